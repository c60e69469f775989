"""Latency budget per path, and the difference between paths with a bootstrap CI.

Per path (``summary.paths``), from its client-facing requests and their chains
(:mod:`netdiag.paths.chains`). A client-facing request is one no captured request
caused, on a connection none of whose requests another request caused, and not a Redis
command at a hop other than the path's first (a proxy's start-up ``SCRIPT LOAD``):

* ``dns_ms``: DNS transactions whose answers contain the address of one of the path's
  client-facing servers;
* ``tcp_ms`` / ``tls_ms``: TCP and TLS handshakes of the client-facing connections;
* per hop: ``own_ms`` (the hop's own time within the client's time to first byte,
  summed over the hop's steps of one request), ``setup_ms`` (TCP + TLS handshakes of
  connections *to* this hop opened for the request), ``wait_ms`` (time to first byte
  of each request the hop served), connection reuse at the hop;
* ``think_ms``: the origin hop's time to first byte (the hop named ``origin``, else a
  profile path's last hop);
* ``transfer_ms``: last byte minus first byte of the client-facing requests.

Each is a contract percentile block (``p50`` is the median), one sample per request
(per DNS transaction, per connection for handshakes).

Paths are compared pairwise (the one with the longer median time to first byte first)
on every phase both have, and on every hop only the first has: the difference of the
medians with a seeded percentile bootstrap (:data:`RESAMPLES` resamples, 95%; a phase
whose samples repeat an earlier one's, as a one-hop path's origin time repeats its time
to first byte, is compared once). A
difference is *supported* when each side has at least :data:`MIN_SAMPLES` samples and
the interval excludes 0; otherwise the sentence declines ("not enough evidence").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from netdiag.analysis.stats import (
    BOOTSTRAP_RESAMPLES,
    LEVEL,
    MedianDraws,
    median,
    ms_figure,
    percentiles,
)
from netdiag.paths.chains import Chains, Node, is_resp
from netdiag.paths.endpoint import split_endpoint
from netdiag.paths.profile import Profile
from netdiag.records import Connection, DnsTransaction, Request

RESAMPLES = BOOTSTRAP_RESAMPLES
"""Bootstrap resamples per comparison."""
MIN_SAMPLES = 5
"""Fewest samples on each side for a difference to be stated."""


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (b - a) / 1e6


@dataclass
class HopBudget:
    """What one hop of one path cost."""

    name: str
    depth: int | None = None
    """Smallest depth at which the hop appears in a chain (0: client-facing)."""
    servers: list[str] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    """Per client request: the hop's own time within the time to first byte (ms)."""
    own_split: dict[str, list[float]] = field(default_factory=lambda: {
        "before_calls": [], "between_calls": [], "after_calls": []})
    """Per client request where the hop called others within its wait: its own time
    before the first call, between calls and after the last call (ms)."""
    setup: list[float] = field(default_factory=list)
    """Per client request that needed it: setup (TCP + TLS handshakes) of connections to
    this hop opened for the request (ms)."""
    wait: list[float] = field(default_factory=list)
    """Per request the hop served: its time to first byte (ms)."""
    commands: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Redis commands served at this hop: command -> latency (first reply byte, ms)."""
    connections: list[str] = field(default_factory=list)
    """Ids of the path's connections at this hop that carried requests."""
    requests: int = 0
    single_request: list[str] = field(default_factory=list)
    """Connections at this hop that carried a single request."""
    callers: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Hops whose requests caused requests at this hop, with how many."""

    @property
    def reuse_rate(self) -> float | None:
        if not self.requests:
            return None
        return (self.requests - len(self.connections)) / self.requests

    def to_json(self) -> dict[str, Any]:
        return {
            "servers": sorted(self.servers), "connections": len(self.connections),
            "requests": self.requests, "reuse_rate": self.reuse_rate,
            "own_ms": percentiles(self.own),
            "own_split_ms": {k: percentiles(v) for k, v in self.own_split.items()},
            "setup_ms": percentiles(self.setup),
            "wait_ms": percentiles(self.wait),
            "commands": {k: percentiles(v) for k, v in sorted(self.commands.items())},
            "called_by": dict(sorted(self.callers.items())),
        }


@dataclass
class PathBudget:
    """The latency budget of one path."""

    name: str
    inferred: bool = False
    hop_order: list[str] = field(default_factory=list)
    hops: dict[str, HopBudget] = field(default_factory=dict)
    origin_hop: str = "origin"
    roots: list[Node] = field(default_factory=list)
    """Client-facing requests of the path."""
    client_connections: list[str] = field(default_factory=list)
    """Client-facing connections that carried requests."""
    ttfb: list[float] = field(default_factory=list)
    ttlb: list[float] = field(default_factory=list)
    transfer: list[float] = field(default_factory=list)
    dns: list[float] = field(default_factory=list)
    tcp: list[float] = field(default_factory=list)
    tls: list[float] = field(default_factory=list)
    quic: list[float] = field(default_factory=list)
    """QUIC handshakes of the client-facing QUIC connections (where TCP and TLS stand for
    a TCP connection; a QUIC connection adds to neither)."""
    think: list[float] = field(default_factory=list)
    estimated: bool = False
    multi_hop: bool = False
    """The path has hops behind its client-facing one (declared or seen)."""
    linked: int = 0
    """Client requests whose chain reached every hop the path's chains usually reach,
    without an ambiguous link: the only ones per-hop figures rest on."""
    ambiguous: int = 0
    """Client requests whose chain has an ambiguous link (left out of per-hop figures)."""
    unlinked: int = 0
    """Client requests of a multi-hop path linked to no upstream request, or to fewer
    hops than its chains usually reach (left out of per-hop figures)."""
    upstream_unlinked: int = 0
    """Requests at a hop behind the client-facing one that no client request could be
    linked to (never counted as client requests)."""
    root_own: list[dict[str, int] | str | None] = field(default_factory=list)
    """Per client request (in the order of :attr:`roots`) whose chain is complete: each
    hop's own time within its time to first byte (ns), as added to ``hops[].own``; None
    for the others. A chain of one request holds just its hop's name: that hop's own time
    is the request's whole time to first byte (no map per request, in a capture of direct
    traffic most of them). :func:`own_times` reads either."""

    @property
    def requests(self) -> int:
        return len(self.roots)

    @property
    def reuse_rate(self) -> float | None:
        if not self.roots:
            return None
        return (len(self.roots) - len(self.client_connections)) / len(self.roots)

    def hop(self, name: str) -> HopBudget:
        h = self.hops.get(name)
        if h is None:
            h = self.hops[name] = HopBudget(name)
        return h

    def ordered_hops(self) -> list[HopBudget]:
        known = [self.hops[h] for h in self.hop_order if h in self.hops]
        rest = sorted((h for n, h in self.hops.items() if n not in self.hop_order),
                      key=lambda h: (99 if h.depth is None else h.depth, h.name))
        return known + rest

    def samples(self, phase: str) -> list[float]:
        """The samples of a phase name: ``ttfb``, ``dns``, ``tcp``, ``tls``, ``quic``,
        ``think``, ``transfer`` or ``hop:NAME``."""
        if phase.startswith("hop:"):
            h = self.hops.get(phase[4:])
            return h.own if h is not None else []
        return list(getattr(self, phase))

    def to_json(self) -> dict[str, Any]:
        return {
            "inferred": self.inferred,
            "hops": [h.name for h in self.ordered_hops()],
            "requests": self.requests,
            "connections": len(self.client_connections),
            "reuse_rate": self.reuse_rate,
            "ttfb_ms": percentiles(self.ttfb),
            "ttlb_ms": percentiles(self.ttlb),
            "phases": {
                "dns_ms": percentiles(self.dns),
                "tcp_ms": percentiles(self.tcp),
                "tls_ms": percentiles(self.tls),
                **({"quic_ms": percentiles(self.quic)} if self.quic else {}),
                "hops": {h.name: h.to_json() for h in self.ordered_hops()},
                "think_ms": percentiles(self.think),
                "transfer_ms": percentiles(self.transfer),
            },
            "chains": {"linked": self.linked, "ambiguous": self.ambiguous,
                       "unlinked": self.unlinked,
                       "upstream_unlinked": self.upstream_unlinked},
            "estimated": self.estimated,
        }


def build_budgets(connections: Sequence[Connection], dns_records: Sequence[DnsTransaction],
                  chains: Chains, profile: Profile | None = None) -> dict[str, PathBudget]:
    """One :class:`PathBudget` per path named in ``conn.path`` (after ``attribute``), in
    four steps: what each hop served, the client requests each path starts with, which
    of their chains are complete, and the per-hop times of those."""
    budgets = _Budgets(profile)
    _hop_statistics(budgets, connections)
    client_conns, complete = _client_roots(budgets, chains)
    _keep_complete_chains(budgets.all, chains, complete)
    for name, b in budgets.all.items():
        whole = {id(r) for r in complete.get(name, [])}
        b.root_own = [_hop_figures(b, chains, root, id(root) in whole) for root in b.roots]
    _finish(budgets.all, client_conns, dns_records)
    return budgets.all


class _Budgets:
    """The budgets being built, one per path name, with the profile's hop order."""

    def __init__(self, profile: Profile | None) -> None:
        self.profile = profile
        self.all: dict[str, PathBudget] = {}

    def of(self, c: Connection) -> PathBudget:
        """The budget of ``c``'s path (``c.path`` is set), made on first use."""
        assert c.path is not None
        name = c.path["name"]
        b = self.all.get(name)
        if b is None:
            b = self.all[name] = PathBudget(name, bool(c.path.get("inferred")))
            pdef = self.profile.path(name) if self.profile is not None else None
            if pdef is not None:
                b.hop_order = list(pdef.hops)
                b.origin_hop = pdef.origin_hop
        return b


