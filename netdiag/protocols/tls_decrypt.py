"""TLS analysis with keys: decrypt records, read the hidden handshake, hand HTTP on.

:class:`DecryptingTlsAnalyzer` is composed with the keyless :class:`TlsAnalyzer`, not
derived from it: it owns one, is its record sink (``TlsAnalyzer(record_sink=...)``)
and forwards the flow layer's bytes to it. Once the ServerHello shows the cipher and
both randoms, it looks the ClientHello random up in the key log and, when it finds
secrets, decrypts every record after that point
(:class:`netdiag.tls.decrypt.TlsDecryptor`). Decrypted handshake messages give the
selected ALPN (TLS 1.3), the certificate, session tickets, key updates and the
exact Finished; decrypted application data goes to an HTTP analyzer (HTTP/2 or
HTTP/1.x, picked by ALPN or by the first plaintext bytes), split where the TCP
segments split the record so every HTTP message is timed by the packet that
carried its first byte.

What is decrypted: every record from the ServerHello on, as long as decryption
works. TLS 1.3 hides the content type inside the encryption, so a record cannot be
skipped without losing the session tickets, key updates and alerts it may carry
(all reported); a TLS 1.2 application-data record whose plaintext no analyzer reads
is still decrypted, because authenticating it is what detects a record that is
damaged or not the one captured (reported, and the later requests then estimated).
When a connection's key is not in the log, or decryption has stopped, the sink
detaches itself and the connection costs what a keyless one costs.

A record that fails to authenticate (wrong key, missing bytes) is a warning on the
connection: decryption stops there, the exact requests that started before it are
kept, and the requests after it come from the keyless inference (``estimated``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Final

from netdiag.protocols.base import AnalyzerKind, StreamAnalyzer
from netdiag.protocols.tls import Pieces, TlsAnalyzer
from netdiag.protocols.tls_infer import DEFAULT_SMALL, DEFAULT_TAIL_GAP_NS
from netdiag.records import Request, TlsInfo
from netdiag.tls.decrypt import (  # the record types, Final there (inlined, compiled)
    CT_ALERT,
    CT_APPLICATION_DATA,
    CT_CHANGE_CIPHER_SPEC,
    CT_HANDSHAKE,
    DecryptError,
    TlsDecryptor,
)
from netdiag.tls.keylog import KeyLog
from netdiag.tls.names import alert_text
from netdiag.tls.suites import SUITES

HS_NEW_SESSION_TICKET: Final = 4
HS_ENCRYPTED_EXTENSIONS: Final = 8
HS_CERTIFICATE: Final = 11
HS_FINISHED: Final = 20
HS_KEY_UPDATE: Final = 24
COMPRESSION_DEFLATE: Final = 1
"""TLS compression method DEFLATE (RFC 3749): one zlib stream per direction."""
MAX_INFLATED = 1 << 14
"""Plaintext one compressed record may hold (RFC 5246 6.2.2: 2^14 bytes)."""
MAX_HANDSHAKE_MESSAGE = 1 << 20
"""Longest decrypted handshake message buffered (certificate chains included)."""

AppFactory = Callable[[str | None, bytes], StreamAnalyzer | None]
"""Picks the analyzer of the decrypted bytes (HTTP/2, HTTP/1.x, RESP) from the selected
ALPN and the client's first plaintext; None when none fits."""

_OFF: Final = 0
_WAITING: Final = 1
_ON: Final = 2
_FAILED: Final = 3
_SIDES: tuple[str, ...] = ("client", "server")


def _plaintext_offset(suite: int, tls13: bool, version: int) -> int:
    """Where plaintext byte 0 sits in a record body (explicit nonce or CBC IV before it)."""
    if tls13:
        return 0
    spec = SUITES.get(suite)
    if spec is None:
        return 0
    if spec.kind == "cbc" and version < 0x0302:
        return 0  # TLS 1.0 chains its IV: none on the wire
    return spec.explicit_nonce_len


