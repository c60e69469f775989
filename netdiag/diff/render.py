"""Writing a :func:`netdiag.diff.compare.compare` result: terminal, JSON, or one HTML page.

Latencies going up are drawn red with ``↑``, going down green with ``↓`` (for
connection reuse the other way round); a delta whose test says it is within noise is
drawn dim. Every string that comes from a capture or a report (file names, path names,
finding titles) is escaped: rich markup is never interpreted in it, and the HTML page
escapes it and forbids scripts outright (``Content-Security-Policy``), loads nothing
from the network and carries its CSS inline.
"""

from __future__ import annotations

import html
import json
import math
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from netdiag.textsafe import SENTENCE_LIMIT, safe_text

UP, DOWN, SAME = "↑", "↓", "="


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def fmt_ms(v: Any) -> str:
    if not _num(v):
        return "–"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v / 1000:.2f} s"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_delta(v: Any) -> str:
    if not _num(v):
        return "–"
    return ("+" if v > 0 else "−" if v < 0 else "±") + fmt_ms(abs(v))


def fmt_pct(v: Any) -> str:
    return f"{v * 100:.1f}%" if _num(v) else "–"


def arrow(delta: Any) -> str:
    if not _num(delta) or delta == 0:
        return SAME
    return UP if delta > 0 else DOWN


def tone(delta: Any, significant: Any, higher_is_worse: bool = True) -> str:
    """``worse``, ``better``, ``noise`` or ``none``: how a delta should look."""
    if not _num(delta) or delta == 0:
        return "none"
    if significant is not True:
        return "noise"
    worse = delta > 0 if higher_is_worse else delta < 0
    return "worse" if worse else "better"


def _plain(v: Any) -> str:
    return "–" if v is None else str(v)


def _ci(m: dict[str, Any] | None) -> str:
    if not m:
        return "–"
    return (f"{fmt_delta(m.get('estimate'))} [{fmt_delta(m.get('ci_low'))}, "
            f"{fmt_delta(m.get('ci_high'))}]")


def _side(d: dict[str, Any]) -> str:
    bits = [str(d.get("label"))]
    if _num(d.get("packets")):
        bits.append(f"{d['packets']} packets")
    if _num(d.get("duration_ms")):
        bits.append(f"{d['duration_ms'] / 1000:.2f} s")
    if d.get("engine") and d.get("engine") != "netdiag":
        bits.append(f"engine {d['engine']}")
    if d.get("truncated"):
        bits.append("TRUNCATED")
    return ", ".join(bits)


# ----------------------------------------------------------------------------- terminal


STYLES = {"worse": "bold red", "better": "bold green", "noise": "dim", "none": ""}


SHORT = {"dns.latency_ms": "DNS", "tcp.handshake_rtt_ms": "TCP handshake",
         "tls.handshake_ms": "TLS handshake", "http.ttfb_ms": "TTFB", "http.ttlb_ms": "TTLB",
         "resp.latency_ms": "Redis command"}


def _pair_cell(a: dict[str, Any], b: dict[str, Any], key: str, delta: Any,
               significant: Any) -> Text:
    t = Text(f"{fmt_ms(a.get(key))} → {fmt_ms(b.get(key))}\n")
    t.append(f"{arrow(delta)} {fmt_delta(delta)}", style=STYLES[tone(delta, significant)])
    return t


def _label(m: dict[str, Any]) -> Text:
    name = SHORT.get(str(m.get("metric")),
                     str(m.get("label")).replace(" time to first byte", " TTFB"))
    label = Text(name)
    est = m.get("estimated") or {}
    if est.get("a") or est.get("b"):
        label.append("*", style="yellow")
    return label


