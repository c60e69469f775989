"""Bounded linking: a router queueing hundreds of requests at once (a load ramp).

Every ROC request has its own four connections (client->edge, edge->router,
router->redis, router->origin); the router serves one request per 25 ms, so past 40
requests a second its queue grows and hundreds of router requests overlap each Redis
command and origin request. Linking must stay near-linear in requests: the candidate
pairs it weighs grow with requests times the plausible candidates, not with every
overlapping request.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from paths_synth import ORIGIN, PROFILE, ROUTER, conn, req, roc_request

from netdiag.paths.attribute import attribute
from netdiag.paths.chains import MAX_CANDIDATES, Chains, _Order
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection

SERVICE_MS = 25.0
"""The router serves one request per 25 ms (40 a second)."""


def ramp(duration_s: float = 40.0, rate: tuple[float, float] = (4.0, 80.0), *,
         request_ids: bool = False, redis: bool = True, seed: int = 1
         ) -> tuple[list[Connection], dict[tuple[str, int], tuple[str, int]]]:
    """Poisson arrivals whose rate ramps linearly from ``rate[0]`` to ``rate[1]`` a
    second over ``duration_s``, through a router serving one request per
    :data:`SERVICE_MS` (``start_i = max(arrival_i, start_{i-1} + 25 ms)``; the wait
    ``start - arrival`` is added to the router's 10 ms delay). ``request_ids``: the
    edge->router and router->origin requests carry the client's ``x-request-id``.
    Returns the connections and the truth: each upstream request's (connection id,
    index) -> its cause's."""
    rng = random.Random(seed)
    lo, hi = rate
    peak = max(lo, hi)
    conns: list[Connection] = []
    truth: dict[tuple[str, int], tuple[str, int]] = {}
    t = 0.0
    start = -SERVICE_MS
    n = 1
    while True:
        # thinning: a Poisson process of rate ``peak``, each arrival kept with the share
        # the ramp's rate at that time is of it
        t += rng.expovariate(peak / 1000.0)
        if t >= duration_s * 1000.0:
            break
        if rng.random() * peak > lo + (hi - lo) * t / (duration_s * 1000.0):
            continue
        start = max(t, start + SERVICE_MS)
        cs = roc_request(t, n, router_delay=10.0 + (start - t))
        client, router, store, origin = cs
        if request_ids:
            rid = f"r{n}"
            for c in (router, origin):
                headers = c.requests[0].request_headers
                assert headers is not None
                headers.append(("x-request-id", rid))
        truth[(router.id, 0)] = (client.id, 0)
        truth[(origin.id, 0)] = (router.id, 0)
        if redis:
            truth[(store.id, 0)] = (router.id, 0)
            conns += cs
        else:
            conns += [client, router, origin]
        n += 5
    return conns, truth


def _linked(duration_s: float, **kw: Any) -> tuple[Chains, float]:
    """Chains of a ramp over ``duration_s`` (the rate ramps 4 -> 80 a second whatever
    the duration: four times the duration is four times the requests, and a queue at
    the router four times as deep) and the share of upstream requests linked to their
    true cause."""
    conns, truth = ramp(duration_s, **kw)
    chains = attribute(conns, parse_profile(PROFILE))
    right = sum(1 for k, cause in truth.items()
                if (p := chains.nodes[k].parent) is not None and p.key == cause)
    return chains, right / len(truth)


def _considered(chains: Chains) -> int:
    return chains.stats["pairs_costed"] + chains.stats["pairs_stepped_over"]


@pytest.mark.parametrize("request_ids", [False, True])
def test_linking_grows_with_requests_not_with_the_queue(request_ids: bool) -> None:
    """Four times the requests, and a router queue four times as deep (hundreds of
    router requests overlap each Redis command and origin request): the candidate pairs
    looked at and weighed grow about linearly, and every upstream request still links
    to its cause."""
    small, share_small = _linked(20.0, request_ids=request_ids)
    large, share_large = _linked(80.0, request_ids=request_ids)
    assert large.stats["children"] >= 3.5 * small.stats["children"]
    assert _considered(large) <= 6 * _considered(small), (small.stats, large.stats)
    assert large.stats["links_weighed"] <= 6 * small.stats["links_weighed"]
    # the overlap really is deep: far more router requests contain an origin request
    # than the assignment weighs
    assert max(n.candidates for n in large.nodes.values()) > 8 * MAX_CANDIDATES
    assert share_small >= 0.99 and share_large >= share_small - 0.005, (share_small,
                                                                         share_large)


def test_block_walks_find_what_a_scan_finds() -> None:
    """The walks over blocks of parents (:class:`_Order`) return the nearest parent a
    scan would: one whose window lasts until the child's end and that began by its
    start."""
    rng = random.Random(3)
    for size in (1, 2, 3, 31, 32, 33, 100):
        keys = sorted(rng.randrange(1000) for _ in range(size))
        ends = [rng.randrange(2000) for _ in range(size)]
        starts = [rng.randrange(1000) for _ in range(size)]
        for with_starts in (False, True):
            order = _Order.of(keys, None, ends, starts if with_starts else None)
            for _ in range(200):
                end, start = rng.randrange(2000), rng.randrange(1000)
                lo, hi = sorted((rng.randrange(size + 1), rng.randrange(size + 1)))
                i = rng.randrange(-1, size + 1)

                def ok(j: int) -> bool:
                    return ends[j] >= end and (not with_starts or starts[j] <= start)  # noqa: B023

                want_before = next((j for j in range(min(i, size - 1), lo - 1, -1) if ok(j)),
                                   lo - 1)
                want_after = next((j for j in range(max(i, 0), hi) if ok(j)), hi)
                assert order.before(min(i, size - 1), lo, end, start) == want_before
                assert order.after(max(i, 0), hi, end, start) == want_after


