"""A lean asyncio HTTP/2 server (h2 state machine, TLS or cleartext prior knowledge).

The lab's router and origins must add exactly the time they are told to and nothing
noticeable besides; a general-purpose ASGI server spends one to three milliseconds of
Python per request before the application even runs, which would blur the very
delays the lab injects. This server hands each request to a coroutine as soon as its
HEADERS frame is parsed, with the loop time of its arrival (``Stream.t_headers``), so
a handler can time its answer from the request's arrival on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

log = logging.getLogger("netdiag.lab.h2server")


class StreamGone(Exception):
    """The client reset the stream or the connection went away."""


class _Served(Protocol):
    local: tuple[str, int]
    """The server's own address and port on the connection."""


class RequestHead:
    """What a server's handler reads of a request's head, the same for an HTTP/2
    :class:`Stream` and an HTTP/1.1 ``netdiag.lab.h1.H1Stream``: its header fields,
    pseudo-headers included, in order."""

    headers: list[tuple[str, str]]
    proto: _Served
    _ended: asyncio.Event

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def method(self) -> str:
        return self.header(":method") or ""

    @property
    def path(self) -> str:
        return self.header(":path") or ""

    @property
    def ended(self) -> bool:
        """The request body is complete (HTTP/2: END_STREAM seen)."""
        return self._ended.is_set()

    @property
    def local(self) -> tuple[str, int]:
        """The server's own address and port on this connection."""
        return self.proto.local


