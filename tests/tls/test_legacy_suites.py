"""Legacy TLS 1.0-1.2 cipher suites: the AES key exchanges added to the table,
Camellia, SEED and 3DES in CBC mode, RC4 and the NULL suites.

The records are built here, written from the RFCs with ``cryptography`` (its
``decrepit`` ciphers for Camellia, SEED, 3DES and RC4) under the key block of a
known master secret: TLS 1.0 (CBC IV from the key block, then chained from the last
ciphertext block), TLS 1.1/1.2 (an explicit IV in every CBC record),
MAC-then-encrypt and RFC 7366 encrypt-then-MAC, and several records per direction
so that the IV chaining and the RC4 keystream, which runs on across records, are
exercised. Every suite added is decrypted at least once; each family also goes
through every version and MAC mode, and a wrong MAC (or padding) must raise
:class:`DecryptError` and change nothing. Suites that are still not decrypted must
say why, and the TLS analyzer must then keep the keyless estimates. Python's own
OpenSSL (which still speaks Camellia and, at security level 0, the NULL suites)
gives real traffic for a few of them.
"""

from __future__ import annotations

import hmac
import ssl
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.decrepit.ciphers.algorithms import ARC4, SEED, Camellia, TripleDES
from cryptography.hazmat.primitives.ciphers import (
    BlockCipherAlgorithm,
    Cipher,
    algorithms,
    modes,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decrypt import _write_cert, check_transcript, decrypt_streams, run_traffic

import netdiag.tls.decrypt as decrypt_module
from netdiag.protocols.base import StreamAnalyzer
from netdiag.protocols.http1 import Http1Analyzer
from netdiag.protocols.tls_decrypt import DecryptingTlsAnalyzer
from netdiag.tls.decrypt import DecryptError, TlsDecryptor, prf_tls10, prf_tls12
from netdiag.tls.keylog import KeyLog
from netdiag.tls.names import cipher_name
from netdiag.tls.suites import SUITES, CipherSpec, unsupported_reason

CR = bytes(range(32))
SR = bytes(range(32, 64))
MASTER = bytes(range(100, 148))
TLS10, TLS11, TLS12 = 0x0301, 0x0302, 0x0303
VERSIONS = (TLS10, TLS11, TLS12)
MS = 1_000_000

# -- the suites added, by family ----------------------------------------------------------
AES_CBC = [
    0x0030, 0x0036, 0x003E, 0x0068,  # DH_DSS
    0x0031, 0x0037, 0x003F, 0x0069,  # DH_RSA
    0x0032, 0x0038, 0x0040, 0x006A,  # DHE_DSS
    0x0034, 0x003A, 0x006C, 0x006D,  # DH_anon
    0xC004, 0xC005, 0xC025, 0xC026,  # ECDH_ECDSA
    0xC00E, 0xC00F, 0xC029, 0xC02A,  # ECDH_RSA
    0xC018, 0xC019,                  # ECDH_anon
]
AES_GCM = [0x00A0, 0x00A1, 0x00A2, 0x00A3, 0x00A4, 0x00A5, 0x00A6, 0x00A7,
           0xC02D, 0xC02E, 0xC031, 0xC032]
CAMELLIA = [*range(0x0041, 0x0047), *range(0x0084, 0x008A), *range(0x00BA, 0x00C6),
            *range(0xC072, 0xC07A)]
SEED_CBC = [*range(0x0096, 0x009C)]
DES3 = [0x000A, 0x000D, 0x0010, 0x0013, 0x0016, 0x001B, 0xC003, 0xC008, 0xC00D, 0xC012,
        0xC017]
RC4 = [0x0004, 0x0005, 0x0018, 0xC002, 0xC007, 0xC00C, 0xC011, 0xC016]
NULL = [0x0001, 0x0002, 0x003B, 0xC001, 0xC006, 0xC00B, 0xC010, 0xC015]
FAMILIES = {"aes-cbc": AES_CBC, "aes-gcm": AES_GCM, "camellia": CAMELLIA, "seed": SEED_CBC,
            "3des": DES3, "rc4": RC4, "null": NULL}
ADDED = [code for codes in FAMILIES.values() for code in codes]


def secrets() -> dict[str, bytes]:
    keylog = KeyLog.parse(f"CLIENT_RANDOM {CR.hex()} {MASTER.hex()}\n".encode(), "test")
    return keylog.secrets_for(CR)


# -- the sending side, from the RFCs ------------------------------------------------------
_BLOCK_CIPHERS: dict[str, Callable[[bytes], BlockCipherAlgorithm]] = {
    "aes": algorithms.AES, "camellia": Camellia, "seed": SEED, "3des": TripleDES}


def key_block(spec: CipherSpec, version: int) -> list[bytes]:
    """Client and server MAC keys, keys and IVs (RFC 5246 section 6.3)."""
    sizes = [spec.mac_len] * 2 + [spec.key_len] * 2 + [spec.iv_len] * 2
    seed = SR + CR
    if version == TLS12:
        block = prf_tls12(MASTER, b"key expansion", seed, sum(sizes), spec.hash)
    else:
        block = prf_tls10(MASTER, b"key expansion", seed, sum(sizes))
    out, p = [], 0
    for n in sizes:
        out.append(block[p:p + n])
        p += n
    return out


class Sealer:
    """One direction's record protection: builds the record bodies it would send."""

    def __init__(self, spec: CipherSpec, version: int, direction: int, etm: bool) -> None:
        parts = key_block(spec, version)
        self.spec = spec
        self.version = version
        self.mac_key = parts[direction]
        self.key = parts[2 + direction]
        self.iv = parts[4 + direction]
        self.etm = etm and spec.kind == "cbc"
        self.seq = 0
        self.chain = self.iv
        """TLS 1.0 CBC: the IV of the next record (the key block's, then the last
        ciphertext block)."""
        self.used = 0
        """RC4: keystream bytes the records so far used."""

    def _mac(self, ctype: int, data: bytes) -> bytes:
        header = struct.pack("!QBHH", self.seq, ctype, self.version, len(data))
        assert self.spec.mac is not None
        return hmac.new(self.mac_key, header + data, self.spec.mac).digest()

    def _cbc(self, iv: bytes, data: bytes) -> bytes:
        enc = Cipher(_BLOCK_CIPHERS[self.spec.cipher](self.key), modes.CBC(iv)).encryptor()
        return enc.update(data) + enc.finalize()

    def seal(self, ctype: int, plain: bytes, *, extra_pad: int = 0, bad: str = "") -> bytes:
        """The body of the next record carrying ``plain``.

        ``extra_pad``: CBC padding blocks beyond the shortest. ``bad``: ``mac`` (a
        wrong MAC) or ``padding`` (padding bytes that disagree); such a record does not
        advance this sender, so the good one may follow at the same place.
        """
        spec = self.spec
        chain, used = self.chain, self.used
        if spec.kind == "aead":
            explicit = self.seq.to_bytes(8, "big")
            aad = struct.pack("!QBHH", self.seq, ctype, self.version, len(plain))
            sealed = AESGCM(self.key).encrypt(self.iv + explicit, plain, aad)
            if bad:
                sealed = sealed[:-1] + bytes((sealed[-1] ^ 1,))
            body = explicit + sealed
        elif spec.kind == "cbc":
            bl = spec.block_len
            explicit_iv = self.version >= TLS11

            def pad(data: bytes) -> bytes:
                n = (bl - (len(data) + 1) % bl) % bl + extra_pad * bl
                assert n <= 255
                padding = bytes((n,)) * (n + 1)
                if bad == "padding":
                    padding = bytes((n ^ 1,)) + padding[1:]
                return data + padding

            iv = bytes((self.seq * 13 + i + 1) & 0xFF for i in range(bl)) if explicit_iv \
                else chain
            if self.etm:
                encrypted = self._cbc(iv, pad(plain))
                body = (iv if explicit_iv else b"") + encrypted
                mac = self._mac(ctype, body)
                if bad == "mac":
                    mac = bytes((mac[0] ^ 1,)) + mac[1:]
                body += mac
            else:
                mac = self._mac(ctype, plain)
                if bad == "mac":
                    mac = bytes((mac[0] ^ 1,)) + mac[1:]
                encrypted = self._cbc(iv, pad(plain + mac))
                body = (iv if explicit_iv else b"") + encrypted
            chain = encrypted[-bl:]
        else:
            mac = self._mac(ctype, plain)
            if bad:
                mac = mac[:-1] + bytes((mac[-1] ^ 1,))
            body = plain + mac
            if spec.kind == "stream":
                # the keystream from the start, minus what the earlier records used
                keystream = Cipher(ARC4(self.key), None).encryptor().update(
                    bytes(used + len(body)))[used:]
                body = bytes(a ^ b for a, b in zip(body, keystream, strict=True))
                used += len(body)
            else:
                assert spec.kind == "null"
        if not bad:
            self.seq += 1
            self.chain, self.used = chain, used
        return body


def _pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


FINISHED = b"\x14\x00\x00\x0c" + bytes(range(12))
SCRIPT: list[tuple[int, int, bytes, int]] = [
    # direction, content type, plaintext, extra CBC padding blocks
    (0, 22, FINISHED, 0),
    (1, 22, FINISHED[::-1], 1),
    (0, 23, b"GET /legacy HTTP/1.1\r\nHost: old.test\r\n\r\n", 0),
    (1, 23, b"HTTP/1.1 200 OK\r\ncontent-length: 17400\r\n\r\n", 0),
    (1, 23, _pattern(16384, 1), 0),  # a full record
    (1, 23, _pattern(1000, 2), 3),
    (1, 23, b"", 0),                  # empty records are legal (the CBC countermeasure)
    (0, 23, b"x", 0),                 # 1/n-1 record splitting
    (0, 23, _pattern(15, 3), 2),
    (0, 23, _pattern(16, 4), 0),
    (1, 23, _pattern(17, 5), 0),
    (0, 21, b"\x01\x00", 0),          # close_notify
    (1, 21, b"\x01\x00", 0),
]


def run_script(code: int, version: int, etm: bool,
               script: list[tuple[int, int, bytes, int]] = SCRIPT) -> TlsDecryptor:
    spec = SUITES[code]
    dec = TlsDecryptor(secrets(), code, version, CR, SR, encrypt_then_mac=etm)
    assert dec.encrypt_then_mac is (etm and spec.kind == "cbc")
    senders = (Sealer(spec, version, 0, etm), Sealer(spec, version, 1, etm))
    dec.change_cipher_spec(0)
    dec.change_cipher_spec(1)
    for direction, ctype, plain, extra in script:
        body = senders[direction].seal(ctype, plain, extra_pad=extra)
        assert dec.decrypt(direction, ctype, version, body) == (ctype, plain)
    assert dec.records(0) == sum(1 for d, *_ in script if d == 0)
    assert dec.records(1) == sum(1 for d, *_ in script if d == 1)
    return dec


def _mode(i: int, code: int) -> tuple[int, bool]:
    """A version and a MAC mode for the ``i``-th suite added: spread over all of them,
    TLS 1.2 for the suites that need it (AEAD, SHA-256 and SHA-384 HMACs)."""
    spec = SUITES[code]
    version = TLS12 if spec.kind == "aead" or spec.mac in ("sha256", "sha384") \
        else VERSIONS[i % 3]
    return version, (i // 3) % 2 == 1


EACH = [(code, *_mode(i, code)) for i, code in enumerate(ADDED)]


# -- the table ----------------------------------------------------------------------------
def test_families_add_the_suites_and_no_aria() -> None:
    assert {family: len(codes) for family, codes in FAMILIES.items()} == {
        "aes-cbc": 26, "aes-gcm": 12, "camellia": 32, "seed": 6, "3des": 11, "rc4": 8,
        "null": 8}
    assert len(set(ADDED)) == len(ADDED) == 103
    assert all(code in SUITES for code in ADDED)
    assert not [spec.name for spec in SUITES.values() if "ARIA" in spec.name]
    assert not [spec.name for spec in SUITES.values()
                if "CAMELLIA" in spec.name and "GCM" in spec.name]


def _expected(name: str) -> dict[str, Any]:
    """What a TLS 1.0-1.2 suite's name says about its record protection."""
    cipher = name.split("_WITH_")[1]
    if "_GCM_" in cipher or cipher.endswith(("_CCM", "_CCM_8")) or "CHACHA20" in cipher:
        return {"kind": "aead", "mac": None}
    mac = {"MD5": "md5", "SHA": "sha1", "SHA256": "sha256",
           "SHA384": "sha384"}[cipher.rsplit("_", 1)[1]]
    if cipher.startswith("NULL_"):
        return {"kind": "null", "cipher": "null", "key_len": 0, "iv_len": 0, "mac": mac,
                "block_len": 0}
    if cipher.startswith("RC4_128_"):
        return {"kind": "stream", "cipher": "rc4", "key_len": 16, "iv_len": 0, "mac": mac,
                "block_len": 0}
    algorithm = cipher.split("_")[0]
    block = 8 if algorithm == "3DES" else 16
    key_len = {"3DES": 24, "SEED": 16}.get(algorithm) or (32 if "_256_" in cipher else 16)
    return {"kind": "cbc", "cipher": algorithm.lower(), "key_len": key_len, "iv_len": block,
            "mac": mac, "block_len": block}


def test_suite_table_follows_the_names() -> None:
    for code, spec in SUITES.items():
        assert spec.name == cipher_name(code)
        if spec.tls13:
            continue
        expected = _expected(spec.name)
        assert {key: getattr(spec, key) for key in expected} == expected, spec.name
        assert spec.hash == ("sha384" if spec.name.endswith("SHA384") else "sha256")
        if spec.mac is not None:
            assert spec.mac_len == {"md5": 16, "sha1": 20, "sha256": 32, "sha384": 48}[spec.mac]
        else:
            assert spec.mac_len == 0
        assert spec.explicit_nonce_len == {"cbc": spec.block_len, "aead": 8, "stream": 0,
                                           "null": 0}[spec.kind] or spec.cipher == "chacha20"


# -- every suite added, decrypted ---------------------------------------------------------
@pytest.mark.parametrize(("code", "version", "etm"), EACH,
                         ids=[f"{c:04x}-{v:04x}-{'etm' if e else 'mte'}" for c, v, e in EACH])
def test_each_added_suite_decrypts(code: int, version: int, etm: bool) -> None:
    run_script(code, version, etm)


REPRESENTATIVES = {"aes-cbc": [0xC004, 0xC02A], "camellia": [0x0084, 0xC073],
                   "seed": [0x0096], "3des": [0x000A], "rc4": [0x0004, 0x0005],
                   "null": [0x0001, 0x0002]}
MATRIX = [(code, version, etm) for codes in REPRESENTATIVES.values() for code in codes
          for version in VERSIONS for etm in (False, True)]


@pytest.mark.parametrize(("code", "version", "etm"), MATRIX,
                         ids=[f"{c:04x}-{v:04x}-{'etm' if e else 'mte'}" for c, v, e in MATRIX])
def test_every_version_and_mac_mode(code: int, version: int, etm: bool) -> None:
    """TLS 1.0 chains its CBC IVs, 1.1/1.2 send them; RC4 and NULL ignore encrypt-then-MAC
    (RFC 7366 defines it for block ciphers only)."""
    run_script(code, version, etm)


def test_3des_records_are_multiples_of_8_bytes() -> None:
    spec = SUITES[0x000A]
    assert (spec.block_len, spec.iv_len, spec.key_len, spec.explicit_nonce_len) == (8, 8, 24, 8)
    for version in VERSIONS:
        for etm in (False, True):
            sender = Sealer(spec, version, 0, etm)
            dec = TlsDecryptor(secrets(), 0x000A, version, CR, SR, encrypt_then_mac=etm)
            dec.change_cipher_spec(0)
            odd = 0
            for n in range(3, 40, 4):
                body = sender.seal(23, _pattern(n, n))
                encrypted = len(body) - (20 if etm else 0)
                assert encrypted % 8 == 0
                odd += encrypted % 16 == 8  # not a multiple of 16: 8-byte blocks indeed
                assert dec.decrypt(0, 23, version, body) == (23, _pattern(n, n))
            assert odd >= 4


def test_tls10_iv_chains_from_the_last_ciphertext_block() -> None:
    """A TLS 1.0 record encrypted under the key block's IV again (not the previous
    record's last block) does not authenticate; nor does an RC4 record that restarts
    the keystream."""
    for code in (0x0041, 0x000A):
        spec = SUITES[code]
        dec = TlsDecryptor(secrets(), code, TLS10, CR, SR)
        dec.change_cipher_spec(0)
        sender = Sealer(spec, TLS10, 0, False)
        assert dec.decrypt(0, 23, TLS10, sender.seal(23, b"first")) == (23, b"first")
        sender.chain = sender.iv
        with pytest.raises(DecryptError, match="record 2 from client failed to authenticate"):
            dec.decrypt(0, 23, TLS10, sender.seal(23, b"second"))
    dec = TlsDecryptor(secrets(), 0x0005, TLS12, CR, SR)
    dec.change_cipher_spec(1)
    sender = Sealer(SUITES[0x0005], TLS12, 1, False)
    assert dec.decrypt(1, 23, TLS12, sender.seal(23, b"first")) == (23, b"first")
    sender.used = 0
    with pytest.raises(DecryptError, match="record 2 from server failed to authenticate"):
        dec.decrypt(1, 23, TLS12, sender.seal(23, b"second"))


def test_null_suites_carry_the_plaintext_in_clear() -> None:
    spec = SUITES[0x0002]
    sender = Sealer(spec, TLS12, 0, False)
    body = sender.seal(23, b"GET / HTTP/1.1\r\n\r\n")
    assert body.startswith(b"GET / HTTP/1.1\r\n\r\n") and len(body) == 18 + 20


# -- failures -----------------------------------------------------------------------------
BAD = [(code, version, etm, bad)
       for code in (0xC00F, 0x0045, 0x009A, 0xC008, 0xC02D, 0xC011, 0x0018, 0x003B, 0x0001)
       for version, etm in ((TLS10, False), (TLS11, True), (TLS12, False), (TLS12, True))
       if SUITES[code].kind != "aead" or version == TLS12
       for bad in (("mac", "padding") if SUITES[code].kind == "cbc" else ("mac",))]


@pytest.mark.parametrize(("code", "version", "etm", "bad"), BAD,
                         ids=[f"{c:04x}-{v:04x}-{'etm' if e else 'mte'}-{b}"
                              for c, v, e, b in BAD])
def test_a_wrong_mac_raises_and_changes_nothing(code: int, version: int, etm: bool,
                                                bad: str) -> None:
    spec = SUITES[code]
    dec = TlsDecryptor(secrets(), code, version, CR, SR, encrypt_then_mac=etm)
    senders = (Sealer(spec, version, 0, etm), Sealer(spec, version, 1, etm))
    dec.change_cipher_spec(0)
    dec.change_cipher_spec(1)
    for i, (direction, ctype, plain, extra) in enumerate(SCRIPT):
        sender = senders[direction]
        if i in (2, 5):  # the third record from the client, the third from the server
            wrong = sender.seal(ctype, plain, extra_pad=extra, bad=bad)
            side = ("client", "server")[direction]
            with pytest.raises(DecryptError, match=f"record {dec.records(direction) + 1} "
                                                   f"from {side} failed to authenticate"):
                dec.decrypt(direction, ctype, version, wrong)
        body = sender.seal(ctype, plain, extra_pad=extra)
        assert dec.decrypt(direction, ctype, version, body) == (ctype, plain)


@pytest.mark.parametrize("code", [0x0041, 0x000A, 0x0004, 0x0002])
def test_records_too_short_or_misaligned_fail_cleanly(code: int) -> None:
    for version in VERSIONS:
        dec = TlsDecryptor(secrets(), code, version, CR, SR)
        dec.change_cipher_spec(0)
        for n in (0, 1, 7, 8, 15, 16, 17, 20, 31, 33):
            try:
                dec.decrypt(0, 23, version, _pattern(n, n))
            except DecryptError as e:
                assert "failed to authenticate" in str(e)
            else:  # only a NULL record can be valid by chance, and never is here
                pytest.fail(f"{n} random bytes decrypted")


@pytest.mark.parametrize(("code", "why"), [
    (0xC03C, "the cryptography package has no ARIA cipher"),
    (0xC050, "the cryptography package has no ARIA cipher"),
    (0xC07A, "the cryptography package has no Camellia-GCM"),
    (0x0003, "export key derivation is not implemented"),
    (0x008A, "PSK suites are not implemented"),
    (0x0000, "it is the initial state, not a negotiated suite"),
    (0x0007, "IDEA suites are not implemented"),
    (0x0009, "single-DES suites are not implemented"),
])
def test_suites_left_out_say_why(code: int, why: str) -> None:
    assert code not in SUITES
    assert unsupported_reason(cipher_name(code)) == why
    with pytest.raises(DecryptError) as info:
        TlsDecryptor(secrets(), code, TLS12, CR, SR)
    assert str(info.value) == (f"cipher suite {cipher_name(code)} is not supported for "
                               f"decryption ({why})")


def test_unknown_suite_message_is_unchanged() -> None:
    with pytest.raises(DecryptError) as info:
        TlsDecryptor(secrets(), 0xFFEE, TLS12, CR, SR)
    assert str(info.value) == "cipher suite 0xffee is not supported for decryption"


def test_added_gcm_suites_need_tls12() -> None:
    with pytest.raises(DecryptError, match=r"TLS_ECDH_RSA_WITH_AES_128_GCM_SHA256 needs TLS 1\.2"):
        TlsDecryptor(secrets(), 0xC031, TLS11, CR, SR)


@pytest.mark.parametrize(("code", "cipher"), [(0x0096, "seed"), (0x0004, "rc4"),
                                              (0x000A, "3des")])
def test_a_cipher_openssl_lacks_is_a_decrypt_error(monkeypatch: pytest.MonkeyPatch, code: int,
                                                   cipher: str) -> None:
    def no_cipher(*args: object, **kwargs: object) -> Any:
        raise UnsupportedAlgorithm("not in this OpenSSL")

    monkeypatch.setattr(decrypt_module, "Cipher", no_cipher)
    with pytest.raises(DecryptError, match=f"cannot run {cipher} here"):
        TlsDecryptor(secrets(), code, TLS12, CR, SR)


def _fuzz_decryptors() -> list[TlsDecryptor]:
    out = []
    for code, version, etm in [(0x000A, TLS10, False), (0x000A, TLS12, True),
                               (0x0084, TLS11, False), (0xC073, TLS12, True),
                               (0x0004, TLS10, False), (0xC011, TLS12, False),
                               (0x0001, TLS12, False), (0x003B, TLS10, True)]:
        dec = TlsDecryptor(secrets(), code, version, CR, SR, encrypt_then_mac=etm)
        dec.change_cipher_spec(0)
        dec.change_cipher_spec(1)
        out.append(dec)
    return out


FUZZ_DECRYPTORS = _fuzz_decryptors()


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(FUZZ_DECRYPTORS) - 1), direction=st.integers(0, 1),
       ctype=st.one_of(st.integers(20, 24), st.integers(-1, 300)),
       version=st.one_of(st.sampled_from(VERSIONS), st.integers(-1, 0x10001)),
       fragment=st.one_of(st.binary(max_size=80),
                          st.integers(0, 0x10100).map(lambda n: bytes(n)),
                          st.binary(min_size=8, max_size=8).map(lambda b: b * 9)))
