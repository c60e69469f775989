"""The per-packet decode of netdiag.flows.table: link types, IPv4/IPv6 headers, UDP.

Packets are built with scapy (or by hand where scapy has no layer for the link
header) and fed to :meth:`FlowTable.scan` as ``(ts_ns, linktype, data, wire_len)``.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.dns import DNS, DNSQR
from scapy.layers.inet import IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether
from scapy.packet import Packet, Raw

from netdiag.capture import linktypes as lt
from netdiag.flows.table import FlowTable
from netdiag.flows.tcp import TcpFlow

T0 = 1_764_425_767_123_456_789
DNS_Q = bytes(DNS(id=0x1234, qd=DNSQR(qname="api.roc.test")))
MACS = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}


class Recorder:
    """A StreamAnalyzer that records every call."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.warnings: list[str] = []

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        self.events.append(("feed", direction, ts_ns, bytes(data), packet))

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        self.events.append(("gap", direction, ts_ns, nbytes))

    def close(self, ts_ns: int) -> None:
        self.events.append(("close", ts_ns))

    def stream(self, direction: int) -> bytes:
        return b"".join(e[3] for e in self.events if e[0] == "feed" and e[1] == direction)


class Harness:
    """A FlowTable with a claiming decider and recording callbacks."""

    def __init__(self, dns_ports: frozenset[int] = frozenset({53}),
                 dns_heuristic: bool = True) -> None:
        self.analyzers: list[Recorder] = []
        self.finished: list[TcpFlow] = []
        self.udp: list[tuple[int, str, str, bytes, int]] = []
        self.table = FlowTable(self._decide, self.finished.append, self._udp, dns_ports,
                               dns_heuristic=dns_heuristic)

    def _decide(self, flow: TcpFlow, first: bytes) -> Recorder:
        rec = Recorder()
        self.analyzers.append(rec)
        return rec

    def _udp(self, ts: int, src: str, dst: str, payload: bytes, pkt: int) -> None:
        self.udp.append((ts, src, dst, payload, pkt))

    def scan(self, *frames: tuple[int, bytes | Packet]) -> Harness:
        """Scan ``(linktype, frame)`` pairs, 1 ms apart."""
        pkts = []
        for i, (ltype, frame) in enumerate(frames):
            data = bytes(frame)
            pkts.append((T0 + i * 1_000_000, ltype, data, len(data)))
        self.table.scan(pkts)
        return self


def eth() -> Ether:
    return Ether(**MACS)


def udp4(payload: bytes = DNS_Q) -> Packet:
    return IP(src="10.0.0.1", dst="10.0.0.53") / UDP(sport=40000, dport=53) / Raw(payload)


def udp6(payload: bytes = DNS_Q) -> Packet:
    return IPv6(src="2001:db8::1", dst="2001:db8::53") / UDP(sport=40000, dport=53) / Raw(payload)


V4_EPS = ("10.0.0.1:40000", "10.0.0.53:53")
V6_EPS = ("[2001:db8::1]:40000", "[2001:db8::53]:53")


def null_hdr(family: int, order: str) -> bytes:
    return struct.pack("<I" if order == "little" else ">I", family)


