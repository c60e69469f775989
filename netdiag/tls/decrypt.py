"""Decrypt the records of one TLS connection with secrets from a key log.

:class:`TlsDecryptor` follows one connection's record protection, one state per
direction (0 = client to server, 1 = server to client); it is fed each direction's
record bodies in order and returns the plaintext and its content type. It owns no
I/O and no clock: the caller (the TLS analyzer) cuts the records and tells it about
the handshake events it reads in the decrypted plaintext.

TLS 1.3 (RFC 8446 section 7): keys come from the traffic secrets of the key log,
``key = HKDF-Expand-Label(secret, "key", "", key_len)``, ``iv =
HKDF-Expand-Label(secret, "iv", "", 12)``; the nonce is the IV XOR the 64-bit
record sequence number, the additional data the 5-byte record header. Each
direction starts with its handshake traffic secret (the first records after the
ServerHello), switches to ``*_TRAFFIC_SECRET_0`` after its Finished
(:meth:`TlsDecryptor.handshake_done`) and to the next generation on a KeyUpdate
(:meth:`TlsDecryptor.key_update`); every key change resets the sequence number.
Records whose outer type is not application_data (23) are not encrypted in TLS
1.3 (ClientHello, ServerHello, HelloRetryRequest, compatibility ChangeCipherSpec,
an alert sent before the keys) and are returned unchanged without counting.

When a record fails under the current key, the next key of the schedule is tried
once (early -> handshake, handshake -> application, application generation N ->
N+1) and kept if it authenticates, so a caller that misses a Finished or a
KeyUpdate does not lose the connection; a record that fails to authenticate never
changes the state, so the caller may skip it and go on.

A key log may lack some TLS 1.3 secrets (some servers log only part of them): the
decryptor is built as long as one traffic secret is there, and the records that
need a missing one raise :class:`DecryptError` naming the missing label; the other
direction is not affected.

0-RTT early data: with ``CLIENT_EARLY_TRAFFIC_SECRET`` in the secrets, the client
direction starts with the early traffic key (its records right after the
ClientHello, before the ServerHello, must then be fed too, for the sequence
numbers to count them) and moves to the handshake key after EndOfEarlyData, or
when the early key stops working (early data the server rejected is followed
directly by the handshake-key Finished). Without that secret the early-data
records raise :class:`DecryptError`; since a failure changes nothing, a caller
may skip them and go on with the handshake records.

TLS 1.0-1.2 (RFC 5246 section 6.3, RFC 2246/4346 for the older PRF): the key block
is ``PRF(master_secret, "key expansion", server_random + client_random)`` (P_SHA256
or P_SHA384 in TLS 1.2, MD5 XOR SHA-1 before), split into the client and server
MAC keys, encryption keys and fixed IVs. A direction is decrypted from its
ChangeCipherSpec on (:meth:`TlsDecryptor.change_cipher_spec`), with sequence
numbers from 0. AES-GCM and AES-CCM (RFC 5288, RFC 6655): nonce = fixed IV (4) +
explicit nonce (the first 8 bytes of the record); ChaCha20-Poly1305 (RFC 7905):
nonce = IV (12) XOR sequence number; additional data = sequence number (8) + type
+ version + plaintext length. CBC (AES, Camellia, SEED: 16-byte blocks; 3DES: 8-byte
blocks): IV (explicit in each record from TLS 1.1, chained from the previous
record in TLS 1.0, the first one from the key block) + ciphertext, padded to the
block size, HMAC over sequence number + type + version + length + plaintext inside
the encryption (MAC-then-encrypt), or over the IV and ciphertext after it with RFC
7366 encrypt-then-MAC. RC4: E(plaintext + HMAC), no IV and no padding, one
keystream per direction running on across its records. NULL suites: plaintext +
HMAC, the HMAC checked like the others'. RFC 7366 encrypt-then-MAC is for block
ciphers only; OpenSSL negotiates it for the NULL suites too, which changes nothing
there (no IV, no padding: the HMAC covers the same bytes), so it is ignored for RC4
and NULL. HMAC-MD5 for the ``*_MD5`` suites. Renegotiation is not followed: its new
keys are not in the key log.

Camellia, SEED, 3DES and RC4 come from ``cryptography``'s ``decrepit`` module (from
``cryptography.hazmat.primitives`` before version 43); when the installed OpenSSL
cannot run one of them the decryptor is not built (:class:`DecryptError`).

Padding checks are not constant-time: this reads captured traffic, it is not an
endpoint an attacker can query.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives.ciphers import BlockCipherAlgorithm, Cipher, CipherContext
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.ciphers.algorithms import AES
from cryptography.hazmat.primitives.ciphers.modes import CBC

# (the classes, not the ``algorithms`` and ``modes`` submodules: compiled by mypyc, a
# submodule imported by name, ``from ...ciphers import algorithms``, is None at run time.)

try:
    from cryptography.hazmat.decrepit.ciphers.algorithms import ARC4, SEED, Camellia, TripleDES
except ImportError:  # cryptography < 43: still in primitives
    from cryptography.hazmat.primitives.ciphers.algorithms import (
        ARC4,
        SEED,
        Camellia,
        TripleDES,
    )

from netdiag.tls.keylog import (
    CLIENT_EARLY_TRAFFIC_SECRET,
    CLIENT_HANDSHAKE_TRAFFIC_SECRET,
    CLIENT_RANDOM,
    CLIENT_TRAFFIC_SECRET_0,
    SERVER_HANDSHAKE_TRAFFIC_SECRET,
    SERVER_TRAFFIC_SECRET_0,
)
from netdiag.tls.names import cipher_name, version_name
from netdiag.tls.suites import SUITES, CipherSpec, unsupported_reason

if TYPE_CHECKING:
    from _hashlib import HASH

TLS10: Final = 0x0301
TLS11: Final = 0x0302
TLS12: Final = 0x0303
TLS13: Final = 0x0304

CT_CHANGE_CIPHER_SPEC: Final = 20
CT_ALERT: Final = 21
CT_HANDSHAKE: Final = 22
CT_APPLICATION_DATA: Final = 23

HS_END_OF_EARLY_DATA: Final = 5

_EARLY: Final = 0
_HANDSHAKE: Final = 1
_APPLICATION: Final = 2
_LABELS13: tuple[tuple[str, ...], ...] = (
    (CLIENT_EARLY_TRAFFIC_SECRET, ""),
    (CLIENT_HANDSHAKE_TRAFFIC_SECRET, SERVER_HANDSHAKE_TRAFFIC_SECRET),
    (CLIENT_TRAFFIC_SECRET_0, SERVER_TRAFFIC_SECRET_0),
)
"""Key log label of each TLS 1.3 phase's secret, by direction."""
_SIDES = ("client", "server")
_HASH_LEN = {"sha256": 32, "sha384": 48}
_BLOCK_CIPHERS: dict[str, Callable[[bytes], BlockCipherAlgorithm]] = {
    "aes": AES, "camellia": Camellia, "seed": SEED, "3des": TripleDES}
