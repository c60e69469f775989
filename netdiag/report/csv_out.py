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
  the ``capture.*`` facts.

Cells: ``null`` is an empty cell, booleans are ``true``/``false``, numbers are
written as Python prints them (full precision), lists and objects that are not
flattened (``answers``, ``evidence``, headers, ``chunk_gaps_ms``) are compact JSON.
Columns come in a fixed order: the contract's fields in the order CONTRACT.md lists
them, then any other column in alphabetical order, so two reports of the same netdiag
version have the same header. Quoting follows RFC 4180 (``csv`` module, CRLF line
ends, UTF-8 without BOM).

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
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""First characters of a text cell that a spreadsheet would read as a formula."""


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def flatten(obj: dict[str, Any], prefix: str = "", *, lists: bool = False
            ) -> dict[str, Any]:
    """Nested dicts to one level with dotted keys; ``lists``: lists of dicts too, by
    index (``path_comparison.0.a``). Other values are kept as they are."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + ".", lists=lists))
        elif lists and isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(flatten(x, f"{key}.{i}.", lists=lists))
        else:
            out[key] = v
    return out


def columns(rows: Iterable[dict[str, Any]], known: Sequence[str]) -> list[str]:
    """``known`` first (all of them, so the header does not depend on the data), then
    every other key of ``rows`` alphabetically. A key that is only the empty parent of
    flattened ones (``tls`` where another row has ``tls.version``) is left out."""
    keys = {k for r in rows for k in r}
    parents = {k.rsplit(".", i)[0] for k in keys | set(known)
               for i in range(1, k.count(".") + 1)}
    seen = set(known)
    extra = sorted(k for k in keys if k not in seen and k not in parents)
    return list(known) + extra


def defuse(text: str) -> str:
    """``text`` with a leading ``'`` when a spreadsheet would run it as a formula."""
    return "'" + text if text.startswith(FORMULA_START) else text


def _write(path: Path, header: Sequence[str], rows: Iterable[dict[str, Any]],
           excel_safe: bool) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        # a column can be named by a capture-borne key (a flattened map): defused too
        w.writerow([defuse(k) for k in header] if excel_safe else header)
        for r in rows:
            cells = []
            for k in header:
                v = r.get(k)
                c = _cell(v)
                if excel_safe and isinstance(v, str):
                    c = defuse(c)
                cells.append(c)
            w.writerow(cells)


def dns_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(d) for d in doc.get("dns") or []]


def connection_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in doc.get("connections") or []:
        flat = flatten({k: v for k, v in c.items() if k != "requests"})
        flat["requests"] = len(c.get("requests") or [])
        rows.append(flat)
    return rows


def request_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in doc.get("connections") or []:
        for i, r in enumerate(c.get("requests") or []):
            row = flatten(r)
            row["connection"] = r.get("connection", c.get("id"))
            row["index"] = i
            rows.append(row)
    return rows


def summary_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    head: dict[str, Any] = {"contract": doc.get("contract"),
                            "netdiag_version": doc.get("netdiag_version")}
    cap = doc.get("capture") or {}
    head.update(flatten(cap, "capture."))
    head.update(flatten(doc.get("summary") or {}, lists=True))
    return [{"key": k, "value": v} for k, v in head.items()]


def write_csv(doc: dict[str, Any], outdir: Path, *, excel_safe: bool = True
              ) -> list[Path]:
    """Write the five CSV files of ``doc`` into ``outdir`` (created if needed); returns
    their paths: dns, connections, requests, findings, summary. ``excel_safe``: text
    cells a spreadsheet would run as a formula get a leading ``'`` (the default)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tables: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    rows = dns_rows(doc)
    tables.append(("dns.csv", columns(rows, DNS_COLUMNS), rows))
    rows = connection_rows(doc)
    tables.append(("connections.csv", columns(rows, CONNECTION_COLUMNS), rows))
    rows = request_rows(doc)
    tables.append(("requests.csv", columns(rows, REQUEST_COLUMNS), rows))
    rows = [dict(f) for f in doc.get("findings") or []]
    tables.append(("findings.csv", columns(rows, FINDING_COLUMNS), rows))
    tables.append(("summary.csv", ["key", "value"], summary_rows(doc)))
    out = []
    for name, header, rows in tables:
        path = outdir / name
        _write(path, header, rows, excel_safe)
        out.append(path)
    return out
