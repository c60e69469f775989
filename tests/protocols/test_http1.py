"""Tests of the passive HTTP/1.x analyzer (netdiag.protocols.http1).

Three kinds of input: hand-written byte strings fed with exact capture times, real
traffic between http.client and http.server recorded by a loopback TCP relay, and
the third-party captures under ../shared/captures/thirdparty/ (when present).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import dpkt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.protocols.http1 import MAX_HEAD, Http1Analyzer
from netdiag.records import Request

T0 = 1_764_425_767_000_000_000
MS = 1_000_000
THIRDPARTY = Path(__file__).resolve().parents[2].parent / "shared" / "captures" / "thirdparty"
TSHARK = shutil.which("tshark")


def t(ms: float) -> int:
    """Capture time ``ms`` milliseconds after T0."""
    return T0 + round(ms * MS)


def run(*events: Any, close: float | None = None, tls: bool = False) -> Http1Analyzer:
    """Feed events: ``(direction, ms, bytes)`` data, ``(direction, ms, int)`` a gap."""
    an = Http1Analyzer(tls=tls)
    for packet, (d, ms, data) in enumerate(events, 1):
        if isinstance(data, int):
            an.gap(d, t(ms), data)
        else:
            an.feed(d, t(ms), data, packet)
    if close is not None:
        an.close(t(close))
    return an


def chunk(payload: bytes) -> bytes:
    """One HTTP chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def summary(r: Request) -> tuple[Any, ...]:
    return (r.method, r.path, r.status, r.request_bytes, r.response_bytes)


# ---------------------------------------------------------------------------------
# Hand-written exchanges
# ---------------------------------------------------------------------------------

