"""Record decryption against real TLS traffic.

Real traffic: Python's ``ssl`` module (OpenSSL) runs a client and a server over
in-memory BIOs, the client writes a genuine NSS key log (``keylog_filename``),
and the bytes each side wrote are cut into records and decrypted here; the
plaintext must be exactly what ``SSLObject.write`` was given. TLS 1.3 cipher
suites cannot be chosen from Python 3.11, so those runs happen in a child process
whose ``OPENSSL_CONF`` sets ``Ciphersuites``; a real KeyUpdate is sent by calling
OpenSSL's ``SSL_key_update`` through ctypes in a child process (skipped when the
SSL pointer cannot be found and checked). Third-party captures with their key
logs (``../shared/captures/thirdparty``) are decrypted record by record when
present. Vectors: RFC 8448 traffic keys, the TLS 1.2 PRF test vector, the TLS 1.0
PRF; 0-RTT records (which Python cannot send) are built with ``cryptography``.

Run ``python tests/tls/test_decrypt.py CONFIG_JSON`` to generate one transcript
(what the child process does).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import json
import os
import random
import ssl
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dpkt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import netdiag.tls.decrypt as decrypt_mod
from netdiag.tls.decrypt import (
    DecryptError,
    TlsDecryptor,
    hkdf_expand,
    hkdf_expand_label,
    prf_tls10,
    prf_tls12,
    traffic_key_iv,
)
from netdiag.tls.keylog import KeyLog
from netdiag.tls.names import cipher_name
from netdiag.tls.suites import SUITES, CipherSpec

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
SHARED = HERE.parents[3] / "shared" / "captures" / "thirdparty"

HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
SSL_OP_NO_ENCRYPT_THEN_MAC = 1 << 19
CLOSE_NOTIFY = b"\x01\x00"


def _pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


MESSAGES: list[tuple[int, bytes]] = [
    (0, b"GET /v1/messages HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    (1, b"HTTP/1.1 200 OK\r\ncontent-length: 40000\r\n\r\n"),
    (1, _pattern(40000, 1)),          # several full 16 KB records
    (0, b"x"),                         # a 1-byte record
    (0, _pattern(16384, 2)),          # exactly one full record
    (1, b"data: {\"token\": \"hi\"}\n\n"),
]


# -- certificates -----------------------------------------------------------------------
def _write_cert(directory: Path, kind: str) -> tuple[str, str]:
    key: Any = (rsa.generate_private_key(65537, 2048) if kind == "rsa"
                else ec.generate_private_key(ec.SECP256R1()))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256()))
    cert_path = directory / f"{kind}.pem"
    key_path = directory / f"{kind}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    directory = tmp_path_factory.mktemp("certs")
    return {"rsa": _write_cert(directory, "rsa"), "ec": _write_cert(directory, "ec")}


# -- generating real traffic ------------------------------------------------------------
def _libssl_key_update(obj: ssl.SSLObject, ctx: ssl.SSLContext) -> bool:
    """Ask OpenSSL for a KeyUpdate (update_requested) on ``obj``; False if not possible.

    CPython 3.11 keeps ``SSL *`` right after the weak socket reference in its
    ``_ssl._SSLSocket`` and ``SSL_CTX *`` first in ``SSLContext``; both are read and
    checked against each other and the protocol version before use.
    """
    name = ctypes.util.find_library("ssl")
    if name is None or sys.implementation.name != "cpython":
        return False
    lib = ctypes.CDLL(name)
    if lib.OpenSSL_version_num() != ssl.OPENSSL_VERSION_NUMBER:
        return False
    lib.SSL_get_SSL_CTX.argtypes = [ctypes.c_void_p]
    lib.SSL_get_SSL_CTX.restype = ctypes.c_void_p
    lib.SSL_version.argtypes = [ctypes.c_void_p]
    lib.SSL_key_update.argtypes = [ctypes.c_void_p, ctypes.c_int]
    word = ctypes.sizeof(ctypes.c_void_p)
    ssl_ptr = ctypes.c_void_p.from_address(id(obj._sslobj) + 3 * word).value  # type: ignore[attr-defined]
    ctx_ptr = ctypes.c_void_p.from_address(id(ctx) + 2 * word).value
    if not ssl_ptr or not ctx_ptr or lib.SSL_get_SSL_CTX(ssl_ptr) != ctx_ptr:
        return False
    if lib.SSL_version(ssl_ptr) != 0x0304:
        return False
    return lib.SSL_key_update(ssl_ptr, 1) == 1


def generate(cfg: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One in-memory TLS connection; returns the bytes each side wrote (hex).

    ``previous``: the result of an earlier call, whose contexts and session are
    reused (resumption).
    """
    if previous is not None:
        return _connect(cfg, previous["contexts"][0], previous["contexts"][1],
                        previous["session"])
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(cfg["cert"], cfg["key"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1
        for ctx in (cctx, sctx):
            ctx.maximum_version = getattr(ssl.TLSVersion, cfg.get("max", "TLSv1_3"))
            if cfg.get("min"):
                ctx.minimum_version = getattr(ssl.TLSVersion, cfg["min"])
            if cfg.get("ciphers"):
                ctx.set_ciphers(cfg["ciphers"])
            if cfg.get("etm") is False:
                ctx.options |= SSL_OP_NO_ENCRYPT_THEN_MAC
    if cfg.get("server_curve"):
        sctx.set_ecdh_curve(cfg["server_curve"])  # forces a HelloRetryRequest
    cctx.keylog_filename = cfg["keylog"]
    return _connect(cfg, cctx, sctx, None)


def _connect(cfg: dict[str, Any], cctx: ssl.SSLContext, sctx: ssl.SSLContext,
             session: Any) -> dict[str, Any]:
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = cctx.wrap_bio(c_in, c_out, server_hostname="localhost", session=session)
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    streams = (bytearray(), bytearray())

    def pump() -> bool:
        moved = False
        data = c_out.read()
        if data:
            streams[0].extend(data)
            s_in.write(data)
            moved = True
        data = s_out.read()
        if data:
            streams[1].extend(data)
            c_in.write(data)
            moved = True
        return moved

    for _ in range(50):
        done = True
        for obj in (client, server):
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                done = False
        pump()
        if done:
            break
    else:
        raise RuntimeError("handshake did not finish")

    def send(direction: int, data: bytes) -> None:
        sender, receiver = (client, server) if direction == 0 else (server, client)
        sender.write(data)
        got = bytearray()
        while len(got) < len(data):
            pump()
            try:
                got += receiver.read(1 << 17)
            except ssl.SSLWantReadError:
                if not pump():
                    raise
        assert bytes(got) == data

    messages = [(d, bytes.fromhex(h)) for d, h in cfg["messages"]]
    update_at = cfg.get("key_update_at")
    key_update = False
    for i, (direction, data) in enumerate(messages):
        if i == update_at:
            key_update = _libssl_key_update(client, cctx)
            if not key_update:
                return {"key_update": False}
        send(direction, data)
    for obj in (client, server, client):
        with contextlib.suppress(ssl.SSLWantReadError):
            obj.unwrap()
        pump()
    return {"streams": [streams[0].hex(), streams[1].hex()], "version": client.version(),
            "cipher": client.cipher()[0], "reused": client.session_reused,
            "key_update": key_update, "session": client.session, "contexts": (cctx, sctx)}


@dataclass
class Transcript:
    client: bytes
    server: bytes
    keylog: KeyLog
    sent: list[tuple[int, bytes]]
    cipher: str
    version: str
    reused: bool = False
    raw: Any = None

    def expected(self, direction: int) -> bytes:
        return b"".join(data for d, data in self.sent if d == direction)


_OPENSSL_CONF = """openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
Ciphersuites = {suites}
"""


def run_traffic(tmp_path: Path, certs: dict[str, tuple[str, str]], *, kind: str = "rsa",
                ciphersuites: str | None = None, key_update_at: int | None = None,
                messages: list[tuple[int, bytes]] | None = None, previous: Any = None,
                name: str = "keys.log", **cfg: Any) -> Transcript:
    messages = MESSAGES if messages is None else messages
    cert, key = certs[kind]
    keylog_path = tmp_path / name
    cfg.update(cert=cert, key=key, keylog=str(keylog_path),
               messages=[(d, data.hex()) for d, data in messages])
    if ciphersuites is None and key_update_at is None:
        out = generate(cfg, previous)
    else:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        if ciphersuites is not None:
            conf = tmp_path / "openssl.cnf"
            conf.write_text(_OPENSSL_CONF.format(suites=ciphersuites))
            env["OPENSSL_CONF"] = str(conf)
        if key_update_at is not None:
            cfg["key_update_at"] = key_update_at
        proc = subprocess.run([sys.executable, str(HERE), json.dumps(cfg)], env=env,
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        if key_update_at is not None and (proc.returncode < 0 or '"key_update": false'
                                          in proc.stdout):
            pytest.skip("cannot call SSL_key_update through ctypes here")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
    return Transcript(bytes.fromhex(out["streams"][0]), bytes.fromhex(out["streams"][1]),
                      KeyLog.from_file(keylog_path), messages, out["cipher"], out["version"],
                      out["reused"], out)


# -- reading records back ---------------------------------------------------------------
Record = tuple[int, int, bytes]


def split_records(stream: bytes) -> tuple[list[Record], int]:
    """TLS records of one direction, and the bytes left over (a partial record)."""
    out: list[Record] = []
    i = 0
    while len(stream) - i >= 5:
        n = (stream[i + 3] << 8) | stream[i + 4]
        if len(stream) - i - 5 < n:
            break
        out.append((stream[i], (stream[i + 1] << 8) | stream[i + 2], stream[i + 5:i + 5 + n]))
        i += 5 + n
    return out, len(stream) - i


class Messages:
    """Handshake messages cut from a direction's handshake-type plaintext."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        self.buf += data
        while len(self.buf) >= 4:
            n = int.from_bytes(self.buf[1:4], "big")
            if len(self.buf) < 4 + n:
                return
            mtype = self.buf[0]
            body = bytes(self.buf[4:4 + n])
            del self.buf[:4 + n]
            yield mtype, body


@dataclass
class Hello:
    random: bytes
    suite: int
    version: int
    extensions: dict[int, bytes]


def parse_hello(body: bytes, server: bool) -> Hello:
    """ClientHello / ServerHello body (after the 4-byte handshake header)."""
    legacy = int.from_bytes(body[0:2], "big")
    random = body[2:34]
    p = 34
    p += 1 + body[p]                                  # session id
    if server:
        suite = int.from_bytes(body[p:p + 2], "big")
        p += 3                                        # suite, compression
    else:
        suite = 0
        p += 2 + int.from_bytes(body[p:p + 2], "big")  # suites
        p += 1 + body[p]                              # compression methods
    exts: dict[int, bytes] = {}
    if p < len(body):
        end = p + 2 + int.from_bytes(body[p:p + 2], "big")
        p += 2
        while p < end:
            etype = int.from_bytes(body[p:p + 2], "big")
            n = int.from_bytes(body[p + 2:p + 4], "big")
            exts[etype] = body[p + 4:p + 4 + n]
            p += 4 + n
        assert p == end
    version = legacy
    if server and 43 in exts:
        version = int.from_bytes(exts[43], "big")
    return Hello(random, suite, version, exts)


def hellos(crec: list[Record], srec: list[Record]) -> tuple[Hello, Hello, bool]:
    """The ClientHello, the (real) ServerHello, and whether a HelloRetryRequest came."""
    ch = sh = None
    hrr = False
    msgs = Messages()
    for ctype, _, frag in crec:
        if ctype == 22:
            for mtype, body in msgs.feed(frag):
                if mtype == 1 and ch is None:
                    ch = parse_hello(body, server=False)
            if ch is not None:
                break
    msgs = Messages()
    for ctype, _, frag in srec:
        if ctype == 23 or sh is not None:
            break
        if ctype == 22:
            for mtype, body in msgs.feed(frag):
                if mtype == 2:
                    hello = parse_hello(body, server=True)
                    if hello.random == HRR_RANDOM:
                        hrr = True
                    else:
                        sh = hello
                        break
    assert ch is not None and sh is not None
    return ch, sh, hrr


@dataclass
class Decrypted:
    tls13: bool
    suite: int
    version: int
    hrr: bool
    etm: bool
    app: tuple[bytearray, bytearray] = field(default_factory=lambda: (bytearray(), bytearray()))
    handshake: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    alerts: tuple[list[bytes], list[bytes]] = field(default_factory=lambda: ([], []))
    records: list[int] = field(default_factory=lambda: [0, 0])
    app_records: list[int] = field(default_factory=lambda: [0, 0])
    leftover: tuple[int, int] = (0, 0)
    errors: list[str | None] = field(default_factory=lambda: [None, None])
    client_random: bytes = b""


def decrypt_streams(client: bytes, server: bytes, keylog: KeyLog, *,
                    follow_events: bool = True) -> Decrypted:
    """Decrypt both directions of one connection as the TLS analyzer would.

    ``follow_events``: call handshake_done / key_update on the Finished and
    KeyUpdate messages read; without, the decryptor must find the next key itself.
    Every encrypted record must authenticate (DecryptError propagates), except
    that a direction whose secret the key log lacks stops there (``errors``).
    """
    crec, cleft = split_records(client)
    srec, sleft = split_records(server)
    ch, sh, hrr = hellos(crec, srec)
    etm = 22 in ch.extensions and 22 in sh.extensions
    secrets = keylog.secrets_for(ch.random)
    assert secrets, "no secrets in the key log for this client random"
    dec = TlsDecryptor(secrets, sh.suite, sh.version, ch.random, sh.random,
                       encrypt_then_mac=etm)
    out = Decrypted(dec.tls13, sh.suite, sh.version, hrr, etm, leftover=(cleft, sleft),
                    client_random=ch.random)
    for direction, records in enumerate((crec, srec)):
        msgs = Messages()
        ccs = False
        for ctype, version, frag in records:
            if ctype == 20 and not ccs and not dec.tls13:
                assert frag == b"\x01"
                dec.change_cipher_spec(direction)
                ccs = True
                continue
            try:
                inner, plain = dec.decrypt(direction, ctype, version, frag)
            except DecryptError as e:
                if "the key log lacks" not in str(e):
                    raise
                out.errors[direction] = str(e)
                break
            encrypted = ctype == 23 if dec.tls13 else ccs
            if not encrypted:
                assert (inner, plain) == (ctype, frag)
                if ctype == 20:  # TLS 1.3 compatibility CCS
                    continue
            else:
                out.records[direction] += 1
            if inner == 22:
                for mtype, _ in msgs.feed(plain):
                    out.handshake[direction].append(mtype)
                    if follow_events and encrypted and dec.tls13:
                        if mtype == 20:
                            dec.handshake_done(direction)
                        elif mtype == 24:
                            dec.key_update(direction)
            elif inner == 23:
                out.app[direction].extend(plain)
                out.app_records[direction] += 1
            elif inner == 21:
                out.alerts[direction].append(plain)
        if out.errors[direction] is None:
            assert not msgs.buf, "a handshake message was left incomplete"
            assert dec.records(direction) == out.records[direction]
    return out


def check_transcript(t: Transcript, out: Decrypted) -> None:
    assert out.errors == [None, None]
    assert bytes(out.app[0]) == t.expected(0)
    assert bytes(out.app[1]) == t.expected(1)
    assert out.alerts == ([CLOSE_NOTIFY], [CLOSE_NOTIFY])
    assert out.leftover == (0, 0)
    assert cipher_name(out.suite) == t.cipher or _openssl_name(out.suite) == t.cipher
    # each side's Finished was decrypted
    assert 20 in out.handshake[0] and 20 in out.handshake[1]
    if out.tls13:
        assert t.version == "TLSv1.3"
        assert out.handshake[1][:2] == [2, 8] or out.handshake[1][:3] == [2, 2, 8]
        if not t.reused:
            assert 11 in out.handshake[1] and 15 in out.handshake[1]
        assert 4 in out.handshake[1]  # NewSessionTicket, under application keys


_OPENSSL_NAMES = {
    0xC02F: "ECDHE-RSA-AES128-GCM-SHA256", 0xC030: "ECDHE-RSA-AES256-GCM-SHA384",
    0xCCA8: "ECDHE-RSA-CHACHA20-POLY1305", 0xCCA9: "ECDHE-ECDSA-CHACHA20-POLY1305",
    0xC02B: "ECDHE-ECDSA-AES128-GCM-SHA256", 0x009C: "AES128-GCM-SHA256",
    0xC0AC: "ECDHE-ECDSA-AES128-CCM", 0xC0AF: "ECDHE-ECDSA-AES256-CCM8",
    0xC09D: "AES256-CCM", 0xC013: "ECDHE-RSA-AES128-SHA", 0xC014: "ECDHE-RSA-AES256-SHA",
    0x003D: "AES256-SHA256", 0xC028: "ECDHE-RSA-AES256-SHA384", 0x002F: "AES128-SHA",
    0xC023: "ECDHE-ECDSA-AES128-SHA256", 0x0035: "AES256-SHA", 0xC027: "ECDHE-RSA-AES128-SHA256",
}


def _openssl_name(code: int) -> str:
    return _OPENSSL_NAMES.get(code, "?")


# -- TLS 1.3, real traffic --------------------------------------------------------------
def test_tls13_default_suite_real_traffic(tmp_path: Path, certs: Any) -> None:
    t = run_traffic(tmp_path, certs)
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert out.tls13 and out.suite == 0x1302 and not out.hrr
    check_transcript(t, out)
    assert out.app_records[1] >= 4  # 40000 bytes need three full records and more


@pytest.mark.parametrize(("suite", "code"), [
    ("TLS_AES_128_GCM_SHA256", 0x1301),
    ("TLS_AES_256_GCM_SHA384", 0x1302),
    ("TLS_CHACHA20_POLY1305_SHA256", 0x1303),
    ("TLS_AES_128_CCM_SHA256", 0x1304),
    ("TLS_AES_128_CCM_8_SHA256", 0x1305),
])
def test_tls13_each_suite_real_traffic(tmp_path: Path, certs: Any, suite: str, code: int) -> None:
    t = run_traffic(tmp_path, certs, ciphersuites=suite)
    assert t.cipher == suite, "OPENSSL_CONF did not select the suite"
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert out.suite == code
    check_transcript(t, out)


def test_tls13_hello_retry_request_real_traffic(tmp_path: Path, certs: Any) -> None:
    t = run_traffic(tmp_path, certs, server_curve="prime256v1")
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert out.hrr, "the server did not send a HelloRetryRequest"
    check_transcript(t, out)


def test_tls13_without_handshake_events_finds_the_next_keys(tmp_path: Path,
                                                            certs: Any) -> None:
    t = run_traffic(tmp_path, certs)
    out = decrypt_streams(t.client, t.server, t.keylog, follow_events=False)
    check_transcript(t, out)


@pytest.mark.parametrize("follow_events", [True, False])
def test_tls13_key_update_real_traffic(tmp_path: Path, certs: Any, follow_events: bool) -> None:
    t = run_traffic(tmp_path, certs, key_update_at=3)
    out = decrypt_streams(t.client, t.server, t.keylog, follow_events=follow_events)
    # the client's KeyUpdate(update_requested) makes the server update too
    assert 24 in out.handshake[0] and 24 in out.handshake[1]
    check_transcript(t, out)


def test_tls13_resumption_real_traffic(tmp_path: Path, certs: Any) -> None:
    first = run_traffic(tmp_path, certs)
    again = run_traffic(tmp_path, certs, previous=first.raw)
    assert again.reused
    out = decrypt_streams(again.client, again.server, again.keylog)
    assert 11 not in out.handshake[1]  # no Certificate in a PSK handshake
    check_transcript(again, out)


# -- TLS 1.2 and older, real traffic ----------------------------------------------------
TLS12_CASES = [
    ("ECDHE-RSA-AES128-GCM-SHA256", "rsa", 0xC02F, None),
    ("ECDHE-RSA-AES256-GCM-SHA384", "rsa", 0xC030, None),
    ("ECDHE-RSA-CHACHA20-POLY1305", "rsa", 0xCCA8, None),
    ("ECDHE-ECDSA-AES128-GCM-SHA256", "ec", 0xC02B, None),
    ("ECDHE-ECDSA-CHACHA20-POLY1305", "ec", 0xCCA9, None),
    ("AES128-GCM-SHA256", "rsa", 0x009C, None),
    ("ECDHE-ECDSA-AES128-CCM", "ec", 0xC0AC, None),
    ("ECDHE-ECDSA-AES256-CCM8", "ec", 0xC0AF, None),
    ("AES256-CCM", "rsa", 0xC09D, None),
    ("ECDHE-RSA-AES128-SHA", "rsa", 0xC013, True),
    ("ECDHE-RSA-AES128-SHA", "rsa", 0xC013, False),
    ("ECDHE-RSA-AES256-SHA", "rsa", 0xC014, False),
    ("AES256-SHA256", "rsa", 0x003D, True),
    ("AES256-SHA256", "rsa", 0x003D, False),
    ("ECDHE-RSA-AES256-SHA384", "rsa", 0xC028, True),
    ("ECDHE-RSA-AES256-SHA384", "rsa", 0xC028, False),
    ("ECDHE-ECDSA-AES128-SHA256", "ec", 0xC023, False),
    ("AES128-SHA", "rsa", 0x002F, True),
]


@pytest.mark.parametrize(("ciphers", "kind", "code", "etm"), TLS12_CASES,
                         ids=[f"{c[0]}{'' if c[3] is None else '-etm' if c[3] else '-mte'}"
                              for c in TLS12_CASES])
def test_tls12_real_traffic(tmp_path: Path, certs: Any, ciphers: str, kind: str, code: int,
                            etm: bool | None) -> None:
    t = run_traffic(tmp_path, certs, kind=kind, max="TLSv1_2", ciphers=ciphers,
                    etm=False if etm is False else None)
    assert t.cipher == ciphers and t.version == "TLSv1.2"
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert not out.tls13 and out.suite == code and out.version == 0x0303
    if etm is not None:
        assert out.etm is etm  # OpenSSL offers encrypt-then-MAC unless told not to
    check_transcript(t, out)


@pytest.mark.parametrize(("version", "ciphers", "etm"), [
    ("TLSv1", "ECDHE-RSA-AES128-SHA", True),
    ("TLSv1", "ECDHE-RSA-AES128-SHA", False),
    ("TLSv1_1", "AES256-SHA", True),
    ("TLSv1_1", "AES256-SHA", False),
])
def test_tls10_tls11_real_traffic(tmp_path: Path, certs: Any, version: str, ciphers: str,
                                  etm: bool) -> None:
    try:
        t = run_traffic(tmp_path, certs, max=version, min="TLSv1",
                        ciphers=ciphers + ":@SECLEVEL=0", etm=None if etm else False)
    except (ssl.SSLError, RuntimeError) as e:
        pytest.skip(f"this OpenSSL will not speak {version}: {e}")
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert out.version == (0x0301 if version == "TLSv1" else 0x0302)
    assert out.etm is etm
    check_transcript(t, out)


def test_tls12_resumption_real_traffic(tmp_path: Path, certs: Any) -> None:
    first = run_traffic(tmp_path, certs, max="TLSv1_2", ciphers="ECDHE-RSA-AES128-GCM-SHA256")
    again = run_traffic(tmp_path, certs, previous=first.raw)
    assert again.reused
    out = decrypt_streams(again.client, again.server, again.keylog)
    assert 11 not in out.handshake[1]  # abbreviated handshake: the server's CCS comes first
    check_transcript(again, out)


# -- third-party captures ---------------------------------------------------------------
def _packets(path: Path) -> Iterator[tuple[bytes, int]]:
    with path.open("rb") as f:
        head = f.read(4)
        f.seek(0)
        reader: Any = (dpkt.pcapng.Reader(f) if head == b"\x0a\x0d\x0d\x0a"
                       else dpkt.pcap.Reader(f))
        link = reader.datalink()
        for _, buf in reader:
            yield buf, link


def _ip_of(buf: bytes, link: int) -> Any:
    if link == 0:  # DLT_NULL: 4-byte address family, host order
        payload = buf[4:]
    elif link == 1:
        return dpkt.ethernet.Ethernet(buf).data
    elif link == 113:
        return dpkt.sll.SLL(buf).data
    else:
        raise AssertionError(f"link type {link}")
    if payload[:1] and payload[0] >> 4 == 6:
        return dpkt.ip6.IP6(payload)
    return dpkt.ip.IP(payload)


def tcp_connections(path: Path) -> list[tuple[bytes, bytes]]:
    """(client bytes, server bytes) of every TCP connection, reassembled by sequence."""
    segments: dict[tuple[Any, ...], list[tuple[int, bytes, int]]] = {}
    order: list[tuple[Any, ...]] = []
    for buf, link in _packets(path):
        ip = _ip_of(buf, link)
        tcp = getattr(ip, "data", None)
        if not isinstance(tcp, dpkt.tcp.TCP):
            continue
        key = (bytes(ip.src), tcp.sport, bytes(ip.dst), tcp.dport)
        if key not in segments:
            segments[key] = []
            order.append(key)
        segments[key].append((tcp.seq, bytes(tcp.data), tcp.flags))
    conns = []
    seen = set()
    for key in order:
        src, sport, dst, dport = key
        back = (dst, dport, src, sport)
        if key in seen:
            continue
        seen.update((key, back))
        streams = [_reassemble(segments.get(k, [])) for k in (key, back)]
        syn_from_key = any(f & dpkt.tcp.TH_SYN and not f & dpkt.tcp.TH_ACK
                           for _, _, f in segments[key])
        syn_from_back = any(f & dpkt.tcp.TH_SYN and not f & dpkt.tcp.TH_ACK
                            for _, _, f in segments.get(back, []))
        if syn_from_back or (not syn_from_key and streams[1][:1] == b"\x16"
                             and streams[1][5:6] == b"\x01"):
            streams.reverse()
        conns.append((streams[0], streams[1]))
    return conns


def _reassemble(segs: list[tuple[int, bytes, int]]) -> bytes:
    syn = [s for s, _, f in segs if f & dpkt.tcp.TH_SYN]
    data = [(s, d) for s, d, _ in segs if d]
    if not data:
        return b""
    base = (syn[0] + 1) if syn else min(s for s, _ in data)
    out = bytearray()
    for seq, payload in sorted(data, key=lambda x: (x[0] - base) % (1 << 32)):
        off = (seq - base) % (1 << 32)
        assert off <= len(out), f"gap in the stream at {len(out)}"
        out += payload[len(out) - off:]
    return bytes(out)


CAPTURES = [
    ("illustrated_tls13.pcap", "illustrated_tls13.keys", b"ping", b"pong", 0),
    ("illustrated_tls12.pcap", "illustrated_tls12.keys", b"ping", b"pong", 0),
    ("zeek_tls12_stream_keylog.pcap", "zeek_tls12_stream_keylog.keys", b"GET ", b"HTTP/1.", 0),
    ("cryptohack_tls3_h2.pcapng", "cryptohack_tls3_h2.keys", b"PRI * HTTP/2.0\r\n", b"", 0),
    # one connection where the client sends an encrypted alert instead of its Finished
    ("hotplace_http1_tls13.pcapng", "hotplace_http.keys", b"GET ", b"HTTP/1.1", 1),
]


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared third-party captures not present")
@pytest.mark.parametrize(("capture", "keys", "client_starts", "server_starts", "expect_aborted"),
                         CAPTURES, ids=[c[0] for c in CAPTURES])
def test_third_party_captures_decrypt(capture: str, keys: str, client_starts: bytes,
                                      server_starts: bytes, expect_aborted: int) -> None:
    if not (SHARED / capture).exists() or not (SHARED / keys).exists():
        pytest.skip(f"{capture} not present")
    keylog = KeyLog.from_file(SHARED / keys)
    decrypted = aborted = 0
    for client, server in tcp_connections(SHARED / capture):
        if client[:1] != b"\x16" or not server:
            continue
        out = decrypt_streams(client, server, keylog)
        assert out.errors == [None, None]
        assert out.records[0] > 0 and out.records[1] > 0
        assert 20 in out.handshake[1]
        if 20 not in out.handshake[0]:
            # the client gave up during the handshake: its encrypted alert is read
            assert out.alerts[0] and out.alerts[0][0][0] == 2  # fatal
            assert not out.app[0]
            aborted += 1
            continue
        assert bytes(out.app[0]).startswith(client_starts)
        assert out.app[1] and bytes(out.app[1]).startswith(server_starts)
        decrypted += 1
    assert decrypted >= 1
    assert aborted == expect_aborted


# -- vectors ----------------------------------------------------------------------------
@pytest.mark.parametrize(("secret", "key", "iv"), [
    # RFC 8448 section 3: server/client handshake, server/client application secrets
    ("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38",
     "3fce516009c21727d0f2e4e86ee403bc", "5d313eb2671276ee13000b30"),
    ("b3eddb126e067f35a780b3abf45e2d8f3b1a950738f52e9600746a0e27a55a21",
     "dbfaa693d1762c5b666af5d950258d01", "5bd3c71b836e0b76bb73265f"),
    ("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643",
     "9f02283b6c9c07efc26bb9f2ac92e356", "cf782b88dd83549aadf1e984"),
])
def test_rfc8448_traffic_keys(secret: str, key: str, iv: str) -> None:
    s = bytes.fromhex(secret)
    assert hkdf_expand_label(s, b"key", b"", 16, "sha256").hex() == key
    assert hkdf_expand_label(s, b"iv", b"", 12, "sha256").hex() == iv
    assert traffic_key_iv(s, 16, "sha256") == (bytes.fromhex(key), bytes.fromhex(iv))


def test_traffic_key_iv_is_hkdf_expand_label_s_key_and_iv() -> None:
    """The write key and IV derived from one prepared HMAC are HKDF-Expand-Label's, for
    every TLS 1.3 suite and for shapes it hands to the general path (unknown hash, key
    longer than the hash, secret longer than the hash's block)."""
    r = random.Random(8)
    shapes = {(spec.key_len, spec.hash) for spec in SUITES.values() if spec.tls13}
    assert {(16, "sha256"), (32, "sha384"), (32, "sha256")} <= shapes
    shapes |= {(24, "sha256"), (40, "sha256"), (16, "sha512"), (13, "sha256")}
    for key_len, hash_name in sorted(shapes):
        for n in (32, 48, 64, 65, 130):
            secret = r.randbytes(n)
            assert traffic_key_iv(secret, key_len, hash_name) == (
                hkdf_expand_label(secret, b"key", b"", key_len, hash_name),
                hkdf_expand_label(secret, b"iv", b"", 12, hash_name)), (key_len, hash_name, n)


def test_tls12_prf_vector() -> None:
    # the TLS 1.2 PRF (P_SHA256) test vector posted to the IETF TLS list
    out = prf_tls12(bytes.fromhex("9bbe436ba940f017b17652849a71db35"), b"test label",
                    bytes.fromhex("a0ba9f936cda311827a6f796ffd5198c"), 100)
    assert out.hex() == (
        "e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a6b301791e90d35c9"
        "c9a46b4e14baf9af0fa022f7077def17abfd3797c0564bab4fbc91666e9def9b97fce34f796789ba"
        "a48082d122ee42c5a72e5a5110fff70187347b66")


def test_tls10_prf_vector() -> None:
    assert prf_tls10(b"secret", b"label", b"seed", 20).hex() == \
        "b5baf4722b91851a8816d22ebd8c1d8cc2e94d55"


def test_hmac_and_hkdf_expand_are_the_standard_library_s() -> None:
    """The key schedule's own HMAC (two hash calls) is ``hmac.digest`` for every hash and
    key length (keys longer than the block are hashed first), and HKDF-Expand is RFC
    5869's for every output length (RFC 5869 test case 1 included)."""
    import hmac as std_hmac

    r = random.Random(5)
    for name in ("md5", "sha1", "sha256", "sha384", "sha512"):
        for n in (0, 1, 32, 48, 63, 64, 65, 127, 128, 129, 200):
            key, msg = r.randbytes(n), r.randbytes(r.choice((0, 5, 64, 300)))
            assert decrypt_mod._hmac(key, msg, name) == std_hmac.digest(key, msg, name)
    for length in (0, 1, 12, 32, 33, 48, 100, 255):
        prk, info = r.randbytes(32), r.randbytes(10)
        want, block, counter = b"", b"", 1
        while len(want) < length:
            block = std_hmac.digest(prk, block + info + bytes((counter,)), "sha256")
            want += block
            counter += 1
        assert hkdf_expand(prk, info, length, "sha256") == want[:length]
    okm = hkdf_expand(bytes.fromhex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844a"
                                    "d7c2b3e5"), bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"), 42,
                      "sha256")
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


# -- built records: 0-RTT, padding, errors ----------------------------------------------
CR = bytes(range(32))
SR = bytes(range(32, 64))


def _secrets13(hlen: int = 32, early: bool = False) -> dict[str, bytes]:
    labels = ["CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET",
              "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"]
    if early:
        labels.append("CLIENT_EARLY_TRAFFIC_SECRET")
    return {label: bytes([i + 1]) * hlen for i, label in enumerate(labels)}


def _aead(spec: CipherSpec, key: bytes) -> Any:
    if spec.aead == "aes-gcm":
        return AESGCM(key)
    if spec.aead == "chacha20":
        return ChaCha20Poly1305(key)
    return AESCCM(key, tag_length=spec.tag_len)


def seal13(code: int, secret: bytes, seq: int, inner: int, payload: bytes,
           pad: int = 0) -> bytes:
    """A TLS 1.3 record body, encrypted with ``cryptography`` directly."""
    spec = SUITES[code]
    key = hkdf_expand_label(secret, b"key", b"", spec.key_len, spec.hash)
    iv = int.from_bytes(hkdf_expand_label(secret, b"iv", b"", 12, spec.hash), "big")
    plain = payload + bytes((inner,)) + bytes(pad)
    n = len(plain) + spec.tag_len
    header = bytes((23, 3, 3, n >> 8, n & 0xFF))
    return _aead(spec, key).encrypt((iv ^ seq).to_bytes(12, "big"), plain, header)


def test_tls13_early_data_accepted() -> None:
    secrets = _secrets13(early=True)
    early = secrets["CLIENT_EARLY_TRAFFIC_SECRET"]
    hs = secrets["CLIENT_HANDSHAKE_TRAFFIC_SECRET"]
    app = secrets["CLIENT_TRAFFIC_SECRET_0"]
    dec = TlsDecryptor(secrets, 0x1301, 0x0304, CR, SR)
    recs = [seal13(0x1301, early, 0, 23, b"GET /early"),
            seal13(0x1301, early, 1, 23, b" more early"),
            seal13(0x1301, early, 2, 22, b"\x05\x00\x00\x00"),         # EndOfEarlyData
            seal13(0x1301, hs, 0, 22, b"\x14\x00\x00\x20" + bytes(32)),  # Finished
            seal13(0x1301, app, 0, 23, b"GET /after")]
    got = [dec.decrypt(0, 23, 0x0303, r) for r in recs[:4]]
    dec.handshake_done(0)
    got.append(dec.decrypt(0, 23, 0x0303, recs[4]))
    assert [g[0] for g in got] == [23, 23, 22, 22, 23]
    assert got[0][1] + got[1][1] == b"GET /early more early"
    assert got[4][1] == b"GET /after"


def test_tls13_early_data_rejected_moves_to_the_handshake_key() -> None:
    secrets = _secrets13(early=True)
    early = secrets["CLIENT_EARLY_TRAFFIC_SECRET"]
    hs = secrets["CLIENT_HANDSHAKE_TRAFFIC_SECRET"]
    dec = TlsDecryptor(secrets, 0x1303, 0x0304, CR, SR)
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1303, early, 0, 23, b"0rtt")) == (23, b"0rtt")
    # no EndOfEarlyData when the server rejected early data: the Finished follows
    fin = b"\x14\x00\x00\x20" + bytes(32)
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1303, hs, 0, 22, fin)) == (22, fin)
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1303, hs, 1, 21, b"\x01\x00")) == (21, b"\x01\x00")


