"""The collector's settings (``netdiag.gcpolicy``) rest on a scan making no cyclic
garbage: the youngest generation is collected only every ``YOUNG_THRESHOLD`` container
allocations, so garbage that only the collector can free would pile up that long. These
runs collect as often as CPython does by default and count what is found while a
capture is read (the run's own state, a cycle once it ends, is not garbage until
then)."""

from __future__ import annotations

import gc
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink, JsonlSink
from netdiag.tls.keylog import KeyLog

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
sys.path.insert(0, str(ROOT / "benchmarks"))


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Collect at CPython's default pace; yields [objects found so far]."""
    found = [0]

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            found[0] += info["collected"]

    gc.collect()
    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    gc.callbacks.append(count)
    try:
        yield found
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()


def _garbage_while(scan: Callable[[], object]) -> tuple[int, object]:
    with _counting() as found:
        kept = scan()
    return found[0], kept


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("collect", [False, True])
def test_a_scan_makes_no_cyclic_garbage(keys: bool, collect: bool) -> None:
    def scan() -> object:
        options = Options(keylog=KeyLog.from_file(KEYS) if keys else None)
        sink: Any = CollectingSink() if collect else JsonlSink(io.StringIO())
        result = analyze([str(CAPTURE)], sink, options)
        if not collect:
            sink.end(result)
        return sink, result

    found, (_sink, result) = _garbage_while(scan)  # type: ignore[misc]
    assert result.capture.packets > 500
    assert found == 0


@pytest.mark.parametrize("shape", ["h2", "h1", "h1up", "conns", "servers", "ooo",
                                   "halfopen", "dns", "frag"])
def test_hostile_shapes_make_no_cyclic_garbage(shape: str, tmp_path: Path) -> None:
    from hostile_shapes import write

    path = tmp_path / f"{shape}.pcap"
    packets, _ = write(shape, 20_000, path)
    found, _kept = _garbage_while(lambda: (s := CollectingSink(), analyze(
        [str(path)], s, Options())))
    assert packets >= 10_000
    assert found == 0


def test_the_counting_sees_cyclic_garbage() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    def scan() -> object:
        for _ in range(5000):
            Node()
        return None

    found, _ = _garbage_while(scan)
    assert found >= 4000  # the last few hundred are left for a later collection
