"""Per-request wire times and hop chains from tshark alone (an independent reference).

netdiag's hop figures (netdiag/paths/chains.py: ``wait``, ``setup`` and ``own`` time
of every hop of a chain) and its request, connection and DNS timings are cross-checked
here against tshark's frame times of the same packets, never against a delay a lab
injected nor a server's own clock. Nothing of netdiag's analysis is used to build the
reference; only tshark (Debian's 4.0, TSHARK.md), driven the way tshark_ref.py and
http_ref.py drive it (:func:`tshark_ref.tshark_layers`, the tshark engine's plumbing):
one run per capture, ``-n -2 -o tcp.reassemble_out_of_order:TRUE``, the key log if one
is given (``-o tls.keylog_file:KEYS``; a pcapng with a decryption-secrets block
decrypts without it), ``-T json`` parsed keeping duplicate keys in order.

Keys and units
--------------
* Times are integer nanoseconds of capture time (``frame.time_epoch`` split at the dot,
  so a pcapng's nanosecond timestamps are kept exactly).
* Endpoints are the contract's ``"ip:port"`` strings (IPv6 in brackets).
* A request is keyed ``(client, server, ident)`` (:data:`ReqKey`, see
  :func:`request_key`): ``ident`` is the HTTP/2 stream id, or for HTTP/1.x and
  Redis (RESP) the 0-based ordinal of the request on its TCP connection, in the order
  sent. A connection is keyed ``(client, server)``; its ``tcp_stream`` is tshark's.

What is measured (:class:`WireRequest`)
---------------------------------------
Every message is timed by the packet carrying its *first* byte (CONTRACT.md), while
tshark reports a message at the packet that *completes* it: a message reported in a
packet with ``tcp.segments`` that is the packet's first PDU (cleartext) or lies in
its first ``tls`` layer (the reassembled record) starts in the first listed segment;
an HTTP/1.x message reported with ``tls.segments`` starts in the first listed record's
frame; anything else starts in the reporting packet. Where that is not exact (a
second HTTP/2 frame inside one reassembled record) ``approx`` says so. Loopback lab
captures have no reassembly at all (MTU 64 KiB), so there every time is exact.

* HTTP/2 (``kind == "h2"``), per (``tcp.stream``, ``http2.streamid``): ``ts`` the
  client's first HEADERS frame, ``first_byte`` the server's first HEADERS frame (an
  interim 1xx included), ``last_byte`` the packet completing the server's frame with
  END_STREAM (None when the stream never ended in the capture), ``event_ns`` the
  completing packets of the server's DATA frames with a payload, or, for a
  ``text/event-stream`` answer, of the frame completing each event (a blank line).
* HTTP/1.x (``kind == "http1"``): ``ts`` the request's first byte, ``first_byte`` the
  first byte of the first response tshark pairs with it (``http.request_in``; an
  interim 1xx counts), ``last_byte`` the packet completing the final response. A
  response tshark never emits (one that ends at the close) falls back to the first
  server application payload after the request (a TLS record of decrypted type 23, or
  any cleartext payload) and the last one before the next request.
* Redis/RESP (``kind == "resp"``, server port in ``resp_ports``; tshark 4.0 cannot
  dissect RESP) from the TCP payload packets (retransmissions skipped): a command
  starts at the first client->server payload packet after the previous reply began;
  its ``first_byte`` is the next server->client payload packet and ``last_byte`` the
  last one before the next command. ``args`` are decoded from the client payload of
  the command (RESP arrays, inline commands). This is exact for connections that
  carry one command at a time (the lab's router); a pipelined burst is taken as one
  command (``pipelined`` > 1 says how many it held, ``approx`` is set).
* Per TCP connection (:class:`WireConnection`): the client's first SYN (``syn_ns``),
  the client's ACK completing the handshake, and the TLS handshake
  (:class:`WireTls`: ClientHello, ServerHello, both Finished messages, and the
  contract's end of the handshake).
* DNS (:class:`WireDns`): per transaction the first query and first response (first
  byte frames), their difference, and tshark's own ``dns.time``.

Hops (:func:`hop_times`)
------------------------
Given a chain, a root request and what it caused as ``(request key, parent index)``
pairs (index 0 is the root, index ``i`` the ``i``-th pair), per hop:

* ``wait`` = ``first_byte - ts``;
* ``setup`` = ``ts - syn`` when the hop's connection was opened for it: the request is
  the connection's first and its SYN lies inside the parent's wait
  (``parent.ts <= syn < parent.first_byte`` and ``syn <= ts``); its interval as the
  parent sees it then starts at the SYN, else at ``ts``;
* ``own`` = ``wait`` minus the union of its callees' ``[start, first byte]``
  intervals (a callee without a first byte: to the hop's first byte), each clipped to
  ``[ts, first_byte]``; ``own_parts`` splits it into before the first call, between
  calls and after the last call.

:func:`chains_by_request_id` derives the chains from the request ids the capture shows
(``x-request-id``, ``x-correlation-id``, ``request-id`` headers, the trace id of
``traceparent``; a RESP command carries one when one of its arguments is an HTTP
request's id): a request's parent is a request with the same id on another
connection to another server that started before it and had not ended when it
started; one whose server address is the request's client address is preferred (the
proxy sent it), then the latest to start (the innermost hop). Where no id is sent
(a lab run with ``request_ids`` off), :func:`chains_from_ledger` takes the lab
ledger's ``chains`` (endpoints and stream ids or ordinals: the same keys).

``setup`` follows the brief's wording (the SYN inside the parent's wait); netdiag's
code only asks ``parent.ts <= syn <= ts``: the two differ for a connection opened after
the parent's first byte, which no own time depends on (such a callee is clipped away).
A connection carrying HTTP/2 reports its HTTP/2 streams only (the HTTP/1.1 request of
an ``Upgrade: h2c`` is not one of them).

Using it
--------
``ref = wire_reference(capture, keylog)`` (cached); ``ref.requests[(client, server,
ident)]``, ``ref.connection(client, server)``, ``ref.dns``;
``chains_by_request_id(ref)`` or ``chains_from_ledger(ledger["chains"])`` ->
``{root key: [(key, parent index), ...]}``; ``hop_times(ref, root, callees)`` ->
:class:`HopTimes` per hop, ``all_hop_times(ref, chains)`` by key. Against netdiag:
``compare_chains(ref, analysis.chain_table, chains)`` (:class:`HopComparison`:
``share_within``, ``stats``, ``worst``, ``relinked``, ``missing``) and
``compare_requests(ref, connections)``; ``netdiag_key(conn, index)`` turns netdiag's
``conn.requests[index]`` into the reference's key.

Run as a script to print a capture's chains: ``python tests/crosscheck/hops_ref.py
CAPTURE [KEYS]``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tshark_ref import (
    endpoint,
    norm_endpoint,
    tshark_layers,
    tshark_path,
)

from netdiag.engines.tshark import H2_DATA, H2_HEADERS, TLS_VERSIONS, dns_decode_rules
from netdiag.engines.tshark import H2_RST_STREAM as H2_RST
from netdiag.engines.tshark import final_status as _final
from netdiag.engines.tsjson import (
    Node,
    find_all,
    find_first,
    hex_bytes,
    http2_frames,
    segment_frames,
    to_int,
    walk,
)
from netdiag.engines.tsjson import epoch_ns as parse_epoch_ns

ReqKey = tuple[str, str, int]
"""``(client endpoint, server endpoint, HTTP/2 stream id or 0-based ordinal)``."""
ConnKey = tuple[str, str]
"""``(client endpoint, server endpoint)``."""

JSON_PROTOCOLS = "frame ip ipv6 udp tcp tcp.segments dns tls tls.segments http http2"
"""What ``-J`` keeps of each packet."""
REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "request-id")
RESP_PORTS = (6379,)
DNS_PORTS = (53,)


def request_key(client: str, server: str, ident: int) -> ReqKey:
    """The reference's key of a request (endpoints normalised)."""
    return norm_endpoint(client), norm_endpoint(server), int(ident)


