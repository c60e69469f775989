"""``netdiag trace HOST``: TCP SYN / UDP / ICMP traceroute, mtr-style per-hop report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import click


@click.command()
@click.argument("host")
@click.option("--proto", type=click.Choice(["tcp", "udp", "icmp"]), default="tcp",
              show_default=True, help="TCP SYN probes, UDP datagrams or ICMP echo requests.")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=None,
              help="Destination port: default 443 for TCP, 33434 for UDP (unused for ICMP).")
@click.option("-c", "--count", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Probes per hop (rounds).")
@click.option("--max-hops", type=click.IntRange(1, 255), default=30, show_default=True,
              help="Largest TTL probed.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Seconds to wait for the replies of a round.")
@click.option("--interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds from the start of one round to the next (routers rate-limit "
                   "their ICMP errors; Linux allows a burst of 6, then 1/s).")
@click.option("--iface", default=None, help="Send on this interface (default: the route's).")
@click.option("-4", "family", flag_value=4, default=None, help="Use IPv4 only.")
@click.option("-6", "family", flag_value=6, help="Use IPv6 only.")
@click.option("--dns-server", metavar="IP[:PORT]",
              help="Resolve HOST with this DNS server (default: the system resolver).")
@click.option("--profile", type=click.Path(dir_okay=False),
              help="Path profile (TOML, docs/profiles.md): name the path and hop of each "
                   "responding address.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="mtr-style table, or one JSON document.")
def trace(host: str, proto: str, port: int | None, count: int, max_hops: int, timeout: float,
          interval: float, iface: str | None, family: int | None, dns_server: str | None,
          profile: str | None, fmt: str) -> None:
    """Trace the route to HOST: loss and RTT percentiles per hop, like mtr --report.

    Each round sends one probe per TTL; routers answer with ICMP time-exceeded, the
    destination with SYN-ACK/RST (TCP), port unreachable (UDP) or echo reply (ICMP).
    Needs root or CAP_NET_RAW. Exit status: 0 when the destination answered, 1 when
    it did not or on bad input (one line on stderr), 2 on a usage error.

    \b
      netdiag trace api.example.com --port 443 --count 5 --profile paths.toml
      netdiag trace 192.0.2.10 --proto udp --format json
    """
    from netdiag.trace.resolve import resolve
    from netdiag.trace.traceroute import attribute, check_privileges
    from netdiag.trace.traceroute import trace as run_trace

    match = None
    if profile is not None:
        match = _profile_matcher(profile)
    check_privileges()
    address = resolve(host, dns_server=dns_server, family=family)
    result = run_trace(address, proto=proto, port=port, count=count, max_hops=max_hops,
                       timeout=timeout, iface=iface, interval=interval, host=host)
    if match is not None:
        attribute(result, match)
    if fmt == "json":
        doc = result.to_json()
        doc["profile"] = profile
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from netdiag.trace.render import render_text

        sys.stdout.write(render_text(result))
    sys.stdout.flush()
    if not result.reached:
        sys.exit(1)


def _profile_matcher(path: str) -> Callable[..., tuple[str, str] | None]:
    """``match_address(ip, port=None, hops=None) -> (path, hop) | None`` of the profile."""
    from netdiag.paths.profile import load_profile

    return load_profile(path).match_address
