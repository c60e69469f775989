"""DNS queries stamped at their system calls: a dnspython nameserver, and its socket I/O.

The HTTP probes resolve with ``dns.resolver.Resolver`` (its search list, A then AAAA,
its retry over TCP after a truncated answer, its fallback to the next nameserver).
Timed around ``resolve()``, the ``dns`` phase would also hold the resolver's own
work: building the query, making the socket, parsing the answer, building the
``Answer``. That is 0.3 ms on a quiet host, but 1-2 ms on a virtual machine whose
idle vCPUs wake slowly, where a capture of the same lookup shows none of it.

:class:`StampedNameserver` answers the resolver's ``query()`` itself, as
``dns.query.udp`` / ``dns.query.tcp`` would, and keeps in a shared :class:`Stamps`
the mark taken just before the first query is handed to the kernel and the mark
taken just after the ``recv()`` that returned the answer the resolver used: the
span a capture measures from the query packet to the response packet.

Its socket I/O is in module functions (:func:`send_udp`, :func:`send_tcp`,
:func:`udp_answer`, :func:`tcp_answer`) that ``netdiag dns`` (``probe/dns.py``) uses
too, on its own socket per query.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

import dns.exception
import dns.inet
import dns.message
import dns.nameserver
import dns.query

from netdiag.probe.marks import Mark

_MAX_UDP = 65535


@dataclass(slots=True)
class Stamps:
    """The wire's span of one resolution across all its queries (or of one query of
    ``netdiag dns``)."""

    first_sent: Mark | None = None
    """Just before the resolution's first query was handed to the kernel."""
    answered: Mark | None = None
    """Just after the ``recv()`` that returned the last answer (the one the resolver
    used, when it used one)."""

    def sending(self) -> None:
        """Called just before a query is handed to the kernel: the first is marked."""
        if self.first_sent is None:
            self.first_sent = Mark.now()


class StampedNameserver(dns.nameserver.Do53Nameserver):
    """A plain-DNS nameserver (UDP, TCP after truncation) that stamps its queries."""

    def __init__(self, address: str, port: int, stamps: Stamps) -> None:
        super().__init__(address, port)
        self.stamps = stamps

    def query(self, request: dns.message.QueryMessage, timeout: float, source: str | None,
              source_port: int, max_size: bool, one_rr_per_rrset: bool = False,
              ignore_trailing: bool = False) -> dns.message.Message:
        family = dns.inet.af_for_address(self.address)
        deadline = time.monotonic() + timeout
        kind = socket.SOCK_STREAM if max_size else socket.SOCK_DGRAM
        with socket.socket(family, kind) as sock:
            if source is not None or source_port:
                any_address = "::" if family == socket.AF_INET6 else "0.0.0.0"
                sock.bind(dns.inet.low_level_address_tuple((source or any_address, source_port),
                                                           family))
            _settimeout(sock, deadline)
            # connected: the source address is fixed, only the server's datagrams come
            # back, and an ICMP port unreachable is an error rather than a timeout
            try:
                sock.connect(dns.inet.low_level_address_tuple((self.address, self.port),
                                                              family))
            except TimeoutError:
                raise dns.exception.Timeout from None
            wire = request.to_wire()
            if max_size:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                send_tcp(sock, wire, self.stamps)
                return tcp_answer(sock, request, deadline, self.stamps,
                                  one_rr_per_rrset=one_rr_per_rrset,
                                  ignore_trailing=ignore_trailing)
            send_udp(sock, wire, self.stamps)
            return udp_answer(sock, request, deadline, self.stamps,
                              one_rr_per_rrset=one_rr_per_rrset, ignore_trailing=ignore_trailing,
                              raise_on_truncation=True, ignore_errors=True)


def send_udp(sock: socket.socket, wire: bytes, stamps: Stamps) -> None:
    """Send ``wire`` on a connected UDP socket; the first send of ``stamps`` is marked
    just before the call."""
    stamps.sending()
    sock.send(wire)


def send_tcp(sock: socket.socket, wire: bytes, stamps: Stamps) -> None:
    """Send ``wire`` with its length prefix on a connected TCP socket, marked as
    :func:`send_udp` does."""
    stamps.sending()
    sock.sendall(len(wire).to_bytes(2, "big") + wire)


def udp_answer(sock: socket.socket, request: dns.message.Message, deadline: float,
               stamps: Stamps, *, one_rr_per_rrset: bool = False,
               ignore_trailing: bool = False, raise_on_truncation: bool = False,
               ignore_errors: bool = False) -> dns.message.Message:
    """The first datagram that answers ``request``, ``stamps.answered`` marked just
    after the ``recv()`` that returned it. A datagram that answers another query is
    ignored (``dns.query.udp(ignore_unexpected=True)``); a malformed one too with
    ``ignore_errors``, else it raises. With ``raise_on_truncation``, a truncated answer
    raises ``dns.message.Truncated`` (stamped: the resolver retries over TCP)."""
    while True:
        _settimeout(sock, deadline)
        data = _recv(sock, _MAX_UDP)
        got = Mark.now()
        try:
            answer = dns.message.from_wire(data, one_rr_per_rrset=one_rr_per_rrset,
                                           ignore_trailing=ignore_trailing,
                                           raise_on_truncation=raise_on_truncation)
        except dns.message.Truncated as exc:
            if request.is_response(exc.message()):  # type: ignore[no-untyped-call]
                stamps.answered = got
                raise
            continue
        except Exception:
            if ignore_errors:  # a malformed datagram is not the answer
                continue
            raise
        if request.is_response(answer):
            stamps.answered = got
            return answer


def tcp_answer(sock: socket.socket, request: dns.message.Message, deadline: float,
               stamps: Stamps, *, one_rr_per_rrset: bool = False,
               ignore_trailing: bool = False) -> dns.message.Message:
    """The length-prefixed answer, ``stamps.answered`` marked just after the ``recv()``
    that completed it; anything but the response to ``request`` is an error, as
    ``dns.query.tcp`` has it."""
    size = int.from_bytes(_read_exactly(sock, 2, deadline), "big")
    data = _read_exactly(sock, size, deadline)
    stamps.answered = Mark.now()
    answer = dns.message.from_wire(data, one_rr_per_rrset=one_rr_per_rrset,
                                   ignore_trailing=ignore_trailing)
    if not request.is_response(answer):
        raise dns.query.BadResponse
    return answer


def stamped(nameservers: Any, ports: dict[str, int], default_port: int,
            stamps: Stamps) -> list[Any]:
    """A resolver's nameserver list with every plain-DNS entry (an address, or a
    ``Do53Nameserver``) replaced by a :class:`StampedNameserver`; others (DNS over
    HTTPS from a configuration) kept as they are."""
    out: list[Any] = []
    for ns in nameservers:
        if isinstance(ns, dns.nameserver.Do53Nameserver):
            out.append(StampedNameserver(ns.address, ns.port, stamps))
        elif isinstance(ns, str) and dns.inet.is_address(ns):
            out.append(StampedNameserver(ns, ports.get(ns, default_port), stamps))
        else:
            out.append(ns)
    return out


def _settimeout(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise dns.exception.Timeout
    sock.settimeout(left)


def _recv(sock: socket.socket, size: int) -> bytes:
    try:
        return sock.recv(size)
    except TimeoutError:
        raise dns.exception.Timeout from None


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        _settimeout(sock, deadline)
        chunk = _recv(sock, size - len(buf))
        if not chunk:
            raise EOFError("EOF")
        buf += chunk
    return bytes(buf)
