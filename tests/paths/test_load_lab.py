"""Load over time against the lab's ledger, on a real ramp: the lab offers an open-loop
Poisson load rising past the ROC router's token budget (a queue in Redis), captures it
on loopback, and netdiag reads the capture back.

Independent truth is the ledger: the clients' own send times (per-interval counts) and
the router's own per-request queue waits, as granted by the Redis script (where the
queue starts to grow). The knee netdiag finds on the wire must lie where the ledger's
queue starts to grow, be pinned on the router, and the direct path must have none.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from labtools import LIVE

from netdiag.cli import cli
from netdiag.lab import LabParams, run_lab

pytestmark = [pytest.mark.slow, LIVE]

RAMP = (8.0, 50.0, 36.0)
"""From, to (req/s per path), duration (s): a long quiet start (the low-load level), then
past the budget by 1.7x."""
BUDGET = 30.0
"""The router's token budget (req/s); its queue holds up to 400 requests."""
INTERVAL_S = 1.0
"""The report's interval. An interval's rate is a Poisson count, sd ``sqrt(rate /
interval)``: 7.7 req/s at the budget over 0.5 s, blurring the order of the intervals by
rate over a sixth of the ramp, and the share blurred falls only with the square root of
the interval (a longer ramp adds intervals, not order). Over 0.5 s, 22 knees of eleven
ramps (six beside two CPU burners) found none in 1 to 80 of 400 resamples (the limit is
80, ``knee.MAX_FAILED_SHARE``); the same captures over 1 s, in 0 to 30."""
SEEDS = (1, 2, 3)
"""The ramp's schedules, tried in turn while the ROC median's knee is declined as *not
stable under resampling*, and only then. On this project's VMs that decline came in 3 of
about 20 runs of the suite (81-88 of 400 resamples against the limit of 80; 0-70 when
found, 0-10 on a quiet machine): the host's noise in a few low-load intervals, near the
1.5x threshold, which netdiag rightly calls uncertain. A knee in the wrong place, or a
ramp with none, fails on the first schedule; three declines in a row fail too."""
WIRE_MARGIN_S = 0.0005
"""Slack around the ledger's ``written_ts`` (the client's clock read right before and
right after the request's HEADERS were written to its socket; the capture's kernel
stamps the packet in between, on the same wall clock): the ledger rounds to the
microsecond. A request is counted in the interval of the first reading; it may lie in
any interval these bounds touch, however late the loaded client ran between them."""


@pytest.fixture(scope="module")
def ramp(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    for seed in SEEDS:
        out = tmp_path_factory.mktemp("load") / "ramp.pcapng"
        led = run_lab(out, LabParams(netns=True, ramp=RAMP, router_budget_per_s=BUDGET,
                                     router_queue_limit=400, settle_ms=300.0, hash_bucket=7,
                                     seed=seed))
        res = CliRunner().invoke(cli, ["report", str(out), "--format", "json", "--interval",
                                       f"{INTERVAL_S * 1000:g}ms"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        why = doc["timeseries"]["knee_declined"].get("ROC", {}).get("ttfb_p50", "")
        if "not stable under resampling" not in why:
            break
        print(f"ramp with seed {seed}: {why}; another schedule")
    return led, doc


def _sent(led: dict[str, Any], path: str) -> list[dict[str, Any]]:
    return [r for r in led["request_log"] if r["path"] == path and r.get("sent_ts")]


def test_interval_counts_are_the_clients(ramp: tuple[dict[str, Any], dict[str, Any]]) -> None:
    led, doc = ramp
    ts = doc["timeseries"]
    assert ts["interval_ms"] == INTERVAL_S * 1000
    origin = ts["start_ts"]
    for path in ("ROC", "DPF"):
        sent = _sent(led, path)
        assert sent and len(sent) == led["ramp"][path]["sent"]
        want: dict[int, int] = {}
        near_edge: dict[int, int] = {}
        for r in sent:
            lo, hi = r["written_ts"]
            assert r["sent_ts"] <= lo <= hi, r
            k = math.floor((lo - origin) / INTERVAL_S)
            want[k] = want.get(k, 0) + 1
            first = math.floor((lo - WIRE_MARGIN_S - origin) / INTERVAL_S)
            last = math.floor((hi + WIRE_MARGIN_S - origin) / INTERVAL_S)
            if first != last:
                for j in range(first, last + 1):
                    near_edge[j] = near_edge.get(j, 0) + 1
        got = {round((e["start_ts"] - origin) / INTERVAL_S): e["requests"]
               for e in ts["paths"][path]}
        assert sum(got.values()) == len(sent), path
        for k in set(got) | set(want):
            assert abs(got.get(k, 0) - want.get(k, 0)) <= near_edge.get(k, 0), (path, k)


def _queue_transition(led: dict[str, Any], q: float) -> tuple[float, float]:
    """From the ledger alone: the clients' send rate in the first interval where the
    ``q`` quantile of the router's granted queue waits exceeds 2 ms (the queue starts to
    form, as that statistic sees it), and in the first where their median exceeds ten
    slots (it no longer drains: an M/D/1 queue waits ten service times on average at 95%
    utilisation)."""
    origin = min(r["sent_ts"] for r in _sent(led, "ROC"))
    per: dict[int, list[float]] = {}
    for r in _sent(led, "ROC"):
        wait = (r.get("hops") or {}).get("router", {}).get("queue_ms")
        if wait is not None:
            per.setdefault(math.floor((r["sent_ts"] - origin) / INTERVAL_S), []).append(wait)
    start = end = None
    for k in sorted(per):
        ws = sorted(per[k])
        rate = len(ws) / INTERVAL_S
        if start is None and len(ws) >= 5 and ws[min(len(ws) - 1, int(q * len(ws)))] > 2.0:
            start = rate
        if end is None and ws[len(ws) // 2] > 10 * 1000.0 / BUDGET:
            end = rate
    assert start is not None and end is not None
    return start, end


def test_the_knee_lies_where_the_routers_queue_starts_to_grow(
        ramp: tuple[dict[str, Any], dict[str, Any]]) -> None:
    led, doc = ramp
    knees = {(k["path"], k["metric"]): k for k in doc["knees"]}
    declined = doc["timeseries"]["knee_declined"]
    found = [(m, q) for m, q in (("ttfb_p50", 0.5), ("ttfb_p99", 0.99)) if ("ROC", m) in knees]
    assert ("ROC", "ttfb_p50") in knees, declined.get("ROC")
    # the rate of one interval is a Poisson count: sd sqrt(rate * interval) / interval
    slack = math.sqrt(BUDGET * INTERVAL_S) / INTERVAL_S
    for metric, q in found:
        k = knees[("ROC", metric)]
        start, end = _queue_transition(led, q)
        lo, hi = k["ci"]
        assert start - slack <= k["rate_per_s"] <= end + slack, (metric, start, end, k)
        assert lo <= end + slack and hi >= start - slack, (metric, start, end, k)
        assert k["hop"] == "router", k
        assert k["hops"]["router"]["above_ms"] > 5 * k["hops"]["router"]["below_ms"] + 10
        assert k["sentence"].startswith("ROC's ")
    assert not any(p == "DPF" for p, _ in knees), knees
    assert any(f["code"] == "latency-knee" and "ROC" in f["title"] for f in doc["findings"])
