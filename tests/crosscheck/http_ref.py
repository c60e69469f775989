"""HTTP reference figures from tshark, and their comparison with netdiag's requests.

tshark (with the capture's key log, ``-o tls.keylog_file:KEYS``) decodes the HTTP/1.x
messages and HTTP/2 frames; this module finds, for each of them, the packet carrying
its *first byte* (CONTRACT.md times every message that way, while tshark reports a
message at the packet that *completes* it), and derives per TCP connection:

* the request count: the HTTP/2 streams on which the client sent a HEADERS frame
  (``http2.type == 1``, distinct ``http2.streamid``) plus the HTTP/1.x requests
  (``http.request``). An ``Upgrade: h2c`` request is one HTTP/1.x request whose
  response is stream 1 of the HTTP/2 connection: it is counted once;
* per request, the reference TTFB:

  - HTTP/2: first byte of the server's first HEADERS frame on (``tcp.stream``,
    ``http2.streamid``) minus first byte of the client's first HEADERS frame;
  - HTTP/1.x: first byte of the first response tshark pairs with the request
    (``http.request_in``; an interim ``1xx`` counts, as it does for netdiag and as an
    interim HEADERS frame does in HTTP/2) minus the request's first byte. When tshark
    emits no response (one that ends at the connection's close may never be emitted,
    TSHARK.md), the first server payload after the request is used instead;
  - an ``Upgrade: h2c`` request: its HTTP/1.x request bytes to the first byte of the
    ``101 Switching Protocols`` (the first response byte; CONTRACT.md does not single
    out upgrades, netdiag times them that way). The HTTP/2 HEADERS of stream 1 is
    shown alongside.

Where the first byte is (``_Position``):

1. a packet without reassembly (no ``tcp.segments``, no ``tls.segments``): every
   message it reports starts in it - exact;
2. cleartext with ``tcp.segments``: the first message of the packet is the reassembled
   PDU, which starts in the first listed segment; later messages start in the packet
   itself - exact;
3. TLS with ``tcp.segments`` (one record completed from several segments) and no
   ``tls.segments``: messages decoded from the records after the reassembled one (a
   second ``tls`` layer) start in the packet - exact;
4. otherwise, HTTP/1.x over TLS: the message is taken to start at the beginning of the
   plaintext of the first application-data record (decrypted content type 23) of its
   direction completed after the previous message of that direction - true of
   HTTP/1.x unless pipelined responses share a record. The record's position comes
   from framing the TLS records of the reassembled TCP byte stream (``tcp.payload``,
   first transmission of each byte; :class:`netdiag.engines.tsstream.Direction`, the
   tshark engine's), checked record by record against tshark's
   ``tls.record.length`` list; its plaintext starts after the 5-byte header and the
   explicit nonce of the cipher suite (8 bytes for TLS 1.2 AES-GCM/CCM, none for
   ChaCha20-Poly1305 and TLS 1.3);
5. otherwise (an HTTP/2 frame in a record spanning several packets, or in several
   records): not placed; the request is left out of the TTFB comparison with that
   reason (counted as excluded).

tshark decodes the h2c captures on port 8080 without any ``-d`` option (8080 is in
the HTTP dissector's default ports) and follows the ``Upgrade: h2c``.

tshark is run, and its JSON read, by the engine's plumbing (tshark_ref.py's
:func:`~tshark_ref.tshark_layers`); the placing rules above, the cipher suites' nonces
and the request pairing are this module's own, not the engine's (whose rules differ:
it places an HTTP/2 frame inside a reassembled record, rule 5 here), so the comparison
checks netdiag's analyzers against a reference derived apart from both.

Run as a script to print the references: ``python tests/crosscheck/http_ref.py [NAME...]``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_ref import Item, Skip, Tally, _conn_key, _fmt
from tshark_ref import (
    CaptureSpec,
    endpoint,
    project_captures,
    thirdparty_captures,
    tshark_layers,
    tshark_path,
)

from netdiag.engines.tshark import final_status as _final
from netdiag.engines.tsjson import (
    Node,
    find_first,
    hex_bytes,
    http2_frames,
    nodes_with,
    segment_frames,
    to_int,
)
from netdiag.engines.tsstream import Direction, Record

TOLERANCE_MS = Decimal("0.05")
"""Largest accepted difference between netdiag's and tshark's TTFB (and request ts)."""
HTTP_JSON_PROTOCOLS = "frame ip ipv6 tcp tcp.segments tls tls.segments http http2"
HTTP_THIRDPARTY = (
    "cryptohack_tls3_h2.pcapng",
    "hotplace_http1_tls13.pcapng",
    "zeek_tls12_stream_keylog.pcap",
    "scapy_http2_h2c.pcap",
    "suricata_http2_range_h2c.pcap",
    "zeek_http_pipelined.pcap",
    "zeek_http_vlan.pcap",
)
"""The third-party captures that carry HTTP (MANIFEST.tsv); the others carry none
(``test_no_http_elsewhere`` checks it)."""
H2_HEADERS = 1
AEAD_NONCE_12 = {
    # TLS 1.2 AES-GCM (RFC 5288, 5289) and AES-CCM (RFC 6655, 7251): 8-byte explicit nonce
    **{s: 8 for s in range(0x009C, 0x00A8)},
    **{s: 8 for s in range(0xC02B, 0xC033)},
    **{s: 8 for s in range(0xC09C, 0xC0B0)},
    # ChaCha20-Poly1305 (RFC 7905): none
    **{s: 0 for s in range(0xCCA8, 0xCCAF)},
}


def http_captures() -> list[CaptureSpec]:
    """The third-party captures with HTTP (those present), then the project's own."""
    return [s for s in thirdparty_captures() if s.name in HTTP_THIRDPARTY] + project_captures()


