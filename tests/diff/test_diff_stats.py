"""The pure-Python statistics behind ``netdiag diff`` (checked against scipy when present)."""

from __future__ import annotations

import math
import random

import pytest

from netdiag.diff.stats import (
    _u_distribution,
    bootstrap_median_diff,
    mann_whitney_u,
    median,
    two_proportion_z,
)


def test_u_distribution_counts_every_arrangement() -> None:
    for m in range(1, 8):
        for n in range(1, 8):
            dist = _u_distribution(m, n)
            assert len(dist) == m * n + 1
            assert sum(dist) == math.comb(m + n, m)
            assert dist == dist[::-1]  # symmetric
            assert all(c > 0 for c in dist)


def test_exact_known_values() -> None:
    # completely separated samples: the most extreme arrangement of C(6,3) = 20
    r = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert r.method == "exact"
    assert r.u == 0
    assert r.p_value == pytest.approx(2 / 20)
    assert r.min_p == pytest.approx(0.1)
    same = mann_whitney_u([1, 3, 5], [2, 4, 6])
    assert same.p_value == pytest.approx(0.7)


def test_ties_use_the_corrected_normal_approximation() -> None:
    r = mann_whitney_u([1, 1, 2, 2, 3], [2, 3, 3, 4, 4])
    assert r.method == "normal" and r.z is not None
    assert 0 < r.p_value < 1
    all_tied = mann_whitney_u([5, 5, 5], [5, 5])
    assert all_tied.p_value == 1.0


def test_empty_side_is_an_error() -> None:
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


def test_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for _ in range(200):
        n1, n2 = rng.randint(1, 40), rng.randint(1, 40)
        ties = rng.random() < 0.5
        a = [rng.randint(0, 9) if ties else rng.random() for _ in range(n1)]
        b = [rng.randint(0, 9) + rng.randint(0, 2) if ties else rng.random() + 0.1
             for _ in range(n2)]
        mine = mann_whitney_u(a, b)
        method = "exact" if mine.method == "exact" else "asymptotic"
        ref = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method=method,
                                       use_continuity=True)
        assert mine.u == pytest.approx(ref.statistic)
        assert mine.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


def test_bootstrap_is_deterministic_and_brackets_the_shift() -> None:
    rng = random.Random(1)
    a = [rng.gauss(20, 2) for _ in range(80)]
    b = [x + 5 for x in (rng.gauss(20, 2) for _ in range(80))]
    one = bootstrap_median_diff(b, a, seed=3)  # median(b) - median(a)
    two = bootstrap_median_diff(b, a, seed=3)
    assert one == two
    point, lo, hi = one
    assert point == pytest.approx(median(b) - median(a))
    assert lo < point < hi
    assert lo > 2 and hi < 8  # the true shift is 5
    other_seed = bootstrap_median_diff(b, a, seed=4)
    assert other_seed[0] == point and other_seed[1:] != one[1:]


def test_bootstrap_of_identical_samples_straddles_zero() -> None:
    a = [float(x) for x in range(30)]
    point, lo, hi = bootstrap_median_diff(a, list(a), seed=0)
    assert point == 0 and lo <= 0 <= hi


def test_bootstrap_uses_every_value_of_large_samples() -> None:
    a = [float(x % 97) for x in range(20000)]
    point, lo, hi = bootstrap_median_diff([x + 1 for x in a], a, seed=0, resamples=50)
    assert point == pytest.approx(1.0)
    assert lo <= hi


def test_two_proportions() -> None:
    t = two_proportion_z(45, 100, 60, 100)
    pooled = 105 / 200
    se = math.sqrt(pooled * (1 - pooled) * (2 / 100))
    assert t.z == pytest.approx(0.15 / se)
    assert t.p_value == pytest.approx(math.erfc(abs(t.z) / math.sqrt(2)))
    assert t.p_value < 0.05
    assert t.ci_low < 0.15 < t.ci_high
    same = two_proportion_z(0, 10, 0, 20)
    assert same.p_value == 1.0 and same.diff == 0
    with pytest.raises(ValueError):
        two_proportion_z(0, 0, 1, 2)


def test_order_statistic_bootstrap_matches_resampling() -> None:
    """The O(1)-per-resample median bootstrap has the distribution of sorting n draws."""
    from netdiag.analysis.stats import bootstrap_medians, quantile

    rng = random.Random(11)
    for n in (1, 2, 3, 4, 9, 10, 40, 41):
        values = sorted(round(rng.lognormvariate(3, 1), 1) for _ in range(n))
        fast = sorted(bootstrap_medians(values, random.Random(n), 20000))
        brute_rng = random.Random(n + 100)
        slow = sorted(quantile(sorted(brute_rng.choices(values, k=n)), 0.5)
                      for _ in range(20000))
        points = sorted(set(fast) | set(slow))
        from bisect import bisect_right
        ks = max(abs(bisect_right(fast, x) - bisect_right(slow, x)) / 20000 for x in points)
        assert ks < 0.02, (n, ks)


def test_shared_median_draws_do_not_depend_on_comparison_order() -> None:
    from netdiag.analysis.stats import MedianDraws

    rng = random.Random(5)
    a = [rng.gauss(30, 3) for _ in range(60)]
    b = [rng.gauss(20, 3) for _ in range(50)]
    c = [rng.gauss(25, 3) for _ in range(40)]
    first = MedianDraws(seed=1)
    ab_first = first.diff("a", a, ("b", b))
    first.diff("a", a, ("c", c))
    later = MedianDraws(seed=1)
    later.diff("c", c, ("b", b))
    later.diff("a", a, ("c", c))
    assert later.diff("a", a, ("b", b)) == ab_first
    point, lo, hi = ab_first
    assert lo < point < hi and lo > 5  # the medians differ by about 10
    assert MedianDraws(seed=2).diff("a", a, ("b", b)) != ab_first
