"""The probe tests' loopback lab, run as its own process (``python lab_server.py``).

Why a separate process: a client and servers in one Python process share one GIL,
and a thread that wakes from ``recv()`` while another holds the GIL waits for up to
the switch interval (5 ms) before it can stamp the time -- the probe would then be
measuring the GIL, not the network. The loopback sniffer runs here too, for the
same reason.

Serves, each on its own 127.0.0.x address and a free port:

* ``h2``: hypercorn, TLS 1.3 only, ALPN h2 + http/1.1, ``/v1/messages`` answered
  after a 20 ms think time;
* ``tls12``: hypercorn, TLS 1.2 only (ECDHE + AES-GCM), 10 ms think time;
* ``dns_slow`` / ``dns_fast``: DNS over UDP and TCP (dnspython wire format),
  answering ``A`` for the lab's names and NXDOMAIN for anything else, after
  10 ms / at once;
* ``blackhole``: a bound UDP socket nobody reads (queries time out).

The pieces (certificates, server TLS contexts, the ASGI app, the DNS answerer, the
hypercorn config, the loopback capture) come from ``captures/make_antho.py``.

Protocol: one JSON line on stdout once everything listens (the endpoints and the CA
file), then commands on stdin, one per line, each answered with one line:
``capture PATH`` starts sniffing ``lo`` (``ok``), ``stop`` writes the capture to
PATH (``ok N``); end of input shuts everything down.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from port_pair import udp_and_tcp

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "captures" / "make_antho.py"

H2_IP, TLS12_IP = "127.0.0.151", "127.0.0.152"
DNS_SLOW_IP, DNS_FAST_IP, BLACKHOLE_IP = "127.0.0.153", "127.0.0.154", "127.0.0.155"
H2_NAME, TLS12_NAME = "api.probe.test", "tls12.probe.test"
H2_THINK_MS, TLS12_THINK_MS, DNS_DELAY_MS = 20.0, 10.0, 10.0
CAPTURED = [H2_IP, TLS12_IP, DNS_SLOW_IP, DNS_FAST_IP, BLACKHOLE_IP]


def load_make_antho() -> Any:
    spec = importlib.util.spec_from_file_location("make_antho_for_probe", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _udp_and_tcp(m: Any, ip: str) -> tuple[socket.socket, socket.socket]:
    """A UDP and a listening TCP socket on the same free port of ``ip``."""
    return udp_and_tcp(lambda port, kind: m._listening_socket(ip, port, kind), m.LabError)


def _dns_tcp(handler: Any) -> Any:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    size = struct.unpack("!H", await reader.readexactly(2))[0]
                    wire = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                await asyncio.sleep(handler.delay_s)
                answer = handler.answer(wire)
                if answer is None:
                    break
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return client


class Servers:
    def __init__(self, m: Any, chain: Path, key: Path) -> None:
        self.m = m
        self.socks: list[socket.socket] = []
        self.h2_sock = self._keep(m._listening_socket(H2_IP, 0, socket.SOCK_STREAM))
        self.tls12_sock = self._keep(m._listening_socket(TLS12_IP, 0, socket.SOCK_STREAM))
        self.dns: dict[str, tuple[socket.socket, socket.socket, Any]] = {}
        zone = {H2_NAME: H2_IP, TLS12_NAME: TLS12_IP}
        for label, ip, delay in (("slow", DNS_SLOW_IP, DNS_DELAY_MS), ("fast", DNS_FAST_IP, 0)):
            udp, tcp = _udp_and_tcp(m, ip)
            self._keep(udp)
            self._keep(tcp)
            self.dns[label] = (udp, tcp, m._DnsHandler(zone, delay / 1000))
        self.blackhole = self._keep(m._listening_socket(BLACKHOLE_IP, 0, socket.SOCK_DGRAM))
        self.h2_ssl = m._server_ssl_context(chain, key, tls12_only=False)
        self.tls12_ssl = m._server_ssl_context(chain, key, tls12_only=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="probe-lab", daemon=True)

    def _keep(self, sock: socket.socket) -> socket.socket:
        self.socks.append(sock)
        return sock

    def endpoints(self) -> dict[str, str]:
        def ep(sock: socket.socket) -> str:
            ip, port = sock.getsockname()[:2]
            return f"{ip}:{port}"

        return {"h2": ep(self.h2_sock), "tls12": ep(self.tls12_sock),
                "dns_slow": ep(self.dns["slow"][0]), "dns_fast": ep(self.dns["fast"][0]),
                "blackhole": ep(self.blackhole)}

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("lab servers did not start")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self.loop is not None and self.stop_event is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(10)
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    async def _main(self) -> None:
        from hypercorn.asyncio import serve

        m = self.m
        self.loop = asyncio.get_running_loop()
        self.stop_event = stop = asyncio.Event()
        closers = []
        for udp, tcp, handler in self.dns.values():
            transport, proto = await self.loop.create_datagram_endpoint(
                lambda h=handler: m._DnsUdp(h), sock=udp)
            server = await asyncio.start_server(_dns_tcp(handler), sock=tcp)
            closers.append((transport, proto, server))
        https = [
            asyncio.create_task(serve(m._make_app("H2", H2_THINK_MS / 1000, 3, 0.005),
                                      m._LabHypercornConfig(self.h2_ssl, self.h2_sock),
                                      shutdown_trigger=stop.wait, mode="asgi")),
            asyncio.create_task(serve(m._make_app("T12", TLS12_THINK_MS / 1000, 3, 0.005),
                                      m._LabHypercornConfig(self.tls12_ssl, self.tls12_sock),
                                      shutdown_trigger=stop.wait, mode="asgi")),
        ]
        self.ready.set()
        try:
            await stop.wait()
            await asyncio.wait_for(asyncio.gather(*https, return_exceptions=True), 8)
        finally:
            for task in https:
                task.cancel()
            for transport, proto, server in closers:
                server.close()
                transport.close()
                for task in list(proto.tasks):
                    task.cancel()


def _reply(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> int:
    m = load_make_antho()
    with tempfile.TemporaryDirectory(prefix="probe-lab-") as tmp:
        ca_pem, chain, key = m._make_certs([H2_NAME, TLS12_NAME], Path(tmp))
        cafile = Path(tmp) / "ca.pem"
        cafile.write_bytes(ca_pem)
        servers = Servers(m, chain, key)
        servers.start()
        capture: Any = None
        out: Path | None = None
        try:
            _reply(json.dumps({**servers.endpoints(), "ca_pem": ca_pem.decode()}))
            for line in sys.stdin:
                cmd, _, arg = line.strip().partition(" ")
                try:
                    if cmd == "capture":
                        capture, out = m.LoopbackCapture(CAPTURED), Path(arg)
                        capture.start()
                        _reply("ok")
                    elif cmd == "stop" and capture is not None and out is not None:
                        time.sleep(0.3)  # let the last FIN/ACKs reach the sniffer
                        packets = capture.stop()
                        n = capture.write(packets, out)
                        capture = None
                        _reply(f"ok {n}")
                    else:
                        _reply(f"error unknown command {cmd!r}")
                except Exception as exc:  # report, keep serving
                    _reply(f"error {type(exc).__name__}: {exc}".replace("\n", " "))
        finally:
            if capture is not None:
                capture.stop()
            servers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
