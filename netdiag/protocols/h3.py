"""HTTP/3 (RFC 9114) and QPACK (RFC 9204) over the decrypted streams of one QUIC connection.

Fed by :mod:`netdiag.protocols.quic` with each stream's bytes in order, each piece with
the capture time of the packet that carried it. Requests are filled as the HTTP/2
analyzer fills them (CONTRACT.md timings, transposed):

- ``ts_ns``: the packet carrying the first byte of the client's HEADERS frame on a
  client-initiated bidirectional stream; ``end_ns``: the packet carrying the client's
  FIN; ``request_bytes``: client DATA payload bytes.
- ``first_byte_ns``: the first byte of the first response HEADERS frame (1xx
  included); ``status``, ``content_type`` from the final HEADERS.
- ``last_byte_ns``: the packet carrying the server's FIN on the stream (None when the
  stream never ended in the capture).
- ``response_bytes``, ``chunks`` (DATA frames with a payload), ``chunk_gaps_ns``
  (gaps between their first-byte times); ``text/event-stream`` bodies go through
  :class:`~netdiag.protocols.sse.SseCounter`, as in HTTP/2.
- ``reset``/``reset_by``: a RESET_STREAM's error code (H3 name) and its sender.

Header blocks are decoded with ``pylsqpack.Decoder``, one per sending side, created
with the table capacity the receiving side announced in its SETTINGS (0 until then),
and fed that side's QPACK encoder stream; a block that references entries not yet
received waits (blocked stream) and is decoded when the encoder stream delivers them,
keeping its own frame time.
"""

from __future__ import annotations

from typing import Any

import pylsqpack

from netdiag.protocols.quic_wire import QuicMalformed, varint
from netdiag.protocols.sse import (
    SseCounter,
    add_events,
    final_response,
    response_status,
)
from netdiag.records import Request

H3_DATA, H3_HEADERS, H3_SETTINGS, H3_GOAWAY = 0x0, 0x1, 0x4, 0x7
UNI_CONTROL, UNI_PUSH, UNI_ENCODER, UNI_DECODER = 0x0, 0x1, 0x2, 0x3
SETTING_QPACK_CAPACITY, SETTING_QPACK_BLOCKED = 0x1, 0x7
MAX_HEADER_BLOCK = 1 << 16
"""Bytes of one HEADERS frame kept for decoding; a longer one is not decoded."""
MAX_CONTROL_FRAME = 1 << 14
"""Bytes of a control-stream frame kept (SETTINGS, GOAWAY)."""
MAX_ENCODER_PENDING = 1 << 16
"""QPACK encoder-stream bytes held before the decoder exists."""
MAX_REQUESTS = 100_000
"""Requests one connection records (more are counted in ``limits_hit``)."""
LIMIT_H3_REQUESTS = "h3_requests_per_connection"

H3_ERRORS = {
    0x100: "H3_NO_ERROR", 0x101: "H3_GENERAL_PROTOCOL_ERROR", 0x102: "H3_INTERNAL_ERROR",
    0x103: "H3_STREAM_CREATION_ERROR", 0x104: "H3_CLOSED_CRITICAL_STREAM",
    0x105: "H3_FRAME_UNEXPECTED", 0x106: "H3_FRAME_ERROR", 0x107: "H3_EXCESSIVE_LOAD",
    0x108: "H3_ID_ERROR", 0x109: "H3_SETTINGS_ERROR", 0x10A: "H3_MISSING_SETTINGS",
    0x10B: "H3_REQUEST_REJECTED", 0x10C: "H3_REQUEST_CANCELLED",
    0x10D: "H3_REQUEST_INCOMPLETE", 0x10E: "H3_MESSAGE_ERROR", 0x10F: "H3_CONNECT_ERROR",
    0x110: "H3_VERSION_FALLBACK",
}


def error_name(code: int) -> str:
    """HTTP/3 error code name, or its number."""
    return H3_ERRORS.get(code, f"0x{code:x}")


class _Half:
    """One direction of one stream: the frame being read."""

    __slots__ = (
        "body",
        "buf",
        "dead",
        "frame_ts",
        "ftype",
        "kind",
        "remaining",
        "too_long",
    )

    def __init__(self, kind: int | None) -> None:
        self.buf = bytearray()
        """Bytes of a frame header (or uni stream type) not yet complete."""
        self.ftype = -1
        """Type of the frame whose payload is being read, -1 between frames."""
        self.remaining = 0
        self.body = bytearray()
        self.frame_ts = 0
        self.kind = kind
        """Unidirectional stream type; None for request streams, -1 before it is read."""
        self.dead = False
        self.too_long = False


