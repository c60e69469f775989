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
``traceparent``) link at once; different ones never do. A Redis command carries the
id of a request when exactly one of its words is one (``Request.named_ids``: a
rate-limit script called with it, a key ``idem:<id>``).

**Assignment.** Per parent group and child kind, children are assigned to parents as a
matching over the whole capture, each parent taking at most one child of the kind: edges
are taken in order of cost, cheapest first. In the last round a child left over first
takes its cheapest augmenting path to a parent without a child (others moving along,
each to another parent that contains it: :func:`_augment`), then a second call of the
same kind where none frees a parent. The cost of an edge is how far its timing strays
from what that pair of hops does typically (the start offset ``U.ts - P.ts`` of a call
made on arrival, the request-end offset ``U.ts - P.end`` of a call made once ``P``'s
body was in, the end offset ``P.first_byte - U.first_byte`` of a call whose answer is
relayed: whichever is steadier for the pair), plus penalties for a different method,
path or body size, for a call after ``P``'s first byte, and, where the pair relays
answers, for a parent that answered before the child; sending from the parent's server
address lowers it a little. The typical offsets come from first matchings by adjacency,
one per anchor. A child linked through several hops (an origin request lies inside both
the router's and the edge's request) goes to the nearest hop that its own assignment
made the child's caller (:func:`_innermost`), else to the innermost parent.

**Bounded.** Under load a proxy holds hundreds of requests open at once, and each of
its upstream requests lies inside all of them; linking costs requests times the
*plausible* candidates, not times the overlap. The first-come-first-served estimate
walks each parent group once, skipping the parents already taken (or whose window closed
before every child still to come) once and for all. Each refined round weighs, per child
and parent group, its equal-id parents and its :data:`MAX_CANDIDATES` cheapest others by
that round's timing cost, found by walking outwards from the pair's typical offset in
the parents sorted by start or first byte and skipping blocks of parents that cannot
contain the child (:class:`_Order`). Where the cap may have decided a child's link (it
got none, or one in the dearer half of those kept, while some were left out) its cap is
doubled and its assignment run again, up to :data:`MAX_CANDIDATES_DEEP`; a child still
so is linked ``ambiguous``, and so is one with a candidate left out that might cost as
little as its link. ``Chains.stats`` counts what it looked at.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappush, heapreplace
from itertools import pairwise
from typing import Any, Final

from netdiag.analysis.stats import quantile
from netdiag.paths.endpoint import split_endpoint
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
AMBIGUITY_MS: Final = 0.1
"""An alternative assignment within this cost (milliseconds of timing) of the chosen
one leaves the link ``ambiguous``."""
VIABLE_SHARE = 0.5 * PROXY_MIN_SHARE
"""Share of a child group's requests a pair's first estimate must link for the pair to
go through the refined rounds (unless its children come from the parent's address)."""
_BLOCK_SHIFT: Final = 5
_BLOCK: Final = 1 << _BLOCK_SHIFT
_BLOCK_MASK: Final = _BLOCK - 1
"""Parents are scanned in blocks of 32 by start time, each with its latest end."""


def _block_ends(ends: Sequence[int]) -> list[int]:
    """The latest end of each block of :data:`_BLOCK` consecutive parents."""
    return [max(ends[b:b + _BLOCK]) for b in range(0, len(ends), _BLOCK)]


def _at(a: list[int], x: int) -> int:
    """``bisect_left(a, x)`` on integers, compiled (no call into the ``bisect`` module,
    no integer objects compared: the linker bisects per child and parent group)."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _after(a: list[int], x: int) -> int:
    """``bisect_right(a, x)`` on integers, compiled (see :func:`_at`)."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _next_ending(ends: Sequence[int], block_ends: Sequence[int], k: int, stop: int,
                 end: int) -> int:
    """The largest index from ``k`` down to ``stop`` whose ``ends[k]`` is at least
    ``end``, a value below ``stop`` where none is; a whole block of parents that all end
    too early is skipped at once (the last index of block b is ``b * _BLOCK + _BLOCK -
    1``)."""
    while k >= stop:
        if k & _BLOCK_MASK == _BLOCK_MASK and block_ends[k >> _BLOCK_SHIFT] < end:
            k -= _BLOCK
        elif ends[k] >= end:
            return k
        else:
            k -= 1
    return k


def _ending_after(ends: Sequence[int], block_ends: Sequence[int], hi: int, stop: int,
                  end: int) -> Iterator[int]:
    """Indices ``k`` from ``hi - 1`` down to ``stop`` whose ``ends[k]`` is at least
    ``end``, newest first (:func:`_next_ending`, one after the other)."""
    k = _next_ending(ends, block_ends, hi - 1, stop, end)
    while k >= stop:
        yield k
        k = _next_ending(ends, block_ends, k - 1, stop, end)


MAX_CANDIDATES = 16
"""Candidate parents a refined round of the assignment weighs per child and parent group
(beside those with the child's request id): the cheapest by the round's timing cost
(:func:`_timing_cost`), so the time to link grows with requests times this, whatever the
concurrency. Raised per child where the cap may have decided its link (up to
:data:`MAX_CANDIDATES_DEEP`, :meth:`_Linker.assign`). 16 changes no link of the tests,
of the lab's captures or of the shipped capture; 8 changed 17 links of the lab's
captures (all but one to ``ambiguous``), 4 changed 70 (8 of them confidently): a burst
whose true parents lie past the cap shifts the first-come-first-served order, and the
shift reaches children whose own candidates were all weighed."""
MAX_CANDIDATES_DEEP = 16 * MAX_CANDIDATES
"""The largest cap a child's candidates are raised to where the cap may have decided
its link; a child still so at it is linked ``ambiguous``."""
_SCAN_DIRECT: Final = 64
"""Parents in a child's range of starts at most which :meth:`_Linker._every` tests one
by one rather than by the block walk."""
MAX_SCAN: Final = 1024
"""Requests of a parent group stepped over (not containing the child) per child and
parent group before a walk stops: one request whose window spans the capture (an answer
that never came) cannot make linking quadratic."""
REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "request-id")
"""Request headers whose equal values tie an upstream request to its cause."""

_LATE_PENALTY_MS: Final = 1000.0
_METHOD_PENALTY_MS: Final = 50.0
_PATH_PENALTY_MS: Final = 20.0
_SIZE_PENALTY_MS: Final = 5.0
_ADDRESS_BONUS_MS: Final = 0.5
_UNRELAYED_PENALTY_MS: Final = _LATE_PENALTY_MS
"""Where a pair relays answers (its anchor is the first byte, and its parents answered
after their children), a parent that answered before the child cannot have relayed it."""
_RID_COST: Final = -1e9
_INF: Final = float("inf")
_NO_EDGE: Final = object()
_NO_CHILDREN: Final[list[Node]] = []
"""The children of every node that caused none (:attr:`Node.children`; never written
to)."""
_SLOT_BITS: Final = 32
"""A child's number takes the low bits of a :meth:`_Linker.slot`, its parent group's (or
a subset's) number the bits above: a report holds far fewer than 2**32 requests."""
_SLOT_MASK: Final = (1 << _SLOT_BITS) - 1
_NO_LINKS: Final[list[_Edge]] = []
"""What :meth:`_Linker._links` gives a child in a pair linked by request ids only when
no parent of the group carries the child's id (never written to)."""
_NO_SAME: Final[tuple[Node, ...]] = ()
"""What :meth:`_Linker._same_rid` gives a child without an equal request id."""


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


