"""What each decryptable cipher suite needs: record protection, key sizes, hashes.

One :class:`CipherSpec` per suite id in :data:`SUITES`. Only suites whose record
protection the ``cryptography`` package provides (its ``decrepit`` module included)
are listed:

- the TLS 1.3 suites;
- AES-GCM, AES-CCM and ChaCha20-Poly1305 (TLS 1.2);
- AES-CBC, Camellia-CBC (128 and 256), SEED-CBC and 3DES-EDE-CBC (8-byte block)
  with HMAC-SHA1, -SHA256 or -SHA384, MAC-then-encrypt or RFC 7366 encrypt-then-MAC;
- RC4_128 with HMAC-MD5 or -SHA1 (a stream cipher: MAC-then-encrypt, the keystream
  runs on across the records of a direction);
- the NULL suites (no encryption, HMAC-MD5, -SHA1 or -SHA256 only);

each with the RSA, DH_DSS, DH_RSA, DHE_DSS, DHE_RSA, DH_anon, ECDH_ECDSA,
ECDHE_ECDSA, ECDH_RSA, ECDHE_RSA and ECDH_anon key exchanges IANA defines it for.
The key exchange does not matter for decryption (the key log gives the master
secret), it is only in the name.

Left out: ARIA (CBC and GCM) and Camellia-GCM, which ``cryptography`` does not
provide (``Cipher(Camellia(...), GCM(...))`` raises ``UnsupportedAlgorithm``); the
export suites (their weakened key derivation is not implemented); IDEA, DES and RC2;
the PSK, SRP and KRB5 key exchanges; SSL 3.0 (its MAC is not HMAC). The decryptor
names the reason when a connection uses one of them
(:func:`netdiag.tls.suites.unsupported_reason`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mac = Literal["md5", "sha1", "sha256", "sha384"]
"""HMAC hash of a CBC, RC4 or NULL suite."""
BlockCipher = Literal["aes", "camellia", "seed", "3des"]
"""Block cipher of a CBC suite."""


@dataclass(frozen=True, slots=True)
class CipherSpec:
    """Record protection of one cipher suite."""

    name: str
    """IANA name, e.g. ``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``."""
    tls13: bool
    """A TLS 1.3 suite (HKDF key schedule, keys from the traffic secrets)."""
    kind: Literal["aead", "cbc", "stream", "null"]
    """AEAD; a block cipher in CBC mode with an HMAC (MAC-then-encrypt, or RFC 7366
    encrypt-then-MAC); RC4 with an HMAC (MAC-then-encrypt); or no encryption, an
    HMAC only."""
    aead: Literal["aes-gcm", "chacha20", "aes-ccm"] | None
    """The AEAD algorithm (None for the other kinds)."""
    key_len: int
    """Encryption key length in bytes (0 for NULL)."""
    iv_len: int
    """Fixed IV from the key schedule: 4 for TLS 1.2 GCM/CCM (the salt before the
    8-byte explicit nonce), 12 for ChaCha20 and every TLS 1.3 suite; for CBC the
    block size (16, 8 for 3DES), which only TLS 1.0 takes from the key block (TLS
    1.1+ carries an explicit IV in every record); 0 for RC4 and NULL."""
    mac: Mac | None
    """HMAC hash of the CBC, RC4 and NULL suites (None for AEAD)."""
    mac_len: int
    """HMAC length (and MAC key length) in bytes, 0 for AEAD."""
    hash: Literal["sha256", "sha384"]
    """Hash of the TLS 1.2 PRF or of the TLS 1.3 HKDF."""
    tag_len: int = 16
    """AEAD tag length (8 for the ``*_CCM_8`` suites)."""
    cipher: Literal["aes", "camellia", "seed", "3des", "chacha20", "rc4", "null"] = "aes"
    """The cipher: the block cipher of a CBC suite, the AEAD's cipher, ``rc4`` or
    ``null``."""
    block_len: int = 16
    """CBC: the cipher's block size in bytes (16; 8 for 3DES), which the IV, the
    ciphertext length and the padding are multiples of; 0 for the other kinds."""

    @property
    def explicit_nonce_len(self) -> int:
        """Bytes before the ciphertext in a TLS 1.2 record: GCM/CCM nonce, CBC IV."""
        if self.tls13 or self.kind in ("stream", "null") or self.aead == "chacha20":
            return 0
        return 8 if self.kind == "aead" else self.block_len


def _tls13(name: str, aead: Literal["aes-gcm", "chacha20", "aes-ccm"], key_len: int,
           hash_: Literal["sha256", "sha384"], tag_len: int = 16) -> CipherSpec:
    return CipherSpec(name, True, "aead", aead, key_len, 12, None, 0, hash_, tag_len,
                      "chacha20" if aead == "chacha20" else "aes", 0)


def _gcm(name: str, key_len: int, hash_: Literal["sha256", "sha384"]) -> CipherSpec:
    return CipherSpec(name, False, "aead", "aes-gcm", key_len, 4, None, 0, hash_, block_len=0)


def _ccm(name: str, key_len: int, tag_len: int = 16) -> CipherSpec:
    return CipherSpec(name, False, "aead", "aes-ccm", key_len, 4, None, 0, "sha256", tag_len,
                      block_len=0)


def _chacha(name: str) -> CipherSpec:
    return CipherSpec(name, False, "aead", "chacha20", 32, 12, None, 0, "sha256",
                      cipher="chacha20", block_len=0)


_MAC_LEN: dict[Mac, int] = {"md5": 16, "sha1": 20, "sha256": 32, "sha384": 48}


def _prf(mac: Mac) -> Literal["sha256", "sha384"]:
    """TLS 1.2 PRF hash: SHA-384 for the ``*_SHA384`` suites, else SHA-256 (RFC 5246)."""
    return "sha384" if mac == "sha384" else "sha256"


def _cbc(name: str, key_len: int, mac: Mac, cipher: BlockCipher = "aes") -> CipherSpec:
    block = 8 if cipher == "3des" else 16
    return CipherSpec(name, False, "cbc", None, key_len, block, mac, _MAC_LEN[mac], _prf(mac),
                      cipher=cipher, block_len=block)


def _camellia(name: str, key_len: int, mac: Mac) -> CipherSpec:
    return _cbc(name, key_len, mac, "camellia")


def _seed(name: str) -> CipherSpec:
    return _cbc(name, 16, "sha1", "seed")


def _3des(name: str) -> CipherSpec:
    return _cbc(name, 24, "sha1", "3des")


def _rc4(name: str, mac: Mac) -> CipherSpec:
    return CipherSpec(name, False, "stream", None, 16, 0, mac, _MAC_LEN[mac], "sha256",
                      cipher="rc4", block_len=0)


def _null(name: str, mac: Mac) -> CipherSpec:
    return CipherSpec(name, False, "null", None, 0, 0, mac, _MAC_LEN[mac], _prf(mac),
                      cipher="null", block_len=0)


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
    0x00A0: _gcm("TLS_DH_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x00A1: _gcm("TLS_DH_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0x00A2: _gcm("TLS_DHE_DSS_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x00A3: _gcm("TLS_DHE_DSS_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0x00A4: _gcm("TLS_DH_DSS_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x00A5: _gcm("TLS_DH_DSS_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0x00A6: _gcm("TLS_DH_anon_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0x00A7: _gcm("TLS_DH_anon_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC02B: _gcm("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC02C: _gcm("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC02D: _gcm("TLS_ECDH_ECDSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC02E: _gcm("TLS_ECDH_ECDSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC02F: _gcm("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC030: _gcm("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    0xC031: _gcm("TLS_ECDH_RSA_WITH_AES_128_GCM_SHA256", 16, "sha256"),
    0xC032: _gcm("TLS_ECDH_RSA_WITH_AES_256_GCM_SHA384", 32, "sha384"),
    # ChaCha20-Poly1305 (RFC 7905)
    0xCCA8: _chacha("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    0xCCA9: _chacha("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    0xCCAA: _chacha("TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    # AES-CCM (RFC 6655, RFC 7251; IANA defines no CCM suite for the other key exchanges)
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
    0x0030: _cbc("TLS_DH_DSS_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0036: _cbc("TLS_DH_DSS_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x003E: _cbc("TLS_DH_DSS_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x0068: _cbc("TLS_DH_DSS_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0x0031: _cbc("TLS_DH_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0037: _cbc("TLS_DH_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x003F: _cbc("TLS_DH_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x0069: _cbc("TLS_DH_RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0x0032: _cbc("TLS_DHE_DSS_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0038: _cbc("TLS_DHE_DSS_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x0040: _cbc("TLS_DHE_DSS_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x006A: _cbc("TLS_DHE_DSS_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0x0033: _cbc("TLS_DHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x0039: _cbc("TLS_DHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x0067: _cbc("TLS_DHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x006B: _cbc("TLS_DHE_RSA_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0x0034: _cbc("TLS_DH_anon_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0x003A: _cbc("TLS_DH_anon_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0x006C: _cbc("TLS_DH_anon_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0x006D: _cbc("TLS_DH_anon_WITH_AES_256_CBC_SHA256", 32, "sha256"),
    0xC004: _cbc("TLS_ECDH_ECDSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC005: _cbc("TLS_ECDH_ECDSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC025: _cbc("TLS_ECDH_ECDSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC026: _cbc("TLS_ECDH_ECDSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
    0xC009: _cbc("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC00A: _cbc("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC023: _cbc("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC024: _cbc("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
    0xC00E: _cbc("TLS_ECDH_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC00F: _cbc("TLS_ECDH_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC029: _cbc("TLS_ECDH_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC02A: _cbc("TLS_ECDH_RSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
    0xC013: _cbc("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC014: _cbc("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", 32, "sha1"),
    0xC027: _cbc("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", 16, "sha256"),
    0xC028: _cbc("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384", 32, "sha384"),
    0xC018: _cbc("TLS_ECDH_anon_WITH_AES_128_CBC_SHA", 16, "sha1"),
    0xC019: _cbc("TLS_ECDH_anon_WITH_AES_256_CBC_SHA", 32, "sha1"),
    # Camellia-CBC (RFC 5932, RFC 6367). The Camellia-GCM suites (0xC07A-0xC08D) are
    # left out: cryptography has no Camellia-GCM.
    0x0041: _camellia("TLS_RSA_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0042: _camellia("TLS_DH_DSS_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0043: _camellia("TLS_DH_RSA_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0044: _camellia("TLS_DHE_DSS_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0045: _camellia("TLS_DHE_RSA_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0046: _camellia("TLS_DH_anon_WITH_CAMELLIA_128_CBC_SHA", 16, "sha1"),
    0x0084: _camellia("TLS_RSA_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x0085: _camellia("TLS_DH_DSS_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x0086: _camellia("TLS_DH_RSA_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x0087: _camellia("TLS_DHE_DSS_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x0088: _camellia("TLS_DHE_RSA_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x0089: _camellia("TLS_DH_anon_WITH_CAMELLIA_256_CBC_SHA", 32, "sha1"),
    0x00BA: _camellia("TLS_RSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00BB: _camellia("TLS_DH_DSS_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00BC: _camellia("TLS_DH_RSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00BD: _camellia("TLS_DHE_DSS_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00BE: _camellia("TLS_DHE_RSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00BF: _camellia("TLS_DH_anon_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0x00C0: _camellia("TLS_RSA_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0x00C1: _camellia("TLS_DH_DSS_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0x00C2: _camellia("TLS_DH_RSA_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0x00C3: _camellia("TLS_DHE_DSS_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0x00C4: _camellia("TLS_DHE_RSA_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0x00C5: _camellia("TLS_DH_anon_WITH_CAMELLIA_256_CBC_SHA256", 32, "sha256"),
    0xC072: _camellia("TLS_ECDHE_ECDSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0xC073: _camellia("TLS_ECDHE_ECDSA_WITH_CAMELLIA_256_CBC_SHA384", 32, "sha384"),
    0xC074: _camellia("TLS_ECDH_ECDSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0xC075: _camellia("TLS_ECDH_ECDSA_WITH_CAMELLIA_256_CBC_SHA384", 32, "sha384"),
    0xC076: _camellia("TLS_ECDHE_RSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0xC077: _camellia("TLS_ECDHE_RSA_WITH_CAMELLIA_256_CBC_SHA384", 32, "sha384"),
    0xC078: _camellia("TLS_ECDH_RSA_WITH_CAMELLIA_128_CBC_SHA256", 16, "sha256"),
    0xC079: _camellia("TLS_ECDH_RSA_WITH_CAMELLIA_256_CBC_SHA384", 32, "sha384"),
    # SEED-CBC (RFC 4162)
    0x0096: _seed("TLS_RSA_WITH_SEED_CBC_SHA"),
    0x0097: _seed("TLS_DH_DSS_WITH_SEED_CBC_SHA"),
    0x0098: _seed("TLS_DH_RSA_WITH_SEED_CBC_SHA"),
    0x0099: _seed("TLS_DHE_DSS_WITH_SEED_CBC_SHA"),
    0x009A: _seed("TLS_DHE_RSA_WITH_SEED_CBC_SHA"),
    0x009B: _seed("TLS_DH_anon_WITH_SEED_CBC_SHA"),
    # 3DES-EDE-CBC, 8-byte blocks (RFC 5246, RFC 4492)
    0x000A: _3des("TLS_RSA_WITH_3DES_EDE_CBC_SHA"),
    0x000D: _3des("TLS_DH_DSS_WITH_3DES_EDE_CBC_SHA"),
    0x0010: _3des("TLS_DH_RSA_WITH_3DES_EDE_CBC_SHA"),
    0x0013: _3des("TLS_DHE_DSS_WITH_3DES_EDE_CBC_SHA"),
    0x0016: _3des("TLS_DHE_RSA_WITH_3DES_EDE_CBC_SHA"),
    0x001B: _3des("TLS_DH_anon_WITH_3DES_EDE_CBC_SHA"),
    0xC003: _3des("TLS_ECDH_ECDSA_WITH_3DES_EDE_CBC_SHA"),
    0xC008: _3des("TLS_ECDHE_ECDSA_WITH_3DES_EDE_CBC_SHA"),
    0xC00D: _3des("TLS_ECDH_RSA_WITH_3DES_EDE_CBC_SHA"),
    0xC012: _3des("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"),
    0xC017: _3des("TLS_ECDH_anon_WITH_3DES_EDE_CBC_SHA"),
    # RC4_128 (RFC 5246, RFC 4492; prohibited by RFC 7465, still in old captures)
    0x0004: _rc4("TLS_RSA_WITH_RC4_128_MD5", "md5"),
    0x0005: _rc4("TLS_RSA_WITH_RC4_128_SHA", "sha1"),
    0x0018: _rc4("TLS_DH_anon_WITH_RC4_128_MD5", "md5"),
    0xC002: _rc4("TLS_ECDH_ECDSA_WITH_RC4_128_SHA", "sha1"),
    0xC007: _rc4("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", "sha1"),
    0xC00C: _rc4("TLS_ECDH_RSA_WITH_RC4_128_SHA", "sha1"),
    0xC011: _rc4("TLS_ECDHE_RSA_WITH_RC4_128_SHA", "sha1"),
    0xC016: _rc4("TLS_ECDH_anon_WITH_RC4_128_SHA", "sha1"),
    # NULL encryption, HMAC only (RFC 5246, RFC 4492). TLS_NULL_WITH_NULL_NULL (0x0000)
    # is the initial state, never negotiated.
    0x0001: _null("TLS_RSA_WITH_NULL_MD5", "md5"),
    0x0002: _null("TLS_RSA_WITH_NULL_SHA", "sha1"),
    0x003B: _null("TLS_RSA_WITH_NULL_SHA256", "sha256"),
    0xC001: _null("TLS_ECDH_ECDSA_WITH_NULL_SHA", "sha1"),
    0xC006: _null("TLS_ECDHE_ECDSA_WITH_NULL_SHA", "sha1"),
    0xC00B: _null("TLS_ECDH_RSA_WITH_NULL_SHA", "sha1"),
    0xC010: _null("TLS_ECDHE_RSA_WITH_NULL_SHA", "sha1"),
    0xC015: _null("TLS_ECDH_anon_WITH_NULL_SHA", "sha1"),
    # ARIA (RFC 6209: 0xC03C-0xC071) is left out: cryptography has no ARIA cipher.
}
"""Decryptable cipher suites by IANA code point."""

_UNSUPPORTED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("_EXPORT",), "export key derivation is not implemented"),
    (("_PSK_",), "PSK suites are not implemented"),
    (("_SRP_",), "SRP suites are not implemented"),
    (("_KRB5_",), "Kerberos suites are not implemented"),
    (("_NULL_WITH_NULL_NULL",), "it is the initial state, not a negotiated suite"),
    (("_ARIA_",), "the cryptography package has no ARIA cipher"),
    (("_CAMELLIA_", "_GCM_"), "the cryptography package has no Camellia-GCM"),
    (("_IDEA_",), "IDEA suites are not implemented"),
    (("_DES_",), "single-DES suites are not implemented"),
)
"""Name parts of suites left out of :data:`SUITES`, and why they are."""


def cipher_spec(code: int) -> CipherSpec | None:
    """The spec of suite ``code``, None when it cannot be decrypted here."""
    return SUITES.get(code)


def unsupported_reason(name: str) -> str | None:
    """Why the suite named ``name`` (not in :data:`SUITES`) is not decrypted, if known."""
    for parts, why in _UNSUPPORTED:
        if all(part in name for part in parts):
            return why
    return None
