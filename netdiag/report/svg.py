"""Inline SVG charts for the HTML report, drawn in Python (no script, no external file).

Every text that reaches a chart goes through :func:`esc`, in ``<text>``, ``<title>``
and attributes alike. Colours come from CSS classes (``ph-*`` for timing phases,
``s0``...``s7`` for series) that the page's stylesheet defines, so that a chart follows
the page's light or dark theme; nothing from the data chooses a class or a colour.
"""

from __future__ import annotations

import html
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SERIES = 8
"""Series colour classes ``s0``..``s7`` (then they repeat)."""

_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029"
                     "\u202a-\u202e\u2060-\u2069\ufeff]")


def esc(v: object) -> str:
    """Text for HTML or SVG, in content and in quoted attributes: ``html.escape`` with
    quotes, after control, bidirectional-override and zero-width characters are shown
    as ``\\uXXXX`` (so that a hostile name cannot reorder or hide what is displayed)."""
    s = "" if v is None else str(v)
    s = _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    return html.escape(s, quote=True)


def clip(v: object, n: int) -> str:
    """At most ``n`` characters (an ellipsis marks the cut); escape the result."""
    s = "" if v is None else str(v)
    return esc(s if len(s) <= n else s[: max(n - 1, 1)] + "…")


def num(v: object) -> float | None:
    """A finite number from a document value, else None (strings are never numbers)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def fmt_ms(v: object, unit: bool = True) -> str:
    """Milliseconds for people: ``0.031 ms``, ``4.17 ms``, ``24.3 ms``, ``243 ms``, ``1.24 s``."""
    x = num(v)
    if x is None:
        return "–"
    a = abs(x)
    if a >= 1000:
        s, u = f"{x / 1000:.2f}", "s"
    elif a >= 100:
        s, u = f"{x:.0f}", "ms"
    elif a >= 10:
        s, u = f"{x:.1f}", "ms"
    elif a >= 1:
        s, u = f"{x:.2f}", "ms"
    else:
        s, u = f"{x:.3f}", "ms"
    return f"{s}\u202f{u}" if unit else s


def _f(x: float) -> str:
    """A coordinate: two decimals, no trailing zeros."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def nice_step(span: float, target: int = 6) -> float:
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    step = nice_step(hi - lo, target)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 10))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks per decade covering [lo, hi] (lo > 0)."""
    out: list[float] = []
    e = math.floor(math.log10(lo))
    while True:
        for m in (1, 2, 5):
            t = m * 10.0 ** e
            if t >= lo / 1.0000001 and t <= hi * 1.0000001:
                out.append(t)
            if t > hi:
                return out or [lo, hi]
        e += 1


@dataclass
class Scale:
    """Maps a domain to pixels, linearly or on a log10 axis."""

    lo: float
    hi: float
    px0: float
    px1: float
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            a, b, x = math.log10(self.lo), math.log10(self.hi), math.log10(v)
        else:
            a, b, x = self.lo, self.hi, v
        if b == a:
            return self.px0
        return self.px0 + (x - a) / (b - a) * (self.px1 - self.px0)

    def ticks(self) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi)
        return [t for t in nice_ticks(self.lo, self.hi) if self.lo - 1e-9 <= t <= self.hi + 1e-9]


def ms_scale(values: Sequence[float], px0: float, px1: float) -> Scale:
    """An x scale for latencies: log10 when they span more than two decades."""
    pos = [v for v in values if v > 0]
    if not values:
        return Scale(0.0, 1.0, px0, px1)
    lo, hi = min(values), max(values)
    if pos and len(pos) == len(values) and hi / min(pos) > 100:
        lo_t = 10 ** math.floor(math.log10(min(pos)))
        hi_t = 10 ** math.ceil(math.log10(hi))
        return Scale(lo_t, hi_t, px0, px1, log=True)
    ticks = nice_ticks(0.0 if lo >= 0 and lo < (hi - lo) else lo, hi)
    return Scale(ticks[0], ticks[-1], px0, px1)


def svg_open(width: int, height: int, label: str, cls: str = "chart") -> str:
    return (f'<svg class="{cls}" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{esc(label)}">')


def tick_labels(ticks: Sequence[float], log: bool = False) -> list[str]:
    """Axis labels in ms (seconds from 2 s up), with as many decimals as the step needs."""
    if not ticks:
        return []
    top = max(abs(t) for t in ticks)
    div, unit = (1000.0, "s") if top >= 2000 else (1.0, "ms")
    vals = [t / div for t in ticks]
    if log:
        return [f"{v:g}\u202f{unit}" if v else "0" for v in vals]
    steps = [b - a for a, b in itertools.pairwise(vals) if b > a]
    step = min(steps) if steps else (vals[0] or 1.0)
    dec = 0
    while dec < 6 and abs(round(step, dec) - step) > step * 1e-6:
        dec += 1
    return [f"{v:.{dec}f}\u202f{unit}" if v else "0" for v in vals]


def _x_axis(sc: Scale, y0: float, y1: float) -> list[str]:
    out = []
    ticks = sc.ticks()
    for t, lab in zip(ticks, tick_labels(ticks, sc.log), strict=True):
        x = sc(t)
        out.append(f'<line class="grid" x1="{_f(x)}" y1="{_f(y0)}" x2="{_f(x)}" '
                   f'y2="{_f(y1)}"/>')
        out.append(f'<text class="ax" x="{_f(x)}" y="{_f(y1 + 14)}" '
                   f'text-anchor="middle">{esc(lab)}</text>')
    return out


# --- CDF and histograms ------------------------------------------------------------


@dataclass
class Series:
    """One named sample of latencies (ms)."""

    name: str
    values: list[float]
    index: int = 0
    """Colour index (``s{index % SERIES}``)."""
    note: str = ""


def cdf_chart(series: Sequence[Series], label: str, width: int = 1150, height: int = 300
              ) -> str:
    """Empirical CDFs on one axis, one step line per series, with a legend."""
    allv = [v for s in series for v in s.values]
    left, right, top = 52, 20, 14
    legend_h = 20 * len(series) + 8
    plot_h = height - top - 36
    h = height + legend_h
    sc = ms_scale(allv, left, width - right)
    out = [svg_open(width, h, label)]
    y = Scale(0.0, 1.0, top + plot_h, top)
    for q in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
        yy = y(q)
        cls = "grid strong" if q in (0.5, 0.9) else "grid"
        out.append(f'<line class="{cls}" x1="{left}" y1="{_f(yy)}" x2="{width - right}" '
                   f'y2="{_f(yy)}"/>')
        out.append(f'<text class="ax" x="{left - 6}" y="{_f(yy + 4)}" '
                   f'text-anchor="end">{q * 100:.0f}%</text>')
    out += _x_axis(sc, top, top + plot_h)
    for s in series:
        vals = sorted(v for v in s.values if (v > 0 or not sc.log))
        if not vals:
            continue
        n = len(vals)
        d = [f"M{_f(sc(vals[0]))},{_f(y(0))}"]
        for i, v in enumerate(vals):
            d.append(f"H{_f(sc(v))}V{_f(y((i + 1) / n))}")
        d.append(f"H{_f(width - right)}")
        out.append(f'<path class="line s{s.index % SERIES}" d="{"".join(d)}">'
                   f'<title>{esc(s.name)}: {n} samples</title></path>')
    ly = top + plot_h + 34
    for i, s in enumerate(series):
        row_y = ly + i * 20
        out.append(f'<rect class="fill s{s.index % SERIES}" x="{left}" y="{row_y - 9}" '
                   f'width="14" height="10" rx="2"/>')
        out.append(f'<text class="lg" x="{left + 20}" y="{row_y}">{clip(s.name, 60)}'
                   f'<tspan class="ax"> {esc(s.note)}</tspan></text>')
    out.append("</svg>")
    return "".join(out)


def histogram(s: Series, sc_values: Sequence[float], label: str, width: int = 560,
              height: int = 170, bins: int = 30) -> str:
    """A histogram of one series on an axis shared with ``sc_values`` (all series)."""
    left, right, top, bottom = 40, 26, 22, 34
    sc = ms_scale(list(sc_values) or s.values, left, width - right)
    vals = [v for v in s.values if v > 0 or not sc.log]
    # bin edges in the scale's own space
    a = math.log10(sc.lo) if sc.log else sc.lo
    b = math.log10(sc.hi) if sc.log else sc.hi
    counts = [0] * bins
    for v in vals:
        x = math.log10(v) if sc.log else v
        i = int((x - a) / (b - a) * bins) if b > a else 0
        counts[min(max(i, 0), bins - 1)] += 1
    peak = max(counts) or 1
    plot_h = height - top - bottom
    out = [svg_open(width, height, label, "chart small")]
    out.append(f'<text class="lg" x="{left}" y="14">{clip(s.name, 48)}'
               f'<tspan class="ax"> {esc(s.note)}</tspan></text>')
    out += _x_axis(sc, top, top + plot_h)
    ys = Scale(0.0, float(peak), top + plot_h, top)
    out.append(f'<text class="ax" x="{left - 6}" y="{_f(top + 8)}" '
               f'text-anchor="end">{peak}</text>')
    out.append(f'<text class="ax" x="{left - 6}" y="{_f(top + plot_h)}" '
               f'text-anchor="end">0</text>')
    bw = (width - right - left) / bins
    for i, c in enumerate(counts):
        if not c:
            continue
        x = left + i * bw
        yy = ys(c)
        e0, e1 = a + (b - a) * i / bins, a + (b - a) * (i + 1) / bins
        if sc.log:
            e0, e1 = 10 ** e0, 10 ** e1
        out.append(f'<rect class="fill s{s.index % SERIES}" x="{_f(x + 0.5)}" y="{_f(yy)}" '
                   f'width="{_f(max(bw - 1, 1))}" height="{_f(top + plot_h - yy)}">'
                   f'<title>{esc(fmt_ms(e0))} – {esc(fmt_ms(e1))}: {c}</title></rect>')
    out.append(f'<line class="axis" x1="{left}" y1="{_f(top + plot_h)}" '
               f'x2="{width - right}" y2="{_f(top + plot_h)}"/>')
    out.append("</svg>")
    return "".join(out)


# --- stacked budget bars -----------------------------------------------------------


@dataclass
class Segment:
    """One phase of a stacked bar."""

    cls: str
    """CSS class of the phase (``ph-dns``...)."""
    label: str
    value: float


def budget_bars(rows: Sequence[tuple[str, list[Segment]]], label: str, width: int = 1150
                ) -> str:
    """One horizontal stacked bar per path: the medians of its phases, end to end."""
    left, right, top, row_h = 220, 80, 8, 30
    total = max((sum(max(sg.value, 0) for sg in segs) for _, segs in rows), default=0.0)
    sc = Scale(0.0, nice_ticks(0.0, total or 1.0)[-1], left, width - right)
    height = top + row_h * len(rows) + 30
    out = [svg_open(width, height, label)]
    out += _x_axis(sc, top, top + row_h * len(rows))
    for i, (name, segs) in enumerate(rows):
        y = top + i * row_h + 6
        out.append(f'<text class="lg" x="{left - 8}" y="{_f(y + 13)}" '
                   f'text-anchor="end">{clip(name, 28)}</text>')
        x = 0.0
        for sg in segs:
            if sg.value <= 0:
                continue
            x0, x1 = sc(x), sc(x + sg.value)
            out.append(f'<rect class="{sg.cls}" x="{_f(x0)}" y="{_f(y)}" '
                       f'width="{_f(max(x1 - x0, 1))}" height="18">'
                       f'<title>{esc(name)} · {esc(sg.label)}: {esc(fmt_ms(sg.value))}'
                       f'</title></rect>')
            x += sg.value
        out.append(f'<text class="ax" x="{_f(sc(x) + 6)}" y="{_f(y + 13)}">'
                   f'{esc(fmt_ms(x))}</text>')
    out.append("</svg>")
    return "".join(out)


# --- waterfall ---------------------------------------------------------------------


@dataclass
class Bar:
    """A span on a waterfall row, in ms from the chart's origin."""

    start: float
    end: float
    cls: str
    tip: str
    gap: bool = False
    """Drawn as a thin dotted line (idle time between phases), not a bar."""