def other_thirdparty_captures() -> list[CaptureSpec]:
    return [s for s in thirdparty_captures() if s.name not in HTTP_THIRDPARTY]


# ----------------------------------------------------------------------------- tshark


def run_tshark_http(spec: CaptureSpec) -> list[Node]:
    """The packets' ``layers`` of one tshark run (same options as tshark_ref.py)."""
    return tshark_layers(spec.path, spec.keylog, spec.extra_opts, HTTP_JSON_PROTOCOLS)[0]


def _ms(seconds: Decimal) -> Decimal:
    return seconds * 1000


@dataclass
class _Msg:
    """One HTTP/1.x message or HTTP/2 frame as tshark reports it in a packet."""

    kind: str
    """``http`` or ``http2``."""
    node: Node
    tls_layer: int
    """How many ``tls`` layers precede it in the packet (0: cleartext)."""
    first: bool
    """The packet's first HTTP/1.x message or HTTP/2 frame."""


@dataclass
class _Pkt:
    frame: int
    ts: Decimal
    stream: int
    src: str
    dst: str
    seq: int | None
    payload: bytes
    syn: bool
    ack: bool
    tcp_segments: list[int]
    tls_segments: list[int]
    records: list[Node]
    """tshark's ``tls.record`` nodes (those with a ``tls.record.length``), in order."""
    msgs: list[_Msg]
    magic: bool
    """Carries the HTTP/2 client preface."""
    server_hello: tuple[int | None, str | None] | None = None
    """``(cipher suite, version)`` of a ServerHello in the packet."""


