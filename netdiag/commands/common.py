"""What several commands share: where the TLS keys come from, how a result is printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from netdiag.console import stderr_console
from netdiag.durations import parse_duration_ns


def keylog_paths(paths: tuple[str, ...] | list[str], doing: str = "reporting") -> list[str]:
    """The key log files to use: those named, else ``$SSLKEYLOGFILE``'s when it exists
    (a warning says so when it names a missing file; ``doing`` completes the sentence)."""
    if paths:
        return list(paths)
    env = os.environ.get("SSLKEYLOGFILE")
    if not env:
        return []
    if not os.path.exists(env):
        stderr_console().print(f"[yellow]warning:[/] SSLKEYLOGFILE names {env}, which does "
                               f"not exist; {doing} without keys", highlight=False)
        return []
    return [env]


def load_keylogs(paths: tuple[str, ...] | list[str]) -> Any:
    """The key logs of :func:`keylog_paths`, merged into one ``KeyLog``; None without any."""
    from netdiag.tls.keylog import KeyLog

    files = keylog_paths(paths)
    if not files:
        return None
    merged = KeyLog()
    for p in files:
        merged.merge(KeyLog.from_file(p))
    return merged


def print_result(fmt: str, result: Any, render: Callable[[Any, Any], None]) -> None:
    """``--format json``: the result's JSON on stdout; else ``render`` into a rich console
    that is at least 140 columns wide when stdout is not a terminal."""
    if fmt == "json":
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))
    render(result, console)


def profile_beside(captures: tuple[str, ...] | list[str]) -> str | None:
    """``X.paths.toml`` beside the first capture ``X.pcapng`` (also ``X.pcap``,
    ``X.pcapng.gz``; ``X`` may hold dots), where it exists."""
    from pathlib import Path

    if not captures:
        return None
    first = Path(captures[0])
    name = first.name
    for suffix in (".gz",):
        name = name.removesuffix(suffix)
    stems = [name.rsplit(".", 1)[0], name.split(".", 1)[0]]
    for stem in dict.fromkeys(stems):
        candidate = first.with_name(f"{stem}.paths.toml")
        if candidate.is_file():
            return str(candidate)
    return None


def resolve_profile(profile_path: str | None, no_profile: bool,
                    captures: tuple[str, ...] | list[str]) -> Any:
    """The path profile to use: ``--profile``'s, else ``X.paths.toml`` beside the capture
    (saying so on stderr), none with ``--no-profile``."""
    from netdiag.paths.profile import load_profile

    if profile_path:
        return load_profile(profile_path)
    if no_profile:
        return None
    found = profile_beside(captures)
    if found is None:
        return None
    profile = load_profile(found)
    stderr_console().print(f"note: using the path profile {found} found beside the "
                           "capture (--profile FILE for another, --no-profile for none)",
                           highlight=False)
    return profile


def limit_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The flags that raise the caps on analysis state over all connections
    (``netdiag.limits``); the command receives them as ``limits``, a dict of
    ``Options`` fields."""
    import functools

    import click

    from netdiag.limits import (
        DEFAULT_MAX_CONNECTIONS,
        DEFAULT_MAX_DNS_OPEN,
        DEFAULT_MAX_HELD_BYTES,
    )

    @click.option("--max-connections", type=click.IntRange(min=1),
                  default=DEFAULT_MAX_CONNECTIONS, show_default=True,
                  help="TCP connections open at once; beyond, the least recently active "
                       "are finished early (close: evicted, capture.limits_hit).")
    @click.option("--max-held-mib", type=click.IntRange(min=1),
                  default=DEFAULT_MAX_HELD_BYTES >> 20, show_default=True,
                  help="MiB of out-of-order and not-yet-analyzed TCP payload held over all "
                       "connections; beyond, missing bytes are declared lost sooner.")
    @click.option("--max-dns-pending", type=click.IntRange(min=1),
                  default=DEFAULT_MAX_DNS_OPEN, show_default=True,
                  help="DNS transactions awaiting an answer at once; beyond, the least "
                       "recently active are finished early.")
    @functools.wraps(f)
    def wrapper(*args: Any, max_connections: int, max_held_mib: int, max_dns_pending: int,
                **kwargs: Any) -> Any:
        kwargs["limits"] = {"max_connections": max_connections,
                            "max_held_bytes": max_held_mib << 20,
                            "max_dns_open": max_dns_pending}
        return f(*args, **kwargs)

    return wrapper


