#!/usr/bin/env python3
"""Write deterministic captures of the traffic shapes that once made netdiag super-linear.

Each shape is an Ethernet / IPv4 / microsecond pcap of about ``packets`` packets
(issue 11):

* ``h2``: one cleartext HTTP/2 connection (prior knowledge, ``h2c``) with thousands of
  streams; HPACK-encoded request headers (a unique ``x-request-id`` per stream, added
  to a 64 KiB dynamic table, 1 MiB allowed), a client SETTINGS frame (changing
  INITIAL_WINDOW_SIZE) every few streams, one stream in four never answered, now and
  then a 32 KiB header block of a thousand small fields;
* ``frag``: tens of thousands of first IPv4 fragments whose datagrams never complete,
  interleaved with whole fragmented DNS queries that do (and are answered);
* ``h1``: one HTTP/1.1 connection with pipelined requests that are never answered
  (after a few answered ones); ``h1up``: the same, each request asking for an Upgrade;
* ``conns``: many short HTTP/1.1 connections (handshake, one exchange, FIN);
* ``servers``: the same, each to another server address;

and three that stress memory rather than time:

* ``ooo``: hundreds of interleaved HTTP/1.1 connections, each a request line then
  1400-byte segments past a 1-byte hole that is never filled (out-of-order queues that
  only grow; about 1.4 KB held per packet, never closed);
* ``halfopen``: a new connection every three packets (a SYN never answered, a ~1000-byte
  request and a ~2000-byte server segment, every other connection the server first),
  never closed, 10 µs apart;
* ``dns``: a flood of padded UDP DNS queries 10 µs apart, one in ten answered, so the
  others stay open (all within netdiag's 5 s transaction timeout at 400k packets).

Used by ``benchmarks/hostile.py``; ``python benchmarks/hostile_shapes.py SHAPE N OUT``
writes one. Nothing is sent anywhere: the 10.0.0.0/8 addresses exist only in the file.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

PCAP_GLOBAL = struct.Struct("<IHHiIII")
PCAP_REC = struct.Struct("<IIII")
IP_HDR = struct.Struct("!BBHHHBBH4s4s")
TCP_HDR = struct.Struct("!HHIIBBHHH")
UDP_HDR = struct.Struct("!HHHH")
ETH = bytes.fromhex("020000000002" "020000000001" "0800")
BASE_S = 1_700_000_000
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

SYN, FIN, PSH, ACK = 0x02, 0x01, 0x08, 0x10


def ip4(n: int) -> bytes:
    """10.x.y.z for ``n`` (0 <= n < 2**24)."""
    return bytes((10, (n >> 16) & 255, (n >> 8) & 255, n & 255))


class Pcap:
    """A pcap being written, one ``add`` per packet."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.f.write(PCAP_GLOBAL.pack(0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        self.packets = 0
        self._buf: list[bytes] = []

    def add(self, ts_us: int, frame: bytes) -> None:
        """Append one Ethernet frame captured at ``ts_us`` (µs after the base time)."""
        s, us = divmod(ts_us, 1_000_000)
        n = len(frame)
        self._buf.append(PCAP_REC.pack(BASE_S + s, us, n, n))
        self._buf.append(frame)
        self.packets += 1
        if len(self._buf) > 4096:
            self.f.write(b"".join(self._buf))
            self._buf.clear()

    def close(self) -> None:
        """Flush and close the file."""
        self.f.write(b"".join(self._buf))
        self._buf.clear()
        self.f.close()


def ipv4(src: bytes, dst: bytes, proto: int, payload: bytes, ident: int = 0,
         frag: int = 0x4000) -> bytes:
    """An Ethernet + IPv4 frame (header checksum left zero: netdiag does not check it)."""
    return ETH + IP_HDR.pack(0x45, 0, 20 + len(payload), ident & 0xFFFF, frag, 64, proto, 0,
                             src, dst) + payload