@dataclass
class Row:
    """One waterfall row: a label, its bars, tick marks (streamed chunks) and a note
    (plain text: :func:`waterfall` escapes it)."""

    label: str
    bars: list[Bar] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)
    note: str = ""
    cls: str = ""


CHAR_W = 6.4
"""Rough width of a character of 11 px axis text, to place notes."""


def waterfall(rows: Sequence[Row], label: str, width: int = 1150) -> str:
    """Rows of phase bars on one time axis starting at 0 ms; a row's note goes right of
    its bars, else left of them, else over them at the right edge."""
    left, right, top, row_h = 260, 24, 6, 22
    end = max((b.end for r in rows for b in r.bars), default=0.0)
    end = max([end] + [t for r in rows for t in r.ticks])
    sc = Scale(0.0, nice_ticks(0.0, end or 1.0)[-1], left, width - right)
    plot_bottom = top + row_h * len(rows)
    height = plot_bottom + 22
    out = [svg_open(width, height, label, "chart wf")]
    for i, _ in enumerate(rows):
        if i % 2:
            out.append(f'<rect class="band" x="0" y="{top + i * row_h}" width="{width}" '
                       f'height="{row_h}"/>')
    out += _x_axis(sc, top, plot_bottom)
    for i, r in enumerate(rows):
        y = top + i * row_h
        cls = f"lg {r.cls}".strip()
        out.append(f'<text class="{cls}" x="8" y="{y + 15}">{clip(r.label, 38)}'
                   f'<title>{esc(r.label)}</title></text>')
        last, first = 0.0, float(width)
        for b in r.bars:
            x0, x1 = sc(max(b.start, 0.0)), sc(max(b.end, b.start, 0.0))
            if b.gap:
                out.append(f'<line class="gap" x1="{_f(x0)}" y1="{y + 11}" x2="{_f(x1)}" '
                           f'y2="{y + 11}"><title>{esc(b.tip)}</title></line>')
                continue
            x1 = x0 + max(x1 - x0, 1.5)
            out.append(f'<rect class="{b.cls}" x="{_f(x0)}" y="{y + 5}" '
                       f'width="{_f(x1 - x0)}" height="12" rx="1.5">'
                       f'<title>{esc(b.tip)}</title></rect>')
            last, first = max(last, x1), min(first, x0)
        for t in r.ticks:
            x = sc(t)
            out.append(f'<line class="tick" x1="{_f(x)}" y1="{y + 2}" x2="{_f(x)}" '
                       f'y2="{y + 20}"/>')
            last, first = max(last, x), min(first, x)
        if r.note:
            w = len(r.note) * CHAR_W
            if last + 6 + w <= width - 2:
                x, anchor = last + 6, "start"
            elif first - 6 - w >= left:
                x, anchor = first - 6, "end"
            else:
                x, anchor = width - 2.0, "end"
            out.append(f'<text class="ax note" x="{_f(x)}" y="{y + 15}" '
                       f'text-anchor="{anchor}">{esc(r.note)}</text>')
    out.append("</svg>")
    return "".join(out)


