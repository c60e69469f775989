"""Redis commands and replies (RESP2 and RESP3), read passively from a connection's two streams.

A sans-IO :class:`~netdiag.protocols.base.StreamAnalyzer`: the flow layer (or the TLS
layer, for ``rediss``) feeds each direction's in-order bytes, split anywhere, with the
capture time of the segment carrying them. Each command becomes one
:class:`~netdiag.records.Request` (``protocol="resp"``, ``estimated=False``):

``method``
    The command name, upper-cased (``GET``, ``HINCRBY``, ``EVALSHA``); for the
    container commands (``SCRIPT``, ``CLIENT``, ``CONFIG``, ``XINFO``...) the
    subcommand too, as Redis documents them: ``SCRIPT LOAD``, ``CLIENT SETNAME``.
``path``
    The first key the command names, where its position is known (argument 1 for
    most commands; the first ``KEYS`` entry of ``EVAL``/``EVALSHA``/``FCALL``, None
    when ``numkeys`` is 0; the first key after ``numkeys`` for ``ZUNION``, ``LMPOP``...;
    after ``STREAMS`` for ``XREAD``); the channel or pattern for pub/sub commands;
    None for commands without keys (``PING``, ``MULTI``, ``SCRIPT LOAD``...). At most
    :data:`MAX_ARG` bytes, decoded as UTF-8 with backslash escapes for other bytes.
``ts_ns`` / ``end_ns``
    Capture time of the segment carrying the command's first / last byte.
``first_byte_ns`` / ``last_byte_ns``
    Capture time of the segment carrying the reply's first / last byte (a RESP3
    attribute before the reply is part of it). For ``SUBSCRIBE a b c`` the reply is
    the three confirmations. None when no reply was seen: the server never answered
    before the connection ended, the stream was lost, or the command asks for no
    reply (``CLIENT REPLY OFF``/``SKIP`` and what they silence).
``request_bytes`` / ``response_bytes``
    Wire size of the command / of its reply (RESP framing included).
``reset``
    ``error:<PREFIX>`` when the reply is an error (``-`` simple error or ``!`` bulk
    error): the error's first word, e.g. ``error:ERR``, ``error:NOSCRIPT``,
    ``error:WRONGTYPE``, ``error:MOVED``. Only the top-level reply counts: the
    errors of single commands inside an ``EXEC`` reply are not looked at.
``status``
    Always None (RESP has no status code).
``named_ids``
    The words of the command that could name a request's correlation id: its
    arguments after the name (but a subcommand, the script or digest of ``EVAL`` and
    ``EVALSHA``, or ``FCALL``'s function name) and their parts between ``:``, ``{``,
    ``}``, ``/``, ``|``, ``=``; 8 to 128 bytes, not numbers. A rate-limit script or
    an idempotency key called with the HTTP request's ``x-request-id`` ties the
    command to that request (:mod:`netdiag.paths.chains`). Not in the JSON report.

Replies are matched to commands in order (pipelining). ``MULTI``, each queued command
(its reply is ``+QUEUED``) and ``EXEC`` are commands of their own. RESP3 push
messages (``>``) are not replies, except the subscribe/unsubscribe confirmations a
pending (un)subscribe command waits for; in RESP2 pub/sub mode, ``message``,
``pmessage`` and ``smessage`` arrays are pushes too. After ``MONITOR``, replies
that arrive with no command outstanding are the monitor feed, not strays.

Every RESP2 and RESP3 type is parsed, in both directions: arrays, bulk strings,
simple strings, errors, integers, nulls (``_``, ``$-1``, ``*-1``), doubles, booleans,
big numbers, bulk errors, verbatim strings, maps, sets, pushes, attributes, and the
streamed strings (``$?`` with ``;`` chunks) and aggregates (``*?`` ... ``.``). A client
stream that does not start a value with ``*`` is read as inline commands, as
Redis reads it (split on blanks, quotes not interpreted).

Bounded: only a line being read (at most :data:`MAX_LINE` bytes) and the first
:data:`MAX_ARG` bytes of the first :data:`MAX_ARGS` arguments of a command are ever
buffered; bulk strings are skipped by counting, whatever length the peer claims.
Over-long simple-string/error/number lines are skipped to their end. Bytes that are
not RESP end the parsing of that direction with a warning; lost bytes inside a
bulk string are skipped (the argument is then unknown), lost bytes anywhere else
end that direction (an unknown number of messages was lost, so FIFO matching
would be wrong from there on). Nothing raises for bad bytes.

Numbers are never converted beyond what is needed: an integer (``:``), double or big
number reply of any length (more digits than Python's ``int`` conversion allows,
``sys.get_int_max_str_digits()``, included) is a scalar like any other, matched to its
command, and parsing goes on; :attr:`RespAnalyzer.oversized_numbers` counts the
numeric replies longer than :data:`MAX_NUMBER_DIGITS` digits. A length or count
(``*``, ``$``, ``;``...) is read from its digits without ``int`` (leading zeros
allowed); one above :data:`MAX_LENGTH`, whatever its number of digits, is "a length
over 2**40": the value cannot be skipped, so that direction ends with a warning.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Final

from netdiag.protocols.base import AnalyzerKind, add_warning
from netdiag.records import Request

MAX_LINE = 64 * 1024
"""Longest line (type byte, length, simple string, inline command) buffered."""
MAX_ARGS = 16
"""Arguments (command name included) captured per command."""
MAX_ARG = 512
"""Bytes captured per argument; longer arguments are truncated."""
MIN_ID = 8
"""Shortest word of a command read as a possible request id (:func:`_named_ids`)."""
MAX_ID = 128
"""Longest such word."""
MAX_NAMED_IDS = 8
"""Possible request ids kept per command."""
_ID_SEPARATORS = re.compile(rb"[:{}/|=]")
_NUMBER = re.compile(rb"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")
MAX_SERVER_CAPTURE = 64
"""Bytes captured of a reply's error text and of its first elements (push kinds)."""
MAX_DEPTH = 128
"""Deepest nesting of aggregates accepted."""
MAX_LENGTH = 1 << 40
"""Largest bulk-string length or aggregate count accepted."""
MAX_WARNINGS = 32
"""Warnings kept per connection; one more line says the rest were dropped."""
MAX_NUMBER_DIGITS = 4300
"""Digits of a numeric reply above which :attr:`RespAnalyzer.oversized_numbers` counts
it (Python's default ``int`` conversion limit; the value is never converted)."""
_LENGTH_DIGITS = len(str(MAX_LENGTH))