def _tcp_packet(layers: Node) -> _Pkt | None:
    frame_l = layers.get("frame")
    tcp = layers.get("tcp")
    if not isinstance(frame_l, Node) or not isinstance(tcp, Node):
        return None
    number = to_int(frame_l.get("frame.number"))
    epoch = frame_l.get("frame.time_epoch")
    stream = to_int(tcp.get("tcp.stream"))
    if number is None or epoch is None or stream is None:
        return None
    src = dst = None
    for key in ("ip", "ipv6"):
        node = layers.get(key)
        if isinstance(node, Node):
            src, dst = node.get(f"{key}.src"), node.get(f"{key}.dst")
            break
    sport, dport = to_int(tcp.get("tcp.srcport")), to_int(tcp.get("tcp.dstport"))
    if src is None or dst is None or sport is None or dport is None:
        return None
    payload = hex_bytes(tcp.get("tcp.payload"))
    pkt = _Pkt(number, Decimal(epoch), stream, endpoint(src, sport), endpoint(dst, dport),
               to_int(tcp.get("tcp.seq")), payload,
               find_first(tcp, "tcp.flags.syn") == "1", find_first(tcp, "tcp.flags.ack") == "1",
               [], [], [], [], False)
    tls_layers = 0
    for key, value in layers:
        if key == "tcp.segments":
            pkt.tcp_segments = segment_frames(value, "tcp")
        elif key == "tls.segments":
            pkt.tls_segments = segment_frames(value, "tls")
        elif key == "tls" and isinstance(value, Node):
            tls_layers += 1
            pkt.records += _records(value)
            for hs in nodes_with(value, "tls.handshake.type"):
                if hs.get("tls.handshake.type") != "2":
                    continue
                pkt.server_hello = (
                    to_int(hs.get("tls.handshake.ciphersuite")),
                    find_first(hs, "tls.handshake.extensions.supported_version")
                    or hs.get("tls.handshake.version"))
        elif key == "http" and isinstance(value, Node):
            pkt.msgs.append(_Msg("http", value, tls_layers, not pkt.msgs))
        elif key == "http2" and isinstance(value, Node):
            magic, frames = http2_frames(value)
            pkt.magic = pkt.magic or magic
            for fnode in frames:
                pkt.msgs.append(_Msg("http2", fnode, tls_layers, not pkt.msgs))
    return pkt


def _records(tls: Node) -> Iterator[Node]:
    """Each record of a ``tls`` layer that has a length."""
    for key, value in tls:
        if key == "tls.record" and isinstance(value, Node) \
                and to_int(value.get("tls.record.length")) is not None:
            yield value


# ----------------------------------------------------------------------------- positions


@dataclass
class _Position:
    """The packet carrying a message's first byte, and how that was established."""

    frame: int
    ts: Decimal
    how: str


# ----------------------------------------------------------------------------- references


@dataclass
class RequestRef:
    """One request as tshark sees it, with the first-byte packets of the request and of
    its response."""

    tcp_stream: int
    kind: str
    """``h2`` (a client HEADERS frame), ``http1`` or ``upgrade`` (HTTP/1.1 ``Upgrade: h2c``)."""
    stream_id: int | None
    method: str | None
    path: str | None
    authority: str | None
    request_frame: int
    """Frame where tshark reports the request (HEADERS frame / HTTP/1.x request)."""
    request: _Position | None = None
    status: int | None = None
    response_frame: int | None = None
    response: _Position | None = None
    h2_response: _Position | None = None
    """``upgrade`` only: the first server HEADERS frame of stream 1."""
    why_not: str | None = None
    """Why there is no reference TTFB."""

    @property
    def ttfb_ms(self) -> Decimal | None:
        if self.request is None or self.response is None:
            return None
        return _ms(self.response.ts - self.request.ts)

    def describe(self) -> str:
        sid = f" stream {self.stream_id}" if self.stream_id is not None else ""
        return (f"{self.kind}{sid} {self.method} {self.path} (tcp.stream {self.tcp_stream}, "
                f"tshark request frame {self.request_frame}, response frame "
                f"{self.response_frame})")

    def timing(self) -> str:
        if self.request is None or self.response is None:
            return f"no reference: {self.why_not}"
        return (f"request first byte frame {self.request.frame} [{self.request.how}] -> "
                f"response first byte frame {self.response.frame} [{self.response.how}] "
                f"= {_fmt(self.ttfb_ms)} ms")


@dataclass
class StreamRef:
    """One ``tcp.stream`` with its requests."""

    tcp_stream: int
    client: str | None
    server: str | None
    first_ts: Decimal
    first_frame: int
    tls: bool
    requests: list[RequestRef] = field(default_factory=list)

    @property
    def h2_streams(self) -> int:
        return sum(1 for r in self.requests if r.kind == "h2")

    @property
    def http1_requests(self) -> int:
        return sum(1 for r in self.requests if r.kind != "h2")

    def describe(self) -> str:
        return (f"tcp.stream {self.tcp_stream} {self.client} -> {self.server} "
                f"(first frame {self.first_frame})")


@dataclass
class HttpReference:
    spec: CaptureSpec
    streams: list[StreamRef]
    frames: int

    @property
    def requests(self) -> list[RequestRef]:
        return [r for s in self.streams for r in s.requests]


