"""The tshark engine: the report contract's document built from tshark's dissection.

``netdiag report --engine tshark`` and ``netdiag verify`` call :func:`tshark_document`.
tshark decodes, decrypts (``-o tls.keylog_file:KEYS``; a pcapng's decryption-secrets
blocks are used by tshark without it) and reassembles; this module only turns its
fields into netdiag's records (:mod:`netdiag.records`) and lets netdiag's own
:class:`~netdiag.analysis.summary.SummaryBuilder` and
:func:`~netdiag.analysis.findings.build_findings` do the arithmetic, so that the two
engines can only differ in what they measured, never in how they summed it.

How tshark is run: one ``tshark -n -2 -o tcp.reassemble_out_of_order:TRUE -T json``
pass per capture, started directly with :mod:`subprocess` (see
:mod:`netdiag.engines.tsjson` for why not through ``pyshark.FileCapture``: its JSON mode
merges repeated keys and loses the order that ties a message to its reassembly);
pyshark's tshark wrapper finds the binary and its version. Several captures are first
merged by time with ``mergecap``. Frame numbers are tshark's (of the merged file when
several are given) and are written next to every figure (``frames``), so that a figure
can be looked at in Wireshark.

Per figure (CONTRACT.md's definitions; "first byte" = the packet that first carried the
first byte of the message, found from ``tcp.seq``/``tcp.payload`` by
:class:`~netdiag.engines.tsstream.Direction`, because tshark reports a reassembled
message at the packet that *completes* it):

* ``dns[]``: every DNS message tshark decodes on the DNS ports (``-d`` for extra ones),
  keyed as the contract says. A query tshark flags ``dns.retransmission`` is a
  retransmission of the transaction with the same key; a response joins the
  transaction of its ``dns.response_to`` frame. ``latency_ms`` is computed from frame
  times (first byte of the first query to first byte of the first response; for DNS
  over TCP the first frame of ``tcp.segments``), not from ``dns.time``, which counts
  from the last copy of a retransmitted query.
* ``connections[]``: one per ``tcp.stream``. ``handshake_rtt_ms`` runs from the client's
  first SYN to the ACK on which tshark first reports ``tcp.analysis.initial_rtt`` (the
  ACK completing the handshake). tshark's own ``initial_rtt`` starts at the most recent
  SYN, so it is not used directly. ``retransmissions`` counts packets tshark flags
  ``tcp.analysis.retransmission``, ``fast_retransmission`` or
  ``spurious_retransmission``; ``out_of_order`` those flagged ``out_of_order``;
  ``bytes_to_*`` and ``lost_bytes`` come from the sequence-number coverage.
* ``connections[].tls``: ClientHello (SNI, offered ALPN), ServerHello (version from
  ``supported_versions``, cipher, TLS 1.3 resumption = extension 41, HelloRetryRequest =
  the HRR random), EncryptedExtensions' ALPN once decrypted, ``tls.resumed`` for TLS 1.2
  (or the server's ChangeCipherSpec coming first). ``handshake_ms`` runs from the first
  byte of the first ClientHello to the first byte of the closing Finished: decrypted, the
  handshake message of type 20; otherwise by record position (TLS 1.3: the client's first
  encrypted record after the ServerHello; TLS 1.2: the first record after the
  ChangeCipherSpec of the side whose Finished closes the handshake).
* ``requests[]``: HTTP/2 frames (``http2.type``, ``http2.streamid``,
  ``http2.flags.end_stream``, ``http2.headers.*``) and HTTP/1.x messages
  (``http.request``, ``http.response``, ``http.request_in``) that tshark decodes,
  decrypted or in the clear. ``ts`` and ``ttfb_ms`` use first-byte packets: a packet
  without reassembly starts every message it reports; after a ``tcp.segments``
  reassembly the first message starts in the first segment (cleartext) or at the first
  plaintext byte of the reassembled TLS record (offset by the frames before it); a
  message in a later TLS layer of the packet starts in it; an HTTP/1.x message starts at
  the first plaintext byte of the first application-data record completed after the
  previous message of its direction. A message none of these rules places is timed at
  the packet completing it, and ``frames.request_how``/``response_how`` say so.
  ``ttlb_ms`` ends at the packet completing the frame carrying END_STREAM (HTTP/2) or
  completing the response (HTTP/1.x). tshark cannot see requests inside TLS it cannot
  decrypt: this engine never estimates requests.

Not measured (``null``/empty): ``tls.certificate``, ``connections[].http2``.

Cost: tshark's JSON is verbose and every packet is kept until the end (payloads are
needed to place first bytes): about 2,500 packets a second and memory in proportion to
the capture. This engine is a cross-check, not the fast path.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from netdiag import CONTRACT_VERSION, __version__
from netdiag.analysis.findings import Thresholds, build_findings
from netdiag.analysis.summary import SummaryBuilder
from netdiag.engines.tsjson import (
    Node,
    TsharkRun,
    dns_messages,
    epoch_ns,
    find_all,
    find_first,
    has_key,
    hex_bytes,
    http2_frames,
    require_tshark,
    segment_frames,
    to_int,
    tshark_version,
    walk,
)
from netdiag.engines.tsstream import Direction
from netdiag.errors import InputError
from netdiag.records import (
    Connection,
    DnsTransaction,
    Request,
    TlsInfo,
    Warning_,
    endpoint,
)

DEFAULT_DNS_PORTS = frozenset({53})
HRR_RANDOM = "cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c"
"""SHA-256 of "HelloRetryRequest": the random of a ServerHello that is an HRR (RFC 8446)."""
WTAP_LINK_TYPES = {1: "EN10MB", 7: "RAW", 15: "NULL", 25: "LINUX_SLL", 210: "LINUX_SLL2",
                   129: "LOOP", 4: "PPP", 23: "IEEE802_11"}
"""tshark's ``frame.encap_type`` to the pcap link-type name netdiag reports."""
H2_DATA, H2_HEADERS, H2_RST_STREAM = 0, 1, 3
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
             4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR",
             7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR",
             11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}


# ----------------------------------------------------------------------------- packets


@dataclass(eq=False)
class _Msg:
    """One HTTP/1.x message or HTTP/2 frame as tshark reports it in a packet."""

    kind: str
    """``http`` or ``http2``."""
    node: Node
    tls_layer: int
    """How many ``tls`` layers precede it in the packet (0: cleartext)."""
    first: bool
    """The packet's first HTTP/1.x message or HTTP/2 frame."""
    index_in_layer: int = 0
    """How many HTTP/2 frames of the same ``tls`` layer precede it."""
    before_in_layer: int = 0
    """Their total size in bytes (9-byte header + payload each)."""