def netdiag_key(conn: Any, index: int) -> ReqKey:
    """The reference key of netdiag's ``conn.requests[index]`` (a ``Connection``
    record): its stream id on HTTP/2, else its index (netdiag lists a connection's
    HTTP/1.x requests and RESP commands in the order sent)."""
    r = conn.requests[index]
    ident = r.stream_id if r.stream_id is not None else index
    return request_key(conn.client, conn.server, ident)


# ----------------------------------------------------------------------------- records


@dataclass
class WireRequest:
    """One request (HTTP/2 stream, HTTP/1.x exchange, RESP command) on the wire."""

    key: ReqKey
    tcp_stream: int
    kind: str
    """``h2``, ``http1`` or ``resp``."""
    ts_ns: int
    request_frame: int
    """Frame carrying the request's first byte."""
    first_byte_ns: int | None = None
    response_frame: int | None = None
    """Frame carrying the response's first byte."""
    last_byte_ns: int | None = None
    method: str | None = None
    path: str | None = None
    authority: str | None = None
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    """Request headers (lower-case names), where decoded."""
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    """RESP: the command's arguments (the command name first)."""
    pipelined: int = 1
    """RESP: commands found in what is taken as this one command."""
    event_ns: list[int] = field(default_factory=list)
    """Completing packets of the response's DATA frames with a payload (or of its SSE
    events, ``sse`` True)."""
    sse: bool = False
    approx: str | None = None
    """Why a time is not exact (None: every time is the first-byte packet's)."""

    @property
    def client(self) -> str:
        return self.key[0]

    @property
    def server(self) -> str:
        return self.key[1]

    @property
    def ident(self) -> int:
        return self.key[2]

    @property
    def wait_ns(self) -> int | None:
        return None if self.first_byte_ns is None else self.first_byte_ns - self.ts_ns

    @property
    def ttlb_ns(self) -> int | None:
        return None if self.last_byte_ns is None else self.last_byte_ns - self.ts_ns

    @property
    def gaps_ns(self) -> list[int]:
        """Gaps between successive response chunks (DATA frames / SSE events)."""
        return [b - a for a, b in zip(self.event_ns, self.event_ns[1:], strict=False)]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def response_header(self, name: str) -> str | None:
        return next((v for k, v in self.response_headers if k == name), None)

    @property
    def request_id(self) -> str | None:
        """The correlation id of an HTTP request's headers (RESP: None, see
        :func:`chains_by_request_id`)."""
        for k, v in self.headers:
            if k in REQUEST_ID_HEADERS and v:
                return v
            if k == "traceparent":
                parts = v.split("-")
                if len(parts) >= 3 and parts[1]:
                    return parts[1]
        return None

    def describe(self) -> str:
        what = " ".join(x for x in (self.method, self.path) if x) or " ".join(self.args[:1])
        return (f"{self.kind} {self.client} -> {self.server} #{self.ident} {what} "
                f"(tcp.stream {self.tcp_stream}, frames {self.request_frame} -> "
                f"{self.response_frame})")


@dataclass
class WireTls:
    """The TLS handshake of one TCP connection."""

    client_hello_ns: int | None = None
    server_hello_ns: int | None = None
    client_finished_ns: int | None = None
    server_finished_ns: int | None = None
    version: str | None = None
    """``TLS 1.3``, ``TLS 1.2``, ..."""
    resumed: bool = False

    @property
    def finished_ns(self) -> int | None:
        """The contract's end of the handshake: the client's Finished in TLS 1.3 and in
        an abbreviated TLS 1.2 handshake, the server's in a full TLS 1.2 one."""
        if self.version == "TLS 1.3" or self.resumed:
            return self.client_finished_ns
        return self.server_finished_ns

    @property
    def handshake_ns(self) -> int | None:
        fin = self.finished_ns
        return None if fin is None or self.client_hello_ns is None else fin - self.client_hello_ns


@dataclass
class WireConnection:
    """One ``tcp.stream``."""

    tcp_stream: int
    client: str
    server: str
    first_ns: int
    last_ns: int
    syn_ns: int | None = None
    """The client's first SYN."""
    handshake_ack_ns: int | None = None
    """The client's ACK completing the three-way handshake."""
    protocol: str | None = None
    """``h2``, ``http1``, ``resp`` or None (no request)."""
    tls: WireTls | None = None
    requests: list[WireRequest] = field(default_factory=list)

    @property
    def key(self) -> ConnKey:
        return self.client, self.server

    @property
    def handshake_rtt_ns(self) -> int | None:
        if self.syn_ns is None or self.handshake_ack_ns is None:
            return None
        return self.handshake_ack_ns - self.syn_ns


@dataclass
class WireDns:
    """One DNS transaction (first query, first matching response)."""

    client: str
    server: str
    transport: str
    id: int
    qname: str
    qtype: int | None
    query_ns: int
    query_frame: int
    copies: int = 1
    response_ns: int | None = None
    response_frame: int | None = None
    rcode: int | None = None
    dns_time_ns: int | None = None
    """tshark's ``dns.time`` of the first response."""

    @property
    def latency_ns(self) -> int | None:
        return None if self.response_ns is None else self.response_ns - self.query_ns

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return self.client, self.server, self.transport, self.id, self.qname