def _hop_statistics(budgets: _Budgets, connections: Sequence[Connection]) -> None:
    """Every connection of a path, grouped by hop: servers, connections, requests."""
    for c in connections:
        if c.path is None:
            continue
        b = budgets.of(c)
        b.inferred = b.inferred and bool(c.path.get("inferred"))
        h = b.hop(c.path["hop"])
        if c.server not in h.servers:
            h.servers.append(c.server)
        if c.requests:
            h.connections.append(c.id)
            h.requests += len(c.requests)
            if len(c.requests) == 1:
                h.single_request.append(c.id)


def _client_roots(budgets: _Budgets, chains: Chains
                  ) -> tuple[dict[str, dict[str, Connection]], dict[str, list[Node]]]:
    """The client requests of each path (chain roots at its first hop) with their
    end-to-end figures; returns the client connections per path and the linked chains
    that are not ambiguous."""
    profile = budgets.profile
    client_conns: dict[str, dict[str, Connection]] = defaultdict(dict)
    upstream_conns = {n.conn.id for n in chains.nodes.values() if n.parent is not None}
    complete: dict[str, list[Node]] = defaultdict(list)
    for root in chains.roots:
        c = root.conn
        if c.path is None:
            continue
        b = budgets.of(c)
        pdef = profile.path(b.name) if profile is not None else None
        first_hop = pdef.hops[0] if pdef is not None else (
            "edge" if b.name.startswith("via ") else c.path["hop"])
        if pdef is not None and len(pdef.hops) > 1:
            b.multi_hop = True
        if c.id in upstream_conns or c.path["hop"] != first_hop:
            # a request at an upstream hop that nothing captured caused (a proxy's
            # start-up SCRIPT LOAD, or one the linking could not place): never a
            # client request of the path
            b.upstream_unlinked += 1
            continue
        b.roots.append(root)
        if root.children:
            b.multi_hop = True
            if chains.is_ambiguous(root):
                b.ambiguous += 1
            else:
                complete[b.name].append(root)
        client_conns[b.name][c.id] = c
        r = root.req
        if r.estimated:
            b.estimated = True
        ttfb = _ms(r.ts_ns, r.first_byte_ns)
        if ttfb is not None:
            b.ttfb.append(ttfb)
        ttlb = _ms(r.ts_ns, r.last_byte_ns)
        if ttlb is not None:
            b.ttlb.append(ttlb)
        tr = _ms(r.first_byte_ns, r.last_byte_ns)
        if tr is not None:
            b.transfer.append(tr)
    return client_conns, complete


