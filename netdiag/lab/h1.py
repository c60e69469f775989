"""Lean asyncio HTTP/1.1 for the lab: a keep-alive server, a client connection, pools.

The lab's hops speak HTTP/2 by default; real proxies also speak HTTP/1.1 upstream
(an edge to its routers, a router to its backends), so the lab can too:

* :class:`H1ServerProtocol` serves HTTP/1.1 (cleartext, or over TLS when the client's
  ALPN chose ``http/1.1``) with the same :class:`H1Stream` interface as the HTTP/2
  server's ``Stream`` (pseudo-headers ``:method``, ``:path``, ``:authority``,
  ``send_headers``, ``send_data``, ``t_headers``), so one handler serves both. Requests
  on a connection are handled one after the other (no pipelining), keep-alive unless
  the client asks ``connection: close``; an answer without ``content-length`` is sent
  in chunked encoding (server-sent events too), one chunk per ``send_data``.
* :class:`H1ClientConnection`: one request at a time on a TCP (or TLS) connection
  from a pre-bound source socket, its answer read as it arrives, ``on_headers`` called
  from the very callback that read the response head (as ``H2ClientConnection``).
* :class:`H1Pool`: keep-alive connections to one server, each carrying one request at
  a time; a new one is opened only when every connection is busy, at most ``cap``.
* :func:`start_http_server`: serve a handler on pre-bound sockets; over TLS each
  connection gets HTTP/2 or HTTP/1.1 by its ALPN, in cleartext the protocol asked for.

Ordinals: each side counts the requests of a connection from 0 in the order they
were sent (the client) or received (the server) -- the same numbers, since requests
never overlap on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from netdiag.lab.h2client import Answer, OnHeaders, UpstreamError, connect
from netdiag.lab.h2server import RequestHead, ServerConnection, StreamGone
from netdiag.lab.sockets import bound_socket

log = logging.getLogger("netdiag.lab.h1")

MAX_HEAD = 64 * 1024
"""Largest request or response head read."""
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                        "upgrade", "te", "trailer"})
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found",
           429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable"}
_HEAD_END = re.compile(rb"\r?\n\r?\n")

Handler = Callable[[Any], Awaitable[None]]


def _endpoint(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}"


def _parse_fields(lines: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            out.append((name.strip().lower(), value.strip()))
    return out


def _tokens(fields: list[tuple[str, str]], name: str) -> set[str]:
    return {t.strip().lower() for k, v in fields if k == name for t in v.split(",")}


class _Body:
    """Incremental HTTP/1.1 body framing: ``length`` bytes, chunked, or until close."""

    def __init__(self, length: int | None, chunked: bool) -> None:
        self.left = length
        self.chunked = chunked
        self.until_close = length is None and not chunked
        self.done = length == 0 and not chunked
        self._state = "size"  # chunked: size, data, crlf, trailer

    def feed(self, buf: bytearray) -> list[bytes]:
        """Consume what it can of ``buf``; the body pieces found (``done`` at the end)."""
        out: list[bytes] = []
        if self.until_close:
            if buf:
                out.append(bytes(buf))
                del buf[:]
            return out
        if not self.chunked:
            assert self.left is not None
            take = min(self.left, len(buf))
            if take:
                out.append(bytes(buf[:take]))
                del buf[:take]
                self.left -= take
            self.done = self.left == 0
            return out
        while buf and not self.done:
            if self._state == "size":
                end = buf.find(b"\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ValueError("chunk-size line too long")
                    return out
                line = bytes(buf[:end]).strip().split(b";")[0]
                del buf[:end + 1]
                self.left = int(line, 16)
                self._state = "data" if self.left else "trailer"
            elif self._state == "data":
                assert self.left is not None
                take = min(self.left, len(buf))
                out.append(bytes(buf[:take]))
                del buf[:take]
                self.left -= take
                if self.left == 0:
                    self._state = "crlf"
            elif self._state == "crlf":
                end = buf.find(b"\n")
                if end < 0:
                    return out
                del buf[:end + 1]
                self._state = "size"
            else:  # trailer section: lines until an empty one
                end = buf.find(b"\n")
                if end < 0:
                    return out
                line = bytes(buf[:end]).strip()
                del buf[:end + 1]
                if not line:
                    self.done = True
        return out


def _framing(fields: list[tuple[str, str]]) -> tuple[int | None, bool]:
    """(content length, chunked) of a message's fields."""
    if "chunked" in _tokens(fields, "transfer-encoding"):
        return None, True
    for k, v in fields:
        if k == "content-length":
            return int(v), False
    return None, False


