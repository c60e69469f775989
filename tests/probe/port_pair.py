"""One port number for a UDP and a TCP socket (a DNS server answers on both)."""

from __future__ import annotations

import socket
from collections.abc import Callable

Bind = Callable[[int, socket.SocketKind], socket.socket]
"""Binds a socket of the kind to the port (0: one the system picks) and returns it."""


def udp_and_tcp(bind: Bind, taken: type[BaseException] | tuple[type[BaseException], ...],
                tries: int = 50) -> tuple[socket.socket, socket.socket]:
    """A UDP socket on a port the system picks and a TCP socket bound to the same
    number. The UDP port the system chose may be a TCP port in use (an ephemeral port of
    another test's connection): ``bind`` then raises ``taken`` and another pair is
    tried, up to ``tries`` times."""
    for _ in range(tries):
        udp = bind(0, socket.SOCK_DGRAM)
        try:
            return udp, bind(udp.getsockname()[1], socket.SOCK_STREAM)
        except taken:
            udp.close()
    raise RuntimeError(f"no port free for both UDP and TCP in {tries} tries")
