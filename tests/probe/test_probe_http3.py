"""``netdiag probe --http3`` against a real aioquic HTTP/3 server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netdiag.errors import InputError
from netdiag.probe.http3 import run_http3_probe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAME, THINK_MS = "api.probe.test", 20.0
ORDER = ("start", "dns_start", "dns_end", "handshake_start", "handshake_end", "ready",
         "request", "written", "first_byte", "last_byte")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@dataclass
class H3:
    proc: subprocess.Popen[str]
    addr: str
    cafile: Path

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def url(self, path: str = "/v1/messages") -> str:
        return f"https://{NAME}:{self.port}{path}"


@pytest.fixture(scope="module")
def h3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[H3]:
    proc = subprocess.Popen([sys.executable, str(HERE / "h3_server.py")], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        info: dict[str, Any] = json.loads(proc.stdout.readline())
        cafile = tmp_path_factory.mktemp("h3") / "ca.pem"
        cafile.write_text(info["ca_pem"])
        yield H3(proc, info["h3"], cafile)
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _udp_port(bound: bool) -> tuple[socket.socket | None, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if bound:
        return sock, port
    sock.close()
    return None, port


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def _ordered(r: Any) -> None:
    marks = [r.marks[k] for k in ORDER if k in r.marks]
    assert [m.perf_ns for m in marks] == sorted(m.perf_ns for m in marks)
    assert [m.epoch_ns for m in marks] == sorted(m.epoch_ns for m in marks)


def test_reuse_one_handshake_for_n_requests(h3: H3) -> None:
    res = run_http3_probe(h3.url(), count=4, connect_to=h3.addr, cafile=str(h3.cafile))
    assert res.succeeded == 4 and res.connections == 1
    assert res.summary()["handshakes"] == 1
    first, *rest = res.requests
    ph = first.phases_ms()
    assert ph["handshake"] is not None and ph["handshake"] > 0
    assert ph["dns"] is None and ph["connect"] is None and ph["tls"] is None
    for r in res.requests:
        _ordered(r)
        p = r.phases_ms()
        assert r.status == 200 and r.http_version == "HTTP/3" and r.alpn == "h3"
        assert p["send"] > 0 and p["ttfb"] >= THINK_MS and p["transfer"] >= 0
        assert p["total"] >= p["ttfb"]
    assert [r.stream_id for r in res.requests] == [0, 4, 8, 12]
    assert all(r.reused and r.phases_ms()["handshake"] is None for r in rest)


def test_fresh_handshakes_each_time_and_keylog(h3: H3, tmp_path: Path) -> None:
    keylog = tmp_path / "keys.log"
    res = run_http3_probe(h3.url("/v1/stream"), count=2, reuse=False, connect_to=h3.addr,
                          cafile=str(h3.cafile), keylog=keylog)
    assert res.succeeded == 2 and res.connections == 2
    assert all(r.stream_id == 0 and not r.reused for r in res.requests)
    for r in res.requests:  # 3 events 5 ms apart: the last byte comes after both gaps
        # (a loaded machine can read the first event late, which shortens the transfer
        # but never the time from the request to the last byte)
        ph = r.phases_ms()
        assert ph["transfer"] > 0 and ph["ttfb"] + ph["transfer"] >= 2 * 5.0
        assert r.response_bytes == 3 * len("data: 0\n\n")
    text = keylog.read_text()
    assert text.count("CLIENT_HANDSHAKE_TRAFFIC_SECRET") == 2
    assert "SERVER_TRAFFIC_SECRET_0" in text


def test_json_output_fields(h3: H3) -> None:
    p = run("probe", "--http3", h3.url(), "-n", "2", "--connect-to", h3.addr,
            "--cacert", str(h3.cafile), "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["http"] == "3" and doc["mode"] == "reuse"
    assert doc["summary"]["ok"] == 2 and doc["summary"]["connections"] == 1
    assert doc["summary"]["phases"]["handshake_ms"]["count"] == 1
    r = doc["requests"][0]
    for key in ("handshake_ms", "send_ms", "wait_ms", "ttfb_ms", "transfer_ms", "total_ms",
                "request_ts", "first_byte_ts", "stream_id", "local", "remote", "cipher"):
        assert r[key] is not None, key
    assert r["http_version"] == "HTTP/3" and r["tls_version"] == "TLS 1.3"
    assert r["remote"] == h3.addr and r["local"].startswith("127.0.0.1:")


def test_text_output_and_insecure(h3: H3) -> None:
    p = run("probe", "--http3", f"https://{h3.addr}/v1/messages", "-k", "-n", "2")
    assert p.returncode == 0, p.stderr
    for word in ("handshake", "HTTP/3 (QUIC)", "2/2 ok", "1 connection(s), 1 reused",
                 "p50"):
        assert word in p.stdout, word


def test_refused_and_timeout_are_one_line_errors(h3: H3) -> None:
    _, free = _udp_port(bound=False)
    p = run("probe", "--http3", f"https://127.0.0.1:{free}/", "-k")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused" in lines[0], p.stderr
    assert "request 1 failed in handshake" in p.stdout
    hole, port = _udp_port(bound=True)
    try:
        p = run("probe", "--http3", f"https://127.0.0.1:{port}/", "-k", "--timeout", "0.5")
    finally:
        assert hole is not None
        hole.close()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "timeout after 0.5 s" in lines[0]


def test_bad_certificate_and_bad_input(h3: H3) -> None:
    res = run_http3_probe(h3.url(), connect_to=h3.addr, timeout=5)  # system CAs: untrusted
    assert res.failures == 1 and res.requests[0].failed_phase == "handshake"
    with pytest.raises(InputError, match="needs https"):
        run_http3_probe("http://127.0.0.1/")
    p = run("probe", "--http3", "ftp://x.test/")
    assert p.returncode == 1 and "bad URL" in p.stderr and "Traceback" not in p.stderr
    p = run("probe", "--http3", "--http1.1", "https://x.test/")
    assert p.returncode == 2
