"""``netdiag lab``: run the ROC/DPF topology on loopback, drive load, capture it, report."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from netdiag.console import stderr_console

LAB_MODULES = ("redis", "xxhash", "httpx", "h2", "hypercorn")
"""Python packages of the ``lab`` extra that the lab imports while it runs."""

@click.command()
@click.option("-w", "--write", "out", required=True,
              type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="The capture to write (pcapng, TLS keys embedded); the path profile "
                   "<stem>.paths.toml and the ledger <stem>.expected.json go beside it.")
@click.option("--keylog", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also write the TLS key log (NSS format) here.")
@click.option("--requests", type=click.IntRange(0, 10_000), default=16, show_default=True,
              help="Requests per path (ROC and DPF each).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Requests in flight at once, per path.")
@click.option("--origins", type=click.IntRange(1, 9), default=3, show_default=True,
              help="Origin servers per path.")
@click.option("--dns-delay-ms", type=click.FloatRange(0), default=2.0, show_default=True,
              help="DNS answer delay.")
@click.option("--router-delay-ms", type=click.FloatRange(0), default=10.0, show_default=True,
              help="The ROC router's own time per request.")
@click.option("--think-ms", type=click.FloatRange(0), default=20.0, show_default=True,
              help="Origin think time before the first byte (both paths).")
@click.option("--roc-think-ms", type=click.FloatRange(0), default=None,
              help="Think time of the ROC origins (default: --think-ms).")
@click.option("--dpf-think-ms", type=click.FloatRange(0), default=None,
              help="Think time of the DPF origins (default: --think-ms).")
@click.option("--token-gap-ms", type=click.FloatRange(0), default=5.0, show_default=True,
              help="Gap between two SSE token events.")
@click.option("--sse-events", type=click.IntRange(0, 10_000), default=8, show_default=True,
              help="Events in a streamed answer.")
@click.option("--sse-share", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Share of requests asking for a streamed (SSE) answer.")
@click.option("--roc-keepalive/--no-roc-keepalive", default=True, show_default=True,
              help="ROC clients keep their connection to the edge.")
@click.option("--dpf-pool/--no-dpf-pool", default=True, show_default=True,
              help="DPF clients pool their connections to the origins.")
@click.option("--max-connections", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Client connection pool limit.")
@click.option("--dpf-tls", type=click.Choice(["1.3", "1.2"]), default="1.3", show_default=True,
              help="TLS version of the DPF origins.")
@click.option("--dpf-dns", "dpf_dns", type=click.Choice(["udp", "tcp"]), default="udp",
              show_default=True, help="How DPF clients resolve origin names.")
@click.option("--nx-lookup/--no-nx-lookup", default=False, show_default=True,
              help="The ROC client first looks up a name that does not exist.")
@click.option("--resume/--no-resume", default=False, show_default=True,
              help="After the load, one more ROC connection resuming a TLS 1.3 session.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the request mix.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(5, 3600), default=60.0,
              show_default=True, help="Hard limit for the whole run, in seconds.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Print the report on the capture at the end.")
def lab(out: Path, keylog: Path | None, requests: int, concurrency: int, origins: int,
        dns_delay_ms: float, router_delay_ms: float, think_ms: float,
        roc_think_ms: float | None, dpf_think_ms: float | None, token_gap_ms: float,
        sse_events: int, sse_share: float, roc_keepalive: bool, dpf_pool: bool,
        max_connections: int, dpf_tls: str, dpf_dns: str, nx_lookup: bool, resume: bool,
        seed: int, timeout_s: float, report: bool) -> None:
    """Run the ROC/DPF lab on loopback, capture it, and report on the capture.

    Real servers on 127.0.0.0/8: DNS (127.0.0.53), the ROC edge (127.0.0.10:443),
    router (127.0.0.11:8080, h2c), Redis token store (127.0.0.12:6379, Debian
    redis-server) and origins (127.0.0.21..), the DPF origins (127.0.0.31..). ROC
    clients connect from 127.0.0.2, DPF clients from 127.0.0.3. Needs root on Linux
    (ports 53 and 443, a raw socket on lo) and redis-server.
    """
    from netdiag.lab import LabError, LabParams, run_lab
    from netdiag.lab.redis_store import find_redis_server

    if not sys.platform.startswith("linux"):
        raise LabError("netdiag lab runs on Linux only (loopback addresses 127.0.0.0/8)")
    if os.geteuid() != 0:
        raise LabError("netdiag lab needs root: it binds ports 53 and 443 and captures on "
                       "lo (run it with sudo)")
    if find_redis_server() is None:
        raise LabError("redis-server not found: install redis-server "
                       "(apt-get install redis-server)")
    missing = [m for m in LAB_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise LabError(f"netdiag lab needs {', '.join(missing)}: pip install 'netdiag[lab]'")
    params = LabParams(
        requests=requests, concurrency=concurrency, origins=origins,
        dns_delay_ms=dns_delay_ms, router_delay_ms=router_delay_ms, think_ms=think_ms,
        roc_think_ms=roc_think_ms, dpf_think_ms=dpf_think_ms, token_gap_ms=token_gap_ms,
        sse_events=sse_events, sse_share=sse_share, roc_keepalive=roc_keepalive,
        dpf_pool=dpf_pool, max_connections=max_connections, dpf_tls=dpf_tls,
        dpf_dns_transport=dpf_dns, nx_lookup=nx_lookup, roc_resume=resume, seed=seed,
        timeout_s=timeout_s)
    err = stderr_console()
    err.print(f"netdiag lab: running {requests} requests per path "
              f"(concurrency {concurrency}) ...", highlight=False)
    with _watchdog(timeout_s + 20):
        result = run_lab(out, params, keylog=keylog)
    _summary(out, result)
    if report:
        _report(out)


@contextlib.contextmanager
def _watchdog(seconds: float) -> Any:
    """Last resort: raise in the main thread if the run (cleanup included) hangs."""
    from netdiag.lab import LabError

    def _expired(signum: int, frame: Any) -> None:
        raise LabError(f"netdiag lab did not finish within {seconds:.0f} s; stopped")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(max(1, int(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def _summary(out: Path, result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from netdiag.lab.lab import sibling
    from netdiag.lab.recover import recover

    console = Console()
    files = [str(out), str(sibling(out, ".paths.toml")), str(sibling(out, ".expected.json"))]
    if result.get("keylog"):
        files.append(str(out.with_name(result["keylog"])))
    size = out.stat().st_size
    console.print(f"[bold]netdiag lab[/] wrote {', '.join(files)}\n"
                  f"{result['packets']:,} packets, {size:,} bytes, TLS keys embedded; "
                  f"{result['duration_s']:.1f} s", highlight=False)
    found = recover(out, result["delays_ms"])
    t = Table(title="Paths (the driver's ledger / the capture)", title_justify="left")
    for col in ("path", "requests", "statuses", "connections", "reuse", "TTFB p50"):
        t.add_column(col, justify="left" if col in ("path", "statuses") else "right")
    for name in ("ROC", "DPF"):
        led, cap = result["paths"][name], found["paths"][name]
        reuse = cap["reuse_rate"]
        t.add_row(name, f"{led['requests']} / {cap['requests']}",
                  ", ".join(f"{k}×{v}" for k, v in led["statuses"].items()),
                  f"{led['connections']} / {cap['connections']}",
                  "-" if reuse is None else f"{reuse:.0%}", _ms(cap["ttfb_ms"]))
    console.print(t)
    hops = found["hops"]
    router = result["router"]
    console.print(
        f"ROC behind the edge: {hops['edge_router']['connections']} pooled h2c connection(s) "
        f"edge->router carrying {hops['edge_router']['requests']} requests; "
        f"{router['upstream_connections']} new TLS connections router->origin "
        f"({hops['router_origin']['connections']} in the capture); "
        f"{router['redis_commands']} EVALSHA to Redis ({hops['token_store']['evalsha']} in "
        f"the capture, median {_ms(hops['token_store']['latency_ms'])})", highlight=False)
    d = Table(title="Delays: injected / found in the capture (medians)", title_justify="left")
    for col in ("hop", "injected", "found", "samples"):
        d.add_column(col, justify="left" if col == "hop" else "right")
    names = {"dns": "DNS answer", "router": "ROC router (own time)",
             "roc_think": "ROC origin think", "dpf_think": "DPF origin think",
             "token_gap": "SSE token gap"}
    for key, label in names.items():
        v = found["delays_ms"][key]
        d.add_row(label, _ms(v["injected"]), _ms(v["found"]), str(v["samples"]))
    console.print(d)
    if result.get("capture_drops"):
        stderr_console().print(f"[yellow]warning:[/] the kernel dropped "
                               f"{result['capture_drops']} packet(s) before the capture "
                               "could read them", highlight=False)
    errors = result.get("errors") or []
    if errors:
        stderr_console().print(f"[yellow]warning:[/] {len(errors)} request(s) failed: "
                               f"{errors[0]}", highlight=False)


def _report(out: Path) -> None:
    from rich.console import Console

    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.report.terminal import render

    sink = CollectingSink()
    result = analyze([str(out)], sink, Options())
    render(result, Console())
