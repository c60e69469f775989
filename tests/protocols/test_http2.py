"""Tests of the HTTP/2 analyzer (netdiag.protocols.http2).

The byte streams are real: an ``h2`` client connection and an ``h2`` server
connection talk to each other in memory, and every flush of one side's outgoing
bytes is recorded with a synthetic capture time chosen by the test. The recording
is then fed to :class:`Http2Analyzer` whole, byte by byte and in random pieces
(each piece keeping its flush's time), and the figures must be exactly the times
the test assigned.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.protocols.http2 import PREFACE, Http2Analyzer, error_name, setting_name
from netdiag.records import Request

MS = 1_000_000
T0 = 1_764_425_767_000_000_000
"""Capture times are T0 + n milliseconds."""

Chunk = tuple[int, int, bytes]
"""(direction, capture time, bytes) of one recorded flush."""


def at(ms: float) -> int:
    return T0 + int(ms * MS)


def get(path: str = "/", authority: str = "api.test", method: str = "GET",
        extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [(":method", method), (":path", path), (":authority", authority),
            (":scheme", "https"), *extra]


class Pair:
    """An h2 client and an h2 server in memory; each flush is recorded with its time."""

    def __init__(self, *, connect: bool = True, client_settings: dict[Any, int] | None = None,
                 upgrade: bool = False) -> None:
        self.c = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.s = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self.chunks: list[Chunk] = []
        self.settings_header: bytes | None = None
        if upgrade:
            self.settings_header = self.c.initiate_upgrade_connection()
            self.s.initiate_upgrade_connection(self.settings_header)
        elif connect:
            self.c.initiate_connection()
            if client_settings:
                self.c.update_settings(client_settings)
            self.s.initiate_connection()
            self.client(0)
            self.server(0.5)
            self.client(0.6)  # SETTINGS ACK

    def client(self, ms: float) -> int:
        """Send everything the client has queued at ``T0 + ms``."""
        data = self.c.data_to_send()
        if data:
            self.chunks.append((0, at(ms), data))
            self.s.receive_data(data)
        return at(ms)

    def server(self, ms: float) -> int:
        """Send everything the server has queued at ``T0 + ms``."""
        data = self.s.data_to_send()
        if data:
            self.chunks.append((1, at(ms), data))
            self.c.receive_data(data)
        return at(ms)


def split(chunks: list[Chunk], mode: str, seed: int = 0) -> Iterator[tuple[int, int, bytes, int]]:
    """The recorded chunks as feed() calls: whole, byte by byte or random pieces."""
    rnd = random.Random(seed)
    for packet, (direction, ts, data) in enumerate(chunks, 1):
        if mode == "whole":
            yield direction, ts, data, packet
        elif mode == "bytes":
            for i in range(len(data)):
                yield direction, ts, data[i:i + 1], packet
        else:
            i = 0
            while i < len(data):
                n = rnd.randint(1, 40)
                yield direction, ts, data[i:i + n], packet
                i += n


def analyze(chunks: list[Chunk], mode: str = "whole", close_ms: float = 10_000,
            **kwargs: Any) -> Http2Analyzer:
    a = Http2Analyzer(**kwargs)
    for direction, ts, data, packet in split(chunks, mode):
        a.feed(direction, ts, data, packet)
    a.close(at(close_ms))
    return a


MODES = ["whole", "bytes", "random"]


def frames(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(offset, length, type, flags, stream) of every frame of a recorded flush."""
    out = []
    pos = len(PREFACE) if data.startswith(PREFACE) else 0
    while pos + 9 <= len(data):
        hi, lo, ftype, flags, sid = struct.unpack_from("!HBBBL", data, pos)
        length = (hi << 8) | lo
        out.append((pos, length, ftype, flags, sid & 0x7FFFFFFF))
        pos += 9 + length
    return out


def by_stream(a: Http2Analyzer) -> dict[int | None, Request]:
    return {r.stream_id: r for r in a.requests}


# ---------------------------------------------------------------------------------
# Basic exchange, timing, settings
# ---------------------------------------------------------------------------------


def basic_exchange() -> Pair:
    p = Pair()
    p.c.send_headers(1, get("/v1/messages"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "application/json")])
    p.server(20)
    p.s.send_data(1, b"x" * 100)
    p.server(25)
    p.s.send_data(1, b"y" * 50)
    p.server(32)
    p.s.send_data(1, b"", end_stream=True)
    p.server(40)
    return p


@pytest.mark.parametrize("mode", MODES)
def test_basic_get(mode: str) -> None:
    a = analyze(basic_exchange().chunks, mode)
    assert a.warnings == []
    assert a.protocol == "h2"
    [r] = a.requests
    assert (r.stream_id, r.method, r.path, r.authority, r.status) == (
        1, "GET", "/v1/messages", "api.test", 200)
    assert r.ts_ns == at(10) and r.end_ns == at(10)
    assert r.first_byte_ns == at(20)
    assert r.last_byte_ns == at(40)
    assert r.response_bytes == 150 and r.request_bytes == 0
    assert r.chunks == 2  # the empty END_STREAM DATA frame is not a chunk
    assert r.chunk_gaps_ns == [7 * MS]
    assert r.content_type == "application/json"
    assert r.estimated is False and r.protocol == "h2"
    assert r.reset is None and r.stall_ns is None and r.sse_events is None
    assert (":path", "/v1/messages") in (r.request_headers or [])
    assert r.response_headers == [(":status", "200"), ("content-type", "application/json")]
    j = r.to_json()
    assert j["ttfb_ms"] == pytest.approx(10.0) and j["ttlb_ms"] == pytest.approx(30.0)