@dataclass(eq=False)
class _Pkt:
    frame: int
    ts: int
    cap_len: int = 0
    encap: int | None = None
    has_ip: bool = False
    src: str | None = None
    dst: str | None = None
    transport: str | None = None
    sport: int | None = None
    dport: int | None = None
    stream: int | None = None
    icmp: bool = False
    seq: int | None = None
    syn: bool = False
    ack: bool = False
    fin: bool = False
    rst: bool = False
    retrans: bool = False
    out_of_order: bool = False
    initial_rtt: bool = False
    payload: bytes = b""
    tcp_segments: list[int] = field(default_factory=list)
    tls_segments: list[int] = field(default_factory=list)
    dns: list[tuple[Node, list[int]]] = field(default_factory=list)
    tls_layers: int = 0
    records: list[Node] = field(default_factory=list)
    record_layers: list[int] = field(default_factory=list)
    msgs: list[_Msg] = field(default_factory=list)
    magic: bool = False
    resumed_flag: bool = False


def _flag(node: Any, name: str) -> bool:
    return find_first(node, name) == "1"


def _packet(layers: Node) -> _Pkt | None:
    frame_l = layers.get("frame")
    if not isinstance(frame_l, Node):
        return None
    number = to_int(frame_l.get("frame.number"))
    epoch = frame_l.get("frame.time_epoch")
    if number is None or not isinstance(epoch, str):
        return None
    pkt = _Pkt(number, epoch_ns(epoch), to_int(frame_l.get("frame.cap_len")) or 0,
               to_int(frame_l.get("frame.encap_type")))
    ip_src = ip_dst = None
    h2_in_layer: dict[int, tuple[int, int]] = {}
    for key, value in layers:
        if not isinstance(value, Node):
            continue
        if key in ("ip", "ipv6") and not pkt.has_ip:
            pkt.has_ip = True
            ip_src, ip_dst = value.get(f"{key}.src"), value.get(f"{key}.dst")
        elif key in ("udp", "tcp") and pkt.transport is None and not pkt.icmp:
            pkt.transport = key
            pkt.sport = to_int(value.get(f"{key}.srcport"))
            pkt.dport = to_int(value.get(f"{key}.dstport"))
            pkt.stream = to_int(value.get(f"{key}.stream"))
            if key == "tcp":
                _tcp_fields(pkt, value)
        elif key in ("icmp", "icmpv6"):
            pkt.icmp = True
        elif key == "tcp.segments":
            pkt.tcp_segments = segment_frames(value, "tcp")
        elif key == "tls.segments":
            pkt.tls_segments = segment_frames(value, "tls")
        elif key == "tls":
            pkt.tls_layers += 1
            for rkey, rec in value:
                if rkey == "tls.record" and isinstance(rec, Node):
                    pkt.records.append(rec)
                    pkt.record_layers.append(pkt.tls_layers)
            if has_key(value, "tls.resumed"):
                pkt.resumed_flag = True
        elif key == "http":
            pkt.msgs.append(_Msg("http", value, pkt.tls_layers, not pkt.msgs))
        elif key == "http2":
            magic, frames = http2_frames(value)
            pkt.magic = pkt.magic or magic
            for fnode in frames:
                count, size = h2_in_layer.get(pkt.tls_layers, (0, 0))
                pkt.msgs.append(_Msg("http2", fnode, pkt.tls_layers, not pkt.msgs,
                                     count, size))
                length = to_int(fnode.get("http2.length")) or 0
                h2_in_layer[pkt.tls_layers] = (count + 1, size + 9 + length)
    pkt.dns = dns_messages(layers)
    if ip_src is not None and pkt.sport is not None:
        pkt.src = endpoint(str(ip_src), pkt.sport)
        pkt.dst = endpoint(str(ip_dst), pkt.dport or 0)
    return pkt


def _tcp_fields(pkt: _Pkt, tcp: Node) -> None:
    pkt.seq = to_int(tcp.get("tcp.seq"))
    pkt.syn = _flag(tcp, "tcp.flags.syn")
    pkt.ack = _flag(tcp, "tcp.flags.ack")
    pkt.fin = _flag(tcp, "tcp.flags.fin")
    pkt.rst = _flag(tcp, "tcp.flags.reset")
    analysis = tcp.get("tcp.analysis")
    if isinstance(analysis, Node):
        keys = {k for k, _ in walk(analysis)}
        pkt.retrans = bool(keys & {"tcp.analysis.retransmission",
                                   "tcp.analysis.fast_retransmission",
                                   "tcp.analysis.spurious_retransmission"})
        pkt.out_of_order = "tcp.analysis.out_of_order" in keys
        pkt.initial_rtt = "tcp.analysis.initial_rtt" in keys
    pkt.payload = hex_bytes(tcp.get("tcp.payload"))


# ----------------------------------------------------------------------------- DNS


def _qname(name: str) -> str:
    if name in ("<Root>", "<root>", ""):
        return "."
    return name.rstrip(".") or "."


def dns_decode_rules(ports: Iterable[int]) -> list[str]:
    """tshark ``-d`` rules decoding ``ports`` (besides 53) as DNS, over UDP and TCP."""
    return [f"{t}.port=={port},dns" for port in sorted(set(ports) - {53})
            for t in ("udp", "tcp")]


def _type_text(code: int) -> str:
    import dns.rdatatype

    return dns.rdatatype.to_text(code)  # type: ignore[arg-type]


def _rcode_text(code: int) -> str:
    import dns.rcode

    return dns.rcode.to_text(code)  # type: ignore[arg-type]


def _answers(msg: Node) -> list[str]:
    answers = msg.get("Answers")
    out: list[str] = []
    if not isinstance(answers, Node):
        return out
    for label, rr in answers:
        if not isinstance(rr, Node):
            continue
        rtype = to_int(rr.get("dns.resp.type"))
        value: str | None = None
        for name in ("dns.a", "dns.aaaa", "dns.cname", "dns.ptr.domain_name", "dns.ns"):
            if rr.get(name) is not None:
                value = _qname(str(rr.get(name))) if name in (
                    "dns.cname", "dns.ptr.domain_name", "dns.ns") else str(rr.get(name))
                break
        if value is None and rtype == 15:
            value = f"{rr.get('dns.mx.preference')} {_qname(str(rr.get('dns.mx.mail_exchange')))}"
        if value is None and rr.get("dns.txt") is not None:
            value = " ".join(f'"{t}"' for t in rr.all("dns.txt"))
        out.append(value if value is not None else label)
    return out


