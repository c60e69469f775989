"""Decoded HTTP/2 header fields are shared between requests, within a bound."""

from __future__ import annotations

import pytest

from netdiag.protocols import http2


def test_short_fields_are_one_object_long_ones_are_not() -> None:
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