LINK_CASES = [
    ("ethernet-v4", lt.LINKTYPE_ETHERNET, lambda: eth() / udp4(), V4_EPS),
    ("ethernet-v6", lt.LINKTYPE_ETHERNET, lambda: eth() / udp6(), V6_EPS),
    ("vlan", lt.LINKTYPE_ETHERNET, lambda: eth() / Dot1Q(vlan=7) / udp4(), V4_EPS),
    ("vlan-v6", lt.LINKTYPE_ETHERNET, lambda: eth() / Dot1Q(vlan=7) / udp6(), V6_EPS),
    ("qinq", lt.LINKTYPE_ETHERNET,
     lambda: eth() / Dot1AD(vlan=10) / Dot1Q(vlan=20) / udp4(), V4_EPS),
    ("qinq-9100", lt.LINKTYPE_ETHERNET,
     lambda: Ether(type=0x9100, **MACS) / Dot1Q(vlan=10) / Dot1Q(vlan=20) / udp4(), V4_EPS),
    ("sll", lt.LINKTYPE_LINUX_SLL, lambda: CookedLinux(proto=0x0800) / udp4(), V4_EPS),
    ("sll-v6", lt.LINKTYPE_LINUX_SLL, lambda: CookedLinux(proto=0x86DD) / udp6(), V6_EPS),
    ("sll2", lt.LINKTYPE_LINUX_SLL2, lambda: CookedLinuxV2(proto=0x0800) / udp4(), V4_EPS),
    ("sll2-v6", lt.LINKTYPE_LINUX_SLL2, lambda: CookedLinuxV2(proto=0x86DD) / udp6(), V6_EPS),
    # a VLAN tag put back after the cooked header (netdiag capture -i any does so)
    ("sll-vlan", lt.LINKTYPE_LINUX_SLL,
     lambda: CookedLinux(proto=0x8100) / Dot1Q(vlan=7) / udp4(), V4_EPS),
    ("sll2-vlan", lt.LINKTYPE_LINUX_SLL2,
     lambda: CookedLinuxV2(proto=0x8100) / Dot1Q(vlan=7) / udp4(), V4_EPS),
    ("raw-v4", lt.LINKTYPE_RAW, udp4, V4_EPS),
    ("raw-v6", lt.LINKTYPE_RAW, udp6, V6_EPS),
    ("ipv4", lt.LINKTYPE_IPV4, udp4, V4_EPS),
    ("ipv6", lt.LINKTYPE_IPV6, udp6, V6_EPS),
]
for _order in ("little", "big"):
    LINK_CASES.append((f"null-inet-{_order}", lt.LINKTYPE_NULL,
                       lambda o=_order: null_hdr(2, o) + bytes(udp4()), V4_EPS))
    for _fam in (10, 24, 28, 30):
        LINK_CASES.append((f"null-inet6-{_fam}-{_order}", lt.LINKTYPE_NULL,
                           lambda f=_fam, o=_order: null_hdr(f, o) + bytes(udp6()), V6_EPS))
LINK_CASES.append(("loop-inet", lt.LINKTYPE_LOOP, lambda: null_hdr(2, "big") + bytes(udp4()),
                   V4_EPS))
for _fam in (24, 28, 30):
    LINK_CASES.append((f"loop-inet6-{_fam}", lt.LINKTYPE_LOOP,
                       lambda f=_fam: null_hdr(f, "big") + bytes(udp6()), V6_EPS))


@pytest.mark.parametrize(("ltype", "build", "eps"), [c[1:] for c in LINK_CASES],
                         ids=[c[0] for c in LINK_CASES])
def test_link_types_reach_udp(ltype: int, build: Any, eps: tuple[str, str]) -> None:
    h = Harness().scan((ltype, build()))
    assert h.table.undecoded == 0
    assert h.udp == [(T0, eps[0], eps[1], DNS_Q, 1)]


@pytest.mark.parametrize(("ltype", "build", "eps"), [c[1:] for c in LINK_CASES],
                         ids=[c[0] for c in LINK_CASES])
def test_every_truncation_is_delivered_or_undecoded(ltype: int, build: Any,
                                                    eps: tuple[str, str]) -> None:
    """A capture cut at any length never raises: the packet is read or counted undecoded."""
    frame = bytes(build())
    h = Harness()
    h.scan(*[(ltype, frame[:n]) for n in range(len(frame) + 1)])
    assert h.table.packets == len(frame) + 1
    assert h.table.undecoded + len(h.udp) == len(frame) + 1
    # every delivered prefix carries the UDP header and a prefix of the payload
    for _ts, src, dst, payload, _pkt in h.udp:
        assert (src, dst) == eps
        assert DNS_Q.startswith(payload)
    assert h.udp[-1][3] == DNS_Q


