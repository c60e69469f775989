"""Server-sent events (``text/event-stream``) counted as they complete.

Fed the decoded response body in order, with the capture time of the bytes, it
records the time of each event: the time of the bytes that complete it (the blank
line that ends an event). Blocks without a ``data`` field (comments used as
keep-alives, lone ``retry:``) dispatch nothing and are not counted. The gaps
between those times are the token cadence of a streamed LLM answer.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from netdiag.records import Request


class SseCounter:
    """Counts events in one ``text/event-stream`` body."""

    __slots__ = ("_cr", "_tail", "event_times")

    MAX_TAIL: ClassVar[int] = 1 << 16
    """Bytes of an unfinished event kept to look for its end; beyond that only the end
    (a class attribute, ``SseCounter.MAX_TAIL``, in the compiled module too)."""

    def __init__(self) -> None:
        self.event_times: list[int] = []
        """Capture time at which each event was complete, in order."""
        self._tail = bytearray()
        """The unfinished event so far, line ends already made ``\\n``; never holds a
        blank line (``\\n\\n``)."""
        self._cr = False
        """The bytes fed so far ended with ``\\r``: a ``\\n`` first in the next bytes
        completes that CRLF (one line end, already counted), not a blank line."""

    def feed(self, ts_ns: int, data: bytes | bytearray | memoryview) -> None:
        """More body bytes (any bytes-like object), captured at ``ts_ns``.

        The result does not depend on where the body is cut into pieces (a CRLF split
        across two segments is one line end), and each piece is searched only from the
        end of the unfinished event before it, so cost is linear in the body.
        """
        if not data:
            return
        data = bytes(data)
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        if not data:
            self._cr = False
            return
        self._cr = data[-1:] == b"\r"
        tail = self._tail
        pos = max(len(tail) - 1, 0)  # the tail has no blank line: one may end in it
        tail += data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = 0
        while True:
            end = tail.find(b"\n\n", pos)
            if end < 0:
                break
            if _dispatches(tail[start:end]):
                self.event_times.append(ts_ns)
            start = pos = end + 2
        cut = max(start, len(tail) - self.MAX_TAIL)
        if cut:
            del tail[:cut]

    @property
    def events(self) -> int:
        """Events completed so far."""
        return len(self.event_times)

    def gaps(self) -> list[int] | None:
        """Gaps between successive events, None with fewer than two events."""
        t = self.event_times
        if len(t) < 2:
            return None
        return [b - a for a, b in itertools.pairwise(t)]


def response_status(headers: list[tuple[str, str]] | None) -> int | None:
    """The ``:status`` of a response's header fields (HTTP/2, HTTP/3), None without one
    or when it is not a number."""
    for name, value in headers or ():
        if name == ":status":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def final_response(req: Request, status: int | None,
                   headers: list[tuple[str, str]] | None) -> SseCounter | None:
    """Record a final (non-1xx) response's status and header fields on ``req`` (its
    ``content_type`` the first ``content-type``); the event counter to feed its body
    with when it is an event stream (``sse_events`` and ``chunks`` then start at 0)."""
    req.status = status
    if headers is None:
        return None
    req.response_headers = headers
    for name, value in headers:
        if name == "content-type":
            req.content_type = value
            break
    if not is_event_stream(req.content_type):
        return None
    req.sse_events = 0
    req.chunks = 0
    return SseCounter()


def add_events(counter: SseCounter, req: Request, gaps: list[int], ts_ns: int,
               chunk: bytes | bytearray | memoryview) -> None:
    """Feed one body chunk of an event-stream answer (HTTP/2 DATA, HTTP/3 DATA) and keep
    ``req``'s figures: ``first_event_ns``, ``sse_events`` (= ``chunks``) and
    ``chunk_gaps_ns`` (``gaps``, the list the analyzer keeps for this request)."""
    before = counter.events
    counter.feed(ts_ns, chunk)
    times = counter.event_times
    if len(times) > before:
        if before == 0:
            req.first_event_ns = times[0]
        else:
            gaps.append(times[before] - times[before - 1])
        for k in range(before + 1, len(times)):  # per DATA frame: no slices, no zip call
            gaps.append(times[k] - times[k - 1])
        req.sse_events = req.chunks = len(times)
        if gaps:
            req.chunk_gaps_ns = gaps


def _dispatches(block: bytes | bytearray) -> bool:
    """An event is dispatched only when it has a data field (comments are keep-alives)."""
    return any(line.startswith(b"data") for line in block.split(b"\n"))


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``content-type`` header value announces server-sent events."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"
