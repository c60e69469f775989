"""The records netdiag produces, one documented type per record (see CONTRACT.md).

Times are integer nanoseconds of capture time inside the program (``*_ns``);
the JSON form (``to_json``) turns them into the contract's ``ts`` epoch seconds and
``*_ms`` milliseconds. A value that could not be measured is ``None`` (JSON ``null``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import truediv
from typing import Any, Final

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
RETRANSMISSION_TIMES_CAP = 1024
"""Retransmission times a connection keeps (its count goes on beyond)."""


def _ratio(num: int, den: int) -> float:
    """``num / den``, correctly rounded as Python divides ints.

    Not the ``/`` operator: compiled by mypyc, ``int / int`` converts both operands to
    float first, which rounds twice once a value exceeds 2**53 (every epoch time in
    nanoseconds), so the last digit of a ``ts`` would differ between the two cores.
    """
    q: float = truediv(num, den)
    return q


def ns_to_ts(ns: int | None) -> float | None:
    """Capture time in integer nanoseconds to epoch seconds (float), or None."""
    return None if ns is None else _ratio(ns, NS_PER_S)


def ns_to_ms(ns: int | None) -> float | None:
    """A duration in integer nanoseconds to milliseconds (float), or None."""
    return None if ns is None else _ratio(ns, NS_PER_MS)


def span_ms(start_ns: int | None, end_ns: int | None) -> float | None:
    """Milliseconds from ``start_ns`` to ``end_ns``; None when either is unknown."""
    if start_ns is None or end_ns is None:
        return None
    return _ratio(end_ns - start_ns, NS_PER_MS)


def endpoint(ip: str, port: int) -> str:
    """The contract's endpoint string: ``ip:port``, IPv6 in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _field_values(obj: Any) -> tuple[Any, ...]:
    """Every field of a record, in its ``__init__``'s order: what :func:`pickle` passes
    back to the class. Compiled, a class with its own ``__init__`` is not made by
    ``__new__`` alone, so the default reduction (``__new__``, then the state) fails."""
    return tuple([getattr(obj, f.name) for f in fields(obj)])


@dataclass(slots=True)
class Warning_:
    """Something in the input that netdiag could not read as expected."""

    kind: str
    """Which layer noticed it: ``capture``, ``ip``, ``tcp``, ``dns``, ``tls``."""
    message: str
    """One plain sentence, naming file, byte offset and packet number when known."""
    file: str | None = None
    """The capture file it concerns."""
    offset: int | None = None
    """Byte offset in the (uncompressed) capture file where the problem starts."""
    packet: int | None = None
    """1-based number of the packet concerned (as Wireshark numbers frames)."""

    def __init__(self, kind: str, message: str, file: str | None = None,
                 offset: int | None = None, packet: int | None = None) -> None:
        self.kind = kind
        self.message = message
        self.file = file
        self.offset = offset
        self.packet = packet

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), _field_values(self)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "file": self.file,
                "offset": self.offset, "packet": self.packet}


