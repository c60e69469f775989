"""Decoded HTTP/2 header fields are shared between requests, within a bound."""

from __future__ import annotations

import pytest

from netdiag.protocols import http2


def test_short_fields_are_one_object_long_ones_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http2, "_shared_headers", {})  # the first one decoded, then shared
    a = http2._header_pair(b"content-type", bytearray(b"application/json"))
    b = http2._header_pair(memoryview(b"content-type"), b"application/json")
    assert a == ("content-type", "application/json") and a is b
    long_value = b"x" * (http2.SHARED_VALUE_MAX + 1)
    c = http2._header_pair(b"cookie", long_value)
    d = http2._header_pair(b"cookie", long_value)
    assert c == d and c is not d
    assert http2._header_pair(b"x", b"\xff") == ("x", "\ufffd")  # replaced, never raises


def test_the_cache_stops_growing_at_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http2, "_shared_headers", {})
    monkeypatch.setattr(http2, "SHARED_HEADERS_MAX", 8)
    pairs = [http2._header_pair(b"x-n", str(i).encode()) for i in range(50)]
    assert len(http2._shared_headers) == 8
    assert [p[1] for p in pairs] == [str(i) for i in range(50)]


def test_requests_share_the_decoded_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the analyzer (compiled too, where a typed tuple would be copied): the same
    field of two requests is one tuple, the one the cache holds."""
    import struct

    from hpack import Encoder

    monkeypatch.setattr(http2, "_shared_headers", {})
    enc = Encoder()
    a = http2.Http2Analyzer(protocol="h2c")
    a.feed(0, 1, http2.PREFACE, 1)
    for sid in (1, 3):
        block = enc.encode([(":method", "GET"), (":path", "/"), ("x-k", "v")], huffman=False)
        a.feed(0, 2, struct.pack("!HBBBL", 0, len(block), 1, 0x5, sid) + block, 2)
    one, two = (r.request_headers for r in a.requests)
    assert one is not None and two is not None and one == two
    assert all(x is y for x, y in zip(one, two, strict=True))
    assert one[2] is http2._shared_headers[(b"x-k", b"v")]