def test_link_tcp_over_ethernet_v6_and_sll2() -> None:
    h = Harness()
    seg6 = IPv6(src="2001:db8::1", dst="2001:db8::2") / TCP(sport=50000, dport=443, flags="PA",
                                                           seq=1000) / Raw(b"hello")
    seg4 = IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=50000, dport=443, flags="PA",
                                                  seq=1000) / Raw(b"world")
    h.scan((lt.LINKTYPE_ETHERNET, eth() / seg6), (lt.LINKTYPE_LINUX_SLL2,
                                                 CookedLinuxV2(proto=0x0800) / seg4))
    h.table.finish_all()
    conns = {f.conn.client: f for f in h.finished}
    assert set(conns) == {"[2001:db8::1]:50000", "10.0.0.1:50000"}
    assert conns["[2001:db8::1]:50000"].conn.server == "[2001:db8::2]:443"
    assert [a.stream(0) for a in h.analyzers] == [b"hello", b"world"]


def test_unknown_link_type_counted() -> None:
    h = Harness().scan((lt.LINKTYPE_IEEE802_11, eth() / udp4()), (147, b"\x00" * 40))
    assert h.table.undecoded == 2
    assert h.table.link_unknown == {lt.LINKTYPE_IEEE802_11, 147}
    assert h.udp == []


@pytest.mark.parametrize("frame", [
    pytest.param(lambda: eth() / ARP(), id="arp"),
    pytest.param(lambda: Ether(type=0x0800, **MACS) / udp6(), id="v6-in-v4-ethertype"),
    pytest.param(lambda: Ether(type=0x86DD, **MACS) / udp4(), id="v4-in-v6-ethertype"),
    pytest.param(lambda: eth() / IP(ihl=4) / UDP(dport=53) / Raw(DNS_Q), id="ihl-4"),
    pytest.param(lambda: eth() / IP(len=24) / UDP(dport=53) / Raw(DNS_Q), id="ip-len-cuts-udp"),
    pytest.param(lambda: eth() / IP(len=12) / UDP(dport=53) / Raw(DNS_Q), id="ip-len-below-ihl"),
    pytest.param(lambda: eth() / IP() / TCP(dataofs=4) / Raw(b"x"), id="tcp-doff-4"),
    pytest.param(lambda: eth() / IP(len=30) / TCP() / Raw(b"x"), id="ip-len-cuts-tcp"),
    pytest.param(lambda: b"", id="empty"),
    pytest.param(lambda: b"\x08\x00", id="two-bytes"),
])
def test_malformed_counted_undecoded(frame: Any) -> None:
    h = Harness().scan((lt.LINKTYPE_ETHERNET, frame()))
    assert h.table.undecoded == 1
    assert h.udp == [] and h.table.flows == {}


def test_null_unknown_family_and_raw_bad_version() -> None:
    h = Harness().scan((lt.LINKTYPE_NULL, null_hdr(7, "little") + bytes(udp4())),
                       (lt.LINKTYPE_RAW, b"\x50" + bytes(udp4())[1:]),
                       (lt.LINKTYPE_IPV6, bytes(udp4())))
    assert h.table.undecoded == 3
    assert h.udp == []


def test_ipv4_options_skipped() -> None:
    pkt = IP(src="10.0.0.1", dst="10.0.0.53", options=[IPOption_RR()]) / UDP(
        sport=40000, dport=53) / Raw(DNS_Q)
    raw = bytes(pkt)
    assert raw[0] & 15 > 5
    h = Harness().scan((lt.LINKTYPE_RAW, raw))
    assert h.udp == [(T0, *V4_EPS, DNS_Q, 1)]
    tcp = IP(src="10.0.0.1", dst="10.0.0.2", options=[IPOption_RR()]) / TCP(
        sport=50000, dport=80, flags="PA") / Raw(b"GET / HTTP/1.1\r\n")
    h = Harness().scan((lt.LINKTYPE_RAW, tcp))
    h.table.finish_all()
    assert h.analyzers[0].stream(0) == b"GET / HTTP/1.1\r\n"


