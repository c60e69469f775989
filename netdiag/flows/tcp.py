"""One TCP connection: orientation, handshake timing, per-direction reassembly, counters.

Sequence numbers are unwrapped to 64-bit stream offsets, so streams longer than
4 GiB stay ordered. Payload bytes are only kept (for out-of-order segments) when an
analyzer claimed the connection; for the others only sequence ranges are tracked.
"""

from __future__ import annotations

from collections.abc import Callable

from netdiag.protocols.base import StreamAnalyzer
from netdiag.records import Connection

FIN = 0x01
SYN = 0x02
RST = 0x04
ACK = 0x10

MASK32 = 0xFFFFFFFF
HALF32 = 0x80000000
MAX_OOO_SEGMENTS = 1024
"""Out-of-order segments held per direction before the missing bytes are declared lost."""
MAX_OOO_BYTES = 8 << 20
"""Out-of-order payload bytes held per direction before the missing bytes are declared lost."""
DEFAULT_REORDER_NS = 3_000_000
"""Gap fills faster than this (or the handshake RTT) count as reordering, not retransmission."""
MAX_PENDING_SERVER = 64 << 10
"""Server bytes held while the client has not yet spoken (analyzer undecided)."""

Decider = Callable[["TcpFlow", bytes], "StreamAnalyzer | None"]


class _Direction:
    """Reassembly state of one direction."""

    __slots__ = ("fin_at", "gap_ns", "isn_seen", "next", "ooo", "ooo_bytes")

    def __init__(self) -> None:
        self.next: int | None = None
        self.isn_seen = False
        self.ooo: dict[int, tuple[int, bytes | None, int, int]] = {}
        self.ooo_bytes = 0
        self.gap_ns = 0
        self.fin_at: int | None = None


