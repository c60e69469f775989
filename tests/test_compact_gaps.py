"""A report that holds every record keeps each answer's chunk gaps compact.

An answer streamed token by token (the LLM endpoints this tool watches) has a gap per
token: held as a list, each is an int object and a list slot (about 40 bytes); held as
``array('q')``, 8. The gaps keep their values, the JSON its text, and the memory
estimate of ``--max-memory`` counts them.
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

import pytest

from netdiag.pipeline import Options, analyze
from netdiag.record_cost import REQUEST_BYTES, connection_bytes
from netdiag.records import COMPACT_GAPS, Connection, Request, compact_gaps
from netdiag.report.records_out import CollectingSink

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "captures" / "antho.pcapng"


class _Plain:
    """Keeps the records as the analyzers made them."""

    def __init__(self) -> None:
        self.connections: list[Connection] = []

    def connection(self, c: Connection) -> None:
        self.connections.append(c)

    def dns(self, _t: object) -> None:
        pass


def _gapped(conns: list[Connection]) -> list[Request]:
    return [r for c in conns for r in c.requests if r.chunk_gaps_ns]


def test_kept_records_hold_the_same_gaps_compactly() -> None:
    plain, kept = _Plain(), CollectingSink()
    analyze([str(LAB)], plain, Options())
    analyze([str(LAB)], kept, Options())
    before, after = _gapped(plain.connections), _gapped(kept.connections)
    assert len(before) == len(after) > 0
    compacted = 0
    for b, a in zip(before, after, strict=True):
        assert isinstance(b.chunk_gaps_ns, list)
        if len(b.chunk_gaps_ns) >= COMPACT_GAPS:
            assert isinstance(a.chunk_gaps_ns, array) and a.chunk_gaps_ns.typecode == "q"
            compacted += 1
        else:
            assert isinstance(a.chunk_gaps_ns, list)
        assert list(a.chunk_gaps_ns) == b.chunk_gaps_ns
    assert compacted
    by_id = {c.id: c for c in plain.connections}
    for c in kept.connections:
        assert c.to_json(headers=True) == by_id[c.id].to_json(headers=True)


def _held_bytes(gaps: list[int] | array[int]) -> int:
    if isinstance(gaps, array):
        return sys.getsizeof(gaps) - sys.getsizeof(array("q"))
    return sys.getsizeof(gaps) + sum(sys.getsizeof(g) for g in gaps)


def test_compact_gaps_take_under_a_quarter_of_the_memory() -> None:
    gaps = [1_000_000 + 7 * i for i in range(10_000)]  # beyond the small ints' cache
    c = Connection(id="C1", ts_ns=0, client="10.0.0.1:40000", server="10.0.0.2:443")
    c.requests.append(Request(ts_ns=0, chunk_gaps_ns=list(gaps)))
    held = c.requests[0].chunk_gaps_ns
    assert isinstance(held, list)
    as_list = _held_bytes(held)
    compact_gaps(c)
    compact = c.requests[0].chunk_gaps_ns
    assert isinstance(compact, array) and list(compact) == gaps
    assert sys.getsizeof(compact) * 4 < as_list


def test_a_gap_beyond_64_bits_stays_a_list() -> None:
    # crafted timestamps (a pcapng block claiming 2**64 seconds) make such gaps
    gaps = [5, 1 << 70]
    c = Connection(id="C1", ts_ns=0, client="10.0.0.1:40000", server="10.0.0.2:443")
    c.requests.append(Request(ts_ns=0, chunk_gaps_ns=gaps))
    compact_gaps(c)
    assert c.requests[0].chunk_gaps_ns is gaps
    assert c.to_json()["requests"][0]["chunk_gaps_ms"] == [g / 1e6 for g in gaps]


@pytest.mark.parametrize("n", [1, COMPACT_GAPS - 1, COMPACT_GAPS, 5000])
def test_the_memory_estimate_covers_the_gaps_held(n: int) -> None:
    """Past the request's own share, each gap held is counted: a long stream's gaps
    are never estimated as a short answer's."""
    c = Connection(id="C1", ts_ns=0, client="10.0.0.1:40000", server="10.0.0.2:443")
    c.requests.append(Request(ts_ns=0))
    bare = connection_bytes(c)
    c.requests[0].chunk_gaps_ns = [10**9 + i for i in range(n)]
    compact_gaps(c)
    held = c.requests[0].chunk_gaps_ns
    assert isinstance(held, list | array)
    assert REQUEST_BYTES + connection_bytes(c) - bare >= _held_bytes(held)
