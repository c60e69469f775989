"""How durations and sizes are written for people: one place, so every table reads
alike."""

from __future__ import annotations


def ms_text(v: float | None) -> str:
    """Milliseconds with their unit, precision following magnitude: ``0.030 ms``,
    ``4.2 ms``, ``250 ms``, ``1.25 s``; ``-`` when unknown."""
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 1:
        return f"{v:.1f} ms"
    return f"{v:.3f} ms"


def ms_number(v: float | None) -> str:
    """Milliseconds as a bare number for a table whose header names the unit (seconds
    above 1000 ms say so); ``-`` when unknown."""
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def bytes_text(n: float, sep: str = " ") -> str:
    """A size in binary units: ``512 B``, ``1.5 KiB``, ``300.0 MiB``, ``2.0 GiB``."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.1f}{sep}{unit}"
    return f"{n:.0f}{sep}B"
