"""Parquet files from a contract document, for DuckDB, pandas, Polars or Spark.

:func:`write_parquet` writes, in ``outdir``, one file per table (the rows of
:mod:`netdiag.report.csv_out`, typed):

* ``connections.parquet``: one row per connection, without its requests (``requests``
  is their count);
* ``requests.parquet``: one row per request, led by its ``connection`` id, its ``index``
  on the connection (0-based) and the connection's ``client``, ``server``,
  ``connection.protocol`` (a request has a ``protocol`` of its own), ``path.name`` and
  ``path.hop``, so that most questions need no join;
* ``dns.parquet``: one row per DNS transaction;
* ``findings.parquet``: one row per finding;
* ``timeseries.parquet`` (when the document has ``timeseries``): one row per path and
  interval, with ``path`` (null for the requests on no path, key ``"null"``), the series'
  ``interval_ms`` and whether the path is ``sparse`` (only its active intervals listed);
* ``knees.parquet`` (when the document has ``knees``): one row per knee, its ``ci`` also
  as ``ci_low`` and ``ci_high``;
* ``groups.parquet`` (when the document has ``groups``, ``--by``): one row per group,
  ``key``, ``files``, ``first_ts``, ``last_ts``, ``truncated`` and its ``summary``
  flattened (``summary.http.ttfb_ms.p99``).

**Names.** The contract's field names, its units in them (``ts`` epoch seconds,
``*_ms`` milliseconds). An object whose keys are the contract's field names is
flattened into dotted columns, as in the CSV files (``tls.version``,
``tls.handshake_ms``, ``path.name``, ``http2.goaway.ts``, ``ttfb_ms.p99``); an object
whose keys are data (HTTP/2 settings, hop names, counts per TLS version) is an Arrow
``map<string, ...>`` (``http2.settings.client``, ``hops``, ``summary.tls.versions``); a
list is an Arrow list (``answers``, ``tls.alpn_offered``, ``chunk_gaps_ms``,
``evidence``), a list of objects a ``list<struct>`` whose fields are named by the same
rule (``chain``, headers as ``{name, value}``). Flat columns rather than structs: the
names are the CSV's and the JSON paths, pandas reads them as ordinary typed columns (a
struct becomes a column of Python dicts), a request's own ``path`` sits beside its
connection's ``path.name`` without clashing, and Parquet stores each struct field as a
column of its own anyway, so nothing is lost in size or speed. The price is quoting:
``"path.name"`` in SQL, the name in backticks in Spark SQL.

**Types** are fixed by :data:`TABLES` whatever the data, so that the tables of an empty
capture are typed and the files of different captures concatenate: ``ts`` and every
duration ``float64``; counts, sizes, ids and statuses ``int64``; flags ``bool``; text
``string``; ``time`` is ``timestamp[us, UTC]`` derived from ``ts`` (``start_time`` from
``start_ts`` in ``timeseries``, ``first_time`` and ``last_time`` in ``groups``), rounded
to the microsecond, null outside the years 1 to 9999 (which pandas, Spark and ISO 8601
cannot all hold); ``ts`` keeps the exact value. ``null`` is null. A value the schema has
no column for (a field added to the contract after this netdiag) or whose type does not
fit its column (text where a number goes, a fraction where a count goes) is not
dropped: its column is null there and ``_extra``, a ``map<string, string>``, holds it
by its dotted name (list indexes and map keys included, ``chain.0.own_ms``) as compact
JSON; ``_extra`` is null when nothing is left over: on every row of a report of
netdiag's own engine (``--engine tshark`` adds each record's ``frames``, which land
there).

**Text** from the capture is stored as it is (Parquet is data, not a terminal: no
escaping, no cutting, NULs and escape sequences kept). Only what UTF-8 cannot encode
changes: a lone surrogate (a ``str`` can hold one, a Parquet string cannot) becomes
U+FFFD, the replacement character a UTF-8 decoder puts for an invalid byte; a
surrogate pair becomes the character it encodes. In ``_extra``'s JSON such text is kept
exactly, as ``\\udXXX`` escapes.

**Bytes** are deterministic: the same document gives the same files (fixed
compression: zstd where pyarrow has it, else snappy; fixed row groups; no time in the
metadata). Each file's key-value metadata holds ``contract`` and ``netdiag_version``.

pyarrow is optional (the ``scale`` extra): it is imported when :func:`write_parquet`
runs, and :class:`ParquetUnavailable` says how to install it when it is missing.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from netdiag import CONTRACT_VERSION, __version__
from netdiag.errors import InputError
from netdiag.report.json_out import Records

# --- the schema, as plain data (no pyarrow needed to read it) -------------------------

F64 = "float64"
I64 = "int64"
BOOL = "bool"
STR = "string"
TIME = "timestamp[us, UTC]"
"""A ``timestamp`` column derived from a ``ts`` column (never read from the document):
see :data:`TIME_OF`."""


@dataclass(frozen=True)
class ListOf:
    """An Arrow ``list<item>``."""

    item: ColumnType


@dataclass(frozen=True)
class MapOf:
    """An Arrow ``map<string, value>``: an object whose keys are data, in its order."""

    value: ColumnType


@dataclass(frozen=True)
class StructOf:
    """An Arrow ``struct``; its fields dotted like top-level columns. ``pair``: read from
    a two-item list (a header ``[name, value]``) rather than from an object."""

    fields: tuple[tuple[str, ColumnType], ...]
    pair: bool = False


ColumnType: TypeAlias = str | ListOf | MapOf | StructOf
Columns: TypeAlias = tuple[tuple[str, ColumnType], ...]

EXTRA = "_extra"
"""The column of values the schema does not type (see the module docstring)."""
PCT = ("count", "min", "p50", "p90", "p99", "max", "mean")


def _pct(prefix: str) -> Columns:
    """A percentile block ``{count, min, p50, p90, p99, max, mean}`` under ``prefix``."""
    return tuple((f"{prefix}.{k}", I64 if k == "count" else F64) for k in PCT)


def _prefixed(prefix: str, cols: Columns) -> Columns:
    return tuple((f"{prefix}.{name}", t) for name, t in cols)


STRINGS = ListOf(STR)
FLOATS = ListOf(F64)
COUNTS = MapOf(I64)
_HEADER = StructOf((("name", STR), ("value", STR)), pair=True)
HEADERS = ListOf(_HEADER)
"""Decoded headers, ``[[name, value], ...]`` in the document, in their order."""

CHAIN_STEP = StructOf((
    ("hop", STR), ("path", STR), ("server", STR), ("connection", STR), ("request", I64),
    ("depth", I64), ("what", STR), ("wait_ms", F64), ("setup_ms", F64), ("own_ms", F64),
    ("in_ttfb", BOOL), ("link", STR), ("candidates", I64),
    ("own_split_ms.before_calls", F64), ("own_split_ms.between_calls", F64),
    ("own_split_ms.after_calls", F64),
))
"""One entry of ``requests[].chain``."""

DNS_COLUMNS: Columns = (
    ("ts", F64), ("time", TIME), ("client", STR), ("server", STR), ("transport", STR),
    ("id", I64), ("qname", STR), ("qtype", STR), ("rcode", STR), ("answers", STRINGS),
    ("latency_ms", F64), ("retransmissions", I64), ("responses", I64), ("truncated", BOOL),
    (EXTRA, MapOf(STR)),
)

CONNECTION_COLUMNS: Columns = (
    ("id", STR), ("ts", F64), ("time", TIME), ("client", STR), ("server", STR),
    ("transport", STR), ("protocol", STR), ("handshake_rtt_ms", F64),
    ("retransmissions", I64), ("resets", I64), ("bytes_to_server", I64),
    ("bytes_to_client", I64), ("duration_ms", F64), ("packets", I64), ("out_of_order", I64),
    ("lost_bytes", I64), ("syn_retransmissions", I64), ("handshake_seen", BOOL),
    ("close", STR), ("server_ttl", I64), ("requests", I64),
    ("tls.version", STR), ("tls.sni", STR), ("tls.alpn_offered", STRINGS), ("tls.alpn", STR),
    ("tls.cipher", STR), ("tls.resumed", BOOL), ("tls.hello_retry", BOOL),
    ("tls.handshake_ms", F64), ("tls.decrypted", BOOL), ("tls.alert", STR),
    ("tls.session_tickets", I64), ("tls.key_updates", I64), ("tls.decrypt_error", STR),
    ("tls.certificate.subject", STR), ("tls.certificate.issuer", STR),
    ("tls.certificate.not_after", STR), ("tls.certificate.size", I64),
    ("tls.certificate.chain_length", I64), ("tls.certificate.chain_bytes", I64),
    ("path.name", STR), ("path.hop", STR), ("path.inferred", BOOL), ("path.evidence", STRINGS),
    ("edge.name", STR), ("edge.evidence", STRINGS), ("edge.inferred", BOOL), ("edge.hops", I64),
    ("edge.tls_at_tcp_peer", BOOL),
    ("http2.max_concurrent_streams", I64), ("http2.settings.client", COUNTS),
    ("http2.settings.server", COUNTS), ("http2.goaway.ts", F64), ("http2.goaway.from", STR),
    ("http2.goaway.error", STR), ("http2.goaway.last_stream_id", I64),
    ("http2.rst_streams", I64), ("http2.flow_control_stalls", I64), ("http2.pushes", I64),
    ("http2.unmatched_streams", I64), ("http2.frames.client", I64),
    ("http2.frames.server", I64),
    ("tunnel.authority", STR), ("tunnel.protocol", STR), ("tunnel.requests", I64),
    ("quic.version", STR), ("quic.zero_rtt", BOOL), ("quic.retry", BOOL),
    ("quic.migrations", I64), ("quic.connection_ids", I64),
    (EXTRA, MapOf(STR)),
)
"""``requests`` is the connection's number of requests; ``time`` is derived from ``ts``."""

