"""Paths for a whole report: attribute, link, budget, compare, find; fill a JSON document.

``netdiag report --profile`` calls :func:`apply_paths` on the contract document once
every record is collected; ``netdiag paths`` calls :func:`analyze_paths` and renders it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from netdiag.analysis.findings import Thresholds
from netdiag.gcpolicy import paused
from netdiag.paths.attribute import attribute
from netdiag.paths.budget import (
    MIN_SAMPLES,
    RESAMPLES,
    Difference,
    PathBudget,
    build_budgets,
    compare_all,
    summary_paths,
)
from netdiag.paths.chains import Chains, Step
from netdiag.paths.edge import annotate_edge, edge_findings
from netdiag.paths.findings import PathThresholds, path_findings
from netdiag.paths.load import Load, load_of_paths
from netdiag.paths.profile import Profile
from netdiag.records import Connection, DnsTransaction, Finding, Warning_


@dataclass
class PathsAnalysis:
    """Everything the paths of one capture yield."""

    profile: Profile | None
    chains: Chains
    budgets: dict[str, PathBudget]
    differences: list[Difference]
    findings: list[Finding]
    chain_table: dict[tuple[str, int], list[Step]] = field(default_factory=dict)
    """Chains of the client requests that caused other requests, by (connection id,
    request index)."""
    load: Load | None = None
    """Load over time and the knees (:mod:`netdiag.paths.load`); None when not asked."""

    @property
    def timeseries(self) -> dict[str, Any] | None:
        """The contract's ``timeseries`` (None without load analysis)."""
        return None if self.load is None else self.load.timeseries

    @property
    def knees(self) -> list[dict[str, Any]] | None:
        """The contract's ``knees`` (None without load analysis)."""
        return None if self.load is None else self.load.knees

    def summary(self) -> dict[str, Any]:
        """The contract's ``summary.paths``."""
        return summary_paths(self.budgets)

    def comparison_json(self) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.differences]


def analyze_paths(connections: list[Connection], dns_records: Sequence[DnsTransaction],
                  profile: Profile | None = None, *, thresholds: Thresholds | None = None,
                  path_thresholds: PathThresholds | None = None, seed: int = 0,
                  resamples: int = RESAMPLES, min_samples: int = MIN_SAMPLES,
                  load: bool = True, interval_ns: int | None = None) -> PathsAnalysis:
    """Attribute every connection (sets ``conn.path``), link chains, build the budgets,
    compare paths and derive the path findings; with ``load``, the time series per
    path and interval (``interval_ns``, default chosen from the capture) and the knees."""
    with paused():
        chains = attribute(connections, profile)
        budgets = build_budgets(connections, dns_records, chains, profile)
        diffs = compare_all(budgets, seed=seed, resamples=resamples, min_samples=min_samples)
        findings = path_findings(budgets, diffs, chains, thresholds, path_thresholds)
        findings = [*findings, *edge_findings(connections, profile)]
        built = None
        if load:
            built = load_of_paths(connections, dns_records, budgets).build(interval_ns,
                                                                          seed=seed)
            findings.extend(built.findings)
        return PathsAnalysis(profile, chains, budgets, diffs, findings, chains.table(), built)


def annotate_document(doc: dict[str, Any], connections: Sequence[Connection],
                      analysis: PathsAnalysis) -> None:
    """Write ``path`` into each ``doc["connections"][]``, and into each request dict a
    ``chain`` (client requests that caused others) or ``caused_by`` (``{"connection",
    "request"}``, for requests another captured request caused)."""
    by_id = {c.id: c for c in connections}
    for cj in doc.get("connections", []):
        conn = by_id.get(str(cj.get("id"))) if isinstance(cj, dict) else None
        if conn is not None:
            annotate_connection(cj, conn, analysis)


def annotate_connection(cj: dict[str, Any], conn: Connection, analysis: PathsAnalysis) -> None:
    """What :func:`annotate_document` writes, for one connection's dict ``cj``."""
    annotate_edge(cj, conn, analysis.profile)
    cj["path"] = conn.path
    for i, rj in enumerate(cj.get("requests") or []):
        steps = analysis.chain_table.get((conn.id, i))
        if steps is not None:
            rj["chain"] = [s.to_json() for s in steps]
        node = analysis.chains.node(conn.id, i)
        if node is not None and node.parent is not None:
            rj["caused_by"] = {"connection": node.parent.conn.id,
                               "request": node.parent.index}


def apply_paths(doc: dict[str, Any], connections: list[Connection],
                dns_records: Sequence[DnsTransaction], profile: Profile | None,
                thresholds: Thresholds | None = None,
                path_thresholds: PathThresholds | None = None,
                interval_ns: int | None = None, *, annotate: bool = True) -> PathsAnalysis:
    """Fill a contract document (``CollectingSink.document``) with paths.

    Sets ``connections[].path`` (and ``conn.path`` on the records), adds ``chain`` /
    ``caused_by`` to requests, sets ``summary.paths`` and ``summary.path_comparison``,
    sets ``timeseries`` and ``knees``, and merges the path findings into ``findings``
    (most severe first). Returns the analysis, whose ``findings`` a terminal report can
    add to its own. Without ``annotate`` the connections are left as they are, for the
    caller to pass each through :func:`annotate_connection` as it writes it.
    """
    analysis = analyze_paths(connections, dns_records, profile, thresholds=thresholds,
                             path_thresholds=path_thresholds, interval_ns=interval_ns)
    if annotate:
        annotate_document(doc, connections, analysis)
    summary = doc.setdefault("summary", {})
    summary["paths"] = analysis.summary()
    summary["path_comparison"] = analysis.comparison_json()
    if analysis.load is not None:
        doc["timeseries"] = analysis.load.timeseries
        doc["knees"] = analysis.load.knees
        warnings = doc.setdefault("capture", {}).setdefault("warnings", [])
        warnings.extend(Warning_("interval", w).to_json() for w in analysis.load.warnings)
    findings = list(doc.get("findings", [])) + [f.to_json() for f in analysis.findings]
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order.get(f.get("severity", ""), 3))
    doc["findings"] = findings
    return analysis
