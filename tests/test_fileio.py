"""Reading a file by offset (``netdiag.fileio.pread_all``): every byte asked for, in as
many calls as it takes, fewer only past the end of the file."""

from __future__ import annotations

import tempfile

import pytest

from netdiag import fileio


@pytest.mark.parametrize("most", [1, 7, 1 << 24])
def test_reads_what_is_asked_in_pieces_and_stops_at_the_end(
        monkeypatch: pytest.MonkeyPatch, most: int) -> None:
    monkeypatch.setattr(fileio, "PREAD_MAX", most)
    data = bytes(range(256)) * 5
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        fd = f.fileno()
        f.seek(3)  # the descriptor's own position plays no part
        assert fileio.pread_all(fd, 100, 17) == data[17:117]
        assert fileio.pread_all(fd, 0, 17) == b""
        assert fileio.pread_all(fd, 5000, 1000) == data[1000:]  # past the end: fewer
        assert fileio.pread_all(fd, 10, len(data) + 4) == b""
