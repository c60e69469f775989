"""Hop chains: which upstream requests (and token-store commands) each request caused.

Where a capture sees several hops (taken on a proxy host, or on loopback in the lab),
a proxy's upstream request happens *inside* the request it serves. Real proxies
(nginx, Envoy, HAProxy, a CDN) connect upstream from the host's own address or a NAT
pool, pool keep-alive connections that concurrent requests share, and forward no
request id unless told to; so linking rests on time and on statistics over the whole
capture, and addresses are evidence only.

**Groups and kinds.** Requests are grouped by hop: the profile's ``(path, hop)`` where a
rule matched their connection, else their server endpoint. A child's *kind* is its
group's hop, or without a profile its protocol class and server port (several origins
behind one router are one kind): a proxy makes one call of each kind per request.

**Candidates.** A request ``U`` is a candidate child of ``P`` (another group, not a
Redis command) when ``P.ts <= U.ts`` and ``U`` ends (last byte, else first byte, else
start) no later than ``P``'s window (``P``'s last byte, else its connection's end),
and, with a profile, ``P``'s hop comes before ``U``'s in the declared hop order of the
same path (hops of two different paths are never linked). Equal request ids
(``x-request-id``, ``x-correlation-id``, ``request-id``, the trace id of
``traceparent``) link at once; different ones never do.

**Assignment.** Per parent group and child kind, children are assigned to parents as a
matching over the whole capture, each parent taking at most one child of the kind
(then, for children left over, a second call of the same kind): edges are taken in
order of cost, cheapest first. The cost of an edge is how far its timing strays from
what that pair of hops does typically (the start offset ``U.ts - P.ts`` of a call made
on arrival, the end offset ``P.first_byte - U.first_byte`` of a call whose answer is
relayed: whichever is steadier for the pair), plus penalties for a different method,
path or body size, and for a call after ``P``'s first byte; sending from the parent's
server address lowers it a little. The typical offsets come from a first matching by
adjacency. A child linked through several nested hops (an origin request lies inside
both the router's and the edge's request) takes the innermost.

**Without a profile** a pair of groups is linked only when the statistics say the
parent is a proxy: at least :data:`PROXY_MIN_REQUESTS` matched pairs, and either most
of them sent from the parent server's address or (with at least
:data:`COUPLED_MIN_PAIRS`) a steady offset, its spread at most :data:`COUPLING_MAX` of
the slack the parent left; and at least :data:`PROXY_MIN_SHARE` of the parent's
requests contain such a child. A profile's declared hop order needs no statistics.

**Link kinds** (``Node.link``): ``request-id``; ``unique`` (the only candidate by
containment); ``matched`` (the assignment chose among concurrent candidates);
``ambiguous`` (giving the child to another candidate, or swapping it with another
parent's child, costs less than :data:`AMBIGUITY_MS` more). Statements per hop use
chains without ambiguous links only.

Each request's chain lists the hops it went through (depth first, callees in order of
start) with the time spent at each: ``wait`` is the hop's time to first byte;
``setup`` is the time from the SYN of an upstream connection opened for this request
to the request on it (TCP and TLS handshakes); ``own`` is ``wait`` minus the union of
its callees' ``[setup start or request start, first byte]`` intervals that fall within
it, split into the time before the first call, between calls and after the last call
(a router's wait between its token-store call and its origin call is *between*;
parsing the request *before*; relaying the answer *after*). So for nested,
sequential calls the ``own`` and ``setup`` times of a chain add up to the client's time
to first byte exactly.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from netdiag.paths.profile import split_endpoint
from netdiag.records import Connection, Request

PROXY_MIN_SHARE = 0.8
"""Share of a server's requests that must contain an upstream request for it to be
inferred to be a proxy."""
PROXY_MIN_REQUESTS = 3
"""Fewest matched pairs (and requests of the server) for a proxy to be inferred."""
COUPLED_MIN_PAIRS = 5
"""Fewest matched pairs for a proxy to be inferred from timing alone (no address
relation)."""
COUPLING_MAX = 0.5
"""Largest spread (interquartile range) of a pair's steadier offset, as a share of the
median gap between successive parents (what pairing by chance gives), for timing
alone to infer a proxy."""
AMBIGUITY_MS = 0.1
"""An alternative assignment within this cost (milliseconds of timing) of the chosen
one leaves the link ``ambiguous``."""
VIABLE_SHARE = 0.5 * PROXY_MIN_SHARE
"""Share of a child group's requests a pair's first estimate must link for the pair to
go through the refined rounds (unless its children come from the parent's address)."""
_BLOCK_SHIFT = 5
_BLOCK = 1 << _BLOCK_SHIFT
_BLOCK_MASK = _BLOCK - 1
"""Parents are scanned in blocks of 32 by start time, each with its latest end."""


def _block_ends(ends: Sequence[int]) -> list[int]:
    """The latest end of each block of :data:`_BLOCK` consecutive parents."""
    return [max(ends[b:b + _BLOCK]) for b in range(0, len(ends), _BLOCK)]


def _ending_after(ends: Sequence[int], block_ends: Sequence[int], hi: int, stop: int,
                  end: int) -> Iterator[int]:
    """Indices ``k`` from ``hi - 1`` down to ``stop`` whose ``ends[k]`` is at least
    ``end``, newest first; a whole block of parents that all end too early is skipped
    at once (the last index of block b is ``b * _BLOCK + _BLOCK - 1``)."""
    k = hi - 1
    while k >= stop:
        if k & _BLOCK_MASK == _BLOCK_MASK and block_ends[k >> _BLOCK_SHIFT] < end:
            k -= _BLOCK
        else:
            if ends[k] >= end:
                yield k
            k -= 1
MAX_CANDIDATES = 256
"""Candidate parents kept per child and parent group (the latest-starting ones): the
time to link stays linear in requests whatever the concurrency."""
MAX_SCAN = 4 * MAX_CANDIDATES
"""Earlier requests of a parent group looked at per child: one request whose window
spans the capture (an answer that never came) cannot make linking quadratic."""
REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "request-id")
"""Request headers whose equal values tie an upstream request to its cause."""

_LATE_PENALTY_MS = 1000.0
_METHOD_PENALTY_MS = 50.0
_PATH_PENALTY_MS = 20.0
_SIZE_PENALTY_MS = 5.0
_ADDRESS_BONUS_MS = 0.5
_RID_COST = -1e9


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def request_id(r: Request) -> str | None:
    """The request's correlation id, where its headers are visible."""
    if not r.request_headers:
        return None
    for k, v in r.request_headers:
        name = k.lower()
        if name in REQUEST_ID_HEADERS and v:
            return v
        if name == "traceparent":
            parts = v.split("-")
            if len(parts) >= 3 and parts[1]:
                return parts[1]
    return None


