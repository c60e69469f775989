"""CSV files from a contract document: one file per record type.

:func:`write_csv` writes, in ``outdir``:

* ``dns.csv``: one row per DNS transaction;
* ``connections.csv``: one row per connection, nested objects flattened into dotted
  columns (``tls.version``, ``tls.certificate.subject``, ``path.name``,
  ``http2.settings.client.MAX_CONCURRENT_STREAMS``...), without its requests;
* ``requests.csv``: one row per request, led by its ``connection`` id and its
  ``index`` on the connection (0-based), Redis commands (``protocol`` ``resp``)
  included;
* ``findings.csv``: one row per finding;
* ``summary.csv``: ``key,value`` rows of the flattened summary (``http.ttfb_ms.p50``,
  ``paths.ROC.phases.dns_ms.p50``...), preceded by ``contract``, ``netdiag_version`` and
  the ``capture.*`` facts;
* ``timeseries.csv`` (when the document has ``timeseries``): one row per path and
  interval, led by its ``path`` (empty for the requests on no path, key ``null``), the
  percentile blocks flattened (``ttfb_ms.p99``), each hop's own time as
  ``hops.<hop>.own_ms.p50`` and ``.p99`` (hops client-facing first, as the paths'
  chains in ``summary.paths`` order them, then in the order they appear);
* ``knees.csv`` (when the document has ``knees``): one row per knee, its CI as
  ``ci_low`` and ``ci_high``.

Cells: ``null`` is an empty cell, booleans are ``true``/``false``, numbers are
written as Python prints them (full precision), lists and objects that are not
flattened (``answers``, ``evidence``, headers, ``chunk_gaps_ms``) are compact JSON.
Columns come in a fixed order: the contract's fields in the order CONTRACT.md lists
them, then any other column in alphabetical order, so two reports of the same netdiag
version have the same header. Quoting follows RFC 4180 as the ``csv`` module writes it
(minimal quoting: a cell in double quotes, its own doubled, only when it holds a comma, a
double quote or a line end; the data lines are joined here, to the same bytes), CRLF line
ends, UTF-8 without BOM.

Spreadsheets run cells that begin with ``=``, ``+``, ``-`` or ``@`` (or a tab or a
carriage return before one) as formulas, and a capture is untrusted input (a DNS name,
an SNI, a path, a header can be ``=HYPERLINK(...)``): following OWASP's guidance on CSV
injection, every *text* cell that begins with one of :data:`FORMULA_START` gets a
leading ``'``, which spreadsheets hide and which stops the formula. Numbers are never
touched (a negative duration stays ``-1.5``), nor are empty cells, booleans, or the
compact JSON of lists and objects (it begins with ``[`` or ``{``). This is the default
(what ``netdiag report --format csv`` writes); ``excel_safe=False`` writes text exactly
as it is, for a program that reads the files back.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from netdiag.report.json_encode import compact_encoder
from netdiag.report.spill import BatchSpill

DNS_COLUMNS = ("ts", "client", "server", "transport", "id", "qname", "qtype", "rcode",
               "answers", "latency_ms", "retransmissions", "responses", "truncated")
CONNECTION_COLUMNS = (
    "id", "ts", "client", "server", "transport", "protocol", "handshake_rtt_ms",
    "retransmissions", "resets", "bytes_to_server", "bytes_to_client", "duration_ms",
    "packets", "out_of_order", "lost_bytes", "syn_retransmissions", "handshake_seen",
    "close", "requests",
    "tls.version", "tls.sni", "tls.alpn_offered", "tls.alpn", "tls.cipher", "tls.resumed",
    "tls.hello_retry", "tls.handshake_ms", "tls.decrypted", "tls.alert",
    "tls.session_tickets", "tls.key_updates", "tls.decrypt_error",
    "tls.certificate.subject", "tls.certificate.issuer", "tls.certificate.not_after",
    "tls.certificate.size", "tls.certificate.chain_length", "tls.certificate.chain_bytes",
    "path.name", "path.hop", "path.inferred", "path.evidence",
)
REQUEST_COLUMNS = (
    "connection", "index", "stream_id", "ts", "method", "authority", "path", "status",
    "ttfb_ms", "ttlb_ms", "send_ms", "response_bytes", "request_bytes", "chunks",
    "chunk_gaps_ms", "estimated", "protocol", "content_type", "sse_events",
    "first_event_ms", "reset", "reset_by", "stall_ms",
)
FINDING_COLUMNS = ("severity", "code", "title", "detail", "evidence")
_PCT = ("count", "min", "p50", "p90", "p99", "max", "mean")
TIMESERIES_COLUMNS = (
    "path", "start_ts", "requests", "rate_per_s", "in_flight_max", "new_connections",
    "reuse_rate", "dns_lookups", *(f"ttfb_ms.{k}" for k in _PCT),
    *(f"ttlb_ms.{k}" for k in _PCT), "retransmissions", "bytes", "estimated",
)
"""The columns of ``timeseries.csv`` before the hops' own times."""
HOP_FIELDS = ("p50", "p99")
"""Of each hop's own time per interval, the figures ``timeseries.csv`` has."""
KNEE_COLUMNS = ("path", "metric", "rate_per_s", "ci_low", "ci_high", "below_ms", "above_ms",
                "slope_ms_per_rps", "hop", "sentence", "points", "below", "above", "evidence")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""First characters of a text cell that a spreadsheet would read as a formula."""


_compact = compact_encoder(ensure_ascii=False)
"""``json.dumps(v, separators=(",", ":"), ensure_ascii=False)``, through orjson where it
gives the same JSON (:mod:`netdiag.report.json_encode`)."""


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return v
    return _compact(v)


def flatten(obj: dict[str, Any], prefix: str = "", *, lists: bool = False
            ) -> dict[str, Any]:
    """Nested dicts to one level with dotted keys; ``lists``: lists of dicts too, by
    index (``path_comparison.0.a``). Other values are kept as they are."""
    out: dict[str, Any] = {}
    _flatten_into(obj, prefix, lists, out)
    return out


def _flatten_into(obj: dict[Any, Any], prefix: str, lists: bool, out: dict[str, Any]) -> None:
    for k, v in obj.items():
        key = k if not prefix and k.__class__ is str else f"{prefix}{k}"
        t = v.__class__
        if t is str or t is int or t is float or v is None:  # most values: no test more
            out[key] = v
            continue
        if t is dict or isinstance(v, dict):
            if v:
                _flatten_into(v, key + ".", lists, out)
                continue
        elif lists and isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                _flatten_into(x, f"{key}.{i}.", lists, out)
            continue
        out[key] = v


def columns(rows: Iterable[Iterable[str]], known: Sequence[str]) -> list[str]:
    """``known`` first (all of them, so the header does not depend on the data), then
    every other key of ``rows`` (dicts, or the key tuples of :attr:`Rows.shapes`)
    alphabetically. A key that is only the empty parent of flattened ones (``tls`` where
    another row has ``tls.version``) is left out."""
    keys = {k for r in rows for k in r}
    parents = {k.rsplit(".", i)[0] for k in keys | set(known)
               for i in range(1, k.count(".") + 1)}
    seen = set(known)
    extra = sorted(k for k in keys if k not in seen and k not in parents)
    return list(known) + extra


def defuse(text: str) -> str:
    """``text`` with a leading ``'`` when a spreadsheet would run it as a formula."""
    return "'" + text if text.startswith(FORMULA_START) else text


