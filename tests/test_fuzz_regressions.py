"""Every input that once crashed a fuzz target is replayed (issue 11, docs/fuzzing.md).

``fuzz/regressions/TARGET/*`` go through ``fuzz.targets.TARGETS[TARGET]`` as a plain
function call (no atheris): no exception may escape and each input must finish in
:data:`TIME_LIMIT_S`. ``fuzz/regressions/cli/*.pcapng`` (mutated captures found by
``fuzz/mutate_cli.py``; a ``.keys`` file beside one is its key log) go through
``netdiag report`` in every format: never exit 4, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.mutate_cli import FORMATS  # noqa: E402  (the formats the fuzzer runs)
from fuzz.targets import TARGETS  # noqa: E402

REGRESSIONS = ROOT / "fuzz" / "regressions"
TIME_LIMIT_S = 10.0
"""Longest a regression input may take (atheris runs each target with -timeout=10)."""
NOT_INPUTS = {".txt", ".md"}


def _inputs() -> list[Path]:
    if not REGRESSIONS.is_dir():
        return []
    return sorted(p for p in REGRESSIONS.glob("*/*")
                  if p.is_file() and p.suffix not in NOT_INPUTS and p.parent.name in TARGETS)


def _cli_inputs() -> list[Path]:
    return sorted((REGRESSIONS / "cli").glob("*.pcapng")) if REGRESSIONS.is_dir() else []


def test_every_regression_directory_names_a_target() -> None:
    if not REGRESSIONS.is_dir():
        pytest.skip("no fuzz/regressions yet")
    names = {p.name for p in REGRESSIONS.iterdir() if p.is_dir()}
    assert names <= set(TARGETS) | {"cli"}


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_regression_input_is_handled(path: Path) -> None:
    target = TARGETS[path.parent.name]
    t0 = time.process_time()  # CPU time: what the input costs, not what the machine is doing
    target(path.read_bytes())
    took = time.process_time() - t0
    assert took < TIME_LIMIT_S, f"{path.name} took {took:.1f} s of CPU"


@pytest.mark.parametrize("name", sorted(TARGETS))
@pytest.mark.parametrize("data", [b"", b"\x00" * 64, bytes(range(256)) * 4],
                         ids=["empty", "zeros", "ramp"])
def test_every_target_takes_junk(name: str, data: bytes) -> None:
    """The harness itself keeps working (the TLS layer is being refactored: the targets
    reach it through the pipeline)."""
    TARGETS[name](data)


@pytest.mark.parametrize("path", _cli_inputs(), ids=lambda p: p.name)
def test_cli_regression_capture_never_exits_4(path: Path, tmp_path: Path) -> None:
    env = dict(os.environ, NETDIAG_DEBUG="1")
    env.pop("SSLKEYLOGFILE", None)
    keys = path.with_suffix(".keys")
    key_args = ["--keylog", str(keys if keys.exists() else ROOT / "captures" / "antho.keys")]
    runs = [[*key_args, "--format", f, "-o", str(tmp_path / f"out.{f}")] for f in FORMATS]
    runs.append(["--format", "jsonl", "-o", str(tmp_path / "wp.jsonl"),
                 "--write-pcapng", str(tmp_path / "out.pcapng")])
    for extra in runs:
        p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(path), "--no-profile",
                            *extra], capture_output=True, text=True, errors="replace",
                           env=env, timeout=120)
        assert p.returncode != 4, p.stderr[-3000:]
        assert "Traceback" not in p.stderr, p.stderr[-3000:]


def test_the_cli_mutator_runs_every_command_it_counts(tmp_path: Path) -> None:
    """``fuzz/mutate_cli.py`` in-process runs many reports in one process: a report's
    quick exit (``netdiag.quick_exit``) must not end the mutator after the first one."""
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "mutate_cli.py"), "--runs", "21",
                           "--seed", "7", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = [line for line in proc.stdout.splitlines() if line.startswith("done: ")]
    assert done, proc.stdout + proc.stderr
    runs = int(done[0].split()[1])
    assert runs >= 21
    assert "0 failure site(s)" in done[0]
