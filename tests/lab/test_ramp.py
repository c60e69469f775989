"""The lab's open-loop ramp (issue 13, part 3): the schedule, the router's queue in
Redis, and a real ramp whose knee is the queue's.

* pure parts (no servers): ``--ramp`` parsing, the thinning schedule (its count, its
  rising rate, its seed), the parameters;
* the queue script against a real ``redis-server`` with synthetic clocks: exact
  waits, refusal beyond the queue limit, recovery after an idle spell;
* live (root, ``redis-server``; in a network namespace of the lab's own): a short
  ramp through a router budget, checked with the ledger's own clocks against each
  other -- the client's scheduled and sent times, the hops' wall-clock timestamps
  (``hops``), the origins' arrival rate -- never against the sleeps the lab injects;
  and a small queue that refuses.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import statistics
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from labtools import LIVE

from netdiag.lab import LabParams, run_lab
from netdiag.lab.ramp import parse_duration, parse_ramp, ramp_rate, ramp_schedule
from netdiag.lab.redis_store import (
    QUEUE_KEY,
    QUEUE_SCRIPT,
    RedisServer,
    find_redis_server,
    queue_reply,
)

REDIS = pytest.mark.skipif(find_redis_server() is None,
                           reason="needs redis-server (apt-get install redis-server)")

# ---------------------------------------------------------------------- pure parts


def test_ramp_parsing() -> None:
    assert parse_ramp("50:1500:30s") == (50.0, 1500.0, 30.0)
    assert parse_ramp("0:10.5:500ms") == (0.0, 10.5, 0.5)
    assert parse_ramp("5:60:2m") == (5.0, 60.0, 120.0)
    assert parse_ramp("5:60:12.5") == (5.0, 60.0, 12.5)
    assert parse_duration(" 250ms ") == 0.25
    for bad, why in [("50:1500", "FROM:TO:DURATION"), ("a:10:1s", "FROM"),
                     ("-1:10:1s", "FROM"), ("1:0:1s", "TO must be more than 0"),
                     ("1:x:1s", "TO"), ("1:10:0s", "more than 0"), ("1:10:3h", "duration"),
                     ("1:10:", "duration"), ("1:nan:1s", "TO"), ("1:10:61m", "at most"),
                     ("1:1e6:1s", "at most")]:
        with pytest.raises(ValueError, match=why):
            parse_ramp(bad)


def test_cli_ramp_errors_are_bad_parameters(tmp_path: Path) -> None:
    from netdiag.commands.lab import lab

    result = CliRunner().invoke(lab, ["-w", str(tmp_path / "x.pcapng"), "--ramp", "5:0:1s"])
    assert result.exit_code == 2
    assert "Invalid value for '--ramp'" in result.output
    assert "TO must be more than 0" in result.output
    result = CliRunner().invoke(lab, ["-w", str(tmp_path / "x.pcapng"), "--router-budget", "0"])
    assert result.exit_code == 2 and "--router-budget" in result.output


def test_ramp_params_are_checked_and_extend_the_time_limit() -> None:
    p = LabParams()
    assert (p.ramp, p.router_budget_per_s, p.router_queue_limit) == (None, None, 50)
    assert p.run_timeout_s == p.timeout_s == 60.0
    r = LabParams(ramp=[5, 60, 120], timeout_s=30)  # a list (JSON) becomes a tuple
    assert r.ramp == (5.0, 60.0, 120.0) and r.run_timeout_s >= 120 + 30
    assert json.loads(json.dumps(r.to_json()))["ramp"] == [5.0, 60.0, 120.0]
    for bad in ({"ramp": (1, 0, 5)}, {"ramp": (-1, 5, 5)}, {"ramp": (1, 5, 0)},
                {"ramp": (1, 5)}, {"router_budget_per_s": 0}, {"router_queue_limit": -1}):
        with pytest.raises(ValueError):
            LabParams(**bad)


@pytest.mark.parametrize("ramp", [(5.0, 60.0, 10.0), (200.0, 20.0, 30.0), (40.0, 40.0, 5.0)])
def test_thinning_schedule(ramp: tuple[float, float, float]) -> None:
    lo, hi, duration = ramp
    times = ramp_schedule(ramp, 1, "ROC")
    mean = (lo + hi) / 2 * duration  # the integral of the rate
    assert abs(len(times) - mean) < 5 * math.sqrt(mean)
    assert times == sorted(times) and times[0] >= 0 and times[-1] < duration
    third = [sum(1 for t in times if k * duration / 3 <= t < (k + 1) * duration / 3)
             for k in range(3)]
    if hi > lo:
        assert third[2] > third[0]
    elif hi < lo:
        assert third[2] < third[0]
    assert ramp_rate(ramp, 0) == lo and ramp_rate(ramp, duration) == hi
    # reproducible from the seed and the path, different for another of either
    assert ramp_schedule(ramp, 1, "ROC") == times
    assert ramp_schedule(ramp, 2, "ROC") != times
    assert ramp_schedule(ramp, 1, "DPF") != times


def test_thinning_follows_the_rate_over_many_runs() -> None:
    ramp = (10.0, 90.0, 10.0)
    counts = [0] * 5
    for seed in range(40):
        for t in ramp_schedule(ramp, seed, "DPF"):
            counts[int(t // 2)] += 1
    for k, n in enumerate(counts):  # 40 runs x the integral of the rate over [2k, 2k+2)
        expected = 40 * 2 * ramp_rate(ramp, 2 * k + 1)
        assert abs(n - expected) < 5 * math.sqrt(expected), (k, n, expected)


def test_hops_are_joined_through_the_chains() -> None:
    from netdiag.lab.chains import build_chains

    t = 1_700_000_000.0
    ns = int(t * 1e9)
    requests = [
        {"request_id": "roc-1", "path": "ROC", "status": 200, "client": "127.0.0.2:5000",
         "server": "127.0.0.10:443", "stream_id": 1, "sent_ts": t},
        {"request_id": "roc-2", "path": "ROC", "status": 429, "client": "127.0.0.2:5000",
         "server": "127.0.0.10:443", "stream_id": 3, "sent_ts": t},
        {"request_id": "dpf-1", "path": "DPF", "status": 200, "client": "127.0.0.3:6000",
         "server": "127.0.0.31:443", "stream_id": 1, "sent_ts": t},
        {"request_id": "roc-3", "path": "ROC", "status": None, "client": None,
         "server": "127.0.0.10:443", "stream_id": None, "sent_ts": None},
    ]
    edge = [{"client": "127.0.0.2:5000", "server": "127.0.0.10:443", "stream_id": sid,
             "ordinal": None, "server_timing": None, "received_ns": ns + 1_000_000 * sid,
             "forwarded_ns": ns + 1_000_000 * sid + 200_000, "upstream": [
                 {"hop": "router", "client": "127.0.0.10:7000", "server": "127.0.0.11:8080",
                  "stream_id": sid, "ordinal": None}]} for sid in (3, 1)]
    router = [{"client": "127.0.0.10:7000", "server": "127.0.0.11:8080", "stream_id": 1,
               "ordinal": None, "request_id": None, "received_ns": ns + 1_500_000,
               "store_ms": 0.2, "queue_ms": 40.0, "denied": False,
               "dispatched_ns": ns + 52_000_000, "upstream": [
                   {"hop": "token-store", "client": "127.0.0.11:7100",
                    "server": "127.0.0.12:6379", "stream_id": None, "ordinal": 0},
                   {"hop": "origin", "client": "127.0.0.11:7200", "server": "127.0.0.21:443",
                    "stream_id": 1, "ordinal": None}]},
              {"client": "127.0.0.10:7000", "server": "127.0.0.11:8080", "stream_id": 3,
               "ordinal": None, "request_id": None, "received_ns": ns + 3_500_000,
               "store_ms": 0.2, "queue_ms": 900.0, "denied": True, "dispatched_ns": None,
               "upstream": [{"hop": "token-store", "client": "127.0.0.11:7100",
                             "server": "127.0.0.12:6379", "stream_id": None, "ordinal": 1}]}]
    origins = [{"client": "127.0.0.11:7200", "server": "127.0.0.21:443", "stream_id": 1,
                "ordinal": None, "received_ns": ns + 52_500_000, "answered_ns": ns + 72_500_000},
               {"client": "127.0.0.3:6000", "server": "127.0.0.31:443", "stream_id": 1,
                "ordinal": None, "received_ns": ns + 300_000, "answered_ns": ns + 20_300_000}]
    hops: dict[str, Any] = {}
    _chains, problems = build_chains(requests, edge, router, origins, hops)
    assert problems == []
    assert set(hops) == {"roc-1", "roc-2", "dpf-1", "roc-3"}
    one = hops["roc-1"]
    assert set(one) == {"edge", "router", "origin"}
    assert one["edge"] == {"received_ts": pytest.approx(t + 0.001, abs=1e-6),
                           "forwarded_ts": pytest.approx(t + 0.0012, abs=1e-6),
                           "received_ms": 1.0, "forwarded_ms": 1.2}
    assert one["router"]["queue_ms"] == 40.0 and one["router"]["dispatched_ms"] == 52.0
    assert one["router"]["received_ms"] == 1.5 and one["router"]["denied"] is False
    assert one["origin"]["answered_ms"] == 72.5
    refused = hops["roc-2"]
    assert set(refused) == {"edge", "router"} and refused["router"]["denied"] is True
    assert refused["router"]["dispatched_ts"] is None
    assert refused["router"]["dispatched_ms"] is None
    assert hops["dpf-1"] == {"origin": {"received_ts": pytest.approx(t + 0.0003, abs=1e-6),
                                        "answered_ts": pytest.approx(t + 0.0203, abs=1e-6),
                                        "received_ms": 0.3, "answered_ms": 20.3}}
    assert hops["roc-3"] == {}


def test_ramp_summary_counts_lag_and_windows() -> None:
    from netdiag.lab.ramp import ramp_summary

    start = 1_700_000_000.0
    reqs: list[dict[str, Any]] = []
    for i in range(20):  # one every 0.1 s for 2 s; the last five sent 15 ms late
        lag = 0.015 if i >= 15 else 0.001
        at = start + 0.05 + i * 0.1
        reqs.append({"request_id": f"roc-{i:04d}", "path": "ROC", "status": 200,
                     "scheduled_ts": at, "sent_ts": at + lag,
                     "client_ttfb_ms": 30.0 + i, "hops": {"router": {"queue_ms": float(i),
                                                                     "denied": False}}})
    reqs.append({"request_id": "roc-0020", "path": "ROC", "status": None, "error": "x",
                 "scheduled_ts": start + 1.99, "sent_ts": None, "hops": {}})
    out = ramp_summary((10.0, 10.0, 2.0), 5.0, 7, reqs, start, {"ROC": 21, "DPF": 0})
    assert (out["from_rps"], out["to_rps"], out["duration_s"]) == (10.0, 10.0, 2.0)
    assert (out["router_budget_per_s"], out["router_queue_limit"]) == (5.0, 7)
    roc = out["ROC"]
    assert (roc["offered"], roc["sent"], roc["late"]) == (21, 20, 5)
    assert roc["statuses"] == {"200": 20, "None": 1}
    assert roc["send_lag_ms"] == {"p50": pytest.approx(1.0, abs=1e-3),
                                  "p99": pytest.approx(15.0, abs=1e-3),
                                  "max": pytest.approx(15.0, abs=1e-3)}
    assert out["window_s"] == pytest.approx(0.2) and len(roc["windows"]) == 10
    first, last = roc["windows"][0], roc["windows"][-1]
    assert (first["scheduled"], first["ok"], first["queue_ms_p50"]) == (2, 2, 0.0)
    assert (last["scheduled"], last["sent"], last["failed"]) == (3, 2, 1)
    assert last["queue_ms_max"] == 19.0 and last["ttfb_ms_p99"] == 49.0
    assert out["DPF"]["offered"] == 0 and out["DPF"]["send_lag_ms"]["p50"] is None


# ---------------------------------------------------------------------- the queue in Redis


@pytest.fixture(scope="module")
def redis_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import redis

    if find_redis_server() is None:
        pytest.skip("needs redis-server (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = RedisServer("127.0.0.1", port, tmp_path_factory.mktemp("redis"))
    server.start()
    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def _queue(client: Any, now_ms: float, rate: float, limit: int,
           key: str = QUEUE_KEY) -> tuple[bool, float]:
    sha = client.script_load(QUEUE_SCRIPT)
    return queue_reply(client.evalsha(sha, 1, key, f"{now_ms:.3f}", repr(rate), limit, "t"))


@REDIS
def test_queue_script_exact_waits_refusal_and_recovery(redis_client: Any) -> None:
    redis_client.delete(QUEUE_KEY)
    # 10/s: slots 100 ms apart; three arrive at once, then one 50.5 ms later
    assert _queue(redis_client, 1000, 10, 3) == (True, 0.0)
    assert _queue(redis_client, 1000, 10, 3) == (True, 100.0)
    assert _queue(redis_client, 1000, 10, 3) == (True, 200.0)
    assert _queue(redis_client, 1050.5, 10, 3) == (True, 249.5)  # its slot: 1300
    # three are waiting (slots 1100, 1200, 1300): a fourth is refused, twice, and a
    # refusal takes no slot
    assert _queue(redis_client, 1050.5, 10, 3) == (False, 349.5)
    assert _queue(redis_client, 1099.0, 10, 3) == (False, 301.0)
    # the slot at 1100 is taken: room for one again, at 1400
    assert _queue(redis_client, 1100.0, 10, 3) == (True, 300.0)
    assert float(redis_client.get(QUEUE_KEY)) == 1500.0
    # idle long enough: no wait, the queue starts over from now
    assert _queue(redis_client, 9000, 10, 3) == (True, 0.0)
    assert float(redis_client.get(QUEUE_KEY)) == 9100.0


@REDIS
def test_queue_script_keeps_a_fractional_rate_exact(redis_client: Any) -> None:
    key = "roc:queue:test"
    redis_client.delete(key)
    now = 1.7e12  # epoch milliseconds, as the router sends them
    waits = [_queue(redis_client, now, 30, 100, key) for _ in range(61)]
    assert all(ok for ok, _ in waits)
    # 1000/30 ms apart (not 33 ms: 30.3/s): exact to the double's resolution of epoch
    # milliseconds (0.24 us), at most half of that drifting per slot
    for k, (_, wait) in enumerate(waits):
        assert abs(wait - k * 1000 / 30) < 0.001 + k * 0.00013
    assert abs(float(redis_client.get(key)) - (now + 61 * 1000 / 30)) < 0.001 + 61 * 0.00013
    # queue limit 0: served only when nothing is waiting
    redis_client.delete(key)
    assert _queue(redis_client, 0, 30, 0, key) == (True, 0.0)
    assert _queue(redis_client, 1, 30, 0, key)[0] is False
    assert _queue(redis_client, 33.4, 30, 0, key) == (True, 0.0)  # after its slot (33.33)


# ---------------------------------------------------------------------- live ramps

RAMP = (5.0, 60.0, 9.0)
BUDGET = 27.0
BASE: dict[str, Any] = {"netns": True, "settle_ms": 200.0, "think_ms": 20.0,
                        "router_delay_ms": 10.0, "hash_bucket": 7}
US = 1e-6
"""Slack of a comparison between two wall-clock timestamps (rounded to microseconds)."""
CLOCK_READS_MS = 0.05
"""How far apart two clock reads in a row may be (a hop reads the loop's clock, then
the wall clock), rounding of the logged figures included."""


def _offered_rate(led: dict[str, Any], r: dict[str, Any]) -> float:
    ramp = led["ramp"]
    return ramp_rate((ramp["from_rps"], ramp["to_rps"], ramp["duration_s"]),
                     r["scheduled_ts"] - ramp["start_ts"])


@pytest.fixture(scope="module")
def ramp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ramp") / "ramp.pcapng"
    params = LabParams(**BASE, ramp=RAMP, router_budget_per_s=BUDGET, router_queue_limit=400)
    led = run_lab(out, params)
    assert json.loads(out.with_name("ramp.expected.json").read_text())["ramp"] == led["ramp"]
    return led


@pytest.mark.slow
@LIVE
def test_ramp_is_open_loop_and_on_time(ramp_run: dict[str, Any]) -> None:
    led = ramp_run
    ramp = led["ramp"]
    assert (ramp["from_rps"], ramp["to_rps"], ramp["duration_s"]) == RAMP
    assert (ramp["router_budget_per_s"], ramp["router_queue_limit"]) == (BUDGET, 400)
    for path in ("ROC", "DPF"):
        mine = [r for r in led["request_log"] if r["path"] == path]
        unsent = sum(1 for r in mine if r["sent_ts"] is None)
        assert ramp[path]["offered"] == len(mine) == len(ramp_schedule(RAMP, 1, path))
        assert ramp[path]["sent"] == ramp[path]["offered"] - unsent
        assert not [r["error"] for r in mine if r["status"] != 200], path
        lags = [(r["sent_ts"] - r["scheduled_ts"]) * 1000 for r in mine]
        assert statistics.median(lags) < 5.0
        assert ramp[path]["send_lag_ms"]["p50"] < 5.0
        # open loop: requests leave at their scheduled times, so as many left in the
        # ramp's last second as were scheduled in it, however slow the answers were
        end = ramp["start_ts"] + RAMP[2]
        sent_last = sum(1 for r in mine if end - 1 <= r["sent_ts"] < end + 0.05)
        scheduled_last = sum(1 for r in mine if end - 1 <= r["scheduled_ts"] < end)
        assert sent_last >= scheduled_last - 2
    assert led["errors"] == []
    assert led["capture_drops"] == 0


@pytest.mark.slow
@LIVE
def test_hop_timestamps_follow_the_request(ramp_run: dict[str, Any]) -> None:
    for r in ramp_run["request_log"]:
        hops = r["hops"]
        if r["path"] == "DPF":
            assert set(hops) == {"origin"}
            order = [r["sent_ts"], hops["origin"]["received_ts"], hops["origin"]["answered_ts"]]
        else:
            assert set(hops) == {"edge", "router", "origin"}
            e, rt, o = hops["edge"], hops["router"], hops["origin"]
            order = [r["sent_ts"], e["received_ts"], e["forwarded_ts"], rt["received_ts"],
                     rt["dispatched_ts"], o["received_ts"], o["answered_ts"]]
            # the router held it at least its queue wait and its own delay, less the
            # relay time it dispatches early by (``early_ms``); its sleeps are timed by
            # the loop's monotonic clock, which may run up to 500 ppm off the wall clock
            # of the timestamps, and the wall clock of ``received`` is read just after
            # the loop's (``CLOCK_READS_MS`` apart at most)
            held_ms = (rt["dispatched_ts"] - rt["received_ts"]) * 1000
            least_ms = rt["queue_ms"] + BASE["router_delay_ms"] - rt["early_ms"]
            assert held_ms >= least_ms * (1 - 5e-4) - CLOCK_READS_MS, (
                r["request_id"], held_ms, least_ms)
        assert all(b >= a - US for a, b in itertools.pairwise(order)), r["request_id"]
        # the client saw the first byte after the origin sent it (its own clock: the
        # loop's monotonic one, which may run up to 500 ppm off the wall clock)
        answered_ms = (order[-1] - r["sent_ts"]) * 1000
        assert r["client_ttfb_ms"] >= answered_ms * (1 - 5e-4) - 0.01, r["request_id"]
        assert hops["origin"]["answered_ms"] == pytest.approx(answered_ms, abs=0.01)
    chains = {c["request_id"] for c in ramp_run["chains"]}
    assert chains == {r["request_id"] for r in ramp_run["request_log"]}


@pytest.mark.slow
@LIVE
def test_the_knee_is_the_routers_queue(ramp_run: dict[str, Any]) -> None:
    led = ramp_run
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    slot_ms = 1000 / BUDGET
    low = [r for r in roc if _offered_rate(led, r) < 0.5 * BUDGET]
    high = sorted((r for r in roc if _offered_rate(led, r) > 1.3 * BUDGET),
                  key=lambda r: r["scheduled_ts"])
    assert len(low) >= 5 and len(high) >= 60
    # under half the budget: a request waits about a slot at most (Poisson bursts)
    assert statistics.median(r["hops"]["router"]["queue_ms"] for r in low) < slot_ms
    # well over it: the queue holds requests for seconds, longer and longer
    waits = [r["hops"]["router"]["queue_ms"] for r in high]
    assert statistics.median(waits) > 10 * slot_ms
    third = len(waits) // 3
    assert statistics.median(waits[-third:]) > statistics.median(waits[:third]) + 5 * slot_ms
    # and the client sees it: its TTFB carries the wait, and little else grew
    assert all(r["client_ttfb_ms"] > r["hops"]["router"]["queue_ms"] for r in roc)
    rest = [statistics.median(r["client_ttfb_ms"] - r["hops"]["router"]["queue_ms"]
                              for r in group) for group in (low, high)]
    assert rest[1] < rest[0] + 30.0, rest
    # the origins (another process) see ROC requests arrive at the budget's rate once
    # the queue is full: R per second, however many the clients offer
    t_full = min(r["hops"]["router"]["dispatched_ts"] for r in high)
    arrivals = sorted(r["hops"]["origin"]["received_ts"] for r in roc
                      if r["hops"]["origin"]["received_ts"] >= t_full)
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert rate == pytest.approx(BUDGET, rel=0.05)
    # DPF shares the machine, not the queue: its TTFB stays flat through the ramp
    dpf = [r for r in led["request_log"] if r["path"] == "DPF"]
    early = [r["client_ttfb_ms"] for r in dpf if _offered_rate(led, r) < 0.5 * BUDGET]
    late = [r["client_ttfb_ms"] for r in dpf if _offered_rate(led, r) > 1.3 * BUDGET]
    assert statistics.median(late) < statistics.median(early) + 5.0


@pytest.mark.slow
@LIVE
def test_a_full_queue_refuses_with_429(tmp_path: Path) -> None:
    budget, limit = 10.0, 3
    params = LabParams(**BASE, ramp=(40.0, 40.0, 2.0), router_budget_per_s=budget,
                       router_queue_limit=limit)
    led = run_lab(tmp_path / "refuse.pcapng", params)
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    refused = [r for r in roc if r["status"] == 429]
    admitted = [r for r in roc if r["status"] == 200]
    assert len(refused) + len(admitted) == len(roc) == led["ramp"]["ROC"]["offered"]
    assert refused and len(refused) == led["router"]["denied"]
    assert led["ramp"]["ROC"]["statuses"].get("429") == len(refused)
    # about the budget's worth got through (2 s at 10/s, plus the queue), the rest not
    assert budget * 2 - 5 <= len(admitted) <= budget * 2 + limit + 5
    slot_ms = 1000 / budget
    for r in refused:
        hop = r["hops"]["router"]
        assert hop["denied"] and hop["queue_ms"] > limit * slot_ms - 0.01
        assert "origin" not in r["hops"] and hop["dispatched_ts"] is None
        assert r["headers"]["x-router"] == "roc-router"
    for r in admitted:
        assert r["hops"]["router"]["queue_ms"] <= limit * slot_ms + 0.01
    assert all(r["status"] == 200 for r in led["request_log"] if r["path"] == "DPF")
