"""Hop chains: which upstream requests (and token-store commands) each request caused.

Where a capture sees several hops (taken on a proxy host, or on loopback in the lab),
a proxy's upstream request happens *inside* the request it serves. A request ``U`` on
connection ``CU`` is a candidate child of request ``P`` on another connection ``CP``
when:

* **time containment**: ``P.ts < U.ts`` and ``U`` ends (last byte, else first byte,
  else its start) no later than ``P``'s window ends (``P``'s last byte, else the end of
  ``CP`` when ``P``'s answer never ended in the capture);
* and **who sent it**: ``CU``'s client address is ``CP``'s server address (the proxy
  itself sent ``U``), or both carry the same request id header (``x-request-id``,
  ``x-correlation-id``, ``request-id``, or the trace id of ``traceparent``).

Children are placed in time order. Among a child's candidates the best parent is the
one with, in order: the same request id; the address relation (a request id is
forwarded through every hop: the parent is the hop that sent ``U``); ``U`` starting
before ``P``'s first byte (so
it is part of ``P``'s wait); the same request path; no child of the same kind yet (the
same profile hop, else the same protocol and server port: a proxy makes one call of
each kind per request); and the earliest start (a proxy forwards in arrival order).

An address-only link is accepted only when the parent's server is a *proxy*: at least
:data:`PROXY_MIN_SHARE` of at least :data:`PROXY_MIN_REQUESTS` of its requests contain
upstream requests from its address (``trusted`` connections, matched by a profile, need
no such consistency). That keeps a host that is both a server and, for unrelated
reasons, a client from being taken for a proxy.

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

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from netdiag.paths.profile import split_endpoint
from netdiag.records import Connection, Request

PROXY_MIN_SHARE = 0.8
"""Share of a server's requests that must contain upstream requests from its address
for it to be inferred to be a proxy."""
PROXY_MIN_REQUESTS = 3
"""Fewest requests a server must have served for it to be inferred to be a proxy."""
REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "request-id")
"""Request headers whose equal values tie an upstream request to its cause."""


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
    """Why it is linked to its parent: ``address`` (sent from the parent's server
    address, inside its time), ``request-id`` (same request id, inside its time) or
    ``address+request-id``."""
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
            "own_ms": _ms(self.own_ns), "in_ttfb": self.in_ttfb,
            "own_split_ms": None if self.parts_ns is None else {
                "before_calls": _ms(self.parts_ns[0]), "between_calls": _ms(self.parts_ns[1]),
                "after_calls": _ms(self.parts_ns[2])},
        }


@dataclass(slots=True)
class ProxyEvidence:
    """How consistently a server's requests contained upstream requests from it."""

    server: str
    followed: int
    total: int

    @property
    def is_proxy(self) -> bool:
        return (self.total >= PROXY_MIN_REQUESTS
                and self.followed >= PROXY_MIN_SHARE * self.total)

    @property
    def sentence(self) -> str:
        ip, _ = split_endpoint(self.server)
        return (f"{self.followed} of {self.total} requests to {self.server} were followed "
                f"by upstream requests from {ip}")


@dataclass
class Chains:
    """The call graph of one capture's requests."""

    nodes: dict[tuple[str, int], Node]
    proxies: dict[str, ProxyEvidence]
    """Per server endpoint that had address-related candidate children."""

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


@dataclass(slots=True)
class _Cand:
    parent: Node
    address: bool
    rid: int
    """1 same request id, -1 both have one and they differ, 0 otherwise."""
    before_fb: bool
    same_path: bool


def _host(ep: str) -> str:
    return split_endpoint(ep)[0]


def _kind(n: Node) -> tuple[Any, ...]:
    """What hop a request goes to: the profile's hop where a rule matched its
    connection, else its protocol class and server port (several origins behind one
    router are one kind)."""
    p = n.conn.path
    if p is not None and not p.get("inferred"):
        return ("hop", p["name"], p["hop"])
    return ("resp" if is_resp(n.conn, n.req) else "http", split_endpoint(n.conn.server)[1])


def _first_request_index(conn: Connection) -> int | None:
    if not conn.requests:
        return None
    return min(range(len(conn.requests)), key=lambda i: (conn.requests[i].ts_ns, i))