def _content_type(rec: Record) -> int | None:
    """The decrypted content type tshark gives a framed record."""
    return to_int(rec.node.get("tls.record.content_type")) if rec.node is not None else None


class _StreamBuilder:
    """Everything about one ``tcp.stream``."""

    def __init__(self, pkts: list[_Pkt]) -> None:
        self.pkts = pkts
        self.number = pkts[0].stream
        self.client, self.server = self._endpoints()
        self.tls = any(p.records for p in pkts)
        self.nonce: int | None = None
        self.nonce_why = "no ServerHello captured"
        for p in pkts:
            if p.server_hello is not None:
                suite, version = p.server_hello
                if version == "0x0304":
                    self.nonce, self.nonce_why = 0, ""
                elif suite in AEAD_NONCE_12:
                    self.nonce, self.nonce_why = AEAD_NONCE_12[suite], ""
                else:
                    self.nonce = None
                    self.nonce_why = (f"cipher suite {suite and hex(suite)} is not a known "
                                      f"AEAD suite")
        self.dirs: dict[str, Direction] = {}

    def _endpoints(self) -> tuple[str | None, str | None]:
        for p in self.pkts:
            if p.syn and not p.ack:
                return p.src, p.dst
        for p in self.pkts:
            if p.magic or any(m.kind == "http" and m.node.get("http.request") is not None
                              for m in p.msgs):
                return p.src, p.dst
            if any(m.kind == "http" and m.node.get("http.response") is not None
                   for m in p.msgs):
                return p.dst, p.src
        return None, None

    def direction(self, src: str) -> Direction:
        if src not in self.dirs:
            syn = any(p.syn for p in self.pkts if p.src == src)
            self.dirs[src] = Direction([p for p in self.pkts if p.src == src], syn)
        return self.dirs[src]

    # first-byte positions -------------------------------------------------------------

    def exact(self, pkt: _Pkt, msg: _Msg) -> _Position | None:
        """Rules 1-3 of the module docstring."""
        if not pkt.tcp_segments and not pkt.tls_segments:
            return _Position(pkt.frame, pkt.ts, f"reported in frame {pkt.frame}, "
                                                f"no reassembly")
        if pkt.tls_segments:
            return None
        if msg.tls_layer == 0:  # cleartext
            if msg.first:
                seg = pkt.tcp_segments[0]
                first = self.frame(seg)
                if first is None:
                    return None
                return _Position(first.frame, first.ts,
                                 f"first of tcp.segments {pkt.tcp_segments}")
            return _Position(pkt.frame, pkt.ts, f"reported in frame {pkt.frame} after its "
                                                f"reassembled PDU")
        if msg.tls_layer >= 2:
            return _Position(pkt.frame, pkt.ts, f"reported in frame {pkt.frame}, in a TLS "
                                                f"record after the reassembled one")
        return None

    def frame(self, number: int) -> _Pkt | None:
        for p in self.pkts:
            if p.frame == number:
                return p
        return None

    def record_start(self, src: str, after_frame: int | None,
                     until_frame: int | None) -> tuple[_Position | None, str]:
        """Rule 4: first byte of the plaintext of the first application-data record of
        ``src`` completed after ``after_frame`` (and not after ``until_frame``)."""
        if self.nonce is None:
            return None, self.nonce_why
        d = self.direction(src)
        recs = d.records()
        if recs is None:
            return None, d.records_why or "TLS records not framed"
        for rec in recs:
            if _content_type(rec) != 23:
                continue
            if after_frame is not None and rec.done.frame <= after_frame:
                continue
            if until_frame is not None and rec.done.frame > until_frame:
                break
            offset = rec.start + 5 + self.nonce
            p = d.packet_at(offset)
            if p is None:
                return None, f"stream offset {offset - d.base} not captured"
            return _Position(p.frame, p.ts,
                             f"plaintext start of the TLS record at stream offset "
                             f"{rec.start - d.base} (completed in frame {rec.done.frame})"), ""
        return None, "no application-data record found"

    def position(self, pkt: _Pkt, msg: _Msg, prev_frame: int | None,
                 http1: bool) -> tuple[_Position | None, str]:
        pos = self.exact(pkt, msg)
        if pos is not None:
            return pos, ""
        if msg.tls_layer == 0:
            return None, f"cleartext reassembly in frame {pkt.frame} not understood"
        if not http1:
            return None, (f"HTTP/2 frame completed in frame {pkt.frame} whose TLS record(s) "
                          f"began in earlier packets (tcp.segments {pkt.tcp_segments}, "
                          f"tls.segments {pkt.tls_segments}): the packet of its first byte "
                          f"is not placed")
        return self.record_start(pkt.src, prev_frame, pkt.frame)

    def first_payload_after(self, src: str, after: int) -> _Position | None:
        """The first packet from ``src`` after frame ``after`` with payload (cleartext)
        or with the plaintext start of an application-data record (TLS)."""
        if not self.tls:
            for p in self.pkts:
                if p.src == src and p.frame > after and p.payload:
                    return _Position(p.frame, p.ts, "first server payload after the request")
            return None
        d = self.direction(src)
        if self.nonce is None:
            return None
        for rec in d.records() or []:
            if _content_type(rec) != 23:
                continue
            p = d.packet_at(rec.start + 5 + self.nonce)
            if p is not None and p.frame > after:
                return _Position(p.frame, p.ts, "plaintext start of the first server "
                                                "application-data record after the request")
        return None

    # requests ---------------------------------------------------------------------------

    def build(self) -> StreamRef:
        first = self.pkts[0]
        ref = StreamRef(self.number, self.client, self.server, first.ts, first.frame, self.tls)
        if self.client is None:
            return ref
        self._http1(ref)
        self._http2(ref)
        ref.requests.sort(key=lambda r: (r.request_frame, r.stream_id or 0))
        return ref

    def _http1(self, ref: StreamRef) -> None:
        by_frame: dict[int, list[RequestRef]] = {}
        requests: list[RequestRef] = []
        prev: dict[str, int | None] = {"req": None, "resp": None}
        for p in self.pkts:
            for m in p.msgs:
                if m.kind != "http":
                    continue
                if m.node.get("http.request") is not None and p.src == self.client:
                    req = RequestRef(self.number, "http1", None,
                                     find_first(m.node, "http.request.method"),
                                     find_first(m.node, "http.request.uri"),
                                     find_first(m.node, "http.host"), p.frame)
                    req.request, why = self.position(p, m, prev["req"], True)
                    if req.request is None:
                        req.why_not = f"request: {why}"
                    prev["req"] = p.frame
                    requests.append(req)
                    by_frame.setdefault(p.frame, []).append(req)
                elif m.node.get("http.response") is not None and p.src == self.server:
                    pos, why = self.position(p, m, prev["resp"], True)
                    prev["resp"] = p.frame
                    req_in = to_int(find_first(m.node, "http.request_in"))
                    cands = by_frame.get(req_in or -1, [])
                    if not cands:
                        continue
                    # one request per frame unless pipelined in one packet: the first
                    # without a final response
                    req = next((r for r in cands if not _final(r.status)), cands[-1])
                    code = to_int(find_first(m.node, "http.response.code"))
                    if req.response_frame is None:  # the first response, interim or not
                        req.response_frame = p.frame
                        req.response = pos
                        if pos is None:
                            req.why_not = f"response: {why}"
                    if not _final(req.status):
                        req.status = code
        for req in requests:
            if req.response_frame is None and req.request is not None:
                req.response = self.first_payload_after(self.server or "", req.request.frame)
                if req.response is None:
                    req.why_not = "no response captured"
        ref.requests += requests

    def _http2(self, ref: StreamRef) -> None:
        client: dict[int, tuple[_Pkt, _Msg]] = {}
        server: dict[int, tuple[_Pkt, _Msg]] = {}
        status: dict[int, int | None] = {}
        for p in self.pkts:
            for m in p.msgs:
                if m.kind != "http2" or to_int(m.node.get("http2.type")) != H2_HEADERS:
                    continue
                sid = to_int(m.node.get("http2.streamid"))
                if sid is None:
                    continue
                side = client if p.src == self.client else server
                side.setdefault(sid, (p, m))
                if side is server and not _final(status.get(sid)):
                    # the final status (an interim 1xx HEADERS comes first)
                    status[sid] = to_int(find_first(m.node, "http2.headers.status"))
        upgrade = next((r for r in ref.requests if r.kind == "http1" and r.status == 101), None)
        if upgrade is not None and 1 in server and 1 not in client:
            upgrade.kind, upgrade.stream_id = "upgrade", 1
            upgrade.status = status.get(1)
            p, m = server[1]
            upgrade.h2_response, _ = self.position(p, m, None, False)
        for sid in sorted(client):
            p, m = client[sid]
            req = RequestRef(self.number, "h2", sid, find_first(m.node, "http2.headers.method"),
                             find_first(m.node, "http2.headers.path"),
                             find_first(m.node, "http2.headers.authority"), p.frame)
            req.request, why = self.position(p, m, None, False)
            if req.request is None:
                req.why_not = f"request HEADERS: {why}"
            if sid in server:
                sp, sm = server[sid]
                req.response_frame = sp.frame
                req.status = status.get(sid)
                req.response, why = self.position(sp, sm, None, False)
                if req.response is None:
                    req.why_not = f"response HEADERS: {why}"
            elif req.why_not is None:
                req.why_not = "no response HEADERS captured"
            ref.requests.append(req)


