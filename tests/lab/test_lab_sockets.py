"""The lab's client sockets never give two connections one 4-tuple.

Found as a flaky live test: the ROC router's HTTP/1 upstream connections were bound with
``bind((ip, 0))``, which picks a port at random; the servers close first, so a port
came back for the same server within one capture (a few times in 400 connections) and
the tshark reference could no longer tell the two connections' requests apart.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

from netdiag.lab import sockets
from netdiag.lab.sockets import SOURCE_PORTS, bind_source, bound_socket


def _connections(n: int) -> list[int]:
    """Source ports of ``n`` short connections to one loopback server, one after the
    other, closed as the lab's hops close them (the server first)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    addr = srv.getsockname()

    def serve() -> None:
        for _ in range(n):
            conn, _peer = srv.accept()
            conn.close()

    t = threading.Thread(target=serve)
    t.start()
    ports: list[int] = []
    try:
        for _ in range(n):
            s = socket.socket()
            port = bind_source(s, "127.0.0.1")
            s.connect(addr)
            assert s.getsockname()[1] == port
            ports.append(port)
            while s.recv(64):
                pass
            s.close()
    finally:
        t.join()
        srv.close()
    return ports


def test_a_port_comes_back_only_after_the_whole_range() -> None:
    ports = _connections(1500)
    assert len(set(ports)) == len(ports)
    assert all(p in SOURCE_PORTS for p in ports)
    # in turn: each the next of the range, but for ports something else held
    steps = [(b - a) % len(SOURCE_PORTS) for a, b in itertools.pairwise(ports)]
    assert sum(1 for d in steps if d == 1) >= 0.9 * len(steps)


def test_a_port_in_use_is_skipped() -> None:
    holder = socket.socket()
    nxt = SOURCE_PORTS[(next(sockets._turn) + 1) % len(SOURCE_PORTS)]  # the port it takes
    holder.bind(("127.0.0.1", nxt))
    try:
        s = bound_socket("127.0.0.1")
        try:
            port = s.getsockname()[1]
            assert port != nxt and port in SOURCE_PORTS
        finally:
            s.close()
    finally:
        holder.close()


def test_a_forked_child_takes_other_ports() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next port, then out without pytest's teardown
        try:
            s = socket.socket()
            os.write(write, str(bind_source(s, "127.0.0.1")).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 16))
    os.waitpid(pid, 0)
    os.close(read)
    parent = [bind_source(socket.socket(), "127.0.0.1") for _ in range(3)]
    # the child reseeded: not the parent's sequence (a clash has odds 3 in 12,768)
    assert child not in parent
