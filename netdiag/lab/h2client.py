"""A small asyncio HTTP/2 client connection (TLS, or cleartext with prior knowledge).

The ROC router opens a new upstream TLS connection per request (the anti-pattern the
lab exists to show) and the edge keeps one pooled h2c connection to the router;
httpx would hide both behind a pool, so they use this: TCP from a chosen source
address, TLS with the lab's client context (which writes the key log) or none, the h2
preface, any number of streams, then GOAWAY and a clean close (the server closes
first, so no RST is ever sent).

It is an ``asyncio.Protocol`` so that an answer's HEADERS reach the caller inside the
very callback that read them (``on_headers``): a proxy relaying them from there adds
no event-loop round trips to the time it is measured by.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from netdiag.lab.sockets import bound_socket

OnHeaders = Callable[[int, list[tuple[str, str]], float], None]


class UpstreamError(Exception):
    """The upstream request failed (connection, TLS, protocol or stream reset)."""


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_writer(fd)


P = TypeVar("P", bound=asyncio.Protocol)


async def connect(made: Callable[[], P], sock: socket.socket, ip: str, port: int,
                  sni: str | None, ctx: ssl.SSLContext | None, timeout: float) -> P:
    """Connect ``sock`` (non-blocking, see :func:`bound_socket`) to ``ip:port`` and run
    the protocol ``made()`` returns on it, TLS (server name ``sni``) if ``ctx``. The SYN
    leaves before the protocol is made, and both before this coroutine first yields.
    Where it cannot connect in ``timeout`` seconds, ``sock`` is closed and
    :class:`UpstreamError` raised."""
    err = sock.connect_ex((ip, port))
    loop = asyncio.get_running_loop()
    proto = made()
    try:
        if err == errno.EINPROGRESS:
            await asyncio.wait_for(_writable(loop, sock), timeout)
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err not in (0, errno.EISCONN):
            raise OSError(err, os.strerror(err))
        await asyncio.wait_for(loop.create_connection(
            lambda: proto, sock=sock, ssl=ctx, server_hostname=sni if ctx else None),
            timeout)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        sock.close()
        raise UpstreamError(f"cannot connect to {sni or ip} ({ip}:{port}): {exc!r}") from exc
    return proto


class _Timed(Protocol):
    timeout: float
    """Seconds to wait for an answer's head, and between its chunks."""


class Answer:
    """The answer to one upstream request as its connection delivers it: the head
    (status, headers) once, then the body chunk by chunk, ``None`` at its end, or the
    exception that ended it. Waits for each at most ``conn.timeout`` seconds.
    :class:`Exchange` (HTTP/2) and ``netdiag.lab.h1.H1Exchange`` (HTTP/1.1) are one."""

    conn: _Timed

    def __init__(self, on_headers: OnHeaders | None) -> None:
        loop = asyncio.get_running_loop()
        self.on_headers = on_headers
        self.headers: asyncio.Future[tuple[int, list[tuple[str, str]]]] = loop.create_future()
        self.chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

    def fail(self, exc: BaseException) -> None:
        if not self.headers.done():
            self.headers.set_exception(exc)
            self.headers.exception()  # retrieved: no "never retrieved" noise
        self.chunks.put_nowait(exc)

    async def response(self) -> tuple[int, list[tuple[str, str]]]:
        """(status, headers) of the answer."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.headers), self.conn.timeout)
        except TimeoutError as exc:
            raise UpstreamError("no answer from upstream in time") from exc

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body, chunk by chunk as it arrives."""
        while True:
            try:
                item = await asyncio.wait_for(self.chunks.get(), self.conn.timeout)
            except TimeoutError as exc:
                raise UpstreamError("upstream body stalled") from exc
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class Exchange(Answer):
    """One request on an :class:`H2ClientConnection` and its answer."""

    def __init__(self, conn: H2ClientConnection, stream_id: int,
                 on_headers: OnHeaders | None) -> None:
        super().__init__(on_headers)
        self.conn: H2ClientConnection = conn
        self.stream_id = stream_id
        self.ordinal: int | None = None
        """HTTP/1.1 requests count; HTTP/2 ones have a stream id."""

    def cancel(self) -> None:
        """Reset the stream (the answer is no longer wanted) and forget it."""
        if self.conn.exchanges.pop(self.stream_id, None) is not None:
            with contextlib.suppress(Exception):
                self.conn.conn.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
                self.conn.flush()

    def send_body(self, body: bytes) -> None:
        """The request body (after ``start(..., end_stream=False)``), ending the stream."""
        self.conn.send_data(self.stream_id, body)


