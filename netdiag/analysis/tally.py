"""The per-request figures the summary counts, taken from a connection's requests in one
loop (a function of its own: the summary's builder calls it for every connection)."""

from __future__ import annotations

from dataclasses import dataclass, field

from netdiag.records import Request


@dataclass(slots=True)
class RequestTimes:
    """What :func:`request_times` finds in one connection's requests, in their order."""

    ttfb_ms: list[float] = field(default_factory=list)
    """Time to first byte of each request that has one (ms)."""
    ttlb_ms: list[float] = field(default_factory=list)
    """Time to last byte of each request that has one (ms)."""
    estimated: int = 0
    """Requests estimated from encrypted record timing."""
    streams: list[Request] = field(default_factory=list)
    """Requests answered with server-sent events."""

    def __init__(self, ttfb_ms: list[float] | None = None, ttlb_ms: list[float] | None = None,
                 estimated: int = 0, streams: list[Request] | None = None) -> None:
        self.ttfb_ms = [] if ttfb_ms is None else ttfb_ms
        self.ttlb_ms = [] if ttlb_ms is None else ttlb_ms
        self.estimated = estimated
        self.streams = [] if streams is None else streams


def request_times(reqs: list[Request]) -> RequestTimes:
    """The time to first and to last byte of ``reqs``, how many are estimated, and the
    streamed ones."""
    out = RequestTimes()
    ttfb, ttlb = out.ttfb_ms, out.ttlb_ms
    estimated = 0
    for r in reqs:
        if r.estimated:
            estimated += 1
        fb = r.first_byte_ns
        if fb is not None:
            ttfb.append((fb - r.ts_ns) / 1e6)
        lb = r.last_byte_ns
        if lb is not None:
            ttlb.append((lb - r.ts_ns) / 1e6)
        if r.sse_events:
            out.streams.append(r)
    out.estimated = estimated
    return out
