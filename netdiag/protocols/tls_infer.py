"""Guess request/response exchanges from the sizes and times of encrypted TLS records.

Without a key, an HTTPS connection shows only application-data records: who sent
each one, when its first and last byte passed, and its ciphertext length. This
module turns that sequence into :class:`~netdiag.records.Request` records marked
``estimated=True``. It is fed online, one event per complete record
(:meth:`ExchangeInferrer.record`), and keeps O(1) state per connection besides the
exchange in progress (whose ``chunk_gaps_ns`` list grows with its records).

The heuristic
-------------
*Substantive records.* HTTP/2 sends small control frames in both directions that
are not requests or responses: SETTINGS ACK (9 bytes), WINDOW_UPDATE and RST_STREAM
(13), often two WINDOW_UPDATEs together (26). When the cipher's exact expansion is
known (``overhead``: 17 for TLS 1.3, 24 for TLS 1.2 AES-GCM/CCM, 16 for
ChaCha20-Poly1305; see :func:`netdiag.tls.names.record_overhead`), a
record's plaintext size is ``length - overhead`` and the record is *control* when
that is at most 9 bytes or one of 13, 22 (9+13), 26 (13+13), 35 and 39; every other
record is *substantive*. The bar is that low on purpose: on a reused HTTP/2
connection HPACK shrinks a repeated request's HEADERS frame to 15..20 bytes (curl
15, httpx 17, a browser about 19), so a fixed ciphertext threshold of about 40
bytes would miss every request after the first. A 17-byte client record counts
(httpx's HEADERS; clients rarely ping). A 17-byte *server* record is a PING, a
GOAWAY without debug data (which servers send at idle close, seconds after the
last answer) or a small response HEADERS (``:status`` and an indexed
content-type and content-length): it is held back and counted only when more
server data follows in the same exchange, or when it is the exchange's only
answer.
When the overhead is unknown (CBC and stream suites, whose padding hides the
plaintext size, unknown suites, or a capture that starts after the handshake), a
record is substantive when its ciphertext is longer than ``small`` bytes (default
40: TLS 1.3 adds 17 bytes and a request HEADERS frame is rarely under 25 bytes).
TLS 1.3's encrypted alerts (2 bytes of plaintext) are control by either rule.

*Request boundaries.* A request starts at a substantive client record that comes
after substantive server data was seen since the previous request started, or at
the first substantive client record of the connection. Further client records
before any server answer (request body, more HEADERS of the same burst) belong to
the same request. Server records before the first request (TLS 1.3
NewSessionTicket, HTTP/2 server SETTINGS sent first) are not responses.

*Response figures.* ``first_byte_ns`` is the first-byte time of the first
substantive server record after the request started; ``last_byte_ns`` the
last-byte time of the last substantive server record before the next request (or
the end of the connection); ``response_bytes`` the sum of those records'
ciphertext lengths; ``chunks`` their number; ``chunk_gaps_ns`` the gaps between
the first-byte times of successive ones (``None`` when fewer than two). Control
records never count, so a trailing empty END_STREAM DATA frame or a GOAWAY sent
seconds later at idle close does not stretch the last response. A request never
answered keeps ``None`` in every response field.

*The handshake tail.* When the client's Finished ends the handshake (TLS 1.3, and
TLS 1.2 resumption), the client sends its first request in the same flight as
its Finished, and the server's NewSessionTickets and HTTP/2 SETTINGS, triggered
by the Finished, arrive after the request started, looking like a fast answer
(in real captures: 22 ms of a 44 ms TTFB; 1 ms of a 95 ms one). So, once armed
(:meth:`ExchangeInferrer.arm_tail`), the first burst of server records after the
first request started (records each starting within ``tail_gap_ns`` of the
previous one's last byte) is held back: if another server record follows after a
longer pause, the burst was the handshake tail and is dropped; if the exchange
ends first, the burst was the answer (the server answered so fast the two cannot
be told apart, and the error is at most the burst's length). Server data before
the first request disarms it (the tail came first). Failure mode: a response whose
first part (say, streamed HEADERS) leaves together with the tickets and whose rest
follows after a pause gets its first byte from the second part.

Limits
------
Multiplexed HTTP/2 streams in flight together cannot be told apart: concurrent
requests merge into one exchange, and server pushes or interleaved responses are
counted as one answer. Pipelined HTTP/1.1 merges the same way. A request sent as
TLS 1.3 early data (0-RTT) is not seen. ``Expect: 100-continue`` splits one
request into two. Everything here is an estimate; decrypted connections use the
HTTP/2 and HTTP/1.x analyzers instead.
"""

from __future__ import annotations

from typing import Final

from netdiag.records import Request

CONTROL_MAX_PLAINTEXT: Final = 9
"""Plaintext sizes up to this are control (SETTINGS ACK, alerts, HTTP/1.1 ``0\\r\\n\\r\\n``)."""

CONTROL_PLAINTEXT_SIZES: Final = frozenset({13, 22, 26, 35, 39})
"""Other plaintext sizes taken as HTTP/2 control: WINDOW_UPDATE/RST_STREAM (13) and
their combinations with each other and with a SETTINGS ACK (9)."""

AMBIGUOUS_SERVER_PLAINTEXT: Final = 17
"""A server record of this plaintext size is a PING, a GOAWAY without debug data (sent
at idle close) or a small HPACK-indexed response HEADERS: held back (module doc)."""

DEFAULT_SMALL = 40
"""Default ciphertext threshold when the cipher's overhead is unknown."""

DEFAULT_TAIL_GAP_NS = 2_000_000
"""Default longest pause inside the handshake-tail burst (2 ms)."""

