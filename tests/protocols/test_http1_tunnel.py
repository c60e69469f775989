"""CONNECT tunnels in the HTTP/1 analyzer: the tunnelled bytes reach the inner analyzer."""

from __future__ import annotations

from typing import Any

from netdiag.protocols.http1 import Http1Analyzer
from netdiag.protocols.tunnel import Tunnel

MS = 1_000_000
CONNECT = b"CONNECT api.test:80 HTTP/1.1\r\nHost: api.test:80\r\n\r\n"
OK = b"HTTP/1.1 200 Connection established\r\n\r\n"


def _inner_http1(seen: list[Any]):  # type: ignore[no-untyped-def]
    def pick(tunnel: Tunnel, first: bytes) -> Http1Analyzer:
        seen.append((tunnel.authority, first))
        return Http1Analyzer()
    return pick


def test_tunnelled_http1_requests_follow_the_connect() -> None:
    seen: list[Any] = []
    a = Http1Analyzer(tunnel_picker=_inner_http1(seen))
    inner_req = b"GET /inside HTTP/1.1\r\nHost: api.test\r\n\r\n"
    # the client sends its first tunnelled bytes before the proxy's answer (held)
    a.feed(0, 1 * MS, CONNECT + inner_req, 1)
    # the answer and the origin's response in one segment
    a.feed(1, 5 * MS, OK + b"HTTP/1.1 204 No Content\r\n\r\n", 2)
    a.feed(0, 9 * MS, b"GET /again HTTP/1.1\r\nHost: api.test\r\n\r\n", 3)
    a.gap(1, 10 * MS, 5)  # lost inside the tunnel: the inner analyzer is told
    a.close(20 * MS)
    assert seen == [("api.test:80", inner_req)]
    reqs = a.requests
    assert [(r.method, r.path, r.status) for r in reqs] == [
        ("CONNECT", None, 200), ("GET", "/inside", 204), ("GET", "/again", None)]
    assert reqs[1].ts_ns == 1 * MS and reqs[1].first_byte_ns == 5 * MS
    assert a.tunnel is not None and a.tunnel.to_json() == {
        "authority": "api.test:80", "protocol": "http/1.1", "requests": 2}
    assert any("in the CONNECT tunnel to api.test:80" in w for w in a.warnings)


def test_server_speaking_first_in_the_tunnel_is_held_until_the_client_does() -> None:
    seen: list[Any] = []
    a = Http1Analyzer(tunnel_picker=_inner_http1(seen))
    a.feed(0, 1 * MS, CONNECT, 1)
    a.feed(1, 2 * MS, OK, 2)
    a.feed(1, 3 * MS, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 3)  # before any request
    a.feed(0, 4 * MS, b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n", 4)
    a.close(9 * MS)
    assert seen and seen[0][1].startswith(b"GET /late")
    inner = a.tunnel.inner if a.tunnel is not None else None
    assert inner is not None and any("no request outstanding" in w for w in inner.warnings)


def test_refused_connect_is_no_tunnel_and_without_a_picker_nothing_is_read() -> None:
    a = Http1Analyzer(tunnel_picker=_inner_http1([]))
    a.feed(0, 1 * MS, CONNECT, 1)
    a.feed(1, 2 * MS, b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", 2)
    a.close(3 * MS)
    assert a.tunnel is None and [r.status for r in a.requests] == [403]
    b = Http1Analyzer()
    b.feed(0, 1 * MS, CONNECT + b"\x16\x03\x01\x00\x05hello", 1)
    b.feed(1, 2 * MS, OK + b"\x16\x03\x03\x00\x01x", 2)
    b.close(3 * MS)
    assert b.tunnel is None and [r.method for r in b.requests] == ["CONNECT"]
