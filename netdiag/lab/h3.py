"""HTTP/3 for the lab (aioquic): the edge's QUIC listener and the lab's h3 client.

The edge answers HTTP/3 on UDP at the very address and port of its TLS listener
(``127.0.0.10:443``), with the lab's certificate and the lab's key log (aioquic's
``QuicConfiguration.secrets_log_file`` writes NSS key-log lines). Each request is
handed, as soon as its HEADERS frame is decoded, to the same handler the edge runs
for HTTP/2 (``netdiag.lab.servers.Edge.handle``), as an :class:`H3Stream`: the
interface of ``netdiag.lab.h2server.Stream`` (headers, body, ``send_headers``,
``send_data``, the arrival time on both clocks, the connection's peer and local
endpoints and the QUIC stream id), so an h3 request is forwarded through the router
to the origins exactly as an h2 one is, and logged by the same keys.

The client (:class:`H3Client`) is what ``LabParams(client_protocol="h3")`` uses for
the ROC path: one QUIC connection from a bound UDP socket (``127.0.0.2``), requests on
its bidirectional streams, every answer's first and last byte stamped at the
``datagram_received`` that delivered it.

Arrival times are taken when the datagram is read (``datagram_received``), before
aioquic decrypts it: the same moment the HTTP/2 server stamps (``data_received``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.h3.connection import H3_ALPN, ErrorCode, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent

from netdiag.lab.h2server import Stream, StreamGone

log = logging.getLogger("netdiag.lab.h3")

ALPN = list(H3_ALPN)
"""ALPN the lab's h3 endpoints offer (``h3``)."""