@dataclass(slots=True)
class DnsTransaction:
    """One DNS question and its answer, keyed as CONTRACT.md says."""

    ts_ns: int
    """Capture time of the first query of the transaction."""
    client: str
    """Endpoint that asked (``ip:port``)."""
    server: str
    """Endpoint that was asked (``ip:port``)."""
    transport: str
    """``udp`` or ``tcp``."""
    id: int
    """DNS message id."""
    qname: str
    """Question name, without the trailing dot (``.`` for the root)."""
    qtype: str
    """Question type mnemonic (``A``, ``AAAA``, ``TYPE65534`` for unknown ones)."""
    rcode: str | None = None
    """Response code of the first matching response (``NOERROR``, ``NXDOMAIN``...)."""
    answers: list[str] = field(default_factory=list)
    """Answer section rdata as text, in order (addresses for A/AAAA)."""
    response_ts_ns: int | None = None
    """Capture time of the first response that matches the transaction."""
    retransmissions: int = 0
    """Extra copies of the query seen before (or without) a response."""
    responses: int = 0
    """How many responses matched; more than one means duplicate responses."""
    truncated: bool = False
    """The first response had the TC bit set (the answer continues over TCP)."""
    query_packet: int | None = None
    """Packet number of the first query."""
    response_packet: int | None = None
    """Packet number of the first response."""

    def __init__(self, ts_ns: int, client: str, server: str, transport: str, id: int, qname: str,
                 qtype: str, rcode: str | None = None, answers: list[str] | None = None,
                 response_ts_ns: int | None = None, retransmissions: int = 0, responses: int = 0,
                 truncated: bool = False, query_packet: int | None = None,
                 response_packet: int | None = None) -> None:
        self.ts_ns = ts_ns
        self.client = client
        self.server = server
        self.transport = transport
        self.id = id
        self.qname = qname
        self.qtype = qtype
        self.rcode = rcode
        self.answers = [] if answers is None else answers
        self.response_ts_ns = response_ts_ns
        self.retransmissions = retransmissions
        self.responses = responses
        self.truncated = truncated
        self.query_packet = query_packet
        self.response_packet = response_packet

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), _field_values(self)

    @property
    def latency_ns(self) -> int | None:
        """First query to first matching response, in nanoseconds."""
        if self.response_ts_ns is None:
            return None
        return self.response_ts_ns - self.ts_ns

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": ns_to_ts(self.ts_ns), "client": self.client, "server": self.server,
            "transport": self.transport, "id": self.id, "qname": self.qname,
            "qtype": self.qtype, "rcode": self.rcode, "answers": list(self.answers),
            "latency_ms": span_ms(self.ts_ns, self.response_ts_ns),
            "retransmissions": self.retransmissions, "responses": self.responses,
            "truncated": self.truncated,
        }


@dataclass(slots=True)
class TlsInfo:
    """What the TLS handshake of one connection showed."""

    version: str | None = None
    """Negotiated version (``TLS 1.3``, ``TLS 1.2``...), from supported_versions if present."""
    sni: str | None = None
    """Server name the client asked for."""
    alpn_offered: list[str] = field(default_factory=list)
    """ALPN protocols in the ClientHello, in order."""
    alpn: str | None = None
    """ALPN protocol the server selected, where visible (TLS 1.2, or decrypted 1.3)."""
    cipher: str | None = None
    """IANA name of the negotiated cipher suite."""
    resumed: bool | None = None
    """Session resumed: TLS 1.2 abbreviated handshake, or TLS 1.3 PSK selected."""
    hello_retry: bool = False
    """The server answered the first ClientHello with a HelloRetryRequest."""
    client_hello_ns: int | None = None
    """Capture time of the packet carrying the first byte of the (first) ClientHello."""
    finished_ns: int | None = None
    """Capture time of the Finished that ends the handshake (CONTRACT.md)."""
    decrypted: bool = False
    """The connection was decrypted with a key log."""
    alert: str | None = None
    """First alert, e.g. ``fatal handshake_failure from server``; ``encrypted`` if unread."""
    client_hello_packet: int | None = None
    """Packet number carrying the first byte of the ClientHello."""
    finished_packet: int | None = None
    """Packet number carrying the first byte of the closing Finished."""
    client_random: bytes | None = None
    """ClientHello random (32 bytes), the key-log lookup key."""
    session_ticket_offered: bool = False
    """The ClientHello carried a non-empty session ticket or a PSK identity."""
    certificate: dict[str, Any] | None = None
    """Server certificate facts where visible: ``{subject, issuer, not_after, size,
    chain_length}`` (TLS 1.2 in clear, TLS 1.3 once decrypted)."""
    session_tickets: int = 0
    """NewSessionTicket messages the server sent (TLS 1.3 only once decrypted)."""
    key_updates: int = 0
    """TLS 1.3 KeyUpdate messages seen (decrypted)."""
    decrypt_error: str | None = None
    """Why decryption stopped, e.g. a record that failed to authenticate."""

    def __init__(self, version: str | None = None, sni: str | None = None,
                 alpn_offered: list[str] | None = None, alpn: str | None = None,
                 cipher: str | None = None, resumed: bool | None = None,
                 hello_retry: bool = False, client_hello_ns: int | None = None,
                 finished_ns: int | None = None, decrypted: bool = False,
                 alert: str | None = None, client_hello_packet: int | None = None,
                 finished_packet: int | None = None, client_random: bytes | None = None,
                 session_ticket_offered: bool = False, certificate: dict[str, Any] | None = None,
                 session_tickets: int = 0, key_updates: int = 0,
                 decrypt_error: str | None = None) -> None:
        self.version = version
        self.sni = sni
        self.alpn_offered = [] if alpn_offered is None else alpn_offered
        self.alpn = alpn
        self.cipher = cipher
        self.resumed = resumed
        self.hello_retry = hello_retry
        self.client_hello_ns = client_hello_ns
        self.finished_ns = finished_ns
        self.decrypted = decrypted
        self.alert = alert
        self.client_hello_packet = client_hello_packet
        self.finished_packet = finished_packet
        self.client_random = client_random
        self.session_ticket_offered = session_ticket_offered
        self.certificate = certificate
        self.session_tickets = session_tickets
        self.key_updates = key_updates
        self.decrypt_error = decrypt_error

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), _field_values(self)

    @property
    def handshake_ns(self) -> int | None:
        """ClientHello to the closing Finished, in nanoseconds."""
        if self.client_hello_ns is None or self.finished_ns is None:
            return None
        return self.finished_ns - self.client_hello_ns

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version, "sni": self.sni, "alpn_offered": list(self.alpn_offered),
            "alpn": self.alpn, "cipher": self.cipher, "resumed": self.resumed,
            "hello_retry": self.hello_retry,
            "handshake_ms": span_ms(self.client_hello_ns, self.finished_ns),
            "decrypted": self.decrypted, "alert": self.alert,
            "certificate": self.certificate, "session_tickets": self.session_tickets,
            "key_updates": self.key_updates, "decrypt_error": self.decrypt_error,
        }