RESP_PORTS = frozenset({6379})
"""Server ports claimed for RESP whatever the first bytes (Redis's default port)."""

_RESP_START = re.compile(rb"\*[1-9][0-9]{0,8}\r\n\$")

# Parser states of one direction.
_LINE = 0  # reading a line: a type byte and what follows it up to CRLF
_BULK = 1  # inside a bulk string payload (``rem`` bytes left, CRLF included)
_CHUNK = 2  # a streamed string (``$?``): expecting a ``;<len>`` chunk line
_SKIPLINE = 3  # skipping the rest of an over-long scalar line
_STOPPED: Final = 4  # not parsed any more

_NAMES: Final = ("client", "server")

# Type bytes.
_ARRAY, _MAP, _SET, _PUSH, _ATTR = 0x2A, 0x25, 0x7E, 0x3E, 0x7C  # * % ~ > |
_BULKSTR, _BULKERR, _VERBATIM = 0x24, 0x21, 0x3D  # $ ! =
_SIMPLE, _ERROR, _INT, _NULL, _DOUBLE, _BOOL, _BIGNUM = (
    0x2B, 0x2D, 0x3A, 0x5F, 0x2C, 0x23, 0x28)  # + - : _ , # (
_END = 0x2E  # . (end of a streamed aggregate)
_SCALARS = frozenset((_SIMPLE, _ERROR, _INT, _NULL, _DOUBLE, _BOOL, _BIGNUM))
_AGGREGATES = frozenset((_ARRAY, _MAP, _SET, _PUSH, _ATTR))
_BULKS = frozenset((_BULKSTR, _BULKERR, _VERBATIM))

_CONTAINERS = frozenset((
    b"ACL", b"CLIENT", b"CLUSTER", b"COMMAND", b"CONFIG", b"DEBUG", b"FUNCTION",
    b"LATENCY", b"MEMORY", b"MODULE", b"OBJECT", b"PUBSUB", b"SCRIPT", b"SLOWLOG",
    b"XGROUP", b"XINFO"))