def test_chunkings_agree() -> None:
    p = basic_exchange()
    base = analyze(p.chunks, "whole")
    for mode in ("bytes", "random"):
        other = analyze(p.chunks, mode)
        assert [r.to_json() for r in other.requests] == [r.to_json() for r in base.requests]
        assert other.http2 == base.http2


def test_settings_and_frame_counts() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
                              SettingCodes.MAX_CONCURRENT_STREAMS: 7})
    a = analyze(p.chunks)
    h = a.http2
    client, server = h["settings"]["client"], h["settings"]["server"]
    assert client["INITIAL_WINDOW_SIZE"] == 1 << 20
    assert client["MAX_CONCURRENT_STREAMS"] == 7
    assert client["ENABLE_PUSH"] == 1
    assert server["MAX_CONCURRENT_STREAMS"] == 100
    assert server["ENABLE_PUSH"] == 0
    assert server["HEADER_TABLE_SIZE"] == 4096
    assert server["MAX_FRAME_SIZE"] == 16384
    assert server["MAX_HEADER_LIST_SIZE"] == 65536
    # client: SETTINGS, SETTINGS (update), SETTINGS ACK; server: SETTINGS + 2 ACKs.
    assert h["frames"] == {"client": 3, "server": 3}
    assert h["goaway"] is None and h["rst_streams"] == 0 and h["pushes"] == 0
    assert h["max_concurrent_streams"] == 0 and a.requests == []


def test_names() -> None:
    assert error_name(8) == "CANCEL" and error_name(0xD) == "HTTP_1_1_REQUIRED"
    assert error_name(0x1234) == "0x1234"
    assert setting_name(4) == "INITIAL_WINDOW_SIZE" and setting_name(0x99) == "0x99"


def test_frame_time_is_first_byte_last_byte_is_last_segment() -> None:
    """A DATA frame split across segments: chunk time = first byte, ttlb = last byte."""
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.server(20)
    p.s.send_data(1, b"a" * 1000)
    p.server(30)
    p.s.send_data(1, b"b" * 1000, end_stream=True)
    data = p.s.data_to_send()
    a = Http2Analyzer()
    for direction, ts, chunk in p.chunks:
        a.feed(direction, ts, chunk, 0)
    a.feed(1, at(40), data[:500], 0)  # header + start of the last frame
    a.feed(1, at(45), data[500:], 0)  # its last byte
    a.close(at(50))
    [r] = a.requests
    assert r.chunk_gaps_ns == [10 * MS]  # 30 -> 40: the first byte of the frame
    assert r.last_byte_ns == at(45)
    assert r.response_bytes == 2000


def test_header_split_across_feeds() -> None:
    """A frame header cut in the middle takes the time of its first byte."""
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "204")], end_stream=True)
    data = p.s.data_to_send()
    a = Http2Analyzer()
    for direction, ts, chunk in p.chunks:
        a.feed(direction, ts, chunk, 0)
    a.feed(1, at(20), data[:4], 7)
    a.feed(1, at(21), data[4:], 8)
    a.close(at(30))
    [r] = a.requests
    assert r.first_byte_ns == at(20) and r.last_byte_ns == at(21) and r.status == 204


def test_post_request_bytes_and_end_ns() -> None:
    p = Pair()
    p.c.send_headers(1, get("/upload", method="POST"))
    p.client(10)
    p.c.send_data(1, b"z" * 300)
    p.client(12)
    p.c.send_data(1, b"z" * 200, end_stream=True, pad_length=17)
    p.client(15)
    p.s.send_headers(1, [(":status", "201")], end_stream=True)
    p.server(20)
    [r] = analyze(p.chunks).requests
    assert r.method == "POST" and r.request_bytes == 500
    assert r.ts_ns == at(10) and r.end_ns == at(15)
    assert r.status == 201 and r.last_byte_ns == at(20) and r.first_byte_ns == at(20)
    assert r.response_bytes == 0 and r.chunks == 0 and r.chunk_gaps_ns is None


def test_authority_falls_back_to_host() -> None:
    p = Pair()
    p.c.send_headers(1, [(":method", "GET"), (":path", "/h"), (":scheme", "http"),
                         ("host", "hosted.test")], end_stream=True)
    p.client(10)
    [r] = analyze(p.chunks).requests
    assert r.authority == "hosted.test"
    assert r.first_byte_ns is None and r.last_byte_ns is None and r.response_bytes is None