@functools.cache
def http_reference(spec: CaptureSpec) -> HttpReference:
    """tshark's HTTP reference for one capture (cached)."""
    layers = run_tshark_http(spec)
    pkts = [p for p in map(_tcp_packet, layers) if p is not None]
    by_stream: dict[int, list[_Pkt]] = {}
    for p in pkts:
        by_stream.setdefault(p.stream, []).append(p)
    streams = [_StreamBuilder(v).build() for _, v in sorted(by_stream.items())]
    return HttpReference(spec, streams, len(layers))


# ----------------------------------------------------------------------------- netdiag


@functools.cache
def netdiag_http_document(spec: CaptureSpec) -> dict[str, Any]:
    """netdiag's contract document for one capture, with its key log (cached)."""
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    keylog = KeyLog.from_file(str(spec.keylog)) if spec.keylog is not None else None
    sink = CollectingSink()
    result = analyze([str(spec.path)], sink, Options(keylog=keylog))
    return sink.document(result)


# ----------------------------------------------------------------------------- comparison


HttpItem = Item
"""One comparison: ``kind`` ``count`` (one per connection) or ``ttfb`` (one per request)."""
HttpSkip = Skip


@dataclass
class HttpOutcome(Tally):
    spec: CaptureSpec
    ref: HttpReference
    doc: dict[str, Any]
    items: list[HttpItem] = field(default_factory=list)
    skips: list[HttpSkip] = field(default_factory=list)