ROWS_BATCH = 8192
"""Rows of a table kept in memory at once; each full batch goes to a
:class:`~netdiag.report.spill.BatchSpill` until the header is known."""


class Rows:
    """A table's rows, kept until every column is known: each row as the number of its
    keys' tuple (one tuple per distinct set and order of keys, :attr:`shapes`) and the
    tuple of its values, a batch of :data:`ROWS_BATCH` at a time pickled in a temporary
    file (a big capture's rows took as much memory as its records). Iterating gives
    ``(keys, values)`` per row, in the order added."""

    __slots__ = ("_count", "_keys", "_spill", "_values", "shapes")

    def __init__(self, rows: Iterable[dict[str, Any]] = ()) -> None:
        self.shapes: dict[tuple[str, ...], int] = {}
        """Each distinct tuple of keys, with its number."""
        self._keys: list[int] = []
        """The rows not yet spilled: each one's number of its keys in :attr:`shapes`."""
        self._values: list[tuple[Any, ...]] = []
        """The rows not yet spilled: each one's values, in the order of its keys."""
        self._spill = BatchSpill()
        self._count = 0
        for r in rows:
            self.append(r)

    def append(self, row: dict[str, Any]) -> None:
        keys = tuple(row)
        shape = self.shapes.get(keys)
        if shape is None:
            shape = self.shapes[keys] = len(self.shapes)
        self._keys.append(shape)
        self._values.append(tuple(row.values()))
        self._count += 1
        if len(self._values) >= ROWS_BATCH:
            self._spill.add((self._keys, self._values))
            self._keys, self._values = [], []

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[tuple[str, ...], tuple[Any, ...]]]:
        by_number = list(self.shapes)
        for keys, values in itertools.chain(self._spill, ((self._keys, self._values),)):
            for k, v in zip(keys, values, strict=True):
                yield by_number[k], v

    def close(self) -> None:
        """Let the rows go (the spilled ones' file too)."""
        self._spill.close()
        self._keys, self._values = [], []


