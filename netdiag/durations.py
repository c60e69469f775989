"""Durations written by people (``500ms``, ``30s``, ``2m``, ``1h``): one parser for every
option that takes one (``--interval``, ``--set-gap``, the lab's ``--ramp``)."""

from __future__ import annotations

import re

_UNITS_NS = {"ms": 10**6, "s": 10**9, "sec": 10**9, "m": 60 * 10**9, "min": 60 * 10**9,
             "h": 3_600 * 10**9}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|sec|min|m|h)?\s*")


def parse_duration_ns(text: str) -> int:
    """``500ms``, ``1s``, ``2.5s``, ``2m``/``2min``, ``1h`` or bare seconds -> ns.

    Raises ValueError, with a sentence for the user, on anything else and on a duration
    of 0 or under 1 ms."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration (like 500ms, 30s, 2m, 1h or seconds)")
    ns = round(float(m.group(1)) * _UNITS_NS[m.group(2) or "s"])
    if ns <= 0:
        raise ValueError(f"the duration {text!r} must be more than 0")
    if ns < 10**6:
        raise ValueError(f"the duration {text!r} is under 1 ms")
    return ns
