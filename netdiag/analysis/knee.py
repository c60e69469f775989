"""The knee of latency against load: the request rate above which a path's latency departs
from its low-load level, with its uncertainty, or why the data cannot support one.

Input, per path: one point per time interval, the interval's request rate (req/s, the
offered load), its number of requests, and a latency statistic of the interval (p99 or
p50 time to first byte, in ms).

Method (:func:`find_knee`): a change point in the level of latency, read the way an SRE
says it ("p99 passes 1.5 times its quiet level above 1,150 req/s"):

1. *Usable intervals.* An interval is used when it holds at least ``min_count`` requests
   and a finite, non-negative rate and a finite latency; at least ``min_points`` of them
   are needed, at two or more distinct rates, and a negative latency anywhere declines
   (it is not a latency).
2. *The split.* The intervals are sorted by rate. For every split between two distinct
   rates that leaves at least ``min_side`` intervals, at two or more distinct rates, on
   each side, the *low-load level* ``L`` is the median latency of the intervals at or
   below it, and an interval is *elevated* when its latency exceeds ``T = max(L (1 +
   min_rise), L + min_rise_ms)``. The knee is the split that misplaces the fewest
   intervals (elevated ones at or below it, not elevated ones above it), the lowest such
   split on a tie; its rate is the midpoint of the two rates around it. One sort, then
   O(log n) per split (a sorted prefix and bisection): an hour of 1 s intervals takes
   milliseconds. Each interval counts once: on a ramp an interval's count grows with the
   rate, and weighting by it would let the busiest intervals outvote the plateau that
   defines the knee.

   Why a level change and not a fitted hinge (flat, then a straight rise): past a
   queue's capacity latency grows with *time* (the backlog accumulates) and so, on a
   ramp, faster than linearly in the rate; a least-squares hinge then puts its break
   where the steep part, extended back, meets the plateau, late by up to half the
   capacity on a ramp to twice it, while the level change stays where latency leaves
   its plateau.
3. *Is there a knee?* In order, each with its reason when it fails:

   * the median above the knee exceeds ``L`` by at least ``max(min_rise L, min_rise_ms)``;
   * the departure is sustained: at least :data:`SUSTAINED` of the intervals above the
     knee are elevated, and at most ``1 - SUSTAINED`` of those at or below it;
   * it is not the continuation of a trend: a straight line fitted to the intervals at
     or below the knee (its slope clamped at 0 or more), extended above it, leaves at
     least :data:`BEYOND_TREND` of the intervals above the knee elevated against it (a
     straight rise from the first interval declines here);
   * it is not chance: the elevated intervals gather above the knee more than a random
     placement would (hypergeometric tail probability), at :data:`ALPHA` after a
     Bonferroni correction for the number of splits tried.
4. *Uncertainty.* A percentile bootstrap over intervals: the usable intervals are
   resampled with replacement (``random.Random(seed)``) and the knee is found again,
   with every test of step 3, on each resample; a resample that declines is a failure.
   The 95% interval is the 2.5% and 97.5% percentiles of the accepted knees. When more
   than :data:`MAX_FAILED_SHARE` of the resamples fail, or the interval is wider than
   :data:`MAX_CI_SHARE` of the observed rate range, the knee is declined as not stable
   under resampling. The cost is bounded: at most :data:`BOOTSTRAP_DRAWS` intervals are
   drawn in all (fewer resamples for long series, never fewer than
   :data:`MIN_RESAMPLES`). The result depends only on the data and the seed.
5. ``slope_ms_per_rps`` is the least-squares slope of the intervals above the knee
   (how fast latency grows past it), for information.

Nothing here raises on any input (empty, NaN, infinite, zero counts, one rate only,
negative values, unequal lengths): it declines, saying why.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netdiag.analysis.stats import LEVEL, quantile

SUSTAINED = 0.8
"""At least this share of the intervals above a knee must be elevated (and at most the
rest of those at or below it)."""
BEYOND_TREND = 0.6
"""At least this share of the intervals above a knee must be elevated against the trend
of the intervals below it, extended."""
SMOOTH_HALF = 2
"""The split is found on a running median of 2 * SMOOTH_HALF + 1 intervals in rate order
(a p99 of a few requests is noisy); the reported levels are the raw medians."""
ALPHA = 1e-3
"""The elevated intervals must gather above the knee with a (Bonferroni-corrected)
hypergeometric tail probability of at most this."""
MAX_FAILED_SHARE = 0.2
"""A knee is declined when more than this share of the bootstrap resamples find none."""
MAX_CI_SHARE = 0.5
"""A knee is declined when its interval is wider than this share of the observed range of
rates."""
BOOTSTRAP_DRAWS = 400_000
"""At most this many intervals are drawn over all bootstrap resamples (bounds the cost of a
long series: its resamples are fewer)."""
MIN_RESAMPLES = 100
"""The bootstrap never uses fewer resamples than this (nor more than asked for)."""
MAX_FIGURE = 1e30
"""Rates, latencies and counts above this decline (their sums of squares could overflow)."""
@dataclass(frozen=True)
class Knee:
    """The request rate above which latency departs from its low-load level."""

    rate_per_s: float
    """The knee: the request rate (req/s) above which latency departs from its low-load
    level (the midpoint between the rates around the split)."""
    ci: tuple[float, float]
    """95% percentile-bootstrap interval of ``rate_per_s`` (req/s)."""
    below_ms: float
    """Low-load level: the median of the statistic over the intervals at or below the knee."""
    above_ms: float
    """The level above the knee: the median of the statistic over the intervals above it."""
    slope_ms_per_rps: float
    """Least-squares growth of the latency above the knee (ms per req/s)."""
    points: int
    """Usable intervals the fit used."""
    below: int
    """Usable intervals at or below the knee."""
    above: int
    """Usable intervals above the knee."""

    def to_json(self) -> dict[str, Any]:
        """The contract's fields: rates to 0.1 req/s, milliseconds to the microsecond, the
        slope to four significant figures."""
        return {
            "rate_per_s": round(self.rate_per_s, 1),
            "ci": [round(self.ci[0], 1), round(self.ci[1], 1)],
            "below_ms": round(self.below_ms, 3),
            "above_ms": round(self.above_ms, 3),
            "slope_ms_per_rps": float(f"{self.slope_ms_per_rps:.4g}"),
            "points": self.points,
            "below": self.below,
            "above": self.above,
        }


@dataclass(frozen=True)
class Declined:
    """No knee: the data cannot support one."""

    reason: str
    """Why, in one plain sentence."""
    points: int
    """Usable intervals (0 when the input could not be read)."""

    def to_json(self) -> dict[str, Any]:
        """``{"declined": reason, "points": points}``."""
        return {"declined": self.reason, "points": self.points}


# --------------------------------------------------------------------------- input


def _num(x: object) -> float:
    """``x`` as a float, NaN when it is not a number."""
    if isinstance(x, bool):
        return math.nan
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _usable(rates: Sequence[float], values: Sequence[float], counts: Sequence[int],
            min_count: float) -> tuple[list[tuple[float, float, float]], int, int, str | None]:
    """The usable ``(rate, value, count)`` points, the number of intervals, the number
    with at least ``min_count`` requests, and why the input is unreadable (None when it
    is read)."""
    try:
        r, v, c = list(rates), list(values), list(counts)
    except TypeError:
        return [], 0, 0, "the rates, latencies and counts are not sequences"
    if not len(r) == len(v) == len(c):
        return [], 0, 0, (f"the rates, latencies and counts differ in length "
                          f"({len(r)}, {len(v)} and {len(c)})")
    out = []
    enough = 0
    for ri, vi, ci in zip(r, v, c, strict=True):
        rate, value, count = _num(ri), _num(vi), _num(ci)
        if count >= min_count and count > 0 and math.isfinite(count):
            enough += 1
            if math.isfinite(rate) and rate >= 0 and math.isfinite(value):
                out.append((rate, value, count))
    return out, len(r), enough, None


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class _Opts:
    """The thresholds of one :func:`find_knee` call."""

    min_side: int
    min_rise: float
    min_rise_ms: float


@dataclass(frozen=True)
class _Fit:
    """An accepted knee: its rate, the slope above it, the points at or below and above
    it and the medians of the latency there."""

    k: float
    b: float
    below: int
    above: int
    below_ms: float
    above_ms: float


def _median_sorted(values: list[float]) -> float:
    values.sort()
    return quantile(values, 0.5)


def _threshold(level: float, opts: _Opts) -> float:
    return max(level * (1.0 + opts.min_rise), level + opts.min_rise_ms)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``(slope, mean x, mean y)``; slope 0 when x does not vary."""
    n = len(xs)
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return 0.0, mx, my
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx, mx, my


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _tail(n: int, elevated: int, m: int, hits: int) -> float:
    """P(at least ``hits`` elevated among ``m`` intervals drawn from ``n`` holding
    ``elevated``): the hypergeometric upper tail."""
    top = min(elevated, m)
    if hits > top:
        return 0.0
    denom = _log_comb(n, m)
    logs = [_log_comb(elevated, j) + _log_comb(n - elevated, m - j) - denom
            for j in range(hits, top + 1) if m - j <= n - elevated]
    if not logs:
        return 0.0
    big = max(logs)
    return min(1.0, math.exp(big) * math.fsum(math.exp(x - big) for x in logs))


