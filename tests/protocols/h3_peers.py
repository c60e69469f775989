"""What the live QUIC captures (``h3_capture.py``, ``quic_scenarios.py``) share: an
aioquic HTTP/3 server that answers every request after a fixed think time, a client that
times each request with its own clock (``time.time_ns()``), a free UDP port, and tcpdump
capturing the exchange on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

from aioquic.asyncio import QuicConnectionProtocol
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.events import HandshakeCompleted, QuicEvent

THINK_S = 0.02
"""The server's wait between a request's HEADERS and its answer."""


class H3Server(QuicConnectionProtocol):
    """Answers each request: HEADERS (status 200, ``x-path``), then ``CHUNKS`` as DATA
    frames, the last ending the stream."""

    CHUNKS: ClassVar[tuple[bytes, ...]] = (b"y" * 2000,)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.h3: H3Connection | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if self.h3 is None:
            self.h3 = H3Connection(self._quic)
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                path = dict(ev.headers).get(b":path", b"/")
                asyncio.get_running_loop().call_later(THINK_S, self._answer, ev.stream_id,
                                                      path)

    def _answer(self, sid: int, path: bytes) -> None:
        assert self.h3 is not None
        self.h3.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/plain"),
                                   (b"x-path", path)])
        *body, last = self.CHUNKS
        for chunk in body:
            self.h3.send_data(sid, chunk, end_stream=False)
        self.h3.send_data(sid, last, end_stream=True)
        self.transmit()


class H3Client(QuicConnectionProtocol):
    """Sends GET requests and records, per stream, its clock when the request was handed
    to aioquic (``sent_ns``), at the first response event (``first_ns``) and at the end."""

    AUTHORITY: ClassVar[bytes] = b"quic.test"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.h3 = H3Connection(self._quic)
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.first: dict[int, int] = {}
        self.status: dict[int, int] = {}
        self.handshake: HandshakeCompleted | None = None
        self.handshake_ns: int | None = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            self.handshake, self.handshake_ns = event, time.time_ns()
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived | DataReceived):
                self.first.setdefault(ev.stream_id, time.time_ns())
                if isinstance(ev, HeadersReceived):
                    self.status[ev.stream_id] = int(dict(ev.headers)[b":status"])
                if ev.stream_ended:
                    fut = self.waiters.pop(ev.stream_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)

    def local_port(self) -> int:
        return cast(int, self._transport.get_extra_info("sockname")[1])

    async def get(self, path: str) -> dict[str, Any]:
        sid = self._quic.get_next_available_stream_id()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        sent = time.time_ns()
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                   (b":authority", self.AUTHORITY), (b":path", path.encode()),
                                   (b"user-agent", b"netdiag-test")], end_stream=True)
        self.transmit()
        await asyncio.wait_for(fut, 5)
        return {"stream_id": sid, "path": path, "sent_ns": sent,
                "first_ns": self.first[sid], "end_ns": time.time_ns(),
                "status": self.status.get(sid), "local_port": self.local_port()}


def free_udp_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """A UDP port free on ``host`` (``port`` itself when given: OSError if taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, port))
        return cast(int, s.getsockname()[1])


@contextlib.contextmanager
def tcpdump(pcap: Path, bpf: str) -> Iterator[None]:
    """tcpdump on loopback writing ``pcap`` (packets matching ``bpf``) while the block
    runs: started once it says it listens, stopped a moment after the block."""
    exe = shutil.which("tcpdump") or "/usr/bin/tcpdump"
    dump = subprocess.Popen(
        [exe, "-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0",
         *(["-Z", "root"] if os.geteuid() == 0 else []), "-w", str(pcap), bpf],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        yield
        time.sleep(0.3)
    finally:
        dump.terminate()
        dump.wait(10)
