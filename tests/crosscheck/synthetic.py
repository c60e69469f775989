"""A small synthetic capture with the cases the real captures do not exercise.

Written with dpkt (Ethernet/IPv4, microsecond pcap), DNS messages by dnspython:

* DNS over TCP, query and response each split over two segments (the 2-byte length
  and the start of the message in the first, the rest 5 ms / 3 ms later): tshark's
  ``dns.time`` runs from the query's *last* segment to the response's *last* segment
  (18 ms), the contract from the *first* byte of each (20 ms);
* DNS over UDP with the query sent twice (1 s apart) before the response: tshark flags
  ``dns.retransmission`` and its ``dns.time`` counts from the second copy;
* a TCP connection whose SYN was retransmitted (1 s later): tshark's ``initial_rtt``
  counts from the last SYN (2 ms), the contract from the first (1002 ms);
* a TLS 1.2 abbreviated (resumed) handshake: the ServerHello echoes the ClientHello's
  session id, then ChangeCipherSpec and an (opaque) Finished each way; tshark marks
  it ``tls.resumed``;
* a plain DNS/UDP exchange and a plain TCP handshake, as controls.

:data:`EXPECTED` holds what the contract says each figure is, by construction.
"""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.rrset
import dpkt

T0 = 1_700_000_000.0
CLIENT = "10.0.0.1"
RESOLVER = "10.0.0.53"
WEB = "10.0.0.80"

EXPECTED = {
    "dns_tcp_split": {"client": f"{CLIENT}:40000", "qname": "split.example",
                      "latency_ms": 20.0, "tshark_dns_time_ms": 18.0},
    "dns_udp_retransmitted": {"client": f"{CLIENT}:40100", "qname": "retry.example",
                              "latency_ms": 1050.0, "retransmissions": 1},
    "dns_udp_plain": {"client": f"{CLIENT}:40101", "qname": "plain.example",
                      "latency_ms": 4.0},
    "tcp_syn_retransmitted": {"client": f"{CLIENT}:40001", "handshake_rtt_ms": 1002.0,
                              "tshark_initial_rtt_ms": 2.0},
    "tcp_plain": {"client": f"{CLIENT}:40002", "handshake_rtt_ms": 1.5},
    "tls12_resumed": {"client": f"{CLIENT}:40003", "server": f"{WEB}:443",
                      "version": "TLS 1.2", "sni": "resume.example",
                      "alpn_offered": ["h2", "http/1.1"], "resumed": True,
                      "hello_retry": False},
}


def _ip(addr: str) -> bytes:
    return bytes(int(x) for x in addr.split("."))


class _Writer:
    def __init__(self, path: Path) -> None:
        self.fh = path.open("wb")
        self.pcap = dpkt.pcap.Writer(self.fh)

    def _write(self, ts: float, src: str, dst: str, l4: dpkt.Packet, proto: int) -> None:
        ip = dpkt.ip.IP(src=_ip(src), dst=_ip(dst), p=proto, ttl=64, data=l4)
        ip.len = len(ip)
        eth = dpkt.ethernet.Ethernet(src=b"\x02\x00\x00\x00\x00\x01",
                                     dst=b"\x02\x00\x00\x00\x00\x02",
                                     type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        self.pcap.writepkt(bytes(eth), ts=ts)

    def udp(self, ts: float, src: str, sport: int, dst: str, dport: int, data: bytes) -> None:
        udp = dpkt.udp.UDP(sport=sport, dport=dport, data=data)
        udp.ulen = len(udp)
        self._write(ts, src, dst, udp, dpkt.ip.IP_PROTO_UDP)

    def tcp(self, ts: float, src: str, sport: int, dst: str, dport: int, seq: int, ack: int,
            flags: int, data: bytes = b"") -> None:
        tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags,
                           win=65535, data=data)
        self._write(ts, src, dst, tcp, dpkt.ip.IP_PROTO_TCP)

    def close(self) -> None:
        self.pcap.close()


def _query(qname: str, msg_id: int) -> dns.message.Message:
    q = dns.message.make_query(qname, "A")
    q.id = msg_id
    return q


def _answer(q: dns.message.Message, addr: str) -> bytes:
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text(q.question[0].name, 60, "IN", "A", addr))
    return r.to_wire()


def _hs(hs_type: int, body: bytes) -> bytes:
    msg = bytes([hs_type]) + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(msg).to_bytes(2, "big") + msg


def _ext(ext_type: int, data: bytes) -> bytes:
    return ext_type.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


def _client_hello(sni: str, alpn: list[str], session_id: bytes) -> bytes:
    name = sni.encode()
    server_name = b"\x00" + len(name).to_bytes(2, "big") + name
    protos = b"".join(bytes([len(p)]) + p.encode() for p in alpn)
    exts = (_ext(0, len(server_name).to_bytes(2, "big") + server_name)
            + _ext(16, len(protos).to_bytes(2, "big") + protos))
    body = (b"\x03\x03" + bytes(range(32)) + bytes([len(session_id)]) + session_id
            + b"\x00\x02\xc0\x2f" + b"\x01\x00" + len(exts).to_bytes(2, "big") + exts)
    return _hs(1, body)


def _server_hello(session_id: bytes) -> bytes:
    body = (b"\x03\x03" + bytes(range(64, 96)) + bytes([len(session_id)]) + session_id
            + b"\xc0\x2f\x00" + b"\x00\x00")
    return _hs(2, body).replace(b"\x16\x03\x01", b"\x16\x03\x03", 1)


CCS_AND_FINISHED = (b"\x14\x03\x03\x00\x01\x01"
                    + b"\x16\x03\x03\x00\x28" + bytes(range(100, 140)))
