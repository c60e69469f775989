"""A CONNECT tunnel through a real proxy (tinyproxy), captured on loopback (issue 12).

A client asks tinyproxy for ``CONNECT 127.0.0.62:PORT``, then speaks TLS (1.3 and 1.2,
SNI ``api.tunnel.test``, with a key log) to a real HTTPS origin through it and sends
keep-alive HTTP/1.1 requests. The capture holds only the client-to-proxy connection
(the proxy's upstream port is filtered out), so everything netdiag says about the
origin's requests comes from inside the tunnel. Truth: the client's own timers (send to
first response byte) and what it sent; the origin waits :data:`DELAY_S` before each
answer.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netdiag.lab.certs import client_ssl_context, make_certs, server_ssl_context
from netdiag.live.capture import LiveCapture
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

IS_ROOT_LINUX = sys.platform.startswith("linux") and os.geteuid() == 0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not IS_ROOT_LINUX, reason="needs root on Linux (packet socket)"),
    pytest.mark.skipif(shutil.which("tinyproxy") is None, reason="needs tinyproxy"),
]

PROXY_IP, ORIGIN_IP = "127.0.0.61", "127.0.0.62"
NAME = "api.tunnel.test"
DELAY_S = 0.03
REQUESTS = 4


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class Origin:
    """An HTTPS/1.1 origin: each request answered after DELAY_S, keep-alive."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.sock = socket.create_server((ORIGIN_IP, 0))
        self.port = self.sock.getsockname()[1]
        self.ctx = ctx
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(raw,), daemon=True).start()

    def _conn(self, raw: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        chunk = s.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    path = head.split(b" ")[1]
                    time.sleep(DELAY_S)
                    body = b"tunnelled " + path
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        except (OSError, ssl.SSLError):
            return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = _free_port(PROXY_IP)
    conf = tmp_path / "tinyproxy.conf"
    conf.write_text(f"Port {port}\nListen {PROXY_IP}\nTimeout 30\nMaxClients 20\n"
                    f"Allow 127.0.0.0/8\nLogLevel Info\nLogFile \"{tmp_path / 'tp.log'}\"\n"
                    f"PidFile \"{tmp_path / 'tp.pid'}\"\nUser root\nGroup root\n")
    proc = subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((PROXY_IP, port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("tinyproxy did not start")
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def _client(proxy_port: int, origin_port: int, ctx: ssl.SSLContext) -> list[dict[str, Any]]:
    """CONNECT, TLS through the tunnel, REQUESTS keep-alive GETs; the client's timers."""
    raw = socket.create_connection((PROXY_IP, proxy_port))
    target = f"{ORIGIN_IP}:{origin_port}"  # tinyproxy resolves names itself: an address
    raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(4096)
    assert answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n")[0], answer
    timers = []
    with ctx.wrap_socket(raw, server_hostname=NAME) as s:
        for i in range(REQUESTS):
            path = f"/v1/tunnel/{i}"
            t0 = time.perf_counter()
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode())
            data = s.recv(65536)
            t1 = time.perf_counter()
            while b"tunnelled" not in data:
                data += s.recv(65536)
            timers.append({"path": path, "ttfb_ms": (t1 - t0) * 1e3})
    return timers


def _report(path: Path, keylog: KeyLog | None) -> dict[str, Any]:
    sink = CollectingSink()
    return sink.document(analyze([str(path)], sink, Options(keylog=keylog)))


@pytest.mark.parametrize("tls12", [False, True], ids=["tls1.3", "tls1.2"])
def test_connect_tunnel_through_tinyproxy(tmp_path: Path, proxy: int, tls12: bool) -> None:
    ca, chain, key = make_certs([NAME], tmp_path)
    sctx = server_ssl_context(chain, key, tls12_only=tls12)
    sctx.set_alpn_protocols(["http/1.1"])
    origin = Origin(sctx)
    keys = tmp_path / "keys.log"
    cctx = client_ssl_context(ca, keys, alpn=("http/1.1",))
    out = tmp_path / "tunnel.pcapng"
    try:
        with LiveCapture(out, iface="lo", bpf=f"tcp port {proxy}"):
            time.sleep(0.2)
            timers = _client(proxy, origin.port, cctx)
            time.sleep(0.3)
    finally:
        origin.close()
    for keylog in (KeyLog.from_file(keys), None):
        doc = _report(out, keylog)
        # the fixture's readiness probe may still be closing as the capture starts (its
        # last packets, without payload, are a connection of their own): not the tunnel
        conns = [c for c in doc["connections"] if c["server"] == f"{PROXY_IP}:{proxy}"
                 and c["bytes_to_server"] + c["bytes_to_client"] > 0]
        assert len(conns) == 1, doc["connections"]
        conn = conns[0]
        assert conn["tunnel"]["authority"] == f"{ORIGIN_IP}:{origin.port}"
        assert conn["tls"]["sni"] == NAME
        assert conn["tls"]["version"] == ("TLS 1.2" if tls12 else "TLS 1.3")
        reqs = conn["requests"]
        assert reqs[0]["method"] == "CONNECT" and reqs[0]["status"] == 200
        inner = reqs[1:]
        if keylog is None:  # estimated from the tunnelled TLS records
            assert inner and all(r["estimated"] for r in inner)
            continue
        assert conn["tunnel"]["protocol"] == "http/1.1"
        assert [(r["method"], r["path"], r["status"], r["estimated"]) for r in inner] == [
            ("GET", t["path"], 200, False) for t in timers]
        for r, t in zip(inner, timers, strict=True):
            # the capture sees the answer before the client reads it, and the origin
            # waited DELAY_S first
            assert DELAY_S * 1e3 * 0.99 <= r["ttfb_ms"] <= t["ttfb_ms"] + 1.0, (r, t)
