"""Percentiles that merge: the summary's percentile blocks from DDSketches.

The exact summary keeps one float per measured figure and sorts them at the end. When a
fleet's records would not fit (``report --max-records``), the summary keeps instead, per
figure, a DDSketch (Masson, Rim and Lee, VLDB 2019; the ``ddsketch`` package): values
are counted in buckets whose bounds grow geometrically by ``(1 + a) / (1 - a)``, so
that any value is represented within a relative error ``a`` (``relative_accuracy``), in
memory that grows with the logarithm of the range of values (about 1,000 buckets from
1 us to 1,000 s at 1 %), not with their number. Two sketches of the same accuracy
merge exactly into the sketch of all the values (bucket counts add), in any order.

What a sketched percentile block promises, for ``n`` values ``x_0 <= ... <= x_n-1``:

* ``count``, ``min``, ``max`` are exact, ``mean`` is exact up to float rounding (the
  sum is kept alongside);
* ``pq`` is within ``a`` (relative) of ``x_r``, ``r = floor(q (n - 1))``: the exact
  block interpolates between ``x_r`` and ``x_r+1``, so
  ``(1 - a) x_r <= pq <= (1 + a) x_r`` and the exact figure lies in ``[x_r, x_r+1]``
  (``tests/fleet/test_sketch.py`` checks both against exact percentiles).

The report says a summary is sketched: ``summary.sketch = {"relative_accuracy": a}``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from netdiag.analysis.stats import ms_figure
from netdiag.analysis.summary import TOP_K, SummaryBuilder, _Top
from netdiag.contract import Percentiles, Summary

DEFAULT_RELATIVE_ACCURACY = 0.01
"""The sketches' relative error bound (1 %)."""

PERCENTILE_FIELDS: dict[str, tuple[str, ...]] = {
    "dns_latency": ("dns", "latency_ms"),
    "tcp_rtt": ("tcp", "handshake_rtt_ms"),
    "quic_rtt": ("quic", "handshake_rtt_ms"),
    "tls_ms": ("tls", "handshake_ms"),
    "http_per_conn": ("http", "requests_per_connection"),
    "http_ttfb": ("http", "ttfb_ms"),
    "http_ttlb": ("http", "ttlb_ms"),
    "stream_first_event": ("http", "streaming", "first_event_ms"),
    "stream_gaps": ("http", "streaming", "gap_ms"),
    "resp_latency": ("resp", "latency_ms"),
}
"""``SummaryBuilder`` value lists and where their percentile block sits in the summary."""
EXAMPLE_CAPS = {"tcp_reset_conns": 1000, "http_single_request_conns": 1000}
"""Caps of the example lists ``SummaryBuilder`` keeps (the others keep ``TOP_K``)."""


def _sketch(relative_accuracy: float) -> Any:
    try:
        from ddsketch import DDSketch
    except ImportError as e:  # pragma: no cover - the scale extra is a test dependency
        from netdiag.errors import InputError

        raise InputError("sketched percentiles need ddsketch: pip install ddsketch") from e
    return DDSketch(relative_accuracy=relative_accuracy)