def render_text(result: dict[str, Any], console: Console) -> None:
    """The comparison for a terminal (fits 80 columns)."""
    from rich import box

    console.print(Text("netdiag diff", style="bold"))
    console.print(Text("A: ") + Text(safe_text(_side(result["a"]), SENTENCE_LIMIT)))
    console.print(Text("B: ") + Text(safe_text(_side(result["b"]), SENTENCE_LIMIT)))
    rows = list(result["latency"]) + [p["ttfb"] for p in result.get("paths") or []]
    table = Table(title="Latency percentiles, ms (A → B, delta B − A)", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("", max_width=24, overflow="fold")
    table.add_column("n A→B", no_wrap=True)
    for col in ("p50", "p90", "p99"):
        table.add_column(col, no_wrap=True, justify="right", min_width=13)
    for m in rows:
        sig = m.get("significant")
        table.add_row(_label(m), f"{m.get('n_a')}→{m.get('n_b')}",
                      *(_pair_cell(m["a"], m["b"], k, m["delta"].get(k), sig)
                        for k in ("p50", "p90", "p99")))
    console.print(table)
    tests = Table(title=f"Bigger than the noise? (Mann-Whitney U, α={result['alpha']}; "
                        f"95% bootstrap CI, seed {result['seed']})", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    tests.add_column("", max_width=24, overflow="fold")
    tests.add_column("median Δ [95% CI] ms", no_wrap=True)
    tests.add_column("verdict")
    for m in rows:
        sig = m.get("significant")
        est = (m.get("median_diff") or {}).get("estimate")
        tests.add_row(_label(m), _ci(m.get("median_diff")),
                      Text(str(m.get("verdict")), style=STYLES[tone(est, sig)] if sig
                           else "dim"))
    console.print(tests)
    if any((m.get("estimated") or {}).get(s) for m in rows for s in ("a", "b")):
        console.print(Text("* includes requests estimated from encrypted records (no key "
                           "log): a guess, see docs/report.md", style="yellow"))
    r = result["reuse"]
    line = Text("Connection reuse: ")
    line.append(f"{fmt_pct(r['a'].get('rate'))} ({r['a']['requests']} requests on "
                f"{r['a']['connections']} connections) → {fmt_pct(r['b'].get('rate'))} "
                f"({r['b']['requests']} on {r['b']['connections']}) ")
    d = r.get("delta")
    line.append(f"{arrow(d)}{'' if not _num(d) else f'{d * 100:+.1f} pts'} ",
                style=STYLES[tone(d, r.get("significant"), higher_is_worse=False)])
    line.append(str(r.get("verdict")), style="dim" if not r.get("significant") else "")
    console.print(line)
    counts = Table(title="Counts", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("", "A", "B", "Δ"):
        counts.add_column(col, justify="left" if not col else "right")
    for c in result["counts"]:
        delta = c.get("delta")
        counts.add_row(str(c["label"]), _plain(c.get("a")), _plain(c.get("b")),
                       Text(f"{delta:+d}" if isinstance(delta, int) and delta else
                            ("0" if delta == 0 else "–"),
                            style="yellow" if delta else ""))
    console.print(counts)
    paths = result.get("paths") or []
    if paths:
        pt = Table(title="Paths", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("path", "requests A→B", "reuse A→B", "TTFB p50 A→B", "verdict"):
            pt.add_column(col)
        for p in paths:
            m = p["ttfb"]
            pt.add_row(Text(safe_text(p["name"])),
                       f"{p['requests'].get('a', '–')}→{p['requests'].get('b', '–')}",
                       f"{fmt_pct(p['reuse_rate'].get('a'))}→{fmt_pct(p['reuse_rate'].get('b'))}",
                       _pair_cell(m["a"], m["b"], "p50", m["delta"].get("p50"),
                                  m.get("significant")),
                       Text(str(m.get("verdict"))))
        console.print(pt)
    f = result["findings"]
    console.print(Text("Findings", style="bold"))
    if not (f["appeared"] or f["gone"] or f["unchanged"]):
        console.print(Text("  none on either side", style="dim"))
    for e in f["appeared"]:
        console.print(Text("  + appeared: ", style="red") +
                      Text(safe_text(f"[{e.get('severity')}] {e.get('code')}: {e.get('title')}",
                                     SENTENCE_LIMIT)))
    for e in f["gone"]:
        console.print(Text("  − gone:     ", style="green") +
                      Text(safe_text(f"[{e.get('severity')}] {e.get('code')}: {e.get('title')}",
                                     SENTENCE_LIMIT)))
    for e in f["unchanged"]:
        console.print(Text("  = still:    ", style="dim") +
                      Text(safe_text(f"[{e.get('severity')}] {e.get('code')}: {e.get('title_b')}",
                                     SENTENCE_LIMIT)))


# ----------------------------------------------------------------------------- JSON


def render_json(result: dict[str, Any], out: IO[str]) -> None:
    json.dump(result, out, indent=2, allow_nan=False)
    out.write("\n")


# ----------------------------------------------------------------------------- HTML


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:70em;color:#1d2330;background:#fff;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em}
.sides{color:#444}.sides b{display:inline-block;width:1.5em}
table{border-collapse:collapse;margin:.5em 0;width:100%}
th,td{padding:.3em .6em;border-bottom:1px solid #e3e6ec;text-align:left;vertical-align:top}
th{background:#f4f6f9;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.worse{color:#b3261e;font-weight:600}.better{color:#1b7f3b;font-weight:600}
.noise{color:#8a8f98}.none{color:#555}
.tag{font-size:.8em;padding:.05em .4em;border-radius:.3em;background:#fff4d6;color:#7a5600}
.note{color:#666;font-size:.9em}
li{margin:.2em 0}
"""


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _html_pair(a: dict[str, Any], b: dict[str, Any], key: str, delta: Any,
               significant: Any, higher_is_worse: bool = True) -> str:
    cls = tone(delta, significant, higher_is_worse)
    return (f'<td class="n">{_e(fmt_ms(a.get(key)))} → {_e(fmt_ms(b.get(key)))} '
            f'<span class="{cls}">{_e(arrow(delta))}{_e(fmt_delta(delta))}</span></td>')


def _html_latency_row(m: dict[str, Any]) -> str:
    sig = m.get("significant")
    est = m.get("estimated") or {}
    tag = ' <span class="tag">estimated</span>' if est.get("a") or est.get("b") else ""
    cls = tone((m.get("median_diff") or {}).get("estimate"), sig) if sig else "noise"
    cells = "".join(_html_pair(m["a"], m["b"], k, m["delta"].get(k), sig)
                    for k in ("p50", "p90", "p99"))
    return (f"<tr><td>{_e(m.get('label'))}{tag}</td>"
            f'<td class="n">{_e(m.get("n_a"))}→{_e(m.get("n_b"))}</td>{cells}'
            f'<td class="n">{_e(_ci(m.get("median_diff")))}</td>'
            f'<td class="{cls}">{_e(m.get("verdict"))}</td></tr>')


def render_html(result: dict[str, Any]) -> str:
    """One self-contained page (no script, nothing loaded from elsewhere)."""
    a, b = result["a"], result["b"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'style-src \'unsafe-inline\'">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>netdiag diff: {_e(a['label'])} vs {_e(b['label'])}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>netdiag diff</h1>",
        f'<p class="sides"><b>A</b>{_e(_side(a))}<br><b>B</b>{_e(_side(b))}</p>',
        f'<p class="note">Deltas are B − A. Significance: two-sided Mann-Whitney U test on '
        f'the per-item values at α={_e(result["alpha"])}; interval: 95% bootstrap of the '
        f'difference of medians (seed {_e(result["seed"])}). Red: slower (or less reuse), '
        f"green: faster (or more reuse), grey: within noise.</p>",
        "<h2>Latency (ms)</h2><table><thead><tr><th></th><th>n A→B</th><th>p50</th>"
        "<th>p90</th><th>p99</th><th>median Δ [95% CI]</th><th>verdict</th></tr></thead>"
        "<tbody>",
    ]
    parts += [_html_latency_row(m) for m in result["latency"]]
    parts.append("</tbody></table>")
    r = result["reuse"]
    d = r.get("delta")
    cls = tone(d, r.get("significant"), higher_is_worse=False)
    delta_text = f"{d * 100:+.1f} pts" if _num(d) else "–"
    parts.append(
        "<h2>Connection reuse</h2><table><thead><tr><th></th><th>A</th><th>B</th><th>Δ</th>"
        "<th>verdict</th></tr></thead><tbody>"
        f'<tr><td>reuse rate</td><td class="n">{_e(fmt_pct(r["a"].get("rate")))} '
        f'({_e(r["a"]["requests"])} requests / {_e(r["a"]["connections"])} connections)</td>'
        f'<td class="n">{_e(fmt_pct(r["b"].get("rate")))} ({_e(r["b"]["requests"])} / '
        f'{_e(r["b"]["connections"])})</td>'
        f'<td class="n"><span class="{cls}">{_e(arrow(d))}{_e(delta_text)}</span></td>'
        f'<td>{_e(r.get("verdict"))}</td></tr></tbody></table>')
    parts.append("<h2>Counts</h2><table><thead><tr><th></th><th>A</th><th>B</th><th>Δ</th>"
                 "</tr></thead><tbody>")
    for c in result["counts"]:
        delta = c.get("delta")
        parts.append(f'<tr><td>{_e(c["label"])}</td><td class="n">{_e(c.get("a"))}</td>'
                     f'<td class="n">{_e(c.get("b"))}</td><td class="n">'
                     f'{_e(f"{delta:+d}" if isinstance(delta, int) else "–")}</td></tr>')
    parts.append("</tbody></table>")
    paths = result.get("paths") or []
    if paths:
        parts.append("<h2>Paths</h2><table><thead><tr><th>path</th><th>requests A→B</th>"
                     "<th>reuse A→B</th><th>TTFB p50</th><th>TTFB p90</th><th>verdict</th>"
                     "</tr></thead><tbody>")
        for p in paths:
            m = p["ttfb"]
            sig = m.get("significant")
            parts.append(
                f'<tr><td>{_e(p["name"])}</td><td class="n">{_e(p["requests"].get("a"))}→'
                f'{_e(p["requests"].get("b"))}</td><td class="n">'
                f'{_e(fmt_pct(p["reuse_rate"].get("a")))}→'
                f'{_e(fmt_pct(p["reuse_rate"].get("b")))}</td>'
                + _html_pair(m["a"], m["b"], "p50", m["delta"].get("p50"), sig)
                + _html_pair(m["a"], m["b"], "p90", m["delta"].get("p90"), sig)
                + f'<td>{_e(m.get("verdict"))}</td></tr>')
        parts.append("</tbody></table>")
    f = result["findings"]
    parts.append("<h2>Findings</h2><ul>")
    if not (f["appeared"] or f["gone"] or f["unchanged"]):
        parts.append('<li class="noise">none on either side</li>')
    for e in f["appeared"]:
        parts.append(f'<li><span class="worse">appeared</span> [{_e(e.get("severity"))}] '
                     f'<code>{_e(e.get("code"))}</code>: {_e(e.get("title"))}</li>')
    for e in f["gone"]:
        parts.append(f'<li><span class="better">gone</span> [{_e(e.get("severity"))}] '
                     f'<code>{_e(e.get("code"))}</code>: {_e(e.get("title"))}</li>')
    for e in f["unchanged"]:
        parts.append(f'<li><span class="noise">still</span> [{_e(e.get("severity"))}] '
                     f'<code>{_e(e.get("code"))}</code>: {_e(e.get("title_b"))}</li>')
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"