@dataclass
class WireReference:
    """Everything the reference extracts from one capture."""

    capture: str
    keylog: str | None
    connections: list[WireConnection]
    dns: list[WireDns]
    frames: int
    decode_as: tuple[str, ...] = ()
    """The ``-d`` options the reference found it needed (see :func:`wire_reference`)."""
    requests: dict[ReqKey, WireRequest] = field(default_factory=dict)
    by_conn: dict[ConnKey, WireConnection] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.connections:
            if c.key in self.by_conn:
                raise ValueError(f"{self.capture}: two TCP connections {c.client} -> "
                                 f"{c.server} (tcp.stream {self.by_conn[c.key].tcp_stream} "
                                 f"and {c.tcp_stream}): request keys would be ambiguous")
            self.by_conn[c.key] = c
            for r in c.requests:
                self.requests[r.key] = r

    def request(self, key: ReqKey) -> WireRequest:
        return self.requests[request_key(*key)]

    def connection(self, client: str, server: str) -> WireConnection:
        return self.by_conn[(norm_endpoint(client), norm_endpoint(server))]

    def conn_of(self, key: ReqKey) -> WireConnection:
        return self.by_conn[(key[0], key[1])]


# ----------------------------------------------------------------------------- tshark


def run_tshark_json(capture: str, keylog: str | None, extra_opts: Sequence[str]) -> list[Node]:
    """The packets' ``layers`` of one tshark run (exit status 2, a cut capture, is
    accepted: tshark still prints every complete packet)."""
    return tshark_layers(capture, keylog, extra_opts, JSON_PROTOCOLS)[0]


@dataclass
class _Msg:
    kind: str
    """``http``, ``http2``, ``hs`` (a TLS handshake message), ``rec`` (a TLS record),
    ``dns``."""
    node: Any
    group: int
    """0: the packet's first PDU (the reassembled one where ``tcp.segments``), 1: a
    later one."""
    first: bool
    """The first message of its group."""
    tls: bool
    tls_segments: list[int] = field(default_factory=list)


@dataclass
class _Pkt:
    frame: int
    ts: int
    transport: str
    stream: int | None
    src: str
    dst: str
    syn: bool = False
    ack: bool = False
    payload: bytes = b""
    retransmission: bool = False
    tcp_segments: list[int] = field(default_factory=list)
    msgs: list[_Msg] = field(default_factory=list)
    magic: bool = False


def _parse(layers: Node) -> _Pkt | None:
    fr = layers.get("frame")
    if not isinstance(fr, Node):
        return None
    number, epoch = to_int(fr.get("frame.number")), fr.get("frame.time_epoch")
    if number is None or not isinstance(epoch, str):
        return None
    src = dst = None
    for key in ("ip", "ipv6"):
        node = layers.get(key)
        if isinstance(node, Node):
            src, dst = node.get(f"{key}.src"), node.get(f"{key}.dst")
            break
    transport = next((k for k, v in layers if k in ("tcp", "udp") and isinstance(v, Node)), None)
    if src is None or dst is None or transport is None:
        return None
    tl = layers.get(transport)
    sport, dport = to_int(tl.get(f"{transport}.srcport")), to_int(tl.get(f"{transport}.dstport"))
    if sport is None or dport is None:
        return None
    pkt = _Pkt(number, parse_epoch_ns(epoch), transport, to_int(tl.get(f"{transport}.stream")),
               endpoint(src, sport), endpoint(dst, dport))
    if transport == "tcp":
        pkt.syn = find_first(tl, "tcp.flags.syn") == "1"
        pkt.ack = find_first(tl, "tcp.flags.ack") == "1"
        pkt.payload = hex_bytes(tl.get("tcp.payload"))
        analysis = tl.get("tcp.analysis")
        if isinstance(analysis, Node):
            pkt.retransmission = any(analysis.get(k) is not None for k in (
                "tcp.analysis.retransmission", "tcp.analysis.fast_retransmission",
                "tcp.analysis.spurious_retransmission"))
    tls_layers, cleartext_msgs = 0, 0
    group = 0
    pending_tls_segments: list[int] = []

    def add(kind: str, node: Any, tls: bool) -> None:
        first = not any(m.group == group and m.kind == kind for m in pkt.msgs)
        pkt.msgs.append(_Msg(kind, node, group, first, tls, list(pending_tls_segments)))

    def cleartext() -> None:
        # a cleartext PDU: the packet's first one is the reassembled one
        nonlocal group, cleartext_msgs
        if tls_layers == 0:
            group = 0 if cleartext_msgs == 0 else 1
            cleartext_msgs += 1

    for key, value in layers:
        if key == "tcp.segments":
            pkt.tcp_segments = segment_frames(value, "tcp")
        elif key == "tls.segments":
            pending_tls_segments = segment_frames(value, "tls")
        elif key == "tls" and isinstance(value, Node):
            # the first tls layer holds the record reassembled from tcp.segments (if
            # any); the records after it are in a second layer
            tls_layers += 1
            group = 0 if tls_layers == 1 else 1
            for rkey, rec in value:
                if rkey != "tls.record" or not isinstance(rec, Node):
                    continue
                add("rec", rec, True)
                for hkey, hs in rec:
                    if hkey == "tls.handshake" and isinstance(hs, Node):
                        add("hs", hs, True)
        elif key == "http" and isinstance(value, Node):
            cleartext()
            add("http", value, tls_layers > 0)
            pending_tls_segments = []
        elif key == "http2" and isinstance(value, Node):
            magic, frames = http2_frames(value)
            pkt.magic = pkt.magic or magic
            for fnode in frames:
                cleartext()
                add("http2", fnode, tls_layers > 0)
        elif key == "dns" and isinstance(value, Node):
            cleartext()
            add("dns", value, False)
    return pkt


class _Times:
    """First-byte packet of a message (module docstring)."""

    def __init__(self, pkts: list[_Pkt]) -> None:
        self.by_frame = {p.frame: p for p in pkts}

    def start(self, pkt: _Pkt, msg: _Msg) -> tuple[int, int, str | None]:
        """(frame, ts, why not exact) of the packet carrying the message's first byte."""
        if msg.tls_segments:
            f = msg.tls_segments[0]
            p = self.by_frame.get(f)
            if p is None:
                return pkt.frame, pkt.ts, f"tls.segment frame {f} not captured"
            if not p.tcp_segments:
                return p.frame, p.ts, None
            recs = [m for m in p.msgs if m.kind == "rec"]
            if len(recs) == 1 and recs[0].group == 0:
                # that frame completes one record only, reassembled: the message
                # starts in it, whose first byte is in the first segment
                return self.start(p, recs[0])
            return p.frame, p.ts, (f"its first record (frame {f}) was itself reassembled, "
                                   f"among other records")
        if pkt.tcp_segments and msg.group == 0:
            f = pkt.tcp_segments[0]
            p = self.by_frame.get(f)
            if p is None:
                return pkt.frame, pkt.ts, f"tcp.segment frame {f} not captured"
            why = None if msg.first else (f"not the first message of the record reassembled "
                                          f"in frame {pkt.frame}")
            return p.frame, p.ts, why
        return pkt.frame, pkt.ts, None


