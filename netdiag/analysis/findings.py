"""Plain-words findings from the summary, each with its threshold and evidence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netdiag.analysis.stats import quantile
from netdiag.analysis.summary import SummaryBuilder
from netdiag.records import Finding


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Limits beyond which a figure becomes a finding (all overridable on the CLI)."""

    dns_slow_ms: float = 100.0
    """A DNS answer slower than this is slow."""
    dns_unanswered_max: float = 0.0
    """Share of unanswered DNS transactions tolerated (0: any is reported)."""
    rtt_slow_ms: float = 100.0
    """A TCP handshake RTT above this is slow."""
    tls_slow_ms: float = 200.0
    """A TLS handshake longer than this is slow."""
    ttfb_slow_ms: float = 1000.0
    """A time to first byte longer than this is slow."""
    reuse_min: float = 0.8
    """Connection reuse below this (with enough requests) is low."""
    reuse_min_requests: int = 5
    """Reuse is judged only with at least this many requests."""
    retrans_max: float = 0.01
    """Retransmitted segments above this share of TCP packets are reported."""
    stall_ms: float = 500.0
    """A pause longer than this between two events of a streamed answer is a stall."""


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _ms(x: float) -> str:
    return f"{x:.1f} ms" if x < 1000 else f"{x / 1000:.2f} s"


def _over(top: Any, limit: float) -> list[tuple[float, str]]:
    """The ``(value, label)`` pairs a summary's top-k list holds above ``limit``, worst first."""
    return [(v, lab) for v, lab in top.items() if v > limit]


Rule = Callable[[SummaryBuilder, Thresholds], "Finding | None"]
"""One finding's rule: the finding the summary supports under the thresholds, or None."""