# ---------------------------------------------------------------------- server


class H1Stream(RequestHead):
    """One HTTP/1.1 request on a server connection, with the HTTP/2 ``Stream`` interface."""

    def __init__(self, proto: H1ServerProtocol, ordinal: int, method: str, target: str,
                 fields: list[tuple[str, str]], keep_alive: bool, t_headers: float,
                 wall: int) -> None:
        self.proto: H1ServerProtocol = proto
        self.ordinal = ordinal
        """0-based position of the request on its connection."""
        self.stream_id: int | None = None
        self.id = ordinal
        host = next((v for k, v in fields if k == "host"), "")
        self.headers: list[tuple[str, str]] = [
            (":method", method), (":scheme", proto.scheme), (":authority", host),
            (":path", target)] + [(k, v) for k, v in fields if k != "host"]
        self.t_headers = t_headers
        """Loop time at which the request head's first bytes were read."""
        self.wall_headers = wall
        """Wall clock (``time.time_ns()``) of that same moment."""
        self.keep_alive = keep_alive
        self._body = bytearray()
        self._ended = asyncio.Event()
        self._answered = asyncio.Event()
        self.gone = False
        self._chunked = False
        self._sent_head = False

    @property
    def answered(self) -> bool:
        """The whole answer was sent."""
        return self._answered.is_set()

    async def body(self) -> bytes:
        await self._ended.wait()
        if self.gone:
            raise StreamGone(f"request {self.ordinal} is gone")
        return bytes(self._body)

    def send_headers(self, status: int, headers: list[tuple[str, str]],
                     end_stream: bool = False) -> None:
        if self.gone or self.proto.closing:
            raise StreamGone(f"request {self.ordinal} is gone")
        out = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        names = {k.lower() for k, _ in out}
        if end_stream:
            if "content-length" not in names:
                out.append(("content-length", "0"))
        elif "content-length" not in names:
            self._chunked = True
            out.append(("transfer-encoding", "chunked"))
        if not self.keep_alive:
            out.append(("connection", "close"))
        head = f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in out) + "\r\n"
        self._sent_head = True
        self.proto.write(head.encode("latin-1"))
        if end_stream:
            self._finish()

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        if self.gone or self.proto.closing:
            raise StreamGone(f"request {self.ordinal} is gone")
        if self._chunked:
            out = (b"%x\r\n%s\r\n" % (len(data), data)) if data else b""
            if end_stream:
                out += b"0\r\n\r\n"
        else:
            out = data
        if out:
            self.proto.write(out)
        if end_stream:
            self._finish()

    def _finish(self) -> None:
        self._answered.set()