# ---------------------------------------------------------------------------------
# Concurrency, reset, goaway
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_streams(mode: str) -> None:
    p = Pair()
    for i, sid in enumerate((1, 3, 5)):
        p.c.send_headers(sid, get(f"/r{sid}"), end_stream=True)
        p.client(10 + i)
    for i, sid in enumerate((5, 1, 3)):
        p.s.send_headers(sid, [(":status", "200")])
        p.s.send_data(sid, f"body{sid}".encode(), end_stream=True)
        p.server(20 + i)
    p.c.send_headers(7, get("/r7"), end_stream=True)
    p.client(30)
    p.s.send_headers(7, [(":status", "404")], end_stream=True)
    p.server(31)
    a = analyze(p.chunks, mode)
    assert [r.stream_id for r in a.requests] == [1, 3, 5, 7]
    assert [r.path for r in a.requests] == ["/r1", "/r3", "/r5", "/r7"]
    assert [r.ts_ns for r in a.requests] == [at(10), at(11), at(12), at(30)]
    assert [r.first_byte_ns for r in a.requests] == [at(21), at(22), at(20), at(31)]
    assert [r.status for r in a.requests] == [200, 200, 200, 404]
    assert a.http2["max_concurrent_streams"] == 3


@pytest.mark.parametrize("mode", MODES)
def test_rst_stream_cancel_by_client(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/stream"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"partial")
    p.server(20)
    p.c.reset_stream(1, ErrorCodes.CANCEL)
    p.client(30)
    p.c.send_headers(3, get("/next"), end_stream=True)
    p.client(40)
    a = analyze(p.chunks, mode)
    r1, r3 = a.requests
    assert r1.reset == "CANCEL" and r1.reset_by == "client"
    assert r1.last_byte_ns is None  # the response never ended
    assert r1.response_bytes == 7 and r1.chunks == 1
    assert r3.reset is None
    assert a.http2["rst_streams"] == 1
    # stream 1 closed by the reset: at most one stream open at a time
    assert a.http2["max_concurrent_streams"] == 1


def test_rst_stream_by_server() -> None:
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.reset_stream(1, ErrorCodes.REFUSED_STREAM)
    p.server(11)
    [r] = analyze(p.chunks).requests
    assert (r.reset, r.reset_by, r.first_byte_ns) == ("REFUSED_STREAM", "server", None)


def test_goaway() -> None:
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")], end_stream=True)
    p.s.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM, last_stream_id=1,
                         additional_data=b"slow down")
    p.server(50)
    a = analyze(p.chunks)
    assert a.http2["goaway"] == {"from": "server", "error": "ENHANCE_YOUR_CALM",
                                 "last_stream_id": 1, "ts": at(50) / 1e9}


def test_goaway_from_client_no_error() -> None:
    p = Pair()
    p.c.close_connection()
    p.client(5)
    g = analyze(p.chunks).http2["goaway"]
    assert g["from"] == "client" and g["error"] == "NO_ERROR" and g["last_stream_id"] == 0


# ---------------------------------------------------------------------------------
# Flow control
# ---------------------------------------------------------------------------------


def fill_window(p: Pair, sid: int) -> None:
    while (n := min(p.s.local_flow_control_window(sid), p.s.max_outbound_frame_size)) > 0:
        p.s.send_data(sid, b"f" * n)


@pytest.mark.parametrize("mode", MODES)
def test_flow_control_stall_connection_window(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/big"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    fill_window(p, 1)
    p.server(20)  # 65535 bytes: stream and connection windows both at 0
    p.c.increment_flow_control_window(100_000, stream_id=1)
    p.client(60)  # stream window open, connection window still 0: still stalled
    p.c.increment_flow_control_window(100_000)
    p.client(75)  # reopened
    p.s.send_data(1, b"rest", end_stream=True)
    p.server(80)
    a = analyze(p.chunks, mode)
    [r] = a.requests
    assert r.stall_ns == 55 * MS
    assert a.http2["flow_control_stalls"] == 1
    assert r.response_bytes == 65535 + 4 and r.last_byte_ns == at(80)


def test_flow_control_stall_stream_window() -> None:
    """A small INITIAL_WINDOW_SIZE stalls one stream; the other keeps flowing."""
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    p.c.send_headers(1, get("/a"), end_stream=True)
    p.c.send_headers(3, get("/b"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_headers(3, [(":status", "200")])
    p.s.send_data(1, b"1" * 1000)  # stream 1 window exhausted
    p.s.send_data(3, b"3" * 10, end_stream=True)
    p.server(20)
    p.c.increment_flow_control_window(5000, stream_id=1)
    p.client(33)
    p.s.send_data(1, b"1" * 10, end_stream=True)
    p.server(40)
    a = analyze(p.chunks)
    r1, r3 = a.requests
    assert r1.stall_ns == 13 * MS and r3.stall_ns is None
    assert a.http2["flow_control_stalls"] == 1
    assert r1.response_bytes == 1010


def test_stall_open_at_close_runs_to_close() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 10})
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"0123456789")
    p.server(20)
    a = analyze(p.chunks, close_ms=100)
    [r] = a.requests
    assert r.stall_ns == 80 * MS and r.last_byte_ns is None


