"""The rich terminal report: what an on-call engineer reads in ten seconds.

Every string that comes from the capture (SNI, server, protocol names, DNS rcodes,
TLS versions, warnings, finding titles, details and evidence) goes through
:mod:`netdiag.textsafe`: shown as text, never read as rich markup, with control and
bidirectional characters made visible.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from netdiag.report.svg import Bucket, Interval, bucket_load, count_text, path_intervals
from netdiag.report.svg import num as _finite
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
    if "quic" in s:
        _pct_row(t, "QUIC first RTT", s["quic"]["handshake_rtt_ms"])
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
    quic = s.get("quic")
    if quic:
        text.append("\nQUIC ", style="bold")
        text.append(f"{quic['connections']} connections, {quic['zero_rtt_attempted']} tried "
                    f"0-RTT, {quic['retries']} Retry, {quic['migrations']} migrations")
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


def _paths(paths: Any, connections: Any, budgets: list[Any], shown: list[Any]) -> list[Any]:
    """The path section: attribution, latency budget per path (``budgets``: those with
    client requests; ``shown``: of :func:`netdiag.paths.render.shown_paths`), and the
    differences."""
    from netdiag.paths.render import attribution_line, budget_table, differences, not_shown_line

    out: list[Any] = [Text("Paths", style="bold"),
                      Text(attribution_line(connections, first={b.name for b in shown}))]
    if budgets:
        out.append(budget_table(shown))
        more = not_shown_line(budgets, shown)
        if more is not None:
            out.append(more)
        out.append(differences(paths))
    return out


SPARK = "▁▂▃▄▅▆▇█"
"""The sparkline's eight levels (a blank: no request in the interval)."""
LOAD_MIN_INTERVALS = 3
"""The "Load over time" section is shown when some path has at least this many intervals."""
LOAD_NAME_MAX = 28
"""Cells of a path's name (and of its interval count) left of its sparklines, from 80
columns on (an inferred path's name, ``direct 255.255.255.255:65535``, fits); 20 from 60
columns, a fifth of the width below."""
NO_PATH = "no path"
"""How the time series of requests on no path (key ``null``) is named."""


