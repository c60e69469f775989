"""Output kept on disk until it is written: texts read back in any order, batches of
values read back in order.

A format that must sort what it makes before writing it (HAR sorts its entries by
start) would otherwise hold all of its output in memory at once, on top of the records:
1.2 GB of entries at 10M packets. :class:`TextSpill` appends each text to an anonymous
temporary file (``tempfile.TemporaryFile``, in ``TMPDIR``; it never appears in the file
system and is gone when closed) and reads it back by number. Where no file can be
written (no ``TMPDIR``, a full disk), it keeps the texts in memory instead, those
already written included: the output is the same either way.

CSV must know every column before it writes a row, so it holds its rows until the last
one is made: as much again as the records at 1M packets. :class:`BatchSpill` keeps
batches of them pickled in such a file instead, and gives them back in order.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

from netdiag.fileio import pread_all

BUFFER_BYTES = 1 << 20
"""Texts gathered before a write to the file."""


class TextSpill:
    """Texts numbered in the order added (:meth:`add`), read back by number (:meth:`get`)
    once :meth:`done`."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._in_memory = False
        """No file could be written: every text is in :attr:`_pending`."""
        self._ends: list[int] = []
        """Per text, the offset just after it, counted from the first text's start."""
        self._pending = bytearray()
        """The texts not in the file (all of them, :attr:`_in_memory`)."""
        self._written = 0
        """Bytes in the file."""

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def on_disk(self) -> bool:
        """Whether the texts are in a file (else in memory)."""
        return self._file is not None

    def add(self, text: str) -> int:
        """Keep ``text``; returns its number."""
        self._pending += text.encode("utf-8", "surrogatepass")
        self._ends.append(self._written + len(self._pending))
        if len(self._pending) >= BUFFER_BYTES and not self._in_memory:
            self._flush()
        return len(self._ends) - 1

    def _flush(self) -> None:
        """The texts pending to the file; all into memory where it cannot be written."""
        done = 0
        failed = False
        try:
            if self._file is None:
                # kept open across calls, closed by close()
                self._file = tempfile.TemporaryFile(prefix="netdiag-texts-")  # noqa: SIM115
            fd = self._file.fileno()
            with memoryview(self._pending) as view:
                while done < len(view):
                    done += os.write(fd, view[done:])
        except OSError:
            failed = True
        # past the handler: no view of the buffer is left (its traceback held one)
        self._written += done
        del self._pending[:done]
        if failed:
            self._to_memory()

    def _to_memory(self) -> None:
        kept = b""
        if self._file is not None:
            try:
                kept = pread_all(self._file.fileno(), self._written, 0)
            finally:
                self._file.close()
                self._file = None
        self._pending[:0] = kept
        self._written = 0
        self._in_memory = True

    def done(self) -> None:
        """Nothing more is added. Texts that never filled a buffer stay in memory."""
        if self._file is None:
            self._in_memory = True
        elif self._pending:
            self._flush()

    def get(self, n: int) -> str:
        """Text number ``n`` (after :meth:`done`)."""
        start = self._ends[n - 1] if n else 0
        end = self._ends[n]
        if self._in_memory:
            return self._pending[start:end].decode("utf-8", "surrogatepass")
        assert self._file is not None
        # the text alone, not a span around it: read out of file order (a connection's
        # requests spread over the whole capture), a span would be read again and again
        data = pread_all(self._file.fileno(), end - start, start)
        return data.decode("utf-8", "surrogatepass")

    def read(self, numbers: Iterable[int]) -> Iterator[str]:
        """The texts of ``numbers``, in that order (after :meth:`done`); the file is let
        go after the last, or when the reading is abandoned."""
        try:
            for n in numbers:
                yield self.get(n)
        finally:
            self.close()

    def close(self) -> None:
        """Let the texts go: the file and its space, or the memory that held them."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._pending = bytearray()
        self._ends = []


class BatchSpill:
    """Batches of values (anything ``pickle`` keeps exactly), added in order and read
    back in that order (:meth:`__iter__`), pickled in an anonymous temporary file
    meanwhile; in memory, still pickled, where no file can be written."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._sizes: list[int] = []
        """The pickled size of each batch in the file, in order."""
        self._memory: list[bytes] | None = None
        """Every batch pickled, where the file could not be written (else None)."""

    def __len__(self) -> int:
        """Batches added."""
        return len(self._sizes) if self._memory is None else len(self._memory)

    @property
    def on_disk(self) -> bool:
        """Whether the batches are in a file (else in memory)."""
        return self._file is not None

    def add(self, batch: Any) -> None:
        data = pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
        if self._memory is None:
            failed = False
            try:
                if self._file is None:
                    # kept open across calls, closed by close()
                    self._file = tempfile.TemporaryFile(prefix="netdiag-rows-")  # noqa: SIM115
                fd = self._file.fileno()
                with memoryview(data) as view:
                    done = 0
                    while done < len(view):
                        done += os.write(fd, view[done:])
            except OSError:
                failed = True
            if not failed:
                self._sizes.append(len(data))
                return
            self._to_memory()
        assert self._memory is not None
        self._memory.append(data)

    def _to_memory(self) -> None:
        """The whole batches written so far into memory; a part written of the batch
        being added is dropped (it is kept in memory with the later ones)."""
        memory: list[bytes] = []
        if self._file is not None:
            try:
                memory = list(self._in_file())
            finally:
                self._file.close()
                self._file = None
        self._memory = memory
        self._sizes = []

    def _in_file(self) -> Iterator[bytes]:
        """Each batch in the file, pickled, in order (none without a file)."""
        if self._file is None:
            return
        fd = self._file.fileno()
        offset = 0
        for size in self._sizes:
            yield pread_all(fd, size, offset)
            offset += size

    def __iter__(self) -> Iterator[Any]:
        """Every batch, in the order added."""
        for data in self._in_file() if self._memory is None else self._memory:
            yield pickle.loads(data)

    def close(self) -> None:
        """Let the batches go: the file and its space, or the memory that held them."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._sizes = []
        self._memory = None if self._memory is None else []
