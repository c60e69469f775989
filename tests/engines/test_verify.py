"""``netdiag verify``: the figure-by-figure comparison, its output and exit status."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netdiag.engines.verify import NdPackets, compare_documents, render_text

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None,
                                  reason="tshark is not installed")


def run(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *map(str, args)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)


def _doc() -> dict[str, Any]:
    return {
        "capture": {"files": ["x.pcap"], "packets": 10, "bytes": 100, "truncated": False,
                    "first_ts": 100.0, "last_ts": 101.0},
        "summary": {"dns": {"transactions": 1}, "http": {"estimated": False}},
        "dns": [{"ts": 100.0, "client": "10.0.0.1:5000", "server": "10.0.0.53:53",
                 "transport": "udp", "id": 7, "qname": "a.test", "qtype": "A",
                 "latency_ms": 4.0, "rcode": "NOERROR", "retransmissions": 0,
                 "responses": 1, "truncated": False, "frames": {"query": 1, "response": 2}}],
        "connections": [{
            "id": "C1", "ts": 100.1, "client": "10.0.0.1:40000", "server": "10.0.0.2:443",
            "handshake_rtt_ms": 1.0, "packets": 8, "retransmissions": 0, "resets": 0,
            "tls": {"version": "TLS 1.3", "sni": "a.test", "alpn_offered": ["h2"],
                    "handshake_ms": 3.0},
            "frames": {"first": 3, "syn": 3, "handshake_ack": 5, "client_hello": 6,
                       "finished": 8},
            "requests": [{"stream_id": 1, "ts": 100.2, "method": "GET", "path": "/",
                          "status": 200, "ttfb_ms": 20.0, "ttlb_ms": 21.0,
                          "estimated": False, "protocol": "h2", "response_bytes": 5,
                          "frames": {"request": 9, "response": 11, "last": 12}}]}],
        "findings": [],
    }


def _fig(result: Any, section: str, name: str) -> Any:
    return next(f for f in result.figures if f.section == section and f.name == name)


def test_identical_documents_agree() -> None:
    r = compare_documents(_doc(), _doc())
    assert r.ok and r.figures and not r.differences
    assert r.summary_line() == f"{len(r.figures)} figures compared, 0 differ"
    assert {f.section for f in r.figures} >= {"capture", "dns", "tcp", "tls", "http",
                                               "summary"}


def test_tolerance() -> None:
    b = _doc()
    b["dns"][0]["latency_ms"] = 4.04
    b["connections"][0]["requests"][0]["ttfb_ms"] = 20.06
    r = compare_documents(_doc(), b, tolerance_ms=0.05)
    assert not _fig(r, "dns", "latency_ms").differs
    ttfb = _fig(r, "http", "ttfb_ms")
    assert ttfb.differs and ttfb.diff_ms == pytest.approx(-0.06)
    assert ttfb.tshark_frames == {"request": 9, "response": 11, "last": 12}
    assert [f.name for f in r.differences] == ["ttfb_ms"]
    assert compare_documents(_doc(), b, tolerance_ms=0.1).ok


def test_null_and_value_differences() -> None:
    b = _doc()
    b["connections"][0]["handshake_rtt_ms"] = None
    b["connections"][0]["tls"]["version"] = "TLS 1.2"
    b["connections"][0]["tls"]["alpn_offered"] = None
    a = _doc()
    a["connections"][0]["tls"]["alpn_offered"] = []
    r = compare_documents(a, b)
    assert {(f.section, f.name) for f in r.differences} == {
        ("tcp", "handshake_rtt_ms"), ("tls", "version")}  # [] and null offered ALPN agree
    text = render_text(r)
    assert "handshake_rtt_ms: netdiag 1 vs tshark None" in text
    assert "version: netdiag 'TLS 1.2'" not in text and "tshark 'TLS 1.2'" in text
    assert "tshark frames first 3, syn 3, handshake_ack 5" in text
    assert text.rstrip().endswith(f"{len(r.figures)} figures compared, 2 differ")


def test_items_only_one_side_has() -> None:
    b = _doc()
    b["dns"] = []
    extra = copy.deepcopy(b["connections"][0])
    extra.update(id="C2", client="10.0.0.1:40001")
    b["connections"].append(extra)
    packets = NdPackets(dns={0: {"query": 1, "response": 2}})
    r = compare_documents(_doc(), b, packets=packets)
    present = [f for f in r.differences if f.name == "present"]
    assert [(f.section, f.netdiag, f.tshark) for f in present] == [
        ("dns", True, False), ("tcp", False, True)]
    assert present[0].netdiag_packets == {"query": 1, "response": 2}
    text = render_text(r)
    assert "only netdiag has it" in text and "only tshark has it" in text
    assert "look at: netdiag packets query 1, response 2; tshark frames -" in text


def test_estimated_requests_are_not_comparable() -> None:
    a = _doc()
    a["connections"][0]["requests"][0]["estimated"] = True
    a["summary"]["http"]["estimated"] = True
    b = _doc()
    b["connections"][0]["requests"] = []
    r = compare_documents(a, b)
    assert r.ok
    assert not [f for f in r.figures if f.section == "http"]
    assert [s["section"] for s in r.not_comparable] == ["http", "summary"]
    assert "estimated from encrypted records" in r.not_comparable[0]["reason"]


def test_json_shape() -> None:
    b = _doc()
    b["capture"]["packets"] = 11
    out = compare_documents(_doc(), b).to_json()
    assert out["ok"] is False and out["differ"] == 1 and out["compared"] == len(out["figures"])
    assert out["differences"][0]["figure"] == "packets"
    assert out["by_section"]["capture"] == {"compared": 5, "differ": 1}
    json.dumps(out)


# ----------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def antho() -> tuple[dict[str, Any], Any]:
    """netdiag's document of antho (with keys) and its records."""
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    sink = CollectingSink()
    doc = sink.document(analyze([str(ANTHO)], sink,
                                Options(keylog=KeyLog.from_file(str(KEYS)))))
    return doc, sink


