"""The rich terminal report: what an on-call engineer reads in ten seconds.

Every string that comes from the capture (SNI, server, protocol names, DNS rcodes,
TLS versions, warnings, finding titles, details and evidence) goes through
:mod:`netdiag.textsafe`: shown as text, never read as rich markup, with control and
bidirectional characters made visible.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from netdiag.report.units import ms_text
from netdiag.result import Result
from netdiag.textsafe import SENTENCE_LIMIT, safe_cell, safe_text

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
WARNING_LIMIT = 1024
"""Characters of a capture warning (or of the file names) shown in the header."""
FINDING_LIMIT = SENTENCE_LIMIT
"""Characters of a finding's title or detail shown (they quote capture-borne names)."""


_ms = ms_text


LINK_MEANINGS = {
    "EN10MB": "Ethernet", "LINUX_SLL": "Linux cooked", "LINUX_SLL2": "Linux cooked v2",
    "RAW": "raw IP", "IPV4": "raw IPv4", "IPV6": "raw IPv6", "NULL": "loopback",
    "LOOP": "loopback",
}
"""Plain words for the libpcap link-type names the header shows."""


def _pct_row(table: Table, name: str, block: dict[str, Any]) -> None:
    if not block["count"]:
        table.add_row(name, "0", "-", "-", "-", "-")
        return
    table.add_row(name, str(block["count"]), _ms(block["p50"]), _ms(block["p90"]),
                  _ms(block["p99"]), _ms(block["max"]))


def _header(result: Result) -> Panel:
    cap = result.capture
    dur = None if cap.first_ns is None or cap.last_ns is None else (cap.last_ns - cap.first_ns)
    text = Text()
    text.append(safe_text(", ".join(cap.files), WARNING_LIMIT), style="bold")
    text.append(f"\n{cap.packets:,} packets, {cap.bytes:,} bytes")
    if dur is not None:
        text.append(f", {_ms(dur / 1e6)} of traffic")
    if cap.link_types:
        names = [f"{n} ({LINK_MEANINGS[n]})" if n in LINK_MEANINGS else n
                 for n in cap.link_types]
        text.append(f", link {safe_text('/'.join(names))}")
    if cap.truncated:
        text.append("\nTRUNCATED: ", style="bold red")
        first = next((w for w in cap.warnings if w.kind == "capture"), None)
        text.append(safe_text(first.message, WARNING_LIMIT) if first
                    else "the capture is damaged", style="red")
    limits = [w for w in cap.warnings if w.kind == "limit"]
    for w in limits:
        text.append("\nLIMIT: ", style="bold yellow")
        text.append(safe_text(w.message.removeprefix("limit "), WARNING_LIMIT), style="yellow")
    other = len(cap.warnings) + cap.warnings_dropped - len(limits)
    if other:
        text.append(f"\n{other} warning(s); see --format json for details", style="dim")
    return Panel(text, title="netdiag report", box=box.ROUNDED, expand=False)


def _latency_table(s: dict[str, Any]) -> Table:
    t = Table(title="Latency", box=box.SIMPLE_HEAVY, title_justify="left", expand=False)
    for col in ("", "count", "p50", "p90", "p99", "max"):
        t.add_column(col, justify="right" if col else "left", no_wrap=True)
    est = " ~" if s["http"]["estimated"] else ""
    _pct_row(t, "DNS answer", s["dns"]["latency_ms"])
    _pct_row(t, "TCP handshake", s["tcp"]["handshake_rtt_ms"])
    _pct_row(t, "TLS handshake", s["tls"]["handshake_ms"])
    _pct_row(t, "First byte" + est, s["http"]["ttfb_ms"])
    _pct_row(t, "Last byte" + est, s["http"]["ttlb_ms"])
    return t


def _counts(s: dict[str, Any]) -> Text:
    dns, tcp, tls = s["dns"], s["tcp"], s["tls"]
    text = Text()
    text.append("DNS ", style="bold")
    text.append(f"{dns['transactions']} transactions, {dns['unanswered']} unanswered, "
                f"{dns['retransmissions']} retried")
    rc = {k: v for k, v in dns["rcodes"].items() if k != "NOERROR"}
    if rc:
        text.append(", " + safe_text(", ".join(f"{k} {v}" for k, v in rc.items())))
    text.append("\nTCP ", style="bold")
    text.append(f"{tcp['connections']} connections, {tcp['retransmissions']} retransmissions, "
                f"{tcp['reset_connections']} reset")
    text.append("\nTLS ", style="bold")
    vers = safe_text(", ".join(f"{k} {v}" for k, v in sorted(tls["versions"].items()))
                     ) or "none"
    text.append(f"{tls['handshakes']} handshakes ({vers}), {tls['resumed']} resumed, "
                f"{tls['hello_retry']} HelloRetryRequest, {tls['decrypted']} decrypted")
    st = s["http"]["streaming"]
    if st["responses"]:
        text.append("\nStreaming ", style="bold")
        text.append(f"{st['responses']} SSE answers: first event p50 "
                    f"{_ms(st['first_event_ms']['p50'])}, cadence p50 {_ms(st['gap_ms']['p50'])}"
                    f" p99 {_ms(st['gap_ms']['p99'])}, longest stall "
                    f"{_ms(st['longest_stall_ms'])}")
    return text


