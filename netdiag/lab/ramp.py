"""The lab's open-loop ramp: its schedule, and what the ledger says about it.

``LabParams.ramp = (from_rps, to_rps, duration_s)``: per path, requests arrive as a
non-homogeneous Poisson process of rate ``rate(t) = from + (to - from) * t / duration``
(``ramp_rate``), drawn by thinning (``ramp_schedule``: candidates of a homogeneous
process at the peak rate, each kept with probability ``rate(t) / peak``) from a
generator seeded with ``LabParams.seed`` and the path's name, so a run's schedule is
the same every time. The driver (``netdiag.lab.driver``) sends every request at its
scheduled time whatever the servers do (open loop): a slow server makes requests
pile up, never arrive later.

``ramp_summary`` is the ledger's ``ramp`` block (``docs/lab.md``); ``parse_ramp`` reads
the command line's ``FROM:TO:DURATION``.
"""

from __future__ import annotations

import math
import random
from typing import Any

from netdiag.durations import parse_duration_ns

LATE_MS = 10.0
"""A request sent more than this after its scheduled time is ``late``."""

def parse_duration(text: str) -> float:
    """``30s``, ``500ms``, ``2m`` or bare seconds (``12.5``) -> seconds (at least 1 ms;
    the parser of every duration option, ``netdiag.durations``)."""
    return parse_duration_ns(text) / 1e9


def _rate(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number of requests per second") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} {text!r} must be a rate >= 0")
    return value


def parse_ramp(text: str) -> tuple[float, float, float]:
    """``FROM:TO:DURATION`` -> (from_rps, to_rps, duration_s); rates >= 0, TO > 0."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"{text!r} is not FROM:TO:DURATION (like 50:1500:30s)")
    from netdiag.lab.params import MAX_RAMP_RPS, MAX_RAMP_S

    lo = _rate(parts[0], "FROM")
    hi = _rate(parts[1], "TO")
    if hi <= 0:
        raise ValueError(f"TO must be more than 0 requests per second (got {parts[1]!r})")
    if max(lo, hi) > MAX_RAMP_RPS:
        raise ValueError(f"rates are at most {MAX_RAMP_RPS:g} requests per second")
    duration = parse_duration(parts[2])
    if duration > MAX_RAMP_S:
        raise ValueError(f"the duration is at most {MAX_RAMP_S:g} s (got {parts[2]!r})")
    return lo, hi, duration


def ramp_rate(ramp: tuple[float, float, float], t: float) -> float:
    """The offered rate (requests per second) ``t`` seconds into the ramp."""
    lo, hi, duration = ramp
    return lo + (hi - lo) * min(max(t, 0.0), duration) / duration


def ramp_schedule(ramp: tuple[float, float, float], seed: int, path: str) -> list[float]:
    """Arrival times (seconds from the ramp's start, increasing) of one path.

    Thinning (Lewis and Shedler): candidates of a Poisson process at the peak rate,
    each kept with probability ``ramp_rate(t) / peak``."""
    lo, hi, duration = ramp
    peak = max(lo, hi)
    rng = random.Random(f"netdiag-lab-ramp|{seed}|{path}")
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak < ramp_rate(ramp, t):
            out.append(t)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _r3(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _lag_ms(r: dict[str, Any]) -> float | None:
    if r.get("sent_ts") is None or r.get("scheduled_ts") is None:
        return None
    return (float(r["sent_ts"]) - float(r["scheduled_ts"])) * 1000


def window_s(duration: float) -> float:
    """Width of the ledger's ramp windows: 1 s, or a tenth of a ramp shorter than 10 s."""
    return 1.0 if duration >= 10 else duration / 10


def ramp_summary(ramp: tuple[float, float, float], budget_per_s: float | None,
                 queue_limit: int, requests: list[dict[str, Any]], start_ts: float,
                 offered: dict[str, int]) -> dict[str, Any]:
    """The ledger's ``ramp`` block, from the ``request_log`` (with ``hops``).

    Per path: ``offered`` (requests scheduled), ``sent`` (those issued), ``send_lag_ms``
    (sent - scheduled: p50, p99, max), ``late`` (lag over ``LATE_MS``), ``statuses``,
    and ``windows``: per slice of the ramp (``window_s``), the requests scheduled in
    it and what became of them (ROC: with the router's queue waits it granted).
    """
    lo, hi, duration = ramp
    width = window_s(duration)
    n_windows = max(1, math.ceil(duration / width - 1e-9))
    out: dict[str, Any] = {"from_rps": lo, "to_rps": hi, "duration_s": duration,
                           "router_budget_per_s": budget_per_s,
                           "router_queue_limit": queue_limit,
                           "start_ts": round(start_ts, 6), "window_s": round(width, 6)}
    for path in ("ROC", "DPF"):
        reqs = [r for r in requests if r["path"] == path and r.get("scheduled_ts") is not None]
        lags = [x for x in (_lag_ms(r) for r in reqs) if x is not None]
        statuses: dict[str, int] = {}
        for r in reqs:
            key = str(r.get("status"))
            statuses[key] = statuses.get(key, 0) + 1
        windows: list[dict[str, Any]] = []
        for k in range(n_windows):
            t0, t1 = k * width, min((k + 1) * width, duration)
            mine = [r for r in reqs if t0 <= float(r["scheduled_ts"]) - start_ts < t1]
            ok = [r for r in mine if r.get("status") == 200]
            ttfb = [float(r["client_ttfb_ms"]) for r in ok if r.get("client_ttfb_ms") is not None]
            win: dict[str, Any] = {
                "t_s": round(t0, 6), "offered_rps": round(ramp_rate(ramp, (t0 + t1) / 2), 3),
                "scheduled": len(mine),
                "sent": sum(1 for r in mine if r.get("sent_ts") is not None),
                "ok": len(ok), "denied": sum(1 for r in mine if r.get("status") == 429),
                "failed": sum(1 for r in mine if r.get("status") is None),
                "send_lag_ms_p99": _r3(percentile(
                    [x for x in (_lag_ms(r) for r in mine) if x is not None], 0.99)),
                "ttfb_ms_p50": _r3(percentile(ttfb, 0.5)),
                "ttfb_ms_p99": _r3(percentile(ttfb, 0.99))}
            if path == "ROC":  # the waits granted (a refused request waited for nothing)
                routed = [(r.get("hops") or {}).get("router") or {} for r in mine]
                queue = [float(h["queue_ms"]) for h in routed
                         if h.get("queue_ms") is not None and not h.get("denied")]
                win["queue_ms_p50"] = _r3(percentile(queue, 0.5))
                win["queue_ms_max"] = _r3(max(queue) if queue else None)
            windows.append(win)
        out[path] = {
            "offered": offered.get(path, len(reqs)),
            "sent": sum(1 for r in reqs if r.get("sent_ts") is not None),
            "send_lag_ms": {"p50": _r3(percentile(lags, 0.5)),
                            "p99": _r3(percentile(lags, 0.99)),
                            "max": _r3(max(lags) if lags else None)},
            "late": sum(1 for x in lags if x > LATE_MS),
            "statuses": dict(sorted(statuses.items())),
            "windows": windows,
        }
    return out
