"""TLS analysis with keys: decrypt records, read the hidden handshake, hand HTTP on.

:class:`DecryptingTlsAnalyzer` extends the keyless :class:`TlsAnalyzer`: once the
ServerHello shows the cipher and both randoms, it looks the ClientHello random up in
the key log and, when it finds secrets, decrypts every record after that point
(:class:`netdiag.tls.decrypt.TlsDecryptor`). Decrypted handshake messages give the
selected ALPN (TLS 1.3), the certificate, session tickets, key updates and the
exact Finished; decrypted application data goes to an HTTP analyzer (HTTP/2 or
HTTP/1.x, picked by ALPN or by the first plaintext bytes), split where the TCP
segments split the record so every HTTP message is timed by the packet that
carried its first byte.

A record that fails to authenticate (wrong key, missing bytes) is a warning on the
connection: decryption stops there, the exact requests that started before it are
kept, and the requests after it come from the keyless inference (``estimated``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netdiag.protocols.base import HttpAnalyzer
from netdiag.protocols.tls import (
    CT_ALERT,
    CT_APPLICATION_DATA,
    CT_CHANGE_CIPHER_SPEC,
    CT_HANDSHAKE,
    TlsAnalyzer,
)
from netdiag.protocols.tls_names import alert_description, alert_level_name
from netdiag.records import Request
from netdiag.tls.decrypt import DecryptError, TlsDecryptor
from netdiag.tls.keylog import KeyLog
from netdiag.tls.suites import SUITES

HS_NEW_SESSION_TICKET = 4
HS_ENCRYPTED_EXTENSIONS = 8
HS_CERTIFICATE = 11
HS_FINISHED = 20
HS_KEY_UPDATE = 24
MAX_HANDSHAKE_MESSAGE = 1 << 20
"""Longest decrypted handshake message buffered (certificate chains included)."""

AppFactory = Callable[[str | None, bytes], "HttpAnalyzer | None"]
"""Picks the HTTP analyzer from the selected ALPN and the client's first plaintext."""

_OFF, _WAITING, _ON, _FAILED = 0, 1, 2, 3
_SIDES = ("client", "server")


def _plaintext_offset(suite: int, tls13: bool, version: int) -> int:
    """Where plaintext byte 0 sits in a record body (explicit nonce or CBC IV before it)."""
    if tls13:
        return 0
    spec = SUITES.get(suite)
    if spec is None:
        return 0
    if spec.kind == "cbc":
        return 16 if version >= 0x0302 else 0  # TLS 1.0 chains its IV: none on the wire
    return 8 if spec.aead in ("aes-gcm", "aes-ccm") else 0


