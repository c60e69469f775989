"""``netdiag probe`` and ``netdiag dns`` as a user meets them: output, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def _one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_help() -> None:
    for cmd in ("probe", "dns"):
        p = run(cmd, "--help")
        assert p.returncode == 0, p.stderr
        assert "Exit status" in p.stdout
    assert "--http1.1" in run("probe", "--help").stdout


def test_usage_and_input_errors() -> None:
    p = run("probe", "ftp://example.test/")
    assert p.returncode == 1 and "bad URL" in _one_error_line(p)
    p = run("probe", "https://example.test/", "-H", "no colon")
    assert p.returncode == 2 and "Name: value" in p.stderr
    p = run("probe", "https://example.test/", "--count", "0")
    assert p.returncode == 2
    p = run("dns", "example.test", "--server", "dns.example")
    assert p.returncode == 1 and "not an IP address" in _one_error_line(p)
    p = run("dns", "example.test", "--server", "127.0.0.1", "--type", "BOGUS")
    assert p.returncode == 1 and "unknown record type" in _one_error_line(p)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_probe_text_and_json(lab: Any, tmp_path: Path) -> None:
    keylog = tmp_path / "k.log"
    p = run("probe", lab.url(), "--count", "3", "--reuse", "--dns-server", lab.dns_fast,
            "--cacert", str(lab.cafile), "--keylog", str(keylog))
    assert p.returncode == 0, p.stderr
    for word in ("dns", "connect", "tls", "send", "ttfb", "transfer", "total", "reused",
                 "p50", "p99", "3/3 ok", "1 connection(s), 2 reused", "TLS 1.3", "HTTP/2"):
        assert word in p.stdout, word
    assert "CLIENT_TRAFFIC_SECRET_0" in keylog.read_text()
    p = run("probe", lab.url(), "-n", "2", "--fresh", "--http1.1", "--connect-to", lab.h2,
            "--cacert", str(lab.cafile), "--format", "json", "-H", "X-Test: 1", "-X", "POST")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["mode"] == "fresh" and doc["method"] == "POST"
    assert doc["summary"]["connections"] == 2 and doc["summary"]["ok"] == 2
    assert {r["http_version"] for r in doc["requests"]} == {"HTTP/1.1"}
    assert all(r["ttfb_ms"] >= lab.H2_THINK_MS for r in doc["requests"])


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_probe_exit_status(lab: Any) -> None:
    p = run("probe", f"https://{lab.refused}/", "-n", "2", "--format", "json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)  # the report is still written
    assert doc["summary"]["failures"] == 2
    line = _one_error_line(p)
    assert "all 2 requests failed" in line and "connection refused" in line
    p = run("probe", f"https://{lab.refused}/")
    assert p.returncode == 1 and "request 1 failed in connect: connection refused" in p.stdout
    # one success is enough for exit 0; failures are still listed
    p = run("probe", lab.url(path="/missing"), "--dns-server", lab.dns_fast,
            "--cacert", str(lab.cafile))
    assert p.returncode == 0 and "404" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_dns_text_json_and_exit_status(lab: Any) -> None:
    p = run("dns", lab.H2_NAME, "--server", lab.dns_slow, "--server", lab.dns_fast,
            "--server", lab.blackhole, "--count", "3", "--timeout", "0.2")
    assert p.returncode == 0, p.stderr
    for word in (lab.dns_slow, lab.dns_fast, lab.blackhole, "NOERROR 3", lab.H2_IP,
                 "timeouts", "p50", "p99"):
        assert word in p.stdout, word
    p = run("dns", lab.NX_NAME, "-s", lab.dns_fast, "--tcp", "-n", "2", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["transport"] == "tcp" and doc["servers"][0]["rcodes"] == {"NXDOMAIN": 2}
    p = run("dns", lab.H2_NAME, "-s", lab.blackhole, "--timeout", "0.1", "-n", "2")
    assert p.returncode == 1
    assert "no server answered: 2 queries, 2 timed out" in _one_error_line(p)
