"""The unit of work of a fleet: one capture set, or one flow shard of it.

:func:`run_task` runs wherever it is sent (this process, a Dask worker on another
machine) and returns bytes: the records it finished, packed as tuples of their fields
(``netdiag.shard``'s packing: compiled and pure-Python records do not share a pickle),
with what the merge needs of the capture. Workers open the files themselves, through
fsspec for URLs, so no shared file system is needed for those.

* one shard of one (``shards == 1``): the pipeline as one process runs it; the records
  come back in the order that process emits them;
* shard ``k`` of ``n``: ``netdiag.shard``'s shard run (every shard reads the whole set
  and keeps the flows whose endpoints hash to it); the client merges the ``n`` outputs
  exactly as ``--jobs n`` does, or, when only one process can be exact
  (``"sequential"``), runs the set again as one shard.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import pickle
from operator import attrgetter
from types import SimpleNamespace
from typing import Any

from netdiag.pipeline import Options, _analyze
from netdiag.records import DnsTransaction, Warning_
from netdiag.result import CaptureFacts, Result
from netdiag.tls.keylog import KeyLog

PLAIN, SHARD, SEQUENTIAL = "plain", "shard", "sequential"
"""Kinds of task result."""
DNS, CONNECTION = 0, 1
"""Kinds of record in a plain result."""

_get_dns = attrgetter(*(f.name for f in dataclasses.fields(DnsTransaction)))
_get_warning = attrgetter(*(f.name for f in dataclasses.fields(Warning_)))


@dataclasses.dataclass
class SetTask:
    """What a worker needs to analyze one set (or one shard of it): plain data only."""

    set_index: int
    paths: list[str]
    options: Options
    """The run's options without progress callback or key log (see ``keylog``)."""
    keylog: bytes | None = None
    """The key log as NSS text (``KeyLog.to_bytes``), None without one."""
    shard: int = 0
    shards: int = 1
    render: bool = False
    """Render JSON Lines in the worker (``JsonlSink.render_*``), as ``--jobs`` shards do."""


def task_options(options: Options) -> tuple[Options, bytes | None]:
    """``options`` as a task carries them, and the key log as text."""
    keylog = options.keylog.to_bytes() if options.keylog is not None else None
    # no budget for a worker's shard: it sends its records back either way, and one
    # run of the whole set in its place would hold them all
    plain = dataclasses.replace(options, progress=None, keylog=None, jobs=1, shard=None,
                                max_memory=None, max_records=None)
    return plain, keylog


def set_options(task: SetTask) -> Options:
    """The options of a set's run: a key log of its own (a copy), one process."""
    keylog = None
    if task.keylog is not None:
        keylog = KeyLog()
        if task.keylog:
            keylog.merge(KeyLog.parse(task.keylog, "--keylog"))
    return dataclasses.replace(task.options, keylog=keylog, jobs=1, shard=None, progress=None,
                               summarize=False)  # the client's fleet counts the records


# -- packing -----------------------------------------------------------------------------

def pack_facts(facts: CaptureFacts) -> dict[str, Any]:
    d = {f.name: getattr(facts, f.name) for f in dataclasses.fields(CaptureFacts)}
    d["warnings"] = [_get_warning(w) for w in facts.warnings]
    return d


def unpack_facts(d: dict[str, Any]) -> CaptureFacts:
    d = dict(d)
    d["warnings"] = [Warning_(*w) for w in d["warnings"]]
    return CaptureFacts(**d)


class _ListSink:
    """Keeps the records in the order the pipeline emits them, packed, maybe rendered."""

    def __init__(self, render: bool) -> None:
        from netdiag.report.records_out import JsonlSink
        from netdiag.shard import pack_connection

        self.records: list[tuple[int, Any, str | None]] = []
        self._pack = pack_connection
        self._render_dns = JsonlSink.render_dns if render else None
        self._render_connection = JsonlSink.render_connection if render else None

    def dns(self, t: DnsTransaction) -> None:
        r = self._render_dns
        self.records.append((DNS, _get_dns(t), r(t) if r is not None else None))

    def connection(self, c: Any) -> None:
        r = self._render_connection
        self.records.append((CONNECTION, self._pack(c), r(c) if r is not None else None))


