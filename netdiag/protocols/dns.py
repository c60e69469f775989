"""Passive DNS analysis: queries and responses paired into :class:`DnsTransaction`.

The analyzer is sans-IO: the pipeline hands it UDP payloads (``on_udp``) and TCP
byte streams (``tcp_stream`` returns a :class:`~netdiag.protocols.base.StreamAnalyzer`)
with capture timestamps, and it calls ``emit`` once per finished transaction. It
never reads a clock, never raises for bad bytes, and holds only the transactions
that are still open, so memory follows concurrent transactions, not packets.

A transaction is keyed as CONTRACT.md says: (client endpoint, server endpoint,
transport, DNS id, question name, question type), the name compared without regard
to ASCII case. The first query starts it; repeated queries with the same key count
as retransmissions and do not move its start; the first matching response completes
it and later ones are counted as duplicates until the transaction has been idle for
``timeout_ns``.

Parsing cost decides the split of work. dnspython's ``dns.message.from_wire`` costs
about 38 µs for a query and 150 µs for a three-answer response here, so the header
and question are read by a small bounds-checked parser of our own (it agrees with
dnspython's on every input the tests try), the answer section is walked record by
record, and each answer's rdata is decoded and printed by dnspython
(``dns.rdata.from_wire``), which stays the parser of record for every value we
report, except where its text is plain: A and AAAA addresses (class IN, the right
length) and the names of NS, CNAME and PTR (read by the question's name parser; any
doubt, such as a name that does not fill its rdata, goes to dnspython). The tests
compare both on valid and mutated messages. Only the first response of a transaction
has its answers decoded; queries (about 4 µs including the transaction), duplicates
and unmatched responses (about 2 µs) never touch dnspython. The texts of rdata that
holds no compressible name (A, AAAA, TXT, SVCB, HTTPS, CAA) are memoised by their
bytes. Walking record by record also lets a response cut short by the snapshot
length keep the answers that were captured whole.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import dns.exception
import dns.ipv6
import dns.name
import dns.rcode
import dns.rdata
import dns.rdatatype

from netdiag.limits import LIMIT_DNS_OPEN, Limits
from netdiag.protocols.base import AnalyzerKind
from netdiag.records import DnsTransaction, Request

__all__ = ["MAX_WARNINGS", "DnsAnalyzer", "DnsTcpStream", "name_text", "rdata_text"]

_HEADER: Final = struct.Struct("!HHHHHH")
"""id, flags, qdcount, ancount, nscount, arcount."""
_RR: Final = struct.Struct("!HHIH")
"""type, class, ttl, rdlength of a resource record, after its owner name."""
_QTYPE: Final = struct.Struct("!H")

_QR: Final = 0x8000
_TC: Final = 0x0200
_OPT: Final = 41
_IN: Final = 1
_A: Final = 1
_AAAA: Final = 28
_NAME_TYPES: Final = frozenset({2, 5, 12})
"""NS, CNAME, PTR: rdata that is one (possibly compressed) name, read by :func:`_read_name`."""
_MEMO_TYPES: Final = frozenset({_A, _AAAA, 16, 64, 65, 257})
"""A, AAAA, TXT, SVCB, HTTPS, CAA: rdata whose text depends on its bytes only (no name,
or a name dnspython reads only uncompressed), memoised by them."""
_MAX_POINTERS = dns.name.MAX_COMPRESSION_POINTER_CHAIN

_SAFE_LABELS: Final = re.compile(rb"[!#%&'*+,\-/0-9:<=>?A-Z\[\]^_`a-z{|}~]*")
"""Label bytes that dnspython prints unescaped (printable ASCII less ``"().;\\@$``)."""

_ROOT = dns.name.root
_MEMO_SIZE: Final = 4096
MAX_WARNINGS = 200
"""Warnings kept per list; after that one notice, and the rest are only counted."""


class _Malformed(Exception):
    """Internal: the bytes are not a DNS message; the text is the reason."""


def _read_name(wire: bytes, off: int) -> tuple[list[bytes], int]:
    """Read the (possibly compressed) name at ``off``: its labels and the offset after it.

    Mirrors ``dns.name.from_wire_parser``: pointers must point backwards, chains are
    bounded, and a pointed-to name may not overlap the one that points to it.
    """
    labels: list[bytes] = []
    n = len(wire)
    end = n  # bytes at or past ``end`` are off limits (overlap rule after a pointer)
    after = -1
    biggest = off
    hops = 0
    total = 1
    while True:
        if off >= end:
            raise _Malformed("name runs past the end of the message")
        length = wire[off]
        if length == 0:
            off += 1
            break
        if length < 64:
            start = off + 1
            off = start + length
            if off > end:
                raise _Malformed("name runs past the end of the message")
            total += length + 1
            if total > 255:
                raise _Malformed("name longer than 255 bytes")
            labels.append(wire[start:off])
        elif length >= 0xC0:
            if off + 2 > end:
                raise _Malformed("name runs past the end of the message")
            target = ((length & 0x3F) << 8) | wire[off + 1]
            if after < 0:
                after = off + 2
            if target >= biggest:
                raise _Malformed("compression pointer does not point backwards")
            hops += 1
            if hops > _MAX_POINTERS:
                raise _Malformed("compression pointer chain too long")
            end = biggest  # the start of the name part that pointed here
            biggest = target
            off = target
        else:
            raise _Malformed(f"unknown label type 0x{length:02x}")
    return labels, (off if after < 0 else after)


def _skip_name(wire: bytes, off: int) -> int:
    """Offset just past the name at ``off``, without following pointers."""
    n = len(wire)
    while True:
        if off >= n:
            raise _Malformed("name runs past the end of the message")
        length = wire[off]
        if length == 0:
            return off + 1
        if length < 64:
            off += length + 1
        elif length >= 0xC0:
            if off + 2 > n:
                raise _Malformed("name runs past the end of the message")
            return off + 2
        else:
            raise _Malformed(f"unknown label type 0x{length:02x}")


def name_text(labels: list[bytes]) -> str:
    """A name's text as dnspython prints it, without the trailing dot (``.`` for root)."""
    if not labels:
        return "."
    if _SAFE_LABELS.fullmatch(b"".join(labels)):
        return b".".join(labels).decode("ascii")
    return dns.name.Name([*labels, b""]).to_text(omit_final_dot=True)


def rdata_text(rdata: dns.rdata.Rdata) -> str:
    """Rdata as dnspython prints it, with the trailing dot of every embedded name removed.

    Names are printed relative to the root, which drops their final dot; a root
    name, which dnspython then prints as ``@``, is put back as ``.``.
    """
    text = rdata.to_text(origin=_ROOT, relativize=True)
    if "@" in text:
        absolute = rdata.to_text()
        rel_tokens, abs_tokens = text.split(" "), absolute.split(" ")
        if len(rel_tokens) != len(abs_tokens):
            return absolute
        text = " ".join("." if r == "@" and a == "." else r
                        for r, a in zip(rel_tokens, abs_tokens, strict=True))
    return text


_qtype_texts: dict[int, str] = {}
_rcode_texts: dict[int, str] = {}


def _qtype_text(qtype: int) -> str:
    text = _qtype_texts.get(qtype)
    if text is None:
        text = _qtype_texts[qtype] = dns.rdatatype.to_text(qtype)  # type: ignore[arg-type]
    return text


def _rcode_text(rcode: int) -> str:
    text = _rcode_texts.get(rcode)
    if text is None:
        text = _rcode_texts[rcode] = dns.rcode.to_text(rcode)  # type: ignore[arg-type]
    return text


def _name_rdata(wire: bytes, off: int, end: int) -> str | None:
    """The text of an NS, CNAME or PTR rdata at ``wire[off:end]``, as dnspython prints it
    (:func:`rdata_text`), read without dnspython; None where dnspython must decide (the
    name is malformed or does not fill the rdata exactly)."""
    try:
        labels, after = _read_name(wire, off)
    except _Malformed:
        return None
    return name_text(labels) if after == end else None


def _address_rdata(rdtype: int, wire: bytes, off: int, rdlen: int) -> str | None:
    """The text of an A or AAAA rdata (class IN) as dnspython prints it; None for other
    types and wrong lengths (left to dnspython)."""
    if rdtype == _A and rdlen == 4:
        return f"{wire[off]}.{wire[off + 1]}.{wire[off + 2]}.{wire[off + 3]}"
    if rdtype == _AAAA and rdlen == 16:
        return dns.ipv6.inet_ntoa(wire[off:off + 16])
    return None


_Key = tuple[str, str, str, int, str, int]
"""(client, server, transport, id, lowercased qname, qtype)."""
_IdKey = tuple[str, str, str, int]


class _Open:
    """A transaction still held: waiting for its response, or for duplicates of it."""

    __slots__ = ("key", "last_ns", "order", "rec", "stream")

    def __init__(self, key: _Key, rec: DnsTransaction, last_ns: int,
                 stream: DnsTcpStream | None) -> None:
        self.key = key
        self.rec = rec
        self.last_ns = last_ns
        self.stream = stream
        self.order: Any = None
        """``DnsAnalyzer.clock()`` when it last moved to the end of the expiry order."""


class DnsAnalyzer:
    """Pairs DNS queries and responses over UDP and TCP into transactions.

    ``emit`` receives each transaction once, when it is finished: answered and idle
    for ``timeout_ns`` (so duplicate responses are still counted), unanswered for
    ``timeout_ns`` after its last query, when its TCP connection closes, or at
    ``finish``. Emission order is completion order, not start order.

    ``warnings`` holds plain sentences about UDP payloads that were not (wholly) DNS;
    each TCP stream keeps its own in ``DnsTcpStream.warnings``. ``stats`` counts
    ``queries``, ``responses``, ``malformed``, ``partial`` (responses whose answers
    were cut short, transaction kept), ``unmatched_responses``, ``retransmissions``,
    ``duplicate_responses``, ``transactions`` (emitted) and ``warnings_suppressed``.
    """

    def __init__(self, emit: Callable[[DnsTransaction], None], *,
                 timeout_ns: int = 5_000_000_000, limits: Limits | None = None) -> None:
        self._emit = emit
        self.timeout_ns = timeout_ns
        """Idle time after which an open transaction is finished."""
        self.limits = limits if limits is not None else Limits()
        """Caps (``max_dns_open``: transactions open at once) and their hits."""
        self.warnings: list[str] = []
        """Sentences about UDP messages that could not be read (TCP: per stream)."""
        self.stats: dict[str, int] = dict.fromkeys(
            ("queries", "responses", "malformed", "partial", "unmatched_responses",
             "retransmissions", "duplicate_responses", "transactions",
             "warnings_suppressed"), 0)
        """Counters, see the class docstring."""
        self._open: OrderedDict[_Key, _Open] = OrderedDict()
        """Open transactions, least recently active first."""
        self._by_id: dict[_IdKey, list[_Key]] = {}
        """Open transaction keys per (client, server, transport, id)."""
        self._memo: dict[tuple[int, bytes], str] = {}
        """Memo of rdata texts (of :data:`_MEMO_TYPES`), keyed by type and rdata bytes."""
        self._suppressed_noted = False
        self.clock: Callable[[], Any] | None = None
        """When set (``netdiag.shard``), called each time a transaction moves to the end
        of the expiry order; the value is that transaction's place in the order."""
        self.finishing_order: Any = None
        """The ``clock()`` value of the transaction being emitted (when ``clock`` is set)."""

    # -- inputs ------------------------------------------------------------------------

    def on_udp(self, ts_ns: int, src: str, dst: str, payload: bytes, packet: int) -> None:
        """One UDP payload to or from port 53, with its capture time and packet number."""
        self._message(ts_ns, src, dst, "udp", bytes(payload), packet, None, self.warnings)

    def tcp_stream(self, client: str, server: str) -> DnsTcpStream:
        """A stream analyzer for one DNS-over-TCP connection from ``client`` to ``server``."""
        return DnsTcpStream(self, client, server)

    def expire(self, now_ns: int) -> None:
        """Emit every transaction idle for more than ``timeout_ns`` at ``now_ns``."""
        limit = now_ns - self.timeout_ns
        opened = self._open
        while opened:
            first = next(iter(opened.values()))
            if first.last_ns >= limit:
                break
            self._finish(first)

    def head_order(self) -> Any:
        """The ``order`` of the transaction that is next to expire; None when none is open."""
        return next(iter(self._open.values())).order if self._open else None

    def finish(self) -> None:
        """Emit every transaction still open (end of input)."""
        while self._open:
            self._finish(next(iter(self._open.values())))
        if self.stats["warnings_suppressed"] and not self._suppressed_noted:
            self._suppressed_noted = True
            self.warnings.append(
                f"{self.stats['warnings_suppressed']} further DNS warnings were not listed")

    # -- internals ---------------------------------------------------------------------

    def _warn(self, sink: list[str], text: str) -> None:
        """Add a warning to ``sink`` unless it already holds ``MAX_WARNINGS``."""
        if len(sink) < MAX_WARNINGS:
            sink.append(text)
        else:
            self.stats["warnings_suppressed"] += 1

    def _finish(self, txn: _Open) -> None:
        """Forget ``txn`` and emit its record."""
        key = txn.key
        del self._open[key]
        idkey = (key[0], key[1], key[2], key[3])
        keys = self._by_id[idkey]
        keys.remove(key)
        if not keys:
            del self._by_id[idkey]
        if txn.stream is not None:
            txn.stream._keys.discard(key)
        self.stats["transactions"] += 1
        self.finishing_order = txn.order
        self._emit(txn.rec)

    def _message(self, ts_ns: int, src: str, dst: str, transport: str, wire: bytes,
                 packet: int, stream: DnsTcpStream | None, sink: list[str]) -> None:
        """One whole DNS message from ``src`` to ``dst``."""
        stats = self.stats
        if len(wire) < 12:
            stats["malformed"] += 1
            self._warn(sink, f"packet {packet}: malformed DNS message from {src} "
                             f"({len(wire)} bytes, shorter than the 12-byte header)")
            return
        msg_id, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(wire)
        qname: str | None = None
        qtype = 0
        off = 12
        problem: str | None = None
        if qdcount:
            try:
                labels, off = _read_name(wire, 12)
                if off + 4 > len(wire):
                    raise _Malformed("question cut short")
                qtype = _QTYPE.unpack_from(wire, off)[0]
                off += 4
                qname = name_text(labels)
            except _Malformed as exc:
                problem = str(exc)
            except Exception as exc:  # dnspython's Name() on odd labels: never raise
                problem = f"bad question name: {exc}"

        if not flags & _QR:
            stats["queries"] += 1
            if qname is None:
                stats["malformed"] += 1
                self._warn(sink, f"packet {packet}: malformed DNS message from {src} "
                                 f"({problem or 'query without a question'})")
                return
            self._query(ts_ns, src, dst, transport, msg_id, qname, qtype, packet, stream)
            return

        stats["responses"] += 1
        client, server = dst, src
        txn: _Open | None = None
        if qname is not None:
            txn = self._open.get((client, server, transport, msg_id, qname.lower(), qtype))
        else:
            if problem is not None:
                stats["malformed"] += 1
                self._warn(sink, f"packet {packet}: malformed DNS message from {src} "
                                 f"({problem}); matching it by id only")
            keys = self._by_id.get((client, server, transport, msg_id))
            if keys is not None and len(keys) == 1:
                txn = self._open[keys[0]]
        if txn is not None and ts_ns - txn.last_ns > self.timeout_ns:
            self._finish(txn)  # too late: it had already timed out
            txn = None
        if txn is None:
            stats["unmatched_responses"] += 1
            return

        rec = txn.rec
        txn.last_ns = ts_ns
        self._open.move_to_end(txn.key)
        if self.clock is not None:
            txn.order = self.clock()
        rec.responses += 1
        if rec.responses > 1:
            stats["duplicate_responses"] += 1
            return
        rec.response_ts_ns = ts_ns
        rec.response_packet = packet
        rec.truncated = bool(flags & _TC)
        rcode = flags & 0xF
        if problem is None:
            answers, ext, error = self._answers(wire, off, ancount, nscount + arcount)
            rec.answers = answers
            rcode |= ext << 4
            if error is not None:
                stats["partial"] += 1
                self._warn(sink, f"packet {packet}: malformed DNS message from {src} "
                                 f"({error}; kept {len(answers)} of {ancount} answers)")
        rec.rcode = _rcode_text(rcode)

    def _query(self, ts_ns: int, client: str, server: str, transport: str, msg_id: int,
               qname: str, qtype: int, packet: int, stream: DnsTcpStream | None) -> None:
        """Start a transaction, or count a retransmission of an open one."""
        key = (client, server, transport, msg_id, qname.lower(), qtype)
        txn = self._open.get(key)
        if txn is not None:
            if txn.rec.responses == 0 and ts_ns - txn.last_ns <= self.timeout_ns:
                txn.rec.retransmissions += 1
                self.stats["retransmissions"] += 1
                txn.last_ns = ts_ns
                self._open.move_to_end(key)
                if self.clock is not None:
                    txn.order = self.clock()
                return
            self._finish(txn)  # answered, or timed out: the id was reused
        rec = DnsTransaction(ts_ns=ts_ns, client=client, server=server, transport=transport,
                             id=msg_id, qname=qname, qtype=_qtype_text(qtype),
                             query_packet=packet)
        opened = self._open[key] = _Open(key, rec, ts_ns, stream)
        if len(self._open) > self.limits.max_dns_open:
            self.limits.count(LIMIT_DNS_OPEN)
            self._finish(next(iter(self._open.values())))
        if self.clock is not None:
            opened.order = self.clock()
        self._by_id.setdefault((client, server, transport, msg_id), []).append(key)
        if stream is not None:
            stream._keys.add(key)

    def _answers(self, wire: bytes, off: int, ancount: int,
                 others: int) -> tuple[list[str], int, str | None]:
        """Answer texts, the EDNS extended rcode bits, and the first problem met.

        Records are framed by their rdlength, so a record dnspython rejects is skipped
        and the walk goes on; a record cut short ends it.
        """
        answers: list[str] = []
        error: str | None = None
        n = len(wire)
        memo_texts = self._memo
        try:
            for i in range(ancount):
                off = _skip_name(wire, off)
                if off + 10 > n:
                    raise _Malformed(f"answer {i + 1} cut short")
                rdtype, rdclass, _ttl, rdlen = _RR.unpack_from(wire, off)
                off += 10
                end = off + rdlen
                if end > n:
                    raise _Malformed(f"answer {i + 1} cut short")
                if rdclass == _IN and rdtype in _NAME_TYPES:
                    text = _name_rdata(wire, off, end)
                    if text is None:
                        text = self._rdata(rdclass, rdtype, wire, off, rdlen)
                elif rdclass == _IN and rdtype in _MEMO_TYPES:
                    memo = (rdtype, wire[off:end])
                    text = memo_texts.get(memo)
                    if text is None:
                        text = _address_rdata(rdtype, wire, off, rdlen)
                        if text is None:
                            text = self._rdata(rdclass, rdtype, wire, off, rdlen)
                        if text is not None:
                            if len(memo_texts) >= _MEMO_SIZE:
                                memo_texts.clear()
                            memo_texts[memo] = text
                else:
                    text = self._rdata(rdclass, rdtype, wire, off, rdlen)
                if text is None:
                    error = error or f"answer {i + 1}: bad {_qtype_text(rdtype)} rdata"
                else:
                    answers.append(text)
                off = end
        except _Malformed as exc:
            return answers, 0, error or str(exc)
        ext = 0
        try:  # the OPT record, if any, carries the upper 8 bits of the rcode
            for _ in range(others):
                off = _skip_name(wire, off)
                if off + 10 > n:
                    break
                rdtype, _rdclass, ttl, rdlen = _RR.unpack_from(wire, off)
                if rdtype == _OPT:
                    ext = ttl >> 24
                    break
                off += 10 + rdlen
        except _Malformed:
            pass
        return answers, ext, error

    @staticmethod
    def _rdata(rdclass: int, rdtype: int, wire: bytes, off: int, rdlen: int) -> str | None:
        """dnspython's text of one rdata, or None when dnspython rejects it."""
        try:
            return rdata_text(dns.rdata.from_wire(
                rdclass, rdtype, wire, off, rdlen))  # type: ignore[arg-type]
        except Exception:  # dnspython raises many kinds for bad rdata; never propagate
            return None


class _Direction:
    """Framing state of one direction of a DNS-over-TCP connection."""

    __slots__ = ("buf", "dead", "dst", "segments", "src")

    def __init__(self, src: str, dst: str) -> None:
        self.src = src
        self.dst = dst
        self.buf = bytearray()
        """Bytes received but not yet part of a whole message."""
        self.segments: list[tuple[int, int, int]] = []
        """(offset in ``buf``, ts_ns, packet) of each segment whose bytes are in ``buf``."""
        self.dead = False
        """A gap was met: nothing more is parsed in this direction."""


class DnsTcpStream:
    """DNS over TCP on one connection: 2-byte length framing in both directions.

    A message is timed by the segment carrying its first byte, i.e. the first byte of
    its 2-byte length prefix. After a gap a direction is no longer parsed (there is
    no reliable way to find the next length prefix); the bytes of a message begun
    before the gap, or left when the connection closes, are still read for a header
    and question so that a cut response can complete its transaction.
    """

    def __init__(self, analyzer: DnsAnalyzer, client: str, server: str) -> None:
        self._analyzer = analyzer
        self.client = client
        self.server = server
        self._dirs = (_Direction(client, server), _Direction(server, client))
        self._keys: set[_Key] = set()
        self._warnings: list[str] = []
        self._closed = False

    @property
    def warnings(self) -> list[str]:
        """Sentences about this connection's bytes that could not be read as DNS."""
        return self._warnings

    @property
    def kind(self) -> AnalyzerKind:
        """``dns``."""
        return "dns"

    @property
    def requests(self) -> list[Request]:
        """None to report: the transactions go to the DNS analyzer's sink."""
        return []

    @property
    def protocol(self) -> None:
        """None: ``dns``, as the connection already says."""
        return None

    @property
    def http2(self) -> None:
        return None

    @property
    def client_random(self) -> None:
        return None

    @property
    def limits_hit(self) -> dict[str, int]:
        """Empty: the DNS analyzer counts its own caps (``DnsAnalyzer.limits``)."""
        return {}

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        """New in-order bytes of ``direction`` (0 client to server, 1 server to client)."""
        d = self._dirs[direction]
        if d.dead or self._closed or not data:
            return
        analyzer = self._analyzer
        if not d.buf:
            # Common case: the segment starts on a message boundary; no copying.
            pos, n = 0, len(data)
            while n - pos >= 2:
                end = pos + 2 + ((data[pos] << 8) | data[pos + 1])
                if end > n:
                    break
                analyzer._message(ts_ns, d.src, d.dst, "tcp", bytes(data[pos + 2:end]),
                                  packet, self, self._warnings)
                pos = end
            if pos < n:
                d.buf += data[pos:]
                d.segments.append((0, ts_ns, packet))
            return
        d.segments.append((len(d.buf), ts_ns, packet))
        d.buf += data
        buf = d.buf
        pos, n = 0, len(buf)
        while n - pos >= 2:
            end = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
            if end > n:
                break
            msg_ts, msg_packet = self._stamp(d, pos)
            analyzer._message(msg_ts, d.src, d.dst, "tcp", bytes(buf[pos + 2:end]),
                              msg_packet, self, self._warnings)
            pos = end
        if pos:
            del buf[:pos]
            if buf:
                first = 0
                for i, seg in enumerate(d.segments):
                    if seg[0] <= pos:
                        first = i
                d.segments = [(max(off - pos, 0), t, p) for off, t, p in d.segments[first:]]
            else:
                d.segments.clear()

    @staticmethod
    def _stamp(d: _Direction, offset: int) -> tuple[int, int]:
        """(ts_ns, packet) of the segment that carried byte ``offset`` of ``d.buf``."""
        for seg_off, ts_ns, packet in reversed(d.segments):
            if seg_off <= offset:
                return ts_ns, packet
        _off, ts_ns, packet = d.segments[0]
        return ts_ns, packet

    def _leftover(self, d: _Direction, why: str) -> None:
        """Read what can be read of an incomplete message, then drop it."""
        buf = d.buf
        if not buf:
            return
        ts_ns, packet = self._stamp(d, 0)
        if len(buf) >= 2:
            want = (buf[0] << 8) | buf[1]
            self._analyzer._warn(self._warnings, (
                f"packet {packet}: DNS over TCP message from {d.src} cut short by {why} "
                f"({len(buf) - 2} of {want} bytes)"))
            if len(buf) >= 14:
                self._analyzer._message(ts_ns, d.src, d.dst, "tcp", bytes(buf[2:]), packet,
                                        self, self._warnings)
        else:
            self._analyzer._warn(self._warnings, (
                f"packet {packet}: DNS over TCP message from {d.src} cut short by {why} "
                f"inside its length prefix"))
        buf.clear()
        d.segments.clear()

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """``nbytes`` of ``direction`` were never captured: stop parsing that direction."""
        d = self._dirs[direction]
        if d.dead or self._closed:
            return
        self._leftover(d, "a gap")
        d.dead = True
        self._analyzer._warn(self._warnings, (
            f"DNS over TCP from {d.src} to {d.dst}: {nbytes} bytes not captured; "
            f"the rest of that direction is not parsed"))

    def close(self, ts_ns: int) -> None:
        """The connection ended: read any incomplete messages, emit its transactions."""
        if self._closed:
            return
        self._closed = True
        for d in self._dirs:
            if not d.dead:
                self._leftover(d, "the end of the connection")
        analyzer = self._analyzer
        for key in list(self._keys):
            txn = analyzer._open.get(key)
            if txn is not None and txn.stream is self:
                analyzer._finish(txn)
        self._keys.clear()
