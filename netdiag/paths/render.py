"""Rich renderables for paths: hop chains, the latency budget table, the differences.

Formatters only: they build renderables, the command prints them. Names, servers,
commands, sentences and finding text can come from the capture: every one goes through
:mod:`netdiag.textsafe` (shown as text, never read as rich markup, control and
bidirectional characters made visible).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from netdiag.analysis.stats import quantile
from netdiag.paths.apply import PathsAnalysis
from netdiag.paths.budget import MAX_DIRECT_PAIRS, HopBudget, PathBudget
from netdiag.paths.shown import PATHS_SHOWN, PathSize, not_shown_sentence, shown_names
from netdiag.records import Connection
from netdiag.textsafe import SENTENCE_LIMIT, safe_cell, safe_markup, safe_text


def _fmt(sorted_values: Sequence[float], q: float) -> str:
    if not sorted_values:
        return "–"
    x = quantile(sorted_values, q)
    return f"{x:.1f}" if x < 1000 else f"{x / 1000:.2f} s"


def _servers(h: HopBudget, k: int = 3) -> str:
    s = sorted(h.servers)
    shown = ", ".join(s[:k])
    return shown + (f" +{len(s) - k}" if len(s) > k else "")


def hop_tree(b: PathBudget, profile_path: bool) -> Any:
    """The path's hops as a tree, from who called whom in the chains."""
    from rich.tree import Tree

    how = "profile" if profile_path else "inferred"
    reuse = "" if b.reuse_rate is None else f", connection reuse {b.reuse_rate * 100:.0f}%"
    linked = ""
    if b.multi_hop:
        linked = f"; {b.linked} linked to every hop"
        if b.ambiguous:
            linked += f", {b.ambiguous} ambiguous"
    title = (f"[bold]{safe_markup(b.name)}[/] ({how}): {b.requests} client request"
             f"{'s' if b.requests != 1 else ''} on {len(b.client_connections)} "
             f"connection{'s' if len(b.client_connections) != 1 else ''}{reuse}{linked}")
    tree = Tree(title, highlight=False)
    hops = b.ordered_hops()
    children: dict[str, list[HopBudget]] = {}
    roots: list[HopBudget] = []
    for h in hops:
        if h.callers:
            caller = max(h.callers.items(), key=lambda kv: kv[1])[0]
            children.setdefault(caller, []).append(h)
        else:
            roots.append(h)
    seen: set[str] = set()

    def label(h: HopBudget) -> str:
        bits = [f"[bold]{safe_markup(h.name)}[/] {safe_markup(_servers(h))}"]
        if h.requests:
            bits.append(f"{h.requests} req on {len(h.connections)} conn")
        if h.commands:
            bits.append(safe_markup(", ".join(f"{cmd} ×{len(v)}"
                                              for cmd, v in sorted(h.commands.items()))))
        return " · ".join(bits)

    def add(node: Any, h: HopBudget) -> None:
        if h.name in seen:
            return
        seen.add(h.name)
        sub = node.add(label(h))
        for c in children.get(h.name, []):
            add(sub, c)

    for h in roots:
        add(tree, h)
    for h in hops:
        if h.name not in seen:
            add(tree, h)
    return tree


def _sizes(budgets: Sequence[PathBudget]) -> list[PathSize]:
    return [PathSize(b.name, b.inferred, b.multi_hop, b.requests) for b in budgets]


def shown_paths(budgets: Sequence[PathBudget], limit: int = PATHS_SHOWN) -> list[PathBudget]:
    """The paths a terminal shows (:func:`netdiag.paths.shown.shown_names`), in name
    order."""
    names = shown_names(_sizes(budgets), limit)
    return sorted((b for b in budgets if b.name in names), key=lambda b: b.name)


def not_shown_line(budgets: Sequence[PathBudget], shown: Sequence[PathBudget]) -> Any:
    """One dim line for the paths :func:`shown_paths` left out (None when none was)."""
    from rich.text import Text

    sentence = not_shown_sentence(_sizes(budgets), {b.name for b in shown})
    return None if sentence is None else Text(sentence, style="dim")


PHASE_ROWS = (("dns", "DNS lookup"), ("tcp", "TCP handshake"), ("tls", "TLS handshake"))


def budget_table(budgets: Sequence[PathBudget]) -> Any:
    """Phases down, paths across: ``median / p99 (samples)`` in milliseconds.

    A renderable that lays itself out for the terminal's width: the paths are split
    over as many tables as it takes for every figure to fit whole (a path name wraps at
    its spaces, a number never)."""
    return _BudgetTables(list(budgets))


