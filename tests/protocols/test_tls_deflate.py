"""TLS 1.2 with DEFLATE compression (RFC 3749), decrypted with keys (issue 12).

OpenSSL no longer negotiates compression, so the conversation is built here: a TLS 1.2
handshake choosing TLS_RSA_WITH_AES_128_GCM_SHA256 and compression method 1, then
every record after ChangeCipherSpec compressed with one zlib stream per direction
(``Z_SYNC_FLUSH`` per record, as RFC 3749 says) and sealed with AES-GCM under the key
block of a known master secret. The requests must come out exactly, and a stream that
does not inflate must stop decryption with a reason, keeping the keyless estimates.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from test_tls import CCS, MS, Feeder, client_hello, handshake, record, vec8

from netdiag.pipeline import _app_for_tls
from netdiag.protocols.tls_decrypt import DecryptingTlsAnalyzer
from netdiag.tls.decrypt import prf_tls12
from netdiag.tls.keylog import KeyLog

CLIENT_RANDOM = bytes(range(32))
SERVER_RANDOM = b"\x11" * 32
MASTER = bytes(range(100, 148))
SUITE = 0x009C  # TLS_RSA_WITH_AES_128_GCM_SHA256


def server_hello(compression: int) -> bytes:
    body = (b"\x03\x03" + SERVER_RANDOM + vec8(b"\x22" * 32)
            + struct.pack("!HB", SUITE, compression) + struct.pack("!H", 0))
    return handshake(2, body)


class Side:
    """One direction's record protection and compression."""

    def __init__(self, key: bytes, salt: bytes, compress: bool) -> None:
        self.aead = AESGCM(key)
        self.salt = salt
        self.seq = 0
        self.z = zlib.compressobj() if compress else None

    def seal(self, ctype: int, plain: bytes, corrupt: bool = False) -> bytes:
        if self.z is not None:
            plain = self.z.compress(plain) + self.z.flush(zlib.Z_SYNC_FLUSH)
        if corrupt:
            plain = b"\xff" * len(plain)
        explicit = self.seq.to_bytes(8, "big")
        aad = explicit + bytes([ctype]) + b"\x03\x03" + len(plain).to_bytes(2, "big")
        body = explicit + self.aead.encrypt(self.salt + explicit, plain, aad)
        self.seq += 1
        return record(ctype, body)


def sides(compress: bool, client_random: bytes = CLIENT_RANDOM) -> tuple[Side, Side]:
    block = prf_tls12(MASTER, b"key expansion", SERVER_RANDOM + client_random, 40, "sha256")
    ckey, skey, civ, siv = block[:16], block[16:32], block[32:36], block[36:40]
    return Side(ckey, civ, compress), Side(skey, siv, compress)


def conversation(f: Feeder, *, compression: int = 1, corrupt_at: int | None = None) -> None:
    client, server = sides(compression == 1)
    f.send(0, record(22, client_hello(rnd=CLIENT_RANDOM), version=0x0301))
    f.send(1, record(22, server_hello(compression) + handshake(11, b"\x00" * 600)
                     + handshake(14, b"")))
    f.send(0, record(22, handshake(16, b"\x00\x80" + b"\x05" * 128)) + CCS
           + client.seal(22, handshake(20, b"\x0c" * 12)))
    f.send(1, CCS + server.seal(22, handshake(20, b"\x0d" * 12)))
    for i, path in enumerate(["/deflate", "/again", "/third"]):
        req = f"GET {path} HTTP/1.1\r\nHost: api.test\r\nUser-Agent: t\r\n\r\n".encode()
        f.send(0, client.seal(23, req, corrupt=corrupt_at == i))
        body = f"hello {path} ".encode() * 20
        f.send(1, server.seal(23, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
                              + body), step_ns=3 * MS)


def analyzer() -> DecryptingTlsAnalyzer:
    keys = KeyLog.parse(f"CLIENT_RANDOM {CLIENT_RANDOM.hex()} {MASTER.hex()}\n".encode(), "t")
    return DecryptingTlsAnalyzer(keys, _app_for_tls)


def test_deflate_records_are_inflated_and_read_exactly() -> None:
    an = analyzer()
    f = Feeder(an)  # type: ignore[arg-type]
    conversation(f)
    an.close(f.ts + MS)
    info = an.info
    assert info.decrypted and info.decrypt_error is None, an.warnings
    reqs = an.requests
    assert [(r.method, r.path, r.status, r.estimated) for r in reqs] == [
        ("GET", p, 200, False) for p in ("/deflate", "/again", "/third")]
    assert all(r.first_byte_ns is not None and r.first_byte_ns > r.ts_ns for r in reqs)
    assert not any("alert" in w or "handshake message" in w for w in an.warnings)


def test_uncompressed_twin_gives_the_same_requests() -> None:
    plain, deflated = analyzer(), analyzer()
    for an, method in ((plain, 0), (deflated, 1)):
        f = Feeder(an)  # type: ignore[arg-type]
        conversation(f, compression=method)
        an.close(f.ts + MS)
    assert [r.to_json() for r in plain.requests] == [r.to_json() for r in deflated.requests]


@pytest.mark.parametrize("corrupt_at", [0, 2])
def test_a_stream_that_does_not_inflate_stops_with_a_reason(corrupt_at: int) -> None:
    an = analyzer()
    f = Feeder(an)  # type: ignore[arg-type]
    conversation(f, corrupt_at=corrupt_at)
    an.close(f.ts + MS)
    assert an.info.decrypt_error is not None and "DEFLATE" in an.info.decrypt_error
    assert [r.path for r in an.requests if not r.estimated] == (
        ["/deflate", "/again"][:corrupt_at])
    assert an.requests  # later ones estimated, not lost


def test_unknown_compression_method_says_why_and_keeps_estimates() -> None:
    an = analyzer()
    f = Feeder(an)  # type: ignore[arg-type]
    conversation(f, compression=64)
    an.close(f.ts + MS)
    assert an.info.decrypt_error == "compression method 64 (only DEFLATE, 1, is known)"
    assert an.requests and all(r.estimated for r in an.requests)
