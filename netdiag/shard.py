"""``--jobs N``: one analysis in N processes, merged into exactly what one process gives.

Every process reads all of the input and runs the whole pipeline (the parent is shard
0, forked children are the others), but its flow table keeps only the TCP connections
and UDP DNS flows whose endpoints hash to its shard (:func:`netdiag.flows.table.shard_of`):
a packet of another shard is dropped right after its flow key is built. What comes
before the key (link and IP decode, fragments, undecoded packets, timestamps, counts,
the sweep every ``SWEEP_EVERY`` packets, pcapng decryption-secrets blocks) is the same
in every process and taken from shard 0; a DNS transaction (client, server, id) lives
where its UDP flow or its TCP connection does.

Each shard records what it emits (connections, DNS transactions, warnings) with a
*position* that means the same in every process, ``(packet, phase, within, seq)``:

* at a packet, the sweep that runs before it: ``CONN`` with the creating packet of the
  connection being finished (the table finishes them in creation order), then
  ``EXPIRE`` with the expiry-order place of the DNS transaction (``DnsAnalyzer.clock``:
  the position of its last move to the end of that order);
* the packet itself (``PACKET``): a reused 4-tuple, a DNS id reused or answered too late;
* after the input (packet ``END``): ``CONN`` (``finish_all``), ``SECRETS``, ``DNS_END``;
* ``seq`` counts events inside one shard. Two events can only share the first three
  parts in one shard (one packet, connection or transaction belongs to one shard).

The parent sorts the events of all shards by position, numbers the connections
``C1..CN`` by the packet that created them (as one process does), and replays the
events through the summary, the warnings and the sink in that order: the sink and the
summary see what one process shows them, in the same order, only later. A sink may
offer ``render_dns``/``dns_rendered`` and ``render_connection``/``connection_rendered``
(``JsonlSink`` does): records are then rendered in the shard that finished them, which
keeps the serial part small.

For a sink that streams (``JsonlSink``: it takes records rendered apart from writing
them), each shard writes its events to a file at every sweep, in position order
(:class:`_Spill`), rather than holding them until the merge, and the parent merges the
files as it reads them: no process holds the records of the whole input, as none does
in one process. The files are anonymous (``tempfile.TemporaryFile`` in ``TMPDIR``, made
by the parent before it forks and shared with the shards): however the run ends, even
killed, the system takes their space back with the last process. Where they cannot be
made or written, the input is analyzed in one process.

Two things that one process does across shards are checked afterwards; if either
happened, the input is analyzed again in one process (exact, but twice the time):

* a TLS key-log decryption-secrets block read after the first TLS connection was
  decided: one process adds such secrets to the key log when it decides a TLS
  connection, so which connections saw them would depend on the other shards;
* a DNS expiry stopped early: one process expires transactions in their expiry order
  up to the first one still active, which may be another shard's. It matters only when
  the last-activity times are out of that order (a DNS over TCP message is timed by
  its first segment, a capture out of time order), so ``EXPIRE`` is checked per sweep.

For any other sink, a shard stops at once, and the input is analyzed in one process,
where the records it holds pass its share of ``Options.max_memory`` (``--max-memory``)
or of ``Options.max_records`` (``--max-records``): such a shard keeps every record
until the merge, and one process listing them sketches the summary past either bound
(``netdiag.fleet``). A cap over all connections reached by a shard
(``Limits.on_global_hit``) does the same, whatever the sink.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import heapq
import multiprocessing
import os
import pickle
import signal
import tempfile
import traceback
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from operator import attrgetter, itemgetter
from typing import IO, Any

from netdiag.analysis.findings import build_findings
from netdiag.analysis.summary import NoSummary, SummaryBuilder
from netdiag.capture.reader import CaptureReader
from netdiag.fileio import pread_all
from netdiag.gcpolicy import Settler, settle
from netdiag.pipeline import DSB_TLS_KEY_LOG, Options, _analyze, _Run, record_limits
from netdiag.protocols.dns import MAX_WARNINGS as DNS_MAX_WARNINGS
from netdiag.protocols.dns import DnsAnalyzer
from netdiag.quick_exit import flush_standard_streams
from netdiag.record_cost import connection_bytes, dns_bytes
from netdiag.records import (
    Connection,
    DnsTransaction,
    Request,
    TlsInfo,
    Warning_,
    compact_gaps,
)
from netdiag.result import CaptureFacts, Result, Sink, renders
from netdiag.tls.keylog import KeyLog

AUTO_MIN_BYTES = 64 << 20
"""``--jobs`` unset or 0: input smaller than this (all files) is analyzed in one process
(starting the others and merging costs about what they save below this)."""

TRANSFER_EVENTS = 1024
"""Events a shard packs and sends per message: the records cross a thousand at a time,
so neither end ever holds all of a shard's events twice (as records and as pickled
bytes), and the parent unpacks one batch while the shard packs the next."""

END = 1 << 62
"""The packet position of what is emitted after the input (beyond any packet number)."""
CONN, EXPIRE, DNS_END, PACKET = 0, 1, 2, 3
"""Phases, in order, at one packet position (see the module docstring)."""
SECRETS = 1
"""The phase between ``CONN`` and ``DNS_END`` at ``END``."""

WARN, SECRETS_WARN, CONNECTION, DNS = 0, 1, 2, 3
"""Kinds of event."""

Position = tuple[int, int, Any, int]
Event = tuple[Position, int, Any, Any]
"""(position, kind, record, extra): a connection's extra is its rendered text or None, a
DNS transaction's the same, a warning's the id of the connection it may be about."""


class Sequential(BaseException):
    """Internal: a shard met what only one process can reproduce (module docstring).

    A ``BaseException``, so that the flow layer's guard around an analyzer (which
    catches ``Exception`` as an analyzer bug) lets it through."""


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Shard processes are forked: is that possible here?"""
    return "fork" in multiprocessing.get_all_start_methods()


