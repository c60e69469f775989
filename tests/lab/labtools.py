"""Helpers of the live lab tests: real servers on loopback, a real redis-server, a real capture.

They need root on Linux (ports 53 and 443, a packet socket on ``lo``) and Debian's
``redis-server``; elsewhere they are skipped.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from netdiag.lab import params as P
from netdiag.lab.redis_store import find_redis_server

# ``netdiag lab`` runs in a network namespace of its own when it can (root). The
# lifecycle tests squat the lab's ports and count its listening sockets from the
# test's own namespace, so the command they start must share it: they get
# ``--no-netns`` through the environment. Tests that want a namespace ask for one
# (``LabParams(netns=True)``, ``netdiag lab --netns``).
os.environ.setdefault("NETDIAG_LAB_NETNS", "0")

LIVE = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or find_redis_server() is None,
    reason="needs root on Linux and redis-server (apt-get install redis-server)")


def children(pid: int | None = None) -> set[int]:
    """Live (non-zombie) child processes of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def lab_ports(origins: int = 3) -> list[tuple[str, int, int]]:
    """(address, port, socket type) of every listening socket of a lab."""
    topo = P.Topology(origins)
    tcp, udp = socket.SOCK_STREAM, socket.SOCK_DGRAM
    out = [(P.DNS_IP, P.DNS_PORT, udp), (P.DNS_IP, P.DNS_PORT, tcp),
           (P.EDGE_IP, P.EDGE_PORT, tcp), (P.ROUTER_IP, P.ROUTER_PORT, tcp),
           (P.REDIS_IP, P.REDIS_PORT, tcp)]
    out += [(ip, P.ORIGIN_PORT, tcp) for ip, _ in topo.roc_origins + topo.dpf_origins]
    return out


def port_free(ip: str, port: int, kind: int) -> bool:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ip, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(1)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def descendants(pid: int) -> set[int]:
    """Live (non-zombie) descendants of ``pid``, children of children included."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    out: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in out]
        out.update(kids)
        todo.extend(kids)
    return out


def ip_of(ep: str) -> str:
    """The address of an ``ip:port`` endpoint."""
    return ep.rpartition(":")[0].strip("[]")
