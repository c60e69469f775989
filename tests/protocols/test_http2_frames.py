"""The HTTP/2 analyzer reads frame bodies itself, as hyperframe 6 did for it: the same
frames refused with the same messages, the same fields of the others.

``frame_error``/``fragment_bounds``/``settings_of`` are compared with
``Frame.parse_frame_header`` + ``parse_body`` (what ``http2.py`` called until it read
the bodies itself) on every small body and on random ones, then through the analyzer:
a refused frame gives the warning it gave, quoting hyperframe's message.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from hyperframe.frame import Frame

from netdiag.protocols.http2 import (
    PREFACE,
    Http2Analyzer,
    error_name,
    fragment_bounds,
    frame_error,
    settings_of,
)

CHECKED = (1, 3, 4, 5, 7, 8)
"""HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, GOAWAY, WINDOW_UPDATE: the frame types
whose bodies the analyzer reads."""
T0 = 1_764_425_767_000_000_000


def header(ftype: int, flags: int, sid: int, length: int) -> bytes:
    return struct.pack("!HBBBL", length >> 8, length & 255, ftype, flags, sid)


def by_hyperframe(ftype: int, flags: int, sid: int, body: bytes) -> tuple[str, Any]:
    """``("error", message)``, or ``("ok", fields)`` with the fields the analyzer uses."""
    try:
        frame, _ = Frame.parse_frame_header(memoryview(header(ftype, flags, sid, len(body))))
        frame.parse_body(memoryview(body))
    except Exception as exc:  # what http2.py caught
        return "error", str(exc)
    f: Any = frame
    if ftype in (1, 5):
        return "ok", f.data
    if ftype == 4:
        return "ok", list(f.settings.items())
    if ftype == 3:
        return "ok", f.error_code
    if ftype == 7:
        return "ok", (f.last_stream_id, f.error_code)
    return "ok", f.window_increment


def by_netdiag(ftype: int, flags: int, sid: int, body: bytes) -> tuple[str, Any]:
    why = frame_error(ftype, flags, sid & 0x7FFFFFFF, body)
    if why:
        return "error", why
    if ftype in (1, 5):
        start, end = fragment_bounds(ftype, flags, body)
        return "ok", body[start:end]
    if ftype == 4:
        return "ok", list(settings_of(body).items())
    word = [int.from_bytes(body[i:i + 4], "big") for i in range(0, len(body) - 3, 4)]
    if ftype == 7:
        return "ok", (word[0], word[1])
    return "ok", word[0]


def test_every_short_body_every_flag() -> None:
    """Bodies up to 14 bytes of telling values, every flag byte, stream ids 0, odd, even
    and with the reserved bit."""
    values = (0, 1, 2, 5, 0x7F, 0x80, 0xFF)
    bodies = [b""]
    r = random.Random(7)
    for n in range(1, 15):
        bodies += [bytes(r.choice(values) for _ in range(n)) for _ in range(12)]
    for ftype in CHECKED:
        for flags in range(256):
            for sid in (0, 1, 2, 0x80000003):
                for body in bodies:
                    want = by_hyperframe(ftype, flags, sid, body)
                    assert by_netdiag(ftype, flags, sid, body) == want, (ftype, flags, sid, body)


def test_random_frames() -> None:
    r = random.Random(11)
    for _ in range(40_000):
        ftype = r.choice(CHECKED)
        flags = r.choice((0, 1, 4, 8, 0x20, 0x28, 0x2D, r.randrange(256)))
        sid = r.choice((0, 1, 3, 4, r.randrange(1 << 32)))
        n = r.choice((0, 1, 4, 5, 6, 8, 9, 12, r.randrange(64), r.randrange(300)))
        body = bytearray(r.randrange(256) for _ in range(n))
        if n and r.random() < 0.5:
            body[0] = r.randrange(min(n, 256))  # a pad length that may fit
        if ftype == 5 and n > 4 and r.random() < 0.5:
            p = 1 if flags & 8 else 0
            body[p:p + 4] = struct.pack("!L", 2 * r.randrange(1 << 30))
        if ftype == 8 and n == 4 and r.random() < 0.5:
            body[0] &= 0x7F
        data = bytes(body)
        assert by_netdiag(ftype, flags, sid, data) == by_hyperframe(ftype, flags, sid, data), (
            ftype, flags, sid, data)


def test_bytearray_bodies_read_as_bytes() -> None:
    for body in (b"\x03\x00\x00\x00\x01abc\x00\x00\x00", b"\x00\x05" + b"\x00" * 4):
        for ftype in CHECKED:
            assert frame_error(ftype, 0x2D, 2, bytearray(body)) == frame_error(ftype, 0x2D, 2, body)


class Conn:
    """An analyzer past the preface and both SETTINGS, fed raw frames."""

    def __init__(self) -> None:
        self.a = Http2Analyzer(protocol="h2c")
        self.a.feed(0, T0, PREFACE + header(4, 0, 0, 0), 1)
        self.a.feed(1, T0, header(4, 0, 0, 0), 2)
        self.pkt = 3

    def send(self, direction: int, ftype: int, flags: int, sid: int, body: bytes) -> None:
        self.a.feed(direction, T0 + self.pkt, header(ftype, flags, sid, len(body)) + body,
                    self.pkt)
        self.pkt += 1


@pytest.mark.parametrize(("ftype", "flags", "sid", "body"), [
    (1, 0x4, 0, b"\x82"),
    (1, 0xC, 1, b""),
    (1, 0x24, 1, b"\x00\x00"),
    (1, 0xC, 1, b"\x05\x82"),
    (5, 0x4, 2, b"\x00\x00\x00\x00"),
    (5, 0x4, 1, b"\x00\x00\x00\x03\x82"),
    (5, 0xC, 1, b"\x09\x00\x00\x00\x02"),
    (4, 0, 0, b"\x00\x01\x00\x00"),
    (4, 0, 3, b""),
    (3, 0, 0, b"\x00\x00\x00\x08"),
    (3, 0, 1, b"\x00\x00\x08"),
    (7, 0, 0, b"\x00\x00\x00\x01"),
    (7, 0, 5, b"\x00" * 8),
    (8, 0, 0, b"\x00\x00\x00\x00"),
    (8, 0, 1, b"\x80\x00\x00\x01"),
    (8, 0, 0, b"\x00\x00\x01"),
    (8, 0, 0, b"\x00\x00\x00\x01\x00"),
])
def test_refused_frames_warn_with_hyperframes_message(ftype: int, flags: int, sid: int,
                                                      body: bytes) -> None:
    kind, message = by_hyperframe(ftype, flags, sid, body)
    assert kind == "error"
    c = Conn()
    c.send(0 if ftype != 5 else 1, ftype, flags, sid, body)
    side = "client" if ftype != 5 else "server"
    want = (f"http2: invalid {side} frame of type {ftype} on stream {sid} at byte "
            f"{24 + 9 if side == 'client' else 9} (packet 3): {message}")
    assert want in c.a.warnings, c.a.warnings


def test_frames_read_whole_or_across_segments_alike() -> None:
    """A body in one segment is a slice of it; split byte by byte it is collected: the
    analyzer sees the same frames either way (padded, prioritised HEADERS and
    CONTINUATION, RST_STREAM, GOAWAY, SETTINGS)."""
    from hpack import Encoder

    enc = Encoder()
    block = enc.encode([(":method", "GET"), (":path", "/x"), (":authority", "a.test"),
                        (":scheme", "http"), ("x-long", "v" * 300)])
    second = enc.encode([(":method", "GET"), (":path", "/y"), (":authority", "a.test"),
                         (":scheme", "http")])
    frames = [
        (0, header(1, 0x28, 1, 1 + 5 + 40 + 3) + b"\x03" + b"\x00\x00\x00\x00\x10"
         + block[:40] + b"\x00\x00\x00"),
        (0, header(9, 0x4, 1, len(block) - 40) + block[40:]),
        (1, header(1, 0x5, 1, 1) + b"\x88"),
        (0, header(1, 0x5, 3, len(second)) + second),
        (0, header(3, 0, 3, 4) + b"\x00\x00\x00\x08"),
        (1, header(4, 0, 0, 6) + b"\x00\x03\x00\x00\x00\x64"),
        (1, header(7, 0, 0, 8) + b"\x00\x00\x00\x01\x00\x00\x00\x00"),
    ]
    whole = Conn()
    split = Conn()
    for direction, data in frames:
        whole.a.feed(direction, T0 + 10, data, 10)
        for i in range(len(data)):
            split.a.feed(direction, T0 + 10, data[i:i + 1], 10)
    for c in (whole, split):
        reqs = c.a.requests
        assert [r.path for r in reqs] == ["/x", "/y"] and not c.a.warnings
        assert reqs[0].status == 200 and reqs[0].authority == "a.test"
        assert reqs[0].request_headers is not None
        assert ("x-long", "v" * 300) in reqs[0].request_headers
        assert c.a.http2["goaway"]["last_stream_id"] == 1
        assert c.a.http2["settings"]["server"] == {"MAX_CONCURRENT_STREAMS": 100}
    assert whole.a.warnings == split.a.warnings
    assert [r.to_json() for r in whole.a.requests] == [r.to_json() for r in split.a.requests]
    assert whole.a.http2 == split.a.http2
    assert error_name(8) == "CANCEL" and whole.a.requests[-1].reset == "CANCEL"


def test_any_bytes_like_input_is_accepted() -> None:
    """``feed`` takes bytes-like objects as the pure-Python analyzer always did (the
    compiled one checks ``bytes`` annotations, so it copies another type first)."""
    from netdiag.protocols.sse import SseCounter

    ping = header(6, 0, 0, 8) + bytes(8)
    got = []
    for kind in (bytes, bytearray, memoryview):
        c = Conn()
        c.a.feed(0, T0 + 5, kind(ping), 5)
        got.append((c.a.http2["frames"], c.a.warnings))
    assert got[0] == got[1] == got[2] and got[0][0]["client"] == 2
    counter = SseCounter()
    counter.feed(T0, bytearray(b"data: 1\n\n"))
    counter.feed(T0 + 1, memoryview(b"data: 2\n\n"))
    assert counter.event_times == [T0, T0 + 1] and SseCounter.MAX_TAIL == 1 << 16