@dataclass(slots=True)
class Request:
    """One request/response exchange on a connection (exact or inferred)."""

    ts_ns: int
    """Capture time of the request's first HEADERS frame / first request byte."""
    first_byte_ns: int | None = None
    """Capture time of the first response HEADERS frame / first response byte."""
    last_byte_ns: int | None = None
    """Capture time of the last byte of the response."""
    stream_id: int | None = None
    """HTTP/2 stream id; None for HTTP/1.x and inferred requests."""
    method: str | None = None
    """Request method, where visible."""
    authority: str | None = None
    """``:authority`` or ``Host``, where visible."""
    path: str | None = None
    """Request path, where visible."""
    status: int | None = None
    """Response status code, where visible."""
    response_bytes: int | None = None
    """Response body bytes (inferred: TLS record payload bytes of the response)."""
    chunks: int | None = None
    """DATA frames / SSE events / TLS records carrying the response."""
    chunk_gaps_ns: Sequence[int] | None = None
    """Gaps between successive response chunks after the first: a list while the
    analyzer builds it; an ``array('q')`` (8 bytes a gap, not an int object and a list
    slot: a fifth) once a report that holds every record keeps it (:func:`compact_gaps`:
    from a few gaps on), as an answer streamed token by token has one per token."""
    estimated: bool = True
    """Inferred from encrypted record timing rather than decoded."""
    protocol: str | None = None
    """``h2``, ``h2c``, ``http/1.1``, ``http/1.0``; None when inferred."""
    end_ns: int | None = None
    """Capture time of the request's last byte (END_STREAM / end of the request body)."""
    request_bytes: int | None = None
    """Request body bytes, where decoded."""
    content_type: str | None = None
    """Response ``content-type``, where decoded."""
    sse_events: int | None = None
    """Server-sent events counted in a ``text/event-stream`` response (then ``chunks``
    and ``chunk_gaps_ns`` count events, not DATA frames)."""
    first_event_ns: int | None = None
    """Capture time of the first complete SSE event."""
    reset: str | None = None
    """RST_STREAM error code name when the stream was reset, e.g. ``CANCEL``."""
    reset_by: str | None = None
    """``client`` or ``server``: who reset the stream."""
    stall_ns: int | None = None
    """Time the response spent waiting on a zero HTTP/2 flow-control window."""
    request_headers: list[tuple[str, str]] | None = None
    """Decoded request headers (HTTP/2 pseudo-headers included), for HAR export."""
    response_headers: list[tuple[str, str]] | None = None
    """Decoded response headers, for HAR export."""
    named_ids: tuple[str, ...] | None = None
    """Words of a Redis command that could be a request's correlation id (its
    arguments, see :mod:`netdiag.protocols.resp`), to tie it to the HTTP request whose
    id it names; None for other protocols. Not in the JSON report."""

    def __init__(self, ts_ns: int, first_byte_ns: int | None = None,
                 last_byte_ns: int | None = None, stream_id: int | None = None,
                 method: str | None = None, authority: str | None = None,
                 path: str | None = None, status: int | None = None,
                 response_bytes: int | None = None, chunks: int | None = None,
                 chunk_gaps_ns: Sequence[int] | None = None, estimated: bool = True,
                 protocol: str | None = None, end_ns: int | None = None,
                 request_bytes: int | None = None, content_type: str | None = None,
                 sse_events: int | None = None, first_event_ns: int | None = None,
                 reset: str | None = None, reset_by: str | None = None,
                 stall_ns: int | None = None,
                 request_headers: list[tuple[str, str]] | None = None,
                 response_headers: list[tuple[str, str]] | None = None,
                 named_ids: tuple[str, ...] | None = None) -> None:
        self.ts_ns = ts_ns
        self.first_byte_ns = first_byte_ns
        self.last_byte_ns = last_byte_ns
        self.stream_id = stream_id
        self.method = method
        self.authority = authority
        self.path = path
        self.status = status
        self.response_bytes = response_bytes
        self.chunks = chunks
        self.chunk_gaps_ns = chunk_gaps_ns
        self.estimated = estimated
        self.protocol = protocol
        self.end_ns = end_ns
        self.request_bytes = request_bytes
        self.content_type = content_type
        self.sse_events = sse_events
        self.first_event_ns = first_event_ns
        self.reset = reset
        self.reset_by = reset_by
        self.stall_ns = stall_ns
        self.request_headers = request_headers
        self.response_headers = response_headers
        self.named_ids = named_ids

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), _field_values(self)

    def to_json(self, connection_id: str | None = None,
                headers: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stream_id": self.stream_id, "ts": ns_to_ts(self.ts_ns), "method": self.method,
            "authority": self.authority, "path": self.path, "status": self.status,
            "ttfb_ms": span_ms(self.ts_ns, self.first_byte_ns),
            "ttlb_ms": span_ms(self.ts_ns, self.last_byte_ns),
            "response_bytes": self.response_bytes, "chunks": self.chunks,
            "chunk_gaps_ms": (None if not self.chunk_gaps_ns
                              else [_ratio(g, NS_PER_MS) for g in self.chunk_gaps_ns]),
            "estimated": self.estimated,
            "protocol": self.protocol,
            "request_bytes": self.request_bytes,
            "content_type": self.content_type,
            "sse_events": self.sse_events,
            "first_event_ms": span_ms(self.ts_ns, self.first_event_ns),
            "reset": self.reset,
            "reset_by": self.reset_by,
            "stall_ms": ns_to_ms(self.stall_ns),
            "send_ms": span_ms(self.ts_ns, self.end_ns),
        }
        if headers:
            out["request_headers"] = (None if self.request_headers is None
                                      else [list(h) for h in self.request_headers])
            out["response_headers"] = (None if self.response_headers is None
                                       else [list(h) for h in self.response_headers])
        if connection_id is not None:
            out["connection"] = connection_id
        return out


