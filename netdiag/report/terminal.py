"""The rich terminal report: what an on-call engineer reads in ten seconds."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from netdiag.pipeline import Result

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 1:
        return f"{v:.1f} ms"
    return f"{v:.3f} ms"


def _pct_row(table: Table, name: str, block: dict[str, Any], note: str = "") -> None:
    if not block["count"]:
        table.add_row(name, "0", "-", "-", "-", "-", note)
        return
    table.add_row(name, str(block["count"]), _ms(block["p50"]), _ms(block["p90"]),
                  _ms(block["p99"]), _ms(block["max"]), note)


def _header(result: Result) -> Panel:
    cap = result.capture
    dur = None if cap.first_ns is None or cap.last_ns is None else (cap.last_ns - cap.first_ns)
    text = Text()
    text.append(", ".join(cap.files), style="bold")
    text.append(f"\n{cap.packets:,} packets, {cap.bytes:,} bytes")
    if dur is not None:
        text.append(f", {_ms(dur / 1e6)} of traffic")
    if cap.link_types:
        text.append(f", link {'/'.join(cap.link_types)}")
    if cap.truncated:
        text.append("\nTRUNCATED: ", style="bold red")
        first = next((w for w in cap.warnings if w.kind == "capture"), None)
        text.append(first.message if first else "the capture is damaged", style="red")
    other = len(cap.warnings) + cap.warnings_dropped
    if other:
        text.append(f"\n{other} warning(s); see --format json for details", style="dim")
    return Panel(text, title="netdiag report", box=box.ROUNDED, expand=False)


def _latency_table(result: Result) -> Table:
    s = result.summary.build()
    t = Table(title="Latency", box=box.SIMPLE_HEAVY, title_justify="left")
    for col in ("", "count", "p50", "p90", "p99", "max"):
        t.add_column(col, justify="right" if col else "left")
    t.add_column("", justify="left", style="dim")
    dns = s["dns"]
    _pct_row(t, "DNS answer", dns["latency_ms"],
             f"{dns['unanswered']} unanswered, {dns['retransmissions']} retried"
             if dns["transactions"] else "")
    tcp = s["tcp"]
    _pct_row(t, "TCP handshake", tcp["handshake_rtt_ms"],
             f"{tcp['connections']} conns, {tcp['retransmissions']} retrans, "
             f"{tcp['resets']} RST")
    tls = s["tls"]
    vers = ", ".join(f"{k} {v}" for k, v in sorted(tls["versions"].items()))
    _pct_row(t, "TLS handshake", tls["handshake_ms"],
             f"{vers}; {tls['resumed']} resumed" if tls["handshakes"] else "")
    http = s["http"]
    est = " (estimated)" if http["estimated"] else ""
    _pct_row(t, "Time to 1st byte" + est, http["ttfb_ms"])
    _pct_row(t, "Time to last byte" + est, http["ttlb_ms"])
    return t


def _reuse_line(result: Result) -> Text:
    http = result.summary.build()["http"]
    text = Text()
    if not http["requests"]:
        return text.append("No requests seen.", style="dim")
    rate = http["reuse_rate"]
    style = "green" if rate is not None and rate >= result.thresholds.reuse_min else "yellow"
    text.append("Connection reuse: ")
    text.append(f"{rate * 100:.0f}%", style=f"bold {style}")
    text.append(f"  ({http['requests']} requests on {http['connections']} connections"
                f"{', estimated from encrypted records' if http['estimated'] else ''})")
    protos = ", ".join(f"{k} {v}" for k, v in http["protocols"].items())
    if protos:
        text.append(f"  protocols: {protos}", style="dim")
    return text


def _slowest(result: Result, n: int = 5) -> Table | None:
    rows = result.summary.slowest_connections.payloads()[:n]
    if not rows:
        return None
    t = Table(title="Slowest connections", box=box.SIMPLE, title_justify="left")
    for col in ("id", "client -> server", "SNI", "proto", "TCP", "TLS", "worst TTFB", "reqs",
                "retr", "RST"):
        t.add_column(col, justify="right" if col in ("TCP", "TLS", "worst TTFB", "reqs", "retr",
                                                     "RST") else "left")
    for r in rows:
        ttfb = _ms(r["ttfb_ms"]) + ("~" if r["estimated"] and r["ttfb_ms"] is not None else "")
        t.add_row(r["id"], f"{r['client']} -> {r['server']}", r["sni"] or "-",
                  r["protocol"] or "-", _ms(r["rtt_ms"]), _ms(r["tls_ms"]), ttfb,
                  str(r["requests"]), str(r["retransmissions"]), str(r["resets"]))
    return t


def _findings(result: Result) -> Group:
    if not result.findings:
        return Group(Text("No findings: nothing crossed a threshold.", style="green"))
    parts: list[Any] = [Text("Findings", style="bold")]
    for f in result.findings:
        line = Text()
        line.append(f" {f.severity.upper():8} ", style=SEVERITY_STYLE.get(f.severity, ""))
        line.append(f.title, style="bold")
        line.append(f"\n          {f.detail}", style="default")
        if f.evidence:
            shown = ", ".join(f.evidence[:6]) + (" ..." if len(f.evidence) > 6 else "")
            line.append(f"\n          evidence: {shown}", style="dim")
        parts.append(line)
    return Group(*parts)


def render(result: Result, console: Console) -> None:
    """Print the whole terminal report."""
    console.print(_header(result))
    console.print(_latency_table(result))
    console.print(_reuse_line(result))
    slow = _slowest(result)
    if slow is not None:
        console.print(slow)
    console.print(_findings(result))
