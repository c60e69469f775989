"""HTTP/2 analyzer for one connection (``h2`` over TLS, ``h2c`` in cleartext), sans-IO.

It implements :class:`~netdiag.protocols.base.HttpAnalyzer`: the flow layer (or the
TLS layer, with decrypted bytes) feeds each direction's bytes in order, split
anywhere, with the capture time and packet number of the segment that carried them.
Nothing here reads a clock or raises for bad bytes.

Framing. The 9-byte frame header is read with integer operations on the fed bytes;
a frame's time is the capture time of the segment carrying its first byte (the
header), its *last-byte time* that of the segment carrying its last byte. DATA
bodies are usually not even copied: the analyzer keeps a count of the body bytes
still to come and only reads the pad-length byte, so a segment inside a DATA frame
costs a few comparisons. DATA bodies are buffered only for ``text/event-stream``
responses (the SSE counter needs them). The bodies of HEADERS, PUSH_PROMISE,
SETTINGS, RST_STREAM, GOAWAY and WINDOW_UPDATE frames are read here too, with the
checks ``hyperframe`` 6 (``Frame.parse_frame_header`` + ``parse_body``) makes, in its
order and with its messages (:func:`frame_error`; ``tests/protocols/test_http2_frames.py``
compares the two): a frame hyperframe would refuse is a warning quoting its message
and is otherwise ignored. No frame object is built. A body that arrives whole in
one segment is one slice of it; CONTINUATION bodies are the header-block fragment
itself. PING, PRIORITY and unknown frame types are skipped without being copied or
checked.
One :class:`~netdiag.protocols.hpack_decode.HpackDecoder` per direction (``hpack.Decoder``'s
behaviour, compiled) decodes the header blocks (HEADERS or
PUSH_PROMISE plus CONTINUATIONs, decoded when END_HEADERS arrives, timed at the
initial frame); every block is decoded, pushes and trailers included, so that the
dynamic table stays in step with the sender's.

Per request (:class:`~netdiag.records.Request`, ``estimated=False``, in the order of
the streams' first client HEADERS):

- ``ts_ns``: the client's first HEADERS frame; ``end_ns``: last-byte time of the
  client frame carrying END_STREAM; ``request_bytes``: client DATA payload bytes,
  padding excluded; method/authority (``:authority``, else ``host``)/path and
  ``request_headers`` from the decoded block.
- ``first_byte_ns``: the first response HEADERS frame, a 1xx informational one
  included (CONTRACT.md: "the first response HEADERS frame"); ``status``,
  ``response_headers`` and ``content_type`` come from the final (non-1xx) HEADERS;
  a HEADERS after it is a trailer block (decoded, not recorded).
- ``last_byte_ns``: last-byte time of the server frame carrying END_STREAM (DATA, or
  trailers HEADERS/CONTINUATION). A response that never ended (reset, or still
  open at ``close``) keeps ``last_byte_ns`` None: its ``ttlb`` was not measured.
- ``response_bytes``: server DATA payload bytes, padding excluded (None until the
  first response frame); ``chunks``: DATA frames with a non-empty payload,
  ``chunk_gaps_ns``: the gaps between their frame times (None below two).
- ``text/event-stream`` responses: each DATA payload goes to an
  :class:`~netdiag.protocols.sse.SseCounter` at the frame's last-byte time (an event
  is complete when the frame completing it has fully arrived); then ``chunks`` =
  ``sse_events`` = events, ``chunk_gaps_ns`` = gaps between events,
  ``first_event_ns`` = the first event's time.
- ``reset``/``reset_by``: the first RST_STREAM's error code name and its sender.
- ``stall_ns``: see flow control below.

Connection facts (``http2``): ``max_concurrent_streams`` (most streams open at once:
from the client's first HEADERS until both sides ended it or one reset it),
``settings`` per side (latest value of each setting, by name), ``goaway`` (the last
GOAWAY: ``{from, error, last_stream_id, ts}``), ``rst_streams``, ``pushes``
(PUSH_PROMISE frames; pushed streams make no request), ``flow_control_stalls``,
``unmatched_streams`` (client-initiated streams answered by the server whose
request HEADERS was never seen, e.g. after a client-side gap) and ``frames`` per
side.

Flow control is tracked for the server-to-client direction only (what delays a
response): connection window 65535, stream windows from the client's
SETTINGS_INITIAL_WINDOW_SIZE (changes applied to open streams), raised by the
client's WINDOW_UPDATEs, lowered by each server DATA frame's whole payload (padding
included, as RFC 9113 counts it). A stream whose response is still pending stalls
when ``min(stream window, connection window)`` drops to 0 or below (time: the
last-byte time of the DATA or SETTINGS frame that did it, or the stream's first
HEADERS if it opened on a closed window); the stall ends at the last-byte time of
the WINDOW_UPDATE/SETTINGS that reopens it, at the stream's end or reset, or at
``close``. Each stall counts once in ``flow_control_stalls`` and adds to the
request's ``stall_ns`` (None when it never stalled). Tracking stops (open stalls
closed at that moment) when a WINDOW_UPDATE/SETTINGS body or a frame boundary of
either direction is lost.

Damaged input. A gap that falls inside a frame body whose header was seen keeps the
frame boundaries: the frame is finished without its body. A lost HEADERS/
CONTINUATION/PUSH_PROMISE fragment, an interrupted header block or a block that
fails to decode makes that direction's HPACK state unknown: every later block of
that direction is left undecoded (fields None) instead of guessed, while streams are
still opened, timed and counted from frame headers alone. A lost DATA pad-length
byte makes that response's ``response_bytes`` None; lost SSE bytes make its event
fields None. A gap that covers a frame header (or the preface), or a frame longer
than the receiver's largest advertised SETTINGS_MAX_FRAME_SIZE (at least 16384: how
non-HTTP/2 bytes show up), stops the parsing of that direction with a warning;
``max_concurrent_streams`` is then frozen and flow control no longer tracked. A
missing connection preface only gives a warning: frames are parsed anyway. Buffers
grow only with bytes actually received, never with a claimed length; header blocks
over 1 MiB are not buffered (HPACK state lost).

Cost, measured on the development machine (CPython 3.11): about 1.1-1.4 µs per
DATA frame of any size on an ordinary response (one frame per feed or ten), 0.4 µs
per TCP segment falling inside a DATA body, 4-7 µs per DATA frame of a small-event
``text/event-stream`` response (the SSE counter's share) and ~40 µs for 16 KiB
event-stream frames (pure Python; the compiled module, ``netdiag._core``, takes a
fraction of that); hyperframe's own header+body parse of one DATA frame costs 2.3-2.8
µs, which is why no frame goes through it.

Bounded state, linear time (issue 11). SETTINGS_INITIAL_WINDOW_SIZE changes move one
offset that every stream window is read through, instead of visiting the streams;
with more than :data:`FC_INDEX_OVER` streams open, the streams whose stall starts or
ends are taken from two heaps ordered by window (pending streams not stalled, stalled
ones) rather than found by a scan; the results are those of the scan (a DATA frame
whose last byte was lost, after which a stall may disagree with its windows, makes
the next check a scan again, as before). Flow-control bookkeeping is allowed
:data:`FC_WORK_BASE` steps plus :data:`FC_WORK_PER_FRAME` per frame; past that (a
connection window shut and opened again and again over thousands of streams) flow
control is no longer tracked. At most :data:`MAX_OPEN_STREAMS` streams are followed:
beyond, the oldest stops being followed (its request stays as seen, its later frames
are ignored). The HPACK dynamic table of each direction honours the receiver's
SETTINGS_HEADER_TABLE_SIZE up to :data:`MAX_HPACK_TABLE`. Header blocks longer than
:data:`HPACK_WHOLE` bytes are decoded in runs of whole fields (``hpack.Decoder`` copies
the rest of its input at every literal field; both quote the rest of their input in
an error message, which the runs keep short). Each cap reached is counted in
``limits_hit`` (keys ``LIMIT_*``) with one warning.

h2c upgrade: pass ``upgrade_request`` (the HTTP/1.1 request with ``Upgrade: h2c``);
it becomes stream 1, already half-closed by the client, and its response is read
from the server's HTTP/2 frames on stream 1. Feed the client bytes from the
connection preface on and the server bytes after the ``101`` response. Its
``HTTP2-Settings`` header, when present in ``request_headers``, gives the client's
settings. A ``first_byte_ns`` the caller already set (the ``101``, an interim
response like any 1xx) is kept, else it is the first HEADERS on stream 1;
``status``/``response_headers`` become the final HTTP/2 response's, and
``last_byte_ns``/``response_bytes``/``chunks`` are measured on stream 1.
"""