def test_ethernet_padding_trimmed() -> None:
    """A short IP packet padded to Ethernet's 60-byte minimum: the padding is no payload."""
    frame = bytes(eth() / udp4(b"ab"))
    assert len(frame) < 60
    h = Harness().scan((lt.LINKTYPE_ETHERNET, frame + b"\xee" * (60 - len(frame))))
    assert h.udp[0][3] == b"ab"
    tcp = bytes(eth() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=50000, dport=80,
                                                                flags="PA") / Raw(b"x"))
    h = Harness().scan((lt.LINKTYPE_ETHERNET, tcp + b"\xee" * 6))
    h.table.finish_all()
    assert h.analyzers[0].stream(0) == b"x"
    assert h.finished[0].conn.bytes_to_server == 1
    # the same for IPv6, trimmed to the payload length
    frame6 = bytes(eth() / udp6(b"cd")) + b"\xee" * 8
    assert Harness().scan((lt.LINKTYPE_ETHERNET, frame6)).udp[0][3] == b"cd"


def test_tso_total_length_zero_takes_the_frame() -> None:
    raw = bytearray(bytes(udp4(b"z" * 3000)))
    raw[2:4] = b"\x00\x00"
    h = Harness().scan((lt.LINKTYPE_RAW, bytes(raw)))
    assert h.udp[0][3] == b"z" * 3000
    raw6 = bytearray(bytes(udp6(b"y" * 3000)))
    raw6[4:6] = b"\x00\x00"
    assert Harness().scan((lt.LINKTYPE_IPV6, bytes(raw6))).udp[0][3] == b"y" * 3000


def test_ip_length_beyond_capture_is_cut_to_capture() -> None:
    """A snaplen-truncated packet: the captured part of the payload is handed on."""
    frame = bytes(eth() / udp4())
    h = Harness().scan((lt.LINKTYPE_ETHERNET, frame[:-5]))
    assert h.udp[0][3] == DNS_Q[:-5]


def _v6_ext() -> Packet:
    return (IPv6(src="2001:db8::1", dst="2001:db8::53") / IPv6ExtHdrHopByHop()
            / IPv6ExtHdrRouting(addresses=["2001:db8::99"]) / IPv6ExtHdrDestOpt())


def test_ipv6_extension_headers_udp_and_tcp() -> None:
    h = Harness().scan((lt.LINKTYPE_ETHERNET, eth() / _v6_ext() / UDP(sport=40000, dport=53)
                        / Raw(DNS_Q)))
    assert h.udp == [(T0, *V6_EPS, DNS_Q, 1)]
    h = Harness().scan((lt.LINKTYPE_ETHERNET, eth() / _v6_ext() / TCP(
        sport=50000, dport=443, flags="PA", seq=5) / Raw(b"abc")))
    h.table.finish_all()
    assert h.finished[0].conn.client == "[2001:db8::1]:50000"
    assert h.analyzers[0].stream(0) == b"abc"


def test_ipv6_authentication_header() -> None:
    # next header UDP, length 4 (in 4-byte units, minus 2): 24 bytes with a 12-byte ICV
    ah = bytes([17, 4, 0, 0]) + struct.pack(">II", 0x100, 1) + b"\x00" * 12
    pkt = (IPv6(src="2001:db8::1", dst="2001:db8::53", nh=51) / Raw(ah)
           / UDP(sport=40000, dport=53) / Raw(DNS_Q))
    assert Harness().scan((lt.LINKTYPE_IPV6, pkt)).udp == [(T0, *V6_EPS, DNS_Q, 1)]


def test_other_ip_protocols_ignored() -> None:
    h = Harness().scan((lt.LINKTYPE_RAW, IP() / Raw(b"\x08\x00" + b"\x00" * 6)),
                       (lt.LINKTYPE_RAW, IPv6(nh=59)))
    assert h.udp == [] and h.table.flows == {}
    assert h.table.packets == 2


