"""The per-packet scan: link, IP and transport headers at fixed offsets, and the flow table.

This is the hot path. It decodes only what the flow layer needs with plain byte
indexing into int locals, keeps one dict entry per flow direction (a 12- or 36-byte
key of addresses and ports), and hands UDP port-53 payloads and TCP segments on.
Everything else about a packet is ignored.

Packets too short or malformed to decode (and link types not handled here) are
counted in ``undecoded``; they never raise. Exceptions from the decider, an analyzer
or a callback are not caught: those are bugs, not bad packets.

A connection whose 4-tuple is taken by a new SYN (another ISN) is finished with
``close: reused`` unless it had already ended with FIN or RST; idle connections are
finished by :meth:`FlowTable.sweep`.
"""

from __future__ import annotations

import heapq
import socket
import zlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol

from netdiag.capture.reader import CaptureReader, PacketSink
from netdiag.flows.defrag import Defragmenter
from netdiag.flows.dns_shape import looks_like_dns
from netdiag.flows.stream import StreamAnalyzer
from netdiag.flows.tcp import ACK, SYN, TcpFlow
from netdiag.limits import LIMIT_CONNECTIONS, Limits
from netdiag.records import Connection, Warning_, endpoint

if TYPE_CHECKING:  # annotations only: at run time an i64 is an int
    from mypy_extensions import i64

SWEEP_EVERY = 1 << 15
"""Packets between two sweeps of idle flows."""
IDLE_TIMEOUT_NS = 300 * 1_000_000_000
"""An open connection with no packet for this long is finished (``close: idle``)."""
CLOSED_LINGER_NS = 5 * 1_000_000_000
"""A connection that ended with FIN or RST stays in the table this long for late ACKs."""
WELL_KNOWN_SERVER_PORTS = frozenset({
    22, 25, 53, 80, 110, 143, 443, 465, 587, 853, 993, 995, 1080, 3128, 3306, 5432,
    6379, 8000, 8008, 8080, 8443, 8888, 9000, 9090, 9200, 9443, 11211, 27017,
})
"""Ports taken as the server side when a connection's SYN was not captured."""
MAX_DNS_SERVERS = 4096
"""End points found to serve DNS on other ports (:mod:`netdiag.flows.dns_shape`) kept;
beyond, a new one is parsed packet by packet (each payload must pass on its own)."""
NOT_DNS_PORTS = frozenset({137, 138})
"""UDP ports whose traffic looks like DNS but is not (NetBIOS name and datagram)."""

QUIC_PORTS = frozenset({443, 4433, 8443})
"""UDP ports read as QUIC (a packet with the QUIC fixed bit); on other ports only a long
header of a known version is."""
QUIC_VERSIONS = frozenset({0x00000001, 0x6B3343CF, 0xFF00001D})
"""QUIC versions recognised in a long header on any port (v1, v2, draft-29)."""
MAX_QUIC_SERVERS = 4096
"""QUIC server end points on other ports remembered; beyond, only long headers route."""
UDP_SESSION_IDLE_NS = 120 * 1_000_000_000
"""A UDP session (QUIC connection) with no packet for this long is finished (``idle``)."""


UdpHandler = Callable[[int, str, str, bytes, int], None]


class UdpSession(Protocol):
    """A connection over UDP (QUIC) that the table numbers and finishes with the TCP ones."""

    conn: Connection

    def finish(self, ts: int, reason: str) -> None:
        """The connection ends (``reason``: ``idle``, ``open`` at the end of input)."""


def _created_order(conn: Connection) -> int:
    """Creation order of a connection: its number (``C12``, or ``#packet`` in a shard)."""
    return int(conn.id[1:])


Decider = Callable[[TcpFlow, bytes], "StreamAnalyzer | None"]
ConnectionSink = Callable[[TcpFlow], None]


def _ntop(addr: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(addr) == 4 else socket.AF_INET6, addr)


def _last_ns(flow: TcpFlow) -> int:
    return flow.conn.last_ns


_HASH_MOD: Final = (1 << 31) - 1
_HASH_MUL: Final = 1_000_003