"""The block cipher of each CBC suite's ``CipherSpec.cipher``."""
_MAX_FRAGMENT: Final = 0xFFFF
"""Longest record body the 2-byte record length allows."""
_HEADER13: Final = struct.Struct("!BHH")
"""TLS 1.3 additional data: the record header (type, version, length)."""
_AAD12: Final = struct.Struct("!QBHH")
"""TLS <= 1.2 additional data and MAC prefix: sequence number, type, version, length."""
# How a TLS <= 1.2 suite protects its records (TlsDecryptor._kind12).
_EXPLICIT_NONCE: Final = 0
_CHACHA: Final = 1
_CBC_MTE: Final = 2
_CBC_ETM: Final = 3
_STREAM: Final = 4

Aead = AESGCM | AESCCM | ChaCha20Poly1305
Fragment = bytes | bytearray | memoryview


class DecryptError(Exception):
    """One connection cannot be (further) decrypted.

    Not a :class:`~netdiag.errors.NetdiagError`: it never reaches the user as an
    error; the caller stops decrypting that connection and says why in a warning.
    Messages name the record and the side, never key material.
    """


# -- key derivation ---------------------------------------------------------------------
_HASHES: dict[str, tuple[Callable[[bytes], HASH], int]] = {
    "md5": (hashlib.md5, 64), "sha1": (hashlib.sha1, 64), "sha256": (hashlib.sha256, 64),
    "sha384": (hashlib.sha384, 128)}
