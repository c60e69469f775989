"""QUIC on the wire (RFC 9000, 9001, 9369): headers, packet protection, frames.

Sans-IO and passive: every function reads bytes it is given and raises
:class:`QuicMalformed` (never another exception) on bytes that do not parse.
Packet protection uses aioquic's pieces (its C ``AEAD`` and ``HeaderProtection`` through
``aioquic.quic.crypto.CryptoContext``, and ``aioquic.tls``'s HKDF); the header and frame
parsers are our own, because aioquic's live inside its connection state machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # aioquic (and the x509 and certifi it imports) loads at the first
    # QUIC packet to decrypt, not at the start of every report: 0.1 s
    from aioquic.quic.crypto import CryptoContext

VERSION_1 = 0x00000001
VERSION_2 = 0x6B3343CF
DRAFT_29 = 0xFF00001D
KNOWN_VERSIONS = frozenset({VERSION_1, VERSION_2, DRAFT_29})
"""Versions whose Initial packets we can decrypt."""
AES_128_GCM_SHA256 = 0x1301
"""The cipher suite of Initial packets (RFC 9001 section 5.2)."""

INITIAL_SALTS = {
    VERSION_1: bytes.fromhex("38762cf7f55934b34d179ae6a4c80cadccbb7f0a"),
    VERSION_2: bytes.fromhex("0dede3def700a6db819381be6e269dcbf9bd2ed9"),
    DRAFT_29: bytes.fromhex("afbfec289993d24c9e9786f19c6111e04390a899"),
}
"""RFC 9001 section 5.2, RFC 9369 section 3.3.1, draft-ietf-quic-tls-29 section 5.2."""

# packet types (our own numbering, version independent)
INITIAL, ZERO_RTT, HANDSHAKE, RETRY, VERSION_NEGOTIATION, ONE_RTT = range(6)
TYPE_NAMES = ("initial", "0rtt", "handshake", "retry", "version_negotiation", "1rtt")
_V1_TYPES = (INITIAL, ZERO_RTT, HANDSHAKE, RETRY)
_V2_TYPES = (RETRY, INITIAL, ZERO_RTT, HANDSHAKE)

MAX_CID = 20
SAMPLE = 16


class QuicMalformed(Exception):
    """Bytes that are not the QUIC structure they should be."""


def version_name(version: int) -> str:
    """``1``, ``2``, ``draft-29`` or the hex number."""
    if version == VERSION_1:
        return "1"
    if version == VERSION_2:
        return "2"
    if version & 0xFFFFFF00 == 0xFF000000:
        return f"draft-{version & 0xFF}"
    return f"0x{version:08x}"


def varint(data: bytes, p: int) -> tuple[int, int]:
    """The variable-length integer at ``p`` and the offset after it."""
    if p >= len(data):
        raise QuicMalformed("varint beyond the end")
    first = data[p]
    n = 1 << (first >> 6)
    if p + n > len(data):
        raise QuicMalformed("varint beyond the end")
    v = first & 0x3F
    for i in range(1, n):
        v = (v << 8) | data[p + i]
    return v, p + n


@dataclass(slots=True)
class LongHeader:
    """A long-header packet (or Version Negotiation), as far as it is readable in clear."""

    ptype: int
    version: int
    dcid: bytes
    scid: bytes
    start: int
    """Offset of the packet in the datagram."""
    pn_offset: int
    """Offset (in the datagram) of the protected packet number; 0 for VN, Retry and a
    version not in :data:`KNOWN_VERSIONS` (whose packet ends the datagram)."""
    end: int
    """Offset after the packet (coalesced packets follow)."""
    token: bytes = b""
    versions: list[int] = field(default_factory=list)
    """Version Negotiation: the versions the server offers."""


def parse_long(data: bytes, p: int) -> LongHeader:
    """The long-header packet at ``p`` of a datagram."""
    if p + 7 > len(data):
        raise QuicMalformed("long header cut short")
    first = data[p]
    version = int.from_bytes(data[p + 1:p + 5], "big")
    q = p + 5
    dl = data[q]
    if dl > MAX_CID or q + 1 + dl >= len(data):
        raise QuicMalformed("bad destination connection id length")
    dcid = data[q + 1:q + 1 + dl]
    q += 1 + dl
    sl = data[q]
    if sl > MAX_CID or q + 1 + sl > len(data):
        raise QuicMalformed("bad source connection id length")
    scid = data[q + 1:q + 1 + sl]
    q += 1 + sl
    if version == 0:
        n = (len(data) - q) // 4
        versions = [int.from_bytes(data[q + 4 * i:q + 4 * i + 4], "big") for i in range(n)]
        return LongHeader(VERSION_NEGOTIATION, 0, dcid, scid, p, 0, len(data),
                          versions=versions)
    if version not in KNOWN_VERSIONS:
        # RFC 8999: beyond the connection ids the layout is the version's own; the
        # rest of the datagram is taken as one packet, counted as an Initial (only a
        # client's Initial-sized one starts a connection: QuicAnalyzer._find)
        return LongHeader(INITIAL, version, dcid, scid, p, 0, len(data))
    if not first & 0x40:
        raise QuicMalformed("fixed bit is zero")
    bits = (first & 0x30) >> 4
    ptype = _V2_TYPES[bits] if version == VERSION_2 else _V1_TYPES[bits]
    token = b""
    if ptype == RETRY:
        if len(data) - q < 16:
            raise QuicMalformed("retry cut short")
        return LongHeader(RETRY, version, dcid, scid, p, 0, len(data),
                          token=data[q:len(data) - 16])
    if ptype == INITIAL:
        tl, q = varint(data, q)
        if q + tl > len(data):
            raise QuicMalformed("token beyond the end")
        token = data[q:q + tl]
        q += tl
    length, q = varint(data, q)
    end = q + length
    if end > len(data) or length < 4 + SAMPLE - 3:  # pn (1..4) + sample must fit
        raise QuicMalformed("packet length beyond the datagram")
    return LongHeader(ptype, version, dcid, scid, p, q, end, token=token)


def initial_secrets(dcid: bytes, version: int) -> tuple[bytes, bytes]:
    """(client, server) Initial secrets from the client's first Destination CID."""
    from aioquic.tls import CipherSuite, cipher_suite_hash, hkdf_expand_label, hkdf_extract

    salt = INITIAL_SALTS.get(version, INITIAL_SALTS[VERSION_1])
    algorithm = cipher_suite_hash(CipherSuite.AES_128_GCM_SHA256)
    initial = hkdf_extract(algorithm, salt, dcid)
    size = algorithm.digest_size
    return (hkdf_expand_label(algorithm, initial, b"client in", b"", size),
            hkdf_expand_label(algorithm, initial, b"server in", b"", size))