@dataclass(slots=True)
class Connection:
    """One TCP connection, oriented client to server."""

    id: str
    """``C1``, ``C2``... in order of first packet."""
    ts_ns: int
    """Capture time of the connection's first packet."""
    client: str
    """Client endpoint: the SYN's sender, else the ephemeral-port side."""
    server: str
    """Server endpoint."""
    transport: str = "tcp"
    """``tcp``, or ``udp`` for a QUIC connection."""
    syn_ns: int | None = None
    """Capture time of the client's first SYN."""
    handshake_ack_ns: int | None = None
    """Capture time of the client's ACK completing the three-way handshake."""
    syn_retransmissions: int = 0
    """Extra SYNs sent by the client before the handshake completed."""
    retransmissions: int = 0
    """Segments (either direction) whose data or SYN/FIN had been seen before."""
    out_of_order: int = 0
    """Segments that filled a gap soon after it opened (reordering, as tshark marks it)."""
    lost_bytes: int = 0
    """Bytes never captured (gaps the stream never filled)."""
    resets: int = 0
    """Segments with RST set."""
    packets: int = 0
    """Packets of the connection, both directions."""
    bytes_to_server: int = 0
    """TCP payload bytes from client to server (retransmissions excluded)."""
    bytes_to_client: int = 0
    """TCP payload bytes from server to client (retransmissions excluded)."""
    last_ns: int = 0
    """Capture time of the connection's last packet."""
    server_ttl: int | None = None
    """IP TTL (hop limit) of the server's SYN-ACK, or of its first packet when the
    connection was first seen from the server; hop distance = next initial TTL - this."""
    handshake_seen: bool = False
    """The SYN was captured, so orientation comes from it rather than from ports."""
    close: str = "open"
    """How it ended: ``fin``, ``rst``, ``idle`` (expired), ``reused`` (a new SYN took its
    4-tuple), ``close`` (a QUIC CONNECTION_CLOSE) or ``open`` (the capture ended first)."""
    tls: TlsInfo | None = None
    """TLS handshake facts, None for cleartext."""
    protocol: str | None = None
    """Application protocol: ``h2``, ``http/1.1``, ``dns``, ``tls`` (unknown inside), None."""
    path: dict[str, Any] | None = None
    """Path attribution ``{name, hop, evidence, inferred}`` (issue 5), None until then."""
    requests: list[Request] = field(default_factory=list)
    """Requests carried by the connection, in order."""
    http2: dict[str, Any] | None = None
    """HTTP/2 connection facts where decoded: ``{max_concurrent_streams, settings:
    {client, server}, goaway, rst_streams, flow_control_stalls}``."""
    tunnel: dict[str, Any] | None = None
    """An accepted HTTP ``CONNECT`` on this (proxy) connection: ``{authority, protocol,
    requests}``; the tunnelled requests follow the CONNECT request in ``requests``, the
    tunnelled TLS handshake is ``tls``. None without a tunnel (and then not in JSON)."""
    retransmission_ns: list[int] = field(default_factory=list)
    """Capture times of the packets counted in ``retransmissions``, the first
    :data:`RETRANSMISSION_TIMES_CAP` of them (per-interval figures; not in JSON)."""
    quic: dict[str, Any] | None = None
    """QUIC connection facts (``transport`` ``udp``): ``{version, zero_rtt: {attempted,
    accepted, packets}, retry, version_negotiation, migrations, client_endpoints,
    connection_ids: {client, server}, packets, undecrypted, frames, close,
    handshake_done_ms, h3}``; None for TCP (and then not in JSON)."""
    initial_ns: int | None = None
    """QUIC: capture time of the client's first Initial packet."""
    initial_answer_ns: int | None = None
    """QUIC: capture time of the server's first answer to it (Initial, Retry or Version
    Negotiation); ``handshake_rtt_ms`` spans the two."""

    def __init__(self, id: str, ts_ns: int, client: str, server: str, transport: str = "tcp",
                 syn_ns: int | None = None, handshake_ack_ns: int | None = None,
                 syn_retransmissions: int = 0, retransmissions: int = 0, out_of_order: int = 0,
                 lost_bytes: int = 0, resets: int = 0, packets: int = 0,
                 bytes_to_server: int = 0, bytes_to_client: int = 0, last_ns: int = 0,
                 server_ttl: int | None = None, handshake_seen: bool = False,
                 close: str = "open", tls: TlsInfo | None = None, protocol: str | None = None,
                 path: dict[str, Any] | None = None, requests: list[Request] | None = None,
                 http2: dict[str, Any] | None = None, tunnel: dict[str, Any] | None = None,
                 retransmission_ns: list[int] | None = None, quic: dict[str, Any] | None = None,
                 initial_ns: int | None = None, initial_answer_ns: int | None = None) -> None:
        self.id = id
        self.ts_ns = ts_ns
        self.client = client
        self.server = server
        self.transport = transport
        self.syn_ns = syn_ns
        self.handshake_ack_ns = handshake_ack_ns
        self.syn_retransmissions = syn_retransmissions
        self.retransmissions = retransmissions
        self.out_of_order = out_of_order
        self.lost_bytes = lost_bytes
        self.resets = resets
        self.packets = packets
        self.bytes_to_server = bytes_to_server
        self.bytes_to_client = bytes_to_client
        self.last_ns = last_ns
        self.server_ttl = server_ttl
        self.handshake_seen = handshake_seen
        self.close = close
        self.tls = tls
        self.protocol = protocol
        self.path = path
        self.requests = [] if requests is None else requests
        self.http2 = http2
        self.tunnel = tunnel
        self.retransmission_ns = [] if retransmission_ns is None else retransmission_ns
        self.quic = quic
        self.initial_ns = initial_ns
        self.initial_answer_ns = initial_answer_ns

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), _field_values(self)

    def to_json(self, with_requests: bool = True, headers: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "ts": ns_to_ts(self.ts_ns), "client": self.client,
            "server": self.server, "transport": self.transport,
            "handshake_rtt_ms": (span_ms(self.syn_ns, self.handshake_ack_ns)
                                 if self.transport == "tcp"
                                 else span_ms(self.initial_ns, self.initial_answer_ns)),
            "retransmissions": self.retransmissions, "resets": self.resets,
            "bytes_to_server": self.bytes_to_server, "bytes_to_client": self.bytes_to_client,
            "duration_ms": span_ms(self.ts_ns, self.last_ns),
            "packets": self.packets, "out_of_order": self.out_of_order,
            "lost_bytes": self.lost_bytes, "syn_retransmissions": self.syn_retransmissions,
            "handshake_seen": self.handshake_seen, "close": self.close,
            "server_ttl": self.server_ttl,
            "tls": None if self.tls is None else self.tls.to_json(),
            "protocol": self.protocol, "path": self.path, "http2": self.http2,
        }
        if self.tunnel is not None:
            out["tunnel"] = self.tunnel
        if self.quic is not None:
            out["quic"] = self.quic
        if with_requests:
            out["requests"] = [r.to_json(headers=headers) for r in self.requests]
        return out


