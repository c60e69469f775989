"""A finished report leaves without tearing its heap down (``netdiag.quick_exit``), yet
runs the exit handlers, writes every byte and keeps its exit code; other commands exit
the usual way."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from netdiag import quick_exit

SHIPPED = Path(__file__).resolve().parent.parent / "captures" / "antho.pcapng"

CHILD = """
import atexit, os, sys
real_exit = os._exit
def spy(code):  # the quick exit ends the process through os._exit, nothing else does here
    os.write(2, b"quick exit %d\\n" % code)
    real_exit(code)
os._exit = spy
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
sys.argv = ["netdiag"] + sys.argv[1:]
from netdiag.cli import main
main()
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_report_skips_the_teardown_but_not_the_exit_handlers(tmp_path: Path) -> None:
    p = _run("report", str(SHIPPED), "--format", "json", "--jobs", "1")
    assert p.returncode == 0, p.stderr
    assert "exit handler ran" in p.stderr
    assert "quick exit 0" in p.stderr
    doc = json.loads(p.stdout)  # every byte written to the pipe
    assert doc["connections"] and doc["summary"]
    out = tmp_path / "r.json"
    q = _run("report", str(SHIPPED), "--format", "json", "--jobs", "1", "-o", str(out))
    assert q.returncode == 0, q.stderr
    assert "quick exit 0" in q.stderr
    assert json.loads(out.read_text()) == doc  # and to a file


def test_a_truncated_capture_keeps_its_exit_code(tmp_path: Path) -> None:
    cut = tmp_path / "cut.pcapng"
    data = SHIPPED.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 7])
    p = _run("report", str(cut), "--format", "jsonl", "--jobs", "1")
    assert p.returncode == 3, p.stderr
    assert "quick exit 3" in p.stderr and "exit handler ran" in p.stderr
    lines = [json.loads(line) for line in p.stdout.splitlines()]  # every line whole
    assert {"summary", "capture"} <= {line["type"] for line in lines}


def test_other_commands_exit_the_usual_way() -> None:
    p = _run("--version")
    assert p.returncode == 0, p.stderr
    assert "quick exit" not in p.stderr and "exit handler ran" in p.stderr
    bad = _run("report", "/nonexistent/x.pcap")
    assert bad.returncode == 1 and "exit handler ran" in bad.stderr
    assert "quick exit" not in bad.stderr


def test_leave_returns_where_it_may_not_end_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quick_exit, "_allowed", False)
    quick_exit.leave(0)  # not allowed: returns
    monkeypatch.setattr(quick_exit, "_allowed", True)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)  # a thread shutdown would wait for
    worker.start()
    try:
        quick_exit.leave(0)  # returns instead of ending this test process
    finally:
        stop.set()
        worker.join()
