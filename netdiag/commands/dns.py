"""``netdiag dns NAME``: dig's query, repeated and compared across servers."""

from __future__ import annotations

from typing import Any

import click

from netdiag.commands.common import print_result
from netdiag.errors import NetdiagError
from netdiag.report.units import ms_number


@click.command()
@click.argument("name")
@click.option("-s", "--server", "servers", multiple=True, metavar="IP[:PORT]",
              help="DNS server to ask. Repeatable. Default: the system resolver's "
                   "nameservers (/etc/resolv.conf).")
@click.option("-t", "--type", "rdtype", default="A", show_default=True,
              help="Record type (A, AAAA, CNAME, MX, TXT, HTTPS...).")
@click.option("--tcp", is_flag=True, help="Ask over TCP (a connection per query), not UDP.")
@click.option("-n", "--count", type=click.IntRange(min=1), default=1, show_default=True,
              help="Queries per server.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="Seconds to wait for each answer.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="A table, or one JSON document.")
def dns(name: str, servers: tuple[str, ...], rdtype: str, tcp: bool, count: int,
        timeout: float, fmt: str) -> None:
    """Ask every server for NAME, COUNT times each (round-robin), and compare them:
    latency percentiles, timeouts, response codes and answers per server.

    Latency is query sent -> answer received, as dig's "Query time" and netdiag
    report's dns[].latency_ms measure it; over TCP the connection setup is timed
    apart. Exit status: 0 when at least one server answered (any rcode, NXDOMAIN
    included), 1 when none did or on bad input (one line on stderr), 2 on a usage
    error.

    \b
      netdiag dns api.example.com --server 1.1.1.1 --server 8.8.8.8 --count 20
      netdiag dns example.com -t AAAA --tcp -s 127.0.0.53:53 --format json
    """
    from netdiag.probe.dns import run_dns_probe, system_nameservers

    chosen = list(servers) or system_nameservers()
    result = run_dns_probe(name, servers=chosen, count=count, rdtype=rdtype, tcp=tcp,
                           timeout=timeout)
    print_result(fmt, result, render)
    if result.answered == 0:
        total = sum(len(s.queries) for s in result.servers)
        timeouts = sum(s.timeouts for s in result.servers)
        raise NetdiagError(f"no server answered: {total} quer{'y' if total == 1 else 'ies'}, "
                           f"{timeouts} timed out")


_ms = ms_number


def render(result: Any, console: Any) -> None:
    """One row per server: counts, rcodes, latency percentiles, answers."""
    from rich import box
    from rich.table import Table

    console.print(f"[bold]{result.name} {result.rdtype}[/] over {result.transport}, "
                  f"{result.count} quer{'y' if result.count == 1 else 'ies'} per server, "
                  f"timeout {result.timeout:g} s", highlight=False)
    table = Table(box=box.SIMPLE_HEAVY, title="per server (latency in ms)",
                  title_justify="left")
    for col in ("server", "queries", "ok", "timeouts", "errors", "rcodes", "p50", "p90",
                "p99", "max", "answers"):
        table.add_column(col, justify="left" if col in ("server", "rcodes", "answers")
                         else "right")
    for s in result.servers:
        lat = s.latency_ms()
        rcodes = ", ".join(f"{k} {v}" for k, v in sorted(s.rcodes.items())) or "-"
        answers = [a for a, _ in s.answers.most_common()]
        shown = ", ".join(answers[:4]) + (f" (+{len(answers) - 4})" if len(answers) > 4 else "")
        table.add_row(s.server, str(len(s.queries)), str(s.answered),
                      f"[red]{s.timeouts}[/]" if s.timeouts else "0", str(s.errors), rcodes,
                      *(_ms(lat[k]) for k in ("p50", "p90", "p99", "max")), shown or "-")
    console.print(table)
    for s in result.servers:
        kinds: dict[str, int] = {}
        for q in s.queries:
            if q.error is not None and not q.timed_out:
                kinds[q.error] = kinds.get(q.error, 0) + 1
        for kind, n in kinds.items():
            console.print(f"[red]{s.server}:[/] {n} x {kind}", highlight=False)
