"""Reading a file by offset, for the files that wait for output (``netdiag.shard``'s
spilled events, ``netdiag.report.spill``'s texts and rows)."""

from __future__ import annotations

import os

PREAD_MAX = 1 << 24
"""Bytes asked of one ``os.pread`` at most (a call allocates what it asks)."""


def pread_all(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes of ``fd`` from ``offset``, however many calls that takes;
    fewer only at the end of the file. The descriptor's own position is not used."""
    parts = []
    while size > 0:
        part = os.pread(fd, min(size, PREAD_MAX), offset)
        if not part:
            break
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return b"".join(parts)
