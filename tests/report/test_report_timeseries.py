"""The per-path time series and latency knees (issue 13) in the terminal, HTML and CSV
reports: a real document of the shipped capture with a synthetic ``timeseries`` and
``knees`` added (the shapes the paths analysis writes), hostile names included."""

from __future__ import annotations

import copy
import io
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from report_docs import ANTHO, with_paths
from rich.console import Console
from test_report_csv import read
from test_report_html import assert_safe_and_self_contained

from netdiag.report.csv_out import KNEE_COLUMNS, TIMESERIES_COLUMNS, write_csv
from netdiag.report.html import render_html
from netdiag.report.terminal import SPARK, load_section, render

KNEE_RATE = 1150.0
HOSTILE_NAME = ("\x1b[31mRED\x1b[0m<script>alert(1)</script>\nnext line \u202eevil "
                + "x" * 300)
HOSTILE_REASON = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07 <script>alert(2)</script>\n"
HOSTILE_SENTENCE = "[red]markup[/red] \x1b[2J cleared <img src=x onerror=alert(3)>"


def _block(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None,
                "mean": None}
    v = sorted(values)

    def q(p: float) -> float:
        return v[min(int(p * len(v)), len(v) - 1)]

    return {"count": len(v), "min": v[0], "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "max": v[-1], "mean": sum(v) / len(v)}


def _roc_p99(rate: float) -> float:
    """ROC's p99 TTFB at a rate: flat at 45 ms, then 2.1 ms more per req/s above the knee."""
    return 45.0 if rate < KNEE_RATE else 45.0 + (rate - KNEE_RATE) * 2.1 + 100.0


def synthetic(doc: dict[str, Any], n: int = 60, interval_ms: float = 1000.0,
              roc: str = "ROC", dpf: str = "DPF") -> dict[str, Any]:
    """``doc`` with a ``timeseries`` of ``n`` intervals per path: ROC's rate ramps up
    past a knee at 1,150 req/s where its router slows down; DPF's latency stays flat.
    Every 17th interval is empty (no request: null percentiles)."""
    iv = interval_ms / 1000.0
    first = doc["capture"]["first_ts"]
    start = math.floor(first / iv) * iv
    paths: dict[str, list[dict[str, Any]]] = {roc: [], dpf: []}
    for i in range(n):
        empty = i % 17 == 5
        for name in (roc, dpf):
            rate = 0.0 if empty else 100.0 + 1400.0 * i / max(n - 1, 1)
            if name == dpf:
                rate = 0.0 if empty else 40.0 + 5 * (i % 7)
            requests = round(rate * iv)
            p99 = None if empty else (_roc_p99(rate) if name == roc else 21.0 + (i % 3))
            ttfb = _block([] if p99 is None else [p99 / 2, p99 * 0.8, p99])
            ttfb["p99"] = p99
            entry: dict[str, Any] = {
                "start_ts": start + i * iv, "requests": requests,
                "rate_per_s": requests / iv, "in_flight_max": 0 if empty else 4,
                "new_connections": 0 if empty else 1,
                "reuse_rate": None if empty else 0.917, "dns_lookups": 0,
                "ttfb_ms": ttfb, "ttlb_ms": _block([] if p99 is None else [p99 + 1]),
                "retransmissions": i % 2, "bytes": 12345 * requests, "estimated": False}
            if name == roc:
                router = None if p99 is None else max(p99 - 35.0, 10.0)
                entry["hops"] = {
                    "edge": {"own_ms": _block([] if p99 is None else [3.0])},
                    "router": {"own_ms": _block([] if router is None else [router])},
                    "origin": {"own_ms": _block([] if p99 is None else [20.0])}}
            paths[name].append(entry)
    doc["timeseries"] = {
        "interval_ms": interval_ms, "start_ts": start, "paths": paths,
        "knee_declined": {dpf: {"ttfb_p99": "latency does not rise with load (slope 0.01 "
                                            "ms per req/s)",
                                "ttfb_p50": "latency does not rise with load"}}}
    doc["knees"] = [{
        "path": roc, "metric": "ttfb_p99", "rate_per_s": KNEE_RATE, "ci": [1080.0, 1210.0],
        "below_ms": 45.0, "above_ms": 820.0, "slope_ms_per_rps": 2.1, "points": n,
        "below": 18, "above": 12, "hop": "router",
        "hops": {"router": {"below_ms": 10.0, "above_ms": 640.0},
                 "origin": {"below_ms": 20.0, "above_ms": 20.4}},
        "evidence": ["p99 TTFB 45 ms over 18 intervals below 1150 req/s, 820 ms over 12 "
                     "above", "router own time 10 -> 640 ms", "origin own time 20 -> 20.4 ms"],
        "sentence": f"{roc}'s p99 time to first byte rises from 45 to 820 ms above 1,150 "
                    "req/s (95% CI 1,080-1,210); the router's own time grows from 10 to "
                    "640 ms; the origin's stays at 20 ms."}]
    return doc


@pytest.fixture
def load_doc(doc_keys: dict[str, Any]) -> dict[str, Any]:
    return synthetic(with_paths(doc_keys))


def hostile(doc: dict[str, Any]) -> dict[str, Any]:
    """The synthetic load with a hostile name for ROC, hostile reasons and sentences."""
    ts = doc["timeseries"]
    ts["paths"][HOSTILE_NAME] = ts["paths"].pop("ROC")
    for iv in ts["paths"][HOSTILE_NAME]:
        iv["hops"][HOSTILE_NAME] = iv["hops"].pop("router")
    ts["knee_declined"]["DPF"]["ttfb_p99"] = HOSTILE_REASON
    ts["knee_declined"][HOSTILE_NAME] = {"ttfb_p50": HOSTILE_REASON}
    k = doc["knees"][0]
    k.update(path=HOSTILE_NAME, hop=HOSTILE_NAME,
             sentence=HOSTILE_SENTENCE + " " + HOSTILE_NAME, evidence=[HOSTILE_SENTENCE])
    return doc


# --- terminal ----------------------------------------------------------------------


def _print(renderable: Any, width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False,
            legacy_windows=False).print(renderable)
    return buf.getvalue()


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("width", [80, 200])
def test_terminal_section_fits_and_shows_the_knees(load_doc: dict[str, Any],
                                                   width: int) -> None:
    sec = load_section(load_doc["timeseries"], load_doc["knees"], width)
    assert sec is not None
    text = _print(sec, width)
    lines = text.splitlines()
    assert lines[0].startswith("Load over time")
    assert max(len(line) for line in lines) <= width
    sparks = [re.sub(f"[^{SPARK} ]", "", line) for line in lines
              if any(c in SPARK for c in line)]
    assert len(sparks) == 4                           # two lines per path
    for s in sparks:
        assert 0 < len(s.strip()) <= width - 20
    n = len(load_doc["timeseries"]["paths"]["ROC"])
    if width >= 200:                                  # every interval is a cell: gaps show
        req = next(line for line in lines if line.startswith("ROC"))
        spark = req[req.index("req/s") + 6:][:n]
        assert [i for i, c in enumerate(spark) if c == " "] == [5, 22, 39, 56]
        assert spark[-1] == "█" and "a mark is" not in text
    else:                                             # downsampled: it says how
        assert "a mark is 2 intervals: mean rate, highest p99" in _flat(text)
    flat = _flat(text)
    assert _flat(load_doc["knees"][0]["sentence"]) in flat
    assert "no knee: latency does not rise with load (slope 0.01 ms per req/s)" in flat
    assert "60 × 1 s" in text
    # the ranges: ROC's p99 from 45 ms to the top of the ramp
    assert "45.0 ms–" in text


def test_terminal_section_draws_only_the_paths_shown(load_doc: dict[str, Any]) -> None:
    """``only`` (the paths the path section shows, :func:`shown_paths`): the others are
    neither drawn nor their knees said, but counted."""
    everything = _flat(_print(load_section(load_doc["timeseries"], load_doc["knees"], 200),
                              200))
    assert "ROC" in everything and "more path" not in everything
    text = _flat(_print(load_section(load_doc["timeseries"], load_doc["knees"], 200,
                                     only={"DPF"}), 200))
    assert "DPF" in text and "ROC" not in text
    assert _flat(load_doc["knees"][0]["sentence"]) not in text
    assert "1 more path not shown (as above): --format json has their time series" in text


def test_terminal_section_only_with_three_intervals(load_doc: dict[str, Any]) -> None:
    assert load_section(None, None, 80) is None
    assert load_section({}, [], 80) is None
    short = synthetic(copy.deepcopy(load_doc), n=2)
    assert load_section(short["timeseries"], short["knees"], 80) is None
    three = synthetic(copy.deepcopy(load_doc), n=3)
    assert load_section(three["timeseries"], [], 80) is not None


def test_terminal_long_series_is_downsampled(load_doc: dict[str, Any]) -> None:
    doc = synthetic(load_doc, n=10_000, interval_ms=100.0)
    t = time.perf_counter()
    text = _print(load_section(doc["timeseries"], doc["knees"], 80), 80)
    assert time.perf_counter() - t < 2.0
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "10,000 × 100 ms" in text
    k = re.search(r"a mark is ([\d,]+) intervals", _flat(text))
    assert k and int(k.group(1).replace(",", "")) * 45 >= 10_000


def test_terminal_hostile_names_are_shown_not_obeyed(load_doc: dict[str, Any]) -> None:
    doc = hostile(load_doc)
    for width in (80, 200):
        text = _print(load_section(doc["timeseries"], doc["knees"], width), width)
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
        assert max(len(line) for line in text.splitlines()) <= width
        assert "\\u001b[31mRED" in text                  # the name, escaped
        assert "\\u001b]8;;http://evil.example\\u0007click" in _flat(text)
        assert "[red]markup[/red]" in text               # not read as markup
        assert "\\n" in text
        # a name too long for its column: a line of its own, whole (up to the safe-text
        # limit), then the sparklines
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if "RED" in line)
        assert lines[first].startswith("\\u001b[31mRED\\u001b[0m<script>alert(1)")
        rest = "".join(lines[first:first + 6])
        assert "\\u202eevil " + "x" * 200 in rest
        req = next(line for line in lines[first:] if "req/s" in line)
        assert req.startswith(" ") and req.index("req/s") <= 30


