"""The statistics ``netdiag diff`` needs, in pure Python (no scipy at run time).

* :func:`mann_whitney_u`: two-sided Mann-Whitney U test. Exact null distribution when
  there are no ties and both samples have at most :data:`EXACT_MAX` values; otherwise the
  normal approximation with the tie correction of the variance and a continuity
  correction (what ``scipy.stats.mannwhitneyu(..., method="asymptotic")`` computes).
* the bootstrap interval of a difference of medians is the one of path comparisons,
  :func:`netdiag.analysis.stats.bootstrap_median_diff` (re-exported here).
* :func:`two_proportion_z`: two-sided z-test of two proportions (pooled variance), with
  a Wald interval of their difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from netdiag.analysis.stats import BOOTSTRAP_RESAMPLES, LEVEL, bootstrap_median_diff, median

__all__ = ["BOOTSTRAP_RESAMPLES", "LEVEL", "MannWhitney", "TwoProportions",
           "bootstrap_median_diff", "mann_whitney_u", "median", "two_proportion_z"]

EXACT_MAX = 25
"""Largest sample size for which the exact distribution of U is used (no ties)."""


def _norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) of ``values``, and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = rank
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _u_distribution(m: int, n: int) -> list[int]:
    """Counts of the arrangements of m + n values giving U = 0..m*n (no ties): the
    coefficients of the Gaussian binomial coefficient [m+n choose m]_q."""
    size = m * n + 1
    poly = [0] * size
    poly[0] = 1
    for i in range(1, m + 1):
        # multiply by (1 - q^(n+i)), then divide by (1 - q^i)
        k = n + i
        for u in range(size - 1, k - 1, -1):
            poly[u] -= poly[u - k]
        for u in range(i, size):
            poly[u] += poly[u - i]
    return poly


@dataclass(frozen=True)
class MannWhitney:
    """Result of :func:`mann_whitney_u`."""

    u: float
    """U of the first sample (pairs where a > b, ties counted half)."""
    p_value: float
    """Two-sided."""
    z: float | None
    """Standardised statistic (normal approximation only)."""
    method: str
    """``exact`` or ``normal``."""
    n_a: int
    n_b: int
    min_p: float
    """The smallest p-value these sample sizes could give (exact, no ties): at or
    above the significance level, the test cannot tell anything."""


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test of ``a`` against ``b`` (both non-empty)."""
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        raise ValueError("Mann-Whitney U needs values on each side")
    ranks, ties = _ranks([*a, *b])
    r1 = sum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2
    mn = n1 * n2
    min_p = min(1.0, 2 / math.comb(n1 + n2, n1))
    if not ties and max(n1, n2) <= EXACT_MAX:
        dist = _u_distribution(n1, n2)
        total = sum(dist)
        hi = max(u1, mn - u1)
        tail = sum(dist[round(hi):])
        return MannWhitney(u1, min(1.0, 2 * tail / total), None, "exact", n1, n2, min_p)
    n = n1 + n2
    tie_term = sum(t ** 3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    var = mn / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return MannWhitney(u1, 1.0, 0.0, "normal", n1, n2, min_p)
    big = max(u1, mn - u1)
    z = (big - mn / 2 - 0.5) / math.sqrt(var)
    return MannWhitney(u1, min(1.0, 2 * _norm_sf(z)), z, "normal", n1, n2, min_p)


@dataclass(frozen=True)
class TwoProportions:
    p_a: float
    p_b: float
    diff: float
    """``p_b - p_a``."""
    z: float
    p_value: float
    ci_low: float
    ci_high: float


def two_proportion_z(x_a: int, n_a: int, x_b: int, n_b: int,
                     level: float = LEVEL) -> TwoProportions:
    """Two-sided z-test of x_a/n_a against x_b/n_b (pooled standard error), and a Wald
    interval of the difference at ``level``."""
    if n_a <= 0 or n_b <= 0:
        raise ValueError("two proportions need a denominator on each side")
    p1, p2 = x_a / n_a, x_b / n_b
    pooled = (x_a + x_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        z, p = 0.0, 1.0
    else:
        z = (p2 - p1) / se
        p = min(1.0, 2 * _norm_sf(abs(z)))
    zq = _z_quantile(1 - (1 - level) / 2)
    se_diff = math.sqrt(p1 * (1 - p1) / n_a + p2 * (1 - p2) / n_b)
    return TwoProportions(p1, p2, p2 - p1, z, p, p2 - p1 - zq * se_diff,
                          p2 - p1 + zq * se_diff)


def _z_quantile(q: float) -> float:
    """Inverse of the standard normal CDF (bisection; plenty for confidence levels)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 1 - _norm_sf(mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
