"""Sinks that turn finished records into the contract's JSON and JSON Lines."""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

from netdiag import CONTRACT_VERSION, __version__
from netdiag.contract import Document
from netdiag.gcpolicy import Settler
from netdiag.records import Connection, DnsTransaction, compact_gaps
from netdiag.report.json_encode import compact_encoder
from netdiag.report.json_out import Records
from netdiag.result import Result

if TYPE_CHECKING:
    from netdiag.paths.load import StreamingLoad


def _conn_order(c: Connection) -> int:
    return int(c.id[1:])


_ID = "\x00netdiag-connection-id\x00"
"""Stands for the connection id in a rendered line (see ``JsonlSink.render_connection``)."""
_QUOTED_ID = json.dumps(_ID)


_encode = compact_encoder(check_circular=False)
"""``json.dumps(obj, separators=(",", ":"))``, through orjson where it gives the same JSON
(:mod:`netdiag.report.json_encode`; without the cycle check: records are trees)."""


def _line(obj: dict[str, Any]) -> str:
    return _encode(obj) + "\n"


class CollectingSink:
    """Keeps every record, for the whole-document JSON and the terminal report."""

    def __init__(self, settler: Settler | None = None) -> None:
        self.dns_records: list[DnsTransaction] = []
        self.connections: list[Connection] = []
        self.settler = settler
        """Told of each record kept (an analyzing command's: ``netdiag.gcpolicy``)."""

    def dns(self, t: DnsTransaction) -> None:
        self.dns_records.append(t)
        if self.settler is not None:
            self.settler.kept()

    def connection(self, c: Connection) -> None:
        compact_gaps(c)
        self.connections.append(c)
        if self.settler is not None:
            self.settler.kept()

    def document(self, result: Result, headers: bool = False, lazy: bool = False) -> Document:
        """The contract's single JSON object (``headers``: decoded HTTP headers too;
        ``lazy``: its connections and DNS transactions as
        :class:`~netdiag.report.json_out.Records`, each made into a dict only as
        :func:`~netdiag.report.json_out.write_json` writes it)."""
        self.dns_records.sort(key=lambda t: (t.ts_ns, t.id))
        self.connections.sort(key=_conn_order)
        connections: Any = (
            Records(self.connections, lambda c: c.to_json(headers=headers)) if lazy
            else [c.to_json(headers=headers) for c in self.connections])
        dns: Any = (Records(self.dns_records, lambda t: t.to_json()) if lazy
                    else [t.to_json() for t in self.dns_records])
        return {
            "contract": CONTRACT_VERSION,
            "netdiag_version": __version__,
            "capture": result.capture.to_json(),
            "summary": result.summary_json(),
            "dns": dns,
            "connections": connections,
            "findings": [f.to_json() for f in result.findings],
        }


class JsonlSink:
    """Writes each record as one JSON line the moment it is finished; with ``load``
    (``--interval``), also keeps a compact row per request for the time series records
    written at the end."""

    def __init__(self, out: IO[str], load: StreamingLoad | None = None,
                 interval_ns: int | None = None) -> None:
        self.out = out
        self.load = load
        self.interval_ns = interval_ns

    def _write(self, obj: dict[str, Any]) -> None:
        self.out.write(_line(obj))

    def dns(self, t: DnsTransaction) -> None:
        self.dns_rendered(t, self.render_dns(t))

    def connection(self, c: Connection) -> None:
        self.connection_rendered(c, self.render_connection(c))

    # Rendering apart from writing: netdiag.shard renders a record in the process that
    # finished it, before the connections of all processes are numbered, and writes the
    # text in the parent, in order, with the final id.
    @staticmethod
    def render_dns(t: DnsTransaction) -> str:
        """The record's line."""
        return _line({"type": "dns", **t.to_json()})

    def dns_rendered(self, t: DnsTransaction, text: str) -> None:
        """Write what :meth:`render_dns` gave for ``t``."""
        self.out.write(text)
        if self.load is not None:
            self.load.dns(t)

    @staticmethod
    def render_connection(c: Connection) -> str:
        """The connection's line and its requests' lines, a placeholder for the id."""
        head = c.to_json(with_requests=False)
        head["id"] = _ID
        return _line({"type": "connection", **head}) + "".join(
            [_line({"type": "request", **r.to_json(_ID)}) for r in c.requests])

    def connection_rendered(self, c: Connection, text: str) -> None:
        """Write what :meth:`render_connection` gave for ``c``, with ``c.id``."""
        if self.load is not None:
            self.load.connection(c)
        cid = json.dumps(c.id)
        if text.count(_QUOTED_ID) == 1 + len(c.requests):
            self.out.write(text.replace(_QUOTED_ID, cid))
            return
        # a value of the record is the placeholder itself: cut each line where the id is
        head = c.to_json(with_requests=False)
        head["id"] = _ID
        before, after = _line({"type": "connection", **head}).split(_QUOTED_ID, 1)
        parts = [before, cid, after]
        for r in c.requests:
            before, after = _line({"type": "request", **r.to_json(_ID)}).rsplit(_QUOTED_ID, 1)
            parts += (before, cid, after)
        self.out.write("".join(parts))

    def end(self, result: Result) -> None:
        """The records only known at the end: time series and knees (with ``load``),
        findings, summary, capture facts."""
        findings = list(result.findings)
        if self.load is not None:
            built = self.load.build(self.interval_ns)
            ts = built.timeseries
            for path, entries in ts["paths"].items():
                for e in entries:
                    self._write({"type": "timeseries", "path": None if path == "null" else path,
                                 "interval_ms": ts["interval_ms"], **e})
            for k in built.knees:
                self._write({"type": "knee", **k})
            findings += built.findings
        for f in findings:
            self._write({"type": "finding", **f.to_json()})
        self._write({"type": "summary", "contract": CONTRACT_VERSION,
                     "netdiag_version": __version__, **result.summary_json()})
        self._write({"type": "capture", **result.capture.to_json()})