def link_requests(connections: Iterable[Connection],
                  trusted: Iterable[str] = ()) -> Chains:
    """Link every request to the request that caused it, where the capture shows one.

    ``trusted``: ids of connections a profile matched; their servers need not pass the
    proxy consistency test for address-only links to be accepted.
    """
    conns = [c for c in connections if c.requests]
    trusted_ids = set(trusted)
    nodes: dict[tuple[str, int], Node] = {}
    by_server_ip: dict[str, list[Node]] = defaultdict(list)
    by_rid: dict[str, list[Node]] = defaultdict(list)
    for c in conns:
        for i, r in enumerate(c.requests):
            n = Node(c, i, r)
            nodes[n.key] = n
            by_server_ip[_host(c.server)].append(n)
            rid = request_id(r)
            if rid is not None:
                by_rid[rid].append(n)
    starts: dict[str, list[int]] = {}
    longest: dict[str, int] = {}
    for ip, lst in by_server_ip.items():
        lst.sort(key=lambda n: n.req.ts_ns)
        starts[ip] = [n.req.ts_ns for n in lst]
        longest[ip] = max(n.window_end_ns - n.req.ts_ns for n in lst)

    cands: dict[tuple[str, int], list[_Cand]] = {}
    followed: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for u in nodes.values():
        uc = u.conn
        pool: dict[tuple[str, int], Node] = {}
        cip = _host(uc.client)
        if cip in by_server_ip:
            # only requests that started before u, and not so long before that even
            # the longest window of that server would have ended before u ends
            lst, ts = by_server_ip[cip], starts[cip]
            lo = bisect_left(ts, u.end_ns - longest[cip])
            hi = bisect_left(ts, u.req.ts_ns)
            for p in lst[lo:hi]:
                pool[p.key] = p
        urid = request_id(u.req)
        if urid is not None:
            for p in by_rid.get(urid, ()):
                pool.setdefault(p.key, p)
        found: list[_Cand] = []
        for p in pool.values():
            if p.conn is uc or p.conn.server == uc.server:
                continue
            if not (p.req.ts_ns < u.req.ts_ns and u.end_ns <= p.window_end_ns):
                continue
            address = _host(uc.client) == _host(p.conn.server)
            prid = request_id(p.req)
            rid = 0 if urid is None or prid is None else (1 if urid == prid else -1)
            if not address and rid != 1:
                continue
            pfb = p.req.first_byte_ns
            before = pfb is None or u.req.ts_ns < pfb
            same_path = (u.req.path is not None and u.req.path == p.req.path
                         and not is_resp(uc, u.req))
            found.append(_Cand(p, address, rid, before, same_path))
            if address:
                followed[p.conn.server].add(p.key)
        if found:
            cands[u.key] = found

    totals: dict[str, int] = defaultdict(int)
    for n in nodes.values():
        totals[n.conn.server] += 1
    proxies = {s: ProxyEvidence(s, len(keys), totals[s]) for s, keys in followed.items()}

    def accepted(c: _Cand) -> bool:
        if c.rid == 1:
            return True
        if c.rid == -1:
            return False
        ev = proxies.get(c.parent.conn.server)
        return c.parent.conn.id in trusted_ids or (ev is not None and ev.is_proxy)

    # children in time order; a parent that already has a child of the same kind (the
    # same hop) is a worse candidate than one that has none yet, and among equals the
    # parent that came first wins (a proxy forwards in arrival order)
    kinds: dict[tuple[str, int], set[tuple[Any, ...]]] = defaultdict(set)
    for key in sorted(cands, key=lambda k: (nodes[k].req.ts_ns, k)):
        ok = [c for c in cands[key] if accepted(c)]
        if not ok:
            continue
        u = nodes[key]
        kind = _kind(u)
        best = max(ok, key=lambda c: (c.rid, c.address, c.before_fb, c.same_path,
                                      kind not in kinds[c.parent.key],
                                      -c.parent.req.ts_ns, c.parent.key))
        kinds[best.parent.key].add(kind)
        u.parent = best.parent
        u.link = ("address+request-id" if best.rid == 1 and best.address else
                  "request-id" if best.rid == 1 else "address")
        best.parent.children.append(u)

    for c in conns:
        first = _first_request_index(c)
        if first is None or c.syn_ns is None:
            continue
        u = nodes[(c.id, first)]
        p = u.parent
        if p is not None and p.req.ts_ns <= c.syn_ns <= u.req.ts_ns:
            u.opened = True
    return Chains(nodes, proxies)
