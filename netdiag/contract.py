"""The JSON report's shape (``../shared/docs/CONTRACT.md``) as types, where it is built.

The builders (``SummaryBuilder.build``, ``CaptureFacts.to_json``,
``CollectingSink.document``, ``percentiles``) return these instead of
``dict[str, Any]``, so that mypy checks each field's name and type where the document
is made. They are plain dicts at run time: nothing changes in the output. Records
(``dns[]``, ``connections[]``, ``requests[]``, ``findings[]``) keep the ``to_json`` of
their dataclasses in ``netdiag/records.py``, whose fields are the contract's.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Percentiles(TypedDict):
    """``{count, min, p50, p90, p99, max, mean}``; all but count null when empty."""

    count: int
    min: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None


class DnsSummary(TypedDict):
    transactions: int
    answered: int
    unanswered: int
    latency_ms: Percentiles
    retransmissions: int
    duplicate_responses: int
    rcodes: dict[str, int]


class TcpSummary(TypedDict):
    connections: int
    handshake_rtt_ms: Percentiles
    retransmissions: int
    resets: int
    reset_connections: int
    lost_bytes: int


class QuicSummary(TypedDict):
    """``summary.quic``: present only when the capture holds QUIC connections (which
    ``summary.tcp`` does not count; their TLS handshakes are in ``summary.tls``)."""

    connections: int
    handshake_rtt_ms: Percentiles
    zero_rtt_attempted: int
    retries: int
    migrations: int


class TlsSummary(TypedDict):
    handshakes: int
    handshake_ms: Percentiles
    resumed: int
    hello_retry: int
    versions: dict[str, int]
    alpn: dict[str, int]
    decrypted: int


class StreamingSummary(TypedDict):
    responses: int
    first_event_ms: Percentiles
    gap_ms: Percentiles
    longest_stall_ms: float | None


class HttpSummary(TypedDict):
    requests: int
    connections: int
    reuse_rate: float | None
    requests_per_connection: Percentiles
    ttfb_ms: Percentiles
    ttlb_ms: Percentiles
    protocols: dict[str, int]
    estimated: bool
    estimated_requests: int
    streaming: StreamingSummary


class RespSummary(TypedDict):
    connections: int
    commands: int
    by_command: dict[str, int]
    errors: int
    latency_ms: Percentiles


class Summary(TypedDict):
    """The document's ``summary``."""

    dns: DnsSummary
    tcp: TcpSummary
    quic: NotRequired[QuicSummary]
    tls: TlsSummary
    http: HttpSummary
    resp: RespSummary
    paths: dict[str, Any]


class CaptureJson(TypedDict):
    """The document's ``capture``."""

    files: list[str]
    packets: int
    bytes: int
    first_ts: float | None
    last_ts: float | None
    duration_ms: float | None
    link_types: list[str]
    truncated: bool
    warnings: list[dict[str, Any]]
    warnings_dropped: int
    undecoded_packets: int
    limits_hit: dict[str, int]


class Document(TypedDict):
    """The whole JSON report (``--format json``)."""

    contract: int
    netdiag_version: str
    capture: CaptureJson
    summary: Summary
    dns: list[dict[str, Any]]
    connections: list[dict[str, Any]]
    findings: list[dict[str, Any]]


class HopLoad(TypedDict):
    """One hop's figures in one interval (paths with hop chains)."""

    own_ms: Percentiles


class IntervalJson(TypedDict):
    """One interval of one path (``timeseries.paths.<name>[]``)."""

    start_ts: float
    requests: int
    rate_per_s: float
    in_flight_max: int
    new_connections: int
    reuse_rate: float | None
    dns_lookups: int
    ttfb_ms: Percentiles
    ttlb_ms: Percentiles
    retransmissions: int
    bytes: int
    estimated: bool
    hops: NotRequired[dict[str, HopLoad]]


class TimeseriesJson(TypedDict):
    """The document's ``timeseries`` (added by the paths analysis)."""

    interval_ms: float
    start_ts: float
    paths: dict[str, list[IntervalJson]]
    knee_declined: dict[str, dict[str, str]]
    sparse: NotRequired[list[str]]


class KneeJson(TypedDict):
    """One entry of the document's ``knees``."""

    path: str
    metric: str
    rate_per_s: float
    ci: list[float]
    below_ms: float
    above_ms: float
    slope_ms_per_rps: float
    points: int
    below: int
    above: int
    hop: str | None
    hops: dict[str, dict[str, float | None]]
    evidence: list[str]
    sentence: str


class ZeroRttJson(TypedDict):
    """``connections[].quic.zero_rtt``."""

    attempted: bool
    """The client sent 0-RTT packets."""
    accepted: bool | None
    """The server accepted them (EncryptedExtensions' early_data, so only with keys);
    null when attempted without keys, false when not attempted."""
    packets: int


class QuicJson(TypedDict):
    """``connections[].quic`` of a QUIC connection (``transport`` ``"udp"``); absent for
    TCP. Built by ``netdiag.protocols.quic.QuicConnection.finish``."""

    version: str
    """``"1"``, ``"2"``, ``"draft-29"`` or the hex number."""
    zero_rtt: ZeroRttJson
    retry: bool
    version_negotiation: list[str] | None
    migrations: int
    """Client endpoints beyond the first that carried the connection's ids."""
    client_endpoints: list[str]
    connection_ids: dict[str, list[str]]
    """``{"client": [...], "server": [...]}``, hex, in order of appearance."""
    packets: dict[str, int]
    undecrypted: int
    frames: dict[str, int] | None
    close: dict[str, Any] | None
    handshake_done_ms: float | None
    h3: dict[str, Any] | None
    """``{settings: {client, server}, goaway, frames}`` where HTTP/3 was decrypted."""


class ConnectionQuicFields(TypedDict):
    """What a QUIC connection adds to ``connections[]`` (the rest is a TCP one's)."""

    transport: str
    quic: NotRequired[QuicJson]