def quoted(text: str) -> str:
    """``text`` as the ``csv`` module writes a cell of a row of several (``QUOTE_MINIMAL``,
    the default dialect): in double quotes, its own doubled, when it holds a comma, a
    double quote, a carriage return or a line feed; else as it is."""
    if "," in text or '"' in text or "\r" in text or "\n" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


LINES_BATCH = 512
"""Lines of a table joined into one write."""


def _write(path: Path, header: Sequence[str], rows: Rows, excel_safe: bool) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        # a column can be named by a capture-borne key (a flattened map): defused too
        w.writerow([defuse(k) for k in header] if excel_safe else header)
        # each row's values laid over a copy of the empty row: a row holds a few of the
        # many columns, so only the values it has are walked, not every cell
        place = {k: i for i, k in enumerate(header)}
        # the cells made text here and each line joined, as the csv module writes them
        # (None empty, an int by str(), a float by repr(), quoted where it must be): its
        # writer looked at every character of every cell, numbers and empty ones too
        empty: list[str] = [""] * len(place)
        places: dict[tuple[str, ...], list[int]] = {}  # per shape: each key's column
        lines: list[str] = []
        for keys, values in rows:
            at = places.get(keys)
            if at is None:
                # -1: the parent of flattened columns of other rows, not a column
                at = places[keys] = [place.get(k, -1) for k in keys]
            cells = empty.copy()
            for i, v in zip(at, values, strict=True):
                if i < 0 or v is None:
                    continue
                t = v.__class__
                if t is float:
                    cells[i] = repr(v)
                elif t is int:
                    cells[i] = str(v)
                else:
                    cells[i] = quoted(_text_cell(v, excel_safe))
            line = ",".join(cells)
            # the csv module writes a row of one empty cell as "", not as an empty line
            lines.append(line if line or not cells else '""')
            if len(lines) >= LINES_BATCH:
                lines.append("")
                f.write("\r\n".join(lines))
                lines = []
        if lines:
            lines.append("")
            f.write("\r\n".join(lines))


def _text_cell(v: Any, excel_safe: bool) -> str:
    """A cell's text before quoting: text as it is (defused), else :func:`_cell`."""
    if v.__class__ is str:
        return defuse(v) if excel_safe else v
    c = _cell(v)
    if excel_safe and isinstance(v, str):  # a subclass of str
        c = defuse(c)
    return c