# ----------------------------------------------------------------------------- builders


def _headers(node: Node, prefix: str) -> list[tuple[str, str]]:
    out = []
    for k, h in walk(node):
        if k == f"{prefix}.header" and isinstance(h, Node):
            name, value = h.get(f"{prefix}.header.name"), h.get(f"{prefix}.header.value")
            if isinstance(name, str):
                out.append((name.lower(), value if isinstance(value, str) else ""))
    return out


def _http1_headers(node: Node, side: str) -> list[tuple[str, str]]:
    out = []
    for line in find_all(node, f"http.{side}.line"):
        name, sep, value = line.partition(":")
        if sep:
            out.append((name.strip().lower(), value.strip()))
    return out


class _Conn:
    """Builds one :class:`WireConnection` from its packets."""

    def __init__(self, pkts: list[_Pkt], times: _Times, resp_ports: frozenset[int]) -> None:
        self.pkts = pkts
        self.times = times
        self.resp_ports = resp_ports
        self.client, self.server = self._endpoints()

    def _endpoints(self) -> tuple[str, str]:
        for p in self.pkts:
            if p.syn and not p.ack:
                return p.src, p.dst
        for p in self.pkts:
            if p.magic:
                return p.src, p.dst
            for m in p.msgs:
                if m.kind == "http" and m.node.get("http.request") is not None:
                    return p.src, p.dst
                if m.kind == "http" and m.node.get("http.response") is not None:
                    return p.dst, p.src
                if m.kind == "hs" and m.node.get("tls.handshake.type") == "1":
                    return p.src, p.dst
        a, b = self.pkts[0].src, self.pkts[0].dst
        port = lambda ep: int(ep.rpartition(":")[2])  # noqa: E731
        return (a, b) if port(b) <= port(a) else (b, a)

    def build(self) -> WireConnection:
        first = self.pkts[0]
        conn = WireConnection(first.stream if first.stream is not None else -1, self.client,
                              self.server, first.ts, self.pkts[-1].ts)
        syn_seen = False
        for p in self.pkts:
            if p.src == self.client and p.syn and not p.ack and conn.syn_ns is None:
                conn.syn_ns = p.ts
            elif p.src == self.server and p.syn and p.ack:
                syn_seen = True
            elif (syn_seen and conn.handshake_ack_ns is None and p.src == self.client
                  and p.ack and not p.syn):
                conn.handshake_ack_ns = p.ts
        conn.tls = self._tls()
        h2 = self._http2(conn)
        if h2:
            conn.protocol, conn.requests = "h2", h2
        else:
            h1 = self._http1(conn)
            if h1:
                conn.protocol, conn.requests = "http1", h1
            elif int(self.server.rpartition(":")[2]) in self.resp_ports:
                resp = self._resp(conn)
                if resp:
                    conn.protocol, conn.requests = "resp", resp
        return conn

    # TLS ---------------------------------------------------------------------------

    def _tls(self) -> WireTls | None:
        tls = WireTls()
        seen = False
        for p in self.pkts:
            for m in p.msgs:
                if m.kind != "hs":
                    continue
                seen = True
                htype = m.node.get("tls.handshake.type")
                _, ts, _ = self.times.start(p, m)
                if htype == "1" and p.src == self.client and tls.client_hello_ns is None:
                    tls.client_hello_ns = ts
                elif htype == "2" and p.src == self.server and tls.server_hello_ns is None:
                    tls.server_hello_ns = ts
                    sv = find_all(m.node, "tls.handshake.extensions.supported_version")
                    code = to_int(sv[0]) if sv else to_int(m.node.get("tls.handshake.version"))
                    tls.version = TLS_VERSIONS.get(code or 0)
                    if "41" in find_all(m.node, "tls.handshake.extension.type"):
                        tls.resumed = True
                elif htype == "20":
                    if p.src == self.client and tls.client_finished_ns is None:
                        tls.client_finished_ns = ts
                    elif p.src == self.server and tls.server_finished_ns is None:
                        tls.server_finished_ns = ts
        if not seen:
            return None
        if tls.version == "TLS 1.3" and tls.client_finished_ns is None \
                and tls.server_hello_ns is not None:
            # no key: the client's Finished is its first record of outer type 23
            # after the ServerHello (TSHARK.md)
            for p in self.pkts:
                if p.src != self.client or p.ts < tls.server_hello_ns:
                    continue
                # (tshark shows a TLS 1.3 record's outer type as opaque_type, and a
                # content_type only once decrypted: had that been the Finished, it
                # would have been seen)
                rec = next((m for m in p.msgs if m.kind == "rec"
                            and m.node.get("tls.record.opaque_type") == "23"
                            and m.node.get("tls.record.content_type") is None), None)
                if rec is not None:
                    tls.client_finished_ns = self.times.start(p, rec)[1]
                    break
        if (tls.version == "TLS 1.2" and tls.client_finished_ns is not None
                and tls.server_finished_ns is not None
                and tls.server_finished_ns < tls.client_finished_ns):
            tls.resumed = True  # abbreviated handshake: the server finishes first
        return tls

    # HTTP/2 ------------------------------------------------------------------------

    def _http2(self, conn: WireConnection) -> list[WireRequest]:
        reqs: dict[int, WireRequest] = {}
        buffers: dict[int, bytes] = {}
        for p in self.pkts:
            for m in p.msgs:
                if m.kind != "http2":
                    continue
                ftype = to_int(m.node.get("http2.type"))
                sid = to_int(m.node.get("http2.streamid"))
                if sid is None or sid == 0:
                    continue
                flags = to_int(m.node.get("http2.flags")) or 0
                end = ftype in (H2_DATA, H2_HEADERS) and bool(flags & 0x1)
                frame, ts, why = self.times.start(p, m)
                if p.src == self.client:
                    if ftype == H2_HEADERS and sid not in reqs:
                        r = WireRequest(request_key(self.client, self.server, sid),
                                        conn.tcp_stream, "h2", ts, frame, approx=why)
                        r.headers = _headers(m.node, "http2")
                        r.method = r.header(":method")
                        r.path = r.header(":path")
                        r.authority = r.header(":authority")
                        reqs[sid] = r
                    continue
                r = reqs.get(sid)
                if r is None:
                    continue
                if ftype == H2_HEADERS:
                    hdrs = _headers(m.node, "http2")
                    status = to_int(next((v for k, v in hdrs if k == ":status"), None))
                    if r.first_byte_ns is None:
                        r.first_byte_ns, r.response_frame = ts, frame
                        r.approx = r.approx or why
                    if status is not None and not _final(r.status):
                        r.status = status
                        r.response_headers = hdrs
                        ctype = next((v for k, v in hdrs if k == "content-type"), "")
                        r.sse = ctype.split(";")[0].strip().lower() == "text/event-stream"
                elif ftype == H2_DATA:
                    # the frame's own payload: on the frame ending the stream tshark
                    # shows the whole reassembled body, of which it is the tail
                    length = to_int(m.node.get("http2.length")) or 0
                    if flags & 0x8:  # PADDED
                        length -= 1 + (to_int(m.node.get("http2.pad_length")) or 0)
                    body = hex_bytes(m.node.get("http2.data.data"))
                    data = body[len(body) - length:] if length > 0 else b""
                    if r.sse:
                        buf = (buffers.get(sid, b"") + data).replace(b"\r\n", b"\n")
                        while b"\n\n" in buf:
                            _, _, buf = buf.partition(b"\n\n")
                            r.event_ns.append(p.ts)
                        buffers[sid] = buf
                    elif length > 0:
                        r.event_ns.append(p.ts)
                if end and r.last_byte_ns is None:
                    r.last_byte_ns = p.ts
                if ftype == H2_RST and r.last_byte_ns is None:
                    r.approx = r.approx or "stream reset"
        return [reqs[s] for s in sorted(reqs, key=lambda s: (reqs[s].ts_ns, s))]

    # HTTP/1.x ----------------------------------------------------------------------

    def _app_payloads(self, src: str) -> list[tuple[int, int, int]]:
        """(frame, first-byte ts, completing ts) of each application payload of one
        direction: TLS records of decrypted type 23, or cleartext payload packets."""
        out = []
        clear = conn_is_cleartext(self.pkts)
        for p in self.pkts:
            if p.src != src or p.retransmission:
                continue
            recs = [m for m in p.msgs if m.kind == "rec"]
            if recs:
                for m in recs:
                    if m.node.get("tls.record.content_type") == "23":
                        frame, ts, _ = self.times.start(p, m)
                        out.append((frame, ts, p.ts))
            elif p.payload and clear:
                out.append((p.frame, p.ts, p.ts))
        return out

    def _http1(self, conn: WireConnection) -> list[WireRequest]:
        reqs: list[WireRequest] = []
        by_frame: dict[int, list[WireRequest]] = {}
        responses: list[tuple[_Pkt, _Msg]] = []
        for p in self.pkts:
            for m in p.msgs:
                if m.kind != "http":
                    continue
                if m.node.get("http.request") is not None and p.src == self.client:
                    frame, ts, why = self.times.start(p, m)
                    r = WireRequest(request_key(self.client, self.server, len(reqs)),
                                    conn.tcp_stream, "http1", ts, frame, approx=why)
                    r.method = find_first(m.node, "http.request.method")
                    r.path = find_first(m.node, "http.request.uri")
                    r.headers = _http1_headers(m.node, "request")
                    r.authority = r.header("host")
                    reqs.append(r)
                    by_frame.setdefault(p.frame, []).append(r)
                elif m.node.get("http.response") is not None and p.src == self.server:
                    responses.append((p, m))
        if not reqs:
            return []
        taken: dict[int, int] = {}
        for p, m in responses:
            req_in = to_int(m.node.get("http.request_in"))
            cands = by_frame.get(req_in or -1)
            if not cands:
                continue
            k = taken.get(req_in or -1, 0)
            # several requests reported in one frame: their responses come in order;
            # an interim response stays with its request
            r = cands[min(k, len(cands) - 1)]
            code = to_int(find_first(m.node, "http.response.code"))
            frame, ts, why = self.times.start(p, m)
            if r.first_byte_ns is None:
                r.first_byte_ns, r.response_frame = ts, frame
                r.approx = r.approx or why
            if _final(code):
                r.status = code
                r.response_headers = _http1_headers(m.node, "response")
                r.last_byte_ns = p.ts
                taken[req_in or -1] = k + 1
        server_payloads = self._app_payloads(self.server)
        for i, r in enumerate(reqs):
            if r.first_byte_ns is not None and r.last_byte_ns is not None:
                continue
            nxt = reqs[i + 1].request_frame if i + 1 < len(reqs) else None
            after = [x for x in server_payloads
                     if x[0] > r.request_frame and (nxt is None or x[0] < nxt)]
            if not after:
                continue
            if r.first_byte_ns is None:
                r.first_byte_ns, r.response_frame = after[0][1], after[0][0]
                r.approx = r.approx or "no response emitted by tshark: first server payload"
            if r.last_byte_ns is None:
                r.last_byte_ns = after[-1][2]
        return reqs

    # RESP --------------------------------------------------------------------------

    def _resp(self, conn: WireConnection) -> list[WireRequest]:
        out: list[WireRequest] = []
        bufs: list[bytes] = []
        cur: WireRequest | None = None
        for p in self.pkts:
            if not p.payload or p.retransmission:
                continue
            if p.src == self.client:
                if cur is None or cur.first_byte_ns is not None:
                    cur = WireRequest(request_key(self.client, self.server, len(out)),
                                      conn.tcp_stream, "resp", p.ts, p.frame)
                    out.append(cur)
                    bufs.append(p.payload)
                else:
                    bufs[-1] += p.payload
            elif cur is not None:
                if cur.first_byte_ns is None:
                    cur.first_byte_ns, cur.response_frame = p.ts, p.frame
                cur.last_byte_ns = p.ts
        for r, buf in zip(out, bufs, strict=True):
            cmds = resp_commands(buf)
            r.args = cmds[0] if cmds else []
            r.method = r.args[0].upper() if r.args else None
            r.pipelined = max(len(cmds), 1)
            if r.pipelined > 1:
                r.approx = f"{r.pipelined} pipelined commands taken as one"
        return out