@pytest.mark.parametrize("cap", [1, 2, 16])
def test_a_candidate_left_out_as_cheap_leaves_the_link_ambiguous(
        monkeypatch: pytest.MonkeyPatch, cap: int) -> None:
    """Five router requests alike (same start, same answer, five connections) hold one
    origin request: whichever the cap keeps, the link is ambiguous, never a guess."""
    from netdiag.paths import chains as chains_mod

    monkeypatch.setattr(chains_mod, "MAX_CANDIDATES", cap)
    monkeypatch.setattr(chains_mod, "MAX_CANDIDATES_DEEP", cap)
    routers = [conn(f"C{i + 1}", f"127.0.0.10:{41000 + i}", ROUTER, [req(0, 40, 41)],
                    protocol="h2c") for i in range(5)]
    origin = conn("C9", "127.0.0.11:43000", ORIGIN, [req(5, 39, 39.5)])
    chains = attribute([*routers, origin], parse_profile(PROFILE))
    n = chains.node("C9", 0)
    assert n is not None and n.parent is not None
    assert n.link == "ambiguous" and n.candidates == 5


def _tied_nodes(rng: random.Random, n_conns: int) -> list:  # type: ignore[type-arg]
    """Nodes of ``n_conns`` connections of 1 to 4 requests with many equal starts, first
    bytes and request ends (some without a first byte, some whose body ended later)."""
    from netdiag.paths.chains import Node

    conns = []
    for c in range(n_conns):
        reqs = []
        for _ in range(rng.randint(1, 4)):
            ts = rng.choice([0.0, 1.0, 2.5]) + rng.randint(0, 3)  # many equal starts
            fb = None if rng.random() < 0.2 else ts + rng.choice([0.5, 1.0, 2.0])
            r = req(ts, fb, None if fb is None else fb + 1)
            if rng.random() < 0.5:  # its body ended later (some at one instant)
                r.end_ns = r.ts_ns + rng.choice([0, 250_000, 10**6])
            reqs.append(r)
        conns.append(conn(f"C{c + 1}", "10.0.0.1:5000", ROUTER, reqs))
    return [Node.of(cn, i, r) for cn in conns for i, r in enumerate(cn.requests)]


def test_arrival_ranks_are_the_arrival_orders() -> None:
    """``_set_ranks`` (one integer per node and order) sorts as :func:`_order` does, in
    all five orders, with ties on the anchor broken by start, connection and index."""
    from netdiag.paths.chains import _ORDERS, _order, _rank, _set_ranks

    rng = random.Random(5)
    nodes = _tied_nodes(rng, 40)
    for k, nd in enumerate(nodes):
        if k % 3 == 0:
            nd.syn_first_ns = nd.ts_ns - rng.choice([0, 100, 10**6])
    _set_ranks(nodes)
    assert len({nd.rend_ns - nd.ts_ns for nd in nodes}) == 3
    for anchor, child in _ORDERS:
        want = sorted(nodes, key=lambda nd: _order(nd, anchor, child))
        got = sorted(nodes, key=lambda nd: _rank(nd, anchor, child))
        assert [nd.key for nd in got] == [nd.key for nd in want]


def test_orders_placed_without_sorting_are_the_sorted_ones() -> None:
    """The orders the linker places instead of sorting (the nodes by start from their
    first rank; a parent subset's first bytes and request ends as a stable sort of the
    positions by one value) are those of sorting by the full keys, ties and all."""
    from netdiag.paths.chains import _Linker, _Parents, _set_ranks

    rng = random.Random(11)
    nodes = _tied_nodes(rng, 60)
    rng.shuffle(nodes)
    _set_ranks(nodes)
    linker = _Linker(nodes, set(), {})
    assert [nd.key for nd in linker._by_start()] == [
        nd.key for nd in sorted(nodes, key=lambda nd: (nd.ts_ns, nd.conn_id, nd.index))]
    sub = _Parents.of(nodes)
    want_fb = sorted((k for k, nd in enumerate(nodes) if nd.fb_ns is not None),
                     key=lambda k: (nodes[k].fb_ns, k))
    assert sub.fb_pos == want_fb and sub.fbs == [nodes[k].fb_ns for k in want_fb]
    assert len(set(sub.fbs)) < len(sub.fbs)  # ties that the positions break
    pos, ends = sub.rend_keys()
    want_rend = sorted(range(len(nodes)), key=lambda k: (nodes[k].rend_ns, k))
    assert pos == want_rend and ends == [nodes[k].rend_ns for k in want_rend]
    assert len(set(ends)) < len(ends)
