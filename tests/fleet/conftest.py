"""A real Dask cluster on loopback for the fleet tests: a scheduler and two workers,
each a process started here (``dask scheduler``, ``dask worker``) and killed at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # jobs_capture
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fleetcaps


@dataclass
class Cluster:
    scheduler_file: Path
    client: Any
    procs: list[subprocess.Popen[bytes]]
    logs: Path

    def worker_pids(self) -> dict[str, int]:
        return dict(self.client.run(os.getpid))

    def wait_for_workers(self, n: int = 2, timeout: float = 60) -> None:
        self.client.wait_for_workers(n, timeout=timeout)


def _dask(*args: str) -> list[str]:
    exe = shutil.which("dask")
    if exe is not None:
        return [exe, *args]
    module = {"scheduler": "distributed.cli.dask_scheduler",
              "worker": "distributed.cli.dask_worker"}[args[0]]
    return [sys.executable, "-m", module, *args[1:]]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:  # whatever is left, and the worker processes the nannies started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("distributed")
    from distributed import Client

    d = tmp_path_factory.mktemp("dask")
    sched_file = d / "scheduler.json"
    logs = d / "logs"
    logs.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, cmd: list[str]) -> None:
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=d, start_new_session=True))

    client = None
    try:
        start("scheduler", _dask("scheduler", "--host", "127.0.0.1", "--port", "0",
                                 "--scheduler-file", str(sched_file), "--no-dashboard"))
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("the Dask scheduler did not start: "
                                   + (logs / "scheduler.log").read_text())
            time.sleep(0.1)
        for k in range(2):
            start(f"worker{k}", _dask("worker", "--scheduler-file", str(sched_file),
                                      "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                                      "--local-directory", str(d / f"w{k}")))
        client = Client(scheduler_file=str(sched_file), timeout=60, set_as_default=False)
        client.wait_for_workers(2, timeout=90)
        yield Cluster(sched_file, client, procs, logs)
    finally:
        if client is not None:
            client.close()
        _stop(procs)