class H1ServerProtocol(ServerConnection):
    """One server-side HTTP/1.1 connection; requests handled one at a time, in order."""

    def __init__(self, handler: Handler, connections: set[Any] | None = None,
                 scheme: str = "http") -> None:
        self.handler = handler
        self.connections = connections
        self.scheme = scheme
        self.transport: asyncio.Transport | None = None
        self.local: tuple[str, int] = ("", 0)
        self.peer: tuple[str, int] = ("", 0)
        self.closing = False
        self._buf = bytearray()
        self._body: _Body | None = None
        self._receiving: H1Stream | None = None
        self._queue: deque[H1Stream] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._ordinal = 0
        self._head_t: float | None = None
        self._head_wall = 0
        self._arrival: float | None = None
        self._arrival_wall = 0
        self._goaway = False
        self.streams: dict[int, H1Stream] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._accepted(transport)  # bytes read in this callback arrived when it began
        if self.connections is not None:
            self.connections.add(self)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self._arrival is not None:
            now, wall = self._arrival, self._arrival_wall
        else:
            now, wall = asyncio.get_running_loop().time(), time.time_ns()
        if self._head_t is None and self._receiving is None:
            self._head_t, self._head_wall = now, wall
        self._buf += data
        try:
            self._parse()
        except ValueError as exc:
            log.warning("HTTP/1.1 parse error from %s: %s", self.peer, exc)
            self.close()

    def _parse(self) -> None:
        while self._buf and not self.closing:
            if self._receiving is not None:
                assert self._body is not None
                for piece in self._body.feed(self._buf):
                    self._receiving._body += piece
                if not self._body.done:
                    return
                self._receiving._ended.set()
                self._receiving, self._body = None, None
                if self._buf:
                    self._head_t = asyncio.get_running_loop().time()
                    self._head_wall = time.time_ns()
                continue
            while self._buf[:2] == b"\r\n":
                del self._buf[:2]
            match = _HEAD_END.search(self._buf)
            if match is None:
                if len(self._buf) > MAX_HEAD:
                    raise ValueError("request head too long")
                return
            head = bytes(self._buf[:match.start()]).decode("latin-1")
            del self._buf[:match.end()]
            line, *rest = head.split("\n")
            parts = line.strip().split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                raise ValueError(f"bad request line {line[:60]!r}")
            method, target, version = parts
            fields = _parse_fields([x.rstrip("\r") for x in rest])
            conn_tokens = _tokens(fields, "connection")
            keep = ("close" not in conn_tokens if version == "HTTP/1.1"
                    else "keep-alive" in conn_tokens)
            length, chunked = _framing(fields)
            t = self._head_t if self._head_t is not None else asyncio.get_running_loop().time()
            stream = H1Stream(self, self._ordinal, method, target, fields, keep, t,
                              self._head_wall or time.time_ns())
            self._ordinal += 1
            self._head_t = None
            self.streams[stream.ordinal] = stream
            body = _Body(length if (length is not None or chunked) else 0, chunked)
            if body.done:
                stream._ended.set()
            else:
                self._receiving, self._body = stream, body
            self._queue.append(stream)
            if self._worker is None:
                self._worker = asyncio.get_running_loop().create_task(self._work())
            if self._buf and self._receiving is None:
                self._head_t = asyncio.get_running_loop().time()
                self._head_wall = time.time_ns()

    async def _work(self) -> None:
        try:
            while self._queue and not self.closing:
                stream = self._queue.popleft()
                try:
                    await self.handler(stream)
                except StreamGone:
                    pass
                except Exception:
                    log.exception("handler failed on request %s", stream.ordinal)
                    if not stream._sent_head:
                        with contextlib.suppress(StreamGone):
                            stream.send_headers(500, [], end_stream=True)
                finally:
                    self.streams.pop(stream.ordinal, None)
                if not stream.answered or not stream.keep_alive:
                    self.close()  # the server closes first: no RST from anyone
                    return
            if self._goaway and not self.streams:
                self.close()
        finally:
            self._worker = None

    def goaway(self) -> None:
        """Close when idle (a keep-alive connection has no GOAWAY)."""
        self._goaway = True
        if not self.streams and self._worker is None:
            self.close()

    def close(self) -> None:
        if not self.closing and self.transport is not None:
            self.closing = True
            self.transport.close()

    def eof_received(self) -> bool | None:
        if self._receiving is not None or self._worker is None:
            self.close()
        else:
            self._goaway = True  # answer the request in hand, then close
        # over TLS the transport closes anyway (no half-close): do not ask otherwise
        return None if self.scheme == "https" else True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.connections is not None:
            self.connections.discard(self)
        for stream in self.streams.values():
            stream.gone = True
            stream._ended.set()


class _AlpnDispatch(asyncio.Protocol):
    """A TLS connection's protocol by its ALPN: HTTP/2 for ``h2``, else HTTP/1.1."""

    def __init__(self, handler: Handler, connections: set[Any],
                 max_streams: int | None = None, connection_window: int | None = None
                 ) -> None:
        self.handler = handler
        self.connections = connections
        self.max_streams = max_streams
        self.connection_window = connection_window

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from netdiag.lab.h2server import H2ServerProtocol

        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        proto: asyncio.Protocol = (H2ServerProtocol(self.handler, self.connections,
                                                    self.max_streams, self.connection_window)
                                   if alpn == "h2" else
                                   H1ServerProtocol(self.handler, self.connections, "https"))
        transport.set_protocol(proto)
        proto.connection_made(transport)


async def start_http_server(handler: Handler, socks: list[socket.socket],
                            ssl_context: ssl.SSLContext | None = None,
                            cleartext: str = "h2", max_streams: int | None = None,
                            connection_window: int | None = None
                            ) -> tuple[list[asyncio.Server], set[Any]]:
    """Serve ``handler`` on pre-bound listening sockets.

    Over TLS a connection speaks what its ALPN chose (``h2``, else HTTP/1.1); in
    cleartext ``cleartext``: ``h2`` (prior knowledge, h2c) or ``http1``. HTTP/2
    connections advertise ``max_streams`` concurrent streams (None: h2's 100) and open
    their connection-level receive window to ``connection_window`` bytes (None: the
    protocol's 65,535). Stop it with ``netdiag.lab.h2server.stop_h2_server``.
    """
    from netdiag.lab.h2server import H2ServerProtocol

    loop = asyncio.get_running_loop()
    connections: set[Any] = set()

    def factory() -> asyncio.Protocol:
        if ssl_context is not None:
            return _AlpnDispatch(handler, connections, max_streams, connection_window)
        if cleartext == "http1":
            return H1ServerProtocol(handler, connections, "http")
        return H2ServerProtocol(handler, connections, max_streams, connection_window)

    servers = [await loop.create_server(factory, sock=sock, ssl=ssl_context, backlog=1024)
               for sock in socks]
    return servers, connections


