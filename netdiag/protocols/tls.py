"""TLS record and handshake analyzer for one TCP connection, without keys.

The analyzer walks the TLS record layer of both directions as the flow layer feeds
it (:class:`~netdiag.protocols.base.StreamAnalyzer`). Until each direction starts
encrypting, its handshake records are buffered and parsed (ClientHello,
ServerHello, HelloRetryRequest, alerts); after that only the 5-byte record
headers are read and record bodies are skipped without being copied: a
per-direction count of the bytes left in the current record makes a segment that
falls inside a record body cost one comparison and two stores.

What it fills (:class:`~netdiag.records.TlsInfo`): version, cipher, SNI, ALPN,
resumption, HelloRetryRequest, the first alert, and the two ends of
``handshake_ms`` (CONTRACT.md): from the first byte of the first ClientHello to the
first byte of the record carrying the Finished that ends the handshake, found by
its position in the record sequence:

- TLS 1.3 (full, PSK, after a HelloRetryRequest): the client's Finished, its first
  record of outer type 23 after the (real) ServerHello; the client's compatibility
  ChangeCipherSpec records are skipped.
- TLS 1.2 and older, full handshake: the server's Finished, its first record after
  its ChangeCipherSpec (the server's CCS comes second).
- TLS 1.2 abbreviated (resumed) handshake: the client's Finished, its first record
  after its ChangeCipherSpec (the client's CCS comes second).

A record's first-byte time is the capture time of the segment carrying its first
byte, its last-byte time that of the segment carrying its last byte. "After" means
in feed order, so the flow layer must feed both directions in capture order.
Known limit: with TLS 1.3 early data (0-RTT) the client's early records come
before the ServerHello and are skipped, but early data still in flight after the
ServerHello would be taken for the Finished.

Application-data records after the client's Finished drive an
:class:`~netdiag.protocols.tls_infer.ExchangeInferrer` that guesses
request/response exchanges (``requests``, all ``estimated=True``).

Decryption composes with the analyzer rather than deriving from it: give
``TlsAnalyzer(record_sink=...)`` a :class:`RecordSink` (any callable of that
signature), which is called once per complete record after the analyzer's own
processing of it, and set ``keep_bodies = True`` (at any time, e.g. from the sink
once the ClientHello's ``client_random`` finds a key) to receive every record's
body rather than ``None``; set ``infer_requests = False`` to stop the inference.
``record_sink`` may be replaced or set to None at any time (a sink that needs no
more records detaches itself). Overriding :meth:`on_record` in a subclass still
works, for code written against the earlier hook, but a subclass cannot be
compiled with the analyzer (mypyc); new code passes a sink.

Without ``keep_bodies`` the walk buffers only what it parses: plaintext handshake
records (until the handshake is encrypted or done) and the first alert. Every other
record, application data above all, is followed by its header alone: the body is
counted off (``left``) and never sliced or copied.

Bad input never raises: bytes that are not TLS records give one warning and stop
the parsing of that direction (an SSLv2-compatible ClientHello included); a gap
inside an application-data record is stepped over, any other gap stops that
direction.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from netdiag.protocols.base import AnalyzerKind, add_warning
from netdiag.protocols.tls_infer import DEFAULT_SMALL, DEFAULT_TAIL_GAP_NS, ExchangeInferrer
from netdiag.records import Request, TlsInfo

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing
    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls
from netdiag.tls.names import (
    alert_text,
    cipher_name,
    is_tls13,
    record_overhead,
    version_name,
)

CT_CHANGE_CIPHER_SPEC: Final = 20
CT_ALERT: Final = 21
CT_HANDSHAKE: Final = 22
CT_APPLICATION_DATA: Final = 23
CT_HEARTBEAT: Final = 24

HS_CLIENT_HELLO = 1
HS_SERVER_HELLO = 2
HS_NEW_SESSION_TICKET = 4

HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
"""ServerHello.random of a HelloRetryRequest: SHA-256("HelloRetryRequest")."""

MAX_RECORD_LENGTH: Final = 16384 + 2048
"""Longest TLSCiphertext fragment any version allows (TLS 1.2: 2^14 + 2048)."""

MAX_HELLO_LENGTH = 1 << 17
"""Longest ClientHello/ServerHello buffered; longer ones are not parsed."""

MAX_WARNINGS = 20
"""Warnings kept per connection; one more line says the rest were dropped."""

EXT_SERVER_NAME = 0
EXT_ALPN = 16
EXT_ENCRYPT_THEN_MAC = 22
EXT_SESSION_TICKET = 35
EXT_PRE_SHARED_KEY = 41
EXT_SUPPORTED_VERSIONS = 43

_SIDES = ("client", "server")

Pieces = list[tuple[int, int, int]]
"""Where a record body came from: ``(offset in body, capture time, packet)`` of each
TCP segment's share of it, in order."""


