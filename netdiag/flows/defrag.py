"""IPv4 and IPv6 fragment reassembly, bounded in memory and time."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_DATAGRAM = 65535 + 8
"""No reassembled datagram is allowed to grow beyond this (IPv6 jumbograms aside)."""
FRAGMENT_TIMEOUT_NS = 30_000_000_000
"""Fragments of a datagram that has not completed within this are dropped (RFC 791's 15-120 s)."""
MAX_PENDING = 4096
"""At most this many datagrams are being reassembled at once; the oldest is dropped first."""


@dataclass(slots=True)
class _Pending:
    first_ns: int
    pieces: dict[int, bytes] = field(default_factory=dict)
    total: int | None = None


class Defragmenter:
    """Collects fragments per (source, destination, id, protocol) and returns whole payloads."""

    def __init__(self) -> None:
        self._pending: dict[tuple[bytes, bytes, int, int], _Pending] = {}
        self.dropped = 0
        """Datagrams abandoned (timeout, overlap beyond limits, too many pending)."""

    def add(self, ts_ns: int, src: bytes, dst: bytes, ident: int, proto: int,
            offset: int, more: bool, payload: bytes) -> bytes | None:
        """Add one fragment (``offset`` in bytes); return the whole payload once complete."""
        key = (src, dst, ident, proto)
        pend = self._pending.get(key)
        if pend is None:
            if len(self._pending) >= MAX_PENDING:
                self._expire(ts_ns, force_one=True)
            pend = self._pending[key] = _Pending(ts_ns)
        end = offset + len(payload)
        if end > MAX_DATAGRAM:
            del self._pending[key]
            self.dropped += 1
            return None
        old = pend.pieces.get(offset)
        if old is None or len(payload) > len(old):  # a longer copy (refragmented) wins
            pend.pieces[offset] = payload
        if not more:
            pend.total = end
        if pend.total is None:
            return None
        out = bytearray(pend.total)
        covered = 0
        for off in sorted(pend.pieces):
            piece = pend.pieces[off]
            if off > covered:
                return None
            stop = min(off + len(piece), pend.total)
            if stop > covered:
                out[covered:stop] = piece[covered - off:stop - off]
                covered = stop
        if covered < pend.total:
            return None
        del self._pending[key]
        return bytes(out)

    def expire(self, now_ns: int) -> None:
        """Drop datagrams whose first fragment is older than the timeout."""
        self._expire(now_ns, force_one=False)

    def _expire(self, now_ns: int, force_one: bool) -> None:
        stale = [k for k, p in self._pending.items() if now_ns - p.first_ns > FRAGMENT_TIMEOUT_NS]
        if force_one and not stale and self._pending:
            stale = [min(self._pending, key=lambda k: self._pending[k].first_ns)]
        for k in stale:
            del self._pending[k]
            self.dropped += 1