def context(cipher_suite: int, secret: bytes, version: int) -> CryptoContext:
    """Packet protection keys for one direction and space (``quic key/iv/hp``, or the
    ``quicv2`` labels for version 2), as aioquic derives them."""
    from aioquic.quic.crypto import CryptoContext
    from aioquic.tls import CipherSuite

    ctx = CryptoContext()
    ctx.setup(cipher_suite=CipherSuite(cipher_suite), secret=secret,
              version=VERSION_2 if version == VERSION_2 else VERSION_1)
    return ctx


def initial_contexts(dcid: bytes, version: int) -> tuple[CryptoContext, CryptoContext]:
    """(client, server) Initial packet protection."""
    c, s = initial_secrets(dcid, version)
    return (context(AES_128_GCM_SHA256, c, version), context(AES_128_GCM_SHA256, s, version))


def unprotect(ctx: CryptoContext, packet: bytes, pn_offset: int,
              expected: int) -> tuple[bytes, bytes, int]:
    """(plain header, payload, full packet number) of one protected packet (``packet``
    starts at its first byte and ends at its end); QuicMalformed if it does not
    authenticate."""
    if pn_offset + 4 + SAMPLE > len(packet):
        raise QuicMalformed("packet too short for a header protection sample")
    try:
        header, payload, pn, _changed = ctx.decrypt_packet(packet, pn_offset, expected)
    except Exception as e:  # aioquic's CryptoError, or ValueError from the C module
        raise QuicMalformed(f"packet does not decrypt ({type(e).__name__})") from None
    return header, payload, pn


