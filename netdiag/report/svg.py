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
    mag = 10 ** math.floor(math.log10(raw))
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
        yy = ly + i * 20
        out.append(f'<rect class="fill s{s.index % SERIES}" x="{left}" y="{yy - 9}" '
                   f'width="14" height="10" rx="2"/>')
        out.append(f'<text class="lg" x="{left + 20}" y="{yy}">{clip(s.name, 60)}'
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