# ---------------------------------------------------------------------- client


class H1Exchange(Answer):
    """One request on an :class:`H1ClientConnection` and its answer (``Exchange``'s API)."""

    def __init__(self, conn: H1ClientConnection, ordinal: int,
                 on_headers: OnHeaders | None) -> None:
        super().__init__(on_headers)
        self.conn: H1ClientConnection = conn
        self.ordinal = ordinal
        """0-based position of the request on its connection."""
        self.stream_id: int | None = None
        self.complete = False

    def cancel(self) -> None:
        """The answer is no longer wanted: the connection cannot be reused, close it."""
        if not self.complete:
            self.conn.abandon()

    def send_body(self, body: bytes) -> None:  # pragma: no cover - the body goes in start()
        raise UpstreamError("HTTP/1.1 requests are sent whole")


class H1ClientConnection(asyncio.Protocol):
    """One client-side HTTP/1.1 connection (TLS when opened with a context)."""

    def __init__(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.local = ""
        self.server = ""
        self.tls_version: str | None = None
        self.closed = False
        """No further request may be sent (closing, closed, or the server said close)."""
        self.sent = 0
        """Requests sent so far (the next request's ordinal)."""
        self._ex: H1Exchange | None = None
        self._buf = bytearray()
        self._body: _Body | None = None
        self._lost: asyncio.Future[None] = loop.create_future()
        self._server_closes = False

    @classmethod
    async def open(cls, ip: str, port: int, sni: str | None, ctx: ssl.SSLContext | None,
                   sock: socket.socket, timeout: float) -> H1ClientConnection:
        """Connect ``sock`` (see ``bound_socket``) to ``ip:port``, TLS if ``ctx``."""
        def made() -> H1ClientConnection:
            conn = cls(timeout)
            conn.server = f"{ip}:{port}"
            return conn

        self = await connect(made, sock, ip, port, sni, ctx, timeout)
        assert self.transport is not None
        if ctx is not None:
            ssl_object = self.transport.get_extra_info("ssl_object")
            alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if ssl_object is None or alpn not in (None, "http/1.1"):
                self.transport.close()
                raise UpstreamError(f"{sni} did not negotiate http/1.1 (got {alpn})")
            self.tls_version = ssl_object.version()
        return self

    @property
    def idle(self) -> bool:
        """Ready for a request."""
        return self._ex is None and not self.closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local = _endpoint(transport.get_extra_info("sockname"))

    def start(self, headers: list[tuple[str, str]], body: bytes,
              on_headers: OnHeaders | None = None, close: bool = False) -> H1Exchange:
        """Send a whole request (HTTP/2-style pseudo-headers in ``headers``)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamError("the connection is closed")
        if self._ex is not None:
            raise UpstreamError("the connection is busy")
        pseudo = {k: v for k, v in headers if k.startswith(":")}
        method = pseudo.get(":method", "GET")
        lines = [f"{method} {pseudo.get(':path', '/')} HTTP/1.1",
                 f"host: {pseudo.get(':authority', '')}"]
        lines += [f"{k}: {v}" for k, v in headers
                  if not k.startswith(":") and k not in HOP_BY_HOP and k not in (
                      "host", "content-length")]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"content-length: {len(body)}")
        if close:
            lines.append("connection: close")
            self._server_closes = True
            self.closed = True
        ex = self._ex = H1Exchange(self, self.sent, on_headers)
        self.sent += 1
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return ex

    def data_received(self, data: bytes) -> None:
        started = asyncio.get_running_loop().time()
        self._buf += data
        try:
            self._parse(started)
        except ValueError as exc:
            self._fail(UpstreamError(f"upstream protocol error: {exc}"))
            self.abandon()

    def _parse(self, started: float) -> None:
        while self._buf:
            ex = self._ex
            if ex is None:
                raise ValueError(f"{len(self._buf)} bytes without a request")
            if self._body is None:
                match = _HEAD_END.search(self._buf)
                if match is None:
                    if len(self._buf) > MAX_HEAD:
                        raise ValueError("response head too long")
                    return
                head = bytes(self._buf[:match.start()]).decode("latin-1")
                del self._buf[:match.end()]
                line, *rest = head.split("\n")
                parts = line.strip().split(None, 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                    raise ValueError(f"bad status line {line[:60]!r}")
                status = int(parts[1])
                if 100 <= status < 200:
                    continue
                fields = _parse_fields([x.rstrip("\r") for x in rest])
                if "close" in _tokens(fields, "connection"):
                    self.closed = True
                    self._server_closes = True
                length, chunked = _framing(fields)
                if status in (204, 304):
                    length, chunked = 0, False
                self._body = _Body(length, chunked)
                if self._body.until_close:
                    self.closed = True
                    self._server_closes = True
                if ex.on_headers is not None:
                    try:
                        ex.on_headers(status, fields, started)
                    except Exception as exc:  # the relaying side is gone
                        ex.fail(UpstreamError(f"relaying the answer failed: {exc!r}"))
                        self.abandon()
                        return
                if not ex.headers.done():
                    ex.headers.set_result((status, fields))
            for piece in self._body.feed(self._buf):
                if piece:
                    ex.chunks.put_nowait(piece)
            if not self._body.done:
                return
            self._end()

    def _end(self) -> None:
        ex, self._ex, self._body = self._ex, None, None
        if ex is not None:
            ex.complete = True
            ex.chunks.put_nowait(None)

    def _fail(self, exc: BaseException) -> None:
        ex, self._ex, self._body = self._ex, None, None
        if ex is not None:
            ex.fail(exc)

    def eof_received(self) -> bool | None:
        self.closed = True
        if self._body is not None and self._body.until_close:
            self._end()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._body is not None and self._body.until_close:
            self._end()
        self._fail(UpstreamError("upstream closed the connection"))
        if not self._lost.done():
            self._lost.set_result(None)

    def abandon(self) -> None:
        """Close now (an answer is being dropped)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def close(self) -> None:
        """Close: wait for the server to close first when it said it would, else close."""
        self.closed = True
        if self.transport is None:
            return
        if self._server_closes:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._lost), min(self.timeout, 2.0))
        self.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._lost), min(self.timeout, 2.0))


