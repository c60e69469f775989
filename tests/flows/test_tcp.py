"""TCP connections through the flow table: orientation, handshake timing, reassembly.

Segments are built by hand (Ethernet/IPv4/TCP, checked against scapy below) so that
property tests can craft thousands of them; the table is driven with a recording
decider whose analyzers log every ``feed``/``gap``/``close`` call.
"""

from __future__ import annotations

import itertools
import socket
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from netdiag.flows import table as table_mod
from netdiag.flows import tcp as tcp_mod
from netdiag.flows.table import CLOSED_LINGER_NS, IDLE_TIMEOUT_NS, FlowTable
from netdiag.flows.tcp import DEFAULT_REORDER_NS, TcpFlow

T0 = 1_764_425_767_000_000_000
US = 1_000
MS = 1_000_000
S = 1_000_000_000
MAC = bytes.fromhex("020000000002020000000001")
FLAGS = {"F": 0x01, "S": 0x02, "R": 0x04, "P": 0x08, "A": 0x10}

C = ("10.0.0.1", 50000)
SRV = ("10.0.0.2", 443)


def frame(src: tuple[str, int], dst: tuple[str, int], flags: str, seq: int,
          payload: bytes = b"", ack: int = 0, ttl: int = 64) -> bytes:
    """An Ethernet/IPv4/TCP frame with zero checksums (the scan does not verify them)."""
    fl = 0
    for ch in flags:
        fl |= FLAGS[ch]
    tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF,
                      5 << 4, fl, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0, ttl, 6, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    return MAC + b"\x08\x00" + ip + tcp + payload


class Recorder:
    """A StreamAnalyzer that records every call."""

    def __init__(self, flow: TcpFlow, first: bytes) -> None:
        self.flow = flow
        self.first = first
        self.events: list[tuple[Any, ...]] = []
        self.warnings: list[str] = []

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        assert data, "feed with no bytes"
        self.events.append(("feed", direction, ts_ns, bytes(data), packet))

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        assert nbytes > 0
        self.events.append(("gap", direction, ts_ns, nbytes))

    def close(self, ts_ns: int) -> None:
        self.events.append(("close", ts_ns))

    def stream(self, direction: int) -> bytes:
        return b"".join(e[3] for e in self.events if e[0] == "feed" and e[1] == direction)

    def feeds(self, direction: int) -> list[tuple[int, bytes, int]]:
        return [(e[2], e[3], e[4]) for e in self.events if e[0] == "feed" and e[1] == direction]

    def gaps(self) -> list[tuple[Any, ...]]:
        return [e[1:] for e in self.events if e[0] == "gap"]


class Harness:
    """A FlowTable, a recording decider (claims every flow unless ``claim`` is False)."""

    def __init__(self, claim: bool = True) -> None:
        self.claim = claim
        self.decided: list[tuple[str, bytes]] = []
        self.analyzers: dict[str, Recorder] = {}
        self.finished: list[TcpFlow] = []
        self.table = FlowTable(self._decide, self._done, lambda *a: None)
        self.pkt = 0

    def _decide(self, flow: TcpFlow, first: bytes) -> Recorder | None:
        self.decided.append((flow.conn.id, first))
        if not self.claim:
            return None
        rec = self.analyzers[flow.conn.id] = Recorder(flow, first)
        return rec

    def _done(self, flow: TcpFlow) -> None:
        # the analyzer has been closed exactly once, after everything else
        an = self.analyzers.get(flow.conn.id)
        if an is not None:
            assert [e[0] for e in an.events].count("close") == 1
            assert an.events[-1][0] == "close"
        self.finished.append(flow)

    def send(self, ts: int, src: tuple[str, int], dst: tuple[str, int], flags: str, seq: int,
             payload: bytes = b"", ack: int = 0) -> int:
        """Scan one segment; return its packet number."""
        data = frame(src, dst, flags, seq, payload, ack)
        self.pkt += 1
        self.table.scan([(ts, 1, data, len(data))], first_number=self.pkt)
        return self.pkt

    def end(self) -> dict[str, TcpFlow]:
        self.table.finish_all()
        assert self.table.flows == {}
        return {f.conn.id: f for f in self.finished}

    def an(self, cid: str = "C1") -> Recorder:
        return self.analyzers[cid]


