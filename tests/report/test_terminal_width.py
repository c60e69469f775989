"""The terminal report on narrow terminals (issue 12): tables fit, no number is cut."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"


def _report(width: int) -> str:
    env = dict(os.environ, COLUMNS=str(width), NETDIAG_JOBS="1")
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(ANTHO), "--no-profile"],
                       capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return p.stdout


def _slowest_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Slowest connections"))
    block = []
    for line in lines[start + 1:]:
        if not line.strip() and block and len(block) > 3:
            break
        block.append(line)
    return block


@pytest.mark.parametrize("width", [60, 80, 120])
def test_slowest_connections_fit_without_cutting_numbers(width: int) -> None:
    text = _report(width)
    block = _slowest_block(text)
    assert all(len(line) <= width for line in block)
    assert not any("…" in line for line in block), block
    header = next(line for line in block if "TTFB" in line)
    assert header.split()[:2] == ["id", "server"] and "TTFB" in header.split()
    rows = [line for line in block if re.match(r"^ C\d+ ", line)]
    assert rows
    for row in rows:  # every TTFB is a whole number of the figure's format
        assert re.search(r"\d+\.\d+~?\s+\d+\s+\d+\s*$|\d+\.\d+~?\s+\d+\s*$", row), row
    if width >= 80:
        assert "SNI" in header  # room for it at 80 columns


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("profile", [True, False])
def test_whole_report_fits_and_cuts_nothing(width: int, profile: bool) -> None:
    env = dict(os.environ, COLUMNS=str(width), NETDIAG_JOBS="1")
    args = [] if profile else ["--no-profile"]
    text = subprocess.run([sys.executable, "-m", "netdiag", "report", str(ANTHO), *args],
                          capture_output=True, text=True, env=env, check=True,
                          cwd=ROOT).stdout
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    # the budget splits its paths over tables rather than cut an address
    budget_headers = [line for line in text.splitlines() if line.startswith("┃ phase")]
    assert budget_headers
    addresses = re.findall(r"\d+\.\d+\.\d+\.\d+:\d+", " ".join(budget_headers))
    if not profile:
        assert len(set(addresses)) == 4, budget_headers


GOLDEN_DIR = ROOT / "tests" / "data"


@pytest.mark.parametrize("profile", [True, False], ids=["profile", "no-profile"])
def test_golden_rendering_at_80_columns(profile: bool) -> None:
    """The terminal report of the shipped capture at 80 columns, exactly (the file is
    what an engineer sees; ``NETDIAG_UPDATE_GOLDEN=1`` rewrites it after an intended
    change, as for the JSON baseline)."""
    env = dict(os.environ, COLUMNS="80", NETDIAG_JOBS="1")
    args = [] if profile else ["--no-profile"]
    text = subprocess.run([sys.executable, "-m", "netdiag", "report",
                           "captures/antho.pcapng", *args], capture_output=True, text=True,
                          env=env, check=True, cwd=ROOT).stdout
    golden = GOLDEN_DIR / f"antho.80col{'' if profile else '.no-profile'}.txt"
    if os.environ.get("NETDIAG_UPDATE_GOLDEN") or not golden.exists():
        golden.write_text(text, encoding="utf-8")
        if not os.environ.get("NETDIAG_UPDATE_GOLDEN"):
            pytest.fail(f"wrote the missing {golden.name}: check it and commit it")
    assert text == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("profile", [True, False])
def test_terms_explained_once_where_they_first_appear(profile: bool) -> None:
    env = dict(os.environ, COLUMNS="200", NETDIAG_JOBS="1")
    args = [] if profile else ["--no-profile"]
    text = subprocess.run([sys.executable, "-m", "netdiag", "report", str(ANTHO), *args],
                          capture_output=True, text=True, env=env, check=True,
                          cwd=ROOT).stdout
    assert "link EN10MB (Ethernet)" in text
    first_h2c = text.index("h2c")  # the shipped capture has h2c hops
    line_end = text.index("\n", first_h2c)
    assert "= HTTP/2 without TLS" in text[first_h2c:line_end]  # said where it first appears
    assert text.count("HTTP/2 without TLS") == 1
    explained = "Inferred: named by netdiag from the addresses"
    if profile:
        assert "(inferred)" not in text and explained not in text
    else:
        first = text.index("(inferred)")
        assert text.count(explained) == 1
        assert text.index(explained) > first
        assert text.index(explained) < text.index("Latency budget")  # the same paragraph