def test_tls13_early_data_without_its_secret_can_be_skipped() -> None:
    with_early = _secrets13(early=True)
    secrets = {k: v for k, v in with_early.items() if k != "CLIENT_EARLY_TRAFFIC_SECRET"}
    early = with_early["CLIENT_EARLY_TRAFFIC_SECRET"]
    hs = secrets["CLIENT_HANDSHAKE_TRAFFIC_SECRET"]
    dec = TlsDecryptor(secrets, 0x1301, 0x0304, CR, SR)
    for seq in range(2):
        with pytest.raises(DecryptError, match=rf"^record {seq + 1} from client failed"):
            dec.decrypt(0, 23, 0x0303, seal13(0x1301, early, seq, 23, b"early"))
    fin = b"\x14\x00\x00\x20" + bytes(32)
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1301, hs, 0, 22, fin)) == (22, fin)


def test_tls13_padding_and_records_that_are_not_encrypted() -> None:
    secrets = _secrets13(hlen=48)
    shs = secrets["SERVER_HANDSHAKE_TRAFFIC_SECRET"]
    dec = TlsDecryptor(secrets, 0x1302, 0x0304, CR, SR)
    assert dec.tls13
    # plaintext records pass through and do not count
    assert dec.decrypt(1, 22, 0x0303, b"\x02\x00\x00\x00") == (22, b"\x02\x00\x00\x00")
    assert dec.decrypt(0, 20, 0x0303, b"\x01") == (20, b"\x01")
    assert dec.records(0) == dec.records(1) == 0
    rec = seal13(0x1302, shs, 0, 22, b"\x08\x00\x00\x02\x00\x00", pad=300)
    assert dec.decrypt(1, 23, 0x0303, rec) == (22, b"\x08\x00\x00\x02\x00\x00")
    empty = seal13(0x1302, shs, 1, 23, b"", pad=5)
    assert dec.decrypt(1, 23, 0x0303, empty) == (23, b"")
    only_zeros = seal13(0x1302, shs, 2, 0, b"", pad=10)
    with pytest.raises(DecryptError, match="record 3 from server has no content type"):
        dec.decrypt(1, 23, 0x0303, only_zeros)


