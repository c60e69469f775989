"""The bootstrap's Beta draws: the same values as the standard library's, on both cores."""

from __future__ import annotations

import random

import pytest

from netdiag.analysis import stats


@pytest.mark.parametrize(("alpha", "beta"), [
    (1, 1), (1, 9), (9, 1), (2, 3), (50, 51), (1000, 1001), (12345, 12346), (0.5, 2.0)])
def test_beta_draws_equal_the_standard_librarys(alpha: float, beta: float) -> None:
    for seed in range(50):
        ours, theirs = random.Random(seed), random.Random(seed)
        got = [stats._beta(ours, alpha, beta) for _ in range(40)]
        assert got == [theirs.betavariate(alpha, beta) for _ in range(40)], seed
        assert ours.random() == theirs.random()  # as many uniforms taken


def test_bootstrap_medians_follow_the_standard_librarys_draws() -> None:
    """The resampled medians as drawn with ``random.Random.betavariate`` itself."""
    values = sorted(random.Random(7).uniform(0, 100) for _ in range(101))
    got = stats.bootstrap_medians(values, random.Random(3), 500)
    rng = random.Random(3)
    want = [values[min(int(101 * rng.betavariate(51, 51)), 100)] for _ in range(500)]
    assert got == want
