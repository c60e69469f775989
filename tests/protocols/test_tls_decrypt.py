"""Decryption end to end through the pipeline: exact requests, hidden handshake facts,
fallback to the estimated view when a key is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from netdiag.capture.pcapng_writer import write_pcapng
from netdiag.capture.reader import CaptureReader
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
ANTHO_KEYS = ROOT / "captures" / "antho.keys"
EXPECTED = ROOT / "captures" / "antho.expected.json"
THIRDPARTY = ROOT.parent / "shared" / "captures" / "thirdparty"


def report(path: Path, keylog: KeyLog | None) -> dict[str, Any]:
    sink = CollectingSink()
    result = analyze([str(path)], sink, Options(keylog=keylog))
    return sink.document(result)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped capture without its decryption-secrets block (no key inside)."""
    out = tmp_path_factory.mktemp("antho") / "antho-nokeys.pcapng"
    with CaptureReader(ANTHO) as reader, open(out, "wb") as f:
        write_pcapng(f, reader.packets())
    return out


def _tls_log(exp: dict[str, Any]) -> list[dict[str, Any]]:
    """Every TLS connection of the lab run: its clients' and its router's upstream ones."""
    ups = [{"client": u["client"], "alpn": "h2", "resumed": False,
            "requests": [{"request_id": u["request_id"]}]}
           for u in exp["router"]["upstream_log"]]
    return list(exp["connection_log"]) + ups


def test_antho_with_keys_gives_every_request_exactly(bare: Path) -> None:
    doc = report(bare, KeyLog.from_file(ANTHO_KEYS))
    exp = json.loads(EXPECTED.read_text())
    by_client = {c["client"]: c for c in doc["connections"]}
    for logged in _tls_log(exp):
        c = by_client[logged["client"]]
        assert c["tls"]["decrypted"] is True
        assert c["tls"]["alpn"] == logged["alpn"]  # hidden in TLS 1.3 without keys
        assert c["protocol"] == "h2"
        if logged["resumed"]:
            assert c["tls"]["certificate"] is None  # a PSK handshake sends none
        else:
            assert c["tls"]["certificate"]["subject"]
        if "method" not in logged["requests"][0]:  # the router's: one request each
            assert len(c["requests"]) == 1 and c["requests"][0]["status"] == 200
            continue
        got = [(r["stream_id"], r["method"], r["path"], r["status"]) for r in c["requests"]]
        want = [(r["stream_id"], r["method"], r["path"], r["status"])
                for r in logged["requests"]]
        assert got == want
        for r, w in zip(c["requests"], logged["requests"], strict=True):
            assert r["estimated"] is False
            if "events" in w:
                assert r["sse_events"] == w["events"] == r["chunks"]
                assert len(r["chunk_gaps_ms"]) == w["events"] - 1
    http = doc["summary"]["http"]
    assert http["estimated"] is False and http["estimated_requests"] == 0
    roc, dpf = exp["requests"]["roc"], exp["requests"]["dpf"]
    n = roc + dpf + exp["edge"]["requests"] + exp["router"]["upstream_connections"]
    conns = len(_tls_log(exp)) + exp["edge"]["router_connections"]
    assert http["requests"] == n
    assert http["reuse_rate"] == pytest.approx((n - conns) / n)
    assert doc["summary"]["tls"]["decrypted"] == len(_tls_log(exp))
    # the origins' think time is a floor for every HTTP request's TTFB, at every hop
    think = min(exp["params"]["roc_think_ms"], exp["params"]["dpf_think_ms"])
    ttfbs = [r["ttfb_ms"] for c in doc["connections"] for r in c["requests"]
             if r["protocol"] in ("h2", "h2c")]
    assert len(ttfbs) == n and all(t >= think for t in ttfbs)
    # the embedded keys are the key log's: the shipped file decrypts the same by itself
    shipped = report(ANTHO, None)
    assert shipped["summary"]["http"] == http
    assert shipped["summary"]["tls"]["decrypted"] == len(_tls_log(exp))