def handshake(h: Harness, cisn: int = 1000, sisn: int = 9000, t: int = T0,
              rtt: int = 200 * US, c: tuple[str, int] = C,
              s: tuple[str, int] = SRV) -> tuple[int, int]:
    """SYN at t, SYN-ACK at t + rtt/2, ACK at t + rtt; returns the next (client, server) seq."""
    h.send(t, c, s, "S", cisn)
    h.send(t + rtt // 2, s, c, "SA", sisn, ack=cisn + 1)
    h.send(t + rtt, c, s, "A", cisn + 1, ack=sisn + 1)
    return cisn + 1, sisn + 1


def test_frame_builder_matches_scapy() -> None:
    ours = frame(C, SRV, "PA", 123456, b"hello", ack=99)
    theirs = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")
                   / IP(src=C[0], dst=SRV[0], id=0, flags=0, ttl=64, chksum=0)
                   / TCP(sport=C[1], dport=SRV[1], seq=123456, ack=99, flags="PA",
                         window=65535, chksum=0) / Raw(b"hello"))
    assert ours == theirs


# -- orientation and handshake ----------------------------------------------------------
def test_orientation_and_rtt_from_handshake() -> None:
    h = Harness()
    # the client uses port 80 and the server an ephemeral one: the SYN decides, not ports
    c, s = ("10.0.0.9", 80), ("10.0.0.8", 61000)
    handshake(h, rtt=123_456, c=c, s=s)
    conn = h.end()["C1"].conn
    assert (conn.client, conn.server) == ("10.0.0.9:80", "10.0.0.8:61000")
    assert conn.syn_ns == T0 and conn.handshake_ack_ns == T0 + 123_456
    assert conn.handshake_seen and conn.ts_ns == T0 and conn.last_ns == T0 + 123_456
    assert conn.to_json()["handshake_rtt_ms"] == pytest.approx(0.123456)
    assert (conn.packets, conn.retransmissions, conn.syn_retransmissions) == (3, 0, 0)


def test_orientation_from_synack_when_syn_missing() -> None:
    h = Harness()
    h.send(T0, SRV, C, "SA", 9000, ack=1001)
    h.send(T0 + 100 * US, C, SRV, "A", 1001, ack=9001)
    h.send(T0 + 200 * US, C, SRV, "PA", 1001, b"GET")
    conn = h.end()["C1"].conn
    assert (conn.client, conn.server) == ("10.0.0.1:50000", "10.0.0.2:443")
    assert conn.syn_ns is None and conn.handshake_ack_ns is None
    assert conn.to_json()["handshake_rtt_ms"] is None
    assert not conn.handshake_seen
    assert h.an().stream(0) == b"GET"


@pytest.mark.parametrize(("src", "dst", "client"), [
    (("10.0.0.2", 443), ("10.0.0.1", 50000), "10.0.0.1:50000"),   # server speaks first
    (("10.0.0.1", 50000), ("10.0.0.2", 443), "10.0.0.1:50000"),
    (("10.0.0.2", 8080), ("10.0.0.1", 1234), "10.0.0.1:1234"),     # well-known beats order
    (("10.0.0.2", 40000), ("10.0.0.1", 50000), "10.0.0.1:50000"),  # neither: higher port
    (("10.0.0.2", 50000), ("10.0.0.1", 40000), "10.0.0.2:50000"),
    (("10.0.0.2", 443), ("10.0.0.1", 80), "10.0.0.2:443"),         # both well-known
])
def test_orientation_from_ports(src: tuple[str, int], dst: tuple[str, int], client: str) -> None:
    h = Harness()
    h.send(T0, src, dst, "PA", 5, b"data")
    conn = h.end()["C1"].conn
    assert conn.client == client and not conn.handshake_seen
    d = 0 if f"{src[0]}:{src[1]}" == client else 1
    assert h.an().stream(d) == b"data"


def test_syn_retransmission_rtt_from_first_syn() -> None:
    h = Harness()
    h.send(T0, C, SRV, "S", 1000)
    h.send(T0 + 1 * S, C, SRV, "S", 1000)
    h.send(T0 + 3 * S, C, SRV, "S", 1000)
    h.send(T0 + 3 * S + 50 * US, SRV, C, "SA", 9000, ack=1001)
    h.send(T0 + 3 * S + 50 * US, SRV, C, "SA", 9000, ack=1001)  # duplicated SYN-ACK
    h.send(T0 + 3 * S + 90 * US, C, SRV, "A", 1001, ack=9001)
    h.send(T0 + 3 * S + 95 * US, C, SRV, "PA", 1001, b"hi")
    flows = h.end()
    assert list(flows) == ["C1"]
    conn = flows["C1"].conn
    assert conn.syn_ns == T0 and conn.handshake_ack_ns == T0 + 3 * S + 90 * US
    assert conn.syn_retransmissions == 2
    assert conn.retransmissions == 3  # two SYNs and one SYN-ACK
    assert h.an().stream(0) == b"hi"