def _keep_complete_chains(budgets: dict[str, PathBudget], chains: Chains,
                          complete: dict[str, list[Node]]) -> None:
    """Per-hop figures only from chains that reached the hops the path's chains usually
    reach (a chain that lost its origin call would give its router the origin's time);
    a single-hop path's every request is complete."""
    for name, b in budgets.items():
        if not b.multi_hop:
            continue
        roots = complete.get(name, [])
        sets = [frozenset(_hop_names(chains, root, b.name)) for root in roots]
        counts: dict[str, int] = defaultdict(int)
        for hs in sets:
            for h in hs:
                counts[h] += 1
        usual = {h for h, k in counts.items() if k >= PROXY_USUAL_SHARE * len(sets)}
        keep = [root for root, hs in zip(roots, sets, strict=True) if usual <= hs]
        b.linked = len(keep)
        b.unlinked = len(b.roots) - b.linked - b.ambiguous
        complete[name] = keep
    for b in budgets.values():
        if b.multi_hop:
            continue
        complete[b.name] = list(b.roots)
        b.linked = len(b.roots)


PROXY_USUAL_SHARE = 0.8
"""A hop reached by at least this share of a path's linked chains is one its complete
chains must reach."""


def _hop_names(chains: Chains, root: Node, path: str) -> list[str]:
    out = []
    for st in chains.steps(root):
        out.append(_hop_label(st.node.conn.path, path))
    return out