def _named_id(words: tuple[str, ...], ids: dict[str, list[Node]]) -> str | None:
    """The request id a Redis command names among its words: the only word that is
    some request's id (None for none, or for two different ids)."""
    found: str | None = None
    for w in words:
        if w in ids and w != found:
            if found is not None:
                return None
            found = w
    return found


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
    ts_ns: int
    """The request's start (``req.ts_ns``). This and the next four fields are copies
    that the linker reads from the node itself: nodes are allocated together, records
    are spread over the whole heap."""
    fb_ns: int | None
    """The request's first byte (``req.first_byte_ns``)."""
    end_ns: int
    """Its last byte, else its first byte, else its start."""
    rend_ns: int
    """The request's own last byte (``req.end_ns``: END_STREAM, the end of its body), else
    its start."""
    window_end_ns: int
    """End of the time this request may have caused others: its last byte, or the end
    of its connection when the answer never ended in the capture."""
    server: str
    """The connection's server endpoint."""
    conn_id: str
    """The connection's id."""
    group: tuple[Any, ...] = ()
    """Set by the linker: the node's group (a profile's hop, else its server)."""
    kind: tuple[Any, ...] = ()
    """Set by the linker: what it is (a profile's hop, else RESP or HTTP, and the port)."""
    rid: str | None = None
    """Set by the linker: its request id header, if any; for a Redis command, the one
    request id its arguments name."""
    resp: bool = False
    """Set by the linker: a Redis (RESP) command."""
    parent: Node | None = None
    children: list[Node] = field(default_factory=lambda: _NO_CHILDREN)
    """The requests it caused, in the order linked. A node that caused none shares one
    empty list (never appended to: :func:`link_requests` gives a parent a list of its own
    at its first child), not one list per request."""
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
    num: int = 0
    """Set by the linker: its number among the linked nodes (0 to their count less
    one): maps keyed by a pair of nodes use one integer, not a tuple of two ids."""
    ranks: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    """Set by the linker: its place in each arrival order (:func:`_order`), indexed by
    :func:`_rank`, so that sorting and comparing by arrival is by one integer (five
    machine integers inside the node, compiled: no tuple and no int objects)."""
    taken_in: int = 0
    """Set by the linker: the first estimate (:meth:`_Linker._fifo`, numbered from 1)
    that last gave this request a child, instead of a set of the ids taken per
    estimate."""
    client_ip: str = ""
    """Set by the linker: the address its connection's client sent from (no port)."""
    server_ip: str = ""
    """Set by the linker: the address its connection's server listens on (no port)."""
    same_rid: tuple[Node, ...] | None = None
    """Set by the linker once asked: the requests with its request id that contain it, of
    every parent group (:meth:`_Linker._same_rid`)."""
    left_out: list[tuple[float, int, bool, float] | None] | None = None
    """Set by the linker's rounds: per parent group of its group (in the order of
    :attr:`_Linker.pairs_of`), what the last round left out (:meth:`_Linker.left_out_of`)."""
    as_child: bool = False
    """Marks the node while :func:`_separate` looks at a set of links (as a child)."""
    as_parent: bool = False
    """Marks the node while :func:`_separate` looks at a set of links (as a parent), or
    :func:`link_requests` at the final matchings (a parent with two calls of a kind)."""
    kept: list[tuple[str, list[_Edge], int] | None] | None = None
    """Set by the linker's rounds: per parent group of its group (in the order of
    :attr:`_Linker.pairs_of`), the links a round kept, how, and how many candidates it
    met, where it met them all (:meth:`_Linker._links`; links by equal ids only are not
    kept).
    Kept on the node, not in a map over all children and groups: reached with the node,
    not through a large table's scattered entries."""

    def __init__(self, conn: Connection, index: int, req: Request, ts_ns: int, fb_ns: int | None,
                 end_ns: int, rend_ns: int, window_end_ns: int, server: str, conn_id: str,
                 group: tuple[Any, ...] = (), kind: tuple[Any, ...] = (), rid: str | None = None,
                 resp: bool = False, parent: Node | None = None,
                 children: list[Node] | None = None, link: str | None = None,
                 candidates: int = 0, syn_first_ns: int | None = None,
                 from_parent_address: bool = False, opened: bool = False, num: int = 0,
                 ranks: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0), taken_in: int = 0,
                 client_ip: str = "", server_ip: str = "",
                 same_rid: tuple[Node, ...] | None = None,
                 left_out: list[tuple[float, int, bool, float] | None] | None = None,
                 as_child: bool = False, as_parent: bool = False,
                 kept: list[tuple[str, list[_Edge], int] | None] | None = None
                 ) -> None:
        self.conn = conn
        self.index = index
        self.req = req
        self.ts_ns = ts_ns
        self.fb_ns = fb_ns
        self.end_ns = end_ns
        self.rend_ns = rend_ns
        self.window_end_ns = window_end_ns
        self.server = server
        self.conn_id = conn_id
        self.group = group
        self.kind = kind
        self.rid = rid
        self.resp = resp
        self.parent = parent
        self.children = _NO_CHILDREN if children is None else children
        self.link = link
        self.candidates = candidates
        self.syn_first_ns = syn_first_ns
        self.from_parent_address = from_parent_address
        self.opened = opened
        self.num = num
        self.ranks = ranks
        self.taken_in = taken_in
        self.client_ip = client_ip
        self.server_ip = server_ip
        self.same_rid = same_rid
        self.left_out = left_out
        self.as_child = as_child
        self.as_parent = as_parent
        self.kept = kept

    @classmethod
    def of(cls, conn: Connection, index: int, req: Request) -> Node:
        """The node of ``conn.requests[index]``."""
        fb = req.first_byte_ns
        ts = req.ts_ns
        last = req.last_byte_ns
        # the max() written out: compiled, a max() of three ints was a call into the builtins
        if last is not None:
            f = fb or last
            window_end = f if f > last else last
        else:
            f = fb or ts
            window_end = conn.last_ns
            if f > window_end:
                window_end = f
            if ts > window_end:
                window_end = ts
        sent = req.end_ns
        # Node(...), not cls(...): compiled, a call through ``cls`` is a Python-level call
        return Node(conn, index, req, ts, fb, last or fb or ts,
                    sent if sent is not None and sent > ts else ts, window_end, conn.server,
                    conn.id)

    @property
    def key(self) -> tuple[str, int]:
        return self.conn_id, self.index

    @property
    def label(self) -> str:
        """``C3#0`` (connection id, request index)."""
        return f"{self.conn_id}#{self.index}"

    @property
    def start_ns(self) -> int:
        """Start of this node's interval as its parent sees it (setup included)."""
        if self.opened and self.conn.syn_ns is not None:
            return self.conn.syn_ns
        return self.ts_ns

    @property
    def wait_ns(self) -> int | None:
        return None if self.fb_ns is None else self.fb_ns - self.ts_ns

    @property
    def setup_ns(self) -> int | None:
        if not self.opened or self.conn.syn_ns is None:
            return None
        return self.ts_ns - self.conn.syn_ns

    def in_wait(self, child: Node) -> bool:
        """The child started before this request's first byte (it delays the answer)."""
        fb = self.fb_ns
        return fb is None or child.start_ns < fb

    def _spans(self, fb: int) -> tuple[int, int, list[tuple[int, int]]]:
        """(start, first byte ``fb``, merged callee intervals within them)."""
        lo, hi = self.ts_ns, fb
        spans = []
        for c in self.children:
            s = max(c.start_ns, lo)
            e = min(c.fb_ns if c.fb_ns is not None else hi, hi)
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
        return self.own_and_parts_ns()[0]

    def own_parts_ns(self) -> tuple[int, int, int] | None:
        """The own time split around the calls within the wait: (before the first call,
        between calls, after the last call); None when it made no call within it."""
        return self.own_and_parts_ns()[1]

    def own_and_parts_ns(self) -> tuple[int | None, tuple[int, int, int] | None]:
        """:meth:`own_ns` and :meth:`own_parts_ns` from one walk of the callees (none
        walked for a request that made no call: most)."""
        fb = self.fb_ns
        if fb is None:
            return None, None
        if not self.children:
            return fb - self.ts_ns, None
        lo, hi, merged = self._spans(fb)
        own = (hi - lo) - sum(e - s for s, e in merged)
        if not merged:
            return own, None
        before = merged[0][0] - lo
        after = hi - merged[-1][1]
        between = sum(merged[k + 1][0] - merged[k][1] for k in range(len(merged) - 1))
        return own, (before, between, after)


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

    def __init__(self, node: Node, depth: int, own_ns: int | None, in_ttfb: bool,
                 parts_ns: tuple[int, int, int] | None = None) -> None:
        self.node = node
        self.depth = depth
        self.own_ns = own_ns
        self.in_ttfb = in_ttfb
        self.parts_ns = parts_ns

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
        method, target = r.method, r.path
        if method and target:
            return f"{method} {target}"
        if method or target:
            return method or target or ""
        return "command" if is_resp(self.node.conn, r) else "request"

    def to_json(self) -> dict[str, Any]:
        n = self.node
        return {
            "hop": self.hop, "path": self.path, "server": n.server,
            "connection": n.conn_id, "request": n.index, "depth": self.depth,
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
    stats: dict[str, int] = field(default_factory=dict)
    """What linking cost: ``children`` (requests that had a parent group to link to),
    ``pairs_costed`` (candidate links built and costed), ``pairs_stepped_over``
    (requests of a parent group walked past because they did not contain the child),
    ``links_weighed`` (candidate links given to the assignment, over its rounds)."""

    _roots: list[Node] | None = field(default=None, repr=False, compare=False)
    """The roots once found (:attr:`roots`)."""
    _steps: dict[tuple[str, int], list[Step]] = field(default_factory=dict, repr=False,
                                                      compare=False)
    """Each chain of more than one request once walked (:meth:`steps`: the budgets read
    every chain twice, the chain table once more)."""

    @property
    def roots(self) -> list[Node]:
        """Requests no captured request caused, in time order (found once: the links
        are made before the chains are)."""
        if self._roots is None:
            self._roots = sorted((n for n in self.nodes.values() if n.parent is None),
                                 key=lambda n: n.ranks[0])  # (start, connection, index)
        return list(self._roots)

    def node(self, conn_id: str, index: int) -> Node | None:
        return self.nodes.get((conn_id, index))

    def is_proxy(self, server: str) -> bool:
        ev = self.proxies.get(server)
        return ev is not None and ev.is_proxy

    def steps(self, root: Node) -> list[Step]:
        """The chain of ``root``: itself and every request it caused, depth first (a
        chain of more than one request is walked once: the links are made before the
        chains are)."""
        key = root.key
        out = self._steps.get(key)
        if out is None:
            out = []
            _walk_steps(root, 0, True, out)
            if root.children:  # a chain of one step is not worth keeping
                self._steps[key] = out
        return list(out)

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


def _child_order(c: Node) -> tuple[int, str, int]:
    return c.start_ns, c.conn_id, c.index


def _walk_steps(n: Node, depth: int, in_ttfb: bool, out: list[Step]) -> None:
    # a module function, not a closure: compiled, a closure and its frame would form a
    # reference cycle per chain, left for the collector
    own, parts = n.own_and_parts_ns()
    out.append(Step(n, depth, own, in_ttfb, parts))
    for c in sorted(n.children, key=_child_order):
        _walk_steps(c, depth + 1, in_ttfb and n.in_wait(c), out)


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
    ro: float
    """Request-end offset: child start minus the parent request's last byte (ms)."""
    cost: float = 0.0

    def __init__(self, parent: Node, child: Node, pgroup: tuple[Any, ...],
                 cgroup: tuple[Any, ...], kind: tuple[Any, ...], rid: bool, declared: bool,
                 address: bool, base: float, so: float, eo: float | None, slack: float | None,
                 ro: float, cost: float = 0.0) -> None:
        self.parent = parent
        self.child = child
        self.pgroup = pgroup
        self.cgroup = cgroup
        self.kind = kind
        self.rid = rid
        self.declared = declared
        self.address = address
        self.base = base
        self.so = so
        self.eo = eo
        self.slack = slack
        self.ro = ro
        self.cost = cost


_START: Final = 0
"""A pair's anchor: the parent's start (a call made on arrival)."""
_FB: Final = 1
"""A pair's anchor: the parent's first byte (an answer relayed)."""
_REND: Final = 2
"""A pair's anchor: the parent request's last byte (a call made once the request's body
was in: a proxy that buffers it, a router that counts the prompt's tokens)."""


@dataclass(slots=True)
class _PairStats:
    """Timing of the matched pairs of one (parent group, child group)."""

    n: int
    med_so: float
    iqr_so: float
    med_eo: float | None
    iqr_eo: float | None
    low_eo: float | None
    """Lower quartile of the end offsets: not below zero where the parent's answers
    came after its children's (relays)."""
    med_slack: float | None
    address_share: float
    med_ro: float
    """Median request-end offset (ms)."""
    iqr_ro: float
    """Interquartile range of the request-end offsets (ms)."""

    chosen: int | None = None
    """The anchor chosen by the first estimates (:data:`_START`, :data:`_FB` or
    :data:`_REND`; None: the steadier of the start and end offsets here)."""
    chance_ms: float | None = None
    """Median gap between successive parents' anchors: how far a child taken by
    chance would stray where parents are dense (the slack the parent leaves, where
    they are few and long: the smaller of the two is :attr:`coupling`'s scale)."""

    @property
    def anchor(self) -> int:
        """The offset the pair's cost measures: :data:`_START`, :data:`_FB` or
        :data:`_REND`."""
        chosen = self.chosen
        if chosen is not None:
            return _START if chosen == _FB and self.iqr_eo is None else chosen
        return _FB if self.iqr_eo is not None and self.iqr_eo < self.iqr_so else _START

    @property
    def anchor_is_end(self) -> bool:
        return self.anchor == _FB

    @property
    def spread(self) -> float:
        """Interquartile range of the anchor's offset (ms)."""
        anchor = self.anchor
        if anchor == _FB and self.iqr_eo is not None:
            return self.iqr_eo
        return self.iqr_ro if anchor == _REND else self.iqr_so

    @property
    def coupling(self) -> float:
        """Spread of the anchor offset over what chance gives: a child paired with the
        first parent to come by chance strays by about the gap between parents; one a
        proxy made strays by the proxy's jitter only."""
        scales = [x for x in (self.chance_ms, self.med_slack) if x is not None]
        return self.spread / max(min(scales) if scales else 0.0, 0.001)


def _stats(edges: Sequence[_Edge]) -> _PairStats:
    so = sorted([e.so for e in edges])
    eo = sorted([e.eo for e in edges if e.eo is not None])
    sl = sorted([e.slack for e in edges if e.slack is not None])
    ro = sorted([e.ro for e in edges])
    address = 0
    for e in edges:
        if e.address:
            address += 1
    return _PairStats(
        len(edges), quantile(so, 0.5), quantile(so, 0.75) - quantile(so, 0.25),
        quantile(eo, 0.5) if eo else None,
        (quantile(eo, 0.75) - quantile(eo, 0.25)) if eo else None,
        quantile(eo, 0.25) if eo else None,
        quantile(sl, 0.5) if sl else None,
        address / len(edges), quantile(ro, 0.5), quantile(ro, 0.75) - quantile(ro, 0.25))


def _timing_cost(e: _Edge, st: _PairStats | None) -> float:
    if e.rid:
        return _RID_COST
    if st is None:  # no typical timing for the pair (it had no match in FIFO order)
        return e.base + min(e.so, e.eo if e.eo is not None and e.eo >= 0 else e.so)
    dso = abs(e.so - st.med_so)
    deo = abs(e.eo - st.med_eo) if e.eo is not None and st.med_eo is not None else None
    anchor = st.anchor
    if anchor == _FB and deo is not None:
        if e.eo is not None and e.eo < 0 and st.low_eo is not None and st.low_eo >= 0:
            # the pair relays its children's answers, and this parent answered first
            return e.base + _UNRELAYED_PENALTY_MS + deo + 0.01 * dso
        return e.base + deo + 0.01 * dso
    if anchor == _REND:
        return e.base + abs(e.ro - st.med_ro) + (0.01 * deo if deo is not None else 0.0)
    return e.base + dso + (0.01 * deo if deo is not None else 0.0)


_ALL_KEPT: Final[list[tuple[float, int, bool, float] | None]] = [
    (_INF, n, True, _INF) for n in range(2 * MAX_CANDIDATES)]


def _all_kept(n: int) -> tuple[float, int, bool, float] | None:
    """What a child left out of a parent group whose ``n`` candidates were all kept
    (:meth:`_Linker.left_out_of`): nothing; the usual counts share one tuple each. Never
    None: typed as the optional entry of :attr:`Node.left_out` because, compiled, a
    plain tuple type is returned unboxed and boxed again (a new tuple) where stored."""
    return _ALL_KEPT[n] if n < len(_ALL_KEPT) else (_INF, n, True, _INF)


def _anchor_ns(n: Node, anchor: int, child: bool = False) -> int:
    """The time a pair's steadier offset is measured from: the request's first byte
    (a relayed answer), its last byte as a parent (a call made once its body was in) or
    its start (a call made on arrival; for a call that opened its connection, the SYN:
    the proxy decided to call then)."""
    if anchor == _FB and n.fb_ns is not None:
        return n.fb_ns
    if child:
        syn = n.syn_first_ns
        return n.ts_ns if syn is None else syn
    return n.rend_ns if anchor == _REND else n.ts_ns


def _order(n: Node, anchor: int, child: bool = False) -> tuple[int, int, str, int]:
    """Arrival order: the anchor time, then the start, then (requests that arrived in
    one packet) their order on the connection."""
    return _anchor_ns(n, anchor, child), n.ts_ns, n.conn_id, n.index


_ORDERS: Final = ((_START, False), (_FB, False), (_START, True), (_FB, True), (_REND, False))
"""The arrival orders :func:`_set_ranks` ranks, by their place in ``Node.ranks``."""


def _set_ranks(nodes: Sequence[Node]) -> None:
    """Each node's place in the five arrival orders (:func:`_order` by start or first
    byte, as a parent or as a child, and by the request's last byte as a parent:
    :data:`_ORDERS`): ``node.ranks``, read by :func:`_rank`. The orders are total (a
    node's connection and index break every tie): each is sorted by its anchor time,
    then by the place in the order by start (the first), as one integer per node."""
    n = len(nodes)
    if not n:
        return
    base = [0] * n
    # the order by start: sorted by start alone, then each run of equal starts (requests
    # that arrived in one packet, or at one instant on several connections) by connection
    # id and index; one integer key per node would outgrow a machine word
    starts = [nd.ts_ns for nd in nodes]
    at = sorted(range(n), key=starts.__getitem__)  # the node at each place
    i = 0
    while i < n:
        t = starts[at[i]]
        j = i + 1
        while j < n and starts[at[j]] == t:
            j += 1
        if j - i > 1:
            at[i:j] = sorted(at[i:j], key=lambda k: (nodes[k].conn_id, nodes[k].index))
        i = j
    for r, k in enumerate(at):
        base[k] = r
    places: list[list[int]] = [base]
    seen: list[list[int]] = []  # the anchors of each order so far (by start: none)
    for v in range(1, len(_ORDERS)):
        anchor, child = _ORDERS[v]
        anchors = [_anchor_ns(nd, anchor, child) for nd in nodes]
        if all(a == nd.ts_ns for a, nd in zip(anchors, nodes, strict=True)):
            places.append(base)  # every anchor is the start: the order by start
            seen.append(anchors)
            continue
        same = next((k for k, other in enumerate(seen) if other == anchors), None)
        seen.append(anchors)
        if same is not None:  # the anchors of an earlier order (a child's first byte)
            places.append(places[same + 1])
            continue
        # ``at`` lists the nodes in the order by start, and a sort is stable: equal
        # anchors keep that order
        place = [0] * n
        for r, k in enumerate(sorted(at, key=anchors.__getitem__)):
            place[k] = r
        places.append(place)
    for i, nd in enumerate(nodes):
        nd.ranks = (places[0][i], places[1][i], places[2][i], places[3][i], places[4][i])


def _rank(n: Node, anchor: int, child: bool = False) -> int:
    """The node's place in the arrival order :func:`_order` (``anchor``, ``child``)
    gives."""
    r = n.ranks
    if child:
        return r[3] if anchor == _FB else r[2]
    if anchor == _FB:
        return r[1]
    return r[4] if anchor == _REND else r[0]


def _in_order(p1: Node, c1: Node, p2: Node, c2: Node, anchor: int) -> bool:
    """Parents and children in the same order (first come, first served). Two answers
    relayed in one packet say nothing of their order: their starts decide then."""
    if anchor == _FB and _anchor_ns(p1, _FB) == _anchor_ns(p2, _FB):
        anchor = _START
    return ((_rank(p1, anchor) < _rank(p2, anchor))
            == (_rank(c1, anchor, True) < _rank(c2, anchor, True)))


def _relayed_together(taken: dict[int, _Edge], edges: Sequence[_Edge],
                      anchors: Mapping[tuple[Any, Any], int]) -> None:
    """Parents whose answers left in one packet (one first byte) say nothing of their
    order by it: where a pair's anchor is the first byte, their children go to them in
    the order both began (first come, first served), when that costs no more than
    :data:`AMBIGUITY_MS` over the assignment's. Paired by the children's first bytes, a
    router that answered them in another order would reverse them."""
    blocks: dict[tuple[Any, Any, int], list[_Edge]] = {}
    for e in taken.values():
        if e.rid or e.parent.fb_ns is None or anchors.get((e.pgroup, e.cgroup), _START) != _FB:
            continue
        key = (e.pgroup, e.cgroup, e.parent.fb_ns)
        block = blocks.get(key)
        if block is None:
            blocks[key] = [e]
        else:
            block.append(e)
    by_pair: dict[tuple[int, int], _Edge] | None = None  # built at the first need
    for block in blocks.values():
        if len(block) < 2:
            continue
        parents = sorted([e.parent for e in block], key=lambda n: _rank(n, _START))
        children = sorted([e.child for e in block], key=lambda n: _rank(n, _START, True))
        if by_pair is None:
            by_pair = {(id(e.parent), id(e.child)): e for e in edges}
        fifo: list[_Edge] = []
        for p, c in zip(parents, children, strict=True):
            x = by_pair.get((id(p), id(c)))
            if x is None or x.rid:
                break
            fifo.append(x)
        if len(fifo) < len(block):
            continue  # a pair in start order that is no candidate
        more = 0.0  # what the order by start costs over the assignment's
        for x, e in zip(fifo, block, strict=True):
            more += x.cost - e.cost
        if more > AMBIGUITY_MS:
            continue
        for x in fifo:
            taken[id(x.child)] = x


def _fifo_repair(taken: dict[int, _Edge], edges: Sequence[_Edge],
                 anchors: Mapping[tuple[Any, Any], int]) -> None:
    """Among assignments within :data:`AMBIGUITY_MS` of each other, keep the one that
    preserves order (a proxy forwards, and relays answers, first come first served):
    swap the children of neighbouring parents whose children are out of order when the
    swap costs no more than that."""
    by_pair: dict[tuple[int, int], _Edge] | None = None  # built at the first need
    chosen = sorted(taken.values(), key=lambda e: _rank(
        e.parent, anchors.get((e.pgroup, e.cgroup), _START)))
    for _ in range(8):
        changed = False
        for i in range(len(chosen) - 1):
            a, b = chosen[i], chosen[i + 1]
            if a.rid or b.rid:
                continue
            anchor = anchors.get((a.pgroup, a.cgroup), _START)
            if _in_order(a.parent, a.child, b.parent, b.child, anchor):
                continue
            if by_pair is None:
                by_pair = {(id(e.parent), id(e.child)): e for e in edges}
            x = by_pair.get((id(a.parent), id(b.child)))
            y = by_pair.get((id(b.parent), id(a.child)))
            if x is None or y is None or x.cost + y.cost - a.cost - b.cost > AMBIGUITY_MS:
                continue
            chosen[i], chosen[i + 1] = x, y
            taken[id(x.child)], taken[id(y.child)] = x, y
            changed = True
        if not changed:
            break


_MATCH_VALUE: Final = 1e6
"""Value of one link in the ordered assignment: more links first, then less cost."""


def _assign_ordered(edges: Sequence[_Edge], anchor: int) -> dict[int, _Edge]:
    """The order-preserving assignment of most value (each link :data:`_MATCH_VALUE`
    less its cost): parents and children both in arrival order, as a proxy handles them
    first come, first served (a token call goes out in the order the requests came;
    answers are relayed in the order they came back). A weighted longest increasing
    chain over the candidate links, with a Fenwick tree of prefix maxima: O(E log n)."""
    parents = sorted({id(e.parent): e.parent for e in edges}.values(),
                     key=lambda n: _rank(n, anchor))
    pidx = {id(p): i for i, p in enumerate(parents)}
    by_child: dict[int, list[_Edge]] = defaultdict(list)
    for e in edges:
        by_child[id(e.child)].append(e)
    children = sorted((lst[0].child for lst in by_child.values()),
                      key=lambda n: _rank(n, anchor, True))
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


DECISIVE_MS: Final = 2.0
"""A link at least this much cheaper (ms of timing, or a body size, path or method that
differs) than the child's and the parent's every other free choice is taken before
arrival order is consulted."""


def _decisive(edges: Sequence[_Edge], taken: dict[int, _Edge], used: set[int]) -> None:
    """Take the links the evidence decides: the child's cheapest free parent, by at
    least :data:`DECISIVE_MS`, whose own cheapest free child it is, by as much. Repeated
    while that frees decisions (at most a few rounds)."""
    free = [e for e in edges if id(e.child) not in taken and id(e.parent) not in used]
    for _ in range(6):
        best_c: dict[int, list[Any]] = {}  # [best edge, best cost, second cost]
        best_p: dict[int, list[Any]] = {}
        for e in free:
            _keep(best_c, id(e.child), e)
            _keep(best_p, id(e.parent), e)
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
        free = [e for e in free if id(e.child) not in taken and id(e.parent) not in used]


def _keep(best: dict[int, list[Any]], key: int, e: _Edge) -> None:
    """Keep ``e`` among the two cheapest links of ``key`` (:func:`_decisive`)."""
    two = best.get(key)
    cost = e.cost
    if two is None:
        best[key] = [e, cost, _INF]
    elif cost < two[1]:
        two[0], two[1], two[2] = e, cost, two[1]
    elif cost < two[2]:
        two[2] = cost


def _separate(edges: Sequence[_Edge]) -> bool:
    """No two edges share a child or a parent (the common case of requests that do not
    overlap in time). Marks the nodes seen, then clears the marks: no set of ids."""
    seen = 0
    separate = True
    for e in edges:
        c, p = e.child, e.parent
        if c.as_child or p.as_parent:
            separate = False
            break
        c.as_child = True
        p.as_parent = True
        seen += 1
    for k in range(seen):
        e = edges[k]
        e.child.as_child = False
        e.parent.as_parent = False
    return separate


def _assign(edges: list[_Edge], second: bool,
            anchors: Mapping[tuple[Any, Any], int] | None = None) -> dict[int, _Edge]:
    """Equal request ids first; then the links the evidence decides (:func:`_decisive`);
    then the order-preserving assignment of most value (:func:`_assign_ordered`) for
    what timing alone cannot tell apart; then, cheapest first, children left over with
    parents still free (``second``: then also with parents that already have a child of
    the kind). Returns child node id -> edge."""
    if _separate(edges):
        # what the steps below give then: every link taken, those by equal ids first
        # (decisive takes each other one: it is its child's and its parent's only one)
        taken = {id(e.child): e for e in edges if e.rid}
        for e in edges:
            if not e.rid:
                taken[id(e.child)] = e
        return taken
    anchors = anchors or {}
    taken = {}
    used: set[int] = set()
    for e in edges:
        if e.rid and id(e.child) not in taken and id(e.parent) not in used:
            taken[id(e.child)] = e
            used.add(id(e.parent))
    _decisive([e for e in edges if not e.rid], taken, used)
    rest = [e for e in edges if not e.rid and id(e.child) not in taken
            and id(e.parent) not in used]
    votes = [0, 0, 0]  # per anchor
    for e in rest:
        votes[anchors.get((e.pgroup, e.cgroup), _START)] += 1
    anchor = _START  # the most votes (a tie: the start, then the first byte)
    for a in (_FB, _REND):
        if votes[a] > votes[anchor]:
            anchor = a
    for c, e in _assign_ordered(rest, anchor).items():
        taken[c] = e
        used.add(id(e.parent))
    edges.sort(key=lambda e: (e.cost, e.child.ts_ns, e.parent.ts_ns))
    for e in edges:
        c, p = id(e.child), id(e.parent)
        if c in taken or p in used:
            continue
        taken[c] = e
        used.add(p)
    _relayed_together(taken, edges, anchors)
    _fifo_repair(taken, edges, anchors)
    if second:
        _augment(taken, edges)
        extra: set[int] = set()
        for e in edges:
            c, p = id(e.child), id(e.parent)
            if c in taken or p in extra:
                continue
            taken[c] = e
            extra.add(p)
    return taken


MAX_AUGMENT_DEPTH: Final = 8
"""Most children one augmenting path (:func:`_augment`) links anew."""
AUGMENT_WORK: Final = 4096
"""Edges the augmenting paths of one assignment may look at (:func:`_augment`), or as
many as it has edges where that is more: linear time whatever the overlap."""


def _augment(taken: dict[int, _Edge], edges: Sequence[_Edge]) -> None:
    """Children left without a link while a parent of theirs is free only through other
    children: link each along its cheapest augmenting path (up to
    :data:`MAX_AUGMENT_DEPTH` children, of timing cost below the late penalty), each
    child on it moving to the next child's parent and the last to a free parent, so that
    the second calls of the last round go only to parents that no chain of moves could
    leave with none. Links by equal ids never move. ``edges`` sorted by cost."""
    by_child: dict[int, list[_Edge]] = {}
    holder: dict[int, int] = {}  # parent id -> the child id holding it
    for c, e in taken.items():
        holder[id(e.parent)] = c
    free: set[int] = set()
    for e in edges:
        if e.rid:
            continue
        lst = by_child.get(id(e.child))
        if lst is None:
            by_child[id(e.child)] = [e]
        else:
            lst.append(e)
        if id(e.parent) not in holder:
            free.add(id(e.parent))
    budget = max(AUGMENT_WORK, len(edges))
    for u in by_child:
        if not free or budget <= 0:
            return
        if u in taken:
            continue
        path, budget = _augmenting_path(u, by_child, taken, holder, budget)
        if path is None:
            continue
        for e in path:
            c = id(e.child)
            taken[c] = e
            holder[id(e.parent)] = c
        free.discard(id(path[0].parent))


def _augmenting_path(u: int, by_child: Mapping[int, list[_Edge]], taken: Mapping[int, _Edge],
                     holder: Mapping[int, int], budget: int
                     ) -> tuple[list[_Edge] | None, int]:
    """The cheapest path (:func:`_augment`) from left-over child ``u`` to a free parent,
    by rounds of relaxation over the children it moves (Bellman-Ford, at most
    :data:`MAX_AUGMENT_DEPTH` rounds), or None; the budget left."""
    dist: dict[int, float] = {u: 0.0}
    via: dict[int, _Edge] = {}  # child id -> the edge that took its parent from it
    best: list[_Edge] | None = None
    best_cost = _LATE_PENALTY_MS
    frontier = [u]
    for _depth in range(MAX_AUGMENT_DEPTH):
        nxt: list[int] = []
        for c in dict.fromkeys(frontier):  # once per round, in the order reached
            own = taken.get(c)
            if own is not None and own.rid:
                continue
            base = dist[c] - (0.0 if own is None else own.cost)
            for e in by_child.get(c, ()):
                budget -= 1
                p = id(e.parent)
                if own is not None and e.parent is own.parent:
                    continue
                cost = base + e.cost
                if cost >= best_cost:
                    continue
                h = holder.get(p)
                if h is None:
                    path = _path_to(c, e, via, u)
                    if path is not None:
                        best, best_cost = path, cost
                elif h != c and cost < dist.get(h, _INF):
                    dist[h] = cost
                    via[h] = e
                    nxt.append(h)
            if budget <= 0:
                return best, budget
        if not nxt:
            break
        frontier = nxt
    return best, budget


def _path_to(c: int, last: _Edge, via: Mapping[int, _Edge], u: int) -> list[_Edge] | None:
    """The edges of the path ending with child ``c`` taking ``last``: each child back to
    ``u`` takes the parent of the child it displaced; None where the moves loop."""
    path = [last]
    seen = {c}
    while c != u:
        e = via.get(c)
        if e is None:
            return None
        c = id(e.child)
        if c in seen:
            return None
        seen.add(c)
        path.append(e)
    return path


def _median_gap(parents: Sequence[Node], anchor: int) -> float | None:
    """Median gap (ms) between successive anchors of ``parents``, None for fewer than
    two."""
    ts = sorted([_anchor_ns(n, anchor) for n in parents])
    gaps = sorted([b - a for a, b in pairwise(ts)])
    return gaps[len(gaps) // 2] / 1e6 if gaps else None


REND_MARGIN: Final = 0.5
"""The request end is a pair's anchor only where its offset's spread (over what chance
gives) is at most this share of the start's and the first byte's: where bodies come
with their headers the two offsets differ by noise only."""


def _estimates(starts: dict[tuple[Any, Any], _PairStats], ends: dict[tuple[Any, Any], _PairStats],
               rends: dict[tuple[Any, Any], _PairStats],
               parents: Mapping[tuple[Any, ...], Sequence[Node]]
               ) -> dict[tuple[Any, Any], _PairStats]:
    """Per pair of groups, its typical timing from a first-come-first-served assignment
    in start order (``starts``), one in first-byte order (``ends``) and one in the
    order the parents' requests ended (``rends``, only where some request of the parent
    group ended after it began): whichever makes its own offset the steadier is the
    pair's anchor (a token call goes out on arrival, or once the request's body is in;
    an origin's answer is relayed). ``parents``: per parent group, its requests that
    contain a candidate child (the gaps between them are what chance gives)."""
    gaps_of: dict[tuple[Any, ...], tuple[float | None, float | None]] = {}
    rend_gaps: dict[tuple[Any, ...], float | None] = {}  # only groups with such estimates
    out: dict[tuple[Any, Any], _PairStats] = {}
    for pair in set(starts) | set(ends) | set(rends):
        a, b, r = starts.get(pair), ends.get(pair), rends.get(pair)
        pg = pair[0]
        got = gaps_of.get(pg)
        if got is None:  # per parent group, not per pair: a group is parent to many
            marked = parents.get(pg, ())
            got = gaps_of[pg] = (_median_gap(marked, _START), _median_gap(marked, _FB))
        ga, gb = got
        ca = a.iqr_so / max(ga or 0.0, 0.001) if a is not None else None
        cb = (b.iqr_eo / max(gb or 0.0, 0.001)
              if b is not None and b.iqr_eo is not None else None)
        gr = cr = None
        if r is not None:
            if pg not in rend_gaps:
                rend_gaps[pg] = _median_gap(parents.get(pg, ()), _REND)
            gr = rend_gaps[pg]
            cr = r.iqr_ro / max(gr or 0.0, 0.001)
        if cr is not None and all(c is None or cr <= REND_MARGIN * c for c in (ca, cb)):
            assert r is not None
            r.chosen, r.chance_ms = _REND, gr
            out[pair] = r
        elif cb is not None and (ca is None or cb < ca):
            assert b is not None
            b.chosen, b.chance_ms = _FB, gb
            out[pair] = b
        elif a is not None:
            a.chosen, a.chance_ms = _START, ga
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
    anchors = {k: st.anchor for k, st in stats.items()}
    return {gk: _assign(lst, second, anchors) for gk, lst in by_gk.items()}


def _keep_anchors(new: dict[tuple[Any, Any], _PairStats],
                  old: Mapping[tuple[Any, Any], _PairStats]) -> dict[tuple[Any, Any], _PairStats]:
    for k, st in new.items():
        if k in old:
            st.chosen, st.chance_ms = old[k].chosen, old[k].chance_ms
    return new


def _pair_stats(matchings: Mapping[tuple[Any, Any], dict[int, _Edge]]
                ) -> dict[tuple[Any, Any], _PairStats]:
    by_pair: dict[tuple[Any, Any], list[_Edge]] = defaultdict(list)
    for m in matchings.values():
        for e in m.values():
            if not e.rid:
                by_pair[(e.pgroup, e.cgroup)].append(e)
    return {k: _stats(v) for k, v in by_pair.items()}


def _same_links(a: dict[int, _Edge], b: dict[int, _Edge]) -> bool:
    """Two assignments (child node id -> link) that took the very same links."""
    if len(a) != len(b):
        return False
    return all(b.get(k) is e for k, e in a.items())


def _same_stats(done: Mapping[tuple[Any, Any], _PairStats], pair: tuple[Any, Any]
                ) -> dict[tuple[Any, Any], _PairStats]:
    """What :func:`_pair_stats` gives ``pair`` for the links whose statistics are
    ``done[pair]`` (none where it has none): a copy of them."""
    st = done.get(pair)
    if st is None:
        return {}
    return {pair: _PairStats(st.n, st.med_so, st.iqr_so, st.med_eo, st.iqr_eo, st.low_eo,
                             st.med_slack, st.address_share, st.med_ro, st.iqr_ro,
                             st.chosen, st.chance_ms)}


def _levels(vals: list[int], take: Callable[[int, int], int]) -> list[list[int]]:
    """``take`` (max or min) of ``vals`` over aligned blocks of 1, 2, 4, 8, ... values:
    ``levels[L][b]`` covers ``vals[b << L:(b + 1) << L]``."""
    levels = [vals]
    while len(levels[-1]) > 1:
        prev = levels[-1]
        nxt = [take(x, y) for x, y in zip(prev[::2], prev[1::2], strict=False)]
        if len(prev) & 1:
            nxt.append(prev[-1])
        levels.append(nxt)
    return levels


@dataclass(slots=True)
class _Order:
    """Parents in one order (by start, or by first byte), with the ends of their windows
    (and their starts) in that order, aggregated over aligned blocks: a walk for the
    next parent that can contain a child skips a block of parents that all ended too
    early (or began too late) at once, so it costs O(log n), not the requests in
    between (:meth:`before`, :meth:`after`)."""

    keys: list[int]
    pos: list[int] | None
    """Position in :attr:`_Parents.lst` of each (None: the same)."""
    max_end: list[list[int]]
    min_start: list[list[int]] | None
    """None where the order is by start (its range already bounds the start)."""
    steps: int = 0
    """Blocks and parents the walks looked at (a debug statistic)."""

    @classmethod
    def of(cls, keys: list[int], pos: list[int] | None, ends: list[int],
           starts: list[int] | None) -> _Order:
        return cls(keys, pos, _levels(ends, max),
                   None if starts is None else _levels(starts, min))

    def _fits(self, level: int, b: int, end: int, start: int) -> bool:
        """Some parent of block ``b`` of the level may contain the child."""
        return self.max_end[level][b] >= end and (
            self.min_start is None or self.min_start[level][b] <= start)

    def before(self, i: int, lo: int, end: int, start: int) -> int:
        """The last index from ``i`` down to ``lo`` whose parent's window lasts until
        ``end`` and that began by ``start``; ``lo - 1`` where none does."""
        top = len(self.max_end)
        while i >= lo:
            self.steps += 1
            level = 0
            while level + 1 < top and not (i + 1) & ((2 << level) - 1) \
                    and not self._fits(level + 1, ((i + 1) >> (level + 1)) - 1, end, start):
                level += 1
            if level:
                i -= 1 << level
            elif self._fits(0, i, end, start):
                return i
            else:
                i -= 1
        return lo - 1

    def after(self, i: int, hi: int, end: int, start: int) -> int:
        """The first index from ``i`` up to ``hi - 1`` whose parent's window lasts until
        ``end`` and that began by ``start``; ``hi`` where none does."""
        top = len(self.max_end)
        while i < hi:
            self.steps += 1
            level = 0
            while level + 1 < top and not i & ((2 << level) - 1) \
                    and not self._fits(level + 1, i >> (level + 1), end, start):
                level += 1
            if level:
                i += 1 << level
            elif self._fits(0, i, end, start):
                return i
            else:
                i += 1
        return hi


@dataclass(slots=True)
class _Parents:
    """Requests of one parent group (or of a subset of it), sorted by start (then
    connection id and index), with their windows' ends, and the same positions sorted by
    first byte (then start): what the walks of the first-come-first-served estimate and
    of the cheapest candidates bisect into."""

    lst: list[Node]
    starts: list[int]
    ends: list[int]
    """``window_end_ns`` of each."""
    longest: int
    """Longest window (end minus start): no request of the group contains a child that
    ends more than this after it began."""
    fb_pos: list[int]
    """Positions (in ``lst``) of the requests with a first byte, by first byte."""
    fbs: list[int]
    num: int = 0
    """The subset's number in its linker (the keys of :meth:`_Linker._every`)."""
    orders: tuple[_Order, _Order, _Order] | None = None
    """:attr:`by_start`, :attr:`by_fb` and :attr:`no_fb` once a walk for the cheapest
    candidates first needs them (the first estimates do not: the parents of a pair
    whose timing is chance never need them)."""
    rend_pos: list[int] | None = None
    """Positions (in ``lst``) by the request's last byte (then start), once needed
    (:meth:`rend_keys`)."""
    rends: list[int] | None = None
    """The requests' last bytes in that order."""
    rend_order: _Order | None = None
    """:attr:`by_rend` once a walk needs it."""

    @classmethod
    def of(cls, lst: list[Node], num: int = 0) -> _Parents:
        starts = [n.ts_ns for n in lst]
        ends = [n.window_end_ns for n in lst]
        longest = max((e - s for s, e in zip(starts, ends, strict=True)), default=0)
        fb_all = [n.fb_ns or 0 for n in lst]
        # positions listed in order, then a stable sort: by (first byte, position)
        fb_pos = [k for k, n in enumerate(lst) if n.fb_ns is not None]
        fb_pos.sort(key=fb_all.__getitem__)
        fbs = [fb_all[k] for k in fb_pos]
        return cls(lst, starts, ends, longest, fb_pos, fbs, num)

    def _orders(self) -> tuple[_Order, _Order, _Order]:
        got = self.orders
        if got is None:
            lst, starts, ends, fb_pos = self.lst, self.starts, self.ends, self.fb_pos
            nofb_pos = [k for k, n in enumerate(lst) if n.fb_ns is None]
            got = self.orders = (
                _Order.of(starts, None, ends, None),
                _Order.of(self.fbs, fb_pos, [ends[k] for k in fb_pos],
                          [starts[k] for k in fb_pos]),
                _Order.of([starts[k] for k in nofb_pos], nofb_pos,
                          [ends[k] for k in nofb_pos], None))
        return got

    @property
    def by_start(self) -> _Order:
        """All of them, by start."""
        return self._orders()[0]

    @property
    def by_fb(self) -> _Order:
        """Those with a first byte, by first byte."""
        return self._orders()[1]

    @property
    def no_fb(self) -> _Order:
        """Those without a first byte, by start."""
        return self._orders()[2]

    def rend_keys(self) -> tuple[list[int], list[int]]:
        """(positions in ``lst``, request ends) in the order the requests ended."""
        pos, keys = self.rend_pos, self.rends
        if pos is None or keys is None:
            rend_all = [n.rend_ns for n in self.lst]
            # a stable sort of the positions in order: by (request end, position)
            pos = self.rend_pos = sorted(range(len(rend_all)), key=rend_all.__getitem__)
            keys = self.rends = [rend_all[k] for k in pos]
        return pos, keys

    @property
    def by_rend(self) -> _Order:
        """All of them, by the request's last byte."""
        got = self.rend_order
        if got is None:
            pos, keys = self.rend_keys()
            got = self.rend_order = _Order.of(keys, pos, [self.ends[k] for k in pos],
                                              [self.starts[k] for k in pos])
        return got


class _PairCount:
    """A pair of groups being decided by :meth:`_Linker._hopeless_pairs`: the parent
    group's requests by start, and the children found inside one or not so far."""

    __slots__ = ("begun", "block_ends", "ends", "hits", "hopeless", "longest", "lst", "misses",
                 "pg", "starts")

    def __init__(self, pg: tuple[Any, ...], lst: list[Node], starts: list[int],
                 ends: list[int], block_ends: list[int], longest: int) -> None:
        self.pg = pg
        self.lst = lst
        self.starts = starts
        self.ends = ends
        self.block_ends = block_ends
        self.longest = longest
        self.hits = 0
        self.misses = 0
        self.hopeless = False
        self.begun = 0
        """How many parents began by the last child's start (the children come in order
        of start, so this only moves forward)."""


_NEAR: Final = 8
"""Parents :func:`_holds_other` tries one by one before it bisects for the oldest that
can hold the child."""


def _holds_other(pc: _PairCount, u_ts: int, u_end: int, uc: Connection) -> bool:
    """A request of the parent group, on another connection to another server, whose
    window holds ``[u_ts, u_end]`` (the newest :data:`MAX_SCAN` that began by
    ``u_ts``; walked by :func:`_next_ending` without a generator: this runs per child
    and parent group). The children of a pair come in order of start (``u_ts``): the
    parents begun by then are counted on from the last child's, not bisected for."""
    starts, ends, block_ends, lst = pc.starts, pc.ends, pc.block_ends, pc.lst
    hi = pc.begun
    n = len(starts)
    while hi < n and starts[hi] <= u_ts:
        hi += 1
    pc.begun = hi
    server = uc.server
    # the newest few first, before the lower bound is looked up: a window that holds the
    # child ends at u_end or later, so it began at u_end - longest or later (at lo or
    # above) whatever lo is; in busy traffic the newest parent usually holds it
    k = hi - 1
    near = max(hi - _NEAR, 0)
    while k >= near:
        if ends[k] >= u_end:
            p = lst[k]
            if p.conn is not uc and p.server != server:
                return True
        k -= 1
    lo = _at(starts, u_end - pc.longest)
    stop = max(lo, hi - MAX_SCAN)
    k = _next_ending(ends, block_ends, near - 1, stop, u_end)
    while k >= stop:
        p = lst[k]
        if p.conn is not uc and p.server != server:
            return True
        k = _next_ending(ends, block_ends, k - 1, stop, u_end)
    return False


def _find(nxt: list[int], i: int) -> int:
    """The first position from ``i`` on not yet removed (``nxt`` links removed positions
    onwards; path compression keeps the walks short)."""
    root = i
    while nxt[root] != root:
        root = nxt[root]
    while nxt[i] != root:
        nxt[i], i = root, nxt[i]
    return root


def _containing_counts(sub: _Parents, queries: Sequence[tuple[int, int]]) -> list[int]:
    """For each ``(start, end)``: how many requests of ``sub`` began at or before
    ``start`` and whose window lasts until ``end`` or later (a Fenwick tree over the
    windows' ends, queries in start order: O((n + q) log n))."""
    ranks = sorted(set(sub.ends))
    size = len(ranks)
    tree = [0] * (size + 1)
    out = [0] * len(queries)
    k = 0
    for q in sorted(range(len(queries)), key=lambda q: queries[q][0]):
        ts, end = queries[q]
        while k < len(sub.lst) and sub.starts[k] <= ts:
            i = bisect_left(ranks, sub.ends[k]) + 1
            while i <= size:
                tree[i] += 1
                i += i & -i
            k += 1
        i, before = bisect_left(ranks, end), 0
        while i > 0:
            before += tree[i]
            i -= i & -i
        out[q] = k - before
    return out


class _Linker:
    """Builds the candidate graph and runs the assignment (see the module docstring)."""

    def __init__(self, nodes: list[Node], trusted: set[str],
                 hop_order: Mapping[str, Sequence[str]]) -> None:
        self.nodes = nodes
        self.trusted = trusted
        self.hop_order = {k: list(v) for k, v in hop_order.items()}
        self.median_wait: dict[tuple[Any, ...], int] = {}
        """Median time to first byte per group (ns)."""
        self.clients: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        """Client addresses per group."""
        self.servers: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        """Server addresses per group."""
        self.considered: set[tuple[Any, Any]] = set()
        """Pairs of groups that passed the pair tests (before the proxy share test)."""
        self.pairs_of: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], bool, bool, int]]] = {}
        """Per child group, its parent groups: (group, declared, hopeless, the parent
        group's slot: :meth:`slot` less the child's number)."""
        self.pair_info: dict[tuple[Any, Any], tuple[bool, bool]] = {}
        """Per pair of groups that may link: (declared by the hop order, hopeless)."""
        self.declared_pairs: set[tuple[Any, Any]] = set()
        """Pairs with a declared candidate (the hop order, or a parent a profile
        matched)."""
        self.cap: dict[int, int] = {}
        """Per child and parent group (:meth:`slot`), its cap where doubled
        (:meth:`assign`)."""
        self.capped: set[int] = set()
        """Children and parent groups (:meth:`slot`) the cap may have decided in the last
        round."""
        self._group_slot: dict[tuple[Any, ...], int] = {}
        self._slot_group: list[tuple[Any, ...]] = []
        """The groups by number (:meth:`slot`)."""
        self.stepped = 0
        self.weighed = 0
        self._groups: dict[tuple[Any, ...], list[Node]] = {}
        self._subsets: dict[tuple[Any, ...], _Parents] = {}
        self._rid_index: dict[str, tuple[list[Node], list[int], list[int], list[int]]] = {}
        self._edges: dict[int, _Edge | None] = {}
        """Candidate links built, by ``parent.num * len(nodes) + child.num``."""
        self.built = 0
        """Candidate links built (one dropped by :meth:`forget_unweighed` and needed
        again counts twice)."""
        self._every_cache: dict[int, int] = {}
        """Per child and subset of parents (the subset's number in the bits above the
        child's, as in :meth:`slot`), a cap its containing parents exceed."""
        self._subsets_made = 0
        self._estimates_run = 0
        """First estimates run so far (:attr:`Node.taken_in`)."""
        # one tuple per distinct group and kind, shared by the nodes (dictionary keys
        # then compare by identity first)
        shared: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        last_conn: Connection | None = None
        client_ip = server_ip = ""
        for num, n in enumerate(nodes):
            n.num = num
            if n.conn is not last_conn:  # once per run of one connection's requests
                last_conn = n.conn
                client_ip, server_ip = _host(last_conn.client), _host(last_conn.server)
            n.client_ip, n.server_ip = client_ip, server_ip
            g = self._group_of(n)
            n.group = shared.setdefault(g, g)
            if n.group not in self._group_slot:
                self._group_slot[n.group] = len(self._slot_group) << _SLOT_BITS
                self._slot_group.append(n.group)
            k = self._kind_of(n)
            n.kind = shared.setdefault(k, k)
            n.rid = request_id(n.req)
            n.resp = is_resp(n.conn, n.req)

    def left_out_of(self, u: Node, pg: tuple[Any, ...]) -> tuple[float, int, bool, float] | None:
        """Of child ``u`` and parent group ``pg``, in the last round: (lower bound of the
        cost of the candidates it left out, candidates costed, all of them, where the
        dearer half of those kept begins: infinity where all were kept, and never read
        then); None where the round weighed none of them (:attr:`Node.left_out`)."""
        lo = u.left_out
        if lo is None:
            return None
        pairs = self.pairs_of[u.group]
        for j in range(len(pairs)):
            if pairs[j][0] == pg:
                return lo[j]
        return None

    def _put_left_out(self, u: Node, j: int,
                      value: tuple[float, int, bool, float] | None) -> None:
        """Set what ``u`` left out with its ``j``-th parent group (None: nothing
        weighed)."""
        lo = u.left_out
        if lo is None:
            if value is None:
                return
            lo = u.left_out = [None] * len(self.pairs_of[u.group])
        lo[j] = value

    def slot(self, u: Node, pg: tuple[Any, ...]) -> int:
        """The integer that stands for child ``u`` and parent group ``pg`` in the maps of
        the assignment: one int instead of a tuple, so no tuple is built per lookup and
        the group's tuple is not hashed again each time."""
        return self._group_slot[pg] | u.num

    def _of_slot(self, key: int) -> tuple[Node, tuple[Any, ...]]:
        """The child and parent group of a :meth:`slot`."""
        return self.nodes[key & _SLOT_MASK], self._slot_group[key >> _SLOT_BITS]

    @staticmethod
    def _group_of(n: Node) -> tuple[Any, ...]:
        p = n.conn.path
        if p is not None and not p.get("inferred"):
            return ("hop", p["name"], p["hop"])
        return ("server", n.server)

    @staticmethod
    def _kind_of(n: Node) -> tuple[Any, ...]:
        p = n.conn.path
        if p is not None and not p.get("inferred"):
            return ("hop", p["name"], p["hop"])
        return ("resp" if is_resp(n.conn, n.req) else "http", split_endpoint(n.server)[1])

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

    def _by_start(self) -> list[Node]:
        """The nodes by (start, connection, index): placed by their first rank
        (:func:`_set_ranks` numbers that order 0 to n - 1), not sorted."""
        nodes = self.nodes
        out = list(nodes)
        for n in nodes:
            out[n.ranks[0]] = n
        return out

    def prepare(self) -> None:
        """Groups and their indexes, and per child group the parent groups it may link to
        (decided once per pair of groups; pairs no statistic could accept are marked
        hopeless: only links by equal request ids are built for them)."""
        by_start = self._by_start()
        groups: dict[tuple[Any, ...], list[Node]] = {}
        for n in self.nodes:  # the groups in the order of their first node
            if not n.resp and n.group not in groups:
                groups[n.group] = []
        for n in by_start:  # each group's nodes by (start, connection, index)
            if not n.resp:
                groups[n.group].append(n)
        waits: dict[tuple[Any, ...], list[int]] = defaultdict(list)
        for n in self.nodes:
            if n.wait_ns is not None:
                waits[n.group].append(n.wait_ns)
        self.median_wait = {g: sorted(w)[len(w) // 2] for g, w in waits.items()}
        for n in self.nodes:
            g = n.group
            self.clients[g].add(n.client_ip)
            self.servers[g].add(n.server_ip)
        index: dict[tuple[Any, ...], tuple[list[Node], list[int], list[int], list[int], int]] = {}
        for g, lst in groups.items():
            ends = [n.window_end_ns for n in lst]
            index[g] = (lst, [n.ts_ns for n in lst], ends, _block_ends(ends),
                        max(e - n.ts_ns for n, e in zip(lst, ends, strict=True)))
        self._groups = groups
        by_rid: dict[str, list[Node]] = defaultdict(list)
        for n in by_start:  # each id's nodes by (start, connection, index)
            r = n.rid
            if r is not None and not n.resp:
                by_rid[r].append(n)
        for n in self.nodes:
            if n.resp and n.req.named_ids is not None:
                n.rid = _named_id(n.req.named_ids, by_rid)
        for r, lst in by_rid.items():
            ends = [n.window_end_ns for n in lst]
            self._rid_index[r] = (lst, [n.ts_ns for n in lst], ends, _block_ends(ends))
        parents_of: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, pgs in self._overlapping_groups(index).items():
            parents_of[cg] = [(pg, declared, *index[pg]) for pg in pgs
                              for ok, declared in (self._allowed(pg, cg),) if ok]
        hopeless = self._hopeless_pairs(parents_of, by_start)
        for cg, parents in parents_of.items():
            self.pairs_of[cg] = [(e[0], e[1], (e[0], cg) in hopeless, self._group_slot[e[0]])
                                 for e in parents]
            for pg, declared, dead, _slot in self.pairs_of[cg]:
                self.pair_info[(pg, cg)] = (declared, dead)

    def _subset(self, pg: tuple[Any, ...], trusted_only: bool, without_id: bool) -> _Parents:
        """The requests of a parent group, all or only those on connections a profile
        matched, all or only those without a request id (the candidates of a child that
        carries one, beside its equal ids)."""
        key = (pg, trusted_only, without_id)
        sub = self._subsets.get(key)
        if sub is None:
            lst = [n for n in self._groups.get(pg, ())
                   if (not trusted_only or n.conn_id in self.trusted)
                   and (not without_id or n.rid is None)]
            sub = self._subsets[key] = _Parents.of(lst, self._subsets_made)
            self._subsets_made += 1
        return sub

    def _same_rid(self, u: Node) -> tuple[Node, ...]:
        """The requests with the child's request id that contain it, of every group, in
        start order: however far back they began (the newest :data:`MAX_SCAN` that began
        before it: an id repeated without end costs no more). Kept on the node as one
        tuple, not a map of lists per group: most children have one such parent, and
        every child of a capture with request ids has its own (the lab capture with its
        key log at 1M packets, compiled: 13-20 MiB less at the peak than a map per
        child)."""
        got = u.same_rid
        if got is not None:
            return got
        urid = u.rid
        if urid is None or urid not in self._rid_index:
            u.same_rid = _NO_SAME
            return _NO_SAME
        found: list[Node] = []
        same, starts, ends, blocks = self._rid_index[urid]
        top = _after(starts, u.ts_ns)
        for k in _ending_after(ends, blocks, top, max(0, top - MAX_SCAN), u.end_ns):
            p = same[k]
            if self._contains(p, u):
                found.append(p)
        found.reverse()
        out = tuple(found) if found else _NO_SAME
        u.same_rid = out
        return out

    def _same_rid_in(self, u: Node, pg: tuple[Any, ...]) -> tuple[Node, ...]:
        """Those of :meth:`_same_rid` in the parent group ``pg``, in start order."""
        same = self._same_rid(u)
        n = len(same)
        if n == 0:
            return same
        if n == 1:
            return same if same[0].group == pg else _NO_SAME
        out = tuple([p for p in same if p.group == pg])
        return same if len(out) == n else out

    def _edge_of(self, p: Node, u: Node, pg: tuple[Any, ...], cg: tuple[Any, ...],
                 declared: bool) -> _Edge | None:
        """The candidate link ``p -> u``, built once (``p`` contains ``u``)."""
        key = p.num * len(self.nodes) + u.num
        e = self._edges.get(key, _NO_EDGE)
        if e is _NO_EDGE:
            e = self._edges[key] = self._edge(p, u, pg, cg, declared, u.rid)
            self.built += 1
        return e  # type: ignore[return-value]

    def forget_unweighed(self, weighed: Callable[[tuple[Any, Any]], bool]) -> None:
        """Drop what the first estimates built for pairs of groups whose candidates the
        rounds will not weigh (``weighed`` false: only request ids, or only parents a
        profile matched): their parent groups' sorted requests and their candidate links
        other than by request id or to such parents. Called between the first estimates
        and the first round, when nothing else holds them; anything needed again is
        built again the same (a direct-traffic capture's first estimates of pairs of
        busy servers are most of the linker's memory)."""
        kept = {pair[0] for pair in self.pair_info if weighed(pair)}
        for sub_key in [k for k in self._subsets if k[0] not in kept]:
            del self._subsets[sub_key]
        for edge_key in [k for k, e in self._edges.items()
                         if e is not None and not e.rid and not e.declared
                         and not weighed((e.pgroup, e.cgroup))]:
            del self._edges[edge_key]

    def _children_of_pairs(self) -> dict[tuple[Any, Any], list[Node]]:
        """Per pair of groups, the children that may have a candidate in it."""
        out: dict[tuple[Any, Any], list[Node]] = defaultdict(list)
        for u in self.nodes:
            cg = u.group
            urid = u.rid
            for pg, _declared, hopeless, _slot in self.pairs_of.get(cg, ()):
                if hopeless and (urid is None or not self._same_rid_in(u, pg)):
                    continue
                out[(pg, cg)].append(u)
        return out

    def first_estimates(self) -> dict[tuple[Any, Any], _PairStats]:
        """Per pair of groups, its typical timing from first-come-first-served
        assignments over every candidate (:func:`_estimates`); also finds the pairs
        that have a declared candidate (:attr:`declared_pairs`)."""
        # each estimate's links are read into the pair's statistics at once, not kept
        # for all pairs and orders (a child's link per order: the most this step holds)
        starts: dict[tuple[Any, Any], _PairStats] = {}
        ends: dict[tuple[Any, Any], _PairStats] = {}
        rends: dict[tuple[Any, Any], _PairStats] = {}
        parents: dict[tuple[Any, ...], dict[int, Node]] = defaultdict(dict)
        sent_later: dict[tuple[Any, ...], bool] = {}  # per parent group: a request ended late
        for pair, kids in self._children_of_pairs().items():
            # the order by start as a child is also the one by the parents' request end
            # (a child's anchor is its start in both): sorted once
            in_order = sorted(kids, key=lambda n: _rank(n, _START, True))
            by_start = self._fifo(pair, in_order, _START, ordered=True)
            starts.update(_pair_stats({pair: by_start}))
            # an order that took the same links has the same statistics: copied, not
            # computed again (each estimate's are its own object: one is chosen)
            by_fb = self._fifo(pair, kids, _FB)
            ends.update(_same_stats(starts, pair) if _same_links(by_start, by_fb)
                        else _pair_stats({pair: by_fb}))
            later = sent_later.get(pair[0])
            if later is None:
                later = sent_later[pair[0]] = any(
                    n.rend_ns != n.ts_ns for n in self._groups.get(pair[0], ()))
            if later:  # else its order and offsets are those by start
                by_rend = self._fifo(pair, in_order, _REND, ordered=True)
                rends.update(_same_stats(starts, pair) if _same_links(by_start, by_rend)
                             else _pair_stats({pair: by_rend}))
            marked = self._with_candidates(pair, kids)
            parents[pair[0]].update(marked)
            if marked and (self.pair_info[pair][0]
                           or any(p.conn_id in self.trusted for p in marked.values())):
                self.declared_pairs.add(pair)
        return _estimates(starts, ends, rends,
                          {g: list(d.values()) for g, d in parents.items()})

    def _fifo(self, pair: tuple[Any, Any], kids: list[Node], anchor: int,
              ordered: bool = False) -> dict[int, _Edge]:
        """First estimate, first come first served: each child in order takes the
        earliest free parent that contains it (an equal request id first) and that it
        does not follow after the parent's first byte. ``anchor`` :data:`_FB`: in the
        order of first bytes, parents answering after the child (an answer relayed);
        :data:`_REND`: in the order the parents' requests ended, before the child began
        (a call made once the body was in); else of starts (a call made on arrival).
        Parents taken, or whose window closed before every child still to come, are
        skipped once and for all (:func:`_find`). ``ordered``: ``kids`` are in the
        anchor's order as children already."""
        pg, cg = pair
        declared, hopeless = self.pair_info[pair]
        end = anchor == _FB
        if end:
            kids = [u for u in kids if u.fb_ns is not None]
        if not ordered:
            kids = sorted(kids, key=lambda n: _rank(n, anchor, True))
        self._estimates_run += 1
        used = self._estimates_run  # the parents taken: ``taken_in`` equal to it
        future = [0] * len(kids)  # the least end of the children from this one on
        least = None
        for i in range(len(kids) - 1, -1, -1):
            e_ns = kids[i].end_ns
            least = e_ns if least is None or e_ns < least else least
            future[i] = least
        links: dict[bool, tuple[_Parents, list[int]]] = {}
        taken: dict[int, _Edge] = {}
        for i, u in enumerate(kids):
            e = None
            with_id = u.rid is not None
            if with_id:
                same: Sequence[Node] = self._same_rid_in(u, pg)
                if end:
                    same = sorted((p for p in same if p.fb_ns is not None),
                                  key=lambda p: _rank(p, _FB))
                elif anchor == _REND:
                    same = sorted(same, key=lambda p: _rank(p, _REND))
                for p in same:
                    if p.taken_in == used:
                        continue
                    cand = self._edge_of(p, u, pg, cg, declared)
                    if cand is None or cand.base >= _LATE_PENALTY_MS or (
                            end and (cand.eo is None or cand.eo < 0)) or (
                            anchor == _REND and cand.ro < 0):
                        continue
                    e = cand
                    break
            if e is None and not hopeless:
                got = links.get(with_id)
                if got is None:
                    sub = self._subset(pg, False, with_id)
                    got = links[with_id] = (sub, list(range(
                        (len(sub.fb_pos) if end else len(sub.lst)) + 1)))
                sub, nxt = got
                if end:
                    e = self._fifo_by_end(u, sub, nxt, used, pair, declared)
                elif anchor == _REND:
                    rend_pos, rends = sub.rend_keys()
                    e = self._fifo_in(u, sub, rend_pos, rends, nxt, used, future[i], pair,
                                      declared)
                else:
                    e = self._fifo_in(u, sub, None, sub.starts, nxt, used, future[i], pair,
                                      declared)
            if e is not None:
                taken[id(u)] = e
                e.parent.taken_in = used
        return taken

    def _fifo_in(self, u: Node, sub: _Parents, pos: list[int] | None, keys: list[int],
                 nxt: list[int], used: int, closed: int, pair: tuple[Any, Any],
                 declared: bool) -> _Edge | None:
        """The first free parent that contains ``u`` in the order ``keys`` (the starts,
        ``pos`` None; or the request ends, ``pos`` their places in ``sub.lst``), among
        those whose key is at most the child's start."""
        u_ts, u_end, server = u.ts_ns, u.end_ns, u.server
        starts, ends, lst = sub.starts, sub.ends, sub.lst
        hi = _after(keys, u_ts)
        j = _find(nxt, _at(keys, u_end - sub.longest))
        stepped = 0
        while j < hi:
            k = j if pos is None else pos[j]
            p = lst[k]
            if p.taken_in == used or ends[k] < closed:
                nxt[j] = j + 1
            else:
                if ends[k] >= u_end and starts[k] <= u_ts and p.server != server:
                    e = self._edge_of(p, u, pair[0], pair[1], declared)
                    if e is not None and e.base < _LATE_PENALTY_MS:
                        self.stepped += stepped
                        return e
                stepped += 1
                if stepped > MAX_SCAN:
                    break
            j = _find(nxt, j + 1)
        self.stepped += stepped
        return None

    def _fifo_by_end(self, u: Node, sub: _Parents, nxt: list[int], used: int,
                     pair: tuple[Any, Any], declared: bool) -> _Edge | None:
        u_ts, u_end, server, u_fb = u.ts_ns, u.end_ns, u.server, u.fb_ns
        assert u_fb is not None
        top = _after(sub.fbs, u_ts + sub.longest)
        j = _find(nxt, _at(sub.fbs, u_fb))
        stepped = 0
        while j < top:
            k = sub.fb_pos[j]
            p = sub.lst[k]
            if p.taken_in == used:
                nxt[j] = j + 1
            else:
                if sub.starts[k] <= u_ts and sub.ends[k] >= u_end and p.server != server:
                    e = self._edge_of(p, u, pair[0], pair[1], declared)
                    if e is not None and e.base < _LATE_PENALTY_MS:
                        self.stepped += stepped
                        return e
                stepped += 1
                if stepped > MAX_SCAN:
                    break
            j = _find(nxt, j + 1)
        self.stepped += stepped
        return None

    def _with_candidates(self, pair: tuple[Any, Any], kids: list[Node]) -> dict[int, Node]:
        """The parents of the pair that contain at least one of its children (a
        candidate link), found per parent through the children's least end from each
        start on."""
        pg, _cg = pair
        hopeless = self.pair_info[pair][1]
        marked: dict[int, Node] = {}
        for u in kids:
            for p in self._same_rid_in(u, pg):
                marked[id(p)] = p
        if hopeless:
            return marked
        plain = [u for u in kids if u.rid is None]
        with_id = [u for u in kids if u.rid is not None]
        for children, parents in ((plain, self._subset(pg, False, False).lst),
                                  (with_id, self._subset(pg, False, True).lst)):
            if not children or not parents:
                continue
            children = sorted(children, key=lambda n: n.ts_ns)
            kts = [n.ts_ns for n in children]
            least: list[int] = [0] * len(children)
            arg: list[int] = [0] * len(children)
            for i in range(len(children) - 1, -1, -1):
                e_ns = children[i].end_ns
                if i + 1 < len(children) and least[i + 1] <= e_ns:
                    least[i], arg[i] = least[i + 1], arg[i + 1]
                else:
                    least[i], arg[i] = e_ns, i
            # the parents come in start order (:meth:`prepare`), so the first child that
            # began at or after each one's start only moves forward: no bisection each
            i = 0
            n_kids = len(kts)
            for p in parents:
                p_ts = p.ts_ns
                while i < n_kids and kts[i] < p_ts:
                    i += 1
                w_end = p.window_end_ns
                if id(p) in marked or i == n_kids or least[i] > w_end:
                    continue
                server = p.server
                if children[arg[i]].server != server or any(
                        u.end_ns <= w_end and u.server != server
                        for u in children[i:i + MAX_SCAN]):
                    marked[id(p)] = p
        return marked

    def assign(self, stats: Mapping[tuple[Any, Any], _PairStats],
               mode: Callable[[tuple[Any, Any]], str], *, by_kind: bool = True,
               second: bool = False
               ) -> tuple[dict[tuple[Any, Any], dict[int, _Edge]], list[_Edge]]:
        """One round of the assignment (:func:`_matching`) over the candidate links of
        :meth:`_links`, and those links. Where the cap may have decided the answer (a
        child left without a link, or linked to the dearer half of the candidates kept
        for it, while some were left out) its cap is doubled and its assignment run
        again, up to :data:`MAX_CANDIDATES_DEEP`; a child still so at that cap is marked
        (:attr:`capped`: its link is ambiguous)."""
        lists: list[list[_Edge]] = []
        pairs_of = self.pairs_of
        # how each pair is linked this round, asked once per pair rather than per child
        hows = {cg: ["rid" if hopeless else mode((pg, cg))
                     for pg, _declared, hopeless, _slot in pairs]
                for cg, pairs in pairs_of.items()}
        for u in self.nodes:
            pairs = pairs_of.get(u.group)
            if not pairs:
                continue
            how_of = hows[u.group]
            no_id = u.rid is None
            num = u.num
            for j, (pg, declared, hopeless, slot) in enumerate(pairs):
                if hopeless and no_id:  # no link to weigh (:meth:`_links`)
                    continue
                key = slot | num
                kept = self._links(u, pg, key, j, declared, hopeless, how_of[j], stats)
                assert kept is not None  # None only where hopeless without an id
                lists.append(kept)
        edges = [e for lst in lists for e in lst]
        self.weighed += len(edges)
        matchings = _matching(edges, stats, second, by_kind)
        where: dict[int, int] | None = None
        while True:
            deep: list[tuple[int, int]] = []  # (slot, place in the child's pairs_of)
            for u in self.nodes:
                lo = u.left_out
                if lo is None:
                    continue
                pairs = pairs_of[u.group]
                for j in range(len(lo)):
                    entry = lo[j]
                    if entry is None or entry[2]:
                        continue
                    pg = pairs[j][0]
                    gk = (pg, u.kind if by_kind else u.group)
                    e = matchings.get(gk, {}).get(id(u))
                    if e is None or (not e.rid and e.cost >= entry[3]):
                        deep.append((pairs[j][3] | u.num, j))
            self.capped = {k for k, _j in deep if self.cap.get(k, MAX_CANDIDATES)
                           >= MAX_CANDIDATES_DEEP}
            if len(self.capped) == len(deep):
                return matchings, edges
            redo: set[tuple[Any, Any]] = set()
            if where is None:
                where = self._list_places()
            for key, j in deep:
                if key in self.capped:
                    continue
                u, pg = self._of_slot(key)
                self.cap[key] = 2 * self.cap.get(key, MAX_CANDIDATES)
                declared, hopeless = self.pair_info[(pg, u.group)]
                kept = self._links(u, pg, key, j, declared, hopeless,
                                   "rid" if hopeless else mode((pg, u.group)), stats)
                assert kept is not None
                i = where[key]
                self.weighed += len(kept) - len(lists[i])
                lists[i] = kept
                redo.add((pg, u.kind if by_kind else u.group))
            edges = [e for lst in lists for e in lst]
            matchings.update(_matching(
                [e for e in edges if (e.pgroup, e.kind if by_kind else e.cgroup) in redo],
                stats, second, by_kind))

    def _list_places(self) -> dict[int, int]:
        """The place of each child and parent group (:meth:`slot`) in a round's lists of
        links (:meth:`assign` makes one list per pair it visits, in this order)."""
        where: dict[int, int] = {}
        for u in self.nodes:
            pairs = self.pairs_of.get(u.group)
            if not pairs:
                continue
            no_id = u.rid is None
            for _pg, _declared, hopeless, slot in pairs:
                if not (hopeless and no_id):
                    where[slot | u.num] = len(where)
        return where

    def _links(self, u: Node, pg: tuple[Any, ...], key: int, j: int, declared: bool,
               hopeless: bool, how: str, stats: Mapping[tuple[Any, Any], _PairStats]
               ) -> list[_Edge] | None:
        """The candidate links of one child in one parent group that a round weighs:
        the parents with the child's request id and its cheapest others under ``stats``
        (:meth:`_cheapest`, as many as its cap), newest parent first; None where the
        pair has none to weigh (hopeless, and the child has no id); :data:`_NO_LINKS`
        where the round links the pair by ids only and no parent carries the child's.
        ``key`` is the child's and group's :meth:`slot`, ``j`` the group's place in the
        child group's :attr:`pairs_of`; ``how`` the pair's mode this round: ``all`` its
        candidates, ``trusted`` only parents a profile matched, ``rid`` only equal
        request ids (``rid`` where hopeless)."""
        urid = u.rid
        if hopeless and urid is None:
            return None
        cg = u.group
        store = u.kept  # never an ids-only round's: _same_rid and _edge_of keep those
        hit = store[j] if store is not None else None
        if hit is not None and hit[0] == how:  # the same links as an earlier round
            _how, was_kept, met = hit
            self._put_left_out(u, j, _all_kept(met))
            return was_kept
        kept = [e for p in (self._same_rid_in(u, pg) if urid is not None else ())
                if (e := self._edge_of(p, u, pg, cg, declared)) is not None]
        every: list[_Edge] | None = None
        if how == "rid":
            self._put_left_out(u, j, None)
            if not kept:
                return _NO_LINKS
        else:
            sub = self._subset(pg, how == "trusted", urid is not None)
            cap = self.cap.get(key, MAX_CANDIDATES)
            st = stats.get((pg, cg))
            every = self._every(u, sub, pg, cg, declared, cap)
            if every is not None:  # all its candidates fit the cap: no walk needed
                if kept:
                    kept += every
                else:  # one list for both (sorted below in place: ``every``'s order is
                    kept = every  # never read)
                self._put_left_out(u, j, _all_kept(len(every)))
            else:
                cheapest, bound, found, complete, half = self._cheapest(
                    u, sub, pg, cg, declared, st, cap)
                kept += cheapest
                self._put_left_out(u, j, (bound, found, complete, half))
        if len(kept) > 1:
            kept.sort(key=lambda e: e.parent.ranks[0], reverse=True)  # newest start first
        if every is not None:  # whatever the statistics: kept for later rounds
            if store is None:
                store = u.kept = [None] * len(self.pairs_of[cg])
            store[j] = (how, kept, len(every))  # the count, not the list: its links
            # are in ``kept``
        return kept

    def _every(self, u: Node, sub: _Parents, pg: tuple[Any, ...], cg: tuple[Any, ...],
               declared: bool, cap: int) -> list[_Edge] | None:
        """Every candidate link of the child in ``sub`` where the parents that contain it
        are at most ``cap`` (what :meth:`_cheapest` would return then, whatever the
        statistics: its walks meet them all, and none is left out), else None (the cap a
        count exceeded is kept: a later round does not count again below it)."""
        ckey = (sub.num << _SLOT_BITS) | u.num
        tried = self._every_cache.get(ckey)
        if tried is not None and tried >= cap:
            return None
        u_ts, u_end = u.ts_ns, u.end_ns
        starts, ends = sub.starts, sub.ends
        a = _at(starts, u_end - sub.longest)
        b = _after(starts, u_ts)
        ks: list[int] = []
        if b - a <= _SCAN_DIRECT:
            for k in range(b - 1, a - 1, -1):
                if ends[k] >= u_end:
                    if len(ks) >= cap:
                        self._every_cache[ckey] = cap
                        return None
                    ks.append(k)
        else:
            order = sub.by_start
            i = order.before(b - 1, a, u_end, u_ts)
            while i >= a:
                if len(ks) >= cap:
                    self._every_cache[ckey] = cap
                    return None
                ks.append(i)
                i = order.before(i - 1, a, u_end, u_ts)
        server = u.server
        lst = sub.lst
        out: list[_Edge] = []
        for k in ks:
            p = lst[k]
            if p.server == server:
                self.stepped += 1
                continue
            e = self._edge_of(p, u, pg, cg, declared)
            if e is not None:
                out.append(e)
        return out

    def _cheapest(self, u: Node, sub: _Parents, pg: tuple[Any, ...], cg: tuple[Any, ...],
                  declared: bool, st: _PairStats | None, cap: int
                  ) -> tuple[list[_Edge], float, int, bool, float]:
        """The child's ``cap`` cheapest candidates in ``sub`` under the pair's
        statistics ``st``: (them, a lower bound of the cost of every candidate left out,
        the candidates costed, whether that was all of them, the cost from which on the
        dearer half of those kept lies).

        The cost's main term is one offset's distance from the pair's typical one
        (:func:`_timing_cost`), and the offset is monotone in the parent's start (or
        first byte) on each stretch: so walking outwards from the typical offset in the
        parents sorted by it meets candidates in rising order of a lower bound of their
        cost (that distance less :data:`_ADDRESS_BONUS_MS`), and the walk stops when the
        bound reaches the dearest one kept. Parents that do not contain the child are
        skipped by blocks (:class:`_Order`); those on the child's own server are stepped
        over (at most :data:`MAX_SCAN`: a walk cut short leaves its bound at minus
        infinity, and the link is ambiguous)."""
        u_ts, u_end, u_fb, server = u.ts_ns, u.end_ns, u.fb_ns, u.server
        syn = u.syn_first_ns
        walks: list[list[Any]] = []  # [order, lo, hi, target, next left, next right]

        def walk(order: _Order, a: int, b: int, target: float) -> None:
            if a < b:
                m = bisect_left(order.keys, target, a, b)
                walks.append([order, a, b, target, order.before(m - 1, a, u_end, u_ts),
                              order.after(m, b, u_end, u_ts)])

        def by_start(order: _Order, typical_ns: float) -> None:
            keys = order.keys
            a = _at(keys, earliest)
            b = _after(keys, u_ts)
            # sent at the SYN, as the parents that began before it see it (_edge)
            if syn is not None:
                k = max(a, min(b, bisect_right(keys, syn, a, b)))
                walk(order, a, k, syn - typical_ns)
                walk(order, k, b, u_ts - typical_ns)
            else:
                walk(order, a, b, u_ts - typical_ns)

        earliest = u_end - sub.longest
        fbs = sub.fbs
        seen: set[int] | None = None
        if st is None:  # base + the smaller of the start offset and a positive end offset
            by_start(sub.by_start, 0.0)
            if u_fb is not None:
                walk(sub.by_fb, _at(fbs, u_fb), _after(fbs, u_ts + sub.longest),
                     float(u_fb))
            seen = set()
        elif (anchor := st.anchor) == _FB and u_fb is not None and st.med_eo is not None:
            walk(sub.by_fb, _at(fbs, earliest), _after(fbs, u_ts + sub.longest),
                 u_fb + st.med_eo * 1e6)
            by_start(sub.no_fb, st.med_so * 1e6)
        elif anchor == _REND:
            # by the parents' request ends, which no window bounds from above; sent at
            # the SYN as the parents that began before it see it (_edge): one walk for
            # each, and a parent met in both is costed once
            order = sub.by_rend
            a = _at(order.keys, earliest)
            b = len(order.keys)
            typical_ns = st.med_ro * 1e6
            walk(order, a, b, u_ts - typical_ns)
            if syn is not None:
                walk(order, a, b, syn - typical_ns)
                seen = set()
        else:
            by_start(sub.by_start, st.med_so * 1e6)
        heap: list[tuple[float, int, _Edge]] = []  # the dearest kept on top
        left_out = bound = inf = _INF
        found = stepped = 0
        cut = False
        while True:
            best, pick, right = inf, None, False
            for w in walks:
                if w[4] >= w[1]:
                    d = w[3] - w[0].keys[w[4]]
                    if d < best:
                        best, pick, right = d, w, False
                if w[5] < w[2]:
                    d = w[0].keys[w[5]] - w[3]
                    if d < best:
                        best, pick, right = d, w, True
            if pick is None:
                bound = inf
                break
            bound = best / 1e6 - _ADDRESS_BONUS_MS - 1e-6
            if len(heap) >= cap and bound >= -heap[0][0]:
                break
            order = pick[0]
            if right:
                i = pick[5]
                pick[5] = order.after(i + 1, pick[2], u_end, u_ts)
            else:
                i = pick[4]
                pick[4] = order.before(i - 1, pick[1], u_end, u_ts)
            k = i if order.pos is None else order.pos[i]
            p = sub.lst[k]
            if seen is not None:
                if id(p) in seen:
                    continue
                seen.add(id(p))
            if p.server == server:
                stepped += 1
                if stepped > MAX_SCAN:
                    cut = True
                    break
                continue
            e = self._edge_of(p, u, pg, cg, declared)
            if e is None:
                continue
            cost = _timing_cost(e, st)
            found += 1
            if len(heap) < cap:
                heappush(heap, (-cost, found, e))
            elif cost < -heap[0][0]:
                left_out = min(left_out, -heapreplace(heap, (-cost, found, e))[0])
            else:
                left_out = min(left_out, cost)
        self.stepped += stepped
        complete = pick is None and not cut
        costs = sorted(-x[0] for x in heap)
        return ([x[2] for x in heap], -_INF if cut else min(bound, left_out), found,
                complete, costs[len(costs) // 2] if costs else _INF)

    def rounds_done(self) -> None:
        """Drop what only the assignment rounds reuse (:meth:`_links`, :meth:`_every`):
        the last round has run, and the links are labelled next."""
        for n in self.nodes:
            n.kept = None
        self._every_cache.clear()

    def walked(self) -> int:
        """Steps of the walks for the cheapest candidates over blocks of parents."""
        return sum(o.steps for sub in self._subsets.values() for o in sub.orders or ())

    def link_of(self, p: Node, u: Node, stats: Mapping[tuple[Any, Any], _PairStats],
                mode: Callable[[tuple[Any, Any]], str]) -> _Edge | None:
        """The final round's candidate link ``p -> u``, costed, whether or not it was
        among the child's cheapest (None where it is no candidate there)."""
        pg, cg = p.group, u.group
        info = self.pair_info.get((pg, cg))
        if info is None or p.resp or not self._contains(p, u):
            return None
        declared, hopeless = info
        urid, prid = u.rid, p.rid
        if urid is not None and urid == prid:
            if p not in self._same_rid_in(u, pg):
                return None
        else:
            how = "rid" if hopeless else mode((pg, cg))
            if how == "rid" or (how == "trusted" and p.conn_id not in self.trusted):
                return None
        e = self._edge_of(p, u, pg, cg, declared)
        if e is not None:
            e.cost = _timing_cost(e, stats.get((pg, cg)))
        return e

    def candidate_counts(self, links: Sequence[_Edge],
                         mode: Callable[[tuple[Any, Any]], str]) -> list[int]:
        """Per final link, how many requests of its parent group could have caused the
        child under the final round's rules (equal ids, then containment): counted in
        the walk where it met them all, else over the group's requests
        (:func:`_containing_counts`)."""
        out = [0] * len(links)
        queries: dict[tuple[Any, ...], list[tuple[int, Node]]] = defaultdict(list)
        for q, e in enumerate(links):
            u, pg = e.child, e.pgroup
            urid = u.rid
            out[q] = len(self._same_rid_in(u, pg)) if urid is not None else 0
            info = self.pair_info[(pg, e.cgroup)]
            how = "rid" if info[1] else mode((pg, e.cgroup))
            if how == "rid":
                continue
            lo = self.left_out_of(u, pg)
            assert lo is not None
            _bound, found, complete, _half = lo
            if complete:
                out[q] += found
            else:
                queries[(pg, how == "trusted", urid is not None)].append((q, u))
        for key, qs in queries.items():
            sub = self._subset(*key)
            servers = {p.server for p in sub.lst}
            counts = _containing_counts(sub, [(u.ts_ns, u.end_ns) for _q, u in qs])
            for (q, u), n in zip(qs, counts, strict=True):
                if u.server in servers:  # a parent on the child's own server is none
                    n -= sum(1 for p in sub.lst if p.server == u.server
                             and p.ts_ns <= u.ts_ns and p.window_end_ns >= u.end_ns)
                out[q] += n
        return out

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
            cg = u.group
            span = spans.get(cg)
            if span is None:
                spans[cg] = [u.ts_ns, u.end_ns]
            else:
                if u.ts_ns > span[0]:
                    span[0] = u.ts_ns
                if u.end_ns < span[1]:
                    span[1] = u.end_ns
        found: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, (last_start, first_end) in spans.items():
            hi = _after(starts, last_start)
            pgs = [order[k] for k in _ending_after(ends, blocks, hi, 0, first_end)]
            pgs.sort(key=place.__getitem__)
            found[cg] = pgs
        return found

    def _hopeless_pairs(self, parents_of: Mapping[tuple[Any, ...], list[tuple[Any, ...]]],
                        by_start: list[Node]) -> set[tuple[Any, Any]]:
        """Pairs of groups that no statistic could accept, decided before any link is
        built (most pairs, in a capture of direct traffic): not declared, no parent a
        profile matched, no child sent from a parent's server address, and fewer child
        requests inside some parent request than :data:`PROXY_MIN_SHARE` of the child
        group. Such a pair can never be accepted (:meth:`accepted_pairs` wants that
        share of the child group linked, and a link needs a parent around the child),
        and its links would take part in no other pair's assignment; only links by equal
        request ids are still built for it. ``by_start``: the nodes by start
        (:meth:`_by_start`)."""
        sizes: dict[tuple[Any, ...], int] = defaultdict(int)
        for n in self.nodes:
            sizes[n.group] += 1
        trusted_groups = {n.group for n in self.nodes if n.conn_id in self.trusted}
        undecided: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for cg, parents in parents_of.items():
            senders = self.clients.get(cg, set())
            undecided[cg] = [entry for entry in parents
                             if not entry[1] and entry[0] not in trusted_groups
                             and not senders & self.servers.get(entry[0], set())]
        # each pair is decided as soon as its count of children inside a parent reaches
        # the share (it stays) or can no longer reach it (hopeless)
        need = {cg: PROXY_MIN_SHARE * sizes[cg] for cg in undecided}
        counts = {cg: [_PairCount(e[0], e[2], e[3], e[4], e[5], e[6]) for e in entries]
                  for cg, entries in undecided.items()}
        hopeless: set[tuple[Any, Any]] = set()
        # in order of start (:func:`_holds_other` counts on the parents begun); a pair's
        # verdict does not depend on the order: it stays once its children inside a
        # parent reach the share, which they do, in any order, unless it was hopeless
        for u in by_start:
            cg = u.group
            active = counts[cg]
            if not active:
                continue
            u_end, u_ts, uc = u.end_ns, u.ts_ns, u.conn
            need_cg, size_cg = need[cg], sizes[cg]
            decided = False
            for pc in active:
                if _holds_other(pc, u_ts, u_end, uc):
                    pc.hits += 1
                    decided = decided or pc.hits >= need_cg
                else:
                    pc.misses += 1
                    if size_cg - pc.misses < need_cg:
                        pc.hopeless = True
                        hopeless.add((pc.pg, cg))
                        decided = True
            if decided:
                counts[cg] = [pc for pc in active if not pc.hopeless and pc.hits < need_cg]
        return hopeless

    @staticmethod
    def _contains(p: Node, u: Node) -> bool:
        return (p.conn is not u.conn and p.server != u.server
                and p.ts_ns <= u.ts_ns and u.end_ns <= p.window_end_ns)

    def _edge(self, p: Node, u: Node, pg: tuple[Any, ...], cg: tuple[Any, ...],
              declared: bool, urid: str | None) -> _Edge | None:
        prid = p.rid
        rid = urid is not None and prid is not None
        if rid and urid != prid:
            return None  # both carry an id, and they differ
        pr, ur = p.req, u.req
        base = 0.0
        if pr.first_byte_ns is not None and ur.ts_ns >= pr.first_byte_ns:
            base += _LATE_PENALTY_MS
        if not u.resp:
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
        address = u.client_ip == p.server_ip
        if address:
            base -= _ADDRESS_BONUS_MS
        sent = u.syn_first_ns if u.syn_first_ns is not None and \
            u.syn_first_ns >= pr.ts_ns else ur.ts_ns
        so = (sent - pr.ts_ns) / 1e6
        eo = slack = None
        if pr.first_byte_ns is not None and ur.first_byte_ns is not None:
            eo = (pr.first_byte_ns - ur.first_byte_ns) / 1e6
            slack = ((pr.first_byte_ns - pr.ts_ns) - (ur.first_byte_ns - ur.ts_ns)) / 1e6
        return _Edge(p, u, pg, u.group, u.kind, rid, declared
                     or p.conn_id in self.trusted, address, base, so, eo, slack,
                     (sent - p.rend_ns) / 1e6)

    def accepted_pairs(self, stats: Mapping[tuple[Any, Any], _PairStats],
                       matchings: Mapping[tuple[Any, Any], dict[int, _Edge]],
                       declared: set[tuple[Any, Any]],
                       estimates: Mapping[tuple[Any, Any], _PairStats]
                       ) -> set[tuple[Any, Any]]:
        """Pairs of groups whose links stand: declared by the profile, or a proxy by the
        statistics (module docstring). The steadiness of a pair's timing is judged on
        the first-come-first-served estimate, which chose no link for its timing (the
        refined assignment picks links near the typical offset, so any pair would look
        steady there). ``declared``: the pairs with a declared candidate."""
        sizes: dict[tuple[Any, ...], int] = defaultdict(int)
        for n in self.nodes:
            sizes[n.group] += 1
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


def _innermost(options: list[_Edge], calls: set[tuple[Any, Any]], shared: set[int]
               ) -> _Edge:
    """Of a child's links through several hops, the one to its caller: the nearest hop
    whose own assignment gave it the child as its only call of the kind (a link through
    a hop that calls another option's hop, ``calls``, is the child's grand-caller's at
    best, even where the two parents' windows do not nest: two requests of different
    chains); ``shared``: ids of the links whose parent made another call of the kind.
    Then the innermost parent. A link by equal request id is never given up
    for one without."""
    options.sort(key=lambda e: (not e.rid, e.cost, -e.parent.ts_ns))
    nearest = [e for e in options if not any(
        o is not e and (e.pgroup, o.pgroup) in calls and (o.rid or not e.rid)
        and id(o) not in shared for o in options)]
    if nearest:
        options = nearest
    best = options[0]
    changed = True
    while changed:
        changed = False
        for e in options:
            p, b = e.parent, best.parent
            if p is not b and b.ts_ns <= p.ts_ns and p.window_end_ns <= b.window_end_ns \
                    and (b.ts_ns < p.ts_ns or p.window_end_ns < b.window_end_ns) \
                    and (e.rid or not best.rid):
                best, changed = e, True
    return best


def _loop_links(tied: dict[int, _Edge]) -> set[int]:
    """Ids of the links that close a loop of parents, one per loop. A parent starts no
    later than its child, so only requests that start at the same instant can form a
    loop (a crafted capture: groups whose waits cannot order them, windows that contain
    each other); ``tied`` holds those links by child id. Of each loop, the request with
    the widest window (then the first by key) loses its parent and becomes the root."""
    state: dict[int, bool] = {}  # child id -> on the path being walked (else done)
    cut: set[int] = set()
    for start in tied:
        path: list[int] = []
        k = start
        while k in tied and k not in state:
            state[k] = True
            path.append(k)
            k = id(tied[k].parent)
        if state.get(k):
            loop = [tied[c] for c in path[path.index(k):]]
            root = min(loop, key=lambda e: (-e.child.window_end_ns, e.child.key))
            cut.add(id(root))
        for c in path:
            state[c] = False
    return cut


def _label(e: _Edge, weighed: _Weighed, gk: tuple[Any, Any], count: int, left_out: float,
           link_of: Callable[[Node, Node], _Edge | None], anchor: int, jitter_ns: int) -> str:
    """The contract's link kind of a chosen edge. ``weighed``: the links the final
    round weighed, among them the child's candidates in the parent's group, and its
    assignments (``gk``: the one that chose ``e``); ``count`` all the candidates;
    ``left_out`` a lower bound of the cost of those it did not weigh. A swap with
    another parent's child that costs as little but puts the two out of order is no
    equal alternative (a proxy handles the requests of one connection first come, first
    served: order is evidence), unless the two parents came on different connections
    closer together than the pair's timing varies (``jitter_ns``, the spread of its
    steadier offset).

    Candidates left out are weighed too: one as cheap as the link makes it ambiguous;
    a swap through one needs the link's parent to cost another parent's child less than
    that child's own link, so it is among that child's cheapest candidates (the weighed
    links into the parent) and is found from there (``link_of`` builds the links not
    weighed)."""
    if e.rid:
        return "request-id"
    if count <= 1:
        return "unique"
    if left_out - e.cost < AMBIGUITY_MS:
        return "ambiguous"
    alts = weighed.alternatives(e.pgroup, e.child)
    child_of = weighed.child_of(gk)
    chosen = weighed.final[gk]

    def swap_fits(a: _Edge, other: _Edge) -> bool:
        swap = link_of(e.parent, other.child)
        if swap is None or swap.cost + a.cost - e.cost - other.cost >= AMBIGUITY_MS:
            return False
        pa, pe = _anchor_ns(a.parent, anchor), _anchor_ns(e.parent, anchor)
        ca, ce = _anchor_ns(other.child, anchor, True), _anchor_ns(e.child, anchor, True)
        # requests on one connection are handled in the order they came; on two, by
        # whichever worker took each, so arrival order is evidence only when they came
        # further apart than the pair's timing varies
        unordered = (a.parent.conn is not e.parent.conn and abs(pa - pe) <= jitter_ns)
        return (unordered or (ca == ce and other.child.conn is not e.child.conn)
                or not _in_order(e.parent, e.child, a.parent, other.child, anchor))

    for a in alts:
        if a is e or a.rid:
            continue
        other = child_of.get(id(a.parent))
        if other is None:
            if a.cost - e.cost < AMBIGUITY_MS:
                return "ambiguous"
            continue
        if swap_fits(a, other):
            return "ambiguous"
    if left_out < _INF:
        alt_parents = {id(a.parent) for a in alts}
        for s in weighed.into(e.parent):
            other = chosen.get(id(s.child))
            if other is None or other.parent is e.parent or id(other.parent) in alt_parents \
                    or child_of.get(id(other.parent)) is not other:
                continue
            alt = link_of(other.parent, e.child)
            if alt is not None and not alt.rid and swap_fits(alt, other):
                return "ambiguous"
    return "matched"


class _Weighed:
    """The links the final round weighed, indexed on first use: most links are
    labelled without an index (by request id, or the only candidate), and the three
    indexes of a big capture's links take tens of MiB."""

    def __init__(self, edges: list[_Edge],
                 final: Mapping[tuple[Any, Any], dict[int, _Edge]]) -> None:
        self.edges = edges
        self.final = final
        """The final round's assignments: per assignment, each child's link."""
        self._child_of: dict[tuple[Any, Any], dict[int, _Edge]] = {}
        self._alternatives: dict[tuple[Any, int], list[_Edge]] | None = None
        self._by_pair: dict[tuple[int, int], _Edge] | None = None
        self._into: dict[int, list[_Edge]] | None = None

    def alternatives(self, pgroup: tuple[Any, ...], child: Node) -> list[_Edge]:
        """The child's links into the parent group ``pgroup``."""
        index = self._alternatives
        if index is None:
            index = self._alternatives = defaultdict(list)
            for e in self.edges:
                index[(e.pgroup, id(e.child))].append(e)
        return index.get((pgroup, id(child)), [])

    def link(self, p: Node, u: Node) -> _Edge | None:
        """The weighed link ``p -> u``, if it was weighed."""
        index = self._by_pair
        if index is None:
            index = self._by_pair = {(id(e.parent), id(e.child)): e for e in self.edges}
        return index.get((id(p), id(u)))

    def child_of(self, gk: tuple[Any, Any]) -> dict[int, _Edge]:
        """Per parent, the link the assignment ``gk`` gave it."""
        got = self._child_of.get(gk)
        if got is None:
            got = self._child_of[gk] = {id(e.parent): e for e in self.final[gk].values()}
        return got

    def into(self, parent: Node) -> list[_Edge]:
        """The weighed links into ``parent``."""
        index = self._into
        if index is None:
            index = self._into = defaultdict(list)
            for e in self.edges:
                index[id(e.parent)].append(e)
        return index.get(id(parent), [])


class _Modes:
    """How each pair of server groups is linked in the rounds of :func:`link_requests`,
    and the final link between two requests."""

    def __init__(self, linker: _Linker, viable: set[tuple[Any, Any]]) -> None:
        self.linker = linker
        self.viable = viable
        self.keep: set[tuple[Any, Any]] = set()
        """Pairs whose statistics stand after the second round."""
        self.weighed: _Weighed = _Weighed([], {})
        self.stats: Mapping[tuple[Any, Any], _PairStats] = {}

    def refined(self, pair: tuple[Any, Any]) -> str:
        """Links declared, by id, or of viable pairs."""
        return "all" if pair in self.viable or self.linker.pair_info[pair][0] else "trusted"

    def weighs(self, pair: tuple[Any, Any]) -> bool:
        """The rounds may weigh every candidate of the pair (:meth:`refined` is ``all``,
        and the pair is not hopeless)."""
        return not self.linker.pair_info[pair][1] and self.refined(pair) == "all"

    def final_mode(self, pair: tuple[Any, Any]) -> str:
        """Links by id, or of pairs that stand."""
        return self.refined(pair) if pair in self.keep else "rid"

    def link_of(self, p: Node, u: Node) -> _Edge | None:
        e = self.weighed.link(p, u)
        return e if e is not None else self.linker.link_of(p, u, self.stats, self.final_mode)


def _first_request_index(conn: Connection) -> int | None:
    """The index of the connection's earliest request (the first of equal starts)."""
    reqs = conn.requests
    if not reqs:
        return None
    best, best_ts = 0, reqs[0].ts_ns
    for i in range(1, len(reqs)):
        ts = reqs[i].ts_ns
        if ts < best_ts:
            best, best_ts = i, ts
    return best


def _prepared_linker(conns: Sequence[Connection], trusted: Iterable[str] = (),
                     hop_order: Mapping[str, Sequence[str]] | None = None
                     ) -> tuple[dict[tuple[str, int], Node], _Linker]:
    """The requests of ``conns`` as nodes by key, and their linker prepared
    (:meth:`_Linker.prepare`), before its first estimates; ``trusted`` and
    ``hop_order`` as :func:`link_requests` takes them."""
    nodes: dict[tuple[str, int], Node] = {}
    for c in conns:
        for i, r in enumerate(c.requests):
            n = Node.of(c, i, r)
            nodes[n.key] = n
    for c in conns:
        first_index = _first_request_index(c)
        if first_index is not None and c.syn_ns is not None \
                and c.syn_ns <= c.requests[first_index].ts_ns:
            nodes[(c.id, first_index)].syn_first_ns = c.syn_ns
    _set_ranks(list(nodes.values()))
    linker = _Linker(list(nodes.values()), set(trusted), hop_order or {})
    linker.prepare()
    return nodes, linker


def link_requests(connections: Iterable[Connection], trusted: Iterable[str] = (),
                  hop_order: Mapping[str, Sequence[str]] | None = None) -> Chains:
    """Link every request to the request that caused it, where the capture shows one.

    ``trusted``: ids of connections whose upstream links need no proxy statistics (a
    profile matched them). ``hop_order``: per profile path, its hops client-facing
    first; connections a profile matched carry ``conn.path`` (``inferred`` false).
    """
    conns = [c for c in connections if c.requests]
    nodes, linker = _prepared_linker(conns, trusted, hop_order)
    estimates = linker.first_estimates()
    # pairs the statistics could never accept do not go through the refined rounds
    sizes: dict[tuple[Any, ...], int] = defaultdict(int)
    for n in nodes.values():
        sizes[n.group] += 1
    viable = {pair for pair, st in estimates.items()
              if st.address_share >= PROXY_MIN_SHARE * 0.5
              or (st.n >= COUPLED_MIN_PAIRS and st.coupling <= COUPLING_MAX
                  and st.n >= VIABLE_SHARE * sizes[pair[1]])}

    # the modes are methods of an object, not closures: compiled, closures and this
    # function's frame would form a reference cycle holding every link candidate until
    # the collector ran (48,000 objects, 44 MiB at 1M packets)
    modes = _Modes(linker, viable)
    linker.forget_unweighed(modes.weighs)
    first, _edges = linker.assign(estimates, modes.refined, by_kind=False)
    stats = _keep_anchors(_pair_stats(first), estimates)
    first.clear()  # the first round's links: read, not kept
    second, _edges = linker.assign(stats, modes.refined, by_kind=False)
    stats = _keep_anchors(_pair_stats(second), estimates)
    modes.keep = linker.accepted_pairs(stats, second, linker.declared_pairs, estimates)

    final, final_edges = linker.assign(stats, modes.final_mode, second=True)
    linker.rounds_done()

    weighed = _Weighed(final_edges, final)
    options: dict[int, list[_Edge]] = defaultdict(list)
    shared: set[int] = set()  # links whose parent made another call of the kind
    for m in final.values():
        again: set[int] = set()
        for e in m.values():  # parents marked as seen, as in _separate: no map of all
            options[id(e.child)].append(e)
            p = e.parent
            if p.as_parent:
                again.add(id(p))
            p.as_parent = True
        for e in m.values():
            e.parent.as_parent = False
        if again:
            shared.update(id(e) for e in m.values() if id(e.parent) in again)

    modes.weighed = weighed
    modes.stats = stats
    chosen = [_innermost(opts, modes.keep, shared) if len(opts) > 1 else opts[0]
              for opts in options.values()]
    tied = {id(e.child): e for e in chosen if e.parent.ts_ns == e.child.ts_ns}
    if tied:
        cut = _loop_links(tied)
        if cut:
            chosen = [e for e in chosen if id(e) not in cut]
    counts = linker.candidate_counts(chosen, modes.final_mode)
    for e, count in zip(chosen, counts, strict=True):
        u, p = e.child, e.parent
        gk = (e.pgroup, e.kind)
        st = stats.get((e.pgroup, e.cgroup))
        anchor = _START if st is None else st.anchor
        jitter = 0.0 if st is None else st.spread
        slot = linker.slot(u, e.pgroup)
        lo = linker.left_out_of(u, e.pgroup)
        left_out = -_INF if slot in linker.capped else _INF if lo is None else lo[0]
        u.link = _label(e, weighed, gk, count, left_out, modes.link_of, anchor,
                        round(jitter * 1e6))
        u.candidates = count
        u.parent = p
        u.from_parent_address = e.address
        if p.children is _NO_CHILDREN:
            p.children = [u]
        else:
            p.children.append(u)

    for c in conns:
        first_index = _first_request_index(c)
        if first_index is None or c.syn_ns is None:
            continue
        opener = nodes[(c.id, first_index)]
        caller = opener.parent
        if caller is not None and caller.ts_ns <= c.syn_ns <= opener.ts_ns:
            opener.opened = True

    for n in linker.nodes:  # the linker's caches on the nodes, not kept with the chains
        n.same_rid = None
        n.left_out = None
    return Chains(nodes, _proxy_evidence(nodes, second, linker.considered),
                  {"children": sum(1 for n in linker.nodes if linker.pairs_of.get(
                      n.group)),
                   "pairs_costed": linker.built,
                   "pairs_stepped_over": linker.stepped + linker.walked(),
                   "links_weighed": linker.weighed})


def _proxy_evidence(nodes: Mapping[tuple[str, int], Node],
                    matchings: Mapping[tuple[Any, Any], dict[int, _Edge]],
                    considered: set[tuple[Any, Any]]) -> dict[str, ProxyEvidence]:
    """Per server: how many of its requests contained an upstream request, from the
    links made, or for a server that was not taken for a proxy, from the assignment
    of the pairs that passed the pair tests."""
    totals: dict[str, int] = defaultdict(int)
    for n in nodes.values():
        totals[n.server] += 1
    followed: dict[str, set[tuple[str, int]]] = defaultdict(set)
    from_address: dict[str, set[tuple[str, int]]] = defaultdict(set)
    declared: set[str] = set()
    accepted: set[str] = set()
    for n in nodes.values():
        if not n.children:
            continue
        s = n.server
        accepted.add(s)
        followed[s].add(n.key)
        if any(c.from_parent_address for c in n.children):
            from_address[s].add(n.key)
        if n.conn.path is not None and not n.conn.path.get("inferred"):
            declared.add(s)
    for m in matchings.values():
        for e in m.values():
            s = e.parent.server
            if s in accepted or (e.pgroup, e.cgroup) not in considered:
                continue
            followed[s].add(e.parent.key)
            if e.address:
                from_address[s].add(e.parent.key)
    return {s: ProxyEvidence(s, len(k), totals[s], len(from_address[s]), s in declared,
                             s in accepted) for s, k in followed.items()}
