"""HTTP/1.x requests and responses, read passively from the two byte streams of a connection.

A sans-IO :class:`~netdiag.protocols.base.HttpAnalyzer`: the flow layer (cleartext) or
the TLS layer (decrypted records) feeds each direction's in-order bytes, split
anywhere, with the capture time and packet number of the segment carrying the first
byte of each piece. Nothing is parsed from the clock, nothing is allocated from a
size the peer claims: bodies are skipped by counting, only header sections (64 KiB)
and chunk-size / trailer lines (8 KiB) are ever buffered.

Timing (CONTRACT.md): a request starts (``ts_ns``) at the segment carrying its first
byte and ends (``end_ns``) at the segment carrying its last; its response's first
byte (``first_byte_ns``, an interim ``1xx`` included) and last byte (``last_byte_ns``,
the end of the message) likewise. Responses are matched to requests in order
(pipelining). ``chunks`` and ``chunk_gaps_ns`` describe how the body arrived:

* ``Transfer-Encoding: chunked``: one chunk per HTTP chunk of non-zero size, timed
  by the segment carrying the first byte of its chunk-size line;
* a body delimited by ``Content-Length`` or by the connection's close: one chunk per
  segment (``feed`` call) carrying body bytes -- that is the segment cadence;
* ``text/event-stream``: one chunk per server-sent event (``SseCounter``), whatever
  the framing; ``sse_events`` and ``first_event_ns`` are set too.

``chunk_gaps_ns`` is None with fewer than two chunks. A body with lost bytes of known
extent (``gap`` inside a ``Content-Length`` body, a chunk, or a body read until
close) is skipped and counted; if its last bytes were lost its end time is None.
Lost bytes anywhere else end the parsing of that direction, with a warning.

Lenient as real servers are: bare LF line ends, blank lines between messages,
obs-fold continuation lines, any case of header names, repeated identical
``Content-Length`` values, header lines without a colon (skipped, with a warning).

Upgrades: after a request carrying ``Upgrade`` (or a ``CONNECT``) the client's later
bytes are held until the response decides. ``101`` with ``Upgrade: h2c`` (cleartext
only) hands both streams to ``Http2Analyzer(protocol="h2c", upgrade_request=...)``;
any other ``101``, or a ``2xx`` to ``CONNECT``, makes the connection a tunnel and
parsing stops without a warning; any other answer releases the held bytes as HTTP/1.x.
A client stream opening with the HTTP/2 preface (prior knowledge) goes to
``Http2Analyzer(protocol="h2c", upgrade_request=None)`` from its first byte.

Bounded state, linear time (issue 11). Held client bytes are a deque that a release
consumes from the front: when the released bytes carry another Upgrade/CONNECT
request, the rest stays where it is instead of being copied into a new hold, so
every held byte is handled a bounded number of times however many such requests
are pipelined. Past :data:`MAX_HELD` the bytes are read as HTTP/1.x (once per
connection: ``limits_hit["http1_held_bytes"]``, one warning); at ``close`` all held
bytes are read, later Upgrade requests included. At most
:data:`MAX_PENDING_REQUESTS` requests are followed while awaiting their response:
beyond, the oldest stops being followed (its record is dropped; the response that
may still come for it is read and discarded, so later responses stay matched in
order), counted in ``limits_hit["http1_pending_requests"]`` with one warning.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from typing import Any

from netdiag.protocols.base import AnalyzerKind, add_warning
from netdiag.protocols.sse import SseCounter, is_event_stream
from netdiag.protocols.tunnel import Tunnel, TunnelPicker
from netdiag.records import Request

MAX_HEAD = 64 * 1024
"""Largest header section (start line and fields) or trailer section buffered."""
MAX_LINE = 8 * 1024
"""Largest chunk-size line (with extensions) or trailer line."""
MAX_HELD = 256 * 1024
"""Client bytes held while an Upgrade/CONNECT answer is awaited; beyond, read as HTTP/1.x."""
MAX_WARNINGS = 32
"""Warnings kept per connection; one more line says the rest were dropped."""
MAX_PENDING_REQUESTS = 4096
"""Requests followed at once while they await their response (pipelining); beyond, the
oldest stops being followed (``limits_hit["http1_pending_requests"]``)."""

LIMIT_PENDING = "http1_pending_requests"
"""``limits_hit`` key: requests no longer followed because :data:`MAX_PENDING_REQUESTS`
others awaited a response."""
LIMIT_HELD = "http1_held_bytes"
"""``limits_hit`` key: times the client sent over :data:`MAX_HELD` bytes after an
Upgrade/CONNECT request without an answer."""

# Parser states of one direction.
_HEAD = 0  # reading a header section (or the blank lines between messages)
_BODY = 1  # a body of known remaining length
_CLOSE_BODY = 2  # a response body that ends when the connection does
_CHUNK_SIZE = 3  # a chunk-size line
_CHUNK_DATA = 4  # chunk data of known remaining length
_CHUNK_END = 5  # the CRLF after chunk data
_TRAILER = 6  # trailer lines after the last chunk
_HELD = 7  # client bytes held until an Upgrade/CONNECT is answered
_H2 = 8  # handed to the HTTP/2 analyzer
_STOPPED = 9  # not parsed any more (error, tunnel, end of connection)
_TUNNEL = 10  # the bytes of an accepted CONNECT go to the tunnel's analyzer

_NAMES = ("client", "server")

_HEAD_END = re.compile(rb"\n\r?\n")
_REQUEST_LINE = re.compile(
    r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+)[ \t]+([^ \t]+)[ \t]+HTTP/(\d)\.(\d)")
_STATUS_LINE = re.compile(r"HTTP/(\d)\.(\d)[ \t]+(\d{3})(?:[ \t].*)?")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_H2_PREFACE = b"PRI * HTTP/2.0\r\n"


class _Side:
    """Parser state of one direction."""

    __slots__ = ("body", "buf", "chunk_feed", "chunk_times", "chunked", "cr", "direction",
                 "feeds", "held", "held_len", "last_ts", "line_ts", "msg_pkt", "msg_ts",
                 "remaining", "req", "sse", "state", "tail_lost", "trailer_len")

    def __init__(self, direction: int) -> None:
        self.direction = direction
        self.state = _HEAD
        self.buf = bytearray()
        self.msg_ts = 0
        """Capture time of the current message's first byte."""
        self.msg_pkt = 0
        self.last_ts: int | None = None
        """Capture time of the current message's latest byte."""
        self.remaining = 0
        self.body = 0
        self.chunked = False
        self.cr = False
        self.line_ts = 0
        self.trailer_len = 0
        self.feeds = 0
        self.chunk_feed = -1
        self.chunk_times: list[int] = []
        self.sse: SseCounter | None = None
        self.tail_lost = False
        self.req: Request | None = None
        """Client: the request being read. Server: the request being answered."""
        self.held: deque[tuple[int, bytes | None, int]] = deque()
        """Held client input: ``(ts, data, packet)`` or ``(ts, None, lost bytes)``."""
        self.held_len = 0


