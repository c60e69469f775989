"""Leaving a finished report without tearing its heap down.

A report holds its records, the linker's nodes and links and the summary's lists until
it is written: millions of objects on a big capture. At exit CPython tears the modules
down and frees each of those objects: 0.08-0.12 s after the benchmark's 1M-packet lab
reports (2-3 % of the run), spent after the last byte was written.

A command whose work is written calls :func:`allow`; the console entry point
(``netdiag.cli.main``) then calls :func:`leave`, which runs the exit handlers
(``atexit``: temporary files, ``multiprocessing``'s clean-up, a coverage tool's), flushes
the standard streams and ends the process with ``os._exit``, skipping the teardown. Where
another thread still runs (one that interpreter shutdown would wait for) or a stream
cannot be flushed, it returns and the interpreter exits the usual way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

_allowed = False


def allow() -> None:
    """The running command has written everything: the process may end at once."""
    global _allowed
    _allowed = True


def leave(code: int = 0) -> None:
    """End the process with ``code`` now if :func:`allow` was called (see the module
    docstring); otherwise, or when it cannot, return."""
    if not _allowed:
        return
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    if not flush_standard_streams():
        return  # the usual exit reports it as it always has
    os._exit(code)


def flush_standard_streams() -> bool:
    """Flush stdout and stderr before an ``os._exit`` or a fork (here, and where
    ``netdiag.shard`` forks and ends its shards); False when one could not be (closed,
    or its reader gone)."""
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            flushed = False
    return flushed
