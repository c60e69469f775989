"""The worst-offender lists of the summary (netdiag.analysis.summary._Top)."""

from __future__ import annotations

import random

from netdiag.analysis.summary import _Top


def test_keeps_says_what_add_keeps() -> None:
    """``keeps`` decides as ``add`` does (ties included: the first of equal values
    stays), so a payload made only when kept leaves the same list."""
    rng = random.Random(11)
    for _ in range(200):
        every, lazy = _Top(k=rng.randint(1, 5)), _Top(k=0)
        lazy.k = every.k
        for i in range(rng.randint(0, 40)):
            value = float(rng.choice([1, 2, 2, 3, 5, 8, rng.random() * 10]))
            every.add(value, f"L{i}", {"i": i})
            if lazy.keeps(value):
                lazy.add(value, f"L{i}", {"i": i})
            else:
                lazy.n += 1
        assert every.heap == lazy.heap and every.n == lazy.n
        assert every.payloads() == lazy.payloads()