def test_late_duplicate_syn_does_not_rewind_the_stream() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"abc")
    h.send(T0 + 2 * MS, C, SRV, "S", 1000)  # the first SYN, delayed in the network
    h.send(T0 + 2 * MS, SRV, C, "SA", 9000, ack=1001)
    h.send(T0 + 3 * MS, C, SRV, "PA", c + 3, b"def")
    h.send(T0 + 3 * MS, SRV, C, "PA", s, b"xyz")
    flows = h.end()
    assert list(flows) == ["C1"]
    assert h.an().stream(0) == b"abcdef" and h.an().stream(1) == b"xyz"
    assert flows["C1"].conn.lost_bytes == 0 and h.an().gaps() == []


def test_data_in_syn_fast_open() -> None:
    h = Harness()
    h.send(T0, C, SRV, "S", 1000, b"GET /")
    h.send(T0 + 1 * MS, SRV, C, "SA", 9000, ack=1006)
    h.send(T0 + 2 * MS, C, SRV, "A", 1006, ack=9001)
    h.send(T0 + 3 * MS, C, SRV, "PA", 1006, b" HTTP")
    h.send(T0 + 4 * MS, C, SRV, "S", 1000, b"GET /")  # retransmitted SYN: data not repeated
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"GET / HTTP"
    assert h.decided == [("C1", b"GET /")]
    assert conn.bytes_to_server == 10 and conn.lost_bytes == 0


# -- in-order delivery ------------------------------------------------------------------
def test_in_order_delivery_with_times_and_packets() -> None:
    h = Harness()
    c, s = handshake(h)
    p1 = h.send(T0 + 1 * MS, C, SRV, "PA", c, b"GET / HTTP/1.1\r\n")
    p2 = h.send(T0 + 2 * MS, C, SRV, "PA", c + 16, b"\r\n")
    p3 = h.send(T0 + 5 * MS, SRV, C, "PA", s, b"HTTP/1.1 200 OK\r\n")
    p4 = h.send(T0 + 6 * MS, SRV, C, "PA", s + 17, b"\r\nbody")
    h.send(T0 + 7 * MS, C, SRV, "A", c + 18, ack=s + 23)
    flows = h.end()
    an = h.an()
    assert an.feeds(0) == [(T0 + 1 * MS, b"GET / HTTP/1.1\r\n", p1), (T0 + 2 * MS, b"\r\n", p2)]
    assert an.feeds(1) == [(T0 + 5 * MS, b"HTTP/1.1 200 OK\r\n", p3),
                           (T0 + 6 * MS, b"\r\nbody", p4)]
    assert an.first == b"GET / HTTP/1.1\r\n" and an.events[-1] == ("close", T0 + 7 * MS)
    conn = flows["C1"].conn
    assert (conn.bytes_to_server, conn.bytes_to_client) == (18, 23)
    assert (conn.retransmissions, conn.out_of_order, conn.lost_bytes) == (0, 0, 0)
    assert (conn.packets, conn.close) == (8, "open")


def test_server_bytes_before_client_spoke_are_replayed() -> None:
    h = Harness()
    c, s = handshake(h, s=("10.0.0.2", 25))
    srv = ("10.0.0.2", 25)
    p1 = h.send(T0 + 1 * MS, srv, C, "PA", s, b"220 mail ")
    p2 = h.send(T0 + 2 * MS, srv, C, "PA", s + 9, b"ready\r\n")
    assert h.decided == []
    p3 = h.send(T0 + 3 * MS, C, srv, "PA", c, b"EHLO x\r\n")
    assert h.decided == [("C1", b"EHLO x\r\n")]
    h.end()
    assert [e for e in h.an().events if e[0] == "feed"] == [
        ("feed", 1, T0 + 1 * MS, b"220 mail ", p1), ("feed", 1, T0 + 2 * MS, b"ready\r\n", p2),
        ("feed", 0, T0 + 3 * MS, b"EHLO x\r\n", p3)]