def test_udp_not_dns_ignored_and_dns_ports_option() -> None:
    pkt = IP(src="10.0.0.1", dst="10.0.0.9") / UDP(sport=40000, dport=5353) / Raw(DNS_Q)
    other = IP(src="10.0.0.1", dst="10.0.0.9") / UDP(sport=40000, dport=5353) / Raw(
        b"\x12\x34" + bytes(30))
    assert Harness(dns_heuristic=False).scan((lt.LINKTYPE_RAW, pkt)).udp == []
    assert Harness().scan((lt.LINKTYPE_RAW, other)).udp == []  # not DNS-shaped
    for h in (Harness(frozenset({5353}), dns_heuristic=False),  # forced by the port
              Harness()):  # found by its shape
        h.scan((lt.LINKTYPE_RAW, pkt))
        assert h.udp == [(T0, "10.0.0.1:40000", "10.0.0.9:5353", DNS_Q, 1)]
    # a response: source port 53
    resp = IP(src="10.0.0.53", dst="10.0.0.1") / UDP(sport=53, dport=40000) / Raw(b"r")
    assert Harness().scan((lt.LINKTYPE_RAW, resp)).udp[0][1:4] == (
        "10.0.0.53:53", "10.0.0.1:40000", b"r")


def test_packet_numbers_times_and_counts() -> None:
    h = Harness()
    pkts = [(T0 + 5, 101, bytes(udp4(b"a")), 0), (T0 + 2, 101, bytes(udp4(b"b")), 0),
            (T0 + 9, 999, b"", 0)]
    h.table.scan(pkts, first_number=10)
    assert [(u[0], u[3], u[4]) for u in h.udp] == [(T0 + 5, b"a", 10), (T0 + 2, b"b", 11)]
    assert (h.table.first_ns, h.table.last_ns, h.table.packets) == (T0 + 2, T0 + 9, 3)
    h.table.scan([(T0 + 1, 101, bytes(udp4(b"c")), 0)])
    assert h.udp[-1][4] == 1
    assert (h.table.first_ns, h.table.last_ns, h.table.packets) == (T0 + 1, T0 + 9, 4)
    h.table.scan([])
    assert (h.table.first_ns, h.table.last_ns) == (T0 + 1, T0 + 9)


LINKS = st.sampled_from([0, 1, 101, 108, 113, 228, 229, 276, 9, 12345])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(LINKS, st.binary(max_size=120)), max_size=30))
def test_random_bytes_never_raise(frames: list[tuple[int, bytes]]) -> None:
    h = Harness()
    h.table.scan([(T0 + i, ltype, data, len(data)) for i, (ltype, data) in enumerate(frames)])
    h.table.sweep(T0 + 10**15)
    h.table.finish_all()
    assert h.table.packets == len(frames)
    assert h.table.flows == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 101, 113, 276]), st.integers(0, 80),
                          st.binary(min_size=1, max_size=8)), max_size=20))
def test_mutated_valid_packets_never_raise(edits: list[tuple[int, int, bytes]]) -> None:
    """Valid headers with a few bytes overwritten reach deeper code paths than pure noise."""
    bases = {
        1: bytes(eth() / Dot1Q() / _v6_ext() / TCP(flags="S") / Raw(b"x" * 20)),
        101: bytes(IP(flags="MF", frag=0) / UDP(dport=53) / Raw(b"x" * 24)),
        113: bytes(CookedLinux(proto=0x86DD) / IPv6(nh=44) / Raw(b"\x11\x00\x00\x01" + b"\x00"
                                                               * 4 + b"x" * 24)),
        276: bytes(CookedLinuxV2(proto=0x0800) / IP() / TCP(flags="PA") / Raw(b"y" * 20)),
    }
    h = Harness()
    pkts = []
    for i, (ltype, at, patch) in enumerate(edits):
        base = bytearray(bases[ltype])
        base[at:at + len(patch)] = patch
        pkts.append((T0 + i, ltype, bytes(base), len(base)))
    h.table.scan(pkts)
    h.table.finish_all()
    assert h.table.packets == len(edits)


