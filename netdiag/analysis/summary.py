"""Summary figures built incrementally from records as they stream past.

Only numbers (and a few top-k lists for evidence) are kept, so a summary of a
multi-gigabyte capture costs memory per connection, not per packet.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from netdiag.analysis.stats import percentiles
from netdiag.analysis.tally import request_times
from netdiag.contract import QuicSummary, Summary
from netdiag.records import Connection, DnsTransaction, Request, ns_to_ms

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing
    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls

Values = Any
"""A value list of the builder: a ``list[float]``, or what the fleet's
``SketchedSummary`` puts in its place (``append``, ``extend``, ``len``, truth,
iteration). Typed ``Any`` so that the compiled builder takes either."""

TOP_K = 10
"""How many worst offenders are kept as evidence per category."""


@dataclass(slots=True)
class _Top:
    """The ``k`` largest values seen, with a label each (e.g. a connection id)."""

    k: int = TOP_K
    heap: list[tuple[float, int, str, Any]] = field(default_factory=list)
    n: int = 0

    def add(self, value: float, label: str, payload: Any = None) -> None:
        self.n += 1
        item = (value, -self.n, label, payload)
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, item)
        elif item > self.heap[0]:
            heapq.heapreplace(self.heap, item)

    def add_made(self, value: float, label: str, make: Callable[[], Any]) -> None:
        """:meth:`add` with the payload ``make()``, made only when the value is kept
        (items compare by value, then by arrival, never by payload)."""
        if len(self.heap) < self.k or (value, -(self.n + 1)) > self.heap[0][:2]:
            self.add(value, label, make())
        else:
            self.n += 1

    def items(self) -> list[tuple[float, str]]:
        """``(value, label)`` pairs, largest first."""
        return [(v, lab) for v, _n, lab, _p in sorted(self.heap, reverse=True)]

    def payloads(self) -> list[Any]:
        """The payloads kept with the values, largest value first."""
        return [p for _v, _n, _lab, p in sorted(self.heap, reverse=True)]


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class SummaryBuilder:
    """Accumulates what the summary, the findings and the terminal report need.

    Compiled, it allows interpreted subclasses (the fleet's ``SketchedSummary``); its
    value lists are :data:`Values`."""

    dns_latency: Values = field(default_factory=list)
    dns_total: int = 0
    dns_unanswered: int = 0
    dns_retransmissions: int = 0
    dns_duplicates: int = 0
    dns_rcodes: Counter[str] = field(default_factory=Counter)
    dns_slowest: _Top = field(default_factory=_Top)
    dns_unanswered_examples: list[str] = field(default_factory=list)
    dns_failed_examples: list[str] = field(default_factory=list)

    tcp_connections: int = 0
    tcp_rtt: Values = field(default_factory=list)
    tcp_retransmissions: int = 0
    tcp_resets: int = 0
    tcp_reset_conns: list[str] = field(default_factory=list)
    tcp_retrans_conns: _Top = field(default_factory=_Top)
    tcp_packets: int = 0
    tcp_lost_bytes: int = 0
    tcp_slowest_rtt: _Top = field(default_factory=_Top)

    quic_connections: int = 0
    quic_rtt: Values = field(default_factory=list)
    quic_zero_rtt: int = 0
    quic_retries: int = 0
    quic_migrations: int = 0

    tls_handshakes: int = 0
    tls_ms: Values = field(default_factory=list)
    tls_resumed: int = 0
    tls_hrr: int = 0
    tls_versions: Counter[str] = field(default_factory=Counter)
    tls_alpn: Counter[str] = field(default_factory=Counter)
    tls_decrypted: int = 0
    tls_slowest: _Top = field(default_factory=_Top)
    tls_alerts: list[str] = field(default_factory=list)

    http_requests: int = 0
    http_connections: int = 0
    http_per_conn: Values = field(default_factory=list)
    http_ttfb: Values = field(default_factory=list)
    http_ttlb: Values = field(default_factory=list)
    http_protocols: Counter[str] = field(default_factory=Counter)
    http_estimated: bool = False
    http_estimated_requests: int = 0
    http_single_request_conns: list[str] = field(default_factory=list)
    http_slowest_ttfb: _Top = field(default_factory=_Top)
    stream_responses: int = 0
    resp_connections: int = 0
    resp_commands: Counter[str] = field(default_factory=Counter)
    resp_errors: int = 0
    resp_latency: Values = field(default_factory=list)
    resp_slowest: _Top = field(default_factory=_Top)
    stream_first_event: Values = field(default_factory=list)
    stream_gaps: Values = field(default_factory=list)
    stream_stalls: _Top = field(default_factory=_Top)
    slowest_connections: _Top = field(default_factory=_Top)

    def add_dns(self, t: DnsTransaction) -> None:
        """Count one finished DNS transaction."""
        self.dns_total += 1
        self.dns_retransmissions += t.retransmissions
        self.dns_duplicates += max(0, t.responses - 1)
        label = f"{t.qname} {t.qtype} via {t.server}"
        lat = t.latency_ns
        if lat is None:
            self.dns_unanswered += 1
            if len(self.dns_unanswered_examples) < TOP_K:
                self.dns_unanswered_examples.append(label)
            return
        ms = lat / 1e6
        self.dns_latency.append(ms)
        self.dns_slowest.add(ms, label)
        if t.rcode:
            self.dns_rcodes[t.rcode] += 1
            if t.rcode not in ("NOERROR", "NXDOMAIN") and len(self.dns_failed_examples) < TOP_K:
                self.dns_failed_examples.append(f"{label}: {t.rcode}")

    def add_connection(self, c: Connection) -> None:
        """Count one finished connection and its requests."""
        if c.transport == "udp":
            self._add_quic(c)
        else:
            self._add_tcp(c)
        tls = c.tls
        if tls is not None and tls.client_hello_ns is not None:
            self.tls_handshakes += 1
            self.tls_versions[tls.version or "unknown"] += 1
            if tls.alpn:
                self.tls_alpn[tls.alpn] += 1
            if tls.resumed:
                self.tls_resumed += 1
            if tls.hello_retry:
                self.tls_hrr += 1
            if tls.decrypted:
                self.tls_decrypted += 1
            hs = ns_to_ms(tls.handshake_ns)
            if hs is not None:
                self.tls_ms.append(hs)
                self.tls_slowest.add(hs, c.id)
            if tls.alert and tls.alert.startswith("fatal") and len(self.tls_alerts) < TOP_K:
                self.tls_alerts.append(f"{c.id}: {tls.alert}")
        reqs = c.requests
        ttfbs: list[float] | None = None
        if c.protocol == "resp":
            self._add_resp(c)
            reqs = []
        if reqs:
            self.http_requests += len(reqs)
            self.http_connections += 1
            self.http_per_conn.append(float(len(reqs)))
            if len(reqs) == 1 and len(self.http_single_request_conns) < 1000:
                self.http_single_request_conns.append(c.id)
            self.http_protocols[c.protocol or "unknown"] += len(reqs)
            times = request_times(reqs)
            ttfbs = times.ttfb_ms
            if times.estimated:
                self.http_estimated = True
                self.http_estimated_requests += times.estimated
            self.http_ttfb.extend(times.ttfb_ms)
            self.http_ttlb.extend(times.ttlb_ms)
            for r in times.streams:
                self._add_stream(c.id, r)
            if times.ttfb_ms:
                self.http_slowest_ttfb.add(max(times.ttfb_ms), c.id)
        self.slowest_connections.add_made(_slow_figures(c, ttfbs)[3], c.id,
                                          lambda: slow_row(c))

    def _add_tcp(self, c: Connection) -> None:
        self.tcp_connections += 1
        self.tcp_packets += c.packets
        self.tcp_lost_bytes += c.lost_bytes
        if c.syn_ns is not None and c.handshake_ack_ns is not None:
            rtt = (c.handshake_ack_ns - c.syn_ns) / 1e6
            self.tcp_rtt.append(rtt)
            self.tcp_slowest_rtt.add(rtt, c.id)
        self.tcp_retransmissions += c.retransmissions
        if c.retransmissions:
            self.tcp_retrans_conns.add(c.retransmissions, c.id)
        self.tcp_resets += c.resets
        if c.resets and len(self.tcp_reset_conns) < 1000:
            self.tcp_reset_conns.append(c.id)

    def _add_quic(self, c: Connection) -> None:
        """A QUIC connection: its own counts, kept out of the TCP ones."""
        self.quic_connections += 1
        if c.initial_ns is not None and c.initial_answer_ns is not None:
            self.quic_rtt.append((c.initial_answer_ns - c.initial_ns) / 1e6)
        q = c.quic or {}
        zero = q.get("zero_rtt")
        if isinstance(zero, dict) and zero.get("attempted"):
            self.quic_zero_rtt += 1
        if q.get("retry"):
            self.quic_retries += 1
        migrations = q.get("migrations")
        if isinstance(migrations, int):
            self.quic_migrations += migrations

    def _add_resp(self, c: Connection) -> None:
        """Redis commands: their own figures, kept out of the HTTP ones."""
        self.resp_connections += 1
        for r in c.requests:
            self.resp_commands[r.method or "?"] += 1
            if r.reset:
                self.resp_errors += 1
            if r.first_byte_ns is not None:
                ms = (r.first_byte_ns - r.ts_ns) / 1e6
                self.resp_latency.append(ms)
                self.resp_slowest.add(ms, f"{c.id} {r.method}")

    def _add_stream(self, conn_id: str, r: Request) -> None:
        """A streamed (SSE) answer: time to first event and the cadence after it."""
        self.stream_responses += 1
        if r.first_event_ns is not None:
            self.stream_first_event.append((r.first_event_ns - r.ts_ns) / 1e6)
        if r.chunk_gaps_ns:
            gaps = [g / 1e6 for g in r.chunk_gaps_ns]
            self.stream_gaps.extend(gaps)
            where = f"{conn_id} stream {r.stream_id}" if r.stream_id else conn_id
            self.stream_stalls.add(max(gaps), f"{where} {r.path or ''}".strip())

    @property
    def reuse_rate(self) -> float | None:
        """``(requests - connections_with_requests) / requests``, None without requests."""
        if not self.http_requests:
            return None
        return (self.http_requests - self.http_connections) / self.http_requests

    def build(self) -> Summary:
        """The contract's ``summary`` object."""
        return self._with_quic({
            "dns": {
                "transactions": self.dns_total,
                "answered": self.dns_total - self.dns_unanswered,
                "unanswered": self.dns_unanswered,
                "latency_ms": percentiles(self.dns_latency),
                "retransmissions": self.dns_retransmissions,
                "duplicate_responses": self.dns_duplicates,
                "rcodes": dict(self.dns_rcodes),
            },
            "tcp": {
                "connections": self.tcp_connections,
                "handshake_rtt_ms": percentiles(self.tcp_rtt),
                "retransmissions": self.tcp_retransmissions,
                "resets": self.tcp_resets,
                "reset_connections": len(self.tcp_reset_conns),
                "lost_bytes": self.tcp_lost_bytes,
            },
            "tls": {
                "handshakes": self.tls_handshakes,
                "handshake_ms": percentiles(self.tls_ms),
                "resumed": self.tls_resumed,
                "hello_retry": self.tls_hrr,
                "versions": dict(self.tls_versions),
                "alpn": dict(self.tls_alpn),
                "decrypted": self.tls_decrypted,
            },
            "http": {
                "requests": self.http_requests,
                "connections": self.http_connections,
                "reuse_rate": self.reuse_rate,
                "requests_per_connection": percentiles(self.http_per_conn),
                "ttfb_ms": percentiles(self.http_ttfb),
                "ttlb_ms": percentiles(self.http_ttlb),
                "protocols": dict(self.http_protocols),
                "estimated": self.http_estimated,
                "estimated_requests": self.http_estimated_requests,
                "streaming": {
                    "responses": self.stream_responses,
                    "first_event_ms": percentiles(self.stream_first_event),
                    "gap_ms": percentiles(self.stream_gaps),
                    "longest_stall_ms": max(self.stream_gaps) if self.stream_gaps else None,
                },
            },
            "resp": {
                "connections": self.resp_connections,
                "commands": sum(self.resp_commands.values()),
                "by_command": dict(self.resp_commands),
                "errors": self.resp_errors,
                "latency_ms": percentiles(self.resp_latency),
            },
            "paths": {},
        })


    def _with_quic(self, summary: Summary) -> Summary:
        """``summary`` with ``quic`` after ``tcp`` when the capture had QUIC connections;
        unchanged otherwise (so that the summary of a capture without QUIC is what it
        always was)."""
        if not self.quic_connections:
            return summary
        quic: QuicSummary = {"connections": self.quic_connections,
                             "handshake_rtt_ms": percentiles(self.quic_rtt),
                             "zero_rtt_attempted": self.quic_zero_rtt,
                             "retries": self.quic_retries,
                             "migrations": self.quic_migrations}
        out: dict[str, Any] = {}
        for key, value in summary.items():
            out[key] = value
            if key == "tcp":
                out["quic"] = quic
        return cast(Summary, out)


class NoSummary(SummaryBuilder):
    """Adds nothing up: for a run whose records another summary counts (a flow shard's,
    replayed by its parent; a fleet's set, counted by the fleet)."""

    def add_dns(self, t: DnsTransaction) -> None:
        pass

    def add_connection(self, c: Connection) -> None:
        pass


def _slow_figures(c: Connection, ttfbs: list[float] | None = None
                  ) -> tuple[float | None, float | None, float | None, float]:
    """(handshake RTT, TLS handshake, worst time to first byte, the worst of them) in ms.
    ``ttfbs``: the requests' times to first byte when already taken."""
    rtt = None
    if c.syn_ns is not None and c.handshake_ack_ns is not None:
        rtt = (c.handshake_ack_ns - c.syn_ns) / 1e6
    elif c.initial_ns is not None and c.initial_answer_ns is not None:
        rtt = (c.initial_answer_ns - c.initial_ns) / 1e6
    tls_ms = ns_to_ms(c.tls.handshake_ns) if c.tls is not None else None
    if ttfbs is None:
        ttfbs = [(r.first_byte_ns - r.ts_ns) / 1e6 for r in c.requests
                 if r.first_byte_ns is not None]
    ttfb = max(ttfbs) if ttfbs else None
    worst = max(v for v in (rtt, tls_ms, ttfb, 0.0) if v is not None)
    return rtt, tls_ms, ttfb, worst


def slow_row(c: Connection) -> dict[str, Any]:
    """What the terminal shows of a connection among the slowest ones."""
    rtt, tls_ms, ttfb, worst = _slow_figures(c)
    return {"id": c.id, "client": c.client, "server": c.server,
            "sni": c.tls.sni if c.tls is not None else None, "protocol": c.protocol,
            "rtt_ms": rtt, "tls_ms": tls_ms, "ttfb_ms": ttfb, "requests": len(c.requests),
            "retransmissions": c.retransmissions, "resets": c.resets, "worst_ms": worst,
            "estimated": any(r.estimated for r in c.requests)}