def test_client_never_speaks_decided_at_finish() -> None:
    h = Harness()
    _c, s = handshake(h)
    h.send(T0 + 1 * MS, SRV, C, "PA", s, b"banner")
    h.end()
    assert h.decided == [("C1", b"")]
    assert h.an().feeds(1) == [(T0 + 1 * MS, b"banner", 4)]


def test_pending_server_bytes_beyond_budget_become_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp_mod, "MAX_PENDING_SERVER", 10)
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, SRV, C, "PA", s, b"12345678")
    h.send(T0 + 2 * MS, SRV, C, "PA", s + 8, b"abcd")
    h.send(T0 + 3 * MS, SRV, C, "PA", s + 12, b"efgh")
    h.send(T0 + 4 * MS, C, SRV, "PA", c, b"hi")
    h.send(T0 + 5 * MS, SRV, C, "PA", s + 16, b"after")
    conn = h.end()["C1"].conn
    assert [e[:4] for e in h.an().events] == [
        ("feed", 1, T0 + 1 * MS, b"12345678"), ("gap", 1, T0 + 2 * MS, 8),
        ("feed", 0, T0 + 4 * MS, b"hi"), ("feed", 1, T0 + 5 * MS, b"after"),
        ("close", T0 + 5 * MS)]
    # the bytes were captured: counted, and not lost
    assert conn.bytes_to_client == 21 and conn.lost_bytes == 0


# -- reordering, retransmission, gaps ---------------------------------------------------
def test_out_of_order_quick_fill() -> None:
    h = Harness()
    c, _s = handshake(h, rtt=1 * MS)
    p2 = h.send(T0 + 10 * MS, C, SRV, "PA", c + 4, b"5678")
    p3 = h.send(T0 + 10 * MS + 10 * US, C, SRV, "PA", c + 8, b"9")
    assert h.decided == []
    p1 = h.send(T0 + 10 * MS + 500 * US, C, SRV, "PA", c, b"1234")
    conn = h.end()["C1"].conn
    assert h.an().feeds(0) == [(T0 + 10 * MS + 500 * US, b"1234", p1),
                               (T0 + 10 * MS, b"5678", p2), (T0 + 10 * MS + 10 * US, b"9", p3)]
    assert (conn.out_of_order, conn.retransmissions, conn.lost_bytes) == (1, 0, 0)
    assert conn.bytes_to_server == 9


@pytest.mark.parametrize(("rtt", "fill_after", "ooo", "retx"), [
    (1 * MS, DEFAULT_REORDER_NS, 1, 0),          # at the 3 ms floor: reordering
    (1 * MS, DEFAULT_REORDER_NS + 1, 0, 1),      # past it: a retransmission
    (20 * MS, 15 * MS, 1, 0),                    # within a long handshake RTT
    (20 * MS, 20 * MS + 1, 0, 1),
])
def test_gap_fill_reorder_or_retransmission(rtt: int, fill_after: int, ooo: int,
                                            retx: int) -> None:
    h = Harness()
    c, _s = handshake(h, rtt=rtt)
    t = T0 + 1 * S
    h.send(t, C, SRV, "PA", c + 3, b"def")
    h.send(t + fill_after, C, SRV, "PA", c, b"abc")
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"abcdef"
    assert (conn.out_of_order, conn.retransmissions) == (ooo, retx)


def test_duplicate_retransmission_not_redelivered() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"hello")
    h.send(T0 + 2 * MS, SRV, C, "PA", s, b"world")
    h.send(T0 + 300 * MS, C, SRV, "PA", c, b"hello")
    h.send(T0 + 301 * MS, C, SRV, "PA", c, b"hel")
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"hello" and len(h.an().feeds(0)) == 1
    assert conn.retransmissions == 2 and conn.bytes_to_server == 5


def test_partial_overlap_delivers_only_new_bytes() -> None:
    h = Harness()
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"abcd")
    p = h.send(T0 + 2 * MS, C, SRV, "PA", c + 2, b"cdefg")
    conn = h.end()["C1"].conn
    assert h.an().feeds(0) == [(T0 + 1 * MS, b"abcd", 4), (T0 + 2 * MS, b"efg", p)]
    assert conn.retransmissions == 1 and conn.bytes_to_server == 7


def test_retransmission_covering_held_segments_counts_bytes_once() -> None:
    h = Harness()
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c + 4, b"EFGH")
    h.send(T0 + 2 * MS, C, SRV, "PA", c + 10, b"KL")
    h.send(T0 + 500 * MS, C, SRV, "PA", c, b"abcdEFGHij")  # resent as one segment
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"abcdEFGHijKL"
    assert conn.bytes_to_server == 12 and conn.lost_bytes == 0