def flow_hash(buf: bytes, at: int, alen: int, l4: int) -> int:
    """A hash of a flow's two end points, whose addresses (``alen`` bytes each) are at
    ``buf[at]`` and ports at ``buf[l4]``: the same in both directions and in every
    process (unlike ``hash()`` of bytes, salted per process), made without an object
    per packet. The lower end point (address bytes, then port) is hashed first, as
    16-bit words of a polynomial modulo a prime.

    The arithmetic is in ``i64`` (no value exceeds 2**51): compiled, mypyc's tagged
    ints take the slow, object-making path for most of these products."""
    other = at + alen
    # each byte read into an i64 before it is shifted: compiled, a shift of a plain int
    # is a call
    s0: i64 = buf[l4]
    s1: i64 = buf[l4 + 1]
    d0: i64 = buf[l4 + 2]
    d1: i64 = buf[l4 + 3]
    sport: i64 = (s0 << 8) | s1
    dport: i64 = (d0 << 8) | d1
    if alen == 4:
        x0: i64 = buf[at]
        x1: i64 = buf[at + 1]
        x2: i64 = buf[at + 2]
        x3: i64 = buf[at + 3]
        y0: i64 = buf[other]
        y1: i64 = buf[other + 1]
        y2: i64 = buf[other + 2]
        y3: i64 = buf[other + 3]
        a: i64 = (x0 << 24) | (x1 << 16) | (x2 << 8) | x3
        b: i64 = (y0 << 24) | (y1 << 16) | (y2 << 8) | y3
        if a > b or (a == b and sport > dport):
            a, b, sport, dport = b, a, dport, sport
        h: i64 = ((a >> 16) * _HASH_MUL + (a & 0xFFFF)) % _HASH_MOD
        h = (h * _HASH_MUL + sport) % _HASH_MOD
        h = (h * _HASH_MUL + (b >> 16)) % _HASH_MOD
        h = (h * _HASH_MUL + (b & 0xFFFF)) % _HASH_MOD
        return int((h * _HASH_MUL + dport) % _HASH_MOD)
    first_lower = sport <= dport
    for i in range(alen):
        x = buf[at + i]
        y = buf[other + i]
        if x != y:
            first_lower = x < y
            break
    if first_lower:
        return int(_mix(_mix(0, buf, at, alen, sport), buf, other, alen, dport))
    return int(_mix(_mix(0, buf, other, alen, dport), buf, at, alen, sport))


def _mix(h: i64, buf: bytes, at: int, alen: int, port: i64) -> i64:
    for i in range(at, at + alen, 2):
        hi: i64 = buf[i]
        lo: i64 = buf[i + 1]
        h = (h * _HASH_MUL + ((hi << 8) | lo)) % _HASH_MOD
    return (h * _HASH_MUL + port) % _HASH_MOD


def shard_of(key: bytes, shards: int) -> int:
    """The shard (0 to ``shards`` - 1) of a TCP or UDP flow from either direction's key
    (addresses, then ports: 12 or 36 bytes), as the scan picks it (:func:`flow_hash`)."""
    alen = (len(key) - 4) // 2
    return flow_hash(key, 0, alen, 2 * alen) % shards