class H2ClientConnection(asyncio.Protocol):
    """One client-side HTTP/2 connection."""

    def __init__(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.timeout = timeout
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.local = ""
        self.tls_version: str | None = None
        self.exchanges: dict[int, Exchange] = {}
        self.closed = False
        self._lost: asyncio.Future[None] = loop.create_future()
        self._window = asyncio.Event()
        self._first: tuple[list[tuple[str, str]], bytes, OnHeaders | None] | None = None
        self.first: Exchange | None = None
        self.first_written: tuple[float, float] | None = None
        """Wall-clock readings (``time.time()``) right before and right after the first
        request (``open``'s ``first``) was written to the socket: its HEADERS crossed the
        wire between the two, however late the process ran."""

    @classmethod
    async def open(cls, ip: str, port: int, sni: str | None, ctx: ssl.SSLContext | None,
                   sock: socket.socket, timeout: float,
                   first: tuple[list[tuple[str, str]], bytes, OnHeaders | None] | None = None
                   ) -> H2ClientConnection:
        """Connect ``sock`` (see :func:`bound_socket`) to ``ip:port``, TLS if ``ctx``, h2.

        The SYN leaves before this coroutine first yields. ``first`` (headers, body,
        on_headers) is sent with the connection preface, in the callback that sees the
        handshake complete, as browsers, curl and httpx do; it is then ``self.first``.
        """
        def made() -> H2ClientConnection:
            conn = cls(timeout)
            conn._first = first
            return conn

        self = await connect(made, sock, ip, port, sni, ctx, timeout)
        assert self.transport is not None
        if ctx is not None:
            ssl_object = self.transport.get_extra_info("ssl_object")
            if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
                self.transport.close()
                raise UpstreamError(f"{sni} did not negotiate h2")
            self.tls_version = ssl_object.version()
        return self

    # ------------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local = "{}:{}".format(*transport.get_extra_info("sockname")[:2])
        self.conn.initiate_connection()
        if self._first is None:
            self.flush()
            return
        headers, body, on_headers = self._first
        self.first = self.start(headers, not body, on_headers, flush=False)
        if body:
            self.send_data(self.first.stream_id, body, flush=False)
        before = time.time()
        self.flush()
        self.first_written = (before, time.time())

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        started = asyncio.get_running_loop().time()
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._fail_all(UpstreamError(f"upstream protocol error: {exc}"))
            return
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                ex = self.exchanges.get(event.stream_id)
                if ex is None:
                    continue
                resp = [(str(k), str(v)) for k, v in event.headers]
                status = int(dict(resp)[":status"])
                headers = [(k, v) for k, v in resp if not k.startswith(":")]
                if ex.on_headers is not None:
                    try:
                        ex.on_headers(status, headers, started)
                    except Exception as exc:  # the relaying side is gone: drop the stream
                        ex.fail(UpstreamError(f"relaying the answer failed: {exc!r}"))
                        ex.cancel()
                        continue
                if not ex.headers.done():
                    ex.headers.set_result((status, headers))
                if event.stream_ended is not None:
                    self._end(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
                ex = self.exchanges.get(event.stream_id)
                if ex is not None and event.data:
                    ex.chunks.put_nowait(event.data)
                if event.stream_ended is not None:
                    self._end(event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._end(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                ex = self.exchanges.pop(event.stream_id, None)
                if ex is not None:
                    ex.fail(UpstreamError(f"upstream reset the stream: {event.error_code!r}"))
                self._window.set()
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                self._window.set()
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = True
                last = event.last_stream_id or 0
                for sid in [s for s in self.exchanges if s > last]:
                    self.exchanges.pop(sid).fail(UpstreamError("upstream sent GOAWAY"))
        self.flush()

    def _end(self, stream_id: int) -> None:
        ex = self.exchanges.pop(stream_id, None)
        if ex is not None:
            ex.chunks.put_nowait(None)
        self._window.set()  # a stream slot may be free again

    def _fail_all(self, exc: BaseException) -> None:
        self.closed = True
        for ex in self.exchanges.values():
            ex.fail(exc)
        self.exchanges.clear()
        self._window.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(UpstreamError("upstream closed the connection"))
        if not self._lost.done():
            self._lost.set_result(None)

    # ------------------------------------------------------------------ API

    def start(self, headers: list[tuple[str, str]], end_stream: bool,
              on_headers: OnHeaders | None = None, flush: bool = True) -> Exchange:
        """Send a request's HEADERS now; the body follows with ``Exchange.send_body``.

        ``on_headers(status, headers, started)`` is called from the callback that read
        the answer's HEADERS; ``started`` is the loop time at which that callback began.
        """
        if self.closed:
            raise UpstreamError("the connection is closed")
        try:
            sid = self.conn.get_next_available_stream_id()
            self.conn.send_headers(sid, headers, end_stream=end_stream)
        except (h2.exceptions.TooManyStreamsError, h2.exceptions.NoAvailableStreamIDError,
                h2.exceptions.ProtocolError) as exc:
            raise UpstreamError(f"cannot start a stream: {exc!r}") from exc
        ex = self.exchanges[sid] = Exchange(self, sid, on_headers)
        if flush:
            self.flush()
        return ex

    def send_data(self, stream_id: int, body: bytes, flush: bool = True) -> None:
        """Send a (small) request body and end the stream."""
        try:
            if body:
                self.conn.send_data(stream_id, body, end_stream=True)
            else:
                self.conn.end_stream(stream_id)
        except h2.exceptions.FlowControlError as exc:  # the lab's bodies are tiny
            raise UpstreamError(f"request body too large for the window: {exc}") from exc
        except h2.exceptions.StreamClosedError:
            return
        if flush:
            self.flush()

    async def send_data_when_open(self, stream_id: int, body: bytes) -> None:
        """``send_data``, first waiting (up to the timeout) for the flow-control window
        to take ``body`` whole: a busy server that has not read the previous bodies yet
        holds this one back instead of failing it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            if self.closed:
                raise UpstreamError("the connection is closed")
            try:
                room = min(self.conn.local_flow_control_window(stream_id),
                           self.conn.max_outbound_frame_size)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
                raise UpstreamError(f"the stream is gone: {exc!r}") from exc
            if room >= len(body):
                self.send_data(stream_id, body)
                return
            self._window.clear()
            left = deadline - loop.time()
            if left <= 0:
                raise UpstreamError("no flow-control window for the request body in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._window.wait(), left)

    async def request(self, headers: list[tuple[str, str]], body: bytes,
                      on_headers: OnHeaders | None = None) -> Exchange:
        """Send a whole request; await ``.response()`` / iterate ``.body()`` on the result."""
        ex = self.start(headers, not body, on_headers)
        if body:
            self.send_data(ex.stream_id, body)
        return ex

    @property
    def in_flight(self) -> int:
        """Streams open on the connection."""
        return len(self.exchanges)

    async def stream_slot(self) -> None:
        """Wait until the server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` allows one more
        stream (a pooled connection shared by more requests than that)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while (not self.closed and self.conn.open_outbound_streams
               >= self.conn.remote_settings.max_concurrent_streams):
            self._window.clear()
            left = deadline - loop.time()
            if left <= 0:
                raise UpstreamError("no free stream on the upstream connection in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._window.wait(), left)

    async def close(self) -> None:
        """GOAWAY, then wait for the server to close first, then close."""
        self.closed = True
        if self.transport is None:
            return
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._lost), min(self.timeout, 2.0))
        self.transport.close()


class H2Pool:
    """One shared, multiplexed HTTP/2 connection to a server, opened on first use.

    Concurrent callers share the connection being opened; a new one is opened when
    the server closed (or sent GOAWAY on) the last. ``on_open(conn)`` is called for
    every connection opened.
    """

    def __init__(self, ip: str, port: int, sni: str | None, ctx: ssl.SSLContext | None,
                 source_ip: str, timeout: float,
                 on_open: Callable[[H2ClientConnection], None] | None = None) -> None:
        self.ip = ip
        self.port = port
        self.sni = sni
        self.ctx = ctx
        self.source_ip = source_ip
        self.timeout = timeout
        self.on_open = on_open
        self.conn: H2ClientConnection | None = None
        self._opening: asyncio.Future[H2ClientConnection] | None = None
        self._old: list[H2ClientConnection] = []

    async def get(self) -> H2ClientConnection:
        """The pooled connection (opened now if there is none)."""
        if self.conn is not None and not self.conn.closed:
            return self.conn
        if self._opening is not None:
            return await asyncio.shield(self._opening)
        if self.conn is not None:
            self._old.append(self.conn)
            self.conn = None
        fut: asyncio.Future[H2ClientConnection] = asyncio.get_running_loop().create_future()
        self._opening = fut
        try:
            conn = await open_shared(fut, self.source_ip, self.ip, self.port, self.sni,
                                     self.ctx, self.timeout)
        finally:
            self._opening = None
        self.conn = conn
        if self.on_open is not None:
            self.on_open(conn)
        fut.set_result(conn)
        return conn

    async def close(self) -> None:
        """Close the pooled connection (GOAWAY; the server closes first)."""
        conns = [c for c in (*self._old, self.conn) if c is not None]
        self.conn, self._old = None, []
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


async def open_shared(fut: asyncio.Future[H2ClientConnection], source: str, ip: str,
                      port: int, sni: str | None, ctx: ssl.SSLContext | None,
                      timeout: float) -> H2ClientConnection:
    """An :class:`H2ClientConnection` to ``ip:port`` from a socket bound to ``source``
    (:func:`bound_socket`), opened for the requests waiting on ``fut``: where it fails,
    ``fut`` gets the error too (marked retrieved) and it is raised here."""
    try:
        try:
            sock = bound_socket(source)
        except OSError as exc:
            raise UpstreamError(f"cannot bind {source}: {exc}") from exc
        return await H2ClientConnection.open(ip, port, sni, ctx, sock, timeout)
    except BaseException as exc:
        fut.set_exception(exc)
        fut.exception()  # retrieved: no "never retrieved" noise
        raise