def _hop_label(conn_path: dict[str, Any] | None, name: str) -> str:
    """A step's hop as the budget of path ``name`` names it: the hop of its connection's
    path, prefixed with that path where it is another one; ``?`` on no path."""
    hop = (None if conn_path is None else conn_path.get("hop")) or "?"
    other = None if conn_path is None else conn_path.get("name")
    return hop if other is None or other == name else f"{other}.{hop}"


def own_at(own: dict[str, int] | str | None, req: Request, hop: str) -> int | None:
    """The own time at ``hop`` (ns) of a :attr:`PathBudget.root_own` entry of the request
    ``req``; None where it has none there."""
    if isinstance(own, str):  # a chain of one request: its whole time to first byte
        fb = req.first_byte_ns
        return None if own != hop or fb is None else fb - req.ts_ns
    return None if own is None else own.get(hop)


def own_times(own: dict[str, int] | str | None, req: Request) -> dict[str, int] | None:
    """A :attr:`PathBudget.root_own` entry of the request ``req`` as a map of hop to own
    time (ns)."""
    if isinstance(own, str):
        at = own_at(own, req, own)
        return None if at is None else {own: at}
    return own


def _hop_figures(b: PathBudget, chains: Chains, root: Node, complete: bool
                 ) -> dict[str, int] | str | None:
    """Add one chain's per-hop figures to its path's budget: what each hop served (every
    chain), and the time each took of the client's wait (complete chains only); returns
    its :attr:`PathBudget.root_own` entry."""
    if root.children:
        return _chain_figures(b, chains, root, complete)
    return _lone_figures(b, root, complete)