from __future__ import annotations

import base64
import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from hpack import HPACKDecodingError, InvalidTableSizeError, OversizedHeaderListError

from netdiag.protocols.base import AnalyzerKind, add_warning
from netdiag.protocols.hpack_decode import HpackDecoder
from netdiag.protocols.sse import (
    SseCounter,
    add_events,
    final_response,
    response_status,
)
from netdiag.records import Request, ns_to_ts

if TYPE_CHECKING:
    from hpack import Decoder

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The client connection preface (24 bytes)."""
SHARED_HEADERS_MAX = 1 << 14
"""Decoded header fields kept once and shared by every request that repeats them
(``:method: GET``, ``content-type: ...``): a big capture repeats the same fields millions
of times. Fields with values longer than :data:`SHARED_VALUE_MAX` are never shared;
once full, the cache stops growing (nothing depends on it but memory)."""
SHARED_VALUE_MAX: Final = 96
_shared_headers: dict[tuple[bytes, bytes], Any] = {}
"""The shared ``(name, value)`` tuples of ``str``, by the field's bytes (values typed
``Any``, see :func:`_text_pair`: compiled, the module then hands on these very tuple
objects, not copies)."""


def _text_pair(k: bytes, v: bytes) -> Any:
    """``(name, value)`` as ``str``, built once (typed ``Any``: compiled, a tuple typed as
    one would be copied into a new tuple wherever it is stored or returned)."""
    return k.decode("utf-8", "replace"), v.decode("utf-8", "replace")


def _header_pair(k: bytes | bytearray | memoryview, v: bytes | bytearray | memoryview
                 ) -> Any:
    """One decoded header field as text (``tuple[str, str]``), the same tuple for every
    repeat of a short one."""
    kb, vb = bytes(k), bytes(v)
    if len(vb) > SHARED_VALUE_MAX:
        return _text_pair(kb, vb)
    key = (kb, vb)
    pair = _shared_headers.get(key)
    if pair is None:
        pair = _text_pair(kb, vb)
        if len(_shared_headers) < SHARED_HEADERS_MAX:
            _shared_headers[key] = pair
    return pair


def _header_pairs(fields: list[Any]) -> list[tuple[str, str]]:
    """:func:`_header_pair` of each field of a decoded block (tuples of ``bytes``, as
    ``HpackDecoder`` returns them: a field already shared is looked up as it is)."""
    shared = _shared_headers
    out: list[Any] = []
    for field in fields:
        pair = shared.get(field)
        if pair is None:
            pair = _header_pair(field[0], field[1])
        out.append(pair)
    return out


# Wire constants are Final (mypyc inlines them); the limits below are not, so that tests
# can lower them on the compiled module too.
DATA: Final = 0
HEADERS: Final = 1
PRIORITY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PUSH_PROMISE: Final = 5
PING: Final = 6
GOAWAY: Final = 7
WINDOW_UPDATE: Final = 8
CONTINUATION: Final = 9

FLAG_END_STREAM: Final = 0x1
FLAG_ACK: Final = 0x1
FLAG_END_HEADERS: Final = 0x4
FLAG_PADDED: Final = 0x8
FLAG_PRIORITY: Final = 0x20

ERROR_CODES = {
    0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR", 0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM", 0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED",
}
"""RFC 9113 error codes by value."""

SETTING_NAMES = {
    0x1: "HEADER_TABLE_SIZE", 0x2: "ENABLE_PUSH", 0x3: "MAX_CONCURRENT_STREAMS",
    0x4: "INITIAL_WINDOW_SIZE", 0x5: "MAX_FRAME_SIZE", 0x6: "MAX_HEADER_LIST_SIZE",
    0x8: "ENABLE_CONNECT_PROTOCOL", 0x9: "NO_RFC7540_PRIORITIES",
}
"""SETTINGS parameters by identifier (RFC 9113, RFC 8441, RFC 9218)."""

SETTING_HEADER_TABLE_SIZE: Final = 0x1
SETTING_INITIAL_WINDOW_SIZE: Final = 0x4
SETTING_MAX_FRAME_SIZE: Final = 0x5

DEFAULT_WINDOW = 65535
"""Initial flow-control window of the connection and of every stream."""
DEFAULT_MAX_FRAME_SIZE = 16384
"""Largest frame a peer may send before the receiver's SETTINGS raise it."""
LARGEST_FRAME_SIZE = (1 << 24) - 1
DEFAULT_HEADER_TABLE_SIZE = 4096
MAX_HEADER_BLOCK = 1 << 20
"""Longest header block (HEADERS + CONTINUATIONs) buffered for decoding."""
MAX_HEADER_LIST = 1 << 20
"""Longest decoded header list (guards against HPACK amplification)."""
MAX_WARNINGS = 20
"""Warnings kept per connection; one more line says the rest were dropped."""
MAX_OPEN_STREAMS = 4096
"""Streams followed at once (opened by the client, not yet ended by both sides); beyond,
the oldest stops being followed (``limits_hit["http2_open_streams"]``)."""
MAX_HPACK_TABLE = 1 << 16
"""Largest HPACK dynamic table kept per direction, whatever SETTINGS_HEADER_TABLE_SIZE
allows (``limits_hit["http2_hpack_table"]``): a peer that uses more loses the decoding
of its later headers."""
HPACK_WHOLE = 1024
"""Header blocks up to this long go to the decoder's ``decode`` in one call; longer ones
in runs of whole fields of about :data:`HPACK_PIECE` bytes (``hpack.Decoder`` copies the
rest of the block for every literal field, quadratic in the block's length; either
decoder quotes the rest of its input in its error messages)."""
HPACK_PIECE = 512
"""Target length of one such run."""
FC_WORK_BASE = 1 << 18
"""Flow-control bookkeeping steps (stalls started or ended, streams visited) allowed per
connection before counting frames; each frame allows :data:`FC_WORK_PER_FRAME` more.
Beyond, flow control is no longer tracked (``limits_hit["http2_flow_control"]``)."""
FC_WORK_PER_FRAME: Final = 64
"""Flow-control bookkeeping steps each frame adds to the allowance."""
FC_INDEX_OVER = 64
"""With more streams open than this, the streams whose stall may change are found
through heaps ordered by window instead of a scan of every stream."""

LIMIT_OPEN_STREAMS = "http2_open_streams"
"""``limits_hit`` key: streams no longer followed because :data:`MAX_OPEN_STREAMS` were."""
LIMIT_HPACK_TABLE = "http2_hpack_table"
"""``limits_hit`` key: a peer grew its HPACK table beyond :data:`MAX_HPACK_TABLE` (which
its receiver's SETTINGS_HEADER_TABLE_SIZE allowed): its later headers are not decoded."""
LIMIT_FLOW_CONTROL = "http2_flow_control"
"""``limits_hit`` key: flow-control tracking stopped after too much bookkeeping."""

