"""Load over time: per path and interval, what was asked of it and how fast it answered,
and the *knee*, the request rate above which its time to first byte departs from its
low-load level.

A :class:`LoadBuilder` is fed rows (client requests, new connections, retransmissions,
DNS lookups, each with its path) and builds the contract's ``timeseries`` and
``knees``:

* intervals are aligned to multiples of the interval in epoch time (``--interval``; by
  default the smallest of :data:`INTERVAL_CHOICES_MS` that gives at most
  :data:`TARGET_INTERVALS` intervals over the capture), so that two captures of the
  same minutes share their intervals;
* a path's intervals run from its first to its last active one, empty ones included,
  unless that would list more than :data:`SPARSE_FACTOR` times as many intervals as
  are active (a path of two requests an hour apart): then only the active intervals,
  and the path is named in ``timeseries.sparse``. The output is so bounded by the
  input, never by the product of paths and intervals;
* a request counts in the interval where it starts (``requests[].ts``); ``in_flight_max``
  is the most client requests of the path open at once in the interval (from ``ts`` to
  the last response byte); ``reuse_rate`` is the share of the interval's requests that
  were not the first of their connection; ``bytes`` are the request and response bodies
  of the interval's requests; ``retransmissions`` are those of the path's connections
  (every hop) whose packet falls in the interval (the first
  ``RETRANSMISSION_TIMES_CAP`` of a connection);
* the knee (:mod:`netdiag.analysis.knee`) is fitted to per-interval (request rate, p99)
  and (request rate, p50) points, and for each hop with chains its own time is
  compared below and above it: the hop whose own time grows most is named when it
  accounts for at least :data:`HOP_SHARE` of the path's rise.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from netdiag.analysis.knee import Declined, Knee, find_knee, level_change
from netdiag.analysis.stats import percentiles
from netdiag.paths.budget import PathBudget, own_at
from netdiag.paths.endpoint import split_endpoint
from netdiag.paths.profile import Profile
from netdiag.records import NS_PER_MS, Connection, DnsTransaction, Finding, Request

INTERVAL_CHOICES_MS = (100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000,
                       120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 86_400_000)
"""Intervals the default is chosen from."""
TARGET_INTERVALS = 60
"""The default interval is the smallest choice giving at most this many intervals."""
MAX_INTERVALS = 100_000
"""An explicit interval giving more intervals than this over the capture is widened."""
SPARSE_FACTOR = 4
"""A path lists only its active intervals when its span has more than this many times
as many intervals as are active."""
HOP_SHARE = 0.5
"""A hop is named as the one whose time grows with load when its own rise is at least
this share of the path's."""
STAYS = 0.2
"""A hop whose own time changes by less than this share (and 1 ms) "stays" at its level."""
KNEE_METRICS = (("ttfb_p99", "p99", "p99"), ("ttfb_p50", "p50", "median"))
"""(contract metric name, percentile key, word in sentences)."""


def choose_interval_ns(span_ns: int) -> int:
    """The default interval for a capture spanning ``span_ns``."""
    for ms in INTERVAL_CHOICES_MS:
        if span_ns <= TARGET_INTERVALS * ms * NS_PER_MS:
            return ms * NS_PER_MS
    return INTERVAL_CHOICES_MS[-1] * NS_PER_MS


def format_interval(ns: int) -> str:
    """``100ms``, ``1s``, ``2.5s``, ``5min``, ``1h``."""
    if ns % (3_600 * 10**9) == 0:
        return f"{ns // (3_600 * 10**9)}h"
    if ns % (60 * 10**9) == 0:
        return f"{ns // (60 * 10**9)}min"
    if ns >= 10**9:
        return f"{ns / 1e9:g}s"
    return f"{ns / 1e6:g}ms"


@dataclass
class _Rows:
    """One path's rows."""

    requests: list[Request] = field(default_factory=list)
    """The path's client requests: their times, body bytes and estimated flag are read
    from the records themselves at binning, not copied (a row of copied integers cost
    about 200 bytes a request)."""
    opened: list[bool] = field(default_factory=list)
    """Per request: the first of its connection."""
    own: list[dict[str, int] | str | None] = field(default_factory=list)
    """Per request: its own time per hop (ns), as
    :attr:`~netdiag.paths.budget.PathBudget.root_own` has them (a hop's name alone stands
    for the whole time to first byte at that hop)."""
    connections: list[int] = field(default_factory=list)
    """First-packet times of the path's client connections."""
    retransmissions: list[int] = field(default_factory=list)
    """Packet times of the retransmissions on the path's connections."""
    dns: list[int] = field(default_factory=list)
    """Start times of the DNS lookups that answered a server of the path."""


