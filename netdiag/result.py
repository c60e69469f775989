"""What an analysis hands to the formatters: the capture's facts, the summary, findings.

Below both the pipeline (which fills a :class:`Result`) and the report (which renders
one), so that neither imports the other.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any, Protocol

from netdiag.analysis.findings import Thresholds
from netdiag.analysis.summary import SummaryBuilder
from netdiag.contract import CaptureJson, Summary
from netdiag.records import Connection, DnsTransaction, Finding, Warning_, ns_to_ts
from netdiag.tls.keylog import KeyLog

MAX_WARNINGS = 200
"""Protocol warnings kept in the report; the rest are only counted."""


class Sink(Protocol):
    """Where finished records go."""

    def dns(self, t: DnsTransaction) -> None:
        """A finished DNS transaction."""

    def connection(self, c: Connection) -> None:
        """A finished connection, with its requests."""


def renders(sink: Any) -> bool:
    """Does ``sink`` render records apart from writing them (``render_dns`` and
    ``render_connection``, then ``dns_rendered`` and ``connection_rendered``: JSON
    Lines)? Such a sink streams: ``netdiag.shard`` renders in the process that finished
    a record and spills its shards' records, the fleet's Dask tasks render too."""
    return all(hasattr(sink, a) for a in ("render_dns", "render_connection", "dns_rendered",
                                          "connection_rendered"))


@dataclass
class CaptureFacts:
    """The contract's ``capture`` object, and what else a report needs about the input."""

    files: list[str] = field(default_factory=list)
    packets: int = 0
    bytes: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    link_types: list[str] = field(default_factory=list)
    truncated: bool = False
    warnings: list[Warning_] = field(default_factory=list)
    warnings_dropped: int = 0
    secrets: list[tuple[int, builtins.bytes]] = field(default_factory=list)
    undecoded: int = 0
    limits_hit: dict[str, int] = field(default_factory=dict)
    """Times each cap on the analysis state was reached (``netdiag.limits``)."""
    dns_ports_found: list[int] = field(default_factory=list)
    """UDP ports other than the DNS ports given where DNS was found by its shape."""

    def warn(self, w: Warning_) -> None:
        """Keep a warning, or count it once the list is long enough."""
        if len(self.warnings) < MAX_WARNINGS or w.kind in ("capture", "limit"):
            self.warnings.append(w)
        else:
            self.warnings_dropped += 1

    def to_json(self) -> CaptureJson:
        return {
            "files": self.files, "packets": self.packets, "bytes": self.bytes,
            "first_ts": ns_to_ts(self.first_ns), "last_ts": ns_to_ts(self.last_ns),
            "duration_ms": (None if self.first_ns is None or self.last_ns is None
                            else (self.last_ns - self.first_ns) / 1e6),
            "link_types": self.link_types, "truncated": self.truncated,
            "warnings": [w.to_json() for w in self.warnings],
            "warnings_dropped": self.warnings_dropped,
            "undecoded_packets": self.undecoded,
            "limits_hit": dict(sorted(self.limits_hit.items())),
        }


@dataclass
class Result:
    """Everything a formatter needs once the input is consumed."""

    capture: CaptureFacts
    summary: SummaryBuilder
    findings: list[Finding]
    thresholds: Thresholds
    client_randoms: set[bytes] = field(default_factory=set)
    """ClientHello randoms of the TLS connections seen."""
    keylog: KeyLog | None = None
    """Every secret known at the end (options and decryption-secrets blocks)."""

    def summary_json(self) -> Summary:
        return self.summary.build()
