"""Fleet reports end to end: rotated files as one capture, hosts apart, damage kept to its
set, URLs, and the same report from every executor, a real Dask cluster included
(``conftest.py``: a scheduler and two workers, processes on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fleetcaps as fc
import jobs_capture as gen
import pytest
from click.testing import CliRunner

from netdiag.cli import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NETDIAG_JOBS", "NETDIAG_EXECUTOR", "NETDIAG_DASK_SCHEDULER"):
        monkeypatch.delenv(var, raising=False)


def report(*args: str, code: int = 0) -> bytes:
    r = CliRunner().invoke(cli, ["report", "--no-profile", *args], catch_exceptions=False)
    assert r.exit_code == code, r.stderr
    return r.stdout_bytes


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "netdiag", "report", "--no-profile", *args],
                          capture_output=True, timeout=timeout, cwd=ROOT)


def without_files(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    doc["capture"]["files"] = None
    return doc


@pytest.fixture(scope="module")
def rotated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """One capture (3000 connections over 20 minutes) and the same cut into 5 ring files."""
    d = tmp_path_factory.mktemp("rotated")
    whole = d / "whole.pcap"
    gen.write_mixed(whole, 3000, seed=11)
    parts = fc.split_pcap(whole, fc.ring_names(d / "caps" / "host-a", "ring", 5, ".pcap"))
    return whole, d / "caps", parts


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three hosts of two rotated files each; host-b's second file is cut mid-packet."""
    d = fc.rotated_hosts(tmp_path_factory.mktemp("three") / "caps", "abc", 400, 2, 100)
    damaged = sorted((d / "host-b").iterdir())[1]
    fc.cut_mid_packet(damaged)
    return d, damaged


def _crossing(doc: dict[str, Any], parts: list[Path]) -> int:
    """Connections alive across a cut between two files."""
    cuts = [fc.read_packets(p)[0][0] / 1e9 for p in parts[1:]]
    n = 0
    for c in doc["connections"]:
        start, end = c["ts"], c["ts"] + (c["duration_ms"] or 0) / 1e3
        n += any(start < t < end for t in cuts)
    return n


# -- (a) rotated files are one capture ------------------------------------------------------

def test_rotated_files_report_as_the_unsplit_capture(rotated: tuple[Path, Path, list[Path]]
                                                      ) -> None:
    whole, caps, parts = rotated
    one = json.loads(report(str(whole), "--format", "json"))
    serial = report(str(caps), "--format", "json", "--executor", "serial")
    doc = json.loads(serial)
    assert doc["capture"]["files"] == [str(p) for p in parts]
    assert without_files(doc) == without_files(one)
    assert len(doc["connections"]) > 2900 and _crossing(doc, parts) >= 3
    assert report(str(caps), "--format", "json", "--executor", "local", "--jobs", "2") == serial
    # one set is what one analysis of its files gives (the pipeline alone, --one-set)
    assert report(*map(str, parts), "--format", "json", "--one-set") == serial
    # a glob, quoted: netdiag expands it
    glob = report(str(caps / "host-a" / "ring_*.pcap"), "--format", "json", "--executor",
                  "serial")
    assert glob == serial


