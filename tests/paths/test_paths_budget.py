"""Latency budget per path, summary.paths, and the bootstrap comparison."""

from __future__ import annotations

import random
import time

import pytest
from paths_synth import PROFILE, conn, dns, dpf_request, req, resp, roc_request

from netdiag.analysis.stats import PERCENTILE_KEYS, bootstrap_median_diff, median
from netdiag.paths.apply import analyze_paths
from netdiag.paths.budget import Difference, PathBudget, compare
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection


def _lab(k: int, *, jitter: float = 0.0, seed: int = 3, router_delay: float = 10.0,
         roc_think: float = 20.0, dpf_think: float = 20.0) -> list[Connection]:
    rng = random.Random(seed)
    out: list[Connection] = []
    for i in range(k):
        out += roc_request(i * 100, 1 + 4 * i, new_origin_conn=True,
                           router_delay=router_delay + rng.uniform(-jitter, jitter),
                           think=roc_think + rng.uniform(-jitter, jitter))
    out += [dpf_request(10_000 + i * 100, 1000 + i,
                        think=dpf_think + rng.uniform(-jitter, jitter)) for i in range(k)]
    return out


DNS = [dns(-10, 2.0, "api.roc.test", ["127.0.0.10"]),
       dns(-5, 3.0, "api.roc.test", ["127.0.0.10"]),
       dns(990, 2.5, "gpu-1.dpf.test", ["127.0.0.31"]),
       dns(995, 9.0, "elsewhere.test", ["192.0.2.1"])]


def test_budget_phases_per_path() -> None:
    conns = _lab(6)
    a = analyze_paths(conns, DNS, parse_profile(PROFILE))
    roc, dpf = a.budgets["ROC"], a.budgets["DPF"]
    assert [h.name for h in roc.ordered_hops()] == ["edge", "router", "token-store", "origin"]
    assert roc.requests == 6 and len(roc.client_connections) == 6
    assert roc.dns == [2.0, 3.0] and dpf.dns == [2.5]
    assert roc.tcp == [pytest.approx(0.1)] * 6 and roc.tls == [pytest.approx(1.3)] * 6
    assert roc.hops["router"].own == [pytest.approx(11.5)] * 6
    assert roc.hops["router"].own_split["between_calls"] == [pytest.approx(10.0)] * 6
    assert roc.hops["router"].own_split["before_calls"] == [pytest.approx(1.0)] * 6
    assert roc.hops["origin"].own_split["between_calls"] == []
    assert roc.hops["edge"].own == [pytest.approx(2.0)] * 6
    assert roc.hops["token-store"].own == [pytest.approx(0.5)] * 6
    assert roc.hops["token-store"].commands == {"EVALSHA": [pytest.approx(0.5)] * 6}
    assert roc.hops["origin"].setup == [pytest.approx(0.5)] * 6
    assert roc.think == [pytest.approx(20.0)] * 6 and dpf.think == [pytest.approx(20.0)] * 6
    assert roc.transfer == [pytest.approx(1.0)] * 6
    # own + setup of every hop add up to the client's time to first byte
    total = sum(median(h.own) for h in roc.ordered_hops()) + median(roc.hops["origin"].setup)
    assert total == pytest.approx(median(roc.ttfb))
    assert dict(roc.hops["origin"].callers) == {"router": 6}


def test_upstream_requests_nothing_caused_are_not_client_requests() -> None:
    conns = _lab(6)
    redis = conns[2]
    redis.requests.insert(0, resp(-50, -49.9, "SCRIPT LOAD"))  # the router's start-up
    lone = conn("C900", "127.0.0.11:42999", "127.0.0.12:6379",
                [resp(-40, -39.9, "PING")], protocol="resp")
    a = analyze_paths([*conns, lone], DNS, parse_profile(PROFILE))
    roc = a.budgets["ROC"]
    assert roc.requests == 6 and len(roc.ttfb) == 6
    assert roc.hops["token-store"].requests == 8  # still counted at their hop