REQUEST_CONTEXT = ("client", "server", "connection.protocol", "path.name", "path.hop")
"""The columns of ``requests.parquet`` copied from the request's connection."""

REQUEST_COLUMNS: Columns = (
    ("connection", STR), ("index", I64), ("client", STR), ("server", STR),
    ("connection.protocol", STR), ("path.name", STR), ("path.hop", STR),
    ("stream_id", I64), ("ts", F64), ("time", TIME), ("method", STR), ("authority", STR),
    ("path", STR), ("status", I64), ("ttfb_ms", F64), ("ttlb_ms", F64), ("send_ms", F64),
    ("response_bytes", I64), ("request_bytes", I64), ("chunks", I64),
    ("chunk_gaps_ms", FLOATS), ("estimated", BOOL), ("protocol", STR),
    ("content_type", STR), ("sse_events", I64), ("first_event_ms", F64), ("reset", STR),
    ("reset_by", STR), ("stall_ms", F64),
    ("request_headers", HEADERS), ("response_headers", HEADERS),
    ("caused_by.connection", STR), ("caused_by.request", I64), ("chain", ListOf(CHAIN_STEP)),
    ("upstream.source", STR), ("upstream.metric", STR), ("upstream.upstream_ms", F64),
    ("upstream.edge_ms", F64), ("upstream.includes_edge", BOOL),
    ("upstream.edge_own_ms", F64), ("upstream.edge_rtt_ms", F64), ("upstream.ttfb_ms", F64),
    ("upstream.exceeds_ttfb", BOOL), ("upstream.raw", STR),
    (EXTRA, MapOf(STR)),
)