class H1Pool:
    """HTTP/1.1 keep-alive connections to one server from ``source_ip``.

    :meth:`acquire` hands out an idle connection (the most recently used first), else
    opens a new one while fewer than ``cap`` exist, else waits for one to be released.
    ``on_open(conn)`` is called for every connection opened.
    """

    def __init__(self, ip: str, port: int, sni: str | None, ctx: ssl.SSLContext | None,
                 source_ip: str, timeout: float, cap: int,
                 on_open: Callable[[H1ClientConnection], None] | None = None) -> None:
        self.ip = ip
        self.port = port
        self.sni = sni
        self.ctx = ctx
        self.source_ip = source_ip
        self.timeout = timeout
        self.cap = cap
        self.on_open = on_open
        self._idle: list[H1ClientConnection] = []
        self._all: set[H1ClientConnection] = set()
        self._opening = 0
        self._released = asyncio.Event()

    async def acquire(self) -> H1ClientConnection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            while self._idle:
                conn = self._idle.pop()
                if conn.idle:
                    return conn
                self._all.discard(conn)
            if len(self._all) + self._opening < self.cap:
                self._opening += 1
                try:
                    try:
                        sock = bound_socket(self.source_ip)
                    except OSError as exc:
                        raise UpstreamError(f"cannot bind {self.source_ip}: {exc}") from exc
                    conn = await H1ClientConnection.open(self.ip, self.port, self.sni,
                                                         self.ctx, sock, self.timeout)
                finally:
                    self._opening -= 1
                self._all.add(conn)
                if self.on_open is not None:
                    self.on_open(conn)
                return conn
            self._released.clear()
            left = deadline - loop.time()
            if left <= 0:
                raise UpstreamError(f"no free connection to {self.ip}:{self.port} in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), left)

    def release(self, conn: H1ClientConnection) -> None:
        """Give a connection back after its answer was read (or dropped)."""
        if conn.idle:
            self._idle.append(conn)
        else:
            self._all.discard(conn)
            if not conn.closed:
                conn.abandon()
        self._released.set()

    async def close(self) -> None:
        conns, self._all, self._idle = list(self._all), set(), []
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