def _split(rates: list[float], ys: list[float], min_side: int, opts: _Opts
           ) -> tuple[int, float, int] | None:
    """The split misplacing the fewest intervals: ``(points at or below, level, splits
    tried)``, or None when no split leaves ``min_side`` points at two rates each side."""
    n = len(rates)
    ordered = sorted(ys)
    prefix: list[float] = []
    best: tuple[int, int, float] | None = None
    tried = 0
    for i in range(1, n):
        insort(prefix, ys[i - 1])
        if not _valid(rates, i, min_side):
            continue
        tried += 1
        level = quantile(prefix, 0.5)
        t = _threshold(level, opts)
        le_prefix = bisect_right(prefix, t)
        wrong = (i - le_prefix) + (bisect_right(ordered, t) - le_prefix)
        if best is None or wrong < best[0]:
            best = (wrong, i, level)
    return None if best is None else (best[1], best[2], tried)


def _valid(rates: list[float], i: int, min_side: int) -> bool:
    """Whether the first ``i`` of the points at ``rates`` (sorted) below a knee and the
    rest above leave ``min_side`` points at two or more distinct rates on each side."""
    n = len(rates)
    return (min_side <= i <= n - min_side and i >= 2 and n - i >= 2
            and rates[i - 1] < rates[i]
            and rates[0] < rates[i - 1] and rates[i] < rates[n - 1])