def test_terminal_inferred_names_are_never_cut(load_doc: dict[str, Any]) -> None:
    ts = load_doc["timeseries"]["paths"]
    ts["direct [2001:db8:85a3::8a2e:370:7334]:443"] = ts.pop("DPF")
    ts["via 127.0.0.10:443"] = ts.pop("ROC")
    text = _print(load_section(load_doc["timeseries"], [], 80), 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "\ndirect [2001:db8:85a3::8a2e:370:7334]:443\n" in text
    assert re.search(r"\nvia 127\.0\.0\.10:443 +req/s ", text)
    ts["direct 255.255.255.255:65535"] = ts.pop("direct [2001:db8:85a3::8a2e:370:7334]:443")
    text = _print(load_section(load_doc["timeseries"], [], 80), 80)
    assert re.search(r"\ndirect 255\.255\.255\.255:65535 req/s ", text)


class _WithLoad:
    """A paths analysis with a time series (what the paths analysis will attach)."""

    def __init__(self, analysis: Any, doc: dict[str, Any]) -> None:
        self._a = analysis
        self.timeseries = doc["timeseries"]
        self.knees = doc["knees"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._a, name)


@pytest.fixture(scope="module")
def antho_analysis() -> tuple[Any, Any, Any]:
    from netdiag.paths.apply import analyze_paths
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    sink = CollectingSink()
    result = analyze([str(ANTHO)], sink, Options())
    paths = analyze_paths(sink.connections, sink.dns_records, None)
    return result, paths, sink.connections


def test_render_prints_the_section_after_the_paths(antho_analysis: tuple[Any, Any, Any],
                                                   load_doc: dict[str, Any]) -> None:
    result, paths, connections = antho_analysis
    buf = io.StringIO()
    console = Console(file=buf, width=80, color_system=None)
    render(result, console, paths=_WithLoad(paths, load_doc), connections=connections)
    text = buf.getvalue()
    assert text.index("Differences between paths") < text.index("Load over time") < (
        text.index("Slowest connections"))
    assert max(len(line) for line in text.splitlines()) <= 80
    buf = io.StringIO()
    bare = _WithLoad(paths, load_doc)
    bare.timeseries = None
    render(result, Console(file=buf, width=80, color_system=None), paths=bare,
           connections=connections)
    assert "Load over time" not in buf.getvalue()


# --- HTML ----------------------------------------------------------------------------


def _svg(out: str, label: str) -> str:
    i = out.index(f'aria-label="{label}"')
    return out[i:out.index("</svg>", i)]


def _x_map(svg: str, unit: str = "") -> tuple[float, float]:
    """(px per unit, px at 0) of a chart's x axis, from its tick labels."""
    sfx = "\u202f" + unit if unit else ""
    ticks = [(float(x), 0.0 if v == "0" else float(v.removesuffix(sfx).replace(",", "")))
             for x, v in re.findall(r'<text class="ax" x="([\d.]+)" y="[\d.]+" '
                                    r'text-anchor="middle">(0|[\d,.]+' + sfx + ")</text>",
                                    svg)]
    assert len(ticks) >= 3, svg[:300]
    (x0, v0), (x1, v1) = ticks[0], ticks[-1]
    k = (x1 - x0) / (v1 - v0)
    return k, x0 - v0 * k


def test_html_load_section(load_doc: dict[str, Any]) -> None:
    out = render_html(load_doc)
    page = assert_safe_and_self_contained(out)
    assert "<h2>Load</h2>" in out and '<a href="#load">Load</a>' in out
    sec = out[out.index('<section id="load">'):]
    sec = sec[:sec.index("</section>")]
    # per path one time chart, then one scatter; colours as in the TTFB charts (the
    # order of summary.paths: DPF s0, ROC s1)
    assert sec.count('aria-label="request rate and time to first byte over time:') == 2
    roc = _svg(out, "request rate and time to first byte over time: ROC")
    dpf = _svg(out, "request rate and time to first byte over time: DPF")
    assert '<path class="area s1"' in roc and '<path class="line ts s1"' in roc
    assert '<path class="line ts s1 dash"' in roc and '<path class="area s0"' in dpf
    for axis in ("request rate (req/s)", "time to first byte (ms)",
                 "time since the capture started (s)"):
        assert axis in roc
    # the knee on ROC's latency panel: where its rate first reached 1,150 req/s
    ivs = load_doc["timeseries"]["paths"]["ROC"]
    cross = next(iv["start_ts"] for iv in ivs if iv["rate_per_s"] >= KNEE_RATE)
    k, x0 = _x_map(roc, "s")
    xs = re.findall(r'<line class="knee s1" x1="([\d.]+)" y1="146" x2="([\d.]+)"', roc)
    assert len(xs) == 1 and xs[0][0] == xs[0][1]
    t = cross - load_doc["capture"]["first_ts"]
    assert float(xs[0][0]) == pytest.approx(x0 + k * t, abs=0.02)
    assert "knee" not in dpf.replace("time to first byte", "")  # DPF has none
    # the scatter: a knee line at its rate, its CI shaded, labelled
    sc = _svg(out, "p99 time to first byte against request rate")
    k, x0 = _x_map(sc)
    (x1,) = re.findall(r'<line class="knee s1" x1="([\d.]+)"', sc)
    assert float(x1) == pytest.approx(x0 + k * KNEE_RATE, abs=0.02)
    band = re.search(r'<rect class="kband s1" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', sc)
    assert band
    assert float(band.group(1)) == pytest.approx(x0 + k * 1080.0, abs=0.02)
    assert float(band.group(2)) == pytest.approx(k * 130.0, abs=0.05)
    assert "ROC: p99 knee at 1,150 req/s (95% CI 1,080–1,210)" in sc
    assert '<path class="dot s1"' in sc and '<path class="dot s0"' in sc
    assert "request rate in the interval (req/s)" in sc and "p99 time to first byte (" in sc
    # the page reads without the charts
    text = " ".join(page.texts)
    assert load_doc["knees"][0]["sentence"] in text
    assert "router own time 10 -> 640 ms" in text
    assert "p99 time to first byte: latency does not rise with load (slope 0.01" in text
    assert "60 intervals of 1\u202fs" in text


def test_html_without_timeseries_has_no_load_section(doc_keys: dict[str, Any]) -> None:
    for doc in (doc_keys, synthetic(with_paths(doc_keys), n=2)):
        out = render_html(doc)
        assert '<section id="load">' not in out and 'href="#load"' not in out
    idle = synthetic(copy.deepcopy(doc_keys), n=5)  # a path with no request: not drawn
    idle["timeseries"]["paths"]["null"] = [{**iv, "requests": 0, "rate_per_s": 0.0}
                                           for iv in idle["timeseries"]["paths"]["DPF"]]
    out = render_html(idle)
    assert out.count('class="chart load"') == 3 and "no path" not in out
    doc = synthetic(doc_keys, n=5)
    doc["knees"] = []
    del doc["timeseries"]["knee_declined"]
    out = render_html(doc)                           # no summary.paths: colours from 0
    assert_safe_and_self_contained(out)
    assert '<path class="area s0"' in out and 'class="knee' not in out
    del doc["timeseries"]["interval_ms"]             # the interval from the start times
    out = render_html(doc)
    roc = _svg(out, "request rate and time to first byte over time: ROC")
    k, x0 = _x_map(roc, "s")
    last = doc["timeseries"]["paths"]["ROC"][-1]["start_ts"] + 1.0
    area = re.search(r'<path class="area s\d" d="([^"]+)"', roc)
    assert area
    end = float(re.findall(r"H([\d.]+)", area.group(1))[-1])
    assert end == pytest.approx(x0 + k * (last - doc["capture"]["first_ts"]), abs=0.1)


def test_html_hostile_names_are_escaped(load_doc: dict[str, Any]) -> None:
    out = render_html(hostile(load_doc))
    page = assert_safe_and_self_contained(out)
    sec = out[out.index('<section id="load">'):]
    sec = sec[:sec.index("</section>")]
    assert "<script" not in sec and "<img" not in sec
    assert "\x1b" not in sec and "\u202e" not in sec and "\x07" not in sec
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in sec
    assert "&lt;img src=x onerror=alert(3)&gt;" in sec
    assert "\\u001b[31mRED" in sec and "\\u202eevil" in sec
    text = " ".join(page.texts)
    assert "<script>alert(2)</script>" in text           # the reason, shown as text
    # a long name is cut in headings and labels, whole in the sentence
    assert sec.count("x" * 300) >= 1
    assert '<path class="area s' in sec


def test_html_stays_small_with_10000_intervals(load_doc: dict[str, Any]) -> None:
    base = len(render_html(load_doc))
    doc = synthetic(load_doc, n=10_000, interval_ms=100.0)
    t = time.perf_counter()
    out = render_html(doc)
    assert time.perf_counter() - t < 5.0
    assert_safe_and_self_contained(out)
    sec = out[out.index('<section id="load">'):]
    sec = sec[:sec.index("</section>")]
    # two paths of 10,000 intervals: the section is bounded by the pixel width (about
    # 60 KB per path's time chart, the scatter's dots thinned), not the intervals
    assert len(sec.encode()) < 200_000, len(sec)
    assert len(out) - base < 200_000
    assert "drawn 10 intervals per pixel column" in sec
    roc = _svg(out, "request rate and time to first byte over time: ROC")
    area = re.search(r'<path class="area s1" d="([^"]+)"', roc)
    assert area and area.group(1).count("H") <= 1066


# --- CSV ------------------------------------------------------------------------------


def test_csv_timeseries_and_knees(load_doc: dict[str, Any], tmp_path: Path) -> None:
    files = write_csv(load_doc, tmp_path)
    assert [p.name for p in files][-2:] == ["timeseries.csv", "knees.csv"]
    header, rows = read(tmp_path / "timeseries.csv")
    hops = [f"hops.{h}.own_ms.{f}" for h in ("edge", "router", "origin") for f in ("p50", "p99")]
    assert header == [*TIMESERIES_COLUMNS, *hops]
    ts = load_doc["timeseries"]["paths"]
    assert len(rows) == len(ts["ROC"]) + len(ts["DPF"])
    assert [r["path"] for r in rows] == ["ROC"] * 60 + ["DPF"] * 60
    first = ts["ROC"][0]
    assert float(rows[0]["start_ts"]) == first["start_ts"]
    assert rows[0]["ttfb_ms.p99"] == repr(first["ttfb_ms"]["p99"])
    assert rows[0]["ttlb_ms.count"] == "1" and rows[0]["estimated"] == "false"
    assert rows[0]["hops.router.own_ms.p50"] == repr(first["hops"]["router"]["own_ms"]["p50"])
    empty = rows[5]                                   # an empty interval: empty cells
    assert (empty["requests"], empty["ttfb_ms.count"], empty["ttfb_ms.p99"],
            empty["reuse_rate"], empty["hops.router.own_ms.p99"]) == ("0", "0", "", "", "")
    assert rows[60]["hops.router.own_ms.p50"] == ""   # DPF has no hops
    header, rows = read(tmp_path / "knees.csv")
    assert header == list(KNEE_COLUMNS)
    (row,) = rows
    k = load_doc["knees"][0]
    assert (row["path"], row["metric"], row["rate_per_s"], row["ci_low"], row["ci_high"],
            row["hop"], row["sentence"]) == ("ROC", "ttfb_p99", "1150.0", "1080.0", "1210.0",
                                             "router", k["sentence"])
    assert row["slope_ms_per_rps"] == "2.1" and row["below_ms"] == "45.0"


def test_csv_only_with_the_keys_and_formulas_defused(load_doc: dict[str, Any],
                                                     tmp_path: Path) -> None:
    bare = {k: v for k, v in load_doc.items() if k not in ("timeseries", "knees")}
    assert len(write_csv(bare, tmp_path / "bare")) == 5
    ts = load_doc["timeseries"]
    ts["paths"]["=cmd|' /C calc'!A0"] = ts["paths"].pop("ROC")
    ts["paths"]["null"] = ts["paths"].pop("DPF")[:3]
    for iv in ts["paths"]["=cmd|' /C calc'!A0"]:
        iv["hops"]["@SUM(1)"] = iv["hops"].pop("edge")
    k = load_doc["knees"][0]
    k.update(path="=cmd|' /C calc'!A0", hop="+1", sentence="-2+3", ci=None)
    load_doc["knees"].append({"path": None, "metric": "ttfb_p50"})
    write_csv(load_doc, tmp_path)
    header, rows = read(tmp_path / "timeseries.csv")
    assert rows[0]["path"] == "'=cmd|' /C calc'!A0"
    assert rows[-1]["path"] == ""                     # requests on no path
    assert "'hops.@SUM(1).own_ms.p50" not in header   # a dotted name: not defused...
    assert "hops.@SUM(1).own_ms.p50" in header        # ...it starts with "hops."
    assert rows[0]["rate_per_s"] == repr(ts["paths"]["=cmd|' /C calc'!A0"][0]["rate_per_s"])
    _, rows = read(tmp_path / "knees.csv")
    assert (rows[0]["path"], rows[0]["hop"], rows[0]["sentence"]) == (
        "'=cmd|' /C calc'!A0", "'+1", "'-2+3")
    assert (rows[0]["ci_low"], rows[0]["ci_high"]) == ("", "")
    assert rows[1]["path"] == "" and rows[1]["rate_per_s"] == ""
    load_doc["knees"] = []
    write_csv(load_doc, tmp_path / "none")
    assert read(tmp_path / "none" / "knees.csv") == (list(KNEE_COLUMNS), [])


# --- in a browser ---------------------------------------------------------------------


@pytest.mark.slow
def test_load_section_in_chromium(tmp_path: Path, load_doc: dict[str, Any]) -> None:
    from test_report_chromium import CHROMIUM, chromium, console

    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium package")
    page = tmp_path / "load.html"
    page.write_text(render_html(hostile(synthetic(load_doc, n=2_000, interval_ms=100.0))),
                    encoding="utf-8")
    run = chromium(tmp_path, page, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    assert console(run.stderr) == []
    dom = run.stdout
    assert "<h2>Load</h2>" in dom and dom.count('class="chart load"') == 3
    assert "<script" not in dom.lower().replace("&lt;script", "")