@pytest.fixture(scope="module")
def antho_rotated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The shipped lab capture (long-lived HTTP/2 connections, TLS with keys) rewritten as
    one pcapng and cut into 5 ring files with dumpcap-like metadata."""
    d = tmp_path_factory.mktemp("antho")
    pkts = fc.read_packets(ROOT / "captures" / "antho.pcapng")
    meta = {"hardware": "Intel(R) Xeon(R)", "os_name": "Linux 6.1", "userappl": "Dumpcap 4.2",
            "if_name": "lo"}
    whole = d / "whole.pcapng"
    whole.write_bytes(fc.pcapng_bytes(pkts, **meta))
    parts = fc.split_pcapng(pkts, fc.ring_names(d / "caps", "antho", 5), **meta)
    return whole, parts


def test_connections_across_cuts_are_one_connection(antho_rotated: tuple[Path, list[Path]]
                                                    ) -> None:
    whole, parts = antho_rotated
    keys = str(ROOT / "captures" / "antho.keys")
    for extra in ([], ["--keylog", keys]):
        one = json.loads(report(str(whole), "--format", "json", *extra))
        doc = json.loads(report(str(parts[0].parent), "--format", "json", "--executor",
                                "serial", *extra))
        assert without_files(doc) == without_files(one)
        assert _crossing(doc, parts) >= 5
        assert sum(len(c["requests"]) for c in doc["connections"]) > 20
        assert report(str(parts[0].parent), "--format", "json", "--jobs", "2",
                      *extra) == report(str(parts[0].parent), "--format", "json",
                                        "--executor", "serial", *extra)


def test_jsonl_and_text_of_a_set(rotated: tuple[Path, Path, list[Path]]) -> None:
    whole, caps, _parts = rotated
    for fmt in ("jsonl", "text"):
        one = report(str(whole), "--format", fmt)
        got = report(str(caps), "--format", fmt, "--executor", "serial")
        if fmt == "jsonl":
            a, b = one.decode().splitlines(), got.decode().splitlines()
            assert a[:-1] == b[:-1]  # the capture record names the files
        else:  # the header names the files; the rest is the same
            assert got.splitlines()[-200:] == one.splitlines()[-200:]
            assert report(str(caps), "--format", fmt) == got


@pytest.mark.slow
def test_dask_equals_serial(dask_cluster: Any, rotated: tuple[Path, Path, list[Path]]) -> None:
    _whole, caps, _parts = rotated
    serial = report(str(caps), "--format", "json", "--executor", "serial")
    sched = str(dask_cluster.scheduler_file)
    for jobs in ("1", "2"):
        got = report(str(caps), "--format", "json", "--executor", "dask", "--scheduler", sched,
                     "--jobs", jobs)
        assert got == serial, f"--jobs {jobs}"
    lines = report(str(caps), "--format", "jsonl", "--executor", "serial")
    assert report(str(caps), "--format", "jsonl", "--executor", "dask", "--scheduler", sched,
                  "--jobs", "2") == lines


@pytest.mark.slow
def test_dask_progress_as_futures_complete(dask_cluster: Any,
                                           three_hosts: tuple[Path, Path]) -> None:
    seen = _progress(three_hosts[0], executor="dask",
                     scheduler=str(dask_cluster.scheduler_file), jobs=2)
    assert len(seen) >= 6  # one per completed shard task, and one per set merged


# -- (c) three hosts, one damaged -------------------------------------------------------------

def _group_check(doc: dict[str, Any], caps: Path, damaged: Path) -> None:
    groups = {g["key"]: g for g in doc["groups"]}
    assert list(groups) == ["host-a/ring_*.pcap", "host-b/ring_*.pcap", "host-c/ring_*.pcap"]
    assert [g["truncated"] for g in groups.values()] == [False, True, False]
    assert doc["capture"]["truncated"] is True
    named = [w for w in doc["capture"]["warnings"] if w["kind"] == "capture"]
    assert len(named) == 1 and named[0]["file"] == str(damaged)
    assert str(damaged) in named[0]["message"]
    ids = [c["id"] for c in doc["connections"]]
    assert len(ids) == len(set(ids)) == sum(g["summary"]["tcp"]["connections"]
                                            for g in groups.values())
    for h in "ac":  # the others in full: as reported alone
        alone = json.loads(report(str(caps / f"host-{h}"), "--format", "json"))
        g = dict(groups[f"host-{h}/ring_*.pcap"]["summary"])
        g.pop("paths")  # paths are attributed over the whole report, not per group
        assert g == {k: alone["summary"][k] for k in g}
    assert doc["summary"]["tcp"]["connections"] == len(ids)


def test_three_hosts_one_damaged(three_hosts: tuple[Path, Path]) -> None:
    caps, damaged = three_hosts
    out = report(str(caps), "--format", "json", "--by", "host", "--executor", "serial", code=3)
    doc = json.loads(out)
    _group_check(doc, caps, damaged)
    assert report(str(caps), "--format", "json", "--by", "host", code=3) == out
    # the other formats carry the groups too
    lines = [json.loads(x) for x in report(str(caps), "--format", "jsonl", "--by", "host",
                                           code=3).splitlines()]
    assert [g["key"] for g in lines if g["type"] == "group"] == [
        g["key"] for g in doc["groups"]]
    text = report(str(caps), "--by", "host", code=3).decode()
    assert "By host" in text and "DAMAGED" in text and "host-c/ring_*.pcap" in text
    html = report(str(caps), "--format", "html", "--by", "host", code=3).decode()
    section = html.split('<section id="groups">', 1)[1].split("</section>", 1)[0]
    for g in doc["groups"]:
        assert f"<td>{g['key']}</td>" in section
    assert section.count("<tr>") == len(doc["groups"]) + 1 and section.count("damaged") == 1
    assert '<section id="groups">' not in report(str(caps), "--format", "html", code=3).decode()
    by_set = json.loads(report(str(caps), "--format", "json", "--by", "set", code=3))
    assert [g["summary"] for g in by_set["groups"]] == [g["summary"] for g in doc["groups"]]
    by_file = json.loads(report(str(caps), "--format", "json", "--by", "file", code=3))
    assert len(by_file["groups"]) == 6
    assert sum(g["summary"]["tcp"]["connections"] for g in by_file["groups"]) == len(
        doc["connections"])


@pytest.mark.slow
def test_three_hosts_on_dask(dask_cluster: Any, three_hosts: tuple[Path, Path]) -> None:
    caps, damaged = three_hosts
    serial = report(str(caps), "--format", "json", "--by", "host", "--executor", "serial",
                    code=3)
    got = run(str(caps), "--format", "json", "--by", "host", "--executor", "dask",
              "--scheduler", str(dask_cluster.scheduler_file), "--jobs", "2")
    assert got.returncode == 3, got.stderr
    assert got.stdout == serial
    assert str(damaged) in got.stderr.decode()
    # the memory budget decides on the records' estimate, in the order of the sets,
    # wherever they ran: the same sketched report
    serial = report(str(caps), "--format", "json", "--by", "host", "--executor", "serial",
                    "--max-memory", "1M", code=3)
    assert json.loads(serial)["capture"]["limits_hit"]["max_memory"] == 1
    got = run(str(caps), "--format", "json", "--by", "host", "--executor", "dask",
              "--scheduler", str(dask_cluster.scheduler_file), "--max-memory", "1M")
    assert got.returncode == 3, got.stderr
    assert got.stdout == serial


def test_one_set_merges_every_source(three_hosts: tuple[Path, Path]) -> None:
    caps, _damaged = three_hosts
    plain = report(str(caps), "--format", "json", "--one-set", code=3)  # the pipeline alone
    assert report(str(caps), "--format", "json", "--one-set", "--executor", "serial",
                  code=3) == plain
    doc = json.loads(report(str(caps), "--format", "json", "--one-set", "--by", "set", code=3))
    assert [g["key"] for g in doc["groups"]] == ["all"]
    assert len(doc["groups"][0]["files"]) == 6


def _progress(caps: Path, **kw: Any) -> list[Any]:
    from netdiag.fleet import make_plan
    from netdiag.fleet.engine import FleetOptions, run_fleet
    from netdiag.fleet.inputs import expand_inputs
    from netdiag.pipeline import Options
    from netdiag.report.records_out import CollectingSink

    plan = make_plan(expand_inputs([str(caps)]).files)
    seen: list[Any] = []
    run_fleet(plan, CollectingSink(), Options(), FleetOptions(progress=seen.append, **kw))
    total = sum(p.stat().st_size for p in caps.rglob("*.pcap"))
    assert seen[-1].sets_done == seen[-1].sets == 3
    assert seen[-1].bytes_done == seen[-1].bytes_total == total
    done = [p.bytes_done for p in seen]
    assert done == sorted(done) and [p.sets_done for p in seen] == sorted(
        p.sets_done for p in seen)
    return seen


def test_progress_counts_sets_and_bytes(three_hosts: tuple[Path, Path]) -> None:
    seen = _progress(three_hosts[0], executor="serial")
    assert len(seen) > 3  # within the sets too


def test_max_records_sketches_the_summary(three_hosts: tuple[Path, Path]) -> None:
    caps, _damaged = three_hosts
    exact = json.loads(report(str(caps), "--format", "json", "--by", "host", code=3))
    doc = json.loads(report(str(caps), "--format", "json", "--by", "host",
                            "--max-records", "100", code=3))
    n_conn, n_dns = len(exact["connections"]), len(exact["dns"])
    assert doc["connections"] == [] and doc["dns"] == []
    assert doc["capture"]["records_omitted"] == {"connections": n_conn, "dns": n_dns}
    for s_exact, s_sk in [(exact["summary"], doc["summary"])] + [
            (a["summary"], b["summary"]) for a, b in zip(exact["groups"], doc["groups"],
                                                         strict=True)]:
        assert s_sk["sketch"] == {"relative_accuracy": 0.01}
        for sec, key in (("http", "ttfb_ms"), ("tcp", "handshake_rtt_ms"),
                         ("dns", "latency_ms")):
            a, b = s_exact[sec][key], s_sk[sec][key]
            assert (a["count"], a["min"], a["max"]) == (b["count"], b["min"], b["max"])
            for q in ("p50", "p90", "p99"):
                assert b[q] == pytest.approx(a[q], rel=0.05)
        assert s_sk["tcp"]["connections"] == s_exact["tcp"]["connections"]
    lines = report(str(caps), "--format", "jsonl", "--max-records", "100", code=3)
    types = [json.loads(x)["type"] for x in lines.splitlines()]
    assert types.count("connection") == n_conn  # JSON Lines still streams every record
    assert json.loads(lines.splitlines()[-2])["sketch"] == {"relative_accuracy": 0.01}


# -- (d) URLs ------------------------------------------------------------------------------------

def test_memory_urls_serial(rotated: tuple[Path, Path, list[Path]]) -> None:
    fsspec = pytest.importorskip("fsspec")
    _whole, caps, parts = rotated
    mem = fsspec.filesystem("memory")
    for p in parts:
        mem.pipe(f"/fleet-test/host-a/{p.name}", p.read_bytes())
    try:
        local = json.loads(report(str(caps), "--format", "json", "--executor", "serial"))
        for url in ("memory://fleet-test", "memory://fleet-test/host-a/ring_*.pcap"):
            doc = json.loads(report(url, "--format", "json", "--executor", "serial"))
            assert doc["capture"]["files"] == [f"memory:///fleet-test/host-a/{p.name}"
                                               for p in parts]
            assert without_files(doc) == without_files(local)
        one = f"memory://fleet-test/host-a/{parts[0].name}"
        assert json.loads(report(one, "--format", "json"))["capture"]["files"] == [one]
        r = CliRunner().invoke(cli, ["report", "memory://fleet-test/nothing.pcap"])
        assert r.exit_code == 1 and "no such file" in str(r.exception)
    finally:
        mem.rm("/fleet-test", recursive=True)


@pytest.mark.slow
def test_file_urls_on_dask(dask_cluster: Any, rotated: tuple[Path, Path, list[Path]]) -> None:
    _whole, caps, parts = rotated
    local = json.loads(report(str(caps), "--format", "json", "--executor", "serial"))
    url = "file://" + str(caps)
    doc = json.loads(report(url, "--format", "json", "--executor", "dask", "--scheduler",
                            str(dask_cluster.scheduler_file), "--jobs", "2"))
    assert doc["capture"]["files"] == ["file://" + str(p) for p in parts]
    assert without_files(doc) == without_files(local)


# -- errors ---------------------------------------------------------------------------------------

def test_input_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for args, words in (([str(tmp_path / "empty")], "no pcap or pcapng capture"),
                        (["bogus://x/y.pcap"], "unknown URL scheme"),
                        ([str(tmp_path / "*.pcap")], "no file matches")):
        p = run(*args)
        assert p.returncode == 1, p.stderr
        err = p.stderr.decode().strip().splitlines()
        assert len(err) == 1 and words in err[0] and err[0].startswith("netdiag: error:")
    env = {**os.environ, "NETDIAG_DASK_CONNECT_TIMEOUT": "1"}
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(tmp_path), "--executor",
                        "dask", "--scheduler", "tcp://127.0.0.1:9"], capture_output=True,
                       timeout=60, env=env, cwd=ROOT)
    assert p.returncode == 1
    # (the folder holds no capture: that is said first, before any scheduler is tried)
    assert b"no pcap or pcapng capture" in p.stderr


def test_unreachable_scheduler(rotated: tuple[Path, Path, list[Path]]) -> None:
    env = {**os.environ, "NETDIAG_DASK_CONNECT_TIMEOUT": "1"}
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(rotated[1]),
                        "--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"],
                       capture_output=True, timeout=60, env=env, cwd=ROOT)
    assert p.returncode == 1
    err = p.stderr.decode().strip().splitlines()
    assert err[-1].startswith("netdiag: error: cannot reach the Dask scheduler at "
                              "tcp://127.0.0.1:9")


# -- (b) a worker dies; Ctrl-C ----------------------------------------------------------------

@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough work that a task outlasts the tests' polling by far: 30k connections in 4
    ring files (a task takes about half a second on an idle machine; 10k made it 0.15 s
    once the scan got faster, and a worker was sometimes killed after its task)."""
    d = tmp_path_factory.mktemp("big")
    whole = d / "whole.pcap"
    gen.write_mixed(whole, 30_000, seed=5)
    fc.split_pcap(whole, fc.ring_names(d / "caps" / "host-z", "ring", 4, ".pcap"))
    whole.unlink()
    return d / "caps"