PHASE_WIDTH = 24
"""Widest the phase column grows (longer phase names wrap)."""


class _BudgetTables:
    def __init__(self, budgets: list[PathBudget]) -> None:
        self.budgets = budgets

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield from _budget_tables(self.budgets, options.max_width)


def _budget_rows(budgets: Sequence[PathBudget]) -> list[tuple[str, str | None,
                                                              list[tuple[str, str] | None]]]:
    """(label, style, per budget (figures, samples) or None) for every row."""
    rows: list[tuple[str, str | None, list[tuple[str, str] | None]]] = []

    def row(label: str, get: Any, style: str | None = None) -> None:
        cells: list[tuple[str, str] | None] = []
        for b in budgets:
            vals = sorted(get(b))
            cells.append((f"{_fmt(vals, 0.5)} / {_fmt(vals, 0.99)} ", f"({len(vals)})")
                         if vals else None)
        rows.append((label, style, cells))

    for key, label in PHASE_ROWS:
        row(label, lambda b, k=key: b.samples(k))
    if any(b.quic for b in budgets):
        row("QUIC handshake", lambda b: b.samples("quic"))
    names: list[str] = []
    for b in sorted(budgets, key=lambda b: -len(b.hops)):
        for h in b.ordered_hops():
            if h.name not in names:
                names.append(h.name)
    for name in names:
        if any((h := b.hops.get(name)) is not None and h.setup for b in budgets):
            row(f"{name}: connection setup",
                lambda b, n=name: b.hops[n].setup if n in b.hops else [])
        row(f"{name}: own time", lambda b, n=name: b.hops[n].own if n in b.hops else [])
        for part, label in (("before_calls", "before its calls"),
                            ("between_calls", "between its calls"),
                            ("after_calls", "after its calls")):
            if any(name in b.hops and any(b.hops[name].own_split[part]) for b in budgets):
                row(f"  {label}", lambda b, n=name, k=part:
                    b.hops[n].own_split[k] if n in b.hops else [], style="dim")
    row("origin think time", lambda b: b.think)
    row("transfer (first to last byte)", lambda b: b.transfer)
    row("time to first byte", lambda b: b.ttfb, style="bold")
    row("time to last byte", lambda b: b.ttlb)
    return rows


def _budget_tables(budgets: Sequence[PathBudget], width: int) -> list[Any]:
    from rich.table import Table
    from rich.text import Text

    rows = [(safe_cell(label), style, cells) for label, style, cells in _budget_rows(budgets)]
    headers = [safe_cell(b.name) for b in budgets]
    col_w = []
    for i, name in enumerate(headers):
        cells = [len(c[0]) + len(c[1]) for _l, _s, cs in rows if (c := cs[i]) is not None]
        col_w.append(max([1, *cells, *(len(w) for w in name.split())]))
    # the phase names whole when every path still fits beside them, else wrapped
    phase_w = max(len(r[0]) for r in rows)
    if 1 + phase_w + 3 + sum(w + 3 for w in col_w) > width:
        phase_w = min(PHASE_WIDTH, phase_w)
    chunks: list[list[int]] = []
    used = 1 + phase_w + 3  # left edge, phase column with its padding and rule
    for i, w in enumerate(col_w):
        if chunks and used + w + 3 <= width:
            chunks[-1].append(i)
            used += w + 3
        else:
            chunks.append([i])
            used = 1 + phase_w + 3 + w + 3
    tables = []
    for n, chunk in enumerate(chunks):
        title = "Latency budget (ms): median / p99 (samples) per path"
        if len(chunks) > 1:
            title += f" ({n + 1} of {len(chunks)})"
        t = Table(title=title, title_justify="left", header_style="bold")
        t.add_column("phase", min_width=min(phase_w, 14), max_width=phase_w)
        for i in chunk:
            t.add_column(headers[i], justify="right", min_width=col_w[i], no_wrap=True)
        for label, style, cells in rows:
            out: list[Any] = [label]
            for i in chunk:
                c = cells[i]
                out.append(Text("–", style="dim") if c is None
                           else Text.assemble(c[0], (c[1], "dim")))
            t.add_row(*out, style=style)
        tables.append(t)
    return tables


SHOWN_IN_DIFFERENCES = frozenset({"path-difference"})
"""Finding codes whose sentences the differences block already prints: a terminal view
that shows the block leaves them out of its findings, so no sentence appears twice."""