def _reuse_line(result: Result, s: dict[str, Any]) -> Text:
    http = s["http"]
    text = Text()
    if not http["requests"]:
        return text.append("No requests seen.", style="dim")
    rate = http["reuse_rate"]
    style = "green" if rate is not None and rate >= result.thresholds.reuse_min else "yellow"
    text.append("HTTP ", style="bold")
    text.append(f"{http['requests']} requests on {http['connections']} connections, reuse ")
    text.append(f"{rate * 100:.0f}%", style=f"bold {style}")
    protos = safe_text(", ".join(f"{k} {v}" + (" = HTTP/2 without TLS" if k == "h2c" else "")
                                 for k, v in http["protocols"].items()))
    if protos:
        text.append(f" ({protos})")
    if http["estimated"]:
        n, total = http["estimated_requests"], http["requests"]
        what = "all requests" if n == total else f"{n} of {total} requests"
        text.append(f"\n~ {what} estimated from encrypted record timing (no key for them)",
                    style="dim")
    return text


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.3f}"


SLOWEST_DROP_ORDER = ("SNI", "proto", "retr", "TCP", "server")
"""Columns of the slowest-connections table given up, in this order, when the table
would be wider than the terminal: numbers and headers are never cut."""


def _slowest(result: Result, n: int = 5, width: int = 80) -> Table | None:
    rows = result.summary.slowest_connections.payloads()[:n]
    if not rows:
        return None
    cols: dict[str, list[str]] = {
        "id": [safe_cell(r["id"]) for r in rows],
        "server": [safe_cell(r["server"]) for r in rows],
        "SNI": [safe_cell(r["sni"] or "-") for r in rows],
        "proto": [safe_cell(r["protocol"] or "-") for r in rows],
        "TCP": [_num(r["rtt_ms"]) for r in rows],
        "TLS": [_num(r["tls_ms"]) for r in rows],
        "TTFB": [_num(r["ttfb_ms"]) + ("~" if r["estimated"] and r["ttfb_ms"] is not None
                                       else "") for r in rows],
        "reqs": [str(r["requests"]) for r in rows],
        "retr": [str(r["retransmissions"]) for r in rows],
    }
    sni_max = 24

    def need(name: str) -> int:
        w = max(len(name), *(len(v) for v in cols[name]))
        return min(w, sni_max) if name == "SNI" else w

    shown = list(cols)
    for victim in SLOWEST_DROP_ORDER:
        if sum(need(c) for c in shown) + len(shown) - 1 <= width:
            break
        shown.remove(victim)
    t = Table(title="Slowest connections (ms)", box=box.SIMPLE, title_justify="left",
              padding=(0, 1), pad_edge=False, collapse_padding=True)
    for c in shown:
        if c == "SNI":
            t.add_column(c, overflow="ellipsis", no_wrap=True, max_width=sni_max)
        else:
            t.add_column(c, justify="left" if c in ("id", "server", "proto") else "right",
                         no_wrap=True, min_width=need(c))
    for i in range(len(rows)):
        t.add_row(*(cols[c][i] for c in shown))
    return t


def _findings(findings: list[Any]) -> Group | Table:
    if not findings:
        return Group(Text("No findings: nothing crossed a threshold.", style="green"))
    t = Table(title="Findings", box=None, title_justify="left", show_header=False,
              padding=(0, 1, 1, 0))
    t.add_column("severity", no_wrap=True)
    t.add_column("finding", ratio=1)
    for f in findings:
        body = Text()
        body.append(safe_text(f.title, FINDING_LIMIT), style="bold")
        body.append("\n" + safe_text(f.detail, FINDING_LIMIT))
        if f.evidence:
            shown = ", ".join(safe_text(e) for e in f.evidence[:6]) + (
                " ..." if len(f.evidence) > 6 else "")
            body.append(f"\nevidence: {shown}", style="dim")
        t.add_row(Text(safe_text(f.severity.upper()),
                       style=SEVERITY_STYLE.get(f.severity, "")), body)
    return t


def _paths(paths: Any, connections: Any) -> list[Any]:
    """The path section: attribution, latency budget per path, and the differences."""
    from netdiag.paths.render import attribution_line, budget_table, differences

    budgets = [paths.budgets[n] for n in sorted(paths.budgets) if paths.budgets[n].roots]
    out: list[Any] = [Text("Paths", style="bold"), Text(attribution_line(connections))]
    if budgets:
        out.append(budget_table(budgets))
        out.append(differences(paths))
    return out


def render(result: Result, console: Console, paths: Any = None,
           connections: Any = None) -> None:
    """Print the whole terminal report (``paths``: a ``PathsAnalysis`` to include)."""
    s = result.summary.build()
    console.print(_header(result))
    console.print(_latency_table(s))
    console.print(_counts(s))
    console.print(_reuse_line(result, s))
    if paths is not None and connections:
        for part in _paths(paths, connections):
            console.print(part)
    slow = _slowest(result, width=console.width)
    if slow is not None:
        console.print(slow)
    findings = list(result.findings)
    if paths is not None:
        from netdiag.paths.render import SHOWN_IN_DIFFERENCES

        shown_block = bool(connections) and any(b.roots for b in paths.budgets.values())
        findings += [f for f in paths.findings
                     if not (shown_block and f.code in SHOWN_IN_DIFFERENCES)]
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    console.print(_findings(findings))

