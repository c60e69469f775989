"""The C allocator's settings (``netdiag.allocator``): memory freed and allocated again
in blocks of a few MiB no longer goes back to the system and faults in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from netdiag.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's")

_CHURN = textwrap.dedent("""
    import json, resource, sys
    from netdiag.gcpolicy import tune_for_analysis

    def churn():
        # three 1 MiB blocks alive at once, then freed: 3 MiB free at the heap's top,
        # over glibc's default trimming threshold once a 1 MiB block was freed
        for _ in range(100):
            a = b"a" * (1 << 20); b = b"b" * (1 << 20); c = b"c" * (1 << 20)
            del a, b, c

    if sys.argv[1] == "tuned":
        tune_for_analysis()
    churn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn()
    print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
""")


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return int(json.loads(out))


def test_freed_blocks_are_reused_without_page_faults() -> None:
    pages = 100 * 3 * (1 << 20) // 4096
    untuned, tuned = _faults("default"), _faults("tuned")
    # glibc as shipped returns the 3 MiB every time and faults it in again; tuned, the
    # heap keeps it (a few faults of the interpreter's own are left)
    assert untuned > pages // 2
    assert tuned < pages // 20


def test_settings_are_glibc_values() -> None:
    # glibc refuses a mapping threshold over HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)
    assert MMAP_THRESHOLD <= 32 << 20 <= TRIM_THRESHOLD
    out = subprocess.run(
        [sys.executable, "-c", "from netdiag.allocator import tune_allocator as t; "
         "print(t())"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "True"