def differences(analysis: PathsAnalysis, declined: bool = True) -> Any:
    """The path differences: each stated one once, then one dim line for those the data
    does not support (``--format json`` lists them with their reasons)."""
    from rich.console import Group
    from rich.text import Text

    lines = []
    said: set[str] = set()
    for d in analysis.differences:
        if d.supported and d.sentence not in said:
            said.add(d.sentence)
            lines.append(Text("• " + safe_text(d.sentence, SENTENCE_LIMIT)))
    rest = [d for d in analysis.differences if not d.supported]
    if declined and rest:
        lines.append(Text(f"• {len(rest)} comparison{'s' if len(rest) != 1 else ''} without "
                          "enough evidence (too few samples, or an interval that includes "
                          "0): --format json lists them", style="dim"))
    if not lines:
        have = sum(1 for b in analysis.budgets.values() if b.ttfb)
        lines.append(Text(
            "Only one path has requests: nothing to compare." if have <= 1 else
            f"No pair of the {have:,} paths with requests is compared: paths a profile "
            "names are compared with each other, inferred paths through a proxy with the "
            f"direct ones (more than {MAX_DIRECT_PAIRS} direct servers pooled as one), "
            "direct servers with each other when few", style="dim"))
    return Group(Text("Differences between paths (95% bootstrap CI of the median "
                      "difference)", style="bold"), *lines)


def _chain_line(steps: Sequence[Any]) -> Any:
    from rich.text import Text

    root = steps[0].node
    r = root.req
    ttfb = None if r.first_byte_ns is None else (r.first_byte_ns - r.ts_ns) / 1e6
    t = Text(f"{safe_text(root.label)} {safe_text(steps[0].what)}", style="bold")
    if ttfb is not None:
        t.append(f" {ttfb:.1f} ms")
    t.append(":")
    for st in steps:
        own = "" if st.own_ns is None else f" {st.own_ns / 1e6:.1f}"
        setup = "" if st.node.setup_ns is None else f" (+{st.node.setup_ns / 1e6:.1f} setup)"
        t.append(f"\n  {'  ' * st.depth}{safe_text(st.hop or st.conn.server)}{own}{setup}")
        if st.node.link is not None:
            style = "yellow" if st.node.link == "ambiguous" else "dim"
            t.append(f" [{safe_text(st.node.link)}]", style=style)
    return t


def slowest_chains(analysis: PathsAnalysis) -> Any:
    """Per path through more than one hop, the chain of its slowest client request (own
    time per hop in ms, and how each link was made)."""
    from rich.console import Group
    from rich.text import Text

    lines: list[Any] = []
    for name in sorted(analysis.budgets):
        b = analysis.budgets[name]
        roots = [r for r in b.roots if r.children and r.req.first_byte_ns is not None]
        if not b.multi_hop or not roots:
            continue
        worst = max(roots, key=lambda r: (r.req.first_byte_ns or 0) - r.req.ts_ns)
        lines.append(Text(f"{safe_text(name)}: ", style="bold") + _chain_line(
            analysis.chains.steps(worst)))
    if not lines:
        return None
    return Group(Text("Slowest request per path, hop by hop (own ms; [how it was linked])",
                      style="bold"), *lines)


def attribution_table(connections: Sequence[Connection]) -> Any:
    """Every connection with its path, hop and first evidence line."""
    from rich.table import Table

    t = Table(title="Attribution", title_justify="left", header_style="bold")
    for col in ("conn", "client", "server", "path", "hop", "how", "evidence"):
        t.add_column(col, overflow="fold")
    for c in connections:
        p = c.path
        if p is None:
            t.add_row(safe_cell(c.id), safe_cell(c.client), safe_cell(c.server), "–", "–",
                      "", "", style="dim")
            continue
        t.add_row(safe_cell(c.id), safe_cell(c.client), safe_cell(c.server),
                  safe_cell(p["name"]), safe_cell(p["hop"]),
                  "inferred" if p["inferred"] else "profile",
                  safe_cell("; ".join(map(str, p["evidence"][:2])), 1024))
    return t