def test_tls13_key_update_built_records() -> None:
    secrets = _secrets13()
    app = secrets["SERVER_TRAFFIC_SECRET_0"]
    upd = hkdf_expand_label(app, b"traffic upd", b"", 32, "sha256")
    upd2 = hkdf_expand_label(upd, b"traffic upd", b"", 32, "sha256")
    dec = TlsDecryptor(secrets, 0x1301, 0x0304, CR, SR)
    dec.handshake_done(1)
    dec.handshake_done(1)  # a second Finished (post-handshake auth) changes nothing
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, app, 0, 23, b"a")) == (23, b"a")
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, app, 1, 22, b"\x18\x00\x00\x01\x00"))[0] == 22
    dec.key_update(1)
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, upd, 0, 23, b"b")) == (23, b"b")
    # an unannounced update is found by trying the next generation once
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, upd2, 0, 23, b"c")) == (23, b"c")
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, upd2, 1, 23, b"d")) == (23, b"d")
    # a replayed old record fails and changes nothing
    with pytest.raises(DecryptError, match="record 6 from server failed to authenticate"):
        dec.decrypt(1, 23, 0x0303, seal13(0x1301, upd, 1, 23, b"x"))
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, upd2, 2, 23, b"e")) == (23, b"e")


MASTER = bytes(range(48))


