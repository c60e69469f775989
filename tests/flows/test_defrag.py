"""IPv4 and IPv6 fragment reassembly: netdiag.flows.defrag and its use by the flow table."""

from __future__ import annotations

import random
from typing import Any

import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, TCP, UDP, fragment
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, fragment6
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from netdiag.capture import linktypes as lt
from netdiag.flows import defrag as defrag_mod
from netdiag.flows.defrag import FRAGMENT_TIMEOUT_NS, MAX_PENDING, Defragmenter
from netdiag.flows.table import FlowTable
from netdiag.flows.tcp import TcpFlow

T0 = 1_764_425_767_000_000_000
MS = 1_000_000
SRC, DST = b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x35"
# a DNS response too big for one 576-byte fragment
DNS_R = bytes(DNS(id=7, qr=1, qd=DNSQR(qname="big.test", qtype="TXT"),
                  an=[DNSRR(rrname="big.test", type="TXT", rdata=[b"t" * 200]) for _ in range(8)]))


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.warnings: list[str] = []

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        self.events.append(("feed", direction, ts_ns, bytes(data), packet))

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        self.events.append(("gap", direction, ts_ns, nbytes))

    def close(self, ts_ns: int) -> None:
        self.events.append(("close", ts_ns))


class Harness:
    def __init__(self) -> None:
        self.analyzers: list[Recorder] = []
        self.finished: list[TcpFlow] = []
        self.udp: list[tuple[int, str, str, bytes, int]] = []
        self.table = FlowTable(self._decide, self.finished.append,
                               lambda *a: self.udp.append(a))

    def _decide(self, flow: TcpFlow, first: bytes) -> Recorder:
        self.analyzers.append(Recorder())
        return self.analyzers[-1]

    def scan(self, ltype: int, frames: list[bytes | Packet], step: int = MS) -> Harness:
        self.table.scan([(T0 + i * step, ltype, bytes(f), len(bytes(f)))
                         for i, f in enumerate(frames)])
        return self


# -- the Defragmenter alone --------------------------------------------------------------
def _add(d: Defragmenter, offset: int, data: bytes, more: bool, ts: int = T0,
         ident: int = 1) -> bytes | None:
    return d.add(ts, SRC, DST, ident, 17, offset, more, data)


def test_in_order_and_out_of_order() -> None:
    d = Defragmenter()
    assert _add(d, 0, b"a" * 8, True) is None
    assert _add(d, 8, b"b" * 8, True) is None
    assert _add(d, 16, b"c", False) == b"a" * 8 + b"b" * 8 + b"c"
    assert d._pending == {}
    assert _add(d, 16, b"c", False, ident=2) is None
    assert _add(d, 8, b"b" * 8, True, ident=2) is None
    assert _add(d, 0, b"a" * 8, True, ident=2) == b"a" * 8 + b"b" * 8 + b"c"


def test_duplicates_and_overlaps() -> None:
    d = Defragmenter()
    whole = bytes(range(40))
    assert _add(d, 0, whole[:16], True) is None
    assert _add(d, 0, whole[:16], True) is None  # duplicate
    assert _add(d, 8, whole[8:32], True) is None  # overlaps both neighbours
    assert _add(d, 24, whole[24:], False) == whole


def test_longer_copy_at_the_same_offset_is_kept() -> None:
    d = Defragmenter()
    whole = bytes(range(48))
    assert _add(d, 0, whole[:8], True) is None
    assert _add(d, 0, whole[:24], True) is None  # refragmented: more bytes at offset 0
    assert _add(d, 24, whole[24:], False) == whole


def test_missing_piece_never_completes_and_expires() -> None:
    d = Defragmenter()
    assert _add(d, 0, b"a" * 8, True) is None
    assert _add(d, 16, b"c", False) is None
    d.expire(T0 + FRAGMENT_TIMEOUT_NS)
    assert len(d._pending) == 1 and d.dropped == 0
    d.expire(T0 + FRAGMENT_TIMEOUT_NS + 1)
    assert d._pending == {} and d.dropped == 1


def test_oversized_datagram_dropped() -> None:
    d = Defragmenter()
    assert _add(d, 0, b"a" * 8, True) is None
    assert _add(d, 65528, b"x" * 100, False) is None
    assert d._pending == {} and d.dropped == 1


def test_pending_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defrag_mod, "MAX_PENDING", 4)
    d = Defragmenter()
    for i in range(10):
        _add(d, 8, b"x", False, ts=T0 + i, ident=i)
    assert len(d._pending) == 4 and d.dropped == 6
    assert sorted(k[2] for k in d._pending) == [6, 7, 8, 9]  # the oldest went first
    assert MAX_PENDING >= 1024


# -- through the flow table ------------------------------------------------------------
def _frags4(payload_pkt: Packet, size: int) -> list[bytes]:
    return [bytes(f) for f in fragment(payload_pkt, fragsize=size)]


def _dns_response4() -> Packet:
    return IP(src="10.0.0.53", dst="10.0.0.1", id=0x4242) / UDP(sport=53, dport=40000) / Raw(DNS_R)


def test_ipv4_udp_dns_fragments_out_of_order_with_duplicates() -> None:
    frags = _frags4(_dns_response4(), 576)
    assert len(frags) >= 3
    order = [frags[2], frags[0], frags[2], *frags[3:], frags[1], frags[0]]
    h = Harness().scan(lt.LINKTYPE_RAW, order)
    assert len(h.udp) == 1
    ts, src, dst, payload, pkt = h.udp[0]
    assert (src, dst, payload) == ("10.0.0.53:53", "10.0.0.1:40000", DNS_R)
    # completed by the packet carrying frags[1]
    assert pkt == len(order) - 1 and ts == T0 + (len(order) - 2) * MS
    assert h.table.undecoded == 0
    # the late duplicate of frags[0] starts a datagram of its own, which times out
    assert len(h.table.defrag._pending) == 1
    h.table.sweep(T0 + FRAGMENT_TIMEOUT_NS + 10 * MS)
    assert h.table.defrag._pending == {} and len(h.udp) == 1