def test_held_segment_resent_longer_keeps_the_extra_bytes() -> None:
    h = Harness()
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c + 2, b"cd")
    h.send(T0 + 2 * MS, C, SRV, "PA", c + 2, b"cdef")  # same start, more bytes
    h.send(T0 + 3 * MS, C, SRV, "PA", c + 2, b"c")      # same start, fewer
    h.send(T0 + 4 * MS, C, SRV, "PA", c, b"ab")
    h.send(T0 + 5 * MS, C, SRV, "PA", c + 6, b"g")
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"abcdefg" and h.an().gaps() == []
    assert conn.retransmissions == 2 and conn.bytes_to_server == 7 and conn.lost_bytes == 0


def test_keepalive_not_counted() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"abc")
    h.send(T0 + 60 * S, C, SRV, "A", c + 2, b"c")   # 1 byte at next - 1
    h.send(T0 + 61 * S, C, SRV, "A", c + 2)         # zero-length probe at next - 1
    h.send(T0 + 61 * S, SRV, C, "A", s, ack=c + 3)
    conn = h.end()["C1"].conn
    assert conn.retransmissions == 0 and h.an().stream(0) == b"abc"


def test_gap_never_filled() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"ab")
    p = h.send(T0 + 2 * MS, C, SRV, "PA", c + 5, b"fgh")
    h.send(T0 + 3 * MS, SRV, C, "PA", s, b"ok")
    flows = h.end()
    conn = flows["C1"].conn
    assert [e[:4] for e in h.an().events] == [
        ("feed", 0, T0 + 1 * MS, b"ab"), ("feed", 1, T0 + 3 * MS, b"ok"),
        ("gap", 0, T0 + 3 * MS, 3), ("feed", 0, T0 + 2 * MS, b"fgh"), ("close", T0 + 3 * MS)]
    assert h.an().events[3][4] == p
    assert conn.lost_bytes == 3 and conn.bytes_to_server == 5


def test_too_many_held_segments_skip_the_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp_mod, "MAX_OOO_SEGMENTS", 3)
    h = Harness()
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"a")
    for i in range(4):
        h.send(T0 + (2 + i) * MS, C, SRV, "PA", c + 3 + i, bytes([0x64 + i]))
    assert h.an().gaps() == [(0, T0 + 5 * MS, 2)]
    h.send(T0 + 6 * MS, C, SRV, "PA", c + 1, b"bc")  # too late: a retransmission
    h.send(T0 + 7 * MS, C, SRV, "PA", c + 7, b"h")
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"adefgh"
    assert (conn.lost_bytes, conn.retransmissions, conn.bytes_to_server) == (2, 1, 6)


def test_gap_before_the_decision_reaches_the_analyzer() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, SRV, C, "PA", s, b"one")
    h.send(T0 + 2 * MS, SRV, C, "PA", s + 5, b"three")
    h.send(T0 + 3 * MS, C, SRV, "PA", c + 4, b"late")  # the client's first bytes were lost
    h.end()
    assert h.decided == [("C1", b"late")]
    assert [e[:4] for e in h.an().events] == [
        ("feed", 1, T0 + 1 * MS, b"one"), ("gap", 0, T0 + 3 * MS, 4),
        ("feed", 0, T0 + 3 * MS, b"late"), ("gap", 1, T0 + 3 * MS, 2),
        ("feed", 1, T0 + 2 * MS, b"three"), ("close", T0 + 3 * MS)]


def test_sequence_wraparound() -> None:
    h = Harness()
    isn = 0xFFFFFFFF - 5
    c, _s = handshake(h, cisn=isn)
    assert c == isn + 1
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"0123")            # ends just before the wrap
    h.send(T0 + 2 * MS, C, SRV, "PA", c + 8, b"89ab")        # after the wrap, ahead
    h.send(T0 + 2 * MS + 10 * US, C, SRV, "PA", c + 4, b"4567")  # crosses 2^32
    h.send(T0 + 3 * MS, C, SRV, "PA", c + 12, b"cd")
    h.send(T0 + 4 * MS, C, SRV, "PA", c + 4, b"45")          # old bytes: a retransmission
    h.send(T0 + 5 * MS, C, SRV, "FA", c + 14)
    conn = h.end()["C1"].conn
    assert h.an().stream(0) == b"0123456789abcd"
    assert (conn.bytes_to_server, conn.out_of_order, conn.retransmissions) == (14, 1, 1)
    assert conn.lost_bytes == 0