"""ChangeCipherSpec, then an encrypted Finished (opaque to anyone without keys)."""


def write(path: Path) -> Path:
    """Write the synthetic capture to ``path`` and return it."""
    syn, ack, psh_ack, fin_ack = (dpkt.tcp.TH_SYN, dpkt.tcp.TH_ACK,
                                  dpkt.tcp.TH_PUSH | dpkt.tcp.TH_ACK,
                                  dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
    w = _Writer(path)
    # DNS over TCP, both messages split over two segments.
    c, s, cp = CLIENT, RESOLVER, 40000
    q = _query("split.example", 0x1111)
    qw = q.to_wire()
    rw = _answer(q, "192.0.2.1")
    qmsg = len(qw).to_bytes(2, "big") + qw
    rmsg = len(rw).to_bytes(2, "big") + rw
    cseq, sseq = 1000, 5000
    w.tcp(T0, c, cp, s, 53, cseq, 0, syn)
    w.tcp(T0 + 0.001, s, 53, c, cp, sseq, cseq + 1, syn | ack)
    w.tcp(T0 + 0.0015, c, cp, s, 53, cseq + 1, sseq + 1, ack)
    cseq, sseq = cseq + 1, sseq + 1
    w.tcp(T0 + 0.010, c, cp, s, 53, cseq, sseq, psh_ack, qmsg[:12])
    w.tcp(T0 + 0.0105, s, 53, c, cp, sseq, cseq + 12, ack)
    w.tcp(T0 + 0.015, c, cp, s, 53, cseq + 12, sseq, psh_ack, qmsg[12:])
    cseq += len(qmsg)
    w.tcp(T0 + 0.030, s, 53, c, cp, sseq, cseq, psh_ack, rmsg[:20])
    w.tcp(T0 + 0.0305, c, cp, s, 53, cseq, sseq + 20, ack)
    w.tcp(T0 + 0.033, s, 53, c, cp, sseq + 20, cseq, psh_ack, rmsg[20:])
    sseq += len(rmsg)
    w.tcp(T0 + 0.034, c, cp, s, 53, cseq, sseq, fin_ack)
    w.tcp(T0 + 0.035, s, 53, c, cp, sseq, cseq + 1, fin_ack)
    w.tcp(T0 + 0.036, c, cp, s, 53, cseq + 1, sseq + 1, ack)
    # DNS over UDP, query retransmitted once; then a plain exchange.
    q = _query("retry.example", 0x2222)
    w.udp(T0 + 0.100, c, 40100, s, 53, q.to_wire())
    w.udp(T0 + 1.100, c, 40100, s, 53, q.to_wire())
    w.udp(T0 + 1.150, s, 53, c, 40100, _answer(q, "192.0.2.2"))
    q = _query("plain.example", 0x3333)
    w.udp(T0 + 1.200, c, 40101, s, 53, q.to_wire())
    w.udp(T0 + 1.204, s, 53, c, 40101, _answer(q, "192.0.2.3"))
    # TCP, SYN retransmitted; then a plain handshake.
    for sport, base, syns in ((40001, T0 + 2.0, 2), (40002, T0 + 5.0, 1)):
        cseq, sseq = 7000, 9000
        for i in range(syns):
            w.tcp(base + i * 1.0, c, sport, WEB, 80, cseq, 0, syn)
        last = base + (syns - 1) * 1.0
        w.tcp(last + 0.001, WEB, 80, c, sport, sseq, cseq + 1, syn | ack)
        w.tcp(last + (0.002 if syns > 1 else 0.0015), c, sport, WEB, 80, cseq + 1, sseq + 1,
              ack)
        w.tcp(last + 0.003, c, sport, WEB, 80, cseq + 1, sseq + 1, fin_ack)
        w.tcp(last + 0.004, WEB, 80, c, sport, sseq + 1, cseq + 2, fin_ack)
        w.tcp(last + 0.005, c, sport, WEB, 80, cseq + 2, sseq + 2, ack)
    # TLS 1.2 abbreviated handshake (session id resumption).
    exp = EXPECTED["tls12_resumed"]
    sport, base, cseq, sseq = 40003, T0 + 8.0, 3000, 4000
    sid = bytes(range(200, 232))
    ch = _client_hello(exp["sni"], exp["alpn_offered"], sid)
    sh = _server_hello(sid) + CCS_AND_FINISHED
    w.tcp(base, c, sport, WEB, 443, cseq, 0, syn)
    w.tcp(base + 0.001, WEB, 443, c, sport, sseq, cseq + 1, syn | ack)
    w.tcp(base + 0.002, c, sport, WEB, 443, cseq + 1, sseq + 1, ack)
    cseq, sseq = cseq + 1, sseq + 1
    w.tcp(base + 0.003, c, sport, WEB, 443, cseq, sseq, psh_ack, ch)
    cseq += len(ch)
    w.tcp(base + 0.005, WEB, 443, c, sport, sseq, cseq, psh_ack, sh)
    sseq += len(sh)
    w.tcp(base + 0.006, c, sport, WEB, 443, cseq, sseq, psh_ack, CCS_AND_FINISHED)
    cseq += len(CCS_AND_FINISHED)
    w.tcp(base + 0.007, c, sport, WEB, 443, cseq, sseq, fin_ack)
    w.tcp(base + 0.008, WEB, 443, c, sport, sseq, cseq + 1, fin_ack)
    w.tcp(base + 0.009, c, sport, WEB, 443, cseq + 1, sseq + 1, ack)
    w.close()
    return path