def attribution_line(connections: Sequence[Connection], limit: int = PATHS_SHOWN,
                     first: Collection[str] = ()) -> str:
    """``24 connections on ROC (profile), 6 on DPF (profile), 1 without a path``; beyond
    ``limit`` paths, those named in ``first`` (the paths shown below it), then those a
    profile names, then those with the most connections, and a count of the rest."""
    counts: Counter[tuple[str, bool]] = Counter()
    none = dns = 0
    for c in connections:
        if c.path is None and c.protocol == "dns":
            dns += 1
        elif c.path is None:
            none += 1
        else:
            counts[(c.path["name"], bool(c.path["inferred"]))] += 1
    kept = sorted(counts.items())
    if len(kept) > limit:
        kept = sorted(sorted(kept, key=lambda kv: (kv[0][0] not in first, kv[0][1], -kv[1],
                                                   kv[0][0]))[:limit])
    parts = [f"{n} on {safe_text(name)} ({'inferred' if inf else 'profile'})"
             for (name, inf), n in kept]
    if len(kept) < len(counts):
        left = sum(counts.values()) - sum(n for _, n in kept)
        parts.append(f"{left} on {len(counts) - len(kept)} other paths")
    if dns:
        parts.append(f"{dns} DNS over TCP (no path)")
    if none:
        parts.append(f"{none} without a path (no rule matched, nothing to infer it from)")
    total = len(connections)
    line = f"{total} connection{'s' if total != 1 else ''}: " + ", ".join(parts)
    if any(inf for _name, inf in counts):
        line += (". Inferred: named by netdiag from the addresses (direct, or via an edge), "
                 "as no profile names them (--profile FILE, docs/profiles.md)")
    return line


def knee_table(analysis: PathsAnalysis, only: set[str] | None = None) -> Any:
    """Per path (``only``: of these), its load over the capture and the knee of its time
    to first byte against request rate (p99 and median), with the evidence, or why there
    is none."""
    from rich.table import Table
    from rich.text import Text

    from netdiag.paths.load import format_interval

    ts = analysis.timeseries
    if not ts:
        return None
    rows = {k: v for k, v in ts["paths"].items()
            if k != "null" and len(v) >= 3 and (only is None or k in only)}
    if not rows:
        return None
    knees = {(k["path"], k["metric"]): k for k in analysis.knees or []}
    declined = ts.get("knee_declined", {})
    interval = format_interval(round(ts["interval_ms"] * 1e6))
    t = Table(title=f"Load: knee of the time to first byte against request rate "
                    f"({interval} intervals)", title_justify="left", expand=False)
    for col in ("path", "intervals", "peak req/s", "p99 knee", "median knee"):
        t.add_column(col, overflow="fold")
    notes: list[Text] = []
    for name in sorted(rows):
        series = rows[name]
        peak = max(e["rate_per_s"] for e in series)
        cells = []
        for metric in ("ttfb_p99", "ttfb_p50"):
            k = knees.get((name, metric))
            if k is None:
                reason = declined.get(name, {}).get(metric, "no knee")
                cells.append(Text(safe_text(f"none: {reason}", SENTENCE_LIMIT), style="dim"))
            else:
                lo, hi = k["ci"]
                cells.append(Text(f"{k['rate_per_s']:,.1f} req/s ({lo:,.1f}-{hi:,.1f})"))
                notes.append(Text(safe_text(k["sentence"], SENTENCE_LIMIT)))
                notes.extend(Text("   " + safe_text(e, SENTENCE_LIMIT), style="dim")
                             for e in k["evidence"])
        t.add_row(safe_cell(name), str(len(series)), f"{peak:,.1f}", *cells)
    if not notes:
        return t
    from rich.console import Group

    return Group(t, *notes)


def render_all(analysis: PathsAnalysis, connections: Sequence[Connection],
               show_connections: bool = False) -> list[Any]:
    """Everything ``netdiag paths`` shows, in order."""
    from rich.text import Text

    budgets = [analysis.budgets[n] for n in sorted(analysis.budgets)
               if analysis.budgets[n].roots]
    shown = shown_paths(budgets)
    more = not_shown_line(budgets, shown)
    out: list[Any] = [Text(attribution_line(connections, first={b.name for b in shown}))]
    prof = analysis.profile
    for b in shown:
        out.append(hop_tree(b, prof is not None and prof.path(b.name) is not None))
    if budgets:
        out.append(budget_table(shown))
        if more is not None:
            out.append(more)
        chains = slowest_chains(analysis)
        if chains is not None:
            out.append(chains)
        out.append(differences(analysis))
        knees = knee_table(analysis, None if more is None else {b.name for b in shown})
        if knees is not None:
            out.append(knees)
    shown = [f for f in analysis.findings
             if not (budgets and f.code in SHOWN_IN_DIFFERENCES)]
    if shown:
        out.append(Text("Findings", style="bold"))
        for f in shown:
            color = {"critical": "red", "warning": "yellow"}.get(f.severity, "cyan")
            out.append(Text.assemble((f"{safe_text(f.severity):8} ", color),
                                     (safe_text(f.title, SENTENCE_LIMIT), "bold"),
                                     "\n         ", safe_text(f.detail, SENTENCE_LIMIT)))
    if show_connections:
        out.append(attribution_table(connections))
    return out
