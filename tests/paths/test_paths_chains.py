"""Hop chains: linking upstream requests to their cause, and exact own-time arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from paths_synth import (
    DPF_ORIGIN,
    EDGE,
    MS,
    ORIGIN,
    PROFILE,
    REDIS,
    ROUTER,
    conn,
    dpf_request,
    ns,
    req,
    resp,
    roc_request,
)

from netdiag.paths.attribute import attribute
from netdiag.paths.chains import PROXY_MIN_REQUESTS, link_requests, request_id
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection


def _roc(k: int, **kw: object) -> list[Connection]:
    out: list[Connection] = []
    for i in range(k):
        out += roc_request(i * 100, 1 + 4 * i, **kw)  # type: ignore[arg-type]
    return out


def test_own_times_add_up_to_the_client_wait_exactly() -> None:
    conns = _roc(3, new_origin_conn=True)
    chains = link_requests(conns)
    root = chains.node("C1", 0)
    assert root is not None and root.parent is None
    steps = chains.steps(root)
    assert [(s.conn.server, s.depth) for s in steps] == [
        (EDGE, 0), (ROUTER, 1), (REDIS, 2), (ORIGIN, 2)]
    own = [s.own_ns for s in steps]
    # edge: 1 ms before forwarding + 1 ms after the router answered
    # router: 1 ms before redis + 10 ms delay + 0.5 ms after the origin answered
    # redis: 0.5 ms; origin: 20 ms think, after 0.5 ms of connection setup
    assert own == [2 * MS, 11_500_000, 500_000, 20 * MS]
    origin = steps[3].node
    assert origin.opened and origin.setup_ns == 500_000 and steps[2].node.setup_ns is None
    wait = root.wait_ns
    assert wait is not None
    assert sum(o or 0 for o in own) + origin.setup_ns == wait
    assert all(s.in_ttfb for s in steps)
    assert [s.to_json()["own_ms"] for s in steps] == [2.0, 11.5, 0.5, 20.0]
    # own time around the calls: the router's 10 ms delay is between its two calls
    assert [s.parts_ns for s in steps] == [(MS, 0, MS), (MS, 10 * MS, 500_000), None, None]
    assert steps[1].to_json()["own_split_ms"] == {"before_calls": 1.0, "between_calls": 10.0,
                                                  "after_calls": 0.5}
    assert steps[3].to_json()["own_split_ms"] is None
    assert steps[3].to_json()["setup_ms"] == 0.5
    assert steps[2].to_json()["what"] == "EVALSHA roc:budget:m"
    assert set(chains.table()) == {("C1", 0), ("C5", 0), ("C9", 0)}


def test_a_chain_walked_once_reads_the_same_every_time() -> None:
    conns = _roc(3, new_origin_conn=True)
    chains = link_requests(conns)
    root = chains.node("C1", 0)
    assert root is not None and root.children
    first = chains.steps(root)
    first.clear()  # a caller's list is its own: the chain kept is not changed
    again = chains.steps(root)
    fresh = link_requests(_roc(3, new_origin_conn=True))
    fresh_root = fresh.node("C1", 0)
    assert fresh_root is not None
    assert [(s.conn.id, s.depth, s.own_ns, s.in_ttfb, s.parts_ns) for s in again] == [
        (s.conn.id, s.depth, s.own_ns, s.in_ttfb, s.parts_ns)
        for s in fresh.steps(fresh_root)]
    assert len(again) == 4 and chains.table()[("C1", 0)] == again
    # a request that caused nothing is a chain of one step, itself
    leaf = again[-1].node
    assert not leaf.children
    (only,) = chains.steps(leaf)
    assert (only.node, only.depth, only.own_ns, only.in_ttfb) == (leaf, 0, leaf.own_ns(),
                                                                  True)


def test_overlapping_callees_count_once_and_late_calls_are_not_in_the_wait() -> None:
    client = conn("C1", "10.0.0.1:5000", "10.0.0.2:443", [req(0, 50, 60)])
    a = conn("C2", "10.0.0.2:6000", "10.0.0.3:80", [req(5, 25, 26)])
    b = conn("C3", "10.0.0.2:6001", "10.0.0.4:80", [req(10, 30, 31)])
    # after the client's first byte, e.g. accounting once the answer is on its way
    late = conn("C4", "10.0.0.2:6002", "10.0.0.5:6379", [resp(52, 53, "HINCRBY")],
                protocol="resp")
    chains = link_requests([client, a, b, late], trusted=["C1"])
    root = chains.node("C1", 0)
    assert root is not None
    steps = chains.steps(root)
    assert [s.conn.id for s in steps] == ["C1", "C2", "C3", "C4"]
    # union of [5, 25] and [10, 30] is 25 ms of the 50 ms wait
    assert steps[0].own_ns == 25 * MS
    assert [s.in_ttfb for s in steps] == [True, True, True, False]


def test_a_call_after_the_first_byte_leaves_the_whole_wait_own() -> None:
    client = conn("C1", "10.0.0.1:5000", "10.0.0.2:443", [req(0, 50, 60)])
    late = conn("C4", "10.0.0.2:6002", "10.0.0.5:6379", [resp(52, 53, "HINCRBY")],
                protocol="resp")
    chains = link_requests([client, late], trusted=["C1"])
    root = chains.node("C1", 0)
    assert root is not None and [c.conn.id for c in root.children] == ["C4"]
    # a callee, but none within the wait: all of it is the hop's own, with no split
    assert root.own_and_parts_ns() == (50 * MS, None) == (root.own_ns(), root.own_parts_ns())
    first, second = chains.steps(root)
    assert (first.own_ns, first.parts_ns, second.in_ttfb) == (50 * MS, None, False)
    assert second.node.own_and_parts_ns() == (MS, None)


def test_request_without_answer_has_no_own_time() -> None:
    client = conn("C1", "10.0.0.1:5000", "10.0.0.2:443", [req(0, None)])
    client.last_ns = client.ts_ns + 100 * MS  # the answer never came; the window is the
    # connection's life
    up = conn("C2", "10.0.0.2:6000", "10.0.0.3:80", [req(5, 25, 26)])
    chains = link_requests([client, up], trusted=["C1"])
    root = chains.node("C1", 0)
    assert root is not None and [c.conn.id for c in root.children] == ["C2"]
    assert root.own_ns() is None and root.wait_ns is None


def test_concurrent_requests_on_shared_connections_link_to_their_own_cause() -> None:
    """Four overlapping ROC requests; edge->router and router->redis each on ONE
    connection, no request ids below the client: the adjacency of start (redis, router)
    and answer (origin) picks the right parent."""
    per = [roc_request(t, 100 + 4 * i, new_origin_conn=True, think=20 + 3 * i)
           for i, t in enumerate((0.0, 0.7, 1.4, 2.1))]
    clients = [p[0] for p in per]
    origins = [p[3] for p in per]
    for o in origins:
        o.requests[0].request_headers = None
    edge_router = conn("E1", "127.0.0.10:41000", ROUTER,
                       sorted((p[1].requests[0] for p in per), key=lambda r: r.ts_ns),
                       protocol="h2c")
    redis = conn("R1", "127.0.0.11:42000", REDIS,
                 sorted((p[2].requests[0] for p in per), key=lambda r: r.ts_ns),
                 protocol="resp")
    chains = link_requests([*clients, edge_router, redis, *origins])
    for i, c in enumerate(clients):
        root = chains.node(c.id, 0)
        assert root is not None
        steps = chains.steps(root)
        assert [s.conn.id for s in steps] == [c.id, "E1", "R1", origins[i].id], i
        assert steps[1].node.index == i and steps[2].node.index == i
        assert steps[3].own_ns == (20 + 3 * i) * MS
        assert steps[1].own_ns == 11_500_000


def test_request_id_links_without_address_and_different_ids_do_not() -> None:
    client = conn("C1", "127.0.0.1:5000", "127.0.0.1:443", [req(0, 30, rid="abc")])
    # sent from another address than the server's: only the id ties them
    same = conn("C2", "127.0.0.5:5001", "127.0.0.1:8080", [req(5, 25, rid="abc")])
    other = conn("C3", "127.0.0.5:5002", "127.0.0.1:8081", [req(6, 24, rid="xyz")])
    chains = link_requests([client, same, other])
    n2, n3 = chains.node("C2", 0), chains.node("C3", 0)
    assert n2 is not None and n2.parent is not None and n2.link == "request-id"
    assert n2.parent.conn.id == "C1"
    assert n3 is not None and n3.parent is None


def test_a_request_id_forwarded_through_every_hop_links_to_the_sender() -> None:
    """The edge, the router and the origin all see the same x-request-id: the origin
    request belongs to the router (who sent it), not to the edge (who came first)."""
    edge = conn("C1", "127.0.0.2:5000", EDGE, [req(0, 50, rid="r1")])
    router = conn("C2", "127.0.0.10:5001", ROUTER, [req(1, 49, rid="r1")])
    origin = conn("C3", "127.0.0.11:5002", ORIGIN, [req(10, 40, rid="r1")])
    chains = link_requests([edge, router, origin])
    n3 = chains.node("C3", 0)
    assert n3 is not None and n3.parent is not None
    assert n3.parent.conn.id == "C2" and n3.link == "request-id" and n3.from_parent_address
    root = chains.node("C1", 0)
    assert root is not None
    assert [s.own_ns for s in chains.steps(root)] == [2 * MS, 18 * MS, 30 * MS]


def test_traceparent_and_correlation_ids() -> None:
    r = req(0, 1)
    r.request_headers = [("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f0-01")]
    assert request_id(r) == "4bf92f3577b34da6a3ce929d0e0e4736"
    r.request_headers = [("X-Correlation-ID", "q1")]
    assert request_id(r) == "q1"
    r.request_headers = None
    assert request_id(r) is None


def test_a_redis_command_naming_a_request_id_links_to_that_request() -> None:
    """A rate-limit script called with the request's id (an argument, or part of a key)
    goes to the router request of that id, whatever the order the router served them
    in; a command naming two ids, or none, is linked by time as before."""
    one, two = "req-0001-aaaa", "req-0002-bbbb"
    edge = [conn(f"C{i + 1}", f"10.0.0.{i + 1}:5000", EDGE,
                 [req(0.2 * i, 50 + 0.2 * i, rid=r, authority="api.roc.test")],
                 sni="api.roc.test", tls=(-1.8, -0.5)) for i, r in enumerate((one, two))]
    router = [conn(f"C{i + 3}", f"127.0.0.10:{5001 + i}", ROUTER,
                   [req(1 + 0.2 * i, 49 + 0.2 * i, rid=r)]) for i, r in enumerate((one, two))]
    first, second = resp(1.5, 1.7), resp(1.6, 1.8)  # served in the other order
    redis = conn("R1", "127.0.0.11:6000", REDIS, [first, second], protocol="resp")
    conns = [*edge, *router, redis]

    def links(words: list[tuple[str, ...] | None]) -> list[list[tuple[str | None, str]]]:
        first.named_ids, second.named_ids = words
        out = []
        for chains in (link_requests(conns), attribute(conns, parse_profile(PROFILE))):
            out.append([(n.parent.conn.id if n.parent else None, str(n.link))
                        for n in (chains.node("R1", 0), chains.node("R1", 1))
                        if n is not None])
        return out

    by_id = [("C4", "request-id"), ("C3", "request-id")]
    assert links([("f" * 40, two), (f"idem:{one}", one)]) == [by_id, by_id]
    # without the words, with both ids in one command, or with no id: time decides
    # (arrival order, under the profile; too few requests for statistics without it)
    for words in ([None, None], [(one, two), None], [("no-such-request-id",), None]):
        plain, profiled = links(words)
        assert [g[0] for g in profiled] == ["C3", "C4"], words
        assert "request-id" not in {g[1] for g in plain + profiled}, words


def _proxy_capture(n: int, followed: int) -> list[Connection]:
    """``n`` requests to 10.0.0.2:443, the first ``followed`` of them containing an
    upstream request from 10.0.0.2."""
    out = []
    for i in range(n):
        t = i * 100.0
        out.append(conn(f"C{2 * i + 1}", "10.0.0.1:5000", "10.0.0.2:443",
                        [req(t, t + 30, t + 31)]))
        if i < followed:
            out.append(conn(f"C{2 * i + 2}", "10.0.0.2:6000", "10.0.0.3:80",
                            [req(t + 5, t + 25, t + 26)]))
    return out


def test_proxy_inference_needs_consistency() -> None:
    assert PROXY_MIN_REQUESTS == 3
    for n, followed, proxy in ((2, 2, False), (3, 3, True), (5, 4, True), (5, 3, False),
                               (12, 12, True)):
        chains = link_requests(_proxy_capture(n, followed))
        ev = chains.proxies["10.0.0.2:443"]
        assert (ev.followed, ev.total, ev.is_proxy) == (followed, n, proxy)
        linked = sum(1 for x in chains.nodes.values() if x.parent is not None)
        assert linked == (followed if proxy else 0), (n, followed)
    chains = link_requests(_proxy_capture(12, 12))
    assert chains.proxies["10.0.0.2:443"].sentence == (
        "12 of 12 requests to 10.0.0.2:443 contained upstream requests (sent from 10.0.0.2)")


def test_profile_trust_links_below_the_consistency_threshold() -> None:
    conns = _proxy_capture(2, 2)
    chains = link_requests(conns, trusted=["C1", "C3"])
    assert sum(1 for x in chains.nodes.values() if x.parent is not None) == 2


def test_unrelated_traffic_is_not_linked() -> None:
    roc = _roc(3)
    dpf = [dpf_request(5 + i * 100, 200 + i, think=10) for i in range(3)]  # inside ROC windows
    chains = link_requests(roc + dpf)
    for c in dpf:
        n = chains.node(c.id, 0)
        assert n is not None and n.parent is None and not n.children
    assert DPF_ORIGIN not in chains.proxies


def test_attribute_returns_the_chains_it_used() -> None:
    conns = _roc(3)
    chains = attribute(conns, None)
    assert len(chains.table()) == 3
    root = chains.roots[0]
    assert chains.depth(root) == 0
    leaf = chains.steps(root)[-1].node
    assert chains.depth(leaf) == 2 and chains.root_of(leaf) is root


def _option(parent: Connection, child: Connection, pg: str, cost: float,
            rid: bool = False) -> Any:
    from netdiag.paths.chains import Node, _Edge

    p = Node.of(parent, 0, parent.requests[0])
    u = Node.of(child, 0, child.requests[0])
    return _Edge(p, u, ("hop", "ROC", pg), ("hop", "ROC", "token-store"),
                 ("hop", "ROC", "token-store"), rid, True, False, 0.0, 0.0, None, None, 0.0,
                 cost)


def test_a_child_goes_to_the_nearest_hop_that_called_it_not_a_cheaper_outer_one() -> None:
    """Live lab (HTTP/1.1 router, 16 at once): the edge forwarded request A late, so
    A's router request began after request B had reached the edge. B's edge request was
    then the cheaper link for A's token-store command at the edge's level, and the two
    windows do not nest (A's router request outlives B); the command went to B's edge
    request, skipping the router, whose own assignment had given it to A's router
    request as its only command. The nearest hop's sole call wins; a second call of
    the kind, or an id the outer link carries, does not."""
    from netdiag.paths.chains import _innermost

    b_edge = conn("C1", "127.0.0.2:1", EDGE, [req(5, 20, 21)])
    a_router = conn("C2", "127.0.0.10:2", ROUTER, [req(8, 40, 41)])
    command = conn("C3", "127.0.0.11:3", REDIS, [resp(9.4, 9.6)], protocol="resp")
    calls = {(("hop", "ROC", "edge"), ("hop", "ROC", "router"))}

    def pick(sole_router: bool, edge_rid: bool = False) -> str:
        outer = _option(b_edge, command, "edge", 0.1, rid=edge_rid)
        inner = _option(a_router, command, "router", 0.4)
        shared = set() if sole_router else {id(inner)}
        return str(_innermost([outer, inner], calls, shared).parent.label)

    assert pick(sole_router=True) == "C2#0"
    assert pick(sole_router=False) == "C1#0"  # a second call: the cheaper link stands
    assert pick(sole_router=True, edge_rid=True) == "C1#0"
    # hops that do not call each other: the cheaper link, then the innermost window
    outer = _option(b_edge, command, "edge", 0.1)
    inner = _option(a_router, command, "router", 0.4)
    assert _innermost([outer, inner], set(), set()).parent.label == "C1#0"


def test_answers_relayed_in_one_packet_leave_the_order_to_the_starts() -> None:
    """Live lab (all at once, no request ids, beside two CPU burners): seven requests
    began in one packet on one HTTP/2 connection and their seven answers left in one
    packet. The edge forwarded each once its body had come, in the order they began;
    the router's answers came back in the reverse order. Paired by first bytes (the
    pair's anchor), the order-keeping assignment linked them backwards, two across
    paths. Parents with one first byte say nothing of their order by it, so their
    children go to them in the order both began, where that costs no more."""
    from netdiag.paths.chains import Node, _assign, _Edge, _set_ranks

    paths = ["/v1/messages", "/v1/stream", "/v1/stream", "/v1/messages", "/v1/stream",
             "/v1/messages", "/v1/messages"]
    client = conn("C1", "10.0.0.1:5000", EDGE,
                  [req(6.3, 174.5, 174.5, path=p, stream_id=5 + 2 * i)
                   for i, p in enumerate(paths)])
    # another client's request in between, answered on its own
    other = conn("C2", "10.0.0.2:5000", EDGE, [req(6.5, 175.5, 175.5, path="/v1/stream")])
    kids = [conn(f"C{i + 3}", f"127.0.0.10:{6000 + i}", ROUTER,
                 [req(52.5 + 2 * i, 168.0 - 0.06 * i, 168.5, path=p)])
            for i, p in enumerate(paths)]
    extra = conn("C10", "127.0.0.10:6100", ROUTER, [req(53.0, 169.0, 169.5, path="/v1/stream")])
    parents = [Node.of(client, i, r) for i, r in enumerate(client.requests)]
    parents.append(Node.of(other, 0, other.requests[0]))
    children = [Node.of(k, 0, k.requests[0]) for k in [*kids, extra]]
    _set_ranks(parents + children)
    pg, cg = ("hop", "ROC", "edge"), ("hop", "ROC", "router")

    def cost(p: Any, c: Any) -> float:  # the edge relays the answer 6.5 ms after the router
        return abs((p.fb_ns - c.fb_ns) / MS - 6.5) + (30.0 if p.req.path != c.req.path else 0)

    edges = [_Edge(p, c, pg, cg, cg, False, True, False, 0.0, 0.0, None, None, 0.0,
                   cost(p, c))
             for p in parents for c in children]
    taken = _assign(edges, False, {(pg, cg): True})
    got = [(taken[id(c)].parent.conn.id, taken[id(c)].parent.index) for c in children]
    assert got == [("C1", i) for i in range(7)] + [("C2", 0)], got


def _held_and_left(costs: dict[tuple[str, str], float], held: dict[str, str],
                   rid: frozenset[tuple[str, str]] = frozenset()
                   ) -> tuple[dict[str, Any], dict[str, Any], dict[int, Any], list[Any]]:
    """Router requests (parents) and origin requests (children) by name, a matching that
    gives child ``c`` parent ``held[c]``, and every edge ``(parent, child): cost`` sorted
    by cost, as :func:`netdiag.paths.chains._assign` hands them to ``_augment``."""
    from netdiag.paths.chains import Node, _Edge

    names_p = sorted({p for p, _c in costs})
    names_c = sorted({c for _p, c in costs})
    parents = {n: Node.of(k, 0, k.requests[0]) for i, n in enumerate(names_p)
               for k in [conn(f"P{i}", f"10.0.0.1:{5000 + i}", ROUTER,
                              [req(10.0 + i, 90.0, 91.0)])]}
    children = {n: Node.of(k, 0, k.requests[0]) for i, n in enumerate(names_c)
                for k in [conn(f"K{i}", f"10.0.0.2:{6000 + i}", ORIGIN,
                               [req(20.0 + i, 60.0, 61.0)])]}
    pg, cg = ("hop", "ROC", "router"), ("hop", "ROC", "origin")
    edges = sorted((_Edge(parents[p], children[c], pg, cg, cg, (p, c) in rid, True, False,
                          0.0, 0.0, None, None, 0.0, cost)
                    for (p, c), cost in costs.items()), key=lambda e: e.cost)
    taken = {id(children[c]): e for e in edges for c, p in held.items()
             if e.child is children[c] and e.parent is parents[p]}
    return parents, children, taken, edges


def test_a_child_left_over_moves_others_along_to_a_free_parent_before_a_second_call() -> None:
    """Saved nginx burst (tests/paths/data/nginx-c16-burst): the final round gave router
    request R3 two origin calls while R1 made none; the call left over could reach R1
    through two others, each moving to the next one's parent. Along the cheapest such
    path every parent keeps one call; without one, the child stays left over (the second
    call of the kind is then the caller's to give)."""
    from netdiag.paths.chains import _augment

    costs = {("R2", "A"): 5.0, ("R1", "A"): 40.0, ("R3", "B"): 10.0, ("R2", "B"): 17.0,
             ("R3", "C"): 23.0}
    parents, children, taken, edges = _held_and_left(costs, {"A": "R2", "B": "R3"})
    _augment(taken, edges)
    got = {c: taken[id(n)].parent.conn.id for c, n in children.items()}
    assert got == {"A": parents["R1"].conn.id, "B": parents["R2"].conn.id,
                   "C": parents["R3"].conn.id}
    # the cheaper of two paths: C takes R3 from B, which takes R2 from A (to R1: 35 more)
    # or goes to free R4 (50 more)
    costs[("R4", "B")] = 60.0
    parents, children, taken, edges = _held_and_left(costs, {"A": "R2", "B": "R3"})
    _augment(taken, edges)
    assert taken[id(children["B"])].parent is parents["R2"]
    costs[("R4", "B")] = 40.0
    parents, children, taken, edges = _held_and_left(costs, {"A": "R2", "B": "R3"})
    _augment(taken, edges)
    assert taken[id(children["B"])].parent is parents["R4"]
    assert taken[id(children["A"])].parent is parents["R2"]


def test_no_child_moves_where_no_parent_is_free_or_a_link_is_by_id() -> None:
    """A proxy that makes two calls per request leaves no parent free: nothing moves.
    A link by equal ids never moves, and a path longer than the bound is not taken."""
    from netdiag.paths.chains import MAX_AUGMENT_DEPTH, _augment

    costs = {("R1", "A"): 5.0, ("R1", "B"): 6.0, ("R2", "C"): 5.0, ("R2", "D"): 6.0,
             ("R2", "B"): 9.0}
    _parents, children, taken, edges = _held_and_left(costs, {"A": "R1", "C": "R2"})
    before = dict(taken)
    _augment(taken, edges)
    assert taken == before and id(children["B"]) not in taken
    # R0 is free, but A holds R1 by its request id
    costs = {("R1", "A"): 5.0, ("R0", "A"): 7.0, ("R1", "B"): 6.0}
    _parents, children, taken, edges = _held_and_left(costs, {"A": "R1"},
                                                      rid=frozenset({("R1", "A")}))
    _augment(taken, edges)
    assert id(children["B"]) not in taken
    # a chain of moves one child longer than the bound: X0 left over, Xi holds Ri, each
    # may move to the next parent, the last to free parent R{n}
    n = MAX_AUGMENT_DEPTH
    for length, moved in ((n - 1, True), (n, False)):
        costs = {(f"R{i:02}", f"X{i:02}"): 1.0 for i in range(1, length + 1)}
        costs.update({(f"R{i + 1:02}", f"X{i:02}"): 2.0 for i in range(length + 1)})
        held = {f"X{i:02}": f"R{i:02}" for i in range(1, length + 1)}
        _parents, children, taken, edges = _held_and_left(costs, held)
        _augment(taken, edges)
        assert (id(children["X00"]) in taken) is moved, length


def test_parents_with_the_same_window_do_not_keep_the_choice_going_round() -> None:
    """Two parents of different groups spanning exactly the same time (crafted, or two
    proxies' requests stamped alike): neither is inside the other, so the choice ends."""
    from netdiag.paths.chains import _innermost

    one = conn("C1", "127.0.0.2:1", EDGE, [req(5, 20, 21)])
    two = conn("C2", "127.0.0.10:2", ROUTER, [req(5, 20, 21)])
    command = conn("C3", "127.0.0.11:3", REDIS, [resp(9.4, 9.6)], protocol="resp")
    a = _option(one, command, "edge", 0.3)
    b = _option(two, command, "router", 0.2)
    assert _innermost([a, b], set(), set()).parent.label == "C2#0"


@pytest.mark.timeout(60)
def test_an_edge_and_a_router_request_stamped_alike_still_link() -> None:
    """A crafted capture: the edge's and the router's requests start and end at the same
    nanosecond, and a token-store command lies inside both. Linking ends (it went round
    forever) and the command goes to the router, which the edge called."""
    conns = [conn("C1", "127.0.0.2:1", EDGE, [req(0, 20, 21, authority="api.roc.test")],
                  sni="api.roc.test", tls=(-1.8, -0.5)),
             conn("C2", "127.0.0.10:2", ROUTER, [req(0, 20, 21)]),
             conn("C3", "127.0.0.11:3", REDIS, [resp(1, 1.5)], protocol="resp")]
    chains = attribute(conns, parse_profile(PROFILE))
    router, command = chains.node("C2", 0), chains.node("C3", 0)
    assert router is not None and command is not None
    assert router.parent is chains.node("C1", 0) and command.parent is router


@pytest.mark.timeout(60)
def test_two_requests_that_name_each_other_make_no_loop_of_parents() -> None:
    """A crafted capture: two requests with the same request id start at the same
    instant and, unanswered, each spans the other. Each is then the other's parent by id;
    found by random small topologies, the loop made every walk up a chain endless. One
    of them becomes the root, whatever the order of the connections."""
    for order in (1, -1):
        conns = [conn("C1", "127.0.0.2:1", ROUTER, [req(40, None, rid="b")], protocol="h2c"),
                 conn("C2", "127.0.0.10:2", EDGE, [req(40, None, rid="b")])][::order]
        chains = attribute(conns, None)
        one, two = chains.node("C1", 0), chains.node("C2", 0)
        assert one is not None and two is not None
        assert {one.parent, two.parent} in ({None, one}, {None, two})
        assert chains.root_of(one) is chains.root_of(two) in (one, two)
        assert len(chains.roots) == 1


def _random_topology(seed: int) -> list[Connection]:
    """Up to 40 connections of up to 4 requests to the ROC hops, a DPF origin or Redis,
    from the client's, the edge's, the router's or the loopback address; times on a
    coarse grid (many ties), answers missing or out of order, ids shared at random,
    request bodies that end later, at once or (crafted) before the request began."""
    import random

    rng = random.Random(seed)
    servers = [(EDGE, "h2"), (ROUTER, "h2c"), (REDIS, "resp"), (ORIGIN, "h2"),
               (DPF_ORIGIN, "h2")]
    clients = ["127.0.0.2", "127.0.0.10", "127.0.0.11", "127.0.0.1"]
    grid = rng.choice([1, 2, 5])
    out: list[Connection] = []
    for k in range(rng.randint(1, 40)):
        server, protocol = rng.choice(servers)
        reqs = []
        for _ in range(rng.randint(1, 4)):
            ts = rng.randint(0, 10) * grid
            fb = None if rng.random() < 0.15 else ts + rng.randint(-2, 6) * grid
            lb = None if fb is None or rng.random() < 0.2 else fb + rng.randint(-2, 3) * grid
            if protocol == "resp":
                reqs.append(resp(ts, fb if fb is not None else ts))
            else:
                r = req(ts, fb, lb, rid=rng.choice([None, None, "a", "b"]),
                        authority=rng.choice([None, "api.roc.test"]),
                        path=rng.choice(["/a", "/b", None]))
                if rng.random() < 0.5:
                    r.end_ns = ns(ts + rng.randint(-1, 8) * grid)
                reqs.append(r)
        reqs.sort(key=lambda r: r.ts_ns)
        out.append(conn(f"C{k + 1}", f"{rng.choice(clients)}:{1000 + k}", server, reqs,
                        protocol=protocol, syn=rng.choice([None, -1]),
                        sni=rng.choice([None, "api.roc.test", "gpu-1.roc.test"])))
    return out


@pytest.mark.timeout(120)
def test_random_small_topologies_link_into_trees() -> None:
    """Hostile timings (ties everywhere, answers before requests, shared ids), with the
    profile and without: linking ends, raises nothing, and gives every request a chain
    that ends at a root (no loop of parents), each parent starting no later than its
    child."""
    profile = parse_profile(PROFILE)
    for seed in range(400):
        for prof in (None, profile):
            conns = _random_topology(seed)
            chains = attribute(conns, prof)
            nodes = list(chains.nodes.values())
            for n in nodes:
                steps = 0
                while n.parent is not None and steps <= len(nodes):
                    assert n.parent.ts_ns <= n.ts_ns, seed
                    n, steps = n.parent, steps + 1
                assert n.parent is None, (seed, "a loop of parents")
            for root in chains.roots:
                chains.steps(root)


def _buffering_edge() -> tuple[list[Connection], list[tuple[str, str]]]:
    """An nginx-like edge (it forwards a request once its body is in, from 127.0.0.1,
    to a router) on a loaded machine: 24 overlapping requests, bodies of 1 to 8 ms,
    answers relayed about 0.07 ms after the router's, except two relayed late (12 and
    8.2 ms), the first of them just before the second's router answered. Returns the
    connections and (router connection, edge connection) of every true link."""
    import random

    rng = random.Random(23)
    late = {10: 12.0, 12: 8.2}  # client request -> how late its answer was relayed
    rows = []
    for i in range(24):
        ts = 2.0 * i + rng.uniform(0.0, 1.0)
        body_end = ts + rng.uniform(1.0, 8.0)
        r_ts = body_end + rng.uniform(0.08, 0.11)
        r_fb = r_ts + rng.uniform(40.0, 90.0)
        rows.append([ts, body_end, r_ts, r_fb, rng.uniform(5.0, 15.0)])
    # request 10 relays its answer 0.068 ms before request 12's router answers, and its
    # answer outlasts 12's router request, so that one lies inside it
    rows[12][4] = 0.07
    rows[10][3] = rows[12][3] - late[10] - 0.068
    rows[10][4] = 20.0
    conns: list[Connection] = []
    truth = []
    for i, (ts, body_end, r_ts, r_fb, length) in enumerate(rows):
        relay = late.get(i, 0.07 + rng.uniform(-0.01, 0.01))
        edge = req(ts, r_fb + relay, r_fb + length + 0.05, method="POST")
        edge.end_ns = ns(body_end)
        router = req(r_ts, r_fb, r_fb + length, method="POST", protocol="http/1.1")
        conns.append(conn(f"C{2 * i + 1}", f"127.0.0.2:{40000 + i}", EDGE, [edge]))
        conns.append(conn(f"C{2 * i + 2}", f"127.0.0.1:{41000 + i}", ROUTER, [router],
                          protocol="http/1.1"))
        truth.append((f"C{2 * i + 2}", f"C{2 * i + 1}"))
    return conns, truth


def test_a_parent_that_answered_first_did_not_relay_the_answer() -> None:
    """Live nginx beside two CPU burners: an edge request relayed its router's answer
    12 ms late, 0.07 ms before another request's router answered, and so looked like that
    other request's relay (the pair's typical offset) and took its router request as a
    second child. Where a pair relays answers, a parent that answered before the child
    cannot have relayed it."""
    conns, truth = _buffering_edge()
    for chains in (link_requests(conns), attribute(conns, parse_profile(PROFILE))):
        got = []
        for child_id, _ in truth:
            node = chains.node(child_id, 0)
            assert node is not None
            got.append((child_id, node.parent.conn.id if node.parent else None))
        assert got == truth