def test_padding_is_flow_controlled_but_not_counted() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 100})
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"p" * 79, pad_length=20)  # 1 + 79 + 20 = 100: window 0
    p.server(20)
    p.c.increment_flow_control_window(50, stream_id=1)
    p.client(26)
    p.s.send_data(1, b"q", end_stream=True, pad_length=5)
    p.server(30)
    [r] = analyze(p.chunks).requests
    assert r.response_bytes == 80 and r.chunks == 2
    assert r.stall_ns == 6 * MS


# ---------------------------------------------------------------------------------
# SSE, trailers, CONTINUATION, 1xx, push
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_sse_events(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/v1/messages", method="POST"))
    p.c.send_data(1, b'{"stream":true}', end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream; charset=utf-8")])
    p.server(50)
    pieces = [
        (60, b"event: a\ndata: 1\n\nda"),      # event 1 complete at 60
        (70, b"ta: 2\n"),                       # nothing complete
        (85, b"\n: keep-alive\n\ndata: 3\r\n"),  # event 2 at 85; the comment is not an event
        (90, b"\r\ndata: 4\n\n"),               # events 3 and 4 at 90
        (120, b"data: [DONE]\n\n"),             # event 5 at 120
    ]
    for ms, body in pieces:
        p.s.send_data(1, body, pad_length=3 if ms == 70 else None)
        p.server(ms)
    p.s.send_data(1, b"", end_stream=True)
    p.server(125)
    a = analyze(p.chunks, mode)
    [r] = a.requests
    assert r.content_type == "text/event-stream; charset=utf-8"
    assert r.request_bytes == 15
    assert r.sse_events == 5 and r.chunks == 5
    assert r.first_event_ns == at(60)
    assert r.chunk_gaps_ns == [25 * MS, 5 * MS, 0, 30 * MS]
    assert r.response_bytes == sum(len(b) for _, b in pieces)
    assert r.first_byte_ns == at(50) and r.last_byte_ns == at(125)
    assert r.to_json()["first_event_ms"] == pytest.approx(50.0)


def test_sse_event_time_is_last_byte_of_frame() -> None:
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream")])
    p.server(20)
    p.s.send_data(1, b"data: " + b"x" * 3000 + b"\n\n", end_stream=True)
    data = p.s.data_to_send()
    a = Http2Analyzer()
    for direction, ts, chunk in p.chunks:
        a.feed(direction, ts, chunk, 0)
    a.feed(1, at(30), data[:1000], 0)
    a.feed(1, at(31), data[1000:2000], 0)
    a.feed(1, at(35), data[2000:], 0)
    a.close(at(40))
    [r] = a.requests
    assert r.sse_events == 1 and r.first_event_ns == at(35) and r.chunk_gaps_ns is None


@pytest.mark.parametrize("mode", MODES)
def test_trailers(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/grpc", method="POST", extra=[("te", "trailers")]))
    p.c.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    p.s.send_data(1, b"\x00\x00\x00\x00\x03abc")
    p.server(20)
    p.s.send_headers(1, [("grpc-status", "0"), ("grpc-message", "ok")], end_stream=True)
    p.server(33)
    [r] = analyze(p.chunks, mode).requests
    assert r.status == 200 and r.last_byte_ns == at(33) and r.first_byte_ns == at(20)
    assert r.response_bytes == 8 and r.chunks == 1
    assert r.response_headers == [(":status", "200"), ("content-type", "application/grpc")]


@pytest.mark.parametrize("mode", MODES)
def test_continuation(mode: str) -> None:
    rnd = random.Random(5)
    big = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(40_000))
    p = Pair()
    p.c.send_headers(1, get("/big", extra=[("x-big", big)]), end_stream=True)
    data = p.c.data_to_send()
    p.s.receive_data(data)
    kinds = [f[2] for f in frames(data)]
    assert kinds[0] == 1 and 9 in kinds  # HEADERS then CONTINUATION frames
    cut = frames(data)[1][0]  # the first CONTINUATION arrives later
    p.chunks += [(0, at(10), data[:cut]), (0, at(14), data[cut:])]
    p.s.send_headers(1, [(":status", "200"), ("x-big-reply", big[:30_000])])
    p.server(20)
    p.s.send_data(1, b"ok", end_stream=True)
    p.server(22)
    a = analyze(p.chunks, mode)
    assert a.warnings == []
    [r] = a.requests
    assert r.ts_ns == at(10) and r.end_ns == at(14)
    assert dict(r.request_headers or [])["x-big"] == big
    assert r.path == "/big" and r.status == 200
    assert dict(r.response_headers or [])["x-big-reply"] == big[:30_000]
    assert r.first_byte_ns == at(20) and r.last_byte_ns == at(22)


@pytest.mark.parametrize("mode", MODES)
def test_informational_response(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/early"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "103"), ("link", "</style.css>; rel=preload")])
    p.server(15)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "text/html")])
    p.s.send_data(1, b"<html>", end_stream=True)
    p.server(40)
    [r] = analyze(p.chunks, mode).requests
    assert r.first_byte_ns == at(15)
    assert r.status == 200 and r.content_type == "text/html"
    assert r.response_headers == [(":status", "200"), ("content-type", "text/html")]
    assert r.last_byte_ns == at(40)