def _decode(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def open_keylog(path: Path | str | None) -> TextIO | None:
    """The key log opened for appending, line-buffered (aioquic writes NSS lines)."""
    if path is None:
        return None
    return open(path, "a", encoding="ascii", buffering=1)


# ---------------------------------------------------------------------- server


class H3Stream(Stream):
    """One HTTP/3 request on the server side: the HTTP/2 ``Stream``'s interface and
    accessors, its own way to answer."""

    protocol = "h3"
    proto: H3ServerProtocol  # type: ignore[assignment]  # the QUIC side of Stream.proto

    def __init__(self, proto: H3ServerProtocol, stream_id: int,
                 headers: list[tuple[str, str]], t_headers: float, wall: int) -> None:
        self.proto = proto
        self.id = stream_id
        self.headers = headers
        self.t_headers = t_headers
        """Loop time at which the datagram carrying the request's HEADERS was read."""
        self.wall_headers = wall
        """Wall clock (``time.time_ns()``) of that same moment."""
        self._body = bytearray()
        self._ended = asyncio.Event()
        self.gone = False

    @property
    def stream_id(self) -> int:
        """The QUIC stream id (0, 4, 8, ... for a client's requests)."""
        return self.id

    def send_headers(self, status: int, headers: list[tuple[str, str]],
                     end_stream: bool = False) -> None:
        if self.gone or self.proto.h3 is None:
            raise StreamGone(f"stream {self.id} is gone")
        try:
            self.proto.h3.send_headers(self.id, _encode([(":status", str(status)), *headers]),
                                       end_stream=end_stream)
        except Exception as exc:  # aioquic: the stream or the connection is closed
            raise StreamGone(str(exc)) from exc
        self.proto.transmit()

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        if self.gone or self.proto.h3 is None:
            raise StreamGone(f"stream {self.id} is gone")
        try:
            self.proto.h3.send_data(self.id, data, end_stream=end_stream)
        except Exception as exc:
            raise StreamGone(str(exc)) from exc
        self.proto.transmit()


Handler = Callable[[Any], Awaitable[None]]


class H3ServerProtocol(QuicConnectionProtocol):
    """One QUIC connection of the server; each request runs ``handler(stream)`` in a task."""

    def __init__(self, quic: QuicConnection, *, handler: Handler,
                 local: tuple[str, int], connections: set[H3ServerProtocol],
                 **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.handler = handler
        self.local = local
        self.peer: tuple[str, int] = ("", 0)
        self.connections = connections
        self.h3: H3Connection | None = None
        self.streams: dict[int, H3Stream] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._arrival = (0.0, 0)
        connections.add(self)

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self._arrival = (self._loop.time(), time.time_ns())
        self.peer = (addr[0], addr[1])
        super().datagram_received(data, addr)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted) and self.h3 is None:
            if event.alpn_protocol not in ALPN:
                self.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="h3 only")
                return
            self.h3 = H3Connection(self._quic)
        if isinstance(event, ConnectionTerminated):
            self.connections.discard(self)
            for stream in self.streams.values():
                stream.gone = True
                stream._ended.set()
        if self.h3 is not None:
            for h3_event in self.h3.handle_event(event):
                self._h3_event(h3_event)

    def _h3_event(self, event: H3Event) -> None:
        if isinstance(event, HeadersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is None:  # (a second HEADERS would be trailers: ignored)
                now, wall = self._arrival
                stream = H3Stream(self, event.stream_id, _decode(event.headers), now, wall)
                self.streams[event.stream_id] = stream
                task = self._loop.create_task(self._run(stream))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            if event.stream_ended:
                stream._ended.set()
        elif isinstance(event, DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._body += event.data
                if event.stream_ended:
                    stream._ended.set()

    async def _run(self, stream: H3Stream) -> None:
        try:
            await self.handler(stream)
        except StreamGone:
            pass
        except Exception:
            log.exception("h3 handler failed on stream %s", stream.id)
            with contextlib.suppress(Exception):
                self._quic.reset_stream(stream.id, ErrorCode.H3_INTERNAL_ERROR)
                self.transmit()
        finally:
            self.streams.pop(stream.id, None)


def server_configuration(chain: Path, key: Path, keylog: TextIO | None) -> QuicConfiguration:
    """The edge's QUIC configuration: the lab's certificate chain and key, ALPN h3,
    secrets appended to ``keylog``."""
    cfg = QuicConfiguration(is_client=False, alpn_protocols=ALPN, secrets_log_file=keylog)
    cfg.load_cert_chain(str(chain), str(key))
    return cfg


class H3Server:
    """The QUIC listener of one pre-bound UDP socket."""

    def __init__(self, handler: Handler, sock: socket.socket, cfg: QuicConfiguration) -> None:
        self.handler = handler
        self.sock = sock
        self.cfg = cfg
        self.local: tuple[str, int] = tuple(sock.getsockname()[:2])  # type: ignore[assignment]
        self.connections: set[H3ServerProtocol] = set()
        self.server: QuicServer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def protocol(quic: QuicConnection, **kwargs: Any) -> H3ServerProtocol:
            return H3ServerProtocol(quic, handler=self.handler, local=self.local,
                                    connections=self.connections, **kwargs)

        _, server = await loop.create_datagram_endpoint(
            lambda: QuicServer(configuration=self.cfg, create_protocol=protocol),
            sock=self.sock)
        self.server = server

    async def stop(self, timeout: float = 3.0) -> None:
        """Let running requests finish (bounded), then CONNECTION_CLOSE every connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(c.streams for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.close()
            self.server = None
        await asyncio.sleep(0)


# ---------------------------------------------------------------------- client


class H3Exchange:
    """One request on an :class:`H3Client` and its answer."""

    def __init__(self, stream_id: int) -> None:
        loop = asyncio.get_running_loop()
        self.stream_id = stream_id
        self.headers: asyncio.Future[tuple[int, list[tuple[str, str]]]] = loop.create_future()
        self.chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.first_byte: tuple[float, int] | None = None
        """(loop time, wall ns) of the datagram that carried the answer's HEADERS."""
        self.last_byte: tuple[float, int] | None = None
        """(loop time, wall ns) of the datagram that ended the answer's stream."""

    def fail(self, exc: BaseException) -> None:
        if not self.headers.done():
            self.headers.set_exception(exc)
            self.headers.exception()
        self.chunks.put_nowait(exc)

    async def response(self) -> tuple[int, list[tuple[str, str]]]:
        return await self.headers

    async def body(self) -> Any:
        while True:
            item = await self.chunks.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class H3Error(Exception):
    """An HTTP/3 request or connection failed (the lab records it)."""


class H3Client(QuicConnectionProtocol):
    """A client QUIC connection speaking HTTP/3; open it with :meth:`open`."""

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.h3 = H3Connection(quic)
        self.exchanges: dict[int, H3Exchange] = {}
        self.local = ""
        self.cipher: str | None = None
        self.terminated: str | None = None
        self._arrival = (0.0, 0)

    @classmethod
    async def open(cls, ip: str, port: int, sni: str, cadata: bytes | None, source: str,
                   timeout: float, keylog: TextIO | None = None,
                   verify: bool = True) -> H3Client:
        """Connect from ``source`` (an ephemeral UDP port) and finish the handshake."""
        loop = asyncio.get_running_loop()
        cfg = QuicConfiguration(is_client=True, alpn_protocols=ALPN, server_name=sni,
                                secrets_log_file=keylog, cadata=cadata,
                                verify_mode=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((source, 0))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise H3Error(f"cannot bind {source}: {exc}") from exc
        _, proto = await loop.create_datagram_endpoint(
            lambda: cls(QuicConnection(configuration=cfg)), sock=sock)
        host, lport = sock.getsockname()[:2]
        proto.local = f"{host}:{lport}"
        proto.connect((ip, port))
        try:
            await asyncio.wait_for(proto.wait_connected(), timeout)
        except (TimeoutError, ConnectionError) as exc:
            proto.close()
            proto._transport.close()  # type: ignore[union-attr]
            raise H3Error(f"QUIC handshake with {ip}:{port} failed: {exc!r}") from exc
        return proto

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self._arrival = (self._loop.time(), time.time_ns())
        super().datagram_received(data, addr)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted):
            ks = getattr(self._quic.tls, "key_schedule", None)
            suite = getattr(ks, "cipher_suite", None)
            self.cipher = f"TLS_{suite.name}" if suite is not None else None
        if isinstance(event, ConnectionTerminated):
            self.terminated = event.reason_phrase or f"error 0x{event.error_code:x}"
            for pending in self.exchanges.values():
                pending.fail(H3Error(f"connection closed: {self.terminated}"))
        for h3_event in self.h3.handle_event(event):
            ex = self.exchanges.get(getattr(h3_event, "stream_id", -1))
            if ex is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                if not ex.headers.done():
                    ex.first_byte = self._arrival
                    got = _decode(h3_event.headers)
                    status = int(next((v for k, v in got if k == ":status"), "0"))
                    ex.headers.set_result((status, [(k, v) for k, v in got
                                                    if not k.startswith(":")]))
            elif isinstance(h3_event, DataReceived) and h3_event.data:
                ex.chunks.put_nowait(h3_event.data)
            if getattr(h3_event, "stream_ended", False):
                ex.last_byte = self._arrival
                if not ex.headers.done():
                    ex.fail(H3Error("stream ended before the response headers"))
                else:
                    ex.chunks.put_nowait(None)
                self.exchanges.pop(ex.stream_id, None)

    @property
    def closed(self) -> bool:
        return self.terminated is not None

    def start(self, headers: list[tuple[str, str]], body: bytes = b"") -> H3Exchange:
        """Send one request (HEADERS, then the body if any) on a new stream."""
        if self.terminated is not None:
            raise H3Error(f"connection closed: {self.terminated}")
        stream_id = self._quic.get_next_available_stream_id()
        ex = self.exchanges[stream_id] = H3Exchange(stream_id)
        self.h3.send_headers(stream_id, _encode(headers), end_stream=not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()
        return ex

    async def aclose(self) -> None:
        """CONNECTION_CLOSE (no error), then release the socket."""
        with contextlib.suppress(Exception):
            self.close()
            await asyncio.wait_for(self.wait_closed(), 0.5)
        if self._transport is not None:
            self._transport.close()