@dataclass
class Load:
    """What :meth:`LoadBuilder.build` gives."""

    timeseries: dict[str, Any]
    """The contract's ``timeseries``."""
    knees: list[dict[str, Any]]
    """The contract's ``knees``."""
    findings: list[Finding]
    """One ``latency-knee`` finding per path with a knee."""
    warnings: list[str]
    """Plain sentences (an interval widened)."""


class LoadBuilder:
    """Collects rows per path (None: on no path); :meth:`build` bins them."""

    def __init__(self) -> None:
        self.rows: dict[str | None, _Rows] = {}

    def _of(self, path: str | None) -> _Rows:
        r = self.rows.get(path)
        if r is None:
            r = self.rows[path] = _Rows()
        return r

    def request(self, path: str | None, ts_ns: int, first_ns: int | None, last_ns: int | None,
                nbytes: int, opened: bool, estimated: bool,
                hop_own: dict[str, int] | str | None = None) -> None:
        """A client request of ``path``, from its figures (body bytes in all)."""
        self.request_of(path, Request(ts_ns=ts_ns, first_byte_ns=first_ns, last_byte_ns=last_ns,
                                      response_bytes=nbytes, estimated=estimated),
                        opened, hop_own)

    def request_of(self, path: str | None, req: Request, opened: bool,
                   hop_own: dict[str, int] | str | None = None) -> None:
        """A client request of ``path``, the record itself (kept, not copied)."""
        rows = self._of(path)
        rows.requests.append(req)
        rows.opened.append(opened)
        rows.own.append(hop_own)

    def connection(self, path: str | None, ts_ns: int) -> None:
        """A new client connection of ``path``."""
        self._of(path).connections.append(ts_ns)

    def retransmissions(self, path: str | None, times_ns: Iterable[int]) -> None:
        """Retransmissions on a connection of ``path``."""
        times = list(times_ns)
        if times:
            self._of(path).retransmissions.extend(times)

    def dns(self, path: str | None, ts_ns: int) -> None:
        """A DNS lookup for ``path``."""
        self._of(path).dns.append(ts_ns)

    # ------------------------------------------------------------------ building

    def _span(self) -> tuple[int, int] | None:
        lo, hi = None, None
        for rows in self.rows.values():
            for seq in (rows.connections, rows.retransmissions, rows.dns):
                if seq:
                    a, b = min(seq), max(seq)
                    lo = a if lo is None else min(lo, a)
                    hi = b if hi is None else max(hi, b)
            for r in rows.requests:
                ts = r.ts_ns
                lo = ts if lo is None else min(lo, ts)
                hi = ts if hi is None else max(hi, ts)
        return None if lo is None or hi is None else (lo, hi)

    def build(self, interval_ns: int | None = None, *, seed: int = 0) -> Load:
        """Bin every path's rows; fit the knees."""
        warnings: list[str] = []
        span = self._span()
        width = span[1] - span[0] if span is not None else 0
        if interval_ns is None:
            interval_ns = choose_interval_ns(width)
        elif width // interval_ns > MAX_INTERVALS:
            wider = next((ms * NS_PER_MS for ms in INTERVAL_CHOICES_MS
                          if width // (ms * NS_PER_MS) <= MAX_INTERVALS),
                         INTERVAL_CHOICES_MS[-1] * NS_PER_MS)
            warnings.append(f"interval {format_interval(interval_ns)} would give "
                            f"{width // interval_ns + 1:,} intervals; widened to "
                            f"{format_interval(wider)} (at most {MAX_INTERVALS:,})")
            interval_ns = wider
        origin = 0 if span is None else span[0] // interval_ns * interval_ns
        out_paths: dict[str, list[dict[str, Any]]] = {}
        sparse: list[str] = []
        knees: list[dict[str, Any]] = []
        declined: dict[str, dict[str, str]] = {}
        findings: list[Finding] = []
        names = sorted(self.rows, key=lambda n: (n is None, n or ""))
        for name in names:
            rows = self.rows[name]
            key = "null" if name is None else name
            series, is_sparse = _bin(rows, origin, interval_ns)
            if not series:
                continue
            out_paths[key] = series
            if is_sparse:
                sparse.append(key)
            if name is None:
                continue
            for metric, pkey, word in KNEE_METRICS:
                found = _knee(name, series, metric, pkey, word, interval_ns, seed)
                if isinstance(found, str):
                    declined.setdefault(key, {})[metric] = found
                else:
                    knees.append(found)
        for k in knees:
            if k["metric"] == "ttfb_p99" or not any(
                    o["path"] == k["path"] and o["metric"] == "ttfb_p99" for o in knees):
                findings.append(_finding(k))
        ts: dict[str, Any] = {
            "interval_ms": interval_ns / NS_PER_MS,
            "start_ts": origin / 1e9,
            "paths": out_paths,
            "knee_declined": declined,
        }
        if sparse:
            ts["sparse"] = sparse
        return Load(ts, knees, findings, warnings)


def _bin(rows: _Rows, origin: int, interval_ns: int) -> tuple[list[dict[str, Any]], bool]:
    """The path's intervals (dense, or its active ones only) and whether sparse."""
    requests = rows.requests
    by_bin: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        bi = (r.ts_ns - origin) // interval_ns
        idx = by_bin.get(bi)
        if idx is None:
            by_bin[bi] = [i]
        else:
            idx.append(i)
    counts: list[dict[int, int]] = []
    for seq in (rows.connections, rows.retransmissions, rows.dns):
        c: dict[int, int] = {}
        for t in seq:
            bi = (t - origin) // interval_ns
            c[bi] = c.get(bi, 0) + 1
        counts.append(c)
    conn, retx, dns = counts
    active = set(by_bin) | set(conn) | set(retx) | set(dns)
    if not active:
        return [], False
    lo, hi = min(active), max(active)
    is_sparse = hi - lo + 1 > SPARSE_FACTOR * len(active) + 8
    bins = sorted(active) if is_sparse else list(range(lo, hi + 1))
    in_flight = _in_flight_max(requests, bins, origin, interval_ns)
    owns = rows.own
    opened = rows.opened
    hop_names = sorted({h for own in owns if own
                        for h in ((own,) if isinstance(own, str) else own)})
    seconds = interval_ns / 1e9
    series = []
    no_requests: list[int] = []
    for k, bi in enumerate(bins):
        idx = by_bin.get(bi, no_requests)
        n = len(idx)
        ttfb: list[float | None] = []
        ttlb: list[float | None] = []
        reused = nbytes = 0
        estimated = False
        for i in idx:
            r = requests[i]
            ts, fb, lb = r.ts_ns, r.first_byte_ns, r.last_byte_ns
            ttfb.append(None if fb is None else (fb - ts) / NS_PER_MS)
            ttlb.append(None if lb is None else (lb - ts) / NS_PER_MS)
            if not opened[i]:
                reused += 1
            nbytes += (r.request_bytes or 0) + (r.response_bytes or 0)
            if r.estimated:
                estimated = True
        entry: dict[str, Any] = {
            "start_ts": (origin + bi * interval_ns) / 1e9,
            "requests": n,
            "rate_per_s": round(n / seconds, 6),
            "in_flight_max": in_flight[k],
            "new_connections": conn.get(bi, 0),
            "reuse_rate": None if not n else round(reused / n, 6),
            "dns_lookups": dns.get(bi, 0),
            "ttfb_ms": percentiles(ttfb),
            "ttlb_ms": percentiles(ttlb),
            "retransmissions": retx.get(bi, 0),
            "bytes": nbytes,
            "estimated": estimated,
        }
        if hop_names:
            entry["hops"] = {h: {"own_ms": percentiles([
                v / NS_PER_MS for i in idx
                if (v := own_at(owns[i], requests[i], h)) is not None])} for h in hop_names}
        series.append(entry)
    return series, is_sparse


def _in_flight_max(requests: Sequence[Request],
                   bins: list[int], origin: int, interval_ns: int) -> list[int]:
    """Per listed interval, the most requests open at once within it (a sweep: ends
    before starts at the same instant)."""
    # one integer per event, 2 * time + 1 for a start and 2 * time for an end: sorted,
    # an instant's ends come before its starts
    events = sorted([2 * r.ts_ns + 1 for r in requests]
                    + [2 * max(r.ts_ns, r.last_byte_ns or r.first_byte_ns or r.ts_ns)
                       for r in requests])
    out = []
    cur = 0
    j = 0
    n = len(events)
    for bi in bins:
        start = origin + bi * interval_ns
        end = start + interval_ns
        while j < n and events[j] >> 1 < start:
            cur += 1 if events[j] & 1 else -1
            j += 1
        peak = cur
        while j < n and events[j] >> 1 < end:
            cur += 1 if events[j] & 1 else -1
            j += 1
            if cur > peak:
                peak = cur
        out.append(peak)
    return out


def _knee(name: str, series: list[dict[str, Any]], metric: str, pkey: str, word: str,
          interval_ns: int, seed: int) -> dict[str, Any] | str:
    """A contract ``knees`` entry, or why there is none."""
    rates = [e["rate_per_s"] for e in series]
    counts = [e["requests"] for e in series]
    values = [_num(e["ttfb_ms"].get(pkey)) for e in series]
    found = find_knee(rates, values, counts, seed=seed)
    if isinstance(found, Declined):
        return found.reason
    assert isinstance(found, Knee)
    hops: dict[str, dict[str, float | None]] = {}
    hop_names = sorted({h for e in series for h in e.get("hops", {})})
    for h in hop_names:
        hv = [_num(e["hops"][h]["own_ms"].get(pkey)) if "hops" in e and h in e["hops"]
              else math.nan for e in series]
        hc = [e["hops"][h]["own_ms"]["count"] if "hops" in e and h in e["hops"] else 0
              for e in series]
        below, above = level_change(rates, hv, hc, found.rate_per_s)
        if below is not None and above is not None:
            hops[h] = {"below_ms": round(below, 3), "above_ms": round(above, 3)}
    rise = found.above_ms - found.below_ms
    growing = None
    if hops:
        h, d = max(((h, v["above_ms"] - v["below_ms"]) for h, v in hops.items()  # type: ignore[operator]
                    ), key=lambda x: x[1])
        if rise > 0 and d >= HOP_SHARE * rise:
            growing = h
    rate = _fmt_rate(found.rate_per_s)
    lo, hi = found.ci
    evidence = [
        f"{pkey} TTFB {_fmt_ms(found.below_ms)} over {found.below} intervals below {rate} "
        f"req/s, {_fmt_ms(found.above_ms)} over {found.above} above "
        f"({format_interval(interval_ns)} intervals)",
    ]
    clauses = []
    for h, v in hops.items():
        b_ms, a_ms = v["below_ms"], v["above_ms"]
        assert b_ms is not None and a_ms is not None
        evidence.append(f"{h} own time {_fmt_ms(b_ms)} -> {_fmt_ms(a_ms)}")
        if abs(a_ms - b_ms) < max(STAYS * b_ms, 1.0):
            clauses.append(f"the {h}'s stays at {_fmt_ms(b_ms)}")
        elif a_ms > b_ms:
            clauses.append(f"the {h}'s own time grows from {_fmt_ms(b_ms)} to "
                           f"{_fmt_ms(a_ms)}")
        else:
            clauses.append(f"the {h}'s own time falls from {_fmt_ms(b_ms)} to "
                           f"{_fmt_ms(a_ms)}")
    if growing is not None:  # the growing hop first
        first = [c for c in clauses if c.startswith(f"the {growing}'s ")]
        clauses = first + [c for c in clauses if c not in first]
    sentence = (f"{name}'s {word} time to first byte rises from {_fmt_ms(found.below_ms)} "
                f"to {_fmt_ms(found.above_ms)} above {rate} req/s (95% CI "
                f"{_fmt_rate(lo)}-{_fmt_rate(hi)})")
    if clauses:
        sentence += "; " + "; ".join(clauses)
    return {"path": name, "metric": metric, **found.to_json(), "hop": growing, "hops": hops,
            "evidence": evidence, "sentence": sentence + "."}


def _finding(k: dict[str, Any]) -> Finding:
    word = "p99" if k["metric"] == "ttfb_p99" else "median"
    title = (f"{k['path']}'s {word} time to first byte rises above "
             f"{_fmt_rate(k['rate_per_s'])} req/s")
    if k.get("hop"):
        title += f" (at the {k['hop']})"
    return Finding("warning", "latency-knee", title, k["sentence"], list(k["evidence"]))


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}"