_TAIL_OFF: Final = 0
_TAIL_ARMED: Final = 1
_TAIL_PENDING: Final = 2


class ExchangeInferrer:
    """Online guess of request/response exchanges from record events (module doc)."""

    __slots__ = (
        "_answered",
        "_bytes",
        "_chunks",
        "_cur",
        "_cur_plain",
        "_first",
        "_gaps",
        "_held",
        "_last",
        "_prev_first",
        "_tail",
        "_tail_deadline",
        "overhead",
        "requests",
        "small",
        "tail_gap_ns",
    )

    def __init__(self, small: int = DEFAULT_SMALL, overhead: int | None = None,
                 tail_gap_ns: int = DEFAULT_TAIL_GAP_NS,
                 requests: list[Request] | None = None) -> None:
        """``small``: ciphertext threshold used when ``overhead`` is None.

        ``overhead``: exact ciphertext expansion per record of the negotiated
        cipher, or None. ``tail_gap_ns``: longest pause inside the handshake-tail
        burst. ``requests``: list to append finished exchanges to (a new one if None).
        """
        self.small = small
        self.overhead = overhead
        self.tail_gap_ns = tail_gap_ns
        self.requests: list[Request] = [] if requests is None else requests
        """Exchanges finished so far, in order; complete after :meth:`close`."""
        self._cur: Request | None = None
        self._cur_plain = 0
        self._answered = False
        self._first: int | None = None
        self._last: int | None = None
        self._bytes = 0
        self._chunks = 0
        self._prev_first = 0
        self._gaps: list[int] = []
        self._held: tuple[int, int, int] | None = None
        self._tail = _TAIL_OFF
        self._tail_deadline: int | None = None

    def arm_tail(self, deadline_ns: int | None = None) -> None:
        """Hold back the first server burst after the first request (module doc).

        With ``deadline_ns``, a burst starting later than that is not the tail.
        Has no effect once server data has been counted.
        """
        if self._tail == _TAIL_OFF and not self._answered:
            self._tail = _TAIL_ARMED
            self._tail_deadline = deadline_ns

    @property
    def pending(self) -> bool:
        """A request has started and its exchange is not finished."""
        return self._cur is not None

    def substantive(self, length: int) -> bool:
        """Whether a record of ciphertext ``length`` carries request/response data."""
        overhead = self.overhead
        if overhead is None:
            return length > self.small
        plain = length - overhead
        return plain > CONTROL_MAX_PLAINTEXT and plain not in CONTROL_PLAINTEXT_SIZES

    def record(self, direction: int, first_ts: int, last_ts: int, length: int,
               first_packet: int) -> None:
        """One complete application-data record: ``direction`` 0 client, 1 server.

        ``first_ts``/``last_ts`` are the capture times of the segments carrying its
        first and last byte, ``length`` its ciphertext length, ``first_packet`` the
        packet carrying its first byte (unused, kept for symmetry with the hook).
        """
        if not self.substantive(length):
            return
        if direction == 0:
            plain = length - (self.overhead or 0)
            if self._cur is None or self._answered:
                self._flush()
                self._cur = Request(ts_ns=first_ts, estimated=True)
                self._cur_plain = plain
            elif plain > self._cur_plain:
                self._cur_plain = plain
            return
        if self._cur is None:
            # Server data before any request: not a response; the tail came first.
            self._tail = _TAIL_OFF
            return
        overhead = self.overhead
        if overhead is not None and length - overhead == AMBIGUOUS_SERVER_PLAINTEXT:
            if self._held is None:
                self._held = (first_ts, last_ts, length)
            return
        held = self._held
        if held is not None:
            self._held = None
            self._server_data(*held)
        self._server_data(first_ts, last_ts, length)

    def close(self) -> None:
        """The connection ended: finish the exchange in progress.

        A last client record no bigger than a GOAWAY or PING (17 bytes of plaintext)
        that got no answer at all is the client closing the session, not a request.
        """
        if (self._cur is not None and self._first is None and self._held is None
                and self.overhead is not None
                and self._cur_plain <= AMBIGUOUS_SERVER_PLAINTEXT):
            self._cur = None
            return
        self._flush()

    def _server_data(self, first_ts: int, last_ts: int, length: int) -> None:
        """Count one substantive server record into the current exchange."""
        tail = self._tail
        if tail != _TAIL_OFF:
            if tail == _TAIL_ARMED:
                deadline = self._tail_deadline
                self._tail = (_TAIL_PENDING if deadline is None or first_ts <= deadline
                              else _TAIL_OFF)
            elif self._last is not None and first_ts - self._last > self.tail_gap_ns:
                # A pause after the first burst: that burst was the handshake tail.
                self._tail = _TAIL_OFF
                self._first = None
                self._last = None
                self._bytes = 0
                self._chunks = 0
                self._gaps = []
        self._answered = True
        if self._first is None:
            self._first = first_ts
        else:
            self._gaps.append(first_ts - self._prev_first)
        self._prev_first = first_ts
        self._last = last_ts
        self._bytes += length
        self._chunks += 1

    def _flush(self) -> None:
        cur = self._cur
        if cur is None:
            return
        held = self._held
        if held is not None:
            self._held = None
            if self._first is None:
                self._server_data(*held)  # the only answer there was
        self._tail = _TAIL_OFF
        if self._first is not None:
            cur.first_byte_ns = self._first
            cur.last_byte_ns = self._last
            cur.response_bytes = self._bytes
            cur.chunks = self._chunks
            cur.chunk_gaps_ns = self._gaps if self._gaps else None
        self.requests.append(cur)
        self._cur = None
        self._answered = False
        self._first = None
        self._last = None
        self._bytes = 0
        self._chunks = 0
        self._gaps = []
