"""The JSON writer's long record lists rendered in several processes (``jobs``): the
bytes one process writes, whatever goes wrong in a child."""

from __future__ import annotations

import io
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from netdiag.report import json_out
from netdiag.report.json_out import Records, write_json

ALONE = json_out._alone


def _doc(n: int, render: Any = None) -> dict[str, Any]:
    items = list(range(n))
    records = Records(items, render or (lambda i: {"id": f"C{i}", "x": i / 7, "s": "é"}))
    records.steps.append(lambda d, i: d.__setitem__("odd", i % 2 == 1))
    return {"capture": {"files": ["a"]}, "connections": records, "dns": [], "n": n}


def _written(doc: dict[str, Any], jobs: int, ensure_ascii: bool = True) -> str:
    out = io.StringIO()
    write_json(doc, out, jobs=jobs, ensure_ascii=ensure_ascii)
    return out.getvalue()


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """Small lists go parallel; temporary files in ``tmp_path``; the forks counted."""
    monkeypatch.setattr(json_out, "PARALLEL_MIN", 4)
    monkeypatch.setattr(json_out, "_alone", lambda: True)  # other tests' threads aside
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[int] = []
    real = os.fork

    def fork() -> int:
        pid = real()
        if pid:
            seen.append(pid)
        return pid

    monkeypatch.setattr(json_out.os, "fork", fork)
    return seen


@pytest.mark.parametrize("n", [4, 5, 17, 100])
@pytest.mark.parametrize("jobs", [2, 3])
def test_the_same_bytes_as_one_process(n: int, jobs: int, forks: list[int],
                                       tmp_path: Path) -> None:
    one = _written(_doc(n), 1)
    assert not forks
    assert _written(_doc(n), jobs) == one
    assert len(forks) == jobs - 1
    assert _written(_doc(n), jobs, ensure_ascii=False) == _written(_doc(n), 1, False)
    assert list(tmp_path.iterdir()) == []


def test_a_short_list_is_written_here(forks: list[int]) -> None:
    assert _written(_doc(3), 2) == _written(_doc(3), 1)
    assert not forks


def test_a_failing_child_leaves_its_part_to_the_parent(forks: list[int],
                                                       tmp_path: Path) -> None:
    parent = os.getpid()

    def render(i: int) -> dict[str, Any]:
        if os.getpid() != parent:
            raise ValueError("not in a child")
        return {"id": i}

    assert _written(_doc(50, render), 3) == _written(_doc(50, render), 1)
    assert len(forks) == 2
    assert list(tmp_path.iterdir()) == []


def test_no_fork_without_a_temporary_file_or_beside_a_thread(
        forks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    one = _written(_doc(40), 1)
    monkeypatch.setattr(json_out, "_alone", ALONE)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _written(_doc(40), 2) == one  # a forked child would get no such thread
    finally:
        stop.set()
        t.join()
    assert not forks

    def refuse(**_kw: Any) -> tuple[int, str]:
        raise OSError("read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert _written(_doc(40), 2) == one
    assert not forks
