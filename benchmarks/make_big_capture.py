#!/usr/bin/env python3
"""Write a large, deterministic, synthetic pcap for benchmarking netdiag against tshark.

The capture is what a busy client host would record (Ethernet, IPv4, microsecond pcap):

* several thousand HTTPS connections, about 400 open at any moment, each with a TCP
  three-way handshake, a TLS handshake (80 % TLS 1.3, 20 % TLS 1.2 with a real X.509
  chain), a few to a hundred request/response rounds of TLS application-data records
  (requests of 100-300 bytes, responses cut into 1400-byte segments), client ACK-only
  packets, delayed ACKs, and a FIN close;
* a few out-of-order segments, spurious server retransmissions (tail-loss probes)
  and client requests lost beyond the capture point and resent after an RTO;
* DNS over UDP (about 5 % of the packets): an A (and sometimes AAAA) lookup before most
  connections plus background queries, a few NXDOMAIN and unanswered ones.

Sequence and acknowledgement numbers are exact, so a reassembler sees in-order data.
IP header checksums are correct, TCP/UDP checksums are zero. Everything comes from one
seeded ``random.Random``: the same arguments give the same bytes.

Speed: headers are packed with one precompiled ``struct.Struct`` per packet from
per-direction templates; connections are generated one at a time and merged by
timestamp through a small heap, so memory stays bounded by the open connections and
one million packets take well under 30 s.

Nothing is sent anywhere: the addresses (10.0.0.0/8) only exist inside the file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import heapq
import json
import math
import random
import struct
import sys
import time
from pathlib import Path

# ---------------------------------------------------------------------------
# Constants and packet templates
# ---------------------------------------------------------------------------

BASE_EPOCH_S = 1_700_000_000  # 2023-11-14 22:13:20 UTC
MSS = 1400
TARGET_CONCURRENCY = 400
DNS_SHARE = 0.05
LOOKAHEAD_US = 2_000_000  # nothing generated later starts more than this before its connection

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

P_OOO_PER_BURST = 0.004  # chance that a multi-segment burst has two segments swapped
P_RETX_PER_SEGMENT = 0.0007  # chance that a server data segment is retransmitted (spuriously)
P_REQ_RETX = 0.002  # chance that a client request is lost after the capture point
P_DNS_UNANSWERED = 0.005
P_TLS12 = 0.20

# eth(14) + 0x45 0x00 | tot_len | ip id | flags/frag ttl proto | ip csum | src dst sport dport |
# seq | ack | data offset | flags | window | tcp csum + urg (zero)
TCP_HDR = struct.Struct("!16sHH4sH12sIIBBH4x")
# same up to the ports, then udp length and udp checksum (zero)
UDP_HDR = struct.Struct("!16sHH4sH12sH2x")
PCAP_GLOBAL = struct.Struct("<IHHiIII")
PCAP_REC = struct.Struct("<IIII")

SYN_OPTS = bytes.fromhex("020405b4" "01" "030307" "01" "01" "0402")  # MSS 1460, WS 7, SACK_PERM
SYNACK_OPTS = bytes.fromhex("020405b4" "01" "030307" "01" "01" "0402")
GATEWAY_MAC = bytes.fromhex("020000000001")

HOSTS = [
    "api.example.com", "www.example.com", "cdn.example.com", "static.example.com",
    "img.example.com", "auth.example.com", "login.example.com", "events.example.com",
    "api.example.net", "www.example.net", "media.example.net", "ws.example.net",
    "metrics.example.org", "telemetry.example.org", "docs.example.org", "www.example.org",
    "graphql.example.com", "search.example.com", "maps.example.com", "fonts.example.net",
    "ads.example.net", "video.example.com", "upload.example.com", "payments.example.com",
    "status.example.org", "git.example.org", "registry.example.org", "mail.example.com",
    "chat.example.com", "push.example.net", "storage.example.net", "s3.eu-west.example.net",
    "api-v2.example.com", "edge-1.cdn.example.net", "edge-2.cdn.example.net",
    "oauth2.example.org", "feeds.example.org", "news.example.com", "shop.example.com",
    "checkout.example.com", "analytics.example.org", "config.example.net",
    "update.example.net", "download.example.net", "lb-eu.example.com", "lb-us.example.com",
    "collector.example.org", "assets.example.com",
]
N_CLIENTS = 200
RESOLVERS = [bytes([10, 53, 0, 53]), bytes([10, 53, 0, 54])]

CIPHERS_MODERN = [0x1301, 0x1302, 0x1303, 0xC02B, 0xC02F, 0xC02C, 0xC030, 0xCCA9, 0xCCA8,
                  0xC013, 0xC014, 0x009C, 0x009D, 0x002F, 0x0035]
CIPHERS_LEGACY = [0xC02B, 0xC02F, 0xC02C, 0xC030, 0xC013, 0xC014, 0x009C, 0x009D, 0x002F,
                  0x0035, 0x000A, 0x00FF]
SIG_ALGS = [0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601, 0x0807]


def ip_sum_base(src: bytes, dst: bytes, ttl: int, proto: int, frag: int) -> int:
    """Sum of the IPv4 header words that are constant for one direction."""
    s = 0x4500 + frag + ((ttl << 8) | proto)
    s += (src[0] << 8 | src[1]) + (src[2] << 8 | src[3])
    s += (dst[0] << 8 | dst[1]) + (dst[2] << 8 | dst[3])
    return s


class Direction:
    """Header template for one direction of one flow."""

    __slots__ = ("addrports", "base", "mid", "pre")

    def __init__(self, src_mac: bytes, dst_mac: bytes, src: bytes, dst: bytes,
                 sport: int, dport: int, ttl: int, proto: int) -> None:
        frag = 0x4000 if proto == 6 else 0
        self.pre = dst_mac + src_mac + b"\x08\x00\x45\x00"
        self.mid = struct.pack("!HBB", frag, ttl, proto)
        self.addrports = src + dst + struct.pack("!HH", sport, dport)
        self.base = ip_sum_base(src, dst, ttl, proto, frag)


def udp_packet(d: Direction, ipid: int, payload: bytes) -> bytes:
    tot = 28 + len(payload)
    s = d.base + tot + ipid
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    hdr = UDP_HDR.pack(d.pre, tot, ipid, d.mid, ~s & 0xFFFF, d.addrports, 8 + len(payload))
    return hdr + payload


# ---------------------------------------------------------------------------
# TLS message builders
# ---------------------------------------------------------------------------


def u8(n: int) -> bytes:
    return bytes((n,))


def u16(n: int) -> bytes:
    return struct.pack("!H", n)


def u24(n: int) -> bytes:
    return n.to_bytes(3, "big")


def vec8(b: bytes) -> bytes:
    return u8(len(b)) + b


def vec16(b: bytes) -> bytes:
    return u16(len(b)) + b


def ext(etype: int, data: bytes) -> bytes:
    return u16(etype) + vec16(data)


def handshake(htype: int, body: bytes) -> bytes:
    return u8(htype) + u24(len(body)) + body


def record(ctype: int, body: bytes, version: int = 0x0303) -> bytes:
    return struct.pack("!BHH", ctype, version, len(body)) + body


CCS_RECORD = record(20, b"\x01")
ALPN_OFFER = vec16(vec8(b"h2") + vec8(b"http/1.1"))


def client_hello(rng: random.Random, sni: str, offer_tls13: bool) -> bytes:
    """A ClientHello record, Chrome-like when offering TLS 1.3, older otherwise."""
    name = sni.encode()
    exts = [ext(0x0000, vec16(u8(0) + vec16(name)))]
    if offer_tls13:
        exts += [
            ext(0x0017, b""),
            ext(0xFF01, b"\x00"),
            ext(0x000A, vec16(u16(0x001D) + u16(0x0017) + u16(0x0018))),
            ext(0x000B, b"\x01\x00"),
            ext(0x0023, b""),
            ext(0x0010, ALPN_OFFER),
            ext(0x0005, b"\x01\x00\x00\x00\x00"),
            ext(0x000D, vec16(b"".join(u16(a) for a in SIG_ALGS))),
            ext(0x0012, b""),
            ext(0x0033, vec16(u16(0x001D) + vec16(rng.randbytes(32)))),
            ext(0x002D, b"\x01\x01"),
            ext(0x002B, vec8(u16(0x0304) + u16(0x0303))),
        ]
        ciphers = CIPHERS_MODERN
        session_id = rng.randbytes(32)
    else:
        exts += [
            ext(0x000A, vec16(u16(0x001D) + u16(0x0017) + u16(0x0018))),
            ext(0x000B, b"\x01\x00"),
            ext(0x0023, b""),
            ext(0x0010, ALPN_OFFER),
            ext(0x000D, vec16(b"".join(u16(a) for a in SIG_ALGS[:-1]))),
            ext(0x0017, b""),
        ]
        ciphers = CIPHERS_LEGACY
        session_id = b""
    head = (u16(0x0303) + rng.randbytes(32) + vec8(session_id)
            + vec16(b"".join(u16(c) for c in ciphers)) + b"\x01\x00")
    if offer_tls13:
        # Chrome pads the ClientHello to 512 bytes (RFC 7685)
        size = len(head) + 2 + sum(map(len, exts)) + 4
        if size < 512:
            exts.append(ext(0x0015, bytes(max(0, 512 - size - 4))))
    body = head + vec16(b"".join(exts))
    return record(22, handshake(1, body), version=0x0301)


def server_hello_13(rng: random.Random, session_id: bytes) -> bytes:
    exts = ext(0x002B, u16(0x0304)) + ext(0x0033, u16(0x001D) + vec16(rng.randbytes(32)))
    body = (u16(0x0303) + rng.randbytes(32) + vec8(session_id) + u16(0x1301) + b"\x00"
            + vec16(exts))
    return record(22, handshake(2, body))


def server_hello_12(rng: random.Random, alpn: bytes) -> bytes:
    exts = (ext(0xFF01, b"\x00") + ext(0x0017, b"") + ext(0x000B, b"\x01\x00")
            + ext(0x0023, b"") + ext(0x0010, vec16(vec8(alpn))))
    body = (u16(0x0303) + rng.randbytes(32) + vec8(rng.randbytes(32)) + u16(0xC02B) + b"\x00"
            + vec16(exts))
    return handshake(2, body)


class CertStore:
    """A deterministic Ed25519 CA and one leaf certificate per host (DER)."""

    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ed25519
        from cryptography.x509.oid import NameOID

        self._x509, self._ed25519, self._oid = x509, ed25519, NameOID
        self.ca_key = ed25519.Ed25519PrivateKey.from_private_bytes(
            hashlib.sha256(b"netdiag-bench-ca").digest())
        self.ca_name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "netdiag benchmark"),
            x509.NameAttribute(NameOID.COMMON_NAME, "netdiag benchmark CA"),
        ])
        self.not_before = dt.datetime(2023, 1, 1, tzinfo=dt.UTC)
        self.not_after = dt.datetime(2033, 1, 1, tzinfo=dt.UTC)
        ca = (x509.CertificateBuilder()
              .subject_name(self.ca_name).issuer_name(self.ca_name)
              .public_key(self.ca_key.public_key()).serial_number(1)
              .not_valid_before(self.not_before).not_valid_after(self.not_after)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .sign(self.ca_key, None))
        from cryptography.hazmat.primitives.serialization import Encoding

        self._der = Encoding.DER
        self.ca_der = ca.public_bytes(Encoding.DER)
        self._chains: dict[str, bytes] = {}

    def chain(self, host: str) -> bytes:
        """The TLS 1.2 Certificate message body's certificate_list for ``host``."""
        if host not in self._chains:
            x509, oid = self._x509, self._oid
            digest = hashlib.sha256(host.encode()).digest()
            key = self._ed25519.Ed25519PrivateKey.from_private_bytes(digest)
            leaf = (x509.CertificateBuilder()
                    .subject_name(x509.Name([x509.NameAttribute(oid.COMMON_NAME, host)]))
                    .issuer_name(self.ca_name).public_key(key.public_key())
                    .serial_number(int.from_bytes(digest[:8], "big") | 1)
                    .not_valid_before(self.not_before).not_valid_after(self.not_after)
                    .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]),
                                   critical=False)
                    .sign(self.ca_key, None))
            certs = [leaf.public_bytes(self._der), self.ca_der]
            self._chains[host] = u24(sum(len(c) + 3 for c in certs)) + b"".join(
                u24(len(c)) + c for c in certs)
        return self._chains[host]