def _fmt_ms(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f} ms"
    if abs(x) >= 10:
        return f"{x:.1f} ms"
    return f"{x:.2f} ms"


def load_of_paths(connections: Sequence[Connection], dns_records: Sequence[DnsTransaction],
                  budgets: dict[str, PathBudget]) -> LoadBuilder:
    """The rows of an attributed capture: each path's client requests (chain roots at its
    first hop, with their hops' own times where the chain is complete), its client
    connections, the retransmissions of all its connections and the DNS lookups that
    answered its client-facing servers; requests on connections of no path under None."""
    lb = LoadBuilder()
    by_id = {c.id: c for c in connections}
    by_answer: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(dns_records):
        for a in set(t.answers):
            by_answer[a].append(i)
    on_path: set[int] = set()
    for name in sorted(budgets):
        b = budgets[name]
        for root, own in zip(b.roots, b.root_own, strict=True):
            lb.request_of(name, root.req, root.index == 0, own)
        ips = set()
        for cid in b.client_connections:
            c = by_id.get(cid)
            if c is not None:
                lb.connection(name, c.ts_ns)
                ips.add(split_endpoint(c.server)[0])
        hits = sorted({i for ip in ips for i in by_answer.get(ip, ())})
        on_path.update(hits)
        for i in hits:
            lb.dns(name, dns_records[i].ts_ns)
    for c in connections:
        path_name: str | None = None if c.path is None else c.path.get("name")
        if c.retransmission_ns:
            lb.retransmissions(path_name, c.retransmission_ns)
        if path_name is None:
            for k, r in enumerate(c.requests):
                lb.request_of(None, r, k == 0)
            if c.requests:
                lb.connection(None, c.ts_ns)
    for i, t in enumerate(dns_records):
        if i not in on_path:
            lb.dns(None, t.ts_ns)
    return lb