"""Commands whose first argument is a subcommand (``method`` names both)."""
_KEYLESS = frozenset((
    b"ASKING", b"AUTH", b"BGREWRITEAOF", b"BGSAVE", b"DBSIZE", b"DISCARD", b"ECHO",
    b"EXEC", b"FAILOVER", b"FLUSHALL", b"FLUSHDB", b"HELLO", b"INFO", b"KEYS",
    b"LASTSAVE", b"LOLWUT", b"MONITOR", b"MULTI", b"PFSELFTEST", b"PING", b"PSYNC",
    b"QUIT", b"RANDOMKEY", b"READONLY", b"READWRITE", b"REPLCONF", b"REPLICAOF",
    b"RESET", b"ROLE", b"SAVE", b"SCAN", b"SELECT", b"SHUTDOWN", b"SLAVEOF", b"SWAPDB",
    b"SYNC", b"TIME", b"UNWATCH", b"WAIT", b"WAITAOF"))
"""Commands naming no key."""
_KEY_AT_2 = frozenset((b"BITOP",))
_CONTAINER_KEY_AT_2 = frozenset((b"OBJECT", b"MEMORY", b"XINFO", b"XGROUP"))
_NUMKEYS_AT_1 = frozenset((b"ZUNION", b"ZINTER", b"ZDIFF", b"ZINTERCARD", b"SINTERCARD",
                           b"LMPOP", b"ZMPOP"))
_NUMKEYS_AT_2 = frozenset((b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL",
                           b"FCALL_RO", b"BLMPOP", b"BZMPOP"))
_NOT_ID_AT_1 = _CONTAINERS | frozenset((b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO",
                                        b"FCALL", b"FCALL_RO"))
"""Commands whose first argument is never an id: a subcommand, ``EVAL``'s script or
``EVALSHA``'s digest, ``FCALL``'s function name (:func:`_named_ids` skips it)."""
_SUBSCRIBES = frozenset((b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE",
                         b"PUNSUBSCRIBE", b"SUNSUBSCRIBE"))
_UNSUBSCRIBES = frozenset((b"unsubscribe", b"punsubscribe", b"sunsubscribe"))
_CONFIRMS = frozenset(s.lower() for s in _SUBSCRIBES)
_MESSAGES = frozenset((b"message", b"pmessage", b"smessage"))


_NUMBERS = frozenset((_INT, _DOUBLE, _BIGNUM))


def _length(digits: bytes) -> int:
    """The value of ASCII ``digits`` (``isdigit()`` already true), or ``MAX_LENGTH + 1``
    when it is larger than :data:`MAX_LENGTH`: never ``int()`` of thousands of digits."""
    d = digits.lstrip(b"0")
    if len(d) > _LENGTH_DIGITS:
        return MAX_LENGTH + 1
    return int(d) if d else 0


def looks_like_resp(first: bytes) -> bool:
    """The client's first bytes open a RESP command: ``*<count>\\r\\n$`` (count 1..)."""
    return _RESP_START.match(first) is not None


class _Side:
    """Parser state of one direction."""

    __slots__ = ("active", "args", "buf", "cap", "cap_left", "capval", "cur_end", "direction",
                 "err", "in_stream", "kind", "line_off", "line_ts", "lost", "maxargs", "nargs",
                 "off", "rem", "skip_first", "stack", "start_off", "start_ts", "state")

    def __init__(self, direction: int) -> None:
        self.direction = direction
        self.state = _LINE
        self.buf = bytearray()
        """The line being read, when it started in an earlier ``feed``."""
        self.off = 0
        """Bytes of the stream seen (fed or lost) before the current ``feed``."""
        self.cur_end = 0
        """Stream offset just past the bytes parsed so far."""
        self.line_ts = 0
        self.line_off = 0
        self.rem = 0
        self.stack: list[list[int]] = []
        """Open aggregates: ``[elements left (-1: streamed), elements done, is attribute]``."""
        self.active = False
        """A top-level value (command or reply) is being read."""
        self.start_ts = 0
        self.start_off = 0
        self.kind = 0
        """Type byte of the top-level value (after any attribute)."""
        self.args: list[bytes | None] = []
        """Captured top-level elements (client: arguments; server: the first three)."""
        self.nargs = 0
        """Elements of the top-level aggregate."""
        self.err: bytes | None = None
        self.cap: bytearray | None = None
        self.cap_left = 0
        self.capval: bytes | None = None
        self.lost = False
        self.in_stream = False
        self.skip_first = b""
        self.maxargs = MAX_ARGS if direction == 0 else 3


class _Pending:
    """A command waiting for its reply (or its confirmations)."""

    __slots__ = ("confirm", "expect", "req")

    def __init__(self, req: Request, expect: int, confirm: bytes | None) -> None:
        self.req = req
        self.expect = expect
        self.confirm = confirm


