"""A fleet's report: every capture set analyzed (here, in a process pool, or on Dask),
the records merged exactly, the summary and findings computed once over them.

The sets of a :class:`~netdiag.fleet.sets.Plan` are independent analyses. Their records
reach the sink set after set, in key order, each set's in the order one process
emits them; connection ids are renumbered so that they stay unique: set after set, a
set's ``C1..Cn`` following the previous sets' (``C1..Cn`` as before when there is one
set). The summary, the findings and the ``groups`` (``--by``) are then built from those
records in that order, wherever the sets ran, so that every executor writes the same
report byte for byte, and one set gives what ``analyze`` alone gives.

Executors (``--executor``):

* ``serial``: one set after another, in this process;
* ``local``: one set after another, each with the ``--jobs`` process pool
  (``netdiag.shard``): the default;
* ``dask``: one task per (set, flow shard) on a ``dask.distributed`` scheduler
  (:mod:`netdiag.fleet.dask_executor`), retried when a worker dies.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from netdiag.analysis.findings import build_findings
from netdiag.analysis.summary import SummaryBuilder
from netdiag.fleet.sets import CaptureFile, CaptureSet, Plan
from netdiag.fleet.sketch import DEFAULT_RELATIVE_ACCURACY, SketchedSummary
from netdiag.pipeline import Options, analyze
from netdiag.record_cost import connection_bytes, dns_bytes
from netdiag.records import Connection, DnsTransaction, Warning_, ns_to_ts
from netdiag.report.units import bytes_text
from netdiag.result import CaptureFacts, Result, renders
from netdiag.tls.keylog import KeyLog

EXECUTORS = ("serial", "local", "dask")
GROUPINGS = ("host", "file", "set")


@dataclasses.dataclass
class Progress:
    """What a progress bar shows: sets and bytes (as stored) done."""

    sets_done: int
    sets: int
    bytes_done: int
    bytes_total: int


@dataclasses.dataclass
class FleetOptions:
    """How a fleet is run (the report's own options stay in ``Options``)."""

    executor: str = "local"
    by: str | None = None
    """``host``, ``file`` or ``set``: the report gains ``groups``."""
    jobs: int | None = None
    """``--jobs`` as given: processes per set (local), flow shards per set (dask)."""
    scheduler: str | None = None
    """Dask scheduler address or scheduler file; None: ``$NETDIAG_DASK_SCHEDULER``,
    else a local cluster."""
    workers: int | None = None
    """Workers of the local Dask cluster (None: one per CPU)."""
    retries: int = 2
    """Times a Dask task is retried after it failed."""
    max_records: int | None = None
    """Records (connections and DNS transactions) beyond which the summary is sketched
    and a collecting sink is emptied (:mod:`netdiag.fleet.sketch`); None: exact always."""
    max_memory: int | None = None
    """Bytes the held records may take (:mod:`netdiag.fleet.memory`'s estimate) before
    the summary is sketched and a collecting sink emptied; None: no bound."""
    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY
    holds_records: bool = True
    """The sink keeps every record (json, text...), as opposed to streaming them."""
    progress: Callable[[Progress], None] | None = None


@dataclasses.dataclass
class FleetResult:
    """The merged result, and what the fleet adds to the report."""

    result: Result
    groups: list[dict[str, Any]] | None = None
    sketched: bool = False
    omitted: dict[str, int] = dataclasses.field(default_factory=dict)
    """Records not kept for the document once sketched (``connections``, ``dns``)."""
    by: str | None = None


Feed = Callable[[Any], Result]
"""Replays (or runs) one set's analysis into a sink and returns the set's result."""


# -- the sink of one set -------------------------------------------------------------------

class _SetSink:
    """Renumbers one set's connections, counts its records, passes them on."""

    def __init__(self, fleet: _Fleet, index: int, offset: int) -> None:
        self.fleet = fleet
        self.index = index
        self.offset = offset
        self.last_id = 0
        """The largest local connection number seen."""

    def _rename(self, c: Connection) -> None:
        n = int(c.id[1:])
        if n > self.last_id:
            self.last_id = n
        if self.offset:
            c.id = f"C{n + self.offset}"

    def dns(self, t: DnsTransaction) -> None:
        if self.fleet.add_dns(self.index, t):
            self.fleet.sink.dns(t)

    def connection(self, c: Connection) -> None:
        self._rename(c)
        if self.fleet.add_connection(self.index, c):
            self.fleet.sink.connection(c)


class _RenderingSetSink(_SetSink):
    """The same for a sink that renders records apart from writing them (``JsonlSink``):
    ``netdiag.shard`` and the Dask tasks render in the process that finished them."""

    def __init__(self, fleet: _Fleet, index: int, offset: int) -> None:
        super().__init__(fleet, index, offset)
        sink = fleet.sink
        self.render_dns = sink.render_dns
        self.render_connection = sink.render_connection

    def dns_rendered(self, t: DnsTransaction, text: str) -> None:
        if self.fleet.add_dns(self.index, t):
            self.fleet.sink.dns_rendered(t, text)

    def connection_rendered(self, c: Connection, text: str) -> None:
        self._rename(c)
        if self.fleet.add_connection(self.index, c):
            self.fleet.sink.connection_rendered(c, text)


# -- the merge ---------------------------------------------------------------------------------

@dataclasses.dataclass
class _Group:
    key: str
    files: list[str]
    summary: SummaryBuilder


class _Fleet:
    """Everything built over all sets: summary, groups, record counts."""

    def __init__(self, plan: Plan, sink: Any, fleet: FleetOptions) -> None:
        self.plan = plan
        self.sink = sink
        self.options = fleet
        self.summary: SummaryBuilder = SummaryBuilder()
        self.records = 0
        self.held_bytes = 0
        """The estimated memory of the records held so far (``netdiag.fleet.memory``)."""
        self.trigger: str | None = None
        """What made the summaries sketched (``max_records``, ``max_memory``); None: exact."""
        self.omitted: Counter[str] = Counter()
        self.groups: dict[str, _Group] = {}
        self._set_groups: list[str] = []
        self._file_starts: list[tuple[list[int], list[str]]] = []
        by = fleet.by
        for s in plan.sets:
            if by == "set":
                self._group(s.key, s.paths)
            elif by == "host":
                g = self._group(s.host, [])
                g.files.extend(s.paths)
            self._set_groups.append(s.host if by == "host" else s.key)
            if by == "file":
                timed = sorted(s.files, key=lambda f: (f.first_ns is None, f.first_ns or 0,
                                                       f.index))
                starts = [f.first_ns if f.first_ns is not None else 1 << 62 for f in timed]
                for f in s.files:
                    self._group(f.name, [f.name])
                self._file_starts.append((starts, [f.name for f in timed]))

    @property
    def sketched(self) -> bool:
        return self.trigger is not None

    def _group(self, key: str, files: list[str]) -> _Group:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(key, files, SummaryBuilder())
            if self.sketched:
                g.summary = SketchedSummary(self.options.relative_accuracy)
        return g

    def _group_of(self, index: int, ts_ns: int) -> _Group | None:
        by = self.options.by
        if by is None:
            return None
        if by != "file":
            return self.groups[self._set_groups[index]]
        starts, names = self._file_starts[index]
        i = max(0, bisect.bisect_right(starts, ts_ns) - 1)
        return self.groups[names[i]]

    def _count(self, kind: str, cost: int) -> bool:
        """Count a record of ``cost`` estimated bytes; False when the sink is not to keep
        it (sketched)."""
        self.records += 1
        if not self.sketched:
            limit = self.options.max_records
            budget = self.options.max_memory
            if limit is not None and self.records > limit:
                self.trigger = "max_records"
            elif budget is not None and self.options.holds_records:
                self.held_bytes += cost
                if self.held_bytes > budget:
                    self.trigger = "max_memory"
            if self.sketched:
                self._sketch()
        if self.sketched and self.options.holds_records:
            self.omitted[kind] += 1
            return False
        return True

    def _sketch(self) -> None:
        """From now on: sketched summaries, and no more records held."""
        acc = self.options.relative_accuracy
        self.summary = SketchedSummary.of(self.summary, acc)
        for g in self.groups.values():
            g.summary = SketchedSummary.of(g.summary, acc)
        if self.options.holds_records:
            for attr, kind in (("connections", "connections"), ("dns_records", "dns")):
                held = getattr(self.sink, attr, None)
                if isinstance(held, list):
                    self.omitted[kind] += len(held)
                    held.clear()

    def add_dns(self, index: int, t: DnsTransaction) -> bool:
        keep = self._count("dns", dns_bytes(t))
        self.summary.add_dns(t)
        g = self._group_of(index, t.ts_ns)
        if g is not None:
            g.summary.add_dns(t)
        return keep

    def add_connection(self, index: int, c: Connection) -> bool:
        keep = self._count("connections", connection_bytes(c))
        self.summary.add_connection(c)
        g = self._group_of(index, c.ts_ns)
        if g is not None:
            g.summary.add_connection(c)
        return keep

    def sink_for(self, index: int, offset: int) -> _SetSink:
        if renders(self.sink):
            return _RenderingSetSink(self, index, offset)
        return _SetSink(self, index, offset)


_CONN_WARNING = re.compile(r"C(\d+) ")


def _renumber(w: Warning_, offset: int) -> Warning_:
    """A warning about connection ``Cn`` of a set, with the connection's report id."""
    if not offset or w.kind == "capture":
        return w
    m = _CONN_WARNING.match(w.message)
    if m is None:
        return w
    return dataclasses.replace(w, message=f"C{int(m.group(1)) + offset} {w.message[m.end():]}")


def merge_facts(parts: list[tuple[CaptureFacts, int]], damaged: list[CaptureFile]) -> CaptureFacts:
    """The ``capture`` facts of all sets (each with its connection id offset), and a
    warning for each file whose header could not be read."""
    out = CaptureFacts()
    firsts: list[int] = []
    lasts: list[int] = []
    ports: set[int] = set()
    for facts, offset in parts:
        out.files.extend(facts.files)
        out.packets += facts.packets
        out.bytes += facts.bytes
        out.truncated = out.truncated or facts.truncated
        for w in facts.warnings:
            out.warn(_renumber(w, offset))
        out.warnings_dropped += facts.warnings_dropped
        out.secrets.extend(facts.secrets)
        out.undecoded += facts.undecoded
        for lt in facts.link_types:
            if lt not in out.link_types:
                out.link_types.append(lt)
        for name, times in facts.limits_hit.items():
            out.limits_hit[name] = out.limits_hit.get(name, 0) + times
        ports.update(facts.dns_ports_found)
        if facts.first_ns is not None:
            firsts.append(facts.first_ns)
        if facts.last_ns is not None:
            lasts.append(facts.last_ns)
    for f in damaged:
        out.files.append(f.name)
        out.truncated = True
        out.warn(Warning_("capture", f"{f.error}; the file is not reported", file=f.name,
                          offset=0, packet=1))
    out.first_ns = min(firsts) if firsts else None
    out.last_ns = max(lasts) if lasts else None
    out.limits_hit = dict(sorted(out.limits_hit.items()))
    out.dns_ports_found = sorted(ports)
    return out


# -- executors --------------------------------------------------------------------------------

def set_options(options: Options, jobs: int) -> Options:
    """One set's options: a copy of the key log (the set's pcapng secrets stay its own)."""
    keylog = None
    if options.keylog is not None:
        keylog = KeyLog()
        keylog.merge(options.keylog)
    return dataclasses.replace(options, keylog=keylog, jobs=jobs, shard=None,
                               summarize=False)  # the fleet counts the records itself


def _in_process(plan: Plan, options: Options, fleet: FleetOptions,
                report: Callable[[int, int], None]) -> Iterator[tuple[int, Feed]]:
    """``serial`` and ``local``: each set analyzed here when its turn comes."""
    from netdiag.shard import resolve_jobs

    for i, s in enumerate(plan.sets):
        jobs = 1 if fleet.executor == "serial" else resolve_jobs(fleet.jobs, s.paths)
        opts = set_options(options, jobs)
        if fleet.progress is not None:
            opts.progress = lambda done, _total, i=i: report(i, done)

        def feed(sink: Any, s: CaptureSet = s, opts: Options = opts) -> Result:
            return analyze(s.paths, sink, opts)

        yield i, feed


def run_fleet(plan: Plan, sink: Any, options: Options, fleet: FleetOptions) -> FleetResult:
    """Analyze every set of ``plan`` into ``sink`` (module docstring)."""
    acc = _Fleet(plan, sink, fleet)
    sizes = [s.size for s in plan.sets]
    total = sum(sizes)
    base = [sum(sizes[:i]) for i in range(len(sizes))]

    def report(i: int, done: int) -> None:
        if fleet.progress is not None:
            fleet.progress(Progress(i, len(sizes), base[i] + min(done, sizes[i]), total))

    feeds: Iterator[tuple[int, Feed]]
    if fleet.executor == "dask":
        from netdiag.fleet.dask_executor import dask_feeds

        feeds = dask_feeds(plan, options, fleet, renders(sink))
    else:
        feeds = _in_process(plan, options, fleet, report)
    parts: list[tuple[CaptureFacts, int]] = []
    randoms: set[bytes] = set()
    keylog: KeyLog | None = None
    offset = 0
    with contextlib.closing(feeds):  # type: ignore[type-var]
        for i, feed in feeds:
            set_sink = acc.sink_for(i, offset)
            res = feed(set_sink)
            parts.append((res.capture, offset))
            randoms |= res.client_randoms
            if res.keylog is not None:
                keylog = keylog or KeyLog()
                keylog.merge(res.keylog)
            offset += set_sink.last_id
            if fleet.progress is not None and fleet.executor != "dask":  # dask: as tasks end
                fleet.progress(Progress(i + 1, len(sizes), base[i] + sizes[i], total))
    facts = merge_facts(parts, plan.damaged)
    if acc.sketched:
        _say_sketched(facts, acc, fleet)
    if options.keylog is not None and keylog is not None:
        options.keylog.merge(keylog)  # as one analysis leaves it: with the blocks' secrets
        keylog = options.keylog
    findings = build_findings(acc.summary, options.thresholds, facts.truncated)
    result = Result(facts, acc.summary, findings, options.thresholds, randoms, keylog)
    groups = None
    if fleet.by is not None:
        groups = [_group_json(g, plan, facts) for g in acc.groups.values()]
    return FleetResult(result, groups, acc.sketched, dict(acc.omitted), fleet.by)


def _say_sketched(facts: CaptureFacts, acc: _Fleet, fleet: FleetOptions) -> None:
    """The limit that made the summary sketched, counted and said in one warning."""
    pct = f"{fleet.relative_accuracy:.0%}"
    if acc.trigger == "max_records":
        why = f"more than {fleet.max_records} records (--max-records)"
    else:
        why = (f"records estimated at more than {bytes_text(fleet.max_memory or 0)} "
               "(--max-memory)")
    what = ("the report lists none of them" if fleet.holds_records
            else "JSON Lines still lists them all")
    facts.limits_hit[acc.trigger or ""] = 1
    facts.limits_hit = dict(sorted(facts.limits_hit.items()))
    facts.warn(Warning_("limit", f"{why}: percentiles are sketched ({pct} relative "
                                 f"error, summary.sketch) and {what}"))


def _group_json(g: _Group, plan: Plan, facts: CaptureFacts) -> dict[str, Any]:
    files = set(g.files)
    infos = [f for f in plan.files if f.name in files]
    firsts = [f.first_ns for f in infos if f.first_ns is not None]
    lasts = [f.last_ns for f in infos if f.last_ns is not None]
    damaged = any(w.kind == "capture" and w.file in files for w in facts.warnings)
    return {"key": g.key, "files": g.files, "summary": g.summary.build(),
            "first_ts": ns_to_ts(min(firsts)) if firsts else None,
            "last_ts": ns_to_ts(max(lasts)) if lasts else None,
            "truncated": damaged}