def _interval_text(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _spark(values: Sequence[float | None]) -> tuple[str, float | None, float | None]:
    """The sparkline of ``values`` (None: a blank), scaled from its lowest value (▁) to
    its highest (█), with those two."""
    shown = [v for v in values if v is not None]
    if not shown:
        return " " * len(values), None, None
    lo, hi = min(shown), max(shown)
    chars = []
    for v in values:
        if v is None:
            chars.append(" ")
        elif hi <= lo:
            chars.append(SPARK[3])
        else:
            chars.append(SPARK[min(round((v - lo) / (hi - lo) * 7), 7)])
    return "".join(chars), lo, hi


def _range(lo: float | None, hi: float | None, fmt: Any) -> str:
    if lo is None or hi is None:
        return ""
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def _load_series(timeseries: dict[str, Any]
                 ) -> list[tuple[str, list[Interval], bool]]:
    """(key, intervals, estimated) of each path with a request, requests on no path last."""
    out = [(key, series, any(x.estimated for x in series))
           for key, series in path_intervals(timeseries)]
    out.sort(key=lambda t: t[0] == "null")
    return out


def load_section(timeseries: dict[str, Any] | None, knees: list[dict[str, Any]] | None,
                 width: int, only: Collection[str] | None = None) -> RenderableType | None:
    """"Load over time": per path, two sparklines on one time axis (requests per second
    and p99 time to first byte per interval, a blank where an interval had no request)
    with their lowest and highest values, then its knees' sentences (or, dimmed, why no
    p99 knee was found). None unless some path has :data:`LOAD_MIN_INTERVALS` intervals.
    A path's name is left of its sparklines, or on a line of its own when longer than
    that column (names are never cut: an inferred path is named by its address).
    Every line fits ``width`` cells; names, reasons and sentences come from the capture
    (a profile's path names) and go through :mod:`netdiag.textsafe`. ``only``: the paths
    to draw (those the path section shows) and requests on no path; the others are
    counted in one line."""
    if not isinstance(timeseries, dict):
        return None
    series = _load_series(timeseries)
    left_out = 0
    if only is not None:
        kept = [t for t in series if t[0] == "null" or t[0] in only]
        left_out = len(series) - len(kept)
        series = kept
    if not any(len(s) >= LOAD_MIN_INTERVALS for _, s, _ in series):
        return None
    series = [t for t in series if any(x.requests for x in t[1])]    # else nothing to draw
    if not series:
        return None
    width = max(width, 20)
    iv_ms = _finite(timeseries.get("interval_ms")) or 0.0
    knee_list = [k for k in knees or [] if isinstance(k, dict)]

    def path_of(k: dict[str, Any]) -> str:
        return "null" if k.get("path") is None else str(k.get("path"))

    declined = timeseries.get("knee_declined")
    declined = declined if isinstance(declined, dict) else {}
    names = {key: Text(NO_PATH if key == "null" else safe_text(key, None), style="bold")
             for key, _, _ in series}
    infos = {key: f"{len(s):,} × {_interval_text(iv_ms)}" if iv_ms else f"{len(s):,}"
             for key, s, _ in series}
    cap = LOAD_NAME_MAX if width >= 80 else 20 if width >= 60 else max(width // 5, 4)
    info_w = max(len(i) for i in infos.values())
    name_w = min(max(*(cell_len(t.plain) for t in names.values()), info_w), cap)
    if width >= 40:                             # room for the count: never cut
        name_w = max(name_w, info_w)
    tag_w = 5                                   # "req/s", "p99~"
    # first pass: the range labels of every path, so that the sparklines line up
    fixed = name_w + 1 + tag_w + 1 + 2
    spark_w = max(width - fixed - 16, 4)       # a first guess to measure the labels
    # The sparklines are downsampled to the width: a cell sums k consecutive intervals
    # (svg.bucket_load): the mean rate of the cell (its requests over its time), the
    # highest p99 (one slow interval is never averaged away).
    Drawn = list[tuple[str, list[Bucket], int, bool]]

    def draw(cells: int) -> tuple[Drawn, int]:
        """The buckets of every path in ``cells`` cells, and the cells that fit beside
        their widest range label."""
        d = [(key, *bucket_load(s, iv_ms / 1000.0, cells), est) for key, s, est in series]
        labels = []
        for _, b, _, _ in d:
            labels.append(_range(*_spark([x.rate if x.requests else None for x in b])[1:],
                                 count_text))
            labels.append(_range(*_spark([x.p99 for x in b])[1:], ms_text))
        return d, max(width - fixed - max(cell_len(lab) for lab in labels), 4)

    fits: tuple[Drawn, int] | None = None
    for _ in range(3):                          # the labels depend on the downsampling
        drawn, room = draw(spark_w)
        if max(len(b) for _, b, _, _ in drawn) <= room:
            fits = drawn, room
            if room == spark_w:
                break
        spark_w = room
    drawn, spark_w = fits if fits is not None else draw(spark_w)
    per = {k for _, _, k, _ in drawn}
    spark_w = min(spark_w, max(len(b) for _, b, _, _ in drawn))    # labels follow the marks
    title = Text("Load over time", style="bold")
    how = "req/s and p99 time to first byte"
    how += f" per {_interval_text(iv_ms)} interval" if iv_ms else " per interval"
    how += ", blank: no request"
    if max(per) > 1:
        how += (f"; a mark is {max(per):,} intervals" if len(per) == 1 else
                f"; a mark is up to {max(per):,} intervals")
        how += ": mean rate, highest p99"
    title.append(f" ({how})", style="dim")
    out: list[RenderableType] = [title]

    def cell(text: Text, w: int) -> Text:
        t = text.copy()
        t.truncate(w, overflow="ellipsis", pad=True)
        return t

    def line(left: Text, tag: str, spark: str, style: str, rng: str) -> Text:
        t = Text(no_wrap=True, overflow="crop")
        t.append_text(cell(left, name_w))
        t.append(" ")
        t.append(tag.ljust(tag_w), style="dim")
        t.append(" ")
        t.append(spark.ljust(spark_w), style=style)
        if rng and cell_len(t.plain) + 2 + cell_len(rng) <= width:    # whole, or not at all
            t.append("  " + rng, style="dim")
        t.rstrip()
        t.truncate(width)
        return t

    shown = set()
    for key, buckets, _, est in drawn:
        shown.add(key)
        rs, rlo, rhi = _spark([b.rate if b.requests else None for b in buckets])
        ps, plo, phi = _spark([b.p99 for b in buckets])
        name = names[key]
        if cell_len(name.plain) > name_w:       # never cut (an address): a line of its own
            out.append(name)
            name = Text()
        out.append(line(name, "req/s", rs, "cyan", _range(rlo, rhi, count_text)))
        out.append(line(Text(infos[key], style="dim"), "p99~" if est else "p99", ps,
                        "magenta", _range(plo, phi, ms_text)))
        mine = [k for k in knee_list if path_of(k) == key]
        for k in mine:
            out.append(Padding(Text(safe_text(k.get("sentence"), SENTENCE_LIMIT)),
                               (0, 0, 0, 2)))
        reasons = declined.get(key)
        reason = reasons.get("ttfb_p99") if isinstance(reasons, dict) else None
        if reason is not None and not any(k.get("metric") == "ttfb_p99" for k in mine):
            out.append(Padding(Text("no knee: " + safe_text(reason, SENTENCE_LIMIT),
                                    style="dim"), (0, 0, 0, 2)))
    for k in knee_list:                         # knees of paths without a time series
        if path_of(k) not in shown and (only is None or path_of(k) in only):
            out.append(Padding(Text(safe_text(k.get("sentence"), SENTENCE_LIMIT)),
                               (0, 0, 0, 2)))
    if left_out:
        out.append(Text(f"{left_out:,} more path{'s' if left_out != 1 else ''} not shown "
                        "(as above): --format json has their time series", style="dim"))
    return Group(*out)


def render(result: Result, console: Console, paths: Any = None,
           connections: Any = None) -> None:
    """Print the whole terminal report (``paths``: a ``PathsAnalysis`` to include)."""
    s = result.summary.build()
    console.print(_header(result))
    console.print(_latency_table(s))
    console.print(_counts(s))
    console.print(_reuse_line(result, s))
    budgets: list[Any] = []
    shown: list[Any] = []
    only = None  # the paths the load section draws: every one unless some are left out
    if paths is not None:
        from netdiag.paths.render import shown_paths

        budgets = [b for b in paths.budgets.values() if b.roots]
        shown = shown_paths(budgets)
        if len(shown) < len(budgets):
            only = {b.name for b in shown}
    if paths is not None and connections:
        for part in _paths(paths, connections, budgets, shown):
            console.print(part)
    if paths is not None:
        load = load_section(getattr(paths, "timeseries", None), getattr(paths, "knees", None),
                            console.width, only)
        if load is not None:
            console.print(load)
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