COMPACT_GAPS: Final = 4
"""Gaps from which :func:`compact_gaps` makes a list an array: below, making the array
costs more time than it saves memory (most answers have one gap or none; the benchmark's
captures keep four fifths of their gaps in the lists of four or more)."""


def compact_gaps(c: Connection) -> None:
    """Hold the chunk gaps of each of ``c``'s requests as an ``array('q')`` instead of a
    list of ints (:attr:`Request.chunk_gaps_ns`), from :data:`COMPACT_GAPS` gaps: for a
    sink that keeps every record. A list with a gap beyond 64 bits (crafted timestamps)
    stays as it is."""
    for r in c.requests:
        gaps = r.chunk_gaps_ns
        if gaps is not None and gaps.__class__ is list and len(gaps) >= COMPACT_GAPS:
            try:
                compact = array("q", gaps)
            except OverflowError:
                continue
            r.chunk_gaps_ns = compact


@dataclass(slots=True)
class Finding:
    """A plain-words statement of something wrong, with its evidence."""

    severity: str
    """``info``, ``warning`` or ``critical``."""
    code: str
    """Stable machine name, e.g. ``low-connection-reuse``."""
    title: str
    """One line a person reads first."""
    detail: str
    """What was measured against which threshold, and what to look at."""
    evidence: list[str] = field(default_factory=list)
    """Connection ids (``C4``) or DNS transaction descriptions backing it."""

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "title": self.title,
                "detail": self.detail, "evidence": list(self.evidence)}