CLIENT: Final = 0
SERVER: Final = 1
_SIDES: tuple[str, ...] = ("client", "server")


def error_name(code: int) -> str:
    """RFC 9113 name of an error code, ``0x..`` for unknown ones."""
    return ERROR_CODES.get(code) or f"0x{code:x}"


def setting_name(ident: int) -> str:
    """Name of a SETTINGS parameter, ``0x..`` for unknown ones."""
    return SETTING_NAMES.get(ident) or f"0x{ident:x}"


# -- frame bodies ------------------------------------------------------------------------
# hyperframe 6 used to parse these frames (``Frame.parse_frame_header`` + ``parse_body``);
# the checks below are its checks, in its order, with its messages, so the warnings of a
# frame it refuses are unchanged. tests/protocols/test_http2_frames.py compares them.

def _u32(body: bytes | bytearray, i: int) -> int:
    """The big-endian 32-bit integer at ``body[i:i + 4]`` (all 32 bits)."""
    return (body[i] << 24) | (body[i + 1] << 16) | (body[i + 2] << 8) | body[i + 3]


def frame_error(ftype: int, flags: int, sid: int, body: bytes | bytearray) -> str:
    """Why hyperframe would refuse a HEADERS, PUSH_PROMISE, SETTINGS, RST_STREAM, GOAWAY
    or WINDOW_UPDATE frame with this header (``sid`` without its reserved bit) and body:
    the message of the exception it raises; ``""`` when it parses the frame (and for
    other frame types, which are not checked)."""
    n = len(body)
    if ftype in (HEADERS, PUSH_PROMISE):
        if not sid:
            return ("Stream ID must be non-zero for "
                    + ("HeadersFrame" if ftype == HEADERS else "PushPromiseFrame"))
        pad = 0
        start = 0
        if flags & FLAG_PADDED:
            if not n:
                return "Invalid Padding data"
            pad = body[0]
            start = 1
        if ftype == HEADERS:
            size = n - start  # hyperframe's body_len: without the pad-length byte
            if flags & FLAG_PRIORITY and size < 5:
                return "Invalid Priority data"
        else:
            if n - start < 4:
                return "Invalid PUSH_PROMISE body"
            promised = _u32(body, start)  # all 32 bits, as hyperframe reads it
            if promised == 0 or promised % 2:
                return f"Invalid PUSH_PROMISE promised stream id: {promised}"
            size = n
        if pad and pad >= size:
            return "Padding is too long."
        return ""
    if ftype == SETTINGS:
        if sid:
            return f"Stream ID must be zero for SettingsFrame with stream_id={sid}"
        if flags & FLAG_ACK and n:
            return f"SETTINGS ack frame must not have payload: got {n} bytes"
        if n % 6:
            return "Invalid SETTINGS body"
        return ""
    if ftype == RST_STREAM:
        if not sid:
            return "Stream ID must be non-zero for RstStreamFrame"
        if n != 4:
            return f"RST_STREAM must have 4 byte body: actual length {n}."
        return ""
    if ftype == GOAWAY:
        if sid:
            return f"Stream ID must be zero for GoAwayFrame with stream_id={sid}"
        if n < 8:
            return "Invalid GOAWAY body."
        return ""
    if ftype == WINDOW_UPDATE:
        if n > 4:
            return f"WINDOW_UPDATE frame must have 4 byte length: got {n}"
        if n < 4:
            return "Invalid WINDOW_UPDATE body"
        if not 1 <= _u32(body, 0) <= 0x7FFFFFFF:
            return "WINDOW_UPDATE increment must be between 1 to 2^31-1"
    return ""


def fragment_bounds(ftype: int, flags: int, body: bytes | bytearray) -> tuple[int, int]:
    """``(start, end)`` of the header block fragment in the body of a HEADERS or
    PUSH_PROMISE frame that :func:`frame_error` accepts (hyperframe's ``frame.data`` is
    ``body[start:end]``, empty when ``end <= start``)."""
    pad = 0
    start = 0
    if flags & FLAG_PADDED:
        pad = body[0]
        start = 1
    if ftype == PUSH_PROMISE:
        start += 4
    elif flags & FLAG_PRIORITY:
        start += 5
    end = len(body) - pad  # > 0: the padding is shorter than the body
    return start, end if end > start else start


def settings_of(body: bytes | bytearray) -> dict[int, int]:
    """The parameters of a SETTINGS body :func:`frame_error` accepts, by identifier: the
    last value of each, in the order of their first appearance (hyperframe's dict)."""
    out: dict[int, int] = {}
    for i in range(0, len(body), 6):
        out[(body[i] << 8) | body[i + 1]] = _u32(body, i + 2)
    return out


def _int_end(block: bytes, pos: int, prefix: int) -> int:
    """End of the HPACK integer at ``pos`` (``prefix`` bits), as ``hpack`` would read it;
    -1 when it runs past the block or is longer than ``hpack`` accepts."""
    if block[pos] & prefix != prefix:
        return pos + 1
    n = len(block)
    i = pos + 1
    while i < n:
        if i - pos > 5:  # hpack's VARINT_MAX_LENGTH
            return -1
        if block[i] < 128:
            return i + 1
        i += 1
    return -1


def _field_end(block: bytes, pos: int) -> tuple[int, bool]:
    """(end of the header field representation at ``pos``, is a table size update);
    end -1 when it cannot be delimited (left to ``hpack`` to report)."""
    b = block[pos]
    if b & 0x80:  # indexed
        return _int_end(block, pos, 0x7F), False
    if b & 0x40:  # literal with incremental indexing
        mask = 0x3F
    elif b & 0x20:  # dynamic table size update
        return _int_end(block, pos, 0x1F), True
    else:  # literal without indexing / never indexed
        mask = 0x0F
    n = len(block)
    if b & mask:
        end = _int_end(block, pos, mask)
        strings = 1
    else:
        end = pos + 1
        strings = 2
    for _ in range(strings):
        if end < 0 or end >= n:
            return -1, False
        start = end
        end = _int_end(block, start, 0x7F)
        if end < 0:
            return -1, False
        length = block[start] & 0x7F
        if length == 0x7F:
            shift = 0
            length = 0x7F
            for k in range(start + 1, end):
                length += (block[k] & 0x7F) << shift
                shift += 7
        end += length
        if end > n:
            return -1, False
    return end, False


def _pieces(block: bytes) -> Iterator[tuple[bytes, bool]]:
    """Runs of whole fields of about :data:`HPACK_PIECE` bytes, each with whether hpack
    would then meet a table size update after a field (an error it reports before
    reading the update)."""
    n = len(block)
    pos = start = 0
    seen_field = False
    while pos < n:
        end, update = _field_end(block, pos)
        if end < 0:
            break
        if update and seen_field:
            yield block[start:pos], True
            return
        seen_field = seen_field or not update
        pos = end
        if pos - start >= HPACK_PIECE:
            yield block[start:pos], False
            start = pos
    if start < n:
        yield block[start:], False


def _decode_block(decoder: HpackDecoder | Decoder, block: bytes) -> Iterable[Any]:
    """``decoder.decode(block, raw=True)``, in linear time for long blocks (with
    ``hpack.Decoder`` too).

    A block longer than :data:`HPACK_WHOLE` is decoded in runs of whole fields (the
    table, the header list size limit and hpack's errors are those of one call: a run
    that cannot be delimited goes whole to hpack, which reports it).
    """
    if len(block) <= HPACK_WHOLE:
        return decoder.decode(block, raw=True)
    headers: list[Any] = []
    inflated = 0
    limit = decoder.max_header_list_size
    try:
        for piece, misplaced in _pieces(block):
            decoder.max_header_list_size = limit - inflated
            try:
                got = decoder.decode(piece, raw=True)
            except OversizedHeaderListError:
                raise OversizedHeaderListError(
                    f"A header list larger than {limit} has been received") from None
            headers.extend(got)
            if misplaced:
                raise HPACKDecodingError("Table size update not at the start of the block")
            for name, value in got:
                inflated += 32 + len(name) + len(value)
    finally:
        decoder.max_header_list_size = limit
    return headers