def _running_median(ys: list[float], half: int) -> list[float]:
    """Each value replaced by the median of it and its ``half`` neighbours on each side
    (in rate order; fewer at the ends)."""
    n = len(ys)
    if half <= 0 or n < 3:
        return list(ys)
    return [quantile(sorted(ys[max(0, i - half):i + half + 1]), 0.5) for i in range(n)]


def _judge(rates: list[float], raw: list[float], opts: _Opts) -> _Fit | str:
    """The knee of one series (sorted by rate), or why there is none."""
    ys = _running_median(raw, SMOOTH_HALF)
    found = _split(rates, ys, opts.min_side, opts)
    if found is None:
        return (f"too few intervals at distinct rates to leave {opts.min_side} at two or "
                f"more rates on each side of a knee")
    i, below_ms, tried = found
    n = len(rates)
    m = n - i
    rate = (rates[i - 1] + rates[i]) / 2
    above_ms = _median_sorted(ys[i:])
    need = max(opts.min_rise * below_ms, opts.min_rise_ms)
    if above_ms - below_ms < need:
        if below_ms > 0:
            change = (above_ms - below_ms) / below_ms * 100
            where = (f"within {abs(change):.0f}% of" if abs(change) < 100
                     else f"{abs(change):.0f}% {'above' if change > 0 else 'below'}")
        else:
            where = f"{above_ms - below_ms:+.3f} ms from"
        return (f"latency does not rise with load (above {rate:.1f} req/s its median is "
                f"{where} its low-load level, {below_ms:.3f} ms; a knee needs "
                f"+{max(opts.min_rise * 100, 0):.0f}% and +{opts.min_rise_ms:g} ms)")
    t = _threshold(below_ms, opts)
    up = sum(1 for y in ys[i:] if y > t)
    low = sum(1 for y in ys[:i] if y > t)
    if up < SUSTAINED * m or low > (1 - SUSTAINED) * i:
        return (f"latency does not stay above its low-load level past a rate (above "
                f"{rate:.1f} req/s {up} of {m} intervals are more than "
                f"{opts.min_rise:.0%} over {below_ms:.3f} ms, and {low} of {i} below; a "
                f"knee needs {SUSTAINED:.0%} above and at most {1 - SUSTAINED:.0%} below)")
    slope, mx, my = _slope(rates[:i], ys[:i])
    slope = max(slope, 0.0)
    beyond = sum(1 for r, y in zip(rates[i:], ys[i:], strict=True)
                 if y > _threshold(max(below_ms, my + slope * (r - mx)), opts))
    if beyond < BEYOND_TREND * m:
        return (f"latency rises with load along one trend, with no knee (above {rate:.1f} "
                f"req/s only {beyond} of {m} intervals rise beyond the trend of those "
                f"below; a knee needs {BEYOND_TREND:.0%})")
    p = _tail(n, up + low, m, up) * max(tried, 1)
    if p > ALPHA:
        return (f"latency's rise above {rate:.1f} req/s is not distinguishable from noise "
                f"(chance {p:.2g} that the elevated intervals gather there, corrected for "
                f"{tried} splits; a knee needs at most {ALPHA:g})")
    b, _, _ = _slope(rates[i:], raw[i:])
    return _Fit(rate, b, i, m, _median_sorted(raw[:i]), _median_sorted(raw[i:]))