@pytest.mark.parametrize("follow_events", [True, False])
def test_tls13_partial_key_log(follow_events: bool) -> None:
    full = _secrets13()
    secrets = {k: v for k, v in full.items() if k != "SERVER_TRAFFIC_SECRET_0"}
    dec = TlsDecryptor(secrets, 0x1301, 0x0304, CR, SR)
    fin = b"\x14\x00\x00\x20" + bytes(32)
    shs, sts = full["SERVER_HANDSHAKE_TRAFFIC_SECRET"], full["SERVER_TRAFFIC_SECRET_0"]
    assert dec.decrypt(1, 23, 0x0303, seal13(0x1301, shs, 0, 22, fin)) == (22, fin)
    if follow_events:
        dec.handshake_done(1)
        dec.key_update(1)  # nothing to update from: still missing
        match = "^record 2 from server cannot be decrypted: the key log lacks SERVER_TRAFFIC"
    else:
        match = (r"^record 2 from server failed to authenticate \(and the key log lacks "
                 r"SERVER_TRAFFIC_SECRET_0\)$")
    with pytest.raises(DecryptError, match=match):
        dec.decrypt(1, 23, 0x0303, seal13(0x1301, sts, 0, 23, b"response"))
    # the client direction does not depend on it
    chs, cts = full["CLIENT_HANDSHAKE_TRAFFIC_SECRET"], full["CLIENT_TRAFFIC_SECRET_0"]
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1301, chs, 0, 22, fin)) == (22, fin)
    dec.handshake_done(0)
    assert dec.decrypt(0, 23, 0x0303, seal13(0x1301, cts, 0, 23, b"GET /")) == (23, b"GET /")


