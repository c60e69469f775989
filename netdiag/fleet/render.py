"""The ``groups`` of a fleet report (``--by``) in the terminal and as CSV."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from rich.table import Table

from netdiag.textsafe import safe_cell


def _p(block: dict[str, Any] | None, key: str) -> str:
    if not block or block.get(key) is None:
        return "-"
    return f"{block[key]:.1f}"


def _row(g: dict[str, Any]) -> dict[str, Any]:
    s = g["summary"]
    return {
        "key": g["key"], "files": len(g["files"]),
        "connections": s["tcp"]["connections"], "requests": s["http"]["requests"],
        "dns": s["dns"]["transactions"],
        "rtt_p50_ms": s["tcp"]["handshake_rtt_ms"].get("p50"),
        "tls_p50_ms": s["tls"]["handshake_ms"].get("p50"),
        "ttfb_p50_ms": s["http"]["ttfb_ms"].get("p50"),
        "ttfb_p90_ms": s["http"]["ttfb_ms"].get("p90"),
        "ttfb_p99_ms": s["http"]["ttfb_ms"].get("p99"),
        "truncated": bool(g.get("truncated")),
    }


def groups_table(groups: list[dict[str, Any]], by: str) -> Table:
    """One row per group: what it holds and its main percentiles."""
    t = Table(title=f"By {by}", title_justify="left")
    t.add_column(by, overflow="fold", ratio=1)
    for col in ("files", "conns", "requests", "DNS", "RTT p50", "TLS p50", "TTFB p50",
                "p90", "p99"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("", no_wrap=True)
    for g in groups:
        s = g["summary"]
        t.add_row(safe_cell(g["key"], None), str(len(g["files"])), str(s["tcp"]["connections"]),
                  str(s["http"]["requests"]), str(s["dns"]["transactions"]),
                  _p(s["tcp"]["handshake_rtt_ms"], "p50"), _p(s["tls"]["handshake_ms"], "p50"),
                  _p(s["http"]["ttfb_ms"], "p50"), _p(s["http"]["ttfb_ms"], "p90"),
                  _p(s["http"]["ttfb_ms"], "p99"),
                  "[red]DAMAGED[/]" if g.get("truncated") else "")
    return t


def write_groups_csv(groups: list[dict[str, Any]], directory: Path) -> Path:
    """``groups.csv`` in ``directory``: the rows of :func:`groups_table`."""
    path = directory / "groups.csv"
    rows = [_row(g) for g in groups]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["key"])
        w.writeheader()
        w.writerows(rows)
    return path