# --- load over time ----------------------------------------------------------------


@dataclass
class Interval:
    """One interval of a path's time series, as the charts need it."""

    start: float
    """Seconds (epoch, or from any origin shared by the series)."""
    rate: float
    """Requests per second."""
    requests: int
    p99: float | None
    p50: float | None
    estimated: bool = False


def path_intervals(timeseries: object) -> list[tuple[str, list[Interval]]]:
    """``(key, intervals)`` of each path of a document's ``timeseries`` that has any (key
    ``"null"`` for requests on no path), in the document's order. An interval without a
    ``start_ts`` is placed by its index from the series' start; a missing rate is its
    requests over the interval."""
    ts = timeseries if isinstance(timeseries, dict) else {}
    iv_s = (num(ts.get("interval_ms")) or 0.0) / 1000.0
    start = num(ts.get("start_ts"))
    paths = ts.get("paths")
    out = []
    for key, rows in (paths.items() if isinstance(paths, dict) else ()):
        series = []
        for i, r in enumerate(rows if isinstance(rows, list) else ()):
            if not isinstance(r, dict):
                continue
            t = num(r.get("start_ts"))
            if t is None:
                if start is None or not iv_s:
                    continue
                t = start + i * iv_s
            n = num(r.get("requests")) or 0.0
            rate = num(r.get("rate_per_s"))
            if rate is None:
                rate = n / iv_s if iv_s else 0.0
            block = r.get("ttfb_ms")
            ttfb: dict[str, Any] = block if isinstance(block, dict) else {}
            series.append(Interval(t, rate, int(n), num(ttfb.get("p99")), num(ttfb.get("p50")),
                                   bool(r.get("estimated"))))
        if series:
            out.append(("null" if key is None else str(key), series))
    return out