class StreamingLoad:
    """Load rows from records as they stream (``--format jsonl``): a connection's path
    is its profile match only (no inferred paths: they need the whole capture), its
    requests are client requests when it matched its path's first hop; without a
    profile every request is on no path. No per-hop own times (no chains)."""

    def __init__(self, profile: Profile | None) -> None:
        self.profile = profile
        self.builder = LoadBuilder()
        self._servers: dict[str, set[str]] = defaultdict(set)
        self._dns: list[tuple[int, tuple[str, ...]]] = []

    def connection(self, c: Connection) -> None:
        """Observe one finished connection."""
        lb = self.builder
        m = self.profile.match(c) if self.profile is not None else None
        name = None if m is None else m.path
        pdef = None if m is None or self.profile is None else self.profile.path(m.path)
        first = m is None or (pdef is not None and pdef.hops and pdef.hops[0] == m.hop)
        if c.retransmission_ns:
            lb.retransmissions(name, c.retransmission_ns)
        if not first or not c.requests:
            return
        lb.connection(name, c.ts_ns)
        if name is not None:
            self._servers[name].add(split_endpoint(c.server)[0])
        for k, r in enumerate(c.requests):
            lb.request(name, r.ts_ns, r.first_byte_ns, r.last_byte_ns,
                       (r.request_bytes or 0) + (r.response_bytes or 0), k == 0, r.estimated)

    def dns(self, t: DnsTransaction) -> None:
        """Observe one DNS transaction."""
        self._dns.append((t.ts_ns, tuple(t.answers)))

    def build(self, interval_ns: int | None = None, *, seed: int = 0) -> Load:
        for ts, answers in self._dns:
            hit = False
            for name, ips in self._servers.items():
                if any(a in ips for a in answers):
                    self.builder.dns(name, ts)
                    hit = True
            if not hit:
                self.builder.dns(None, ts)
        self._dns = []
        return self.builder.build(interval_ns, seed=seed)
