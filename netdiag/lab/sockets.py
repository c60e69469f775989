"""Client sockets of the lab's hops: bound to a chosen source address and to a source
port no other connection of this process has had (kept apart from the HTTP clients so
the RESP pool needs no h2 import).

``bind((ip, 0))`` picks a port at random without knowing the destination, and may pick
the one a connection to the same server had a moment ago (the lab's servers close
first, so the client side keeps no TIME_WAIT): two connections with one 4-tuple in one
capture, a few times in 400 connections on this machine, which makes the requests of a
capture ambiguous to every tool that keys them by end points. Even
``IP_BIND_ADDRESS_NO_PORT`` (the port chosen at ``connect()``) repeated one in about
one run of 400 connections in thirty. So the lab hands out source ports itself, in
turn, from a range below Linux's default ephemeral one (32768-60999), where the
kernel's own choices do not land.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import socket
import threading

SOURCE_PORTS = range(20000, 32768)
"""Source ports the lab's client sockets take in turn (a port in use is skipped)."""

_lock = threading.Lock()
_turn = itertools.count(random.randrange(len(SOURCE_PORTS)))


def _reseed() -> None:
    """A forked child starts elsewhere in the range than its parent goes on."""
    global _turn
    _turn = itertools.count(random.randrange(len(SOURCE_PORTS)))


os.register_at_fork(after_in_child=_reseed)


def bind_source(sock: socket.socket, local_ip: str) -> int:
    """Bind ``sock`` to ``local_ip`` and the next free port of :data:`SOURCE_PORTS`
    (none of this process's connections had it since the range last wrapped); returns
    the port. With every port of the range taken, the kernel chooses one."""
    for _ in range(len(SOURCE_PORTS)):
        with _lock:
            port = SOURCE_PORTS[next(_turn) % len(SOURCE_PORTS)]
        try:
            sock.bind((local_ip, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            continue
        return port
    sock.bind((local_ip, 0))
    return int(sock.getsockname()[1])


def bound_socket(local_ip: str) -> socket.socket:
    """A non-blocking TCP socket bound to ``local_ip`` (prepare it before timing starts;
    its source port from :func:`bind_source`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bind_source(sock, local_ip)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