def resolve_jobs(jobs: int | None, paths: list[str]) -> int:
    """``--jobs``: a positive count as given; None or 0 picks: the CPUs available, or 1
    for input below :data:`AUTO_MIN_BYTES` (or not regular files)."""
    if jobs:
        return jobs
    if not all(os.path.isfile(p) for p in paths):
        return 1  # a pipe, or a missing file (the analysis says what is wrong)
    try:
        total = sum(os.path.getsize(p) for p in paths)
    except OSError:
        return 1
    if total < AUTO_MIN_BYTES:
        return 1
    return available_cpus()


def _shardable(paths: list[str]) -> bool:
    """Every shard reads each file again: regular files only (not a pipe)."""
    return can_fork() and all(os.path.isfile(p) for p in paths)


# -- one shard --------------------------------------------------------------------------

def _created(flow: Any) -> int:
    """The packet that created a connection (its id is ``#packet`` in a shard run)."""
    return int(flow.conn.id[1:]) if flow is not None else -1


class _Facts(CaptureFacts):
    """Records the run's warnings as events (kept in order with the records)."""

    def __init__(self, run: ShardRun) -> None:
        super().__init__()
        self.run = run

    def warn(self, w: Warning_) -> None:
        run = self.run
        if run.in_sync:
            run.events.append((run.position(), SECRETS_WARN, w, None))
        else:
            flow = run.table.finishing
            run.events.append((run.position(), WARN, w,
                               flow.conn.id if flow is not None else None))


class _Recorder:
    """The sink of a shard run: each record becomes an event, rendered if the sink can."""

    def __init__(self, run: ShardRun, sink: Any) -> None:
        self.run = run
        pre = renders(sink)
        self.render_dns = getattr(sink, "render_dns", None) if pre else None
        self.render_connection = getattr(sink, "render_connection", None) if pre else None
        self.holds = run.spill is None
        """The records stay in memory until the output is sent (they are not spilled)."""
        self.settler = Settler()
        budget, records, shard = run.options.max_memory, run.options.max_records, \
            run.options.shard
        n = shard[1] if shard else 1
        self.room = None if budget is None or not self.holds else budget // n
        """Estimated bytes of records this shard may still hold (its share of
        ``Options.max_memory``; None: no bound, or nothing held)."""
        self.records_left = None if records is None or not self.holds else records // n
        """Records this shard may still hold (its share of ``Options.max_records``)."""

    def _hold(self, size: int) -> None:
        """Count a record kept; past the shard's share of the budget or of the records,
        only one process can stay within it."""
        if self.holds:
            self.settler.kept()
        if self.room is not None:
            self.room -= size
            if self.room < 0:
                raise Sequential("the records held passed --max-memory")
        if self.records_left is not None:
            self.records_left -= 1
            if self.records_left < 0:
                raise Sequential("the records held passed --max-records")

    def dns(self, t: DnsTransaction) -> None:
        run = self.run
        render = self.render_dns
        run.events.append((run.position(), DNS, t, None if render is None else render(t)))
        self._hold(dns_bytes(t))

    def connection(self, c: Connection) -> None:
        compact_gaps(c)  # held, then sent: 8 bytes a gap, pickled as one run of bytes
        run = self.run
        render = self.render_connection
        run.events.append((run.position(), CONNECTION, c,
                           None if render is None else render(c)))
        self._hold(connection_bytes(c))


