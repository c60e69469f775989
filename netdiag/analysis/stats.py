"""Percentile blocks as the contract defines them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PERCENTILE_KEYS = ("count", "min", "p50", "p90", "p99", "max", "mean")


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of an already sorted sequence."""
    n = len(sorted_values)
    pos = (n - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def percentiles(values: Sequence[float | None]) -> dict[str, Any]:
    """``{count, min, p50, p90, p99, max, mean}`` of the non-null values; nulls when empty."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return {"count": 0, "min": None, "p50": None, "p90": None, "p99": None,
                "max": None, "mean": None}
    return {
        "count": len(vals), "min": vals[0], "p50": quantile(vals, 0.5),
        "p90": quantile(vals, 0.9), "p99": quantile(vals, 0.99), "max": vals[-1],
        "mean": math.fsum(vals) / len(vals),
    }