class Tcp:
    """One TCP connection's packets with exact sequence numbers (client = direction 0)."""

    def __init__(self, cap: Pcap, client: bytes, cport: int, server: bytes, sport: int) -> None:
        self.cap = cap
        self.addr = ((client, server, cport, sport), (server, client, sport, cport))
        self.seq = [1000, 5000]

    def segment(self, d: int, ts_us: int, flags: int, payload: bytes = b"") -> None:
        """One segment of direction ``d`` carrying ``payload``."""
        src, dst, sp, dp = self.addr[d]
        tcp = TCP_HDR.pack(sp, dp, self.seq[d] & 0xFFFFFFFF, self.seq[1 - d] & 0xFFFFFFFF,
                           5 << 4, flags, 65535, 0, 0)
        self.cap.add(ts_us, ipv4(src, dst, 6, tcp + payload))
        self.seq[d] += len(payload) + (1 if flags & (SYN | FIN) else 0)

    def handshake(self, ts_us: int, rtt_us: int = 200) -> int:
        """SYN, SYN-ACK, ACK from ``ts_us``; returns the time of the ACK."""
        self.segment(0, ts_us, SYN)
        self.segment(1, ts_us + rtt_us // 2, SYN | ACK)
        self.segment(0, ts_us + rtt_us, ACK)
        return ts_us + rtt_us

    def send(self, d: int, ts_us: int, payload: bytes) -> None:
        """Payload of direction ``d`` (PSH+ACK)."""
        self.segment(d, ts_us, PSH | ACK, payload)

    def close(self, ts_us: int) -> None:
        """FIN from the client, FIN from the server, last ACK."""
        self.segment(0, ts_us, FIN | ACK)
        self.segment(1, ts_us + 100, FIN | ACK)
        self.segment(0, ts_us + 200, ACK)


# -- HTTP/2 -------------------------------------------------------------------------------

def h2_frame(ftype: int, flags: int, sid: int, body: bytes) -> bytes:
    """One HTTP/2 frame."""
    n = len(body)
    return struct.pack("!HBBBL", n >> 8, n & 255, ftype, flags, sid) + body


def h2_settings(pairs: list[tuple[int, int]], ack: bool = False) -> bytes:
    """A SETTINGS frame (or its ACK)."""
    return h2_frame(4, 1 if ack else 0, 0,
                    b"".join(struct.pack("!HL", k, v) for k, v in pairs))


def _hint(value: int, prefix: int, first: int) -> bytes:
    """An HPACK integer with ``prefix`` bits in its first byte (whose other bits: ``first``)."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes((first | value,))
    out = [first | top]
    value -= top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hstr(text: str) -> bytes:
    raw = text.encode()
    return _hint(len(raw), 7, 0) + raw


def write_h2(cap: Pcap, packets: int, *, every: int = 4, unanswered: int = 4,
             allowed_table: int = 1 << 20, table: int = 1 << 16, big_every: int = 500
             ) -> dict[str, int]:
    """``h2``: one h2c connection; about one packet per client or server frame group.

    Both sides allow an HPACK table of ``allowed_table`` bytes; the client's encoder uses
    ``table`` bytes (a size update, then a new ``x-request-id`` entry per stream and a
    reference to the previous one, so the table fills and evicts). Per stream: a client
    HEADERS (END_STREAM) packet and, except every ``unanswered``-th stream, a server
    packet with HEADERS + DATA (END_STREAM). Every ``every`` streams the client sends
    SETTINGS (INITIAL_WINDOW_SIZE alternating, HEADER_TABLE_SIZE) and the server its
    ACK. Every ``big_every`` streams, the request carries a 32 KiB header block of
    1,000 small fields (HEADERS + CONTINUATIONs). HPACK is encoded here (hpack's
    encoder searches its whole table for every field). Returns what was written.
    """
    conn = Tcp(cap, ip4(1), 40000, ip4(0x010001), 80)
    t = conn.handshake(0)
    conn.send(0, t + 10, PREFACE + h2_settings([(1, allowed_table), (4, 65535)]))
    conn.send(1, t + 20, h2_settings([(1, allowed_table), (3, 1 << 20)])
              + h2_settings([], ack=True))
    conn.send(0, t + 25, h2_settings([], ack=True))
    t += 30
    sid = 1
    streams = answered = settings = big = 0
    resp = bytes((0x88,)) + b"\x0f\x10" + _hstr("text/plain")  # :status 200, content-type
    filler = b"".join(b"\x0f\x2b" + _hstr(f"{i:032x}") for i in range(1000))  # user-agent
    while cap.packets < packets:
        block = (_hint(table, 5, 0x20) if streams == 0 else b"")
        block += (b"\x82\x86" + b"\x44" + _hstr(f"/item/{sid}")  # GET, http, :path
                  + b"\x41" + _hstr("h2.example")  # :authority (indexed name)
                  + b"\x40" + _hstr("x-request-id") + _hstr(f"{sid:08x}-{sid * 40503:010x}"))
        if streams:
            block += bytes((0x80 | 63,))  # the previous stream's x-request-id (dynamic 2)
        if big_every and streams % big_every == big_every - 1:
            whole = block + filler
            first, rest = whole[:16000], whole[16000:]
            conn.send(0, t, h2_frame(1, 0x1, sid, first))
            while rest:
                piece, rest = rest[:16000], rest[16000:]
                conn.send(0, t, h2_frame(9, 0 if rest else 0x4, sid, piece))
            big += 1
        else:
            conn.send(0, t, h2_frame(1, 0x5, sid, block))
        streams += 1
        if streams % unanswered:
            conn.send(1, t + 150, h2_frame(1, 0x4, sid, resp) + h2_frame(0, 0x1, sid, b"ok"))
            answered += 1
        if streams % every == 0:
            win = 65535 + (streams // every % 2) * 1000
            conn.send(0, t + 200, h2_settings([(4, win), (1, allowed_table)]))
            conn.send(1, t + 250, h2_settings([], ack=True))
            settings += 1
        sid += 2
        t += 300
    conn.close(t + 1000)
    return {"streams": streams, "answered": answered, "settings": settings, "big_blocks": big}


# -- IP fragments ---------------------------------------------------------------------------

def _dns_query(qid: int, name: str, pad: int) -> bytes:
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1 if pad else 0)
    for label in name.split("."):
        q += bytes((len(label),)) + label.encode()
    q += b"\x00" + struct.pack("!HH", 1, 1)
    if pad:  # an OPT record with an EDNS padding option, to make it fragment
        q += b"\x00" + struct.pack("!HHIH", 41, 4096, 0, pad + 4) + struct.pack("!HH", 12, pad)
        q += b"\x00" * pad
    return q


def _dns_answer(query: bytes) -> bytes:
    qid = query[:2]
    end = 12
    while query[end]:
        end += query[end] + 1
    question = query[12:end + 5]
    return (qid + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + question
            + b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes((192, 0, 2, 1)))


def write_frag(cap: Pcap, packets: int, *, whole_every: int = 50) -> dict[str, int]:
    """``frag``: first fragments (MF set) that never complete, 10 µs apart, each its own
    (source, id); every ``whole_every`` of them a DNS query in two fragments that does
    complete, answered unfragmented 300 µs later."""
    server = ip4(0x3500)
    t = 0
    incomplete = whole = 0
    n = 0
    while cap.packets < packets:
        n += 1
        src = ip4(0x020000 + n % 60000)
        udp = UDP_HDR.pack(50000, 9999, 8 + 1400, 0) + bytes(1400)
        cap.add(t, ipv4(src, server, 17, udp[:1208], ident=n, frag=0x2000))
        incomplete += 1
        if n % whole_every == 0:
            client = ip4(0x030000 + n % 5000)
            qid = n & 0xFFFF
            query = _dns_query(qid, f"q{n}.frag.example", 1500)
            udp = UDP_HDR.pack(40000 + n % 20000, 53, 8 + len(query), 0) + query
            cut = 1400
            cap.add(t + 2, ipv4(client, server, 17, udp[:cut], ident=n, frag=0x2000))
            cap.add(t + 4, ipv4(client, server, 17, udp[cut:], ident=n, frag=cut >> 3))
            ans = _dns_answer(query)
            cap.add(t + 300, ipv4(server, client, 17,
                                  UDP_HDR.pack(53, 40000 + n % 20000, 8 + len(ans), 0) + ans))
            whole += 1
        t += 10
    return {"incomplete": incomplete, "whole_queries": whole}


# -- HTTP/1.1 -------------------------------------------------------------------------------

def write_h1(cap: Pcap, packets: int, *, per_segment: int = 1, mss: int = 0,
             answered: int = 10, upgrade_every: int = 0) -> dict[str, int]:
    """``h1``: one connection of pipelined GETs, ``per_segment`` per client segment (or,
    with ``mss``, the client stream cut into ``mss``-byte segments, requests straddling
    them); the first ``answered`` requests get a response, the rest never do. With
    ``upgrade_every``, every such request asks for an Upgrade (websocket)."""
    conn = Tcp(cap, ip4(2), 41000, ip4(0x010002), 80)
    t = conn.handshake(0)
    n = done = 0
    pending = b""

    def request(i: int) -> bytes:
        extra = ("Connection: Upgrade\r\nUpgrade: websocket\r\n"
                 if upgrade_every and i % upgrade_every == 0 else "")
        return f"GET /r/{i} HTTP/1.1\r\nHost: h1.example\r\n{extra}X-Id: {i}\r\n\r\n".encode()

    while cap.packets < packets:
        if mss:
            while len(pending) < mss:
                pending += request(n)
                n += 1
            conn.send(0, t, pending[:mss])
            pending = pending[mss:]
        else:
            conn.send(0, t, b"".join(request(n + i) for i in range(per_segment)))
            n += per_segment
        complete = min(n - (1 if pending else 0), answered)
        if complete > done:
            conn.send(1, t + 100, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                      * (complete - done))
            done = complete
        t += 50
    if pending:
        conn.send(0, t, pending)
    conn.close(t + 1000)
    return {"requests": n, "answered": done}


def write_h1up(cap: Pcap, packets: int) -> dict[str, int]:
    """``h1up``: :func:`write_h1` where every request asks for an Upgrade."""
    return write_h1(cap, packets, upgrade_every=1)


# -- many connections, many servers ------------------------------------------------------

def _short_conns(cap: Pcap, packets: int, server_of: Callable[[int], bytes]) -> dict[str, int]:
    n = 0
    t = 0
    while cap.packets < packets:
        conn = Tcp(cap, ip4(0x040000 + n % 50000), 20000 + n % 40000, server_of(n), 80)
        a = conn.handshake(t)
        conn.send(0, a + 10, f"GET /c/{n} HTTP/1.1\r\nHost: c.example\r\n\r\n".encode())
        conn.send(1, a + 300, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        conn.close(a + 400)
        n += 1
        t += 100
    return {"connections": n}


def write_conns(cap: Pcap, packets: int) -> dict[str, int]:
    """``conns``: short HTTP/1.1 connections to 4 servers, 8 packets each, 100 µs apart."""
    return _short_conns(cap, packets, lambda n: ip4(0x050000 + n % 4))


def write_servers(cap: Pcap, packets: int) -> dict[str, int]:
    """``servers``: the same connections, each to its own server address."""
    return _short_conns(cap, packets, lambda n: ip4(0x800000 + n))


# -- memory: out-of-order queues, half-open connections, open DNS transactions -------------

def write_ooo(cap: Pcap, packets: int, *, per_conn: int = 800, batch: int = 4,
              mss: int = 1400) -> dict[str, int]:
    """``ooo``: ``max(200, packets // per_conn)`` HTTP/1.1 connections (handshake, then an
    in-order request line), then segments of ``mss`` bytes that all lie past a 1-byte hole
    left after the request line, which is never filled; no FIN. The connections take
    turns, ``batch`` segments each, 10 µs apart, so all are open at once and each holds
    about ``per_conn`` segments (under netdiag's per-direction limits), the held payload
    growing with the capture: about ``mss`` bytes per packet."""
    n_conns = max(200, packets // per_conn)
    conns: list[Tcp] = []
    t = 0
    segments = 0
    while cap.packets < packets:
        for i in range(n_conns):
            if cap.packets >= packets:
                break
            if i == len(conns):
                conn = Tcp(cap, ip4(0x060000 + i), 30000 + i % 30000, ip4(0x010006 + i % 4), 80)
                t = conn.handshake(t) + 10
                conn.send(0, t, f"GET /o/{i} HTTP/1.1\r\n".encode())
                conn.seq[0] += 1  # the hole: one byte never sent
                conns.append(conn)
            conn = conns[i]
            for _ in range(batch):
                seg = conn.seq[0]
                line = f"X-Fill-{seg}: ".encode()
                conn.send(0, t, line + b"f" * (mss - len(line) - 2) + b"\r\n")
                segments += 1
                t += 10
    return {"connections": len(conns), "segments": segments}


def write_halfopen(cap: Pcap, packets: int) -> dict[str, int]:
    """``halfopen``: a connection per three packets, each from its own client address: a
    SYN (never a SYN-ACK), a ~1000-byte request (``GET /x``, complete) and a ~2000-byte
    server segment (a response that announces more body than it carries); in every other
    connection the server's segment comes first. Never closed; packets 10 µs apart."""
    n = server_first = 0
    t = 0
    while cap.packets < packets:
        conn = Tcp(cap, ip4(0x100000 + n), 20000 + n % 40000, ip4(0x010007 + n % 4), 80)
        head = f"GET /x HTTP/1.1\r\nHost: halfopen.example\r\nX-Conn: {n}\r\nX-Pad: ".encode()
        request = head + b"p" * (1000 - len(head) - 4) + b"\r\n\r\n"
        status = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
        response = status + b"b" * (2000 - len(status))
        conn.segment(0, t, SYN)
        if n % 2:
            conn.send(1, t + 10, response)
            conn.send(0, t + 20, request)
            server_first += 1
        else:
            conn.send(0, t + 10, request)
            conn.send(1, t + 20, response)
        n += 1
        t += 30
    return {"connections": n, "server_first": server_first}


def write_dns(cap: Pcap, packets: int, *, answer_every: int = 10) -> dict[str, int]:
    """``dns``: A queries for ``q<n>.flood.example`` (distinct ids, names and client ports,
    with 100 bytes of EDNS padding) to two resolvers, 10 µs apart; one in
    ``answer_every`` is answered 5 µs later, the others never are."""
    n = answered = 0
    t = 0
    while cap.packets < packets:
        client = ip4(0x080000 + n % 50000)
        server = ip4(0x010035 + n % 2)
        port = 1024 + n % 64000
        query = _dns_query(n & 0xFFFF, f"q{n}.flood.example", 100)
        cap.add(t, ipv4(client, server, 17, UDP_HDR.pack(port, 53, 8 + len(query), 0) + query))
        if n % answer_every == 0:
            ans = _dns_answer(query)
            cap.add(t + 5, ipv4(server, client, 17,
                                UDP_HDR.pack(53, port, 8 + len(ans), 0) + ans))
            answered += 1
        n += 1
        t += 10
    return {"queries": n, "answered": answered}


SHAPES: dict[str, Callable[[Pcap, int], dict[str, int]]] = {
    "h2": write_h2, "frag": write_frag, "h1": write_h1, "h1up": write_h1up,
    "conns": write_conns, "servers": write_servers,
    "ooo": write_ooo, "halfopen": write_halfopen, "dns": write_dns,
}
"""Shape name -> writer ``(pcap, packets) -> facts``."""


def write(shape: str, packets: int, path: Path) -> tuple[int, dict[str, int]]:
    """Write ``shape`` with about ``packets`` packets to ``path``; (packets written, facts)."""
    cap = Pcap(path)
    try:
        facts = SHAPES[shape](cap, packets)
    finally:
        cap.close()
    return cap.packets, facts


def _main(argv: list[str]) -> Iterator[str]:
    shape, n, out = argv[0], int(argv[1]), Path(argv[2])
    written, facts = write(shape, n, out)
    yield f"{out}: {written} packets {facts}"


if __name__ == "__main__":
    for line in _main(sys.argv[1:]):
        print(line)