def test_keepalive_three_requests_exact_times() -> None:
    an = run(
        (0, 0, b"GET /one HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\n\r\n"),
        (1, 10, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"),
        (0, 20, b"POST /two?x=1 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\n\r\nabcd"),
        (1, 35, b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"),
        (0, 50, b"DELETE /three HTTP/1.1\r\nHost: api.test:8080\r\n\r\n"),
        (1, 52, b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\n"),
        (1, 60, b"nop"),
        close=100,
    )
    assert an.warnings == []
    assert an.protocol == "http/1.1"
    assert an.http2 is None
    r1, r2, r3 = an.requests
    assert summary(r1) == ("GET", "/one", 200, 0, 5)
    assert summary(r2) == ("POST", "/two?x=1", 201, 4, 0)
    assert summary(r3) == ("DELETE", "/three", 404, 0, 3)
    assert (r1.ts_ns, r1.end_ns, r1.first_byte_ns, r1.last_byte_ns) == (t(0), t(0), t(10), t(10))
    assert (r2.ts_ns, r2.end_ns, r2.first_byte_ns, r2.last_byte_ns) == (t(20), t(20), t(35), t(35))
    assert (r3.ts_ns, r3.first_byte_ns, r3.last_byte_ns) == (t(50), t(52), t(60))
    assert r3.authority == "api.test:8080"
    assert all(r.estimated is False and r.protocol == "http/1.1" for r in an.requests)
    assert all(r.stream_id is None for r in an.requests)
    assert r1.request_headers == [("Host", "api.test"), ("Accept", "*/*")]
    assert r1.response_headers == [("Content-Length", "5"), ("Content-Type", "text/plain")]
    assert r1.content_type == "text/plain"
    assert (r1.chunks, r1.chunk_gaps_ns) == (1, None)
    assert (r2.chunks, r2.chunk_gaps_ns) == (0, None)


def test_pipelined_three_requests_in_one_segment() -> None:
    reqs = (b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"
            b"GET /c HTTP/1.1\r\nHost: h\r\n\r\n")
    an = run(
        (0, 0, reqs),
        (1, 5, b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA"
               b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nB"),
        (1, 7, b"B"),
        (1, 9, b"HTTP/1.1 500 Oops\r\nContent-Length: 3\r\n\r\nCCC"),
    )
    assert an.warnings == []
    assert [(r.path, r.status, r.response_bytes) for r in an.requests] == [
        ("/a", 200, 1), ("/b", 404, 2), ("/c", 500, 3)]
    assert [r.ts_ns for r in an.requests] == [t(0)] * 3
    assert [r.end_ns for r in an.requests] == [t(0)] * 3
    assert [r.first_byte_ns for r in an.requests] == [t(5), t(5), t(9)]
    assert [r.last_byte_ns for r in an.requests] == [t(5), t(7), t(9)]
    assert an.requests[1].chunk_gaps_ns == [2 * MS]


def test_chunked_response_three_chunks_at_distinct_times() -> None:
    an = run(
        (0, 0, b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n"),
        (1, 10, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        (1, 20, b"4\r\nabcd\r\n"),
        (1, 45, b"a\r\n0123456789\r\n"),
        (1, 90, b"1\r\nz\r\n"),
        (1, 95, b"0\r\n\r\n"),
    )
    (r,) = an.requests
    assert an.warnings == []
    assert r.first_byte_ns == t(10)
    assert r.last_byte_ns == t(95)
    assert r.response_bytes == 15
    assert r.chunks == 3
    assert r.chunk_gaps_ns == [25 * MS, 45 * MS]


def test_chunk_timed_by_its_size_line_and_split_anywhere() -> None:
    an = run(
        (0, 0, b"GET / HTTP/1.1\r\n\r\n"),
        (1, 1, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1"),
        (1, 2, b"0\r"),
        (1, 3, b"\n0123456789abcdef\r"),
        (1, 4, b"\n2"),
        (1, 8, b"\r\nxy"),
        (1, 9, b"\r\n0\r\n"),
        (1, 12, b"\r\n"),
    )
    (r,) = an.requests
    assert an.warnings == []
    assert r.response_bytes == 18
    assert r.chunks == 2
    assert r.chunk_gaps_ns == [3 * MS]  # size lines start at 1 ms and 4 ms
    assert r.last_byte_ns == t(12)


def test_chunk_extensions_and_trailers() -> None:
    an = run(
        (0, 0, b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
        (0, 1, b"3;ext=1\r\nabc\r\n"),
        (0, 2, b"0\r\nX-Sum: 1\r\n\r\n"),
        (1, 5, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5 ; name=\"quoted;value\"\r\nhello\r\n"
               b"0;final\r\nX-Checksum: abc\r\nX-Other:"),
        (1, 6, b" 2\r\n\r\n"),
        (0, 7, b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n"),
        (1, 8, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    )
    assert an.warnings == []
    r1, r2 = an.requests
    assert (r1.request_bytes, r1.end_ns) == (3, t(2))
    assert (r1.status, r1.response_bytes, r1.chunks, r1.last_byte_ns) == (200, 5, 1, t(6))
    assert summary(r2) == ("GET", "/after", 200, 0, 2)


def test_content_length_body_split_across_segments() -> None:
    body = bytes(range(256)) * 4
    an = run(
        (0, 0, b"GET /blob HTTP/1.1\r\nHo"),
        (0, 3, b"st: h\r\n\r\n"),
        (1, 10, b"HTTP/1.1 200 OK\r\nCont"),
        (1, 11, b"ent-Length: 1024\r\n\r\n" + body[:100]),
        (1, 17, body[100:600]),
        (1, 30, body[600:]),
    )
    (r,) = an.requests
    assert an.warnings == []
    assert (r.ts_ns, r.end_ns) == (t(0), t(3))
    assert r.authority == "h"
    assert r.first_byte_ns == t(10)
    assert r.last_byte_ns == t(30)
    assert r.response_bytes == 1024
    assert r.chunks == 3  # segments carrying body bytes
    assert r.chunk_gaps_ns == [6 * MS, 13 * MS]


def test_head_response_has_no_body() -> None:
    an = run(
        (0, 0, b"HEAD /big HTTP/1.1\r\nHost: h\r\n\r\nGET /small HTTP/1.1\r\nHost: h\r\n\r\n"),
        (1, 4, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"),
        (1, 6, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"),
    )
    assert an.warnings == []
    assert [summary(r) for r in an.requests] == [
        ("HEAD", "/big", 200, 0, 0), ("GET", "/small", 200, 0, 2)]
    assert an.requests[0].last_byte_ns == t(4)


@pytest.mark.parametrize("code", [204, 304])
def test_no_body_statuses(code: int) -> None:
    an = run(
        (0, 0, b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
        (1, 3, f"HTTP/1.1 {code} X\r\nContent-Length: 7\r\nETag: x\r\n\r\n".encode()),
        (1, 5, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
    )
    assert an.warnings == []
    assert [(r.status, r.response_bytes, r.last_byte_ns) for r in an.requests] == [
        (code, 0, t(3)), (200, 3, t(5))]


def test_100_continue() -> None:
    an = run(
        (0, 0, b"PUT /file HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
               b"Content-Length: 6\r\n\r\n"),
        (1, 2, b"HTTP/1.1 100 Continue\r\n\r\n"),
        (0, 3, b"abc"),
        (0, 4, b"def"),
        (1, 9, b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"),
    )
    assert an.warnings == []
    (r,) = an.requests
    assert r.first_byte_ns == t(2)  # the interim response's first byte
    assert (r.end_ns, r.request_bytes) == (t(4), 6)
    assert (r.status, r.last_byte_ns, r.response_bytes) == (201, t(9), 2)
    assert r.response_headers == [("Content-Length", "2")]


def test_103_early_hints_then_final() -> None:
    an = run(
        (0, 0, b"GET / HTTP/1.1\r\n\r\n"),
        (1, 2, b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"),
        (1, 7, b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n"),
        (1, 8, b"x"),
    )
    (r,) = an.requests
    assert (r.status, r.first_byte_ns, r.last_byte_ns, r.response_bytes) == (200, t(2), t(8), 1)


def test_response_until_close_ends_at_last_data_byte() -> None:
    an = run(
        (0, 0, b"GET /legacy HTTP/1.1\r\nHost: h\r\n\r\n"),
        (1, 5, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst "),
        (1, 15, b"second "),
        (1, 40, b"third"),
        close=500,
    )
    assert an.warnings == []
    (r,) = an.requests
    assert (r.status, r.response_bytes, r.last_byte_ns) == (200, 18, t(40))
    assert r.chunks == 3
    assert r.chunk_gaps_ns == [10 * MS, 25 * MS]


def test_response_until_close_without_body() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"), (1, 5, b"HTTP/1.1 200 OK\r\n\r\n"), close=50)
    (r,) = an.requests
    assert (r.response_bytes, r.last_byte_ns, r.chunks) == (0, t(5), 0)


def test_http10() -> None:
    an = run(
        (0, 0, b"GET /old HTTP/1.0\r\nUser-Agent: x\r\n\r\n"),
        (1, 5, b"HTTP/1.0 200 OK\r\nServer: y\r\n\r\n<html>"),
        (1, 6, b"</html>"),
        close=9,
    )
    assert an.warnings == []
    assert an.protocol == "http/1.0"
    (r,) = an.requests
    assert (r.protocol, r.authority, r.status, r.response_bytes) == ("http/1.0", None, 200, 13)
    assert r.last_byte_ns == t(6)


def test_http10_keepalive_with_length() -> None:
    an = run(
        (0, 0, b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
        (1, 1, b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\na"),
        (0, 2, b"GET /b HTTP/1.0\r\n\r\n"),
        (1, 3, b"HTTP/1.0 200 OK\r\n\r\nbb"),
        close=4,
    )
    assert [summary(r) for r in an.requests] == [
        ("GET", "/a", 200, 0, 1), ("GET", "/b", 200, 0, 2)]


def test_sse_events_split_across_segments() -> None:
    an = run(
        (0, 0, b"POST /v1/messages HTTP/1.1\r\nHost: api\r\nContent-Length: 2\r\n\r\n{}"),
        (1, 100, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n"),
        (1, 110, chunk(b"event: a\ndata: one\n\n")),  # a complete event
        (1, 130, chunk(b"data: two\n")),  # the event is not complete yet
        (1, 150, chunk(b"\n") + chunk(b": ping\n\n")),  # completes it; a comment
        (1, 170, chunk(b"data: three\r\n\r\n") + b"0\r\n\r\n"),
    )
    assert an.warnings == []
    (r,) = an.requests
    assert r.content_type == "text/event-stream; charset=utf-8"
    assert r.sse_events == 3
    assert r.chunks == 3
    assert r.first_event_ns == t(110)
    assert r.chunk_gaps_ns == [40 * MS, 20 * MS]
    assert r.last_byte_ns == t(170)
    assert r.response_bytes == 20 + 10 + 1 + 8 + 15


def test_sse_until_close() -> None:
    an = run(
        (0, 0, b"GET /events HTTP/1.1\r\n\r\n"),
        (1, 10, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n"),
        (1, 20, b"\ndata: b\n\n"),
        close=90,
    )
    (r,) = an.requests
    assert (r.sse_events, r.first_event_ns, r.chunk_gaps_ns, r.last_byte_ns) == (
        2, t(20), [0], t(20))


def test_lenient_parsing() -> None:
    an = run(
        (0, 0, b"\r\nGET /lf HTTP/1.1\nHOST: h\nX-Long: a\n  b\n\tc\n\n"),
        (1, 1, b"HTTP/1.1 200\ncontent-LENGTH: 3\nContent-Length: 3\n\nabc\r\n"),
        (0, 2, b"GET /two HTTP/1.1\r\nHost: h\r\n\r\n"),
        (1, 3, b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nxyz"),
    )
    assert an.warnings == []
    r1, r2 = an.requests
    assert (r1.path, r1.authority, r1.status, r1.response_bytes) == ("/lf", "h", 200, 3)
    assert r1.request_headers == [("HOST", "h"), ("X-Long", "a b c")]
    assert (r2.path, r2.response_bytes) == ("/two", 3)


def test_absolute_form_and_asterisk_targets() -> None:
    an = run(
        (0, 0, b"GET http://proxy.test:81/p?q=1 HTTP/1.1\r\nHost: other\r\n\r\n"
               b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"
               b"GET http://bare.test HTTP/1.1\r\n\r\n"),
    )
    assert [(r.authority, r.path) for r in an.requests] == [
        ("proxy.test:81", "/p?q=1"), ("h", "*"), ("bare.test", "/")]


def test_conflicting_content_length_is_a_warning() -> None:
    an = run(
        (0, 0, b"GET / HTTP/1.1\r\n\r\n"),
        (1, 1, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
    )
    assert len(an.warnings) == 1 and "Content-Length" in an.warnings[0]
    (r,) = an.requests
    assert r.status == 200 and r.last_byte_ns is None


@pytest.mark.parametrize("value", [b"-1", b"0x10", b"1e3", b"", b"\xb2", b"9" * 40])
def test_bad_content_length(value: bytes) -> None:
    an = run((0, 0, b"POST / HTTP/1.1\r\nContent-Length: " + value + b"\r\n\r\nab"),
             (0, 1, b"GET /next HTTP/1.1\r\n\r\n"),
             (1, 2, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
    (r,) = an.requests  # seen, but where its body ends is unknown: nothing after it
    assert (r.method, r.end_ns, r.request_bytes, r.status) == ("POST", None, None, 400)
    assert len(an.warnings) == 1


def test_malformed_header_line_is_skipped_with_warning() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\nHost: h\r\nno colon here\r\n: empty\r\n\r\n"),
             (1, 1, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    (r,) = an.requests
    assert r.request_headers == [("Host", "h")]
    assert r.status == 200
    assert len(an.warnings) == 1 and "malformed header" in an.warnings[0]


@pytest.mark.parametrize("garbage", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40) + b"\r\n\r\n",
    b"HELLO\r\n\r\n",
    b"GET /\r\n\r\n",
    b"GET / HTTP/2.0\r\n\r\n",
    b"GET / FTP/1.1\r\n\r\n",
])
def test_client_garbage(garbage: bytes) -> None:
    an = run((0, 0, garbage), (0, 1, b"GET / HTTP/1.1\r\n\r\n"), (1, 2, b"HTTP/1.1 200 OK\r\n\r\n"),
             close=3)
    assert an.requests == []
    assert any("request line" in w for w in an.warnings)


def test_server_garbage() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"), (1, 2, b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
             (1, 3, b"HTTP/1.1 200 OK\r\n\r\n"), close=4)
    (r,) = an.requests
    assert r.status is None and r.last_byte_ns is None
    assert r.first_byte_ns == t(2)  # the first server byte after the request, whatever it is
    assert any("status line" in w for w in an.warnings)


def test_bad_chunk_size_and_missing_crlf() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"),
             (1, 1, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"))
    assert any("chunk size" in w for w in an.warnings)
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"),
             (1, 1, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n"))
    assert any("CRLF" in w for w in an.warnings)


def test_header_section_limit() -> None:
    big = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * MAX_HEAD
    an = run((0, 0, big[:30000]), (0, 1, big[30000:]), (0, 2, b"\r\n\r\n"))
    assert an.requests == []
    assert len(an.warnings) == 1 and "header section" in an.warnings[0]
    an = run((0, 0, big + b"\r\n\r\n"))  # in one piece
    assert an.requests == [] and len(an.warnings) == 1


def test_huge_content_length_is_counted_not_buffered() -> None:
    an = Http1Analyzer()
    an.feed(0, t(0), b"GET /huge HTTP/1.1\r\n\r\n", 1)
    an.feed(1, t(1), b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\n", 2)
    block = bytes(1 << 16)
    for i in range(64):
        an.feed(1, t(2 + i), block, 3 + i)
    an.gap(1, t(100), 10**15)
    an.close(t(200))
    (r,) = an.requests
    assert r.response_bytes == 64 * (1 << 16) + 10**15
    assert r.last_byte_ns is None
    assert r.chunks == 64
    assert any("ended inside the response" in w for w in an.warnings)
    assert len(an._server.buf) == 0


def test_gap_inside_body_is_skipped_and_counted() -> None:
    an = run(
        (0, 0, b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\n"),
        (1, 1, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10),
        (1, 2, 50),
        (1, 3, b"y" * 40 + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n" + b"z"),
        (1, 4, 30),
        (1, 5, b"z\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + b"w" * 5),
        (1, 6, 15),  # the last bytes of the body were lost
        close=9,
    )
    assert an.warnings == []
    assert [(r.status, r.response_bytes) for r in an.requests] == [
        (200, 100), (200, 32), (200, 20)]
    assert [r.last_byte_ns for r in an.requests] == [t(3), t(5), None]
    assert an.requests[0].chunks == 2


def test_gap_in_body_until_close() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"), (1, 1, b"HTTP/1.1 200 OK\r\n\r\nab"),
             (1, 2, 100), (1, 3, b"cd"), close=10)
    (r,) = an.requests
    assert (r.response_bytes, r.last_byte_ns) == (104, t(3))
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"), (1, 1, b"HTTP/1.1 200 OK\r\n\r\nab"),
             (1, 2, 100), close=10)
    assert (an.requests[0].response_bytes, an.requests[0].last_byte_ns) == (102, None)


def test_gap_in_request_body() -> None:
    an = run((0, 0, b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nab"), (0, 1, 5),
             (0, 2, b"cde" + b"GET /next HTTP/1.1\r\n\r\n"))
    assert an.warnings == []
    assert [(r.path, r.request_bytes, r.end_ns) for r in an.requests] == [
        ("/", 10, t(2)), ("/next", 0, t(2))]


def test_gap_in_client_headers_stops_client_parsing() -> None:
    an = run(
        (0, 0, b"GET /a HTTP/1.1\r\n\r\nGET /b HTT"),
        (0, 1, 20),
        (0, 2, b"\r\n\r\nGET /c HTTP/1.1\r\n\r\n"),
        (1, 3, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        close=5,
    )
    assert [r.path for r in an.requests] == ["/a"]
    assert an.requests[0].status == 200
    assert any("not captured" in w and "client" in w for w in an.warnings)


def test_gap_between_messages_and_in_response_headers() -> None:
    an = run((0, 0, b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
             (1, 1, b"HTTP/1.1 200 OK\r\nContent-Le"), (1, 2, 10),
             (1, 3, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), close=4)
    assert [r.status for r in an.requests] == [None, None]
    assert [r.first_byte_ns for r in an.requests] == [t(1), None]
    assert sum("not captured" in w for w in an.warnings) == 1
    an = run((0, 0, b"GET /a HTTP/1.1\r\n\r\n"), (0, 1, 7))
    assert "between messages" in an.warnings[0]


def test_gap_larger_than_chunk_stops() -> None:
    an = run((0, 0, b"GET / HTTP/1.1\r\n\r\n"),
             (1, 1, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab"),
             (1, 2, 100), (1, 3, b"whatever"))
    assert len(an.warnings) == 1 and "not captured" in an.warnings[0]
    assert an.requests[0].last_byte_ns is None


def test_unanswered_and_cut_requests_at_close() -> None:
    an = run((0, 0, b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 9\r\n\r\nab"),
             close=5)
    assert len(an.requests) == 2
    assert an.requests[1].request_bytes == 2 and an.requests[1].end_ns is None
    assert any("ended inside the request POST /b" in w for w in an.warnings)
    assert any("2 requests got no complete response" in w for w in an.warnings)


def test_orphan_response_is_reported() -> None:
    an = run((1, 0, b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"), close=1)
    assert an.requests == []
    assert any("no request outstanding" in w for w in an.warnings)


def test_feed_after_close_and_empty_feed_are_ignored() -> None:
    an = run((0, 0, b""), (0, 0, b"GET / HTTP/1.1\r\n\r\n"), close=1)
    an.feed(0, t(2), b"GET /late HTTP/1.1\r\n\r\n", 9)
    an.gap(1, t(2), 5)
    an.close(t(3))
    assert [r.path for r in an.requests] == ["/"]


def test_memoryview_input() -> None:
    an = Http1Analyzer()
    an.feed(0, t(0), memoryview(b"GET / HTTP/1.1\r\n\r\n"), 1)  # type: ignore[arg-type]
    an.feed(1, t(1), bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), 2)  # type: ignore[arg-type]
    assert an.requests[0].status == 200


# ---------------------------------------------------------------------------------
# CONNECT, Upgrade, h2c
# ---------------------------------------------------------------------------------

def test_connect_tunnel_stops_parsing_quietly() -> None:
    an = run(
        (0, 0, b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n"),
        (1, 5, b"HTTP/1.1 200 Connection Established\r\n\r\n"),
        (0, 6, b"\x16\x03\x01\x00\x05hello"),
        (1, 8, b"\x16\x03\x03\x00\x05world"),
        close=10,
    )
    assert an.warnings == []
    (r,) = an.requests
    assert (r.method, r.authority, r.path, r.status) == ("CONNECT", "api.test:443", None, 200)
    assert (r.first_byte_ns, r.last_byte_ns, r.response_bytes) == (t(5), t(5), 0)


def test_connect_tunnel_client_speaks_first() -> None:
    an = run(
        (0, 0, b"CONNECT api.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05hello"),
        (1, 5, b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x03"),
        close=10,
    )
    assert an.warnings == []
    assert len(an.requests) == 1


def test_connect_refused_resumes_http() -> None:
    an = run(
        (0, 0, b"CONNECT api.test:443 HTTP/1.1\r\n\r\n"),
        (0, 1, b"GET /pipelined HTTP/1.1\r\n\r\n"),  # held until the answer
        (1, 5, b"HTTP/1.1 407 Proxy Auth\r\nContent-Length: 2\r\n\r\nno"),
        (1, 6, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        close=10,
    )
    assert an.warnings == []
    assert [(r.method, r.status, r.ts_ns) for r in an.requests] == [
        ("CONNECT", 407, t(0)), ("GET", 200, t(1))]


def test_websocket_upgrade_stops_parsing_quietly() -> None:
    an = run(
        (0, 0, b"GET /chat HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"),
        (1, 3, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
               b"Connection: Upgrade\r\n\r\n\x81\x05hello"),
        (0, 4, b"\x81\x85\x00\x00\x00\x00hello"),
        close=10,
    )
    assert an.warnings == []
    assert an.protocol == "http/1.1"
    assert an.http2 is None
    (r,) = an.requests
    assert (r.status, r.first_byte_ns, r.last_byte_ns) == (101, t(3), t(3))


def test_upgrade_declined_continues() -> None:
    an = run(
        (0, 0, b"GET / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"),
        (1, 3, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"),
        (0, 4, b"GET /2 HTTP/1.1\r\n\r\n"),
        (1, 5, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
    )
    assert an.warnings == []
    assert an.protocol == "http/1.1"
    assert [(r.path, r.status) for r in an.requests] == [("/", 200), ("/2", 200)]


def test_held_bytes_are_read_at_close_when_never_answered() -> None:
    an = run((0, 0, b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
             (0, 1, b"GET /next HTTP/1.1\r\n\r\n"), close=5)
    assert [(r.path, r.ts_ns) for r in an.requests] == [("/ws", t(0)), ("/next", t(1))]
    assert any("2 requests got no complete response" in w for w in an.warnings)


class FakeH2:
    """Stands in for netdiag.protocols.http2.Http2Analyzer: records what it is fed."""

    instances: ClassVar[list[FakeH2]] = []

    def __init__(self, *, protocol: str, upgrade_request: Request | None) -> None:
        self.protocol = protocol
        self.upgrade_request = upgrade_request
        self.events: list[tuple[Any, ...]] = []
        self.http2 = {"settings": {"client": {}, "server": {}}}
        self.warnings = ["from h2"]
        extra = Request(ts_ns=t(50), stream_id=3, method="GET", path="/h2", estimated=False,
                        protocol="h2c")
        self.requests = ([upgrade_request] if upgrade_request else []) + [extra]
        FakeH2.instances.append(self)

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        self.events.append(("feed", direction, ts_ns, bytes(data), packet))

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        self.events.append(("gap", direction, ts_ns, nbytes))

    def close(self, ts_ns: int) -> None:
        self.events.append(("close", ts_ns))


@pytest.fixture
def fake_h2(monkeypatch: pytest.MonkeyPatch) -> type[FakeH2]:
    module = types.ModuleType("netdiag.protocols.http2")
    module.Http2Analyzer = FakeH2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "netdiag.protocols.http2", module)
    FakeH2.instances = []
    return FakeH2


UPGRADE_REQ = (b"GET /robots.txt HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_h2c_upgrade_hands_both_streams_over(fake_h2: type[FakeH2]) -> None:
    an = run(
        (0, 0, UPGRADE_REQ),
        (0, 1, PREFACE[:10]),  # the client did not wait for the 101: held
        (1, 5, SWITCH + SETTINGS),
        (0, 6, PREFACE[10:] + SETTINGS),
        (1, 7, SETTINGS),
        (1, 8, 9),
        close=9,
    )
    (h2,) = fake_h2.instances
    up = h2.upgrade_request
    assert up is not None
    assert (up.method, up.path, up.protocol) == ("GET", "/robots.txt", "http/1.1")
    assert (up.status, up.first_byte_ns, up.end_ns) == (101, t(5), t(0))
    assert h2.protocol == "h2c"
    assert h2.events == [
        ("feed", 0, t(1), PREFACE[:10], 2),  # the held bytes, when the 101 is read
        ("feed", 1, t(5), SETTINGS, 3),
        ("feed", 0, t(6), PREFACE[10:] + SETTINGS, 4),
        ("feed", 1, t(7), SETTINGS, 5),
        ("gap", 1, t(8), 9),
        ("close", t(9)),
    ]
    assert an.protocol == "h2c"
    assert an.http2 is h2.http2
    assert [r.path for r in an.requests] == ["/robots.txt", "/h2"]
    assert an.requests[0] is up
    assert an.warnings == ["from h2"]


def test_h2c_upgrade_with_request_body(fake_h2: type[FakeH2]) -> None:
    req = UPGRADE_REQ.replace(b"\r\n\r\n", b"\r\nContent-Length: 4\r\n\r\nab")
    an = run((0, 0, req), (1, 1, SWITCH), (1, 2, SETTINGS), (0, 3, b"cd" + PREFACE))
    (h2,) = fake_h2.instances
    assert h2.events == [("feed", 1, t(2), SETTINGS, 3), ("feed", 0, t(3), PREFACE, 4)]
    assert an.requests[0].request_bytes == 4 and an.requests[0].end_ns == t(3)


def test_h2c_over_tls_is_not_honoured(fake_h2: type[FakeH2]) -> None:
    an = run((0, 0, UPGRADE_REQ), (1, 1, SWITCH + SETTINGS), tls=True)
    assert fake_h2.instances == []
    assert an.protocol == "http/1.1"
    assert len(an.warnings) == 1 and "TLS" in an.warnings[0]


def test_h2_prior_knowledge(fake_h2: type[FakeH2]) -> None:
    an = run((0, 0, PREFACE[:5]), (0, 1, PREFACE[5:] + SETTINGS), (1, 2, SETTINGS), close=3)
    (h2,) = fake_h2.instances
    assert h2.upgrade_request is None
    assert b"".join(e[3] for e in h2.events if e[0] == "feed" and e[1] == 0) == PREFACE + SETTINGS
    assert ("feed", 1, t(2), SETTINGS, 3) in h2.events
    assert an.protocol == "h2c"
    assert [r.path for r in an.requests] == ["/h2"]


def test_h2_prior_knowledge_with_the_real_http2_analyzer() -> None:
    pytest.importorskip("netdiag.protocols.http2")
    h2_connection = pytest.importorskip("h2.connection")
    h2_config = pytest.importorskip("h2.config")
    client = h2_connection.H2Connection(h2_config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "GET"), (":path", "/pk"), (":scheme", "http"),
                            (":authority", "h")], end_stream=True)
    cbytes = client.data_to_send()
    server = h2_connection.H2Connection(h2_config.H2Configuration(client_side=False))
    server.initiate_connection()
    server.receive_data(cbytes)
    server.send_headers(1, [(":status", "200")])
    server.send_data(1, b"hi", end_stream=True)
    an = run((0, 0, cbytes[:7]), (0, 1, cbytes[7:]), (1, 3, server.data_to_send()), close=4)
    assert an.protocol == "h2c"
    assert an.warnings == []
    assert [(r.method, r.path, r.status, r.stream_id) for r in an.requests] == [
        ("GET", "/pk", 200, 1)]


def test_h2c_without_http2_analyzer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "netdiag.protocols.http2", None)  # import fails
    an = run((0, 0, UPGRADE_REQ), (1, 1, SWITCH + SETTINGS), (0, 2, PREFACE))
    assert an.protocol == "http/1.1"
    assert an.requests[0].status == 101
    assert len(an.warnings) == 1 and "HTTP/2 analyzer" in an.warnings[0]


# ---------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------

@dataclass
class Exchange:
    request: bytes
    response: bytes
    expect: tuple[Any, ...]
    interim: int = 0
    """Bytes of interim (1xx) responses at the start of ``response``."""


EXCHANGES = [
    Exchange(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n",
             b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", ("GET", "/a", 200, 0, 5)),
    Exchange(b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz",
             b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"3;e=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n",
             ("POST", "/b", 201, 3, 19)),
    Exchange(b"PUT /c HTTP/1.1\nTransfer-Encoding: chunked\n\n2\nhi\n0\n\n",
             b"HTTP/1.1 204 No Content\r\n\r\n", ("PUT", "/c", 204, 2, 0)),
    Exchange(b"HEAD /d HTTP/1.1\r\n\r\n",
             b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", ("HEAD", "/d", 200, 0, 0)),
    Exchange(b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
             b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n!",
             ("POST", "/e", 200, 2, 1), interim=25),
    Exchange(b"GET /f HTTP/1.1\r\n\r\n",
             b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n8\r\ndata: a\n\r\n1\r\n\n\r\n0\r\n\r\n",
             ("GET", "/f", 200, 0, 9)),
]
UNTIL_CLOSE = Exchange(b"GET /z HTTP/1.0\r\n\r\n", b"HTTP/1.0 200 OK\r\n\r\nthe rest",
                       ("GET", "/z", 200, 0, 8))


def split(data: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    """(offset, piece) of ``data`` cut at ``cuts``."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [(a, data[a:b]) for a, b in itertools.pairwise(points) if b > a]


def time_of(pieces: list[tuple[int, bytes]], offset: int, base: int) -> int:
    """Capture time of the piece carrying byte ``offset`` (piece k is at base + k ms)."""
    for k, (a, piece) in enumerate(pieces):
        if a <= offset < a + len(piece):
            return base + k * MS
    raise AssertionError(offset)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(EXCHANGES))), min_size=1, max_size=6),
       st.booleans(), st.lists(st.integers(0, 10_000), max_size=30),
       st.lists(st.integers(0, 10_000), max_size=30))
def test_any_split_gives_the_same_requests_and_exact_times(
        picks: list[int], until_close: bool, ccuts: list[int], scuts: list[int]) -> None:
    exchanges = [EXCHANGES[i] for i in picks] + ([UNTIL_CLOSE] if until_close else [])
    client = b"".join(x.request for x in exchanges)
    server = b"".join(x.response for x in exchanges)
    cpieces, spieces = split(client, ccuts), split(server, scuts)
    an = Http1Analyzer()
    for k, (_, piece) in enumerate(cpieces):
        an.feed(0, T0 + k * MS, piece, k)
    for k, (_, piece) in enumerate(spieces):
        an.feed(1, T0 + 10**9 + k * MS, piece, 1000 + k)
    an.close(T0 + 10**10)
    assert an.warnings == []
    assert [summary(r) for r in an.requests] == [x.expect for x in exchanges]
    coff = soff = 0
    for x, r in zip(exchanges, an.requests, strict=True):
        assert r.ts_ns == time_of(cpieces, coff, T0)
        assert r.end_ns == time_of(cpieces, coff + len(x.request) - 1, T0)
        assert r.first_byte_ns == time_of(spieces, soff, T0 + 10**9)
        assert r.last_byte_ns == time_of(spieces, soff + len(x.response) - 1, T0 + 10**9)
        coff += len(x.request)
        soff += len(x.response)
        if x.expect[1] == "/f":
            assert r.sse_events == 1 and r.chunks == 1


EVENT = st.one_of(
    st.tuples(st.integers(0, 1), st.binary(max_size=200)),
    st.tuples(st.integers(0, 1), st.integers(1, 1 << 20)),
)


def drive(an: Http1Analyzer, events: list[tuple[int, Any]], close: bool) -> None:
    for k, (d, data) in enumerate(events):
        if isinstance(data, int):
            an.gap(d, T0 + k, data)
        else:
            an.feed(d, T0 + k, data, k)
    if close:
        an.close(T0 + 10**9)
    assert all(isinstance(w, str) for w in an.warnings)
    assert all(isinstance(r, Request) for r in an.requests)
    _ = (an.protocol, an.http2)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=30), st.booleans(), st.booleans())
def test_random_bytes_never_raise(events: list[tuple[int, Any]], close: bool,
                                  tls: bool) -> None:
    drive(Http1Analyzer(tls=tls), events, close)


PREFIXES = [b"GET / HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n", b"Transfer-Encoding: chunked\r\n",
            b"Content-Length: 5\r\n", b"\r\n", b"0\r\n\r\n", b"5\r\nhello\r\n",
            b"Upgrade: h2c\r\n", b"HTTP/1.1 101 S\r\nUpgrade: h2c\r\n\r\n",
            b"CONNECT a:1 HTTP/1.1\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
            b"Content-Type: text/event-stream\r\n", b"data: x\n\n", PREFACE]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(EXCHANGES))), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 3)),
                max_size=12),
       st.lists(st.tuples(st.integers(0, 1), st.sampled_from(PREFIXES)), max_size=6),
       st.lists(st.integers(0, 10_000), max_size=20), st.randoms(use_true_random=False))
def test_mutated_exchanges_never_raise(picks: list[int], mutations: list[tuple[int, int, int]],
                                       inserts: list[tuple[int, bytes]], cuts: list[int],
                                       rnd: Any) -> None:
    streams = [bytearray(b"".join(EXCHANGES[i].request for i in picks)),
               bytearray(b"".join(EXCHANGES[i].response for i in picks))]
    for pos, value, kind in mutations:
        s = streams[pos % 2]
        i = pos % (len(s) + 1)
        if kind == 0 and i < len(s):
            s[i] = value
        elif kind == 1:
            s.insert(i, value)
        elif kind == 2 and i < len(s):
            del s[i]
        else:
            s[i:i] = b"\r\n"
    for d, prefix in inserts:
        i = rnd.randrange(len(streams[d]) + 1)
        streams[d][i:i] = prefix
    events: list[tuple[int, Any]] = []
    pieces = [split(bytes(s), cuts) for s in streams]
    while pieces[0] or pieces[1]:
        d = rnd.choice([x for x in (0, 1) if pieces[x]])
        events.append((d, pieces[d].pop(0)[1]))
        if rnd.random() < 0.05:
            events.append((d, rnd.randrange(1, 100)))
    drive(Http1Analyzer(), events, rnd.random() < 0.8)


# ---------------------------------------------------------------------------------
# Real traffic: http.client <-> loopback relay <-> http.server
# ---------------------------------------------------------------------------------

class Relay:
    """Forwards one TCP connection on loopback, recording (direction, time, bytes) per recv."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.records: list[tuple[int, int, bytes]] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pumps = [threading.Thread(target=self._pump, args=(client, server, 0), daemon=True),
                 threading.Thread(target=self._pump, args=(server, client, 1), daemon=True)]
        for p in pumps:
            p.start()
        for p in pumps:
            p.join(30)
        client.close()
        server.close()
        self.listener.close()
        self.done.set()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: int) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            with self.lock:
                self.records.append((direction, time.monotonic_ns(), data))
            try:
                dst.sendall(data)
            except OSError:
                return

    def analyze(self) -> tuple[Http1Analyzer, int]:
        assert self.done.wait(30)
        an = Http1Analyzer()
        for k, (d, ts, data) in enumerate(self.records, 1):
            an.feed(d, ts, data, k)
        close_ns = time.monotonic_ns()
        an.close(close_ns)
        return an, close_ns


SSE_EVENTS = [b"event: delta\ndata: {\"t\": \"Hel\"}\n\n", b": keep-alive\n\n",
              b"data: lo\n\n", b"data: [DONE]\n\n"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _chunked(self, ctype: str, parts: list[bytes], pause: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for part in parts:
            time.sleep(pause)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self._chunked("text/plain", [b"a" * 10, b"b" * 200, b"c" * 3000], 0.05)
        elif self.path == "/sse":
            self._chunked("text/event-stream", SSE_EVENTS, 0.03)
        elif self.path.startswith("/bytes/"):
            n = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(b"x" * n)
        else:
            self.send_error(404)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) // 2))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])


class Http10Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.flush()
        for part in (b"one ", b"two ", b"three"):
            time.sleep(0.03)
            self.wfile.write(part)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Any:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("server", [Handler], indirect=True)
def test_real_keepalive_traffic(server: ThreadingHTTPServer) -> None:
    relay = Relay(server.server_address[:2])
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    done: list[tuple[Any, ...]] = []
    plan = [("GET", "/bytes/100", None), ("POST", "/echo", b"p" * 5000),
            ("GET", "/chunked", None), ("HEAD", "/bytes/50", None), ("GET", "/sse", None),
            ("GET", "/bytes/70000", None), ("GET", "/missing", None)]
    for method, path, body in plan:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        done.append((method, path, resp.status, len(body or b""), len(data)))
    conn.close()
    an, close_ns = relay.analyze()
    assert an.warnings == []
    assert [summary(r) for r in an.requests] == done
    assert all(r.authority == f"127.0.0.1:{relay.port}" for r in an.requests)
    server_times = [ts for d, ts, _ in relay.records if d == 1]
    client_times = [ts for d, ts, _ in relay.records if d == 0]
    for r in an.requests:
        assert r.ts_ns in client_times and r.end_ns in client_times
        assert r.first_byte_ns in server_times and r.last_byte_ns in server_times
        assert r.ts_ns <= r.end_ns < r.first_byte_ns <= r.last_byte_ns < close_ns
    def time_of_byte(needle: bytes, last: bool = False) -> int:
        """Relay time of the server record carrying the first (last) byte of ``needle``."""
        stream = b"".join(data for d, _, data in relay.records if d == 1)
        offset = stream.index(needle) + (len(needle) - 1 if last else 0)
        for d, ts, data in relay.records:
            if d == 1:
                if offset < len(data):
                    return ts
                offset -= len(data)
        raise AssertionError(needle)

    chunked = an.requests[2]
    assert chunked.chunks == 3
    starts = [time_of_byte(b"a\r\naaaaaaaaaa"), time_of_byte(b"c8\r\nbbb"),
              time_of_byte(b"bb8\r\nccc")]
    assert chunked.chunk_gaps_ns == [starts[1] - starts[0], starts[2] - starts[1]]
    assert chunked.last_byte_ns - chunked.first_byte_ns >= 100 * MS  # 3 pauses of 50 ms
    sse = an.requests[4]
    assert sse.content_type == "text/event-stream"
    assert sse.sse_events == sse.chunks == 3
    ends = [time_of_byte(SSE_EVENTS[i], last=True) for i in (0, 2, 3)]
    assert sse.first_event_ns == ends[0]
    assert sse.chunk_gaps_ns == [ends[1] - ends[0], ends[2] - ends[1]]
    assert sse.last_byte_ns - sse.first_byte_ns >= 60 * MS  # 4 pauses of 30 ms
    assert an.requests[1].end_ns is not None
    assert an.requests[-1].status == 404


@pytest.mark.slow
@pytest.mark.parametrize("server", [Http10Handler], indirect=True)
def test_real_response_until_close(server: ThreadingHTTPServer) -> None:
    relay = Relay(server.server_address[:2])
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=10)
    conn.request("GET", "/stream")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    an, close_ns = relay.analyze()
    assert an.warnings == []
    (r,) = an.requests
    assert (r.method, r.path, r.status, r.response_bytes) == ("GET", "/stream", 200, len(body))
    last_server = max(ts for d, ts, data in relay.records if d == 1)
    assert r.last_byte_ns == last_server < close_ns
    assert r.chunks is not None and r.chunks >= 3


# ---------------------------------------------------------------------------------
# Third-party captures
# ---------------------------------------------------------------------------------

def tcp_events(path: Path) -> list[tuple[int, int, Any, int]]:
    """(direction, ts_ns, payload or lost-byte count, packet) of the capture's first TCP
    connection, in capture order, duplicates trimmed by sequence number."""
    out: list[tuple[int, int, Any, int]] = []
    client = server = None
    nxt: dict[int, int] = {}
    with path.open("rb") as f:
        reader = dpkt.pcap.Reader(f)
        link = reader.datalink()
        for k, (ts, buf) in enumerate(reader, 1):
            frame = dpkt.loopback.Loopback(buf) if link == 0 else dpkt.ethernet.Ethernet(buf)
            ip = frame.data
            tcp = getattr(ip, "data", None)
            if not isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) or not isinstance(tcp, dpkt.tcp.TCP):
                continue
            src, dst = (bytes(ip.src), tcp.sport), (bytes(ip.dst), tcp.dport)
            syn = bool(tcp.flags & dpkt.tcp.TH_SYN)
            if client is None:
                client, server = (dst, src) if syn and tcp.flags & dpkt.tcp.TH_ACK else (src, dst)
            if {src, dst} != {client, server}:
                continue  # another connection
            d = 0 if src == client else 1
            if syn:
                nxt[d] = (tcp.seq + 1) & 0xFFFFFFFF
                continue
            data = bytes(tcp.data)
            if not data:
                continue
            seq = tcp.seq
            expected = nxt.get(d, seq)
            delta = (seq - expected) & 0xFFFFFFFF
            if delta >= 1 << 31:  # starts before what we have: trim the duplicate part
                data = data[(expected - seq) & 0xFFFFFFFF:]
                if not data:
                    continue
            elif delta:
                out.append((d, round(ts * 1e6) * 1000, delta, k))
            nxt[d] = (seq + len(bytes(tcp.data))) & 0xFFFFFFFF
            out.append((d, round(ts * 1e6) * 1000, data, k))
    return out


def analyze_capture(name: str) -> Http1Analyzer:
    path = THIRDPARTY / name
    if not path.exists():
        pytest.skip(f"{name} not present")
    an = Http1Analyzer()
    events = tcp_events(path)
    for d, ts, data, k in events:
        if isinstance(data, int):
            an.gap(d, ts, data)
        else:
            an.feed(d, ts, data, k)
    an.close(events[-1][1])
    return an


def tshark_fields(name: str, filt: str, *fields: str) -> list[list[str]]:
    if TSHARK is None:
        pytest.skip("tshark not installed")
    cmd = [TSHARK, "-r", str(THIRDPARTY / name), "-n", "-2", "-Y", filt, "-T", "fields"]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split("\t") for line in out.splitlines() if line]


@pytest.mark.tshark
def test_thirdparty_pipelined_requests_match_tshark() -> None:
    an = analyze_capture("zeek_http_pipelined.pcap")
    requests = tshark_fields("zeek_http_pipelined.pcap", "http.request", "frame.time_epoch",
                             "http.request.method", "http.request.uri", "http.host")
    responses = tshark_fields("zeek_http_pipelined.pcap", "http.response", "http.response.code")
    assert an.warnings == []
    assert len(an.requests) == len(requests) == len(responses) == 5
    assert [(r.method, r.path, r.authority) for r in an.requests] == [
        (m, u, h) for _, m, u, h in requests]
    assert [r.status for r in an.requests] == [int(c) for (c,) in responses]
    # tshark times a request by the packet completing it: these fit in one packet
    assert [round(r.ts_ns / 1e9, 6) for r in an.requests] == [
        round(float(ts), 6) for ts, *_ in requests]
    for r in an.requests:
        assert r.first_byte_ns is not None and r.last_byte_ns is not None
        assert r.ts_ns <= r.end_ns < r.first_byte_ns <= r.last_byte_ns
        assert r.response_bytes and r.response_bytes > 0


@pytest.mark.parametrize(("name", "path", "authority", "status"), [
    ("scapy_http2_h2c.pcap", "/robots.txt", "nghttp2.org", 200),
    ("suricata_http2_range_h2c.pcap", "/eicar", "127.0.0.1:8080", 206),
])
def test_thirdparty_h2c_upgrade_is_handed_over(name: str, path: str, authority: str,
                                               status: int) -> None:
    an = analyze_capture(name)
    up = an.requests[0]
    assert (up.method, up.path, up.authority) == ("GET", path, authority)
    assert up.first_byte_ns is not None and up.first_byte_ns > up.ts_ns
    try:
        import netdiag.protocols.http2  # noqa: F401
    except ImportError:
        assert an.protocol == "http/1.1"
        assert up.status == 101
        pytest.xfail("netdiag.protocols.http2 is not written yet")
    assert an.protocol == "h2c"
    assert an.http2 is not None
    assert an.warnings == []
    assert up.status == status
    assert up.stream_id == 1
    assert up.last_byte_ns is not None and up.last_byte_ns >= up.first_byte_ns
    assert sum(r is up for r in an.requests) == 1
