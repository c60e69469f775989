"""``netdiag probe URL``: time every phase of HTTPS requests, like curl -w / httpstat."""

from __future__ import annotations

from typing import Any

import click

from netdiag.commands.common import print_result
from netdiag.errors import NetdiagError
from netdiag.report.units import ms_number

PHASE_COLUMNS = ("dns", "connect", "tls", "send", "ttfb", "transfer", "total")
H3_PHASE_COLUMNS = ("dns", "handshake", "send", "ttfb", "transfer", "total")


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
        raise click.BadParameter(f"expected 'Name: value', got {text!r}",
                                 param_hint="'-H' / '--header'")
    return name.strip(), value.strip()


@click.command()
@click.argument("url")
@click.option("-n", "--count", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests to send.")
@click.option("--reuse/--fresh", default=True, show_default=True,
              help="One connection for every request (only the first resolves, connects "
                   "and handshakes), or a new lookup, connection and handshake each time.")
@click.option("--http1.1", "http1", is_flag=True,
              help="Offer only HTTP/1.1 (ALPN http/1.1); default: HTTP/2 when the server "
                   "selects h2.")
@click.option("--http3", "http3", is_flag=True,
              help="HTTP/3 over QUIC (UDP, ALPN h3) instead of TCP + TLS; the handshake "
                   "phase replaces connect and tls.")
@click.option("-X", "--method", default="GET", show_default=True, help="Request method.")
@click.option("-H", "--header", "headers", multiple=True, metavar="'NAME: VALUE'",
              help="Extra request header. Repeatable.")
@click.option("--keylog", type=click.Path(dir_okay=False), envvar="SSLKEYLOGFILE",
              help="Append the TLS secrets to this file (NSS key log, for Wireshark or "
                   "netdiag report --keylog). Default: $SSLKEYLOGFILE, as curl does.")
@click.option("--dns-server", metavar="IP[:PORT]",
              help="Resolve with this DNS server (default: /etc/hosts, then the system "
                   "resolver's nameservers).")
@click.option("--connect-to", metavar="HOST:PORT",
              help="Connect here instead of the URL's host and port; SNI, certificate "
                   "check and :authority stay the URL's (like curl --connect-to).")
@click.option("--cacert", type=click.Path(dir_okay=False),
              help="Trust the CA certificates in this PEM file instead of the system's.")
@click.option("-k", "--insecure", is_flag=True, help="Do not verify the server certificate.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds allowed per request, all phases together.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Tables, or one JSON document.")
def probe(url: str, count: int, reuse: bool, http1: bool, http3: bool, method: str,
          headers: tuple[str, ...], keylog: str | None, dns_server: str | None,
          connect_to: str | None, cacert: str | None, insecure: bool, timeout: float,
          fmt: str) -> None:
    """Send COUNT requests to URL and time each phase: dns, connect, tls, send, ttfb,
    transfer, total (milliseconds; curl's and httpstat's phases, over HTTP/2).

    \b
    dns       name lookup (dnspython); skipped for IP literals and reused connections
    connect   TCP connect() call
    tls       TLS handshake (do_handshake)
    send      connection ready -> request written (curl's pretransfer + the write)
    ttfb      request handed to the socket -> first byte of the response HEADERS
              frame (HTTP/2) or of the response (HTTP/1.1), as recv() returns it;
              the span netdiag report measures as requests[].ttfb_ms
    transfer  first byte -> last byte (END_STREAM / end of the HTTP/1.1 body)
    total     start -> last byte
    handshake (--http3, instead of connect and tls) first Initial sent -> our
              Finished sent: the QUIC handshake

    Failures (refused, timeout, TLS, NXDOMAIN...) are reported per request, with the
    phase that failed. Exit status: 0 when at least one request got a complete
    response (whatever its HTTP status), 1 when none did or on bad input (one line on
    stderr), 2 on a usage error.

    \b
      netdiag probe https://api.example.com --count 10 --reuse
      netdiag probe https://api.example.com/v1/messages -n 20 --fresh --format json
      netdiag probe https://api.example.com --http3 -n 10
    """
    parsed = [_header(h) for h in headers]
    if http3 and http1:
        raise click.UsageError("--http3 and --http1.1 exclude each other")
    if http3:
        from netdiag.probe.http3 import run_http3_probe

        result: Any = run_http3_probe(url, count=count, reuse=reuse, method=method,
                                      keylog=keylog, dns_server=dns_server,
                                      connect_to=connect_to, timeout=timeout,
                                      insecure=insecure, cafile=cacert, headers=parsed)
    else:
        from netdiag.probe.http import run_http_probe

        result = run_http_probe(url, count=count, reuse=reuse, http1=http1, method=method,
                                keylog=keylog, dns_server=dns_server, connect_to=connect_to,
                                timeout=timeout, insecure=insecure, cafile=cacert,
                                headers=parsed)
    print_result(fmt, result, render)
    if result.succeeded == 0:
        reasons = result.summary()["errors"]
        top = max(reasons, key=reasons.get) if reasons else "no response"
        noun = "request" if len(result.requests) == 1 else f"all {len(result.requests)} requests"
        raise NetdiagError(f"{noun} failed ({top})")


_ms = ms_number


def render(result: Any, console: Any) -> None:
    """The httpstat-like table per request, then percentiles per phase."""
    from rich import box
    from rich.table import Table

    reqs = result.requests
    mode = "reuse" if result.reuse else "fresh"
    h3 = getattr(result, "http3", False)
    offered = "HTTP/3 (QUIC)" if h3 else (
        "HTTP/1.1 only" if result.http1 else "HTTP/2 offered")
    columns = H3_PHASE_COLUMNS if h3 else PHASE_COLUMNS
    console.print(f"[bold]{result.method} {result.url}[/]  {len(reqs)} request(s), {mode}, "
                  f"{offered}", highlight=False)
    seen: set[int] = set()
    for r in reqs:
        if r.connection is None or r.connection in seen:
            continue
        seen.add(r.connection)
        tls = (f"{r.tls_version} {r.cipher}, ALPN {r.alpn or '-'}" if r.tls_version
               else "no TLS")
        console.print(f"  connection {r.connection}: {r.local} -> {r.remote}, {tls}, "
                      f"{r.http_version or '-'}", highlight=False)
    table = Table(box=box.SIMPLE_HEAVY, title="per request (ms)", title_justify="left")
    for col in ("#", "conn", "reused", "status", *columns, "bytes"):
        table.add_column(col, justify="left" if col == "reused" else "right")
    for r in reqs:
        ph = r.phases_ms()
        status = str(r.status) if r.status is not None else "[red]failed[/]"
        table.add_row(str(r.index), "-" if r.connection is None else str(r.connection),
                      "yes" if r.reused else "no", status,
                      *(_ms(ph[p]) for p in columns),
                      "-" if r.response_bytes is None else str(r.response_bytes))
    console.print(table)
    summary = result.summary()
    for r in reqs:
        if not r.ok:
            after = r.failed_after_ms
            console.print(f"[red]request {r.index} failed in {r.failed_phase}:[/] {r.error}"
                          + (f" (after {_ms(after)} ms)" if after is not None else ""),
                          highlight=False)
    if summary["ok"]:
        console.print(_percentile_table(summary, columns))
    statuses = ", ".join(f"{k}x{v}" for k, v in summary["statuses"].items()) or "none"
    console.print(f"{summary['ok']}/{summary['requests']} ok, {summary['failures']} failed, "
                  f"{summary['connections']} connection(s), {summary['reused']} reused; "
                  f"status {statuses}", highlight=False)


def _percentile_table(summary: dict[str, Any],
                      columns: tuple[str, ...] = PHASE_COLUMNS) -> Any:
    from rich import box
    from rich.table import Table

    pt = Table(box=box.SIMPLE_HEAVY, title="percentiles (ms)", title_justify="left")
    for col in ("phase", "count", "min", "p50", "p90", "p99", "max", "mean"):
        pt.add_column(col, justify="left" if col == "phase" else "right")
    split = columns.index("send") + 1
    for name in (*columns[:split], "wait", *columns[split:]):
        b = summary["phases"][f"{name}_ms"]
        pt.add_row(name, str(b["count"]),
                   *(_ms(b[k]) for k in ("min", "p50", "p90", "p99", "max", "mean")))
    return pt
