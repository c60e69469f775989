"""Server-sent events (``text/event-stream``) counted as they complete.

Fed the decoded response body in order, with the capture time of the bytes, it
records the time of each event: the time of the bytes that complete it (the blank
line that ends an event). Blocks without a ``data`` field (comments used as
keep-alives, lone ``retry:``) dispatch nothing and are not counted. The gaps
between those times are the token cadence of a streamed LLM answer.
"""

from __future__ import annotations

import itertools


class SseCounter:
    """Counts events in one ``text/event-stream`` body."""

    __slots__ = ("_tail", "event_times")

    MAX_TAIL = 1 << 16
    """Bytes of an unfinished event kept to look for its end; beyond that only the end."""

    def __init__(self) -> None:
        self.event_times: list[int] = []
        """Capture time at which each event was complete, in order."""
        self._tail = b""

    def feed(self, ts_ns: int, data: bytes) -> None:
        """More body bytes, captured at ``ts_ns``."""
        if not data:
            return
        buf = self._tail + bytes(data)
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            if _dispatches(buf[start:end]):
                self.event_times.append(ts_ns)
            start = end + 2
        rest = buf[start:]
        self._tail = rest[-self.MAX_TAIL:] if len(rest) > self.MAX_TAIL else rest

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


def _dispatches(block: bytes) -> bool:
    """An event is dispatched only when it has a data field (comments are keep-alives)."""
    return any(line.startswith(b"data") for line in block.split(b"\n"))


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``content-type`` header value announces server-sent events."""
    return bool(content_type) and content_type.split(";", 1)[0].strip().lower() == (
        "text/event-stream")