class _Dir:
    """Parsing state of one direction."""

    __slots__ = (
        "acc", "block", "block_end_stream", "block_kind", "block_lost", "block_sid",
        "block_ts", "body", "decoder", "f_off", "f_pkt", "f_ts", "flags", "frames", "ftype",
        "hdr", "hdr_off", "hdr_pkt", "hdr_ts", "hpack_allowed", "hpack_ok", "last_lost",
        "length", "lost", "max_frame_size", "offset", "pad_len", "pad_pending",
        "preface_left", "remaining", "sid", "stopped",
    )

    def __init__(self) -> None:
        self.stopped = False
        self.preface_left = 0
        self.offset = 0
        self.frames = 0
        self.max_frame_size = DEFAULT_MAX_FRAME_SIZE
        # Partial frame header.
        self.hdr = b""
        self.hdr_ts = 0
        self.hdr_pkt = 0
        self.hdr_off = 0
        # Current frame.
        self.ftype = 0
        self.flags = 0
        self.sid = 0
        self.length = 0
        self.remaining = 0
        self.f_ts = 0
        self.f_pkt = 0
        self.f_off = 0
        self.body: bytes | bytearray | None = None
        """The current frame's whole body, when it is read (set when its last byte
        arrives; None when lost or not needed)."""
        self.acc: bytearray | None = None
        """The body collected so far when it spans segments (None: not collected)."""
        self.pad_pending = False
        self.pad_len = 0
        self.lost = False
        self.last_lost = False
        # HPACK and the header block being assembled.
        self.decoder = HpackDecoder(max_header_list_size=MAX_HEADER_LIST)
        self.hpack_allowed = 0
        """Largest SETTINGS_HEADER_TABLE_SIZE of the receiver above MAX_HPACK_TABLE (0: none)."""
        self.hpack_ok = True
        self.block: bytes | bytearray | None = None
        self.block_sid: int | None = None
        self.block_kind = HEADERS
        self.block_end_stream = False
        self.block_ts = 0
        self.block_lost = False


class _Stream:
    """State of one client-initiated stream."""

    __slots__ = (
        "client_ended", "fc_ver", "final", "gaps", "last_chunk_ns", "req", "responded",
        "server_ended", "sse", "sse_broken", "stall_start", "window",
    )

    def __init__(self, req: Request, window: int) -> None:
        self.req = req
        self.window = window
        """Flow-control window less the analyzer's ``_shift`` (the sum of the
        SETTINGS_INITIAL_WINDOW_SIZE changes, which apply to every open stream)."""
        self.fc_ver = 0
        """Bumped at every change of window or stall: older heap entries are stale."""
        self.client_ended = False
        self.server_ended = False
        self.responded = False
        self.final = False
        self.sse: SseCounter | None = None
        self.sse_broken = False
        self.last_chunk_ns: int | None = None
        self.gaps: list[int] = []
        self.stall_start: int | None = None


