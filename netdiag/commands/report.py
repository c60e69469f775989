"""``netdiag report``: measure DNS, TCP, TLS and requests in capture files."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import IO, Any

import click

from netdiag.commands.common import (
    fleet_options,
    interval_option,
    keylog_paths,
    limit_options,
    load_keylogs,
    resolve_profile,
)
from netdiag.console import stderr_console
from netdiag.textsafe import print_warning

EXIT_TRUNCATED = 3
FORMATS = ["text", "json", "jsonl", "har", "html", "csv", "parquet"]


@click.command()
@click.argument("captures", nargs=-1, required=True, metavar="CAPTURE...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text",
              show_default=True,
              help="Terminal report, one JSON document, JSON Lines (streamed), HAR 1.2, a "
                   "self-contained HTML page, or one CSV or Parquet file per record type "
                   "(-o DIRECTORY).")
@click.option("-o", "--output", type=click.Path(writable=True),
              help="Write the report here instead of standard output (a directory for "
                   "csv and parquet).")
@click.option("--engine", type=click.Choice(["netdiag", "tshark"]), default="netdiag",
              show_default=True,
              help="Who dissects: netdiag's own engine, or tshark (through its JSON output; "
                   "slower, for cross-checking: see netdiag verify).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Path profile (TOML, docs/profiles.md): put every connection on a named "
                   "path and hop. Default: X.paths.toml beside the capture X.pcapng when "
                   "there is one; otherwise paths are inferred and marked so.")
@click.option("--no-profile", is_flag=True,
              help="Ignore a profile beside the capture: infer the paths.")
@click.option("--dns-slow-ms", type=float, default=100.0, show_default=True,
              help="DNS answers slower than this are a finding.")
@click.option("--rtt-slow-ms", type=float, default=100.0, show_default=True,
              help="TCP handshakes slower than this are a finding.")
@click.option("--tls-slow-ms", type=float, default=200.0, show_default=True,
              help="TLS handshakes slower than this are a finding.")
@click.option("--ttfb-slow-ms", type=float, default=1000.0, show_default=True,
              help="Times to first byte longer than this are a finding.")
@click.option("--reuse-min", type=click.FloatRange(0, 1), default=0.8, show_default=True,
              help="Connection reuse below this share is a finding.")
@click.option("--retrans-max", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="Retransmissions above this share of TCP packets are a finding.")
@click.option("--stall-ms", type=float, default=500.0, show_default=True,
              help="Pauses between events of a streamed answer longer than this are a "
                   "finding.")
@click.option("--dns-port", "dns_ports", type=click.IntRange(1, 65535), multiple=True,
              help="Also parse this port as DNS (53 always is). Repeatable.")
@click.option("--dns-heuristic/--no-dns-heuristic", default=True, show_default=True,
              help="Also parse UDP on other ports as DNS where it has DNS's shape (valid "
                   "header, one question that parses; unicast only), as tshark's heuristic "
                   "does; --dns-port forces a port.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--keylog", "keylogs", multiple=True, type=click.Path(dir_okay=False),
              help="TLS key log (NSS format, as SSLKEYLOGFILE writes) to decrypt with. "
                   "Repeatable; default: $SSLKEYLOGFILE. Keys embedded in a pcapng are "
                   "used too.")
@click.option("--write-pcapng", "write_pcapng",
              type=click.Path(dir_okay=False, writable=True),
              help="Also write the capture(s) as one pcapng with the TLS keys of its "
                   "connections embedded (Wireshark decrypts it without a key log).")
@click.option("--jobs", type=click.IntRange(min=0), envvar="NETDIAG_JOBS",
              show_envvar=True,
              help="Processes to analyze in: each reads all the input and keeps its share "
                   "of the flows; the report is the same as with 1. Default (or 0): one per "
                   "core, 1 for input under 64 MiB. The netdiag engine only.")
@interval_option
@limit_options
@fleet_options
def report(captures: tuple[str, ...], fmt: str, output: str | None, dns_slow_ms: float,
           rtt_slow_ms: float, tls_slow_ms: float, ttfb_slow_ms: float, reuse_min: float,
           retrans_max: float, stall_ms: float, dns_ports: tuple[int, ...],
           progress: bool | None, engine: str, profile_path: str | None, no_profile: bool,
           keylogs: tuple[str, ...], write_pcapng: str | None, jobs: int | None,
           dns_heuristic: bool, interval_ns: int | None,
           limits: dict[str, int], fleet: dict[str, Any]) -> None:
    """Measure DNS, TCP, TLS and requests in one or more pcap/pcapng files.

    A CAPTURE is a file, a folder (every capture under it), a glob ('caps/*/ring_*.pcapng',
    quoted: netdiag expands it) or a URL (file://, memory://, s3://... through fsspec).
    Files of one source that follow each other in time (rotated files) are one capture
    set, merged by time into one analysis; sets of different sources are analyzed apart
    and reported together (docs/scale.md). Figures and fields are those of
    docs/report.md; terms used in the terminal report: "link EN10MB" is the capture's
    link type (Ethernet), "h2c" HTTP/2 in the clear, and path names marked "inferred"
    come from the capture itself, not from a profile.

    Exit status: 0 every capture read to its end; 1 input error (a file missing or
    not a capture, a bad profile or key log); 2 usage error; 3 a capture is damaged
    or truncated (everything before the damage is reported, other capture sets in
    full); 4 internal error (a bug:
    NETDIAG_DEBUG=1 prints the traceback); 130 interrupted.
    """
    from netdiag.analysis.findings import Thresholds
    from netdiag.fleet.inputs import expand_inputs
    from netdiag.pipeline import Options
    from netdiag.shard import resolve_jobs

    if fmt in ("csv", "parquet") and not output:
        raise click.UsageError(f"--format {fmt} writes one file per record type: give -o "
                               "DIRECTORY")
    if fmt == "parquet":
        from netdiag.report.parquet_out import require_pyarrow

        require_pyarrow()
    inputs = expand_inputs(captures)
    for note in inputs.notes:
        stderr_console().print(f"note: {note}", highlight=False, markup=False)
    files = inputs.files
    if engine == "tshark" and (fleet["executor"] == "dask" or fleet["by"]
                               or fleet["max_records"] is not None):
        raise click.UsageError("--engine tshark reads files in this process only: without "
                               "--executor dask, --by or --max-records")
    keylog = load_keylogs(keylogs)
    profile = resolve_profile(profile_path, no_profile, files)

    thresholds = Thresholds(dns_slow_ms=dns_slow_ms, rtt_slow_ms=rtt_slow_ms,
                            tls_slow_ms=tls_slow_ms, ttfb_slow_ms=ttfb_slow_ms,
                            reuse_min=reuse_min, retrans_max=retrans_max, stall_ms=stall_ms)
    options = Options(thresholds=thresholds, dns_ports=frozenset({53, *dns_ports}),
                      keylog=keylog, dns_heuristic=dns_heuristic, **limits,
                      jobs=resolve_jobs(jobs, files) if engine == "netdiag" else 1,
                      max_memory=fleet["max_memory"], max_records=fleet["max_records"])
    to_file = bool(output) and fmt not in ("csv", "parquet")
    out: IO[str] = (open(output, "w", encoding="utf-8") if to_file  # noqa: SIM115
                    else sys.stdout)
    try:
        if engine == "tshark":
            result = _run_tshark(files, fmt, options, out, profile, output, keylogs,
                                 interval_ns)
        else:
            run = _fleet_runner(inputs, options, fleet, jobs, fmt)
            result = _run_report(files, fmt, options, out, progress, profile, output,
                                 interval_ns, run)
    finally:
        if to_file:
            out.close()
    if write_pcapng:
        from netdiag.pipeline import export_pcapng

        n, keys = export_pcapng(files, write_pcapng, result)
        stderr_console().print(f"wrote {write_pcapng}: {n} packets, keys of {keys} TLS "
                                "connection(s) embedded", highlight=False)
    if fleet["executor"] != "dask":  # everything is written: no heap teardown at exit
        from netdiag import quick_exit

        quick_exit.allow()
    if result.capture.truncated:
        sys.exit(EXIT_TRUNCATED)


def _fleet_runner(inputs: Any, options: Any, fleet: dict[str, Any], jobs: int | None,
                  fmt: str) -> Any:
    """How the captures are analyzed: None for one capture set the plain way (one file,
    the local executor, no --by/--max-records, and records that cannot pass
    --max-memory), else a function of (sink, progress callback) running the fleet
    (``netdiag.fleet``)."""
    plain = ((len(inputs.files) == 1 or fleet["one_set"]) and fleet["executor"] == "local"
             and not fleet["by"] and fleet["max_records"] is None
             and (fmt == "jsonl" or not _records_may_pass(inputs.files, fleet["max_memory"])))
    if plain:
        return None
    from netdiag.fleet import make_plan
    from netdiag.fleet.engine import FleetOptions, run_fleet

    plan = make_plan(inputs.files, inputs.explicit, fleet["gap_ns"],
                     probe=bool(fleet["by"]) or (len(inputs.files) > 1 and not fleet["one_set"]),
                     one_set=fleet["one_set"])

    def run(sink: Any, progress: Any) -> Any:
        fo = FleetOptions(executor=fleet["executor"], by=fleet["by"], jobs=jobs,
                          scheduler=fleet["scheduler"], workers=fleet["workers"],
                          max_records=fleet["max_records"], max_memory=fleet["max_memory"],
                          holds_records=fmt != "jsonl",
                          progress=progress)
        return run_fleet(plan, sink, options, fo)

    return run


def _records_may_pass(files: list[str], budget: int | None) -> bool:
    """Could these captures' records pass the memory budget (``netdiag.fleet.memory``)?
    A URL's size is not asked for here: it goes the fleet's way, which measures."""
    from netdiag.capture.sources import is_url
    from netdiag.record_cost import may_pass

    if budget is None:
        return False
    if any(is_url(f) for f in files):
        return True
    total = 0
    for f in files:
        with contextlib.suppress(OSError):
            total += os.path.getsize(f)
    return may_pass(total, budget)


def _run_report(captures: list[str], fmt: str, options: Any, out: IO[str],
                progress: bool | None, profile: Any, output: str | None,
                interval_ns: int | None, fleet_run: Any = None) -> Any:
    from netdiag.gcpolicy import Settler, paused, settle, tune_for_analysis
    from netdiag.pipeline import analyze
    from netdiag.report.records_out import CollectingSink, JsonlSink

    tune_for_analysis()
    err = stderr_console()
    show_progress = err.is_terminal if progress is None else progress
    bar = None
    on_fleet = None
    if show_progress:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(),
                       DownloadColumn(), TimeRemainingColumn(), console=err, transient=True)
        task = bar.add_task("reading", total=None)

        def _update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        def on_fleet(p: Any) -> None:
            bar.update(task, completed=p.bytes_done, total=p.bytes_total or None,
                       description=f"sets {p.sets_done}/{p.sets}")

        options.progress = _update
        bar.start()
    fleet_res = None

    def analyzed(sink: Any) -> Any:
        nonlocal fleet_res
        if fleet_run is None:
            return analyze(captures, sink, options)
        options.progress = None
        fleet_res = fleet_run(sink, on_fleet)
        return fleet_res.result

    try:
        if fmt == "jsonl":
            load = None
            if interval_ns is not None:
                from netdiag.paths.load import StreamingLoad

                load = StreamingLoad(profile)
            jsink = JsonlSink(out, load=load, interval_ns=interval_ns)
            result = analyzed(jsink)
            for g in (fleet_res.groups if fleet_res is not None else None) or []:
                out.write(json.dumps({"type": "group", **g}, separators=(",", ":")) + "\n")
            jsink.end(result)
        else:
            csink = CollectingSink(Settler())
            result = analyzed(csink)
            settle()  # the records stay until the report is written
    finally:
        if bar is not None:
            bar.stop()
    if fmt != "jsonl":
        # the path analysis pauses the collector; what it builds, and the writing, is
        # kept until the report is written, so it is frozen, not walked (the first young
        # collection after it took 0.28 s of a 3M-packet key log's report)
        with paused():
            if fmt == "text":
                _write_text(result, csink.connections, csink.dns_records, options, out,
                            profile, interval_ns)
                if fleet_res is not None and fleet_res.groups is not None:
                    _write_groups_text(fleet_res, out)
            else:
                doc = csink.document(result, headers=fmt in ("har", "html"),
                                     lazy=fmt in ("json", "csv", "parquet", "har", "html"))
                if fleet_res is not None:
                    doc = _with_fleet(doc, fleet_res)
                _write_collected(fmt, result, doc, csink.connections, csink.dns_records,
                                 options, out, profile, output, interval_ns)
            settle()
    for w in result.capture.warnings:
        if w.kind == "capture":
            print_warning(w.message)
    return result


def _with_fleet(doc: dict[str, Any], fleet_res: Any) -> dict[str, Any]:
    """The document with the fleet's additions: ``groups`` after ``summary`` (``--by``),
    and ``capture.records_omitted`` once the summary is sketched (``--max-records``)."""
    if fleet_res.sketched:
        doc["capture"]["records_omitted"] = {"connections": 0, "dns": 0, **fleet_res.omitted}
    if fleet_res.groups is None:
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[key] = value
        if key == "summary":
            out["groups"] = fleet_res.groups
    return out


def _write_groups_text(fleet_res: Any, out: IO[str]) -> None:
    from rich.console import Console

    from netdiag.fleet.render import groups_table

    console = Console(file=out) if out is not sys.stdout else Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for the group names
        console = Console(file=out, width=max(console.width, 120))
    console.print(groups_table(fleet_res.groups, fleet_res.by))


def _run_tshark(captures: list[str], fmt: str, options: Any, out: IO[str], profile: Any,
                output: str | None, keylogs: tuple[str, ...], interval_ns: int | None) -> Any:
    """The same report from tshark's dissection (``--engine tshark``)."""
    from netdiag.engines.tshark import tshark_analysis

    paths = keylog_paths(keylogs) if options.keylog is not None else []
    a = tshark_analysis(captures, paths or None, dns_ports=options.dns_ports,
                        thresholds=options.thresholds)
    if fmt == "jsonl":
        _write_document_lines(a.document, out)
    else:
        _write_collected(fmt, a.result, a.document, a.connections, a.dns_records, options,
                         out, profile, output, interval_ns)
    return a.result


def _write_document_lines(doc: dict[str, Any], out: IO[str]) -> None:
    """A whole document as JSON Lines records (what --format jsonl streams)."""
    def line(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    for t in doc["dns"]:
        line({"type": "dns", **t})
    for c in doc["connections"]:
        line({"type": "connection", **{k: v for k, v in c.items() if k != "requests"}})
        for r in c.get("requests") or []:
            line({"type": "request", "connection": c["id"], **r})
    for f in doc["findings"]:
        line({"type": "finding", **f})
    line({"type": "summary", "contract": doc["contract"],
          "netdiag_version": doc["netdiag_version"], **doc["summary"]})
    line({"type": "capture", **doc["capture"]})


def _write_text(result: Any, connections: Any, dns_records: Any, options: Any, out: IO[str],
                profile: Any, interval_ns: int | None = None) -> None:
    """The terminal report: paths straight from the records (no JSON document is built)."""
    from rich.console import Console

    from netdiag.paths.apply import analyze_paths
    from netdiag.report.terminal import render

    analysis = analyze_paths(connections, dns_records, profile, thresholds=options.thresholds,
                             interval_ns=interval_ns)
    render(result, Console(file=out) if out is not sys.stdout else Console(),
           paths=analysis, connections=connections)


def _write_collected(fmt: str, result: Any, doc: dict[str, Any], connections: Any,
                     dns_records: Any, options: Any, out: IO[str], profile: Any,
                     output: str | None, interval_ns: int | None = None) -> None:
    """Paths over the collected records, then the chosen format."""
    from netdiag.paths.apply import annotate_connection, apply_paths
    from netdiag.report.json_out import Records, write_json

    lazy = doc.get("connections")
    analysis = apply_paths(doc, connections, dns_records, profile, options.thresholds,
                           interval_ns=interval_ns, annotate=not isinstance(lazy, Records))
    if isinstance(lazy, Records):  # each connection gets its paths as it is written
        lazy.steps.append(lambda cj, conn: annotate_connection(cj, conn, analysis))
    if fmt == "json":
        write_json(doc, out)
    elif fmt in ("har", "html"):
        from netdiag.report.har import attribute_dns

        dns_of = None
        if isinstance(lazy, Records):  # the DNS lookups need no request: outlines only
            dns_of = attribute_dns({**doc, "connections": Records(
                lazy.items, lambda c: c.to_json(with_requests=False))})
        if fmt == "html":
            from netdiag.report.html import render_html

            out.write(render_html(doc, dns_of=dns_of))
        else:
            from netdiag.report.har import build_har
            from netdiag.report.json_encode import compact_encoder

            # the entries kept as JSON text (in a temporary file) until written, each by
            # the encoder write_json uses
            har = build_har(doc, dns_of=dns_of,
                            encode=compact_encoder(ensure_ascii=False, check_circular=False))
            if "groups" in doc:
                har["log"]["_groups"] = doc["groups"]
            write_json(har, out, ensure_ascii=False)
    elif fmt == "csv":
        from pathlib import Path

        from netdiag.report.csv_out import write_csv

        files = write_csv(doc, Path(output or "."))
        if "groups" in doc:
            from netdiag.fleet.render import write_groups_csv

            files = [*files, write_groups_csv(doc["groups"], Path(output or "."))]
        stderr_console().print(f"wrote {len(files)} CSV files to {output}", highlight=False)
    elif fmt == "parquet":
        from pathlib import Path

        from netdiag.report.parquet_out import write_parquet

        files = write_parquet(doc, Path(output or "."))
        stderr_console().print(f"wrote {len(files)} Parquet files to {output}",
                               highlight=False)