def conn_is_cleartext(pkts: list[_Pkt]) -> bool:
    """No TLS record in the connection."""
    return not any(m.kind == "rec" for p in pkts for m in p.msgs)


def resp_commands(buf: bytes) -> list[list[str]]:
    """The RESP commands of a client byte string (arrays of bulk strings, or inline
    commands), as lists of strings; stops at the first incomplete one."""
    out: list[list[str]] = []
    pos = 0
    while pos < len(buf):
        if buf[pos:pos + 1] == b"*":
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            try:
                n = int(buf[pos + 1:end])
            except ValueError:
                break
            pos = end + 2
            args = []
            for _ in range(max(n, 0)):
                end = buf.find(b"\r\n", pos)
                if end < 0 or buf[pos:pos + 1] != b"$":
                    return out
                try:
                    size = int(buf[pos + 1:end])
                except ValueError:
                    return out
                arg = buf[end + 2:end + 2 + size]
                if len(arg) < size:
                    return out
                args.append(arg.decode("utf-8", "replace"))
                pos = end + 2 + size + 2
            out.append(args)
        else:
            end = buf.find(b"\n", pos)
            if end < 0:
                break
            words = buf[pos:end].decode("utf-8", "replace").split()
            if words:
                out.append(words)
            pos = end + 1
    return out