# ---------------------------------------------------------------------------
# DNS templates (dnspython builds them once; packets only patch the id)
# ---------------------------------------------------------------------------


def build_dns_templates(host_ips: dict[str, str], rng: random.Random):
    """Return a list of (query_wire, response_wire) with id bytes zeroed; plus by-host A/AAAA."""
    import dns.flags
    import dns.message
    import dns.rcode
    import dns.rrset

    def pair(name: str, rdtype: str, answers: list[tuple[str, str, str]], rcode=0,
             authority: bool = False):
        q = dns.message.make_query(name, rdtype, use_edns=0, payload=1232)
        q.id = 0
        r = dns.message.make_response(q)
        r.flags |= dns.flags.RA
        r.set_rcode(rcode)
        for owner, rt, text in answers:
            r.answer.append(dns.rrset.from_text(owner, rng.choice([60, 300, 3600]), "IN", rt,
                                                text))
        if authority:
            zone = ".".join(name.split(".")[-2:]) + "."
            r.authority.append(dns.rrset.from_text(
                zone, 900, "IN", "SOA",
                f"ns1.{zone} hostmaster.{zone} 2024010101 7200 3600 1209600 900"))
        return q.to_wire(), r.to_wire()

    by_host: dict[str, tuple] = {}
    background: list[tuple[bytes, bytes]] = []
    for host, ip in host_ips.items():
        fq = host + "."
        if rng.random() < 0.3:
            target = f"{host.split('.')[0]}.edge.example.net."
            a = pair(host, "A", [(fq, "CNAME", target), (target, "A", ip)])
        else:
            a = pair(host, "A", [(fq, "A", ip)])
        if rng.random() < 0.5:
            v6 = "fd00:200::" + format(int.from_bytes(bytes(map(int, ip.split("."))), "big")
                                       & 0xFFFF, "x")
            aaaa = pair(host, "AAAA", [(fq, "AAAA", v6)])
        else:
            aaaa = pair(host, "AAAA", [], authority=True)
        by_host[host] = (a, aaaa)
        background += [a, aaaa]
    for i in range(300):
        org = rng.choice(["example.com", "example.net", "example.org"])
        name = f"{rng.choice(['tracker', 'beacon', 'svc', 'host', 'node', 'api'])}{i}.{org}"
        roll = rng.random()
        if roll < 0.1:
            background.append(pair(name, "A", [], rcode=dns.rcode.NXDOMAIN, authority=True))
        elif roll < 0.25:
            background.append(pair(name, "AAAA", [], authority=True))
        elif roll < 0.35:
            svcb = '1 . alpn="h2,http/1.1"'
            background.append(pair(name, "HTTPS", [(name + ".", "HTTPS", svcb)]))
        else:
            n = rng.choice([1, 1, 2, 4])
            background.append(pair(name, "A", [
                (name + ".", "A", f"10.{rng.randint(100, 199)}.{rng.randint(0, 255)}."
                                  f"{rng.randint(1, 254)}") for _ in range(n)]))
    return by_host, background