# --------------------------------------------------------------------------- API


def find_knee(rates: Sequence[float], values: Sequence[float], counts: Sequence[int], *,
              min_count: int = 5, min_points: int = 8, min_side: int = 3,
              min_rise: float = 0.5, min_rise_ms: float = 1.0,
              resamples: int = 400, seed: int = 0) -> Knee | Declined:
    """The knee of ``values`` (a latency statistic per interval, ms) against ``rates``
    (req/s per interval), the intervals holding ``counts`` requests, or why there is
    none. The method is the module's docstring. Deterministic for a ``seed``; never
    raises."""
    min_count_n = _num(min_count)
    pts, total, enough, unreadable = _usable(rates, values, counts, min_count_n)
    if unreadable is not None:
        return Declined(unreadable, 0)
    n = len(pts)
    min_side = max(_int(min_side, 3), 1)
    min_points = max(_int(min_points, 8), 2 * min_side, 4)
    if n < min_points:
        if total < min_points:
            why = f"only {total} intervals"
        elif enough < min_points:
            why = f"only {enough} of {total} intervals with at least {min_count_n:g} requests"
        else:
            why = (f"only {n} of the {enough} intervals with at least {min_count_n:g} "
                   f"requests have a finite rate and latency")
        return Declined(f"{why} (need {min_points})", n)
    if any(v < 0 for _, v, _ in pts):
        neg = sum(1 for _, v, _ in pts if v < 0)
        return Declined(f"the latency is negative in {neg} of {n} intervals, so it is not a "
                        f"latency", n)
    if any(max(p) > MAX_FIGURE for p in pts):
        return Declined(f"the rates, latencies or counts are too large to fit (above "
                        f"{MAX_FIGURE:g})", n)
    pts.sort()
    rs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    if rs[0] == rs[-1]:
        return Declined(f"every interval has the same rate ({rs[0]:.1f} req/s), so there is "
                        f"no range of load to find a knee in", n)
    if min(ys) == max(ys):
        return Declined(f"latency does not rise with load (it is {ys[0]:.3f} ms in every "
                        f"interval)", n)
    opts = _Opts(min_side, _num(min_rise), _num(min_rise_ms))
    if not (math.isfinite(opts.min_rise) and math.isfinite(opts.min_rise_ms)):
        return Declined("the minimum rise is not a number", n)
    fit = _judge(rs, ys, opts)
    if isinstance(fit, str):
        return Declined(fit, n)
    rate = fit.k
    resamples = _int(resamples, 0)
    if resamples < 1:
        return Declined(f"a knee (here {rate:.1f} req/s) is only reported with its "
                        f"bootstrap interval, and no resamples were asked for", n)
    ks, failed, total = _bootstrap(pts, opts, resamples, _int(seed, 0))
    span = rs[-1] - rs[0]
    if failed > MAX_FAILED_SHARE * total:
        return Declined(f"the knee at {rate:.1f} req/s is not stable under resampling "
                        f"({failed} of {total} resamples of the intervals find none)", n)
    ks.sort()
    tail = (1 - LEVEL) / 2
    lo, hi = quantile(ks, tail), quantile(ks, 1 - tail)
    if hi - lo > MAX_CI_SHARE * span:
        return Declined(f"the knee at {rate:.1f} req/s is not stable under resampling (its "
                        f"95% interval, {lo:.1f}-{hi:.1f} req/s, spans more than "
                        f"{MAX_CI_SHARE:.0%} of the rates seen, {rs[0]:.1f}-{rs[-1]:.1f})", n)
    return Knee(rate_per_s=rate, ci=(lo, hi), below_ms=fit.below_ms, above_ms=fit.above_ms,
                slope_ms_per_rps=fit.b, points=n, below=fit.below, above=fit.above)