@pytest.mark.parametrize("mode", MODES)
def test_push_promise(mode: str) -> None:
    p = Pair()
    p.c.send_headers(1, get("/index.html"), end_stream=True)
    p.client(10)
    p.s.push_stream(1, 2, get("/style.css"))
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"<html>", end_stream=True)
    p.server(20)
    p.s.send_headers(2, [(":status", "200"), ("content-type", "text/css")])
    p.s.send_data(2, b"body{}", end_stream=True)
    p.server(21)
    # the server's HPACK context keeps working after the pushed blocks
    p.c.send_headers(3, get("/next"), end_stream=True)
    p.client(30)
    p.s.send_headers(3, [(":status", "200"), ("content-type", "text/css")], end_stream=True)
    p.server(31)
    a = analyze(p.chunks, mode)
    assert a.warnings == []
    assert a.http2["pushes"] == 1 and a.http2["unmatched_streams"] == 0
    assert [r.stream_id for r in a.requests] == [1, 3]
    assert a.requests[0].response_bytes == 6
    assert a.requests[1].content_type == "text/css"


def test_padded_headers() -> None:
    """Hand-built padded HEADERS with a priority block (h2 never sends one)."""
    from hpack import Encoder

    enc = Encoder()
    block = enc.encode(get("/padded"))
    body = bytes([7]) + struct.pack("!LB", 0, 15) + block + b"\0" * 7
    headers = struct.pack("!HBBBL", len(body) >> 8, len(body) & 0xFF, 1, 0x1 | 0x4 | 0x8 | 0x20,
                          1) + body
    settings_frame = struct.pack("!HBBBL", 0, 0, 4, 0, 0)
    a = Http2Analyzer()
    a.feed(0, at(1), PREFACE + settings_frame + headers, 1)
    a.close(at(2))
    [r] = a.requests
    assert r.path == "/padded" and r.end_ns == at(1) and a.warnings == []


# ---------------------------------------------------------------------------------
# h2c upgrade, preface, damage
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_h2c_upgrade(mode: str) -> None:
    p = Pair(upgrade=True)
    assert p.settings_header is not None
    p.client(1)  # preface + SETTINGS
    p.s.send_headers(1, [(":status", "200"), ("content-type", "text/plain")])
    p.s.send_data(1, b"upgraded", end_stream=True)
    p.server(9)
    p.c.send_headers(3, get("/second"), end_stream=True)
    p.client(12)
    p.s.send_headers(3, [(":status", "200")], end_stream=True)
    p.server(13)
    up = Request(ts_ns=at(0), method="GET", path="/", authority="h2c.test", end_ns=at(0),
                 request_headers=[("host", "h2c.test"), ("upgrade", "h2c"),
                                  ("http2-settings", p.settings_header.decode())])
    a = analyze(p.chunks, mode, protocol="h2c", upgrade_request=up)
    assert a.warnings == []
    r1, r3 = a.requests
    assert r1 is up
    assert (r1.stream_id, r1.protocol, r1.estimated, r1.status) == (1, "h2c", False, 200)
    assert r1.first_byte_ns == at(9) and r1.last_byte_ns == at(9)
    assert r1.response_bytes == 8 and r1.end_ns == at(0)
    assert r3.protocol == "h2c" and r3.path == "/second" and r3.ts_ns == at(12)
    assert a.protocol == "h2c"
    # HTTP2-Settings of the upgrade request are the client's settings
    assert a.http2["settings"]["client"]["ENABLE_PUSH"] == 1


def test_missing_preface_warns_and_parses() -> None:
    p = basic_exchange()
    chunks = [(d, ts, data[len(PREFACE):] if d == 0 and data.startswith(PREFACE) else data)
              for d, ts, data in p.chunks]
    a = analyze(chunks)
    assert any("preface" in w for w in a.warnings)
    [r] = a.requests
    assert r.status == 200 and r.path == "/v1/messages"
    b = analyze(chunks, expect_preface=False)
    assert b.warnings == [] and b.requests[0].status == 200


def test_http1_bytes_stop_the_direction() -> None:
    a = Http2Analyzer()
    a.feed(0, at(1), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1)
    a.feed(1, at(2), b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", 2)
    a.feed(0, at(3), b"more", 3)
    a.close(at(4))
    assert a.requests == []
    assert any("maximum frame size" in w for w in a.warnings)
    assert len(a.warnings) == 3  # preface, client frame, server frame


def hpack_loss_exchange() -> tuple[Pair, bytes, int]:
    """Two requests; returns the pair, the server flush carrying the first response
    HEADERS (not yet in p.chunks) and that frame's offset in it."""
    p = Pair()
    p.c.send_headers(1, get("/one"), end_stream=True)
    p.c.send_headers(3, get("/two"), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "application/json"),
                         ("x-request-id", "abcdef0123456789")])
    p.s.send_data(1, b"a" * 10, end_stream=True)
    data = p.s.data_to_send()
    p.c.receive_data(data)
    [(off, length, ftype, _, _)] = [f for f in frames(data) if f[2] == 1]
    assert length > 10 and ftype == 1
    return p, data, off