class _Spill:
    """A shard's events written to a file in position order, a batch at a time as the
    scan goes (at each sweep), instead of held until the merge: for a sink that streams
    (JSON Lines), no process then holds the records of the whole input. A batch is an
    8-byte length and the pickle of its packed events (:func:`_pack_events`). The file
    (open for writing, at its start) is the parent's, shared through the fork: the
    parent reads it by its descriptor (:func:`read_spill`)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.fd = file.fileno()
        """The file's descriptor, the same number in the parent."""
        self.created: list[int] = []
        """The creating packets of the connections written."""
        self.first_secrets: Position | None = None
        """The position of the first secrets warning written."""

    def write(self, events: list[Event]) -> None:
        """Append ``events`` (in position order, after every event written so far)."""
        created = self.created
        for pos, kind, rec, _extra in events:
            if kind == CONNECTION:
                created.append(int(rec.id[1:]))
            elif kind == SECRETS_WARN and self.first_secrets is None:
                self.first_secrets = pos
        try:
            for i in range(0, len(events), TRANSFER_EVENTS):
                data = pickle.dumps(_pack_events(events[i:i + TRANSFER_EVENTS]),
                                    pickle.HIGHEST_PROTOCOL)
                self.file.write(len(data).to_bytes(8, "little"))
                self.file.write(data)
        except OSError as e:  # a full disk: one process needs no file
            raise Sequential(f"cannot spill the shard's records: {e}") from None

    def done(self) -> None:
        """Everything written reaches the file (which stays open: the parent's)."""
        try:
            self.file.flush()
        except OSError as e:
            raise Sequential(f"cannot spill the shard's records: {e}") from None


def read_spill(fd: int) -> Iterator[Event]:
    """The events a :class:`_Spill` wrote to descriptor ``fd``, in order, one batch in
    memory at a time (read by offset: the descriptor's own position is the writer's)."""
    offset = 0
    while len(head := os.pread(fd, 8, offset)) == 8:
        size = int.from_bytes(head, "little")
        data = pread_all(fd, size, offset + 8)
        if len(data) < size:
            raise EOFError("a shard's spilled events end early")
        offset += 8 + size
        batch: list[Event] = []
        _unpack_events(pickle.loads(data), batch)
        del data
        yield from batch


