"""One self-contained HTML page from a contract document.

:func:`render_html` is a pure formatter over the document ``CollectingSink.document``
returns (paths filled or not). The page needs no network and runs no script: the
stylesheet is inline, the charts are inline SVG drawn here (:mod:`netdiag.report.svg`),
fonts are the system's, and a Content-Security-Policy (``default-src 'none'``) forbids
scripts, frames and every fetch, as a second wall behind escaping.

Every string that comes from the capture (names, SNI, paths, headers, evidence,
finding text, even numbers that turn out to be strings) is escaped with
:func:`netdiag.report.svg.esc` (``html.escape`` with quotes, control and
bidirectional characters made visible), in HTML text, attributes and SVG alike.

Sections: capture facts and headline figures, findings, the latency percentiles, the
per-path latency budget (when ``summary.paths`` has entries), the load over time and
the latency knees (when ``timeseries`` has a path of :data:`LOAD_MIN_INTERVALS`
intervals or more), time-to-first-byte
distributions (a CDF and histograms, per path or overall), a waterfall per connection
(DNS, TCP, TLS, wait, transfer, streamed chunks; the :data:`MAX_WATERFALLS` slowest
connections), the slowest requests, and the DNS and connection tables.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from netdiag.paths.shown import PATHS_SHOWN, PathSize, not_shown_sentence, shown_names
from netdiag.report.har import attribute_dns, handshake_seen, is_http, split_endpoint
from netdiag.report.json_out import Records
from netdiag.report.svg import (
    SERIES,
    TIMELINE_COLS,
    Bar,
    Cloud,
    Interval,
    KneeLine,
    Row,
    Segment,
    Series,
    TimeMark,
    bucket_load,
    budget_bars,
    cdf_chart,
    clip,
    count_text,
    esc,
    fmt_ms,
    histogram,
    num,
    path_intervals,
    scatter_chart,
    timeline_chart,
    waterfall,
)
from netdiag.report.units import bytes_text

MAX_WATERFALLS = 50
"""Connections drawn as waterfalls (the slowest ones)."""
OPEN_WATERFALLS = 12
"""Waterfalls shown unfolded; the others are one click away."""
MAX_WATERFALL_ROWS = 40
"""Requests drawn per connection (in order of start)."""
MAX_TABLE_ROWS = 500
"""Rows of the DNS and connection tables."""
SLOWEST_REQUESTS = 25
LOAD_MIN_INTERVALS = 3
"""The Load section is drawn when some path has at least this many intervals."""
MAX_LOAD_PATHS = SERIES
"""Paths drawn in the Load section (their colours stay distinct); the others are named."""
NO_PATH = "no path"
"""How the time series of requests on no path (key ``null``) is named."""
METRIC_WORDS = {"ttfb_p99": "p99 time to first byte", "ttfb_p50": "p50 time to first byte"}

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}

PHASE_LABELS = {
    "dns_ms": "DNS lookup", "tcp_ms": "TCP handshake", "tls_ms": "TLS handshake",
    "quic_ms": "QUIC handshake",
    "think_ms": "Origin think time", "transfer_ms": "Transfer (first to last byte)",
}

CSS = """
:root{--bg:#f6f7f9;--card:#fff;--fg:#1d2330;--muted:#5b6475;--border:#dde1e8;
--grid:#e6e9ef;--grid2:#c4cad6;--band:#f5f7fa;--accent:#1a56db;
--dns:#0f8b7e;--tcp:#e37400;--tls:#8e3bd8;--send:#6b7280;--wait:#7aa7f0;--recv:#1d4fc4;
--tick:#111827;--blocked:#b6bcc8;
--s0:#0072b2;--s1:#d55e00;--s2:#009e73;--s3:#cc79a7;--s4:#56b4e9;--s5:#e69f00;
--s6:#7f5539;--s7:#4b5563;
--crit:#b42318;--crit-bg:#fef3f2;--warn:#8a4b00;--warn-bg:#fffaeb;--warn-bd:#f5b83d;
--info:#175cd3;--info-bg:#eff8ff;--ok:#067647}
@media (prefers-color-scheme:dark){:root{--bg:#11151c;--card:#1a1f29;--fg:#e6e9ef;
--muted:#a2aabb;--border:#2e3542;--grid:#262c38;--grid2:#3b4352;--band:#1e2430;
--accent:#7aa2ff;--wait:#5a86d6;--recv:#9cb9ff;--tick:#f3f4f6;--blocked:#4b5263;
--crit:#ff8b7f;--crit-bg:#3a1d1b;--warn:#ffcb66;--warn-bg:#33280f;--warn-bd:#a8771c;
--info:#8fbaff;--info-bg:#15243d;--ok:#56d39b;--s7:#9ca3af}}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.5 system-ui,-apple-system,
"Segoe UI",Roboto,"Noto Sans","Helvetica Neue",Arial,sans-serif}
.wrap{max-width:1240px;margin:0 auto;padding:0 24px 48px}
header.top{background:var(--card);border-bottom:1px solid var(--border);margin-bottom:20px}
header.top .wrap{padding-top:22px;padding-bottom:16px}
h1{font-size:24px;line-height:1.25;margin:0 0 4px;font-weight:650;letter-spacing:-.01em;
overflow-wrap:anywhere}
h2{font-size:18px;margin:0 0 12px;font-weight:650}
h3{font-size:15px;margin:18px 0 8px;font-weight:600}
.sub{color:var(--muted);font-size:13.5px;margin:0}
.sub b{color:var(--fg);font-weight:600}
nav.toc{display:flex;flex-wrap:wrap;gap:6px 14px;margin-top:12px;font-size:13.5px}
nav.toc a{color:var(--accent);text-decoration:none}
nav.toc a:hover{text-decoration:underline}
section{background:var(--card);border:1px solid var(--border);border-radius:10px;
padding:18px 20px;margin:0 0 18px}
.note{color:var(--muted);font-size:13px;margin:6px 0 0}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;
margin-bottom:16px}
.card{border:1px solid var(--border);border-radius:8px;padding:10px 12px;background:var(--bg)}
.card .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums;line-height:1.3}
.card .d{font-size:12.5px;color:var(--muted)}
.banner{border-radius:8px;padding:10px 14px;margin:12px 0 0;font-size:14px}
.banner.crit{background:var(--crit-bg);color:var(--crit);border:1px solid var(--crit)}
.banner.warn{background:var(--warn-bg);color:var(--warn);border:1px solid var(--warn-bd)}
.tbl{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13.5px}
th,td{padding:6px 10px;border-bottom:1px solid var(--border);text-align:left;
vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:12.5px;white-space:nowrap;
background:var(--card)}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.ctr{text-align:center}
tbody tr:hover td{background:var(--band)}
td.em{font-weight:600}
th.grp{color:var(--fg);font-size:13px;text-align:center;border-bottom:2px solid var(--grid2)}
table.budget th.grp{border-left:1px solid var(--border)}
details.hd summary{cursor:pointer;color:var(--accent);white-space:nowrap}
details.hd .hk{font-size:11.5px;color:var(--muted);margin:6px 0 2px;text-transform:uppercase}
table.hdrs{font-size:12px;width:auto}
table.hdrs th,table.hdrs td{padding:1px 8px 1px 0;border:0;font-family:ui-monospace,
SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;overflow-wrap:anywhere}
table.hdrs th{color:var(--muted);font-weight:400;font-size:12px}
ul.cmp{list-style:none;padding:0;margin:0}ul.cmp li{margin:0 0 5px}
.mono,code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;
font-size:12.5px}
.nw{white-space:nowrap}
.badge{display:inline-block;border-radius:999px;padding:1px 8px;font-size:11.5px;
font-weight:600;letter-spacing:.02em;vertical-align:1px;white-space:nowrap}
.b-critical{background:var(--crit);color:#fff}
.b-warning{background:var(--warn-bd);color:#1d1400}
.b-info{background:var(--info);color:#fff}
.b-est{background:var(--warn-bg);color:var(--warn);border:1px solid var(--warn-bd)}
.b-ok{background:transparent;color:var(--ok);border:1px solid var(--ok)}
.b-muted{background:transparent;color:var(--muted);border:1px solid var(--border)}
.finding{border-left:4px solid var(--info);background:var(--info-bg);border-radius:6px;
padding:10px 14px;margin:0 0 10px}
.finding.critical{border-color:var(--crit);background:var(--crit-bg)}
.finding.warning{border-color:var(--warn-bd);background:var(--warn-bg)}
.finding .t{font-weight:600;overflow-wrap:anywhere}
.finding .code{font-weight:400;color:var(--muted)}
.finding .dt{margin:4px 0 0;font-size:14px;overflow-wrap:anywhere}
.finding .ev{margin:6px 0 0;font-size:12.5px;color:var(--muted);overflow-wrap:anywhere}
.chip{display:inline-block;border:1px solid var(--border);background:var(--card);
border-radius:4px;padding:0 5px;margin:0 4px 2px 0}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;font-size:12.5px;color:var(--muted);
margin:0 0 10px}
.legend span{display:inline-flex;align-items:center;gap:6px}
.sw{display:inline-block;width:14px;height:10px;border-radius:2px}
.sw.tk{width:2px;height:12px;background:var(--tick)}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:8px 20px}
svg.chart{display:block;width:100%;height:auto;margin:4px 0 8px;
font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans",Arial,sans-serif}
svg.chart.small{max-width:640px}
svg .grid{stroke:var(--grid);stroke-width:1}
svg .grid.strong{stroke:var(--grid2);stroke-dasharray:4 3}
svg .axis{stroke:var(--grid2);stroke-width:1}
svg .band{fill:var(--band)}
svg text{fill:var(--fg);font-size:12px}
svg text.ax{fill:var(--muted);font-size:11px}
svg text.lg{font-size:12.5px}
svg text.dim{fill:var(--muted);font-style:italic}
svg text.setup{font-weight:600}
svg .line{fill:none;stroke-width:2.2;stroke-linejoin:round}
svg .tick{stroke:var(--tick);stroke-width:1.3}
svg .gap{stroke:var(--blocked);stroke-width:1.5;stroke-dasharray:2 3}
svg text.note{paint-order:stroke;stroke:var(--card);stroke-width:3px;stroke-linejoin:round}
.ph-dns{fill:var(--dns);background:var(--dns)}
.ph-tcp{fill:var(--tcp);background:var(--tcp)}
.ph-tls{fill:var(--tls);background:var(--tls)}
.ph-send{fill:var(--send);background:var(--send)}
.ph-wait{fill:var(--wait);background:var(--wait)}
.ph-recv{fill:var(--recv);background:var(--recv)}
.ph-blocked{fill:var(--blocked);background:var(--blocked)}
.ph-hop0{fill:#4c8bf5;background:#4c8bf5}.ph-hop1{fill:#22b8cf;background:#22b8cf}
.ph-hop2{fill:#7c9cff;background:#7c9cff}.ph-hop3{fill:#0891b2;background:#0891b2}
.ph-hop4{fill:#93c5fd;background:#93c5fd}.ph-hop5{fill:#155e75;background:#155e75}
svg .line.ts{stroke-width:1.6;stroke-linecap:square}
svg .line.dash{stroke-width:1.3;stroke-dasharray:5 3}
svg .area{fill-opacity:.22;stroke-width:1.2}
svg .dot{fill:none;stroke-width:5;stroke-linecap:round;stroke-opacity:.7}
svg .knee{stroke-width:1.6;stroke-dasharray:6 3}
svg .knee.p50{stroke-dasharray:2 3}
svg .kband{fill-opacity:.13}
""" + "".join(
    f".s{i}.line{{stroke:var(--s{i})}}.s{i}.fill{{fill:var(--s{i})}}"
    f".s{i}.area{{fill:var(--s{i});stroke:var(--s{i})}}.s{i}.dot{{stroke:var(--s{i})}}"
    f".s{i}.knee{{stroke:var(--s{i})}}.s{i}.kband{{fill:var(--s{i})}}"
    f".sw.s{i}{{background:var(--s{i})}}" for i in range(8)) + """
details.conn{border-top:1px solid var(--border);padding:8px 0 2px}
details.conn:first-of-type{border-top:0}
details.conn summary{cursor:pointer;font-size:13.5px;list-style-position:outside;
overflow-wrap:anywhere}
details.conn summary b{font-weight:650}
details.conn summary .m{color:var(--muted)}
footer{color:var(--muted);font-size:12.5px;text-align:center;margin-top:8px}
@media (max-width:640px){.wrap{padding:0 12px 32px}section{padding:14px 12px}
h1{font-size:20px}.grid2{grid-template-columns:1fr}}
@media print{body{background:#fff}section{break-inside:avoid-page;border-color:#ccc}
nav.toc{display:none}}
"""


# --- small formatters --------------------------------------------------------------


def _iso(ts: object) -> str:
    t = num(ts)
    if t is None:
        return "–"
    try:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    except (OverflowError, OSError, ValueError):
        return "–"


def _int(v: object) -> str:
    x = num(v)
    return "–" if x is None else f"{x:,.0f}"


def _bytes(v: object) -> str:
    x = num(v)
    return "–" if x is None else bytes_text(x, "\u202f")


def _pct(v: object) -> str:
    x = num(v)
    return "–" if x is None else f"{x * 100:.0f}%"


def _rel(ts: object, t0: float | None) -> str:
    t = num(ts)
    if t is None or t0 is None:
        return "–"
    return f"+{t - t0:.3f}\u202fs"


def _d(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _is_block(v: object) -> bool:
    return isinstance(v, dict) and "p50" in v


def _badge(text: str, cls: str) -> str:
    return f'<span class="badge {cls}">{esc(text)}</span>'


def _table(head: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str | None]],
           cls: str = "", above: str = "") -> str:
    """``head``: (escaped label, numeric); ``rows``: cells already escaped markup;
    ``above``: an extra header row (markup) over the column names. A ``None`` cell is
    covered by the cell before it (``colspan``)."""
    h = "".join(f'<th class="n">{lab}</th>' if n else f"<th>{lab}</th>" for lab, n in head)
    h = f"{above}<tr>{h}</tr>"
    body = []
    for r in rows:
        cells = []
        for j, c in enumerate(r):
            if c is None or j >= len(head):
                continue            # covered by the cell before it
            span = 1
            while j + span < len(r) and r[j + span] is None:
                span += 1
            attrs = ' class="n"' if head[j][1] else ""
            if span > 1:
                attrs = f' class="n ctr" colspan="{span}"'
            cells.append(f"<td{attrs}>{c}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="tbl"><table class="{cls}"><thead>{h}</thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


# --- data helpers ------------------------------------------------------------------


def _records(v: object) -> Iterable[Any]:
    """The elements of a list, or of a :class:`~netdiag.report.json_out.Records` (each
    made as it is read: ``netdiag report`` hands the connections and DNS so)."""
    return v if isinstance(v, list | Records) else ()


class _Top:
    """The ``size`` items of the largest keys among those added, ties to the first added
    (what a stable sort by decreasing key keeps of its head), without keeping the rest."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.added = 0
        """How many items were added in all."""
        self._heap: list[tuple[float, int, Any]] = []

    def add(self, key: float, item: Any) -> None:
        entry = (key, -self.added, item)  # the count first: items are never compared
        self.added += 1
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, entry)
        elif (key, entry[1]) > self._heap[0][:2]:
            heapq.heapreplace(self._heap, entry)

    def best(self) -> list[Any]:
        """The items kept, largest key first, ties in the order added."""
        return [e[2] for e in sorted(self._heap, key=lambda e: (-e[0], -e[1]))]


class _Digest:
    """What the sections read of the connections, from one pass over them: a document
    made as it is read (``Records``) is rendered once, and only the connections and
    requests a section shows are kept."""

    def __init__(self, doc: dict[str, Any], dns_of: dict[str, dict[str, Any]]) -> None:
        self.ttfb_by_path: dict[str, list[float]] = {}
        """Per path name (in the order first seen), the times to first byte of its
        client-facing HTTP requests."""
        self.estimated_paths: dict[str, bool] = {}
        """Per path name of :attr:`ttfb_by_path`: whether one of those was estimated."""
        self.ttfb: list[float] = []
        """The time to first byte of every HTTP request that has one."""
        self.any_estimated = False
        """Whether an HTTP request was estimated (with or without a first byte)."""
        self.slowest = _Top(SLOWEST_REQUESTS)
        """``(connection, index, request)`` of the longest times to first byte."""
        self.slowest_on_path = False
        """Whether a request with a time to first byte is on a named path."""
        self.slowest_with_headers = False
        """Whether a request with a time to first byte has decoded headers."""
        self.waterfalls = _Top(MAX_WATERFALLS)
        """``(order, connection)`` of the slowest connections with something to draw."""
        self.table: list[dict[str, Any]] = []
        """The first :data:`MAX_TABLE_ROWS` connections."""
        self.connections = 0
        """How many connections there are."""
        self.servers: set[str] = set()
        """The server addresses."""
        for order, c in enumerate(_records(doc.get("connections"))):
            if isinstance(c, dict):
                self._add(order, c, dns_of)

    def _add(self, order: int, c: dict[str, Any], dns_of: dict[str, dict[str, Any]]) -> None:
        self.connections += 1
        if len(self.table) < MAX_TABLE_ROWS:
            self.table.append(c)
        self.servers.add(split_endpoint(c.get("server"))[0])
        w = _conn_waterfall(c, dns_of.get(str(c.get("id"))), draw=False)
        if w is not None:
            self.waterfalls.add(w[0], (order, c))
        name = _path_name(c)
        for i, r in enumerate(_l(c.get("requests"))):
            if not isinstance(r, dict) or not is_http(c, r):
                continue
            self.any_estimated = self.any_estimated or bool(r.get("estimated"))
            v = num(r.get("ttfb_ms"))
            if v is None:
                continue
            self.ttfb.append(v)
            self.slowest.add(v, (c, i, r))
            self.slowest_on_path = self.slowest_on_path or bool(name)
            self.slowest_with_headers = self.slowest_with_headers or bool(
                r.get("request_headers") or r.get("response_headers"))
            if name is not None and "caused_by" not in r:
                self.ttfb_by_path.setdefault(name, []).append(v)
                self.estimated_paths[name] = (self.estimated_paths.get(name, False)
                                              or bool(r.get("estimated")))


def _path_name(c: dict[str, Any]) -> str | None:
    p = c.get("path")
    if isinstance(p, dict) and p.get("name") is not None:
        return str(p.get("name"))
    return None


def _req_label(r: dict[str, Any], i: int, mark: bool = True) -> str:
    """``GET /v1/messages 200``, or ``request 3 (estimated)`` when nothing is visible."""
    if r.get("method") is None and r.get("path") is None:
        return f"request {i + 1}" + (" (estimated)" if mark and r.get("estimated") else "")
    bits = [str(r.get("method") or "?"), str(r.get("path") or "")]
    if r.get("status") is not None:
        bits.append(str(r.get("status")))
    return " ".join(b for b in bits if b)


# --- sections ----------------------------------------------------------------------


def _header(doc: dict[str, Any], title: str) -> str:
    cap = _d(doc.get("capture"))
    files = [str(f) for f in _l(cap.get("files"))]
    facts = [
        f"<b>{_int(cap.get('packets'))}</b> packets",
        f"<b>{esc(_bytes(cap.get('bytes')))}</b>",
        f"<b>{esc(fmt_ms(cap.get('duration_ms')))}</b> of traffic",
        f"from {esc(_iso(cap.get('first_ts')))}",
    ]
    lt = [str(x) for x in _l(cap.get("link_types"))]
    if lt:
        facts.append("link " + esc("/".join(lt)))
    out = [f'<header class="top"><div class="wrap"><h1>{esc(title)}</h1>',
           f'<p class="sub">{" · ".join(facts)}</p>']
    named = ", ".join(files)
    if named and named not in title:
        out[1] = f'<p class="sub">{esc(named)} · {" · ".join(facts)}</p>'
    if cap.get("truncated"):
        first = next((w for w in _l(cap.get("warnings"))
                      if isinstance(w, dict) and w.get("kind") == "capture"), None)
        msg = first.get("message") if first else "the capture is damaged or cut short"
        out.append(f'<div class="banner crit"><b>Truncated capture.</b> {esc(msg)} '
                   "Everything before the damage is reported.</div>")
    http = _d(_d(doc.get("summary")).get("http"))
    n_est = num(http.get("estimated_requests"))
    if http.get("estimated"):
        n_req = num(http.get("requests"))
        how = (f"{n_est:.0f} of {n_req:.0f} requests are" if n_est is not None
               and n_req is not None else "Some requests are")
        out.append(f'<div class="banner warn"><b>Estimated timings.</b> {esc(how)} '
                   "inferred from encrypted TLS record timing (no key log for their "
                   "connections): their request and response boundaries are a guess, and "
                   "method, path and status are unknown. Pass <code>--keylog</code> for "
                   "exact figures.</div>")
    nav = [("summary", "Summary"), ("findings", "Findings")]
    if _d(_d(doc.get("summary")).get("paths")):
        nav.append(("paths", "Paths"))
    if _load_series(doc):
        nav.append(("load", "Load"))
    nav += [("ttfb", "Time to first byte"), ("waterfall", "Waterfall"),
            ("slowest", "Slowest requests"), ("dns", "DNS"), ("connections", "Connections")]
    out.append('<nav class="toc">' + "".join(f'<a href="#{a}">{lab}</a>' for a, lab in nav)
               + "</nav></div></header>")
    return "".join(out)


def _card(k: str, v: str, d: str = "") -> str:
    return (f'<div class="card"><div class="k">{k}</div><div class="v">{v}</div>'
            f'<div class="d">{d}</div></div>')


def _summary(doc: dict[str, Any]) -> str:
    s = _d(doc.get("summary"))
    dns, tcp, tls, http = (_d(s.get(k)) for k in ("dns", "tcp", "tls", "http"))
    dl, hr = _d(dns.get("latency_ms")), _d(tcp.get("handshake_rtt_ms"))
    th, tt = _d(tls.get("handshake_ms")), _d(http.get("ttfb_ms"))
    est = " (estimated)" if http.get("estimated") else ""
    findings = [f for f in _l(doc.get("findings")) if isinstance(f, dict)]
    sev = {k: sum(1 for f in findings if f.get("severity") == k)
           for k in ("critical", "warning", "info")}
    versions = ", ".join(f"{esc(k)} ×{_int(v)}" for k, v in _d(tls.get("versions")).items())
    cards = [
        _card("DNS lookup", esc(fmt_ms(dl.get("p50"))),
              f"median · {_int(dns.get('transactions'))} queries · "
              f"{_int(dns.get('unanswered'))} unanswered"),
        _card("TCP handshake", esc(fmt_ms(hr.get("p50"))),
              f"median RTT · {_int(tcp.get('connections'))} connections · "
              f"{_int(tcp.get('retransmissions'))} retransmissions"),
        _card("TLS handshake", esc(fmt_ms(th.get("p50"))),
              f"median · {_int(tls.get('handshakes'))} handshakes · "
              f"{_int(tls.get('resumed'))} resumed"),
        _card("Time to first byte", esc(fmt_ms(tt.get("p50"))),
              f"median{esc(est)} · p99 {esc(fmt_ms(tt.get('p99')))} · "
              f"max {esc(fmt_ms(tt.get('max')))}"),
        _card("Connection reuse", esc(_pct(http.get("reuse_rate"))),
              f"{_int(http.get('requests'))} requests on {_int(http.get('connections'))} "
              "connections"),
        _card("Findings", f"{len(findings)}",
              " · ".join(f"{n} {k}" for k, n in sev.items() if n) or "nothing to report"),
    ]
    rows = []
    blocks = [
        ("DNS lookup", dl, True), ("TCP handshake RTT", hr, True),
        ("TLS handshake", th, True), ("Time to first byte" + est, tt, True),
        ("Time to last byte" + est, _d(http.get("ttlb_ms")), True),
        ("SSE first event", _d(_d(http.get("streaming")).get("first_event_ms")), True),
        ("SSE gap between events", _d(_d(http.get("streaming")).get("gap_ms")), True),
        ("Requests per connection", _d(http.get("requests_per_connection")), False),
    ]
    for name, b, ms in blocks:
        if name.startswith("SSE") and not num(b.get("count")):
            continue
        f = fmt_ms if ms else (lambda v: "–" if num(v) is None else f"{num(v):.1f}")
        rows.append([esc(name), _int(b.get("count"))]
                    + [esc(f(b.get(k))) for k in ("min", "p50", "p90", "p99", "max", "mean")])
    head = [("", False), ("count", True), ("min", True), ("p50", True), ("p90", True),
            ("p99", True), ("max", True), ("mean", True)]
    extra = []
    if versions:
        extra.append(f"TLS versions: {versions}")
    protos = ", ".join(f"{esc(k)} ×{_int(v)}" for k, v in _d(http.get("protocols")).items())
    if protos:
        extra.append(f"HTTP: {protos}")
    rc = ", ".join(f"{esc(k)} ×{_int(v)}" for k, v in _d(dns.get("rcodes")).items())
    if rc:
        extra.append(f"DNS answers: {rc}")
    if num(tls.get("decrypted")) is not None:
        extra.append(f"decrypted TLS connections: {_int(tls.get('decrypted'))} of "
                     f"{_int(tls.get('handshakes'))}")
    return ('<section id="summary"><h2>Summary</h2>'
            f'<div class="cards">{"".join(cards)}</div>'
            + _table(head, rows)
            + (f'<p class="note">{" · ".join(extra)}</p>' if extra else "")
            + "</section>")


def _groups(doc: dict[str, Any]) -> str:
    """The ``--by`` breakdown of a fleet report (``groups``): one row per host, file or
    capture set, with the summary's main figures; empty without ``groups``."""
    groups = [g for g in _l(doc.get("groups")) if isinstance(g, dict)]
    if not groups:
        return ""
    rows = []
    for g in groups:
        s = _d(g.get("summary"))
        tcp, tls, http, dns = (_d(s.get(k)) for k in ("tcp", "tls", "http", "dns"))
        tt = _d(http.get("ttfb_ms"))
        rows.append([
            esc(g.get("key")), _int(len(_l(g.get("files")))), _int(tcp.get("connections")),
            _int(http.get("requests")), _int(dns.get("transactions")),
            esc(fmt_ms(_d(tcp.get("handshake_rtt_ms")).get("p50"))),
            esc(fmt_ms(_d(tls.get("handshake_ms")).get("p50"))),
            esc(fmt_ms(tt.get("p50"))), esc(fmt_ms(tt.get("p90"))), esc(fmt_ms(tt.get("p99"))),
            _badge("damaged", "b-critical") if g.get("truncated") else ""])
    head = [("group", False), ("files", True), ("connections", True), ("requests", True),
            ("DNS", True), ("RTT p50", True), ("TLS p50", True), ("TTFB p50", True),
            ("p90", True), ("p99", True), ("", False)]
    return ('<section id="groups"><h2>By group</h2>'
            f'<p class="note">{_int(len(groups))} groups; the summary above covers them '
            "all.</p>" + _table(head, rows) + "</section>")


def _findings(doc: dict[str, Any]) -> str:
    fs = [f for f in _l(doc.get("findings")) if isinstance(f, dict)]
    fs.sort(key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 3))
    if not fs:
        return ('<section id="findings"><h2>Findings</h2><p>Nothing crossed a threshold.'
                "</p></section>")
    items = []
    for f in fs:
        sev = str(f.get("severity") or "info")
        cls = sev if sev in SEVERITY_ORDER else "info"
        ev = "".join(f'<span class="chip mono">{clip(e, 120)}</span>'
                     for e in _l(f.get("evidence"))[:40])
        more = len(_l(f.get("evidence"))) - 40
        if more > 0:
            ev += f" and {more} more"
        items.append(
            f'<div class="finding {cls}"><div class="t">{_badge(sev, "b-" + cls)} '
            f'{esc(f.get("title"))} <span class="mono code">'
            f'{esc(f.get("code"))}</span></div>'
            f'<p class="dt">{esc(f.get("detail"))}</p>'
            + (f'<div class="ev">evidence: {ev}</div>' if ev else "") + "</div>")
    return f'<section id="findings"><h2>Findings</h2>{"".join(items)}</section>'


def _hop_order(paths: dict[str, dict[str, Any]]) -> list[str]:
    """Every hop of the paths, client-facing first: each path's own order (its ``hops``
    list, else its budget's) merged, a hop going before the hops it precedes anywhere."""
    order: list[str] = []
    for p in paths.values():
        own = [str(h) for h in _l(p.get("hops"))]
        own += [str(h) for h in _d(_d(p.get("phases")).get("hops")) if str(h) not in own]
        for i, h in enumerate(own):
            if h in order:
                continue
            later = [order.index(x) for x in own[i + 1:] if x in order]
            if later:
                order.insert(min(later), h)
            else:
                order.append(h)
    return order


def _budget_rows(paths: dict[str, dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    """(label, key path into a path's dict) rows of the budget table, from what the
    paths have: DNS, TCP, TLS, each hop's own time (and upstream setup), the other
    phases, then time to first and last byte."""
    keys: list[str] = []
    for p in paths.values():
        ph = _d(p.get("phases"))
        keys += [k for k, v in ph.items() if _is_block(v) and k not in keys]
    hops = [h for h in _hop_order(paths)
            if any(h in _d(_d(p.get("phases")).get("hops")) for p in paths.values())]
    first = [k for k in ("dns_ms", "tcp_ms", "tls_ms", "quic_ms") if k in keys]
    rows: list[tuple[str, tuple[str, ...]]] = [
        (PHASE_LABELS.get(k, k), ("phases", k)) for k in first]
    for h in hops:
        rows.append((f"hop {h}: own time", ("phases", "hops", h, "own_ms")))
        if any(num(_d(_dig(p, ("phases", "hops", h, "setup_ms"))).get("count"))
               for p in paths.values()):
            rows.append((f"hop {h}: upstream setup", ("phases", "hops", h, "setup_ms")))
    rows += [(PHASE_LABELS.get(k, k), ("phases", k)) for k in keys if k not in first]
    for k, lab in (("ttfb_ms", "Time to first byte"), ("ttlb_ms", "Time to last byte")):
        if any(_is_block(p.get(k)) for p in paths.values()):
            rows.append((lab, (k,)))
    return rows


def _dig(d: object, path: Sequence[str]) -> object:
    for k in path:
        d = _d(d).get(k)
    return d


def _shown_paths(paths: dict[str, dict[str, Any]]) -> tuple[list[str], str]:
    """The names of the paths the page shows (:func:`netdiag.paths.shown.shown_names`),
    in the document's order, and a note on those it leaves out ("" when none)."""

    def requests(n: str) -> int:
        r = paths[n].get("requests")
        return r if isinstance(r, int) and not isinstance(r, bool) else 0

    sizes = [PathSize(n, p.get("inferred") is not False, len(_l(p.get("hops"))) > 1,
                      requests(n)) for n, p in paths.items()]
    keep = shown_names(sizes)
    sentence = not_shown_sentence(sizes, keep)
    return ([n for n in paths if n in keep],
            "" if sentence is None else f'<p class="note">{esc(sentence)}.</p>')


def _paths(doc: dict[str, Any]) -> str:
    s = _d(doc.get("summary"))
    paths = {str(k): _d(v) for k, v in _d(s.get("paths")).items()}
    if not paths:
        return ""
    names, not_shown = _shown_paths(paths)
    paths = {n: paths[n] for n in names}
    head = [("", False)]
    for _ in names:
        head += [("p50", True), ("p99", True)]
    above = ('<tr><th></th>' + "".join(f'<th class="n grp" colspan="2">{clip(n, 48)}</th>'
                                        for n in names) + "</tr>")
    rows: list[list[str | None]] = []
    for lab, fld in (("requests", "requests"), ("connections", "connections")):
        rows.append([esc(lab), *(c for n in names for c in (_int(paths[n].get(fld)), None))])
    rows.append(["connection reuse",
                 *(c for n in names for c in (esc(_pct(paths[n].get("reuse_rate"))), None))])
    for lab, key in _budget_rows(paths):
        cells: list[str | None] = [clip(lab, 60)]
        for n in names:
            b = _d(_dig(paths[n], key))
            cells += [esc(fmt_ms(b.get("p50"))), esc(fmt_ms(b.get("p99")))]
        rows.append(cells)
    hop_names = _hop_order(paths)
    # stacked bars of medians
    bars = []
    for n in names:
        p = paths[n]
        ph = _d(p.get("phases"))
        segs = [Segment("ph-dns", "DNS", num(_d(ph.get("dns_ms")).get("p50")) or 0.0),
                Segment("ph-tcp", "TCP", num(_d(ph.get("tcp_ms")).get("p50")) or 0.0),
                Segment("ph-tls", "TLS", num(_d(ph.get("tls_ms")).get("p50")) or 0.0)]
        hops = _d(ph.get("hops"))
        own = [(h, num(_d(_d(hops.get(h)).get("own_ms")).get("p50"))) for h in hop_names]
        own = [(h, v) for h, v in own if v]
        if own:
            segs += [Segment(f"ph-hop{hop_names.index(h) % 6}", f"hop {h}", v or 0.0)
                     for h, v in own]
        else:
            segs.append(Segment("ph-wait", "time to first byte",
                                num(_d(p.get("ttfb_ms")).get("p50")) or 0.0))
        segs.append(Segment("ph-recv", "transfer",
                            num(_d(ph.get("transfer_ms")).get("p50")) or 0.0))
        bars.append((n, segs))
    legend = [("ph-dns", "DNS"), ("ph-tcp", "TCP"), ("ph-tls", "TLS")]
    drawn = {sg.label for _, segs in bars for sg in segs}
    legend += [(f"ph-hop{i % 6}", f"hop {h} (own)") for i, h in enumerate(hop_names)
               if f"hop {h}" in drawn]
    if any(sg.cls == "ph-wait" for _, segs in bars for sg in segs):
        legend.append(("ph-wait", "time to first byte (no hops known)"))
    legend.append(("ph-recv", "transfer"))
    comp = [c for c in _l(s.get("path_comparison")) if isinstance(c, dict)]
    comp_html = ""
    if comp:
        items = []
        for c in comp:
            sup = c.get("supported")
            badge = _badge("supported", "b-ok") if sup else _badge("inconclusive", "b-muted")
            items.append(f"<li>{badge} {esc(c.get('sentence') or '')}</li>")
        comp_html = ("<h3>Differences between paths</h3>"
                     f'<ul class="cmp">{"".join(items)}</ul>')
    return (
        '<section id="paths"><h2>Latency budget per path</h2>'
        + _table(head, rows, "budget", above) + not_shown
        + '<p class="note">Medians (p50) and p99 per phase, in each path\'s client-facing '
          "requests; a hop's own time is its share of the client's time to first byte.</p>"
        + "<h3>Median budget, phases end to end</h3>"
        + _legend(legend)
        + budget_bars(bars, "median latency budget per path")
        + '<p class="note">Each bar puts the medians of the phases end to end, for scale: '
          "a sum of medians is not the median of sums.</p>"
        + comp_html + "</section>")


# --- load over time and knees --------------------------------------------------------


def _interval_text(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:g}\u202fs"
    return f"{ms:g}\u202fms"


def _load_series(doc: dict[str, Any]) -> list[tuple[str, str, list[Interval], bool]]:
    """(key, shown name, intervals, estimated) of each path of ``timeseries`` with a
    request, in the order of ``summary.paths`` then the document's, requests on no path
    last; empty when no path has :data:`LOAD_MIN_INTERVALS` intervals."""
    out = []
    longest = 0
    for key, series in path_intervals(doc.get("timeseries")):
        longest = max(longest, len(series))
        name = NO_PATH if key in (None, "null") else str(key)
        out.append((str(key), name, series, any(x.estimated for x in series)))
    if longest < LOAD_MIN_INTERVALS:
        return []
    out = [t for t in out if any(x.requests for x in t[2])]    # else nothing to draw
    known = [str(k) for k in _d(_d(doc.get("summary")).get("paths"))]

    def order(item: tuple[str, str, list[Interval], bool]) -> tuple[int, int]:
        k = item[0]
        return (2, 0) if k == "null" else (0, known.index(k)) if k in known else (1, 0)

    return sorted(out, key=order)


def _path_colours(doc: dict[str, Any], keys: Sequence[str]) -> dict[str, int]:
    """The colour of each path: its index in ``summary.paths``, as in the TTFB charts;
    other paths the next free ones; requests on no path grey (``s7``)."""
    known = [str(k) for k in _d(_d(doc.get("summary")).get("paths"))]
    out = {k: i for i, k in enumerate(known)}
    nxt = len(known)
    for k in keys:
        if k == "null":
            out[k] = SERIES - 1
        elif k not in out:
            out[k] = nxt
            nxt += 1
    return out


def _knee_path(k: dict[str, Any]) -> str:
    return "null" if k.get("path") is None else str(k.get("path"))


def _knee_label(k: dict[str, Any], name: str, with_ci: bool = True) -> str:
    metric = str(k.get("metric") or "")
    word = {"ttfb_p99": "p99", "ttfb_p50": "p50"}.get(metric, metric)
    rate = num(k.get("rate_per_s"))
    text = f"{name}: {word} knee at {count_text(rate) if rate is not None else '?'} req/s"
    ci = [num(c) for c in _l(k.get("ci"))]
    if with_ci and len(ci) == 2 and ci[0] is not None and ci[1] is not None:
        text += f" (95% CI {count_text(ci[0])}–{count_text(ci[1])})"
    return text


def _load(doc: dict[str, Any]) -> str:
    """Per path, the request rate and p99/p50 time to first byte over time with its knees
    marked, then every path's p99 against the rate with the knees and their CIs; the
    knee sentences (or why there is none) as text under each path's chart."""
    series = _load_series(doc)
    if not series:
        return ""
    ts = _d(doc.get("timeseries"))
    iv_ms = num(ts.get("interval_ms")) or 0.0
    knees = [k for k in _l(doc.get("knees")) if isinstance(k, dict)]
    declined = _d(ts.get("knee_declined"))
    sparse = {str(x) for x in _l(ts.get("sparse"))}
    colours = _path_colours(doc, [k for k, _, _, _ in series])
    shown, hidden = series[:MAX_LOAD_PATHS], series[MAX_LOAD_PATHS:]
    # the time axis, shared: seconds from the capture's first packet (or the first
    # interval's start when the document has no capture start)
    starts = [x.start for _, _, s, _ in shown for x in s]
    t0 = num(_d(doc.get("capture")).get("first_ts"))
    if t0 is None:
        t0 = num(ts.get("start_ts"))
    if t0 is None:
        t0 = min(starts)
    iv_s = iv_ms / 1000.0
    # downsampled to the pixel width: see svg.bucket_load (mean rate, highest p99, mean
    # p50 per pixel column), so 10,000 intervals draw as ~1,000 steps
    drawn = {key: bucket_load(s, iv_s, TIMELINE_COLS) for key, _, s, _ in shown}
    t_lo = min(0.0, min(starts) - t0)
    t_hi = max(b[-1].end for b, _ in drawn.values()) - t0
    parts = []
    clouds: list[Cloud] = []
    lines: list[KneeLine] = []
    for key, name, s, est in shown:
        idx = colours[key]
        mine = [k for k in knees if _knee_path(k) == key]
        marks = []
        for k in mine:
            rate = num(k.get("rate_per_s"))
            if rate is None:
                continue
            dashed = k.get("metric") == "ttfb_p50"
            ci = [num(c) for c in _l(k.get("ci"))]
            lines.append(KneeLine(_knee_label(k, name), idx, rate,
                                  (ci[0], ci[1]) if len(ci) == 2 and ci[0] is not None
                                  and ci[1] is not None else None, dashed))
            # where the path's rate first reached the knee's
            cross = next((x.start for x in sorted(s, key=lambda x: x.start)
                          if x.rate >= rate), None)
            if cross is not None:
                marks.append(TimeMark(cross - t0, _knee_label(k, name, False)
                                      + f", first reached at {cross - t0:,.1f}\u202fs",
                                      rate, dashed))
        buckets, per = drawn[key]
        clouds.append(Cloud(name, idx, [(x.rate, x.p99) for x in s if x.p99 is not None]))
        peak = max(x.rate for x in s)
        p99s = [x.p99 for x in s if x.p99 is not None]
        facts = [f"{len(s):,} interval{'s' if len(s) != 1 else ''} of "
                 f"{_interval_text(iv_ms)}" if iv_ms else f"{len(s):,} intervals",
                 f"peak {count_text(peak)} req/s"]
        if p99s:
            facts.append(f"p99 time to first byte {fmt_ms(min(p99s))} – {fmt_ms(max(p99s))}")
        if per > 1:
            facts.append(f"drawn {per:,} intervals per pixel column")
        if key in sparse:
            facts.append("only its active intervals are listed")
        if est:
            facts.append("estimated")
        chart = timeline_chart(buckets, idx, t0, t_lo, t_hi,
                               f"request rate and time to first byte over time: {name}",
                               marks)
        items = []
        for k in mine:
            ev = [str(e) for e in _l(k.get("evidence"))]
            items.append(f"<li>{_badge('knee', 'b-warning')} {esc(k.get('sentence') or '')}"
                         + (f'<div class="note">{esc(" · ".join(ev[:12]))}</div>' if ev
                            else "") + "</li>")
        found = {str(k.get("metric")) for k in mine}
        for metric, reason in _d(declined.get(key)).items():
            if str(metric) in found:
                continue
            what = METRIC_WORDS.get(str(metric), str(metric))
            items.append(f"<li>{_badge('no knee', 'b-muted')} {esc(what)}: "
                         f"{esc(reason)}</li>")
        parts.append(f'<h3><i class="sw s{idx % SERIES}"></i> {clip(name, 80)} '
                     f'<span class="note">{esc(" · ".join(facts))}</span></h3>'
                     + chart + (f'<ul class="cmp">{"".join(items)}</ul>' if items else ""))
    more = ""
    if hidden:
        named = [n for _, n, _, _ in hidden[:PATHS_SHOWN]]
        if len(hidden) > len(named):
            named.append(f"and {len(hidden) - len(named):,} more")
        more = ('<p class="note">Not drawn (the first ' f"{MAX_LOAD_PATHS} paths are): "
                + esc(", ".join(named)) + ".</p>")
    shown_keys = {k for k, _, _, _ in shown}
    others = [k for k in knees if _knee_path(k) not in shown_keys]
    if others:
        more += ('<ul class="cmp">' + "".join(
            f"<li>{_badge('knee', 'b-warning')} {esc(k.get('sentence') or '')}</li>"
            for k in others) + "</ul>")
    legend = _legend([(f"s{colours[k] % SERIES}", n) for k, n, _, _ in shown])
    scatter = scatter_chart(clouds, lines, "p99 time to first byte against request rate")
    return ('<section id="load"><h2>Load</h2>'
            '<p class="note" style="margin:0 0 8px">Per path and interval: the requests '
            "per second and the time to first byte of the requests that started in it "
            "(p99 solid, p50 dashed; a blank where an interval had none). A knee is the "
            "request rate above which the time to first byte departs from its low-load "
            "level: a dashed line where the path's rate first reached it. Long series "
            "are drawn one pixel column per few intervals: their mean rate, their highest "
            "p99 and their mean p50.</p>"
            + "".join(parts) + more
            + "<h3>Latency against request rate</h3>" + legend + scatter
            + '<p class="note">One dot per interval with a request (p99 time to first byte '
              "against that interval's request rate); each knee a vertical line at its "
              "rate, its 95% confidence interval shaded.</p></section>")


def _legend(items: Sequence[tuple[str, str]]) -> str:
    return ('<div class="legend">' + "".join(
        f'<span><i class="sw {cls}"></i>{esc(lab)}</span>' for cls, lab in items) + "</div>")


def _ttfb(doc: dict[str, Any], digest: _Digest) -> str:
    summary_paths = {str(k): _d(v) for k, v in _d(_d(doc.get("summary")).get("paths")).items()}
    paths, not_shown = _shown_paths(summary_paths)
    series: list[Series] = []
    if paths:
        by: dict[str, list[float]] = {str(p): [] for p in paths}
        for n, seen in digest.ttfb_by_path.items():
            if not not_shown or n in by:
                by.setdefault(n, []).extend(seen)
        est = digest.estimated_paths
        for i, (n, vals) in enumerate(by.items()):
            if vals:
                series.append(Series(n, vals, i, _series_note(vals, est.get(n, False))))
        what = "per path (client-facing requests)"
    else:
        vals = digest.ttfb
        if vals:
            series.append(Series("all requests", vals, 0,
                                 _series_note(vals, digest.any_estimated)))
        what = "over all requests (no paths attributed)"
    if not series:
        return ('<section id="ttfb"><h2>Time to first byte</h2>'
                "<p>No request with a measured time to first byte.</p></section>")
    allv = [v for s in series for v in s.values]
    hists = "".join(histogram(s, allv, f"histogram of time to first byte: {s.name}")
                    for s in series)
    return ('<section id="ttfb"><h2>Time to first byte</h2>'
            f'<p class="note" style="margin:0 0 8px">Distribution {esc(what)}: the '
            "share of requests answered within a time (CDF), then histograms on the same "
            "axis.</p>"
            + cdf_chart(series, "cumulative distribution of time to first byte")
            + f'<div class="grid2">{hists}</div>{not_shown}</section>')


def _series_note(vals: list[float], estimated: bool) -> str:
    v = sorted(vals)

    def q(p: float) -> float:
        k = (len(v) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    note = f"n={len(v)} · p50 {fmt_ms(q(0.5))} · p99 {fmt_ms(q(0.99))}"
    return note + (" · estimated" if estimated else "")


# --- waterfall ---------------------------------------------------------------------


def _conn_waterfall(c: dict[str, Any], dns: dict[str, Any] | None, draw: bool = True
                    ) -> tuple[float, list[Row]] | None:
    """(slowness key, rows) of one connection, or None when it has nothing to draw. The key
    is its setup (DNS + TCP + TLS) plus its slowest request's time to last byte. Without
    ``draw``, the key alone (no rows): the report draws only the slowest connections."""
    conn_ts = num(c.get("ts"))
    reqs = [(i, r) for i, r in enumerate(_l(c.get("requests")))
            if isinstance(r, dict) and num(r.get("ts")) is not None]
    reqs.sort(key=lambda t: t[1]["ts"])
    seen = handshake_seen(c)
    tcp = num(c.get("handshake_rtt_ms"))
    tls = num(_d(c.get("tls")).get("handshake_ms"))
    dns_ts = num(dns.get("ts")) if dns else None
    dns_ms = num(dns.get("latency_ms")) if dns else None
    starts = [t for t in (dns_ts, conn_ts if seen else None) if t is not None]
    if reqs:
        starts.append(reqs[0][1]["ts"])
    if not starts:
        return None
    if not reqs and not c.get("tls"):
        return None          # a bare TCP connection (DNS over TCP...): the table has it
    t0 = min(starts)
    key = _waterfall_key(reqs, seen and conn_ts is not None,
                         dns_ms if dns and dns_ts is not None else None, tcp, tls)
    if not draw:
        return key, []

    def rel(ts: float) -> float:
        return (ts - t0) * 1000.0

    rows: list[Row] = []
    if seen and conn_ts is not None:
        setup = Row("connection setup", cls="setup")
        if dns and dns_ts is not None and dns_ms is not None:
            setup.bars.append(Bar(rel(dns_ts), rel(dns_ts) + dns_ms, "ph-dns",
                                  f"DNS {dns.get('qname')} {dns.get('qtype')}: "
                                  f"{fmt_ms(dns_ms)}"))
        x = rel(conn_ts)
        if dns_ts is not None and dns_ms is not None and x - (rel(dns_ts) + dns_ms) > 0:
            setup.bars.append(Bar(rel(dns_ts) + dns_ms, x, "", "client idle between the DNS "
                                  f"answer and the SYN: {fmt_ms(x - rel(dns_ts) - dns_ms)}",
                                  gap=True))
        if tcp is not None:
            setup.bars.append(Bar(x, x + tcp, "ph-tcp", f"TCP handshake: {fmt_ms(tcp)}"))
            x += tcp
        if tls is not None:
            setup.bars.append(Bar(x, x + tls, "ph-tls", f"TLS handshake: {fmt_ms(tls)}"))
            x += tls
        parts = [f"{lab} {fmt_ms(v)}" for lab, v in (("DNS", dns_ms), ("TCP", tcp),
                                                     ("TLS", tls)) if v is not None]
        setup.note = " + ".join(parts)
        if reqs and rel(reqs[0][1]["ts"]) > x:
            setup.bars.append(Bar(x, rel(reqs[0][1]["ts"]), "", "between the end of the "
                                  "handshake and the first request: "
                                  f"{fmt_ms(rel(reqs[0][1]['ts']) - x)}", gap=True))
        rows.append(setup)
    for i, r in reqs[:MAX_WATERFALL_ROWS]:
        ts = r["ts"]
        send = max(num(r.get("send_ms")) or 0.0, 0.0)
        ttfb, ttlb = num(r.get("ttfb_ms")), num(r.get("ttlb_ms"))
        row = Row(_req_label(r, i), cls="dim" if r.get("estimated") else "")
        x = rel(ts)
        if send > 0:
            row.bars.append(Bar(x, x + send, "ph-send", f"send: {fmt_ms(send)}"))
        if ttfb is not None:
            row.bars.append(Bar(x + send, x + max(ttfb, send), "ph-wait",
                                f"waiting for the first byte: {fmt_ms(ttfb)} after the "
                                "request started"))
            if ttlb is not None and ttlb > ttfb:
                row.bars.append(Bar(x + ttfb, x + ttlb, "ph-recv",
                                    f"transfer: {fmt_ms(ttlb - ttfb)}"))
        gaps = [v for g in _l(r.get("chunk_gaps_ms")) for v in (num(g),) if v is not None]
        if gaps and ttfb is not None:
            first = num(r.get("first_event_ms"))
            if first is not None:
                t = first
                marks = [t]
                for g in gaps:
                    t += g
                    marks.append(t)
            else:           # anchor the last chunk at the last byte
                t = ttlb if ttlb is not None else ttfb + sum(gaps)
                marks = [t]
                for g in reversed(gaps):
                    t -= g
                    marks.append(t)
            row.ticks = [x + m for m in marks]
        bits = []
        if ttfb is not None:
            bits.append(f"TTFB {fmt_ms(ttfb)}")
        if ttlb is not None and ttfb is not None and ttlb - ttfb >= 0.5:
            bits.append(f"total {fmt_ms(ttlb)}")
        if r.get("sse_events"):
            bits.append(f"{num(r.get('sse_events')) or 0:.0f} events")
        if r.get("reset"):
            bits.append(f"reset {r.get('reset')}")
        row.note = " · ".join(bits)
        rows.append(row)
    if len(reqs) > MAX_WATERFALL_ROWS:
        rows.append(Row(f"… {len(reqs) - MAX_WATERFALL_ROWS} more requests", cls="dim"))
    return key, rows


def _waterfall_key(reqs: list[tuple[int, dict[str, Any]]], setup: bool, dns_ms: float | None,
                   tcp: float | None, tls: float | None) -> float:
    """:func:`_conn_waterfall`'s key: the setup shown (DNS, TCP, TLS) plus the slowest
    drawn request's time to its last byte (else first byte)."""
    setup_ms = 0.0
    if setup:
        for v in (dns_ms, tcp, tls):
            if v is not None:
                setup_ms += v
    worst = 0.0
    for _i, r in reqs[:MAX_WATERFALL_ROWS]:
        ttlb = num(r.get("ttlb_ms"))
        end = ttlb if ttlb is not None else num(r.get("ttfb_ms"))
        worst = max(worst, end or 0.0)
    return setup_ms + worst


def _conn_title(c: dict[str, Any], n_req: int) -> str:
    tls = _d(c.get("tls"))
    bits = [f"<b>{esc(c.get('id'))}</b>",
            f'<span class="mono">{esc(c.get("client"))} → {esc(c.get("server"))}</span>']
    if tls.get("sni"):
        bits.append(esc(tls.get("sni")))
    proto = [str(x) for x in (tls.get("version"), c.get("protocol")) if x and x != "tls"]
    if proto:
        bits.append(esc(" ".join(proto)))
    if tls.get("resumed"):
        bits.append("resumed")
    p = c.get("path")
    if isinstance(p, dict) and p.get("name") is not None:
        bits.append(f"path {esc(p.get('name'))}/{esc(p.get('hop'))}")
    bits.append(f"{n_req} request{'s' if n_req != 1 else ''}")
    if c.get("close"):
        bits.append(f'<span class="m">closed: {esc(c.get("close"))}</span>')
    if any(isinstance(r, dict) and r.get("estimated") for r in _l(c.get("requests"))):
        bits.append(_badge("estimated", "b-est"))
    return " · ".join(bits)


def _waterfalls(digest: _Digest, dns_of: dict[str, dict[str, Any]]) -> str:
    total = digest.waterfalls.added
    shown = []
    for order, c in sorted(digest.waterfalls.best(), key=lambda t: t[0]):
        w = _conn_waterfall(c, dns_of.get(str(c.get("id"))))
        assert w is not None  # drawn: it had something to draw
        shown.append((w[0], order, c, w[1]))
    legend = _legend([("ph-dns", "DNS lookup"), ("ph-tcp", "TCP handshake"),
                      ("ph-tls", "TLS handshake"), ("ph-send", "request upload"),
                      ("ph-wait", "waiting for the first byte"),
                      ("ph-recv", "transfer to the last byte")])
    legend = legend.replace("</div>", '<span><i class="sw tk"></i>streamed chunk / '
                            "event</span></div>", 1)
    if not shown:
        return ('<section id="waterfall"><h2>Waterfall per connection</h2>'
                "<p>No connection with requests or a captured handshake.</p></section>")
    parts = []
    for i, (_, _, c, rows) in enumerate(shown):
        n_req = len([r for r in _l(c.get("requests")) if isinstance(r, dict)])
        chart = waterfall(rows, f"waterfall of connection {c.get('id')}")
        op = " open" if i < OPEN_WATERFALLS else ""
        parts.append(f'<details class="conn"{op}><summary>{_conn_title(c, n_req)}</summary>'
                     f"{chart}</details>")
    note = ("" if total <= MAX_WATERFALLS else
            f'<p class="note">Showing the {MAX_WATERFALLS} slowest of {total} connections '
            "(setup plus their slowest request), in order of start; every connection is in "
            "the table below.</p>")
    return ('<section id="waterfall"><h2>Waterfall per connection</h2>' + legend
            + '<p class="note" style="margin:0 0 6px">Each chart starts at the connection\'s '
              "DNS query (the lookup whose answer holds the server address, just before the "
              "SYN) or its SYN; TLS is drawn from the end of the TCP handshake. Streamed "
              "chunks are placed from the gaps between them (from the first event, else back "
              "from the last byte).</p>"
            + note + "".join(parts) + "</section>")


# --- tables --------------------------------------------------------------------------


def _slowest(doc: dict[str, Any], digest: _Digest) -> str:
    total = digest.slowest.added
    if not total:
        return ""
    reqs = digest.slowest.best()
    t0 = num(_d(doc.get("capture")).get("first_ts"))
    head = [("start", True), ("conn.", False), ("request", False), ("authority", False),
            ("status", True), ("TTFB", True), ("total", True), ("response", True)]
    # headers column: "request + response" header counts, unfolded on click
    with_paths = digest.slowest_on_path
    if with_paths:
        head.append(("path", False))
    with_headers = digest.slowest_with_headers
    if with_headers:
        head.append(("headers", False))
    rows = []
    for c, i, r in reqs:
        label = clip(_req_label(r, i, mark=False), 80)
        if r.get("estimated"):
            label += " " + _badge("estimated", "b-est")
        rows.append([esc(_rel(r.get("ts"), t0)), esc(c.get("id")),
                     f'<span class="mono">{label}</span>',
                     clip(r.get("authority") or _d(c.get("tls")).get("sni") or "", 60),
                     esc(r.get("status") if r.get("status") is not None else "–"),
                     esc(fmt_ms(r.get("ttfb_ms"))), esc(fmt_ms(r.get("ttlb_ms"))),
                     esc(_bytes(r.get("response_bytes")))]
                    + ([esc(_path_name(c) or "–")] if with_paths else [])
                    + ([_headers_cell(r)] if with_headers else []))
    return ('<section id="slowest"><h2>Slowest requests</h2>'
            f'<p class="note" style="margin:0 0 8px">The {len(reqs)} '
            f"longest times to first byte of {total} requests.</p>"
            + _table(head, rows) + "</section>")


def _headers_cell(r: dict[str, Any]) -> str:
    """Decoded headers, folded: request then response."""
    parts = []
    for what, key in (("request", "request_headers"), ("response", "response_headers")):
        hs = [h for h in _l(r.get(key)) if isinstance(h, list | tuple) and len(h) == 2]
        if hs:
            rows = "".join(f"<tr><th>{clip(n, 60)}</th><td>{clip(v, 300)}</td></tr>"
                           for n, v in hs[:60])
            parts.append(f'<div class="hk">{what}</div><table class="hdrs">{rows}</table>')
    if not parts:
        return "–"
    n_req, n_resp = len(_l(r.get("request_headers"))), len(_l(r.get("response_headers")))
    return (f'<details class="hd"><summary>{n_req} + {n_resp}</summary>{"".join(parts)}'
            "</details>")


def _dns_table(doc: dict[str, Any]) -> str:
    recs: list[dict[str, Any]] = []  # the first MAX_TABLE_ROWS
    total = 0
    for d in _records(doc.get("dns")):
        if isinstance(d, dict):
            total += 1
            if len(recs) < MAX_TABLE_ROWS:
                recs.append(d)
    t0 = num(_d(doc.get("capture")).get("first_ts"))
    head = [("start", True), ("name", False), ("type", False), ("rcode", False),
            ("answers", False), ("latency", True), ("server", False), ("via", False),
            ("retrans.", True)]
    rows = []
    for d in recs:
        answers = [str(a) for a in _l(d.get("answers"))]
        ans = ", ".join(answers[:6]) + (f" +{len(answers) - 6}" if len(answers) > 6 else "")
        ans = ans or "–"
        lat = fmt_ms(d.get("latency_ms")) if num(d.get("latency_ms")) is not None else (
            "unanswered")
        rows.append([esc(_rel(d.get("ts"), t0)), f'<span class="mono">{clip(d.get("qname"), 80)}'
                     "</span>", esc(d.get("qtype")), esc(d.get("rcode") or "–"),
                     f'<span class="mono">{clip(ans, 160)}</span>', esc(lat),
                     f'<span class="mono">{esc(d.get("server"))}</span>',
                     esc(d.get("transport")), _int(d.get("retransmissions"))])
    more = (f'<p class="note">Showing {MAX_TABLE_ROWS} of {total} transactions; the '
            "CSV and JSON reports have them all.</p>" if total > MAX_TABLE_ROWS else "")
    body = _table(head, rows) if rows else "<p>No DNS transaction in the capture.</p>"
    return f'<section id="dns"><h2>DNS</h2>{body}{more}</section>'


def _conn_table(doc: dict[str, Any], digest: _Digest) -> str:
    t0 = num(_d(doc.get("capture")).get("first_ts"))
    head = [("id", False), ("start", True), ("client → server", False), ("SNI", False),
            ("TLS", False), ("protocol", False), ("path", False), ("TCP RTT", True),
            ("TLS hs", True), ("req.", True), ("bytes ↑ / ↓", True), ("retr. / rst", True),
            ("close", False)]
    rows = []
    for c in digest.table:
        tls = _d(c.get("tls"))
        tv = esc(tls.get("version") or ("–" if not tls else "?"))
        if tls.get("resumed"):
            tv += " " + _badge("resumed", "b-muted")
        if tls and not tls.get("decrypted"):
            tv += " " + _badge("no key", "b-muted")
        p = c.get("path")
        pth = (f"{esc(p.get('name'))}/{esc(p.get('hop'))}" if isinstance(p, dict)
               and p.get("name") is not None else "–")
        if isinstance(p, dict) and p.get("evidence"):
            ev = "; ".join(str(e) for e in _l(p.get("evidence")))
            pth = f'<span title="{esc(ev)}">{pth}</span>'
        rows.append([
            esc(c.get("id")), esc(_rel(c.get("ts"), t0)),
            f'<span class="mono nw">{esc(c.get("client"))} → {esc(c.get("server"))}</span>',
            clip(tls.get("sni") or "–", 60), tv, esc(c.get("protocol") or "–"), pth,
            esc(fmt_ms(c.get("handshake_rtt_ms"))), esc(fmt_ms(tls.get("handshake_ms"))),
            _int(len([r for r in _l(c.get("requests")) if isinstance(r, dict)])),
            f"{esc(_bytes(c.get('bytes_to_server')))} / {esc(_bytes(c.get('bytes_to_client')))}",
            f"{_int(c.get('retransmissions'))} / {_int(c.get('resets'))}",
            esc(c.get("close") or "–")])
    total = digest.connections
    more = (f'<p class="note">Showing {MAX_TABLE_ROWS} of {total} connections; the '
            "CSV and JSON reports have them all.</p>" if total > MAX_TABLE_ROWS else "")
    body = _table(head, rows) if rows else "<p>No TCP connection in the capture.</p>"
    return f'<section id="connections"><h2>Connections</h2>{body}{more}</section>'


def _servers_text(digest: _Digest) -> str:
    ips = digest.servers
    return f"{len(ips)} server address{'es' if len(ips) != 1 else ''}"


def render_html(doc: dict[str, Any], *, title: str | None = None,
                dns_of: dict[str, dict[str, Any]] | None = None) -> str:
    """The whole report as one HTML document (a string; write it as UTF-8). ``dns_of``:
    what :func:`~netdiag.report.har.attribute_dns` gives for ``doc``, where the caller
    has it cheaper."""
    if dns_of is None:
        dns_of = attribute_dns(doc)
    digest = _Digest(doc, dns_of)
    files = [str(f) for f in _l(_d(doc.get("capture")).get("files"))]
    if title is None:
        names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in files]
        title = "netdiag report — " + (", ".join(names) or "capture")
    body = [
        _header(doc, title),
        '<main class="wrap">',
        _summary(doc), _groups(doc), _findings(doc), _paths(doc), _load(doc),
        _ttfb(doc, digest), _waterfalls(digest, dns_of), _slowest(doc, digest),
        _dns_table(doc), _conn_table(doc, digest),
        f"<footer>netdiag {esc(doc.get('netdiag_version'))} · report contract "
        f"{esc(doc.get('contract'))} · {esc(_servers_text(digest))} · times are capture "
        "timestamps; durations in milliseconds unless marked.</footer>",
        "</main>",
    ]
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="referrer" content="no-referrer">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")
