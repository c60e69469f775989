"""netdiag.probe.stamped_dns against a real DNS server on loopback (a thread serving
UDP and TCP on 127.0.0.1, answers built by dnspython): the stamps span the first
query's send to the answer's receipt, whatever else arrives, across a retry over TCP
and an AAAA after an empty A."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dns.exception
import dns.message
import dns.nameserver
import dns.rcode
import dns.resolver
import dns.rrset
import pytest
from port_pair import udp_and_tcp

from netdiag.probe.dns import run_dns_probe
from netdiag.probe.stamped_dns import StampedNameserver, Stamps, stamped

NAME = "api.stamped.test."
DELAY_S = 0.03


@dataclass
class Server:
    """Answers A (and AAAA if ``aaaa``) for NAME after DELAY_S; ``junk_first`` sends a
    malformed datagram and an answer with another id at once, before the real one
    (``other_first``: that answer only);
    ``truncate`` answers UDP with TC set (and no answer), TCP with ``tcp_address``."""

    junk_first: bool = False
    other_first: bool = False
    truncate: bool = False
    aaaa: bool = False
    udp_address: str = "192.0.2.1"
    tcp_address: str = "192.0.2.2"
    tcp_answered_ns: list[int] = field(default_factory=list)
    udp: socket.socket = field(init=False)
    tcp: socket.socket = field(init=False)

    def answer(self, wire: bytes, address: str, truncate: bool = False) -> bytes:
        query = dns.message.from_wire(wire)
        response = dns.message.make_response(query)
        rdtype = query.question[0].rdtype
        if truncate:
            response.flags |= dns.flags.TC
        elif rdtype == dns.rdatatype.A and not self.aaaa:
            response.answer.append(dns.rrset.from_text(NAME, 30, "IN", "A", address))
        elif rdtype == dns.rdatatype.AAAA and self.aaaa:
            response.answer.append(dns.rrset.from_text(NAME, 30, "IN", "AAAA", "2001:db8::7"))
        return response.to_wire()

    def serve_udp(self) -> None:
        while True:
            try:
                wire, peer = self.udp.recvfrom(65535)
            except OSError:
                return
            if peer is None:  # shut down
                return
            if self.junk_first and not self._send(b"\x00\x01garbage", peer):
                return
            if self.junk_first or self.other_first:
                other = dns.message.from_wire(wire)
                other.id ^= 0x5A5A
                if not self._send(self.answer(other.to_wire(), "198.51.100.9"), peer):
                    return
            time.sleep(DELAY_S)
            if not self._send(self.answer(wire, self.udp_address, self.truncate), peer):
                return

    def _send(self, data: bytes, peer: Any) -> bool:
        """Send a datagram; False once the socket is shut (the test ended while this
        thread was between a query and its answers)."""
        try:
            self.udp.sendto(data, peer)
        except OSError:
            return False
        return True

    def serve_tcp(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            with conn:
                size = int.from_bytes(conn.recv(2), "big")
                wire = b""
                while len(wire) < size:
                    wire += conn.recv(size - len(wire))
                time.sleep(DELAY_S)
                out = self.answer(wire, self.tcp_address)
                self.tcp_answered_ns.append(time.perf_counter_ns())
                conn.sendall(len(out).to_bytes(2, "big") + out)


class _PortTaken(Exception):
    pass


def _bound(port: int, kind: socket.SocketKind) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            raise _PortTaken from e
        raise
    return s


@contextlib.contextmanager
def _serving(server: Server) -> Iterator[int]:
    server.udp, server.tcp = udp_and_tcp(_bound, _PortTaken)
    port = server.udp.getsockname()[1]
    server.tcp.listen()
    threads = [threading.Thread(target=server.serve_udp, daemon=True),
               threading.Thread(target=server.serve_tcp, daemon=True)]
    for t in threads:
        t.start()
    try:
        yield port
    finally:
        for s in (server.udp, server.tcp):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _resolver(port: int, stamps: Stamps, timeout: float = 2.0) -> dns.resolver.Resolver:
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [StampedNameserver("127.0.0.1", port, stamps)]
    resolver.cache = None
    resolver.timeout = resolver.lifetime = timeout
    return resolver


def _span_ns(stamps: Stamps) -> int:
    assert stamps.first_sent is not None and stamps.answered is not None
    return stamps.answered.perf_ns - stamps.first_sent.perf_ns


@pytest.mark.parametrize("junk_first", [False, True], ids=["plain", "junk-first"])
def test_the_stamps_span_query_to_answer(junk_first: bool) -> None:
    server, stamps = Server(junk_first=junk_first), Stamps()
    with _serving(server) as port:
        before = time.perf_counter_ns()
        answer = _resolver(port, stamps).resolve(NAME, "A")
        after = time.perf_counter_ns()
    assert [r.address for r in answer] == ["192.0.2.1"]
    assert stamps.first_sent is not None and stamps.answered is not None
    assert before <= stamps.first_sent.perf_ns < stamps.answered.perf_ns <= after
    # the junk came at once: had it been stamped, the span would be under the delay
    assert _span_ns(stamps) >= DELAY_S * 1e9
    assert stamps.first_sent.epoch_ns < stamps.answered.epoch_ns


def test_a_truncated_answer_is_retried_over_tcp_within_the_span() -> None:
    server, stamps = Server(truncate=True), Stamps()
    with _serving(server) as port:
        answer = _resolver(port, stamps).resolve(NAME, "A")
    assert [r.address for r in answer] == ["192.0.2.2"]  # TCP's answer
    assert len(server.tcp_answered_ns) == 1
    assert stamps.answered is not None and stamps.answered.perf_ns >= server.tcp_answered_ns[0]
    assert _span_ns(stamps) >= 2 * DELAY_S * 1e9  # the UDP query's wait, then TCP's


def test_an_aaaa_after_an_empty_a_is_within_the_span() -> None:
    server, stamps = Server(aaaa=True), Stamps()
    with _serving(server) as port:
        resolver = _resolver(port, stamps)
        assert resolver.resolve(NAME, "A", raise_on_no_answer=False).rrset is None
        first = stamps.first_sent
        answer = resolver.resolve(NAME, "AAAA")
    assert [r.address for r in answer] == ["2001:db8::7"]
    assert stamps.first_sent is first  # the first query's send stays the start
    assert _span_ns(stamps) >= 2 * DELAY_S * 1e9


def test_silence_is_a_timeout_and_a_closed_port_an_error() -> None:
    quiet = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    quiet.bind(("127.0.0.1", 0))
    try:
        stamps = Stamps()
        with pytest.raises(dns.exception.Timeout):
            _resolver(quiet.getsockname()[1], stamps, timeout=0.2).resolve(NAME, "A")
        assert stamps.first_sent is not None and stamps.answered is None
    finally:
        quiet.close()
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(dns.resolver.NoNameservers):
        _resolver(port, Stamps()).resolve(NAME, "A")


def test_stamped_replaces_plain_dns_entries_only() -> None:
    stamps = Stamps()
    doh = dns.nameserver.DoHNameserver("https://dns.example/dns-query")
    out = stamped(["192.0.2.53", dns.nameserver.Do53Nameserver("2001:db8::53", 5353), doh],
                  {"192.0.2.53": 5300}, 53, stamps)
    assert [(type(ns).__name__, getattr(ns, "port", None)) for ns in out[:2]] == [
        ("StampedNameserver", 5300), ("StampedNameserver", 5353)]
    assert out[0].address == "192.0.2.53" and out[1].address == "2001:db8::53"
    assert all(ns.stamps is stamps for ns in out[:2])
    assert out[2] is doh


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_the_dns_probe_times_the_exchange_only(monkeypatch: pytest.MonkeyPatch,
                                               tcp: bool) -> None:
    """``netdiag dns``'s latency runs from the query's send to the answer's recv():
    parsing the answer, made 200 ms slow here, is outside it."""
    parse = dns.message.from_wire
    prober = threading.current_thread()

    def slow_parse(*args: object, **kwargs: object) -> dns.message.Message:
        if threading.current_thread() is prober:
            time.sleep(0.2)
        return parse(*args, **kwargs)  # type: ignore[arg-type]

    with _serving(Server()) as port:
        monkeypatch.setattr(dns.message, "from_wire", slow_parse)
        result = run_dns_probe(NAME, servers=[f"127.0.0.1:{port}"], tcp=tcp, timeout=2.0)
    [query] = result.queries
    assert query.error is None and query.answers == ["192.0.2.2" if tcp else "192.0.2.1"]
    assert query.latency_ns is not None
    assert DELAY_S * 1e9 <= query.latency_ns < (DELAY_S + 0.15) * 1e9


def test_the_dns_probe_waits_past_an_answer_to_another_query() -> None:
    with _serving(Server(other_first=True)) as port:
        before = time.time_ns()
        result = run_dns_probe(NAME, servers=[f"127.0.0.1:{port}"], timeout=2.0)
        after = time.time_ns()
    [query] = result.queries
    assert query.error is None and query.answers == ["192.0.2.1"]
    assert query.latency_ns is not None and query.latency_ns >= DELAY_S * 1e9
    assert before <= query.ts_ns <= after - query.latency_ns


def test_the_dns_probe_counts_a_malformed_answer_as_an_error() -> None:
    with _serving(Server(junk_first=True)) as port:
        result = run_dns_probe(NAME, servers=[f"127.0.0.1:{port}"], timeout=2.0)
    [query] = result.queries
    assert query.latency_ns is None and query.error is not None
    assert query.error.startswith("bad response")
