"""The garbage collector's settings for a run that analyzes captures.

An analysis allocates millions of small containers (records, per-connection state,
link candidates) that live until the report is written, so the collector's default
first-generation threshold (700 allocations) makes it walk the same young objects
again and again: about a fifth of a terminal report's CPU time on a 200k-packet
capture (``docs/performance.md``). Reference counting frees nearly everything; the
collector is only there for the rare cycle, so it may run far less often.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from netdiag.allocator import tune_allocator

YOUNG_THRESHOLD = 500_000
"""Allocations (minus deallocations) of container objects between two collections of
the youngest generation (CPython's default: 700). A scan makes no cyclic garbage
(``tests/test_gcpolicy.py``), so nothing waits for these collections but the walking
itself; at 50,000, the state that connections hold for a while (streams, HPACK tables,
records in reassembly) was walked again and again: 1.0-1.4 s of a 1M-packet keyed
report. Garbage a future cycle made could pile up this long: some tens of MiB."""


SETTLE_EVERY = 1024
"""Records a run that keeps them all takes between two freezes (:class:`Settler`): a
thousand connections are some tens of thousands of containers, far below
:data:`YOUNG_THRESHOLD`."""


class Settler:
    """Moves the records a run keeps until its report is written out of the collector's
    reach as they pile up (:func:`settle` every :data:`SETTLE_EVERY` records kept).

    Kept records are most of what a young collection would find: with a key log, the
    1M-packet benchmark's scan reached :data:`YOUNG_THRESHOLD` once and its collection
    walked 400,000 records' containers in 0.22 s; 3M packets, three such walks (0.2 s
    each). Freezing is constant time. The price is the one :func:`settle` already pays
    after the scan: a cycle made while the records pile up would not be freed until the
    process ends, and a scan makes none (``tests/test_gcpolicy.py``). For the process
    of an analyzing command (its sink, and its shards' ``netdiag.shard``)."""

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left = SETTLE_EVERY

    def kept(self) -> None:
        """One more record kept."""
        self._left -= 1
        if self._left <= 0:
            self._left = SETTLE_EVERY
            gc.freeze()


def tune_for_analysis() -> None:
    """Move everything imported so far out of the collector's reach (``gc.freeze``),
    collect the youngest generation every :data:`YOUNG_THRESHOLD` allocations, and keep
    the C allocator from returning memory it will take back (:mod:`netdiag.allocator`).

    For the process of an analyzing command (and the shard processes it forks); not for
    long-lived servers or the lab's timed clients.
    """
    tune_allocator()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for a phase that builds many containers and frees few cycles
    (the path analysis: a 1M-packet capture's linking took 17 % longer with it on, its
    full collections walking the linker's growing state again and again), or that is
    timed (a probe's request); restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def settle() -> None:
    """Move everything allocated so far (the records a collecting report holds once the
    capture is read) out of the collector's reach, as :func:`tune_for_analysis` does
    after start-up: later collections walk only what is made after. For the process of
    an analyzing command."""
    gc.freeze()