@pytest.mark.parametrize("mode", MODES)
def test_hpack_loss_after_gap_in_server_headers(mode: str) -> None:
    p, data, off = hpack_loss_exchange()
    a = Http2Analyzer()
    for direction, ts, chunk, packet in split(p.chunks, mode):
        a.feed(direction, ts, chunk, packet)
    a.feed(1, at(20), data[:off + 12], 50)  # header + 3 body bytes
    a.gap(1, at(21), 5)
    a.feed(1, at(21), data[off + 17:], 51)
    p.chunks = []
    p.s.send_headers(3, [(":status", "404"), ("content-type", "application/json"),
                         ("x-request-id", "abcdef0123456789")])
    p.s.send_data(3, b"b" * 20)
    p.server(30)
    p.s.send_data(3, b"c" * 5, end_stream=True)
    p.server(34)
    for direction, ts, chunk, packet in split(p.chunks, mode):
        a.feed(direction, ts, chunk, packet)
    a.close(at(40))
    r1, r3 = a.requests
    assert any("not decoded" in w for w in a.warnings)
    assert r1.path == "/one" and r3.path == "/two"  # client direction unaffected
    assert r1.status is None and r1.response_headers is None
    assert r1.first_byte_ns == at(20) and r1.last_byte_ns == at(21) and r1.response_bytes == 10
    assert r3.status is None and r3.content_type is None and r3.response_headers is None
    assert r3.first_byte_ns == at(30) and r3.last_byte_ns == at(34)
    assert r3.response_bytes == 25 and r3.chunks == 2 and r3.chunk_gaps_ns == [4 * MS]


def test_gap_across_frame_header_stops_direction() -> None:
    p = basic_exchange()
    a = Http2Analyzer()
    chunks = p.chunks
    for i, (direction, ts, data) in enumerate(chunks):
        if direction == 1 and ts == at(25):  # lose the whole first DATA frame
            a.gap(1, ts, len(data))
            continue
        a.feed(direction, ts, data, i)
    a.close(at(50))
    [r] = a.requests
    assert r.status == 200 and r.last_byte_ns is None
    assert any("not parsed" in w for w in a.warnings)
    assert a.http2["flow_control_stalls"] == 0


def test_gap_inside_sse_data_marks_events_unknown() -> None:
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream")])
    p.s.send_data(1, b"data: 1\n\n")
    p.server(20)
    p.s.send_data(1, b"data: 2\n\ndata: 3\n\n", end_stream=True)
    data = p.s.data_to_send()
    a = Http2Analyzer()
    for direction, ts, chunk in p.chunks:
        a.feed(direction, ts, chunk, 0)
    a.feed(1, at(30), data[:12], 0)
    a.gap(1, at(31), 4)
    a.feed(1, at(31), data[16:], 0)
    a.close(at(40))
    [r] = a.requests
    assert r.sse_events is None and r.chunks is None and r.chunk_gaps_ns is None
    assert r.response_bytes == 27 and r.last_byte_ns == at(31)


def test_unmatched_stream_after_client_gap() -> None:
    p = Pair()
    p.c.send_headers(1, get("/seen"), end_stream=True)
    p.client(10)
    p.c.send_headers(3, get("/lost"), end_stream=True)
    p.client(11)
    p.s.send_headers(1, [(":status", "200")], end_stream=True)
    p.s.send_headers(3, [(":status", "200")], end_stream=True)
    p.server(20)
    a = Http2Analyzer()
    for direction, ts, data in p.chunks:
        if ts == at(11):
            a.gap(0, ts, len(data))
        else:
            a.feed(direction, ts, data, 0)
    a.close(at(30))
    assert [r.stream_id for r in a.requests] == [1]
    assert a.http2["unmatched_streams"] == 1


def test_truncated_hpack_block_stops_decoding() -> None:
    """A HEADERS frame whose block does not decode: later blocks are not guessed."""
    from hpack import Encoder

    enc = Encoder()
    good = enc.encode(get("/a"))
    bad = b"\xff\xff\xff\xff\xff"  # indexed field with an absurd index
    later = enc.encode(get("/b"))

    def hdrs(sid: int, block: bytes) -> bytes:
        return struct.pack("!HBBBL", 0, len(block), 1, 0x5, sid) + block

    a = Http2Analyzer()
    a.feed(0, at(1), PREFACE + hdrs(1, good) + hdrs(3, bad) + hdrs(5, later), 1)
    a.close(at(2))
    assert [r.path for r in a.requests] == ["/a", None, None]
    assert [r.ts_ns for r in a.requests] == [at(1)] * 3
    assert any("could not be decoded" in w for w in a.warnings)


# ---------------------------------------------------------------------------------
# Robustness
# ---------------------------------------------------------------------------------