# -- frames ---------------------------------------------------------------------------
PADDING, PING, ACK, ACK_ECN = 0x00, 0x01, 0x02, 0x03
RESET_STREAM, STOP_SENDING, CRYPTO, NEW_TOKEN = 0x04, 0x05, 0x06, 0x07
STREAM_BASE = 0x08
MAX_DATA, MAX_STREAM_DATA, MAX_STREAMS_BIDI, MAX_STREAMS_UNI = 0x10, 0x11, 0x12, 0x13
DATA_BLOCKED, STREAM_DATA_BLOCKED, STREAMS_BLOCKED_BIDI, STREAMS_BLOCKED_UNI = (
    0x14, 0x15, 0x16, 0x17)
NEW_CONNECTION_ID, RETIRE_CONNECTION_ID = 0x18, 0x19
PATH_CHALLENGE, PATH_RESPONSE = 0x1A, 0x1B
CONNECTION_CLOSE, CONNECTION_CLOSE_APP, HANDSHAKE_DONE = 0x1C, 0x1D, 0x1E
DATAGRAM, DATAGRAM_LEN = 0x30, 0x31

FRAME_NAMES = {
    PADDING: "PADDING", PING: "PING", ACK: "ACK", ACK_ECN: "ACK", RESET_STREAM: "RESET_STREAM",
    STOP_SENDING: "STOP_SENDING", CRYPTO: "CRYPTO", NEW_TOKEN: "NEW_TOKEN",
    MAX_DATA: "MAX_DATA", MAX_STREAM_DATA: "MAX_STREAM_DATA", MAX_STREAMS_BIDI: "MAX_STREAMS",
    MAX_STREAMS_UNI: "MAX_STREAMS", DATA_BLOCKED: "DATA_BLOCKED",
    STREAM_DATA_BLOCKED: "STREAM_DATA_BLOCKED", STREAMS_BLOCKED_BIDI: "STREAMS_BLOCKED",
    STREAMS_BLOCKED_UNI: "STREAMS_BLOCKED", NEW_CONNECTION_ID: "NEW_CONNECTION_ID",
    RETIRE_CONNECTION_ID: "RETIRE_CONNECTION_ID", PATH_CHALLENGE: "PATH_CHALLENGE",
    PATH_RESPONSE: "PATH_RESPONSE", CONNECTION_CLOSE: "CONNECTION_CLOSE",
    CONNECTION_CLOSE_APP: "CONNECTION_CLOSE", HANDSHAKE_DONE: "HANDSHAKE_DONE",
    DATAGRAM: "DATAGRAM", DATAGRAM_LEN: "DATAGRAM",
}


@dataclass(slots=True)
class Frame:
    """One frame of a decrypted packet payload (the fields its type has)."""

    ftype: int
    """Frame type (``0x08``-``0x0f`` for STREAM variants)."""
    stream_id: int | None = None
    offset: int = 0
    data: bytes = b""
    """CRYPTO, STREAM, DATAGRAM, NEW_TOKEN payload; the connection id of
    NEW_CONNECTION_ID; the reason phrase of CONNECTION_CLOSE."""
    fin: bool = False
    value: int = 0
    """ACK largest acknowledged; error code of RESET_STREAM, STOP_SENDING and
    CONNECTION_CLOSE; sequence number of NEW/RETIRE_CONNECTION_ID; the limit of MAX_*
    and *_BLOCKED."""
    extra: int = 0
    """ACK delay (encoded units); RESET_STREAM final size; NEW_CONNECTION_ID retire prior
    to; CONNECTION_CLOSE offending frame type."""

    @property
    def name(self) -> str:
        """Frame type name, ``STREAM`` for every STREAM variant."""
        if STREAM_BASE <= self.ftype <= 0x0F:
            return "STREAM"
        return FRAME_NAMES.get(self.ftype, f"0x{self.ftype:x}")