# ---------------------------------------------------------------------------
# One TCP connection
# ---------------------------------------------------------------------------


class Conn:
    """Builds the packets of one TCP connection (client side 0, server side 1).

    Packets are appended to ``self.pkts`` as (timestamp_us, frame bytes); the list is
    sorted by time at the end (stable, so generation order breaks ties).
    """

    def __init__(self, g: Generator, t0: int, client: int, host: str) -> None:
        rng = g.rng
        self.g = g
        self.rng = rng
        self.pool = g.pool
        self.pkts: list[tuple[int, bytes]] = []
        c_ip, c_mac = g.client_ips[client], g.client_macs[client]
        s_ip = g.host_ip_bytes[host]
        port = g.next_port(client)
        self.dirs = (
            Direction(c_mac, GATEWAY_MAC, c_ip, s_ip, port, 443, 64, 6),
            Direction(GATEWAY_MAC, c_mac, s_ip, c_ip, 443, port, g.host_ttl[host], 6),
        )
        self.ipid = [rng.getrandbits(16), rng.getrandbits(16)]
        self.snd = [rng.getrandbits(32), rng.getrandbits(32)]
        self.rcv = [0, 0]  # next byte expected by this side from the other one
        self.win = [rng.choice([501, 1024, 2048]), rng.choice([83, 235, 501])]
        self.last = [t0, t0]  # last send time per side (keeps each side's stream in time order)
        self.rtt = int(min(300_000, max(800, rng.lognormvariate(math.log(25_000), 0.8))))
        self.gap = rng.choice([12, 23, 45, 112])  # µs per full segment: 1 Gbit/s .. 100 Mbit/s
        self.host = host
        self.horizon = t0  # latest packet time, retransmissions included
        self.retx = 0
        self.ooo = 0

    # -- packet primitives --------------------------------------------------

    def raw(self, side: int, t: int, flags: int, seq: int, payload: bytes = b"",
            opts: bytes = b"", window: int | None = None) -> None:
        d = self.dirs[side]
        tot = 40 + len(opts) + len(payload)
        ipid = self.ipid[side]
        self.ipid[side] = (ipid + 1) & 0xFFFF
        s = d.base + tot + ipid
        s = (s & 0xFFFF) + (s >> 16)
        s = (s & 0xFFFF) + (s >> 16)
        ack = self.rcv[side] & 0xFFFFFFFF if flags & ACK else 0
        hdr = TCP_HDR.pack(d.pre, tot, ipid, d.mid, ~s & 0xFFFF, d.addrports,
                           seq & 0xFFFFFFFF, ack, (5 + len(opts) // 4) << 4, flags,
                           self.win[side] if window is None else window)
        self.pkts.append((t, hdr + opts + payload if opts else hdr + payload))
        if t > self.last[side]:
            self.last[side] = t

    def send(self, side: int, t: int, payload: bytes, flags: int = PSH | ACK) -> None:
        """New in-order data (or a bare ACK when payload is empty)."""
        seq = self.snd[side]
        self.raw(side, t, flags, seq, payload)
        n = len(payload) + (1 if flags & (SYN | FIN) else 0)
        if n:
            self.snd[side] = seq + n
            self.rcv[1 - side] = seq + n

    def burst(self, side: int, t: int, data: bytes) -> tuple[int, bool]:
        """Send ``data`` cut into MSS segments; the receiver ACKs every second segment.

        Returns the time of the last segment and whether a segment is still unacknowledged.
        """
        rng = self.rng
        other = 1 - side
        t = max(t, self.last[side] + 3)
        n = len(data)
        nseg = (n + MSS - 1) // MSS
        base = self.snd[side]
        order = list(range(nseg))
        if nseg >= 3 and rng.random() < P_OOO_PER_BURST:
            j = rng.randrange(nseg - 1)
            order[j], order[j + 1] = order[j + 1], order[j]
            self.ooo += 1
        expect = 0
        got: set[int] = set()
        gap = self.gap
        unacked = 0
        for idx in order:
            off = idx * MSS
            chunk = data[off:off + MSS]
            flags = PSH | ACK if idx == nseg - 1 else ACK
            self.raw(side, t, flags, base + off, chunk)
            if side == 1 and rng.random() < P_RETX_PER_SEGMENT:
                # a tail-loss probe / RTO that fires although the segment arrived
                keep = self.last[side]
                t_retx = t + 2 * self.rtt + rng.randint(200, 20_000)
                self.raw(side, t_retx, flags, base + off, chunk)
                self.last[side] = keep
                self.horizon = max(self.horizon, t_retx)
                self.retx += 1
            if idx == expect:
                expect += 1
                while expect in got:
                    got.discard(expect)
                    expect += 1
            else:
                got.add(idx)
            self.rcv[other] = base + min(expect * MSS, n)
            unacked += 1
            if unacked >= 2 and not got:
                self.send(other, t + rng.randint(15, 60), b"", ACK)
                unacked = 0
            t += len(chunk) * gap // MSS + rng.randint(0, 4)
        self.snd[side] = base + n
        self.rcv[other] = base + n
        return t, unacked > 0

    def pool_bytes(self, n: int) -> bytes:
        o = self.rng.randrange(len(self.pool) - n)
        return self.pool[o:o + n]

    def app_record(self, length: int) -> bytes:
        return record(23, self.pool_bytes(length))

    # -- the connection's story ---------------------------------------------

    def build(self) -> tuple[str, int]:
        rng = self.rng
        g = self.g
        rtt = self.rtt
        t = self.last[0]
        tls13 = rng.random() >= P_TLS12
        offer13 = tls13 or rng.random() < 0.5
        # TCP three-way handshake
        self.raw(0, t, SYN, self.snd[0], opts=SYN_OPTS, window=64240)
        self.snd[0] += 1
        self.rcv[1] = self.snd[0]
        t += rtt
        self.raw(1, t, SYN | ACK, self.snd[1], opts=SYNACK_OPTS, window=65160)
        self.snd[1] += 1
        self.rcv[0] = self.snd[1]
        t += rng.randint(20, 80)
        self.send(0, t, b"", ACK)
        t += rng.randint(50, 400)
        ch = client_hello(rng, self.host, offer13)
        self.send(0, t, ch)
        t += rtt + rng.randint(200, 4000)
        if tls13:
            sid = ch[5 + 4 + 2 + 32 + 1:5 + 4 + 2 + 32 + 1 + 32]
            flight = [server_hello_13(rng, sid), CCS_RECORD]
            sizes = [rng.randint(30, 120), rng.randint(1800, 4600), rng.choice([97, 281, 537]),
                     53]
            if rng.random() < 0.3:
                flight.append(self.app_record(sum(sizes)))
            else:
                flight += [self.app_record(s) for s in sizes]
            t, _ = self.burst(1, t, b"".join(flight))
            t += rng.randint(300, 2500)
            h2 = rng.random() < 0.8
            client_fin = CCS_RECORD + self.app_record(53)
            if h2:
                client_fin += self.app_record(rng.randint(60, 110))  # preface + SETTINGS
            self.send(0, t, client_fin)
            t_post = t + rtt + rng.randint(100, 800)
            t += rng.randint(10, 60)
            # server: two NewSessionTickets (+ SETTINGS) after the client's Finished; sent
            # once the client's first request is generated, which must not ACK them
            post = [self.app_record(rng.randint(200, 280)) for _ in range(2)]
            if h2:
                post.append(self.app_record(rng.randint(40, 70)))
            server_post = (t_post, b"".join(post))
        else:
            alpn = b"h2" if rng.random() < 0.7 else b"http/1.1"
            msgs = [
                server_hello_12(rng, alpn),
                handshake(11, g.certs.chain(self.host)),
                handshake(12, b"\x03" + u16(0x001D) + vec8(rng.randbytes(32)) + u16(0x0807)
                          + vec16(rng.randbytes(64))),
                handshake(14, b""),
            ]
            if rng.random() < 0.5:
                flight = record(22, b"".join(msgs))
            else:
                flight = b"".join(record(22, m) for m in msgs)
            t, _ = self.burst(1, t, flight)
            t += rng.randint(300, 2500)
            cke = record(22, handshake(16, vec8(rng.randbytes(32))))
            self.send(0, t, cke + CCS_RECORD + record(22, self.pool_bytes(40)))
            t += rtt + rng.randint(200, 1500)
            ticket = handshake(4, struct.pack("!I", 7200) + vec16(self.pool_bytes(192)))
            self.burst(1, t, record(22, ticket) + CCS_RECORD + record(22, self.pool_bytes(40)))
            t += rng.randint(10, 80)
            server_post = None
        # request / response rounds
        max_rec = rng.choice([16401, 16401, 4113, 1369])
        n_req = min(150, 1 + int(rng.expovariate(1 / 15)))
        for i in range(n_req):
            if i:
                idle = (rng.randint(500, 20_000) if rng.random() < 0.6
                        else rng.randint(50_000, 1_500_000))
                t = max(t, self.last[0]) + idle
            n_pipe = 1 if rng.random() < 0.85 else rng.randint(2, 4)
            for k in range(n_pipe):
                seq = self.snd[0]
                req = self.app_record(rng.randint(95, 295))
                self.send(0, t, req)
                if k == n_pipe - 1 and server_post is None and rng.random() < P_REQ_RETX:
                    # the request is lost beyond the capture point: RTO, then a real
                    # retransmission; the server only hears the second copy
                    t += max(200_000, 2 * rtt) + rng.randint(0, 20_000)
                    self.raw(0, t, PSH | ACK, seq, req)
                    self.retx += 1
                t += rng.randint(5, 40)
            acked = server_post is not None  # the tickets already ACK the first request
            if acked:
                self.burst(1, *server_post)
                server_post = None
            think = int(min(800_000, max(150, rng.lognormvariate(math.log(8_000), 1.1))))
            if think > 40_000 and not acked:
                self.send(1, t + rtt + 40_000, b"", ACK)  # server's delayed ACK
            resp = []
            for _ in range(n_pipe):
                resp.append(self.app_record(rng.randint(40, 200)))  # HEADERS
                roll = rng.random()
                if roll < 0.45:
                    body = rng.randint(200, 2000)
                elif roll < 0.9:
                    body = rng.randint(2000, 20_000)
                else:
                    body = rng.randint(20_000, 60_000)
                while body > 0:
                    size = min(body + 17 + 9, max_rec)
                    resp.append(self.app_record(size))
                    body -= size - 17 - 9
            t_last, pending = self.burst(1, t + rtt + think, b"".join(resp))
            t = t_last
            if pending and rng.random() < 0.5:
                # the client's delayed ACK fires before its next request
                self.send(0, t + 40_000, b"", ACK)
                t += 40_000
        # close
        t = max(*self.last, self.horizon) + rng.randint(1_000, 3_000_000)
        if rng.random() < 0.7:
            if tls13 or rng.random() < 0.5:
                self.send(0, t, self.app_record(19))  # close_notify alert (encrypted)
                t += rng.randint(5, 30)
            self.send(0, t, b"", FIN | ACK)
            t += rtt
            self.send(1, t, b"", FIN | ACK)
            t += rng.randint(20, 80)
            self.send(0, t, b"", ACK)
        else:
            self.send(1, t, b"", FIN | ACK)
            t += rng.randint(100, 5_000)
            self.send(0, t, b"", FIN | ACK)
            t += rtt
            self.send(1, t, b"", ACK)
        self.pkts.sort(key=lambda p: p[0])
        return ("tls13" if tls13 else "tls12"), t


# ---------------------------------------------------------------------------
# The whole capture
# ---------------------------------------------------------------------------


class Generator:
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.pool = rng.randbytes(1 << 20)
        self.client_ips = [bytes([10, 1, i // 250, i % 250 + 1]) for i in range(N_CLIENTS)]
        self.client_macs = [bytes([2, 0, 10, 1, i // 250, i % 250 + 1]) for i in range(N_CLIENTS)]
        self.ports = [rng.randint(32768, 50000) for _ in range(N_CLIENTS)]
        self.host_ip_bytes = {h: bytes([10, 200, 0, i // 2 + 1]) for i, h in enumerate(HOSTS)}
        self.host_ttl = {h: rng.randint(48, 60) for h in HOSTS}
        self.host_weights = [1.0 / (i + 1) ** 0.8 for i in range(len(HOSTS))]
        self.certs = CertStore()
        host_ips = {h: ".".join(map(str, b)) for h, b in self.host_ip_bytes.items()}
        self.dns_by_host, self.dns_background = build_dns_templates(host_ips, rng)
        self.dns_dirs: dict[tuple[int, int, int], tuple[Direction, Direction]] = {}

    def next_port(self, client: int) -> int:
        p = self.ports[client] + self.rng.randint(1, 3)
        if p > 60999:
            p = 32768 + (p - 61000)
        self.ports[client] = p
        return p

    def dns_pair(self, t: int, client: int, templates: tuple[bytes, bytes],
                 answered: bool = True) -> list[tuple[int, bytes]]:
        rng = self.rng
        resolver = rng.randrange(len(RESOLVERS))
        port = rng.randint(49152, 65535)  # clear of traceroute's 33434-33534
        c_ip, c_mac = self.client_ips[client], self.client_macs[client]
        r_ip = RESOLVERS[resolver]
        q_dir = Direction(c_mac, GATEWAY_MAC, c_ip, r_ip, port, 53, 64, 17)
        r_dir = Direction(GATEWAY_MAC, c_mac, r_ip, c_ip, 53, port, 63, 17)
        qid = u16(rng.getrandbits(16))
        query, response = templates
        out = [(t, udp_packet(q_dir, rng.getrandbits(16), qid + query[2:]))]
        if answered:
            lat = int(min(400_000, max(150, rng.lognormvariate(math.log(2_500), 1.2))))
            out.append((t + lat, udp_packet(r_dir, rng.getrandbits(16), qid + response[2:])))
        return out

    def background_dns(self, t: int) -> list[tuple[int, bytes]]:
        rng = self.rng
        return self.dns_pair(t, rng.randrange(N_CLIENTS), rng.choice(self.dns_background),
                             answered=rng.random() >= P_DNS_UNANSWERED)

    def write(self, path: Path, n_packets: int, nanosecond: bool = False) -> dict:
        rng = self.rng
        heap: list[tuple[int, int, list[tuple[int, bytes]], int]] = []
        order = 0
        stats = {"packets": 0, "tcp_packets": 0, "dns_packets": 0, "connections": 0,
                 "tls13_connections": 0, "tls12_connections": 0, "retransmissions": 0,
                 "out_of_order_bursts": 0}
        spans: list[tuple[int, int]] = []
        generated = 0  # packets pushed into the heap
        dns_debt = 0.0
        start = 1_000_000  # µs after BASE_EPOCH_S
        mean_dur = 6_000_000.0  # running estimate, adapts to what is generated
        done = False
        first_ts = last_ts = None

        def push(pkts: list[tuple[int, bytes]]) -> None:
            nonlocal order, generated
            if pkts:
                heapq.heappush(heap, (pkts[0][0], order, pkts, 0))
                order += 1
                generated += len(pkts)

        def fill_dns(count: int, lo: int, hi: int) -> None:
            while count > 0:
                pair = self.background_dns(rng.randint(lo, hi))
                if count == 1:
                    pair = pair[:1]
                push(pair)
                stats["dns_packets"] += len(pair)
                count -= len(pair)

        ts_scale = 1000 if nanosecond else 1
        magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
        with open(path, "wb") as f:
            f.write(PCAP_GLOBAL.pack(magic, 2, 4, 0, 0, 262144, 1))
            chunk: list[bytes] = []
            written = 0
            while True:
                while not done and (not heap or heap[0][0] >= start - LOOKAHEAD_US):
                    host = rng.choices(HOSTS, self.host_weights)[0]
                    client = rng.randrange(N_CLIENTS)
                    conn = Conn(self, start, client, host)
                    kind, end = conn.build()
                    lookups: list[tuple[int, bytes]] = []
                    if rng.random() < 0.8:
                        a, aaaa = self.dns_by_host[host]
                        lead = rng.randint(3_000, 150_000)
                        lookups = self.dns_pair(start - lead, client, a)
                        if rng.random() < 0.5:
                            lookups += self.dns_pair(start - lead + rng.randint(5, 80), client,
                                                     aaaa)
                    gap = rng.expovariate(TARGET_CONCURRENCY / mean_dur)
                    if generated + len(conn.pkts) + len(lookups) > n_packets:
                        # the budget is nearly spent: finish with DNS
                        fill_dns(n_packets - generated, start, start + 1_000_000)
                        done = True
                        break
                    push(conn.pkts)
                    push(sorted(lookups, key=lambda p: p[0]))
                    dur = end - start
                    spans.append((start, end))
                    mean_dur += (dur - mean_dur) / min(len(spans), 200)
                    stats["connections"] += 1
                    stats[kind + "_connections"] += 1
                    stats["tcp_packets"] += len(conn.pkts)
                    stats["dns_packets"] += len(lookups)
                    stats["retransmissions"] += conn.retx
                    stats["out_of_order_bursts"] += conn.ooo
                    dns_debt += len(conn.pkts) * DNS_SHARE / (1 - DNS_SHARE) - len(lookups)
                    nxt = start + int(gap) + 1
                    if dns_debt >= 2:
                        n = int(dns_debt) // 2 * 2
                        fill_dns(min(n, n_packets - generated), start, nxt + 500_000)
                        dns_debt -= n
                    start = nxt
                    if generated >= n_packets:
                        done = True
                if not heap:
                    break
                ts, o, pkts, i = heap[0]
                pkt = pkts[i][1]
                if i + 1 < len(pkts):
                    heapq.heapreplace(heap, (pkts[i + 1][0], o, pkts, i + 1))
                else:
                    heapq.heappop(heap)
                if first_ts is None:
                    first_ts = ts
                last_ts = ts
                n = len(pkt)
                chunk.append(PCAP_REC.pack(BASE_EPOCH_S + ts // 1_000_000,
                                           ts % 1_000_000 * ts_scale, n, n))
                chunk.append(pkt)
                written += 1
                if len(chunk) >= 16384:
                    f.write(b"".join(chunk))
                    chunk.clear()
            f.write(b"".join(chunk))
        stats["packets"] = written
        stats["duration_s"] = round((last_ts - first_ts) / 1e6, 3) if written else 0.0
        # concurrency from the connection spans: peak and time-weighted median
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        cur = peak = 0
        level_time: dict[int, int] = {}
        prev = events[0][0] if events else 0
        for tev, delta in events:
            level_time[cur] = level_time.get(cur, 0) + tev - prev
            prev = tev
            cur += delta
            peak = max(peak, cur)
        total = sum(level_time.values())
        acc, median = 0, 0
        for level in sorted(level_time):
            acc += level_time[level]
            if acc * 2 >= total:
                median = level
                break
        stats["max_concurrent_connections"] = peak
        stats["median_concurrent_connections"] = median
        return stats


def default_path(packets: int) -> Path:
    return Path(__file__).resolve().parent / "out" / f"capture-{packets}.pcap"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=1_000_000,
                    help="number of packets to write (default 1,000,000)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output pcap (default benchmarks/out/capture-PACKETS.pcap)")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--nanosecond", action="store_true",
                    help="write a nanosecond-resolution pcap (magic a1b23c4d)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.packets < 1:
        ap.error("--packets must be positive")
    if args.out is None:
        args.out = default_path(args.packets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = args.out.with_name(args.out.name + ".part")
    stats = Generator(args.seed).write(tmp, args.packets, args.nanosecond)
    tmp.replace(args.out)
    stats["size_mb"] = round(args.out.stat().st_size / 1e6, 1)
    stats["seconds_to_generate"] = round(time.perf_counter() - t0, 2)
    stats["seed"] = args.seed
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(stats, indent=2) + "\n")
    if not args.quiet:
        print(f"wrote {args.out}", file=sys.stderr)
        for k, v in stats.items():
            print(f"  {k:30} {v}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
