"""``netdiag diff A B``: two captures (or JSON reports) side by side, with deltas and
whether each change is bigger than the noise."""

from __future__ import annotations

import sys
from typing import IO

import click

EXIT_TRUNCATED = 3


@click.command()
@click.argument("before", type=click.Path(dir_okay=False))
@click.argument("after", type=click.Path(dir_okay=False))
@click.option("--keylog", "keylogs", multiple=True, type=click.Path(dir_okay=False),
              help="TLS key log for both captures (repeatable; default: $SSLKEYLOGFILE).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True, help="Terminal tables, a JSON object, or one HTML page.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write here instead of standard output.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.05, show_default=True,
              help="Significance level of the Mann-Whitney and proportion tests.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the bootstrap intervals (results are deterministic).")
@click.option("--label-a", help="Name shown for BEFORE (default: its file name).")
@click.option("--label-b", help="Name shown for AFTER (default: its file name).")
@click.option("--dns-port", "dns_ports", type=click.IntRange(1, 65535), multiple=True,
              help="Also parse this port as DNS (53 always is). Repeatable.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Path profile (TOML, docs/profiles.md) for the captures, as for "
                   "`netdiag report`; default: X.paths.toml beside a capture X.pcapng, "
                   "else paths are inferred.")
@click.option("--no-profile", is_flag=True,
              help="Ignore profiles beside the captures: infer the paths.")
def diff(before: str, after: str, keylogs: tuple[str, ...], fmt: str, output: str | None,
         alpha: float, seed: int, label_a: str | None, label_b: str | None,
         dns_ports: tuple[int, ...], profile_path: str | None, no_profile: bool) -> None:
    """Compare BEFORE with AFTER: DNS, TCP, TLS, TTFB/TTLB percentiles, connection reuse,
    per-path figures and findings, with B - A deltas.

    Each of BEFORE and AFTER is a pcap/pcapng capture (analysed now, with --keylog) or a
    JSON report saved by `netdiag report --format json` (no re-analysis; paths as it
    attributed them). For every
    latency the per-item values of both sides go through a two-sided Mann-Whitney U test
    and a seeded bootstrap interval of the median difference: the verdict says
    "significant (p=0.003)" or "within noise". Reuse is compared with a two-proportion
    z-test.

    Exit status: 0 done; 1 input error; 3 a capture is damaged or truncated (compared
    up to the damage).
    """
    from netdiag.commands.common import load_keylogs, resolve_profile
    from netdiag.diff.compare import compare
    from netdiag.diff.load import load_side
    from netdiag.diff.render import render_html, render_json, render_text

    keylog = load_keylogs(keylogs)
    ports = frozenset({53, *dns_ports})
    docs = []
    for side in (before, after):
        # a capture's own X.paths.toml, as netdiag report takes it (unless --profile)
        profile = None if side.endswith(".json") else resolve_profile(
            profile_path, no_profile, [side])
        docs.append(load_side(side, keylog, ports, profile))
    doc_a, doc_b = docs
    result = compare(doc_a, doc_b, alpha=alpha, seed=seed, label_a=label_a, label_b=label_b)
    out: IO[str] = open(output, "w", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
    try:
        if fmt == "json":
            render_json(result, out)
        elif fmt == "html":
            out.write(render_html(result))
        else:
            from rich.console import Console

            render_text(result, Console(file=out) if output else Console())
    finally:
        if output:
            out.close()
    if result["a"].get("truncated") or result["b"].get("truncated"):
        sys.exit(EXIT_TRUNCATED)
