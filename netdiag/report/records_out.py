"""Sinks that turn finished records into the contract's JSON and JSON Lines."""

from __future__ import annotations

import json
from typing import IO, Any

from netdiag import CONTRACT_VERSION, __version__
from netdiag.pipeline import Result
from netdiag.records import Connection, DnsTransaction


def _conn_order(c: Connection) -> int:
    return int(c.id[1:])


class CollectingSink:
    """Keeps every record, for the whole-document JSON and the terminal report."""

    def __init__(self) -> None:
        self.dns_records: list[DnsTransaction] = []
        self.connections: list[Connection] = []

    def dns(self, t: DnsTransaction) -> None:
        self.dns_records.append(t)

    def connection(self, c: Connection) -> None:
        self.connections.append(c)

    def document(self, result: Result, headers: bool = False) -> dict[str, Any]:
        """The contract's single JSON object (``headers``: decoded HTTP headers too)."""
        self.dns_records.sort(key=lambda t: (t.ts_ns, t.id))
        self.connections.sort(key=_conn_order)
        return {
            "contract": CONTRACT_VERSION,
            "netdiag_version": __version__,
            "capture": result.capture.to_json(),
            "summary": result.summary_json(),
            "dns": [t.to_json() for t in self.dns_records],
            "connections": [c.to_json(headers=headers) for c in self.connections],
            "findings": [f.to_json() for f in result.findings],
        }


class JsonlSink:
    """Writes each record as one JSON line the moment it is finished."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def _write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, separators=(",", ":")))
        self.out.write("\n")

    def dns(self, t: DnsTransaction) -> None:
        self._write({"type": "dns", **t.to_json()})

    def connection(self, c: Connection) -> None:
        self._write({"type": "connection", **c.to_json(with_requests=False)})
        for r in c.requests:
            self._write({"type": "request", **r.to_json(c.id)})

    def end(self, result: Result) -> None:
        """The records only known at the end: findings, summary, capture facts."""
        for f in result.findings:
            self._write({"type": "finding", **f.to_json()})
        self._write({"type": "summary", "contract": CONTRACT_VERSION,
                     "netdiag_version": __version__, **result.summary_json()})
        self._write({"type": "capture", **result.capture.to_json()})
