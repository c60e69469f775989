"""The mergeable percentiles (DDSketch) against exact ones: the stated error bound."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from netdiag.analysis.findings import Thresholds, build_findings
from netdiag.analysis.stats import percentiles
from netdiag.analysis.summary import SummaryBuilder
from netdiag.fleet.sketch import SketchedSummary, SketchValues
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
QS = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _check_bound(block: dict[str, float | int | None], values: list[float], a: float) -> None:
    """Each sketched pq within a of x_r (r = floor(q (n-1))), the exact one in
    [x_r, x_r+1]; count, min and max exact, the mean to float rounding."""
    xs = sorted(values)
    n = len(xs)
    exact = percentiles(xs)
    assert block["count"] == n
    assert block["min"] == exact["min"] and block["max"] == exact["max"]
    assert block["mean"] == pytest.approx(exact["mean"], rel=1e-9, abs=1e-6)
    for key, q in QS.items():
        r = math.floor(q * (n - 1))
        lo = xs[r]
        got = block[key]
        assert got is not None
        # the block rounds to the nanosecond (6 decimals of a millisecond)
        assert (1 - a) * lo - 1e-6 <= got <= (1 + a) * lo + 1e-6, (key, got, lo)
        assert xs[r] - 1e-6 <= exact[key] <= xs[min(r + 1, n - 1)] + 1e-6  # type: ignore[operator]


@pytest.mark.parametrize("a", [0.01, 0.05])
def test_merged_sketches_keep_the_bound(a: float) -> None:
    rng = random.Random(14)
    parts = [[rng.lognormvariate(3, 1.2) for _ in range(rng.randint(1, 4000))]
             for _ in range(9)]
    parts.append([0.0, 0.0, 1e-6, 5e4])  # zeros, tiny and huge values
    merged = SketchValues(a)
    for p in parts:
        merged.merge(SketchValues(a, p))
    values = [v for p in parts for v in p]
    _check_bound(merged.block(), values, a)
    # the order of merging does not matter
    other = SketchValues(a)
    for p in reversed(parts):
        other.merge(SketchValues(a, p))
    assert other.block() == merged.block()
    # iteration represents every value within the bound
    assert len(list(merged)) == len(values)
    for got, want in zip(sorted(merged), sorted(values), strict=True):
        assert abs(got - want) <= a * abs(want) + 1e-12


def test_sketches_of_different_accuracy_do_not_merge() -> None:
    with pytest.raises(ValueError):
        SketchValues(0.01, [1.0]).merge(SketchValues(0.02, [2.0]))


def test_empty_sketch_block_is_null() -> None:
    assert SketchValues().block() == percentiles([])


def test_sketched_summary_of_a_capture() -> None:
    """Summaries of parts, sketched and merged, against the exact summary of the whole."""
    from netdiag.tls.keylog import KeyLog

    sink = CollectingSink()
    res = analyze([str(ANTHO)], sink, Options(keylog=KeyLog.from_file(KEYS)))
    exact = res.summary
    halves = [SummaryBuilder(), SummaryBuilder()]
    for i, t in enumerate(sink.dns_records):
        halves[i % 2].add_dns(t)
    for i, c in enumerate(sink.connections):
        halves[i % 2].add_connection(c)
    sketched = SketchedSummary(0.01)
    for h in halves:
        sketched.absorb(SketchedSummary.of(h, 0.01))
    doc = sketched.build()
    want = exact.build()
    assert doc["sketch"] == {"relative_accuracy": 0.01}
    for section, key, values in (("dns", "latency_ms", exact.dns_latency),
                                 ("tcp", "handshake_rtt_ms", exact.tcp_rtt),
                                 ("tls", "handshake_ms", exact.tls_ms),
                                 ("http", "ttfb_ms", exact.http_ttfb),
                                 ("http", "requests_per_connection", exact.http_per_conn)):
        if values:
            _check_bound(doc[section][key], values, 0.01)  # type: ignore[literal-required]
    # the counters are exact
    for section in ("dns", "tcp", "tls", "http"):
        for k, v in want[section].items():  # type: ignore[literal-required]
            if (not isinstance(v, dict) or "p50" not in v) and k != "streaming":
                assert doc[section][k] == v, (section, k)  # type: ignore[literal-required]
    # findings still work on a sketched summary, with the same codes
    t = Thresholds()
    assert ([f.code for f in build_findings(sketched, t)]
            == [f.code for f in build_findings(exact, t)])