def parse_frames(payload: bytes) -> list[Frame]:
    """Every frame of a decrypted payload, in order; QuicMalformed at the first that does
    not parse (the frames before it are lost too: a packet is all or nothing)."""
    out: list[Frame] = []
    p = 0
    n = len(payload)
    while p < n:
        ftype, p = varint(payload, p)
        if ftype == PADDING:
            while p < n and payload[p] == 0:
                p += 1
            out.append(Frame(PADDING))
        elif ftype in (PING, HANDSHAKE_DONE):
            out.append(Frame(ftype))
        elif ftype in (ACK, ACK_ECN):
            largest, p = varint(payload, p)
            delay, p = varint(payload, p)
            count, p = varint(payload, p)
            _first, p = varint(payload, p)
            if count > n:
                raise QuicMalformed("ACK range count beyond the packet")
            for _ in range(count):
                _gap, p = varint(payload, p)
                _len, p = varint(payload, p)
            if ftype == ACK_ECN:
                for _ in range(3):
                    _c, p = varint(payload, p)
            out.append(Frame(ftype, value=largest, extra=delay))
        elif ftype == RESET_STREAM:
            sid, p = varint(payload, p)
            err, p = varint(payload, p)
            final, p = varint(payload, p)
            out.append(Frame(ftype, stream_id=sid, value=err, extra=final))
        elif ftype == CRYPTO:
            off, p = varint(payload, p)
            ln, p = varint(payload, p)
            if p + ln > n:
                raise QuicMalformed("CRYPTO frame beyond the packet")
            out.append(Frame(ftype, offset=off, data=payload[p:p + ln]))
            p += ln
        elif ftype == NEW_TOKEN:
            ln, p = varint(payload, p)
            if p + ln > n:
                raise QuicMalformed("NEW_TOKEN frame beyond the packet")
            out.append(Frame(ftype, data=payload[p:p + ln]))
            p += ln
        elif STREAM_BASE <= ftype <= 0x0F:
            sid, p = varint(payload, p)
            off = 0
            if ftype & 0x04:
                off, p = varint(payload, p)
            if ftype & 0x02:
                ln, p = varint(payload, p)
                if p + ln > n:
                    raise QuicMalformed("STREAM frame beyond the packet")
            else:
                ln = n - p
            out.append(Frame(ftype, stream_id=sid, offset=off, data=payload[p:p + ln],
                             fin=bool(ftype & 0x01)))
            p += ln
        elif ftype in (MAX_DATA, MAX_STREAMS_BIDI, MAX_STREAMS_UNI, DATA_BLOCKED,
                       STREAMS_BLOCKED_BIDI, STREAMS_BLOCKED_UNI, RETIRE_CONNECTION_ID):
            v, p = varint(payload, p)
            out.append(Frame(ftype, value=v))
        elif ftype in (STOP_SENDING, MAX_STREAM_DATA, STREAM_DATA_BLOCKED):
            # a stream id and one value: the error code, or the limit
            sid, p = varint(payload, p)
            v, p = varint(payload, p)
            out.append(Frame(ftype, stream_id=sid, value=v))
        elif ftype == NEW_CONNECTION_ID:
            seq, p = varint(payload, p)
            retire, p = varint(payload, p)
            if p >= n:
                raise QuicMalformed("NEW_CONNECTION_ID cut short")
            ln = payload[p]
            p += 1
            if not 1 <= ln <= MAX_CID or p + ln + 16 > n:
                raise QuicMalformed("bad NEW_CONNECTION_ID")
            out.append(Frame(ftype, data=payload[p:p + ln], value=seq, extra=retire))
            p += ln + 16
        elif ftype in (PATH_CHALLENGE, PATH_RESPONSE):
            if p + 8 > n:
                raise QuicMalformed("path frame cut short")
            out.append(Frame(ftype, data=payload[p:p + 8]))
            p += 8
        elif ftype in (CONNECTION_CLOSE, CONNECTION_CLOSE_APP):
            err, p = varint(payload, p)
            offending = 0
            if ftype == CONNECTION_CLOSE:
                offending, p = varint(payload, p)
            ln, p = varint(payload, p)
            if p + ln > n:
                raise QuicMalformed("CONNECTION_CLOSE reason beyond the packet")
            out.append(Frame(ftype, value=err, extra=offending, data=payload[p:p + ln]))
            p += ln
        elif ftype in (DATAGRAM, DATAGRAM_LEN):
            if ftype == DATAGRAM_LEN:
                ln, p = varint(payload, p)
                if p + ln > n:
                    raise QuicMalformed("DATAGRAM beyond the packet")
            else:
                ln = n - p
            out.append(Frame(ftype, data=payload[p:p + ln]))
            p += ln
        else:
            raise QuicMalformed(f"unknown frame type 0x{ftype:x}")
    return out


def describe(f: Frame) -> dict[str, Any]:
    """A frame as a small dict (tests and debugging)."""
    return {"type": f.name, "stream_id": f.stream_id, "offset": f.offset,
            "length": len(f.data), "fin": f.fin, "value": f.value}