FINDING_COLUMNS: Columns = (
    ("severity", STR), ("code", STR), ("title", STR), ("detail", STR), ("evidence", STRINGS),
    (EXTRA, MapOf(STR)),
)

HOP_LOAD = StructOf(_pct("own_ms"))
"""One hop's figures in one interval: ``hops['router']."own_ms.p99"``."""

TIMESERIES_COLUMNS: Columns = (
    ("path", STR), ("interval_ms", F64), ("sparse", BOOL), ("start_ts", F64),
    ("start_time", TIME), ("requests", I64), ("rate_per_s", F64), ("in_flight_max", I64),
    ("new_connections", I64), ("reuse_rate", F64), ("dns_lookups", I64),
    *_pct("ttfb_ms"), *_pct("ttlb_ms"),
    ("retransmissions", I64), ("bytes", I64), ("estimated", BOOL),
    ("hops", MapOf(HOP_LOAD)),
    (EXTRA, MapOf(STR)),
)
"""``path``, ``interval_ms`` and ``sparse`` come from the series, ``start_time`` from
``start_ts``; the rest from each interval."""

KNEE_COLUMNS: Columns = (
    ("path", STR), ("metric", STR), ("rate_per_s", F64), ("ci", FLOATS), ("ci_low", F64),
    ("ci_high", F64), ("below_ms", F64), ("above_ms", F64), ("slope_ms_per_rps", F64),
    ("points", I64), ("below", I64), ("above", I64), ("hop", STR),
    ("hops", MapOf(StructOf((("below_ms", F64), ("above_ms", F64))))),
    ("sentence", STR), ("evidence", STRINGS),
    (EXTRA, MapOf(STR)),
)
"""``ci_low`` and ``ci_high`` are ``ci``'s two ends."""

_PATH_HOP = StructOf((
    ("servers", STRINGS), ("connections", I64), ("requests", I64), ("reuse_rate", F64),
    *_pct("own_ms"), *_pct("own_split_ms.before_calls"), *_pct("own_split_ms.between_calls"),
    *_pct("own_split_ms.after_calls"), *_pct("setup_ms"), *_pct("wait_ms"),
    ("commands", MapOf(StructOf(tuple((k, I64 if k == "count" else F64) for k in PCT)))),
    ("called_by", COUNTS),
))
_PATH_BUDGET = StructOf((
    ("inferred", BOOL), ("hops", STRINGS), ("requests", I64), ("connections", I64),
    ("reuse_rate", F64), *_pct("ttfb_ms"), *_pct("ttlb_ms"),
    *_pct("phases.dns_ms"), *_pct("phases.tcp_ms"), *_pct("phases.tls_ms"),
    ("phases.hops", MapOf(_PATH_HOP)), *_pct("phases.think_ms"), *_pct("phases.transfer_ms"),
    ("chains.linked", I64), ("chains.ambiguous", I64), ("chains.unlinked", I64),
    ("chains.upstream_unlinked", I64), ("estimated", BOOL),
))
"""One entry of ``summary.paths``."""
_DIFFERENCE = StructOf((
    ("a", STR), ("b", STR), ("phase", STR), ("only_a", BOOL), ("n_a", I64), ("n_b", I64),
    ("diff_ms", F64), ("ci_low_ms", F64), ("ci_high_ms", F64), ("level", F64),
    ("supported", BOOL), ("reason", STR), ("sentence", STR),
))
"""One entry of ``summary.path_comparison``."""