def _chain_figures(b: PathBudget, chains: Chains, root: Node, complete: bool
                   ) -> dict[str, int] | None:
    """:func:`_hop_figures` of any chain, step by step."""
    own: dict[str, int] = defaultdict(int)
    own_seen: set[str] = set()
    parts: dict[str, list[int]] = {}
    setup: dict[str, int] = defaultdict(int)
    think: int | None = None
    for st in chains.steps(root):
        n = st.node
        hop = _hop_label(n.conn.path, b.name)
        hb = b.hop(hop)
        hb.depth = st.depth if hb.depth is None else min(hb.depth, st.depth)
        if n.parent is not None:
            pp = n.parent.conn.path
            phop = "?" if pp is None else (
                pp["hop"] if pp["name"] == b.name else f"{pp['name']}.{pp['hop']}")
            hb.callers[phop] += 1
        if n.wait_ns is not None:
            hb.wait.append(n.wait_ns / 1e6)
            if is_resp(n.conn, n.req):
                hb.commands[n.req.method or "?"].append(n.wait_ns / 1e6)
        if not st.in_ttfb or not complete:
            continue
        if st.own_ns is not None:
            own[hop] += st.own_ns
            own_seen.add(hop)
        if st.parts_ns is not None:
            acc = parts.setdefault(hop, [0, 0, 0])
            for k in range(3):
                acc[k] += st.parts_ns[k]
        if n.setup_ns is not None and st.depth > 0:
            setup[hop] += n.setup_ns
        if hop == b.origin_hop and n.wait_ns is not None:
            think = (think or 0) + n.wait_ns
    for hop in own_seen:
        b.hop(hop).own.append(own[hop] / 1e6)
    for hop, acc in parts.items():
        split = b.hop(hop).own_split
        for k, key in enumerate(("before_calls", "between_calls", "after_calls")):
            split[key].append(acc[k] / 1e6)
    for hop, ns in setup.items():
        b.hop(hop).setup.append(ns / 1e6)
    if think is not None:
        b.think.append(think / 1e6)
    return {hop: own[hop] for hop in own_seen} if own_seen else None


def _lone_figures(b: PathBudget, root: Node, complete: bool) -> str | None:
    """:func:`_hop_figures` of a chain of one request (most of them, in a capture of
    direct traffic): its one step at depth 0, in the time to first byte, whose own time
    is its whole wait; no caller, no split, no setup, and no step objects built. Its
    figures in milliseconds are one float, shared by the lists it goes into."""
    hop = _hop_label(root.conn.path, b.name)
    hb = b.hop(hop)
    hb.depth = 0
    wait = root.wait_ns
    if wait is None:
        return None
    ms = wait / 1e6
    hb.wait.append(ms)
    if is_resp(root.conn, root.req):
        hb.commands[root.req.method or "?"].append(ms)
    if not complete:
        return None
    hb.own.append(ms)
    if hop == b.origin_hop:
        b.think.append(ms)
    return hop


def _finish(budgets: dict[str, PathBudget], client_conns: dict[str, dict[str, Connection]],
            dns_records: Sequence[DnsTransaction]) -> None:
    # answered DNS transactions by every address they answered (one pass: each path
    # then looks up its own servers instead of scanning every transaction)
    by_answer: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(dns_records):
        if t.latency_ns is not None:
            for a in set(t.answers):
                by_answer[a].append(i)
    for name, conns in client_conns.items():
        b = budgets[name]
        b.client_connections = list(conns)
        ips = set()
        for c in conns.values():
            ips.add(split_endpoint(c.server)[0])
            if c.transport == "udp":
                if c.tls is not None and c.tls.handshake_ns is not None:
                    b.quic.append(c.tls.handshake_ns / 1e6)
                continue
            hs = _ms(c.syn_ns, c.handshake_ack_ns)
            if hs is not None:
                b.tcp.append(hs)
            if c.tls is not None and c.tls.handshake_ns is not None:
                b.tls.append(c.tls.handshake_ns / 1e6)
        hits = sorted({i for ip in ips for i in by_answer.get(ip, ())})
        b.dns.extend(dns_records[i].latency_ns / 1e6 for i in hits)  # type: ignore[operator]
    for b in budgets.values():
        if not b.hop_order:
            b.hop_order = [h.name for h in sorted(
                b.hops.values(), key=lambda h: (99 if h.depth is None else h.depth, h.name))]


def summary_paths(budgets: dict[str, PathBudget]) -> dict[str, Any]:
    """The contract's ``summary.paths``: ``{name: {requests, connections, reuse_rate,
    ttfb_ms, ttlb_ms, phases, ...}}``."""
    return {name: budgets[name].to_json() for name in sorted(budgets)}


# --- comparing paths ---------------------------------------------------------------