@dataclass(eq=False)
class _Txn:
    rec: DnsTransaction
    key: tuple[Any, ...]
    query_frames: set[int]


def _dns(pkts: list[_Pkt], ports: frozenset[int]) -> list[DnsTransaction]:
    ts_of = {p.frame: p.ts for p in pkts}
    txns: list[_Txn] = []
    latest: dict[tuple[Any, ...], _Txn] = {}
    by_frame: dict[int, _Txn] = {}
    for pkt in pkts:
        if (pkt.src is None or pkt.dst is None or pkt.icmp or pkt.transport is None
                or (pkt.sport not in ports and pkt.dport not in ports)):
            continue
        for msg, segments in pkt.dns:
            msg_id = to_int(msg.get("dns.id"))
            response = find_first(msg, "dns.flags.response")
            names = find_all(msg, "dns.qry.name")
            if msg_id is None or response is None or not names:
                continue
            qname = _qname(names[0])
            types = find_all(msg, "dns.qry.type")
            qtype = to_int(types[0]) if types else 0
            first_frame = segments[0] if segments else pkt.frame
            first_ts = ts_of.get(first_frame, pkt.ts)
            if response == "0":
                key = (pkt.src, pkt.dst, pkt.transport, msg_id, qname.lower(), qtype)
                prior = latest.get(key)
                if prior is not None and has_key(msg, "dns.retransmission"):
                    if prior.rec.responses == 0:
                        prior.rec.retransmissions += 1
                    prior.query_frames.add(pkt.frame)
                    by_frame[pkt.frame] = prior
                    continue
                rec = DnsTransaction(ts_ns=first_ts, client=pkt.src, server=pkt.dst,
                                     transport=pkt.transport, id=msg_id, qname=qname,
                                     qtype=_type_text(qtype or 0), query_packet=first_frame)
                txn = _Txn(rec, key, {pkt.frame})
                txns.append(txn)
                latest[key] = txn
                by_frame[pkt.frame] = txn
                continue
            key = (pkt.dst, pkt.src, pkt.transport, msg_id, qname.lower(), qtype)
            to = to_int(find_first(msg, "dns.response_to"))
            found = by_frame.get(to) if to is not None else None
            if found is None:
                found = latest.get(key)
            if found is None or found.rec.ts_ns > first_ts:
                continue
            rec = found.rec
            rec.responses += 1
            if rec.responses > 1:
                continue
            rec.response_ts_ns = first_ts
            rec.response_packet = first_frame
            rec.truncated = _flag(msg, "dns.flags.truncated")
            rcode = to_int(find_first(msg, "dns.flags.rcode"))
            rec.rcode = _rcode_text(rcode) if rcode is not None else None
            rec.answers = _answers(msg)
    out = [t.rec for t in txns]
    out.sort(key=lambda t: (t.ts_ns, t.id))
    return out


# ----------------------------------------------------------------------------- TCP


@dataclass(eq=False)
class _Pos:
    """The packet carrying a message's first byte, and how that was established."""

    pkt: _Pkt
    how: str


class _Stream:
    """Everything about one ``tcp.stream``."""

    def __init__(self, number: int, pkts: list[_Pkt]) -> None:
        self.number = number
        self.pkts = pkts
        self.by_frame = {p.frame: p for p in pkts}
        self.client, self.server, self.handshake_seen = self._endpoints()
        self.dirs: dict[str, Direction] = {}
        self.nonce: int | None = None
        self.nonce_why = "no ServerHello captured"
        self.tls = any(p.records for p in pkts)

    def _endpoints(self) -> tuple[str, str, bool]:
        from netdiag.flows.table import WELL_KNOWN_SERVER_PORTS

        for p in self.pkts:
            if p.syn and not p.ack and p.src and p.dst:
                return p.src, p.dst, True
        for p in self.pkts:
            if p.syn and p.ack and p.src and p.dst:
                return p.dst, p.src, False
        p = self.pkts[0]
        assert p.src is not None and p.dst is not None
        sport, dport = p.sport or 0, p.dport or 0
        if dport in WELL_KNOWN_SERVER_PORTS and sport not in WELL_KNOWN_SERVER_PORTS:
            client = True
        elif sport in WELL_KNOWN_SERVER_PORTS and dport not in WELL_KNOWN_SERVER_PORTS:
            client = False
        else:
            client = sport >= dport
        return (p.src, p.dst, False) if client else (p.dst, p.src, False)

    def direction(self, src: str) -> Direction:
        if src not in self.dirs:
            pkts = [p for p in self.pkts if p.src == src]
            syn = any(p.syn for p in pkts)
            self.dirs[src] = Direction(pkts, syn)
        return self.dirs[src]

    def side(self, p: _Pkt) -> str:
        return "client" if p.src == self.client else "server"


def _connection(cid: str, st: _Stream, dns_ports: frozenset[int]) -> tuple[Connection,
                                                                           dict[str, Any]]:
    pkts = st.pkts
    conn = Connection(id=cid, ts_ns=pkts[0].ts, client=st.client, server=st.server,
                      last_ns=pkts[-1].ts, handshake_seen=st.handshake_seen)
    frames: dict[str, Any] = {"first": pkts[0].frame, "last": pkts[-1].frame,
                              "tcp_stream": st.number}
    syns = [p for p in pkts if p.syn and not p.ack and p.src == st.client]
    # tshark reports tcp.analysis.initial_rtt from the SYN-ACK on; the handshake's ACK is
    # the client's first packet carrying it.
    hs_ack = next((p for p in pkts if p.initial_rtt and p.src == st.client and p.ack
                   and not p.syn), None)
    if syns:
        conn.syn_ns = syns[0].ts
        frames["syn"] = syns[0].frame
        before = [s for s in syns if hs_ack is None or s.frame < hs_ack.frame]
        conn.syn_retransmissions = max(len(before) - 1, 0)
        if hs_ack is not None and hs_ack.frame > syns[0].frame:
            conn.handshake_ack_ns = hs_ack.ts
            frames["handshake_ack"] = hs_ack.frame
    conn.packets = len(pkts)
    conn.retransmissions = sum(1 for p in pkts if p.retrans)
    conn.out_of_order = sum(1 for p in pkts if p.out_of_order)
    conn.resets = sum(1 for p in pkts if p.rst)
    to_server, to_client = st.direction(st.client), st.direction(st.server)
    conn.bytes_to_server = to_server.first_bytes
    conn.bytes_to_client = to_client.first_bytes
    conn.lost_bytes = to_server.lost_bytes + to_client.lost_bytes
    conn.close = "rst" if conn.resets else "fin" if any(p.fin for p in pkts) else "open"
    if _port(st.server) in dns_ports or _port(st.client) in dns_ports:
        conn.protocol = "dns"
    return conn, frames