def _int(x: object, default: int) -> int:
    v = _num(x)
    return int(v) if math.isfinite(v) else default


def _bootstrap(pts: list[tuple[float, float, float]], opts: _Opts, resamples: int,
               seed: int) -> tuple[list[float], int, int]:
    """The knees of the resamples that find one, the number that do not, and the number
    of resamples (``pts`` sorted by rate)."""
    n = len(pts)
    count = min(resamples, max(MIN_RESAMPLES, BOOTSTRAP_DRAWS // n))
    rng = random.Random(seed)
    population = range(n)
    ks: list[float] = []
    failed = 0
    for _ in range(count):
        idx = rng.choices(population, k=n)
        idx.sort()  # the points are sorted by rate, so the resample is too
        fit = _judge([pts[j][0] for j in idx], [pts[j][1] for j in idx], opts)
        if isinstance(fit, str):
            failed += 1
        else:
            ks.append(fit.k)
    return ks, failed, count


def level_change(rates: Sequence[float], values: Sequence[float], counts: Sequence[int],
                 knee_rate: float, *, min_count: int = 5) -> tuple[float | None, float | None]:
    """Median of ``values`` over usable intervals (at least ``min_count`` requests, a
    finite non-negative rate and a finite value) at or below / above ``knee_rate`` (None
    when a side has none): used to say how each hop's own time changes across the knee.
    Never raises."""
    pts, _, _, unreadable = _usable(rates, values, counts, _num(min_count))
    k = _num(knee_rate)
    if unreadable is not None or math.isnan(k):
        return None, None
    below = [v for r, v, _ in pts if r <= k]
    above = [v for r, v, _ in pts if r > k]
    return (_median_sorted(below) if below else None,
            _median_sorted(above) if above else None)