def _dns_dicts(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The rows of ``dns.csv``, one at a time."""
    return (dict(d) for d in doc.get("dns") or [])


def dns_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(_dns_dicts(doc))


def _connection_row(c: dict[str, Any]) -> dict[str, Any]:
    flat = flatten({k: v for k, v in c.items() if k != "requests"})
    flat["requests"] = len(c.get("requests") or [])
    return flat


def _add_request_rows(c: dict[str, Any], rows: list[dict[str, Any]] | Rows) -> None:
    for i, r in enumerate(c.get("requests") or []):
        row = flatten(r)
        row["connection"] = r.get("connection", c.get("id"))
        row["index"] = i
        rows.append(row)


def connection_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [_connection_row(c) for c in doc.get("connections") or []]


def request_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in doc.get("connections") or []:
        _add_request_rows(c, rows)
    return rows


def connection_and_request_rows(doc: dict[str, Any]) -> tuple[Rows, Rows]:
    """:func:`connection_rows` and :func:`request_rows` in one pass over the connections
    (a document made as it is read, ``Records`` as ``netdiag report`` makes it, renders
    each connection once), kept as :class:`Rows`."""
    conns, reqs = Rows(), Rows()
    for c in doc.get("connections") or []:
        conns.append(_connection_row(c))
        _add_request_rows(c, reqs)
    return conns, reqs


def summary_rows(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The rows of ``summary.csv``, made as they are written (without a profile the
    summary has a block per server: millions of rows on a capture of many servers)."""
    head: dict[str, Any] = {"contract": doc.get("contract"),
                            "netdiag_version": doc.get("netdiag_version")}
    cap = doc.get("capture") or {}
    head.update(flatten(cap, "capture."))
    head.update(flatten(doc.get("summary") or {}, lists=True))
    for k, v in head.items():
        yield {"key": k, "value": v}


def timeseries_rows(doc: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The header and rows of ``timeseries.csv``: one row per path and interval."""
    ts = doc.get("timeseries")
    paths = ts.get("paths") if isinstance(ts, dict) else None
    rows: list[dict[str, Any]] = []
    hops: dict[str, None] = {}                      # in the order they first appear
    for name, intervals in (paths.items() if isinstance(paths, dict) else ()):
        for iv in intervals if isinstance(intervals, list) else ():
            if not isinstance(iv, dict):
                continue
            row = flatten({k: v for k, v in iv.items() if k != "hops"})
            row["path"] = None if name in (None, "null") else name
            hop_map = iv.get("hops")
            for hop, figures in (hop_map.items() if isinstance(hop_map, dict) else ()):
                own = figures.get("own_ms") if isinstance(figures, dict) else None
                hops.setdefault(str(hop))
                for f in HOP_FIELDS:
                    row[f"hops.{hop}.own_ms.{f}"] = own.get(f) if isinstance(own, dict) else None
            rows.append(row)
    known = [*TIMESERIES_COLUMNS,
             *(f"hops.{h}.own_ms.{f}" for h in _hop_order(doc, hops) for f in HOP_FIELDS)]
    return columns(rows, known), rows


def _hop_order(doc: dict[str, Any], seen: Iterable[str]) -> list[str]:
    """The hops ``seen``, client-facing first: the paths' chains (``summary.paths.<name>
    .hops``) merged, a hop going before the hops it precedes in any chain; hops no chain
    names after them, in the order they were seen."""
    order: list[str] = []
    paths = (doc.get("summary") or {}).get("paths")
    for p in (paths.values() if isinstance(paths, dict) else ()):
        chain = [str(h) for h in (p.get("hops") or [])] if isinstance(p, dict) else []
        for i, h in enumerate(chain):
            if h in order:
                continue
            later = [order.index(x) for x in chain[i + 1:] if x in order]
            if later:
                order.insert(min(later), h)
            else:
                order.append(h)
    seen = list(seen)
    return [h for h in order if h in seen] + [h for h in seen if h not in order]


def knee_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``knees.csv``: one per knee, its CI split in two columns."""
    rows = []
    for k in doc.get("knees") or []:
        if not isinstance(k, dict):
            continue
        ci = k.get("ci")
        lo, hi = (ci[0], ci[1]) if isinstance(ci, list | tuple) and len(ci) == 2 else (None,
                                                                                        None)
        rows.append({**{c: k.get(c) for c in KNEE_COLUMNS}, "ci_low": lo, "ci_high": hi})
    return rows


def write_csv(doc: dict[str, Any], outdir: Path, *, excel_safe: bool = True
              ) -> list[Path]:
    """Write the CSV files of ``doc`` into ``outdir`` (created if needed); returns their
    paths: dns, connections, requests, findings, summary, then timeseries and knees when
    the document has those keys. ``excel_safe``: text cells a spreadsheet would run as a
    formula get a leading ``'`` (the default)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []

    def table(name: str, header: list[str], rows: Rows) -> None:
        path = outdir / name
        try:
            _write(path, header, rows, excel_safe)
        finally:
            rows.close()
        out.append(path)

    rows = Rows(_dns_dicts(doc))
    table("dns.csv", columns(rows.shapes, DNS_COLUMNS), rows)
    rows, requests = connection_and_request_rows(doc)
    table("connections.csv", columns(rows.shapes, CONNECTION_COLUMNS), rows)
    del rows
    table("requests.csv", columns(requests.shapes, REQUEST_COLUMNS), requests)
    del requests
    rows = Rows(dict(f) for f in doc.get("findings") or [])
    table("findings.csv", columns(rows.shapes, FINDING_COLUMNS), rows)
    table("summary.csv", ["key", "value"], Rows(summary_rows(doc)))
    if isinstance(doc.get("timeseries"), dict):
        header, series = timeseries_rows(doc)
        table("timeseries.csv", header, Rows(series))
    if "knees" in doc:
        table("knees.csv", list(KNEE_COLUMNS), Rows(knee_rows(doc)))
    return out
