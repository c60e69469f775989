"""The command line as a user meets it: formats, exit codes, one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
THIRDPARTY = ROOT.parent / "shared" / "captures" / "thirdparty"
PERCENTILE_KEYS = {"count", "min", "p50", "p90", "p99", "max", "mean"}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=120, input=stdin, cwd=ROOT)


def test_text_report_on_shipped_capture() -> None:
    p = run("report", str(ANTHO))
    assert p.returncode == 0, p.stderr
    assert "Latency" in p.stdout and "DNS answer" in p.stdout
    assert "Traceback" not in p.stderr


def test_json_follows_contract() -> None:
    p = run("report", str(ANTHO), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["contract"] == 1
    assert set(doc) >= {"contract", "netdiag_version", "capture", "summary", "dns",
                        "connections", "findings"}
    cap = doc["capture"]
    assert cap["files"] == [str(ANTHO)]
    assert cap["packets"] > 0 and cap["truncated"] is False
    assert cap["link_types"] == ["EN10MB"]
    s = doc["summary"]
    for block in (s["dns"]["latency_ms"], s["tcp"]["handshake_rtt_ms"], s["tls"]["handshake_ms"],
                  s["http"]["ttfb_ms"], s["http"]["requests_per_connection"]):
        assert set(block) == PERCENTILE_KEYS
    for t in doc["dns"]:
        assert set(t) >= {"ts", "client", "server", "transport", "id", "qname", "qtype", "rcode",
                          "answers", "latency_ms", "retransmissions"}
    for c in doc["connections"]:
        assert set(c) >= {"id", "ts", "client", "server", "transport", "handshake_rtt_ms",
                          "retransmissions", "resets", "bytes_to_server", "bytes_to_client",
                          "duration_ms", "tls", "protocol", "path", "requests"}
        if c["tls"] is not None:
            assert set(c["tls"]) >= {"version", "sni", "alpn_offered", "alpn", "cipher",
                                     "resumed", "hello_retry", "handshake_ms", "decrypted",
                                     "alert"}
        for r in c["requests"]:
            assert set(r) >= {"stream_id", "ts", "method", "authority", "path", "status",
                              "ttfb_ms", "ttlb_ms", "response_bytes", "chunks",
                              "chunk_gaps_ms", "estimated"}
    http = s["http"]
    if http["requests"]:
        assert http["reuse_rate"] == pytest.approx(
            (http["requests"] - http["connections"]) / http["requests"])


def test_jsonl_has_same_records_as_json(tmp_path: Path) -> None:
    doc = json.loads(run("report", str(ANTHO), "--format", "json").stdout)
    p = run("report", str(ANTHO), "--format", "jsonl")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    by_type: dict[str, list[dict]] = {}
    for rec in lines:
        by_type.setdefault(rec["type"], []).append(rec)
    assert len(by_type["dns"]) == len(doc["dns"])
    assert len(by_type["connection"]) == len(doc["connections"])
    assert all("requests" not in c for c in by_type["connection"])
    n_req = sum(len(c["requests"]) for c in doc["connections"])
    assert len(by_type.get("request", [])) == n_req
    assert all(r["connection"].startswith("C") for r in by_type.get("request", []))
    assert len(by_type["summary"]) == 1 and len(by_type["capture"]) == 1
    summary = {k: v for k, v in by_type["summary"][0].items()
               if k not in ("type", "contract", "netdiag_version")}
    # Paths need every connection at once: JSON Lines streams without them (docs/report.md).
    whole = {k: v for k, v in doc["summary"].items() if k not in ("paths", "path_comparison")}
    assert summary.pop("paths") == {}
    assert summary == whole


def test_output_file_and_gzip(tmp_path: Path) -> None:
    gz = tmp_path / "antho.pcapng.gz"
    with open(ANTHO, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out = tmp_path / "r.json"
    p = run("report", str(gz), "--format", "json", "-o", str(out))
    assert p.returncode == 0, p.stderr
    plain = json.loads(run("report", str(ANTHO), "--format", "json", "--no-profile").stdout)
    doc = json.loads(out.read_text())
    assert doc["summary"] == plain["summary"]


def test_two_files_in_one_report(tmp_path: Path) -> None:
    p = run("report", str(ANTHO), str(ANTHO), "--format", "json")
    assert p.returncode == 0, p.stderr
    one = json.loads(run("report", str(ANTHO), "--format", "json").stdout)
    two = json.loads(p.stdout)
    assert two["capture"]["packets"] == 2 * one["capture"]["packets"]
    assert len(two["capture"]["files"]) == 2
    assert two["summary"]["dns"]["transactions"] >= one["summary"]["dns"]["transactions"]


def test_missing_file_is_one_line_exit_1(tmp_path: Path) -> None:
    p = run("report", str(tmp_path / "nope.pcap"))
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert "nope.pcap" in p.stderr


def test_not_a_capture_exit_1(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("this is not a capture at all\n")
    p = run("report", str(f))
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


@pytest.mark.parametrize("command", ["report", "paths"])
def test_help_lists_the_exit_codes(command: str) -> None:
    p = run(command, "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    for code in ("0 every capture read", "1 input error", "2 usage error",
                 "3 a capture is damaged", "4 internal error", "130 interrupted"):
        assert code in text, (command, code)


def test_terminal_header_says_what_the_link_type_is() -> None:
    p = run("report", str(ANTHO), "--no-profile")
    assert p.returncode == 0, p.stderr
    assert "EN10MB (Ethernet)" in p.stdout


def test_usage_error_exit_2() -> None:
    p = run("report", str(ANTHO), "--format", "yaml")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr


def test_cut_capture_exit_3_with_warning(tmp_path: Path) -> None:
    data = ANTHO.read_bytes()
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(data[: len(data) * 2 // 3])
    p = run("report", str(cut), "--format", "json")
    assert p.returncode == 3, p.stderr
    doc = json.loads(p.stdout)
    assert doc["capture"]["truncated"] is True
    w = [w for w in doc["capture"]["warnings"] if w["kind"] == "capture"]
    assert w and w[0]["file"] == str(cut) and w[0]["offset"] is not None
    assert w[0]["packet"] is not None
    full = json.loads(run("report", str(ANTHO), "--format", "json").stdout)
    assert 0 < doc["capture"]["packets"] < full["capture"]["packets"]
    assert "warning" in p.stderr
    assert any(f["code"] == "capture-truncated" for f in doc["findings"])


def test_thresholds_are_overridable() -> None:
    doc = json.loads(run("report", str(ANTHO), "--format", "json", "--dns-slow-ms", "0.001",
                         "--tls-slow-ms", "0.001", "--reuse-min", "0").stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert "slow-dns" in codes and "slow-tls-handshake" in codes
    assert "low-connection-reuse" not in codes
    doc = json.loads(run("report", str(ANTHO), "--format", "json", "--dns-slow-ms", "1e9",
                         "--reuse-min", "1").stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert "slow-dns" not in codes and "low-connection-reuse" in codes


@pytest.mark.skipif(not THIRDPARTY.is_dir(), reason="third-party captures absent")
def test_every_thirdparty_capture_reports_without_error() -> None:
    for f in sorted(THIRDPARTY.iterdir()):
        if f.suffix not in (".pcap", ".pcapng", ".cap"):
            continue
        p = run("report", str(f), "--format", "json")
        assert p.returncode in (0, 3), f"{f.name}: {p.stderr}"
        assert "Traceback" not in p.stderr and "internal error" not in p.stderr, f.name
        json.loads(p.stdout)


def test_progress_bar_goes_to_stderr_only() -> None:
    plain = run("report", str(ANTHO), "--format", "json", "--no-progress")
    forced = run("report", str(ANTHO), "--format", "json", "--progress")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["summary"] == json.loads(plain.stdout)["summary"]
    assert "Traceback" not in forced.stderr


def test_help_and_version() -> None:
    assert run("--help").returncode == 0
    v = run("--version")
    assert v.returncode == 0 and "netdiag" in v.stdout


KEYS = ROOT / "captures" / "antho.keys"


def without_keys(tmp_path: Path) -> Path:
    """A copy of the shipped capture without its embedded TLS keys (DSB)."""
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    out = tmp_path / "antho-nokeys.pcapng"
    reader = CaptureReader(ANTHO)
    with open(out, "wb") as f:
        write_pcapng(f, reader.packets(), None)
    assert reader.secrets, "the shipped capture embeds its keys"
    return out


def test_keylog_decrypts_and_streaming_summary() -> None:
    doc = json.loads(run("report", str(ANTHO), "--keylog", str(KEYS), "--format", "json").stdout)
    http = doc["summary"]["http"]
    assert http["estimated"] is False
    assert set(http["protocols"]) <= {"h2", "h2c", "http/1.1"}
    assert sum(http["protocols"].values()) == http["requests"]
    st = http["streaming"]
    assert st["responses"] >= 1 and st["first_event_ms"]["count"] == st["responses"]
    assert st["longest_stall_ms"] == st["gap_ms"]["max"]
    assert "streaming-stalls" not in {f["code"] for f in doc["findings"]}
    low = json.loads(run("report", str(ANTHO), "--keylog", str(KEYS), "--format", "json",
                         "--stall-ms", "0.001").stdout)
    assert "streaming-stalls" in {f["code"] for f in low["findings"]}


def test_malformed_keylog_is_one_line_with_its_line_number(tmp_path: Path) -> None:
    bad = tmp_path / "bad.keys"
    bad.write_text("# comment\nCLIENT_RANDOM zz 00\n")
    p = run("report", str(ANTHO), "--keylog", str(bad))
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "bad.keys:2" in p.stderr
    assert "Traceback" not in p.stderr


def test_sslkeylogfile_from_environment(tmp_path: Path) -> None:
    bare = without_keys(tmp_path)
    env = {**os.environ, "SSLKEYLOGFILE": str(KEYS)}
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(bare), "--format",
                        "json"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["summary"]["http"]["estimated"] is False
    env["SSLKEYLOGFILE"] = str(tmp_path / "absent.keys")
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(bare), "--format",
                        "json"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 0 and "absent.keys" in p.stderr
    assert json.loads(p.stdout)["summary"]["http"]["estimated"] is True


def test_write_pcapng_embeds_only_the_keys_of_its_connections(tmp_path: Path) -> None:
    keys = tmp_path / "more.keys"
    extra = "CLIENT_RANDOM " + "ab" * 32 + " " + "cd" * 48
    keys.write_text(KEYS.read_text() + extra + "\n")
    out = tmp_path / "shared.pcapng"
    bare = without_keys(tmp_path)
    assert json.loads(run("report", str(bare), "--format", "json").stdout)[
        "summary"]["http"]["estimated"] is True
    p = run("report", str(bare), "--keylog", str(keys), "--format", "json",
            "--write-pcapng", str(out))
    assert p.returncode == 0, p.stderr
    assert "cdcdcd" not in p.stdout and "cdcdcd" not in p.stderr
    data = out.read_bytes()
    assert b"ab" * 32 not in data and b"CLIENT_TRAFFIC_SECRET_0" in data
    again = json.loads(run("report", str(out), "--format", "json").stdout)
    first = json.loads(p.stdout)
    assert again["summary"]["http"] == first["summary"]["http"]


@pytest.mark.parametrize("fmt", ["text", "json", "jsonl"])
def test_a_reader_gone_before_the_report_is_exit_1_and_silent(fmt: str) -> None:
    """``netdiag report x | head``, the reader gone before a byte is written: exit status
    1, as click, rich and Python give on a broken pipe, with no traceback or error line
    (README, "Exit status")."""
    r, w = os.pipe()
    os.close(r)  # no reader at all: the first write fails, whatever the timing
    try:
        p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(ANTHO),
                            "--format", fmt], stdout=w, stderr=subprocess.PIPE, text=True,
                           timeout=120, cwd=ROOT)
    finally:
        os.close(w)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "error" not in p.stderr, p.stderr