class RespAnalyzer:
    """Redis RESP2/RESP3 over one connection (see the module docstring)."""

    def __init__(self) -> None:
        self._client = _Side(0)
        self._server = _Side(1)
        self._sides = (self._client, self._server)
        self._requests: list[Request] = []
        self._fifo: deque[_Pending] = deque()
        self._warnings: list[str] = []
        self._subscribed = False
        self._monitor = False
        self._reply_off = False
        self._skip_next = False
        self._orphans = 0
        self.pushes = 0
        """Server values that were not replies (RESP3 pushes, pub/sub messages, monitor)."""
        self.oversized_numbers = 0
        """Numeric values (``:``, ``,``, ``(``) of more than :data:`MAX_NUMBER_DIGITS`
        digits: kept as scalars, never converted."""
        self._closed = False

    # -- StreamAnalyzer interface ------------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """Commands in the order they started."""
        return list(self._requests)

    @property
    def warnings(self) -> list[str]:
        return list(self._warnings)

    @property
    def protocol(self) -> str:
        return "resp"

    @property
    def http2(self) -> dict[str, Any] | None:
        return None

    @property
    def kind(self) -> AnalyzerKind:
        """``resp``."""
        return "resp"

    @property
    def client_random(self) -> bytes | None:
        """None: the TLS layer, if any, is not this analyzer's."""
        return None

    @property
    def limits_hit(self) -> dict[str, int]:
        """Empty: RESP parsing is bounded per line and argument, without dropping state."""
        return {}

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        if not data or self._closed:
            return
        side = self._sides[1 if direction else 0]
        if side.state == _STOPPED:
            side.off += len(data)
            return
        if type(data) is not bytes:
            data = bytes(data)
        try:
            self._run(side, ts_ns, data, packet)
        except Exception as exc:  # a bug: keep the rest of the capture analysable
            self._stop(side, f"internal error parsing the {_NAMES[side.direction]} stream "
                             f"({type(exc).__name__}: {exc}) at packet {packet}; "
                             "stopped parsing it")

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        if nbytes <= 0 or self._closed:
            return
        side = self._sides[1 if direction else 0]
        try:
            self._gap(side, ts_ns, nbytes)
        except Exception as exc:  # a bug: keep the rest of the capture analysable
            self._stop(side, f"internal error after lost bytes of the "
                             f"{_NAMES[side.direction]} stream ({type(exc).__name__}: "
                             f"{exc}); stopped parsing it")

    def _gap(self, side: _Side, ts_ns: int, nbytes: int) -> None:
        st = side.state
        side.off += nbytes
        if st == _STOPPED:
            return
        if st == _BULK and nbytes <= side.rem:
            side.rem -= nbytes
            side.lost = True
            side.cur_end = side.off
            if side.rem == 0:
                self._bulk_end(side, ts_ns)
            return
        where = "between messages" if not side.active and not side.buf else "inside a message"
        self._stop(side, f"{nbytes} bytes of the {_NAMES[side.direction]} stream were not "
                         f"captured ({where}); stopped parsing it")

    def close(self, ts_ns: int) -> None:
        if self._closed:
            return
        self._closed = True
        cli, srv = self._client, self._server
        if srv.state != _STOPPED and (srv.active or srv.buf) and self._fifo:
            head = self._fifo[0]
            req = head.req
            if req.first_byte_ns is None:
                req.first_byte_ns = srv.start_ts if srv.active else srv.line_ts
            self._warn(f"the connection ended inside the reply to {_label(req)}")
            self._fifo.popleft()
        if cli.state != _STOPPED and (cli.active or cli.buf):
            self._warn("the connection ended inside a command")
        waiting = [p for p in self._fifo if p.req.first_byte_ns is None]
        if waiting and srv.state != _STOPPED:
            n = len(waiting)
            self._warn(f"{n} command{'s' if n > 1 else ''} got no reply before the "
                       f"connection ended (first: {_label(waiting[0].req)})")
        if self._orphans:
            self._warn(f"{self._orphans} repl{'ies' if self._orphans > 1 else 'y'} arrived "
                       "with no command outstanding")
        if self.oversized_numbers:
            n = self.oversized_numbers
            self._warn(f"{n} number{'s' if n > 1 else ''} of more than {MAX_NUMBER_DIGITS} "
                       "digits (read as opaque values, not converted)")
        self._fifo.clear()
        for side in self._sides:
            side.state = _STOPPED
            side.buf = bytearray()
            side.stack = []
            side.cap = None

    # -- the parser ------------------------------------------------------------------

    def _run(self, side: _Side, ts: int, data: bytes, packet: int) -> None:
        n = len(data)
        base = side.off
        side.off = base + n
        pos = 0
        while pos < n:
            st = side.state
            if st == _LINE and not side.active and not side.buf:
                # Fast paths: a whole command / simple reply inside this segment.
                if side.direction == 0:
                    if data[pos] == _ARRAY:
                        p = self._fast_command(side, data, pos, base, ts)
                        if p > 0:
                            pos = p
                            continue
                else:
                    p = self._fast_reply(side, data, pos, base, ts)
                    if p > 0:
                        pos = p
                        continue
            if st in (_LINE, _CHUNK):
                buf = side.buf
                if not buf:
                    end = data.find(b"\n", pos, pos + MAX_LINE)
                    if end < 0:
                        side.line_ts = ts
                        side.line_off = base + pos
                        if n - pos >= MAX_LINE:
                            if not self._long_line(side, data[pos:pos + 64], packet):
                                return
                            pos += MAX_LINE
                            continue
                        side.buf = bytearray(data[pos:])
                        return
                    side.line_ts = ts
                    side.line_off = base + pos
                    line = data[pos:end]
                else:
                    room = MAX_LINE - len(buf)
                    end = data.find(b"\n", pos, pos + room)
                    if end < 0:
                        if n - pos >= room:
                            if not self._long_line(side, bytes(buf[:64]), packet):
                                return
                            pos += room
                            continue
                        buf += data[pos:]
                        return
                    buf += data[pos:end]
                    line = bytes(buf)
                    side.buf = bytearray()
                pos = end + 1
                side.cur_end = base + pos
                if line[-1:] == b"\r":
                    line = line[:-1]
                if st == _LINE:
                    self._line(side, line, ts, packet)
                else:
                    self._chunk_line(side, line, ts, packet)
                # Fast path: a bulk payload wholly in this segment.
                if side.state == _BULK:
                    rem = side.rem
                    stop = pos + rem
                    if stop <= n:
                        if data[stop - 2:stop] != b"\r\n":
                            self._garbage(side, data[stop - 2:stop], "a bulk string "
                                          "not followed by CRLF", packet)
                            return
                        cap = side.cap
                        if cap is not None and side.cap_left > len(cap):
                            cap += data[pos:min(stop - 2, pos + side.cap_left - len(cap))]
                        pos = stop
                        side.cur_end = base + pos
                        side.rem = 0
                        self._bulk_end(side, ts)
            elif st == _BULK:
                rem = side.rem
                take = min(rem, n - pos)
                payload = min(take, max(rem - 2, 0))
                if payload and side.cap is not None and side.cap_left > len(side.cap):
                    side.cap += data[pos:pos + min(payload, side.cap_left - len(side.cap))]
                if take > payload:
                    crlf_at = 2 - (rem - payload)
                    want = b"\r\n"[crlf_at:crlf_at + take - payload]
                    got = data[pos + payload:pos + take]
                    if got != want:
                        self._garbage(side, got, "a bulk string not followed by CRLF", packet)
                        return
                pos += take
                side.cur_end = base + pos
                side.rem = rem - take
                if side.rem == 0:
                    self._bulk_end(side, ts)
            elif st == _SKIPLINE:
                end = data.find(b"\n", pos)
                if end < 0:
                    return
                pos = end + 1
                side.cur_end = base + pos
                line, side.skip_first = side.skip_first, b""
                side.state = _LINE
                self._line(side, line, ts, packet)
            else:
                return

    def _fast_command(self, side: _Side, data: bytes, pos: int, base: int, ts: int) -> int:
        """Parse a command of bulk strings wholly in ``data[pos:]``; 0 if it is not one."""
        n = len(data)
        end = data.find(b"\r\n", pos, pos + 12)
        if end < 0:
            return 0
        digits = data[pos + 1:end]
        if not digits.isdigit():
            return 0
        count = _length(digits)
        if count == 0 or count > 1024:
            return 0
        p = end + 2
        args: list[bytes | None] = []
        for i in range(count):
            if p >= n or data[p] != _BULKSTR:
                return 0
            e = data.find(b"\r\n", p, p + 14)
            if e < 0:
                return 0
            digits = data[p + 1:e]
            if not digits.isdigit():
                return 0
            start = e + 2
            stop = start + _length(digits)
            if data[stop:stop + 2] != b"\r\n":
                return 0
            if i < MAX_ARGS:
                args.append(data[start:min(stop, start + MAX_ARG)])
            p = stop + 2
        side.cur_end = base + p
        self._command(args, count, ts, ts, p - pos)
        return p

    def _fast_reply(self, side: _Side, data: bytes, pos: int, base: int, ts: int) -> int:
        """Parse a simple-string, error, integer or bulk-string reply wholly in ``data[pos:]``."""
        t = data[pos]
        end = data.find(b"\r\n", pos, pos + 1024)
        if end < 0:
            return 0
        if t == _BULKSTR:
            digits = data[pos + 1:end]
            if not digits.isdigit():
                return 0
            stop = end + 2 + _length(digits)
            if data[stop:stop + 2] != b"\r\n":
                return 0
            p = stop + 2
            side.err = None
        elif t in (_SIMPLE, _INT):
            p = end + 2
            side.err = None
        elif t == _ERROR:
            p = end + 2
            side.err = data[pos + 1:min(end, pos + 1 + MAX_SERVER_CAPTURE)]
        else:
            return 0
        side.kind = t
        side.args = []
        side.start_ts = ts
        side.start_off = base + pos
        side.cur_end = base + p
        self._reply(side, ts)
        return p

    def _long_line(self, side: _Side, head: bytes, packet: int) -> bool:
        """A line over MAX_LINE: True if it is skipped to its end (a scalar), else stop."""
        side.buf = bytearray()
        if head and head[0] in _SCALARS and (side.direction or side.stack or side.active):
            if head[0] in _NUMBERS:  # MAX_LINE bytes already: over MAX_NUMBER_DIGITS
                self.oversized_numbers += 1
            side.state = _SKIPLINE
            side.skip_first = head
            return True
        self._stop(side, f"a line over {MAX_LINE} bytes in the {_NAMES[side.direction]} "
                         f"stream (packet {packet}, starting {head[:32]!r}); stopped parsing it")
        return False

    def _line(self, side: _Side, line: bytes, ts: int, packet: int) -> None:
        """One complete line of a value (without its line end)."""
        stack = side.stack
        if not side.active:
            if not stack and side.direction == 0 and (not line or line[0] != _ARRAY):
                self._inline(side, line, ts)
                return
            side.active = True
            side.start_ts = side.line_ts
            side.start_off = side.line_off
            side.args = []
            side.err = None
        if not line:
            self._garbage(side, line, "an empty line where a RESP value was expected", packet)
            return
        t = line[0]
        if not stack:
            side.kind = t
        if t in _NUMBERS and len(line) > MAX_NUMBER_DIGITS + 1:
            self.oversized_numbers += 1
        if t in _SCALARS:
            if stack:
                fr = stack[-1]
                if len(stack) == 1 and fr[1] < side.maxargs and not fr[2]:
                    side.capval = line[1:1 + (MAX_ARG if side.direction == 0
                                              else MAX_SERVER_CAPTURE)]
            elif t == _ERROR:
                side.err = line[1:1 + MAX_SERVER_CAPTURE]
            self._complete(side, ts)
            return
        body = line[1:]
        if body.isdigit():
            count = _length(body)
            if count > MAX_LENGTH:
                self._garbage(side, line, "a length over 2**40", packet)
                return
        elif body == b"-1" and t in (_BULKSTR, _ARRAY):
            if side.direction == 0 and not stack:
                side.active = False  # Redis ignores "*-1" from a client
                return
            self._complete(side, ts)  # RESP2 null bulk string / null array
            return
        elif body == b"?" and (t in _AGGREGATES or t == _BULKSTR):
            count = -1
        else:
            if t == _END and not body and stack and stack[-1][0] == -1:
                fr = stack.pop()
                self._agg_done(side, fr, ts)
                return
            self._garbage(side, line, "not a RESP type line", packet)
            return
        if t in _BULKS:
            self._want_capture(side, t)
            side.lost = False
            if count < 0:
                side.in_stream = True
                side.state = _CHUNK
            else:
                side.in_stream = False
                side.rem = count + 2
                side.state = _BULK
            return
        if t in _AGGREGATES:
            if side.direction == 0 and not stack and count == 0:
                side.active = False  # Redis ignores "*0"
                return
            if count == 0:
                if t != _ATTR:
                    self._complete(side, ts)
                return
            if len(stack) >= MAX_DEPTH:
                self._garbage(side, line, f"aggregates nested over {MAX_DEPTH} deep", packet)
                return
            if count > 0 and t in (_MAP, _ATTR):
                count *= 2
            if not stack:
                side.nargs = count
            stack.append([count, 0, 1 if t == _ATTR else 0])
            return
        self._garbage(side, line, "not a RESP type line", packet)

    def _want_capture(self, side: _Side, t: int) -> None:
        stack = side.stack
        if stack:
            fr = stack[-1]
            if len(stack) == 1 and fr[1] < side.maxargs and not fr[2]:
                side.cap = bytearray()
                side.cap_left = MAX_ARG if side.direction == 0 else MAX_SERVER_CAPTURE
                return
        elif t == _BULKERR:
            side.cap = bytearray()
            side.cap_left = MAX_SERVER_CAPTURE
            return
        side.cap = None

    def _chunk_line(self, side: _Side, line: bytes, ts: int, packet: int) -> None:
        """A ``;<len>`` line of a streamed string."""
        body = line[1:]
        size = _length(body) if body.isdigit() else -1
        if line[:1] != b";" or not 0 <= size <= MAX_LENGTH:
            self._garbage(side, line, "not a streamed-string chunk", packet)
            return
        if size == 0:
            side.state = _LINE
            self._string_done(side, ts)
            return
        side.rem = size + 2
        side.state = _BULK

    def _bulk_end(self, side: _Side, ts: int) -> None:
        if side.in_stream:
            side.state = _CHUNK
            return
        side.state = _LINE
        self._string_done(side, ts)

    def _string_done(self, side: _Side, ts: int) -> None:
        cap = side.cap
        if cap is not None:
            side.cap = None
            value = None if side.lost else bytes(cap)
            if side.stack:
                side.capval = value
            else:
                side.err = value if value is not None else b""
        side.in_stream = False
        self._complete(side, ts)

    def _complete(self, side: _Side, ts: int) -> None:
        """A value ended at the current depth."""
        stack = side.stack
        while stack:
            fr = stack[-1]
            if len(stack) == 1 and not fr[2] and fr[1] < side.maxargs:
                side.args.append(side.capval)
            side.capval = None
            fr[1] += 1
            left = fr[0]
            if left < 0:
                return
            if left > 1:
                fr[0] = left - 1
                return
            stack.pop()
            if fr[2]:  # an attribute: the value it annotates follows
                return
        side.capval = None
        self._top_done(side, ts)

    def _agg_done(self, side: _Side, fr: list[int], ts: int) -> None:
        """A streamed aggregate ended (``.``)."""
        if fr[2]:
            return
        self._complete(side, ts)

    # -- commands and replies ------------------------------------------------------------

    def _top_done(self, side: _Side, ts: int) -> None:
        side.active = False
        if side.direction == 0:
            self._command(side.args, side.nargs, side.start_ts, ts,
                          side.cur_end - side.start_off)
        else:
            self._reply(side, ts)

    def _inline(self, side: _Side, line: bytes, ts: int) -> None:
        """An inline command (a client line not starting with ``*``)."""
        words = line.split()
        if not words:
            return
        args: list[bytes | None] = [w[:MAX_ARG] for w in words[:MAX_ARGS]]
        self._command(args, len(words), side.line_ts, ts, side.cur_end - side.line_off)

    def _command(self, args: list[bytes | None], nargs: int, start: int, ts: int,
                 nbytes: int) -> None:
        name = args[0] if args else None
        uname = name.upper() if name is not None else None
        method = None if uname is None else uname.decode("ascii", "backslashreplace")
        sub = None
        if uname in _CONTAINERS and len(args) > 1 and args[1] is not None:
            sub = args[1].upper()
            method = f"{method} {sub.decode('ascii', 'backslashreplace')}"
        key = _first_key(uname, args)
        req = Request(ts_ns=start, end_ns=ts, method=method,
                      path=None if key is None else key.decode("utf-8", "backslashreplace"),
                      estimated=False, protocol="resp", request_bytes=nbytes,
                      named_ids=_named_ids(args, 2 if uname in _NOT_ID_AT_1 else 1))
        self._requests.append(req)
        reply = True
        if uname == b"CLIENT" and sub == b"REPLY":
            mode = args[2].upper() if len(args) > 2 and args[2] is not None else b""
            if mode == b"OFF":
                self._reply_off, reply = True, False
            elif mode == b"SKIP":
                reply = False
                self._skip_next = not self._reply_off
            elif mode == b"ON":
                self._reply_off = self._skip_next = False
        elif self._reply_off:
            reply = False
        elif self._skip_next:
            self._skip_next, reply = False, False
        if uname == b"RESET":
            self._subscribed = self._monitor = self._reply_off = self._skip_next = False
            reply = True
        if not reply:
            return
        if uname in _SUBSCRIBES:
            self._subscribed = True
            self._fifo.append(_Pending(req, max(nargs - 1, 1), uname.lower()))
            return
        if uname == b"MONITOR":
            self._monitor = True
        self._fifo.append(_Pending(req, 1, None))

    def _reply(self, side: _Side, ts: int) -> None:
        kind = side.kind
        args = side.args
        label = args[0].lower() if args and args[0] is not None else None
        fifo = self._fifo
        head = fifo[0] if fifo else None
        if kind == _PUSH or (self._subscribed and kind == _ARRAY
                             and (label in _MESSAGES or label in _CONFIRMS)):
            if label in _UNSUBSCRIBES and len(args) > 2 and args[2] == b"0":
                self._subscribed = False
            if head is not None and head.confirm is not None and label == head.confirm:
                req = head.req
                if req.first_byte_ns is None:
                    req.first_byte_ns = side.start_ts
                    req.response_bytes = 0
                req.last_byte_ns = ts
                req.response_bytes = (req.response_bytes or 0) + side.cur_end - side.start_off
                head.expect -= 1
                if head.expect <= 0:
                    fifo.popleft()
            else:
                self.pushes += 1
            return
        if head is None:
            if self._monitor:
                self.pushes += 1
            else:
                self._orphans += 1
            return
        fifo.popleft()
        req = head.req
        if req.first_byte_ns is None:
            req.first_byte_ns = side.start_ts
            req.response_bytes = 0
        req.last_byte_ns = ts
        req.response_bytes = (req.response_bytes or 0) + side.cur_end - side.start_off
        if kind in (_ERROR, _BULKERR):
            word = (side.err or b"").split(None, 1)
            prefix = word[0][:32].decode("ascii", "backslashreplace") if word else "ERR"
            req.reset = f"error:{prefix}"

    # -- errors ------------------------------------------------------------------------

    def _garbage(self, side: _Side, got: bytes, what: str, packet: int) -> None:
        self._stop(side, f"{what} in the {_NAMES[side.direction]} stream (packet {packet}, "
                         f"{bytes(got[:32])!r}); stopped parsing it")

    def _stop(self, side: _Side, message: str) -> None:
        self._warn(message)
        side.state = _STOPPED
        side.buf = bytearray()
        side.stack = []
        side.cap = None
        side.active = False

    def _warn(self, message: str) -> None:
        add_warning(self._warnings, message, MAX_WARNINGS,
                    "further RESP warnings on this connection were dropped")


