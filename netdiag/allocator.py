"""The C allocator's settings for a run that analyzes captures.

glibc's ``malloc`` returns the free memory at the top of its heap to the system as soon
as it exceeds a threshold (twice the largest block freed so far: 2 MiB once the reader
has freed its first 1 MiB chunk), then takes it back at the next large allocation, and
every page it takes back is a page fault that the kernel must zero. An analysis frees and
allocates a few MiB at a time all along (the reader's chunks, packet payloads, a
report's strings), so that churn was 100,000-150,000 page faults and 0.3-0.8 s of system
time in a 1M-packet report on this project's virtual machine (``docs/performance.md``).

:func:`tune_allocator` keeps up to :data:`TRIM_THRESHOLD` of free memory at the heap's
top and serves blocks up to :data:`MMAP_THRESHOLD` from the heap instead of a mapping of
their own. The peak memory does not change (memory already touched stays mapped,
instead of being returned and faulted in again); freed memory goes back to the system
when the process ends. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import sys

M_TRIM_THRESHOLD = -1
"""glibc's ``mallopt`` parameter numbers (``<malloc.h>``)."""
M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 256 << 20
"""Free memory at the heap's top kept rather than returned (bytes)."""
MMAP_THRESHOLD = 32 << 20
"""Blocks from this size on get a mapping of their own (glibc's largest allowed value on
64-bit systems: ``HEAP_MAX_SIZE / 2``)."""


def tune_allocator() -> bool:
    """Set :data:`TRIM_THRESHOLD` and :data:`MMAP_THRESHOLD` where the C library is
    glibc; True if both were taken. For the process of an analyzing command (the shard
    processes it forks inherit them); not for long-lived servers."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # here: the probes import the collector's policy, not this

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only (not musl)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) \
        and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
