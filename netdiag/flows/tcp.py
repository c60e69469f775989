"""One TCP connection: orientation, handshake timing, per-direction reassembly, counters.

Sequence numbers are unwrapped to 64-bit stream offsets, so streams longer than
4 GiB stay ordered. Payload bytes are only kept (for out-of-order segments) when an
analyzer claimed the connection; for the others only sequence ranges are tracked.

Until the client's first payload bytes let the decider pick an analyzer, the server's
bytes (and any gap of either direction) are held, up to :data:`MAX_PENDING_SERVER`
bytes, and replayed to the analyzer after the decision; server bytes beyond that
reach it as a ``gap``. Payload bytes are counted when they become in-order, so a
retransmission that covers bytes held out of order does not count them twice. Data
carried by a SYN (TCP Fast Open) is part of the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from netdiag.flows.stream import StreamAnalyzer
from netdiag.limits import LIMIT_HELD_BYTES, LIMIT_OUT_OF_ORDER, Limits
from netdiag.records import RETRANSMISSION_TIMES_CAP, Connection

FIN: Final = 0x01
SYN: Final = 0x02
RST: Final = 0x04
ACK: Final = 0x10

MASK32: Final = 0xFFFFFFFF
HALF32: Final = 0x80000000
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

    __slots__ = ("analyzer", "client_isn", "conn", "decide", "decided", "dirs", "failure",
                 "finished", "keys", "limits", "pending", "pending_bytes", "server_isn",
                 "synack_seen")

    def __init__(self, conn: Connection, decide: Decider, limits: Limits | None = None) -> None:
        self.conn = conn
        self.decide = decide
        self.limits = limits if limits is not None else Limits()
        """Caps shared by every connection of the analysis (held bytes) and their hits."""
        self.decided = False
        self.analyzer: StreamAnalyzer | None = None
        self.dirs: tuple[_Direction, ...] = (_Direction(), _Direction())
        self.synack_seen = False
        self.server_isn: int | None = None
        self.client_isn: int | None = None
        self.keys: tuple[bytes, bytes] = (b"", b"")
        self.pending: list[tuple[int, int, bytes, int, int]] = []
        """Held until the decision: ``(d, ts, data, pkt, 0)``; a gap is ``(d, ts, b"", 0, n)``."""
        self.pending_bytes = 0
        self.finished = False
        self.failure: str | None = None
        """Set when the analyzer raised: it is fed nothing more (a bug, reported as a warning)."""

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
            if not self._syn(d, ts, flags, seq, st) or not payload:
                return
            seq = (seq + 1) & MASK32  # data in a first SYN (TCP Fast Open) follows the ISN
        elif (d == 0 and conn.handshake_ack_ns is None and self.synack_seen and flags & ACK
                and conn.syn_ns is not None):
            conn.handshake_ack_ns = ts
        n = len(payload)
        nxt = st.next
        if nxt is None:
            nxt = st.next = seq
        if n:
            delta = ((seq - nxt + HALF32) & MASK32) - HALF32
            if delta == 0:  # the common case, inlined
                if st.ooo:
                    self._count_gap_fill(ts, st)
                if d:
                    conn.bytes_to_client += n
                else:
                    conn.bytes_to_server += n
                st.next = nxt + n
                if self.analyzer is not None or not self.decided:
                    self._deliver(d, ts, payload, pkt)
                if st.ooo:
                    self._drain(d, st)
            elif delta < 0:
                end = delta + n
                if end <= 0:
                    if not (n == 1 and delta == -1):
                        self._retransmitted(ts)
                else:
                    self._retransmitted(ts)
                    self._add_bytes(d, end)
                    st.next = nxt + end
                    self._deliver(d, ts, payload[n - end:], pkt)
                    if st.ooo:
                        self._drain(d, st)
            else:
                self._hold(d, ts, nxt + delta, payload, pkt, st)
        if flags & FIN:
            fin_at = nxt + (((seq - nxt + HALF32) & MASK32) - HALF32) + n
            if st.fin_at is None:
                st.fin_at = fin_at
                if conn.close == "open":
                    other = self.dirs[1 - d]
                    if other.fin_at is not None:
                        conn.close = "fin"
            elif st.fin_at == fin_at and not n:
                self._retransmitted(ts)
            if st.next == fin_at:
                st.next = fin_at + 1

    def _syn(self, d: int, ts: int, flags: int, seq: int, st: _Direction) -> bool:
        """Account a SYN or SYN-ACK; True for the first one of its direction."""
        conn = self.conn
        if d == 0 and not flags & ACK:
            if conn.syn_ns is None:
                conn.syn_ns = ts
                conn.handshake_seen = True
                self.client_isn = seq
                st.next = seq + 1
                st.isn_seen = True
                return True
            conn.syn_retransmissions += 1
            self._retransmitted(ts)
        elif d == 1 and flags & ACK:
            if not self.synack_seen:
                self.synack_seen = True
                self.server_isn = seq
                st.next = seq + 1
                st.isn_seen = True
                return True
            if self.server_isn == seq:
                self._retransmitted(ts)
        return False

    def _retransmitted(self, ts: int) -> None:
        conn = self.conn
        conn.retransmissions += 1
        if len(conn.retransmission_ns) < RETRANSMISSION_TIMES_CAP:
            conn.retransmission_ns.append(ts)

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
            self._retransmitted(ts)
        else:
            conn.out_of_order += 1

    def _hold(self, d: int, ts: int, at: int, payload: bytes, pkt: int, st: _Direction) -> None:
        ooo = st.ooo
        n = len(payload)
        limits = self.limits
        old = ooo.get(at)
        if old is not None:  # seen before: keep it, unless this copy carries more
            self._retransmitted(ts)
            if old[2] >= n:
                return
            st.ooo_bytes -= old[2]
            if old[1] is not None:
                limits.held_bytes -= old[2]
            ts, pkt = old[0], old[3]
        elif not ooo:
            st.gap_ns = ts
        keep = payload if (not self.decided or self.analyzer is not None) else None
        ooo[at] = (ts, keep, n, pkt)
        st.ooo_bytes += n
        if keep is not None:
            limits.held_bytes += n
        if len(ooo) > MAX_OOO_SEGMENTS or st.ooo_bytes > MAX_OOO_BYTES:
            limits.count(LIMIT_OUT_OF_ORDER)
            self._skip_gap(d, ts, st)
        elif limits.held_bytes > limits.max_held_bytes:
            limits.count(LIMIT_HELD_BYTES)
            while st.ooo:
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
            if data is not None:
                self.limits.held_bytes -= n
            end = at + n
            if end <= nxt:
                continue
            st.next = end
            self._add_bytes(d, end - nxt)
            if data is not None:
                self._deliver(d, ts, data[nxt - at:], pkt)

    def _skip_gap(self, d: int, ts: int, st: _Direction) -> None:
        """Declare the bytes before the first held segment lost, and move on."""
        if not st.ooo or st.next is None:
            return
        at = min(st.ooo)
        missing = at - st.next
        self.conn.lost_bytes += missing
        if not self.decided:
            self.pending.append((d, ts, b"", 0, missing))
        elif self.analyzer is not None and self.failure is None:
            try:
                self.analyzer.gap(d, ts, missing)
            except Exception as e:
                self._failed(e, 0)
        st.next = at
        self._drain(d, st)

    # -- analyzers ------------------------------------------------------------------
    def _deliver(self, d: int, ts: int, data: bytes, pkt: int) -> None:
        if not self.decided:
            if d == 1:
                self._pend_server(ts, data, pkt)
                return
            self._decide(bytes(data))
        an = self.analyzer
        if an is not None and self.failure is None:
            try:
                an.feed(d, ts, data, pkt)
            except Exception as e:
                self._failed(e, pkt)

    def _failed(self, e: Exception, pkt: int) -> None:
        """An analyzer bug must cost one connection's analysis, not the whole report."""
        self.failure = f"analyzer failed at packet {pkt} ({type(e).__name__}: {e})"

    def _pend_server(self, ts: int, data: bytes, pkt: int) -> None:
        pend = self.pending
        n = len(data)
        limits = self.limits
        if self.pending_bytes + n <= MAX_PENDING_SERVER:
            if limits.held_bytes + n <= limits.max_held_bytes:
                self.pending_bytes += n
                limits.held_bytes += n
                pend.append((1, ts, bytes(data), pkt, 0))
                return
            limits.count(LIMIT_HELD_BYTES)
        if pend and pend[-1][0] == 1 and pend[-1][4]:  # grow the server gap it ends with
            last = pend[-1]
            pend[-1] = (1, last[1], b"", 0, last[4] + n)
        else:  # over the budget: the analyzer will see these bytes as a gap
            pend.append((1, ts, b"", 0, n))

    def _decide(self, first_client_bytes: bytes) -> None:
        self.decided = True
        an = self.analyzer = self.decide(self, first_client_bytes)
        pend = self.pending
        self.pending = []
        self.limits.held_bytes -= self.pending_bytes
        self.pending_bytes = 0
        if an is not None:
            try:
                for d, ts, data, pkt, gap in pend:
                    if gap:
                        an.gap(d, ts, gap)
                    else:
                        an.feed(d, ts, data, pkt)
            except Exception as e:
                self._failed(e, pend[-1][3] if pend else 0)

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
        if self.analyzer is not None and self.failure is None:
            try:
                self.analyzer.close(ts)
            except Exception as e:
                self._failed(e, 0)