@pytest.mark.tshark
@needs_tshark
def test_cli_agrees_on_antho() -> None:
    p = run("verify", ANTHO, "--keylog", KEYS)
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    n = int(last.split()[0])
    assert last == f"{n} figures compared, 0 differ" and n > 300
    assert p.stdout.startswith(f"netdiag verify {ANTHO}: netdiag ")
    assert re.search(r"by section: capture 5/5 agree, dns (\d+)/\1 agree, tcp (\d+)/\2 agree",
                     p.stdout)


@pytest.mark.tshark
@needs_tshark
def test_cli_json(tmp_path: Path, antho: tuple[dict[str, Any], Any]) -> None:
    out = tmp_path / "v.json"
    p = run("verify", ANTHO, "--keylog", KEYS, "--format", "json", "-o", out,
            "--tolerance-ms", "0.01")
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and doc["differ"] == 0 and doc["tolerance_ms"] == 0.01
    assert doc["compared"] == len(doc["figures"]) > 300
    assert set(doc["by_section"]) == {"capture", "dns", "tcp", "tls", "http", "summary"}
    ttfb = [f for f in doc["figures"] if f["figure"] == "ttfb_ms"]
    http_requests = [r for c in antho[0]["connections"] if c["protocol"] != "resp"
                     for r in c["requests"]]
    assert len(ttfb) == len(http_requests) > 0
    assert all(f["netdiag_packets"]["request"] == f["tshark_frames"]["request"]
               for f in ttfb)


@pytest.mark.tshark
@needs_tshark
def test_cli_differences_exit_5(antho: tuple[dict[str, Any], Any]) -> None:
    # tshark told not to dissect DNS: every DNS transaction is netdiag's alone
    p = run("verify", ANTHO, "--keylog", KEYS, "--tshark-option=--disable-protocol",
            "--tshark-option=dns")
    assert p.returncode == 5, p.stderr
    doc, sink = antho
    d0, t0 = doc["dns"][0], sink.dns_records[0]
    assert (f"DNS {d0['transport']} {d0['client']} -> {d0['server']} id 0x{d0['id']:04x} "
            f"{d0['qname']} {d0['qtype']}\n  only netdiag has it") in p.stdout
    assert (f"look at: netdiag packets query {t0.query_packet}, response "
            f"{t0.response_packet}; tshark frames -") in p.stdout
    last = p.stdout.strip().splitlines()[-1]
    assert last.endswith("differ") and not last.endswith(" 0 differ")
    j = run("verify", ANTHO, "--keylog", KEYS, "--format", "json",
            "--tshark-option=--disable-protocol", "--tshark-option=dns")
    assert j.returncode == 5
    doc = json.loads(j.stdout)
    n = len(antho[0]["dns"])
    assert doc["ok"] is False and doc["by_section"]["dns"] == {"compared": n, "differ": n}


def test_cli_without_tshark(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))
    p = run("verify", ANTHO, env=env)
    assert p.returncode == 1
    assert p.stderr.startswith("netdiag: error: tshark is not installed")


def test_cli_input_errors(tmp_path: Path) -> None:
    p = run("verify", tmp_path / "missing.pcap")
    assert p.returncode == 1 and p.stderr.startswith("netdiag: error:")
    bad = tmp_path / "bad.keys"
    bad.write_text("not a key log\n")
    p = run("verify", ANTHO, "--keylog", bad)
    assert p.returncode == 1 and "key log" in p.stderr
    assert run("verify", ANTHO, "--tolerance-ms", "-1").returncode == 2


def test_cli_help_documents_exit_status() -> None:
    p = run("verify", "--help")
    assert p.returncode == 0
    assert "5 some figures differ" in " ".join(p.stdout.split())
