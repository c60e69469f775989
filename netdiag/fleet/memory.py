"""How much memory a report's records take, and how much of it the report may use
(``report --max-memory``).

A report that lists its records (JSON, text, HTML, HAR, CSV, Parquet) holds every
connection and DNS transaction until the end, and then builds its document from them. The
cost of a record, document included, is estimated from what it holds
(:mod:`netdiag.record_cost`: about 8 KiB a connection, 2 KiB more a request, 1 KiB a DNS
transaction). Once the records held would pass the budget, the fleet engine switches to
sketched percentiles and drops them (:mod:`netdiag.fleet.sketch`), as ``--max-records``
does; the estimate, not the process's RSS, decides, so that the same input and budget
give the same report on every executor and machine.

The default budget is half the memory the system says is available when the report
starts (``MemAvailable``); ``--max-memory none`` never sketches for memory.
"""

from __future__ import annotations

import os
import re

AVAILABLE_SHARE = 0.5
"""Of the available memory, the share the default budget takes."""

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def available_bytes() -> int | None:
    """The memory the system can give without swapping (``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_max_memory() -> int | None:
    """The default budget: a share of the available memory (None: unknown, no bound)."""
    avail = available_bytes()
    return None if avail is None else int(avail * AVAILABLE_SHARE)


def parse_size(text: str) -> int | None:
    """``4G``, ``512M``, ``1.5GiB``, ``200000000`` -> bytes (powers of 1024); ``none`` ->
    None (no bound), ``auto`` -> the default. ValueError on anything else."""
    t = text.strip().lower()
    if t == "none":
        return None
    if t == "auto":
        return default_max_memory()
    m = _SIZE.fullmatch(t)
    if m is None:
        raise ValueError(f"not a size: {text!r} (say 4G, 512M, auto or none)")
    n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n <= 0:
        raise ValueError(f"not a size: {text!r} (it must be more than 0)")
    return n