def rich_exchange() -> list[Chunk]:
    """A recording touching most frame types, for mutation."""
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 3000})
    p.c.send_headers(1, get("/a", method="POST"))
    p.c.send_data(1, b"q" * 40, pad_length=4, end_stream=True)
    p.c.send_headers(3, get("/sse"), end_stream=True)
    p.client(10)
    p.s.push_stream(1, 2, get("/pushed"))
    p.s.send_headers(1, [(":status", "103")])
    p.s.send_headers(1, [(":status", "200"), ("content-type", "application/json")])
    p.s.send_headers(3, [(":status", "200"), ("content-type", "text/event-stream")])
    p.s.send_data(3, b"data: 1\n\nda", pad_length=2)
    p.s.send_data(1, b"r" * 3000)
    p.server(20)
    p.c.increment_flow_control_window(5000, stream_id=1)
    p.c.ping(b"12345678")
    p.client(25)
    p.s.send_data(1, b"s", end_stream=True)
    p.s.send_data(3, b"ta: 2\n\n", end_stream=True)
    p.s.send_headers(2, [(":status", "200")], end_stream=True)
    p.server(30)
    p.c.send_headers(5, get("/c"), end_stream=True)
    p.client(31)
    p.c.reset_stream(5, ErrorCodes.CANCEL)
    p.client(32)
    p.s.close_connection()
    p.server(40)
    return p.chunks


def test_rich_exchange_facts() -> None:
    a = analyze(rich_exchange(), "random")
    assert a.warnings == []
    r1, r3, r5 = a.requests
    assert r1.request_bytes == 40 and r1.status == 200 and r1.response_bytes == 3001
    assert r1.stall_ns == 5 * MS
    assert r3.sse_events == 2 and r3.chunk_gaps_ns == [10 * MS]
    assert r5.reset == "CANCEL"
    h = a.http2
    assert h["pushes"] == 1 and h["rst_streams"] == 1 and h["goaway"]["error"] == "NO_ERROR"
    assert h["flow_control_stalls"] == 1 and h["max_concurrent_streams"] == 2


def feed_all(a: Http2Analyzer, ops: list[tuple[int, int, bytes, int]]) -> None:
    for direction, ts, data, gap in ops:
        if gap:
            a.gap(direction, ts, gap)
        a.feed(direction, ts, data, 1)
    a.close(at(1000))
    _ = a.requests, a.http2, a.warnings
    for r in a.requests:
        r.to_json()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=200), st.integers(0, 3)),
                max_size=12),
       st.booleans())
def test_random_bytes_never_raise(ops: list[tuple[int, bytes, int]], preface: bool) -> None:
    a = Http2Analyzer(expect_preface=preface)
    feed_all(a, [(d, at(i), (PREFACE if preface and i == 0 and d == 0 else b"") + data,
                  gap if gap == 3 else 0) for i, (d, data, gap) in enumerate(ops)])


RICH = rich_exchange()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_streams_never_raise(data: st.DataObject) -> None:
    streams = [bytearray(b"".join(c for d, _, c in RICH if d == k)) for k in (0, 1)]
    for _ in range(data.draw(st.integers(0, 6))):
        k = data.draw(st.integers(0, 1))
        buf = streams[k]
        if not buf:
            continue
        i = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "byte"]))
        if op == "flip":
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "byte":
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=12))
        else:
            del buf[i:i + data.draw(st.integers(1, 12))]
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    ops: list[tuple[int, int, bytes, int]] = []
    pos = [0, 0]
    t = 0
    while pos[0] < len(streams[0]) or pos[1] < len(streams[1]):
        k = rnd.randint(0, 1)
        if pos[k] >= len(streams[k]):
            k = 1 - k
        n = rnd.randint(1, 400)
        gap = rnd.choice([0] * 15 + [1, 7])
        ops.append((k, at(t), bytes(streams[k][pos[k]:pos[k] + n]), gap))
        pos[k] += n + gap
        t += 1
    feed_all(Http2Analyzer(), ops)


def test_claimed_length_is_not_allocated() -> None:
    """A frame claiming 16 MiB after a SETTINGS raising the limit buffers only what came."""
    settings_frame = struct.pack("!HBBBL", 0, 6, 4, 0, 0) + struct.pack("!HL", 5, (1 << 24) - 1)
    a = Http2Analyzer()
    a.feed(1, at(1), settings_frame, 1)
    a.feed(0, at(1), PREFACE + struct.pack("!HBBBL", 0xFFFF, 0xFF, 4, 0, 0) + b"\0" * 60, 2)
    a.close(at(2))
    acc = a._dirs[0].acc  # the body collected so far
    assert acc is not None and len(acc) == 60


# ---------------------------------------------------------------------------------
# Edge cases of flow control and framing
# ---------------------------------------------------------------------------------


def test_initial_window_lowered_on_open_stream() -> None:
    """SETTINGS_INITIAL_WINDOW_SIZE applies to open streams and can close a window."""
    p = Pair()
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"d" * 500)
    p.server(20)
    p.c.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 100})
    p.client(30)  # stream window 100 - 500 < 0
    p.server(31)  # SETTINGS ACK
    p.c.increment_flow_control_window(1000, stream_id=1)
    p.client(45)
    p.s.send_data(1, b"e", end_stream=True)
    p.server(50)
    a = analyze(p.chunks)
    [r] = a.requests
    assert r.stall_ns == 15 * MS and a.http2["flow_control_stalls"] == 1