def test_tls12_before_ccs_is_plaintext_and_renegotiation_stops() -> None:
    dec = TlsDecryptor({"CLIENT_RANDOM": MASTER}, 0xC02F, 0x0303, CR, SR)
    assert not dec.tls13
    assert dec.decrypt(0, 22, 0x0303, b"\x01\x00\x00\x00") == (22, b"\x01\x00\x00\x00")
    dec.handshake_done(0)  # meaningless in TLS 1.2: ignored
    dec.key_update(0)
    dec.change_cipher_spec(0)
    with pytest.raises(DecryptError, match="record 1 from client failed to authenticate"):
        dec.decrypt(0, 22, 0x0303, bytes(40))
    dec.change_cipher_spec(0)
    with pytest.raises(DecryptError, match="client renegotiated"):
        dec.decrypt(0, 23, 0x0303, bytes(40))


@pytest.mark.parametrize(("secrets", "suite", "version", "match"), [
    ({"CLIENT_RANDOM": MASTER}, 0xC03C, 0x0303, "ARIA_128_CBC_SHA256 is not supported"),
    ({"CLIENT_RANDOM": MASTER}, 0xFFEE, 0x0303, "0xffee is not supported"),
    ({"CLIENT_RANDOM": MASTER}, 0x1301, 0x0303, "is a TLS 1.3 cipher suite"),
    ({"CLIENT_RANDOM": MASTER}, 0xC02F, 0x0302, "needs TLS 1.2"),
    ({"CLIENT_RANDOM": MASTER}, 0x002F, 0x0300, "SSL 3.0 records cannot be decrypted"),
    ({"CLIENT_RANDOM": MASTER}, 0x1301, 0x7F1C, "draft 28"),
    ({}, 0xC02F, 0x0303, "lacks CLIENT_RANDOM"),
    ({"CLIENT_RANDOM": MASTER[:47]}, 0xC02F, 0x0303, "47 bytes"),
    (_secrets13(), 0xC02F, 0x0304, "not a TLS 1.3 cipher suite"),
    ({}, 0x1301, 0x0304, "lacks CLIENT_HANDSHAKE_TRAFFIC_SECRET, SERVER_HANDSHAKE"),
    (_secrets13(32), 0x1302, 0x0304, "is 32 bytes, TLS_AES_256_GCM_SHA384 needs 48"),
])
def test_cannot_decrypt(secrets: dict[str, bytes], suite: int, version: int,
                        match: str) -> None:
    with pytest.raises(DecryptError, match=match) as info:
        TlsDecryptor(secrets, suite, version, CR, SR)
    for secret in secrets.values():
        assert secret.hex()[:16] not in str(info.value)


