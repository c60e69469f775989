"""Output kept on disk until written: the same texts back, in any order (``TextSpill``),
and the same batches back, in order (``BatchSpill``), whether they went to a file,
stayed in memory, or fell back to memory half way."""

from __future__ import annotations

import os
import random
import tempfile
from typing import Any

import pytest

from netdiag.report import spill as spill_mod
from netdiag.report.spill import BatchSpill, TextSpill

TEXTS = [f'{{"n":{i},"s":"{"é☃" * (i % 7)}{"x" * (i * 37 % 300)}"}}' for i in range(400)]
TEXTS += ["", "\ud800 lone surrogate", "\U0001f600 astral"]


def _order() -> list[int]:
    order = list(range(len(TEXTS)))
    random.Random(7).shuffle(order)
    return order


def _fill(spill: TextSpill) -> None:
    for i, t in enumerate(TEXTS):
        assert spill.add(t) == i
    spill.done()
    assert len(spill) == len(TEXTS)


def _no_temporary_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """No temporary file can be made (no ``TMPDIR``, a full disk)."""
    def no_file(*_a: Any, **_k: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_file)


def _disk_full_at(monkeypatch: pytest.MonkeyPatch, n: int) -> dict[str, int]:
    """The spill's ``n``-th write writes 10 bytes, every later one finds the disk full;
    returns the count of writes tried."""
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == n:  # a short write first, then the disk is full
            return real_write(fd, bytes(data[:10]))
        if calls["n"] > n:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(spill_mod.os, "write", write)
    return calls


@pytest.mark.parametrize("buffer", [64, 1 << 20])
def test_texts_come_back_in_any_order(monkeypatch: pytest.MonkeyPatch, buffer: int) -> None:
    monkeypatch.setattr(spill_mod, "BUFFER_BYTES", buffer)
    spill = TextSpill()
    _fill(spill)
    # a small buffer sends them to a file, a large one keeps these few in memory
    assert spill.on_disk is (buffer == 64)
    order = _order()
    assert list(spill.read(order)) == [TEXTS[n] for n in order]
    assert not spill.on_disk  # the file let go after the last


def test_no_file_keeps_them_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill_mod, "BUFFER_BYTES", 64)
    _no_temporary_file(monkeypatch)
    spill = TextSpill()
    _fill(spill)
    assert not spill.on_disk
    assert [spill.get(n) for n in _order()] == [TEXTS[n] for n in _order()]


def test_a_full_disk_half_way_reads_back_what_was_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file takes some texts, then a write fails part way (a full disk): the texts
    written so far are read back into memory, and none is lost or doubled."""
    monkeypatch.setattr(spill_mod, "BUFFER_BYTES", 256)
    calls = _disk_full_at(monkeypatch, 5)
    spill = TextSpill()
    _fill(spill)
    assert calls["n"] > 5 and not spill.on_disk
    assert list(spill.read(_order())) == [TEXTS[n] for n in _order()]


def test_closed_it_holds_nothing() -> None:
    spill = TextSpill()
    _fill(spill)
    assert list(spill.read([2, 0])) == [TEXTS[2], TEXTS[0]]
    assert len(spill) == 0
    with pytest.raises(IndexError):
        spill.get(0)


BATCHES = [([i % 3] * (i % 5),
            [(i, f"t{i}\u2603", i / 7, None, [i, {"k": i}]) for _ in range(i % 5)])
           for i in range(60)]
"""Batches like ``csv_out.Rows``' (key numbers, value tuples), some empty; floats,
non-ASCII text and nested values included."""


def test_batches_come_back_in_order_from_a_file() -> None:
    spill = BatchSpill()
    for b in BATCHES:
        spill.add(b)
    assert spill.on_disk and len(spill) == len(BATCHES)
    assert list(spill) == BATCHES
    assert list(spill) == BATCHES  # read again, the same
    spill.close()
    assert not spill.on_disk and list(spill) == []


def test_batches_without_a_file_stay_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_temporary_file(monkeypatch)
    spill = BatchSpill()
    for b in BATCHES:
        spill.add(b)
    assert not spill.on_disk and len(spill) == len(BATCHES)
    assert list(spill) == BATCHES


def test_a_full_disk_half_way_keeps_every_batch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file takes some batches, then a write stops part way through one (a full
    disk): the whole batches written are read back into memory, the one cut short is
    kept from memory, and none is lost or doubled."""
    calls = _disk_full_at(monkeypatch, 9)
    spill = BatchSpill()
    for b in BATCHES:
        spill.add(b)
    assert calls["n"] > 9 and not spill.on_disk and len(spill) == len(BATCHES)
    assert list(spill) == BATCHES