def test_stream_opened_on_closed_window_stalls_from_its_headers() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 0})
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.server(20)
    p.c.increment_flow_control_window(100, stream_id=1)
    p.client(24)
    p.s.send_data(1, b"x", end_stream=True)
    p.server(25)
    [r] = analyze(p.chunks).requests
    assert r.stall_ns == 14 * MS and r.response_bytes == 1


def test_lost_window_update_stops_flow_control() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 10})
    p.c.send_headers(1, get(), end_stream=True)
    p.client(10)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"0123456789")
    p.server(20)
    p.c.increment_flow_control_window(100, stream_id=1)
    data = p.c.data_to_send()
    p.s.receive_data(data)
    a = Http2Analyzer()
    for direction, ts, chunk in p.chunks:
        a.feed(direction, ts, chunk, 0)
    a.feed(0, at(30), data[:10], 0)
    a.gap(0, at(31), 3)  # inside the WINDOW_UPDATE body
    a.close(at(100))
    [r] = a.requests
    assert r.stall_ns == 10 * MS  # tracking stopped at the lost WINDOW_UPDATE (30 ms)
    assert any("WINDOW_UPDATE was lost" in w for w in a.warnings)


def frame(ftype: int, flags: int, sid: int, body: bytes) -> bytes:
    return struct.pack("!HBBBL", len(body) >> 8, len(body) & 0xFF, ftype, flags, sid) + body


def test_lost_pad_length_byte_makes_bytes_unknown() -> None:
    from hpack import Encoder

    enc_c, enc_s = Encoder(), Encoder()
    a = Http2Analyzer()
    a.feed(0, at(1), PREFACE + frame(1, 0x5, 1, enc_c.encode(get())), 1)
    a.feed(1, at(2), frame(1, 0x4, 1, enc_s.encode([(":status", "200")])), 2)
    data = frame(0, 0x8 | 0x1, 1, bytes([3]) + b"abcde" + b"\0\0\0")
    a.feed(1, at(3), data[:9], 3)
    a.gap(1, at(4), 1)
    a.feed(1, at(4), data[10:], 4)
    a.close(at(5))
    [r] = a.requests
    assert r.response_bytes is None and r.last_byte_ns == at(4)


def test_padding_longer_than_payload() -> None:
    from hpack import Encoder

    a = Http2Analyzer()
    a.feed(0, at(1), PREFACE + frame(1, 0x4, 1, Encoder().encode(get())), 1)
    a.feed(1, at(2), frame(1, 0x4, 1, Encoder().encode([(":status", "200")])), 2)
    a.feed(1, at(3), frame(0, 0x8, 1, bytes([50]) + b"ab"), 3)
    a.feed(0, at(4), frame(0, 0x8 | 0x1, 1, bytes([50]) + b"ab"), 4)
    a.close(at(5))
    [r] = a.requests
    assert r.response_bytes == 0 and r.request_bytes == 0 and r.end_ns == at(4)
    assert any("more padding" in w for w in a.warnings)


def test_stray_continuation_and_warning_cap() -> None:
    a = Http2Analyzer(expect_preface=False)
    a.feed(0, at(1), frame(9, 0x4, 1, b"\x82") * 40, 1)
    a.close(at(2))
    assert len(a.warnings) == 21 and "dropped" in a.warnings[-1]
    assert a.http2["frames"]["client"] == 40


def test_interrupted_header_block() -> None:
    """HEADERS without END_HEADERS followed by another frame: block lost, no guess."""
    from hpack import Encoder

    enc = Encoder()
    a = Http2Analyzer()
    a.feed(0, at(1), PREFACE + frame(1, 0x1, 1, enc.encode(get("/x"))), 1)
    a.feed(0, at(2), frame(8, 0, 0, struct.pack("!L", 100)), 2)
    a.feed(0, at(3), frame(1, 0x5, 3, enc.encode(get("/y"))), 3)
    a.close(at(4))
    assert [(r.stream_id, r.path, r.ts_ns) for r in a.requests] == [
        (1, None, at(1)), (3, None, at(3))]
    assert a.requests[0].end_ns is None  # its block never ended
    assert any("interrupted" in w for w in a.warnings)


def test_h2c_upgrade_keeps_callers_first_byte() -> None:
    p = Pair(upgrade=True)
    p.client(1)
    p.s.send_headers(1, [(":status", "200")])
    p.s.send_data(1, b"abc", end_stream=True)
    p.server(9)
    up = Request(ts_ns=at(0), method="GET", path="/", first_byte_ns=at(2), status=101,
                 last_byte_ns=at(2), response_bytes=0, chunks=1)
    a = analyze(p.chunks, protocol="h2c", upgrade_request=up)
    assert (up.first_byte_ns, up.status, up.last_byte_ns) == (at(2), 200, at(9))
    assert (up.response_bytes, up.chunks, up.request_bytes) == (3, 1, 0)
    assert a.http2["max_concurrent_streams"] == 1