class Http1Analyzer:
    """HTTP/1.0 and HTTP/1.1 over one connection (see the module docstring)."""

    def __init__(self, *, tls: bool = False, tunnel_picker: TunnelPicker | None = None) -> None:
        self._tls = tls
        self._tunnel_picker = tunnel_picker
        """Chooses the analyzer of a CONNECT tunnel's bytes; None: tunnels are not read."""
        self.tunnel: Tunnel | None = None
        """The accepted CONNECT tunnel, analysed as the connection it carries."""
        self._client = _Side(0)
        self._server = _Side(1)
        self._sides = (self._client, self._server)
        self._requests: list[Request] = []
        self._dropped: set[int] = set()
        """``id`` of the requests in ``_requests`` no longer followed (their records are
        dropped: a client that pipelines without end cannot grow memory without end)."""
        self._fifo: deque[Request] = deque()
        """Requests whose response has not ended, in order."""
        self._warnings: list[str] = []
        self._protocol: str | None = None
        self._h2: Any = None
        self._upgrade_req: Request | None = None
        self._wait_req: Request | None = None
        """Request with Upgrade/CONNECT whose answer decides what the client sends next."""
        self._switch: tuple[Request, str] | None = None
        """Accepted switch (``h2`` or ``tunnel``) to apply when that request's body ends."""
        self._orphans = 0
        self._closed = False
        self._skip = 0
        """Requests no longer followed (the oldest pending) whose responses are still owed."""
        self._scratch: Request | None = None
        """Stands for the oldest such request while its response is read."""
        self._releasing = False
        self._no_hold = False
        """Set at ``close``: an Upgrade/CONNECT request no longer holds what follows."""
        self._limits: dict[str, int] = {}
        """Caps reached by this analyzer, by kind (:data:`LIMIT_PENDING`, :data:`LIMIT_HELD`)."""

    # -- HttpAnalyzer interface --------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """Requests in the order they started; after an h2c upgrade, the HTTP/2 ones too."""
        own = self._requests
        if self._dropped:
            dropped = self._dropped
            own = [r for r in own if id(r) not in dropped]
        if self.tunnel is not None:
            return own + self.tunnel.requests
        if self._h2 is None:
            return list(own)
        up = self._upgrade_req
        return own + [r for r in self._h2.requests if r is not up]

    @property
    def warnings(self) -> list[str]:
        out = list(self._warnings)
        if self._h2 is not None:
            out += self._h2.warnings
        if self.tunnel is not None:
            out += self.tunnel.warnings
        return out

    @property
    def http2(self) -> dict[str, Any] | None:
        if self.tunnel is not None:
            return self.tunnel.http2
        return None if self._h2 is None else self._h2.http2

    @property
    def limits_hit(self) -> dict[str, int]:
        """Caps reached on this connection, by kind (:data:`LIMIT_PENDING`,
        :data:`LIMIT_HELD`, and after an h2c upgrade the HTTP/2 ones); empty when none was."""
        inner = (self._h2.limits_hit if self._h2 is not None else {}) or (
            self.tunnel.limits_hit if self.tunnel is not None else {})
        if not inner:
            return self._limits
        merged = dict(self._limits)
        for k, v in inner.items():
            merged[k] = merged.get(k, 0) + v
        return merged

    @property
    def protocol(self) -> str:
        if self._h2 is not None:
            return "h2c"
        return self._protocol or "http/1.1"

    @property
    def kind(self) -> AnalyzerKind:
        """``http``."""
        return "http"

    @property
    def client_random(self) -> bytes | None:
        """The ClientHello random of TLS inside a CONNECT tunnel; else None (the TLS
        layer around this analyzer, if any, is not this analyzer's)."""
        return self.tunnel.client_random if self.tunnel is not None else None

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        if not data or self._closed:
            return
        if type(data) is not bytes:
            data = bytes(data)
        side = self._sides[1 if direction else 0]
        side.feeds += 1
        self._run(side, ts_ns, data, 0, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        if nbytes <= 0 or self._closed:
            return
        side = self._sides[1 if direction else 0]
        st = side.state
        if st == _H2:
            self._h2.gap(direction, ts_ns, nbytes)
        elif st == _TUNNEL and self.tunnel is not None:
            self.tunnel.gap(direction, ts_ns, nbytes)
        elif st == _STOPPED:
            return
        elif st == _HELD:
            side.held.append((ts_ns, None, nbytes))
        elif st == _CLOSE_BODY:
            side.body += nbytes
            side.tail_lost = True
            self._restart_sse(side)
        elif st in (_BODY, _CHUNK_DATA) and nbytes <= side.remaining:
            side.body += nbytes
            side.remaining -= nbytes
            self._restart_sse(side)
            if side.remaining == 0:
                if st == _BODY:
                    self._end_message(side, None)
                else:
                    side.state = _CHUNK_END
                    side.cr = False
        else:
            where = {_HEAD: "in a header section", _CHUNK_SIZE: "in a chunk-size line",
                     _CHUNK_END: "after chunk data", _TRAILER: "in trailers",
                     }.get(st, "past the end of a body")
            if st == _HEAD and not side.buf:
                where = "between messages"
            self._stop(side, f"{nbytes} bytes of the {_NAMES[side.direction]} stream were "
                             f"not captured ({where}); stopped parsing it")

    def close(self, ts_ns: int) -> None:
        if self._closed:
            return
        srv, cli = self._server, self._client
        if cli.state == _HELD and cli.held:  # never answered: read what followed as HTTP/1.x
            self._wait_req = None
            self._no_hold = True
            self._release(cli)
        self._closed = True
        if srv.state == _CLOSE_BODY:
            self._end_message(srv, None if srv.tail_lost else srv.last_ts)
        elif srv.state in (_BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER):
            req = srv.req
            if req is not None:
                self._fill_response(req, srv)
                if req is not self._scratch:
                    self._warn(f"the connection ended inside the response to "
                               f"{_label(req)} ({srv.body} body bytes seen)")
                self._pop_front(req)
        elif srv.state == _HEAD and srv.buf:
            self._warn("the connection ended inside a response header section")
        if cli.state in (_BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER) and cli.req:
            cli.req.request_bytes = cli.body
            self._warn(f"the connection ended inside the request {_label(cli.req)}")
        elif cli.state == _HEAD and cli.buf:
            self._warn("the connection ended inside a request header section")
        if (self._fifo or self._skip) and srv.state not in (_STOPPED, _H2, _TUNNEL):
            n = len(self._fifo) + self._skip
            first = ("one no longer followed" if self._skip else _label(self._fifo[0]))
            self._warn(f"{n} request{'s' if n > 1 else ''} got no complete response "
                       f"before the connection ended (first: {first})")
        if self._orphans:
            self._warn(f"{self._orphans} response(s) arrived with no request outstanding")
        for side in self._sides:
            if side.state != _H2:
                side.state = _STOPPED
            side.buf = bytearray()
            side.held = deque()
            side.held_len = 0
        if self._h2 is not None:
            self._h2.close(ts_ns)
        if self.tunnel is not None:
            self.tunnel.close(ts_ns)

    # -- the state machine ------------------------------------------------------------

    def _run(self, side: _Side, ts: int, data: bytes, pos: int, packet: int) -> None:
        n = len(data)
        while pos < n:
            st = side.state
            if st in (_BODY, _CHUNK_DATA):
                end = min(n, pos + side.remaining)
                self._body(side, ts, data, pos, end)
                side.remaining -= end - pos
                pos = end
                if side.remaining == 0:
                    if st == _BODY:
                        self._end_message(side, ts)
                    else:
                        side.state = _CHUNK_END
                        side.cr = False
            elif st == _HEAD:
                pos = self._head(side, ts, data, pos, packet)
            elif st == _CHUNK_SIZE:
                if not side.buf:
                    side.line_ts = ts
                line, pos = self._line(side, data, pos, packet)
                if line is not None:
                    self._chunk_size(side, line, ts, packet)
            elif st == _CHUNK_END:
                b = data[pos]
                if b == 10:
                    pos += 1
                    side.state = _CHUNK_SIZE
                elif b == 13 and not side.cr:
                    side.cr = True
                    pos += 1
                else:
                    self._stop(side, f"chunk data not followed by CRLF in the "
                                     f"{_NAMES[side.direction]} stream (packet {packet})")
            elif st == _TRAILER:
                line, pos = self._line(side, data, pos, packet)
                if line is None:
                    continue
                if not line:
                    self._end_message(side, ts)
                    continue
                side.trailer_len += len(line)
                if side.trailer_len > MAX_HEAD:
                    self._stop(side, f"trailer section over {MAX_HEAD} bytes in the "
                                     f"{_NAMES[side.direction]} stream (packet {packet})")
            elif st == _CLOSE_BODY:
                self._body(side, ts, data, pos, n)
                side.tail_lost = False
                pos = n
            elif st == _HELD:
                self._hold(side, ts, data if pos == 0 else data[pos:], packet)
                pos = n
            elif st == _H2:
                self._h2.feed(side.direction, ts, data if pos == 0 else data[pos:], packet)
                pos = n
            elif st == _TUNNEL and self.tunnel is not None:
                self.tunnel.feed(side.direction, ts, data if pos == 0 else data[pos:], packet)
                pos = n
            else:
                return

    def _head(self, side: _Side, ts: int, data: bytes, pos: int, packet: int) -> int:
        """Read header-section bytes from ``data[pos:]``; returns the new position."""
        n = len(data)
        buf = side.buf
        if not buf:
            while pos < n and data[pos] in b"\r\n":  # blank lines between messages
                pos += 1
            if pos >= n:
                return n
            side.msg_ts = ts
            side.msg_pkt = packet
            if side.direction and (self._fifo or self._skip):
                front = self._front()
                if front is not None and front.first_byte_ns is None:
                    front.first_byte_ns = ts  # the first server byte after the request
            m = _HEAD_END.search(data, pos, pos + MAX_HEAD)
            if m is not None:
                end = m.end()
                self._on_head(side, data[pos:end], ts, packet)
                return end
            if n - pos > MAX_HEAD:
                self._head_too_long(side, packet)
                return n
            buf += data[pos:]
            return n
        old = len(buf)
        buf += data[pos:pos + MAX_HEAD + 1 - old]
        m = _HEAD_END.search(buf, max(0, old - 2))
        if m is not None:
            end = m.end()
            head = bytes(buf[:end])
            side.buf = bytearray()
            self._on_head(side, head, ts, packet)
            return pos + end - old
        if len(buf) > MAX_HEAD:
            self._head_too_long(side, packet)
        return n

    def _head_too_long(self, side: _Side, packet: int) -> None:
        self._stop(side, f"{_NAMES[side.direction]} header section over {MAX_HEAD} bytes "
                         f"(packet {packet}); stopped parsing that direction")

    def _line(self, side: _Side, data: bytes, pos: int,
              packet: int) -> tuple[bytes | None, int]:
        """One line (without its line end) from the buffer and ``data[pos:]``, or None."""
        n = len(data)
        room = MAX_LINE - len(side.buf)
        i = data.find(b"\n", pos, pos + room + 1)
        if i < 0:
            if n - pos > room:
                self._stop(side, f"line over {MAX_LINE} bytes in the "
                                 f"{_NAMES[side.direction]} stream (packet {packet})")
            else:
                side.buf += data[pos:]
            return None, n
        if side.buf:
            line = bytes(side.buf) + data[pos:i]
            side.buf = bytearray()
        else:
            line = data[pos:i]
        if line.endswith(b"\r"):
            line = line[:-1]
        return line, i + 1

    def _chunk_size(self, side: _Side, line: bytes, ts: int, packet: int) -> None:
        size_text = line.split(b";", 1)[0].strip(b" \t")
        if _HEX.fullmatch(size_text) is None:
            shown = line[:40].decode("latin-1")
            self._stop(side, f"bad chunk size {shown!r} in the {_NAMES[side.direction]} "
                             f"stream (packet {packet}); stopped parsing that direction")
            return
        size = int(size_text, 16)
        if size == 0:
            side.state = _TRAILER
            side.trailer_len = 0
            return
        side.remaining = size
        side.state = _CHUNK_DATA
        if side.direction:
            side.chunk_times.append(side.line_ts)

    def _body(self, side: _Side, ts: int, data: bytes, a: int, b: int) -> None:
        if a >= b:
            return
        side.body += b - a
        side.last_ts = ts
        if side.direction and side.req is not None:
            if not side.chunked and side.chunk_feed != side.feeds:
                side.chunk_feed = side.feeds
                side.chunk_times.append(ts)
            if side.sse is not None:
                side.sse.feed(ts, data[a:b])

    @staticmethod
    def _restart_sse(side: _Side) -> None:
        """Lost body bytes: start a new event (the times found so far are kept)."""
        if side.sse is not None:
            fresh = SseCounter()
            fresh.event_times = side.sse.event_times
            side.sse = fresh

    def _begin_body(self, side: _Side, chunked: bool, length: int | None) -> None:
        """Set up body reading: chunked, ``length`` bytes, or until close (None)."""
        side.body = 0
        side.chunked = chunked
        side.chunk_feed = -1
        side.tail_lost = False
        if chunked:
            side.state = _CHUNK_SIZE
        elif length is None:
            side.state = _CLOSE_BODY
        else:
            side.remaining = length
            side.state = _BODY

    # -- messages ---------------------------------------------------------------------

    def _on_head(self, side: _Side, head: bytes, ts: int, packet: int) -> None:
        side.last_ts = ts
        text = head.decode("latin-1")
        nl = text.find("\n")
        start = text[:nl].rstrip("\r \t")
        block = text[nl + 1:]
        if side.direction:
            self._on_response_head(side, start, block, ts, packet)
        else:
            self._on_request_head(side, start, block, head, ts, packet)

    def _fields(self, block: str, side: _Side,
                packet: int) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
        """Header fields (obs-fold joined) and a lower-case name -> values index."""
        headers: list[tuple[str, str]] = []
        bad = 0
        for line in block.replace("\r\n", "\n").split("\n"):
            if not line:
                continue
            if line[0] in " \t":  # obs-fold: continues the previous field's value
                if headers:
                    name, value = headers[-1]
                    cont = line.strip(" \t")
                    headers[-1] = (name, f"{value} {cont}".strip(" ") if value else cont)
                else:
                    bad += 1
                continue
            name, sep, value = line.partition(":")
            name = name.rstrip(" \t")
            if not sep or not name:
                bad += 1
                continue
            headers.append((name, value.strip(" \t")))
        if bad:
            self._warn(f"{bad} malformed header line(s) skipped in the "
                       f"{_NAMES[side.direction]} stream (packet {packet})")
        index: dict[str, list[str]] = {}
        for name, value in headers:
            key = name.lower()
            if key in index:
                index[key].append(value)
            else:
                index[key] = [value]
        return headers, index

    def _framing(self, side: _Side, index: dict[str, list[str]], request: bool,
                 packet: int) -> tuple[bool, int | None] | None:
        """(chunked, length) from the fields; length None = no length given; None = error."""
        te = index.get("transfer-encoding")
        if te:
            codings = [c.strip(" \t").lower() for c in ",".join(te).split(",")]
            codings = [c for c in codings if c]
            if codings and codings[-1] == "chunked":
                return True, None
            if request:
                self._stop(side, f"request Transfer-Encoding {', '.join(te)!r} does not end "
                                 f"with chunked (packet {packet}); stopped parsing requests")
                return None
            return False, None  # a response read until close
        cl = index.get("content-length")
        if cl:
            values = {v.strip(" \t") for v in ",".join(cl).split(",")}
            if len(values) != 1:
                self._stop(side, f"conflicting Content-Length values {sorted(values)} in the "
                                 f"{_NAMES[side.direction]} stream (packet {packet})")
                return None
            (value,) = values
            if not value.isascii() or not value.isdigit() or len(value) > 18:
                self._stop(side, f"bad Content-Length {value[:40]!r} in the "
                                 f"{_NAMES[side.direction]} stream (packet {packet})")
                return None
            return False, int(value)
        return False, None

    def _on_request_head(self, side: _Side, start: str, block: str, head: bytes,
                         ts: int, packet: int) -> None:
        if head.startswith(_H2_PREFACE) and not self._requests:
            self._prior_knowledge(side, head, packet)
            return
        m = _REQUEST_LINE.fullmatch(start)
        if m is None or m.group(3) != "1":
            shown = start[:60]
            self._stop(side, f"not an HTTP/1.x request line {shown!r} (packet {packet}); "
                             f"stopped parsing requests")
            return
        method, target = m.group(1), m.group(2)
        protocol = f"http/1.{m.group(4)}"
        headers, index = self._fields(block, side, packet)
        host = index.get("host")
        authority = host[0] if host else None
        path: str | None = target
        if method == "CONNECT":
            authority, path = target, None
        elif not target.startswith("/") and "://" in target:  # absolute-form (proxy)
            rest = target.split("://", 1)[1]
            cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0),
                      default=len(rest))
            authority = rest[:cut] or authority
            path = rest[cut:] or "/"
            if path.startswith("?"):
                path = "/" + path
        req = Request(ts_ns=side.msg_ts, method=method, authority=authority, path=path,
                      estimated=False, protocol=protocol, request_headers=headers)
        if self._protocol is None:
            self._protocol = protocol
        self._requests.append(req)
        if len(self._fifo) >= MAX_PENDING_REQUESTS:
            self._forget_oldest()
        self._fifo.append(req)
        framing = self._framing(side, index, True, packet)
        if framing is None:  # seen, but where it ends is unknown: requests stop here
            return
        side.req = req
        if (method == "CONNECT" or "upgrade" in index) and not self._no_hold:
            self._wait_req = req
        chunked, length = framing
        if not chunked and not length:
            side.body = 0
            self._end_message(side, ts)
        else:
            self._begin_body(side, chunked, length)

    def _on_response_head(self, side: _Side, start: str, block: str, ts: int,
                          packet: int) -> None:
        m = _STATUS_LINE.fullmatch(start)
        code = int(m.group(3)) if m is not None else 0
        if m is None or m.group(1) != "1" or code < 100:
            shown = start[:60]
            self._stop(side, f"not an HTTP/1.x status line {shown!r} (packet {packet}); "
                             f"stopped parsing responses")
            return
        headers, index = self._fields(block, side, packet)
        req = self._front()
        if req is None:
            self._orphans += 1
        if code < 200:
            if code == 101:
                self._switching(side, req, index, ts, packet)
            return  # interim: the final response follows
        side.req = req
        side.chunk_times = []
        side.sse = None
        ctype = index.get("content-type")
        method = None
        if req is not None:
            method = req.method
            req.status = code
            req.response_headers = headers
            req.content_type = ctype[0] if ctype else None
            if is_event_stream(req.content_type):
                side.sse = SseCounter()
        if method == "CONNECT" and code < 300:
            if self._tunnel_picker is not None and req is not None and self.tunnel is None:
                self.tunnel = Tunnel(self._tunnel_picker, req.authority)
            self._decide(req, "tunnel")
            side.body = 0
            self._end_message(side, ts)
            side.state = _TUNNEL if self.tunnel is not None else _STOPPED
            return
        if req is not None and req is self._wait_req:
            self._decide(req, None)
        if method == "HEAD" or code in (204, 304):
            side.body = 0
            self._end_message(side, ts)
            return
        framing = self._framing(side, index, False, packet)
        if framing is None:
            return
        chunked, length = framing
        if length == 0:
            side.body = 0
            self._end_message(side, ts)
        else:
            self._begin_body(side, chunked, length)

    def _switching(self, side: _Side, req: Request | None, index: dict[str, list[str]],
                   ts: int, packet: int) -> None:
        """A 101 response: h2c goes to the HTTP/2 analyzer, anything else is a tunnel."""
        tokens = {t.strip(" \t").lower() for t in ",".join(index.get("upgrade", [])).split(",")}
        if req is not None:
            req.status = 101
        self._pop_front(req)
        if "h2c" in tokens and not self._tls and req is not None:
            if self._start_h2(req, "an h2c upgrade"):
                side.state = _H2
                self._decide(req, "h2")
                return
        else:
            if "h2c" in tokens:
                why = "over TLS" if self._tls else "without a request"
                self._warn(f"h2c upgrade accepted {why} (packet {packet}); stopped parsing")
            if req is not None:
                req.last_byte_ns = ts
                req.response_bytes = 0
                req.chunks = 0
        side.state = _STOPPED
        self._decide(req, "tunnel")

    def _decide(self, req: Request | None, switch: str | None) -> None:
        """The answer to an Upgrade/CONNECT request is known: switch (h2, tunnel) or not."""
        cli = self._client
        if switch is None:
            if self._wait_req is req:
                self._wait_req = None
                if cli.state == _HELD:
                    self._release(cli)
            return
        waited = self._wait_req is req
        self._wait_req = None
        if cli.state == _HELD or not waited:
            self._apply_switch(cli, switch)
        elif req is not None and cli.req is req:
            self._switch = (req, switch)  # the request body is still coming

    def _apply_switch(self, cli: _Side, switch: str) -> None:
        cli.buf = bytearray()
        inner: Any = (self._h2 if switch == "h2" else
                      self.tunnel if switch == "tunnel" else None)
        state = _H2 if switch == "h2" else _TUNNEL
        if self._releasing:  # the release loop feeds the rest in the new state
            cli.state = state if inner is not None else _STOPPED
            return
        held, cli.held, cli.held_len = cli.held, deque(), 0
        if inner is not None:
            cli.state = state
            for ts, data, x in held:
                if data is None:
                    inner.gap(0, ts, x)
                else:
                    inner.feed(0, ts, data, x)
        else:
            cli.state = _STOPPED

    def _release(self, cli: _Side) -> None:
        """Read the held client bytes as HTTP/1.x after all.

        Consumes ``cli.held`` from the front, each piece in the state the bytes before it
        left (as HTTP/1.x, to the HTTP/2 analyzer after a switch, or dropped once
        stopped). When the bytes read hold the client again (another Upgrade/CONNECT
        request), the rest stays in ``cli.held`` (``_hold`` puts the remainder of the
        current piece back in front) and the loop stops, unless that hold is over
        :data:`MAX_HELD` too.
        """
        if self._releasing:  # the running loop goes on with what is held
            return
        self._releasing = True
        try:
            cli.state = _HEAD
            held = cli.held
            while held and held is cli.held:  # (``_stop`` drops what is held)
                if cli.state == _HELD:
                    if cli.held_len <= MAX_HELD:
                        break
                    self._held_overflow(cli)
                    cli.state = _HEAD
                ts, data, x = held.popleft()
                if data is None:
                    self.gap(0, ts, x)
                else:
                    cli.held_len -= len(data)
                    self._run(cli, ts, data, 0, x)
        finally:
            self._releasing = False

    def _hold(self, cli: _Side, ts: int, data: bytes, packet: int) -> None:
        if self._releasing:  # the rest of the piece being released: back in front
            cli.held.appendleft((ts, data, packet))
            cli.held_len += len(data)
            return
        cli.held.append((ts, data, packet))
        cli.held_len += len(data)
        if cli.held_len > MAX_HELD:
            self._held_overflow(cli)
            self._release(cli)

    def _held_overflow(self, cli: _Side) -> None:
        """Over :data:`MAX_HELD` bytes held: they are read as HTTP/1.x (one warning, naming
        the packet whose bytes went over)."""
        if LIMIT_HELD not in self._limits:
            total, packet = 0, 0
            for _ts, data, x in cli.held:
                if data is not None:
                    total += len(data)
                    packet = x
                    if total > MAX_HELD:
                        break
            self._warn(f"the client sent over {MAX_HELD} bytes after an Upgrade/CONNECT "
                       f"request without an answer; reading them as HTTP/1.x (packet {packet})")
        self._limits[LIMIT_HELD] = self._limits.get(LIMIT_HELD, 0) + 1
        self._wait_req = None

    # -- requests awaiting a response ---------------------------------------------------

    def _front(self) -> Request | None:
        """The request the next response answers (a scratch one for a request no longer
        followed), None when none is pending."""
        if self._skip:
            if self._scratch is None:
                self._scratch = Request(ts_ns=0, estimated=False)
            return self._scratch
        return self._fifo[0] if self._fifo else None

    def _pop_front(self, req: Request | None) -> None:
        """``req``'s response ended (or switched): the next one answers the next request."""
        if self._skip:
            if req is not None and req is self._scratch:
                self._skip -= 1
                self._scratch = None
        elif self._fifo and self._fifo[0] is req:
            self._fifo.popleft()

    def _forget_oldest(self) -> None:
        """:data:`MAX_PENDING_REQUESTS` await a response: stop following the oldest."""
        old = self._fifo.popleft()
        if self._server.req is not old:  # else its response is being read: nothing owed
            self._skip += 1
            dropped = self._dropped
            dropped.add(id(old))
            if len(dropped) > 1024 and 2 * len(dropped) > len(self._requests):
                self._requests = [r for r in self._requests if id(r) not in dropped]
                dropped.clear()
        if self._wait_req is old:
            self._wait_req = None
            if self._client.state == _HELD:
                self._release(self._client)
        n = self._limits.get(LIMIT_PENDING, 0)
        if not n:
            self._warn(f"more than {MAX_PENDING_REQUESTS} requests awaited a response at "
                       f"once; the oldest are no longer followed (their records are dropped and "
                       f"their responses, if any, not matched)")
        self._limits[LIMIT_PENDING] = n + 1

    def _start_h2(self, upgrade: Request | None, what: str) -> bool:
        try:
            from netdiag.protocols.http2 import Http2Analyzer
            self._h2 = Http2Analyzer(protocol="h2c", upgrade_request=upgrade)
        except Exception as exc:  # a missing or incompatible HTTP/2 analyzer
            self._warn(f"{what} was seen but the HTTP/2 analyzer is unavailable ({exc}); "
                       f"stopped parsing")
            self._h2 = None
            return False
        self._upgrade_req = upgrade
        return True

    def _prior_knowledge(self, cli: _Side, head: bytes, packet: int) -> None:
        """The client opened with the HTTP/2 connection preface."""
        srv = self._server
        if not self._start_h2(None, "an HTTP/2 connection preface"):
            cli.state = srv.state = _STOPPED
            return
        cli.state = _H2
        self._h2.feed(0, cli.msg_ts, head, cli.msg_pkt)
        if srv.state == _HEAD:
            pending = bytes(srv.buf)
            srv.buf = bytearray()
            srv.state = _H2
            if pending:
                self._h2.feed(1, srv.msg_ts, pending, srv.msg_pkt)

    def _end_message(self, side: _Side, ts: int | None) -> None:
        side.buf = bytearray()
        if side.direction:
            req = side.req
            side.state = _HEAD
            side.req = None
            if req is not None:
                req.last_byte_ns = ts
                self._fill_response(req, side)
                self._pop_front(req)
            side.sse = None
            return
        req = side.req
        side.req = None
        side.state = _HEAD
        if req is None:
            return
        req.end_ns = ts
        req.request_bytes = side.body
        if self._wait_req is req:
            side.state = _HELD
        elif self._switch is not None and self._switch[0] is req:
            switch = self._switch[1]
            self._switch = None
            self._apply_switch(side, switch)

    @staticmethod
    def _fill_response(req: Request, side: _Side) -> None:
        req.response_bytes = side.body
        if side.sse is not None:
            times = side.sse.event_times
            req.sse_events = len(times)
            req.chunks = len(times)
            req.chunk_gaps_ns = side.sse.gaps()
            req.first_event_ns = times[0] if times else None
        else:
            t = side.chunk_times
            req.chunks = len(t)
            req.chunk_gaps_ns = [b - a for a, b in itertools.pairwise(t)] or None

    def _stop(self, side: _Side, message: str) -> None:
        self._warn(message)
        side.state = _STOPPED
        side.buf = bytearray()
        if not side.direction:
            side.held = deque()
            side.held_len = 0

    def _warn(self, message: str) -> None:
        add_warning(self._warnings, message, MAX_WARNINGS,
                    "further HTTP/1.x warnings on this connection were dropped")


def _label(req: Request) -> str:
    return f"{req.method} {req.path if req.path is not None else req.authority}"