def _port(ep: str) -> int:
    try:
        return int(ep.rpartition(":")[2])
    except ValueError:
        return 0


# ----------------------------------------------------------------------------- TLS


TLS_VERSIONS = {0x0300: "SSL 3.0", 0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: "TLS 1.2",
                0x0304: "TLS 1.3"}


def version_name(code: int | None) -> str | None:
    """``0x0303`` -> ``"TLS 1.2"`` (unknown codes in hex)."""
    if code is None:
        return None
    return TLS_VERSIONS.get(code, f"0x{code:04x}")


def _explicit_nonce(version: int | None, cipher: str | None) -> int | None:
    """Bytes between an encrypted record's header and its first plaintext byte."""
    if version == 0x0304:
        return 0
    if cipher is None:
        return None
    if "GCM" in cipher or "CCM" in cipher:
        return 8
    if "CHACHA20" in cipher or "RC4" in cipher or "NULL" in cipher:
        return 0
    if "CBC" in cipher:
        if version is not None and version <= 0x0301:
            return 0
        return 8 if any(c in cipher for c in ("3DES", "_DES_", "IDEA", "RC2", "DES40")) \
            else 16
    return None


@dataclass(eq=False)
class _RecView:
    """One TLS record of a connection with tshark's node and a way to place its bytes."""

    side: str
    node: Node
    outer_type: int | None
    done: _Pkt
    order: tuple[int, int]
    start: int | None = None
    """Stream offset of its header (None when the direction could not be framed)."""
    direction: Direction | None = None
    fallback: _Pkt | None = None

    def header_pos(self) -> _Pos:
        if self.direction is not None and self.start is not None:
            p = self.direction.packet_at(self.start)
            if p is not None:
                return _Pos(p, f"record header at stream offset "
                               f"{self.start - self.direction.base}")
        p = self.fallback or self.done
        return _Pos(p, f"record reported in frame {self.done.frame}")

    def plain_pos(self, nonce: int | None, offset: int) -> _Pos:
        """The packet carrying plaintext byte ``offset`` of the record (``nonce`` bytes of
        explicit nonce/IV after the header; None when unknown: the header's packet)."""
        if self.direction is not None and self.start is not None and nonce is not None:
            p = self.direction.packet_at(self.start + 5 + nonce + offset)
            if p is not None:
                return _Pos(p, f"byte {offset} of the record at stream offset "
                               f"{self.start - self.direction.base}")
        return self.header_pos()


def _record_views(st: _Stream) -> list[_RecView]:
    views: list[_RecView] = []
    for side_ep in (st.client, st.server):
        side = "client" if side_ep == st.client else "server"
        d = st.direction(side_ep)
        recs = d.records()
        if recs is not None and all(r.node is not None for r in recs):
            for r in recs:
                views.append(_RecView(side, r.node, r.outer_type, r.done,
                                      (r.done.frame, r.index), r.start, d))
            continue
        # not framed: tshark's records, placed at packet level
        n = 0
        for p in st.pkts:
            if p.src != side_ep:
                continue
            for node, layer in zip(p.records, p.record_layers, strict=False):
                outer = to_int(node.get("tls.record.opaque_type")) or \
                    to_int(node.get("tls.record.content_type"))
                fallback = p
                if layer == 1 and p.tcp_segments and node is p.records[0]:
                    fallback = st.by_frame.get(p.tcp_segments[0], p)
                views.append(_RecView(side, node, outer, p, (p.frame, n), fallback=fallback))
                n += 1
    views.sort(key=lambda v: v.order)
    return views