SUMMARY_COLUMNS: Columns = (
    ("dns.transactions", I64), ("dns.answered", I64), ("dns.unanswered", I64),
    *_pct("dns.latency_ms"), ("dns.retransmissions", I64), ("dns.duplicate_responses", I64),
    ("dns.rcodes", COUNTS),
    ("tcp.connections", I64), *_pct("tcp.handshake_rtt_ms"), ("tcp.retransmissions", I64),
    ("tcp.resets", I64), ("tcp.reset_connections", I64), ("tcp.lost_bytes", I64),
    ("tls.handshakes", I64), *_pct("tls.handshake_ms"), ("tls.resumed", I64),
    ("tls.hello_retry", I64), ("tls.versions", COUNTS), ("tls.alpn", COUNTS),
    ("tls.decrypted", I64),
    ("http.requests", I64), ("http.connections", I64), ("http.reuse_rate", F64),
    *_pct("http.requests_per_connection"), *_pct("http.ttfb_ms"), *_pct("http.ttlb_ms"),
    ("http.protocols", COUNTS), ("http.estimated", BOOL), ("http.estimated_requests", I64),
    ("http.streaming.responses", I64), *_pct("http.streaming.first_event_ms"),
    *_pct("http.streaming.gap_ms"), ("http.streaming.longest_stall_ms", F64),
    ("resp.connections", I64), ("resp.commands", I64), ("resp.by_command", COUNTS),
    ("resp.errors", I64), *_pct("resp.latency_ms"),
    ("paths", MapOf(_PATH_BUDGET)), ("path_comparison", ListOf(_DIFFERENCE)),
)
"""The document's ``summary``, as ``groups.parquet`` has it under ``summary.``."""

GROUP_COLUMNS: Columns = (
    ("key", STR), ("files", STRINGS), ("first_ts", F64), ("first_time", TIME),
    ("last_ts", F64), ("last_time", TIME), ("truncated", BOOL),
    *_prefixed("summary", SUMMARY_COLUMNS),
    (EXTRA, MapOf(STR)),
)
"""``first_time`` and ``last_time`` are derived from ``first_ts`` and ``last_ts``."""

TABLES: dict[str, Columns] = {
    "connections": CONNECTION_COLUMNS, "requests": REQUEST_COLUMNS, "dns": DNS_COLUMNS,
    "findings": FINDING_COLUMNS, "timeseries": TIMESERIES_COLUMNS, "knees": KNEE_COLUMNS,
    "groups": GROUP_COLUMNS,
}
"""Every table's columns, in file order; a file is ``<table>.parquet``."""

DERIVED: dict[str, tuple[str, ...]] = {
    "connections": ("time", "requests"),
    "requests": ("connection", "index", *REQUEST_CONTEXT, "time"),
    "dns": ("time",),
    "findings": (),
    "timeseries": ("path", "interval_ms", "sparse", "start_time"),
    "knees": ("ci_low", "ci_high"),
    "groups": ("first_time", "last_time"),
}
"""Per table, the columns not read from the record itself under their own name
(``connection`` is the record's own when it has one, as in JSON Lines)."""

TIME_OF = {"time": "ts", "start_time": "start_ts", "first_time": "first_ts",
           "last_time": "last_ts"}
"""Each ``timestamp`` column and the epoch-seconds column it is derived from."""
ROW_GROUP_ROWS = 131_072
"""Rows per row group (a fixed number, for deterministic bytes)."""
BATCH_ROWS = 8192
"""Rows of the connections and requests tables turned into Arrow columns at a time: a
big document's rows are never all in memory as dicts at once (a dict per row took
several times the memory of its columns)."""
TIME_MIN_US = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z in microseconds: the first ``time`` kept."""
TIME_END_US = 253_402_300_800_000_000
"""10000-01-01T00:00:00Z in microseconds: ``time`` stays below it."""


class ParquetUnavailable(InputError):
    """``--format parquet`` without pyarrow installed."""


def _pyarrow() -> tuple[Any, Any, Any]:
    """``(pyarrow, pyarrow.compute, pyarrow.parquet)``, or :class:`ParquetUnavailable`.

    Arrow's buffers come from the C library's allocator (unless the environment chose
    another pool, or pyarrow was in use before), as netdiag's own objects do
    (:mod:`netdiag.allocator` keeps freed memory for reuse): pyarrow's default mimalloc
    pool gave memory back and faulted it in again, about a second of system time and
    60 MiB more at 1M packets."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # through importlib, not import statements: compiled, those would keep the first
    # module found for good, and a pyarrow that went missing would go unnoticed
    try:
        pa = importlib.import_module("pyarrow")
        pc = importlib.import_module("pyarrow.compute")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise ParquetUnavailable(
            "--format parquet needs pyarrow, which is not installed: "
            "pip install 'pyarrow>=15' (or netdiag[scale])") from e
    return pa, pc, pq