PHASE_LABELS = {
    "ttfb": "time to first byte",
    "dns": "DNS lookup",
    "tcp": "TCP handshake",
    "tls": "TLS handshake",
    "quic": "QUIC handshake",
    "think": "origin think time",
    "transfer": "transfer",
}


def _rounded(x: float | None) -> float | None:
    return None if x is None else ms_figure(x)


def _fmt_ms(x: float) -> str:
    return f"{x:.1f} ms"


def _fmt_ci(lo: float, hi: float) -> str:
    if lo < 0 <= hi or hi < 0:
        return f"{lo:.1f} to {hi:.1f} ms"
    return f"{lo:.1f}–{hi:.1f} ms"


@dataclass
class Difference:
    """One phase of path ``a`` against path ``b`` (``b`` None: a hop only ``a`` has)."""

    a: str
    b: str
    phase: str
    """``ttfb``, ``dns``, ``tcp``, ``tls``, ``think``, ``transfer`` or ``hop:NAME``."""
    only_a: bool
    """The hop exists on ``a`` only: its own time is compared with nothing (0)."""
    n_a: int
    n_b: int
    diff_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    supported: bool = False
    reason: str | None = None
    """Why the sentence declines, when it does."""

    @property
    def label(self) -> str:
        if self.phase.startswith("hop:"):
            return f"at the {self.phase[4:]}"
        return PHASE_LABELS.get(self.phase, self.phase)

    @property
    def sentence(self) -> str:
        a, b = self.a, self.b
        if not self.supported or self.diff_ms is None:
            what = (f"{a} at the {self.phase[4:]}" if self.only_a else
                    f"{a} vs {b}, {self.label}")
            return f"{what}: not enough evidence ({self.reason})"
        d = self.diff_ms
        ci = f"95% CI {_fmt_ci(self.ci_low_ms or 0.0, self.ci_high_ms or 0.0)}"
        more = "more" if d >= 0 else "less"
        if self.only_a:
            return (f"{a} adds {_fmt_ms(d)} {self.label} ({ci}, {self.n_a} linked "
                    f"request{'s' if self.n_a != 1 else ''})")
        if self.phase.startswith("hop:"):
            return f"{a} spends {_fmt_ms(abs(d))} {more} than {b} {self.label} ({ci})"
        if self.phase == "ttfb":
            longer = "longer" if d >= 0 else "shorter"
            return (f"{a}'s time to first byte is {_fmt_ms(abs(d))} {longer} than {b}'s "
                    f"(medians; {ci})")
        return f"{a}'s {self.label} takes {_fmt_ms(abs(d))} {more} than {b}'s ({ci})"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "phase": self.phase, "only_a": self.only_a,
                "n_a": self.n_a, "n_b": self.n_b, "diff_ms": _rounded(self.diff_ms),
                "ci_low_ms": _rounded(self.ci_low_ms), "ci_high_ms": _rounded(self.ci_high_ms),
                "level": LEVEL, "supported": self.supported, "reason": self.reason,
                "sentence": self.sentence}


