"""Peak memory stays bounded on the hostile shapes that once grew it (issue 11).

Each shape of ``benchmarks/hostile_shapes.py`` that piles up state (out-of-order
segments never filled, half-open connections carrying data, unanswered DNS queries) is
written at 1x and 4x and reported in a child process with the streaming format and a
small cap; the child's peak RSS (its ``VmHWM``, measured by the kernel) may grow by
less than a fraction of what the 3x more state would take without the cap. The same
run without the cap shows that the shape does grow memory, so the test can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hostile_shapes  # noqa: E402

MIB = 1 << 20


_CHILD = """
import atexit, sys

def _hwm(path):
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(path, "w") as out:
        out.write(kib)

atexit.register(_hwm, sys.argv[1])
sys.argv = ["netdiag"] + sys.argv[2:]
from netdiag.cli import main
main()
"""


def _peak_rss(capture: Path, *flags: str) -> int:
    """Peak RSS in bytes of one ``netdiag report --format jsonl`` in a child, one process.

    Read from the child's own ``VmHWM`` at exit: ``ru_maxrss`` of a child forked from
    this (large) test process would include the parent's size at the fork."""
    env = dict(os.environ, NETDIAG_JOBS="1")
    hwm = capture.with_suffix(".hwm")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(hwm), "report", str(capture),
                           "--format", "jsonl", "-o", os.devnull, *flags],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          cwd=capture.parent, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return int(hwm.read_text()) * 1024


# shape, packets at 1x, the flag that caps it small, the one that lets it grow
SHAPES = [
    ("ooo", 30_000, ["--max-held-mib", "8"], ["--max-held-mib", "4096"]),
    ("halfopen", 30_000, ["--max-connections", "2000"], ["--max-connections", "1000000"]),
    ("dns", 40_000, ["--max-dns-pending", "2000"], ["--max-dns-pending", "1000000"]),
]


@pytest.mark.parametrize(("shape", "packets", "capped", "uncapped"), SHAPES,
                         ids=[s[0] for s in SHAPES])
def test_peak_memory_does_not_grow_with_the_hostile_state(
        tmp_path: Path, shape: str, packets: int, capped: list[str],
        uncapped: list[str]) -> None:
    small, big = tmp_path / f"{shape}-1x.pcap", tmp_path / f"{shape}-4x.pcap"
    hostile_shapes.write(shape, packets, small)
    hostile_shapes.write(shape, packets * 4, big)
    grown = _peak_rss(big, *uncapped) - _peak_rss(small, *uncapped)
    assert grown > 40 * MIB, f"{shape}: the shape no longer grows memory ({grown / MIB:.0f} MiB)"
    bounded = _peak_rss(big, *capped) - _peak_rss(small, *capped)
    assert bounded < grown / 4, (f"{shape}: +{bounded / MIB:.0f} MiB from 1x to 4x with "
                                 f"{capped}, +{grown / MIB:.0f} MiB without")
