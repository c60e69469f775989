"""The probe's pure pieces: URL and server parsing, HTTP/1.1 framing, HTTP/2 frame
clock, phase arithmetic; plus plain-HTTP/1.1 framings against a tiny socket server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from netdiag.errors import InputError
from netdiag.probe.dns import DnsQuery, DnsServerResult, parse_server
from netdiag.probe.http import (
    Mark,
    ProbeResult,
    RequestResult,
    _H1Response,
    _H2FrameClock,
    _hosts_lookup,
    _target,
    run_http_probe,
)


@pytest.mark.parametrize("text,expected", [
    ("1.1.1.1", ("1.1.1.1", 53)),
    ("127.0.0.53:5353", ("127.0.0.53", 5353)),
    ("2001:db8::1", ("2001:db8::1", 53)),
    ("[2001:db8::1]:853", ("2001:db8::1", 853)),
    (" 8.8.8.8 ", ("8.8.8.8", 53)),
])
def test_parse_server(text: str, expected: tuple[str, int]) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize("text", ["dns.google", "1.1.1.1:0", "1.1.1.1:x", "[::1", "[::1]x",
                                  "1.1.1.1:70000", ""])
def test_parse_server_rejects(text: str) -> None:
    with pytest.raises(InputError):
        parse_server(text)


def test_target() -> None:
    t = _target("https://API.example.com/v1/messages?x=1", None)
    assert (t.scheme, t.host, t.port, t.authority, t.path) == (
        "https", "api.example.com", 443, "api.example.com", "/v1/messages?x=1")
    assert (t.connect_host, t.connect_port) == ("api.example.com", 443)
    t = _target("api.example.com:8443", "127.0.0.10:443")
    assert (t.scheme, t.authority, t.path) == ("https", "api.example.com:8443", "/")
    assert (t.connect_host, t.connect_port) == ("127.0.0.10", 443)
    t = _target("http://[::1]:8080/x", "[::2]")
    assert (t.host, t.authority, t.connect_host, t.connect_port) == ("::1", "[::1]:8080",
                                                                     "::2", 8080)
    for bad in ("gopher://x/", "https://", "https://x:0/", "https://x/a b"):
        with pytest.raises(InputError):
            _target(bad, None)
    with pytest.raises(InputError):
        _target("https://x/", "host:port")


def test_hosts_lookup(tmp_path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# comment\n127.0.0.1 localhost\n10.0.0.5  api.lab  alias # x\n"
                     "bogus line\n")
    assert _hosts_lookup("api.lab", str(hosts)) == "10.0.0.5"
    assert _hosts_lookup("ALIAS.", str(hosts)) == "10.0.0.5"
    assert _hosts_lookup("nothere", str(hosts)) is None
    assert _hosts_lookup("x", str(tmp_path / "missing")) is None


def _feed_all(resp: _H1Response, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        resp.feed(data[i:i + step])


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_h1_framings(step: int) -> None:
    r = _H1Response("GET")
    _feed_all(r, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
                 b"hello", step)
    assert (r.done, r.status, r.body, r.keep_alive) == (True, 200, 5, True)
    r = _H1Response("GET")
    _feed_all(r, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-Trailer: 1\r\n\r\n", step)
    assert (r.done, r.body) == (True, 7)
    r = _H1Response("HEAD")
    _feed_all(r, b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", step)
    assert (r.done, r.body) == (True, 0)
    r = _H1Response("GET")
    _feed_all(r, b"HTTP/1.0 200 OK\r\n\r\nuntil close", step)
    assert (r.done, r.mode, r.body, r.keep_alive) == (False, "close", 11, False)
    r = _H1Response("GET")
    _feed_all(r, b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", step)
    assert (r.done, r.keep_alive) == (True, False)


def test_h1_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        _H1Response("GET").feed(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ValueError):
        _H1Response("GET").feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
    with pytest.raises(ValueError):
        _H1Response("GET").feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


def _frame(ftype: int, stream: int, payload: bytes, flags: int = 0) -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes([ftype, flags])
            + stream.to_bytes(4, "big") + payload)


def test_h2_frame_clock_marks_the_chunk_with_the_first_byte() -> None:
    data = (_frame(0x4, 0, b"") + _frame(0x1, 1, b"h" * 20, 0x4) + _frame(0x0, 1, b"d" * 7, 1)
            + _frame(0x1, 3, b"x" * 5, 0x4))
    clock = _H2FrameClock()
    marks = [Mark(i, 1000 + i) for i in range(len(data))]
    for i, byte in enumerate(data):  # one byte per recv(): the harshest split
        clock.feed(bytes([byte]), marks[i])
    first_h1 = 9  # after the 9-byte SETTINGS frame
    first_h3 = 9 + 29 + 16
    assert clock.first_headers == {1: marks[first_h1], 3: marks[first_h3]}
    clock2 = _H2FrameClock()
    clock2.feed(data[:10], marks[0])  # the first HEADERS byte arrives in the first chunk
    clock2.feed(data[10:], marks[1])
    assert clock2.first_headers[1] == marks[0] and clock2.first_headers[3] == marks[1]



def _attention_after_each_byte(data: bytes) -> list[int]:
    """Offsets (0-based, of the byte just fed) after which the clock raised its
    attention flag; the flag is cleared each time, as the probe does."""
    clock, raised = _H2FrameClock(), []
    for i, byte in enumerate(data):
        clock.feed(bytes([byte]), Mark(i, i))
        if clock.attention:
            raised.append(i)
            clock.attention = False
    return raised


def test_h2_frame_clock_asks_for_attention_once_a_notable_frame_is_whole() -> None:
    headers = _frame(0x1, 1, b"h" * 20, 0x4)
    data = _frame(0x0, 1, b"d" * 7)
    end = _frame(0x0, 1, b"e" * 5, 0x1)
    # HEADERS and DATA without END_STREAM can wait; the END_STREAM frame, once whole
    assert _attention_after_each_byte(headers + data) == []
    stream = headers + data + end
    assert _attention_after_each_byte(stream) == [len(stream) - 1]
    # an empty END_STREAM DATA frame, HEADERS ending the stream (trailers), and every
    # frame type but DATA and HEADERS: when their last byte (or header) is in
    for frame in (_frame(0x0, 1, b"", 0x1), _frame(0x1, 1, b"t" * 3, 0x5),
                  _frame(0x3, 1, b"\0\0\0\x08"), _frame(0x4, 0, b""),
                  _frame(0x6, 0, b"p" * 8), _frame(0x7, 0, b"g" * 8),
                  _frame(0x8, 1, b"\0\0\x10\0"), _frame(0x9, 1, b"c", 0x4)):
        assert _attention_after_each_byte(headers + frame) == [len(headers) + len(frame) - 1], \
            frame[:9].hex()
    # fed whole, in one recv()
    clock = _H2FrameClock()
    clock.feed(headers + data, Mark(0, 0))
    assert not clock.attention
    clock.feed(end, Mark(1, 1))
    assert clock.attention


def _rec(index: int, marks: dict[str, int], **kw: object) -> RequestResult:
    r = RequestResult(index=index, method="GET", url="https://x/", **kw)  # type: ignore[arg-type]
    r.marks = {k: Mark(v * 1_000_000, 1_700_000_000_000_000_000 + v * 1_000_000)
               for k, v in marks.items()}
    return r


def test_phases_and_summary() -> None:
    full = _rec(1, {"start": 0, "dns_start": 0, "dns_end": 2, "connect_start": 2,
                    "connect_end": 3, "tls_start": 3, "tls_end": 7, "ready": 7, "request": 8,
                    "written": 8, "first_byte": 30, "last_byte": 31}, connection=1, status=200)
    reused = _rec(2, {"start": 40, "ready": 40, "request": 40, "written": 41,
                      "first_byte": 60, "last_byte": 62}, connection=1, reused=True, status=200)
    failed = _rec(3, {"start": 70, "connect_start": 70, "failed": 71})
    failed.error, failed.failed_phase = "connection refused", "connect"
    assert full.phases_ms() == {"dns": 2, "connect": 1, "tls": 4, "send": 1, "wait": 22,
                                "ttfb": 22, "transfer": 1, "total": 31}
    assert reused.phases_ms()["dns"] is None and reused.phases_ms()["ttfb"] == 20
    assert failed.failed_after_ms == 1 and not failed.ok and full.ok
    result = ProbeResult(url="https://x/", method="GET", count=3, reuse=True, http1=False,
                         requests=[full, reused, failed])
    s = result.summary()
    assert (s["requests"], s["ok"], s["failures"], s["connections"], s["reused"]) == (3, 2, 1,
                                                                                     1, 1)
    assert s["errors"] == {"connect: connection refused": 1}
    assert s["phases"]["ttfb_ms"]["count"] == 2 and s["phases"]["ttfb_ms"]["max"] == 22
    assert s["phases"]["dns_ms"]["count"] == 1
    doc = result.to_json()
    assert doc["requests"][0]["request_ts"] == pytest.approx(1_700_000_000.008)
    assert doc["requests"][2]["total_ms"] is None


def test_dns_server_summary() -> None:
    s = DnsServerResult("127.0.0.1:53")
    s.queries = [
        DnsQuery("127.0.0.1:53", 1, "udp", 1, 0, latency_ns=2_000_000, rcode="NOERROR",
                 answers=["1.2.3.4", "1.2.3.4"]),
        DnsQuery("127.0.0.1:53", 2, "udp", 2, 0, latency_ns=4_000_000, rcode="NXDOMAIN"),
        DnsQuery("127.0.0.1:53", 3, "udp", 3, 0, error="timeout"),
        DnsQuery("127.0.0.1:53", 4, "udp", 4, 0, error="connection refused"),
    ]
    assert (s.answered, s.timeouts, s.errors) == (2, 1, 1)
    assert s.rcodes == {"NOERROR": 1, "NXDOMAIN": 1} and s.answers == {"1.2.3.4": 1}
    lat = s.latency_ms()
    assert (lat["count"], lat["min"], lat["p50"], lat["max"]) == (2, 2.0, 3.0, 4.0)
    assert s.to_json()["error_kinds"] == {"connection refused": 1}


# --------------------------------------------------------------------------- plain HTTP/1.1


@contextlib.contextmanager
def _http_server(responses: list[bytes]) -> Iterator[int]:
    """Answers each request (one per recv) on a connection with the next response;
    a response ending the connection is followed by a close."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(5)
    queue = list(responses)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while queue:
                conn, _ = srv.accept()
                with conn:
                    while queue:
                        if not conn.recv(65536):
                            break
                        resp = queue.pop(0)
                        conn.sendall(resp)
                        delimited = b"Content-Length" in resp or b"chunked" in resp
                        if b"Connection: close" in resp or not delimited:
                            break

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()
        t.join(5)


def test_plain_http1_framings_and_reuse_fallback() -> None:
    responses = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nclose-delimited",
    ]
    with _http_server(responses) as port:
        result = run_http_probe(f"http://127.0.0.1:{port}/", count=4, reuse=True, timeout=5)
    reqs = result.requests
    assert all(r.ok for r in reqs), [r.error for r in reqs]
    assert [r.status for r in reqs] == [200, 200, 503, 200]
    assert [r.response_bytes for r in reqs] == [2, 3, 0, 15]
    assert [r.reused for r in reqs] == [False, True, True, False]  # server closed after #3
    assert [r.connection for r in reqs] == [1, 1, 1, 2]
    assert reqs[3].http_version == "HTTP/1.0" and reqs[0].tls_version is None
    assert all(r.phases_ms()["tls"] is None for r in reqs)


def test_plain_http1_server_closing_early_is_a_failure() -> None:
    with _http_server([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
                       b"shor"]) as port:
        result = run_http_probe(f"http://127.0.0.1:{port}/", timeout=5)
    r = result.requests[0]
    assert not r.ok and r.failed_phase == "transfer" and "closed" in r.error
