"""An SSLv2-compatible ClientHello that negotiates TLS (RFC 5246 E.2), as tshark reads it."""

from __future__ import annotations

import struct

import pytest
from test_tls import CCS, MS, Feeder, handshake, record
from test_tls_deflate import MASTER, server_hello, sides

from netdiag.protocols.tls import TlsAnalyzer, looks_like_tls

CHALLENGE = bytes(range(16, 32))  # 16 bytes: the client random is it, left-padded


def v2_hello(version: int = 0x0301, challenge: bytes = CHALLENGE,
             specs: bytes = b"\x00\x00\x9c\x00\x00\x2f\x01\x00\x80") -> bytes:
    body = (b"\x01" + struct.pack("!HHHH", version, len(specs), 0, len(challenge))
            + specs + challenge)
    return struct.pack("!H", 0x8000 | len(body)) + body


def test_detected_as_tls_but_not_pure_sslv2() -> None:
    assert looks_like_tls(v2_hello())
    assert looks_like_tls(v2_hello(version=0x0303))
    assert not looks_like_tls(v2_hello(version=0x0002))
    assert not looks_like_tls(b"\x80\x03\x01\x03\x01")  # too short to hold a hello


def _handshake(f: Feeder, hello: bytes, chunk: int | None = None) -> tuple[int, int]:
    client, server = sides(False, CHALLENGE.rjust(32, b"\x00"))
    first = f.send(0, hello, chunk=chunk)
    f.send(1, record(22, server_hello(0) + handshake(11, b"\x00" * 600) + handshake(14, b"")))
    f.send(0, record(22, handshake(16, b"\x00\x80" + b"\x05" * 128)) + CCS
           + client.seal(22, handshake(20, b"\x0c" * 12)))
    f.send(1, CCS + server.seal(22, handshake(20, b"\x0d" * 12)))
    f.send(0, client.seal(23, b"GET /v2 HTTP/1.1\r\nHost: old.test\r\n\r\n"))
    f.send(1, server.seal(23, b"HTTP/1.1 204 No Content\r\n\r\n"), step_ns=2 * MS)
    return first


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_handshake_facts_from_an_sslv2_hello(chunk: int | None) -> None:
    f = Feeder(TlsAnalyzer())
    first = _handshake(f, v2_hello(), chunk)
    an = f.close()
    info = an.info
    assert info.client_random == CHALLENGE.rjust(32, b"\x00")
    assert (info.client_hello_ns, info.client_hello_packet) == first
    assert info.version == "TLS 1.2" and info.handshake_ns is not None
    assert info.sni is None and an.warnings == []
    assert len(an.requests) == 1 and an.requests[0].estimated


def test_decrypted_with_the_key_of_the_padded_challenge() -> None:
    from netdiag.pipeline import _app_for_tls
    from netdiag.protocols.tls_decrypt import DecryptingTlsAnalyzer
    from netdiag.tls.keylog import KeyLog

    random = CHALLENGE.rjust(32, b"\x00")
    keys = KeyLog.parse(f"CLIENT_RANDOM {random.hex()} {MASTER.hex()}\n".encode(), "t")
    an = DecryptingTlsAnalyzer(keys, _app_for_tls)
    f = Feeder(an)  # type: ignore[arg-type]
    _handshake(f, v2_hello())
    an.close(f.ts + MS)
    assert an.info.decrypted and an.info.decrypt_error is None, an.warnings
    assert [(r.path, r.status, r.estimated) for r in an.requests] == [("/v2", 204, False)]


def test_malformed_sslv2_hello_is_a_warning() -> None:
    f = Feeder(TlsAnalyzer())
    bad = bytearray(v2_hello())
    bad[8] = 0x40  # challenge length that does not match
    f.send(0, bytes(bad))
    an = f.close()
    assert an.info.client_hello_ns is None
    assert any("SSLv2" in w for w in an.warnings)