def test_suite_table() -> None:
    assert len(SUITES) >= 30
    for code, spec in SUITES.items():
        if spec.cipher not in ("aes", "chacha20"):
            continue  # Camellia, SEED, 3DES, RC4, NULL: tests/tls/test_legacy_suites.py
        assert spec.name == cipher_name(code)
        assert spec.tls13 == (code >> 8 == 0x13)
        assert (spec.kind == "cbc") == (spec.aead is None) == (spec.mac is not None)
        if spec.tls13 or spec.aead == "chacha20":
            assert spec.iv_len == 12
        elif spec.kind == "aead":
            assert spec.iv_len == 4 and spec.explicit_nonce_len == 8
        else:
            assert spec.iv_len == 16 and spec.mac_len == {"sha1": 20, "sha256": 32,
                                                          "sha384": 48}[spec.mac or ""]
        assert spec.hash == ("sha384" if spec.name.endswith("SHA384") else "sha256")
        assert spec.key_len == (32 if "AES_256" in spec.name or "CHACHA20" in spec.name
                                else 16)
        assert spec.tag_len == (8 if "CCM_8" in spec.name else 16)


# -- fuzzing ----------------------------------------------------------------------------
def _fuzz_decryptors() -> list[tuple[str, TlsDecryptor]]:
    out = []
    for code in (0x1301, 0x1302, 0x1303, 0x1304, 0x1305):
        secrets = _secrets13(48 if SUITES[code].hash == "sha384" else 32, early=True)
        out.append((f"tls13-{code:04x}", TlsDecryptor(secrets, code, 0x0304, CR, SR)))
    for code, version, etm in [(0xC02F, 0x0303, False), (0xC030, 0x0303, False),
                               (0xCCA8, 0x0303, False), (0xC0AF, 0x0303, False),
                               (0xC013, 0x0303, False), (0xC013, 0x0303, True),
                               (0xC028, 0x0303, True), (0x002F, 0x0301, False),
                               (0x002F, 0x0301, True), (0x0035, 0x0302, False)]:
        dec = TlsDecryptor({"CLIENT_RANDOM": MASTER}, code, version, CR, SR,
                           encrypt_then_mac=etm)
        dec.change_cipher_spec(0)
        dec.change_cipher_spec(1)
        out.append((f"{code:04x}-{version:04x}-{etm}", dec))
    return out


