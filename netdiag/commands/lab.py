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


def _ramp_option(ctx: click.Context, param: click.Parameter, value: str | None
                 ) -> tuple[float, float, float] | None:
    from netdiag.lab.ramp import parse_ramp

    if value is None:
        return None
    try:
        return parse_ramp(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


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
              show_default=True, help="Hard limit for the whole run, in seconds (with "
                                      "--ramp, at least its duration + 60).")
@click.option("--upstream-pool/--no-upstream-pool", default=False, show_default=True,
              help="The router keeps pooled keep-alive connections to each origin, shared "
                   "by concurrent requests (HTTP/2: one multiplexed connection per origin; "
                   "HTTP/1.1: one request at a time per connection, a new one only when all "
                   "are busy). Off: a new connection per request.")
@click.option("--origin-pairing-ms", type=click.FloatRange(0, 60_000), default=None,
              help="Each ROC origin holds an HTTP/2 answer until another request is open on "
                   "the same connection, or this many ms at most, so pooled connections "
                   "certainly carry concurrent requests (off by default).")
@click.option("--upstream-max-connections", type=click.IntRange(1, 1000), default=64,
              show_default=True,
              help="Cap of each HTTP/1.1 upstream pool (edge->router, router->origin); "
                   "requests wait for a free connection beyond it.")
@click.option("--upstream-source", type=click.Choice(["own", "loopback"]), default="own",
              show_default=True,
              help="Where the edge and the router connect upstream from (Redis included): "
                   "their own addresses (127.0.0.10, 127.0.0.11), or 127.0.0.1, as nginx or "
                   "Envoy connect from the host's address.")
@click.option("--router-protocol", type=click.Choice(["h2c", "http1"]), default="h2c",
              show_default=True,
              help="Edge->router: one pooled cleartext HTTP/2 connection (h2c), or a pool "
                   "of cleartext HTTP/1.1 keep-alive connections (one request at a time "
                   "each, so concurrency opens several).")
@click.option("--origin-protocol", type=click.Choice(["h2", "http1"]), default="h2",
              show_default=True,
              help="Router->ROC origins over TLS: HTTP/2, or HTTP/1.1 (ALPN http/1.1, "
                   "keep-alive, server-sent events in chunked encoding).")
@click.option("--request-ids/--no-request-ids", default=True, show_default=True,
              help="Clients send x-request-id and every hop forwards it. Off: no "
                   "correlation header anywhere (x-request-id, x-correlation-id, "
                   "request-id, traceparent), and the router's EVALSHA gets '-' for the id.")
@click.option("--server-timing/--no-server-timing", default=False, show_default=True,
              help="The edge adds 'server-timing: edge;dur=<own ms>, upstream;dur=<router "
                   "ms>' and 'x-envoy-upstream-service-time: <ms>' to its answers.")
@click.option("--netns/--no-netns", default=None, envvar="NETDIAG_LAB_NETNS",
              help="Run the whole lab (servers, redis-server, DNS, clients, sniffer) in a "
                   "fresh network namespace, so it never collides with anything on "
                   "127.0.0.x and several labs can run at once. Default: when one can be "
                   "created (root), else in the current namespace, with a note "
                   "[env NETDIAG_LAB_NETNS].")
@click.option("--ramp", "ramp", metavar="FROM:TO:DURATION", callback=_ramp_option,
              help="Open-loop load instead of --requests/--concurrency: per path, Poisson "
                   "arrivals whose rate ramps linearly from FROM to TO requests/s over "
                   "DURATION (30s, 500ms, 2m or seconds), each request sent at its "
                   "scheduled time whatever the servers do (e.g. 50:1500:30s).")
@click.option("--router-budget", "router_budget", type=click.FloatRange(0, min_open=True),
              default=None, metavar="R",
              help="The ROC router admits R requests/s through a queue in Redis: each "
                   "request waits for its slot (1/R s apart), refused with 429 beyond "
                   "--router-queue waiting. Default: no queue (the per-model token "
                   "budget only).")
@click.option("--router-queue", "router_queue", type=click.IntRange(0, 1_000_000),
              default=50, show_default=True, metavar="N",
              help="Requests that may wait in the router's queue (--router-budget); one "
                   "more is refused with 429.")
@click.option("--http3/--no-http3", default=False, show_default=True,
              help="The edge also serves HTTP/3 (QUIC) on UDP 127.0.0.10:443, with the "
                   "lab's certificate and key log, and advertises it (alt-svc: "
                   "h3=\":443\") on its HTTP/2 answers.")