def _dns(pkts: list[_Pkt], times: _Times, ports: frozenset[int]) -> list[WireDns]:
    out: list[WireDns] = []
    open_: dict[tuple[Any, ...], WireDns] = {}
    for p in pkts:
        sport, dport = (int(e.rpartition(":")[2]) for e in (p.src, p.dst))
        if sport not in ports and dport not in ports:
            continue
        for m in p.msgs:
            if m.kind != "dns":
                continue
            msg_id = to_int(m.node.get("dns.id"))
            names = find_all(m.node, "dns.qry.name")
            is_resp = find_first(m.node, "dns.flags.response") == "1"
            if msg_id is None or not names:
                continue
            qname = names[0].rstrip(".").lower() or "."
            qtype = to_int(next(iter(find_all(m.node, "dns.qry.type")), None))
            frame, ts, _ = times.start(p, m)
            if not is_resp:
                key = (p.src, p.dst, p.transport, msg_id, qname, qtype)
                t = open_.get(key)
                if t is not None and t.response_ns is None:
                    t.copies += 1
                    continue
                t = WireDns(p.src, p.dst, p.transport, msg_id, qname, qtype, ts, frame)
                open_[key] = t
                out.append(t)
            else:
                key = (p.dst, p.src, p.transport, msg_id, qname, qtype)
                t = open_.get(key)
                if t is None or t.response_ns is not None:
                    continue
                t.response_ns, t.response_frame = ts, frame
                t.rcode = to_int(find_first(m.node, "dns.flags.rcode"))
                dt = find_first(m.node, "dns.time")
                t.dns_time_ns = None if dt is None else parse_epoch_ns(dt)
    return out


HTTP1_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ",
                 b"CONNECT ", b"TRACE ")


def _undecoded(pkts: list[_Pkt], skip_ports: frozenset[int]) -> list[str]:
    """``-d`` options for servers on ports tshark did not recognise: a connection whose
    first client payload is a TLS ClientHello, the HTTP/2 preface or an HTTP/1.x
    request line that tshark left undissected (another protocol owns the port, or
    none: the lab's servers listen on free ports, and a client's ephemeral port can be
    a registered one, 34980 being EtherCAT's)."""
    streams: dict[int, list[_Pkt]] = {}
    for p in pkts:
        if p.transport == "tcp" and p.stream is not None:
            streams.setdefault(p.stream, []).append(p)
    opts: dict[int, str] = {}
    for pl in streams.values():
        syn = next((p for p in pl if p.syn and not p.ack), None)
        if syn is None:
            continue
        port = int(syn.dst.rpartition(":")[2])
        first = next((p for p in pl if p.src == syn.src and p.payload), None)
        if first is None or port in skip_ports or port in opts:
            continue
        data = first.payload
        if data[:3] in (b"\x16\x03\x01", b"\x16\x03\x03") and len(data) > 5 and data[5] == 1:
            if not any(m.kind == "rec" for m in first.msgs):
                opts[port] = "tls"
        elif data.startswith(b"PRI * HTTP/2.0"):
            if not first.magic and not any(m.kind == "http2" for m in first.msgs):
                opts[port] = "http2"
        elif data.startswith(HTTP1_METHODS) and not any(m.kind == "http" for m in first.msgs):
            opts[port] = "http"
    return [x for port, proto in sorted(opts.items()) for x in ("-d", f"tcp.port=={port},{proto}")]


@functools.cache
def _reference(capture: str, keylog: str | None, extra_opts: tuple[str, ...],
               resp_ports: tuple[int, ...], dns_ports: tuple[int, ...]) -> WireReference:
    opts = list(extra_opts) + [x for rule in dns_decode_rules(dns_ports)
                                for x in ("-d", rule)]
    layers = run_tshark_json(capture, keylog, opts)
    pkts = [p for p in map(_parse, layers) if p is not None]
    more = _undecoded(pkts, frozenset(resp_ports) | frozenset(dns_ports))
    if more:  # once more, telling tshark what those servers speak
        layers = run_tshark_json(capture, keylog, opts + more)
        pkts = [p for p in map(_parse, layers) if p is not None]
    times = _Times(pkts)
    streams: dict[int, list[_Pkt]] = {}
    for p in pkts:
        if p.transport == "tcp" and p.stream is not None:
            streams.setdefault(p.stream, []).append(p)
    rports = frozenset(resp_ports)
    conns = [_Conn(v, times, rports).build() for _, v in sorted(streams.items())]
    conns = [c for c in conns if not _is_dns_conn(c, dns_ports)]
    return WireReference(capture, keylog, conns, _dns(pkts, times, frozenset(dns_ports)),
                         len(layers), decode_as=tuple(more))


def _is_dns_conn(c: WireConnection, dns_ports: Sequence[int]) -> bool:
    return not c.requests and int(c.server.rpartition(":")[2]) in dns_ports


def wire_reference(capture: str | Path, keylog: str | Path | None = None, *,
                   extra_opts: Sequence[str] = (), resp_ports: Sequence[int] = RESP_PORTS,
                   dns_ports: Sequence[int] = DNS_PORTS) -> WireReference:
    """tshark's wire reference of one capture (cached per arguments).

    ``keylog``: a key log file (not needed for a pcapng with embedded keys);
    ``extra_opts``: more tshark options (``-d tcp.port==N,http2``);
    ``resp_ports``: server ports whose connections are Redis (RESP);
    ``dns_ports``: ports carrying DNS (others than 53 are decoded as DNS with ``-d``).
    DNS-over-TCP connections are left out of ``connections``.

    Servers on ports tshark does not associate with their protocol are found by what
    their clients send first (a TLS ClientHello, the HTTP/2 preface, an HTTP/1.x
    request line, left undissected) and tshark is run once more with ``-d
    tcp.port==N,tls`` (``http2``, ``http``) for them (``decode_as`` lists them).
    """
    return _reference(str(capture), None if keylog is None else str(keylog),
                      tuple(extra_opts), tuple(resp_ports), tuple(dns_ports))


# ----------------------------------------------------------------------------- chains