# -- FIN, RST, reuse, expiry ------------------------------------------------------------
def test_fin_close_and_fin_retransmission() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"bye")
    h.send(T0 + 2 * MS, C, SRV, "FA", c + 3)
    h.send(T0 + 3 * MS, SRV, C, "FA", s, ack=c + 4)
    h.send(T0 + 4 * MS, C, SRV, "A", c + 4, ack=s + 1)
    h.send(T0 + 250 * MS, SRV, C, "FA", s, ack=c + 4)  # FIN resent
    assert len(h.table.flows) == 2
    h.table.sweep(T0 + 250 * MS + CLOSED_LINGER_NS)
    assert len(h.table.flows) == 2  # still lingering
    h.table.sweep(T0 + 250 * MS + CLOSED_LINGER_NS + 1)
    assert h.table.flows == {}
    conn = h.finished[0].conn
    assert (conn.close, conn.retransmissions, conn.resets) == ("fin", 1, 0)
    assert conn.bytes_to_server == 3 and conn.last_ns == T0 + 250 * MS
    assert h.an().events[-1] == ("close", T0 + 250 * MS + CLOSED_LINGER_NS + 1)


def test_fin_with_data_and_half_close_stays_open() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "FPA", c, b"last")
    h.send(T0 + 2 * MS, SRV, C, "PA", s, b"reply")
    flows = h.end()
    assert flows["C1"].conn.close == "open"  # only one side closed: capture ended
    assert h.an().stream(0) == b"last" and h.an().stream(1) == b"reply"


def test_rst() -> None:
    h = Harness()
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"x")
    h.send(T0 + 2 * MS, SRV, C, "RA", s)
    h.send(T0 + 3 * MS, SRV, C, "R", s)
    h.table.sweep(T0 + 3 * MS + CLOSED_LINGER_NS + 1)
    assert h.table.flows == {}
    conn = h.finished[0].conn
    assert (conn.close, conn.resets) == ("rst", 2)


def test_port_reuse_after_fin() -> None:
    h = Harness()
    c, s = handshake(h, cisn=1000)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"first")
    h.send(T0 + 2 * MS, C, SRV, "FA", c + 5)
    h.send(T0 + 3 * MS, SRV, C, "FA", s, ack=c + 6)
    h.send(T0 + 4 * MS, C, SRV, "A", c + 6, ack=s + 1)
    assert h.finished == []
    c2, _s2 = handshake(h, cisn=777777, sisn=55, t=T0 + 10 * MS)
    assert [f.conn.id for f in h.finished] == ["C1"]  # emitted when the port was reused
    assert h.finished[0].conn.close == "fin"
    h.send(T0 + 11 * MS, C, SRV, "PA", c2, b"second")
    flows = h.end()
    assert list(flows) == ["C1", "C2"]
    assert h.an("C1").stream(0) == b"first" and h.an("C2").stream(0) == b"second"
    c2conn = flows["C2"].conn
    assert c2conn.syn_ns == T0 + 10 * MS and c2conn.packets == 4 and c2conn.close == "open"


def test_port_reuse_of_an_open_connection_and_by_the_other_side() -> None:
    h = Harness()
    handshake(h, cisn=1000)
    handshake(h, cisn=2000, t=T0 + 1 * S)          # new ISN, no FIN seen: reused
    handshake(h, cisn=3000, t=T0 + 2 * S, c=SRV, s=C)  # the old server now connects
    flows = h.end()
    assert [f.conn.close for f in flows.values()] == ["reused", "reused", "open"]
    assert flows["C3"].conn.client == "10.0.0.2:443"


def test_idle_expiry_frees_the_table() -> None:
    h = Harness()
    for i in range(20):
        cl = ("10.0.1.1", 40000 + i)
        c, _s = handshake(h, cisn=i * 1000, t=T0 + i * MS, c=cl)
        h.send(T0 + i * MS + 1 * MS, cl, SRV, "PA", c, b"q")
    assert len(h.table.flows) == 40
    h.table.sweep(T0 + IDLE_TIMEOUT_NS)
    assert len(h.table.flows) == 40
    h.table.sweep(T0 + 10 * MS + IDLE_TIMEOUT_NS + 1)
    assert len(h.table.flows) == 20  # the first ten have been idle long enough
    h.table.sweep(T0 + 1 * S + IDLE_TIMEOUT_NS)
    assert h.table.flows == {}
    assert [f.conn.close for f in h.finished] == ["idle"] * 20
    assert all(a.stream(0) == b"q" for a in h.analyzers.values())