@click.option("--client-protocol", type=click.Choice(["h2", "h3"]), default="h2",
              show_default=True,
              help="What the ROC clients speak to the edge: HTTP/2 over TLS, or HTTP/3 "
                   "over QUIC (implies --http3). DPF clients speak HTTP/2 either way.")
@click.option("--report/--no-report", default=True, show_default=True,
              help="Print the report on the capture at the end (with the profile the lab "
                   "wrote).")
def lab(out: Path, keylog: Path | None, requests: int, concurrency: int, origins: int,
        dns_delay_ms: float, router_delay_ms: float, think_ms: float,
        roc_think_ms: float | None, dpf_think_ms: float | None, token_gap_ms: float,
        sse_events: int, sse_share: float, roc_keepalive: bool, dpf_pool: bool,
        max_connections: int, dpf_tls: str, dpf_dns: str, nx_lookup: bool, resume: bool,
        seed: int, timeout_s: float, upstream_pool: bool, origin_pairing_ms: float | None,
        upstream_max_connections: int,
        upstream_source: str, router_protocol: str, origin_protocol: str,
        request_ids: bool, server_timing: bool, netns: bool | None,
        ramp: tuple[float, float, float] | None, router_budget: float | None,
        router_queue: int, http3: bool, client_protocol: str, report: bool) -> None:
    """Run the ROC/DPF lab on loopback, capture it, and report on the capture.

    Real servers on 127.0.0.0/8: DNS (127.0.0.53), the ROC edge (127.0.0.10:443),
    router (127.0.0.11:8080, h2c or HTTP/1.1), Redis token store (127.0.0.12:6379,
    Debian redis-server) and origins (127.0.0.21..), the DPF origins (127.0.0.31..).
    ROC clients connect from 127.0.0.2, DPF clients from 127.0.0.3. The ledger
    <stem>.expected.json records each client request's true chain of upstream requests
    (docs/lab.md). Needs root on Linux (ports 53 and 443, a raw socket on lo, a network
    namespace) and redis-server. With --ramp the load is open loop (a Poisson process
    whose rate ramps), and --router-budget gives the router a queue in Redis, so
    the latency knee is real.
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
    if client_protocol == "h3" and (ramp is not None or resume):
        raise click.UsageError("--client-protocol h3 does not combine with --ramp or "
                               "--resume (yet)")
    if (http3 or client_protocol == "h3") and importlib.util.find_spec("aioquic") is None:
        raise LabError("--http3 needs aioquic: pip install aioquic")
    params = LabParams(
        requests=requests, concurrency=concurrency, origins=origins,
        dns_delay_ms=dns_delay_ms, router_delay_ms=router_delay_ms, think_ms=think_ms,
        roc_think_ms=roc_think_ms, dpf_think_ms=dpf_think_ms, token_gap_ms=token_gap_ms,
        sse_events=sse_events, sse_share=sse_share, roc_keepalive=roc_keepalive,
        dpf_pool=dpf_pool, max_connections=max_connections, dpf_tls=dpf_tls,
        dpf_dns_transport=dpf_dns, nx_lookup=nx_lookup, roc_resume=resume, seed=seed,
        timeout_s=timeout_s, upstream_pool=upstream_pool, origin_pairing_ms=origin_pairing_ms,
        upstream_max_connections=upstream_max_connections, upstream_source=upstream_source,
        router_protocol=router_protocol, origin_protocol=origin_protocol,
        request_ids=request_ids, server_timing=server_timing, netns=netns, ramp=ramp,
        router_budget_per_s=router_budget, router_queue_limit=router_queue,
        http3=http3, client_protocol=client_protocol)
    err = stderr_console()
    if ramp is not None:
        budget = (f", router budget {router_budget:g}/s, queue {router_queue}"
                  if router_budget is not None else "")
        err.print(f"netdiag lab: ramping {ramp[0]:g} -> {ramp[1]:g} requests/s per path "
                  f"over {ramp[2]:g} s (open loop{budget}) ...", highlight=False)
    else:
        err.print(f"netdiag lab: running {requests} requests per path "
                  f"(concurrency {concurrency}) ...", highlight=False)
    with _watchdog(params.run_timeout_s + 60):
        result = run_lab(out, params, keylog=keylog)
    note = (result.get("netns") or {}).get("note")
    if note:
        err.print(f"[yellow]note:[/] the lab ran {note}", highlight=False)
    _summary(out, result)
    if report:
        from netdiag.lab.lab import sibling

        _report(out, sibling(out, ".paths.toml"))


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
    found = recover(out, result["delays_ms"], result.get("chains"))
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
    p = result["params"]
    to_router = "HTTP/1.1" if p.get("router_protocol") == "http1" else "h2c"
    to_origin = "HTTP/1.1" if p.get("origin_protocol") == "http1" else "HTTP/2"
    kind = "pooled" if p.get("upstream_pool") else "new"
    source = " from 127.0.0.1" if p.get("upstream_source") == "loopback" else ""
    console.print(
        f"ROC behind the edge{source}: {hops['edge_router']['connections']} pooled "
        f"{to_router} connection(s) edge->router carrying {hops['edge_router']['requests']} "
        f"requests; {router['upstream_connections']} {kind} TLS + {to_origin} connection(s) "
        f"router->origin carrying {hops['router_origin']['requests']} requests "
        f"({hops['router_origin']['connections']} connections in the capture); "
        f"{router['redis_commands']} EVALSHA to Redis ({hops['token_store']['evalsha']} in "
        f"the capture, median {_ms(hops['token_store']['latency_ms'])})", highlight=False)
    d = Table(title="Delays: injected / found in the capture (medians)", title_justify="left")
    for col in ("hop", "injected", "found", "samples"):
        d.add_column(col, justify="left" if col == "hop" else "right")
    queued = p.get("router_budget_per_s") is not None
    names = {"dns": "DNS answer",
             "router": "ROC router (own time + queue)" if queued else "ROC router (own time)",
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
    if result.get("ramp"):
        _ramp_summary(console, result["ramp"])
    errors = result.get("errors") or []
    if errors:
        stderr_console().print(f"[yellow]warning:[/] {len(errors)} request(s) failed: "
                               f"{errors[0]}", highlight=False)


def _ramp_summary(console: Any, ramp: dict[str, Any]) -> None:
    """The ramp: offered and sent per path, send lag, and the knee window by window."""
    import math

    from rich.table import Table

    from netdiag.lab.ramp import LATE_MS

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    budget = ramp.get("router_budget_per_s")
    queue = (f"; router budget {budget:g}/s, queue limit {ramp['router_queue_limit']}"
             if budget is not None else "")
    t = Table(title=f"Ramp {ramp['from_rps']:g} -> {ramp['to_rps']:g} requests/s per path "
                    f"over {ramp['duration_s']:g} s (open loop){queue}",
              title_justify="left")
    for col in ("path", "offered", "sent", "statuses", "lag p50", "p99", "max (ms)",
                f"late >{LATE_MS:g}ms"):
        t.add_column(col, justify="left" if col in ("path", "statuses") else "right")
    for name in ("ROC", "DPF"):
        r = ramp[name]
        lag = r["send_lag_ms"]
        t.add_row(name, str(r["offered"]), str(r["sent"]),
                  " ".join(f"{k}×{v}" for k, v in r["statuses"].items()),
                  num(lag["p50"]), num(lag["p99"]), num(lag["max"]), str(r["late"]))
    console.print(t)
    windows = list(zip(ramp["ROC"]["windows"], ramp["DPF"]["windows"], strict=True))
    step = max(1, math.ceil(len(windows) / 30))
    every = f", every {step}th" if step > 1 else ""
    w = Table(title=f"Ramp windows of {ramp['window_s']:g} s by scheduled time{every} "
                    "(TTFB: the client's, p50; ms)", title_justify="left")
    for col in ("t s", "offered/s", "ROC ok", "429", "fail", "TTFB", "queue",
                "DPF ok", "fail", "TTFB", "lag p99"):
        w.add_column(col, justify="right")
    for roc, dpf in windows[::step]:
        lags = [x for x in (roc["send_lag_ms_p99"], dpf["send_lag_ms_p99"]) if x is not None]
        w.add_row(f"{roc['t_s']:g}", f"{roc['offered_rps']:.0f}", str(roc["ok"]),
                  str(roc["denied"]), str(roc["failed"]), num(roc["ttfb_ms_p50"]),
                  num(roc.get("queue_ms_p50")), str(dpf["ok"]), str(dpf["failed"]),
                  num(dpf["ttfb_ms_p50"]), num(max(lags) if lags else None))
    console.print(w)


def _report(out: Path, profile_path: Path) -> None:
    """``netdiag report OUT --profile PROFILE``: the capture, on the paths the lab wrote."""
    from rich.console import Console

    from netdiag.paths.apply import apply_paths
    from netdiag.paths.profile import load_profile
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.report.terminal import render

    profile = load_profile(str(profile_path))
    options = Options()
    sink = CollectingSink()
    result = analyze([str(out)], sink, options)
    doc = sink.document(result)
    analysis = apply_paths(doc, sink.connections, sink.dns_records, profile,
                           options.thresholds)
    render(result, Console(), paths=analysis, connections=sink.connections)
