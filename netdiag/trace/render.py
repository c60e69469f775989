"""The text form of a trace: one mtr-style report line per hop."""

from __future__ import annotations

from netdiag.trace.traceroute import TraceResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render_text(result: TraceResult) -> str:
    """mtr's ``--report`` table, with the reply kinds and the profile's path/hop."""
    port = "" if result.port is None else f" port {result.port}"
    target = result.host if result.host == result.address else \
        f"{result.host} ({result.address})"
    lines = [f"trace to {target}, {result.proto}{port}, {result.count} probe"
             f"{'s' if result.count != 1 else ''} per hop, max {result.max_hops} hops"]
    width = max([len(h.address or "???") for h in result.hops] + [7])
    with_path = any(h.path for h in result.hops)
    head = (f"{'HOP':>3}  {'ADDRESS':<{width}}  {'LOSS%':>6} {'SENT':>4} {'RECV':>4}  "
            f"{'MIN':>8} {'P50':>8} {'P90':>8} {'MAX':>8}  REPLY")
    lines.append(head + ("  PATH/HOP" if with_path else ""))
    for h in result.hops:
        rtt = h.rtt_ms
        replies = ",".join(f"{k}" + (f"x{n}" if n != h.received else "")
                           for k, n in h.replies.items()) or "-"
        line = (f"{h.ttl:>3}  {(h.address or '???'):<{width}}  {h.loss_pct:>6.1f} "
                f"{h.sent:>4} {h.received:>4}  {_ms(rtt['min']):>8} {_ms(rtt['p50']):>8} "
                f"{_ms(rtt['p90']):>8} {_ms(rtt['max']):>8}  {replies}")
        if with_path:
            line += f"  {h.path['name']}/{h.path['hop']}" if h.path else "  -"
        lines.append(line)
        if len(h.addresses) > 1:
            others = ", ".join(a for a in h.addresses if a != h.address)
            lines.append(f"{'':>3}  also: {others}")
    if result.reached:
        lines.append(f"destination reached at hop {result.destination_hop} "
                     f"({result.duration_s:.1f} s)")
    else:
        ends = [h for h in result.hops if any(k.startswith("unreachable") for k in h.replies)]
        why = (f"hop {ends[0].ttl} answered unreachable" if ends
               else f"no answer from it within {result.max_hops} hops")
        lines.append(f"destination not reached: {why} ({result.duration_s:.1f} s)")
    return "\n".join(lines) + "\n"