class ShardRun(_Run):
    """The pipeline of one shard: records events with their positions instead of emitting."""

    def __init__(self, sink: Sink, options: Options, facts: CaptureFacts,
                 readers: list[CaptureReader], spill: IO[bytes] | None = None) -> None:
        super().__init__(sink, options, facts, readers)
        self.events: list[Event] = []
        """The events not yet written to ``spill``: all of them without one."""
        self.spill = None if spill is None else _Spill(spill)
        """Where the events go at each sweep (``spill``: a file), else None."""
        self._seq = 0
        self._stage: str | None = None
        self._expiring_at = -1
        self.in_sync = False
        self.first_sync: tuple[Position, int] | None = None
        """Position of the first TLS decision and the TLS secrets blocks read by then."""
        self.udp_warnings: list[tuple[Position, str]] = []
        """The DNS analyzer's own warnings (UDP messages), with their positions."""
        self.udp_suppressed = 0
        """UDP warnings the DNS analyzer only counted."""
        self.expire_heads: dict[int, Any] = {}
        """Per sweep: the expiry-order place of the first transaction left open."""
        self.expired_last: dict[int, Any] = {}
        """Per sweep: the expiry-order place of the last transaction expired."""
        self.sink = _Recorder(self, sink)
        self.summary = NoSummary()  # the parent replays every record through its own
        self.facts = _Facts(self)
        self.dns.clock = self.position
        hooks = self.table.sweep_hooks
        hooks[hooks.index(self.dns.expire)] = self._expire
        self.table.on_dns_udp = self._on_udp
        self.limits.on_global_hit = self._global_limit

    @staticmethod
    def _global_limit(name: str) -> None:
        """A shard reached its share of a cap over all connections: one process would
        reach the whole cap, or might; only one process can say what it drops."""
        raise Sequential(f"limit {name} reached")

    def position(self) -> Position:
        """Where the run is, as every shard would say it (module docstring)."""
        self._seq += 1
        t = self.table
        stage = self._stage
        if stage is None:
            p = t.current
            if not t.in_sweep:
                return (p, PACKET, 0, self._seq)
            if self._expiring_at == p:
                return (p, EXPIRE, self.dns.finishing_order, self._seq)
            return (p, CONN, _created(t.finishing), self._seq)
        if stage == "finish":
            return (END, CONN, _created(t.finishing), self._seq)
        if stage == "secrets":
            return (END, SECRETS, 0, self._seq)
        return (END, DNS_END, self.dns.finishing_order, self._seq)

    def stage(self, name: str) -> None:
        self._stage = name

    def _spill_before(self, packet: int) -> None:
        """Write out the events positioned before ``packet``: no later event can sort
        before them (a position's packet is the one being read, or ``END``)."""
        events = self.events
        if self.spill is None or not events:
            return
        events.sort(key=itemgetter(0))
        k = bisect_left(events, packet, key=_packet_of)
        if k:
            self.spill.write(events[:k])
            del events[:k]

    def _expire(self, now_ns: int) -> None:
        p = self.table.current
        self._spill_before(p)
        self._expiring_at = p
        events = self.events
        n = len(events)
        self.dns.expire(now_ns)
        if len(events) > n:
            self.expired_last[p] = events[-1][0][2]
        head = self.dns.head_order()
        if head is not None:
            self.expire_heads[p] = head

    def _on_udp(self, ts_ns: int, src: str, dst: str, payload: bytes, packet: int) -> None:
        dns = self.dns
        warnings = dns.warnings
        n = len(warnings)
        suppressed = dns.stats["warnings_suppressed"]
        dns.on_udp(ts_ns, src, dst, payload, packet)
        if len(warnings) > n:
            self.udp_warnings.extend((self.position(), msg) for msg in warnings[n:])
        self.udp_suppressed += dns.stats["warnings_suppressed"] - suppressed

    def _sync_secrets(self) -> None:
        blocks = sum(1 for r in self.readers for stype, _d in r.secrets
                     if stype == DSB_TLS_KEY_LOG)
        if self.first_sync is None:
            if self._stage is None:
                self.first_sync = (self.position(), blocks)
        elif blocks > self.first_sync[1]:
            raise Sequential("a decryption-secrets block after the first TLS connection")
        self.in_sync = True
        try:
            super()._sync_secrets()
        finally:
            self.in_sync = False

    def output(self) -> ShardOutput:
        dns = self.dns
        own = dict(self.limits.hit)
        fragments = self.table.defrag.limits_hit
        for name, times in fragments.items():
            own[name] = own.get(name, 0) - times
        spill = self.spill
        if spill is not None:
            self._spill_before(END + 1)
            spill.done()
        # handed over, not shared: this run is garbage in a cycle (its table's callbacks
        # are its bound methods) that the tuned collector may leave until the exit, and
        # the events must go with the merge, not stay through the path analysis
        events, self.events = self.events, []
        return ShardOutput(events, self.udp_warnings, self.udp_suppressed,
                           dns.stats["warnings_suppressed"], self.client_randoms,
                           self.first_sync, self.expire_heads, self.expired_last,
                           {k: v for k, v in own.items() if v}, dict(fragments),
                           None if spill is None else spill.fd,
                           None if spill is None else spill.created,
                           None if spill is None else spill.first_secrets)


def _packet_of(e: Event) -> int:
    return e[0][0]