class RecordSink(Protocol):
    """Receives every complete record of a :class:`TlsAnalyzer` (a callable)."""

    def __call__(self, direction: int, content_type: int, version: int,
                 fragment: bytes | bytearray | None, first_ts_ns: int, last_ts_ns: int,
                 first_packet: int, pieces: Pieces | None) -> None:
        """One complete record of ``direction``, after the analyzer processed it.

        ``version`` is the record header's (``0x0303``...). ``fragment`` is the
        record body when it was collected (plaintext handshake records and the first
        alert, or every record while ``keep_bodies`` is set), else None (also when
        part of it was never captured): ``bytes`` when one segment carried it all,
        else a ``bytearray``; the sink owns it (the analyzer keeps no reference).
        ``first_ts_ns``/``first_packet`` are those of the segment that carried the
        header's first byte, ``last_ts_ns`` that of the record's last byte. ``pieces``
        (with ``keep_bodies``) maps the body to the segments that carried it.
        """


class _Malformed(Exception):
    """A handshake message ended early or a length field overran it."""


def looks_like_tls(first_bytes: bytes) -> bool:
    """Whether a client's first payload starts a TLS handshake record (a ClientHello).

    Checks content type 22, record version 3.0..3.4, a sane length and, when those
    bytes are present, handshake type 1. An SSLv2-compatible ClientHello (2-byte
    header with the top bit set, message type 1, version 3.x) offering SSL 3.0 or TLS
    is one too; a pure SSLv2 hello (version 0.2) is not.
    """
    if len(first_bytes) < 3:
        return False
    if first_bytes[0] & 0x80 and first_bytes[2] == 1:
        return (len(first_bytes) < 5
                or (first_bytes[3] == 3 and first_bytes[4] <= 3
                    and ((first_bytes[0] & 0x7F) << 8 | first_bytes[1]) >= 9))
    if first_bytes[0] != CT_HANDSHAKE or first_bytes[1] != 3 or first_bytes[2] > 4:
        return False
    if len(first_bytes) >= 5:
        length = (first_bytes[3] << 8) | first_bytes[4]
        if length == 0 or length > MAX_RECORD_LENGTH:
            return False
    return len(first_bytes) < 6 or first_bytes[5] == HS_CLIENT_HELLO


class _Side:
    """Record-walk and handshake state of one direction."""

    __slots__ = (
        "alive",
        "await_finished",
        "body",
        "ccs",
        "ccs_second",
        "ctype",
        "encrypted",
        "first_pkt",
        "first_ts",
        "hdr",
        "hs_alive",
        "hs_buf",
        "hs_pkt",
        "hs_skip",
        "hs_ts",
        "last_ts",
        "left",
        "length",
        "pieces",
        "records",
        "version",
    )

    def __init__(self) -> None:
        self.left = 0
        """Body bytes of the current record not yet seen (0: a header comes next)."""
        self.body: bytes | bytearray | None = None
        """Body of the current record being collected, None when skipped."""
        self.hdr = bytearray()
        """Carry of a record header split across segments (< 5 bytes)."""
        self.alive = True
        self.ctype = 0
        self.version = 0
        self.length = 0
        self.first_ts = 0
        self.first_pkt = 0
        self.last_ts = 0
        self.pieces: Pieces | None = None
        """With ``keep_bodies``: ``(offset in body, ts, packet)`` of each segment's bytes."""
        self.records = 0
        self.encrypted = False
        """This direction's records are no longer plaintext."""
        self.ccs = False
        self.ccs_second = False
        self.await_finished = False
        self.hs_alive = True
        self.hs_buf = bytearray()
        self.hs_skip = 0
        self.hs_ts = 0
        self.hs_pkt = 0


