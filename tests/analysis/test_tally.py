"""The summary's per-request loop (netdiag.analysis.tally, compiled) against the figures
taken one request at a time, and the summary built from it."""

from __future__ import annotations

import random

from netdiag.analysis.summary import SummaryBuilder, slow_row
from netdiag.analysis.tally import request_times
from netdiag.records import Connection, Request


def _requests(rng: random.Random, n: int) -> list[Request]:
    out = []
    for _ in range(n):
        ts = rng.randint(0, 10**12)
        fb = ts + rng.randint(0, 10**9) if rng.random() < 0.7 else None
        lb = (fb or ts) + rng.randint(0, 10**9) if rng.random() < 0.6 else None
        out.append(Request(ts_ns=ts, first_byte_ns=fb, last_byte_ns=lb,
                           estimated=rng.random() < 0.5,
                           sse_events=rng.choice([None, 0, 1, 7])))
    return out


def test_request_times_are_each_requests_figures_in_order() -> None:
    rng = random.Random(5)
    for _ in range(300):
        reqs = _requests(rng, rng.randint(0, 12))
        got = request_times(reqs)
        assert got.ttfb_ms == [(r.first_byte_ns - r.ts_ns) / 1e6 for r in reqs
                               if r.first_byte_ns is not None]
        assert got.ttlb_ms == [(r.last_byte_ns - r.ts_ns) / 1e6 for r in reqs
                               if r.last_byte_ns is not None]
        assert got.estimated == sum(1 for r in reqs if r.estimated)
        assert got.streams == [r for r in reqs if r.sse_events]


def test_summary_counts_and_ranks_from_the_request_times() -> None:
    """The summary's request figures, and the slowest connections it keeps, are those of
    each request and of :func:`slow_row` (which walks the requests itself)."""
    rng = random.Random(8)
    conns = []
    for i in range(60):
        c = Connection(id=f"C{i + 1}", transport="tcp", client="10.0.0.1:40000",
                       server="10.0.0.2:443", ts_ns=0)
        c.protocol = rng.choice(["h2", "http/1.1", "resp"])
        c.requests = _requests(rng, rng.randint(0, 6))
        if rng.random() < 0.5:  # a handshake slower than some answers
            c.syn_ns, c.handshake_ack_ns = 0, rng.randint(0, 2 * 10**9)
        conns.append(c)
    s = SummaryBuilder()
    for c in conns:
        s.add_connection(c)
    http = [r for c in conns if c.protocol != "resp" for r in c.requests]
    assert sorted(s.http_ttfb) == sorted((r.first_byte_ns - r.ts_ns) / 1e6 for r in http
                                         if r.first_byte_ns is not None)
    assert s.http_estimated_requests == sum(1 for r in http if r.estimated)
    assert s.stream_responses == sum(1 for r in http if r.sse_events)
    worst = sorted((slow_row(c)["worst_ms"] for c in conns), reverse=True)
    assert [v for v, _label in s.slowest_connections.items()] == worst[:len(
        s.slowest_connections.items())]
