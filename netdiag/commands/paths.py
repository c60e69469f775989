"""``netdiag paths``: per path, its hop chain and latency budget, and how paths differ."""

from __future__ import annotations

import json
import sys
from typing import IO

import click

from netdiag.commands.common import (
    interval_option,
    limit_options,
    load_keylogs,
    resolve_profile,
)
from netdiag.textsafe import print_warning

EXIT_TRUNCATED = 3


@click.command()
@click.argument("captures", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Path profile (TOML, see docs/profiles.md). Default: X.paths.toml "
                   "beside the capture X.pcapng when there is one; otherwise paths are "
                   "inferred from the capture and marked as inferred.")
@click.option("--no-profile", is_flag=True,
              help="Ignore a profile beside the capture: infer the paths.")
@click.option("--keylog", "keylogs", multiple=True, type=click.Path(dir_okay=False),
              help="TLS key log to decrypt with. Repeatable; default: $SSLKEYLOGFILE. "
                   "Keys embedded in a pcapng are used too.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Terminal tables or one JSON document.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write here instead of standard output.")
@click.option("--connections", "show_connections", is_flag=True,
              help="Also list every connection with its path, hop and evidence.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the bootstrap that compares paths.")
@click.option("--resp-slow-ms", type=float, default=10.0, show_default=True,
              help="Redis (token store) commands with a p99 above this are a finding.")
@click.option("--stall-ms", type=float, default=500.0, show_default=True,
              help="Pauses between events of a streamed answer longer than this are a "
                   "finding.")
@click.option("--reuse-min", type=click.FloatRange(0, 1), default=0.8, show_default=True,
              help="Connection reuse at a hop below this share is a finding.")
@click.option("--dns-port", "dns_ports", type=click.IntRange(1, 65535), multiple=True,
              help="Also parse this port as DNS (53 always is). Repeatable.")
@interval_option
@limit_options
def paths(captures: tuple[str, ...], profile_path: str | None, no_profile: bool,
          keylogs: tuple[str, ...],
          fmt: str, output: str | None, show_connections: bool, seed: int,
          resp_slow_ms: float, stall_ms: float, reuse_min: float,
          dns_ports: tuple[int, ...], interval_ns: int | None,
          limits: dict[str, int]) -> None:
    """Per path: the hop chain and latency budget, where the paths differ, and the
    knee of each path's time to first byte against its request rate.

    Exit status: 0 every capture read to its end; 1 input error; 2 usage error; 3 a
    capture is damaged or truncated (everything before the damage is analysed); 4
    internal error (a bug: NETDIAG_DEBUG=1 prints the traceback); 130 interrupted.
    """
    from netdiag import CONTRACT_VERSION, __version__
    from netdiag.analysis.findings import Thresholds
    from netdiag.gcpolicy import tune_for_analysis
    from netdiag.paths.apply import analyze_paths
    from netdiag.paths.findings import PathThresholds
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    tune_for_analysis()
    profile = resolve_profile(profile_path, no_profile, captures)
    thresholds = Thresholds(stall_ms=stall_ms, reuse_min=reuse_min)
    options = Options(thresholds=thresholds, dns_ports=frozenset({53, *dns_ports}),
                      keylog=load_keylogs(keylogs), **limits)
    sink = CollectingSink()
    result = analyze(list(captures), sink, options)
    doc = sink.document(result)
    conns = sink.connections
    analysis = analyze_paths(conns, sink.dns_records, profile, thresholds=thresholds,
                             path_thresholds=PathThresholds(resp_slow_ms=resp_slow_ms),
                             seed=seed, interval_ns=interval_ns)
    out: IO[str] = open(output, "w", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
    try:
        if fmt == "json":
            from netdiag.paths.apply import annotate_document

            annotate_document(doc, conns, analysis)
            json.dump({
                "contract": CONTRACT_VERSION, "netdiag_version": __version__,
                "capture": doc["capture"],
                "profile": None if profile is None else profile.source,
                "paths": analysis.summary(),
                "path_comparison": analysis.comparison_json(),
                "findings": [f.to_json() for f in analysis.findings],
                "timeseries": analysis.timeseries,
                "knees": analysis.knees,
                "connections": doc["connections"],
            }, out, indent=2)
            out.write("\n")
        else:
            from rich.console import Console

            from netdiag.paths.render import render_all

            console = Console(file=out) if output else Console()
            for item in render_all(analysis, conns, show_connections):
                console.print(item)
                console.print()
    finally:
        if output:
            out.close()
    for w in result.capture.warnings:
        if w.kind == "capture":
            print_warning(w.message)
    if result.capture.truncated:
        sys.exit(EXIT_TRUNCATED)
