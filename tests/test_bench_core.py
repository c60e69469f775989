"""The benchmark names the core it measured and warns when it changed mid-case.

An editable install whose compiled sources are edited during a benchmark falls back to
the pure-Python core for every run that follows (``netdiag --version`` says why): the
key log rows of one benchmark ran 3.5x slower that way, with nothing in its table to say
so.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402


def _says(line: str) -> list[str]:
    return [sys.executable, "-c", f"print({line!r})"]


def test_the_core_is_read_from_the_version_line() -> None:
    assert bench.netdiag_core(_says("netdiag 0.1.0 (core: compiled, mypyc)"), {}) == \
        "compiled, mypyc"
    stale = "pure Python; netdiag/capture/reader.py changed since it was compiled"
    assert bench.netdiag_core(_says(f"netdiag 0.1.0 (core: {stale})"), {}) == stale


def _row(case: str, cores: list[str]) -> dict:
    return {"case": case, "format": "text", "jobs": 1, "cores": cores, "vs_tshark": 12.0,
            "vs_jobs1": None, "vs_jsonl": 1.0, "memory_vs_tshark": 0.05,
            "netdiag": {"ok": True}}


def test_a_case_whose_core_changed_is_flagged() -> None:
    mixed = bench.verdicts([_row("lab", ["compiled, mypyc", "pure Python; x changed"]),
                            _row("synthetic", ["compiled, mypyc"])])
    warnings = [v for v in mixed if v.startswith("WARNING")]
    assert len(warnings) == 1 and "[lab]" in warnings[0] and "pure Python" in warnings[0]
    steady = bench.verdicts([_row("synthetic", ["compiled, mypyc"])])
    assert not [v for v in steady if v.startswith("WARNING")]