class SketchValues:
    """A value list that keeps a DDSketch instead of its values (what ``SummaryBuilder``
    does with its lists: ``append``, ``extend``, ``len``, truth, iteration), plus the
    exact count, minimum, maximum and sum, and :meth:`block`."""

    __slots__ = ("count", "max", "min", "relative_accuracy", "sketch", "sum")

    def __init__(self, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
                 values: Iterable[float] = ()) -> None:
        self.relative_accuracy = relative_accuracy
        self.sketch = _sketch(relative_accuracy)
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.sum = 0.0
        self.extend(values)

    def append(self, v: float | None) -> None:
        if v is None:
            return
        self.sketch.add(v)
        self.count += 1
        self.sum += v
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v

    def extend(self, values: Iterable[float | None]) -> None:
        for v in values:
            self.append(v)

    def merge(self, other: SketchValues) -> None:
        """Add ``other``'s values (same relative accuracy)."""
        if other.count == 0:
            return
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError("sketches of different accuracy do not merge")
        self.sketch.merge(other.sketch)
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[float]:
        """Each value as its bucket represents it (within the relative accuracy), in
        ascending order: what findings count and take medians of."""
        s = self.sketch
        mapping = s._mapping
        neg = s._negative_store
        for i in range(len(neg.bins) - 1, -1, -1):
            c = round(neg.bins[i])
            if c:
                v = -mapping.value(i + neg.offset)
                for _ in range(c):
                    yield v
        for _ in range(round(s._zero_count)):
            yield 0.0
        pos = s._store
        for i, c_float in enumerate(pos.bins):
            c = round(c_float)
            if c:
                v = mapping.value(i + pos.offset)
                for _ in range(c):
                    yield v

    def quantile(self, q: float) -> float | None:
        """The sketched ``q`` quantile (module docstring), within [min, max]."""
        if not self.count:
            return None
        v = float(self.sketch.get_quantile_value(q))
        return min(max(v, self.min), self.max)

    def block(self) -> Percentiles:
        """The contract's percentile block of the values (module docstring)."""
        if not self.count:
            return {"count": 0, "min": None, "p50": None, "p90": None, "p99": None,
                    "max": None, "mean": None}

        def q(x: float) -> float:
            v = self.quantile(x)
            assert v is not None
            return ms_figure(v)

        return {"count": self.count, "min": ms_figure(self.min), "p50": q(0.5),
                "p90": q(0.9), "p99": q(0.99), "max": ms_figure(self.max),
                "mean": ms_figure(self.sum / self.count)}


class SketchedSummary(SummaryBuilder):
    """A ``SummaryBuilder`` whose value lists are :class:`SketchValues`: memory bounded
    whatever the number of records, and mergeable (:meth:`absorb`)."""

    def __init__(self, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> None:
        super().__init__()
        self.relative_accuracy = relative_accuracy
        for name in PERCENTILE_FIELDS:
            setattr(self, name, SketchValues(relative_accuracy))

    @classmethod
    def of(cls, builder: SummaryBuilder,
           relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> SketchedSummary:
        """The sketched form of an exact summary."""
        out = cls(relative_accuracy)
        out.absorb(builder)
        return out

    def absorb(self, other: SummaryBuilder) -> None:
        """Add everything ``other`` (exact or sketched) counted, as if its records had
        been added here: counters add, value lists merge into the sketches, the worst
        offenders and examples are kept as each builder keeps them."""
        for f in dataclasses.fields(SummaryBuilder):
            name = f.name
            mine = getattr(self, name)
            theirs = getattr(other, name)
            if name in PERCENTILE_FIELDS:
                if isinstance(theirs, SketchValues):
                    mine.merge(theirs)
                else:
                    mine.extend(theirs)
            elif isinstance(mine, bool):
                setattr(self, name, mine or theirs)
            elif isinstance(mine, int | float):
                setattr(self, name, mine + theirs)
            elif isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, _Top):
                _merge_top(mine, theirs)
            elif isinstance(mine, list):
                cap = EXAMPLE_CAPS.get(name, TOP_K)
                mine.extend(theirs[:max(0, cap - len(mine))])

    def build(self) -> Summary:
        """The summary, its percentile blocks from the sketches, and ``sketch``."""
        saved = {name: getattr(self, name) for name in PERCENTILE_FIELDS}
        try:
            for name in saved:
                setattr(self, name, [])
            doc = super().build()
        finally:
            for name, values in saved.items():
                setattr(self, name, values)
        for name, where in PERCENTILE_FIELDS.items():
            target: Any = doc
            for part in where[:-1]:
                target = target.get(part)
                if target is None:  # a block only some summaries have (quic)
                    break
            else:
                target[where[-1]] = saved[name].block()
        gaps = saved["stream_gaps"]
        doc["http"]["streaming"]["longest_stall_ms"] = gaps.max if gaps.count else None
        out: Any = doc
        out["sketch"] = {"relative_accuracy": self.relative_accuracy}
        return doc


def _merge_top(mine: _Top, theirs: _Top) -> None:
    """Keep the ``k`` largest of both (ties: ``theirs`` after ``mine``, as if added later)."""
    for value, _n, label, payload in sorted(theirs.heap, key=lambda it: -it[1]):
        mine.add(value, label, payload)
    mine.n += max(0, theirs.n - len(theirs.heap))
    heapq.heapify(mine.heap)