class Http2Analyzer:
    """Passive analyzer of one HTTP/2 connection (see the module docstring)."""

    def __init__(self, *, protocol: str = "h2", upgrade_request: Request | None = None,
                 expect_preface: bool = True) -> None:
        self._protocol = protocol
        self._dirs: tuple[_Dir, ...] = (_Dir(), _Dir())
        """Client, then server (a tuple of any length to mypyc: indexed by direction)."""
        if expect_preface:
            self._dirs[CLIENT].preface_left = len(PREFACE)
        self._requests: list[Request] = []
        self._warnings: list[str] = []
        self._streams: dict[int, _Stream] = {}
        self._max_client_sid = 0
        self._max_open = 0
        self._concurrency_ok = True
        self._settings: tuple[dict[str, int], ...] = ({}, {})
        self._goaway: dict[str, Any] | None = None
        self._rst = 0
        self._pushes = 0
        self._stalls = 0
        self._unmatched = 0
        self._last_unmatched = 0
        # Server-to-client flow control.
        self._fc_ok = True
        self._conn_window = DEFAULT_WINDOW
        self._init_window = DEFAULT_WINDOW
        self._stalled: set[int] = set()
        self._shift = 0
        """Added to every ``_Stream.window`` (INITIAL_WINDOW_SIZE changes, O(1) each)."""
        self._fc_dirty = False
        """The stall of some stream may disagree with its windows (a DATA frame's last
        byte was lost): the next check visits every stream, as it always did."""
        self._fc_indexed = False
        self._open_heap: list[tuple[int, int, int, _Stream]] = []
        """Pending streams not stalled, by window: ``(window, seq, fc_ver, stream)``."""
        self._stalled_heap: list[tuple[int, int, int, _Stream]] = []
        """Stalled streams, largest window first: ``(-window, seq, fc_ver, stream)``."""
        self._fc_seq = 0
        self._fc_bulk = False
        self._fc_spent = 0
        """Flow-control bookkeeping steps so far (see :meth:`_charge`)."""
        self._open_order: deque[tuple[int, _Stream]] = deque()
        """Streams in the order they opened (stale entries skipped): the oldest goes first."""
        self.limits_hit: dict[str, int] = {}
        """Caps reached on this connection, by kind (:data:`LIMIT_OPEN_STREAMS`,
        :data:`LIMIT_HPACK_TABLE`, :data:`LIMIT_FLOW_CONTROL`); empty when none was."""
        if upgrade_request is not None:
            self._start_upgrade(upgrade_request)

    # -- HttpAnalyzer ------------------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """Requests in the order of their streams' first HEADERS."""
        return self._requests

    @property
    def warnings(self) -> list[str]:
        """Plain sentences about bytes that could not be parsed."""
        return self._warnings

    @property
    def protocol(self) -> str:
        """``h2`` or ``h2c``, as given."""
        return self._protocol

    @property
    def kind(self) -> AnalyzerKind:
        """``http``."""
        return "http"

    @property
    def client_random(self) -> bytes | None:
        """None: the TLS layer, if any, is not this analyzer's."""
        return None

    @property
    def http2(self) -> dict[str, Any]:
        """Connection facts (``Connection.http2``), built on each access."""
        return {
            "max_concurrent_streams": self._max_open,
            "settings": {"client": dict(self._settings[CLIENT]),
                         "server": dict(self._settings[SERVER])},
            "goaway": None if self._goaway is None else dict(self._goaway),
            "rst_streams": self._rst,
            "pushes": self._pushes,
            "flow_control_stalls": self._stalls,
            "unmatched_streams": self._unmatched,
            "frames": {"client": self._dirs[CLIENT].frames, "server": self._dirs[SERVER].frames},
        }

    def feed(self, direction: int, ts_ns: int, data: bytes | bytearray | memoryview,
             packet: int) -> None:
        """In-order bytes of ``direction`` from the segment captured at ``ts_ns``.

        The flow and TLS layers give ``bytes``; another bytes-like object is copied
        first."""
        d = self._dirs[direction]
        if d.stopped or not data:
            return
        if not isinstance(data, bytes):
            data = bytes(data)
        pos = 0
        if d.preface_left:
            done = len(PREFACE) - d.preface_left
            k = min(d.preface_left, len(data))
            if bytes(data[:k]) == PREFACE[done:done + k]:
                d.preface_left -= k
                d.offset += k
                pos = k
                if pos == len(data):
                    return
            else:
                d.preface_left = 0
                self._warn(f"http2: the client stream does not start with the connection "
                           f"preface (packet {packet}); parsing frames anyway")
                if done:
                    d.offset -= done
                    self._parse(d, direction, ts_ns, PREFACE[:done], packet, 0)
                    if d.stopped:
                        return
        self._parse(d, direction, ts_ns, data, packet, pos)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """``nbytes`` of ``direction`` were never captured before the next feed."""
        d = self._dirs[direction]
        if d.stopped or nbytes <= 0:
            return
        name = _SIDES[direction]
        if d.preface_left or d.hdr or not d.remaining or nbytes > d.remaining:
            self._stop(d, direction, f"http2: {nbytes} bytes of the {name} stream were not "
                       f"captured at byte {d.offset}, across a frame header; the rest of that "
                       f"direction is not parsed")
            return
        self._warn(f"http2: {nbytes} bytes of the {name} stream were not captured, inside a "
                   f"frame of type {d.ftype} on stream {d.sid}; frame boundaries kept")
        d.offset += nbytes
        d.remaining -= nbytes
        d.lost = True
        if d.pad_pending:
            d.pad_pending = False
            d.pad_len = -1  # the pad-length byte was lost: payload size unknown
        d.body = None
        d.acc = None
        if not d.remaining:
            d.last_lost = True
            self._frame_done(d, direction, ts_ns)

    def close(self, ts_ns: int) -> None:
        """End of the connection: open stalls end at ``ts_ns``; nothing else is guessed."""
        for sid in list(self._stalled):
            st = self._streams.get(sid)
            if st is not None:
                self._end_stall(st, ts_ns)
        self._stalled.clear()
        for direction, d in enumerate(self._dirs):
            if d.block_sid is not None and not d.stopped:
                self._warn(f"http2: the {_SIDES[direction]} header block of stream "
                           f"{d.block_sid} never ended")
                d.block_sid = None
                d.block = None

    # -- framing -----------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        add_warning(self._warnings, message, MAX_WARNINGS,
                    "http2: further warnings on this connection dropped")

    def _stop(self, d: _Dir, direction: int, message: str) -> None:
        self._warn(message)
        d.stopped = True
        d.body = None
        d.acc = None
        d.block = None
        d.hdr = b""
        self._concurrency_ok = False
        self._fc_stop()
        # Streams can no longer end in this direction: close those the other side ended.
        for st in list(self._streams.values()):
            self._maybe_close(st)

    def _parse(self, d: _Dir, direction: int, ts: int, data: bytes, pkt: int,
               pos: int) -> None:
        n = len(data)
        base = d.offset - pos
        d.offset += n - pos
        while pos < n:
            rem = d.remaining
            if rem:
                take = n - pos
                if take > rem:
                    take = rem
                if d.pad_pending:
                    d.pad_len = data[pos]
                    d.pad_pending = False
                acc = d.acc
                if acc is not None:
                    acc += data[pos:pos + take]
                pos += take
                rem -= take
                d.remaining = rem
                if rem:
                    return
                d.body = acc
                d.acc = None
                self._frame_done(d, direction, ts)
                if d.stopped:
                    return
                continue
            if d.hdr:
                need = 9 - len(d.hdr)
                head = d.hdr + bytes(data[pos:pos + need])
                if len(head) < 9:
                    d.hdr = head
                    return
                pos += need
                d.hdr = b""
                length = (head[0] << 16) | (head[1] << 8) | head[2]
                ftype = head[3]
                flags = head[4]
                sid = (((head[5] & 0x7F) << 24) | (head[6] << 16) | (head[7] << 8)
                       | head[8])
                f_ts, f_pkt, f_off = d.hdr_ts, d.hdr_pkt, d.hdr_off
            elif n - pos >= 9:
                length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
                ftype = data[pos + 3]
                flags = data[pos + 4]
                sid = (((data[pos + 5] & 0x7F) << 24) | (data[pos + 6] << 16)
                       | (data[pos + 7] << 8) | data[pos + 8])
                f_ts, f_pkt, f_off = ts, pkt, base + pos
                pos += 9
            else:
                d.hdr = bytes(data[pos:])
                d.hdr_ts, d.hdr_pkt, d.hdr_off = ts, pkt, base + pos
                return
            if length > d.max_frame_size:
                self._stop(d, direction, f"http2: {_SIDES[direction]} frame of {length} bytes "
                           f"at byte {f_off} (packet {f_pkt}) exceeds the receiver's maximum "
                           f"frame size {d.max_frame_size}; not HTTP/2 or corrupt, the rest "
                           f"of that direction is not parsed")
                return
            d.ftype = ftype
            d.flags = flags
            d.sid = sid
            d.length = length
            d.f_ts, d.f_pkt, d.f_off = f_ts, f_pkt, f_off
            d.lost = False
            d.last_lost = False
            d.pad_len = 0
            keep = False  # the body is read
            if ftype == DATA:
                d.pad_pending = length > 0 and (flags & FLAG_PADDED) != 0
                if direction == SERVER and length:
                    st = self._streams.get(sid)
                    keep = st is not None and st.sse is not None and not st.sse_broken
            else:
                d.pad_pending = False
                if ftype in (HEADERS, CONTINUATION, PUSH_PROMISE):
                    keep = d.hpack_ok and not d.block_lost
                else:
                    keep = ftype <= CONTINUATION and ftype != PING and ftype != PRIORITY
            if not length:
                d.body = b"" if keep else None
                self._frame_done(d, direction, ts)
                if d.stopped:
                    return
            elif n - pos >= length:  # the whole body is in this segment
                if d.pad_pending:
                    d.pad_len = data[pos]
                    d.pad_pending = False
                d.body = data[pos:pos + length] if keep else None
                pos += length
                self._frame_done(d, direction, ts)
                if d.stopped:
                    return
            else:
                d.body = None
                d.acc = bytearray() if keep else None
                d.remaining = length

    def _invalid(self, d: _Dir, direction: int, why: str) -> None:
        """The current frame is one hyperframe would refuse (``why``: its message)."""
        self._warn(f"http2: invalid {_SIDES[direction]} frame of type {d.ftype} on stream "
                   f"{d.sid} at byte {d.f_off} (packet {d.f_pkt}): {why}")

    def _body_ok(self, d: _Dir, direction: int) -> bytes | bytearray | None:
        """The current frame's body when :func:`frame_error` accepts it, else None (with
        the warning)."""
        body = d.body
        if body is None:
            body = b""
        why = frame_error(d.ftype, d.flags, d.sid, body)
        if why:
            self._invalid(d, direction, why)
            return None
        return body

    def _frame_done(self, d: _Dir, direction: int, last_ts: int) -> None:
        """The current frame of ``d`` is complete (its body possibly lost)."""
        d.frames += 1
        ftype = d.ftype
        last: int | None = None if d.last_lost else last_ts
        if d.block_sid is not None and not (ftype == CONTINUATION and d.sid == d.block_sid):
            self._warn(f"http2: the {_SIDES[direction]} header block of stream {d.block_sid} "
                       f"was interrupted by a frame of type {ftype}")
            d.block_lost = True
            self._block_done(d, direction, None)
        if ftype == DATA:
            if direction == SERVER:
                self._server_data(d, last)
            else:
                self._client_data(d, last)
        elif ftype in (HEADERS, PUSH_PROMISE):
            self._headers_frame(d, direction, last)
        elif ftype == CONTINUATION:
            self._continuation(d, direction, last)
        elif ftype == SETTINGS:
            self._settings_frame(d, direction, last)
        elif ftype == WINDOW_UPDATE:
            self._window_update(d, direction, last)
        elif ftype == RST_STREAM:
            self._rst_stream(d, direction, last)
        elif ftype == GOAWAY:
            self._goaway_frame(d, direction)
        d.body = None

    # -- header blocks -----------------------------------------------------------------

    def _headers_frame(self, d: _Dir, direction: int, last: int | None) -> None:
        push = d.ftype == PUSH_PROMISE
        if push:
            if direction == CLIENT:
                self._warn("http2: the client sent a PUSH_PROMISE frame")
            else:
                self._pushes += 1
        d.block_sid = d.sid
        d.block_kind = d.ftype
        d.block_end_stream = bool(d.flags & FLAG_END_STREAM) and not push
        d.block_ts = d.f_ts
        d.block_lost = d.lost
        d.block = None
        if d.hpack_ok and not d.lost:
            body = self._body_ok(d, direction)
            if body is None:
                d.block_lost = True
            else:
                start, end = fragment_bounds(d.ftype, d.flags, body)
                d.block = body if start == 0 and end == len(body) else body[start:end]
        if d.flags & FLAG_END_HEADERS:
            self._block_done(d, direction, last)

    def _continuation(self, d: _Dir, direction: int, last: int | None) -> None:
        if d.block_sid is None:
            self._warn(f"http2: {_SIDES[direction]} CONTINUATION on stream {d.sid} without a "
                       f"header block")
            return
        if d.lost:
            d.block_lost = True
        block = d.block
        body = d.body
        if not d.block_lost and d.hpack_ok and block is not None and body is not None:
            if len(block) + len(body) > MAX_HEADER_BLOCK:
                self._warn(f"http2: {_SIDES[direction]} header block of stream {d.sid} is "
                           f"longer than {MAX_HEADER_BLOCK} bytes; not decoded")
                d.block_lost = True
                d.block = None
            else:
                if not isinstance(block, bytearray):  # the first fragment, a slice
                    block = bytearray(block)
                block += body
                d.block = block
        if d.flags & FLAG_END_HEADERS:
            self._block_done(d, direction, last)

    def _block_done(self, d: _Dir, direction: int, last: int | None) -> None:
        """The header block in ``d`` ended (or was cut short: ``d.block_lost``)."""
        sid = d.block_sid
        block = d.block
        d.block_sid = None
        d.block = None
        fields: list[Any] | None = None
        """The decoded block (bytes), made text only where a request keeps it."""
        if d.hpack_ok:
            if d.block_lost or block is None:
                d.hpack_ok = False
                self._warn(f"http2: part of a {_SIDES[direction]} header block (stream {sid}) "
                           f"was lost; later {_SIDES[direction]} headers are not decoded")
            else:
                try:
                    if len(block) <= HPACK_WHOLE:
                        fields = d.decoder.decode(bytes(block), raw=True)
                    else:
                        fields = list(_decode_block(d.decoder, bytes(block)))
                except Exception as exc:  # hpack's exception classes, for bad blocks
                    d.hpack_ok = False
                    if d.hpack_allowed and isinstance(exc, InvalidTableSizeError):
                        # Within what the peer allowed, beyond what netdiag keeps.
                        self.limits_hit[LIMIT_HPACK_TABLE] = (
                            self.limits_hit.get(LIMIT_HPACK_TABLE, 0) + 1)
                        self._warn(f"http2: the {_SIDES[direction]} grew its HPACK table "
                                   f"beyond the {MAX_HPACK_TABLE} bytes netdiag keeps (it was "
                                   f"allowed {d.hpack_allowed}); later {_SIDES[direction]} "
                                   f"headers are not decoded")
                    else:
                        self._warn(f"http2: {_SIDES[direction]} header block of stream {sid} "
                                   f"could not be decoded ({type(exc).__name__}: {exc}); "
                                   f"later {_SIDES[direction]} headers are not decoded")
        d.block_lost = False
        if sid is None or d.block_kind == PUSH_PROMISE:
            return
        if direction == CLIENT:
            self._client_headers(sid, fields, d.block_ts, d.block_end_stream, last)
        else:
            self._server_headers(sid, fields, d.block_ts, d.block_end_stream, last)

    # -- streams -----------------------------------------------------------------------

    def _start_upgrade(self, req: Request) -> None:
        req.stream_id = 1
        req.protocol = self._protocol
        req.estimated = False
        # The response body, if any, is HTTP/2's: forget HTTP/1.1 figures of the 101.
        req.last_byte_ns = req.response_bytes = req.chunks = req.chunk_gaps_ns = None
        if req.request_bytes is None:
            req.request_bytes = 0
        for name, value in req.request_headers or ():
            if name.lower() == "http2-settings":
                try:
                    raw = base64.urlsafe_b64decode(value.strip() + "=" * (-len(value.strip()) % 4))
                except ValueError:
                    self._warn("http2: the HTTP2-Settings header is not base64url")
                    break
                self._apply_settings(CLIENT, {
                    int.from_bytes(raw[i:i + 2], "big"): int.from_bytes(raw[i + 2:i + 6], "big")
                    for i in range(0, len(raw) - 5, 6)}, req.ts_ns)
                break
        st = _Stream(req, self._init_window)
        st.client_ended = True
        self._max_client_sid = 1
        st.window -= self._shift
        self._open_stream(st, req.ts_ns)

    def _open_stream(self, st: _Stream, ts: int) -> None:
        sid = st.req.stream_id or 0
        streams = self._streams
        if len(streams) >= MAX_OPEN_STREAMS:
            self._forget_oldest(ts)
        streams[sid] = st
        order = self._open_order
        order.append((sid, st))
        n = len(streams)
        if len(order) > 2 * n + 64:
            self._open_order = deque(e for e in order if streams.get(e[0]) is e[1])
        self._requests.append(st.req)
        if self._concurrency_ok and n > self._max_open:
            self._max_open = n
        if self._fc_ok and min(st.window + self._shift, self._conn_window) <= 0:
            self._start_stall(st, ts)
        elif self._fc_indexed:
            self._index(st)

    def _forget_oldest(self, ts: int) -> None:
        """:data:`MAX_OPEN_STREAMS` are open: stop following the one opened first (its
        request stays, as seen so far; an open stall ends at ``ts``)."""
        streams = self._streams
        while self._open_order:
            sid, st = self._open_order.popleft()
            if streams.get(sid) is st:
                break
        else:
            return
        if st.stall_start is not None:
            self._end_stall(st, ts)
        del streams[sid]
        st.fc_ver += 1
        n = self.limits_hit.get(LIMIT_OPEN_STREAMS, 0)
        if not n:
            self._warn(f"http2: more than {MAX_OPEN_STREAMS} streams open at once; the "
                       f"oldest are no longer followed (their later frames are ignored)")
        self.limits_hit[LIMIT_OPEN_STREAMS] = n + 1

    def _maybe_close(self, st: _Stream) -> None:
        client_done = st.client_ended or self._dirs[CLIENT].stopped
        server_done = st.server_ended or self._dirs[SERVER].stopped
        if client_done and server_done:
            sid = st.req.stream_id or 0
            if self._streams.get(sid) is st:
                del self._streams[sid]

    def _client_headers(self, sid: int, fields: list[Any] | None, ts: int,
                        end_stream: bool, last: int | None) -> None:
        st = self._streams.get(sid)
        if st is None:
            if sid % 2 == 0 or sid <= self._max_client_sid:
                return  # a closed stream's late trailers, or a protocol error
            self._max_client_sid = sid
            req = Request(ts_ns=ts, stream_id=sid, estimated=False, protocol=self._protocol,
                          request_bytes=0)
            if fields is not None:
                headers = _header_pairs(fields)
                req.request_headers = headers
                host = None
                for name, value in headers:
                    if name == ":method":
                        req.method = value
                    elif name == ":path":
                        req.path = value
                    elif name == ":authority":
                        req.authority = value
                    elif name == "host" and host is None:
                        host = value
                if req.authority is None:
                    req.authority = host
            st = _Stream(req, self._init_window - self._shift)
            self._open_stream(st, ts)
        if end_stream and not st.client_ended:
            st.client_ended = True
            st.req.end_ns = last
            self._maybe_close(st)

    def _unmatched_stream(self, sid: int) -> None:
        if sid % 2 == 1 and sid > self._max_client_sid and sid > self._last_unmatched:
            self._last_unmatched = sid
            self._unmatched += 1
            if self._unmatched == 1:
                self._warn(f"http2: the server answered stream {sid} whose request was not "
                           f"seen; such responses are counted in unmatched_streams only")

    def _respond(self, st: _Stream) -> Request:
        req = st.req
        if not st.responded:
            st.responded = True
            if req.response_bytes is None:
                req.response_bytes = 0
            if req.chunks is None:
                req.chunks = 0
        return req

    def _server_headers(self, sid: int, fields: list[Any] | None, ts: int,
                        end_stream: bool, last: int | None) -> None:
        st = self._streams.get(sid)
        if st is None:
            self._unmatched_stream(sid)
            return
        req = st.req
        if req.first_byte_ns is None:
            req.first_byte_ns = ts
        self._respond(st)
        if not st.final:
            headers = None if fields is None else _header_pairs(fields)
            status = response_status(headers)
            if status is None or not 100 <= status < 200:
                st.final = True
                counter = final_response(req, status, headers)
                if counter is not None:
                    st.sse = counter
        if end_stream:
            self._server_end(st, last)

    def _server_end(self, st: _Stream, last: int | None) -> None:
        if st.server_ended:
            return
        st.server_ended = True
        st.req.last_byte_ns = last
        if st.stall_start is not None:
            self._end_stall(st, last if last is not None else st.stall_start)
        if self._fc_indexed:
            st.fc_ver += 1  # no longer pending: out of the heaps
        self._maybe_close(st)

    def _server_data(self, d: _Dir, last: int | None) -> None:
        sid = d.sid
        length = d.length
        st = self._streams.get(sid)
        closed_now = False  # this frame closed the connection window
        if self._fc_ok:
            closed_now = self._conn_window > 0 and self._conn_window <= length
            self._conn_window -= length
        if st is None:
            self._unmatched_stream(sid)
            if closed_now:
                if last is not None:
                    self._stall_all(last)
                else:
                    self._fc_dirty = True
            return
        req = self._respond(st)
        if d.pad_len < 0:
            req.response_bytes = None  # the pad-length byte was lost
            payload = length
        else:
            payload = length - (d.pad_len + 1 if d.flags & FLAG_PADDED else 0)
            if payload < 0:
                self._warn(f"http2: server DATA on stream {sid} has more padding than payload")
                payload = 0
            if req.response_bytes is not None:
                req.response_bytes += payload
        if st.sse is not None:
            if not st.sse_broken:
                if d.lost or last is None:
                    st.sse_broken = True
                    req.sse_events = req.chunks = req.chunk_gaps_ns = req.first_event_ns = None
                    self._warn(f"http2: event-stream bytes of stream {sid} were lost; its "
                               f"events are not counted")
                elif payload and d.body is not None:
                    start = 1 if d.flags & FLAG_PADDED else 0
                    add_events(st.sse, req, st.gaps, last,
                               bytes(d.body[start:start + payload]))
        elif payload and req.chunks is not None:
            req.chunks += 1
            if st.last_chunk_ns is not None:
                st.gaps.append(d.f_ts - st.last_chunk_ns)
                req.chunk_gaps_ns = st.gaps
            st.last_chunk_ns = d.f_ts
        if self._fc_ok:
            st.window -= length
            if last is not None:
                if closed_now:
                    self._stall_all(last, except_ended=st if d.flags & FLAG_END_STREAM else None)
                elif st.window + self._shift <= 0 and not d.flags & FLAG_END_STREAM:
                    self._start_stall(st, last)
            elif length:
                self._fc_dirty = True
            if self._fc_indexed and length and st.stall_start is None:
                self._index(st)  # its window went down (a stalled one changes nothing)
        if d.flags & FLAG_END_STREAM:
            self._server_end(st, last)

    def _client_data(self, d: _Dir, last: int | None) -> None:
        st = self._streams.get(d.sid)
        if st is None:
            return
        req = st.req
        if d.pad_len < 0:
            req.request_bytes = None
        elif req.request_bytes is not None:
            payload = d.length - (d.pad_len + 1 if d.flags & FLAG_PADDED else 0)
            req.request_bytes += max(payload, 0)
        if d.flags & FLAG_END_STREAM and not st.client_ended:
            st.client_ended = True
            req.end_ns = last
            self._maybe_close(st)

    def _rst_stream(self, d: _Dir, direction: int, last: int | None) -> None:
        self._rst += 1
        code = "unknown"
        if not d.lost:
            body = self._body_ok(d, direction)
            if body is not None:
                code = error_name(_u32(body, 0))
        st = self._streams.get(d.sid)
        if st is None:
            return
        req = st.req
        if req.reset is None:
            req.reset = code
            req.reset_by = _SIDES[direction]
        if st.stall_start is not None:
            self._end_stall(st, last if last is not None else d.f_ts)
        st.client_ended = st.server_ended = True
        if self._fc_indexed:
            st.fc_ver += 1  # no longer pending: out of the heaps
        self._maybe_close(st)

    def _goaway_frame(self, d: _Dir, direction: int) -> None:
        if d.lost:
            self._goaway = {"from": _SIDES[direction], "error": "unknown",
                            "last_stream_id": None, "ts": ns_to_ts(d.f_ts)}
            return
        body = self._body_ok(d, direction)
        if body is not None:
            self._goaway = {"from": _SIDES[direction], "error": error_name(_u32(body, 4)),
                            "last_stream_id": _u32(body, 0), "ts": ns_to_ts(d.f_ts)}

    # -- settings and flow control -----------------------------------------------------

    def _settings_frame(self, d: _Dir, direction: int, last: int | None) -> None:
        if d.flags & FLAG_ACK:
            return
        if d.lost:
            self._warn(f"http2: a {_SIDES[direction]} SETTINGS frame was lost")
            if direction == CLIENT:
                self._fc_stop()
            return
        body = self._body_ok(d, direction)
        if body is not None:
            self._apply_settings(direction, settings_of(body),
                                 last if last is not None else d.f_ts)

    def _apply_settings(self, direction: int, settings: dict[int, int], ts: int) -> None:
        names = self._settings[direction]
        other = self._dirs[1 - direction]
        for ident, value in settings.items():
            names[setting_name(ident)] = value
            if ident == SETTING_HEADER_TABLE_SIZE:
                # The receiver's setting caps the table its peer's encoder may use.
                dec = other.decoder
                if value > MAX_HPACK_TABLE:
                    other.hpack_allowed = max(other.hpack_allowed, value)
                    value = MAX_HPACK_TABLE
                dec.max_allowed_table_size = max(dec.max_allowed_table_size, value)
            elif ident == SETTING_MAX_FRAME_SIZE:
                other.max_frame_size = max(other.max_frame_size, min(value, LARGEST_FRAME_SIZE))
            elif ident == SETTING_INITIAL_WINDOW_SIZE and direction == CLIENT:
                delta = value - self._init_window
                self._init_window = value
                if self._fc_ok and delta:
                    self._shift += delta  # every stream's window moves by delta
                    self._check_stalls(ts)

    def _start_stall(self, st: _Stream, ts: int) -> None:
        if st.stall_start is None and not st.server_ended:
            st.stall_start = ts
            self._stalled.add(st.req.stream_id or 0)
            self._stalls += 1
            if self._fc_indexed:
                self._index(st)

    def _end_stall(self, st: _Stream, ts: int) -> None:
        start = st.stall_start
        if start is None:
            return
        st.stall_start = None
        self._stalled.discard(st.req.stream_id or 0)
        st.req.stall_ns = (st.req.stall_ns or 0) + max(ts - start, 0)
        if self._fc_indexed:
            self._index(st)

    # Streams whose stall may change are found without visiting every stream once more
    # than FC_INDEX_OVER are open: the pending ones not stalled sit in a min-heap by
    # window (an entry's key is at most the stream's window: a DATA frame re-indexes),
    # the stalled ones in a max-heap (key at least the window: a WINDOW_UPDATE
    # re-indexes). Stale entries (``fc_ver`` changed) are skipped, an entry whose key is
    # off is pushed again with the stream's window, and both heaps are rebuilt when
    # stale entries outnumber the streams. While every stall agrees with its windows
    # (not ``_fc_dirty``), the result is that of the scan.

    def _index(self, st: _Stream) -> None:
        """File ``st`` (again) in the heap of its state, if its response is pending."""
        st.fc_ver += 1
        if st.server_ended:
            return
        self._fc_seq += 1
        if st.stall_start is None:
            heapq.heappush(self._open_heap, (st.window, self._fc_seq, st.fc_ver, st))
        else:
            heapq.heappush(self._stalled_heap, (-st.window, self._fc_seq, st.fc_ver, st))
        if not self._fc_bulk:
            self._compact_index()

    def _compact_index(self) -> None:
        """Rebuild the heaps once stale entries outnumber the streams."""
        if len(self._open_heap) + len(self._stalled_heap) > 2 * len(self._streams) + 64:
            self._build_index()

    def _build_index(self) -> None:
        """(Re)build both heaps from the open streams."""
        self._fc_indexed = True
        opened: list[tuple[int, int, int, _Stream]] = []
        stalled: list[tuple[int, int, int, _Stream]] = []
        seq = self._fc_seq
        for st in self._streams.values():
            st.fc_ver += 1
            if st.server_ended:
                continue
            seq += 1
            if st.stall_start is None:
                opened.append((st.window, seq, st.fc_ver, st))
            else:
                stalled.append((-st.window, seq, st.fc_ver, st))
        self._fc_seq = seq
        heapq.heapify(opened)
        heapq.heapify(stalled)
        self._open_heap, self._stalled_heap = opened, stalled
        self._charge(len(self._streams))

    def _use_index(self) -> bool:
        """True when stalls are to be found through the heaps (else by a scan)."""
        if self._fc_dirty:
            return False
        if not self._fc_indexed and len(self._streams) > FC_INDEX_OVER:
            self._build_index()
        return self._fc_indexed

    def _charge(self, steps: int) -> bool:
        """Count flow-control bookkeeping; past the allowance (:data:`FC_WORK_BASE` plus
        :data:`FC_WORK_PER_FRAME` a frame), stop tracking (False)."""
        self._fc_spent += steps
        dirs = self._dirs
        allowed = FC_WORK_BASE + FC_WORK_PER_FRAME * (dirs[0].frames + dirs[1].frames)
        if self._fc_spent > allowed and self._fc_ok:
            self.limits_hit[LIMIT_FLOW_CONTROL] = self.limits_hit.get(LIMIT_FLOW_CONTROL, 0) + 1
            self._warn(f"http2: flow-control bookkeeping went over {FC_WORK_PER_FRAME} steps "
                       f"a frame; flow control is no longer tracked")
            self._fc_stop()
        return self._fc_ok

    def _stall_all(self, ts: int, except_ended: _Stream | None = None) -> None:
        """The connection window closed at ``ts``: every pending response stalls."""
        if self._use_index():
            entries = self._open_heap
            if not self._charge(len(entries)):
                return
            self._open_heap = []
            keep: list[tuple[int, int, int, _Stream]] = []
            self._fc_bulk = True
            for entry in entries:
                st = entry[3]
                if st.fc_ver != entry[2]:
                    continue
                if st is except_ended or st.server_ended or st.stall_start is not None:
                    keep.append(entry)
                else:
                    self._start_stall(st, ts)
            self._fc_bulk = False
            for entry in keep:
                heapq.heappush(self._open_heap, entry)
            self._compact_index()
        else:
            if not self._charge(len(self._streams)):
                return
            for st in list(self._streams.values()):
                if st is not except_ended and not st.server_ended and st.stall_start is None:
                    self._start_stall(st, ts)
        self._fc_dirty = False  # every pending response is stalled, as the windows say

    def _check_stalls(self, ts: int) -> None:
        """Start or end stalls after a window change at ``ts``."""
        conn = self._conn_window
        if not self._use_index():
            if not self._charge(len(self._streams)):
                return
            shift = self._shift
            for st in list(self._streams.values()):
                if st.server_ended:
                    continue
                open_ = min(st.window + shift, conn) > 0
                if open_ and st.stall_start is not None:
                    self._end_stall(st, ts)
                elif not open_ and st.stall_start is None:
                    self._start_stall(st, ts)
            self._fc_dirty = False
            return
        if conn <= 0:
            return  # every pending response is stalled already
        limit = -self._shift  # a stream's window is open when st.window > limit
        self._fc_bulk = True  # (no rebuild of the heaps while they are walked)
        heap = self._stalled_heap
        steps = 0
        while heap and -heap[0][0] > limit:
            _key, _seq, ver, st = heapq.heappop(heap)
            steps += 1
            if st.fc_ver != ver:
                continue
            if st.window > limit:
                self._end_stall(st, ts)
            else:  # its window went down since (DATA): file it at its window
                self._fc_seq += 1
                heapq.heappush(heap, (-st.window, self._fc_seq, ver, st))
        heap = self._open_heap
        while heap and heap[0][0] <= limit:
            _key, _seq, ver, st = heapq.heappop(heap)
            steps += 1
            if st.fc_ver != ver:
                continue
            if st.window <= limit:
                self._start_stall(st, ts)
            else:  # its window went up since (WINDOW_UPDATE): file it at its window
                self._fc_seq += 1
                heapq.heappush(heap, (st.window, self._fc_seq, ver, st))
        self._fc_bulk = False
        if steps and self._charge(steps):
            self._compact_index()

    def _window_update(self, d: _Dir, direction: int, last: int | None) -> None:
        if direction != CLIENT or not self._fc_ok:
            return
        if d.lost:
            self._warn("http2: a client WINDOW_UPDATE was lost; flow control no longer tracked")
            self._fc_stop()
            return
        body = self._body_ok(d, direction)
        if body is None:
            return
        increment = _u32(body, 0)
        ts = last if last is not None else d.f_ts
        if d.sid == 0:
            self._conn_window += increment
            if self._conn_window > 0 and self._stalled:
                self._check_stalls(ts)
        else:
            st = self._streams.get(d.sid)
            if st is not None:
                st.window += increment
                if st.stall_start is not None:
                    if min(st.window + self._shift, self._conn_window) > 0:
                        self._end_stall(st, ts)
                    elif self._fc_indexed and increment:
                        self._index(st)  # still stalled, at a larger window

    def _fc_stop(self) -> None:
        """Flow-control state is no longer known: stop tracking it."""
        if not self._fc_ok:
            return
        self._fc_ok = False
        self._fc_indexed = False
        self._open_heap = []
        self._stalled_heap = []
        last = self._last_seen_ts()
        for sid in list(self._stalled):
            st = self._streams.get(sid)
            if st is not None:
                self._end_stall(st, last)
        self._stalled.clear()

    def _last_seen_ts(self) -> int:
        return max(d.f_ts for d in self._dirs)