"""The hashes of the key schedules and PRFs: constructor and block size."""
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def _hmac(key: bytes, msg: bytes, hash_name: str) -> bytes:
    """``hmac.digest(key, msg, hash_name)`` (RFC 2104), as two hash calls: about half the
    cost of ``hmac.digest`` on the short messages of key derivation, which runs it
    8 times or more per TLS 1.3 connection."""
    known = _HASHES.get(hash_name)
    if known is None:
        return hmac.digest(key, msg, hash_name)
    new, size = known
    key = _block_key(key, new, size)
    return new(key.translate(_OPAD) + new(key.translate(_IPAD) + msg).digest()).digest()


def _block_key(key: bytes, new: Callable[[bytes], HASH], size: int) -> bytes:
    """The HMAC key as one block of ``size`` bytes (RFC 2104): hashed when longer, then
    padded with zeros; XOR-ed with the pads by ``translate(_IPAD)``/``(_OPAD)``."""
    if len(key) > size:
        key = new(key).digest()
    return key.ljust(size, b"\0")


def hkdf_expand(prk: bytes, info: bytes, length: int, hash_name: str) -> bytes:
    """HKDF-Expand (RFC 5869) with HMAC-``hash_name``."""
    block = _hmac(prk, info + b"\x01", hash_name)
    if length <= len(block):  # every TLS 1.3 key, IV and secret
        return block[:length]
    out = bytearray(block)
    counter = 2
    while len(out) < length:
        block = _hmac(prk, block + info + bytes((counter,)), hash_name)
        out += block
        counter += 1
    return bytes(out[:length])


def hkdf_expand_label(secret: bytes, label: bytes, context: bytes, length: int,
                      hash_name: str) -> bytes:
    """TLS 1.3 HKDF-Expand-Label (RFC 8446 section 7.1); ``label`` without ``tls13 ``."""
    return hkdf_expand(secret, _label_info(label, context, length), length, hash_name)


def _label_info(label: bytes, context: bytes, length: int) -> bytes:
    """HKDF-Expand-Label's ``info`` (the HkdfLabel structure)."""
    full = b"tls13 " + label
    return (length.to_bytes(2, "big") + bytes((len(full),)) + full
            + bytes((len(context),)) + context)


_KEY_INFOS = {n: _label_info(b"key", b"", n) + b"\x01" for n in (16, 24, 32)}
"""The ``key`` label's HMAC input (its ``info`` and HKDF-Expand's first counter byte:
a short output takes one HMAC) per AES or ChaCha20 key length (16, 24, 32 bytes);
other lengths take the general path."""
_IV_INFO = _label_info(b"iv", b"", 12) + b"\x01"


def traffic_key_iv(secret: bytes, key_len: int, hash_name: str) -> tuple[bytes, bytes]:
    """A TLS 1.3 traffic secret's write key (``key_len`` bytes) and 12-byte IV (RFC 8446
    section 7.3): ``hkdf_expand_label`` with labels ``key`` and ``iv``, the HMAC key's
    inner and outer hash states built once for both (the derivation runs for every
    installed key: four or more per decrypted connection)."""
    known = _HASHES.get(hash_name)
    key_info = _KEY_INFOS.get(key_len)
    if known is None or key_info is None or key_len > _HASH_LEN.get(hash_name, 0):
        return (hkdf_expand_label(secret, b"key", b"", key_len, hash_name),
                hkdf_expand_label(secret, b"iv", b"", 12, hash_name))
    new, size = known
    padded = _block_key(secret, new, size)
    inner = new(padded.translate(_IPAD))
    outer = new(padded.translate(_OPAD))
    h = inner.copy()
    h.update(key_info)
    o = outer.copy()
    o.update(h.digest())
    key = o.digest()[:key_len]
    inner.update(_IV_INFO)
    outer.update(inner.digest())
    return key, outer.digest()[:12]


def _p_hash(secret: bytes, seed: bytes, length: int, hash_name: str) -> bytes:
    out = bytearray()
    a = seed
    while len(out) < length:
        a = _hmac(secret, a, hash_name)
        out += _hmac(secret, a + seed, hash_name)
    return bytes(out[:length])


def prf_tls12(secret: bytes, label: bytes, seed: bytes, length: int,
              hash_name: str = "sha256") -> bytes:
    """TLS 1.2 PRF (RFC 5246 section 5): P_<hash>(secret, label + seed)."""
    return _p_hash(secret, label + seed, length, hash_name)