@dataclass
class HopTimes:
    """One hop of a chain, from the wire reference (ns)."""

    key: ReqKey
    parent: int | None
    """Index of the parent hop (None: the root)."""
    depth: int
    ts_ns: int
    first_byte_ns: int | None
    start_ns: int
    """Start of the hop's interval as its parent sees it: the SYN when ``opened``."""
    opened: bool
    wait_ns: int | None
    setup_ns: int | None
    own_ns: int | None
    own_parts_ns: tuple[int, int, int] | None
    """``own`` before the first call, between calls, after the last call (None when it
    made no call within its wait)."""

    @property
    def wait_ms(self) -> float | None:
        return None if self.wait_ns is None else self.wait_ns / 1e6

    @property
    def setup_ms(self) -> float | None:
        return None if self.setup_ns is None else self.setup_ns / 1e6

    @property
    def own_ms(self) -> float | None:
        return None if self.own_ns is None else self.own_ns / 1e6


def _first_request(conn: WireConnection) -> WireRequest | None:
    return min(conn.requests, key=lambda r: (r.ts_ns, r.ident), default=None)


def hop_times(ref: WireReference, root: ReqKey,
              callees: Sequence[tuple[ReqKey, int]]) -> list[HopTimes]:
    """Per hop of a chain (the root first, then ``callees`` in the given order):
    wait, setup and own time from the wire reference alone (module docstring).

    ``callees``: ``(request key, parent index)``, the parent index pointing into
    ``[root, *callees]`` (0: the root) at an earlier entry.
    """
    keys = [request_key(*root)] + [request_key(*k) for k, _ in callees]
    parents: list[int | None] = [None] + [int(i) for _, i in callees]
    for n, pi in enumerate(parents):
        if pi is not None and not 0 <= pi < n:
            raise ValueError(f"hop {n}: parent index {pi} does not point at an earlier hop")
    reqs = [ref.request(k) for k in keys]
    opened = [False] * len(keys)
    for n, (k, r, pi) in enumerate(zip(keys, reqs, parents, strict=True)):
        if pi is None:
            continue
        conn, p = ref.conn_of(k), reqs[pi]
        syn = conn.syn_ns
        opened[n] = (syn is not None and _first_request(conn) is r and p.ts_ns <= syn <= r.ts_ns
                     and (p.first_byte_ns is None or syn < p.first_byte_ns))
    starts = [conn_syn if o and (conn_syn := ref.conn_of(k).syn_ns) is not None else r.ts_ns
              for k, r, o in zip(keys, reqs, opened, strict=True)]
    depth = [0] * len(keys)
    for n, pi in enumerate(parents):
        if pi is not None:
            depth[n] = depth[pi] + 1
    out = []
    for n, r in enumerate(reqs):
        own = parts = None
        if r.first_byte_ns is not None:
            lo, hi = r.ts_ns, r.first_byte_ns
            spans = []
            for c, pc in enumerate(parents):
                if pc != n:
                    continue
                fb = reqs[c].first_byte_ns
                s, e = max(starts[c], lo), min(hi if fb is None else fb, hi)
                if e > s:
                    spans.append((s, e))
            merged: list[tuple[int, int]] = []
            for s, e in sorted(spans):
                if merged and s <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], e))
                else:
                    merged.append((s, e))
            own = (hi - lo) - sum(e - s for s, e in merged)
            if merged:
                parts = (merged[0][0] - lo,
                         sum(merged[j + 1][0] - merged[j][1] for j in range(len(merged) - 1)),
                         hi - merged[-1][1])
        conn = ref.conn_of(keys[n])
        out.append(HopTimes(
            keys[n], parents[n], depth[n], r.ts_ns, r.first_byte_ns, starts[n], opened[n],
            r.wait_ns, (r.ts_ns - conn.syn_ns) if opened[n] and conn.syn_ns is not None
            else None, own, parts))
    return out


def _ip(ep: str) -> str:
    return ep.rpartition(":")[0]


def request_ids(ref: WireReference) -> dict[ReqKey, str]:
    """The request id of every request that shows one: HTTP requests' headers; a RESP
    command when one of its arguments (the last such) is an HTTP request's id."""
    out: dict[ReqKey, str] = {}
    for k, r in ref.requests.items():
        rid = r.request_id
        if rid is not None:
            out[k] = rid
    known = set(out.values())
    for k, r in ref.requests.items():
        if r.kind == "resp":
            hit = [a for a in r.args[1:] if a in known]
            if hit:
                out[k] = hit[-1]
    return out


def chains_by_request_id(ref: WireReference) -> dict[ReqKey, list[tuple[ReqKey, int]]]:
    """Every chain the request ids show: root key -> its callees as ``(key, parent
    index)`` (parent index into ``[root, *callees]``), callees in order of start.
    Roots without callees are left out."""
    ids = request_ids(ref)
    by_id: dict[str, list[WireRequest]] = {}
    for k, rid in ids.items():
        by_id.setdefault(rid, []).append(ref.requests[k])
    parent: dict[ReqKey, ReqKey] = {}
    for k, rid in ids.items():
        u = ref.requests[k]
        cands = [p for p in by_id[rid]
                 if p.key != k and (p.client, p.server) != (u.client, u.server)
                 and p.server != u.server and p.ts_ns < u.ts_ns
                 and (p.last_byte_ns is None or u.ts_ns <= p.last_byte_ns)]
        if cands:
            best = max(cands, key=lambda p: (_ip(p.server) == _ip(u.client), p.ts_ns))
            parent[k] = best.key
    children: dict[ReqKey, list[ReqKey]] = {}
    for k, pk in parent.items():
        children.setdefault(pk, []).append(k)
    out: dict[ReqKey, list[tuple[ReqKey, int]]] = {}
    for root in sorted({k for k in children if k not in parent},
                       key=lambda k: (ref.requests[k].ts_ns, k)):
        order = [root]
        index = {root: 0}
        frontier = [root]
        members: list[ReqKey] = []
        while frontier:
            nxt = []
            for k in frontier:
                for c in children.get(k, []):
                    members.append(c)
                    nxt.append(c)
            frontier = nxt
        members.sort(key=lambda k: (ref.requests[k].ts_ns, k))
        callees = []
        for k in members:
            index[k] = len(order)
            order.append(k)
        for k in members:
            callees.append((k, index[parent[k]]))
        out[root] = callees
    return out


def chains_from_ledger(chains: Iterable[dict[str, Any]]
                       ) -> dict[ReqKey, list[tuple[ReqKey, int]]]:
    """A lab ledger's ``chains`` (``{"client": {client, server, stream_id, ordinal},
    "upstream": [{..., "parent": i}]}``, parent 0 the client request) in the form
    :func:`hop_times` takes; chains without upstream requests are left out."""

    def key(rec: dict[str, Any]) -> ReqKey:
        ident = rec.get("stream_id")
        if ident is None:
            ident = rec.get("ordinal")
        if ident is None:
            raise ValueError(f"ledger hop without stream id or ordinal: {rec}")
        return request_key(rec["client"], rec["server"], ident)

    out: dict[ReqKey, list[tuple[ReqKey, int]]] = {}
    for chain in chains:
        ups = chain.get("upstream") or []
        if ups:
            out[key(chain["client"])] = [(key(u), int(u["parent"])) for u in ups]
    return out


