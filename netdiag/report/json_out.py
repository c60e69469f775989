"""A JSON document written fast and still readable: the outline indented, records one a line.

``json.dump(doc, indent=2)`` runs Python's pure-Python encoder (CPython 3.11's C encoder
only serves compact, one-shot output) and took longer than the analysis on big
captures. Here the top levels of the document are indented, and every deeper value,
above all each element of the long record lists (connections, requests, DNS
transactions), is encoded by the C encoder in one call and written on a line of its own.
The result is the same JSON value as ``json.dump`` gives; only the whitespace differs.

With ``jobs`` above 1 (``report --jobs``), a long record list is rendered in that many
processes: forked children render the later parts into temporary files while this
process renders the first, then their text follows it, so the bytes are those one
process writes. Rendering a record (its dict, the paths' annotations, the encoding) is
most of a big JSON report's time after the path analysis. A child that fails, or a
temporary file that cannot be made, leaves its part to this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Generic, TypeVar

OUTLINE_DEPTH = 2
"""Object levels laid out one key a line; values below are written compact."""
PARALLEL_MIN = 4096
"""Records a list must have to be rendered in several processes (below, forking costs
about what it saves)."""

T = TypeVar("T")


class Records(Generic[T]):
    """A list of JSON objects made from ``items`` only as it is written, one at a time:
    each item is rendered (``render``), then passed with its dict through every one of
    ``steps`` in order. :func:`write_json` writes it as the list of those dicts, so a
    document's long record lists need not all be in memory as dicts at once."""

    def __init__(self, items: Sequence[T], render: Callable[[T], dict[str, Any]]) -> None:
        self.items = items
        self.render = render
        self.steps: list[Callable[[dict[str, Any], T], None]] = []

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.part(0, len(self.items))

    def part(self, start: int, stop: int) -> Iterator[dict[str, Any]]:
        """The dicts of ``items[start:stop]``."""
        render, steps, items = self.render, self.steps, self.items
        for i in range(start, stop):
            item = items[i]
            d = render(item)
            for step in steps:
                step(d, item)
            yield d


def write_json(doc: Any, out: IO[str], *, ensure_ascii: bool = True, jobs: int = 1) -> None:
    """Write ``doc`` (plain JSON types) to ``out``, followed by a newline; its long
    :class:`Records` lists in ``jobs`` processes (module docstring)."""
    encode = json.JSONEncoder(ensure_ascii=ensure_ascii, allow_nan=True,
                              check_circular=False).encode
    _write(doc, out, 0, encode, jobs)
    out.write("\n")


def _write(value: Any, out: IO[str], depth: int, encode: Any, jobs: int = 1) -> None:
    pad = "  " * (depth + 1)
    if isinstance(value, dict) and value and depth < OUTLINE_DEPTH:
        out.write("{")
        sep = "\n"
        for key, item in value.items():
            out.write(f"{sep}{pad}{encode(str(key))}: ")
            _write(item, out, depth + 1, encode, jobs)
            sep = ",\n"
        out.write(f"\n{'  ' * depth}}}")
    elif isinstance(value, Records) and len(value):
        out.write("[")
        _write_records(value, out, pad, encode, jobs)
        out.write(f"\n{'  ' * depth}]")
    elif isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        out.write("[")
        sep = "\n"
        for item in value:
            out.write(sep + pad)
            out.write(encode(item))
            sep = ",\n"
        out.write(f"\n{'  ' * depth}]")
    elif isinstance(value, Records):
        out.write("[]")
    else:
        out.write(encode(value))


def _write_part(records: Records[Any], start: int, stop: int, out: IO[str], pad: str,
                encode: Any) -> None:
    """The lines of ``records[start:stop]``, each after its separator."""
    first = "\n" + pad
    rest = ",\n" + pad
    for i, d in enumerate(records.part(start, stop), start):
        out.write(first if i == 0 else rest)
        out.write(encode(d))


def _write_records(records: Records[Any], out: IO[str], pad: str, encode: Any,
                   jobs: int) -> None:
    n = len(records)
    if jobs < 2 or n < PARALLEL_MIN or not hasattr(os, "fork") or not _alone():
        _write_part(records, 0, n, out, pad, encode)
        return
    bounds = [n * k // jobs for k in range(jobs + 1)]
    children: list[tuple[int, int, str | None]] = []  # (part, pid, file)
    try:
        for k in range(1, jobs):
            children.append((k, *_fork_part(records, bounds[k], bounds[k + 1], pad, encode)))
        _write_part(records, 0, bounds[1], out, pad, encode)
        for k, pid, path in children:
            if path is None or not _joined(pid, path, out):
                _write_part(records, bounds[k], bounds[k + 1], out, pad, encode)
    finally:
        for _k, pid, path in children:
            if pid > 0:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _alone() -> bool:
    """No other thread runs (a Dask client's would not be in a forked child, nor
    release a lock it held there)."""
    return threading.active_count() == 1


def _fork_part(records: Records[Any], start: int, stop: int, pad: str,
               encode: Any) -> tuple[int, str | None]:
    """(pid, file) of a child rendering ``records[start:stop]`` into a temporary file;
    (0, None) where none could be made."""
    try:
        fd, path = tempfile.mkstemp(prefix="netdiag-json-", suffix=".part")
    except OSError:
        return 0, None
    pid = os.fork()
    if pid:
        os.close(fd)
        return pid, path
    code = 1
    try:
        with open(fd, "w", encoding="utf-8") as f:
            _write_part(records, start, stop, f, pad, encode)
        code = 0
    finally:
        os._exit(code)  # nothing of the parent's (its buffers, its exit handlers)


def _joined(pid: int, path: str, out: IO[str]) -> bool:
    """Wait for the child ``pid``; if it ended well, copy its file to ``out``."""
    _pid, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return False
    with open(path, encoding="utf-8") as f:
        while chunk := f.read(1 << 20):
            out.write(chunk)
    return True
