"""Findings about paths and hops, each with its evidence (connection ids).

``path-dominant-hop`` (info)
    Per path with enough requests: the hop with the largest median own time, and its
    share of the path's median time to first byte.
``path-unlinked`` (warning)
    A path with hops behind its client-facing one whose client requests could mostly
    not be linked to their upstream requests (fewer than :data:`~netdiag.paths.budget.
    MIN_SAMPLES`, or under half of them): no per-hop time is stated for it, and the
    finding says why.
``path-difference`` (info)
    Two paths differ and the bootstrap supports it (``netdiag.paths.budget``).
``path-low-reuse`` (warning)
    Connection reuse at one hop of one path below ``reuse_min`` over at least
    ``reuse_min_requests`` requests (the report's thresholds).
``token-store-latency`` (warning)
    A Redis command's p99 latency above ``resp_slow_ms``.
``path-streaming-stalls`` (warning)
    A pause longer than ``stall_ms`` between two events of a streamed answer on a path,
    saying whether the origin's own stream paused too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from heapq import nsmallest

from netdiag.analysis.findings import Thresholds
from netdiag.analysis.stats import median, quantile
from netdiag.paths.budget import MIN_SAMPLES, Difference, PathBudget
from netdiag.paths.chains import Chains, Node, is_resp
from netdiag.records import Finding


@dataclass(frozen=True, slots=True)
class PathThresholds:
    """Limits of the path findings beyond :class:`~netdiag.analysis.findings.Thresholds`."""

    resp_slow_ms: float = 10.0
    """A Redis (token store) command whose p99 latency is above this is slow."""
    min_requests: int = 5
    """Fewest client requests on a path before its dominant hop is reported."""


def _ms(x: float) -> str:
    return f"{x:.1f} ms" if x < 1000 else f"{x / 1000:.2f} s"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _ids(ids: list[str], k: int = 20) -> list[str]:
    """The ``k`` first of ``ids`` (without repeats) by length, then text: ``C2`` before
    ``C10``; picked, not all sorted (a hop's connections can be a capture's)."""
    return nsmallest(k, set(ids), key=lambda i: (len(i), i))


def path_findings(budgets: dict[str, PathBudget], differences: list[Difference],
                  chains: Chains, thresholds: Thresholds | None = None,
                  path_thresholds: PathThresholds | None = None) -> list[Finding]:
    """Every path finding the budgets support, most severe first."""
    t = thresholds or Thresholds()
    pt = path_thresholds or PathThresholds()
    out: list[Finding] = []
    for name in sorted(budgets):
        b = budgets[name]
        out.extend(_unlinked(b))
        out.extend(_dominant(b, pt))
        out.extend(_reuse(b, t))
        out.extend(_token_store(b, pt))
        out.extend(_stalls(b, chains, t))
    out.extend(_differences(differences, budgets))
    order = {"critical": 0, "warning": 1, "info": 2}
    out.sort(key=lambda f: order.get(f.severity, 3))
    return out


def _unlinked(b: PathBudget) -> list[Finding]:
    upstream = [h for h in b.ordered_hops() if h.depth != 0 and h.requests]
    if not b.multi_hop or not b.requests or not upstream:
        return []
    if b.linked >= MIN_SAMPLES and b.linked * 2 >= b.requests:
        return []
    why = []
    if b.ambiguous:
        why.append(f"{b.ambiguous} had concurrent candidates that fit equally well")
    if b.unlinked:
        why.append(f"{b.unlinked} could not be tied to requests at every hop")
    seen = ", ".join(f"{h.name} ({h.requests} requests)" for h in upstream)
    return [Finding(
        "warning", "path-unlinked",
        f"{b.name}: only {b.linked} of {b.requests} client requests could be linked to "
        "their upstream requests; no per-hop time is stated",
        f"The capture shows requests at {seen}, but per-hop times need each client "
        f"request tied to the requests it caused: " + ("; ".join(why) or "too few requests")
        + ". A profile naming every hop, request ids (x-request-id, traceparent) "
        "forwarded by the proxies, or a capture with less concurrency makes the links.",
        _ids(b.client_connections))]


def _dominant(b: PathBudget, pt: PathThresholds) -> list[Finding]:
    if len(b.ttfb) < pt.min_requests or (b.multi_hop and b.linked < MIN_SAMPLES):
        return []
    hops = [(median(h.own), h) for h in b.ordered_hops() if h.own]
    if not hops:
        return []
    own, hop = max(hops, key=lambda x: x[0])
    total = median(b.ttfb)
    share = own / total if total > 0 else 0.0
    parts = ", ".join(f"{h.name} {_ms(m)}" for m, h in hops)
    setups = [(median(h.setup), h) for h in b.ordered_hops() if h.setup]
    if setups:
        parts += "; connection setup " + ", ".join(f"to the {h.name} {_ms(m)}"
                                                   for m, h in setups)
    if len(hops) == 1:
        detail = (f"Only the {hop.name} is visible on {b.name} (no upstream request was "
                  f"linked to its requests), so its own time is the whole time to first "
                  f"byte: median {_ms(own)} over {len(b.ttfb)} requests.")
    else:
        detail = (f"Median own time per hop over {b.linked} linked requests: {parts}. Median "
                  f"time to first byte {_ms(total)}. A hop's own time is its wait minus "
                  "the wait of the hops it called.")
    return [Finding(
        "info", "path-dominant-hop",
        f"{b.name}: the {hop.name} takes {_ms(own)} of the {_ms(total)} median time to "
        f"first byte ({_pct(min(share, 1.0))})",
        detail, _ids(hop.connections))]


def _reuse(b: PathBudget, t: Thresholds) -> list[Finding]:
    out = []
    for h in b.ordered_hops():
        rate = h.reuse_rate
        if rate is None or h.requests < t.reuse_min_requests or rate >= t.reuse_min:
            continue
        new_share = len(h.connections) / h.requests
        cost = ""
        if h.setup:
            cost = (f" Each new connection to it cost a median {_ms(median(h.setup))} of "
                    "connection setup (TCP, and TLS where used) inside the client's "
                    "wait.")
        out.append(Finding(
            "warning", "path-low-reuse",
            f"{b.name}: {_pct(new_share)} of requests to the {h.name} opened a new "
            "connection",
            f"Connection reuse at {b.name}'s {h.name} is {_pct(rate)} ({h.requests} "
            f"requests on {len(h.connections)} connections), below {_pct(t.reuse_min)}."
            + cost, _ids(h.single_request or h.connections)))
    return out


def _token_store(b: PathBudget, pt: PathThresholds) -> list[Finding]:
    out = []
    for h in b.ordered_hops():
        if not h.commands:
            continue
        stats = []
        for cmd, vals in sorted(h.commands.items()):
            s = sorted(vals)
            stats.append((quantile(s, 0.99), cmd, len(s), quantile(s, 0.5)))
        slow = [x for x in stats if x[0] > pt.resp_slow_ms]
        if not slow:
            continue
        worst = max(slow)
        desc = "; ".join(f"{cmd}: median {_ms(p50)}, p99 {_ms(p99)} over {n}"
                         for p99, cmd, n, p50 in stats)
        share = ""
        if h.own and b.ttfb:
            share = (f" Per client request the {h.name} takes a median {_ms(median(h.own))} "
                     f"of the {_ms(median(b.ttfb))} median time to first byte.")
        out.append(Finding(
            "warning", "token-store-latency",
            f"{b.name}: {worst[1]} at the {h.name} takes {_ms(worst[0])} at p99 "
            f"(threshold {_ms(pt.resp_slow_ms)})",
            f"Redis commands at {', '.join(sorted(h.servers))}: {desc}.{share} Every "
            "request waits for these round trips before it is forwarded.",
            _ids(h.connections)))
    return out


def _leaf_http(chains: Chains, root: Node) -> Node | None:
    """The deepest HTTP request in ``root``'s chain (the origin's answer)."""
    best: tuple[int, Node] | None = None
    for st in chains.steps(root):
        n = st.node
        if is_resp(n.conn, n.req):
            continue
        if best is None or st.depth > best[0]:
            best = (st.depth, n)
    return None if best is None or best[1] is root else best[1]


def _stalls(b: PathBudget, chains: Chains, t: Thresholds) -> list[Finding]:
    hits: list[tuple[float, Node]] = []
    n_gaps = 0
    limit = t.stall_ms
    for root in b.roots:
        gaps = root.req.chunk_gaps_ns
        # the longest gap first (the test is monotone in the gap): most answers never
        # stalled, and their gaps are then not converted one by one
        if not gaps or max(gaps) / 1e6 <= limit:
            continue
        long = [g / 1e6 for g in gaps if g / 1e6 > limit]
        if long:
            n_gaps += len(long)
            hits.append((max(long), root))
    if not hits:
        return []
    hits.sort(key=lambda x: -x[0])
    where: dict[str, int] = defaultdict(int)
    for _g, root in hits:
        leaf = _leaf_http(chains, root)
        if leaf is None:
            where["unknown"] += 1
            continue
        lgaps = [g / 1e6 for g in (leaf.req.chunk_gaps_ns or [])]
        hop = (leaf.conn.path or {}).get("hop") or leaf.conn.server
        if lgaps and max(lgaps) > t.stall_ms / 2:
            where[f"already at the {hop}"] += 1
        else:
            where[f"not at the {hop}"] += 1
    worst, root = hits[0]
    sid = f" stream {root.req.stream_id}" if root.req.stream_id is not None else ""
    origin_note = ""
    if any(k.startswith("already") for k in where) or any(k.startswith("not") for k in where):
        origin_note = (" Where the chain is visible, the same pause was " +
                       ", ".join(f"{k} ({v})" for k, v in sorted(where.items())
                                 if k != "unknown") +
                       ": a pause already at the origin comes from its generation; one "
                       "that is not there was added between the origin and the client "
                       "(buffering or flow control at a proxy).")
    return [Finding(
        "warning", "path-streaming-stalls",
        f"{b.name}: streamed answers stalled {n_gaps} time(s) for more than "
        f"{_ms(t.stall_ms)}",
        f"Longest pause between two events on {b.name}: {_ms(worst)} ({root.conn.id}{sid})."
        + origin_note, _ids([r.conn.id for _g, r in hits]))]


def _differences(diffs: list[Difference], budgets: dict[str, PathBudget]) -> list[Finding]:
    by_pair: dict[tuple[str, str], list[Difference]] = defaultdict(list)
    for d in diffs:
        by_pair[(d.a, d.b)].append(d)
    out = []
    for (a, b), ds in by_pair.items():
        ok = [d for d in ds if d.supported]
        if not ok:
            continue
        total = next((d for d in ok if d.phase == "ttfb"), None)
        hops = sorted((d for d in ok if d.phase.startswith("hop:") and (d.diff_ms or 0) > 0),
                      key=lambda d: -(d.diff_ms or 0))
        lead = hops[0] if hops else (total or ok[0])
        declined = [d for d in ds if not d.supported]
        detail = " ".join(d.sentence + "." for d in ok if d is not lead)
        if declined:
            detail += " Not stated for lack of evidence: " + ", ".join(
                d.label for d in declined) + "."
        evidence: list[str] = []
        if lead.phase.startswith("hop:") and lead.a in budgets:
            h = budgets[lead.a].hops.get(lead.phase[4:])
            evidence = _ids(h.connections) if h is not None else []
        else:
            evidence = _ids(budgets[a].client_connections + budgets[b].client_connections
                            if a in budgets and b in budgets else [])
        out.append(Finding("info", "path-difference", lead.sentence, detail, evidence))
    return out