def test_fuzz_random_records_raise_only_decrypt_error(which: int, direction: int, ctype: int,
                                                      version: int, fragment: bytes) -> None:
    try:
        inner, plain = FUZZ_DECRYPTORS[which].decrypt(direction, ctype, version, fragment)
    except DecryptError:
        return
    assert isinstance(inner, int) and isinstance(plain, bytes)


def test_repr_shows_no_key_material() -> None:
    dec = run_script(0x0005, TLS10, False, SCRIPT[:4])
    text = repr(dec)
    assert "TLS_RSA_WITH_RC4_128_SHA" in text
    for part in key_block(SUITES[0x0005], TLS10):
        assert not part or part.hex()[:12] not in text


# -- through the TLS analyzer -------------------------------------------------------------
def _record(ctype: int, body: bytes, version: int = TLS12) -> bytes:
    return struct.pack("!BHH", ctype, version, len(body)) + body


def _handshake(mtype: int, body: bytes) -> bytes:
    return bytes((mtype,)) + len(body).to_bytes(3, "big") + body


def _hellos(code: int, version: int, etm: bool) -> tuple[bytes, bytes]:
    exts = struct.pack("!HH", 22, 0) if etm else b""
    client = (struct.pack("!H", version) + CR + b"\x00" + struct.pack("!HH", 2, code)
              + b"\x01\x00" + struct.pack("!H", len(exts)) + exts)
    server = (struct.pack("!H", version) + SR + b"\x20" + b"\x22" * 32
              + struct.pack("!HB", code, 0) + struct.pack("!H", len(exts)) + exts)
    return _handshake(1, client), _handshake(2, server)