def require_pyarrow() -> None:
    """Raise :class:`ParquetUnavailable` now if pyarrow is missing (before a long
    analysis, rather than after it)."""
    _pyarrow()


# --- records to typed values ----------------------------------------------------------

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_MISMATCH = object()


_PyType: TypeAlias = type


@dataclass(slots=True)
class _Leaf:
    name: str
    """The column's dotted name."""
    type: ColumnType
    """The column's type."""
    exact: _PyType | None = None
    """The Python type whose values the column takes as they are (``float`` for
    float64, ``int`` within 64 bits, ``str``, ``bool``); None for a list, map or struct."""


_EXACT: dict[str, type] = {F64: float, I64: int, STR: str, BOOL: bool}


_Trie: TypeAlias = dict[str, "_Leaf | _Trie"]
_TRIES: dict[int, tuple[StructOf, _Trie]] = {}
"""The trie of each struct type, by identity (the types are module constants)."""


def _trie(cols: Columns, skip: Iterable[str] = ()) -> _Trie:
    """Dotted column names as a tree of their parts, ``skip`` and ``_extra`` left out."""
    skipped = {EXTRA, *skip}
    root: _Trie = {}
    for name, t in cols:
        if name in skipped:
            continue
        *parents, last = name.split(".")
        node = root
        for p in parents:
            child = node.setdefault(p, {})
            assert isinstance(child, dict), name
            node = child
        node[last] = _Leaf(name, t, _EXACT.get(t) if isinstance(t, str) else None)
    return root


def _struct_trie(t: StructOf) -> _Trie:
    hit = _TRIES.get(id(t))
    if hit is None:
        hit = _TRIES[id(t)] = (t, _trie(t.fields))
    return hit[1]


def _key(k: Any) -> str:
    """A map key or field name as text, as JSON writes it."""
    if isinstance(k, str):
        return k
    if k is None or isinstance(k, bool | int | float):
        return json.dumps(k)
    return str(k)


def _scalar(v: Any, t: str) -> Any:
    """``v`` as a value of kind ``t``, or :data:`_MISMATCH`."""
    kind = type(v)
    if t == F64:
        if kind is float:
            return v
        if kind is int or (isinstance(v, int | float) and not isinstance(v, bool)):
            try:
                return float(v)
            except OverflowError:
                return _MISMATCH
        return _MISMATCH
    if t == STR:
        return v if kind is str or isinstance(v, str) else _MISMATCH
    if t == I64:
        if kind is bool or isinstance(v, bool):
            return _MISMATCH
        if isinstance(v, int):
            return int(v) if _INT_MIN <= v <= _INT_MAX else _MISMATCH
        if isinstance(v, float) and v.is_integer() and _INT_MIN <= v <= _INT_MAX:
            return int(v)
        return _MISMATCH
    if t == BOOL:
        return v if isinstance(v, bool) else _MISMATCH
    raise AssertionError(t)


def _convert(v: Any, t: ColumnType, where: str, extra: dict[str, Any]) -> Any:
    """``v`` as a value of ``t`` (None for null); what does not fit goes to ``extra``
    under its dotted name ``where`` and is null in the column."""
    if v is None:
        return None
    if isinstance(t, str):
        out = _scalar(v, t)
    elif isinstance(t, ListOf):
        if not isinstance(v, list | tuple):
            out = _MISMATCH
        else:
            item = t.item
            if isinstance(item, str):            # the common case, no names built
                exact = _EXACT[item]
                if exact is not int:             # every item of the column's own type
                    for x in v:
                        if type(x) is not exact:
                            break
                    else:
                        return list(v)
                items = [None if x is None else _scalar(x, item) for x in v]
                if _MISMATCH not in items:
                    return items
            elif isinstance(item, StructOf) and not item.pair:  # objects: each walked
                trie = _struct_trie(item)
                structs: list[Any] = []
                for i, x in enumerate(v):
                    if type(x) is dict:
                        fields: dict[str, Any] = {}
                        _walk(x, trie, f"{where}.{i}.", fields, extra)
                        structs.append(fields)
                    else:
                        structs.append(_convert(x, item, f"{where}.{i}", extra))
                return structs
            elif item is _HEADER and all(
                    type(h) in (list, tuple) and len(h) == 2 and type(h[0]) is str
                    and type(h[1]) is str for h in v):
                return [{"name": h[0], "value": h[1]} for h in v]
            return [_convert(x, item, f"{where}.{i}", extra) for i, x in enumerate(v)]
    elif isinstance(t, MapOf):
        if not isinstance(v, dict):
            out = _MISMATCH
        else:
            value = t.value
            if isinstance(value, str):
                entries = [(_key(k), None if x is None else _scalar(x, value))
                           for k, x in v.items()]
                if not any(x is _MISMATCH for _, x in entries):
                    return entries
            return [(_key(k), _convert(x, value, f"{where}.{_key(k)}", extra))
                    for k, x in v.items()]
    elif t.pair:
        if not (isinstance(v, list | tuple) and len(v) == len(t.fields)):
            out = _MISMATCH
        else:
            return {name: _convert(x, ft, f"{where}.{i}", extra)
                    for i, ((name, ft), x) in enumerate(zip(t.fields, v, strict=True))}
    elif not isinstance(v, dict):
        out = _MISMATCH
    else:
        row: dict[str, Any] = {}
        _walk(v, _struct_trie(t), f"{where}.", row, extra)
        return row
    if out is _MISMATCH:
        extra[where] = v
        return None
    return out


