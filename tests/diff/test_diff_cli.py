"""``netdiag diff`` end to end: real captures, JSON reports as input, the three formats,
HTML escaping, exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from diff_docs import make_doc, normal

from netdiag.capture.pcapng_writer import write_pcapng
from netdiag.capture.reader import CaptureReader

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
THIRDPARTY = ROOT.parent / "shared" / "captures" / "thirdparty"
LATENCIES = ("dns.latency_ms", "tcp.handshake_rtt_ms", "tls.handshake_ms", "http.ttfb_ms",
             "http.ttlb_ms")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *map(str, args)],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)


def rewrite(src: Path, dst: Path, when: Callable[[int, int], int]) -> Path:
    """A copy of ``src`` with every timestamp ``ts`` replaced by ``when(ts, first_ts)``."""
    reader = CaptureReader(str(src))
    try:
        pkts = list(reader.packets())
    finally:
        reader.close()
    first = pkts[0][0]
    with open(dst, "wb") as out:
        write_pcapng(out, [(when(ts, first), lt, data, wire) for ts, lt, data, wire in pkts])
    return dst


@pytest.fixture(scope="module")
def stretched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """antho with time running at half speed: every latency doubles."""
    return rewrite(ANTHO, tmp_path_factory.mktemp("diff") / "antho_slow.pcapng",
                   lambda ts, first: first + (ts - first) * 2)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """antho one day later: nothing changes."""
    return rewrite(ANTHO, tmp_path_factory.mktemp("diff") / "antho_later.pcapng",
                   lambda ts, first: ts + 86_400 * 10**9)


def _metrics(doc: dict) -> dict[str, dict]:
    return {m["metric"]: m for m in doc["latency"]}


@pytest.fixture(scope="module")
def antho_report() -> dict:
    """netdiag's own report of antho (the figures the diff must show as side A)."""
    p = run("report", ANTHO, "--keylog", KEYS, "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_slower_copy_is_significantly_slower(stretched: Path, antho_report: dict) -> None:
    p = run("diff", ANTHO, stretched, "--keylog", KEYS, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    m = _metrics(doc)
    for name in LATENCIES:
        assert m[name]["significant"] is True, (name, m[name]["verdict"])
        assert m[name]["direction"] == "higher"
        assert re.fullmatch(r"significant \(p(<0\.001|=0\.\d+)\)", m[name]["verdict"])
        # twice as slow: B's median is twice A's
        assert m[name]["b"]["p50"] == pytest.approx(2 * m[name]["a"]["p50"], rel=1e-6)
        lo, hi = m[name]["median_diff"]["ci_low"], m[name]["median_diff"]["ci_high"]
        assert 0 < lo <= m[name]["median_diff"]["estimate"] <= hi
    summary = antho_report["summary"]
    assert m["dns.latency_ms"]["n_a"] == m["dns.latency_ms"]["n_b"] == \
        summary["dns"]["latency_ms"]["count"]
    assert m["http.ttfb_ms"]["n_a"] == summary["http"]["ttfb_ms"]["count"]
    assert m["http.ttfb_ms"]["a"] == summary["http"]["ttfb_ms"]
    assert doc["reuse"]["delta"] == 0 and doc["reuse"]["significant"] is False
    assert doc["findings"]["appeared"] == [] and doc["findings"]["gone"] == []
    assert doc["a"]["label"] == "antho.pcapng" and doc["b"]["label"] == "antho_slow.pcapng"


def test_shifted_copy_is_within_noise_in_text(shifted: Path, antho_report: dict) -> None:
    p = run("diff", ANTHO, shifted, "--keylog", KEYS)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "A: antho.pcapng" in out and "B: antho_later.pcapng" in out
    # every latency, reuse, and the TTFB of each (inferred) path
    assert out.count("within noise (p=1.00)") >= len(LATENCIES) + 1
    assert "significant" not in out
    http = antho_report["summary"]["http"]
    assert (f"Connection reuse: {http['reuse_rate'] * 100:.1f}% ({http['requests']} requests "
            f"on {http['connections']} connections)") in " ".join(out.split())
    for label in ("DNS", "TCP handshake", "TLS handshake", "TTFB", "TTLB"):
        assert label in out
    assert "Traceback" not in p.stderr


def test_text_shows_arrows_for_a_slower_copy(stretched: Path) -> None:
    p = run("diff", ANTHO, stretched, "--keylog", KEYS)
    assert p.returncode == 0, p.stderr
    assert "↑ +" in p.stdout and "significant (p" in p.stdout


def test_json_report_inputs_save_the_reanalysis(tmp_path: Path, stretched: Path) -> None:
    a_json = tmp_path / "a.json"
    p = run("report", ANTHO, "--keylog", KEYS, "--format", "json", "-o", a_json)
    assert p.returncode == 0, p.stderr
    from_report = run("diff", a_json, stretched, "--keylog", KEYS, "--format", "json")
    from_capture = run("diff", ANTHO, stretched, "--keylog", KEYS, "--format", "json")
    assert from_report.returncode == 0, from_report.stderr
    r, c = json.loads(from_report.stdout), json.loads(from_capture.stdout)
    assert r["latency"] == c["latency"] and r["reuse"] == c["reuse"]
    assert r["counts"] == c["counts"] and r["findings"] == c["findings"]


def test_html_is_self_contained(stretched: Path, tmp_path: Path) -> None:
    out = tmp_path / "diff.html"
    p = run("diff", ANTHO, stretched, "--keylog", KEYS, "--format", "html", "-o", out)
    assert p.returncode == 0, p.stderr
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    low = page.lower()
    assert "<script" not in low and "<link" not in low and "@import" not in low
    assert not re.search(r"(src|href)\s*=", low)
    assert "url(" not in low
    assert "significant (p" in page and "Latency (ms)" in page


def test_html_escapes_hostile_strings(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script>'
    img = '"><img src=x onerror=alert(1)>'
    a = make_doc(ttfb=normal(50, 5, 10, 1), paths={hostile: normal(20, 2, 10, 2)},
                 findings=[("warning", img, f"title {hostile}")],
                 files=[f"/tmp/{img}.pcapng"])
    b = make_doc(ttfb=normal(60, 5, 10, 3), paths={hostile: normal(25, 2, 10, 4)},
                 findings=[("critical", "x" + hostile, img), ("info", "m", "[red]boom[/red]")],
                 files=["b.pcapng"])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a), encoding="utf-8")
    pb.write_text(json.dumps(b), encoding="utf-8")
    out = tmp_path / "d.html"
    p = run("diff", pa, pb, "--format", "html", "-o", out, "--label-b", "<b onmouseover=x>")
    assert p.returncode == 0, p.stderr
    page = out.read_text(encoding="utf-8")
    low = page.lower()
    assert "<script" not in low and "<img" not in low and "<b " not in low
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;b onmouseover=x&gt;" in page
    # the terminal does not interpret them as (rich) markup either
    t = run("diff", pa, pb)
    assert t.returncode == 0, t.stderr
    assert "[red]boom[/red]" in t.stdout
    assert "onerror=alert(1)>" in t.stdout


def test_thirdparty_captures() -> None:
    a, b = THIRDPARTY / "zeek_http_pipelined.pcap", THIRDPARTY / "zeek_http_vlan.pcap"
    if not a.is_file() or not b.is_file():
        pytest.skip("third-party captures absent")
    p = run("diff", a, b, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    ttfb = _metrics(doc)["http.ttfb_ms"]
    assert ttfb["n_a"] == 5 and ttfb["n_b"] == 1
    assert doc["counts"][0]["name"] == "dns.transactions"


def test_truncated_capture_exits_3() -> None:
    cut = THIRDPARTY / "dpkt_truncated_dns_cut.pcap"
    if not cut.is_file():
        pytest.skip("third-party captures absent")
    p = run("diff", cut, ANTHO, "--format", "json")
    assert p.returncode == 3, p.stderr
    assert json.loads(p.stdout)["a"]["truncated"] is True


def test_input_errors(tmp_path: Path) -> None:
    p = run("diff", tmp_path / "missing.pcap", ANTHO)
    assert p.returncode == 1
    assert p.stderr.startswith("netdiag: error:") and len(p.stderr.strip().splitlines()) == 1
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}', encoding="utf-8")
    p = run("diff", other, ANTHO)
    assert p.returncode == 1 and "not a netdiag report" in p.stderr
    lines = tmp_path / "r.json"
    lines.write_text('{"type": "dns", "id": 1}\n{"type": "summary"}\n', encoding="utf-8")
    p = run("diff", lines, ANTHO)
    assert p.returncode == 1 and "JSON Lines" in p.stderr
    p = run("diff", ANTHO, ANTHO, "--format", "pdf")
    assert p.returncode == 2