@dataclass
class Bucket:
    """Consecutive intervals drawn as one mark (one terminal cell, one pixel column)."""

    start: float
    end: float
    rate: float
    """Mean request rate over the bucket's time (intervals not listed count as idle)."""
    requests: int
    p99: float | None
    """The highest p99 of its intervals (None: none had a request)."""
    p50: float | None
    """The mean of its intervals' p50."""
    estimated: bool = False


def bucket_load(series: Sequence[Interval], interval_s: float, cols: int
                ) -> tuple[list[Bucket], int]:
    """``series`` cut into at most ``cols`` buckets of ``k`` consecutive intervals each
    (returned with ``k``; 1 when the series fits), placed by their start time so that a
    sparse series (only its active intervals listed) keeps its idle stretches.

    How a bucket sums its intervals: the request rate is their mean (the bucket's
    requests over its duration, idle intervals counting as 0); p99 is their highest
    (a spike of one interval survives any width); p50 is their mean. The work is in the
    number of listed intervals, never in the span they cover."""
    pts = sorted((s for s in series if math.isfinite(s.start)), key=lambda s: s.start)
    if not pts:
        return [], 1
    iv = interval_s if interval_s > 0 and math.isfinite(interval_s) else 0.0
    if not iv:
        gaps = [b.start - a.start for a, b in itertools.pairwise(pts) if b.start > a.start]
        iv = min(gaps) if gaps else 1.0
    first = pts[0].start
    pos = [round((p.start - first) / iv) for p in pts]
    n = pos[-1] + 1
    k = max(1, -(-n // max(cols, 1)))
    nb = -(-n // k)
    rate = [0.0] * nb
    reqs = [0] * nb
    p99: list[float | None] = [None] * nb
    p50s: list[list[float]] = [[] for _ in range(nb)]
    est = [False] * nb
    for p, i in zip(pts, pos, strict=True):
        b = i // k
        rate[b] += p.rate
        reqs[b] += p.requests
        if p.p99 is not None:
            q = p99[b]
            p99[b] = p.p99 if q is None else max(q, p.p99)
        if p.p50 is not None:
            p50s[b].append(p.p50)
        est[b] = est[b] or p.estimated
    out = []
    for b in range(nb):
        span = min(k, n - b * k)
        s0 = first + b * k * iv
        out.append(Bucket(s0, s0 + span * iv, rate[b] / span, reqs[b], p99[b],
                          sum(p50s[b]) / len(p50s[b]) if p50s[b] else None, est[b]))
    return out, k


def _g(x: float) -> str:
    """A coordinate of a dense path: one decimal, no trailing zero (half the bytes)."""
    s = f"{x:.1f}"
    s = s[:-2] if s.endswith(".0") else s
    return "0" if s == "-0" else s


def count_text(v: float) -> str:
    """A rate or a count for people: ``1,240``, ``12.5``, ``0.25``."""
    a = abs(v)
    if a >= 100 or v == int(v):
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def plain_labels(ticks: Sequence[float], unit: str = "") -> list[str]:
    """Axis labels of plain numbers (thousands separated) with as many decimals as the
    step needs, and ``unit`` after each but 0."""
    steps = [b - a for a, b in itertools.pairwise(ticks) if b > a]
    step = min(steps) if steps else (abs(ticks[0]) if ticks and ticks[0] else 1.0)
    dec = 0
    while dec < 6 and abs(round(step, dec) - step) > step * 1e-6:
        dec += 1
    sfx = f"\u202f{unit}" if unit else ""
    return [f"{t:,.{dec}f}{sfx}" if t else "0" for t in ticks]


def _y_axis(sc: Scale, x0: float, x1: float, labels: Sequence[str], ticks: Sequence[float]
            ) -> list[str]:
    out = []
    for t, lab in zip(ticks, labels, strict=True):
        y = sc(t)
        out.append(f'<line class="grid" x1="{_f(x0)}" y1="{_f(y)}" x2="{_f(x1)}" '
                   f'y2="{_f(y)}"/>')
        out.append(f'<text class="ax" x="{_f(x0 - 6)}" y="{_f(y + 4)}" '
                   f'text-anchor="end">{esc(lab)}</text>')
    return out


def _x_grid(sc: Scale, ticks: Sequence[float], y0: float, y1: float) -> list[str]:
    return [f'<line class="grid" x1="{_f(sc(t))}" y1="{_f(y0)}" x2="{_f(sc(t))}" '
            f'y2="{_f(y1)}"/>' for t in ticks]


def linear_scale(lo: float, hi: float, px0: float, px1: float) -> Scale:
    """A linear scale over round ticks covering [lo, hi] (from 0 when lo is 0)."""
    ticks = nice_ticks(lo, hi if hi > lo else lo + 1.0)
    return Scale(ticks[0], ticks[-1], px0, px1)


def _ms_unit(sc: Scale) -> str:
    return "s" if max((abs(t) for t in sc.ticks()), default=0.0) >= 2000 else "ms"


@dataclass
class TimeMark:
    """A vertical mark on a time chart (a knee: where the rate first reached it)."""

    at: float
    """Seconds, on the chart's time axis."""
    label: str
    rate: float | None = None
    """Also drawn as a horizontal line at this rate on the rate panel."""
    dashed: bool = False


TIMELINE_COLS = 1066
"""Pixel columns of a time chart's plot (its width less the axes)."""


def timeline_chart(buckets: Sequence[Bucket], index: int, t0: float, t_lo: float,
                   t_hi: float, label: str, marks: Sequence[TimeMark] = (),
                   width: int = 1150) -> str:
    """Two panels on one time axis (seconds from ``t0``, over [t_lo, t_hi]): the request
    rate (a step area) and the p99 (solid) and p50 (dashed) time to first byte (step
    lines, broken where an interval had no request). ``buckets`` come from
    :func:`bucket_load` with at most :data:`TIMELINE_COLS` columns, so that the chart's
    size follows the pixel width, never the number of intervals."""
    left, right = 64, width - 20
    r_top, r_bot = 24, 114
    l_top, l_bot = 146, 296
    height = l_bot + 42
    cls = f"s{index % SERIES}"
    xs = Scale(t_lo, t_hi if t_hi > t_lo else t_lo + 1.0, left, right)
    t_ticks = [t for t in nice_ticks(t_lo, t_hi, 10) if t_lo - 1e-9 <= t <= t_hi + 1e-9]
    knee_rates = [m.rate for m in marks if m.rate is not None]
    r_hi = max([b.rate for b in buckets] + knee_rates + [0.0])
    rs = linear_scale(0.0, r_hi or 1.0, r_bot, r_top)
    lat = [v for b in buckets for v in (b.p99, b.p50) if v is not None]
    ls = ms_scale(lat, l_bot, l_top)
    out = [svg_open(width, height, label, "chart load")]
    # the rate panel
    out.append(f'<text class="ax" x="{left}" y="14">request rate (req/s)</text>')
    out += _x_grid(xs, t_ticks, r_top, r_bot)
    out += _y_axis(rs, left, right, plain_labels(rs.ticks()), rs.ticks())
    if buckets:
        d = [f"M{_g(xs(buckets[0].start - t0))},{_g(r_bot)}"]
        for b in buckets:
            d.append(f"V{_g(rs(b.rate))}H{_g(xs(b.end - t0))}")
        d.append(f"V{_g(r_bot)}Z")
        out.append(f'<path class="area {cls}" d="{"".join(d)}"/>')
    out.append(f'<line class="axis" x1="{left}" y1="{r_bot}" x2="{right}" y2="{r_bot}"/>')
    # the latency panel
    unit = _ms_unit(ls)
    out.append(f'<text class="ax" x="{left}" y="{l_top - 10}">time to first byte ({unit}):'
               " p99 solid, p50 dashed</text>")
    out += _x_grid(xs, t_ticks, l_top, l_bot)
    lt = ls.ticks()
    out += _y_axis(ls, left, right, tick_labels(lt, ls.log), lt)
    for key, extra in (("p99", ""), ("p50", " dash")):
        d = []
        prev = False
        for b in buckets:
            v = getattr(b, key)
            if v is None:
                prev = False
                continue
            vy, vx = _g(ls(v)), _g(xs(b.end - t0))
            d.append(f"V{vy}H{vx}" if prev else f"M{_g(xs(b.start - t0))},{vy}H{vx}")
            prev = True
        if d:
            out.append(f'<path class="line ts {cls}{extra}" d="{"".join(d)}"/>')
    if not lat:
        out.append(f'<text class="ax" x="{_f((left + right) / 2)}" y="{_f((l_top + l_bot) / 2)}"'
                   ' text-anchor="middle">no request with a time to first byte</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{l_bot}" x2="{right}" y2="{l_bot}"/>')
    for i, m in enumerate(marks):
        x = xs(m.at)
        dash = " p50" if m.dashed else ""
        out.append(f'<line class="knee {cls}{dash}" x1="{_f(x)}" y1="{l_top}" x2="{_f(x)}" '
                   f'y2="{l_bot}"><title>{esc(m.label)}</title></line>')
        anchor, tx = ("end", x - 4) if x > left + 0.7 * (right - left) else ("start", x + 4)
        out.append(f'<text class="ax note" x="{_f(tx)}" y="{l_top + 12 + 14 * i}" '
                   f'text-anchor="{anchor}">{clip(m.label, 80)}</text>')
        if m.rate is not None:
            y = rs(m.rate)
            out.append(f'<line class="knee {cls}{dash}" x1="{left}" y1="{_f(y)}" '
                       f'x2="{right}" y2="{_f(y)}"><title>{esc(m.label)}</title></line>')
    # the shared time axis
    for t, lab in zip(t_ticks, plain_labels(t_ticks, "s"), strict=True):
        out.append(f'<text class="ax" x="{_f(xs(t))}" y="{l_bot + 14}" '
                   f'text-anchor="middle">{esc(lab)}</text>')
    out.append(f'<text class="ax" x="{_f((left + right) / 2)}" y="{l_bot + 34}" '
               'text-anchor="middle">time since the capture started (s)</text>')
    out.append("</svg>")
    return "".join(out)


# --- latency against rate ----------------------------------------------------------


@dataclass
class Cloud:
    """Per-interval (request rate, latency) points of one path."""

    name: str
    index: int
    points: list[tuple[float, float]]


@dataclass
class KneeLine:
    """A knee on the scatter: a vertical line at its rate, its CI as a band."""

    label: str
    index: int
    rate: float
    ci: tuple[float, float] | None = None
    dashed: bool = False


MAX_DOTS = 1500
"""Dots drawn per path at most on the scatter (see :func:`scatter_chart`)."""


def _dots(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Pixel points thinned to one per grid cell, the cell doubled (from 2 px) until at
    most :data:`MAX_DOTS` remain: a dot 5 px wide hides any closer neighbour, so the
    picture is that of every point while its size is bounded."""
    cell = 2.0
    while True:
        seen = {(round(x / cell), round(y / cell)) for x, y in points}
        if len(seen) <= MAX_DOTS or cell >= 64:
            return [(cx * cell, cy * cell) for cx, cy in sorted(seen)]
        cell *= 2


def scatter_chart(clouds: Sequence[Cloud], knees: Sequence[KneeLine], label: str,
                  width: int = 1150, height: int = 360) -> str:
    """p99 time to first byte against request rate, one dot per interval (thinned, see
    :func:`_dots`), one colour per path; each knee a vertical line at its rate with its
    95% CI shaded, labelled."""
    left, right, top, bottom = 64, width - 20, 14, height - 44
    r_hi = max([x for c in clouds for x, _ in c.points] + [k.rate for k in knees]
               + [k.ci[1] for k in knees if k.ci] + [0.0])
    xs = linear_scale(0.0, r_hi or 1.0, left, right)
    lat = [y for c in clouds for _, y in c.points]
    ys = ms_scale(lat, bottom, top)
    out = [svg_open(width, height, label, "chart load")]
    xt = xs.ticks()
    out += _x_grid(xs, xt, top, bottom)
    yt = ys.ticks()
    out += _y_axis(ys, left, right, tick_labels(yt, ys.log), yt)
    for k in knees:
        if k.ci is None:
            continue
        x0, x1 = xs(min(k.ci)), xs(max(k.ci))
        out.append(f'<rect class="kband s{k.index % SERIES}" x="{_f(x0)}" y="{top}" '
                   f'width="{_f(max(x1 - x0, 1))}" height="{bottom - top}">'
                   f"<title>{esc(k.label)}</title></rect>")
    for c in clouds:
        px = [(xs(x), ys(y)) for x, y in c.points if not ys.log or y > 0]
        if not px:
            continue
        d = "".join(f"M{_g(x)},{_g(y)}h0" for x, y in _dots(px))
        out.append(f'<path class="dot s{c.index % SERIES}" d="{d}">'
                   f"<title>{esc(c.name)}: {len(c.points)} intervals</title></path>")
    for i, k in enumerate(knees):
        x = xs(k.rate)
        dash = " p50" if k.dashed else ""
        out.append(f'<line class="knee s{k.index % SERIES}{dash}" x1="{_f(x)}" y1="{top}" '
                   f'x2="{_f(x)}" y2="{bottom}"><title>{esc(k.label)}</title></line>')
        anchor, tx = ("end", x - 4) if x > left + 0.7 * (right - left) else ("start", x + 4)
        out.append(f'<text class="ax note" x="{_f(tx)}" y="{top + 12 + 14 * i}" '
                   f'text-anchor="{anchor}">{clip(k.label, 90)}</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>')
    for t, lab in zip(xt, plain_labels(xt), strict=True):
        out.append(f'<text class="ax" x="{_f(xs(t))}" y="{bottom + 14}" '
                   f'text-anchor="middle">{esc(lab)}</text>')
    out.append(f'<text class="ax" x="{_f((left + right) / 2)}" y="{bottom + 34}" '
               'text-anchor="middle">request rate in the interval (req/s)</text>')
    out.append(f'<text class="ax" x="{left}" y="{top - 4}">p99 time to first byte '
               f"({_ms_unit(ys)})</text>")
    out.append("</svg>")
    return "".join(out)
