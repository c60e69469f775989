"""What the formats make per record, made in several processes (``netdiag.report.fanout``):
the same list, in the same order, as one process makes; a child that fails or is left
behind changes nothing."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from netdiag.cli import cli
from netdiag.report import fanout
from netdiag.report.fanout import made_in_processes

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"


def _children() -> set[int]:
    """This process's child processes still there (zombies included), but for the
    shards of the analysis, which ``multiprocessing`` reaps when it is asked."""
    multiprocessing.active_children()
    pids: set[int] = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            pids.update(int(p) for p in f.read().split())
    return pids


@pytest.fixture
def small_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "MIN_SHARE", 3)
    monkeypatch.setattr(fanout, "BATCH", 4)


@pytest.mark.parametrize("jobs", [2, 3, 5])
@pytest.mark.parametrize("count", [0, 5, 6, 17, 100])
def test_the_list_one_process_makes(small_shares: None, jobs: int, count: int) -> None:
    items = [f"item {i}" for i in range(count)]
    got = list(made_in_processes(items, lambda s: (s.upper(), len(s)), jobs))
    assert got == [(s.upper(), len(s)) for s in items]
    assert not _children()


def test_shares_are_made_in_other_processes(small_shares: None) -> None:
    me = os.getpid()
    got = list(made_in_processes(range(30), lambda i: (i, os.getpid()), 3))
    assert [i for i, _pid in got] == list(range(30))
    makers = [pid for _i, pid in got]
    assert makers[:10] == [me] * 10  # the first share here, as it is read
    assert len(set(makers[10:20])) == len(set(makers[20:])) == 1
    assert len(set(makers)) == 3


def test_a_short_list_is_not_forked() -> None:
    me = os.getpid()
    got = list(made_in_processes(range(fanout.MIN_SHARE * 2 - 1),
                                 lambda i: os.getpid(), 8))
    assert set(got) == {me}


def test_a_failed_child_leaves_its_share_to_this_process(small_shares: None) -> None:
    me = os.getpid()

    def make(i: int) -> int:
        if os.getpid() != me and i == 15:
            raise ValueError("a child fails half way")
        return i * i

    assert list(made_in_processes(range(40), make, 4)) == [i * i for i in range(40)]
    assert not _children()


def test_a_child_killed_from_outside_leaves_its_share_too(small_shares: None) -> None:
    me = os.getpid()

    def make(i: int) -> int:
        if os.getpid() != me:
            os.kill(os.getpid(), 9)
        return -i

    assert list(made_in_processes(range(12), make, 2)) == [-i for i in range(12)]


def test_an_abandoned_iteration_leaves_no_child(small_shares: None) -> None:
    it = made_in_processes(range(60), lambda i: i, 4)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert not _children()


def test_an_error_here_leaves_no_child(small_shares: None) -> None:
    me = os.getpid()

    def make(i: int) -> int:
        if os.getpid() == me and i == 2:
            raise KeyError("this process fails")
        return i

    with pytest.raises(KeyError):
        list(made_in_processes(range(60), make, 4))
    assert not _children()


@pytest.mark.parametrize("keys", [False, True], ids=["keyless", "keylog"])
@pytest.mark.parametrize("fmt", ["json", "har", "parquet"])
def test_reports_made_in_processes_are_byte_identical(
        small_shares: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str,
        keys: bool) -> None:
    """The shipped capture's few connections split into shares of three."""
    monkeypatch.delenv("NETDIAG_JOBS", raising=False)
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    outputs = []
    for jobs in ("1", "2", "3"):
        out = tmp_path / f"jobs{jobs}"
        res = CliRunner().invoke(
            cli, ["report", str(ANTHO), "--format", fmt, "--jobs", jobs, "-o", str(out),
                  *(["--keylog", str(KEYS)] if keys else [])], catch_exceptions=False)
        assert res.exit_code == 0, res.stderr
        outputs.append({f.name: f.read_bytes() for f in out.iterdir()} if out.is_dir()
                       else out.read_bytes())
    assert outputs[0]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
    assert not _children()