def test_tls13_finished_time_with_keys_matches_keyless_position(bare: Path) -> None:
    keyed = report(bare, KeyLog.from_file(ANTHO_KEYS))
    keyless = report(bare, None)
    assert keyless["summary"]["tls"]["decrypted"] == 0
    for a, b in zip(keyed["connections"], keyless["connections"], strict=True):
        if a["tls"] is not None:
            assert a["tls"]["handshake_ms"] == pytest.approx(b["tls"]["handshake_ms"])


def test_wrong_key_falls_back_to_estimated_view(bare: Path) -> None:
    good = KeyLog.from_file(ANTHO_KEYS)
    lines = []
    for line in ANTHO_KEYS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        label, random, secret = line.split()
        if label == "SERVER_TRAFFIC_SECRET_0":
            secret = ("00" if secret[:2] != "00" else "11") + secret[2:]
        lines.append(f"{label} {random} {secret}")
    bad = KeyLog.parse("\n".join(lines) + "\n", "bad.keys")
    assert len(bad) == len(good)
    doc = report(bare, bad)
    tls13 = [c for c in doc["connections"] if c["tls"] and c["tls"]["version"] == "TLS 1.3"]
    assert tls13 and all(c["tls"]["decrypt_error"] for c in tls13)
    # TLS 1.2 keys (CLIENT_RANDOM lines) were left intact: those connections stay exact
    tls12 = [c for c in doc["connections"] if c["tls"] and c["tls"]["version"] == "TLS 1.2"]
    assert tls12 and all(c["tls"]["decrypt_error"] is None and c["requests"]
                         and not any(r["estimated"] for r in c["requests"]) for c in tls12)
    assert any("decryption stopped" in w["message"] for w in doc["capture"]["warnings"])
    assert doc["summary"]["http"]["estimated"] is True
    assert 0 < doc["summary"]["http"]["estimated_requests"] < doc["summary"]["http"]["requests"]
    # the exchanges are still there, now guessed from record timing
    assert doc["summary"]["http"]["requests"] == report(bare, None)["summary"]["http"]["requests"]


def test_keys_for_other_connections_are_ignored(bare: Path) -> None:
    other = KeyLog.parse("CLIENT_RANDOM " + "ab" * 32 + " " + "cd" * 48 + "\n", "other.keys")
    doc = report(bare, other)
    assert doc["summary"]["tls"]["decrypted"] == 0
    assert doc["summary"]["http"]["estimated"] is True


needs_thirdparty = pytest.mark.skipif(not THIRDPARTY.is_dir(), reason="third-party absent")


@needs_thirdparty
def test_cryptohack_h2_over_tls13() -> None:
    doc = report(THIRDPARTY / "cryptohack_tls3_h2.pcapng",
                 KeyLog.from_file(THIRDPARTY / "cryptohack_tls3_h2.keys"))
    (c,) = doc["connections"]
    assert c["tls"]["decrypted"] and c["tls"]["alpn"] == "h2" and c["protocol"] == "h2"
    (r,) = c["requests"]
    assert (r["method"], r["path"], r["status"], r["estimated"]) == ("GET", "/", 200, False)
    assert c["tls"]["certificate"]["subject"] == "CN=tls3.cryptohack.org"


@needs_thirdparty
def test_hotplace_client_alert_instead_of_finished() -> None:
    doc = report(THIRDPARTY / "hotplace_http1_tls13.pcapng",
                 KeyLog.from_file(THIRDPARTY / "hotplace_http.keys"))
    first, second = doc["connections"]
    assert first["tls"]["alert"] == "fatal certificate_unknown from client"
    assert first["tls"]["handshake_ms"] is None and first["requests"] == []
    assert second["protocol"] == "http/1.1"
    assert all(not r["estimated"] and r["method"] == "GET" for r in second["requests"])


@needs_thirdparty
def test_tls12_keylog_http1_keepalive() -> None:
    doc = report(THIRDPARTY / "zeek_tls12_stream_keylog.pcap",
                 KeyLog.from_file(THIRDPARTY / "zeek_tls12_stream_keylog.keys"))
    (c,) = doc["connections"]
    assert c["tls"]["version"] == "TLS 1.2" and c["tls"]["decrypted"]
    assert c["protocol"] == "http/1.1"
    assert len(c["requests"]) == 16  # tshark -Y http.request with the key log
    statuses = sorted(r["status"] for r in c["requests"])
    assert statuses == [200] * 14 + [304] * 2