# -- in place: a packet inside a buffer that holds more bytes after it ---------------------

def _outcome(h: Harness) -> tuple[Any, ...]:
    """What a scan left: counts, UDP deliveries, every stream's calls and connections."""
    h.table.finish_all()
    return (h.table.packets, h.table.undecoded, sorted(h.table.link_unknown), h.udp,
            [a.events for a in h.analyzers],
            [(f.conn.client, f.conn.server, f.conn.packets, f.conn.bytes_to_server)
             for f in h.finished])


def _in_place(frames: list[tuple[int, bytes]], after: bytes) -> tuple[Any, ...]:
    """Each frame handed to ``FlowTable.packet`` inside one buffer, with ``after`` (the
    next packet's bytes, as a capture file's chunk holds them) right behind it."""
    h = Harness()
    buf = b"".join(data + after for _lt, data in frames)
    start = 0
    h.table._begin(1)
    for i, (ltype, data) in enumerate(frames):
        h.table.packet(T0 + i, ltype, buf, start, start + len(data), len(data))
        start += len(data) + len(after)
    h.table._end(1)
    return _outcome(h)


def _alone(frames: list[tuple[int, bytes]]) -> tuple[Any, ...]:
    h = Harness()
    h.table.scan([(T0 + i, ltype, data, len(data)) for i, (ltype, data) in enumerate(frames)])
    return _outcome(h)


def _frames_to_cut() -> list[tuple[int, bytes]]:
    frames = [(c[1], bytes(c[2]())) for c in LINK_CASES]
    frames += [
        (lt.LINKTYPE_ETHERNET, bytes(eth() / _v6_ext() / TCP(sport=50000, dport=443,
                                                             flags="PA") / Raw(b"abc"))),
        (lt.LINKTYPE_ETHERNET, bytes(eth() / _v6_ext() / UDP(sport=40000, dport=53)
                                     / Raw(DNS_Q))),
        (lt.LINKTYPE_RAW, bytes(IP(options=[IPOption_RR()]) / TCP(flags="PA") / Raw(b"x"))),
        (lt.LINKTYPE_RAW, bytes(IP(flags="MF", frag=0) / UDP(dport=53) / Raw(b"x" * 24))),
        (lt.LINKTYPE_IPV6, bytes(IPv6(nh=44) / Raw(b"\x11\x00\x00\x01" + b"\x00" * 4
                                                   + bytes(UDP(dport=53) / Raw(b"q"))))),
    ]
    return frames


@pytest.mark.parametrize("after", [b"", b"\xff" * 80, bytes(eth() / udp4())],
                         ids=["end", "ff", "packet"])
def test_every_truncation_in_place_is_decoded_as_alone(after: bytes) -> None:
    """Reading past a packet's end must fail as it does when the packet stands alone,
    whatever follows it in the buffer (``CaptureReader.deliver`` hands packets in place)."""
    frames = [(ltype, data[:n]) for ltype, data in _frames_to_cut()
              for n in range(len(data) + 1)]
    assert _in_place(frames, after) == _alone(frames)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(LINK_CASES) + 5)), st.integers(0, 80),
                          st.binary(min_size=1, max_size=8), st.integers(0, 120)),
                max_size=12),
       st.binary(min_size=0, max_size=64))
def test_mutated_packets_in_place_are_decoded_as_alone(
        edits: list[tuple[int, int, bytes, int]], after: bytes) -> None:
    bases = _frames_to_cut()
    frames = []
    for which, at, patch, cut in edits:
        ltype, data = bases[which]
        base = bytearray(data)
        base[at:at + len(patch)] = patch
        frames.append((ltype, bytes(base[:cut])))
    assert _in_place(frames, after) == _alone(frames)