def _close(got: Any, want: Decimal) -> bool:
    return (isinstance(got, int | float) and not isinstance(got, bool)
            and abs(Decimal(repr(got)) - want) <= TOLERANCE_MS)


def _diff(got: Any, want: Decimal) -> str:
    if not isinstance(got, int | float) or isinstance(got, bool):
        return ""
    return f" (diff {float(Decimal(repr(got)) - want):+.6f} ms)"


def _take_connection(pool: list[dict[str, Any]], s: StreamRef) -> dict[str, Any] | None:
    cands = [c for c in pool if _conn_key(c) == (s.client, s.server)]
    if not cands:
        return None

    def dist(c: dict[str, Any]) -> float:
        ts = c.get("ts")
        return abs(float(s.first_ts) - ts) if isinstance(ts, int | float) else float("inf")

    best = min(cands, key=dist)
    pool.remove(best)
    return best


def _compare_request(out: HttpOutcome, ref: RequestRef, rec: dict[str, Any] | None,
                     conn_id: str) -> None:
    desc = ref.describe()
    if rec is None:
        out.items.append(HttpItem("ttfb", desc, [f"netdiag {conn_id} has no matching request"]))
        return
    ttfb = ref.ttfb_ms
    if ttfb is None:
        out.skips.append(HttpSkip("ttfb", f"{desc} = netdiag {conn_id}", ref.timing()))
        return
    item = HttpItem("ttfb", f"{desc} = netdiag {conn_id} stream_id={rec.get('stream_id')} "
                            f"ts={rec.get('ts')}")
    got = rec.get("ttfb_ms")
    item.compared.append(f"ttfb_ms netdiag {_fmt(got)} vs tshark {_fmt(ttfb)} "
                         f"[{ref.timing()}]")
    if not _close(got, ttfb):
        item.problems.append(f"ttfb_ms: netdiag {_fmt(got)} vs tshark {_fmt(ttfb)}"
                             f"{_diff(got, ttfb)} [{ref.timing()}]")
        if ref.h2_response is not None and ref.request is not None:
            alt = _ms(ref.h2_response.ts - ref.request.ts)
            item.problems.append(f"(to stream 1's HTTP/2 HEADERS, frame "
                                 f"{ref.h2_response.frame}, it would be {_fmt(alt)} ms)")
    assert ref.request is not None
    ts = rec.get("ts")
    if not _close(ts * 1000 if isinstance(ts, int | float) else ts, ref.request.ts * 1000):
        item.problems.append(f"ts: netdiag {ts!r} vs tshark first request byte "
                             f"{_fmt(ref.request.ts)} (frame {ref.request.frame}, "
                             f"{ref.request.how})")
    expected = {"method": ref.method, "path": ref.path, "authority": ref.authority,
                "status": ref.status}
    for name, want in expected.items():
        if want is None:
            continue
        got_v = rec.get(name)
        item.compared.append(f"{name} {got_v!r}")
        if got_v != want:
            item.problems.append(f"{name}: netdiag {got_v!r} vs tshark {want!r}")
    if rec.get("estimated") is not False:
        item.problems.append(f"estimated: netdiag {rec.get('estimated')!r} although tshark "
                             f"decoded the request")
    out.items.append(item)


