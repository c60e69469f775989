"""Where a byte of a TCP stream was first captured, and the TLS records of the stream.

tshark reports a reassembled message (a TLS record, an HTTP/2 frame, a DNS message
over TCP) at the packet that *completes* it; the contract times a message by the
packet carrying its *first* byte. :class:`Direction` rebuilds one direction of a TCP
connection from tshark's ``tcp.seq`` and ``tcp.payload`` (first transmission of each
byte wins), so that any stream offset maps to the packet that first carried it, and
frames that direction's TLS records. Each framed record is checked against the
records tshark reports in the packet completing it (same lengths, same order) and
carries tshark's dissection of it (:attr:`Record.node`): decrypted content type,
handshake messages, alerts.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

TLS_CONTENT_TYPES = (20, 21, 22, 23, 24)


class Segment(Protocol):
    """What :class:`Direction` needs of a packet."""

    frame: int
    ts: int
    seq: int | None
    payload: bytes
    records: list[Any]
    """tshark's ``tls.record`` nodes completed in this packet, in order."""


@dataclass
class Record:
    """One TLS record of a direction, framed from the stream bytes."""

    start: int
    """Stream offset of its first header byte."""
    length: int
    """Length field (the fragment, header excluded)."""
    outer_type: int
    """Content type of the header (23 for every TLS 1.3 encrypted record)."""
    done: Any
    """The packet that delivered its last missing byte (where tshark reports it)."""
    node: Any = None
    """tshark's ``tls.record`` node for it."""
    index: int = 0
    """Position among the direction's records."""


def _merge(covered: list[tuple[int, int]], a: int, b: int) -> None:
    """Add [a, b) to the sorted, disjoint, merged intervals ``covered``."""
    i = bisect.bisect_left(covered, (a, a))
    if i > 0 and covered[i - 1][1] >= a:
        i -= 1
    j = i
    while j < len(covered) and covered[j][0] <= b:
        a, b = min(a, covered[j][0]), max(b, covered[j][1])
        j += 1
    covered[i:j] = [(a, b)]


def _subtract(a: int, b: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of [a, b) not in the sorted, merged ``covered`` intervals."""
    out = []
    pos = a
    i = bisect.bisect_left(covered, (a, a))
    for ca, cb in covered[max(i - 1, 0):]:
        if cb <= pos:
            continue
        if ca >= b:
            break
        if ca > pos:
            out.append((pos, min(ca, b)))
        pos = max(pos, cb)
        if pos >= b:
            break
    if pos < b:
        out.append((pos, b))
    return out


@dataclass
class Direction:
    """One direction of a TCP connection, byte by byte."""

    pkts: Sequence[Any]
    """Every packet of the direction, in capture order."""
    syn_seen: bool
    spans: list[tuple[int, int, Any]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    covered: list[tuple[int, int]] = field(default_factory=list)
    base: int = 0
    records_why: str | None = None
    _records: list[Record] | None = None

    def __post_init__(self) -> None:
        data = [p for p in self.pkts if p.payload and p.seq is not None]
        self.by_frame = {p.frame: p for p in self.pkts}
        self.base = 1 if self.syn_seen else min((p.seq for p in data), default=0)
        for p in data:
            for a, b in _subtract(p.seq, p.seq + len(p.payload), self.covered):
                self.spans.append((a, b, p))
            _merge(self.covered, p.seq, p.seq + len(p.payload))
        self.spans.sort(key=lambda s: s[0])
        self.starts = [s[0] for s in self.spans]

    # -- bytes -------------------------------------------------------------------------

    @property
    def first_bytes(self) -> int:
        """Payload bytes, each counted once (retransmissions excluded)."""
        return sum(b - a for a, b in self.covered)

    @property
    def lost_bytes(self) -> int:
        """Bytes between the first and the last captured one that were never captured."""
        if not self.covered:
            return 0
        start = min(self.base, self.covered[0][0])
        return (self.covered[-1][1] - start) - self.first_bytes

    def packet_at(self, offset: int) -> Any:
        """The packet that first carried stream byte ``offset`` (None if never captured)."""
        i = bisect.bisect_right(self.starts, offset) - 1
        if i >= 0:
            a, b, p = self.spans[i]
            if a <= offset < b:
                return p
        return None

    def data(self, start: int, end: int) -> bytes | None:
        """The stream bytes [start, end), or None where some were not captured."""
        out = bytearray()
        pos = start
        while pos < end:
            p = self.packet_at(pos)
            if p is None or p.seq is None:
                return None
            take = min(end, p.seq + len(p.payload)) - pos
            out += p.payload[pos - p.seq:pos - p.seq + take]
            pos += take
        return bytes(out)

    def completed_at(self, start: int, end: int) -> Any:
        """The packet (highest frame number) that delivered the last missing byte of
        [start, end), or None where some byte was not captured."""
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        pos, last = start, None
        while pos < end:
            if i >= len(self.spans):
                return None
            a, b, p = self.spans[i]
            i += 1
            if b <= pos:
                continue
            if a > pos:
                return None
            if last is None or p.frame > last.frame:
                last = p
            pos = b
        return last

    # -- TLS records -------------------------------------------------------------------

    def records(self) -> list[Record] | None:
        """The direction's TLS records in stream order, each with tshark's node; None
        (and ``records_why``) when the bytes do not frame as TLS or disagree with tshark."""
        if self._records is not None or self.records_why is not None:
            return self._records
        out: list[Record] = []
        pos = self.base
        end = self.covered[-1][1] if self.covered else self.base
        while pos + 5 <= end:
            head = self.data(pos, pos + 5)
            if head is None:
                break
            if head[0] not in TLS_CONTENT_TYPES or head[1] != 3:
                self.records_why = (f"no TLS record header at stream offset "
                                    f"{pos - self.base}")
                return None
            length = int.from_bytes(head[3:5], "big")
            done = self.completed_at(pos, pos + 5 + length)
            if done is None:
                break
            out.append(Record(pos, length, head[0], done, index=len(out)))
            pos += 5 + length
        by_frame: dict[int, list[Record]] = {}
        for rec in out:
            by_frame.setdefault(rec.done.frame, []).append(rec)
        for frame, recs in by_frame.items():
            pkt = self.by_frame.get(frame)
            theirs = pkt.records if pkt is not None else []
            lengths = [_record_length(n) for n in theirs[:len(recs)]]
            if [r.length for r in recs] != lengths:
                self.records_why = (f"TLS records completed in frame {frame}: framed "
                                    f"{[r.length for r in recs]}, tshark "
                                    f"{[_record_length(n) for n in theirs]}")
                return None
            for rec, node in zip(recs, theirs, strict=False):
                rec.node = node
        self._records = out
        return out


def _record_length(node: Any) -> int | None:
    value = node.get("tls.record.length") if hasattr(node, "get") else None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