def test_summary_paths_follows_the_contract() -> None:
    a = analyze_paths(_lab(6), DNS, parse_profile(PROFILE))
    s = a.summary()
    assert list(s) == ["DPF", "ROC"]
    roc = s["ROC"]
    assert {"requests", "connections", "reuse_rate", "ttfb_ms", "phases"} <= set(roc)
    assert roc["requests"] == 6 and roc["connections"] == 6 and roc["reuse_rate"] == 0.0
    assert set(roc["ttfb_ms"]) == set(PERCENTILE_KEYS)
    ph = roc["phases"]
    assert set(ph) == {"dns_ms", "tcp_ms", "tls_ms", "hops", "think_ms", "transfer_ms"}
    assert list(ph["hops"]) == ["edge", "router", "token-store", "origin"]
    router = ph["hops"]["router"]
    assert router["own_ms"]["p50"] == pytest.approx(11.5)
    assert router["servers"] == ["127.0.0.11:8080"] and router["requests"] == 6
    assert router["own_split_ms"]["between_calls"]["p50"] == pytest.approx(10.0)
    assert ph["hops"]["token-store"]["commands"]["EVALSHA"]["count"] == 6
    assert s["DPF"]["phases"]["hops"]["origin"]["setup_ms"]["count"] == 0
    assert s["DPF"]["inferred"] is False and roc["estimated"] is False


def test_bootstrap_is_deterministic_with_a_seed() -> None:
    rng = random.Random(1)
    a = [30 + rng.gauss(0, 2) for _ in range(40)]
    b = [20 + rng.gauss(0, 2) for _ in range(40)]
    r1 = bootstrap_median_diff(a, b, seed=7)
    assert r1 == bootstrap_median_diff(a, b, seed=7)
    assert r1 != bootstrap_median_diff(a, b, seed=8)
    point, lo, hi = r1
    assert point == pytest.approx(median(a) - median(b))
    assert lo < point < hi and lo > 7 and hi < 13
    one = bootstrap_median_diff(a, None, seed=7)
    assert one[1] < median(a) < one[2]
    with pytest.raises(ValueError):
        bootstrap_median_diff([], [1.0])


def test_bootstrap_caps_large_samples() -> None:
    rng = random.Random(2)
    a = [rng.gauss(50, 5) for _ in range(50_000)]
    b = [rng.gauss(40, 5) for _ in range(50_000)]
    t = time.perf_counter()
    point, lo, hi = bootstrap_median_diff(a, b)
    assert time.perf_counter() - t < 20
    assert lo < point < hi and lo > 8 and hi < 12


def _budget(name: str, own: dict[str, list[float]], ttfb: list[float]) -> PathBudget:
    b = PathBudget(name)
    for hop, vals in own.items():
        b.hop(hop).own = list(vals)
    b.ttfb = list(ttfb)
    return b


def test_difference_is_stated_when_the_data_supports_it() -> None:
    rng = random.Random(5)
    roc = _budget("ROC", {"router": [25.3 + rng.gauss(0, 1) for _ in range(30)],
                          "origin": [20 + rng.gauss(0, 1) for _ in range(30)]},
                  [46 + rng.gauss(0, 1) for _ in range(30)])
    dpf = _budget("DPF", {"origin": [20 + rng.gauss(0, 1) for _ in range(30)]},
                  [20 + rng.gauss(0, 1) for _ in range(30)])
    diffs = {d.phase: d for d in compare(roc, dpf, seed=0)}
    router = diffs["hop:router"]
    assert router.only_a and router.supported
    assert router.ci_low_ms is not None and router.ci_high_ms is not None
    assert router.ci_low_ms < 25.3 < router.ci_high_ms
    assert router.sentence.startswith("ROC adds 25.")
    assert " at the router (95% CI 2" in router.sentence
    assert diffs["ttfb"].supported
    assert diffs["ttfb"].sentence.startswith("ROC's time to first byte is 2")
    # the same origin on both paths: the interval straddles 0, so no sentence
    origin = diffs["hop:origin"]
    assert not origin.supported and origin.reason is not None
    assert "includes 0" in origin.reason
    assert origin.sentence.startswith("ROC vs DPF, at the origin: not enough evidence (95% CI")


def test_difference_declines_on_small_samples() -> None:
    roc = _budget("ROC", {"router": [25.0, 26.0, 24.0, 25.5]}, [50.0, 51, 49, 50])
    dpf = _budget("DPF", {}, [20.0, 21, 19, 20, 20, 22])
    diffs = {d.phase: d for d in compare(roc, dpf, seed=0)}
    assert not diffs["hop:router"].supported
    assert diffs["hop:router"].sentence == (
        "ROC at the router: not enough evidence (4 samples; 5 per side needed)")
    assert not diffs["ttfb"].supported
    assert diffs["ttfb"].reason == "4 samples against 6; 5 per side needed"


def test_difference_declines_on_noise() -> None:
    rng = random.Random(9)
    roc = _budget("ROC", {"router": [rng.uniform(-20, 22) for _ in range(12)]},
                  [rng.uniform(0, 100) for _ in range(12)])
    dpf = _budget("DPF", {}, [rng.uniform(0, 100) for _ in range(12)])
    diffs = compare(roc, dpf, seed=0)
    assert diffs and not any(d.supported for d in diffs)
    assert all("not enough evidence" in d.sentence for d in diffs)