def _compare_stream(out: HttpOutcome, s: StreamRef, conn: dict[str, Any]) -> None:
    cid = str(conn.get("id"))
    reqs = [r for r in conn.get("requests") or [] if isinstance(r, dict)]
    want = len(s.requests)
    item = HttpItem("count", f"{s.describe()} = netdiag {cid}")
    item.compared.append(f"requests netdiag {len(reqs)} vs tshark {want} "
                         f"({s.h2_streams} HTTP/2 streams with a client HEADERS + "
                         f"{s.http1_requests} HTTP/1.x requests)")
    if len(reqs) != want:
        nd = ", ".join(f"{r.get('protocol')} sid={r.get('stream_id')} {r.get('method')} "
                       f"{r.get('path')}{' (estimated)' if r.get('estimated') else ''}"
                       for r in reqs)
        th = ", ".join(f"{r.kind} sid={r.stream_id} {r.method} {r.path} "
                       f"(frame {r.request_frame})" for r in s.requests)
        tls = conn.get("tls") if isinstance(conn.get("tls"), dict) else {}
        why = (" (netdiag decrypted the connection, tls.decrypted=true, yet estimated "
               "requests from its records)"
               if tls.get("decrypted") is True and any(r.get("estimated") for r in reqs)
               else "")
        item.problems.append(f"request count: netdiag {len(reqs)} [{nd}] vs tshark {want} "
                             f"[{th}]{why}")
    out.items.append(item)
    by_sid = {r.get("stream_id"): r for r in reqs if r.get("stream_id") is not None}
    h1 = sorted((r for r in reqs if r.get("stream_id") is None),
                key=lambda r: r.get("ts") or 0.0)
    h1_refs = [r for r in s.requests if r.stream_id is None]
    for ref in s.requests:
        if ref.stream_id is not None:
            rec = by_sid.get(ref.stream_id)
            if rec is None and ref.kind == "upgrade" and h1:
                rec = h1.pop(0)
        else:
            k = h1_refs.index(ref)
            rec = h1[k] if k < len(h1) else None
        _compare_request(out, ref, rec, cid)


def _only_estimated(conn: dict[str, Any]) -> bool:
    """Every request of ``conn`` is estimated, and netdiag did not decrypt it."""
    tls = conn.get("tls")
    decrypted = isinstance(tls, dict) and tls.get("decrypted") is True
    return not decrypted and all(isinstance(r, dict) and r.get("estimated") is True
                                 for r in conn.get("requests") or [])