@dataclasses.dataclass
class ShardOutput:
    """What a shard hands to the merge."""

    events: list[Event]
    udp_warnings: list[tuple[Position, str]]
    udp_suppressed: int
    dns_suppressed: int
    """All the DNS warnings the shard's analyzer only counted (UDP and TCP)."""
    client_randoms: set[bytes]
    first_sync: tuple[Position, int] | None
    expire_heads: dict[int, Any]
    expired_last: dict[int, Any]
    limits_hit: dict[str, int] = dataclasses.field(default_factory=dict)
    """Caps reached on this shard's connections."""
    fragment_hits: dict[str, int] = dataclasses.field(default_factory=dict)
    """Caps reached by IP reassembly (the same in every shard: it precedes the flow key)."""
    spill: int | None = None
    """The descriptor of the file of the events (:func:`read_spill`), in position order;
    then ``events`` is empty. None: the events are ``events``."""
    created: list[int] | None = None
    """With ``spill``: the creating packets of the shard's connections."""
    first_secrets: Position | None = None
    """With ``spill``: the position of the shard's first secrets warning, if any."""


# -- across processes -------------------------------------------------------------------
# Records cross as tuples of their fields (mypyc-compiled classes need not pickle).

def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_CONN_FIELDS = _field_names(Connection)
_CONN_TLS = _CONN_FIELDS.index("tls")
_CONN_REQUESTS = _CONN_FIELDS.index("requests")
_get_conn = attrgetter(*_CONN_FIELDS)
_get_tls = attrgetter(*_field_names(TlsInfo))
_get_request = attrgetter(*_field_names(Request))
_get_dns = attrgetter(*_field_names(DnsTransaction))
_get_warning = attrgetter(*_field_names(Warning_))


def pack_connection(c: Connection) -> tuple[Any, ...]:
    v = list(_get_conn(c))
    if c.tls is not None:
        v[_CONN_TLS] = _get_tls(c.tls)
    v[_CONN_REQUESTS] = [_get_request(r) for r in c.requests]
    return tuple(v)


def unpack_connection(v: tuple[Any, ...]) -> Connection:
    values = list(v)
    if values[_CONN_TLS] is not None:
        values[_CONN_TLS] = TlsInfo(*values[_CONN_TLS])
    values[_CONN_REQUESTS] = [Request(*r) for r in values[_CONN_REQUESTS]]
    return Connection(*values)


def _pack_events(events: list[Event]) -> list[Event]:
    packed: list[Event] = []
    for pos, kind, rec, extra in events:
        if kind == CONNECTION:
            packed.append((pos, kind, pack_connection(rec), extra))
        elif kind == DNS:
            packed.append((pos, kind, _get_dns(rec), extra))
        else:
            packed.append((pos, kind, _get_warning(rec), extra))
    return packed


def _unpack_events(packed: list[Event], events: list[Event]) -> None:
    """Append the records of ``packed`` to ``events``."""
    for pos, kind, rec, extra in packed:
        if kind == CONNECTION:
            events.append((pos, kind, unpack_connection(rec), extra))
        elif kind == DNS:
            events.append((pos, kind, DnsTransaction(*rec), extra))
        else:
            events.append((pos, kind, Warning_(*rec), extra))


def pack_output(out: ShardOutput) -> ShardOutput:
    """The output with its records as field tuples, to pickle in one piece."""
    return dataclasses.replace(out, events=_pack_events(out.events))


def unpack_output(out: ShardOutput) -> ShardOutput:
    """The output :func:`pack_output` packed, with its records again."""
    events: list[Event] = []
    _unpack_events(out.events, events)
    return dataclasses.replace(out, events=events)


_BATCH, _FAILED = b"B", b"E"
"""The first byte of each message after the head: a batch of events, or an error in
place of the rest."""