class TcpFlow:
    """Tracks one connection; ``packet`` is called for each of its segments."""

    __slots__ = ("analyzer", "client_isn", "conn", "decide", "decided", "dirs", "finished",
                 "keys", "pending_server", "server_isn", "synack_seen")

    def __init__(self, conn: Connection, decide: Decider) -> None:
        self.conn = conn
        self.decide = decide
        self.decided = False
        self.analyzer: StreamAnalyzer | None = None
        self.dirs = (_Direction(), _Direction())
        self.synack_seen = False
        self.server_isn: int | None = None
        self.client_isn: int | None = None
        self.keys: tuple[bytes, bytes] = (b"", b"")
        self.pending_server: list[tuple[int, bytes, int]] | None = []
        self.finished = False

    # -- per packet -----------------------------------------------------------------
    def packet(self, d: int, ts: int, flags: int, seq: int, payload: bytes, pkt: int) -> None:
        """Account one segment travelling in direction ``d`` (0: client to server)."""
        conn = self.conn
        conn.packets += 1
        conn.last_ns = ts
        st = self.dirs[d]
        if flags & RST:
            conn.resets += 1
            conn.close = "rst"
        if flags & SYN:
            self._syn(d, ts, flags, seq, st)
            return
        if (d == 0 and conn.handshake_ack_ns is None and self.synack_seen and flags & ACK
                and conn.syn_ns is not None):
            conn.handshake_ack_ns = ts
        n = len(payload)
        nxt = st.next
        if nxt is None:
            nxt = st.next = seq
        delta = ((seq - nxt + HALF32) & MASK32) - HALF32
        if n:
            if delta == 0:
                if st.ooo:
                    self._count_gap_fill(ts, st)
                self._add_bytes(d, n)
                st.next = nxt + n
                self._deliver(d, ts, payload, pkt)
                if st.ooo:
                    self._drain(d, st)
            elif delta < 0:
                end = delta + n
                if end <= 0:
                    if not (n == 1 and delta == -1):
                        conn.retransmissions += 1
                else:
                    conn.retransmissions += 1
                    self._add_bytes(d, end)
                    st.next = nxt + end
                    self._deliver(d, ts, payload[n - end:], pkt)
                    if st.ooo:
                        self._drain(d, st)
            else:
                self._hold(d, ts, nxt + delta, payload, pkt, st)
        if flags & FIN:
            fin_at = nxt + delta + n
            if st.fin_at is None:
                st.fin_at = fin_at
                if conn.close == "open":
                    other = self.dirs[1 - d]
                    if other.fin_at is not None:
                        conn.close = "fin"
            elif st.fin_at == fin_at and not n:
                conn.retransmissions += 1
            if st.next == fin_at:
                st.next = fin_at + 1

    def _syn(self, d: int, ts: int, flags: int, seq: int, st: _Direction) -> None:
        conn = self.conn
        if d == 0 and not flags & ACK:
            if conn.syn_ns is None:
                conn.syn_ns = ts
                conn.handshake_seen = True
                self.client_isn = seq
            else:
                conn.syn_retransmissions += 1
                conn.retransmissions += 1
            st.next = seq + 1
            st.isn_seen = True
        elif d == 1 and flags & ACK:
            if self.synack_seen and self.server_isn == seq:
                conn.retransmissions += 1
            self.synack_seen = True
            self.server_isn = seq
            st.next = seq + 1

    def _add_bytes(self, d: int, n: int) -> None:
        if d == 0:
            self.conn.bytes_to_server += n
        else:
            self.conn.bytes_to_client += n

    def _count_gap_fill(self, ts: int, st: _Direction) -> None:
        conn = self.conn
        rtt = DEFAULT_REORDER_NS
        if conn.syn_ns is not None and conn.handshake_ack_ns is not None:
            rtt = max(rtt, conn.handshake_ack_ns - conn.syn_ns)
        if ts - st.gap_ns > rtt:
            conn.retransmissions += 1
        else:
            conn.out_of_order += 1

    def _hold(self, d: int, ts: int, at: int, payload: bytes, pkt: int, st: _Direction) -> None:
        if at in st.ooo:
            self.conn.retransmissions += 1
            return
        if not st.ooo:
            st.gap_ns = ts
        keep = payload if (not self.decided or self.analyzer is not None) else None
        st.ooo[at] = (ts, keep, len(payload), pkt)
        st.ooo_bytes += len(payload)
        self._add_bytes(d, len(payload))
        if len(st.ooo) > MAX_OOO_SEGMENTS or st.ooo_bytes > MAX_OOO_BYTES:
            self._skip_gap(d, ts, st)

    def _drain(self, d: int, st: _Direction) -> None:
        ooo = st.ooo
        while ooo:
            at = min(ooo)
            nxt = st.next
            assert nxt is not None
            if at > nxt:
                return
            ts, data, n, pkt = ooo.pop(at)
            st.ooo_bytes -= n
            end = at + n
            if end <= nxt:
                continue
            st.next = end
            if data is not None:
                self._deliver(d, ts, data[nxt - at:], pkt)

    def _skip_gap(self, d: int, ts: int, st: _Direction) -> None:
        """Declare the bytes before the first held segment lost, and move on."""
        if not st.ooo or st.next is None:
            return
        at = min(st.ooo)
        missing = at - st.next
        self.conn.lost_bytes += missing
        if self.analyzer is not None:
            self.analyzer.gap(d, ts, missing)
        st.next = at
        self._drain(d, st)

    # -- analyzers ------------------------------------------------------------------
    def _deliver(self, d: int, ts: int, data: bytes, pkt: int) -> None:
        if not self.decided:
            if d == 1:
                pend = self.pending_server
                if pend is not None:
                    if sum(len(p[1]) for p in pend) + len(data) <= MAX_PENDING_SERVER:
                        pend.append((ts, bytes(data), pkt))
                    else:
                        self.pending_server = None
                return
            self._decide(bytes(data))
        an = self.analyzer
        if an is not None:
            an.feed(d, ts, data, pkt)

    def _decide(self, first_client_bytes: bytes) -> None:
        self.decided = True
        self.analyzer = self.decide(self, first_client_bytes)
        pend = self.pending_server
        self.pending_server = None
        if self.analyzer is not None and pend:
            for ts, data, pkt in pend:
                self.analyzer.feed(1, ts, data, pkt)

    def finish(self, ts: int, reason: str) -> None:
        """End of the connection: flush held segments past their gaps, close analyzers."""
        if self.finished:
            return
        self.finished = True
        for d, st in enumerate(self.dirs):
            while st.ooo:
                self._skip_gap(d, ts, st)
        if not self.decided:
            self._decide(b"")
        if self.conn.close == "open" and reason != "open":
            self.conn.close = reason
        if self.analyzer is not None:
            self.analyzer.close(ts)