def _walk(obj: dict[Any, Any], trie: _Trie, prefix: str, out: dict[str, Any],
          extra: dict[str, Any]) -> None:
    """The values of ``obj`` into ``out`` by column name (nested objects by their dotted
    names); keys without a column into ``extra``."""
    get = trie.get
    for k, v in obj.items():
        node = get(k)
        if node is None and type(k) is not str:
            node = get(_key(k))
        if isinstance(node, _Leaf):
            kind = type(v)
            # a value of the column's own type as it is (an int within 64 bits): most are
            if kind is node.exact and (kind is not int or _INT_MIN <= v <= _INT_MAX):
                out[node.name] = v
                continue
            t = node.type
            if v is None:
                out[node.name] = None
            elif isinstance(t, str):             # a scalar: its name only if it misfits
                c = _scalar(v, t)
                if c is _MISMATCH:
                    extra[prefix + _key(k)] = v
                    c = None
                out[node.name] = c
            else:
                out[node.name] = _convert(v, t, prefix + _key(k), extra)
        elif node is None:
            extra[prefix + _key(k)] = v
        elif isinstance(v, dict):
            _walk(v, node, f"{prefix}{_key(k)}.", out, extra)
        elif v is not None:      # a null object: all its columns null
            extra[prefix + _key(k)] = v


def _json(v: Any) -> str:
    """Compact JSON of a leftover value: as it is, or with ``\\u`` escapes where it holds
    text UTF-8 cannot encode (lone surrogates)."""
    try:
        s = json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=repr)
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=True, default=repr)
    except (ValueError, TypeError, RecursionError):      # a cycle, a value repr rejects
        return json.dumps(f"<unserialisable {type(v).__name__}>")