def compare(a: PathBudget, b: PathBudget, *, seed: int = 0, resamples: int = RESAMPLES,
            min_samples: int = MIN_SAMPLES, only_a_hops: bool = True,
            draws: MedianDraws | None = None) -> list[Difference]:
    """Every phase of ``a`` against ``b``: end to end, DNS/TCP/TLS, each hop, think
    time, transfer (``only_a_hops`` false: not the hops only ``a`` has, stated once per
    path elsewhere). A side with fewer than ``min_samples`` declines before any
    resampling. ``draws``: bootstrap medians shared with other comparisons."""
    if draws is None:
        draws = MedianDraws(seed, resamples)
    out: list[Difference] = []
    b_hops = {h.name for h in b.ordered_hops() if h.own}
    phases: list[tuple[str, bool]] = [("ttfb", False), ("dns", False), ("tcp", False),
                                      ("tls", False), ("quic", False), ("think", False)]
    for h in a.ordered_hops():
        if h.own and (only_a_hops or h.name in b_hops):
            phases.append((f"hop:{h.name}", h.name not in b_hops))
    phases.append(("transfer", False))
    seen: set[tuple[tuple[float, ...], tuple[float, ...]]] = set()
    for phase, only_a in phases:
        sa = a.samples(phase)
        sb = [] if only_a else b.samples(phase)
        if not sa or (not only_a and not sb):
            continue
        same = (tuple(sa), tuple(sb))
        if same in seen:
            continue  # e.g. a one-hop path: its own time is its think time and its TTFB
        seen.add(same)
        d = Difference(a.name, b.name, phase, only_a, len(sa), len(sb))
        if len(sa) < min_samples or (not only_a and len(sb) < min_samples):
            d.diff_ms = median(sa) - (0.0 if only_a else median(sb))
            d.reason = (f"{len(sa)} sample{'s' if len(sa) != 1 else ''}"
                        + ("" if only_a else f" against {len(sb)}")
                        + f"; {min_samples} per side needed")
            if only_a and a.multi_hop and a.linked < min_samples:
                d.reason = (f"only {a.linked} of {a.requests} client requests linked to "
                            f"every hop; {min_samples} needed")
            out.append(d)
            continue
        point, lo, hi = draws.diff(f"{a.name}\0{phase}", sa,
                                   None if only_a else (f"{b.name}\0{phase}", sb))
        d.diff_ms, d.ci_low_ms, d.ci_high_ms = point, lo, hi
        if lo <= 0 <= hi:
            d.reason = f"95% CI {_fmt_ci(lo, hi)} includes 0"
        else:
            d.supported = True
        out.append(d)
    return out


MAX_DIRECT_PAIRS = 3
"""Inferred direct paths (one per server) compared pairwise up to this many; beyond,
they are pooled into one group, so comparisons never grow with the square of the
servers."""


def _pooled(name: str, parts: Sequence[PathBudget]) -> PathBudget:
    """One budget holding the samples of several one-hop paths."""
    out = PathBudget(name, inferred=True)
    for b in parts:
        out.roots.extend(b.roots)
        out.root_own.extend(b.root_own)
        out.client_connections.extend(b.client_connections)
        for k in ("ttfb", "ttlb", "transfer", "dns", "tcp", "tls", "quic", "think"):
            getattr(out, k).extend(getattr(b, k))
        out.estimated = out.estimated or b.estimated
        out.linked += b.linked
    return out


def comparison_pairs(budgets: dict[str, PathBudget]) -> list[tuple[PathBudget, PathBudget]]:
    """Which paths are compared: every pair of the paths a profile names; each inferred
    path through a proxy against the inferred direct paths (pooled beyond
    :data:`MAX_DIRECT_PAIRS`); the direct ones among themselves only when few."""
    have = [b for b in budgets.values() if b.ttfb]
    named = [b for b in have if not b.inferred]
    via = [b for b in have if b.inferred and b.multi_hop]
    direct = [b for b in have if b.inferred and not b.multi_hop]
    if len(direct) > MAX_DIRECT_PAIRS:
        direct = [_pooled(f"direct ({len(direct)} servers)", direct)]
    groups = [named, via + direct]
    pairs: list[tuple[PathBudget, PathBudget]] = []
    for g in groups:
        g.sort(key=lambda b: (-median(b.ttfb), b.name))
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                if g is groups[1] and a in via and b in via:
                    continue  # two proxies: each is compared with the direct servers
                pairs.append((a, b))
    return pairs


def compare_all(budgets: dict[str, PathBudget], *, seed: int = 0,
                resamples: int = RESAMPLES, min_samples: int = MIN_SAMPLES
                ) -> list[Difference]:
    """The pairs of :func:`comparison_pairs`, the slower (median time to first byte)
    first; a hop only one side has is stated once per path, with its first pair."""
    out: list[Difference] = []
    stated: set[str] = set()
    draws = MedianDraws(seed, resamples)
    for a, b in comparison_pairs(budgets):
        out.extend(compare(a, b, seed=seed, resamples=resamples, min_samples=min_samples,
                           only_a_hops=a.name not in stated, draws=draws))
        stated.add(a.name)
    return out
