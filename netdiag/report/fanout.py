"""What a format makes of each record of a long list, made in several processes.

``--jobs`` splits the scan across processes; once the path analysis is done, the formats
that write an object per record (the JSON document's connections, HAR's entries) would
make all of them in one. :func:`made_in_processes` gives the list ``jobs`` contiguous
shares: this process makes the first as it is read, forked children the others at the
same time, each pickling what it made, in batches, into a temporary file of its own.
They are read back in order, so the result is the list one process would have made:
``make`` has to be a pure function of its item (what it reads was fixed before the
fork, and what it changes a child does not give back).

A child that fails, or cannot be forked, leaves its share to this process, which makes
it itself; no child outlives the iteration, even one abandoned half way.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TypeVar

from netdiag.quick_exit import flush_standard_streams

T = TypeVar("T")
R = TypeVar("R")

MIN_SHARE = 4096
"""Items a process gets at least: a shorter list, or a smaller share, is not worth a
fork (a few milliseconds for a large process)."""
BATCH = 512
"""Results a child pickles at a time."""


def _fork_share(items: Sequence[T], make: Callable[[T], R], out: IO[bytes]) -> int | None:
    """Fork a child that writes ``make`` of every item to ``out``; its pid, or None."""
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return pid
    code = 1
    try:  # the child: never returns, never runs the parent's exit handlers
        batch: list[R] = []
        for item in items:
            batch.append(make(item))
            if len(batch) >= BATCH:
                pickle.dump(batch, out, pickle.HIGHEST_PROTOCOL)
                batch = []
        if batch:
            pickle.dump(batch, out, pickle.HIGHEST_PROTOCOL)
        out.flush()
        code = 0
    except BaseException:  # the parent makes the share again
        code = 1
    finally:
        os._exit(code)


def _read_back(f: IO[bytes]) -> Iterator[R]:
    f.seek(0)
    while True:
        try:
            batch: list[R] = pickle.load(f)
        except EOFError:
            return
        yield from batch


def made_in_processes(items: Sequence[T], make: Callable[[T], R], jobs: int
                      ) -> Iterator[R]:
    """``map(make, items)``, its shares made by up to ``jobs`` processes at once."""
    n = min(jobs, len(items) // MIN_SHARE)
    if n <= 1 or not hasattr(os, "fork"):
        yield from map(make, items)
        return
    bounds = [len(items) * k // n for k in range(n + 1)]
    children: list[tuple[int | None, IO[bytes] | None]] = []
    try:
        flush_standard_streams()  # a child must not write the parent's buffers again
        for k in range(1, n):
            try:
                f: IO[bytes] | None = tempfile.TemporaryFile(  # noqa: SIM115 - closed below
                    prefix="netdiag-made-")
            except OSError:
                f = None
            pid = (None if f is None
                   else _fork_share(items[bounds[k]:bounds[k + 1]], make, f))
            children.append((pid, f))
        yield from map(make, items[bounds[0]:bounds[1]])
        for k, (pid, f) in enumerate(children, start=1):
            ok = False
            if pid is not None:
                _, status = os.waitpid(pid, 0)
                children[k - 1] = (None, f)
                ok = os.waitstatus_to_exitcode(status) == 0
            if ok and f is not None:
                yield from _read_back(f)
            else:
                yield from map(make, items[bounds[k]:bounds[k + 1]])
    finally:
        for pid, f in children:
            if pid is not None:  # abandoned before it was read: not left running
                try:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            if f is not None:
                f.close()