def test_recovers_injected_router_delay_and_think_time() -> None:
    conns = _lab(20, jitter=1.5, router_delay=25.0, roc_think=30.0, dpf_think=12.0)
    a = analyze_paths(conns, DNS, parse_profile(PROFILE))
    roc, dpf = a.budgets["ROC"], a.budgets["DPF"]
    # router own = 1 ms before redis + delay + 0.5 ms after the origin answered
    assert median(roc.hops["router"].own) == pytest.approx(26.5, abs=1.0)
    assert median(roc.hops["router"].own_split["between_calls"]) == pytest.approx(25, abs=1)
    assert median(roc.think) == pytest.approx(30.0, abs=1.0)
    assert median(dpf.think) == pytest.approx(12.0, abs=1.0)
    diffs: dict[str, Difference] = {d.phase: d for d in a.differences}
    assert diffs["hop:router"].supported and diffs["think"].supported
    assert diffs["think"].sentence.startswith("ROC's origin think time takes 1")
    assert all(d.a == "ROC" and d.b == "DPF" for d in a.differences)


def test_one_hop_paths_are_not_compared_three_times() -> None:
    """On a one-hop path the origin's own time, its think time and the TTFB are the
    same samples: compared once, as the time to first byte."""
    text = ('version = 1\n[[path]]\nname = "A"\nhops = ["origin"]\n[[path.rule]]\n'
            'server = ["127.0.0.31/32"]\n[[path]]\nname = "B"\nhops = ["origin"]\n'
            '[[path.rule]]\nserver = ["127.0.0.32/32"]\n')
    conns = [dpf_request(i * 100, i, think=20) for i in range(6)]
    for i in range(6):
        c = dpf_request(1000 + i * 100, 50 + i, think=10)
        c.server = "127.0.0.32:443"
        conns.append(c)
    a = analyze_paths(conns, [], parse_profile(text))
    assert [d.phase for d in a.differences] == ["ttfb", "tcp", "tls", "transfer"]
    assert a.differences[0].supported and (a.differences[0].a, a.differences[0].b) == (
        "A", "B")


def test_estimated_requests_mark_the_path() -> None:
    conns = [dpf_request(i * 100, i) for i in range(3)]
    for c in conns:
        c.requests[0].estimated = True
    a = analyze_paths(conns, [], None)
    (b,) = a.budgets.values()
    assert b.estimated and a.summary()[b.name]["estimated"] is True


@pytest.mark.parametrize("with_profile", [True, False])
def test_lone_requests_take_the_same_figures_as_a_walked_chain(with_profile: bool) -> None:
    """The shortcut for chains of one request (most of a capture of direct traffic) adds
    to a budget exactly what walking the chain step by step adds."""
    from netdiag.paths.budget import _chain_figures, _lone_figures, own_times

    conns = _lab(4)
    conns.append(conn("C800", "127.0.0.2:41000", "127.0.0.40:443",
                      [req(50, 60, 70), req(80, None), req(90, 91, estimated=True)]))
    conns.append(conn("C801", "127.0.0.2:41001", "127.0.0.50:6379",
                      [resp(100, 100.5, "GET"), resp(110, 110.2, "PING")], protocol="resp"))
    a = analyze_paths(conns, DNS, parse_profile(PROFILE) if with_profile else None)
    lone = [(b, root) for b in a.budgets.values() for root in b.roots if not root.children]
    # with the profile, the Redis server no path names is on no path (no budget)
    kinds = {"h2"} if with_profile else {"h2", "resp"}
    assert len(lone) >= 5 and {root.req.protocol for _, root in lone} >= kinds
    assert any(root.wait_ns is None for _, root in lone)
    owned = 0
    for b, root in lone:
        for complete in (True, False):
            got: list[dict[str, object]] = []
            for walked in (False, True):
                fresh = PathBudget(b.name, b.inferred, origin_hop=root.conn.path["hop"])
                own = (_chain_figures(fresh, a.chains, root, complete) if walked
                       else _lone_figures(fresh, root, complete))
                got.append({"json": fresh.to_json(), "own": own_times(own, root.req),
                            "think": fresh.think,
                            "depth": {h.name: h.depth for h in fresh.hops.values()}})
            assert got[0] == got[1]
            owned += got[0]["own"] is not None
    assert owned >= 3  # complete chains with a time to first byte were compared