def run_task(task: SetTask) -> bytes:
    """Analyze ``task`` (module docstring); the packed result."""
    options = set_options(task)
    if task.shards <= 1:
        sink = _ListSink(task.render)
        res, _run = _analyze(task.paths, sink, options)
        keylog = res.keylog.to_bytes() if res.keylog is not None else None
        gc.disable()
        try:
            return pickle.dumps((PLAIN, task.set_index, sink.records, pack_facts(res.capture),
                                 res.client_randoms, keylog), pickle.HIGHEST_PROTOCOL)
        finally:
            gc.enable()
    from netdiag import shard as sh
    from netdiag.report.records_out import JsonlSink

    opts = sh._shard_options(options, task.shard, task.shards, parent=False)
    sink_like: Any = JsonlSink(io.StringIO()) if task.render else _Discard()
    try:
        res, run = _analyze(task.paths, sink_like, opts, sh.ShardRun)
    except sh.Sequential:
        return pickle.dumps((SEQUENTIAL, task.set_index, task.shard))
    assert isinstance(run, sh.ShardRun)
    extra = None
    if task.shard == 0:
        keylog = run.keylog.to_bytes() if run.keylog is not None else None
        extra = (pack_facts(res.capture),
                 [[_get_warning(w) for w in r.warnings] for r in run.readers], keylog)
    gc.disable()
    try:
        return pickle.dumps((SHARD, task.set_index, task.shard, sh.pack_output(run.output()),
                             extra), pickle.HIGHEST_PROTOCOL)
    finally:
        gc.enable()


class _Discard:
    def dns(self, t: Any) -> None:
        pass

    def connection(self, c: Any) -> None:
        pass


# -- the client side -----------------------------------------------------------------------

def feed_plain(payload: tuple[Any, ...], sink: Any, options: Options) -> Result:
    """Replay a plain result into ``sink``; the set's result (its summary is left empty:
    the fleet builds its own from the records)."""
    from netdiag.analysis.summary import SummaryBuilder
    from netdiag.shard import unpack_connection

    _kind, _i, records, facts, randoms, keylog = payload
    dns_rendered = getattr(sink, "dns_rendered", None)
    connection_rendered = getattr(sink, "connection_rendered", None)
    for kind, rec, text in records:
        if kind == CONNECTION:
            c = unpack_connection(rec)
            if text is not None and connection_rendered is not None:
                connection_rendered(c, text)
            else:
                sink.connection(c)
        else:
            t = DnsTransaction(*rec)
            if text is not None and dns_rendered is not None:
                dns_rendered(t, text)
            else:
                sink.dns(t)
    return Result(unpack_facts(facts), SummaryBuilder(), [], options.thresholds, set(randoms),
                  _keylog(keylog))


@dataclasses.dataclass
class PreparedShards:
    """The merged shard outputs of one set, ready to be replayed."""

    merged: Any
    facts: CaptureFacts
    reader_warnings: list[list[Warning_]]
    keylog: KeyLog | None


def prepare_shards(payloads: list[tuple[Any, ...]]) -> PreparedShards | None:
    """Merge the shard results of one set as ``netdiag.shard`` does; None when only one
    process can be exact."""
    from netdiag import shard as sh

    payloads = sorted(payloads, key=lambda p: p[2])
    outputs = [sh.unpack_output(p[3]) for p in payloads]
    facts_d, reader_warnings, keylog = payloads[0][4]
    facts = unpack_facts(facts_d)
    merged = sh.merge(outputs, facts)
    if merged is None:
        return None
    return PreparedShards(merged, facts,
                          [[Warning_(*w) for w in ws] for ws in reader_warnings],
                          _keylog(keylog))


def replay_prepared(prepared: PreparedShards, sink: Any, options: Options) -> Result:
    """Replay merged shard outputs into ``sink``; the set's result."""
    from netdiag import shard as sh

    run0 = SimpleNamespace(readers=[SimpleNamespace(warnings=ws)
                                    for ws in prepared.reader_warnings],
                           keylog=prepared.keylog)
    res0 = SimpleNamespace(capture=prepared.facts)
    opts = dataclasses.replace(options, keylog=None)  # run0's is the set's, with its blocks'
    result: Result = sh.replay(prepared.merged, sink, opts, run0, res0)  # type: ignore[arg-type]
    return result


def _keylog(data: bytes | None) -> KeyLog | None:
    if data is None:
        return None
    log = KeyLog()
    if data:
        log.merge(KeyLog.parse(data, "decryption secrets"))
    return log