def _tls(st: _Stream) -> tuple[TlsInfo | None, dict[str, Any]]:
    """The connection's TlsInfo and the frames of its handshake."""
    views = _record_views(st)
    if not views:
        return None, {}
    info = TlsInfo()
    frames: dict[str, Any] = {}
    version: int | None = None
    cipher: str | None = None
    sh_seen = False
    ccs: dict[str, bool] = {"client": False, "server": False}
    ccs_order: list[str] = []
    resumed12 = any(p.resumed_flag for p in st.pkts)
    finished: dict[str, _Pos] = {}
    first_after_ccs: dict[str, _Pos | None] = {}
    client_first_encrypted: _Pos | None = None
    client_first_seen = False
    for v in views:
        node = v.node
        opaque = node.get("tls.record.opaque_type") is not None
        inner = to_int(node.get("tls.record.content_type"))
        encrypted = opaque or (version != 0x0304 and ccs[v.side])
        if opaque and inner is not None:
            info.decrypted = True
        if version != 0x0304 and ccs[v.side] and v.side not in first_after_ccs:
            # TLS 1.2: the side's Finished is its first record after its ChangeCipherSpec,
            # a handshake record (an alert there means the handshake failed)
            first_after_ccs[v.side] = v.header_pos() if v.outer_type == 22 else None
        if (version == 0x0304 and sh_seen and v.side == "client" and v.outer_type == 23
                and not client_first_seen):
            # TLS 1.3: the client's first encrypted record; decrypted, it must be a
            # handshake record (a fatal alert there: no handshake completed)
            client_first_seen = True
            if inner is None or inner == 22:
                client_first_encrypted = v.header_pos()
        nonce = st.nonce if encrypted else 0
        offset = 0
        for hs in node.all("tls.handshake"):
            if not isinstance(hs, Node):
                continue  # "Encrypted Handshake Message"
            htype = to_int(hs.get("tls.handshake.type"))
            length = to_int(hs.get("tls.handshake.length")) or 0
            if htype == 1 and v.side == "client" and not sh_seen:
                if info.client_hello_ns is None:
                    pos = v.plain_pos(0, offset)
                    info.client_hello_ns = pos.pkt.ts
                    info.client_hello_packet = pos.pkt.frame
                    frames["client_hello"] = pos.pkt.frame
                    info.sni = find_first(hs, "tls.handshake.extensions_server_name")
                    info.alpn_offered = find_all(hs, "tls.handshake.extensions_alpn_str")
                    rnd = find_first(hs, "tls.handshake.random")
                    if rnd:
                        with contextlib.suppress(ValueError):
                            info.client_random = bytes.fromhex(rnd.replace(":", ""))
                    info.session_ticket_offered = _ticket_offered(hs)
            elif htype == 2 and v.side == "server" and is_hrr(hs):
                info.hello_retry = True
            elif htype == 2 and v.side == "server" and not sh_seen:
                sh_seen = True
                frames["server_hello"] = v.done.frame
                version = to_int(find_first(hs, "tls.handshake.extensions.supported_version")
                                 or hs.get("tls.handshake.version"))
                info.version = version_name(version)
                suite = to_int(hs.get("tls.handshake.ciphersuite"))
                if suite is not None:
                    from netdiag.tls.names import cipher_name

                    cipher = info.cipher = cipher_name(suite)
                alpn = find_first(hs, "tls.handshake.extensions_alpn_str")
                if alpn:
                    info.alpn = alpn
                if version == 0x0304:
                    info.resumed = "41" in find_all(hs, "tls.handshake.extension.type")
                st.nonce = _explicit_nonce(version, cipher)
                st.nonce_why = "" if st.nonce is not None else \
                    f"cipher suite {cipher} has no known record layout"
            elif htype == 8 and v.side == "server":
                alpn = find_first(hs, "tls.handshake.extensions_alpn_str")
                if alpn:
                    info.alpn = alpn
            elif htype == 4 and v.side == "server":
                info.session_tickets += 1
                frames.setdefault("session_ticket", v.done.frame)
            elif htype == 24:
                info.key_updates += 1
            elif htype == 20:
                if encrypted and version != 0x0304:
                    info.decrypted = True
                if v.side not in finished:
                    finished[v.side] = v.plain_pos(nonce, offset)
            offset += 4 + length
        if v.outer_type == 20 and version != 0x0304 and sh_seen and not ccs[v.side]:
            ccs[v.side] = True
            ccs_order.append(v.side)
        alert = node.get("tls.alert_message")
        if info.alert is None or info.alert.startswith("encrypted"):
            if isinstance(alert, Node) and alert.get("tls.alert_message.level") is not None:
                from netdiag.tls.names import alert_description, alert_level_name

                level = to_int(alert.get("tls.alert_message.level")) or 0
                desc = to_int(alert.get("tls.alert_message.desc")) or 0
                info.alert = (f"{alert_level_name(level)} {alert_description(desc)} "
                              f"from {v.side}")
            elif info.alert is None and ((v.outer_type == 21 and encrypted)
                                         or (opaque and inner == 21)):
                info.alert = f"encrypted from {v.side}"
    if version is not None and version != 0x0304:
        info.resumed = resumed12 or (ccs_order[:1] == ["server"])
    closing: _Pos | None = None
    if version == 0x0304:
        closing = finished.get("client") or client_first_encrypted
    elif version is not None:
        side = "client" if info.resumed else "server"
        closing = finished.get(side) or first_after_ccs.get(side)
    if closing is not None and info.client_hello_ns is not None:
        info.finished_ns = closing.pkt.ts
        info.finished_packet = closing.pkt.frame
        frames["finished"] = closing.pkt.frame
        frames["finished_how"] = closing.how
    if info.client_hello_ns is None:
        frames.pop("server_hello", None)
    return info, frames


def is_hrr(hs: Node) -> bool:
    """A ServerHello handshake node that is a HelloRetryRequest (its random)."""
    rnd = (find_first(hs, "tls.handshake.random") or "").replace(":", "").lower()
    return rnd == HRR_RANDOM


def _ticket_offered(hs: Node) -> bool:
    for k, v in walk(hs):
        if k == "tls.handshake.extensions.psk.identity.identity_length" and v not in ("0", 0):
            return True
        if k == "tls.handshake.session_ticket_length" and v not in ("0", 0):
            return True
    return False


# ----------------------------------------------------------------------------- HTTP


@dataclass(eq=False)
class _Req:
    req: Request
    frames: dict[str, Any]
    kind: str
    """``http1``, ``h2`` or ``upgrade``."""
    request_frame: int
    final: bool = False
    sse: bytearray | None = None
    ended: set[str] = field(default_factory=set)
    """The sides that ended the stream (END_STREAM, or a RST_STREAM)."""
    event_times: list[int] = field(default_factory=list)


def final_status(status: int | None) -> bool:
    """A final (non-1xx) status."""
    return status is not None and not 100 <= status < 200


