"""IPv4 and IPv6 fragment reassembly, bounded in memory and time.

Cost is amortised O(log n) per fragment whatever the traffic: datagrams being
reassembled are also kept in a heap ordered by their first fragment's time (ties in
arrival order), so expiry and the eviction of the oldest datagram when the table is
full pop from it instead of scanning the table (entries of datagrams that completed
meanwhile are skipped when met, and the heap is rebuilt when they outnumber the live
ones). Each datagram keeps the union of the byte ranges it has received as a sorted
list of disjoint intervals, so the (sorting) reassembly runs once, when the datagram
is complete, not at every fragment.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

MAX_DATAGRAM = 65535 + 8
"""No reassembled datagram is allowed to grow beyond this (IPv6 jumbograms aside)."""
FRAGMENT_TIMEOUT_NS = 30_000_000_000
"""Fragments of a datagram that has not completed within this are dropped (RFC 791's 15-120 s)."""
MAX_PENDING = 4096
"""At most this many datagrams are being reassembled at once; the oldest is dropped first
(counted in ``Defragmenter.limits_hit["ip_fragments_pending"]``)."""
MAX_PENDING_BYTES = 64 << 20
"""At most this many fragment payload bytes are held at once; the oldest datagrams are
dropped first (counted in ``Defragmenter.limits_hit["ip_fragment_bytes"]``)."""

LIMIT_PENDING = "ip_fragments_pending"
"""``limits_hit`` key: datagrams dropped because :data:`MAX_PENDING` were pending."""
LIMIT_BYTES = "ip_fragment_bytes"
"""``limits_hit`` key: datagrams dropped because :data:`MAX_PENDING_BYTES` were held."""


@dataclass(slots=True)
class _Pending:
    first_ns: int
    pieces: dict[int, bytes] = field(default_factory=dict)
    total: int | None = None
    starts: list[int] = field(default_factory=list)
    """Sorted starts of the disjoint byte ranges received (with ``ends``)."""
    ends: list[int] = field(default_factory=list)
    """Ends (exclusive) of those ranges."""
    max_offset: int = 0
    """Largest fragment offset received."""
    held: int = 0
    """Payload bytes kept in ``pieces``."""


class Defragmenter:
    """Collects fragments per (source, destination, id, protocol) and returns whole payloads."""

    def __init__(self) -> None:
        self._pending: dict[tuple[bytes, bytes, int, int], _Pending] = {}
        self._order: list[tuple[int, int, tuple[bytes, bytes, int, int], _Pending]] = []
        """Heap of ``(first_ns, arrival, key, datagram)``; stale when ``_pending[key]`` is
        not that datagram any more."""
        self._arrivals = 0
        self._held = 0
        self.dropped = 0
        """Datagrams abandoned (timeout, overlap beyond limits, too many pending)."""
        self.limits_hit: dict[str, int] = {}
        """Datagrams dropped because a cap was reached, by cap (:data:`LIMIT_PENDING`,
        :data:`LIMIT_BYTES`); empty when none was."""

    def add(self, ts_ns: int, src: bytes, dst: bytes, ident: int, proto: int,
            offset: int, more: bool, payload: bytes) -> bytes | None:
        """Add one fragment (``offset`` in bytes); return the whole payload once complete."""
        key = (src, dst, ident, proto)
        pend = self._pending.get(key)
        if pend is None:
            if len(self._pending) >= MAX_PENDING:
                self._expire(ts_ns)
                while len(self._pending) >= MAX_PENDING and self._drop_oldest(LIMIT_PENDING):
                    pass
            pend = self._pending[key] = _Pending(ts_ns)
            self._arrivals += 1
            heapq.heappush(self._order, (ts_ns, self._arrivals, key, pend))
            if len(self._order) > 2 * len(self._pending) + 64:
                self._compact()
        end = offset + len(payload)
        if end > MAX_DATAGRAM:
            self._remove(key, pend)
            self.dropped += 1
            return None
        old = pend.pieces.get(offset)
        if old is None or len(payload) > len(old):  # a longer copy (refragmented) wins
            pend.pieces[offset] = payload
            grown = len(payload) - (0 if old is None else len(old))
            pend.held += grown
            self._held += grown
            if end > offset:
                _cover(pend, offset, end)
            if offset > pend.max_offset:
                pend.max_offset = offset
            if self._held > MAX_PENDING_BYTES:
                while self._held > MAX_PENDING_BYTES and self._drop_oldest(LIMIT_BYTES):
                    pass
                if self._pending.get(key) is not pend:  # this datagram was the oldest
                    return None
        if not more:
            pend.total = end
        total = pend.total
        if total is None:
            return None
        # Complete iff the ranges received cover [0, total) and no fragment starts
        # beyond the end (the reassembly below would find a hole there).
        if pend.max_offset > total or (total and (not pend.starts or pend.starts[0] != 0
                                                  or pend.ends[0] < total)):
            return None
        out = bytearray(total)
        covered = 0
        for off in sorted(pend.pieces):
            piece = pend.pieces[off]
            if off > covered:
                return None
            stop = min(off + len(piece), total)
            if stop > covered:
                out[covered:stop] = piece[covered - off:stop - off]
                covered = stop
        if covered < total:
            return None
        self._remove(key, pend)
        return bytes(out)

    def expire(self, now_ns: int) -> None:
        """Drop datagrams whose first fragment is older than the timeout."""
        self._expire(now_ns)

    def _expire(self, now_ns: int) -> None:
        order = self._order
        pending = self._pending
        limit = now_ns - FRAGMENT_TIMEOUT_NS
        while order and order[0][0] < limit:
            _first, _n, key, pend = heapq.heappop(order)
            if pending.get(key) is pend:
                self._remove(key, pend)
                self.dropped += 1

    def _drop_oldest(self, limit: str) -> bool:
        """Drop the datagram whose first fragment came first; False if none is pending."""
        order = self._order
        pending = self._pending
        while order:
            _first, _n, key, pend = heapq.heappop(order)
            if pending.get(key) is not pend:
                continue
            self._remove(key, pend)
            self.dropped += 1
            self.limits_hit[limit] = self.limits_hit.get(limit, 0) + 1
            return True
        return False

    def _remove(self, key: tuple[bytes, bytes, int, int], pend: _Pending) -> None:
        del self._pending[key]
        self._held -= pend.held

    def _compact(self) -> None:
        """Rebuild the heap from the datagrams still pending."""
        pending = self._pending
        self._order = [e for e in self._order if pending.get(e[2]) is e[3]]
        heapq.heapify(self._order)


def _cover(pend: _Pending, start: int, end: int) -> None:
    """Add ``[start, end)`` to the received ranges of ``pend`` (merging neighbours)."""
    starts, ends = pend.starts, pend.ends
    i = bisect.bisect_left(ends, start)  # first range ending at or after start
    j = bisect.bisect_right(starts, end)  # ranges from i to j-1 touch [start, end)
    if i < j:
        start = min(start, starts[i])
        end = max(end, ends[j - 1])
        del starts[i:j], ends[i:j]
    starts.insert(i, start)
    ends.insert(i, end)
