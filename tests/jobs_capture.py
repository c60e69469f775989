"""Deterministic synthetic captures for the ``--jobs`` tests (``tests/test_jobs.py``).

:func:`write_mixed` writes a classic pcap (Ethernet, microseconds) of ``connections``
short TCP connections spread over about 20 minutes, in the shapes where sharding could
go wrong: TLS 1.3 ClientHello/ServerHello with application data (inferred requests),
IPv4 and IPv6, reused 4-tuples (a new SYN on an open connection), connections left
open (finished as idle by the sweeps, or at the end), connections first seen mid-stream,
truncated TLS records (a warning per connection, more than the report keeps), DNS over
UDP (answered, unanswered, retransmitted, duplicated, malformed: more warnings than the
DNS analyzer keeps) and DNS over TCP (responses split over two segments). Everything
comes from one seeded ``random.Random``.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

T0_US = 1_700_000_000 * 1_000_000
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
MAC_C = bytes.fromhex("020000000001")
MAC_S = bytes.fromhex("020000000002")
HOSTS = ["api.example.com", "www.example.net", "cdn.example.org", "a.example", "b.example"]


def _ip4(n: int) -> bytes:
    return bytes((10, (n >> 16) & 255, (n >> 8) & 255, n & 255))


def _ip6(n: int) -> bytes:
    return bytes.fromhex("fd000000000000000000000000000000")[:12] + n.to_bytes(4, "big")


def l4_packet(src: bytes, dst: bytes, proto: int, l4: bytes, ttl: int = 64) -> bytes:
    """Ethernet + IPv4/IPv6 around a transport header and payload (no checksums)."""
    if len(src) == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 0, 0x4000, ttl, proto, 0,
                         src, dst)
        return MAC_S + MAC_C + b"\x08\x00" + ip + l4
    ip6 = struct.pack("!IHBB16s16s", 0x60000000, len(l4), proto, ttl, src, dst)
    return MAC_S + MAC_C + b"\x86\xdd" + ip6 + l4


def tcp(src: bytes, dst: bytes, sport: int, dport: int, seq: int, ack: int, flags: int,
        payload: bytes = b"", ttl: int = 64) -> bytes:
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 0x50,
                      flags, 65535, 0, 0)
    return l4_packet(src, dst, 6, hdr + payload, ttl)


def udp(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    return l4_packet(src, dst, 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
                     + payload)


def _record(ctype: int, body: bytes) -> bytes:
    return struct.pack("!BHH", ctype, 0x0303, len(body)) + body


def client_hello(rnd: bytes, sni: str) -> bytes:
    name = sni.encode()
    exts = (struct.pack("!HHHBH", 0, len(name) + 5, len(name) + 3, 0, len(name)) + name
            + struct.pack("!HHB", 0x002B, 3, 2) + b"\x03\x04"
            + struct.pack("!HHH", 0x0010, 5, 3) + b"\x02h2")
    body = (b"\x03\x03" + rnd + b"\x00" + b"\x00\x04\x13\x01\x13\x02" + b"\x01\x00"
            + struct.pack("!H", len(exts)) + exts)
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return struct.pack("!BHH", 0x16, 0x0301, len(hs)) + hs


def server_hello(rnd: bytes) -> bytes:
    exts = struct.pack("!HHH", 0x002B, 2, 0x0304)
    body = (b"\x03\x03" + rnd + b"\x00" + b"\x13\x01" + b"\x00"
            + struct.pack("!H", len(exts)) + exts)
    hs = b"\x02" + len(body).to_bytes(3, "big") + body
    return _record(0x16, hs) + _record(0x14, b"\x01")


def app_data(n: int) -> bytes:
    return _record(0x17, bytes(n))


def dns_message(msg_id: int, name: str, qtype: int = 1, response: bool = False,
                rcode: int = 0, answers: int = 1) -> bytes:
    flags = (0x8180 | rcode) if response else 0x0100
    q = b"".join(bytes((len(p),)) + p.encode() for p in name.split(".")) + b"\x00"
    q += struct.pack("!HH", qtype, 1)
    an = b""
    if response and rcode == 0:
        for i in range(answers):
            if qtype == 28:
                an += b"\xc0\x0c" + struct.pack("!HHIH", 28, 1, 60, 16) + bytes(15) + bytes((i,))
            else:
                an += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes((192, 0, 2, i))
    return struct.pack("!HHHHHH", msg_id, flags, 1, answers if an else 0, 0, 0) + q + an


class _Capture:
    def __init__(self) -> None:
        self.packets: list[tuple[int, int, bytes]] = []

    def add(self, t_us: int, frame: bytes) -> None:
        self.packets.append((t_us, len(self.packets), frame))

    def write(self, path: Path, keep: int | None = None, of: int = 1) -> None:
        """Write the packets in time order (every ``of``-th from ``keep`` when given)."""
        out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
        for i, (t, _n, frame) in enumerate(sorted(self.packets)):
            if keep is not None and i % of != keep:
                continue
            ts = T0_US + t
            out.append(struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(frame),
                                   len(frame)))
            out.append(frame)
        path.write_bytes(b"".join(out))


def _tls_connection(cap: _Capture, rng: random.Random, t: int, c: bytes, s: bytes,
                    sport: int, *, close: bool, syn: bool = True, warn: bool = False) -> None:
    isn_c, isn_s = rng.getrandbits(32), rng.getrandbits(32)
    rtt = rng.randint(200, 40_000)
    ch = client_hello(rng.randbytes(32), rng.choice(HOSTS))
    cs, ss = isn_c + 1, isn_s + 1
    if syn:
        cap.add(t, tcp(c, s, sport, 443, isn_c, 0, SYN))
        cap.add(t + rtt, tcp(s, c, 443, sport, isn_s, cs, SYN | ACK, ttl=57))
        t += 2 * rtt
    cap.add(t, tcp(c, s, sport, 443, cs, ss, PSH | ACK, ch))
    cs += len(ch)
    sh = server_hello(rng.randbytes(32)) + app_data(rng.randint(50, 2000))
    t += rtt + rng.randint(100, 5000)
    cap.add(t, tcp(s, c, 443, sport, ss, cs, PSH | ACK, sh, ttl=57))
    ss += len(sh)
    for _ in range(rng.randint(1, 3)):
        req = app_data(rng.randint(30, 400))
        t += rng.randint(1000, 50_000)
        cap.add(t, tcp(c, s, sport, 443, cs, ss, PSH | ACK, req))
        cs += len(req)
        resp = app_data(rng.randint(30, 1300))
        if warn:
            resp = resp[:-10]  # the record is cut: the stream ends inside it
        t += rtt + rng.randint(100, 200_000)
        cap.add(t, tcp(s, c, 443, sport, ss, cs, PSH | ACK, resp, ttl=57))
        ss += len(resp)
        if warn:
            break
    if close:
        t += rng.randint(100, 10_000)
        cap.add(t, tcp(c, s, sport, 443, cs, ss, FIN | ACK))
        cap.add(t + rtt, tcp(s, c, 443, sport, ss, cs + 1, FIN | ACK, ttl=57))


def _dns_tcp(cap: _Capture, rng: random.Random, t: int, c: bytes, s: bytes, sport: int,
             name: str) -> None:
    isn_c, isn_s = rng.getrandbits(32), rng.getrandbits(32)
    rtt = rng.randint(200, 5000)
    cap.add(t, tcp(c, s, sport, 53, isn_c, 0, SYN))
    cap.add(t + rtt, tcp(s, c, 53, sport, isn_s, isn_c + 1, SYN | ACK))
    cs, ss = isn_c + 1, isn_s + 1
    t += 2 * rtt
    msg_id = rng.getrandbits(16)
    q = dns_message(msg_id, name)
    q = struct.pack("!H", len(q)) + q
    cap.add(t, tcp(c, s, sport, 53, cs, ss, PSH | ACK, q))
    cs += len(q)
    r = dns_message(msg_id, name, response=True, answers=rng.randint(1, 8))
    r = struct.pack("!H", len(r)) + r
    t += rtt + rng.randint(100, 20_000)
    if rng.random() < 0.5:  # split: the message is timed by its first segment
        cut = rng.randint(1, len(r) - 1)
        cap.add(t, tcp(s, c, 53, sport, ss, cs, PSH | ACK, r[:cut]))
        t += rng.randint(100, 3000)
        cap.add(t, tcp(s, c, 53, sport, ss + cut, cs, PSH | ACK, r[cut:]))
    else:
        cap.add(t, tcp(s, c, 53, sport, ss, cs, PSH | ACK, r))
    ss += len(r)
    if rng.random() < 0.7:
        t += rng.randint(100, 5000)
        cap.add(t, tcp(c, s, sport, 53, cs, ss, FIN | ACK))
        cap.add(t + rtt, tcp(s, c, 53, sport, ss, cs + 1, FIN | ACK))


def _dns_udp(cap: _Capture, rng: random.Random, t: int, c: bytes, s: bytes, sport: int,
             name: str) -> None:
    msg_id = rng.getrandbits(16)
    qtype = 28 if rng.random() < 0.2 else 1
    q = dns_message(msg_id, name, qtype)
    cap.add(t, udp(c, s, sport, 53, q))
    roll = rng.random()
    if roll < 0.05:
        return  # unanswered: expires after 5 s
    if roll < 0.1:
        t += rng.randint(1_000_000, 2_000_000)
        cap.add(t, udp(c, s, sport, 53, q))  # retransmitted
    t += rng.randint(300, 150_000)
    rcode = 3 if rng.random() < 0.05 else 0
    r = dns_message(msg_id, name, qtype, response=True, rcode=rcode, answers=rng.randint(1, 3))
    cap.add(t, udp(s, c, 53, sport, r))
    if rng.random() < 0.03:
        cap.add(t + rng.randint(1, 500), udp(s, c, 53, sport, r))  # duplicate


def build_mixed(connections: int = 10_000, seed: int = 20260601) -> _Capture:
    rng = random.Random(seed)
    cap = _Capture()
    span_us = 1_200_000_000
    servers4 = [_ip4(0x010000 + i) for i in range(40)]
    servers6 = [_ip6(0x010000 + i) for i in range(10)]
    resolvers = [(_ip4(0x350035), False), (_ip6(0x350035), True)]
    open_recent: list[tuple[int, bytes, bytes, int]] = []
    for i in range(connections):
        t = i * span_us // connections + rng.randint(0, 50_000)
        v6 = rng.random() < 0.1
        host = 0x020000 + rng.randint(0, 300)
        client = _ip6(host) if v6 else _ip4(host)
        server = rng.choice(servers6 if v6 else servers4)
        sport = rng.randint(1024, 65535)
        name = f"h{i % 500}.{rng.choice(HOSTS)}"
        if rng.random() < 0.3:
            res = next(r for r, six in resolvers if six == v6)
            _dns_udp(cap, rng, t, client, res, rng.randint(1024, 65535), name)
            t += rng.randint(2000, 200_000)
        roll = rng.random()
        if roll < 0.02:
            res = next(r for r, six in resolvers if six == v6)
            _dns_tcp(cap, rng, t, client, res, sport, name)
            continue
        if roll < 0.05 and open_recent:
            # a new SYN on the 4-tuple of a connection still open: finishes it as reused
            _t, client, server, sport = open_recent.pop()
        close = rng.random() > 0.12
        _tls_connection(cap, rng, t, client, server, sport, close=close,
                        syn=rng.random() > 0.02, warn=rng.random() < 0.03)
        if not close:
            open_recent.append((t, client, server, sport))
            del open_recent[:-20]
    for _ in range(250):  # more malformed DNS messages than the analyzer lists
        t = rng.randint(0, span_us)
        c = _ip4(0x030000 + rng.randint(0, 50))
        cap.add(t, udp(c, resolvers[0][0], rng.randint(1024, 65535), 53, bytes(rng.randint(1, 11))))
    return cap


def write_mixed(path: Path, connections: int = 10_000, seed: int = 20260601,
                split: int | None = None) -> list[Path]:
    """Write the capture to ``path``; with ``split`` = k, as k files of interleaved packets."""
    cap = build_mixed(connections, seed)
    if split is None:
        cap.write(path)
        return [path]
    paths = []
    for k in range(split):
        p = path.with_name(f"{path.stem}.{k}{path.suffix}")
        cap.write(p, keep=k, of=split)
        paths.append(p)
    return paths