class _Http:
    """The requests of one stream, first bytes placed as the module docstring says."""

    def __init__(self, st: _Stream) -> None:
        self.st = st

    # positions --------------------------------------------------------------------------

    def exact(self, pkt: _Pkt, msg: _Msg) -> _Pos | None:
        if not pkt.tcp_segments and not pkt.tls_segments:
            return _Pos(pkt, f"reported in frame {pkt.frame}, no reassembly")
        if pkt.tls_segments:
            return None
        if msg.tls_layer == 0:
            if msg.first:
                first = self.st.by_frame.get(pkt.tcp_segments[0])
                if first is None:
                    return None
                return _Pos(first, f"first of tcp.segments {pkt.tcp_segments}")
            return _Pos(pkt, f"reported in frame {pkt.frame} after its reassembled PDU")
        if msg.tls_layer >= 2:
            return _Pos(pkt, f"reported in frame {pkt.frame}, in a TLS record after the "
                             f"reassembled one")
        if msg.kind == "http2":
            return self.in_reassembled_record(pkt, msg)
        return None

    def in_reassembled_record(self, pkt: _Pkt, msg: _Msg) -> _Pos | None:
        """An HTTP/2 frame inside the one TLS record a ``tcp.segments`` reassembly
        completed in ``pkt``: the record's plaintext start plus the frames before it."""
        st = self.st
        if st.nonce is None or pkt.src is None:
            return None
        d = st.direction(pkt.src)
        recs = d.records()
        if recs is None:
            return None
        rec = next((r for r in recs if r.done.frame == pkt.frame), None)
        if rec is None:
            return None
        offset = rec.start + 5 + st.nonce + msg.before_in_layer
        p = d.packet_at(offset)
        if p is None:
            return None
        return _Pos(p, f"byte {msg.before_in_layer} of the TLS record at stream offset "
                       f"{rec.start - d.base} (completed in frame {pkt.frame})")

    def record_start(self, src: str, after: int | None, until: int | None
                     ) -> tuple[_Pos | None, str]:
        """First plaintext byte of the first application-data record of ``src``
        completed after frame ``after`` (and not after ``until``)."""
        st = self.st
        if st.nonce is None:
            return None, st.nonce_why
        d = st.direction(src)
        recs = d.records()
        if recs is None:
            return None, d.records_why or "TLS records not framed"
        for rec in recs:
            ctype = to_int(rec.node.get("tls.record.content_type")) if rec.node else None
            if ctype != 23:
                continue
            if after is not None and rec.done.frame <= after:
                continue
            if until is not None and rec.done.frame > until:
                break
            offset = rec.start + 5 + st.nonce
            p = d.packet_at(offset)
            if p is None:
                return None, f"stream offset {offset - d.base} not captured"
            return _Pos(p, f"plaintext start of the TLS record at stream offset "
                           f"{rec.start - d.base} (completed in frame {rec.done.frame})"), ""
        return None, "no application-data record found"

    def position(self, pkt: _Pkt, msg: _Msg, prev: int | None) -> _Pos:
        pos = self.exact(pkt, msg)
        if pos is not None:
            return pos
        why = ""
        if msg.tls_layer and msg.kind == "http" and pkt.src is not None:
            pos, why = self.record_start(pkt.src, prev, pkt.frame)
            if pos is not None:
                return pos
        return _Pos(pkt, f"first byte not placed{': ' + why if why else ''}; frame "
                         f"{pkt.frame} completes the message (tcp.segments "
                         f"{pkt.tcp_segments}, tls.segments {pkt.tls_segments})")

    def first_payload_after(self, src: str, after: int) -> _Pos | None:
        st = self.st
        if not st.tls:
            for p in st.pkts:
                if p.src == src and p.frame > after and p.payload and not p.retrans:
                    return _Pos(p, "first server payload after the request")
            return None
        pos, _ = self.record_start(src, after, None)
        return pos

    # requests ---------------------------------------------------------------------------

    def requests(self) -> list[_Req]:
        out = self._http1()
        out += self._http2(out)
        out.sort(key=lambda r: (r.req.ts_ns, r.req.stream_id or 0))
        return out

    def _http1(self) -> list[_Req]:
        st = self.st
        by_frame: dict[int, list[_Req]] = {}
        out: list[_Req] = []
        prev: dict[str, int | None] = {"req": None, "resp": None}
        for p in st.pkts:
            for m in p.msgs:
                if m.kind != "http":
                    continue
                node = m.node
                if node.get("http.request") is not None and p.src == st.client:
                    pos = self.position(p, m, prev["req"])
                    prev["req"] = p.frame
                    version = (find_first(node, "http.request.version") or "HTTP/1.1").lower()
                    req = Request(ts_ns=pos.pkt.ts, estimated=False, protocol=version,
                                  method=find_first(node, "http.request.method"),
                                  path=find_first(node, "http.request.uri"),
                                  authority=find_first(node, "http.host"), end_ns=p.ts)
                    length = to_int(find_first(node, "http.content_length"))
                    req.request_bytes = length if length is not None else 0
                    r = _Req(req, {"request": pos.pkt.frame, "request_how": pos.how,
                                   "request_reported": p.frame}, "http1", p.frame)
                    out.append(r)
                    by_frame.setdefault(p.frame, []).append(r)
                elif node.get("http.response") is not None and p.src == st.server:
                    pos = self.position(p, m, prev["resp"])
                    prev["resp"] = p.frame
                    cands = by_frame.get(to_int(find_first(node, "http.request_in")) or -1, [])
                    if not cands:
                        continue
                    r = next((c for c in cands if not c.final), cands[-1])
                    code = to_int(find_first(node, "http.response.code"))
                    req = r.req
                    if req.first_byte_ns is None:
                        req.first_byte_ns = pos.pkt.ts
                        r.frames["response"] = pos.pkt.frame
                        r.frames["response_how"] = pos.how
                    if not r.final:
                        req.status = code
                        r.final = final_status(code)
                        if r.final or code == 101:
                            req.last_byte_ns = p.ts
                            r.frames["last"] = p.frame
                            length = to_int(find_first(node, "http.content_length"))
                            if length is None and (code in (204, 304)
                                                   or req.method == "HEAD"):
                                length = 0
                            req.response_bytes = length
                            ctype = find_first(node, "http.content_type")
                            req.content_type = ctype
        for r in out:
            if r.req.first_byte_ns is None:
                pos = self.first_payload_after(st.server, r.request_frame)
                if pos is not None:
                    r.req.first_byte_ns = pos.pkt.ts
                    r.frames["response"] = pos.pkt.frame
                    r.frames["response_how"] = pos.how
        return out

    def _http2(self, http1: list[_Req]) -> list[_Req]:
        st = self.st
        proto = "h2" if st.tls else "h2c"
        streams: dict[int, _Req] = {}
        upgrade = next((r for r in http1 if r.req.status == 101), None)
        for p in st.pkts:
            side = st.side(p)
            for m in p.msgs:
                if m.kind != "http2":
                    continue
                node = m.node
                ftype = to_int(node.get("http2.type"))
                sid = to_int(node.get("http2.streamid"))
                if sid is None or sid == 0 or ftype is None:
                    continue
                end_stream = find_first(node, "http2.flags.end_stream") == "1"
                r = streams.get(sid)
                if r is None:
                    if side == "client" and ftype == H2_HEADERS:
                        pos = self.position(p, m, None)
                        req = Request(ts_ns=pos.pkt.ts, stream_id=sid, estimated=False,
                                      protocol=proto, request_bytes=0,
                                      method=find_first(node, "http2.headers.method"),
                                      path=find_first(node, "http2.headers.path"),
                                      authority=find_first(node, "http2.headers.authority"))
                        r = streams[sid] = _Req(req, {"request": pos.pkt.frame,
                                                      "request_how": pos.how}, "h2", p.frame)
                    elif sid == 1 and upgrade is not None and side == "server":
                        r = streams[sid] = upgrade
                        upgrade.kind = "upgrade"
                        upgrade.req.stream_id = 1
                        upgrade.req.protocol = proto
                        upgrade.req.last_byte_ns = None
                        upgrade.req.response_bytes = None
                        upgrade.final = False
                        upgrade.ended = {"client"}  # the HTTP/1.1 request was the whole of it
                    else:
                        continue
                req = r.req
                if len(r.ended) == 2:
                    continue  # a closed stream: late frames (RST_STREAM) are not its own
                if end_stream or ftype == H2_RST_STREAM:
                    r.ended.update(("client", "server") if ftype == H2_RST_STREAM else (side,))
                if side == "client":
                    if ftype == H2_DATA:
                        req.request_bytes = (req.request_bytes or 0) + _h2_payload(node)
                    if end_stream:
                        req.end_ns = p.ts
                elif ftype == H2_HEADERS:
                    if req.first_byte_ns is None:
                        pos = self.position(p, m, None)
                        req.first_byte_ns = pos.pkt.ts
                        r.frames["response"] = pos.pkt.frame
                        r.frames["response_how"] = pos.how
                    status = to_int(find_first(node, "http2.headers.status"))
                    if status is not None and not r.final:
                        req.status = status
                        r.final = final_status(status)
                        ctype = _h2_header(node, "content-type")
                        if ctype is not None:
                            req.content_type = ctype
                            if ctype.split(";")[0].strip().lower() == "text/event-stream":
                                r.sse = bytearray()
                elif ftype == H2_DATA:
                    payload = _h2_payload(node)
                    req.response_bytes = (req.response_bytes or 0) + payload
                    if req.chunks is None:
                        req.chunks = 0
                    if r.sse is not None:
                        _sse_feed(r, node, p.ts)
                    elif payload:
                        req.chunks += 1
                        r.event_times.append(p.ts)
                if ftype == H2_RST_STREAM and req.reset is None:
                    code = to_int(find_first(node, "http2.rst_stream.error"))
                    req.reset = H2_ERRORS.get(code or 0, str(code))
                    req.reset_by = side
                if side == "server" and end_stream and req.last_byte_ns is None:
                    req.last_byte_ns = p.ts
                    r.frames["last"] = p.frame
                    if req.response_bytes is None:
                        req.response_bytes = 0
                        req.chunks = 0
        out = []
        for r in streams.values():
            req = r.req
            times = r.event_times
            if r.sse is not None:
                req.sse_events = req.chunks = len(times)
                req.first_event_ns = times[0] if times else None
            if len(times) >= 2:
                req.chunk_gaps_ns = [b - a for a, b in itertools.pairwise(times)]
            if r.kind == "h2":
                out.append(r)
        return out


