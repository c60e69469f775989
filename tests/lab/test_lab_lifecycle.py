"""The lab comes up and goes down cleanly: processes, threads, ports, files.

Also when it fails to start (a port in use), when its load overruns the time limit,
and when ``netdiag lab`` is interrupted with Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from labtools import LIVE, alive, children, lab_ports, port_free

from netdiag.lab import Lab, LabError, LabParams
from netdiag.lab import params as P

pytestmark = [pytest.mark.slow, LIVE]
ROOT = Path(__file__).resolve().parents[2]


def _assert_clean(before_children: set[int], before_threads: set[threading.Thread],
                  pids: dict[str, int]) -> None:
    assert children() - before_children == set(), "child processes left behind"
    assert [p for p in pids.values() if alive(p)] == [], "a lab process survived"
    left = [t.name for t in threading.enumerate() if t not in before_threads and t.is_alive()]
    assert left == [], f"threads left behind: {left}"
    busy = [f"{ip}:{port}" for ip, port, kind in lab_ports() if not port_free(ip, port, kind)]
    assert busy == [], f"ports still taken: {busy}"


@pytest.mark.timeout(60)
def test_up_and_down_cleanly(tmp_path: Path) -> None:
    before_children = children()
    before_threads = set(threading.enumerate())
    with Lab(LabParams(requests=4, concurrency=2, think_ms=5, router_delay_ms=2)) as lab:
        pids = lab.pids()
        assert set(pids) == {"dns", "edge", "router", "roc-origins", "dpf-origins",
                             "redis-server"}
        assert all(alive(p) for p in pids.values())
        assert children() - before_children == set(pids.values())
        # every server is listening: none of its ports can be taken now
        assert [f"{ip}:{port}" for ip, port, kind in lab_ports() if port_free(ip, port, kind)] == []
        workdir = Path(lab.keylog).parent if lab.keylog else None
        ledger = lab.drive()
        assert ledger["paths"]["ROC"]["statuses"] == {"200": 4}
        assert ledger["paths"]["DPF"]["statuses"] == {"200": 4}
        assert ledger["errors"] == []
        # a second load on the same lab
        again = lab.drive()
        assert again["router"]["upstream_connections"] == 4
    _assert_clean(before_children, before_threads, pids)
    assert workdir is not None and not workdir.exists(), "temporary files left behind"


@pytest.mark.timeout(60)
def test_port_in_use_is_one_clear_error_and_nothing_is_left() -> None:
    before_children = children()
    before_threads = set(threading.enumerate())
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((P.ROUTER_IP, P.ROUTER_PORT))
    squatter.listen(1)
    try:
        lab = Lab(LabParams())
        with pytest.raises(LabError, match=r"127\.0\.0\.11:8080.*in use"):
            lab.start()
        pids = lab.pids()
    finally:
        squatter.close()
    assert pids == {}
    _assert_clean(before_children, before_threads, {})


@pytest.mark.timeout(60)
def test_time_limit_stops_the_load_and_cleans_up() -> None:
    before_children = children()
    before_threads = set(threading.enumerate())
    params = LabParams(requests=500, concurrency=1, think_ms=40, timeout_s=6)
    started = time.monotonic()
    with pytest.raises(LabError, match="time limit"), Lab(params) as lab:
        pids = lab.pids()
        lab.drive()
    assert time.monotonic() - started < 20
    _assert_clean(before_children, before_threads, pids)


@pytest.mark.timeout(60)
def test_exception_inside_the_block_still_tears_down() -> None:
    before_children = children()
    before_threads = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="boom"), Lab(LabParams(requests=2)) as lab:
        pids = lab.pids()
        lab.start_capture()
        raise RuntimeError("boom")
    _assert_clean(before_children, before_threads, pids)


def _lab_processes() -> list[int]:
    """Processes of any lab on this machine (serve roles, the lab's redis-server)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"netdiag.lab.serve" in cmd or (b"redis-server" in cmd and b"127.0.0.12" in cmd):
            out.append(int(entry.name))
    return out


@pytest.mark.timeout(90)
def test_ctrl_c_stops_netdiag_lab_cleanly(tmp_path: Path) -> None:
    assert _lab_processes() == []
    out = tmp_path / "int.pcapng"
    proc = subprocess.Popen(
        [sys.executable, "-m", "netdiag", "lab", "-w", str(out), "--requests", "2000",
         "--concurrency", "2", "--think-ms", "30", "--no-report"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(_lab_processes()) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_lab_processes()) == 6, "the lab did not come up"
        time.sleep(1.0)  # well into the load
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert _lab_processes() == []
    busy = [f"{ip}:{port}" for ip, port, kind in lab_ports() if not port_free(ip, port, kind)]
    assert busy == []
    assert not out.exists()


@pytest.mark.timeout(60)
def test_cli_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((P.EDGE_IP, P.EDGE_PORT))
    squatter.listen(1)
    try:
        p = subprocess.run([sys.executable, "-m", "netdiag", "lab", "-w",
                            str(tmp_path / "x.pcapng")], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    finally:
        squatter.close()
    assert p.returncode == 1
    lines = [x for x in p.stderr.splitlines() if x.startswith("netdiag:")]
    assert lines == ["netdiag: error: cannot bind 127.0.0.10:443: in use (another lab "
                     "running?)"], p.stderr
    assert "Traceback" not in p.stderr
    assert _lab_processes() == []

    # redis-server missing, not root: said in one line each, nothing started
    from click.testing import CliRunner

    import netdiag.lab.redis_store as store
    from netdiag.cli import cli

    monkeypatch.setattr(store, "find_redis_server", lambda: None)
    res = CliRunner().invoke(cli, ["lab", "-w", str(tmp_path / "y.pcapng")])
    assert isinstance(res.exception, LabError)
    assert "install redis-server" in str(res.exception)
    monkeypatch.undo()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = CliRunner().invoke(cli, ["lab", "-w", str(tmp_path / "y.pcapng")])
    assert isinstance(res.exception, LabError)
    assert "needs root" in str(res.exception)
    assert not (tmp_path / "y.pcapng").exists()