def prf_tls10(secret: bytes, label: bytes, seed: bytes, length: int) -> bytes:
    """TLS 1.0/1.1 PRF (RFC 2246 section 5): P_MD5(S1, ...) XOR P_SHA-1(S2, ...)."""
    half = (len(secret) + 1) // 2
    md5 = _p_hash(secret[:half], label + seed, length, "md5")
    sha1 = _p_hash(secret[len(secret) - half:], label + seed, length, "sha1")
    return (int.from_bytes(md5, "big") ^ int.from_bytes(sha1, "big")).to_bytes(length, "big")


def _make_aead(spec: CipherSpec, key: bytes) -> Aead:
    if spec.aead == "aes-gcm":
        return AESGCM(key)
    if spec.aead == "chacha20":
        return ChaCha20Poly1305(key)
    return AESCCM(key, tag_length=spec.tag_len)


# -- per-direction state ----------------------------------------------------------------
class _Direction:
    """Record protection state of one direction."""

    __slots__ = ("active", "aead", "block", "explicit_iv", "iv", "keystream", "mac_key",
                 "missing", "name", "phase", "records", "renegotiated", "salt", "secret",
                 "seq", "stream")

    def __init__(self, name: str) -> None:
        self.name = name
        self.seq = 0
        """Sequence number of the next record under the current key."""
        self.records = 0
        """Encrypted records fed so far (for messages), failures included."""
        self.active = False
        """TLS <= 1.2: after this side's ChangeCipherSpec."""
        self.renegotiated = False
        self.phase = _HANDSHAKE
        self.secret = b""
        """TLS 1.3: the traffic secret of the current key (empty: not in the key log)."""
        self.missing = ""
        """TLS 1.3: the key log label of the current secret when the log lacks it."""
        self.aead: Aead | None = None
        self.iv = 0
        """TLS 1.3 and ChaCha20: the per-record nonce base, as an integer."""
        self.salt = b""
        """TLS 1.2 GCM/CCM: the 4-byte fixed part of the nonce."""
        self.block: BlockCipherAlgorithm | None = None
        """CBC: the keyed block cipher."""
        self.mac_key = b""
        self.explicit_iv = True
        """CBC: each record starts with its IV (TLS 1.1+); else chained (TLS 1.0)."""
        self.stream: CipherContext | None = None
        """RC4: the direction's keystream generator."""
        self.keystream = b""
        """RC4: keystream generated but not used yet (by a record that failed)."""

    def __repr__(self) -> str:
        return f"<_Direction {self.name} seq={self.seq} records={self.records}>"