def _row(obj: dict[Any, Any], trie: _Trie, out: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    _walk(obj, trie, "", out, extra)
    out[EXTRA] = [(_valid(k), _json(v)) for k, v in extra.items()] or None
    return out


def _records(v: Any) -> Iterator[dict[Any, Any]]:
    """The objects of a list of records, or of a :class:`~netdiag.report.json_out.Records`
    (each made as it is read)."""
    if isinstance(v, list | tuple | Records):
        for r in v:
            if isinstance(r, dict):
                yield r


def _connection_row(c: dict[Any, Any], trie: _Trie) -> dict[str, Any]:
    reqs = c.get("requests")
    row = _row({k: v for k, v in c.items() if k != "requests"}, trie,
               {"requests": len(reqs) if isinstance(reqs, list | tuple) else None})
    if reqs is not None and not isinstance(reqs, list | tuple):
        row[EXTRA] = [*(row[EXTRA] or []), ("requests", _json(reqs))]
    return row


class _Rows(Protocol):
    def append(self, row: dict[str, Any], /) -> None: ...


def _add_request_rows(c: dict[Any, Any], crow: dict[str, Any], trie: _Trie,
                      rows: _Rows) -> None:
    context = {"connection": crow.get("id"), "client": crow.get("client"),
               "server": crow.get("server"), "connection.protocol": crow.get("protocol"),
               "path.name": crow.get("path.name"), "path.hop": crow.get("path.hop")}
    reqs = c.get("requests")
    for i, r in enumerate(reqs if isinstance(reqs, list | tuple) else ()):
        if isinstance(r, dict):
            rows.append(_row(r, trie, {**context, "index": i}))


def connection_and_request_rows(doc: dict[str, Any], conns: _Rows, reqs: _Rows) -> None:
    """One row per connection (to ``conns``) and one per request (to ``reqs``), in one
    pass over the connections (a document made as it is read renders each connection
    once)."""
    ctrie = _trie(CONNECTION_COLUMNS, DERIVED["connections"])
    rtrie = _trie(REQUEST_COLUMNS, [n for n in DERIVED["requests"] if n != "connection"])
    for c in _records(doc.get("connections")):
        crow = _connection_row(c, ctrie)
        conns.append(crow)
        _add_request_rows(c, crow, rtrie, reqs)


class _Batched:
    """Rows of one table taken :data:`BATCH_ROWS` at a time into Arrow tables
    (:func:`to_table`), joined into one table at the end."""

    def __init__(self, table: str, metadata: dict[str, str]) -> None:
        self.table = table
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = []
        self.parts: list[Any] = []

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self._convert()

    def _convert(self) -> None:
        self.parts.append(to_table(self.table, self.rows, self.metadata))
        self.rows = []

    def result(self) -> Any:
        """The table of every row appended."""
        if self.rows or not self.parts:
            self._convert()
        parts, self.parts = self.parts, []
        if len(parts) == 1:
            return parts[0]
        return _pyarrow()[0].concat_tables(parts)


def dns_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    trie = _trie(DNS_COLUMNS, DERIVED["dns"])
    return [_row(d, trie, {}) for d in _records(doc.get("dns"))]


def finding_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    trie = _trie(FINDING_COLUMNS)
    return [_row(f, trie, {}) for f in _records(doc.get("findings"))]


def timeseries_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per path and interval, in the document's order."""
    ts = doc.get("timeseries")
    if not isinstance(ts, dict):
        return []
    trie = _trie(TIMESERIES_COLUMNS, DERIVED["timeseries"])
    interval = _convert(ts.get("interval_ms"), F64, "interval_ms", {})
    sparse = ts.get("sparse")
    sparse_names = {_key(n) for n in sparse} if isinstance(sparse, list | tuple) else set()
    paths = ts.get("paths")
    rows = []
    for name, intervals in (paths.items() if isinstance(paths, dict) else ()):
        path = None if name in (None, "null") else _key(name)
        head = {"path": path, "interval_ms": interval,
                "sparse": (path if path is not None else "null") in sparse_names}
        for iv in _records(intervals):
            rows.append(_row(iv, trie, dict(head)))
    return rows


def knee_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    trie = _trie(KNEE_COLUMNS, DERIVED["knees"])
    rows = []
    for k in _records(doc.get("knees")):
        row = _row(k, trie, {})
        ci = row.get("ci")
        lo, hi = ci if isinstance(ci, list) and len(ci) == 2 else (None, None)
        row.update(ci_low=lo, ci_high=hi)
        rows.append(row)
    return rows


def group_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    trie = _trie(GROUP_COLUMNS)
    return [_row(g, trie, {}) for g in _records(doc.get("groups"))]


# --- typed values to Arrow ------------------------------------------------------------


def _valid(s: str) -> str:
    """``s`` as UTF-8 can hold it: lone surrogates as U+FFFD, pairs joined."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _scrub(v: Any) -> Any:
    """Every string in ``v`` (lists, map entries, structs) through :func:`_valid`."""
    if isinstance(v, str):
        return _valid(v)
    if isinstance(v, list):
        return [_scrub(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_scrub(x) for x in v)
    if isinstance(v, dict):
        return {k: _scrub(x) for k, x in v.items()}
    return v


def arrow_type(t: ColumnType) -> Any:
    """The pyarrow type of a column type."""
    pa = _pyarrow()[0]
    if isinstance(t, ListOf):
        return pa.list_(arrow_type(t.item))
    if isinstance(t, MapOf):
        return pa.map_(pa.string(), arrow_type(t.value))
    if isinstance(t, StructOf):
        return pa.struct([pa.field(n, arrow_type(ft)) for n, ft in t.fields])
    return {F64: pa.float64(), I64: pa.int64(), BOOL: pa.bool_(), STR: pa.string(),
            TIME: pa.timestamp("us", tz="UTC")}[t]


def arrow_schema(table: str, metadata: dict[str, str] | None = None) -> Any:
    """The Arrow schema of ``table`` (a key of :data:`TABLES`)."""
    pa = _pyarrow()[0]
    return pa.schema([pa.field(n, arrow_type(t)) for n, t in TABLES[table]],
                     metadata=metadata)


def _array(values: list[Any], t: Any) -> Any:
    pa = _pyarrow()[0]
    try:
        return pa.array(values, type=t)
    except UnicodeEncodeError:
        return pa.array(_scrub(values), type=t)


def _times(ts: Any) -> Any:
    """``timestamp[us, UTC]`` from epoch seconds, null outside the years 1 to 9999."""
    pa, pc, _ = _pyarrow()
    us = pc.round(pc.multiply(ts, 1e6))
    ok = pc.and_(pc.is_finite(us), pc.and_(pc.greater_equal(us, float(TIME_MIN_US)),
                                           pc.less(us, float(TIME_END_US))))
    us = pc.if_else(ok, us, pa.scalar(None, pa.float64()))
    return pc.cast(pc.cast(us, pa.int64()), pa.timestamp("us", tz="UTC"))


def _by_column(rows: list[dict[str, Any]], names: list[str]) -> list[list[Any]]:
    """The values of ``rows`` column by column, in the order of ``names`` (None where a row
    has no such key; keys without a column left out). Each row's own keys are walked, not
    every column of every row: a row holds a few dozen of the columns, most of them not
    null."""
    place = {name: j for j, name in enumerate(names)}
    count = len(rows)
    cols: list[list[Any]] = [[None] * count for _ in names]
    for i, row in enumerate(rows):
        for k, v in row.items():
            j = place.get(k, -1)
            if j >= 0:
                cols[j][i] = v
    return cols


def to_table(table: str, rows: list[dict[str, Any]], metadata: dict[str, str]) -> Any:
    """``rows`` (from the ``*_rows`` functions) as a ``pyarrow.Table`` of ``table``'s
    schema."""
    pa = _pyarrow()[0]
    schema = arrow_schema(table, metadata)
    # the columns gathered from each row's own keys, then one conversion per column
    # (``Table.from_pylist`` looks every column up in every row: most of its time)
    cols = _by_column(rows, schema.names)
    out = pa.Table.from_arrays(
        [pa.nulls(len(rows), field.type) if field.name in TIME_OF
         else _array(col, field.type) for field, col in zip(schema, cols, strict=True)],
        schema=schema)
    for i, field in enumerate(schema):  # the derived times, null so far
        if field.name in TIME_OF:
            ts = out.column(schema.get_field_index(TIME_OF[field.name]))
            out = out.set_column(i, field, _times(ts))
    return out


def tables(doc: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(table name, pyarrow.Table)`` for each file :func:`write_parquet` writes, in its
    order."""
    meta = {"contract": _valid(_key(doc.get("contract", CONTRACT_VERSION))),
            "netdiag_version": _valid(_key(doc.get("netdiag_version", __version__)))}
    conns, reqs = _Batched("connections", meta), _Batched("requests", meta)
    connection_and_request_rows(doc, conns, reqs)
    yield "connections", conns.result()
    yield "requests", reqs.result()
    yield "dns", to_table("dns", dns_rows(doc), meta)
    yield "findings", to_table("findings", finding_rows(doc), meta)
    if isinstance(doc.get("timeseries"), dict):
        yield "timeseries", to_table("timeseries", timeseries_rows(doc), meta)
    if "knees" in doc:
        yield "knees", to_table("knees", knee_rows(doc), meta)
    if "groups" in doc:
        yield "groups", to_table("groups", group_rows(doc), meta)


def compression() -> str:
    """The codec of every file: zstd where this pyarrow has it, else snappy (else none)."""
    pa = _pyarrow()[0]
    return next((c for c in ("zstd", "snappy") if pa.Codec.is_available(c)), "none")


def write_parquet(doc: dict[str, Any], outdir: Path) -> list[Path]:
    """Write the Parquet files of ``doc`` into ``outdir`` (created if needed); returns
    their paths: connections, requests, dns, findings, then timeseries and knees when the
    document has those keys, and groups when it has ``groups``. Raises
    :class:`ParquetUnavailable` without pyarrow."""
    _, _, pq = _pyarrow()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    codec = compression()
    out = []
    for name, table in tables(doc):
        path = outdir / f"{name}.parquet"
        pq.write_table(table, str(path), compression=codec, version="2.6",
                       use_dictionary=True, write_statistics=True,
                       row_group_size=ROW_GROUP_ROWS, store_schema=True)
        out.append(path)
    return out


def _collapsed(cols: Columns) -> list[tuple[str, ColumnType | None]]:
    """``cols`` with each percentile block as one ``x.*`` entry (type None)."""
    out: list[tuple[str, ColumnType | None]] = []
    i = 0
    while i < len(cols):
        name, t = cols[i]
        stem = name[:-len(".count")]
        if name.endswith(".count") and [n for n, _ in cols[i:i + len(PCT)]] == [
                f"{stem}.{k}" for k in PCT]:
            out.append((f"{stem}.*", None))
            i += len(PCT)
        else:
            out.append((name, t))
            i += 1
    return out


def _type_text(t: ColumnType | None) -> str:
    """A column type as docs/report.md writes it (a struct's fields named, not typed)."""
    if t is None:
        return "percentiles"
    if isinstance(t, ListOf):
        return f"list<{_type_text(t.item)}>"
    if isinstance(t, MapOf):
        return f"map<string, {_type_text(t.value)}>"
    if isinstance(t, StructOf):
        return "struct{" + ", ".join(n for n, _ in _collapsed(t.fields)) + "}"
    return t


def column_docs(table: str) -> list[tuple[str, str]]:
    """``(column, type)`` of ``table`` as docs/report.md lists them (no pyarrow needed):
    a percentile block ``x.count`` (int64), ``x.min`` ... ``x.mean`` (float64) is one
    ``x.*`` entry of type ``percentiles``."""
    return [(n, _type_text(t)) for n, t in _collapsed(TABLES[table])]