def _send_output(conn: Any, out: ShardOutput) -> None:
    """The output without its events and the number of batches, then the events
    :data:`TRANSFER_EVENTS` at a time, each batch let go once sent."""
    events = out.events
    batches = -(-len(events) // TRANSFER_EVENTS)
    conn.send_bytes(pickle.dumps(("ok", (dataclasses.replace(out, events=[]), batches)),
                                 pickle.HIGHEST_PROTOCOL))
    for i in range(0, len(events), TRANSFER_EVENTS):
        batch = events[i:i + TRANSFER_EVENTS]
        events[i:i + len(batch)] = [None] * len(batch)  # type: ignore[list-item]
        conn.send_bytes(_BATCH + pickle.dumps(_pack_events(batch), pickle.HIGHEST_PROTOCOL))


def _send_failure(conn: Any, error: BaseException) -> None:
    conn.send_bytes(_FAILED + pickle.dumps(error))


def _receive_output(receive: Any, head: tuple[ShardOutput, int]) -> ShardOutput:
    """The output :func:`_send_output` sent, ``head`` its first message. Each batch is
    unpacked as it arrives, while the shard packs the next one."""
    out, batches = head
    events: list[Event] = []
    for _ in range(batches):
        msg = receive.recv_bytes()
        if msg[:1] == _FAILED:
            raise pickle.loads(memoryview(msg)[1:])
        _unpack_events(pickle.loads(memoryview(msg)[1:]), events)
        del msg
    return dataclasses.replace(out, events=events)


def _shard_options(options: Options, k: int, n: int, *, parent: bool) -> Options:
    keylog = options.keylog
    if keylog is not None:
        keylog = KeyLog()  # the parent's own: options.keylog stays as given until the end
        keylog.merge(options.keylog)  # type: ignore[arg-type]
    return dataclasses.replace(options, jobs=1, shard=(k, n), keylog=keylog,
                               progress=options.progress if parent else None)


def _child(conn: Any, paths: list[str], options: Options, k: int, n: int,
           sink: Any, spill: IO[bytes] | None = None) -> None:
    """A forked shard: run, then send the output (or what went wrong) to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the shards
    try:
        _res, run = _analyze(paths, sink, _shard_options(options, k, n, parent=False),
                             functools.partial(ShardRun, spill=spill))
        assert isinstance(run, ShardRun)
        gc.disable()  # the collector would walk every record while they are packed
        output = run.output()
    except Sequential as e:
        data = pickle.dumps(("sequential", str(e)))
    except BaseException as e:  # everything goes to the parent
        try:
            data = pickle.dumps(("error", e))
        except Exception:
            data = pickle.dumps(("error", RuntimeError(
                f"shard {k} of {n} failed:\n{traceback.format_exc()}")))
    else:
        try:
            _send_output(conn, output)
        except BrokenPipeError:  # the parent stopped listening: it stops us too
            pass
        except BaseException as e:  # in place of the next batch
            _send_failure(conn, RuntimeError(
                f"shard {k} of {n} failed sending its records: {e!r}"))
        conn.close()
        _leave()
    conn.send_bytes(data)
    conn.close()
    _leave()


def _leave() -> None:
    """End a shard process now: freeing every record and flow the shard built took
    longer than sending them (0.2 s at 1M packets). Nothing is left to write but the
    standard streams."""
    flush_standard_streams()
    os._exit(0)


# -- the parent -------------------------------------------------------------------------

def analyze_sharded(paths: list[str], sink: Sink, options: Options) -> Result:
    """``analyze`` in ``options.jobs`` processes (0: :func:`resolve_jobs`)."""
    n = resolve_jobs(options.jobs, paths)
    if n <= 1 or not _shardable(paths):
        return _analyze(paths, sink, dataclasses.replace(options, jobs=1))[0]
    with contextlib.ExitStack() as files:
        spills: list[IO[bytes]] = []
        if renders(sink):
            try:
                spills = [files.enter_context(tempfile.TemporaryFile(prefix="netdiag-shard-"))
                          for _k in range(n)]
            except OSError:  # nowhere to spill: one process streams without
                return _analyze(paths, sink, dataclasses.replace(options, jobs=1))[0]
        return _sharded(paths, sink, options, n, spills)


def _sharded(paths: list[str], sink: Sink, options: Options, n: int,
             spills: list[IO[bytes]]) -> Result:
    """:func:`analyze_sharded` in ``n`` processes; the events of shard k spilled to
    ``spills[k]`` if given."""
    def spill(k: int) -> IO[bytes] | None:
        return spills[k] if spills else None

    ctx = multiprocessing.get_context("fork")
    flush_standard_streams()  # a child must not write the parent's buffers again
    children: list[tuple[Any, Any]] = []
    try:
        for k in range(1, n):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, paths, options, k, n, sink, spill(k)),
                               name=f"netdiag-shard-{k}", daemon=True)
            proc.start()
            send.close()
            children.append((proc, receive))
        try:
            res0, run0 = _analyze(paths, sink, _shard_options(options, 0, n, parent=True),
                                  functools.partial(ShardRun, spill=spill(0)))
        except Sequential:
            return _sequential(paths, sink, options, children)
        assert isinstance(run0, ShardRun)
        outputs = [run0.output()]
        collecting = gc.isenabled()
        gc.disable()  # unpickling makes many objects and no garbage: 5x faster without
        try:
            for proc, receive in children:
                try:
                    status, payload = pickle.loads(receive.recv_bytes())
                    if status == "ok":  # the rest follows in batches
                        payload = _receive_output(receive, payload)
                except EOFError:
                    proc.join()
                    raise RuntimeError(f"{proc.name} ended without a result "
                                       f"(exit code {proc.exitcode})") from None
                if status == "sequential":
                    return _sequential(paths, sink, options, children)
                if status == "error":
                    raise payload
                outputs.append(payload)
        finally:
            if collecting:
                # the shards' records stay as long as this process's own: out of the
                # collector's reach (settle), else re-enabling it walks every one of them
                # at the next allocation (0.25 s for the key log benchmark's)
                settle()
                gc.enable()
        _let_end(children)
    finally:
        _stop(children)
    merged = merge(outputs, res0.capture)
    if merged is None:
        return _sequential(paths, sink, options, [])
    return replay(merged, sink, options, run0, res0)


def _stop(children: list[tuple[Any, Any]]) -> None:
    for proc, receive in children:
        if proc.is_alive():
            proc.terminate()
        proc.join()
        receive.close()


def _let_end(children: list[tuple[Any, Any]]) -> None:
    """Every shard sent all it had and leaves (:func:`_leave`): the parent goes on
    without waiting for them to end. The kernel takes back a shard's memory as it
    exits (26 ms for 400 MB here), on the shard's core while the parent merges;
    ``multiprocessing`` reaps the ended processes later (at its next start of a
    process, or at exit). Empties ``children``: nothing is left to stop."""
    for _proc, receive in children:
        receive.close()
    children.clear()


def _sequential(paths: list[str], sink: Sink, options: Options,
                children: list[tuple[Any, Any]]) -> Result:
    _stop(children)
    children.clear()
    return _analyze(paths, sink, dataclasses.replace(options, jobs=1))[0]


@dataclasses.dataclass
class Merged:
    """The shards' events in the order one process emits them, and the connection ids."""

    events: Iterable[Event]
    """A list, or where the shards spilled them, read from their files as iterated."""
    ids: dict[int, str]
    """Connection id by creating packet."""
    dns_warnings: list[str]
    """The DNS analyzer's warnings, as one process lists them."""
    client_randoms: set[bytes]
    limits_hit: dict[str, int]
    """Caps reached by every shard (IP reassembly's counted once)."""


def merge(outputs: list[ShardOutput], capture: CaptureFacts | None = None) -> Merged | None:
    """Order the events of all shards; None when only one process can be exact."""
    # the expiry of every sweep stopped where one process stops
    heads: dict[int, Any] = {}
    last: dict[int, Any] = {}
    for o in outputs:
        for p, order in o.expire_heads.items():
            if p not in heads or order < heads[p]:
                heads[p] = order
        for p, order in o.expired_last.items():
            if p not in last or order > last[p]:
                last[p] = order
    if any(p in heads and heads[p] < order for p, order in last.items()):
        return None
    # every TLS secrets block had been read at the first TLS decision
    syncs = [o.first_sync for o in outputs if o.first_sync is not None]
    if syncs and capture is not None:
        blocks = sum(1 for stype, _d in capture.secrets if stype == DSB_TLS_KEY_LOG)
        if min(syncs, key=itemgetter(0))[1] != blocks:
            return None
    # secrets warnings: the shard that synced first says them where one process does
    secrets_from = None
    firsts = [(first, i) for i, o in enumerate(outputs)
              if (first := _first_secrets(o)) is not None]
    if firsts:
        secrets_from = min(firsts)[1]
    events: Iterable[Event]
    if any(o.spill is not None for o in outputs):
        events = _Streams(outputs, secrets_from)
        created = sorted(p for o in outputs for p in _created_packets(o))
    else:
        events = []
        for i, o in enumerate(outputs):
            if secrets_from is None or i == secrets_from:
                events.extend(o.events)
            else:
                events.extend(e for e in o.events if e[1] != SECRETS_WARN)
        events.sort(key=itemgetter(0))
        created = sorted(int(e[2].id[1:]) for e in events if e[1] == CONNECTION)
    ids = {p: f"C{i}" for i, p in enumerate(created, 1)}
    # the DNS analyzer's list: the first ones in order, the rest counted
    udp = sorted((w for o in outputs for w in o.udp_warnings), key=itemgetter(0))
    analyzer = DnsAnalyzer(lambda _t: None)
    analyzer.warnings = [msg for _pos, msg in udp[:DNS_MAX_WARNINGS]]
    listed = sum(len(o.udp_warnings) for o in outputs)
    udp_total = listed + sum(o.udp_suppressed for o in outputs)
    analyzer.stats["warnings_suppressed"] = (
        sum(o.dns_suppressed - o.udp_suppressed for o in outputs)
        + udp_total - len(analyzer.warnings))
    analyzer.finish()  # adds the "further DNS warnings" sentence as one process does
    randoms: set[bytes] = set()
    hits: dict[str, int] = dict(outputs[0].fragment_hits) if outputs else {}
    for o in outputs:
        randoms |= o.client_randoms
        for name, times in o.limits_hit.items():
            hits[name] = hits.get(name, 0) + times
    return Merged(events, ids, analyzer.warnings, randoms, hits)


def _first_secrets(o: ShardOutput) -> Position | None:
    if o.spill is not None:
        return o.first_secrets
    return next((e[0] for e in o.events if e[1] == SECRETS_WARN), None)


def _created_packets(o: ShardOutput) -> list[int]:
    """The creating packets of a shard's connections."""
    if o.spill is not None:
        return o.created or []
    return [int(e[2].id[1:]) for e in o.events if e[1] == CONNECTION]


class _Streams:
    """The events of shards that spilled them, merged by position as they are read
    (each file is in position order); the secrets warnings of shard ``secrets_from``
    only. Each iteration reads the files again."""

    def __init__(self, outputs: list[ShardOutput], secrets_from: int | None) -> None:
        self.outputs = outputs
        self.secrets_from = secrets_from

    def _one(self, i: int, o: ShardOutput) -> Iterator[Event]:
        events: Iterable[Event] = (read_spill(o.spill) if o.spill is not None
                                   else sorted(o.events, key=itemgetter(0)))
        if self.secrets_from is None or i == self.secrets_from:
            return iter(events)
        return (e for e in events if e[1] != SECRETS_WARN)

    def __iter__(self) -> Iterator[Event]:
        return heapq.merge(*(self._one(i, o) for i, o in enumerate(self.outputs)),
                           key=itemgetter(0))


def replay(merged: Merged, sink: Sink, options: Options, run0: _Run, res0: Result) -> Result:
    """Feed the merged events to ``sink`` and a summary; the result one process returns."""
    facts = dataclasses.replace(res0.capture, warnings=[], warnings_dropped=0)
    summary = SummaryBuilder() if options.summarize else NoSummary()
    ids = merged.ids
    dns_rendered = getattr(sink, "dns_rendered", None)
    connection_rendered = getattr(sink, "connection_rendered", None)
    for _pos, kind, rec, extra in merged.events:
        if kind == CONNECTION:
            rec.id = ids[int(rec.id[1:])]
            summary.add_connection(rec)
            if extra is not None and connection_rendered is not None:
                connection_rendered(rec, extra)
            else:
                sink.connection(rec)
        elif kind == DNS:
            summary.add_dns(rec)
            if extra is not None and dns_rendered is not None:
                dns_rendered(rec, extra)
            else:
                sink.dns(rec)
        else:
            if extra is not None and rec.message.startswith(extra + " "):
                rec = dataclasses.replace(
                    rec, message=ids[int(extra[1:])] + rec.message[len(extra):])
            facts.warn(rec)
    for r in run0.readers:
        for w in r.warnings:
            facts.warn(w)
    for msg in merged.dns_warnings:
        facts.warn(Warning_("dns", msg))
    limits = dataclasses.replace(options, shard=None).limits()
    limits.add(merged.limits_hit)
    record_limits(facts, limits)
    findings = build_findings(summary, options.thresholds, facts.truncated)
    keylog = run0.keylog
    if options.keylog is not None:
        options.keylog.merge(keylog)  # as one process leaves it: with the blocks' secrets
        keylog = options.keylog
    return Result(facts, summary, findings, options.thresholds, merged.client_randoms,
                  keylog)