FUZZ_DECRYPTORS = _fuzz_decryptors()


@settings(max_examples=400, deadline=None)
@given(which=st.integers(0, len(FUZZ_DECRYPTORS) - 1), direction=st.integers(0, 1),
       ctype=st.one_of(st.integers(20, 24), st.integers(-1, 300)),
       version=st.one_of(st.sampled_from([0x0301, 0x0303]), st.integers(-1, 0x10001)),
       fragment=st.one_of(st.binary(max_size=80),
                          st.integers(0, 18500).map(lambda n: bytes(n)),
                          st.binary(min_size=16, max_size=16).map(lambda b: b * 7)))
def test_fuzz_random_records_raise_only_decrypt_error(which: int, direction: int, ctype: int,
                                                      version: int, fragment: bytes) -> None:
    _, dec = FUZZ_DECRYPTORS[which]
    try:
        inner, plain = dec.decrypt(direction, ctype, version, fragment)
    except DecryptError:
        return
    assert isinstance(inner, int) and isinstance(plain, bytes)


@pytest.fixture(scope="module")
def fuzz_transcripts(tmp_path_factory: pytest.TempPathFactory,
                     certs: Any) -> list[Transcript]:
    tmp = tmp_path_factory.mktemp("fuzz")
    small = [(0, b"hello there"), (1, _pattern(3000, 5)), (0, b"bye")]
    out = []
    for i, cfg in enumerate([{}, {"max": "TLSv1_2", "ciphers": "ECDHE-RSA-AES128-GCM-SHA256"},
                             {"max": "TLSv1_2", "ciphers": "ECDHE-RSA-CHACHA20-POLY1305"},
                             {"max": "TLSv1_2", "ciphers": "ECDHE-RSA-AES128-SHA"},
                             {"max": "TLSv1_2", "ciphers": "AES256-SHA256", "etm": False}]):
        out.append(run_traffic(tmp, certs, messages=small, name=f"k{i}.log", **cfg))
    return out