class Stream(RequestHead):
    """One request: headers (as received), body, and a way to answer."""

    def __init__(self, proto: H2ServerProtocol, stream_id: int, headers: list[tuple[str, str]],
                 t_headers: float) -> None:
        self.proto: H2ServerProtocol = proto
        self.id = stream_id
        self.headers = headers
        self.t_headers = t_headers
        """Loop time at which the request's HEADERS frame was read."""
        self._body = bytearray()
        self._ended = asyncio.Event()
        self.gone = False
        self.wall_headers = 0
        """Wall clock (``time.time_ns()``) at which the HEADERS frame was read (the
        same moment as ``t_headers``)."""

    @property
    def stream_id(self) -> int:
        """The HTTP/2 stream id."""
        return self.id

    @property
    def ordinal(self) -> int | None:
        """HTTP/1.1 requests have an ordinal; HTTP/2 ones a stream id."""
        return None

    async def body(self) -> bytes:
        """The whole request body (waits for END_STREAM)."""
        await self._ended.wait()
        if self.gone:
            raise StreamGone(f"stream {self.id} is gone")
        return bytes(self._body)

    def send_headers(self, status: int, headers: list[tuple[str, str]],
                     end_stream: bool = False) -> None:
        if self.gone:
            raise StreamGone(f"stream {self.id} is gone")
        try:
            self.proto.conn.send_headers(self.id, [(":status", str(status)), *headers],
                                         end_stream=end_stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            raise StreamGone(str(exc)) from exc
        self.proto.flush()

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        conn = self.proto.conn
        view = memoryview(data)
        try:
            if not data and end_stream:
                conn.end_stream(self.id)
            while view:
                if self.gone:
                    raise StreamGone(f"stream {self.id} is gone")
                room = min(conn.local_flow_control_window(self.id), conn.max_outbound_frame_size)
                if room <= 0:
                    await self.proto.window_opened()
                    continue
                chunk, view = view[:room], view[room:]
                conn.send_data(self.id, chunk.tobytes(), end_stream=end_stream and not view)
            self.proto.flush()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            raise StreamGone(str(exc)) from exc


Handler = Callable[[Stream], Awaitable[None]]


class ServerConnection(asyncio.Protocol):
    """What the lab's HTTP/2 and HTTP/1.1 server connections (``netdiag.lab.h1``)
    share: their ends, and when the bytes read in the callback that accepted them
    arrived."""

    transport: asyncio.Transport | None
    local: tuple[str, int]
    peer: tuple[str, int]
    _arrival: float | None
    """Loop time when the current callback began (bytes read in it arrived then);
    None outside the callback that accepted the connection."""
    _arrival_wall: int
    """Wall clock (``time.time_ns()``) of that same moment."""

    def _accepted(self, transport: asyncio.BaseTransport) -> None:
        """The start of ``connection_made``: the arrival time first, then the ends, with
        Nagle's algorithm off."""
        loop = asyncio.get_running_loop()
        self._arrival = loop.time()
        self._arrival_wall = time.time_ns()
        loop.call_soon(self._forget_arrival)
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local = tuple(transport.get_extra_info("sockname")[:2])  # type: ignore[assignment]
        self.peer = tuple(transport.get_extra_info("peername")[:2])  # type: ignore[assignment]

    def _forget_arrival(self) -> None:
        self._arrival = None


class H2ServerProtocol(ServerConnection):
    """One server-side connection; each request runs ``handler(stream)`` in a task."""

    def __init__(self, handler: Handler, connections: set[H2ServerProtocol] | None = None,
                 max_streams: int | None = None, connection_window: int | None = None
                 ) -> None:
        self.handler = handler
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        if max_streams is not None:  # advertised in the first SETTINGS (h2's default: 100)
            self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE:
                    self.conn.DEFAULT_MAX_HEADER_LIST_SIZE})
        self.streams: dict[int, Stream] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.local: tuple[str, int] = ("", 0)
        self.peer: tuple[str, int] = ("", 0)
        self._window = asyncio.Event()
        self._goaway = False
        self._closed = False
        self._arrival: float | None = None
        self._arrival_wall = 0
        self._connection_window = connection_window

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Requests sent in the same flight as the client's Finished (browsers, curl,
        # httpx, our router) are read in this very callback, after the handshake's
        # own work: they arrived when it began.
        self._accepted(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() != "h2":
            transport.close()  # the lab speaks HTTP/2 only
            self._closed = True
            return
        if self.connections is not None:
            self.connections.add(self)
        self.conn.initiate_connection()
        if self._connection_window is not None:  # a WINDOW_UPDATE right after SETTINGS
            grow = self._connection_window - self.conn.inbound_flow_control_window
            if grow > 0:
                self.conn.increment_flow_control_window(grow)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self._closed:
            self.transport.write(data)

    async def window_opened(self) -> None:
        self._window.clear()
        await self._window.wait()

    def data_received(self, data: bytes) -> None:
        if self._arrival is not None:
            now, wall = self._arrival, self._arrival_wall
        else:
            now, wall = asyncio.get_running_loop().time(), time.time_ns()
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.warning("h2 protocol error from %s: %s", self.peer, exc)
            self.flush()
            self.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                stream = Stream(self, event.stream_id,
                                [(str(k), str(v)) for k, v in event.headers], now)
                self.streams[event.stream_id] = stream
                stream.wall_headers = wall
                if event.stream_ended is not None:
                    stream._ended.set()
                task = asyncio.get_running_loop().create_task(self._run(stream))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif isinstance(event, h2.events.DataReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream._body += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
                if event.stream_ended is not None and stream is not None:
                    stream._ended.set()
            elif isinstance(event, h2.events.StreamEnded):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream._ended.set()
            elif isinstance(event, h2.events.StreamReset):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.gone = True
                    stream._ended.set()
                self._window.set()
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                self._window.set()
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._goaway = True
        self.flush()
        if self._goaway and not self.streams:
            self.close()

    async def _run(self, stream: Stream) -> None:
        try:
            await self.handler(stream)
        except StreamGone:
            pass
        except Exception:
            log.exception("handler failed on stream %s", stream.id)
            with contextlib.suppress(Exception):
                self.conn.reset_stream(stream.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                self.flush()
        finally:
            self.streams.pop(stream.id, None)
            if self._goaway and not self.streams:
                self.close()

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def goaway(self) -> None:
        """Tell the client no new streams will be served, and close when idle."""
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        self._goaway = True
        if not self.streams:
            self.close()

    def eof_received(self) -> bool | None:
        self.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self.connections is not None:
            self.connections.discard(self)
        for stream in self.streams.values():
            stream.gone = True
            stream._ended.set()
        self._window.set()


async def start_h2_server(handler: Handler, socks: list[socket.socket],
                          ssl_context: Any = None) -> tuple[list[asyncio.Server],
                                                            set[H2ServerProtocol]]:
    """Serve ``handler`` on pre-bound listening sockets (TLS when ``ssl_context``)."""
    loop = asyncio.get_running_loop()
    connections: set[H2ServerProtocol] = set()
    servers = [await loop.create_server(lambda: H2ServerProtocol(handler, connections),
                                        sock=sock, ssl=ssl_context, backlog=1024)
               for sock in socks]
    return servers, connections


async def stop_h2_server(servers: list[asyncio.Server], connections: set[H2ServerProtocol],
                         timeout: float = 3.0) -> None:
    """Stop accepting, GOAWAY every connection, close them once their streams end."""
    for server in servers:
        server.close()
    for conn in list(connections):
        conn.goaway()
    deadline = asyncio.get_running_loop().time() + timeout
    while connections and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    for conn in list(connections):
        if conn.transport is not None:
            conn.transport.abort()
    for server in servers:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