class FlowTable(PacketSink):
    """Scans packets and maintains the TCP flow table."""

    def __init__(self, decide: Decider, on_connection: ConnectionSink,
                 on_dns_udp: UdpHandler, dns_ports: frozenset[int] = frozenset({53}),
                 shard: tuple[int, int] | None = None, limits: Limits | None = None,
                 dns_heuristic: bool = True) -> None:
        self.decide = decide
        self.dns_heuristic = dns_heuristic
        """Parse UDP on other ports as DNS where it looks like DNS (unicast only)."""
        self.dns_servers: set[bytes] = set()
        """End points (address and port bytes) found by the heuristic to serve DNS."""
        self.limits = limits if limits is not None else Limits()
        """Caps over all connections (``max_connections``, held bytes) and their hits."""
        self.open = 0
        """Connections in the table now."""
        self.on_connection = on_connection
        self.on_dns_udp = on_dns_udp
        self.dns_ports = dns_ports
        self.flows: dict[bytes, tuple[TcpFlow, int]] = {}
        self.defrag = Defragmenter()
        self.connections = 0
        self.packets = 0
        """Packets scanned (all files)."""
        self.undecoded = 0
        """Packets that were not IP/TCP/UDP or too short to decode."""
        self.link_unknown: set[int] = set()
        self.warnings: list[Warning_] = []
        self.now_ns = 0
        self.first_ns: int | None = None
        """Earliest packet time scanned."""
        self.last_ns: int | None = None
        """Latest packet time scanned."""
        self.sweep_hooks: list[Callable[[int], None]] = []
        """Called with the current capture time at every sweep (DNS expiry, ...)."""
        self._next_sweep = SWEEP_EVERY
        """Value of ``packets`` at which the next sweep runs (kept across ``scan`` calls)."""
        self._pkt = 0
        """Number of the last packet scanned (from ``first_number`` of the scan)."""
        self._first = 0
        self._last = 0
        """Earliest and latest packet time during a scan (``first_ns`` and ``last_ns``
        are set from them when it ends)."""
        self.shard = shard
        """``(k, n)``: keep only the TCP and UDP DNS flows whose :func:`shard_of` is k (one
        of n processes reading the same input, see ``netdiag.shard``); None keeps all.
        Everything before the flow key (link, IP, fragments, ``undecoded``, sweeps) is the
        same in every shard."""
        self.current = 0
        """Number of the packet being handled (set when sharded: at sweeps and for the
        packets this shard keeps)."""
        self.in_sweep = False
        """True while :meth:`sweep` runs."""
        self.finishing: TcpFlow | UdpSession | None = None
        """The connection :meth:`_finish` is finishing (or finished last)."""
        self.on_quic: UdpHandler | None = None
        """Where QUIC datagrams go (``ts, src, dst, payload, packet``); None: dropped."""
        self.quic_servers: set[bytes] = set()
        """QUIC server end points (address and port bytes) found on ports other than
        :data:`QUIC_PORTS`, from the client's Initial (the same in every shard)."""
        self.sessions: dict[str, UdpSession] = {}
        """Open UDP sessions (QUIC connections), by connection id, in creation order."""
        self.on_session: Callable[[UdpSession], None] | None = None
        """Called with each finished UDP session."""

    # -- scanning ---------------------------------------------------------------------
    def scan(self, packets: Iterable[tuple[int, int, bytes, int]], first_number: int = 1) -> None:
        """Feed ``(ts_ns, linktype, data, wire_len)`` tuples, numbered from ``first_number``."""
        self._begin(first_number)
        packet = self.packet
        for ts, ltype, data, wire in packets:
            packet(ts, ltype, data, 0, len(data), wire)
        self._end(first_number)

    def scan_reader(self, reader: CaptureReader) -> None:
        """Feed every packet of ``reader`` in place (:meth:`CaptureReader.deliver`: no
        object per packet), numbered from 1."""
        self._begin(1)
        while reader.deliver(self):
            pass
        self._end(1)

    def _begin(self, first_number: int) -> None:
        self._pkt = first_number - 1
        # beyond any timestamp a capture can hold (if_tsoffset reaches 2**63 s)
        self._first = self.first_ns if self.first_ns is not None else 1 << 126
        self._last = self.last_ns if self.last_ns is not None else -(1 << 126)

    def _end(self, first_number: int) -> None:
        if self._pkt >= first_number:
            self.first_ns, self.last_ns = self._first, self._last
            self.now_ns = max(self.now_ns, self._last)

    def packet(self, ts: int, lt: int, buf: bytes, start: int, stop: int, wire: int) -> bool:
        """One packet, ``buf[start:stop]`` (see :meth:`scan`)."""
        pkt = self._pkt = self._pkt + 1
        if ts > self._last:
            self._last = ts
        if ts < self._first:
            self._first = ts
        npackets = self.packets = self.packets + 1
        if npackets >= self._next_sweep:
            self._next_sweep = npackets + SWEEP_EVERY
            self.current = pkt
            self.sweep(ts)
        try:
            # buf holds other packets beyond stop: every read past it must fail as
            # reading past the end of the packet itself would
            if lt == 1:
                if start + 14 > stop:
                    raise IndexError
                et = (buf[start + 12] << 8) | buf[start + 13]
                off = start + 14
            elif lt == 113:  # LINUX_SLL
                if start + 16 > stop:
                    raise IndexError
                et = (buf[start + 14] << 8) | buf[start + 15]
                off = start + 16
            elif lt == 276:  # LINUX_SLL2
                if start + 2 > stop:
                    raise IndexError
                et = (buf[start] << 8) | buf[start + 1]
                off = start + 20
            elif lt == 0 or lt == 108:  # NULL (host byte order), LOOP (network)
                head = buf[start:min(start + 4, stop)]
                fam = int.from_bytes(head, "big")
                if fam > 0xFFFF:
                    fam = int.from_bytes(head, "little")
                et = 0x0800 if fam == 2 else 0x86DD if fam in (10, 23, 24, 28, 30) else 0
                off = start + 4
            elif lt == 101:  # RAW
                if start >= stop:
                    raise IndexError
                v = buf[start] >> 4
                et = 0x0800 if v == 4 else 0x86DD if v == 6 else 0
                off = start
            elif lt == 228:  # IPV4
                et, off = 0x0800, start
            elif lt == 229:  # IPV6
                et, off = 0x86DD, start
            else:
                self.link_unknown.add(lt)
                self.undecoded += 1
                return False
            # VLAN tags (802.1Q, 802.1ad, the older QinQ): after an Ethernet header, or
            # put back after a cooked one by the capture; the other link types never
            # give these types
            while et == 0x8100 or et == 0x88A8 or et == 0x9100:
                if off + 4 > stop:
                    raise IndexError
                et = (buf[off + 2] << 8) | buf[off + 3]
                off += 4
            if off >= stop and (et == 0x0800 or et == 0x86DD):
                raise IndexError
            if et == 0x0800:
                vihl = buf[off]
                if off + 20 > stop:
                    raise IndexError
                tot = (buf[off + 2] << 8) | buf[off + 3]
                end = off + tot if tot else stop  # 0: TSO, take the frame
                if end > stop:
                    end = stop
                l4 = off + ((vihl & 15) << 2)
                if not 0x45 <= vihl <= 0x4F or l4 > end:  # not v4, ihl < 5, or cut
                    self.undecoded += 1
                    return False
                proto = buf[off + 9]
                ttl = buf[off + 8]
                frag = (buf[off + 6] << 8) | buf[off + 7]
                at = off + 12
                if frag & 0x3FFF:
                    whole = self.defrag.add(
                        ts, buf[off + 12:off + 16], buf[off + 16:off + 20],
                        (buf[off + 4] << 8) | buf[off + 5], proto,
                        (frag & 0x1FFF) << 3, bool(frag & 0x2000), buf[l4:end])
                    if whole is None:
                        return False
                    buf = buf[off + 12:off + 20] + whole
                    at, l4, end = 0, 8, 8 + len(whole)
                alen = 4
            elif et == 0x86DD:
                if buf[off] >> 4 != 6:
                    self.undecoded += 1
                    return False
                if off + 8 > stop:
                    raise IndexError
                plen = (buf[off + 4] << 8) | buf[off + 5]
                end = off + 40 + plen if plen else stop
                if end > stop:
                    end = stop
                proto = buf[off + 6]
                ttl = buf[off + 7]
                l4 = off + 40
                at = off + 8
                alen = 16
                # extension headers: hop-by-hop, routing, destination options, the
                # fragment header, AH
                while proto in (0, 43, 60, 44, 51):
                    if l4 + (4 if proto == 44 else 2) > stop:
                        raise IndexError
                    nproto = buf[l4]
                    if proto == 44:
                        fo = (buf[l4 + 2] << 8) | buf[l4 + 3]
                        if fo & 0xFFF9 == 0:  # atomic fragment: offset 0, no MF
                            proto = nproto
                            l4 += 8
                            continue
                        ident = buf[l4 + 4:min(l4 + 8, stop)]
                        whole = self.defrag.add(ts, buf[at:at + 16], buf[at + 16:at + 32],
                                                int.from_bytes(ident, "big"),
                                                nproto, fo & 0xFFF8, bool(fo & 1),
                                                buf[l4 + 8:end])
                        if whole is None:
                            break
                        # the fragmentable part may start with more extension headers
                        buf = buf[at:at + 32] + whole
                        at, l4, end, proto = 0, 32, 32 + len(whole), nproto
                        continue
                    hl = (buf[l4 + 1] + 2) << 2 if proto == 51 else (buf[l4 + 1] + 1) << 3
                    proto = nproto
                    l4 += hl
                if proto == 44:  # fragment held until its datagram completes
                    return False
            else:
                self.undecoded += 1
                return False
        except IndexError:
            self.undecoded += 1
            return False
        # Outside the try: the headers below are bounds-checked, and an IndexError from
        # the flow or an analyzer is a bug to see, not a packet to count as undecoded.
        if proto == 6:
            if l4 + 20 > end or buf[l4 + 12] < 0x50:  # cut short, or data offset < 5
                self.undecoded += 1
                return False
            shard = self.shard
            if shard is not None:
                if flow_hash(buf, at, alen, l4) % shard[1] != shard[0]:
                    return False  # another shard's flow
                self.current = pkt
            flags = buf[l4 + 13]
            # the addresses and ports are one run of bytes when no option or extension
            # header lies between them: one slice
            key = (buf[at:l4 + 4] if l4 == at + 2 * alen
                   else buf[at:at + 2 * alen] + buf[l4:l4 + 4])
            entry = self.flows.get(key)
            seq = ((buf[l4 + 4] << 24) | (buf[l4 + 5] << 16) | (buf[l4 + 6] << 8)
                   | buf[l4 + 7])
            if entry is None or (flags & SYN and not flags & ACK
                                 and self._new_syn(entry, seq)):
                entry = self._new_flow(ts, buf, buf[at:at + 2 * alen], alen, l4, flags, key,
                                       entry)
                if entry[1] == 1:
                    entry[0].conn.server_ttl = ttl
            elif flags & SYN and entry[1] == 1:
                entry[0].conn.server_ttl = ttl  # the SYN-ACK: the server's own TTL
            begin = l4 + ((buf[l4 + 12] >> 4) << 2)
            entry[0].packet(entry[1], ts, flags, seq, buf[begin:end] if end > begin else b"",
                            pkt)
        elif proto == 17:
            self._udp(ts, buf, at, alen, l4, end, pkt)
        return False

    def _udp(self, ts: int, data: bytes, at: int, alen: int, l4: int, end: int,
             pkt: int) -> None:
        """A UDP datagram (its addresses at ``data[at]``): QUIC, DNS, or dropped."""
        if l4 + 8 > end:
            self.undecoded += 1
            return
        addr = data[at:at + 2 * alen]
        sport = (data[l4] << 8) | data[l4 + 1]
        dport = (data[l4 + 2] << 8) | data[l4 + 3]
        ports = self.dns_ports
        if (self.on_quic is not None and sport not in ports and dport not in ports
                and self._quic(data, addr, alen, l4, end, sport, dport, ts, pkt)):
            return
        if sport in ports or dport in ports or (
                self.dns_heuristic and self._dns_elsewhere(data, addr, alen, l4, end,
                                                           sport, dport)):
            shard = self.shard
            if shard is not None:
                if flow_hash(data, at, alen, l4) % shard[1] != shard[0]:
                    return
                self.current = pkt
            src = endpoint(_ntop(addr[:alen]), sport)
            dst = endpoint(_ntop(addr[alen:]), dport)
            self.on_dns_udp(ts, src, dst, bytes(data[l4 + 8:end]), pkt)

    def _quic(self, data: bytes, addr: bytes, alen: int, l4: int, end: int, sport: int,
              dport: int, ts: int, pkt: int) -> bool:
        """Route a QUIC datagram to ``on_quic``; False when it is not QUIC.

        On :data:`QUIC_PORTS` a payload with the fixed bit (or a Version Negotiation
        long header) is QUIC; elsewhere only a long header of a known version. Sharded,
        the server end point (its address and port) picks the shard, so that a client
        that migrates to another address or port stays in the shard of its connection.
        """
        p = l4 + 8
        if p >= end:
            return False
        first = data[p]
        long = bool(first & 0x80)
        src_ep = addr[:alen] + data[l4:l4 + 2]
        dst_ep = addr[alen:] + data[l4 + 2:l4 + 4]
        servers = self.quic_servers
        src_known = bool(servers) and src_ep in servers
        dst_known = bool(servers) and dst_ep in servers
        if sport in QUIC_PORTS or dport in QUIC_PORTS or src_known or dst_known:
            if not first & 0x40 and not (long and end - p >= 7
                                         and data[p + 1:p + 5] == b"\0\0\0\0"):
                return False
        else:
            if not long or end - p < 7:
                return False
            version = int.from_bytes(data[p + 1:p + 5], "big")
            if version not in QUIC_VERSIONS:
                return False
            # an Initial between two unknown end points comes from the client
            initial_bits = 0x10 if version == 0x6B3343CF else 0x00
            if first & 0x30 == initial_bits and len(servers) < MAX_QUIC_SERVERS:
                servers.add(dst_ep)
                dst_known = True
        handler = self.on_quic
        if handler is None:
            return False
        shard = self.shard
        if shard is not None:
            if src_known or dst_known:
                src_server = src_known
            else:
                src_server = (sport in QUIC_PORTS and dport not in QUIC_PORTS) or (
                    (sport in QUIC_PORTS) == (dport in QUIC_PORTS) and sport < dport)
            if zlib.crc32(src_ep if src_server else dst_ep) % shard[1] != shard[0]:
                return True
            self.current = pkt
        src = endpoint(_ntop(addr[:alen]), sport)
        dst = endpoint(_ntop(addr[alen:]), dport)
        handler(ts, src, dst, bytes(data[p:end]), pkt)
        return True

    def new_session(self, session: UdpSession) -> str:
        """Number a new UDP session with the TCP connections and keep it until finished."""
        self.connections += 1
        cid = f"C{self.connections}" if self.shard is None else f"#{self.current}"
        self.sessions[cid] = session
        return cid

    def _dns_elsewhere(self, data: bytes, addr: bytes, alen: int, l4: int, end: int,
                       sport: int, dport: int) -> bool:
        """True for UDP on ports not given as DNS that is DNS: to or from an end point
        already found serving it, or shaped as DNS (``dns_shape``) and sent to a
        unicast address, which then becomes such an end point."""
        servers = self.dns_servers
        if servers and (addr[:alen] + data[l4:l4 + 2] in servers
                        or addr[alen:] + data[l4 + 2:l4 + 4] in servers):
            return True
        if sport in NOT_DNS_PORTS or dport in NOT_DNS_PORTS or end - l4 < 25:
            return False
        first = addr[alen]
        if (first >= 224 if alen == 4 else first == 0xFF):  # multicast, broadcast
            return False
        payload = data[l4 + 8:end]
        if not looks_like_dns(payload):
            return False
        if len(servers) < MAX_DNS_SERVERS:
            if payload[2] & 0x80:  # a response: its sender serves DNS
                servers.add(addr[:alen] + data[l4:l4 + 2])
            else:
                servers.add(addr[alen:] + data[l4 + 2:l4 + 4])
        return True

    @staticmethod
    def _new_syn(entry: tuple[TcpFlow, int], seq: int) -> bool:
        """A SYN on a known flow is a new connection unless it repeats the client's SYN."""
        flow, d = entry
        return d != 0 or flow.conn.syn_ns is None or flow.client_isn != seq

    def _new_flow(self, ts: int, data: bytes, addr: bytes, alen: int, l4: int, flags: int,
                  key: bytes, old: tuple[TcpFlow, int] | None) -> tuple[TcpFlow, int]:
        """A connection starts with this segment; ``old`` is the one whose 4-tuple it reuses."""
        if old is not None:
            self._finish(old[0], ts, "reused")
        sport = (data[l4] << 8) | data[l4 + 1]
        dport = (data[l4 + 2] << 8) | data[l4 + 3]
        if flags & SYN:
            sender_is_client = not flags & ACK
        elif dport in WELL_KNOWN_SERVER_PORTS and sport not in WELL_KNOWN_SERVER_PORTS:
            sender_is_client = True
        elif sport in WELL_KNOWN_SERVER_PORTS and dport not in WELL_KNOWN_SERVER_PORTS:
            sender_is_client = False
        else:
            sender_is_client = sport >= dport
        src = endpoint(_ntop(addr[:alen]), sport)
        dst = endpoint(_ntop(addr[alen:]), dport)
        self.connections += 1
        client, server = (src, dst) if sender_is_client else (dst, src)
        # sharded: "#<packet number>" until netdiag.shard numbers the connections of all shards
        cid = f"C{self.connections}" if self.shard is None else f"#{self.current}"
        conn = Connection(id=cid, ts_ns=ts, client=client, server=server,
                          last_ns=ts)
        flow = TcpFlow(conn, self.decide, self.limits)
        rkey = addr[alen:] + addr[:alen] + data[l4 + 2:l4 + 4] + data[l4:l4 + 2]
        d = 0 if sender_is_client else 1
        flow.keys = (key, rkey)
        entry = (flow, d)
        self.flows[key] = entry
        if rkey != key:  # a connection to itself (same address and port) has one key
            self.flows[rkey] = (flow, 1 - d)
        self.open += 1
        if self.open > self.limits.max_connections:
            self._evict(ts, flow)
        return entry

    def _evict(self, ts: int, keep: TcpFlow) -> None:
        """Too many connections are open: finish the least recently active eighth of them
        (``close: evicted``), so that this costs O(log n) per new connection."""
        flows = [f for key, (f, _d) in self.flows.items() if key == f.keys[0] and f is not keep]
        flows.sort(key=_last_ns)
        n = max(1, len(flows) // 8)
        self.limits.count(LIMIT_CONNECTIONS, n)
        for flow in flows[:n]:
            self._finish(flow, ts, "evicted")

    # -- expiry -----------------------------------------------------------------------
    def sweep(self, now_ns: int) -> None:
        """Finish connections idle too long, or closed and lingering; expire other state."""
        self.now_ns = now_ns
        self.in_sweep = True
        done: list[TcpFlow] = []
        for key, (flow, _d) in self.flows.items():
            if key != flow.keys[0]:  # visit each flow once, through its first key
                continue
            conn = flow.conn
            idle = now_ns - conn.last_ns
            if idle > IDLE_TIMEOUT_NS or (conn.close != "open" and idle > CLOSED_LINGER_NS):
                done.append(flow)
        ended: list[UdpSession] = []
        for session in self.sessions.values():
            conn = session.conn
            idle = now_ns - conn.last_ns
            if idle > UDP_SESSION_IDLE_NS or (conn.close != "open" and idle > CLOSED_LINGER_NS):
                ended.append(session)
        if ended:
            self._finish_in_order(done, ended, now_ns, "idle")
        else:
            for flow in done:
                self._finish(flow, now_ns, "idle")
        self.defrag.expire(now_ns)
        for hook in self.sweep_hooks:
            hook(now_ns)
        self.in_sweep = False

    def _finish(self, flow: TcpFlow, ts: int, reason: str) -> None:
        self.finishing = flow
        removed = False
        for key in flow.keys:
            entry = self.flows.get(key)
            if entry is not None and entry[0] is flow:
                del self.flows[key]
                removed = True
        if removed:
            self.open -= 1
        flow.finish(ts, reason)
        self.on_connection(flow)

    def _finish_session(self, session: UdpSession, ts: int, reason: str) -> None:
        self.finishing = session
        self.sessions.pop(session.conn.id, None)
        session.finish(ts, reason)
        if self.on_session is not None:
            self.on_session(session)

    def _finish_in_order(self, flows: list[TcpFlow], sessions: list[UdpSession], ts: int,
                         reason: str) -> None:
        """Finish TCP flows and UDP sessions together in creation order (as numbered);
        ``ts`` -1: each at its last packet."""
        tcp = [(_created_order(f.conn), 0, i) for i, f in enumerate(flows)]
        udp = [(_created_order(s.conn), 1, i) for i, s in enumerate(sessions)]
        tcp.sort()
        udp.sort()
        for _n, kind, i in heapq.merge(tcp, udp):
            if kind == 0:
                flow = flows[i]
                self._finish(flow, flow.conn.last_ns if ts < 0 else ts, reason)
            else:
                session = sessions[i]
                self._finish_session(session, session.conn.last_ns if ts < 0 else ts,
                                     reason)

    def finish_all(self) -> None:
        """End of input: finish every connection still in the table."""
        seen: set[int] = set()
        flows: list[TcpFlow] = []
        for flow, _d in list(self.flows.values()):
            if id(flow) in seen:
                continue
            seen.add(id(flow))
            flows.append(flow)
        if self.sessions:
            self._finish_in_order(flows, list(self.sessions.values()), -1, "open")
            return
        for flow in flows:
            self._finish(flow, flow.conn.last_ns, "open")