def _slow_dns(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    slow = _over(s.dns_slowest, t.dns_slow_ms)
    if not slow:
        return None
    n = sum(1 for v in s.dns_latency if v > t.dns_slow_ms)
    return Finding(
        "warning", "slow-dns",
        f"{n} DNS answer{'s' if n != 1 else ''} took longer than {_ms(t.dns_slow_ms)}",
        f"Slowest: {_ms(slow[0][0])} for {slow[0][1]}. Median DNS latency is "
        f"{_ms(quantile(sorted(s.dns_latency), 0.5))}. Look at the resolver named.",
        [lab for _v, lab in slow])


def _unanswered_dns(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    if not (s.dns_total and s.dns_unanswered / s.dns_total > t.dns_unanswered_max):
        return None
    share = s.dns_unanswered / s.dns_total
    return Finding(
        "critical" if share > 0.1 else "warning", "unanswered-dns",
        f"{s.dns_unanswered} of {s.dns_total} DNS queries got no answer ({_pct(share)})",
        f"{s.dns_retransmissions} query retransmissions were seen. A client waits its "
        "resolver timeout (often 1-5 s) for each of these.", s.dns_unanswered_examples)


def _dns_errors(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    if not s.dns_failed_examples:
        return None
    return Finding(
        "warning", "dns-errors", f"{len(s.dns_failed_examples)} DNS answers were errors",
        "Responses with SERVFAIL, REFUSED or similar rcodes: " +
        ", ".join(f"{k} {v}" for k, v in s.dns_rcodes.items() if k not in ("NOERROR",)),
        s.dns_failed_examples)


def _slow_tcp(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    slow = _over(s.tcp_slowest_rtt, t.rtt_slow_ms)
    if not slow:
        return None
    return Finding(
        "warning", "slow-tcp-handshake",
        f"TCP handshakes up to {_ms(slow[0][0])} (threshold {_ms(t.rtt_slow_ms)})",
        "The network round trip itself is slow on these connections (SYN to the "
        "handshake's final ACK); every request on them pays it again.",
        [lab for _v, lab in slow])


def _slow_tls(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    slow = _over(s.tls_slowest, t.tls_slow_ms)
    if not slow:
        return None
    n = sum(1 for v in s.tls_ms if v > t.tls_slow_ms)
    return Finding(
        "warning", "slow-tls-handshake",
        f"{n} TLS handshake{'s' if n != 1 else ''} took longer than {_ms(t.tls_slow_ms)}",
        f"Slowest {_ms(slow[0][0])} ({slow[0][1]}); median "
        f"{_ms(quantile(sorted(s.tls_ms), 0.5))}. Slow handshakes point at the TLS "
        "terminator (CPU, OCSP, certificate chain) or at round trips.",
        [lab for _v, lab in slow])


def _tls_alerts(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    if not s.tls_alerts:
        return None
    return Finding(
        "warning", "tls-alerts", f"{len(s.tls_alerts)} connection(s) ended with a fatal "
        "TLS alert", "; ".join(s.tls_alerts), [a.split(":")[0] for a in s.tls_alerts])


def _low_reuse(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    rate = s.reuse_rate
    if rate is None or s.http_requests < t.reuse_min_requests or rate >= t.reuse_min:
        return None
    new_share = s.http_connections / s.http_requests
    est = " (estimated from encrypted records)" if s.http_estimated else ""
    return Finding(
        "warning", "low-connection-reuse",
        f"{_pct(new_share)} of requests opened a new connection{est}",
        f"Connection reuse is {_pct(rate)} ({s.http_requests} requests on "
        f"{s.http_connections} connections), below {_pct(t.reuse_min)}: each new "
        "connection pays a TCP and TLS handshake before its request.",
        s.http_single_request_conns[:20])


def _slow_ttfb(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    slow = _over(s.http_slowest_ttfb, t.ttfb_slow_ms)
    if not slow:
        return None
    return Finding(
        "warning", "slow-ttfb",
        f"Time to first byte up to {_ms(slow[0][0])} (threshold {_ms(t.ttfb_slow_ms)})",
        "The server (or a layer in front of it) took long to start answering.",
        [lab for _v, lab in slow])


def _stalls(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    stalls = _over(s.stream_stalls, t.stall_ms)
    if not stalls:
        return None
    n = sum(1 for v in s.stream_gaps if v > t.stall_ms)
    return Finding(
        "warning", "streaming-stalls",
        f"Streamed answers stalled {n} time(s) for more than {_ms(t.stall_ms)}",
        f"Longest pause between two events: {_ms(stalls[0][0])} ({stalls[0][1]}); "
        f"median cadence {_ms(quantile(sorted(s.stream_gaps), 0.5))}. A user sees the "
        "answer freeze: look at the origin's generation or at flow-control stalls.",
        [lab for _v, lab in stalls])


def _retransmissions(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    if not (s.tcp_retransmissions and s.tcp_packets):
        return None
    share = s.tcp_retransmissions / s.tcp_packets
    if share <= t.retrans_max:
        return None
    return Finding(
        "critical" if share > 0.05 else "warning", "retransmissions",
        f"{s.tcp_retransmissions} TCP retransmissions ({_pct(share)} of TCP packets)",
        "Packet loss or heavy reordering; retransmissions add at least one round "
        "trip, often a retransmission timeout, to the requests they hit.",
        [lab for _v, lab in s.tcp_retrans_conns.items()])


def _resets(s: SummaryBuilder, t: Thresholds) -> Finding | None:
    if not s.tcp_reset_conns:
        return None
    return Finding(
        "warning", "connection-resets",
        f"{len(s.tcp_reset_conns)} connection(s) were reset",
        "A RST ends a connection abruptly: look for a peer or middlebox closing "
        "connections (idle timeouts, load balancer drains, crashes).",
        s.tcp_reset_conns[:20])


RULES: tuple[Rule, ...] = (
    _slow_dns, _unanswered_dns, _dns_errors, _slow_tcp, _slow_tls, _tls_alerts,
    _low_reuse, _slow_ttfb, _stalls, _retransmissions, _resets,
)
"""Every summary rule, in the order their findings are listed within a severity."""

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def build_findings(s: SummaryBuilder, t: Thresholds,
                   truncated: bool = False) -> list[Finding]:
    """Every finding the summary supports (one per rule of :data:`RULES` at most, and
    one for a damaged capture), most severe first."""
    out: list[Finding] = []
    if truncated:
        out.append(Finding(
            "critical", "capture-truncated", "The capture is damaged or cut short",
            "Everything before the damage is reported; see capture.warnings for where it "
            "stopped. Figures near the end may be incomplete.", []))
    for rule in RULES:
        found = rule(s, t)
        if found is not None:
            out.append(found)
    out.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    return out