def _encrypted_records(t: Transcript) -> tuple[TlsDecryptor, list[tuple[int, Record, bool]]]:
    """A fresh decryptor and the transcript's records in feed order, flagged encrypted."""
    crec, _ = split_records(t.client)
    srec, _ = split_records(t.server)
    ch, sh, _ = hellos(crec, srec)
    dec = TlsDecryptor(t.keylog.secrets_for(ch.random), sh.suite, sh.version, ch.random,
                       sh.random, encrypt_then_mac=22 in ch.extensions and 22 in sh.extensions)
    feed: list[tuple[int, Record, bool]] = []
    for direction, records in enumerate((crec, srec)):
        ccs = False
        for rec in records:
            if rec[0] == 20 and not dec.tls13 and not ccs:
                ccs = True
                feed.append((direction, rec, False))
                continue
            feed.append((direction, rec, rec[0] == 23 if dec.tls13 else ccs))
    return dec, feed


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_real_records_fail_cleanly_and_change_nothing(
        fuzz_transcripts: list[Transcript], data: st.DataObject) -> None:
    t = data.draw(st.sampled_from(fuzz_transcripts))
    dec, feed = _encrypted_records(t)
    targets = [i for i, (_, _, enc) in enumerate(feed) if enc]
    target = data.draw(st.sampled_from(targets))
    for direction, (ctype, version, frag), _ in feed[:target]:
        if ctype == 20 and not dec.tls13:
            dec.change_cipher_spec(direction)
        else:
            dec.decrypt(direction, ctype, version, frag)
    direction, (ctype, version, frag), _ = feed[target]
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "replace"]))
    if how == "flip":
        pos = data.draw(st.integers(0, len(frag) - 1))
        bit = data.draw(st.integers(0, 7))
        bad = frag[:pos] + bytes((frag[pos] ^ (1 << bit),)) + frag[pos + 1:]
    elif how == "truncate":
        bad = frag[:data.draw(st.integers(0, len(frag) - 1))]
    elif how == "extend":
        bad = frag + data.draw(st.binary(min_size=1, max_size=40))
    else:
        bad = data.draw(st.binary(max_size=len(frag) + 40).filter(lambda b: b != frag))
    before = dec.records(direction)
    with pytest.raises(DecryptError, match=r"failed to authenticate|no content type"):
        dec.decrypt(direction, ctype, version, bad)
    # the failure changed no key state: the genuine record still decrypts
    dec.decrypt(direction, ctype, version, frag)
    assert dec.records(direction) == before + 2


def test_repr_shows_no_key_material() -> None:
    secrets = _secrets13()
    dec = TlsDecryptor(secrets, 0x1301, 0x0304, CR, SR)
    text = repr(dec)
    assert "TLS_AES_128_GCM_SHA256" in text
    for secret in secrets.values():
        assert secret.hex()[:8] not in text


if __name__ == "__main__":
    result = generate(json.loads(sys.argv[1]))
    result.pop("session", None)
    result.pop("contexts", None)
    print(json.dumps(result))
