"""Percentile blocks as the contract defines them."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from netdiag.contract import Percentiles

PERCENTILE_KEYS = ("count", "min", "p50", "p90", "p99", "max", "mean")
BOOTSTRAP_RESAMPLES = 2000
"""Resamples of every bootstrap interval (path comparisons and ``netdiag diff``)."""
LEVEL = 0.95
"""Confidence level of every bootstrap interval."""


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of an already sorted sequence."""
    n = len(sorted_values)
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


_LOG4 = math.log(4.0)
_SG_MAGICCONST = 1.0 + math.log(4.5)


def _gamma(rng: random.Random, alpha: float) -> float:
    """``rng.gammavariate(alpha, 1.0)`` for ``alpha >= 1``, step for step as CPython's
    ``random`` module computes it (R. C. H. Cheng's rejection method, 1977): the same
    draws from ``rng`` and the same float operations give the same value, without
    the interpreted stdlib function (a path comparison draws tens of thousands)."""
    if alpha < 1.0:
        return rng.gammavariate(alpha, 1.0)
    uniform = rng.random
    if alpha == 1.0:
        return -math.log(1.0 - uniform())
    ainv = math.sqrt(2.0 * alpha - 1.0)
    bbb = alpha - _LOG4
    ccc = alpha + ainv
    while True:
        u1 = uniform()
        if not 1e-7 < u1 < 0.9999999:
            continue
        u2 = 1.0 - uniform()
        v = math.log(u1 / (1.0 - u1)) / ainv
        x = alpha * math.exp(v)
        z = u1 * u1 * u2
        r = bbb + ccc * v - x
        if r + _SG_MAGICCONST - 4.5 * z >= 0.0 or r >= math.log(z):
            return x


def _beta(rng: random.Random, alpha: float, beta: float) -> float:
    """``rng.betavariate(alpha, beta)`` for parameters of at least 1, as CPython computes
    it (two gamma draws: :func:`_gamma`)."""
    y = _gamma(rng, alpha)
    if y:
        return y / (y + _gamma(rng, beta))
    return 0.0


MS_DECIMALS = 6
"""Decimals of a figure in milliseconds: one nanosecond, the finest time a capture holds."""


def ms_figure(x: float) -> float:
    """A computed figure in milliseconds (an interpolated quantile, a mean, a difference)
    rounded to the nanosecond, so that float arithmetic leaves no noise such as
    ``0.05200780000000001`` in the report. The one place durations are rounded."""
    return round(x, MS_DECIMALS)


def percentiles(values: Sequence[float | None]) -> Percentiles:
    """``{count, min, p50, p90, p99, max, mean}`` of the non-null values; nulls when empty.
    Figures are rounded by :func:`ms_figure` (every caller passes milliseconds or
    counts)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"count": 0, "min": None, "p50": None, "p90": None, "p99": None,
                "max": None, "mean": None}
    return {
        "count": len(vals), "min": ms_figure(vals[0]), "p50": ms_figure(quantile(vals, 0.5)),
        "p90": ms_figure(quantile(vals, 0.9)), "p99": ms_figure(quantile(vals, 0.99)),
        "max": ms_figure(vals[-1]), "mean": ms_figure(math.fsum(vals) / len(vals)),
    }


def bootstrap_medians(sorted_values: Sequence[float], rng: random.Random,
                      resamples: int) -> list[float]:
    """Medians of ``resamples`` bootstrap resamples of ``sorted_values``, each in O(1).

    A resample is n draws with replacement, i.e. the values at indices ``floor(n * U_i)``
    for n uniforms U_i; since that index map is monotone, the k-th smallest value of the
    resample is the value at ``floor(n * U_(k))``, and the k-th order statistic U_(k) of
    n uniforms is Beta(k, n - k + 1). Given U_(k) = u, U_(k+1) is u + (1 - u) * Beta(1,
    n - k). So the median of a resample (the middle value, or the mean of the two middle
    ones, as :func:`quantile` takes it) is drawn exactly without building the resample:
    the same distribution as sorting n draws, at any n.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("the bootstrap needs values")
    k = (n + 1) // 2  # 1-based rank of the (lower) middle value
    even = n % 2 == 0
    top = n - 1
    out = []
    for _ in range(resamples):
        u = _beta(rng, k, n - k + 1)
        lo = sorted_values[min(int(n * u), top)]
        if even:
            u2 = u + (1.0 - u) * (1.0 - rng.random() ** (1.0 / (n - k)))
            lo += (sorted_values[min(int(n * u2), top)] - lo) * 0.5  # as quantile() does
        out.append(lo)
    return out


def median(values: Sequence[float]) -> float:
    """The median as :func:`quantile` takes it (the mean of the two middle values)."""
    return quantile(sorted(values), 0.5)


def bootstrap_median_diff(a: Sequence[float], b: Sequence[float] | None = None, *,
                          seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                          level: float = LEVEL) -> tuple[float, float, float]:
    """``(median(a) - median(b), low, high)``: the difference of the medians (the median
    of ``a`` when ``b`` is None) and its percentile-bootstrap interval at ``level``, over
    every value: one sort per side, then O(1) per resample (:func:`bootstrap_medians`).
    Deterministic for a seed."""
    if not a or (b is not None and not b):
        raise ValueError("the bootstrap needs values on each side")
    sa = sorted(a)
    sb = None if b is None else sorted(b)
    point = quantile(sa, 0.5) - (quantile(sb, 0.5) if sb is not None else 0.0)
    rng = random.Random(seed)
    diffs = bootstrap_medians(sa, rng, resamples)
    if sb is not None:
        diffs = [x - y for x, y in zip(diffs, bootstrap_medians(sb, rng, resamples),
                                       strict=True)]
    return (point, *_percentile_interval(diffs, level))


def _percentile_interval(draws: list[float], level: float) -> tuple[float, float]:
    """The central ``level`` interval of bootstrap ``draws`` (sorted here)."""
    draws = sorted(draws)
    tail = (1.0 - level) / 2
    return quantile(draws, tail), quantile(draws, 1.0 - tail)


class MedianDraws:
    """Bootstrap medians of named samples, each drawn once and shared by every
    comparison the sample takes part in (a path's time to first byte against each
    other path). Each sample has its own random stream, seeded by ``seed`` and its
    name, so its draws do not depend on which comparisons come first."""

    def __init__(self, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> None:
        self.seed = seed
        self.resamples = resamples
        self._draws: dict[str, tuple[float, list[float]]] = {}

    def of(self, name: str, values: Sequence[float]) -> tuple[float, list[float]]:
        """The median of ``values``, known as ``name``, and its resampled medians (one
        sort per sample, however many comparisons it is in)."""
        d = self._draws.get(name)
        if d is None:
            ordered = sorted(values)
            rng = random.Random(f"{self.seed}:{name}")
            d = self._draws[name] = (quantile(ordered, 0.5),
                                     bootstrap_medians(ordered, rng, self.resamples))
        return d

    def diff(self, name_a: str, a: Sequence[float],
             other: tuple[str, Sequence[float]] | None = None, level: float = LEVEL
             ) -> tuple[float, float, float]:
        """Like :func:`bootstrap_median_diff` of ``a`` and ``other`` (its name and
        values; None: the median of ``a`` alone), from the shared draws."""
        if not a or (other is not None and not other[1]):
            raise ValueError("the bootstrap needs values on each side")
        ma, da = self.of(name_a, a)
        if other is None:
            return (ma, *_percentile_interval(da, level))
        mb, db = self.of(*other)
        return (ma - mb, *_percentile_interval(
            [x - y for x, y in zip(da, db, strict=True)], level))
