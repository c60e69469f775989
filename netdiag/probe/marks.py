"""One instant on both of the probes' clocks."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Mark:
    """One instant on both clocks."""

    perf_ns: int
    """``time.perf_counter_ns()``: monotonic, every duration is a difference of these."""
    epoch_ns: int
    """``time.time_ns()``: the clock a capture stamps its packets with."""

    @classmethod
    def now(cls) -> Mark:
        return cls(time.perf_counter_ns(), time.time_ns())
