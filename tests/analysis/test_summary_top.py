"""The worst-offender lists of the summary (netdiag.analysis.summary._Top)."""

from __future__ import annotations

import random

from netdiag.analysis.summary import _Top


def test_add_made_keeps_what_add_keeps() -> None:
    """``add_made`` decides as ``add`` does (ties included: the first of equal values
    stays), and makes a payload only for a value it keeps."""
    rng = random.Random(11)
    for _ in range(200):
        k = rng.randint(1, 5)
        every, lazy = _Top(k=k), _Top(k=k)
        for i in range(rng.randint(0, 40)):
            value = float(rng.choice([1, 2, 2, 3, 5, 8, rng.random() * 10]))
            every.add(value, f"L{i}", {"i": i})
            made: list[int] = []

            def make(i: int = i, made: list[int] = made) -> dict[str, int]:
                made.append(i)
                return {"i": i}

            lazy.add_made(value, f"L{i}", make)
            kept = {"i": i} in lazy.payloads()
            assert made == ([i] if kept else [])
        assert every.heap == lazy.heap and every.n == lazy.n
        assert every.payloads() == lazy.payloads()