def _named_ids(args: list[bytes | None], first: int) -> tuple[str, ...] | None:
    """The words of a command that could be a request's correlation id: each argument
    from ``first`` on, and each part of one between ``:``, ``{``, ``}``, ``/``, ``|`` or
    ``=`` (a key ``idem:<id>``), of :data:`MIN_ID` to :data:`MAX_ID` bytes and not a
    number; at most :data:`MAX_NAMED_IDS`, None when there are none."""
    out: list[str] = []
    for a in args[first:]:
        if a is None or len(a) < MIN_ID:
            continue
        for w in (a, *_ID_SEPARATORS.split(a)) if _ID_SEPARATORS.search(a) else (a,):
            if MIN_ID <= len(w) <= MAX_ID and not _NUMBER.fullmatch(w):
                word = w.decode("utf-8", "backslashreplace")
                if word not in out:
                    out.append(word)
                    if len(out) == MAX_NAMED_IDS:
                        return tuple(out)
    return tuple(out) if out else None


def _first_key(name: bytes | None, args: list[bytes | None]) -> bytes | None:
    """The first key (or channel) of a command, from its captured arguments."""
    if name is None or name in _KEYLESS:
        return None
    at = 1
    if name in _CONTAINERS:
        if name not in _CONTAINER_KEY_AT_2:
            return None
        at = 2
    elif name in _KEY_AT_2:
        at = 2
    elif name in _NUMKEYS_AT_2 or name in _NUMKEYS_AT_1:
        nk = 2 if name in _NUMKEYS_AT_2 else 1
        num = args[nk] if len(args) > nk else None
        if num is None or not num.isdigit() or _length(num) == 0:
            return None
        at = nk + 1
    elif name in (b"XREAD", b"XREADGROUP"):
        for i, a in enumerate(args):
            if a is not None and a.upper() == b"STREAMS":
                at = i + 1
                break
        else:
            return None
    elif name == b"MIGRATE":
        at = 3
    return args[at] if len(args) > at else None


def _label(req: Request) -> str:
    return f"{req.method}" + (f" {req.path}" if req.path is not None else "")