@mypyc_attr(allow_interpreted_subclasses=True)
class TlsAnalyzer:
    """Passive TLS analyzer of one connection (implements ``StreamAnalyzer``)."""

    def __init__(self, *, small: int = DEFAULT_SMALL,
                 tail_gap_ns: int = DEFAULT_TAIL_GAP_NS,
                 record_sink: RecordSink | None = None) -> None:
        """``small``/``tail_gap_ns`` tune the request inference (``tls_infer``);
        ``record_sink`` receives every complete record (see :class:`RecordSink`)."""
        self.record_sink: RecordSink | None = record_sink
        """Called once per complete record (decryption); None: nobody is."""
        self.keep_bodies = False
        """Collect every record's body for the record sink (decryption)."""
        self.infer_requests = True
        """Guess request/response exchanges from application-data records."""
        self.info = TlsInfo()
        """Handshake facts, filled as the handshake goes."""
        self.requests: list[Request] = []
        """Inferred exchanges (``estimated=True``); complete after :meth:`close`."""
        self.warnings: list[str] = []
        """Plain sentences about bytes that could not be parsed."""
        self.small = small
        self.tail_gap_ns = tail_gap_ns
        self._sides: tuple[_Side, ...] = (_Side(), _Side())
        self._hook = type(self).on_record is not TlsAnalyzer.on_record
        """A subclass overrides :meth:`on_record` (the earlier, subclassing hook)."""
        self._closed = False
        self._infer: ExchangeInferrer | None = None
        self._ch_count = 0
        self._v2_hello: bytearray | None = bytearray()
        """The client's first bytes while they may be an SSLv2-compatible ClientHello;
        None once the client's stream is known to be TLS records."""
        self._ch_sid = b""
        self._last_ch_ts = 0
        self._sh_seen = False
        self._sh_ts = 0
        self._tls13 = False
        self._version: int | None = None
        self._cipher: int | None = None
        self.server_random: bytes | None = None
        """ServerHello random of the real (not HelloRetryRequest) ServerHello."""
        self.encrypt_then_mac = False
        self.compression_method = 0
        """The compression method the ServerHello chose (1: DEFLATE, RFC 3749)."""
        """The server accepted encrypt_then_mac (extension 22), for TLS 1.2 CBC suites."""
        self._client_finished = False
        self._done = False

    # -- what the pipeline reads (StreamAnalyzer) -----------------------------------

    @property
    def kind(self) -> AnalyzerKind:
        """``tls``."""
        return "tls"

    @property
    def protocol(self) -> str | None:
        """The ALPN protocol the server selected, None when there was none."""
        return self.info.alpn or None

    @property
    def http2(self) -> dict[str, Any] | None:
        """None: without keys nothing is known about HTTP/2 inside."""
        return None

    @property
    def client_random(self) -> bytes | None:
        """The first ClientHello's random (the key log's index), once seen."""
        return self.info.client_random

    @property
    def limits_hit(self) -> dict[str, int]:
        """None of the interface's caps applies to the record walk: always empty."""
        return {}

    # -- what a record sink reads -----------------------------------------------------

    @property
    def server_hello_seen(self) -> bool:
        """The real (not HelloRetryRequest) ServerHello was parsed."""
        return self._sh_seen

    @property
    def tls13(self) -> bool:
        """The ServerHello (or HelloRetryRequest) selected TLS 1.3."""
        return self._tls13

    @property
    def cipher_suite(self) -> int | None:
        """The cipher suite of the real ServerHello, as a number."""
        return self._cipher

    @property
    def version_number(self) -> int | None:
        """The negotiated version (``0x0304``...), ``supported_versions`` included."""
        return self._version

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    def warn(self, message: str) -> None:
        """Add a warning about this connection (capped at :data:`MAX_WARNINGS`)."""
        add_warning(self.warnings, message, MAX_WARNINGS,
                    "tls: further warnings on this connection dropped")

    # -- StreamAnalyzer -------------------------------------------------------------

    def feed(self, direction: int, ts_ns: int, data: bytes | bytearray | memoryview,
             packet: int) -> None:
        """New in-order bytes of ``direction`` from the segment of ``packet``.

        The flow layer gives ``bytes``; another bytes-like object is copied first,
        unless the whole segment falls inside a record body that is skipped.
        """
        side = self._sides[direction]
        left = side.left
        n = len(data)
        if left > n and side.body is None:
            # The whole segment is inside a record body we skip: the hot path.
            side.left = left - n
            side.last_ts = ts_ns
            return
        if side.alive and n:
            raw = data if isinstance(data, bytes) else bytes(data)
            if direction == 0 and self._v2_hello is not None:
                raw = self._sslv2_hello(side, ts_ns, raw, packet)
                if not raw:
                    return
            self._walk(side, direction, ts_ns, raw, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """``nbytes`` of ``direction`` were never captured before the next feed."""
        side = self._sides[direction]
        if not side.alive:
            return
        name = _SIDES[direction]
        if (0 < nbytes <= side.left and not side.hdr
                and side.ctype == CT_APPLICATION_DATA and side.encrypted):
            # Inside an application-data body: record boundaries are still known.
            self.warn(f"tls: {nbytes} bytes of the {name} stream were not captured, inside "
                      f"an application-data record; record boundaries kept")
            side.left -= nbytes
            side.body = None
            if side.left == 0:
                self._complete(side, direction, ts_ns)
            return
        self._kill(side, f"tls: {nbytes} bytes of the {name} stream were not captured; "
                         f"stopped parsing that direction")

    def close(self, ts_ns: int) -> None:
        """The connection ended: finish the exchange in progress."""
        if self._closed:
            return
        self._closed = True
        for direction, side in enumerate(self._sides):
            if not side.alive or not (side.left or side.hdr):
                continue
            name = _SIDES[direction]
            if side.hdr:
                self.warn(f"tls: the {name} stream ended inside a record header")
                continue
            self.warn(f"tls: the {name} stream ended inside a {side.length}-byte record "
                      f"({side.left} bytes missing)")
            if side.ctype == CT_APPLICATION_DATA:
                self._on_application_data(direction, side.first_ts, side.last_ts,
                                          side.length, side.first_pkt)
        if self._infer is not None:
            self._infer.close()
            self._infer = None

    # -- the earlier, subclassing record hook ------------------------------------------

    def on_record(self, direction: int, content_type: int, version: int,
                  fragment: bytes | None, first_ts_ns: int, last_ts_ns: int,
                  first_packet: int, pieces: Pieces | None = None) -> None:
        """Called once per complete record when a subclass overrides it (and no
        ``record_sink`` was given); ``fragment`` as for :class:`RecordSink`, as
        ``bytes``. Kept for code written against it; the base class does nothing
        (and is not even called). New code passes ``record_sink`` instead.
        """

    # -- record layer ---------------------------------------------------------------

    def _sslv2_hello(self, side: _Side, ts_ns: int, data: bytes, packet: int) -> bytes:
        """The client's first bytes: an SSLv2-compatible ClientHello (RFC 5246 E.2) is
        read as the TLS ClientHello it stands for; returns the bytes after it (all of
        ``data`` when the stream starts with a TLS record)."""
        buf = self._v2_hello
        assert buf is not None
        if not buf:
            if not (data[0] & 0x80 and (len(data) < 3 or data[2] == 1)):
                self._v2_hello = None
                return data
            side.first_ts, side.first_pkt = ts_ns, packet
        buf += data
        if len(buf) < 2:
            return b""
        length = ((buf[0] & 0x7F) << 8) | buf[1]
        if len(buf) < 2 + length:
            return b""
        msg, rest = bytes(buf[2:2 + length]), bytes(buf[2 + length:])
        self._v2_hello = None
        ts, pkt = side.first_ts, side.first_pkt
        if len(msg) < 9 or msg[0] != 1 or msg[1] != 3:
            self._kill(side, f"tls: an SSLv2 client hello (packet {pkt}) that does not "
                             f"offer TLS; stopped parsing the client stream")
            return b""
        specs_len = (msg[3] << 8) | msg[4]
        sid_len = (msg[5] << 8) | msg[6]
        challenge_len = (msg[7] << 8) | msg[8]
        if (9 + specs_len + sid_len + challenge_len != len(msg) or specs_len % 3
                or not 16 <= challenge_len <= 32 or sid_len > 32):
            self._kill(side, f"tls: malformed SSLv2 client hello (packet {pkt}); stopped "
                             f"parsing the client stream")
            return b""
        specs = msg[9:9 + specs_len]
        sid = msg[9 + specs_len:9 + specs_len + sid_len]
        challenge = msg[9 + specs_len + sid_len:]
        suites = b"".join(specs[k + 1:k + 3] for k in range(0, specs_len, 3)
                          if specs[k] == 0)
        hello = (msg[1:3] + challenge.rjust(32, b"\x00") + bytes([len(sid)]) + sid
                 + len(suites).to_bytes(2, "big") + suites + b"\x01\x00")
        side.records += 1
        try:
            self._client_hello(hello, ts, pkt)
        except _Malformed:
            self._kill(side, f"tls: malformed SSLv2 client hello (packet {pkt})")
            return b""
        return rest

    def _walk(self, side: _Side, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        n = len(data)
        i = 0
        left = side.left
        while True:
            if left:
                avail = n - i
                body = side.body  # a bytearray while gathered (bytes: see below)
                if avail < left:
                    # The segment ends inside this record's body.
                    if isinstance(body, bytearray):
                        pieces = side.pieces
                        if pieces is not None:
                            pieces.append((len(body), ts_ns, packet))
                        body += memoryview(data)[i:]
                    side.left = left - avail
                    side.last_ts = ts_ns
                    return
                if isinstance(body, bytearray):
                    pieces = side.pieces
                    if pieces is not None:
                        pieces.append((len(body), ts_ns, packet))
                    body += memoryview(data)[i:i + left]
                i += left
                side.left = left = 0
                side.last_ts = ts_ns
                self._complete(side, direction, ts_ns)
                if not side.alive:
                    return
            if i >= n:
                return
            hdr = side.hdr
            if hdr or n - i < 5:
                if not hdr:
                    side.first_ts = ts_ns
                    side.first_pkt = packet
                need = 5 - len(hdr)
                hdr += data[i:i + need]
                i += need
                if len(hdr) < 5:
                    return
                ctype, v1, v2, l1, l2 = hdr
                hdr.clear()
            else:
                ctype = data[i]
                v1 = data[i + 1]
                v2 = data[i + 2]
                l1 = data[i + 3]
                l2 = data[i + 4]
                i += 5
                side.first_ts = ts_ns
                side.first_pkt = packet
            length = (l1 << 8) | l2
            if not (CT_CHANGE_CIPHER_SPEC <= ctype <= CT_HEARTBEAT and v1 == 3 and v2 <= 4
                    and length <= MAX_RECORD_LENGTH):
                self._bad_header(side, direction, packet, bytes((ctype, v1, v2, l1, l2)))
                return
            side.ctype = ctype
            side.version = (v1 << 8) | v2
            side.length = length
            side.last_ts = ts_ns
            side.records += 1
            if self.keep_bodies:
                if 0 < length <= n - i:
                    # The whole record in this segment (the usual case): its body is one
                    # slice, not gathered piece by piece.
                    side.body = data[i:i + length]
                    side.pieces = [(0, ts_ns, packet)]
                    i += length
                    side.left = left = 0
                    self._complete(side, direction, ts_ns)
                    if not side.alive:
                        return
                    continue
                side.body = bytearray()
                side.pieces = []
            elif (ctype == CT_HANDSHAKE and side.hs_alive and not side.encrypted) or (
                    ctype == CT_ALERT and self.info.alert is None):
                side.body = bytearray()
                side.pieces = None
            else:
                side.body = None
            side.left = left = length
            if length == 0:
                self._complete(side, direction, ts_ns)
                if not side.alive:
                    return

    def _bad_header(self, side: _Side, direction: int, packet: int, header: bytes) -> None:
        name = _SIDES[direction]
        if side.records == 0 and direction == 0 and header[0] & 0x80 and header[2] == 1:
            msg = (f"tls: the client opened with an SSLv2-compatible ClientHello "
                   f"(packet {packet}); not analysed as TLS")
        else:
            msg = (f"tls: the {name} stream is not TLS records at packet {packet} "
                   f"(header {header.hex()}); stopped parsing that direction")
        self._kill(side, msg)

    def _kill(self, side: _Side, message: str) -> None:
        self.warn(message)
        side.alive = False
        side.left = 0
        side.body = None
        side.hdr.clear()
        side.hs_buf = bytearray()

    def _complete(self, side: _Side, direction: int, last_ts: int) -> None:
        """The current record of ``side`` is complete."""
        ctype = side.ctype
        body = side.body
        side.body = None
        first_ts = side.first_ts
        pkt = side.first_pkt
        if ctype == CT_APPLICATION_DATA:
            infer = self._infer
            if infer is not None:
                infer.record(direction, first_ts, last_ts, side.length, pkt)
            else:
                self._on_application_data(direction, first_ts, last_ts, side.length, pkt)
        elif ctype == CT_HANDSHAKE:
            if side.await_finished:
                self._on_finished(side, direction, first_ts, last_ts, pkt)
            elif body is not None and not side.encrypted and side.hs_alive:
                self._on_handshake_fragment(side, direction, body, first_ts, pkt)
        elif ctype == CT_CHANGE_CIPHER_SPEC:
            self._on_ccs(side, direction)
        elif ctype == CT_ALERT:
            self._on_alert(side, direction, body)
        sink = self.record_sink
        if sink is not None:
            sink(direction, ctype, side.version, body, first_ts, last_ts, pkt,
                 side.pieces if body is not None else None)
        elif self._hook:
            self.on_record(direction, ctype, side.version,
                           None if body is None else bytes(body), first_ts, last_ts, pkt,
                           side.pieces if body is not None else None)

    # -- record types ---------------------------------------------------------------

    def _on_application_data(self, direction: int, first_ts: int, last_ts: int,
                             length: int, pkt: int) -> None:
        infer = self._infer
        if infer is not None:
            infer.record(direction, first_ts, last_ts, length, pkt)
            return
        if direction != 0 or self._client_finished:
            return
        if self._tls13 and self._sh_seen:
            # TLS 1.3: the client's first encrypted record after the ServerHello.
            self._client_finished = True
            self._set_finished(first_ts, pkt)
            self._start_inference()
            if self._infer is not None:
                rtt = max(self._sh_ts - self._last_ch_ts, 0)
                self._infer.arm_tail(first_ts + 2 * rtt + self.tail_gap_ns)
        elif self._ch_count == 0:
            # The capture started after the handshake: infer from what there is.
            self._start_inference()
            if self._infer is not None:
                self._infer.record(direction, first_ts, last_ts, length, pkt)

    def _start_inference(self) -> None:
        if self.infer_requests and self._infer is None and not self._closed:
            self._infer = ExchangeInferrer(
                small=self.small, overhead=record_overhead(self._version, self._cipher),
                tail_gap_ns=self.tail_gap_ns, requests=self.requests)

    def _set_finished(self, ts: int, pkt: int) -> None:
        if not self._done:
            self._done = True
            self.info.finished_ns = ts
            self.info.finished_packet = pkt
            for side in self._sides:
                side.hs_alive = False
                side.hs_buf = bytearray()

    def _on_ccs(self, side: _Side, direction: int) -> None:
        if self._tls13 or not self._sh_seen or side.ccs:
            return  # TLS 1.3 compatibility CCS, or nothing to change yet
        other = self._sides[1 - direction]
        side.ccs = True
        side.encrypted = True
        side.await_finished = True
        side.ccs_second = other.ccs
        side.hs_buf = bytearray()
        if direction == 1 and not other.ccs:
            self.info.resumed = True  # the server finishes first: abbreviated handshake

    def _on_finished(self, side: _Side, direction: int, first_ts: int, last_ts: int,
                     pkt: int) -> None:
        """TLS <= 1.2: the first handshake record after ``side``'s CCS is its Finished."""
        side.await_finished = False
        if direction == 0:
            self._client_finished = True
            self._start_inference()
            if side.ccs_second:
                self._set_finished(first_ts, pkt)
                if self._infer is not None:
                    rtt = max(self._sh_ts - self._last_ch_ts, 0)
                    self._infer.arm_tail(first_ts + 2 * rtt + self.tail_gap_ns)
        elif side.ccs_second:
            self._set_finished(first_ts, pkt)
            infer = self._infer
            if infer is not None and infer.pending:
                # False Start: the request left before the server's Finished; what
                # the server sends with its Finished (HTTP/2 SETTINGS) is not an answer.
                infer.arm_tail(last_ts + self.tail_gap_ns)
            elif infer is not None and self.info.alpn == "h2":
                # HTTP/2 servers answer the client preface with SETTINGS about one round
                # trip after their Finished, just after the first request left.
                rtt = max(self._sh_ts - self._last_ch_ts, 0)
                infer.arm_tail(last_ts + 2 * rtt + self.tail_gap_ns)

    def _on_alert(self, side: _Side, direction: int, body: bytes | bytearray | None) -> None:
        if self.info.alert is not None or body is None:
            return
        name = _SIDES[direction]
        if len(body) == 2 or (not side.encrypted and len(body) >= 2):
            self.info.alert, problem = alert_text(body[0], body[1], name)
            if problem is not None:
                self.warn(problem)
        elif body:
            self.info.alert = f"encrypted from {name}"

    # -- handshake messages ---------------------------------------------------------

    def _on_handshake_fragment(self, side: _Side, direction: int, frag: bytes | bytearray,
                               first_ts: int, pkt: int) -> None:
        """One plaintext handshake record's body: cut it into handshake messages."""
        view = memoryview(frag)
        skip = side.hs_skip
        if skip:
            if skip >= len(view):
                side.hs_skip = skip - len(view)
                return
            view = view[skip:]
            side.hs_skip = 0
        buf = side.hs_buf
        if not buf:
            side.hs_ts = first_ts
            side.hs_pkt = pkt
        buf += view
        while len(buf) >= 4 and side.hs_alive and not side.encrypted:
            mtype = buf[0]
            mlen = (buf[1] << 16) | (buf[2] << 8) | buf[3]
            if mtype == HS_NEW_SESSION_TICKET and direction == 1:
                self.info.session_tickets += 1  # TLS <= 1.2 sends it in the clear
            if mtype in (HS_CLIENT_HELLO, HS_SERVER_HELLO):
                if mlen > MAX_HELLO_LENGTH:
                    self.warn(f"tls: a {mlen}-byte hello message from the "
                              f"{_SIDES[direction]} (packet {side.hs_pkt}) is too long; "
                              f"handshake not parsed")
                    side.hs_alive = False
                    side.hs_buf = bytearray()
                    return
                if len(buf) < 4 + mlen:
                    return
                msg = bytes(buf[4:4 + mlen])
                del buf[:4 + mlen]
                self._on_hello(direction, mtype, msg, side.hs_ts, side.hs_pkt)
            elif len(buf) - 4 >= mlen:
                del buf[:4 + mlen]
            else:
                side.hs_skip = mlen - (len(buf) - 4)
                buf.clear()
            # The next message starts inside the record that completed this one.
            side.hs_ts = first_ts
            side.hs_pkt = pkt

    def _on_hello(self, direction: int, mtype: int, msg: bytes, ts: int, pkt: int) -> None:
        try:
            if direction == 0 and mtype == HS_CLIENT_HELLO:
                self._client_hello(msg, ts, pkt)
            elif direction == 1 and mtype == HS_SERVER_HELLO:
                self._server_hello(msg, ts)
        except _Malformed:
            what = "ClientHello" if mtype == HS_CLIENT_HELLO else "ServerHello"
            self.warn(f"tls: malformed {what} from the {_SIDES[direction]} (packet {pkt})")

    def _client_hello(self, msg: bytes, ts: int, pkt: int) -> None:
        if self._sh_seen:
            return  # renegotiation in the clear: keep the first handshake's facts
        info = self.info
        self._ch_count += 1
        self._last_ch_ts = ts
        if self._ch_count == 1:
            info.client_hello_ns = ts
            info.client_hello_packet = pkt
        _need(msg, 35)
        random = msg[2:34]
        p = 34
        sid_len = msg[p]
        _need(msg, p + 1 + sid_len)
        sid = msg[p + 1:p + 1 + sid_len]
        p += 1 + sid_len
        _need(msg, p + 2)
        p += 2 + ((msg[p] << 8) | msg[p + 1])  # cipher suites
        _need(msg, p + 1)
        p += 1 + msg[p]  # compression methods
        _need(msg, p)
        exts = _extensions(msg, p)
        self._ch_sid = sid
        if info.client_random is None:
            info.client_random = random
        sni = exts.get(EXT_SERVER_NAME)
        if sni is not None and info.sni is None:
            info.sni = _server_name(sni)
        alpn = exts.get(EXT_ALPN)
        if alpn is not None and not info.alpn_offered:
            info.alpn_offered = _alpn_list(alpn)
        ticket = exts.get(EXT_SESSION_TICKET)
        if (ticket is not None and len(ticket) > 0) or EXT_PRE_SHARED_KEY in exts:
            info.session_ticket_offered = True

    def _server_hello(self, msg: bytes, ts: int) -> None:
        if self._sh_seen:
            return
        _need(msg, 35)
        legacy = (msg[0] << 8) | msg[1]
        random = msg[2:34]
        p = 34
        sid_len = msg[p]
        _need(msg, p + 1 + sid_len + 3)
        sid = msg[p + 1:p + 1 + sid_len]
        p += 1 + sid_len
        cipher = (msg[p] << 8) | msg[p + 1]
        self.compression_method = msg[p + 2]
        p += 3  # cipher suite, compression method
        exts = _extensions(msg, p)
        version = legacy
        sv = exts.get(EXT_SUPPORTED_VERSIONS)
        if sv is not None and len(sv) >= 2:
            version = (sv[0] << 8) | sv[1]
        info = self.info
        info.version = version_name(version)
        info.cipher = cipher_name(cipher)
        tls13 = is_tls13(version)
        if random == HRR_RANDOM:
            info.hello_retry = True
            self._tls13 = tls13
            return
        self._sh_seen = True
        self._sh_ts = ts
        self._version = version
        self._cipher = cipher
        self.server_random = bytes(random)
        self.encrypt_then_mac = EXT_ENCRYPT_THEN_MAC in exts
        alpn = exts.get(EXT_ALPN)
        if alpn is not None:
            protocols = _alpn_list(alpn)
            if protocols:
                info.alpn = protocols[0]
        if tls13:
            self._tls13 = True
            info.resumed = EXT_PRE_SHARED_KEY in exts
            for side in self._sides:
                side.encrypted = True
                side.hs_alive = False
                side.hs_buf = bytearray()
        else:
            info.resumed = bool(sid) and sid == self._ch_sid


def _need(msg: bytes, end: int) -> None:
    if end > len(msg):
        raise _Malformed


def _extensions(msg: bytes, p: int) -> dict[int, bytes]:
    """Extensions block at ``p`` (absent is fine) as ``{type: data}``."""
    out: dict[int, bytes] = {}
    if p == len(msg):
        return out
    _need(msg, p + 2)
    end = p + 2 + ((msg[p] << 8) | msg[p + 1])
    _need(msg, end)
    p += 2
    while p + 4 <= end:
        etype = (msg[p] << 8) | msg[p + 1]
        elen = (msg[p + 2] << 8) | msg[p + 3]
        p += 4
        if p + elen > end:
            raise _Malformed
        out.setdefault(etype, msg[p:p + elen])
        p += elen
    if p != end:
        raise _Malformed
    return out


def _server_name(data: bytes) -> str | None:
    """First host_name of a server_name extension."""
    _need(data, 2)
    end = 2 + ((data[0] << 8) | data[1])
    _need(data, end)
    p = 2
    while p + 3 <= end:
        ntype = data[p]
        nlen = (data[p + 1] << 8) | data[p + 2]
        p += 3
        if p + nlen > end:
            raise _Malformed
        if ntype == 0:
            return data[p:p + nlen].decode("utf-8", "replace")
        p += nlen
    return None


def _alpn_list(data: bytes) -> list[str]:
    """Protocol names of an ALPN extension, in order."""
    _need(data, 2)
    end = 2 + ((data[0] << 8) | data[1])
    _need(data, end)
    out: list[str] = []
    p = 2
    while p < end:
        plen = data[p]
        p += 1
        if p + plen > end:
            raise _Malformed
        out.append(data[p:p + plen].decode("utf-8", "replace"))
        p += plen
    return out