class DecryptingTlsAnalyzer(TlsAnalyzer):
    """A TLS analyzer that decrypts with a key log (implements ``StreamAnalyzer``)."""

    keep_bodies = True

    def __init__(self, keylog: KeyLog, app_factory: AppFactory, **kw: Any) -> None:
        super().__init__(**kw)
        self.keylog = keylog
        self.app_factory = app_factory
        self.app: HttpAnalyzer | None = None
        """The HTTP analyzer fed with decrypted application data, once chosen."""
        self._state = _WAITING
        self._dec: TlsDecryptor | None = None
        self._offset = 0
        self._hs_buf: tuple[bytearray, bytearray] = (bytearray(), bytearray())
        self._hs_start: list[tuple[int, int] | None] = [None, None]
        self._failed_ns: int | None = None
        self._app_decided = False
        self._pending_app: list[tuple[int, int, bytes, int]] = []
        self._encrypted = [False, False]
        self._finished = [False, False]

    # -- the hook ---------------------------------------------------------------------
    def on_record(self, direction: int, content_type: int, version: int,
                  fragment: bytes | None, first_ts_ns: int, last_ts_ns: int,
                  first_packet: int, pieces: list[tuple[int, int, int]] | None = None) -> None:
        state = self._state
        if state in (_OFF, _FAILED):
            return
        if state == _WAITING:
            if not self._sh_seen:
                return
            # This is the record that completed the ServerHello.
            self._start()
            if self._state == _ON and not self._tls13 and fragment is not None:
                self._plain_handshake(direction, fragment, first_ts_ns, first_packet)
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
                self._plain_handshake(direction, fragment, first_ts_ns, first_packet)
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
        self.info.decrypted = True
        if inner == CT_HANDSHAKE:
            self._handshake(direction, plain, pieces, first_ts_ns, first_packet)
        elif inner == CT_APPLICATION_DATA:
            self._app_data(direction, plain, pieces, first_ts_ns, first_packet)
        elif inner == CT_ALERT and len(plain) >= 2 and (
                self.info.alert is None or self.info.alert.startswith("encrypted")):
            if plain[0] == 2 and not self._finished[direction] and self.info.resumed is not None:
                # A fatal alert where this side's Finished belonged: no handshake ended.
                self.info.finished_ns = self.info.finished_packet = None
            self.info.alert = (f"{alert_level_name(plain[0])} "
                                   f"{alert_description(plain[1])} from {_SIDES[direction]}")

    # -- set-up -------------------------------------------------------------------------
    def _start(self) -> None:
        info = self.info
        secrets = self.keylog.secrets_for(info.client_random) if info.client_random else {}
        if not secrets or self._cipher is None or self.server_random is None:
            self._off()
            return
        try:
            self._dec = TlsDecryptor(secrets, self._cipher, self._version or 0,
                                     info.client_random or b"", self.server_random,
                                     encrypt_then_mac=self.encrypt_then_mac)
        except DecryptError as e:
            self._warn(f"tls: cannot decrypt: {e}")
            info.decrypt_error = str(e)
            self._off()
            return
        self._offset = _plaintext_offset(self._cipher, self._dec.tls13, self._version or 0)
        tls13 = self._dec.tls13
        self._encrypted = [tls13, tls13]
        self._state = _ON

    def _off(self) -> None:
        self._state = _OFF
        self.keep_bodies = False

    def _fail(self, ts_ns: int, why: str) -> None:
        self._warn(f"tls: decryption stopped: {why}; later requests are estimated")
        self.info.decrypt_error = why
        self._state = _FAILED
        self._failed_ns = ts_ns
        self.keep_bodies = False
        if self.app is not None:
            self.app.close(ts_ns)

    # -- handshake messages -------------------------------------------------------------
    def _plain_handshake(self, direction: int, fragment: bytes, ts: int, pkt: int) -> None:
        self._handshake(direction, fragment, None, ts, pkt)

    def _handshake(self, direction: int, plain: bytes,
                   pieces: list[tuple[int, int, int]] | None, ts: int, pkt: int) -> None:
        buf = self._hs_buf[direction]
        base = len(buf)
        buf += plain
        pos = 0
        while len(buf) - pos >= 4:
            mtype = buf[pos]
            mlen = (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
            if mlen > MAX_HANDSHAKE_MESSAGE:
                self._warn(f"tls: a {mlen}-byte decrypted handshake message; not parsed")
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
        info = self.info
        dec = self._dec
        if mtype == HS_ENCRYPTED_EXTENSIONS and direction == 1:
            alpn = _alpn_from_extensions(body, 2)
            if alpn:
                info.alpn = alpn
        elif mtype == HS_CERTIFICATE and direction == 1:
            info.certificate = _certificate_facts(body, tls13=self._tls13)
        elif mtype == HS_NEW_SESSION_TICKET and direction == 1 and self._tls13:
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
    def _app_data(self, direction: int, plain: bytes,
                  pieces: list[tuple[int, int, int]] | None, ts: int, pkt: int) -> None:
        if not plain:
            return
        parts = _split(plain, pieces, self._offset, ts, pkt)
        if not self._app_decided:
            if direction == 1:
                self._pending_app.extend((direction, t, d, p) for t, d, p in parts)
                return
            self._app_decided = True
            self.app = self.app_factory(self.info.alpn, plain)
            pending, self._pending_app = self._pending_app, []
            if self.app is not None:
                for d, t, data, p in pending:
                    self.app.feed(d, t, data, p)
        app = self.app
        if app is not None:
            for t, data, p in parts:
                app.feed(direction, t, data, p)

    def close(self, ts_ns: int) -> None:
        if self._closed:
            return
        super().close(ts_ns)
        if not self.info.decrypted:
            return  # no record decrypted: the keyless view stands
        app = self.app
        exact: list[Request] = []
        if app is not None:
            if self._state != _FAILED:
                app.close(ts_ns)
            exact = list(app.requests)
            for w in app.warnings:
                self._warn(w)
        # Decrypted data that is not HTTP carries no requests: nothing is estimated.
        cut = self._failed_ns if self._state == _FAILED else None
        if cut is not None:
            self.requests[:] = ([r for r in exact if r.ts_ns < cut]
                                + [r for r in self.requests if r.ts_ns >= cut])
        else:
            self.requests[:] = exact

    @property
    def exact_requests(self) -> list[Request]:
        """Requests decoded from decrypted data so far."""
        return list(self.app.requests) if self.app is not None else []


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
    facts: dict[str, Any] = {"subject": None, "issuer": None, "not_after": None,
                             "size": len(certs[0]), "chain_length": len(certs),
                             "chain_bytes": sum(len(c) for c in certs)}
    try:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(certs[0])
        facts["subject"] = cert.subject.rfc4514_string()
        facts["issuer"] = cert.issuer.rfc4514_string()
        facts["not_after"] = cert.not_valid_after_utc.isoformat()
    except Exception:  # a certificate cryptography cannot read: sizes only
        pass
    return facts
