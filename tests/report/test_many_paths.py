"""A terminal shows a bounded number of paths, whatever the number of servers.

Without a profile every server is a path of its own: a capture of 50,000 connections,
each to another server, printed 506,405 lines (50 MB) of terminal report, one latency
budget table per one or two paths. The terminal shows :data:`PATHS_SHOWN` paths (those a
profile names, then those through a proxy, then those with the most client requests)
and counts the rest in one line; ``--format json`` keeps every path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netdiag.paths.budget import PathBudget
from netdiag.paths.render import shown_paths
from netdiag.paths.shown import PATHS_SHOWN

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hostile_shapes  # noqa: E402


def _capture(path: Path, counts: list[int]) -> None:
    """Short HTTP/1.1 connections, ``counts[s]`` of them to server ``s``
    (10.128.0.s:80), each a request and its answer."""
    order = [s for s, k in enumerate(counts) for _ in range(k)]
    cap = hostile_shapes.Pcap(path)
    try:
        hostile_shapes._short_conns(cap, 8 * len(order),
                                    lambda n: hostile_shapes.ip4(0x800000 + order[n % len(order)]))
    finally:
        cap.close()


def _run(*args: str) -> str:
    env = dict(os.environ, COLUMNS="120", NETDIAG_JOBS="1")
    p = subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return p.stdout


def _server(s: int) -> str:
    return f"10.128.0.{s}:80"


def _paths_section(out: str) -> str:
    start = out.index("\nPaths\n")
    return out[start:out.index("Differences between paths", start)]


SERVERS = PATHS_SHOWN + 18
"""Servers of the capture with many paths: server s has s + 1 connections."""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the busiest paths are the last servers
    path = tmp_path_factory.mktemp("many") / "many.pcap"
    _capture(path, [s + 1 for s in range(SERVERS)])
    return path


def test_the_report_shows_the_busiest_paths_and_counts_the_rest(many: Path) -> None:
    out = _run("report", str(many), "--no-profile")
    section = _paths_section(out)
    words = " ".join(section.split())
    n = SERVERS
    busiest, rest = range(n - PATHS_SHOWN, n), range(n - PATHS_SHOWN)
    for s in busiest:
        assert _server(s) in section
    for s in rest:
        assert _server(s) not in section
    left = sum(s + 1 for s in rest)
    assert f"{left} on {len(rest)} other paths" in words          # the attribution line
    assert f"{len(rest)} more paths with {left} client requests not shown" in words
    assert words.count("Latency budget") <= PATHS_SHOWN
    differences = " ".join(out[out.index("Differences between paths"):].split())
    assert f"No pair of the {n} paths with requests is compared" in differences
    # every path is still in the JSON document
    doc = json.loads(_run("report", str(many), "--no-profile", "--format", "json"))
    assert {c["path"]["name"] for c in doc["connections"]} == {
        f"direct {_server(s)}" for s in range(n)}


def test_the_paths_command_draws_a_tree_per_shown_path(many: Path) -> None:
    out = _run("paths", str(many), "--no-profile")
    assert out.count("(inferred): ") == PATHS_SHOWN
    assert f"{SERVERS - PATHS_SHOWN} more paths with" in " ".join(out.split())


def test_few_paths_are_all_shown(tmp_path: Path) -> None:
    path = tmp_path / "few.pcap"
    _capture(path, [1] * PATHS_SHOWN)
    section = _paths_section(_run("report", str(path), "--no-profile"))
    for s in range(PATHS_SHOWN):
        assert _server(s) in section
    assert "more path" not in section and "other paths" not in section


def _budget(name: str, inferred: bool, requests: int, multi_hop: bool = False) -> PathBudget:
    b = PathBudget(name, inferred)
    b.roots = [None] * requests  # type: ignore[list-item]
    b.multi_hop = multi_hop
    return b


def test_named_paths_then_proxies_then_the_busiest() -> None:
    budgets = [_budget(f"direct {i}", True, 100 + i) for i in range(20)]
    budgets += [_budget("ROC", False, 1), _budget("via edge", True, 2, multi_hop=True)]
    shown = shown_paths(budgets, limit=5)
    assert [b.name for b in shown] == ["ROC", "direct 17", "direct 18", "direct 19",
                                       "via edge"]
    assert [b.name for b in shown_paths(budgets[:3], limit=5)] == [
        "direct 0", "direct 1", "direct 2"]


def test_the_html_page_shows_the_busiest_paths_and_counts_the_rest(many: Path) -> None:
    page = _run("report", str(many), "--no-profile", "--format", "html")
    budget = page[page.index('<section id="paths">'):]
    budget = budget[:budget.index("</section>")]
    ttfb = page[page.index('<section id="ttfb">'):]
    ttfb = ttfb[:ttfb.index("</section>")]
    n = SERVERS
    for s in range(n - PATHS_SHOWN, n):
        assert _server(s) in budget and _server(s) in ttfb
    for s in range(n - PATHS_SHOWN):
        assert _server(s) not in budget and _server(s) not in ttfb
    left = sum(s + 1 for s in range(n - PATHS_SHOWN))
    note = f"{n - PATHS_SHOWN} more paths with {left} client requests not shown"
    assert note in budget and note in ttfb
    assert ttfb.count("histogram of time to first byte") == PATHS_SHOWN


def test_the_attribution_line_names_the_paths_shown_below_it_first() -> None:
    from netdiag.paths.render import attribution_line
    from netdiag.records import Connection

    conns = []
    for i in range(5):  # five busy direct servers, then a proxy with one connection
        for k in range(10 + i):
            c = Connection(id=f"C{i}-{k}", ts_ns=0, client="10.0.0.1:1000",
                           server=f"10.1.0.{i}:443")
            c.path = {"name": f"direct 10.1.0.{i}:443", "hop": "origin", "evidence": [],
                      "inferred": True}
            conns.append(c)
    via = Connection(id="V", ts_ns=0, client="10.0.0.1:1001", server="10.2.0.1:443")
    via.path = {"name": "via 10.2.0.1:443", "hop": "edge", "evidence": [], "inferred": True}
    conns.append(via)
    busiest = attribution_line(conns, limit=2)
    assert "direct 10.1.0.4:443" in busiest and "direct 10.1.0.3:443" in busiest
    assert "via 10.2.0.1" not in busiest and "34 on 4 other paths" in busiest
    line = attribution_line(conns, limit=2, first={"via 10.2.0.1:443"})
    assert "1 on via 10.2.0.1:443 (inferred)" in line and "direct 10.1.0.4:443" in line
    assert "direct 10.1.0.3:443" not in line and "46 on 4 other paths" in line
