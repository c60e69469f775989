"""The collector's settings (``netdiag.gcpolicy``) rest on a scan making no cyclic
garbage: the youngest generation is collected only every ``YOUNG_THRESHOLD`` container
allocations, so garbage that only the collector can free would pile up that long. These
runs collect as often as CPython does by default and count what is found while a
capture is read (the run's own state, a cycle once it ends, is not garbage until then).
Each count runs in a process of its own: no other test's threads or garbage in it."""

from __future__ import annotations

import gc
import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
SHAPES = ("h2", "h1", "h1up", "conns", "servers", "ooo", "halfopen", "dns", "frag")


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Collect at CPython's default pace; yields [objects found so far]."""
    found = [0]

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            found[0] += info["collected"]

    gc.collect()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    gc.callbacks.append(count)
    try:
        yield found
    finally:
        gc.callbacks.remove(count)


def _garbage_while(scan: Callable[[], object]) -> int:
    """Objects the collector finds while ``scan`` runs a second time (the first imports
    what the scan needs: imports leave cycles of their own)."""
    scan()
    with _counting() as found:
        kept = scan()
    del kept
    return found[0]


def _scan_shipped(keys: bool, collect: bool) -> object:
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink, JsonlSink
    from netdiag.tls.keylog import KeyLog

    options = Options(keylog=KeyLog.from_file(KEYS) if keys else None)
    sink: Any = CollectingSink() if collect else JsonlSink(io.StringIO())
    result = analyze([str(CAPTURE)], sink, options)
    if not collect:
        sink.end(result)
    assert result.capture.packets > 500
    return sink, result


def _scan_shape(shape: str, tmp: Path) -> object:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hostile_shapes import write

    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    path = tmp / f"{shape}.pcap"
    if not path.exists():
        packets, _ = write(shape, 20_000, path)
        assert packets >= 10_000
    sink = CollectingSink()
    return sink, analyze([str(path)], sink, Options())


def _self_check() -> object:
    class Node:
        def __init__(self) -> None:
            self.me = self

    for _ in range(5000):
        Node()
    return None


def _count_in_child(*args: str, tmp: Path | None = None) -> int:
    out = subprocess.run([sys.executable, __file__, *args,
                          str(tmp or ROOT)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return int(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("collect", [False, True])
def test_a_scan_makes_no_cyclic_garbage(keys: bool, collect: bool) -> None:
    assert _count_in_child("shipped", str(int(keys)), str(int(collect))) == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_hostile_shapes_make_no_cyclic_garbage(shape: str, tmp_path: Path) -> None:
    assert _count_in_child("shape", shape, tmp=tmp_path) == 0


def test_the_counting_sees_cyclic_garbage() -> None:
    # each of 5,000 self-referencing objects (the last few hundred may wait for a
    # later collection)
    assert _count_in_child("self-check") >= 4000


def test_a_settler_freezes_the_records_a_sink_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``SETTLE_EVERY`` records kept, all of them are moved out of the collector's
    reach (a young collection would walk them all); those kept since are not yet."""
    from netdiag import gcpolicy
    from netdiag.pipeline import Options, analyze
    from netdiag.records import Connection, DnsTransaction
    from netdiag.report.records_out import CollectingSink

    class Ordered(CollectingSink):
        def __init__(self) -> None:
            super().__init__(gcpolicy.Settler())
            self.order: list[object] = []

        def dns(self, t: DnsTransaction) -> None:
            self.order.append(t)
            super().dns(t)

        def connection(self, c: Connection) -> None:
            self.order.append(c)
            super().connection(c)

    monkeypatch.setattr(gcpolicy, "SETTLE_EVERY", 7)
    sink = Ordered()
    try:
        analyze([str(CAPTURE)], sink, Options())
        tracked = {id(o) for o in gc.get_objects()}
        settled = len(sink.order) // 7 * 7
        assert settled >= 14
        assert not [r for r in sink.order[:settled] if id(r) in tracked]
        assert all(id(r) in tracked for r in sink.order[settled:])
    finally:
        gc.unfreeze()


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    if what == "shipped":
        n = _garbage_while(lambda: _scan_shipped(rest[0] == "1", rest[1] == "1"))
    elif what == "shape":
        n = _garbage_while(lambda: _scan_shape(rest[0], Path(rest[1])))
    else:
        n = _garbage_while(_self_check)
    print(json.dumps(n))