@functools.cache
def compare_http(spec: CaptureSpec) -> HttpOutcome:
    """Run tshark and netdiag on one capture and compare their requests (cached)."""
    ref = http_reference(spec)
    doc = netdiag_http_document(spec)
    out = HttpOutcome(spec, ref, doc)
    conns = [c for c in doc.get("connections") or [] if isinstance(c, dict)]
    for c in conns:
        if c.get("protocol") == "resp":
            # Redis commands are requests to netdiag; tshark 4.0 has no RESP dissector.
            out.skips.append(HttpSkip("count", f"netdiag {c.get('id')} -> {c.get('server')}",
                                      "Redis (RESP), not HTTP: tshark does not dissect it"))
        elif c.get("transport") == "udp":
            # tshark's HTTP reference here is TCP's (http, http2); QUIC streams are
            # compared with tshark's quic dissection in test_quic_vs_tshark.py
            out.skips.append(HttpSkip("count", f"netdiag {c.get('id')} -> {c.get('server')}",
                                      "QUIC (HTTP/3): compared in test_quic_vs_tshark.py"))
    conns = [c for c in conns if c.get("protocol") != "resp" and c.get("transport") != "udp"]
    pool = list(conns)
    for s in ref.streams:
        if s.client is None or s.server is None:
            if s.requests:
                out.skips.append(HttpSkip("count", s.describe(), "client side unknown"))
            continue
        conn = _take_connection(pool, s)
        if conn is None:
            if s.requests:
                swapped = [c.get("id") for c in conns if _conn_key(c) == (s.server, s.client)]
                hint = f" (netdiag has {swapped} with client and server swapped)" \
                    if swapped else ""
                out.items.append(HttpItem("count", s.describe(),
                                          [f"netdiag has no connection {s.client} -> "
                                           f"{s.server}{hint}"]))
            continue
        if not s.requests and not conn.get("requests"):
            continue
        if not s.requests and _only_estimated(conn):
            out.skips.append(HttpSkip(
                "count", f"{s.describe()} = netdiag {conn.get('id')}",
                f"netdiag's {len(conn['requests'])} request(s) are estimated from records "
                f"it could not decrypt; tshark sees no HTTP"))
            continue
        _compare_stream(out, s, conn)
    for conn in pool:
        if conn.get("requests"):
            out.items.append(HttpItem(
                "count", f"netdiag {conn.get('id')} {conn.get('client')} -> "
                         f"{conn.get('server')}",
                [f"netdiag has {len(conn['requests'])} requests on a connection tshark "
                 f"does not have"]))
    return out


def http_summary_line(rows: list[dict[str, Any]]) -> str:
    """``crosscheck HTTP: streams/requests a/b connections agreed, TTFB c/d within
    0.05 ms (e excluded)`` from tally rows ``{"kind", "agreed", "compared", "skipped"}``."""
    def total(kind: str, key: str) -> int:
        return sum(r[key] for r in rows if r["kind"] == kind)

    line = (f"crosscheck HTTP: streams/requests {total('count', 'agreed')}/"
            f"{total('count', 'compared')} connections agreed, TTFB "
            f"{total('ttfb', 'agreed')}/{total('ttfb', 'compared')} within 0.05 ms")
    return line + f" ({total('ttfb', 'skipped')} excluded)"


# ----------------------------------------------------------------------------- script


def _print(ref: HttpReference) -> None:
    print(f"== {ref.spec.name} ({ref.frames} frames, key log "
          f"{ref.spec.keylog.name if ref.spec.keylog else '-'})")
    for s in ref.streams:
        if not s.requests:
            continue
        print(f"  {s.describe()} tls={s.tls}: {len(s.requests)} requests "
              f"({s.h2_streams} h2 streams, {s.http1_requests} HTTP/1.x)")
        for r in s.requests:
            print(f"    {r.describe()} status={r.status}: {r.timing()}")


def main(argv: list[str]) -> int:
    if tshark_path() is None:
        print("tshark is not installed", file=sys.stderr)
        return 1
    specs = http_captures()
    if argv:
        specs = [s for s in specs if s.name in argv]
    for spec in specs:
        _print(http_reference(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