class DecryptingTlsAnalyzer:
    """A TLS analyzer that decrypts with a key log (implements ``StreamAnalyzer``).

    ``tls`` is the keyless analyzer it feeds; ``info``, ``requests`` and
    ``warnings`` are that analyzer's (the requests become the exact ones at
    :meth:`close` when records were decrypted); ``app`` is the analyzer of the
    decrypted application data, once chosen.
    """

    def __init__(self, keylog: KeyLog, app_factory: AppFactory, *,
                 small: int = DEFAULT_SMALL, tail_gap_ns: int = DEFAULT_TAIL_GAP_NS) -> None:
        self.keylog = keylog
        self.app_factory = app_factory
        self.tls = TlsAnalyzer(small=small, tail_gap_ns=tail_gap_ns, record_sink=self._record)
        """The keyless analyzer: record walk, handshake facts, estimated requests."""
        self.tls.keep_bodies = True
        self.app: StreamAnalyzer | None = None
        """The analyzer fed with decrypted application data, once chosen."""
        self._state = _WAITING
        self._dec: TlsDecryptor | None = None
        self._offset = 0
        self._inflate: tuple[Any, ...] | None = None
        """Per direction, the zlib stream of a DEFLATE-compressed connection (RFC 3749)."""
        self._hs_buf: tuple[bytearray, ...] = (bytearray(), bytearray())
        self._failed_ns: int | None = None
        self._app_decided = False
        self._pending_app: list[tuple[int, int, bytes, int]] = []
        self._encrypted = [False, False]
        self._finished = [False, False]

    # -- StreamAnalyzer -----------------------------------------------------------------
    def feed(self, direction: int, ts_ns: int, data: bytes | bytearray | memoryview,
             packet: int) -> None:
        """New in-order bytes of ``direction``; see :meth:`TlsAnalyzer.feed`."""
        self.tls.feed(direction, ts_ns, data, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """``nbytes`` of ``direction`` were never captured before the next feed."""
        self.tls.gap(direction, ts_ns, nbytes)

    def close(self, ts_ns: int) -> None:
        """The connection ended: finish the keyless view, then put the exact requests
        in place of the estimated ones (up to where decryption stopped, if it did)."""
        tls = self.tls
        if tls.closed:
            return
        tls.close(ts_ns)
        tls.record_sink = None
        if not tls.info.decrypted:
            return  # no record decrypted: the keyless view stands
        app = self.app
        exact: list[Request] = []
        if app is not None:
            if self._state != _FAILED:
                app.close(ts_ns)
            exact = list(app.requests)
            for w in app.warnings:
                tls.warn(w)
        # Decrypted data that is not HTTP carries no requests: nothing is estimated.
        requests = tls.requests
        cut = self._failed_ns if self._state == _FAILED else None
        if cut is not None:
            requests[:] = ([r for r in exact if r.ts_ns < cut]
                           + [r for r in requests if r.ts_ns >= cut])
        else:
            requests[:] = exact

    @property
    def warnings(self) -> list[str]:
        """The connection's warnings (the TLS layer's, then the decrypted data's)."""
        return self.tls.warnings

    @property
    def kind(self) -> AnalyzerKind:
        """``tls``."""
        return "tls"

    @property
    def requests(self) -> list[Request]:
        """Estimated requests until :meth:`close`; then the exact ones where decrypted."""
        return self.tls.requests

    @property
    def protocol(self) -> str | None:
        """The decrypted data's protocol once its analyzer is chosen, else the ALPN."""
        app = self.app
        return app.protocol if app is not None else self.tls.protocol

    @property
    def http2(self) -> dict[str, Any] | None:
        """HTTP/2 facts of the decrypted data (None unless it is HTTP/2)."""
        app = self.app
        return app.http2 if app is not None else None

    @property
    def client_random(self) -> bytes | None:
        """The ClientHello random, once seen."""
        return self.tls.client_random

    @property
    def limits_hit(self) -> dict[str, int]:
        """Caps the decrypted data's analyzer reached (empty before it is chosen)."""
        app = self.app
        return app.limits_hit if app is not None else {}

    @property
    def info(self) -> TlsInfo:
        """Handshake facts, keyless and decrypted."""
        return self.tls.info

    @property
    def exact_requests(self) -> list[Request]:
        """Requests decoded from decrypted data so far."""
        return list(self.app.requests) if self.app is not None else []

    # -- the record sink ----------------------------------------------------------------
    def _record(self, direction: int, content_type: int, version: int,
                fragment: bytes | bytearray | None, first_ts_ns: int, last_ts_ns: int,
                first_packet: int, pieces: Pieces | None) -> None:
        """One complete record from :attr:`tls` (its ``record_sink``)."""
        state = self._state
        if state != _ON:
            if state != _WAITING or not self.tls.server_hello_seen:
                return
            # This is the record that completed the ServerHello.
            self._start()
            if self._state == _ON and not self.tls.tls13 and fragment is not None:
                self._handshake(direction, fragment, None, first_ts_ns, first_packet)
            return
        dec = self._dec
        assert dec is not None
        if content_type == CT_CHANGE_CIPHER_SPEC:
            if not dec.tls13:
                dec.change_cipher_spec(direction)
                self._encrypted[direction] = True
            return
        if not self._encrypted[direction]:
            if content_type == CT_HANDSHAKE and fragment is not None:
                self._handshake(direction, fragment, None, first_ts_ns, first_packet)
            return
        if fragment is None:
            self._fail(first_ts_ns, f"{_SIDES[direction]} record at packet {first_packet} "
                                    "was not captured whole")
            return
        try:
            inner, plain = dec.decrypt(direction, content_type, version, fragment)
        except DecryptError as e:
            self._fail(first_ts_ns, f"{e} (packet {first_packet})")
            return
        inflate = self._inflate
        if inflate is not None:
            z = inflate[direction]
            try:
                plain = z.decompress(plain, MAX_INFLATED + 1)
            except zlib.error as bad:  # not ``e``: mypyc types it by its first clause's class
                self._fail(first_ts_ns, f"DEFLATE-compressed {_SIDES[direction]} record at "
                                        f"packet {first_packet} does not inflate ({bad})")
                return
            if len(plain) > MAX_INFLATED or z.unconsumed_tail:
                self._fail(first_ts_ns, f"DEFLATE-compressed {_SIDES[direction]} record at "
                                        f"packet {first_packet} inflates beyond "
                                        f"{MAX_INFLATED} bytes")
                return
            pieces = None  # the pieces map compressed bytes: the record's first packet
        info = self.tls.info
        info.decrypted = True
        if inner == CT_HANDSHAKE:
            self._handshake(direction, plain, pieces, first_ts_ns, first_packet)
        elif inner == CT_APPLICATION_DATA:
            self._app_data(direction, plain, pieces, first_ts_ns, first_packet)
        elif inner == CT_ALERT and len(plain) >= 2 and (
                info.alert is None or info.alert.startswith("encrypted")):
            if plain[0] == 2 and not self._finished[direction] and info.resumed is not None:
                # A fatal alert where this side's Finished belonged: no handshake ended.
                info.finished_ns = info.finished_packet = None
            info.alert, problem = alert_text(plain[0], plain[1], _SIDES[direction])
            if problem is not None:
                self.tls.warn(problem)

    # -- set-up -------------------------------------------------------------------------
    def _start(self) -> None:
        tls = self.tls
        info = tls.info
        cipher = tls.cipher_suite
        server_random = tls.server_random
        secrets = self.keylog.secrets_for(info.client_random) if info.client_random else {}
        if not secrets or cipher is None or server_random is None:
            self._off()
            return
        version = tls.version_number or 0
        try:
            self._dec = TlsDecryptor(secrets, cipher, version, info.client_random or b"",
                                     server_random, encrypt_then_mac=tls.encrypt_then_mac)
        except DecryptError as e:
            tls.warn(f"tls: cannot decrypt: {e}")
            info.decrypt_error = str(e)
            self._off()
            return
        tls13 = self._dec.tls13
        method = tls.compression_method
        if method and not tls13:
            if method != COMPRESSION_DEFLATE:
                why = f"compression method {method} (only DEFLATE, 1, is known)"
                tls.warn(f"tls: cannot decrypt: {why}")
                info.decrypt_error = why
                self._off()
                return
            self._inflate = (zlib.decompressobj(), zlib.decompressobj())
        self._offset = _plaintext_offset(cipher, tls13, version)
        self._encrypted = [tls13, tls13]
        self._state = _ON

    def _detach(self) -> None:
        """No more records are needed: the TLS analyzer walks on without bodies or calls."""
        self.tls.keep_bodies = False
        self.tls.record_sink = None

    def _off(self) -> None:
        self._state = _OFF
        self._detach()

    def _fail(self, ts_ns: int, why: str) -> None:
        tls = self.tls
        tls.warn(f"tls: decryption stopped: {why}; later requests are estimated")
        tls.info.decrypt_error = why
        self._state = _FAILED
        self._failed_ns = ts_ns
        self._detach()
        if self.app is not None:
            self.app.close(ts_ns)

    # -- handshake messages -------------------------------------------------------------
    def _handshake(self, direction: int, plain: bytes | bytearray,
                   pieces: Pieces | None, ts: int, pkt: int) -> None:
        buf = self._hs_buf[direction]
        base = len(buf)
        buf += plain
        pos = 0
        while len(buf) - pos >= 4:
            mtype = buf[pos]
            mlen = (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
            if mlen > MAX_HANDSHAKE_MESSAGE:
                self.tls.warn(f"tls: a {mlen}-byte decrypted handshake message; not parsed")
                buf.clear()
                return
            if len(buf) - pos < 4 + mlen:
                break
            body = bytes(buf[pos + 4:pos + 4 + mlen])
            at = (ts, pkt)
            if pos >= base and pieces:
                at = _time_at(pieces, self._offset + pos - base, ts, pkt)
            self._message(direction, mtype, body, at)
            pos += 4 + mlen
        del buf[:pos]

    def _message(self, direction: int, mtype: int, body: bytes, at: tuple[int, int]) -> None:
        info = self.tls.info
        dec = self._dec
        if mtype == HS_ENCRYPTED_EXTENSIONS and direction == 1:
            alpn = _alpn_from_extensions(body, 2)
            if alpn:
                info.alpn = alpn
        elif mtype == HS_CERTIFICATE and direction == 1:
            info.certificate = _certificate_facts(body, tls13=self.tls.tls13)
        elif mtype == HS_NEW_SESSION_TICKET and direction == 1 and self.tls.tls13:
            info.session_tickets += 1  # TLS 1.2's, in the clear, the keyless parser counts
        elif mtype == HS_KEY_UPDATE and dec is not None:
            info.key_updates += 1
            dec.key_update(direction)
        elif mtype == HS_FINISHED:
            self._finished[direction] = True
            if dec is not None and dec.tls13:
                dec.handshake_done(direction)
                if direction == 0:
                    info.finished_ns, info.finished_packet = at
            elif (direction == 0) == bool(info.resumed):
                # TLS 1.2: the client's Finished ends a resumed handshake, the
                # server's a full one.
                info.finished_ns, info.finished_packet = at

    # -- application data ---------------------------------------------------------------
    def _app_data(self, direction: int, plain: bytes, pieces: Pieces | None, ts: int,
                  pkt: int) -> None:
        if not plain:
            return
        if not self._app_decided:
            parts = _split(plain, pieces, self._offset, ts, pkt)
            if direction == 1:
                self._pending_app.extend((direction, t, d, p) for t, d, p in parts)
                return
            self._app_decided = True
            app = self.app = self.app_factory(self.tls.info.alpn, plain)
            pending, self._pending_app = self._pending_app, []
            if app is None:
                return
            for d, t, data, p in pending:
                app.feed(d, t, data, p)
        else:
            app = self.app
            if app is None:
                return  # not HTTP: the plaintext has no reader (it was still authenticated)
            parts = _split(plain, pieces, self._offset, ts, pkt)
        for t, data, p in parts:
            app.feed(direction, t, data, p)


def _time_at(pieces: list[tuple[int, int, int]], offset: int, ts: int,
             pkt: int) -> tuple[int, int]:
    """(time, packet) of the segment that carried body byte ``offset``."""
    at = (ts, pkt)
    for off, t, p in pieces:
        if off > offset:
            break
        at = (t, p)
    return at


def _split(plain: bytes, pieces: list[tuple[int, int, int]] | None, offset: int, ts: int,
           pkt: int) -> list[tuple[int, bytes, int]]:
    """Cut ``plain`` where the TCP segments cut the record: ``(ts, bytes, packet)``."""
    if not pieces or len(pieces) == 1:
        return [(ts if not pieces else pieces[0][1], plain, pkt if not pieces else pieces[0][2])]
    out: list[tuple[int, bytes, int]] = []
    n = len(plain)
    for i, (off, t, p) in enumerate(pieces):
        start = max(off - offset, 0)
        end = pieces[i + 1][0] - offset if i + 1 < len(pieces) else n
        end = min(end, n)
        if end > start:
            out.append((t, plain[start:end], p))
    if not out:
        out.append((pieces[0][1], plain, pieces[0][2]))
    return out


def _alpn_from_extensions(body: bytes, p: int) -> str | None:
    """The ALPN protocol in an EncryptedExtensions body (extensions from ``p - 2``)."""
    try:
        end = min(len(body), 2 + ((body[0] << 8) | body[1]))
        while p + 4 <= end:
            etype = (body[p] << 8) | body[p + 1]
            elen = (body[p + 2] << 8) | body[p + 3]
            data = body[p + 4:p + 4 + elen]
            p += 4 + elen
            if etype == 16 and len(data) >= 3:
                n = data[2]
                return data[3:3 + n].decode("ascii", "replace")
    except IndexError:
        return None
    return None


def _certificate_facts(body: bytes, tls13: bool) -> dict[str, Any] | None:
    """Subject, issuer, expiry and sizes of a Certificate message's chain."""
    try:
        p = 0
        if tls13:
            p = 1 + body[0]
        total = (body[p] << 16) | (body[p + 1] << 8) | body[p + 2]
        p += 3
        end = min(len(body), p + total)
        certs: list[bytes] = []
        while p + 3 <= end:
            n = (body[p] << 16) | (body[p + 1] << 8) | body[p + 2]
            certs.append(body[p + 3:p + 3 + n])
            p += 3 + n
            if tls13:
                p += 2 + ((body[p] << 8) | body[p + 1])
    except IndexError:
        return None
    if not certs:
        return None
    subject, issuer, not_after = _leaf_names(certs[0])
    return {"subject": subject, "issuer": issuer, "not_after": not_after,
            "size": len(certs[0]), "chain_length": len(certs),
            "chain_bytes": sum(len(c) for c in certs)}


_LEAF_CACHE: dict[bytes, tuple[str | None, str | None, str | None]] = {}
"""Subject, issuer and expiry by DER certificate: most connections of a capture show
one of a few certificates, and reading one costs about 100 µs."""
MAX_LEAF_CACHE = 256


def _leaf_names(der: bytes) -> tuple[str | None, str | None, str | None]:
    """Subject, issuer and expiry of a DER certificate (None where unreadable)."""
    known = _LEAF_CACHE.get(der)
    if known is not None:
        return known
    subject = issuer = not_after = None
    try:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(der)
        subject = cert.subject.rfc4514_string()
        issuer = cert.issuer.rfc4514_string()
        not_after = cert.not_valid_after_utc.isoformat()
    except Exception:  # a certificate cryptography cannot read: sizes only
        pass
    names = (subject, issuer, not_after)
    if len(_LEAF_CACHE) >= MAX_LEAF_CACHE:
        _LEAF_CACHE.clear()
    _LEAF_CACHE[der] = names
    return names