class TlsDecryptor:
    """Follows one connection's key schedule; fed records in order per direction."""

    def __init__(self, secrets: Mapping[str, bytes], cipher_suite: int, version: int,
                 client_random: bytes, server_random: bytes, *,
                 encrypt_then_mac: bool = False) -> None:
        """Keys for the negotiated ``cipher_suite`` and ``version`` (from the ServerHello,
        ``supported_versions`` included), from ``secrets`` (``KeyLog.secrets_for``).

        ``encrypt_then_mac``: both hellos carried extension 22 (RFC 7366); only
        matters for CBC suites. Raises :class:`DecryptError` when the suite or version
        cannot be decrypted or a needed secret is missing.
        """
        spec = SUITES.get(cipher_suite)
        if spec is None:
            name = cipher_name(cipher_suite)
            why = unsupported_reason(name)
            raise DecryptError(f"cipher suite {name} is not supported for decryption"
                               + (f" ({why})" if why else ""))
        self.spec = spec
        """The negotiated suite's :class:`~netdiag.tls.suites.CipherSpec`."""
        self.version = version
        self.encrypt_then_mac = bool(encrypt_then_mac) and spec.kind == "cbc"
        self._dirs: tuple[_Direction, ...] = (_Direction("client"), _Direction("server"))
        self._tls13 = version == TLS13
        self._kind12 = _EXPLICIT_NONCE
        """TLS <= 1.2: the record protection of the suite (``_EXPLICIT_NONCE``...)."""
        if self._tls13:
            self._init_tls13(spec, secrets)
        elif version in (TLS10, TLS11, TLS12):
            self._init_tls12(spec, secrets, client_random, server_random)
        else:
            raise DecryptError(f"{version_name(version)} records cannot be decrypted")

    def __repr__(self) -> str:
        return (f"<TlsDecryptor {self.spec.name} {version_name(self.version)} "
                f"{self._dirs[0]!r} {self._dirs[1]!r}>")

    @property
    def tls13(self) -> bool:
        """The connection uses TLS 1.3."""
        return self._tls13

    def records(self, direction: int) -> int:
        """Encrypted records of ``direction`` fed to :meth:`decrypt` so far."""
        return self._dirs[direction].records

    # -- TLS 1.3 set-up -------------------------------------------------------------------
    def _init_tls13(self, spec: CipherSpec, secrets: Mapping[str, bytes]) -> None:
        if not spec.tls13:
            raise DecryptError(f"{spec.name} is not a TLS 1.3 cipher suite")
        traffic = (CLIENT_HANDSHAKE_TRAFFIC_SECRET, SERVER_HANDSHAKE_TRAFFIC_SECRET,
                   CLIENT_TRAFFIC_SECRET_0, SERVER_TRAFFIC_SECRET_0)
        if not any(label in secrets for label in traffic):
            raise DecryptError("the key log lacks " + ", ".join(traffic))
        hlen = _HASH_LEN[spec.hash]
        for label in (*traffic, CLIENT_EARLY_TRAFFIC_SECRET):
            secret = secrets.get(label)
            if secret is not None and len(secret) != hlen:
                raise DecryptError(f"{label} is {len(secret)} bytes, {spec.name} needs {hlen}")
        self._secrets13: dict[str, bytes] = {
            label: bytes(secrets[label]) for label in (*traffic, CLIENT_EARLY_TRAFFIC_SECRET)
            if label in secrets}
        client, server = self._dirs
        if CLIENT_EARLY_TRAFFIC_SECRET in self._secrets13:
            self._install13(client, 0, _EARLY)
        else:
            self._install13(client, 0, _HANDSHAKE)
        self._install13(server, 1, _HANDSHAKE)

    def _keys13(self, secret: bytes) -> tuple[Aead, int]:
        spec = self.spec
        key, iv = traffic_key_iv(secret, spec.key_len, spec.hash)
        return _make_aead(spec, key), int.from_bytes(iv, "big")

    def _install13(self, d: _Direction, direction: int, phase: int,
                   secret: bytes | None = None) -> None:
        """Switch ``d`` to ``phase`` (with ``secret``, else the key log's secret for it)."""
        label = ""
        if secret is None:
            label = _LABELS13[phase][direction]
            secret = self._secrets13.get(label)
        if secret is None:
            d.aead = None
            d.secret = b""
            d.missing = label
        else:
            d.aead, d.iv = self._keys13(secret)
            d.secret = secret
            d.missing = ""
        d.phase = phase
        d.seq = 0

    def _next_key13(self, d: _Direction, direction: int) -> tuple[int, bytes | None, str]:
        """The phase and secret after ``d``'s current key in the schedule, and the key
        log label that is missing when there is no such secret."""
        if d.phase == _APPLICATION:
            if d.secret:
                return _APPLICATION, self._update_secret(d.secret), ""
            return _APPLICATION, None, d.missing
        phase = _HANDSHAKE if d.phase == _EARLY else _APPLICATION
        label = _LABELS13[phase][direction]
        secret = self._secrets13.get(label)
        return phase, secret, "" if secret is not None else label

    def _update_secret(self, secret: bytes) -> bytes:
        spec = self.spec
        return hkdf_expand_label(secret, b"traffic upd", b"", _HASH_LEN[spec.hash], spec.hash)

    # -- TLS 1.0-1.2 set-up ---------------------------------------------------------------
    def _init_tls12(self, spec: CipherSpec, secrets: Mapping[str, bytes],
                    client_random: bytes, server_random: bytes) -> None:
        if spec.tls13:
            raise DecryptError(f"{spec.name} is a TLS 1.3 cipher suite, "
                               f"negotiated with {version_name(self.version)}")
        if spec.kind == "aead" and self.version < TLS12:
            raise DecryptError(f"{spec.name} needs TLS 1.2, negotiated "
                               f"{version_name(self.version)}")
        master = secrets.get(CLIENT_RANDOM)
        if master is None:
            raise DecryptError("the key log lacks CLIENT_RANDOM (the master secret)")
        if len(master) != 48:
            raise DecryptError(f"the master secret is {len(master)} bytes, expected 48")
        if len(client_random) != 32 or len(server_random) != 32:
            raise DecryptError("client and server randoms must be 32 bytes")
        mac_len = spec.mac_len
        key_len = spec.key_len
        iv_len = spec.iv_len
        size = 2 * (mac_len + key_len + iv_len)
        seed = bytes(server_random) + bytes(client_random)
        if self.version == TLS12:
            block = prf_tls12(bytes(master), b"key expansion", seed, size, spec.hash)
        else:
            block = prf_tls10(bytes(master), b"key expansion", seed, size)
        p = 0
        parts = []
        for n in (mac_len, mac_len, key_len, key_len, iv_len, iv_len):
            parts.append(block[p:p + n])
            p += n
        try:
            for i, d in enumerate(self._dirs):
                self._install12(spec, d, parts[i], parts[2 + i], parts[4 + i])
        except UnsupportedAlgorithm as e:  # a legacy cipher this OpenSSL build lacks
            raise DecryptError(f"{spec.name}: the cryptography package cannot run "
                               f"{spec.cipher} here ({e})") from None
        if spec.kind == "cbc":
            self._kind12 = _CBC_ETM if self.encrypt_then_mac else _CBC_MTE
        elif spec.kind in ("stream", "null"):
            self._kind12 = _STREAM
        elif spec.aead == "chacha20":
            self._kind12 = _CHACHA
        else:
            self._kind12 = _EXPLICIT_NONCE

    def _install12(self, spec: CipherSpec, d: _Direction, mac_key: bytes, key: bytes,
                   iv: bytes) -> None:
        """Key ``d`` for a TLS 1.0-1.2 suite; ``UnsupportedAlgorithm`` when OpenSSL
        cannot run its cipher (found here rather than at the first record)."""
        if spec.kind == "aead":
            d.aead = _make_aead(spec, key)
            d.salt = iv
            d.iv = int.from_bytes(iv, "big")
            return
        d.mac_key = mac_key
        if spec.kind == "cbc":
            d.block = _BLOCK_CIPHERS[spec.cipher](key)
            Cipher(d.block, CBC(bytes(spec.block_len))).decryptor()
            d.explicit_iv = self.version >= TLS11
            d.iv = int.from_bytes(iv, "big")  # TLS 1.0 only
            d.salt = iv
        elif spec.kind == "stream":
            d.stream = Cipher(ARC4(key), None).decryptor()

    # -- events from the caller -----------------------------------------------------------
    def change_cipher_spec(self, direction: int) -> None:
        """TLS <= 1.2: ``direction`` sent ChangeCipherSpec; its next records are encrypted.

        Ignored in TLS 1.3 (compatibility CCS). A second one (renegotiation) makes
        the following records of that direction raise :class:`DecryptError`.
        """
        if self._tls13:
            return
        d = self._dirs[direction]
        if d.active:
            d.renegotiated = True
        d.active = True
        d.seq = 0

    def handshake_done(self, direction: int) -> None:
        """TLS 1.3: ``direction`` sent its Finished; switch it to application keys.

        Call it right after decrypting the record holding that Finished. Does
        nothing when the direction already uses application keys (a post-handshake
        authentication Finished) or in TLS <= 1.2.
        """
        if not self._tls13:
            return
        d = self._dirs[direction]
        if d.phase != _APPLICATION:
            self._install13(d, direction, _APPLICATION)

    def key_update(self, direction: int) -> None:
        """TLS 1.3: ``direction`` sent KeyUpdate; its next records use the next secret.

        Call it right after decrypting the record holding the KeyUpdate. Ignored in
        TLS <= 1.2.
        """
        if not self._tls13:
            return
        d = self._dirs[direction]
        if d.phase != _APPLICATION:
            self._install13(d, direction, _APPLICATION)
        if d.secret:
            self._install13(d, direction, _APPLICATION, self._update_secret(d.secret))
        else:
            d.seq = 0

    # -- records --------------------------------------------------------------------------
    def decrypt(self, direction: int, content_type: int, version: int,
                fragment: Fragment) -> tuple[int, bytes]:
        """One record of ``direction``: returns (content type, plaintext).

        ``fragment`` is the record body as on the wire (after the 5-byte header),
        ``content_type`` and ``version`` the header's. The content type returned is
        the inner one in TLS 1.3, the header's in TLS <= 1.2. Records not encrypted
        (TLS 1.3 outer types other than 23; TLS <= 1.2 before the direction's
        ChangeCipherSpec) come back as they are. Raises :class:`DecryptError` when the
        record does not authenticate; the state is then unchanged.
        """
        if not (0 <= content_type <= 0xFF and 0 <= version <= 0xFFFF):
            raise DecryptError(f"bad record header (type {content_type}, version {version})")
        d = self._dirs[direction]
        if self._tls13:
            if content_type != CT_APPLICATION_DATA:
                return content_type, bytes(fragment)
            d.records += 1
            return self._decrypt13(d, direction, version, fragment)
        if not d.active:
            return content_type, bytes(fragment)
        d.records += 1
        if d.renegotiated:
            raise DecryptError(f"the {d.name} renegotiated (second ChangeCipherSpec); "
                               f"the new keys are not in the key log")
        kind = self._kind12
        if kind == _EXPLICIT_NONCE:
            plain = self._decrypt_explicit_nonce(d, content_type, version, fragment)
        elif kind == _CHACHA:
            plain = self._decrypt_chacha(d, content_type, version, fragment)
        elif kind == _CBC_MTE:
            plain = self._decrypt_mte(d, content_type, version, fragment)
        elif kind == _CBC_ETM:
            plain = self._decrypt_etm(d, content_type, version, fragment)
        else:
            plain = self._decrypt_stream(d, content_type, version, fragment)
        d.seq += 1
        return content_type, plain

    def _fail(self, d: _Direction) -> DecryptError:
        return DecryptError(f"record {d.records} from {d.name} failed to authenticate")

    # -- TLS 1.3 records ------------------------------------------------------------------
    def _decrypt13(self, d: _Direction, direction: int, version: int,
                   fragment: Fragment) -> tuple[int, bytes]:
        n = len(fragment)
        if n > 0xFFFF:
            raise self._fail(d)
        header = _HEADER13.pack(CT_APPLICATION_DATA, version, n)
        aead = d.aead
        plain: bytes | None = None
        if aead is not None:
            try:
                plain = aead.decrypt((d.iv ^ d.seq).to_bytes(12, "big"), fragment, header)
            except (InvalidTag, ValueError, OverflowError):
                plain = None
        if plain is None:
            phase, secret, lacking = self._next_key13(d, direction)
            if secret is not None:
                aead, iv = self._keys13(secret)
                try:
                    plain = aead.decrypt(iv.to_bytes(12, "big"), fragment, header)
                except (InvalidTag, ValueError, OverflowError):
                    plain = None
            if plain is None:
                if d.aead is None:
                    raise DecryptError(f"record {d.records} from {d.name} cannot be decrypted: "
                                       f"the key log lacks {d.missing}")
                if lacking:
                    raise DecryptError(f"record {d.records} from {d.name} failed to "
                                       f"authenticate (and the key log lacks {lacking})")
                raise self._fail(d)
            assert secret is not None
            d.aead, d.iv, d.phase, d.secret, d.seq, d.missing = aead, iv, phase, secret, 0, ""
        d.seq += 1
        if plain and plain[-1]:  # no padding: the content type is the last byte
            ctype = plain[-1]
            content = plain[:-1]
        else:
            content = plain.rstrip(b"\x00")
            if not content:
                raise DecryptError(f"record {d.records} from {d.name} has no content type")
            ctype = content[-1]
            content = content[:-1]
        if (d.phase == _EARLY and ctype == CT_HANDSHAKE and content
                and content[0] == HS_END_OF_EARLY_DATA):
            self._install13(d, direction, _HANDSHAKE)
        return ctype, content

    # -- TLS 1.2 records ------------------------------------------------------------------
    def _decrypt_explicit_nonce(self, d: _Direction, ctype: int, version: int,
                                fragment: Fragment) -> bytes:
        """AES-GCM / AES-CCM: 8-byte explicit nonce, ciphertext, tag."""
        n = len(fragment) - 8 - self.spec.tag_len
        if n < 0 or n > 0xFFFF:
            raise self._fail(d)
        mv = memoryview(fragment)
        aad = _AAD12.pack(d.seq, ctype, version, n)
        aead = d.aead
        assert aead is not None
        try:
            return aead.decrypt(d.salt + mv[:8], mv[8:], aad)
        except (InvalidTag, ValueError, OverflowError):
            raise self._fail(d) from None

    def _decrypt_chacha(self, d: _Direction, ctype: int, version: int,
                        fragment: Fragment) -> bytes:
        """ChaCha20-Poly1305: ciphertext and tag, nonce from the sequence number."""
        n = len(fragment) - 16
        if n < 0 or n > 0xFFFF:
            raise self._fail(d)
        seq = d.seq
        aad = _AAD12.pack(seq, ctype, version, n)
        aead = d.aead
        assert aead is not None
        try:
            return aead.decrypt((d.iv ^ seq).to_bytes(12, "big"), fragment, aad)
        except (InvalidTag, ValueError, OverflowError):
            raise self._fail(d) from None

    def _cbc_decrypt(self, d: _Direction, iv: bytes, ciphertext: memoryview) -> bytes:
        block = d.block
        assert block is not None
        dec = Cipher(block, CBC(iv)).decryptor()
        return dec.update(ciphertext) + dec.finalize()

    def _mac(self, d: _Direction, ctype: int, version: int, data: memoryview | bytes) -> bytes:
        n = len(data)
        h = hmac.new(d.mac_key, _AAD12.pack(d.seq, ctype, version, n), self.spec.mac or "sha1")
        h.update(data)
        return h.digest()

    def _decrypt_mte(self, d: _Direction, ctype: int, version: int,
                     fragment: Fragment) -> bytes:
        """CBC, MAC-then-encrypt: [IV] + E(plaintext + MAC + padding)."""
        mv = memoryview(fragment)
        size = len(mv)
        mac_len = self.spec.mac_len
        bl = self.spec.block_len
        start = bl if d.explicit_iv else 0
        if size % bl or size - start < mac_len + 1 or size - start <= 0 or size > _MAX_FRAGMENT:
            raise self._fail(d)
        iv = bytes(mv[:bl]) if d.explicit_iv else d.iv.to_bytes(bl, "big")
        out = self._cbc_decrypt(d, iv, mv[start:])
        pad = out[-1]
        end = len(out) - pad - 1 - mac_len
        if end < 0 or out[-pad - 1:] != bytes((pad,)) * (pad + 1):
            raise self._fail(d)
        content = out[:end]
        if not hmac.compare_digest(self._mac(d, ctype, version, content),
                                   out[end:end + mac_len]):
            raise self._fail(d)
        if not d.explicit_iv:
            d.iv = int.from_bytes(mv[size - bl:], "big")
        return content

    def _decrypt_etm(self, d: _Direction, ctype: int, version: int,
                     fragment: Fragment) -> bytes:
        """CBC, encrypt-then-MAC (RFC 7366): [IV] + E(plaintext + padding) + MAC."""
        mv = memoryview(fragment)
        mac_len = self.spec.mac_len
        bl = self.spec.block_len
        body_len = len(mv) - mac_len
        start = bl if d.explicit_iv else 0
        if body_len % bl or body_len - start < bl or body_len > _MAX_FRAGMENT:
            raise self._fail(d)
        body = mv[:body_len]
        if not hmac.compare_digest(self._mac(d, ctype, version, body), bytes(mv[body_len:])):
            raise self._fail(d)
        iv = bytes(mv[:bl]) if d.explicit_iv else d.iv.to_bytes(bl, "big")
        out = self._cbc_decrypt(d, iv, body[start:])
        pad = out[-1]
        if pad + 1 > len(out) or out[-pad - 1:] != bytes((pad,)) * (pad + 1):
            raise self._fail(d)
        if not d.explicit_iv:
            d.iv = int.from_bytes(body[body_len - bl:], "big")
        return out[:-pad - 1]

    def _decrypt_stream(self, d: _Direction, ctype: int, version: int,
                        fragment: Fragment) -> bytes:
        """RC4 or NULL: E(plaintext + MAC) (no encryption for NULL), no IV, no padding.

        The RC4 keystream a failed record used is kept for the next record, so a
        failure changes nothing here either.
        """
        n = len(fragment)
        end = n - self.spec.mac_len
        if end < 0 or n > _MAX_FRAGMENT:
            raise self._fail(d)
        stream = d.stream
        keystream = b""
        if stream is None:
            plain = bytes(fragment)
        else:
            keystream = d.keystream
            if len(keystream) < n:
                keystream += stream.update(bytes(n - len(keystream)))
                d.keystream = keystream
            plain = (int.from_bytes(fragment, "big")
                     ^ int.from_bytes(keystream[:n], "big")).to_bytes(n, "big")
        content = plain[:end]
        if not hmac.compare_digest(self._mac(d, ctype, version, content), plain[end:]):
            raise self._fail(d)
        if stream is not None:
            d.keystream = keystream[n:]
        return content
