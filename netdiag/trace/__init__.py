"""``netdiag trace``: traceroute (TCP SYN, UDP, ICMP) with per-hop loss and RTT percentiles."""

from netdiag.trace.traceroute import (
    Hop,
    Probe,
    TraceError,
    TraceResult,
    attribute,
    summarize,
    trace,
)

__all__ = ["Hop", "Probe", "TraceError", "TraceResult", "attribute", "summarize", "trace"]