def _h2_payload(node: Node) -> int:
    length = to_int(node.get("http2.length")) or 0
    pad = to_int(node.get("http2.pad_length")) or 0
    padded = find_first(node, "http2.flags.padded") == "1"
    return max(length - (pad + 1 if padded else 0), 0)


def _h2_header(node: Node, name: str) -> str | None:
    for h in node.all("http2.header"):
        if isinstance(h, Node) and h.get("http2.header.name") == name:
            value = h.get("http2.header.value")
            return str(value) if value is not None else None
    return None


def _sse_feed(r: _Req, node: Node, ts: int) -> None:
    """Count the server-sent events completed by this DATA frame."""
    data = node.get("http2.data.data")
    size = _h2_payload(node)
    if not isinstance(data, str) or r.sse is None or not size:
        return  # (an empty END_STREAM frame shows the whole reassembled body)
    r.sse += bytes.fromhex(data.replace(":", ""))[:size]
    buf = bytes(r.sse).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    while True:
        end = buf.find(b"\n\n")
        if end < 0:
            break
        if buf[:end].strip(b"\n"):
            r.event_times.append(ts)
        buf = buf[end + 2:]
    r.sse = bytearray(buf)


# ----------------------------------------------------------------------------- document


@contextlib.contextmanager
def _inputs(paths: Sequence[str], keylogs: Sequence[str], exe: str
            ) -> Iterator[tuple[str, str | None]]:
    """One capture file and one key log file for tshark (merged copies when several)."""
    for p in [*paths, *keylogs]:
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such file")
    with tempfile.TemporaryDirectory(prefix="netdiag-tshark-") as tmp:
        capture = paths[0]
        if len(paths) > 1:
            mergecap = shutil.which("mergecap") or os.path.join(os.path.dirname(exe),
                                                                "mergecap")
            if not os.path.exists(mergecap):
                raise InputError("several captures need mergecap (Wireshark's) to be "
                                 "merged for tshark")
            capture = os.path.join(tmp, "merged.pcapng")
            proc = subprocess.run([mergecap, "-w", capture, *paths], capture_output=True,
                                  text=True, check=False)
            if proc.returncode != 0:
                raise InputError(f"mergecap failed: {proc.stderr.strip()}")
        keylog: str | None = keylogs[0] if keylogs else None
        if len(keylogs) > 1:
            keylog = os.path.join(tmp, "keys.log")
            with open(keylog, "w", encoding="utf-8") as out:
                for k in keylogs:
                    with open(k, encoding="utf-8", errors="replace") as f:
                        out.write(f.read().rstrip("\n") + "\n")
        yield capture, keylog


@dataclass
class TsharkAnalysis:
    """What one tshark run yields: the contract document, the records it was built from
    (for :func:`netdiag.paths.apply.apply_paths`), and the capture time of every frame
    (for finding the frames another engine's timestamps point at)."""

    document: dict[str, Any]
    """The contract document (``engine`` and ``frames`` added, no paths yet)."""
    connections: list[Connection]
    """The records ``connections[]`` was written from (what ``CollectingSink`` holds)."""
    dns_records: list[DnsTransaction]
    frame_times: dict[int, list[int]]
    """Capture time in ns -> the frame numbers captured at that time."""
    result: Any
    """A :class:`netdiag.pipeline.Result` (capture facts, summary, findings), so that
    every formatter of ``netdiag report`` (the terminal one too) takes this engine's
    output as it takes ``analyze``'s."""


