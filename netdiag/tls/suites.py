"""What each decryptable cipher suite needs: record protection, key sizes, hashes.

One :class:`CipherSpec` per suite id in :data:`SUITES`. Only suites whose record
protection the ``cryptography`` package provides are listed: the TLS 1.3 suites,
and for TLS 1.0-1.2 the AES-GCM, AES-CCM, ChaCha20-Poly1305 and AES-CBC suites
(with HMAC-SHA1, -SHA256 or -SHA384) of the RSA, DHE-RSA, ECDHE-RSA and
ECDHE-ECDSA key exchanges. The key exchange does not matter for decryption (the
key log gives the master secret), it is only in the name. RC4, 3DES, Camellia,
ARIA, the PSK and export suites are left out: nothing current negotiates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class CipherSpec:
    """Record protection of one cipher suite."""

    name: str
    """IANA name, e.g. ``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``."""
    tls13: bool
    """A TLS 1.3 suite (HKDF key schedule, keys from the traffic secrets)."""
    kind: Literal["aead", "cbc"]
    """AEAD, or AES-CBC with an HMAC (MAC-then-encrypt, or RFC 7366 encrypt-then-MAC)."""
    aead: Literal["aes-gcm", "chacha20", "aes-ccm"] | None
    """The AEAD algorithm (None for CBC)."""
    key_len: int
    """Encryption key length in bytes."""
    iv_len: int
    """Fixed IV from the key schedule: 4 for TLS 1.2 GCM/CCM (the salt before the
    8-byte explicit nonce), 12 for ChaCha20 and every TLS 1.3 suite; for CBC the
    block size (16), which only TLS 1.0 takes from the key block (TLS 1.1+ carries
    an explicit IV in every record)."""
    mac: Literal["sha1", "sha256", "sha384"] | None
    """HMAC hash of the CBC suites (None for AEAD)."""
    mac_len: int
    """HMAC length (and MAC key length) in bytes, 0 for AEAD."""
    hash: Literal["sha256", "sha384"]
    """Hash of the TLS 1.2 PRF or of the TLS 1.3 HKDF."""
    tag_len: int = 16
    """AEAD tag length (8 for the ``*_CCM_8`` suites)."""

    @property
    def explicit_nonce_len(self) -> int:
        """Bytes before the ciphertext in a TLS 1.2 record: GCM/CCM nonce, CBC IV."""
        if self.tls13 or self.aead == "chacha20":
            return 0
        return 8 if self.kind == "aead" else 16


def _tls13(name: str, aead: Literal["aes-gcm", "chacha20", "aes-ccm"], key_len: int,
           hash_: Literal["sha256", "sha384"], tag_len: int = 16) -> CipherSpec:
    return CipherSpec(name, True, "aead", aead, key_len, 12, None, 0, hash_, tag_len)


def _gcm(name: str, key_len: int, hash_: Literal["sha256", "sha384"]) -> CipherSpec:
    return CipherSpec(name, False, "aead", "aes-gcm", key_len, 4, None, 0, hash_)


def _ccm(name: str, key_len: int, tag_len: int = 16) -> CipherSpec:
    return CipherSpec(name, False, "aead", "aes-ccm", key_len, 4, None, 0, "sha256", tag_len)


def _chacha(name: str) -> CipherSpec:
    return CipherSpec(name, False, "aead", "chacha20", 32, 12, None, 0, "sha256")


_MAC_LEN = {"sha1": 20, "sha256": 32, "sha384": 48}


def _cbc(name: str, key_len: int, mac: Literal["sha1", "sha256", "sha384"]) -> CipherSpec:
    return CipherSpec(name, False, "cbc", None, key_len, 16, mac, _MAC_LEN[mac],
                      "sha384" if mac == "sha384" else "sha256")


SUITES: dict[int, CipherSpec] = {
    # TLS 1.3 (RFC 8446 appendix B.4)
    0x1301: _tls13("TLS_AES_128_GCM_SHA256", "aes-gcm", 16, "sha256"),
    0x1302: _tls13("TLS_AES_256_GCM_SHA384", "aes-gcm", 32, "sha384"),
    0x1303: _tls13("TLS_CHACHA20_POLY1305_SHA256", "chacha20", 32, "sha256"),
    0x1304: _tls13("TLS_AES_128_CCM_SHA256", "aes-ccm", 16, "sha256"),
    0x1305: _tls13("TLS_AES_128_CCM_8_SHA256", "aes-ccm", 16, "sha256", tag_len=8),
    # AES-GCM (RFC 5288, RFC 5289)
    0x009C: _gcm("TLS_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x009D: _gcm("TLS_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0x009E: _gcm("TLS_DHE_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x009F: _gcm("TLS_DHE_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC02B: _gcm("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC02C: _gcm("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC02F: _gcm("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC030: _gcm("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    # ChaCha20-Poly1305 (RFC 7905)
    0xCCA8: _chacha("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    0xCCA9: _chacha("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    0xCCAA: _chacha("TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    # AES-CCM (RFC 6655, RFC 7251)
    0xC09C: _ccm("TLS_RSA_WITH_AES_128_CCM", 16),
    0xC09D: _ccm("TLS_RSA_WITH_AES_256_CCM", 32),
    0xC09E: _ccm("TLS_DHE_RSA_WITH_AES_128_CCM", 16),
    0xC09F: _ccm("TLS_DHE_RSA_WITH_AES_256_CCM", 32),
    0xC0A0: _ccm("TLS_RSA_WITH_AES_128_CCM_8", 16, 8),
    0xC0A1: _ccm("TLS_RSA_WITH_AES_256_CCM_8", 32, 8),
    0xC0AC: _ccm("TLS_ECDHE_ECDSA_WITH_AES_128_CCM", 16),
    0xC0AD: _ccm("TLS_ECDHE_ECDSA_WITH_AES_256_CCM", 32),
    0xC0AE: _ccm("TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8", 16, 8),
    0xC0AF: _ccm("TLS_ECDHE_ECDSA_WITH_AES_256_CCM_8", 32, 8),
    # AES-CBC (RFC 5246, RFC 4492, RFC 5289)
    0x002F: _cbc("TLS_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0035: _cbc("TLS_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x003C: _cbc("TLS_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x003D: _cbc("TLS_RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0x0033: _cbc("TLS_DHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0039: _cbc("TLS_DHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x0067: _cbc("TLS_DHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x006B: _cbc("TLS_DHE_RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0xC009: _cbc("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC00A: _cbc("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC013: _cbc("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC014: _cbc("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC023: _cbc("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC024: _cbc("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
    0xC027: _cbc("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC028: _cbc("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
}
"""Decryptable cipher suites by IANA code point."""


def cipher_spec(code: int) -> CipherSpec | None:
    """The spec of suite ``code``, None when it cannot be decrypted here."""
    return SUITES.get(code)