def _app(alpn: str | None, first: bytes) -> StreamAnalyzer | None:
    return Http1Analyzer(tls=True)


def converse(code: int, version: int, *, etm: bool = False,
             bad_at: int | None = None) -> DecryptingTlsAnalyzer:
    """A TLS 1.0-1.2 connection with three HTTP/1.1 exchanges through the analyzer;
    ``bad_at``: the request whose record carries a wrong MAC."""
    keys = KeyLog.parse(f"CLIENT_RANDOM {CR.hex()} {MASTER.hex()}\n".encode(), "test")
    an = DecryptingTlsAnalyzer(keys, _app)
    spec = SUITES.get(code)
    client = server = None
    if spec is not None:
        client, server = Sealer(spec, version, 0, etm), Sealer(spec, version, 1, etm)
    ts = 0

    def send(direction: int, data: bytes) -> None:
        nonlocal ts
        ts += MS
        an.feed(direction, ts, data, ts // MS)

    def seal(direction: int, ctype: int, plain: bytes, bad: str = "") -> bytes:
        sender = client if direction == 0 else server
        if sender is None:  # a suite the table lacks: any bytes will do
            return _record(ctype, plain + bytes(48), version)
        return _record(ctype, sender.seal(ctype, plain, bad=bad), version)

    ch, sh = _hellos(code, version, etm)
    ccs = _record(20, b"\x01", version)
    send(0, _record(22, ch, TLS10))
    send(1, _record(22, sh + _handshake(11, bytes(600)) + _handshake(14, b""), version))
    send(0, _record(22, _handshake(16, b"\x00\x80" + b"\x05" * 128), version) + ccs
         + seal(0, 22, _handshake(20, bytes(12))))
    send(1, ccs + seal(1, 22, _handshake(20, b"\x0d" * 12)))
    for i, path in enumerate(["/one", "/two", "/three"]):
        req = f"GET {path} HTTP/1.1\r\nHost: old.test\r\n\r\n".encode()
        send(0, seal(0, 23, req, "mac" if bad_at == i else ""))
        body = f"hello {path} ".encode() * 30
        send(1, seal(1, 23, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body))
    an.close(ts + MS)
    return an


@pytest.mark.parametrize(("code", "version", "etm"), [
    (0x0044, TLS10, False), (0x0084, TLS11, True), (0x0099, TLS12, True),
    (0x000A, TLS10, True), (0xC012, TLS12, False), (0x0004, TLS10, False),
    (0xC011, TLS12, True), (0x0001, TLS11, False), (0xC02D, TLS12, False),
    (0x0040, TLS12, True),
])
def test_analyzer_reads_the_requests_exactly(code: int, version: int, etm: bool) -> None:
    an = converse(code, version, etm=etm)
    assert an.info.decrypted and an.info.decrypt_error is None, an.warnings
    assert [(r.method, r.path, r.status, r.estimated) for r in an.requests] == [
        ("GET", p, 200, False) for p in ("/one", "/two", "/three")]


@pytest.mark.parametrize("code", [0xC03C, 0xC07C, 0x0003])
def test_analyzer_says_why_and_keeps_the_estimates(code: int) -> None:
    an = converse(code, TLS12)
    assert an.info.decrypt_error == (f"cipher suite {cipher_name(code)} is not supported for "
                                     f"decryption ({unsupported_reason(cipher_name(code))})")
    assert not an.info.decrypted
    assert an.requests and all(r.estimated for r in an.requests)


@pytest.mark.parametrize("code", [0x0045, 0x000A, 0x0005, 0x0002])
def test_analyzer_stops_at_a_wrong_mac_and_estimates_the_rest(code: int) -> None:
    an = converse(code, TLS10, bad_at=1)
    error = an.info.decrypt_error
    assert error is not None and "from client failed to authenticate" in error
    assert [r.path for r in an.requests if not r.estimated] == ["/one"]
    assert len(an.requests) >= 2


# -- real traffic from Python's OpenSSL ---------------------------------------------------
@pytest.fixture(scope="module")
def rsa_cert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    return {"rsa": _write_cert(tmp_path_factory.mktemp("legacy-certs"), "rsa")}


@pytest.mark.parametrize(("version", "ciphers", "code", "etm"), [
    ("TLSv1_2", "ECDHE-RSA-CAMELLIA128-SHA256", 0xC076, True),
    ("TLSv1_2", "ECDHE-RSA-CAMELLIA256-SHA384", 0xC077, False),
    ("TLSv1_2", "CAMELLIA256-SHA", 0x0084, False),
    ("TLSv1", "CAMELLIA128-SHA", 0x0041, True),
    ("TLSv1_1", "CAMELLIA256-SHA", 0x0084, True),
    ("TLSv1_2", "NULL-SHA256", 0x003B, None),
    ("TLSv1", "ECDHE-RSA-NULL-SHA", 0xC010, None),
    ("TLSv1_2", "NULL-MD5", 0x0001, None),
])
def test_real_traffic(tmp_path: Path, rsa_cert: dict[str, tuple[str, str]], version: str,
                      ciphers: str, code: int, etm: bool | None) -> None:
    try:
        t = run_traffic(tmp_path, rsa_cert, max=version, min="TLSv1",
                        ciphers=ciphers + ":@SECLEVEL=0", etm=False if etm is False else None)
    except (ssl.SSLError, RuntimeError) as e:
        pytest.skip(f"this OpenSSL will not negotiate {ciphers} with {version}: {e}")
    assert t.cipher == ciphers
    out = decrypt_streams(t.client, t.server, t.keylog)
    assert out.suite == code and cipher_name(code) == SUITES[code].name
    assert out.version == {"TLSv1": TLS10, "TLSv1_1": TLS11, "TLSv1_2": TLS12}[version]
    if etm is not None:
        assert out.etm is etm
    # OpenSSL negotiates encrypt-then-MAC for the NULL suites too: no IV and no padding,
    # so the MAC covers the same bytes either way
    t.cipher = cipher_name(code)  # check_transcript knows only the AES OpenSSL names
    check_transcript(t, out)