def _netdiag_tasks(client: Any) -> dict[str, int]:
    """Worker address -> netdiag tasks it is processing."""
    return {w: sum("netdiag-" in str(k) for k in keys)
            for w, keys in client.processing().items()}


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "netdiag", "report", "--no-profile", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)


def _wait_busy(client: Any, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [w for w, n in _netdiag_tasks(client).items() if n]
        if busy:
            return busy[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no netdiag task started")


@pytest.mark.slow
def test_a_worker_killed_mid_task(dask_cluster: Any, big: Path) -> None:
    serial = report(str(big), "--format", "json", "--executor", "serial")
    dask_cluster.wait_for_workers(2)
    pids = dask_cluster.worker_pids()
    proc = _start([str(big), "--format", "json", "--executor", "dask", "--scheduler",
                   str(dask_cluster.scheduler_file), "--jobs", "2"])
    victim = _wait_busy(dask_cluster.client, proc)
    time.sleep(0.05)  # inside the task (it takes about 0.5 s)
    assert _netdiag_tasks(dask_cluster.client).get(victim), "the task ended too soon"
    os.kill(pids[victim], signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()
    assert out == serial
    with pytest.raises(ProcessLookupError):
        os.kill(pids[victim], 0)
    dask_cluster.wait_for_workers(2)  # the nanny restarted it


@pytest.mark.slow
def test_ctrl_c_cancels_the_tasks(dask_cluster: Any, big: Path) -> None:
    dask_cluster.wait_for_workers(2)
    proc = _start([str(big), "--format", "json", "--executor", "dask", "--scheduler",
                   str(dask_cluster.scheduler_file), "--jobs", "2"])
    _wait_busy(dask_cluster.client, proc)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"interrupted" in err
    deadline = time.monotonic() + 20
    while any(_netdiag_tasks(dask_cluster.client).values()):
        assert time.monotonic() < deadline, "tasks still running after Ctrl-C"
        time.sleep(0.1)