def duration_callback(default: int | None) -> Callable[[Any, Any, str | None], int | None]:
    """A click callback reading a duration option (``netdiag.durations``) as ns, or
    ``default`` when the option is not given; a bad value is a usage error."""

    def convert(ctx: Any, param: Any, value: str | None) -> int | None:
        import click

        if value is None:
            return default
        try:
            return parse_duration_ns(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return convert


def interval_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--interval DURATION`` as ``interval_ns`` (None: chosen from the capture)."""
    import click

    return click.option(
        "--interval", "interval_ns", callback=duration_callback(None), metavar="DURATION",
        help="Length of the load-over-time intervals (500ms, 1s, 1m). Default: chosen "
             "from the capture's length (at most 60 intervals). With --format jsonl, "
             "time series records are written only when this is given.")(f)


def _memory_size(ctx: Any, param: Any, value: str) -> int | None:
    import click

    from netdiag.fleet.memory import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def fleet_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a report over a fleet of captures (``netdiag.fleet``,
    ``docs/scale.md``); the command receives them as ``fleet``, a dict."""
    import functools

    import click

    from netdiag.fleet.sets import DEFAULT_GAP_NS

    gap = duration_callback(DEFAULT_GAP_NS)

    @click.option("--by", "by", type=click.Choice(["host", "file", "set"]),
                  help="Also summarize per host (a capture source), per file or per capture "
                       "set: the report gains groups (JSON groups, a JSON Lines group "
                       "record each, a table).")
    @click.option("--executor", type=click.Choice(["serial", "local", "dask"]),
                  default="local", show_default=True, envvar="NETDIAG_EXECUTOR",
                  show_envvar=True,
                  help="Where the capture sets are analyzed: one after another in this "
                       "process; the same with the --jobs process pool in each set; or one "
                       "task per set and flow shard on a Dask cluster. The report is the "
                       "same.")
    @click.option("--scheduler", metavar="ADDRESS", envvar="NETDIAG_DASK_SCHEDULER",
                  show_envvar=True,
                  help="--executor dask: the scheduler (tcp://HOST:PORT, or the file "
                       "'dask scheduler --scheduler-file' writes). Default: a local cluster.")
    @click.option("--workers", type=click.IntRange(min=1),
                  help="--executor dask without --scheduler: worker processes of the local "
                       "cluster (default: one per CPU).")
    @click.option("--max-records", type=click.IntRange(min=0),
                  help="Records (connections and DNS transactions) the report may hold; "
                       "beyond, the summary's percentiles come from mergeable sketches "
                       "(1% relative error, said in summary.sketch) and the document lists "
                       "no records (JSON Lines still streams them). Default: no bound, exact.")
    @click.option("--max-memory", callback=_memory_size, default="auto", metavar="SIZE",
                  show_default=True,
                  help="Memory the listed records may take (estimated from what they hold: "
                       "4G, 512M); beyond, the summary is sketched as with --max-records. "
                       "auto: half the memory available at the start; none: no bound. "
                       "JSON Lines streams its records and is never bounded (with --jobs "
                       "above 1 its processes spill them to TMPDIR). With --jobs above 1 "
                       "the processes of the other formats hold every record until they "
                       "merge: past this, the capture is analyzed again in one process.")
    @click.option("--set-gap", "set_gap_ns", callback=gap, metavar="DURATION",
                  help="A file of a source starting within this of the previous file's last "
                       "packet continues its capture set (default: 5m, the idle timeout).")
    @click.option("--one-set", is_flag=True,
                  help="Analyze all the captures as one capture set, merged by time whatever "
                       "their sources (captures of the same traffic at several points).")
    @functools.wraps(f)
    def wrapper(*args: Any, by: str | None, executor: str, scheduler: str | None,
                workers: int | None, max_records: int | None, max_memory: int | None,
                set_gap_ns: int, one_set: bool, **kwargs: Any) -> Any:
        kwargs["fleet"] = {"by": by, "executor": executor, "scheduler": scheduler,
                           "workers": workers, "max_records": max_records,
                           "max_memory": max_memory,
                           "gap_ns": set_gap_ns, "one_set": one_set}
        return f(*args, **kwargs)

    return wrapper