def tshark_document(paths: list[str], keylog_path: str | Sequence[str] | None = None, *,
                    dns_ports: frozenset[int] = DEFAULT_DNS_PORTS,
                    thresholds: Thresholds | None = None,
                    extra_args: Sequence[str] = (),
                    tshark: str | None = None,
                    attribute_paths: bool = False,
                    profile: Any = None) -> dict[str, Any]:
    """The contract document of ``paths`` (merged by time) as tshark dissects them.

    ``keylog_path``: an NSS key log (or several, merged) passed to tshark as
    ``tls.keylog_file``. ``dns_ports``: ports decoded as DNS (``-d udp.port==N,dns``
    and ``tcp.port==N,dns`` for the ones besides 53). ``thresholds``: for the findings.
    ``extra_args``: more tshark options (e.g. ``["-d", "tcp.port==8443,tls"]``).
    ``tshark``: the binary (default: pyshark's choice, then ``$PATH``).
    ``attribute_paths``: fill ``connections[].path``, ``summary.paths`` and the path
    findings as ``netdiag report`` does (:func:`netdiag.paths.apply.apply_paths`, with
    ``profile`` - a loaded ``Profile`` - or inferred paths when it is None).

    Raises :class:`~netdiag.engines.tsjson.TsharkMissing` (an ``InputError``) when tshark
    is not installed and ``InputError`` when it cannot read the capture or a key log is
    missing. The document adds ``engine`` (name, tshark version, command) and ``frames``
    (tshark frame numbers) next to the figures. ``capture.truncated`` is true for a
    capture cut short (the caller exits 3, as for netdiag's engine).
    """
    analysis = tshark_analysis(paths, keylog_path, dns_ports=dns_ports,
                               thresholds=thresholds, extra_args=extra_args, tshark=tshark)
    doc = analysis.document
    if attribute_paths or profile is not None:
        from netdiag.paths.apply import apply_paths

        apply_paths(doc, analysis.connections, analysis.dns_records, profile,
                    thresholds or Thresholds())
    return doc


def tshark_analysis(paths: list[str], keylog_path: str | Sequence[str] | None = None, *,
                    dns_ports: frozenset[int] = DEFAULT_DNS_PORTS,
                    thresholds: Thresholds | None = None,
                    extra_args: Sequence[str] = (),
                    tshark: str | None = None) -> TsharkAnalysis:
    """:func:`tshark_document` (without paths), with the records and frame times kept."""
    exe = require_tshark(tshark)
    keylogs = [keylog_path] if isinstance(keylog_path, str) else list(keylog_path or [])
    thresholds = thresholds or Thresholds()
    with _inputs(list(paths), keylogs, exe) as (capture, keylog):
        prefs = {"tcp.reassemble_out_of_order": "TRUE"}
        if keylog is not None:
            prefs["tls.keylog_file"] = keylog
        decode = dns_decode_rules(dns_ports)
        run = TsharkRun(exe, capture, prefs=prefs, decode_as=decode, extra_args=extra_args)
        pkts = [p for p in map(_packet, run) if p is not None]
    command = [("tls.keylog_file:KEYLOG" if keylog and a == f"tls.keylog_file:{keylog}"
                else a) for a in run.command]
    if len(paths) > 1:
        command[command.index("-r") + 1] = "MERGED"
    doc, conns, dns_records, result = _document(
        list(paths), pkts, run, dns_ports, thresholds,
        {"name": "tshark", "tshark_version": tshark_version(exe), "command": command})
    times: dict[int, list[int]] = {}
    for p in pkts:
        times.setdefault(p.ts, []).append(p.frame)
    return TsharkAnalysis(doc, conns, dns_records, times, result)


def _document(paths: list[str], pkts: list[_Pkt], run: TsharkRun, dns_ports: frozenset[int],
              thresholds: Thresholds, engine: dict[str, Any]
              ) -> tuple[dict[str, Any], list[Connection], list[DnsTransaction], Any]:
    summary = SummaryBuilder()
    dns_records = _dns(pkts, dns_ports)
    for t in dns_records:
        summary.add_dns(t)
    streams: dict[int, list[_Pkt]] = {}
    for p in pkts:
        if p.transport == "tcp" and p.stream is not None and p.src is not None \
                and not p.icmp:
            streams.setdefault(p.stream, []).append(p)
    conns: list[tuple[Connection, dict[str, Any], list[dict[str, Any]]]] = []
    for n, (number, spkts) in enumerate(sorted(streams.items(),
                                               key=lambda kv: kv[1][0].frame), start=1):
        st = _Stream(number, spkts)
        conn, frames = _connection(f"C{n}", st, dns_ports)
        if st.tls:
            info, tls_frames = _tls(st)
            conn.tls = info
            frames.update(tls_frames)
            if info is not None and conn.protocol is None:
                conn.protocol = info.alpn or "tls"
        reqs: list[_Req] = []
        if any(p.msgs for p in spkts):
            reqs = _Http(st).requests()
            conn.requests = [r.req for r in reqs]
            if reqs and conn.protocol in (None, "tls"):
                conn.protocol = reqs[0].req.protocol
            elif not reqs and any(p.magic for p in spkts) and conn.protocol is None:
                conn.protocol = "h2c"
        summary.add_connection(conn)
        conns.append((conn, frames, [r.frames for r in reqs]))
    first = min((p.ts for p in pkts), default=None)
    last = max((p.ts for p in pkts), default=None)
    links: list[str] = []
    for p in pkts:
        name = WTAP_LINK_TYPES.get(p.encap or -1, f"WTAP_ENCAP_{p.encap}")
        if name not in links:
            links.append(name)
    warnings: list[Warning_] = []
    if run.truncated:
        line = next((s for s in run.stderr.splitlines() if s.strip()), "cut short")
        warnings.append(Warning_("capture", f"{paths[-1]}: tshark: {line.strip()} (after "
                                            f"packet {len(pkts)})", paths[-1], None,
                                 len(pkts) + 1))
    from netdiag.result import CaptureFacts, Result

    facts = CaptureFacts(files=paths, packets=len(pkts), bytes=sum(p.cap_len for p in pkts),
                         first_ns=first, last_ns=last, link_types=links,
                         truncated=run.truncated, warnings=warnings,
                         undecoded=sum(1 for p in pkts if not p.has_ip))
    findings = build_findings(summary, thresholds, run.truncated)
    result = Result(facts, summary, findings, thresholds)
    dns_json = []
    for t in dns_records:
        j = t.to_json()
        j["frames"] = {"query": t.query_packet, "response": t.response_packet}
        dns_json.append(j)
    conn_json = []
    for conn, frames, req_frames in conns:
        j = conn.to_json()
        j["frames"] = frames
        for rj, rf in zip(j["requests"], req_frames, strict=True):
            rj["frames"] = rf
        conn_json.append(j)
    doc = {
        "contract": CONTRACT_VERSION,
        "netdiag_version": __version__,
        "engine": engine,
        "capture": facts.to_json(),
        "summary": summary.build(),
        "dns": dns_json,
        "connections": conn_json,
        "findings": [f.to_json() for f in findings],
    }
    return doc, [c for c, _, _ in conns], dns_records, result

