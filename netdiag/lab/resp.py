"""A minimal asyncio Redis (RESP2) client for the router's hot path.

One command at a time per connection, a small pool of idle connections, each
connecting from a chosen source address. redis-py would do, but spends several
hundred microseconds of Python per call and chats on connect (``HELLO``, ``CLIENT
SETINFO``); here the wire carries the router's ``EVALSHA`` and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from netdiag.lab.sockets import bound_socket


class RespError(Exception):
    """A Redis error reply, or a broken connection."""


def encode(*args: Any) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


async def _reply(reader: asyncio.StreamReader) -> Any:
    line = await reader.readline()
    if not line.endswith(b"\r\n"):
        raise RespError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = await reader.readexactly(size + 2)
        return data[:-2]
    if kind == b"*":
        count = int(rest)
        return None if count < 0 else [await _reply(reader) for _ in range(count)]
    raise RespError(f"unexpected reply {line[:20]!r}")


class _Conn:
    """One pooled connection and the commands sent on it."""

    __slots__ = ("local", "reader", "sent", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 local: str) -> None:
        self.reader = reader
        self.writer = writer
        self.local = local
        self.sent = 0


class RespPool:
    """Connections to one Redis server from ``source_ip``; one command per connection."""

    def __init__(self, ip: str, port: int, source_ip: str, timeout: float) -> None:
        self.ip = ip
        self.port = port
        self.source_ip = source_ip
        self.timeout = timeout
        self._idle: list[_Conn] = []
        self._all: set[asyncio.StreamWriter] = set()
        self.opened: list[str] = []
        """Local endpoint of every connection opened, in order."""

    async def _connect(self) -> _Conn:
        sock = bound_socket(self.source_ip)  # a source port of the lab's range
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(
                sock, (self.ip, self.port)), self.timeout)
            reader, writer = await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise
        self._all.add(writer)
        local = "{}:{}".format(*writer.get_extra_info("sockname")[:2])
        self.opened.append(local)
        return _Conn(reader, writer, local)

    async def call(self, *args: Any) -> Any:
        """Send one command and return its reply."""
        return (await self.call_traced(*args))[0]

    async def call_traced(self, *args: Any) -> tuple[Any, str, int]:
        """(reply, local endpoint of the connection used, the command's ordinal on it).

        The ordinal counts the commands sent on that connection from 0, in order; this
        pool sends nothing else on its connections (no HELLO, no CLIENT SETINFO).
        """
        conn = self._idle.pop() if self._idle else await self._connect()
        reader, writer = conn.reader, conn.writer
        ordinal = conn.sent
        conn.sent += 1
        try:
            writer.write(encode(*args))
            result = await asyncio.wait_for(_reply(reader), self.timeout)
        except RespError as exc:
            if "closed" in str(exc):
                self._drop(writer)
            else:
                self._idle.append(conn)
            raise
        except BaseException:
            self._drop(writer)
            raise
        self._idle.append(conn)
        return result, conn.local, ordinal

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._all.discard(writer)
        writer.close()

    async def close(self) -> None:
        """Close every connection (FIN from us; Redis closes its side)."""
        writers, self._all, self._idle = list(self._all), set(), []
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2.0)
