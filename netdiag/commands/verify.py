"""``netdiag verify CAPTURE``: netdiag's engine against tshark's, figure by figure."""

from __future__ import annotations

import json
import sys
from typing import IO

import click

EXIT_TRUNCATED = 3
EXIT_DIFFER = 5


@click.command()
@click.argument("capture", type=click.Path(dir_okay=False))
@click.option("--keylog", "keylogs", multiple=True, type=click.Path(dir_okay=False),
              help="TLS key log given to both engines (repeatable; default: "
                   "$SSLKEYLOGFILE). Keys embedded in a pcapng are used by both too.")
@click.option("--tolerance-ms", type=click.FloatRange(min=0), default=0.05,
              show_default=True, help="Durations closer than this agree.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="The differing figures as text, or every figure "
                                      "as JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write here instead of standard output.")
@click.option("--dns-port", "dns_ports", type=click.IntRange(1, 65535), multiple=True,
              help="Also parse this port as DNS, in both engines. Repeatable.")
@click.option("--tshark-option", "tshark_options", multiple=True,
              help="One more argument for tshark, e.g. --tshark-option=-d "
                   "--tshark-option=tcp.port==8443,tls. Repeatable.")
def verify(capture: str, keylogs: tuple[str, ...], tolerance_ms: float, fmt: str,
           output: str | None, dns_ports: tuple[int, ...],
           tshark_options: tuple[str, ...]) -> None:
    """Run netdiag and tshark on CAPTURE and print every figure on which they differ.

    Both engines produce the report contract's document; DNS transactions,
    connections, TLS handshakes and requests are matched and each figure compared
    (durations within --tolerance-ms, everything else equal). Each differing figure
    names the packets to look at: netdiag's packet numbers and tshark's frame numbers.
    The last line is "N figures compared, M differ".

    Needs tshark (tested with tshark 4.0).

    Exit status: 0 every figure agrees; 5 some figures differ (a finding about the
    engines, not an error: the output lists them, and the JSON says "ok": false);
    1 input error (missing file, bad key log, tshark not installed or unable to read
    the capture); 3 the capture is damaged or truncated and the figures before the
    damage agree.
    """
    from netdiag.commands.common import keylog_paths
    from netdiag.engines.verify import render_text, verify_capture

    paths = keylog_paths(keylogs, "verifying")
    result = verify_capture(capture, paths, tolerance_ms=tolerance_ms,
                            dns_ports=frozenset({53, *dns_ports}),
                            extra_args=list(tshark_options))
    out: IO[str] = open(output, "w", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
    try:
        if fmt == "json":
            json.dump(result.to_json(), out, indent=2)
            out.write("\n")
        else:
            out.write(render_text(result))
    finally:
        if output:
            out.close()
    if not result.ok:
        sys.exit(EXIT_DIFFER)
    if result.truncated:
        sys.exit(EXIT_TRUNCATED)