class _Req:
    __slots__ = ("final", "gaps", "last_chunk_ns", "req", "server_ended", "sse")

    def __init__(self, req: Request) -> None:
        self.req = req
        self.final = False
        self.sse: SseCounter | None = None
        self.gaps: list[int] = []
        self.last_chunk_ns: int | None = None
        self.server_ended = False


class Http3:
    """The HTTP/3 layer of one decrypted QUIC connection."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.warnings: list[str] = []
        self.limits_hit: dict[str, int] = {}
        self.settings: list[dict[int, int]] = [{}, {}]
        """SETTINGS of each side (client, server), by identifier."""
        self.goaway: dict[str, Any] | None = None
        self._halves: dict[tuple[int, int], _Half] = {}
        self._reqs: dict[int, _Req] = {}
        self._decoders: list[pylsqpack.Decoder | None] = [None, None]
        self._pending_encoder: list[bytearray] = [bytearray(), bytearray()]
        self._blocked: dict[tuple[int, int], tuple[int, bytes]] = {}
        self._broken = [False, False]
        """A side's QPACK state is unusable (encoder stream error or lost bytes)."""
        self.frames = 0

    def _warn(self, msg: str) -> None:
        if len(self.warnings) < 20:
            self.warnings.append(msg)

    # -- input ------------------------------------------------------------------------
    def data(self, direction: int, sid: int, ts: int, data: bytes, fin: bool) -> None:
        """In-order bytes of stream ``sid`` sent by ``direction`` (0 client)."""
        key = (sid, direction)
        half = self._halves.get(key)
        if half is None:
            uni = bool(sid & 0x2)
            if not uni and sid & 0x1:
                return  # server-initiated bidirectional: not used by HTTP/3
            half = _Half(-1 if uni else None)
            self._halves[key] = half
        if half.dead:
            return
        try:
            self._consume(half, direction, sid, ts, data)
        except QuicMalformed as e:
            half.dead = True
            self._warn(f"h3: stream {sid}: {e}")
        if fin and half.kind is None:
            self._fin(direction, sid, ts)

    def lost(self, direction: int, sid: int) -> None:
        """Bytes of this stream were never captured: stop reading it."""
        half = self._halves.get((sid, direction))
        if half is None:
            half = _Half(None)
            self._halves[(sid, direction)] = half
        half.dead = True
        if half.kind == UNI_ENCODER:
            self._broken[direction] = True

    def reset(self, direction: int, sid: int, code: int) -> None:
        """RESET_STREAM from ``direction`` (or STOP_SENDING asking for one)."""
        st = self._reqs.get(sid)
        if st is not None and st.req.reset is None:
            st.req.reset = error_name(code)
            st.req.reset_by = "client" if direction == 0 else "server"

    def _consume(self, half: _Half, direction: int, sid: int, ts: int, data: bytes) -> None:
        p = 0
        n = len(data)
        if half.kind == -1:  # the stream type
            prev = len(half.buf)
            half.buf += data[:8 - prev]
            try:
                kind, used = varint(bytes(half.buf), 0)
            except QuicMalformed:
                if len(half.buf) >= 8:
                    raise
                return
            p = used - prev
            half.buf.clear()
            half.kind = kind
            if kind not in (UNI_CONTROL, UNI_ENCODER, UNI_DECODER):
                half.dead = True  # push streams, decoder streams, grease: not read
                return
        if half.kind == UNI_ENCODER:
            self._encoder(direction, data[p:])
            return
        if half.kind == UNI_DECODER:
            return
        while p < n:
            if half.ftype < 0:
                if not half.buf:
                    half.frame_ts = ts
                take = min(n - p, 16 - len(half.buf))
                half.buf += data[p:p + take]
                hdr = bytes(half.buf)
                try:
                    ftype, q = varint(hdr, 0)
                    length, q = varint(hdr, q)
                except QuicMalformed:
                    if len(hdr) >= 16:
                        raise
                    p += take
                    continue
                p += q - (len(hdr) - take)
                half.buf.clear()
                half.ftype = ftype
                half.remaining = length
                half.body = bytearray()
                half.too_long = False
                self.frames += 1
                self._frame_start(half, direction, sid)
                if length == 0:
                    self._frame_end(half, direction, sid)
                continue
            take = min(n - p, half.remaining)
            chunk = data[p:p + take]
            p += take
            half.remaining -= take
            self._frame_bytes(half, direction, sid, ts, chunk)
            if half.remaining == 0:
                self._frame_end(half, direction, sid)

    # -- frames -----------------------------------------------------------------------
    def _frame_start(self, half: _Half, direction: int, sid: int) -> None:
        if half.kind is not None or half.ftype != H3_DATA:
            return
        st = self._reqs.get(sid)
        if st is None:
            return
        req = st.req
        if direction == 1:
            if req.response_bytes is None:
                req.response_bytes = 0
            if half.remaining and st.sse is None:
                if req.chunks is None:
                    req.chunks = 0
                req.chunks += 1
                if st.last_chunk_ns is not None:
                    st.gaps.append(half.frame_ts - st.last_chunk_ns)
                    req.chunk_gaps_ns = st.gaps
                st.last_chunk_ns = half.frame_ts
            if req.response_bytes is not None:
                req.response_bytes += half.remaining
        else:
            req.request_bytes = (req.request_bytes or 0) + half.remaining

    def _frame_bytes(self, half: _Half, direction: int, sid: int, ts: int,
                     chunk: bytes) -> None:
        ftype = half.ftype
        if ftype == H3_DATA:
            if direction == 1 and half.kind is None:
                st = self._reqs.get(sid)
                if st is not None and st.sse is not None:
                    self._sse(st, ts, chunk)
            return
        limit = MAX_HEADER_BLOCK if ftype == H3_HEADERS else MAX_CONTROL_FRAME
        if ftype == H3_HEADERS or (half.kind == UNI_CONTROL and ftype in (H3_SETTINGS,
                                                                          H3_GOAWAY)):
            if len(half.body) + len(chunk) > limit:
                half.too_long = True
            elif not half.too_long:
                half.body += chunk

    def _frame_end(self, half: _Half, direction: int, sid: int) -> None:
        ftype = half.ftype
        half.ftype = -1
        body = bytes(half.body)
        half.body = bytearray()
        if half.too_long:
            self._warn(f"h3: frame 0x{ftype:x} on stream {sid} is too long to read")
            if ftype == H3_HEADERS and half.kind is None:
                self._headers(direction, sid, half.frame_ts, None)
            return
        if half.kind == UNI_CONTROL:
            if ftype == H3_SETTINGS:
                self._settings(direction, body)
            elif ftype == H3_GOAWAY:
                try:
                    v, _ = varint(body, 0)
                except QuicMalformed:
                    v = -1
                self.goaway = {"from": "client" if direction == 0 else "server", "id": v}
            return
        if half.kind is None and ftype == H3_HEADERS:
            self._headers(direction, sid, half.frame_ts, body)

    def _settings(self, direction: int, body: bytes) -> None:
        out: dict[int, int] = {}
        p = 0
        while p < len(body):
            ident, p = varint(body, p)
            value, p = varint(body, p)
            out[ident] = value
        self.settings[direction] = out

    def _decoder(self, sender: int) -> pylsqpack.Decoder:
        dec = self._decoders[sender]
        if dec is None:
            peer = self.settings[1 - sender]
            dec = pylsqpack.Decoder(min(peer.get(SETTING_QPACK_CAPACITY, 0), 1 << 20),
                                    min(peer.get(SETTING_QPACK_BLOCKED, 0), 1 << 10))
            self._decoders[sender] = dec
            pending = self._pending_encoder[sender]
            if pending:
                self._pending_encoder[sender] = bytearray()
                self._feed_encoder(sender, dec, bytes(pending))
        return dec

    def _encoder(self, sender: int, data: bytes) -> None:
        if self._broken[sender] or not data:
            return
        dec = self._decoders[sender]
        if dec is None and not self.settings[1 - sender]:
            pend = self._pending_encoder[sender]
            if len(pend) + len(data) > MAX_ENCODER_PENDING:
                self._broken[sender] = True
                self._warn("h3: QPACK encoder stream held too long before SETTINGS")
                return
            pend += data
            return
        self._feed_encoder(sender, self._decoder(sender), data)

    def _feed_encoder(self, sender: int, dec: pylsqpack.Decoder, data: bytes) -> None:
        try:
            unblocked = dec.feed_encoder(data)
        except Exception as e:  # pylsqpack.EncoderStreamError
            self._broken[sender] = True
            self._warn(f"h3: QPACK encoder stream of the "
                       f"{'client' if sender == 0 else 'server'} is invalid "
                       f"({type(e).__name__})")
            return
        for sid in unblocked:
            held = self._blocked.pop((sid, sender), None)
            if held is None:
                continue
            try:
                _ack, headers = dec.resume_header(sid)
            except Exception as e:
                self._warn(f"h3: header block on stream {sid} does not decode "
                           f"({type(e).__name__})")
                self._apply(sender, sid, held[0], None)
                continue
            self._apply(sender, sid, held[0], headers)

    def _headers(self, sender: int, sid: int, ts: int, block: bytes | None) -> None:
        if block is None or self._broken[sender]:
            self._apply(sender, sid, ts, None)
            return
        dec = self._decoder(sender)
        try:
            _ack, headers = dec.feed_header(sid, block)
        except pylsqpack.StreamBlocked:
            if (sid, sender) not in self._blocked:
                self._blocked[(sid, sender)] = (ts, b"")
                self._placeholder(sender, sid, ts)
                return
            self._apply(sender, sid, ts, None)
            return
        except Exception as e:
            self._warn(f"h3: header block on stream {sid} does not decode "
                       f"({type(e).__name__})")
            self._apply(sender, sid, ts, None)
            return
        self._apply(sender, sid, ts, headers)

    def _placeholder(self, sender: int, sid: int, ts: int) -> None:
        """A blocked block still times the request or the response."""
        if sender == 0:
            self._new_request(sid, ts)
        else:
            st = self._reqs.get(sid)
            if st is not None and st.req.first_byte_ns is None:
                st.req.first_byte_ns = ts

    def _new_request(self, sid: int, ts: int) -> _Req | None:
        st = self._reqs.get(sid)
        if st is not None:
            return st
        if len(self.requests) >= MAX_REQUESTS:
            self.limits_hit[LIMIT_H3_REQUESTS] = self.limits_hit.get(LIMIT_H3_REQUESTS, 0) + 1
            return None
        req = Request(ts_ns=ts, stream_id=sid, estimated=False, protocol="h3")
        st = _Req(req)
        self._reqs[sid] = st
        self.requests.append(req)
        return st

    def _apply(self, sender: int, sid: int, ts: int,
               raw: list[tuple[bytes, bytes]] | None) -> None:
        headers = (None if raw is None else
                   [(k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
                    for k, v in raw])
        if sender == 0:
            st = self._new_request(sid, ts)
            if st is None:
                return
            req = st.req
            if headers is not None and req.request_headers is None:
                req.request_headers = headers
                for name, value in headers:
                    if name == ":method":
                        req.method = value
                    elif name == ":path":
                        req.path = value
                    elif name == ":authority" or (name == "host" and req.authority is None):
                        req.authority = value
            return
        st = self._reqs.get(sid)
        if st is None:
            return
        req = st.req
        if req.first_byte_ns is None:
            req.first_byte_ns = ts
        if req.response_bytes is None:
            req.response_bytes = 0
        if req.chunks is None:
            req.chunks = 0
        if st.final or headers is None:
            return
        status = response_status(headers)
        if status is not None and 100 <= status < 200:
            return
        st.final = True
        counter = final_response(req, status, headers)
        if counter is not None:
            st.sse = counter

    def _sse(self, st: _Req, ts: int, chunk: bytes) -> None:
        counter = st.sse
        assert counter is not None
        add_events(counter, st.req, st.gaps, ts, chunk)

    def _fin(self, direction: int, sid: int, ts: int) -> None:
        st = self._reqs.get(sid)
        if st is None:
            return
        if direction == 0:
            if st.req.end_ns is None:
                st.req.end_ns = ts
        elif not st.server_ended:
            st.server_ended = True
            st.req.last_byte_ns = ts

    def to_json(self) -> dict[str, Any]:
        """Connection facts: settings per side, GOAWAY, frames read."""
        return {"settings": {"client": {str(k): v for k, v in self.settings[0].items()},
                             "server": {str(k): v for k, v in self.settings[1].items()}},
                "goaway": self.goaway, "frames": self.frames}