def test_memory_follows_concurrent_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps during the scan finish closed connections: the table never grows with time."""
    monkeypatch.setattr(table_mod, "SWEEP_EVERY", 16)
    h = Harness(claim=False)
    peak = 0
    for i in range(200):
        t = T0 + i * 2 * S
        cl = ("10.0.1.1", 30000 + i)
        c, s = handshake(h, cisn=i, t=t, c=cl)
        h.send(t + 1 * MS, cl, SRV, "PA", c, b"q" * 100)
        h.send(t + 2 * MS, SRV, cl, "PA", s, b"r" * 1000)
        h.send(t + 3 * MS, cl, SRV, "FA", c + 100)
        h.send(t + 4 * MS, SRV, cl, "FA", s + 1000)
        peak = max(peak, len(h.table.flows))
    assert peak <= 2 * 8
    assert len(h.finished) > 150
    h.end()
    assert len(h.finished) == 200 and len(h.decided) == 200
    assert all(f.conn.close == "fin" and f.conn.bytes_to_client == 1000 for f in h.finished)


def test_self_connection_is_swept() -> None:
    h = Harness()
    me = ("127.0.0.1", 5000)
    h.send(T0, me, me, "S", 1)
    h.send(T0 + 1, me, me, "PA", 2, b"x")
    assert len(h.table.flows) == 1
    h.table.sweep(T0 + IDLE_TIMEOUT_NS + 2)
    assert h.table.flows == {} and len(h.finished) == 1


def test_unclaimed_flows_keep_no_payload() -> None:
    h = Harness(claim=False)
    c, s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"GET")  # the decision: nobody claims it
    h.send(T0 + 2 * MS, C, SRV, "PA", c + 10, b"held" * 100)
    h.send(T0 + 2 * MS, SRV, C, "PA", s + 10, b"held" * 100)
    flow = next(iter(h.table.flows.values()))[0]
    for dstate in flow.dirs:
        assert [v[1] for v in dstate.ooo.values()] == [None]
    assert flow.pending == [] and flow.analyzer is None
    flows = h.end()
    conn = flows["C1"].conn
    assert conn.lost_bytes == 17 and conn.bytes_to_server == 403 and conn.bytes_to_client == 400


def test_ipv6_connection() -> None:
    h = Harness()
    a, b = ("2001:db8::1", 50000), ("2001:db8::2", 443)

    def v6(ts: int, src: tuple[str, int], dst: tuple[str, int], flags: str, seq: int,
           payload: bytes = b"") -> tuple[int, int, bytes, int]:
        data = bytes(IPv6(src=src[0], dst=dst[0]) / TCP(sport=src[1], dport=dst[1], flags=flags,
                                                       seq=seq) / Raw(payload))
        return (ts, 229, data, len(data))

    h.table.scan([v6(T0, a, b, "S", 10), v6(T0 + 1 * MS, b, a, "SA", 20),
                  v6(T0 + 2 * MS, a, b, "A", 11), v6(T0 + 3 * MS, a, b, "PA", 11, b"hi")])
    conn = h.end()["C1"].conn
    assert (conn.client, conn.server) == ("[2001:db8::1]:50000", "[2001:db8::2]:443")
    assert conn.handshake_ack_ns - conn.syn_ns == 2 * MS
    assert h.an().stream(0) == b"hi"


def test_analyzer_errors_cost_one_connection_not_the_report() -> None:
    class Broken(Recorder):
        def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
            raise IndexError("analyzer bug")

    h = Harness()
    h.table.decide = lambda flow, first: Broken(flow, first)
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C, SRV, "PA", c, b"x")
    h.send(T0 + 2 * MS, C, SRV, "PA", c + 1, b"y")
    assert h.table.undecoded == 0
    flow = next(iter(h.table.flows.values()))[0]
    # The failing analyzer is fed nothing more, the connection is still counted,
    # and the failure is kept for a warning instead of killing the whole report.
    assert flow.failure is not None and "IndexError" in flow.failure
    assert flow.conn.bytes_to_server == 2


# -- properties -------------------------------------------------------------------------
@st.composite
def _segmented(draw: st.DrawFn) -> tuple[bytes, int, list[tuple[int, int]]]:
    data = draw(st.binary(min_size=1, max_size=600))
    isn = draw(st.one_of(st.integers(0, 0xFFFFFFFF), st.integers(0xFFFFFFFF - 700, 0xFFFFFFFF)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=25)))
    bounds = [0, *[x for x in cuts if x < len(data)], len(data)]
    segs = list(itertools.pairwise(bounds))
    extra = draw(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 80)),
                          max_size=6))
    segs += [(a, min(len(data), a + n)) for a, n in extra]  # overlapping retransmissions
    order = draw(st.permutations(segs))
    return data, isn, list(order)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_segmented(), _segmented(), st.booleans())
def test_reordered_segments_deliver_the_exact_stream(
        up: tuple[bytes, int, list[tuple[int, int]]],
        down: tuple[bytes, int, list[tuple[int, int]]], handshake_seen: bool) -> None:
    cdata, cisn, csegs = up
    sdata, sisn, ssegs = down
    h = Harness()
    pkts: list[tuple[int, int, bytes, int]] = []
    if handshake_seen:
        pkts += [(T0, 1, frame(C, SRV, "S", cisn - 1), 54),
                 (T0 + 1, 1, frame(SRV, C, "SA", sisn - 1), 54),
                 (T0 + 2, 1, frame(C, SRV, "A", cisn), 54)]
    else:  # no handshake: the first segment of each direction starts its stream
        first_c = min(csegs)
        first_s = min(ssegs)
        csegs.remove(first_c)
        ssegs.remove(first_s)
        csegs.insert(0, first_c)
        ssegs.insert(0, first_s)
    # the two directions interleaved, each keeping its own order
    merged: list[tuple[int, tuple[int, int]]] = []
    for i in range(max(len(csegs), len(ssegs))):
        merged += [(0, csegs[i])] if i < len(csegs) else []
        merged += [(1, ssegs[i])] if i < len(ssegs) else []
    t = T0 + 1 * MS
    for d, (a, b) in merged:
        src, dst, isn, data = (C, SRV, cisn, cdata) if d == 0 else (SRV, C, sisn, sdata)
        f = frame(src, dst, "PA", isn + a, data[a:b])
        pkts.append((t, 1, f, len(f)))
        t += 10 * US
    h.table.scan(pkts)
    conn = h.end()["C1"].conn
    an = h.an()
    assert an.stream(0) == cdata and an.stream(1) == sdata
    assert an.gaps() == []
    assert (conn.bytes_to_server, conn.bytes_to_client, conn.lost_bytes) == (
        len(cdata), len(sdata), 0)
    assert conn.client == "10.0.0.1:50000"
    # each feed carries the time and number of a packet that held its first byte
    times = {p[0]: i + 1 for i, p in enumerate(pkts)}
    for _d, ts, _data, pkt in (e[1:] for e in an.events if e[0] == "feed"):
        assert times[ts] == pkt


@settings(max_examples=100, deadline=None)
@given(_segmented())
def test_unclaimed_reordered_stream_counts_exact_bytes(
        up: tuple[bytes, int, list[tuple[int, int]]]) -> None:
    data, isn, segs = up
    h = Harness(claim=False)
    pkts = [(T0, 1, frame(C, SRV, "S", isn - 1), 54)]
    for i, (a, b) in enumerate(segs):
        f = frame(C, SRV, "PA", isn + a, data[a:b])
        pkts.append((T0 + (i + 1) * MS, 1, f, len(f)))
    h.table.scan(pkts)
    conn = h.end()["C1"].conn
    assert conn.bytes_to_server == len(data) and conn.lost_bytes == 0


def test_server_ttl_from_the_syn_ack_or_the_first_server_packet() -> None:
    h = Harness()
    h.table.scan([(T0, 1, frame(C, SRV, "S", 1000), 54),
                  (T0 + US, 1, frame(SRV, C, "SA", 9000, ack=1001, ttl=57), 54),
                  (T0 + 2 * US, 1, frame(SRV, C, "A", 9001, ack=1001, ttl=3), 54)])
    # a mid-stream connection first seen from the server side
    other = (C[0], C[1] + 1)
    h.table.scan([(T0 + 3 * US, 1, frame(SRV, other, "PA", 5, b"x", ttl=120), 55)])
    flows = h.end()
    assert flows["C1"].conn.server_ttl == 57  # the SYN-ACK's, not a later packet's
    assert flows["C2"].conn.server_ttl == 120
    assert flows["C1"].conn.to_json()["server_ttl"] == 57