def is_resp(conn: Connection, r: Request | None = None) -> bool:
    """A Redis (RESP) connection or command."""
    if r is not None and r.protocol == "resp":
        return True
    return conn.protocol == "resp"


@dataclass(eq=False, slots=True)
class Node:
    """One request of one connection, as a node of the call graph."""

    conn: Connection
    index: int
    req: Request
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    link: str | None = None
    """How it was tied to its parent (the contract's ``link``): ``request-id`` (an equal
    id header), ``unique`` (the only candidate by containment), ``matched`` (chosen by
    the assignment over concurrent candidates) or ``ambiguous`` (another candidate was
    as good)."""
    candidates: int = 0
    """Requests of the parent's hop that could have caused it (containment)."""
    syn_first_ns: int | None = None
    """The SYN of its connection when it is the connection's first request (set while
    linking): a call that opened a connection was decided at the SYN."""
    from_parent_address: bool = False
    """Its connection was opened from the address the parent's server listens on
    (evidence, not a requirement)."""
    opened: bool = False
    """Its connection was opened while the parent waited, for this request: the TCP
    and TLS handshakes count as this hop's setup time."""

    @property
    def key(self) -> tuple[str, int]:
        return self.conn.id, self.index

    @property
    def label(self) -> str:
        """``C3#0`` (connection id, request index)."""
        return f"{self.conn.id}#{self.index}"

    @property
    def end_ns(self) -> int:
        r = self.req
        return r.last_byte_ns or r.first_byte_ns or r.ts_ns

    @property
    def window_end_ns(self) -> int:
        """End of the time this request may have caused others: its last byte, or the
        end of its connection when the answer never ended in the capture."""
        r = self.req
        if r.last_byte_ns is not None:
            return max(r.last_byte_ns, r.first_byte_ns or r.last_byte_ns)
        return max(self.conn.last_ns, r.first_byte_ns or r.ts_ns, r.ts_ns)

    @property
    def start_ns(self) -> int:
        """Start of this node's interval as its parent sees it (setup included)."""
        if self.opened and self.conn.syn_ns is not None:
            return self.conn.syn_ns
        return self.req.ts_ns

    @property
    def wait_ns(self) -> int | None:
        r = self.req
        return None if r.first_byte_ns is None else r.first_byte_ns - r.ts_ns

    @property
    def setup_ns(self) -> int | None:
        if not self.opened or self.conn.syn_ns is None:
            return None
        return self.req.ts_ns - self.conn.syn_ns

    def in_wait(self, child: Node) -> bool:
        """The child started before this request's first byte (it delays the answer)."""
        fb = self.req.first_byte_ns
        return fb is None or child.start_ns < fb

    def _spans(self) -> tuple[int, int, list[tuple[int, int]]] | None:
        """(start, first byte, merged callee intervals within them), None without an
        answer."""
        r = self.req
        if r.first_byte_ns is None:
            return None
        lo, hi = r.ts_ns, r.first_byte_ns
        spans = []
        for c in self.children:
            s = max(c.start_ns, lo)
            e = min(c.req.first_byte_ns if c.req.first_byte_ns is not None else hi, hi)
            if e > s:
                spans.append((s, e))
        spans.sort()
        merged: list[tuple[int, int]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        return lo, hi, merged

    def own_ns(self) -> int | None:
        """Wait minus the union of the callees' intervals within it."""
        sp = self._spans()
        if sp is None:
            return None
        lo, hi, merged = sp
        return (hi - lo) - sum(e - s for s, e in merged)

    def own_parts_ns(self) -> tuple[int, int, int] | None:
        """The own time split around the calls within the wait: (before the first call,
        between calls, after the last call); None when it made no call within it."""
        sp = self._spans()
        if sp is None or not sp[2]:
            return None
        lo, hi, merged = sp
        before = merged[0][0] - lo
        after = hi - merged[-1][1]
        between = sum(merged[k + 1][0] - merged[k][1] for k in range(len(merged) - 1))
        return before, between, after


@dataclass(slots=True)
class Step:
    """One hop of a request's chain."""

    node: Node
    depth: int
    own_ns: int | None
    in_ttfb: bool
    """Part of the root request's time to first byte (started before each ancestor's
    first byte)."""
    parts_ns: tuple[int, int, int] | None = None
    """``own_ns`` split around the calls it made: before, between, after them."""

    @property
    def conn(self) -> Connection:
        return self.node.conn

    @property
    def hop(self) -> str | None:
        p = self.node.conn.path
        return None if p is None else p.get("hop")

    @property
    def path(self) -> str | None:
        p = self.node.conn.path
        return None if p is None else p.get("name")

    @property
    def what(self) -> str:
        r = self.node.req
        if is_resp(self.node.conn, r):
            return " ".join(x for x in (r.method, r.path) if x) or "command"
        return " ".join(x for x in (r.method, r.path) if x) or "request"

    def to_json(self) -> dict[str, Any]:
        n = self.node
        return {
            "hop": self.hop, "path": self.path, "server": n.conn.server,
            "connection": n.conn.id, "request": n.index, "depth": self.depth,
            "what": self.what, "wait_ms": _ms(n.wait_ns), "setup_ms": _ms(n.setup_ns),
            "own_ms": _ms(self.own_ns), "in_ttfb": self.in_ttfb, "link": n.link,
            "candidates": n.candidates if n.parent is not None else None,
            "own_split_ms": None if self.parts_ns is None else {
                "before_calls": _ms(self.parts_ns[0]), "between_calls": _ms(self.parts_ns[1]),
                "after_calls": _ms(self.parts_ns[2])},
        }


@dataclass(slots=True)
class ProxyEvidence:
    """How consistently a server's requests contained upstream requests."""

    server: str
    followed: int
    """Requests to the server that contained at least one linked upstream request."""
    total: int
    """Requests to the server."""
    from_address: int = 0
    """Of ``followed``, those whose upstream request came from the server's address."""
    declared: bool = False
    """A profile's hop order made the links (no statistics needed)."""
    linked: bool = True
    """Its requests were linked to upstream requests (taken for a proxy)."""

    @property
    def is_proxy(self) -> bool:
        return self.linked

    @property
    def sentence(self) -> str:
        ip, _ = split_endpoint(self.server)
        how = (f"sent from {ip}" if self.from_address * 2 > self.followed else
               "sent from other addresses, linked by timing")
        return (f"{self.followed} of {self.total} requests to {self.server} contained "
                f"upstream requests ({how})")


@dataclass
class Chains:
    """The call graph of one capture's requests."""

    nodes: dict[tuple[str, int], Node]
    proxies: dict[str, ProxyEvidence]
    """Per server endpoint whose requests caused others."""

    @property
    def roots(self) -> list[Node]:
        """Requests no captured request caused, in time order."""
        return sorted((n for n in self.nodes.values() if n.parent is None),
                      key=lambda n: (n.req.ts_ns, n.conn.id, n.index))

    def node(self, conn_id: str, index: int) -> Node | None:
        return self.nodes.get((conn_id, index))

    def is_proxy(self, server: str) -> bool:
        ev = self.proxies.get(server)
        return ev is not None and ev.is_proxy

    def steps(self, root: Node) -> list[Step]:
        """The chain of ``root``: itself and every request it caused, depth first."""
        out: list[Step] = []

        def walk(n: Node, depth: int, in_ttfb: bool) -> None:
            out.append(Step(n, depth, n.own_ns(), in_ttfb, n.own_parts_ns()))
            for c in sorted(n.children, key=lambda c: (c.start_ns, c.conn.id, c.index)):
                walk(c, depth + 1, in_ttfb and n.in_wait(c))

        walk(root, 0, True)
        return out

    def links(self, root: Node) -> list[str]:
        """The ``link`` of every request below ``root`` in its chain."""
        out: list[str] = []
        stack = list(root.children)
        while stack:
            n = stack.pop()
            out.append(n.link or "?")
            stack.extend(n.children)
        return out

    def is_ambiguous(self, root: Node) -> bool:
        """Some link of the chain had an equally good alternative."""
        return "ambiguous" in self.links(root)

    def table(self) -> dict[tuple[str, int], list[Step]]:
        """Chains of every root request that caused at least one other request."""
        return {r.key: self.steps(r) for r in self.roots if r.children}

    def depth(self, n: Node) -> int:
        d = 0
        while n.parent is not None:
            n = n.parent
            d += 1
        return d

    def root_of(self, n: Node) -> Node:
        while n.parent is not None:
            n = n.parent
        return n


# --- linking -----------------------------------------------------------------------


def _host(ep: str) -> str:
    return split_endpoint(ep)[0]


@dataclass(slots=True)
class _Edge:
    """A candidate link: ``child`` inside ``parent``."""

    parent: Node
    child: Node
    pgroup: tuple[Any, ...]
    cgroup: tuple[Any, ...]
    kind: tuple[Any, ...]
    rid: bool
    declared: bool
    address: bool
    base: float
    """Penalties that do not depend on timing (ms)."""
    so: float
    """Start offset: child start minus parent start (ms)."""
    eo: float | None
    """End offset: parent first byte minus child first byte (ms)."""
    slack: float | None
    """Parent wait minus child wait (ms)."""
    cost: float = 0.0


@dataclass(slots=True)
class _PairStats:
    """Timing of the matched pairs of one (parent group, child group)."""

    n: int
    med_so: float
    iqr_so: float
    med_eo: float | None
    iqr_eo: float | None
    med_slack: float | None
    address_share: float

    end: bool | None = None
    """The anchor chosen by the first estimates (None: the steadier offset here)."""
    chance_ms: float | None = None
    """Median gap between successive parents' anchors: how far a child taken by
    chance would stray where parents are dense (the slack the parent leaves, where
    they are few and long: the smaller of the two is :attr:`coupling`'s scale)."""

    @property
    def anchor_is_end(self) -> bool:
        if self.end is not None:
            return self.end and self.iqr_eo is not None
        return self.iqr_eo is not None and self.iqr_eo < self.iqr_so

    @property
    def coupling(self) -> float:
        """Spread of the anchor offset over what chance gives: a child paired with the
        first parent to come by chance strays by about the gap between parents; one a
        proxy made strays by the proxy's jitter only."""
        spread = self.iqr_eo if self.anchor_is_end and self.iqr_eo is not None else self.iqr_so
        scales = [x for x in (self.chance_ms, self.med_slack) if x is not None]
        return spread / max(min(scales) if scales else 0.0, 0.001)


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    from netdiag.analysis.stats import quantile

    return quantile(list(sorted_vals), q)


def _stats(edges: Sequence[_Edge]) -> _PairStats:
    so = sorted(e.so for e in edges)
    eo = sorted(e.eo for e in edges if e.eo is not None)
    sl = sorted(e.slack for e in edges if e.slack is not None)
    return _PairStats(
        len(edges), _quantile(so, 0.5), _quantile(so, 0.75) - _quantile(so, 0.25),
        _quantile(eo, 0.5) if eo else None,
        (_quantile(eo, 0.75) - _quantile(eo, 0.25)) if eo else None,
        _quantile(sl, 0.5) if sl else None,
        sum(1 for e in edges if e.address) / len(edges))


def _timing_cost(e: _Edge, st: _PairStats | None) -> float:
    if e.rid:
        return _RID_COST
    if st is None:  # no typical timing for the pair (it had no match in FIFO order)
        return e.base + min(e.so, e.eo if e.eo is not None and e.eo >= 0 else e.so)
    dso = abs(e.so - st.med_so)
    deo = abs(e.eo - st.med_eo) if e.eo is not None and st.med_eo is not None else None
    if st.anchor_is_end and deo is not None:
        return e.base + deo + 0.01 * dso
    return e.base + dso + (0.01 * deo if deo is not None else 0.0)


def _anchor_ns(n: Node, end: bool, child: bool = False) -> int:
    """The time a pair's steadier offset is measured from: the request's first byte
    (a relayed answer) or its start (a call made on arrival; for a call that opened its
    connection, the SYN: the proxy decided to call then)."""
    if end and n.req.first_byte_ns is not None:
        return n.req.first_byte_ns
    if child and n.syn_first_ns is not None:
        return n.syn_first_ns
    return n.req.ts_ns


def _order(n: Node, end: bool, child: bool = False) -> tuple[int, int, str, int]:
    """Arrival order: the anchor time, then the start, then (requests that arrived in
    one packet) their order on the connection."""
    return _anchor_ns(n, end, child), n.req.ts_ns, n.conn.id, n.index


def _in_order(p1: Node, c1: Node, p2: Node, c2: Node, end: bool) -> bool:
    """Parents and children in the same order (first come, first served). Two answers
    relayed in one packet say nothing of their order: their starts decide then."""
    if end and _anchor_ns(p1, True) == _anchor_ns(p2, True):
        end = False
    return ((_order(p1, end) < _order(p2, end))
            == (_order(c1, end, True) < _order(c2, end, True)))


def _fifo_repair(taken: dict[int, _Edge], edges: Sequence[_Edge],
                 ends: Mapping[tuple[Any, Any], bool]) -> None:
    """Among assignments within :data:`AMBIGUITY_MS` of each other, keep the one that
    preserves order (a proxy forwards, and relays answers, first come first served):
    swap the children of neighbouring parents whose children are out of order when the
    swap costs no more than that."""
    by_pair = {(id(e.parent), id(e.child)): e for e in edges}
    chosen = sorted(taken.values(), key=lambda e: _order(
        e.parent, ends.get((e.pgroup, e.cgroup), False)))
    for _ in range(8):
        changed = False
        for i in range(len(chosen) - 1):
            a, b = chosen[i], chosen[i + 1]
            if a.rid or b.rid:
                continue
            end = ends.get((a.pgroup, a.cgroup), False)
            if _in_order(a.parent, a.child, b.parent, b.child, end):
                continue
            x = by_pair.get((id(a.parent), id(b.child)))
            y = by_pair.get((id(b.parent), id(a.child)))
            if x is None or y is None or x.cost + y.cost - a.cost - b.cost > AMBIGUITY_MS:
                continue
            chosen[i], chosen[i + 1] = x, y
            taken[id(x.child)], taken[id(y.child)] = x, y
            changed = True
        if not changed:
            break


_MATCH_VALUE = 1e6
"""Value of one link in the ordered assignment: more links first, then less cost."""


def _assign_ordered(edges: Sequence[_Edge], end: bool) -> dict[int, _Edge]:
    """The order-preserving assignment of most value (each link :data:`_MATCH_VALUE`
    less its cost): parents and children both in arrival order, as a proxy handles them
    first come, first served (a token call goes out in the order the requests came;
    answers are relayed in the order they came back). A weighted longest increasing
    chain over the candidate links, with a Fenwick tree of prefix maxima: O(E log n)."""
    parents = sorted({id(e.parent): e.parent for e in edges}.values(),
                     key=lambda n: _order(n, end))
    pidx = {id(p): i for i, p in enumerate(parents)}
    by_child: dict[int, list[_Edge]] = defaultdict(list)
    for e in edges:
        by_child[id(e.child)].append(e)
    children = sorted((lst[0].child for lst in by_child.values()),
                      key=lambda n: _order(n, end, True))
    size = len(parents)
    best = [-1.0] * (size + 1)
    ptr = [-1] * (size + 1)
    links: list[tuple[_Edge, int]] = []

    def query(i: int) -> tuple[float, int]:  # best chain over parents [0, i)
        v, k = 0.0, -1
        while i > 0:
            if best[i] > v:
                v, k = best[i], ptr[i]
            i -= i & -i
        return v, k

    for c in children:
        pending = []
        for e in by_child[id(c)]:
            i = pidx[id(e.parent)]
            v, prev = query(i)
            links.append((e, prev))
            pending.append((i + 1, v + _MATCH_VALUE - e.cost, len(links) - 1))
        for i, v, k in pending:  # after the queries: one link per child
            while i <= size:
                if v > best[i]:
                    best[i], ptr[i] = v, k
                i += i & -i
    taken: dict[int, _Edge] = {}
    k = query(size)[1]
    while k >= 0:
        e, k = links[k]
        taken[id(e.child)] = e
    return taken


DECISIVE_MS = 2.0
"""A link at least this much cheaper (ms of timing, or a body size, path or method that
differs) than the child's and the parent's every other free choice is taken before
arrival order is consulted."""


def _decisive(edges: Sequence[_Edge], taken: dict[int, _Edge], used: set[int]) -> None:
    """Take the links the evidence decides: the child's cheapest free parent, by at
    least :data:`DECISIVE_MS`, whose own cheapest free child it is, by as much. Repeated
    while that frees decisions (at most a few rounds)."""
    inf = float("inf")

    def keep(d: dict[int, list[Any]], key: int, e: _Edge) -> None:
        two = d.get(key)  # [best edge, best cost, second cost]
        if two is None:
            d[key] = [e, e.cost, inf]
        elif e.cost < two[1]:
            two[0], two[1], two[2] = e, e.cost, two[1]
        elif e.cost < two[2]:
            two[2] = e.cost

    for _ in range(6):
        best_c: dict[int, list[Any]] = {}
        best_p: dict[int, list[Any]] = {}
        for e in edges:
            c, p = id(e.child), id(e.parent)
            if c in taken or p in used:
                continue
            keep(best_c, c, e)
            keep(best_p, p, e)
        added = 0
        for e, cost, runner_up in best_c.values():
            if runner_up - cost < DECISIVE_MS:
                continue
            mine = best_p[id(e.parent)]
            if mine[0] is not e or mine[2] - cost < DECISIVE_MS:
                continue
            if id(e.child) in taken or id(e.parent) in used:
                continue
            taken[id(e.child)] = e
            used.add(id(e.parent))
            added += 1
        if not added:
            return


def _assign(edges: list[_Edge], second: bool,
            ends: Mapping[tuple[Any, Any], bool] | None = None) -> dict[int, _Edge]:
    """Equal request ids first; then the links the evidence decides (:func:`_decisive`);
    then the order-preserving assignment of most value (:func:`_assign_ordered`) for
    what timing alone cannot tell apart; then, cheapest first, children left over with
    parents still free (``second``: then also with parents that already have a child of
    the kind). Returns child node id -> edge."""
    ends = ends or {}
    taken: dict[int, _Edge] = {}
    used: set[int] = set()
    for e in edges:
        if e.rid and id(e.child) not in taken and id(e.parent) not in used:
            taken[id(e.child)] = e
            used.add(id(e.parent))
    _decisive([e for e in edges if not e.rid], taken, used)
    rest = [e for e in edges if not e.rid and id(e.child) not in taken
            and id(e.parent) not in used]
    votes: dict[bool, int] = defaultdict(int)
    for e in rest:
        votes[ends.get((e.pgroup, e.cgroup), False)] += 1
    end = votes[True] > votes[False]
    for c, e in _assign_ordered(rest, end).items():
        taken[c] = e
        used.add(id(e.parent))
    edges.sort(key=lambda e: (e.cost, e.child.req.ts_ns, e.parent.req.ts_ns))
    for e in edges:
        c, p = id(e.child), id(e.parent)
        if c in taken or p in used:
            continue
        taken[c] = e
        used.add(p)
    _fifo_repair(taken, edges, ends)
    if second:
        extra: set[int] = set()
        for e in edges:
            c, p = id(e.child), id(e.parent)
            if c in taken or p in extra:
                continue
            taken[c] = e
            extra.add(p)
    return taken


def _assign_fifo(edges: list[_Edge], end: bool) -> dict[int, _Edge]:
    """First estimate, first come first served: each child in order takes the earliest
    free parent that contains it (an equal request id first). ``end``: in the order of
    first bytes (an answer relayed: the parent's first byte follows the child's), else
    of starts (a call made on arrival)."""
    if end:
        edges = [e for e in edges if e.eo is not None and e.eo >= 0]
    edges.sort(key=lambda e: (_order(e.child, end, True), not e.rid, _order(e.parent, end),
                              e.base))
    taken: dict[int, _Edge] = {}
    used: set[int] = set()
    for e in edges:
        c, p = id(e.child), id(e.parent)
        if c in taken or p in used or e.base >= _LATE_PENALTY_MS:
            continue
        taken[c] = e
        used.add(p)
    return taken


def _first_estimates(edges: list[_Edge]) -> dict[tuple[Any, Any], _PairStats]:
    """Per pair of groups, its typical timing from a first-come-first-served assignment
    in start order and one in first-byte order: whichever makes its own offset the
    steadier is the pair's anchor (a token call goes out on arrival; an origin's answer
    is relayed)."""
    by_gk: dict[tuple[Any, Any], list[_Edge]] = defaultdict(list)
    for e in edges:
        by_gk[(e.pgroup, e.cgroup)].append(e)
    starts = _pair_stats({gk: _assign_fifo(lst, False) for gk, lst in by_gk.items()})
    ends = _pair_stats({gk: _assign_fifo(list(lst), True) for gk, lst in by_gk.items()})
    parents: dict[tuple[Any, ...], dict[int, Node]] = defaultdict(dict)
    for e in edges:
        parents[e.pgroup][id(e.parent)] = e.parent

    def gap(group: tuple[Any, ...], end: bool) -> float | None:
        ts = sorted(_anchor_ns(n, end) for n in parents[group].values())
        gaps = sorted(b - a for a, b in pairwise(ts))
        return gaps[len(gaps) // 2] / 1e6 if gaps else None

    out: dict[tuple[Any, Any], _PairStats] = {}
    for pair in set(starts) | set(ends):
        a, b = starts.get(pair), ends.get(pair)
        ga, gb = gap(pair[0], False), gap(pair[0], True)
        ca = a.iqr_so / max(ga or 0.0, 0.001) if a is not None else None
        cb = (b.iqr_eo / max(gb or 0.0, 0.001)
              if b is not None and b.iqr_eo is not None else None)
        if cb is not None and (ca is None or cb < ca):
            assert b is not None
            b.end, b.chance_ms = True, gb
            out[pair] = b
        elif a is not None:
            a.end, a.chance_ms = False, ga
            out[pair] = a
    return out


def _matching(edges: list[_Edge], stats: Mapping[tuple[Any, Any], _PairStats],
              second: bool = False, by_kind: bool = True
              ) -> dict[tuple[Any, Any], dict[int, _Edge]]:
    """One assignment per (parent group, child kind), or per pair of groups (the
    statistics that decide which pairs stand: an unrelated server on the same port
    must not crowd the assignment of the one behind the proxy)."""
    by_gk: dict[tuple[Any, Any], list[_Edge]] = defaultdict(list)
    for e in edges:
        e.cost = _timing_cost(e, stats.get((e.pgroup, e.cgroup)))
        by_gk[(e.pgroup, e.kind if by_kind else e.cgroup)].append(e)
    ends = {k: st.anchor_is_end for k, st in stats.items()}
    return {gk: _assign(lst, second, ends) for gk, lst in by_gk.items()}


def _keep_anchors(new: dict[tuple[Any, Any], _PairStats],
                  old: Mapping[tuple[Any, Any], _PairStats]) -> dict[tuple[Any, Any], _PairStats]:
    for k, st in new.items():
        if k in old:
            st.end, st.chance_ms = old[k].end, old[k].chance_ms
    return new


def _pair_stats(matchings: Mapping[tuple[Any, Any], dict[int, _Edge]]
                ) -> dict[tuple[Any, Any], _PairStats]:
    by_pair: dict[tuple[Any, Any], list[_Edge]] = defaultdict(list)
    for m in matchings.values():
        for e in m.values():
            if not e.rid:
                by_pair[(e.pgroup, e.cgroup)].append(e)
    return {k: _stats(v) for k, v in by_pair.items()}


class _Linker:
    """Builds the candidate graph and runs the assignment (see the module docstring)."""

    def __init__(self, nodes: list[Node], trusted: set[str],
                 hop_order: Mapping[str, Sequence[str]]) -> None:
        self.nodes = nodes
        self.trusted = trusted
        self.hop_order = {k: list(v) for k, v in hop_order.items()}
        self.group: dict[int, tuple[Any, ...]] = {}
        self.kind: dict[int, tuple[Any, ...]] = {}
        self.rid: dict[int, str | None] = {}
        self._ips: dict[int, str] = {}
        self.median_wait: dict[tuple[Any, ...], int] = {}
        """Median time to first byte per group (ns)."""
        self.clients: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        """Client addresses per group."""
        self.servers: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        """Server addresses per group."""
        self.considered: set[tuple[Any, Any]] = set()
        """Pairs of groups that passed the pair tests (before the proxy share test)."""
        for n in nodes:
            self.group[id(n)] = self._group_of(n)
            self.kind[id(n)] = self._kind_of(n)
            self.rid[id(n)] = request_id(n.req)

    @staticmethod
    def _group_of(n: Node) -> tuple[Any, ...]:
        p = n.conn.path
        if p is not None and not p.get("inferred"):
            return ("hop", p["name"], p["hop"])
        return ("server", n.conn.server)

    @staticmethod
    def _kind_of(n: Node) -> tuple[Any, ...]:
        p = n.conn.path
        if p is not None and not p.get("inferred"):
            return ("hop", p["name"], p["hop"])
        return ("resp" if is_resp(n.conn, n.req) else "http", split_endpoint(n.conn.server)[1])

    def _allowed(self, pg: tuple[Any, ...], cg: tuple[Any, ...]) -> tuple[bool, bool]:
        """(may link, declared by the profile's hop order). Undeclared, a group whose
        requests wait less than the child group's (medians) is not its parent: a proxy
        waits for what it calls, so the hop graph has no cycles."""
        if pg == cg:
            return False, False
        if pg[0] == "hop" and cg[0] == "hop":
            if pg[1] != cg[1]:
                return False, False
            order = self.hop_order.get(pg[1], [])
            if pg[2] in order and cg[2] in order:
                ok = order.index(pg[2]) < order.index(cg[2])
                return ok, ok
        wp, wc = self.median_wait.get(pg), self.median_wait.get(cg)
        if wp is not None and wc is not None and wp <= wc:
            return False, False
        if self._same_sender(pg, cg):
            return False, False
        return True, False

    def _same_sender(self, pg: tuple[Any, ...], cg: tuple[Any, ...]) -> bool:
        """Every request of the child group was sent by a host that also sent the parent
        group's requests as a client, and is not where the parent's server listens:
        requests one client makes side by side, not a proxy's upstream calls (a capture
        on a client host). Loopback addresses, which every local process shares, never
        count."""
        senders = self.clients.get(cg, set())
        if not senders or any(ip.startswith("127.") or ip == "::1" for ip in senders):
            return False
        own = self.clients.get(pg, set()) - self.servers.get(pg, set())
        return senders <= own

    def candidates(self) -> list[_Edge]:
        groups: dict[tuple[Any, ...], list[Node]] = defaultdict(list)
        for n in self.nodes:
            if not is_resp(n.conn, n.req):
                groups[self.group[id(n)]].append(n)
        waits: dict[tuple[Any, ...], list[int]] = defaultdict(list)
        for n in self.nodes:
            if n.wait_ns is not None:
                waits[self.group[id(n)]].append(n.wait_ns)
        self.median_wait = {g: sorted(w)[len(w) // 2] for g, w in waits.items()}
        for n in self.nodes:
            g = self.group[id(n)]
            self.clients[g].add(self._client_ip(n.conn))
            self.servers[g].add(self._server_ip(n.conn))
        index: dict[tuple[Any, ...], tuple[list[Node], list[int], list[int], list[int], int]] = {}
        for g, lst in groups.items():
            lst.sort(key=lambda n: (n.req.ts_ns, n.conn.id, n.index))
            ends = [n.window_end_ns for n in lst]
            index[g] = (lst, [n.req.ts_ns for n in lst], ends, _block_ends(ends),
                        max(e - n.req.ts_ns for n, e in zip(lst, ends, strict=True)))
        by_rid: dict[str, list[Node]] = defaultdict(list)
        for n in self.nodes:
            r = self.rid[id(n)]
            if r is not None and not is_resp(n.conn, n.req):
                by_rid[r].append(n)
        rid_index: dict[str, tuple[list[Node], list[int], list[int], list[int]]] = {}
        for r, lst in by_rid.items():
            lst.sort(key=lambda n: (n.req.ts_ns, n.conn.id, n.index))
            ends = [n.window_end_ns for n in lst]
            rid_index[r] = (lst, [n.req.ts_ns for n in lst], ends, _block_ends(ends))
        edges: list[_Edge] = []
        # per child group: the parent groups it may link to, whether the profile declares
        # the pair, and their index (decided once per pair of groups)
        parents_of: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, pgs in self._overlapping_groups(index).items():
            parents_of[cg] = [(pg, declared, *index[pg]) for pg in pgs
                              for ok, declared in (self._allowed(pg, cg),) if ok]
        hopeless = self._hopeless_pairs(parents_of)
        live_parents = {cg: [e for e in parents if (e[0], cg) not in hopeless]
                        for cg, parents in parents_of.items()}
        for u in self.nodes:
            cg = self.group[id(u)]
            urid = self.rid[id(u)]
            seen: set[int] = set()
            u_end, u_ts, uc = u.end_ns, u.req.ts_ns, u.conn
            # a child with a request id may still link by it to a hopeless pair's parent
            for pg, declared, lst, starts, ends, block_ends, longest in (
                    live_parents[cg] if urid is None else parents_of[cg]):
                lo = bisect_left(starts, u_end - longest)
                hi = bisect_right(starts, u_ts)
                kept = 0
                for k in _ending_after(ends, block_ends, hi, max(lo, hi - MAX_SCAN), u_end):
                    p = lst[k]
                    if p.conn is uc or p.conn.server == uc.server:
                        continue
                    e = self._edge(p, u, pg, cg, declared, urid)
                    if e is None or (not e.rid and (pg, cg) in hopeless):
                        continue
                    edges.append(e)
                    seen.add(id(p))
                    kept += 1
                    if kept >= MAX_CANDIDATES:
                        break
            if urid is not None and urid in rid_index:
                # the same id, however far back its request began (the newest MAX_SCAN
                # that began before it: an id repeated without end costs no more)
                same, same_starts, same_ends, same_blocks = rid_index[urid]
                top = bisect_right(same_starts, u_ts)
                for k in _ending_after(same_ends, same_blocks, top, max(0, top - MAX_SCAN),
                                       u_end):
                    p = same[k]
                    pg = self.group[id(p)]
                    ok, declared = self._allowed(pg, cg)
                    if id(p) in seen or not ok or not self._contains(p, u):
                        continue
                    e = self._edge(p, u, pg, cg, declared, urid)
                    if e is not None:
                        edges.append(e)
        return edges

    def _overlapping_groups(self, index: Mapping[tuple[Any, ...], tuple[Any, ...]]
                            ) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        """Per child group (in the order of the nodes), the parent groups of ``index``
        (in its order) that could hold one of its requests: one starts before the child
        group's last request and one ends after its first request's end. Found through
        the groups sorted by first start (and the block scan of :func:`_ending_after`),
        not by trying every pair of groups: with a group per server, most pairs never
        overlap in time."""
        order = sorted(index, key=lambda g: index[g][1][0])
        starts = [index[g][1][0] for g in order]
        ends = [max(index[g][2]) for g in order]
        blocks = _block_ends(ends)
        place = {g: i for i, g in enumerate(index)}
        spans: dict[tuple[Any, ...], list[int]] = {}
        for u in self.nodes:
            cg = self.group[id(u)]
            span = spans.get(cg)
            if span is None:
                spans[cg] = [u.req.ts_ns, u.end_ns]
            else:
                if u.req.ts_ns > span[0]:
                    span[0] = u.req.ts_ns
                if u.end_ns < span[1]:
                    span[1] = u.end_ns
        found: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, (last_start, first_end) in spans.items():
            hi = bisect_right(starts, last_start)
            pgs = [order[k] for k in _ending_after(ends, blocks, hi, 0, first_end)]
            pgs.sort(key=place.__getitem__)
            found[cg] = pgs
        return found

    def _hopeless_pairs(self, parents_of: Mapping[tuple[Any, ...], list[tuple[Any, ...]]]
                        ) -> set[tuple[Any, Any]]:
        """Pairs of groups that no statistic could accept, decided before any link is
        built (most pairs, in a capture of direct traffic): not declared, no parent a
        profile matched, no child sent from a parent's server address, and fewer child
        requests inside some parent request than :data:`PROXY_MIN_SHARE` of the child
        group. Such a pair can never be accepted (:meth:`accepted_pairs` wants that
        share of the child group linked, and a link needs a parent around the child),
        and its links would take part in no other pair's assignment; only links by equal
        request ids are still built for it."""
        sizes: dict[tuple[Any, ...], int] = defaultdict(int)
        for n in self.nodes:
            sizes[self.group[id(n)]] += 1
        trusted_groups = {self.group[id(n)] for n in self.nodes if n.conn.id in self.trusted}
        undecided: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, parents in parents_of.items():
            senders = self.clients.get(cg, set())
            undecided[cg] = [entry for entry in parents
                             if not entry[1] and entry[0] not in trusted_groups
                             and not senders & self.servers.get(entry[0], set())]
        # each pair is decided as soon as its count of children inside a parent reaches
        # the share (it stays) or can no longer reach it (hopeless)
        need = {cg: PROXY_MIN_SHARE * sizes[cg] for cg in undecided}
        hits: dict[tuple[Any, Any], int] = defaultdict(int)
        misses: dict[tuple[Any, Any], int] = defaultdict(int)
        hopeless: set[tuple[Any, Any]] = set()
        for u in self.nodes:
            cg = self.group[id(u)]
            active = undecided[cg]
            if not active:
                continue
            u_end, u_ts, uc = u.end_ns, u.req.ts_ns, u.conn
            decided = False
            for entry in active:
                pg, _declared, lst, starts, ends, block_ends, longest = entry
                lo = bisect_left(starts, u_end - longest)
                hi = bisect_right(starts, u_ts)
                found = False
                for k in _ending_after(ends, block_ends, hi, max(lo, hi - MAX_SCAN), u_end):
                    p = lst[k]
                    if p.conn is not uc and p.conn.server != uc.server:
                        found = True
                        break
                pair = (pg, cg)
                if found:
                    hits[pair] += 1
                    decided = decided or hits[pair] >= need[cg]
                else:
                    misses[pair] += 1
                    if sizes[cg] - misses[pair] < need[cg]:
                        hopeless.add(pair)
                        decided = True
            if decided:
                undecided[cg] = [e for e in active if (e[0], cg) not in hopeless
                                 and hits[(e[0], cg)] < need[cg]]
        return hopeless

    def _client_ip(self, c: Connection) -> str:
        ip = self._ips.get(id(c))
        if ip is None:
            ip = self._ips[id(c)] = _host(c.client)
        return ip

    def _server_ip(self, c: Connection) -> str:
        key = -id(c)
        ip = self._ips.get(key)
        if ip is None:
            ip = self._ips[key] = _host(c.server)
        return ip

    @staticmethod
    def _contains(p: Node, u: Node) -> bool:
        return (p.conn is not u.conn and p.conn.server != u.conn.server
                and p.req.ts_ns <= u.req.ts_ns and u.end_ns <= p.window_end_ns)

    def _edge(self, p: Node, u: Node, pg: tuple[Any, ...], cg: tuple[Any, ...],
              declared: bool, urid: str | None) -> _Edge | None:
        prid = self.rid[id(p)]
        rid = urid is not None and prid is not None
        if rid and urid != prid:
            return None  # both carry an id, and they differ
        pr, ur = p.req, u.req
        base = 0.0
        if pr.first_byte_ns is not None and ur.ts_ns >= pr.first_byte_ns:
            base += _LATE_PENALTY_MS
        if not is_resp(u.conn, ur):
            if pr.method and ur.method and pr.method != ur.method:
                base += _METHOD_PENALTY_MS
            if pr.path and ur.path and pr.path != ur.path:
                base += _PATH_PENALTY_MS
            if (pr.request_bytes is not None and ur.request_bytes is not None
                    and pr.request_bytes != ur.request_bytes):
                base += _SIZE_PENALTY_MS
            if (pr.response_bytes is not None and ur.response_bytes is not None
                    and not pr.sse_events and pr.response_bytes != ur.response_bytes):
                base += _SIZE_PENALTY_MS
        address = self._client_ip(u.conn) == self._server_ip(p.conn)
        if address:
            base -= _ADDRESS_BONUS_MS
        sent = u.syn_first_ns if u.syn_first_ns is not None and \
            u.syn_first_ns >= pr.ts_ns else ur.ts_ns
        so = (sent - pr.ts_ns) / 1e6
        eo = slack = None
        if pr.first_byte_ns is not None and ur.first_byte_ns is not None:
            eo = (pr.first_byte_ns - ur.first_byte_ns) / 1e6
            slack = ((pr.first_byte_ns - pr.ts_ns) - (ur.first_byte_ns - ur.ts_ns)) / 1e6
        return _Edge(p, u, pg, self.group[id(u)], self.kind[id(u)], rid, declared
                     or p.conn.id in self.trusted, address, base, so, eo, slack)

    def accepted_pairs(self, stats: Mapping[tuple[Any, Any], _PairStats],
                       matchings: Mapping[tuple[Any, Any], dict[int, _Edge]],
                       edges: Sequence[_Edge],
                       estimates: Mapping[tuple[Any, Any], _PairStats]
                       ) -> set[tuple[Any, Any]]:
        """Pairs of groups whose links stand: declared by the profile, or a proxy by the
        statistics (module docstring). The steadiness of a pair's timing is judged on
        the first-come-first-served estimate, which chose no link for its timing (the
        refined assignment picks links near the typical offset, so any pair would look
        steady there)."""
        declared = {(e.pgroup, e.cgroup) for e in edges if e.declared}
        sizes: dict[tuple[Any, ...], int] = defaultdict(int)
        for n in self.nodes:
            sizes[self.group[id(n)]] += 1
        inferred: set[tuple[Any, Any]] = set()
        for pair, st in stats.items():
            if pair in declared or st.n < PROXY_MIN_REQUESTS:
                continue
            # a server behind a proxy gets (nearly) all its requests through it
            behind = st.n >= PROXY_MIN_SHARE * sizes[pair[1]]
            est = estimates.get(pair)
            steady = est is not None and est.n >= COUPLED_MIN_PAIRS and \
                est.coupling <= COUPLING_MAX
            if st.address_share >= PROXY_MIN_SHARE or (
                    behind and st.n >= COUPLED_MIN_PAIRS and steady):
                inferred.add(pair)
        # the parent must be a proxy: most of its requests contain such a child
        followed: dict[tuple[Any, ...], set[int]] = defaultdict(set)
        for m in matchings.values():
            for e in m.values():
                if (e.pgroup, e.cgroup) in inferred:
                    followed[e.pgroup].add(id(e.parent))
        proxies = {g for g, s in followed.items()
                   if sizes[g] >= PROXY_MIN_REQUESTS and len(s) >= PROXY_MIN_SHARE * sizes[g]}
        self.considered = declared | inferred | {
            p for p, st in stats.items() if st.address_share >= PROXY_MIN_SHARE}
        return declared | {p for p in inferred if p[0] in proxies}


def _innermost(options: list[_Edge]) -> _Edge:
    """Of a child's links through nested hops, the one to the innermost parent."""
    options.sort(key=lambda e: (not e.rid, e.cost, -e.parent.req.ts_ns))
    best = options[0]
    changed = True
    while changed:
        changed = False
        for e in options:
            p, b = e.parent, best.parent
            if p is not b and b.req.ts_ns <= p.req.ts_ns and p.window_end_ns <= b.window_end_ns \
                    and (e.rid or not best.rid):
                best, changed = e, True
    return best


def _label(e: _Edge, alts: Sequence[_Edge], by_pair: Mapping[tuple[int, int], _Edge],
           child_of: Mapping[int, _Edge], end: bool, jitter_ns: int) -> tuple[str, int]:
    """The contract's link kind of a chosen edge, and its candidate count. A swap with
    another parent's child that costs as little but puts the two out of order is no
    equal alternative (a proxy handles the requests of one connection first come, first
    served: order is evidence), unless the two parents came on different connections
    closer together than the pair's timing varies (``jitter_ns``, the spread of its
    steadier offset)."""
    if e.rid:
        return "request-id", len(alts)
    if len(alts) <= 1:
        return "unique", len(alts)
    for a in alts:
        if a is e or a.rid:
            continue
        other = child_of.get(id(a.parent))
        if other is None:
            if a.cost - e.cost < AMBIGUITY_MS:
                return "ambiguous", len(alts)
            continue
        swap = by_pair.get((id(e.parent), id(other.child)))
        if swap is None or swap.cost + a.cost - e.cost - other.cost >= AMBIGUITY_MS:
            continue
        pa, pe = _anchor_ns(a.parent, end), _anchor_ns(e.parent, end)
        ca, ce = _anchor_ns(other.child, end, True), _anchor_ns(e.child, end, True)
        # requests on one connection are handled in the order they came; on two, by
        # whichever worker took each, so arrival order is evidence only when they came
        # further apart than the pair's timing varies
        unordered = (a.parent.conn is not e.parent.conn and abs(pa - pe) <= jitter_ns)
        if unordered or (ca == ce and other.child.conn is not e.child.conn) \
                or not _in_order(e.parent, e.child, a.parent, other.child, end):
            return "ambiguous", len(alts)
    return "matched", len(alts)


def _first_request_index(conn: Connection) -> int | None:
    if not conn.requests:
        return None
    return min(range(len(conn.requests)), key=lambda i: (conn.requests[i].ts_ns, i))


def link_requests(connections: Iterable[Connection], trusted: Iterable[str] = (),
                  hop_order: Mapping[str, Sequence[str]] | None = None) -> Chains:
    """Link every request to the request that caused it, where the capture shows one.

    ``trusted``: ids of connections whose upstream links need no proxy statistics (a
    profile matched them). ``hop_order``: per profile path, its hops client-facing
    first; connections a profile matched carry ``conn.path`` (``inferred`` false).
    """
    conns = [c for c in connections if c.requests]
    nodes: dict[tuple[str, int], Node] = {}
    for c in conns:
        for i, r in enumerate(c.requests):
            n = Node(c, i, r)
            nodes[n.key] = n
    for c in conns:
        i = _first_request_index(c)
        if i is not None and c.syn_ns is not None and c.syn_ns <= c.requests[i].ts_ns:
            nodes[(c.id, i)].syn_first_ns = c.syn_ns
    linker = _Linker(list(nodes.values()), set(trusted), hop_order or {})
    edges = linker.candidates()

    estimates = _first_estimates(edges)
    # pairs the statistics could never accept do not go through the refined rounds
    sizes: dict[tuple[Any, ...], int] = defaultdict(int)
    for n in nodes.values():
        sizes[linker.group[id(n)]] += 1
    viable = {pair for pair, st in estimates.items()
              if st.address_share >= PROXY_MIN_SHARE * 0.5
              or (st.n >= COUPLED_MIN_PAIRS and st.coupling <= COUPLING_MAX
                  and st.n >= VIABLE_SHARE * sizes[pair[1]])}
    edges = [e for e in edges if e.declared or e.rid or (e.pgroup, e.cgroup) in viable]
    stats = _keep_anchors(_pair_stats(_matching(edges, estimates, by_kind=False)),
                          estimates)
    second = _matching(edges, stats, by_kind=False)
    stats = _keep_anchors(_pair_stats(second), estimates)
    keep = linker.accepted_pairs(stats, second, edges, estimates)
    final_edges = [e for e in edges if e.rid or (e.pgroup, e.cgroup) in keep]
    final = _matching(final_edges, stats, second=True)

    alternatives: dict[tuple[Any, Any, int], list[_Edge]] = defaultdict(list)
    by_pair: dict[tuple[int, int], _Edge] = {}
    for e in final_edges:
        alternatives[(e.pgroup, e.kind, id(e.child))].append(e)
        by_pair[(id(e.parent), id(e.child))] = e
    options: dict[int, list[_Edge]] = defaultdict(list)
    for m in final.values():
        for e in m.values():
            options[id(e.child)].append(e)
    child_of_by_gk: dict[tuple[Any, Any], dict[int, _Edge]] = {
        gk: {id(e.parent): e for e in m.values()} for gk, m in final.items()}

    for opts in options.values():
        e = _innermost(opts)
        u, p = e.child, e.parent
        gk = (e.pgroup, e.kind)
        st = stats.get((e.pgroup, e.cgroup))
        end = st is not None and st.anchor_is_end
        jitter = 0.0 if st is None else (st.iqr_eo or 0.0) if end else st.iqr_so
        u.link, u.candidates = _label(e, alternatives[(e.pgroup, e.kind, id(u))], by_pair,
                                      child_of_by_gk[gk], end, round(jitter * 1e6))
        u.parent = p
        u.from_parent_address = e.address
        p.children.append(u)

    for c in conns:
        i = _first_request_index(c)
        if i is None or c.syn_ns is None:
            continue
        u = nodes[(c.id, i)]
        p = u.parent
        if p is not None and p.req.ts_ns <= c.syn_ns <= u.req.ts_ns:
            u.opened = True

    return Chains(nodes, _proxy_evidence(nodes, second, linker.considered))


def _proxy_evidence(nodes: Mapping[tuple[str, int], Node],
                    matchings: Mapping[tuple[Any, Any], dict[int, _Edge]],
                    considered: set[tuple[Any, Any]]) -> dict[str, ProxyEvidence]:
    """Per server: how many of its requests contained an upstream request, from the
    links made, or for a server that was not taken for a proxy, from the assignment
    of the pairs that passed the pair tests."""
    totals: dict[str, int] = defaultdict(int)
    for n in nodes.values():
        totals[n.conn.server] += 1
    followed: dict[str, set[tuple[str, int]]] = defaultdict(set)
    from_address: dict[str, set[tuple[str, int]]] = defaultdict(set)
    declared: set[str] = set()
    accepted: set[str] = set()
    for n in nodes.values():
        if not n.children:
            continue
        s = n.conn.server
        accepted.add(s)
        followed[s].add(n.key)
        if any(c.from_parent_address for c in n.children):
            from_address[s].add(n.key)
        if n.conn.path is not None and not n.conn.path.get("inferred"):
            declared.add(s)
    for m in matchings.values():
        for e in m.values():
            s = e.parent.conn.server
            if s in accepted or (e.pgroup, e.cgroup) not in considered:
                continue
            followed[s].add(e.parent.key)
            if e.address:
                from_address[s].add(e.parent.key)
    return {s: ProxyEvidence(s, len(k), totals[s], len(from_address[s]), s in declared,
                             s in accepted) for s, k in followed.items()}