def test_ipv4_overlapping_fragments_by_hand() -> None:
    """Fragments cut at other places than scapy's, overlapping, over Ethernet with padding."""
    whole = bytes(_dns_response4())
    hdr, body = bytearray(whole[:20]), whole[20:]
    frames = []
    for off, end, more in ((0, 48, True), (40, 200, True), (96, len(body), False)):
        h = bytearray(hdr)
        piece = body[off:end]
        h[2:4] = (20 + len(piece)).to_bytes(2, "big")
        h[6:8] = ((0x2000 if more else 0) | (off >> 3)).to_bytes(2, "big")
        frames.append(bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=0x0800))
                      + bytes(h) + piece + b"\x00" * 30)  # trailing frame padding
    h = Harness().scan(lt.LINKTYPE_ETHERNET, [frames[2], frames[1], frames[0]])
    assert [u[3] for u in h.udp] == [DNS_R]


def test_ipv4_fragmented_tcp_segment() -> None:
    seg = IP(src="10.0.0.1", dst="10.0.0.2", id=9) / TCP(sport=50000, dport=80, flags="PA",
                                                         seq=100) / Raw(b"P" * 3000)
    frags = _frags4(seg, 1000)
    random.Random(3).shuffle(frags)
    h = Harness().scan(lt.LINKTYPE_IPV4, frags)
    h.table.finish_all()
    assert len(h.finished) == 1
    conn = h.finished[0].conn
    assert (conn.client, conn.server, conn.bytes_to_server) == (
        "10.0.0.1:50000", "10.0.0.2:80", 3000)
    assert h.analyzers[0].events[0][:4] == ("feed", 0, T0 + (len(frags) - 1) * MS, b"P" * 3000)


def test_fragments_of_different_datagrams_do_not_mix() -> None:
    a = _frags4(IP(src="10.0.0.53", dst="10.0.0.1", id=1) / UDP(sport=53, dport=1)
                / Raw(b"A" * 1500), 512)
    b = _frags4(IP(src="10.0.0.53", dst="10.0.0.1", id=2) / UDP(sport=53, dport=1)
                / Raw(b"B" * 1500), 512)
    interleaved = [x for pair in zip(a, b, strict=True) for x in pair]
    h = Harness().scan(lt.LINKTYPE_RAW, interleaved)
    assert [u[3] for u in h.udp] == [b"A" * 1500, b"B" * 1500]


def test_incomplete_fragments_expire_at_sweep() -> None:
    frags = _frags4(_dns_response4(), 576)
    h = Harness().scan(lt.LINKTYPE_RAW, frags[1:])
    assert h.udp == [] and len(h.table.defrag._pending) == 1
    h.table.sweep(T0 + FRAGMENT_TIMEOUT_NS + 10 * MS)
    assert h.table.defrag._pending == {} and h.table.defrag.dropped == 1


def _dns_response6() -> Packet:
    return (IPv6(src="2001:db8::53", dst="2001:db8::1") / IPv6ExtHdrFragment(id=77)
            / UDP(sport=53, dport=40000) / Raw(DNS_R))


def test_ipv6_fragments_reassembled() -> None:
    frags = [bytes(f) for f in fragment6(_dns_response6(), 600)]
    assert len(frags) >= 3
    h = Harness().scan(lt.LINKTYPE_IPV6, [frags[-1], *frags[1:-1], frags[1], frags[0]])
    assert [(u[1], u[2], u[3]) for u in h.udp] == [
        ("[2001:db8::53]:53", "[2001:db8::1]:40000", DNS_R)]
    assert h.table.undecoded == 0


def test_ipv6_fragmentable_part_starting_with_destination_options() -> None:
    """Extension headers after the fragment header are walked once the datagram is whole."""
    pkt = (IPv6(src="2001:db8::53", dst="2001:db8::1") / IPv6ExtHdrFragment(id=78)
           / IPv6ExtHdrDestOpt() / UDP(sport=53, dport=40000) / Raw(DNS_R))
    frags = [bytes(f) for f in fragment6(pkt, 700)]
    h = Harness().scan(lt.LINKTYPE_RAW, list(reversed(frags)))
    assert [u[3] for u in h.udp] == [DNS_R]


def test_ipv6_fragmented_tcp() -> None:
    pkt = (IPv6(src="2001:db8::1", dst="2001:db8::2") / IPv6ExtHdrFragment(id=5)
           / TCP(sport=50000, dport=443, flags="PA", seq=1) / Raw(b"Q" * 2500))
    frags = [bytes(f) for f in fragment6(pkt, 1000)]
    h = Harness().scan(lt.LINKTYPE_IPV6, frags[::-1])
    h.table.finish_all()
    assert h.analyzers[0].events[0][3] == b"Q" * 2500
    assert h.finished[0].conn.server == "[2001:db8::2]:443"


def test_ipv6_atomic_fragment() -> None:
    """A fragment header with offset 0 and no more fragments: the packet is whole already."""
    pkt = (IPv6(src="2001:db8::53", dst="2001:db8::1") / IPv6ExtHdrFragment(id=9, offset=0, m=0)
           / UDP(sport=53, dport=40000) / Raw(b"atomic"))
    h = Harness().scan(lt.LINKTYPE_IPV6, [pkt])
    assert [u[3] for u in h.udp] == [b"atomic"]
    assert h.table.defrag._pending == {}