def all_hop_times(ref: WireReference,
                  chains: dict[ReqKey, list[tuple[ReqKey, int]]] | None = None
                  ) -> dict[ReqKey, HopTimes]:
    """Every hop of every chain (default: :func:`chains_by_request_id`), by its key."""
    chains = chains_by_request_id(ref) if chains is None else chains
    out: dict[ReqKey, HopTimes] = {}
    for root, callees in chains.items():
        for h in hop_times(ref, root, callees):
            out[h.key] = h
    return out


# ----------------------------------------------------------------------------- netdiag


@dataclass
class HopComparison:
    """netdiag's hop figures against the reference's, hop by hop (ms)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    """Per netdiag hop: ``key``, ``root``, ``what``, and per figure ``own``, ``wait``,
    ``setup``: ``(netdiag ms, reference ms)``."""
    relinked: list[str] = field(default_factory=list)
    """Chains whose hops differ from the request ids' (netdiag linked a request to
    another parent than the one carrying its id)."""
    missing: list[str] = field(default_factory=list)
    """Hops netdiag has that the reference has no chain for, and the reverse."""

    def errors(self, figure: str) -> list[float]:
        """``|netdiag - reference|`` in ms per hop (inf where only one has a value)."""
        out = []
        for row in self.rows:
            a, b = row[figure]
            out.append(0.0 if a is None and b is None else
                       float("inf") if a is None or b is None else abs(a - b))
        return out

    def share_within(self, figure: str, tol_ms: float) -> float:
        errs = self.errors(figure)
        return sum(1 for e in errs if e <= tol_ms) / len(errs) if errs else 0.0

    def stats(self, figure: str) -> dict[str, float]:
        """``{"n", "median", "p95", "max"}`` of the errors, ms."""
        errs = sorted(self.errors(figure))
        if not errs:
            return {"n": 0, "median": float("nan"), "p95": float("nan"), "max": float("nan")}
        mid = len(errs) // 2
        median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
        p95 = errs[min(len(errs) - 1, max(0, -(-95 * len(errs) // 100) - 1))]
        return {"n": len(errs), "median": median, "p95": p95, "max": errs[-1]}

    def worst(self, figure: str, n: int = 5) -> list[str]:
        errs = self.errors(figure)
        order = sorted(range(len(errs)), key=lambda i: -errs[i])[:n]
        return [f"{self.rows[i]['what']}: {figure} netdiag {self.rows[i][figure][0]} vs "
                f"tshark {self.rows[i][figure][1]} ms" for i in order]


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def compare_chains(ref: WireReference, chain_table: dict[Any, list[Any]],
                   chains: dict[ReqKey, list[tuple[ReqKey, int]]] | None = None
                   ) -> HopComparison:
    """netdiag's chains (``PathsAnalysis.chain_table``: steps with ``node.conn``,
    ``node.index``, ``own_ns``, ``node.wait_ns``, ``node.setup_ns``) against the
    reference's chains (default: from the request ids).

    Each netdiag hop is compared with the reference hop of the same request key, in
    whichever true chain that request is (a hop netdiag put under another parent still
    has its own wait and setup; a parent that got another's callee shows it in its own
    time)."""
    chains = chains_by_request_id(ref) if chains is None else chains
    truth = all_hop_times(ref, chains)
    out = HopComparison()
    seen: set[ReqKey] = set()
    for steps in chain_table.values():
        keys = [netdiag_key(s.node.conn, s.node.index) for s in steps]
        root = keys[0]
        want = {root} | {k for k, _ in chains.get(root, [])}
        if set(keys) != want:
            out.relinked.append(f"chain of {root}: netdiag has {sorted(set(keys) - want)} "
                                f"the request ids do not, lacks {sorted(want - set(keys))}")
        for k, s in zip(keys, steps, strict=True):
            seen.add(k)
            h = truth.get(k)
            if h is None:
                out.missing.append(f"netdiag hop {k} of the chain of {root}: no reference chain")
                continue
            r = ref.requests[k]
            out.rows.append({
                "key": k, "root": root,
                "what": f"{r.describe()} (chain of {root[0]} #{root[2]})",
                "own": (_ms(s.own_ns), h.own_ms), "wait": (_ms(s.node.wait_ns), h.wait_ms),
                "setup": (_ms(s.node.setup_ns), h.setup_ms)})
    for k in truth:
        if k not in seen:
            out.missing.append(f"reference hop {k}: in no netdiag chain")
    return out


def compare_requests(ref: WireReference, connections: Iterable[Any], tol_ns: int = 0
                     ) -> list[str]:
    """Every request of netdiag's ``Connection`` records against the reference:
    ``ts``, ``first_byte`` and ``last_byte`` must be the same packets' times (within
    ``tol_ns``); one line per disagreement (empty: all agree). Connections the
    reference has no requests for (DNS/TCP, undecrypted) are skipped."""
    problems = []
    for c in connections:
        if not c.requests:
            continue
        for i, r in enumerate(c.requests):
            key = netdiag_key(c, i)
            w = ref.requests.get(key)
            if w is None:
                if (norm_endpoint(c.client), norm_endpoint(c.server)) in ref.by_conn:
                    problems.append(f"{c.id} {key}: not in the reference")
                continue
            for name, got, want in (("ts", r.ts_ns, w.ts_ns),
                                    ("first_byte", r.first_byte_ns, w.first_byte_ns),
                                    ("last_byte", r.last_byte_ns, w.last_byte_ns)):
                if got is None or want is None or abs(got - want) > tol_ns:
                    diff = "" if got is None or want is None else f" ({(got - want) / 1e6:+.6f} ms)"
                    problems.append(f"{c.id} {w.describe()}: {name} netdiag {got} vs tshark "
                                    f"{want}{diff}")
    return problems


# ----------------------------------------------------------------------------- script


def main(argv: list[str]) -> int:
    if tshark_path() is None or not argv:
        print("usage: hops_ref.py CAPTURE [KEYS] (needs tshark)", file=sys.stderr)
        return 1
    ref = wire_reference(argv[0], argv[1] if len(argv) > 1 else None)
    for root, callees in chains_by_request_id(ref).items():
        print(ref.requests[root].describe())
        for h in hop_times(ref, root, callees):
            r = ref.requests[h.key]
            print(f"  {'  ' * h.depth}{r.describe()}: wait {h.wait_ms} setup {h.setup_ms} "
                  f"own {h.own_ms} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
