"""A real HTTP/3 exchange on loopback, captured: aioquic server and client, tcpdump.

``python tests/protocols/h3_capture.py OUTDIR`` writes ``OUTDIR/h3.pcap``,
``OUTDIR/h3.keys`` (the client's NSS key log) and ``OUTDIR/timers.json``: per request,
the connection number, stream id, path and the client's own clock
(``time.time_ns()``) when it handed the request HEADERS to its QUIC connection to be
sent and when the first response event (HEADERS) arrived. Connection 1 carries
``N_FIRST`` requests one after the other, connection 2 one request.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent

N_FIRST = 4
BODY = b"x" * 3000


class _Server(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.h3: H3Connection | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if self.h3 is None:
            self.h3 = H3Connection(self._quic)
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                path = dict(ev.headers).get(b":path", b"/")
                asyncio.get_running_loop().call_later(0.02, self._answer, ev.stream_id, path)

    def _answer(self, sid: int, path: bytes) -> None:
        assert self.h3 is not None
        self.h3.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/plain"),
                                   (b"x-path", path)])
        self.h3.send_data(sid, BODY, end_stream=False)
        self.h3.send_data(sid, b"end", end_stream=True)
        self.transmit()


class _Client(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.h3 = H3Connection(self._quic)
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.first: dict[int, int] = {}

    def quic_event_received(self, event: QuicEvent) -> None:
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived | DataReceived):
                self.first.setdefault(ev.stream_id, time.time_ns())
                if ev.stream_ended:
                    fut = self.waiters.pop(ev.stream_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)

    async def get(self, path: str) -> dict[str, Any]:
        sid = self._quic.get_next_available_stream_id()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        sent = time.time_ns()
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                   (b":authority", b"h3.test"), (b":path", path.encode()),
                                   (b"user-agent", b"netdiag-test")], end_stream=True)
        self.transmit()
        await asyncio.wait_for(fut, 5)
        return {"stream_id": sid, "path": path, "sent_ns": sent,
                "first_ns": self.first[sid]}


def _free_udp_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def _run(out: Path, port: int) -> list[dict[str, Any]]:
    from netdiag.lab.certs import make_certs

    _ca, chain, key = make_certs(["h3.test"], out)
    scfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
    scfg.load_cert_chain(str(chain), str(key))
    server = await serve("127.0.0.1", port, configuration=scfg, create_protocol=_Server)
    timers: list[dict[str, Any]] = []
    try:
        with open(out / "h3.keys", "w") as keys:
            for n, count in ((1, N_FIRST), (2, 1)):
                ccfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                                         server_name="h3.test", secrets_log_file=keys)
                ccfg.verify_mode = 0  # ssl.CERT_NONE
                async with connect("127.0.0.1", port, configuration=ccfg,
                                   create_protocol=_Client) as client:
                    assert isinstance(client, _Client)
                    await client.wait_connected()
                    for i in range(count):
                        t = await client.get(f"/c{n}/r{i}")
                        t["connection"] = n
                        timers.append(t)
                        await asyncio.sleep(0.03)
                keys.flush()
                await asyncio.sleep(0.05)
    finally:
        server.close()
    return timers


def make(out: Path) -> dict[str, Any]:
    """Run the exchange under tcpdump; returns the timers (also in ``timers.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    port = _free_udp_port()
    exe = shutil.which("tcpdump") or "/usr/bin/tcpdump"
    pcap = out / "h3.pcap"
    dump = subprocess.Popen(
        [exe, "-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0",
         *(["-Z", "root"] if os.geteuid() == 0 else []), "-w", str(pcap),
         f"udp port {port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert dump.stderr is not None
    seen = b""
    deadline = time.monotonic() + 10
    while b"listening on" not in seen and time.monotonic() < deadline:
        line = dump.stderr.readline()
        if not line:
            break
        seen += line
    time.sleep(0.2)
    try:
        timers = asyncio.run(_run(out, port))
        time.sleep(0.3)
    finally:
        dump.terminate()
        dump.wait(10)
    result = {"port": port, "requests": timers}
    (out / "timers.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    print(json.dumps(make(Path(sys.argv[1]))))
