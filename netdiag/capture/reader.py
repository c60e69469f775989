"""Read pcap and pcapng capture files, plain or gzip-compressed, as a stream of packets.

This is the first stage of the hot path, so it is written for speed and bounded
memory: the file is read in chunks of :data:`CHUNK_SIZE` bytes, records are cut out of
an immutable ``bytes`` chunk with one ``struct`` call per packet, and only the partial
record at the end of a chunk is carried over to the next one (a plain local file reads
it again with the next chunk, ``os.pread``: one copy of each byte, not two). A record that claims
more bytes than exist never causes that much to be allocated: data is read chunk by
chunk until the claim is met or the file ends.

Damage (a file cut short, an absurd or inconsistent length, a corrupt gzip stream)
ends the iteration normally: everything before it has been yielded, ``truncated``
is set and a :class:`~netdiag.records.Warning_` says where (file, byte offset in the
uncompressed stream, number of the packet that would have come next).

Timestamps are integer nanoseconds since the epoch, converted with integer
arithmetic only (pcap micro/nanosecond magic; pcapng ``if_tsresol``/``if_tsoffset``).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import os
import stat
import struct
import zlib
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from netdiag.capture.linktypes import normalize
from netdiag.errors import CaptureFormatError, InputError
from netdiag.records import Warning_

if TYPE_CHECKING:  # annotations only: at run time an i64 is an int
    from mypy_extensions import i64

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing
    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls

Packet = tuple[int, int, bytes, int]
"""``(ts_ns, linktype, data, wire_len)`` as yielded by :meth:`CaptureReader.packets`."""

CHUNK_SIZE = 1 << 20
"""Bytes read from the (decompressed) stream at a time."""
HARD_CAP = 256 << 20
"""No record or block may claim more than this many bytes."""
TAIL_SPAN_NS = 7 * 86_400 * 1_000_000_000
""":meth:`CaptureReader.tail_time_ns`: how long after ``near_ns`` a last packet may be."""
TAIL_SLACK_NS = 3_600 * 1_000_000_000
"""... and how long before it (packets slightly out of time order)."""
PCAP_MAX_DEFAULT = 262144
"""libpcap's usual maximum packet size; pcap records may claim 4x max(snaplen, this)."""

NS = 1_000_000_000

# pcap magic (as the first 4 bytes appear in the file) -> byte order, ns per
# fraction unit, record header size. a1b2cd34 is Kuznetzov's "modified" pcap
# whose record headers carry 8 extra bytes.
_PCAP_MAGICS: dict[bytes, tuple[str, int, int]] = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000, 16),
    b"\xa1\xb2\xc3\xd4": (">", 1000, 16),
    b"\x4d\x3c\xb2\xa1": ("<", 1, 16),
    b"\xa1\xb2\x3c\x4d": (">", 1, 16),
    b"\x34\xcd\xb2\xa1": ("<", 1000, 24),
    b"\xa1\xb2\xcd\x34": (">", 1000, 24),
}
_SHB_MAGIC = b"\x0a\x0d\x0d\x0a"
_BOM_LE = b"\x4d\x3c\x2b\x1a"
_BOM_BE = b"\x1a\x2b\x3c\x4d"
_GZIP_MAGIC = b"\x1f\x8b"

# pcapng block types
BT_SHB = 0x0A0D0D0A
BT_IDB = 0x00000001
BT_PB = 0x00000002
BT_SPB = 0x00000003
BT_NRB = 0x00000004
BT_ISB = 0x00000005
BT_EPB = 0x00000006
BT_DSB = 0x0000000A

SECRETS_TLS_KEY_LOG = 0x544C534B
"""DSB secrets type of an NSS key log (SSLKEYLOGFILE) text."""

_SHB_TEXT = {2: "shb_hardware", 3: "shb_os", 4: "shb_userappl"}
_IDB_TEXT = {2: "if_name", 3: "if_description"}
_ISB_OPTIONS = {4: "isb_ifrecv", 5: "isb_ifdrop", 6: "isb_filteraccept",
                7: "isb_osdrop", 8: "isb_usrdeliv"}

# An interface of the current pcapng section:
# (linktype, ts multiplier, ts divisor, ts offset in ns, snaplen).
_Iface = tuple[int, int, int, int, int]


_FAST_TICKS_HIGH = 1 << 21
"""An EPB timestamp's upper 32 bits below this (ticks below 2**53) with a resolution of
a microsecond or finer (nanoseconds per tick at most 1000) are converted in native 64-bit
arithmetic: the product fits, and mypyc's tagged ints would make objects for it."""


def _tsresol(code: int) -> tuple[int, int]:
    """``(mul, div)`` so that ``ticks * mul // div`` is nanoseconds, for an if_tsresol byte."""
    exp = code & 0x7F
    if code & 0x80:
        return NS, 1 << exp
    if exp <= 9:
        return 10 ** (9 - exp), 1
    return 1, 10 ** (exp - 9)


class _Gunzip:
    """Streaming gzip decompression (multi-member, zero padding allowed) that never raises.

    Unlike ``gzip.GzipFile``, an error (corrupt deflate data, CRC mismatch, stream cut
    short) does not lose the data decoded before it: that data is returned, ``error``
    says what happened, and later reads return ``b""``.
    """

    IN_CHUNK = 1 << 16
    SALVAGE_STEP = 64

    def __init__(self, raw: io.BufferedReader | _FileObject) -> None:
        self.raw = raw
        self.error: str | None = None
        self.consumed = 0
        """Compressed bytes read from the file."""
        self._d = zlib.decompressobj(31)
        self._in_member = False
        self._pending = b""
        self._eof = False

    def _input(self) -> bytes:
        """The next compressed bytes for the current member; ``b""`` at the end of the file."""
        tail = self._d.unconsumed_tail
        if tail:
            return tail
        while True:
            data, self._pending = self._pending, b""
            if not data:
                data = self.raw.read(self.IN_CHUNK)
                self.consumed += len(data)
                if not data:
                    return b""
            if not self._in_member:
                data = data.lstrip(b"\0")  # zero padding between/after members
                if not data:
                    continue
                self._in_member = True
            return data

    def read(self, n: int) -> bytes:
        """Up to about ``n`` decompressed bytes; ``b""`` at the end or after an error."""
        out: list[bytes] = []
        have = 0
        while have < n and not self._eof and self.error is None:
            try:
                data = self._input()
            except OSError as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                break
            if not data:
                self._eof = True
                if self._in_member:
                    self.error = ("compressed file ended before the end-of-stream marker "
                                  "was reached")
                break
            backup = self._d.copy()
            try:
                piece = self._d.decompress(data, n - have)
            except zlib.error as exc:
                out.append(self._salvage(backup, data))
                self.error = f"corrupt compressed data: {exc}"
                break
            out.append(piece)
            have += len(piece)
            if self._d.eof:
                self._pending = self._d.unused_data
                self._d = zlib.decompressobj(31)
                self._in_member = False
        return b"".join(out)

    def _salvage(self, d: Any, data: bytes) -> bytes:
        """What ``d`` decodes from ``data`` before the error: small steps, then single bytes."""
        out = []
        step = self.SALVAGE_STEP
        for i in range(0, len(data), step):
            backup = d.copy()
            try:
                out.append(d.decompress(data[i:i + step]))
            except zlib.error:
                d = backup
                for j in range(i, min(i + step, len(data))):
                    try:
                        out.append(d.decompress(data[j:j + 1]))
                    except zlib.error:
                        break
                break
        return b"".join(out)


class _FileObject:
    """An opened binary file (an fsspec file, ``io.BytesIO``...) as :class:`_Source` reads
    it: ``peek``, ``read`` and ``close``, every read error an ``OSError`` (a remote file
    system raises its own exception types), and the file closed with the reader."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self._head = b""

    @property
    def closed(self) -> bool:
        return bool(self.f.closed)

    def _read(self, n: int) -> bytes:
        try:
            data = self.f.read(n)
        except OSError:
            raise
        except Exception as exc:  # a file system's own error: damage, as OSError is
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        return bytes(data) if data else b""

    def peek(self, n: int) -> bytes:
        """At least the next ``n`` bytes when there are, without consuming them."""
        while len(self._head) < n:
            more = self._read(n - len(self._head))
            if not more:
                break
            self._head += more
        return self._head

    def read(self, n: int) -> bytes:
        head = self._head
        if not head:
            return self._read(n)
        if len(head) >= n:
            self._head = head[n:]
            return head[:n]
        self._head = b""
        return head + self._read(n - len(head))

    def size(self) -> int | None:
        """The file's size when it says (fsspec files have ``size``) or can seek."""
        f = self.f
        size = getattr(f, "size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size
        try:
            if not f.seekable():
                return None
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(here)
        except Exception:
            return None
        return end - here + len(self._head)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()


class _Source:
    """The byte stream of one file, decompressed if gzip; read errors end it quietly.

    ``fileobj``: read that opened binary file (named ``path``) instead of opening
    ``path``; it is closed with the source.
    """

    def __init__(self, path: str, fileobj: IO[bytes] | None = None) -> None:
        raw: io.BufferedReader | _FileObject
        if fileobj is None:
            try:
                local = open(path, "rb")  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
            raw = local
        else:
            raw = _FileObject(fileobj)
        self.raw = raw
        self.error: str | None = None
        """Why reading stopped early (I/O or decompression error), if it did."""
        self._consumed = 0
        try:
            if isinstance(raw, _FileObject):
                self.total: int | None = raw.size()
            else:
                st = os.fstat(raw.fileno())
                self.total = st.st_size if stat.S_ISREG(st.st_mode) else None
            head = raw.peek(2)[:2]
        except OSError as exc:
            raw.close()
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
        self.gunzip = _Gunzip(raw) if head == _GZIP_MAGIC else None
        self._fd = -1
        """A plain local file's descriptor, read at ``_consumed`` (``os.pread``); -1 for
        any other stream."""
        if self.gunzip is None and isinstance(raw, io.BufferedReader) \
                and self.total is not None:
            self._fd = raw.fileno()

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` at the end of the data or after a read error."""
        if self.error is not None:
            return b""
        gz = self.gunzip
        if gz is not None:
            data = gz.read(n)
            self.error = gz.error
            return data
        try:
            data = os.pread(self._fd, n, self._consumed) if self._fd >= 0 else self.raw.read(n)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return b""
        self._consumed += len(data)
        return data

    def read_after(self, kept: bytes, n: int) -> bytes:
        """``kept`` (the last bytes :meth:`read` returned, not yet used) followed by up to
        ``n`` more, as one bytes object. A plain local file reads ``kept`` again with
        them, in one call, rather than copying every new byte once more to join them."""
        k = len(kept)
        if self._fd < 0 or not k or self.error is not None:
            return kept + self.read(n)
        try:
            data = os.pread(self._fd, k + n, self._consumed - k)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return kept
        if len(data) < k or not data.startswith(kept):  # the file changed under us
            return kept + self.read(n)
        self._consumed += len(data) - k
        return data

    def consumed(self) -> int:
        """Bytes of the on-disk file consumed so far."""
        return self._consumed if self.gunzip is None else self.gunzip.consumed

    def close(self) -> None:
        """Close the file."""
        self.raw.close()


class CaptureReader:
    """A pcap or pcapng file (optionally gzip-compressed) read as a stream of packets.

    Usage::

        with CaptureReader("trace.pcapng") as cap:
            for ts_ns, linktype, data, wire_len in cap.packets():
                ...
            if cap.truncated:
                print(cap.warnings[-1].message)

    The constructor reads only the file header. pcapng interface link types, name
    resolution entries, secrets and statistics are collected as their blocks are
    met during iteration, so they are complete once :meth:`packets` is exhausted.

    ``CaptureReader(name, fileobj=f)`` reads an already opened binary file instead
    (an fsspec file of a URL, ``io.BytesIO``...; ``netdiag.capture.sources.open_capture``
    opens URLs so), named ``name`` in warnings; the reader closes it. Damage is handled
    the same way, and a read error of the file object ends the packets as one of a
    local file does.
    """

    def __init__(self, path: str | os.PathLike[str], fileobj: IO[bytes] | None = None) -> None:
        """Open ``path`` (or take ``fileobj``) and read its file header.

        Raises :class:`InputError` if the file cannot be read and
        :class:`CaptureFormatError` if it is empty or not a pcap/pcapng capture.
        """
        self.path: str = os.fspath(path)
        """The file as given."""
        self.format: str = ""
        """``pcap`` or ``pcapng``."""
        self.link_types: list[int] = []
        """Distinct link types seen (pcap header, each pcapng IDB), in order of first appearance."""
        self.packets_read: int = 0
        """Packets yielded so far."""
        self.bytes_read: int = 0
        """Sum of the captured lengths of the packets yielded so far."""
        self.truncated: bool = False
        """The file was cut short or damaged; packets before the damage were yielded."""
        self.warnings: list[Warning_] = []
        """Problems met while reading (kind ``capture``)."""
        self.secrets: list[tuple[int, bytes]] = []
        """pcapng Decryption Secrets Blocks as ``(secrets_type, data)``."""
        self.names: dict[str, list[str]] = {}
        """pcapng Name Resolution Block entries: address text -> names."""
        self.interface_stats: list[dict[str, Any]] = []
        """pcapng Interface Statistics Blocks: ``interface_id``, ``ts_ns``, ``isb_*`` counters."""
        self.sections: list[dict[str, str]] = []
        """pcapng Section Header Blocks' text options (``shb_hardware``, ``shb_os``,
        ``shb_userappl``), one dict per section met so far."""
        self.interfaces: list[dict[str, str]] = []
        """pcapng Interface Description Blocks' text options (``if_name``,
        ``if_description``), one dict per interface met so far, over all sections."""
        self._buf = b""
        self._pos = 0
        self._base = 0
        self._gen: Generator[Packet, None, None] | None = None
        self._done = False
        """The data ended (or was damaged): nothing more to deliver."""
        self._ng_ts = 0
        """pcapng: the time of the last packet (a simple packet block's)."""
        self._ng_bo = "<"
        self._ng_ifaces: list[_Iface] = []
        """The interfaces of the current pcapng section (for :meth:`tail_time_ns`)."""
        self._src = _Source(self.path, fileobj)
        try:
            self._read_file_header()
        except BaseException:
            self._src.close()
            raise

    # -- public --------------------------------------------------------------------

    def packets(self) -> Iterator[Packet]:
        """Yield ``(ts_ns, linktype, data, wire_len)`` for each packet, in file order.

        The reader is one stream: calling this again (or :meth:`deliver`) continues
        where the last iteration stopped. Damage ends the iteration normally (see
        ``truncated``).
        """
        if self._gen is None:
            self._gen = self._generate()
        return self._gen

    def _generate(self) -> Generator[Packet, None, None]:
        one = _OnePacket()
        while self.deliver(one):
            packet = one.taken
            one.taken = None
            if packet is not None:
                yield packet

    def deliver(self, sink: PacketSink) -> bool:
        """Hand the packets, in file order, to ``sink.packet`` in place (no object per
        packet: the bytes stay in the chunk of the file they were read with) until the
        sink asks to stop (True: call again to go on) or the data ends (False).

        This is the scan's way in (``FlowTable``); :meth:`packets` is built on it.
        """
        if self._done or self._src.raw.closed:
            return False
        more = self._pcap_deliver(sink) if self.format == "pcap" else \
            self._pcapng_deliver(sink)
        if not more:
            self._done = True
        return more

    def __iter__(self) -> Iterator[Packet]:
        return self.packets()

    @property
    def compressed(self) -> bool:
        """Is the file gzip-compressed (so that only reading from its start gives its
        packets)?"""
        return self._src.gunzip is not None

    def progress(self) -> tuple[int, int | None]:
        """``(bytes of the on-disk file consumed, its size or None)``, for a progress bar."""
        return self._src.consumed(), self._src.total

    def close(self) -> None:
        """Stop iterating and close the file."""
        if self._gen is not None:
            with contextlib.suppress(ValueError):  # closed from inside its own iteration
                self._gen.close()
        self._src.close()

    def tail_time_ns(self, tail: bytes, near_ns: int) -> int | None:
        """The time of the last packet in ``tail``, the last bytes of this (uncompressed)
        file up to its end, read back without reading the file from the start; None when
        ``tail`` does not tell it for sure. ``near_ns`` is a packet time of the file (its
        first): a time read back must lie within :data:`TAIL_SPAN_NS` after it.

        pcapng blocks end with their length, so they are walked back from the end (the
        interfaces are those of the section read so far: call it after the first packet).
        pcap records are not: the first offset of ``tail`` from which plausible record
        headers (time near ``near_ns``, lengths within the snap length) chain exactly to
        the end, over at least two records, is taken as a record boundary.
        """
        if self.format == "pcapng":
            ts = self._pcapng_tail(tail)
        elif self.format == "pcap":
            ts = self._pcap_tail(tail, near_ns)
        else:
            return None
        if ts is None or not near_ns - TAIL_SLACK_NS <= ts <= near_ns + TAIL_SPAN_NS:
            return None
        return ts

    def _pcapng_tail(self, tail: bytes) -> int | None:
        bo = self._ng_bo
        ifaces = self._ng_ifaces
        u32 = struct.Struct(bo + "I").unpack_from
        end = len(tail)
        while end >= 12:
            blen = u32(tail, end - 4)[0]
            if blen < 12 or blen & 3 or blen > end:
                return None
            start = end - blen
            btype, lead = struct.unpack_from(bo + "II", tail, start)
            if lead != blen or btype == BT_SHB:
                return None
            if btype in (BT_EPB, BT_PB) and blen >= 32:
                if btype == BT_EPB:
                    ifid, th, tl = struct.unpack_from(bo + "III", tail, start + 8)
                else:
                    ifid, _, th, tl = struct.unpack_from(bo + "HHII", tail, start + 8)
                if ifid >= len(ifaces):
                    return None
                iface = ifaces[ifid]
                ticks: int = (th << 32) | tl
                ts: int = ticks * iface[1] // iface[2] + iface[3]
                return ts
            end = start
        return None

    def _pcap_tail(self, tail: bytes, near_ns: int) -> int | None:
        bo = self._bo
        hl = self._hdr_len
        mul = self._frac_mul
        frac_max = 1_000_000 if mul == 1000 else 1_000_000_000
        limit = self._limit
        unpack = struct.Struct(bo + "IIII").unpack_from
        end = len(tail)
        lo_s = max(0, (near_ns - TAIL_SLACK_NS) // NS)
        hi_s = (near_ns + TAIL_SPAN_NS) // NS
        # candidate record starts: where the seconds field's upper half fits the span
        starts: set[int] = set()
        for upper in range(lo_s >> 16, min(hi_s >> 16, 0xFFFF) + 1):
            pat = upper.to_bytes(2, "little" if bo == "<" else "big")
            shift = 2 if bo == "<" else 0
            i = tail.find(pat)
            while i >= 0:
                if i >= shift:
                    starts.add(i - shift)
                i = tail.find(pat, i + 1)
        dead: set[int] = set()
        """Offsets from which the chain is known not to reach the end."""
        for start in sorted(starts):
            pos = start
            last = -1
            count = 0
            visited: list[int] = []
            while pos + hl <= end and pos not in dead:
                sec, frac, incl, orig = unpack(tail, pos)
                if (not lo_s <= sec <= hi_s or frac >= frac_max or incl > limit
                        or orig < incl or pos + hl + incl > end):
                    break
                visited.append(pos)
                last = sec * NS + frac * mul
                count += 1
                pos += hl + incl
            if pos == end and count >= 2:
                return last
            dead.update(visited)
            dead.add(pos)
        return None

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- buffer ----------------------------------------------------------------------

    def _fill(self, pos: int, need: int) -> bool:
        """Make ``need`` bytes available from ``_buf[_pos]``; False at the end of the data.

        When fewer than ``need`` bytes follow ``pos``, the consumed part is dropped and
        the stream is read at most :data:`CHUNK_SIZE` bytes at a time, so memory grows
        only with data that exists, whatever ``need`` is.
        """
        buf = self._buf
        have = len(buf) - pos
        if have >= need:
            self._pos = pos
            return True
        self._base += pos
        src = self._src
        first = src.read_after(buf[pos:], CHUNK_SIZE)
        parts = [first]
        more = len(first) > have
        have = len(first)
        read = src.read
        while more and have < need:
            chunk = read(CHUNK_SIZE)
            more = bool(chunk)
            parts.append(chunk)
            have += len(chunk)
        self._buf = first if len(parts) == 1 else b"".join(parts)
        self._pos = 0
        return have >= need

    def _read_file_header(self) -> None:
        """Detect the format and parse the pcap file header (pcapng's SHB is read lazily)."""
        self._fill(0, 28)
        buf = self._buf
        if not buf:
            if self._src.error:
                raise CaptureFormatError(f"{self.path} cannot be decompressed ({self._src.error})")
            raise CaptureFormatError(f"{self.path} is empty")
        magic = buf[:4]
        if magic in _PCAP_MAGICS:
            self._read_pcap_header(buf, magic)
        elif magic == _SHB_MAGIC:
            if len(buf) < 12:
                raise CaptureFormatError(
                    f"{self.path}: pcapng section header cut short ({len(buf)} of 12 bytes)")
            if buf[8:12] not in (_BOM_LE, _BOM_BE):
                raise CaptureFormatError(
                    f"{self.path} is not a pcapng capture (byte-order magic 0x{buf[8:12].hex()})")
            self.format = "pcapng"
        else:
            raise CaptureFormatError(
                f"{self.path} is not a pcap or pcapng capture (magic 0x{magic.hex()})")

    def _read_pcap_header(self, buf: bytes, magic: bytes) -> None:
        bo, frac_mul, hdr_len = _PCAP_MAGICS[magic]
        if len(buf) < 24:
            raise CaptureFormatError(
                f"{self.path}: pcap file header cut short ({len(buf)} of 24 bytes)")
        snaplen, network = struct.unpack_from(bo + "II", buf, 16)
        self.format = "pcap"
        self._bo = bo
        self._frac_mul = frac_mul
        self._hdr_len = hdr_len
        self._limit = min(HARD_CAP, 4 * max(snaplen, PCAP_MAX_DEFAULT))
        self._linktype = normalize(network & 0x03FFFFFF)
        self.link_types.append(self._linktype)
        self._pos = 24

    # -- warnings --------------------------------------------------------------------

    def _damage(self, offset: int, detail: str, cut: bool = False) -> None:
        """Record damage at ``offset`` (start of the bad record) and mark the file truncated."""
        self.truncated = True
        packet = self.packets_read + 1
        what = "cut short" if cut else "damaged"
        if cut and self._src.error:
            what = "unreadable"
            detail = f"{detail}; {self._src.error}"
        self.warnings.append(Warning_(
            kind="capture", file=self.path, offset=offset, packet=packet,
            message=(f"{self.path}: {what} at byte offset {offset} in packet {packet} "
                     f"({detail}); packets before it are reported")))

    def _cut(self, hdr_len: int, claim: int | None, what: str) -> None:
        """The data ended inside the record at the start of the buffer (after a failed fill)."""
        left = len(self._buf)
        if claim is None or left < hdr_len:
            detail = f"{what} header incomplete: {left} of {hdr_len} bytes"
        else:
            detail = f"{what} header claims {claim} bytes, {left - hdr_len} left"
        self._damage(self._base, detail, cut=True)

    def _finish(self) -> None:
        """The data ended at a record boundary: warn only if a read error ended it."""
        if self._src.error:
            self._damage(self._base + len(self._buf), "reading stopped", cut=True)

    # -- pcap ------------------------------------------------------------------------

    def _pcap_deliver(self, sink: PacketSink) -> bool:
        """The pcap record loop: one header read (byte by byte, no object) per packet."""
        hl = self._hdr_len
        mul: i64 = self._frac_mul  # i64: the nanosecond product exceeds what mypyc's
        # tagged ints multiply without making objects (a second, up to 2**32 - 1, times 10**9
        # stays below 2**63)
        limit = self._limit
        lt = self._linktype
        little = self._bo == "<"
        buf = self._buf
        pos = self._pos
        end = len(buf)
        n = self.packets_read
        nbytes = self.bytes_read
        while True:
            stop = end - hl
            while pos <= stop:
                sec: i64 = _u32(buf, pos, little)
                frac: i64 = _u32(buf, pos + 4, little)
                incl = _u32(buf, pos + 8, little)
                orig = _u32(buf, pos + 12, little)
                start = pos + hl
                nxt = start + incl
                if nxt > end or incl > limit:
                    break
                n += 1
                nbytes += incl
                self.packets_read = n
                self.bytes_read = nbytes
                pos = nxt
                if sink.packet(sec * 1_000_000_000 + frac * mul, lt, buf, start, nxt, orig):
                    self._pos = pos
                    return True
            incl = _u32(buf, pos + 8, little) if pos <= stop else -1
            if incl > limit:
                self._damage(self._base + pos, f"record header claims {incl} bytes, "
                             f"more than the {limit}-byte limit")
                return False
            if not self._fill(pos, hl + max(incl, 0)):
                if self._buf:
                    self._cut(hl, incl if incl >= 0 else None, "record")
                else:
                    self._finish()
                return False
            buf = self._buf
            pos = self._pos
            end = len(buf)

    # -- pcapng ----------------------------------------------------------------------

    def _pcapng_deliver(self, sink: PacketSink) -> bool:
        """The pcapng block loop: a fast path for EPBs, a careful one for everything else."""
        ifaces = self._ng_ifaces
        little = self._ng_bo == "<"
        buf = self._buf
        pos = self._pos
        end = len(buf)
        n = self.packets_read
        nbytes = self.bytes_read
        while True:
            # Fast path: complete, consistent EPBs of known interfaces. Each block's
            # trailing length is read together with the next block's header.
            nif = len(ifaces)
            while pos + 28 <= end:
                blen = _u32(buf, pos + 4, little)
                nxt = pos + blen
                if (_u32(buf, pos, little) != 6 or nxt > end or blen < 32 or blen & 3
                        or _u32(buf, nxt - 4, little) != blen):
                    break
                ifid = _u32(buf, pos + 8, little)
                cap = _u32(buf, pos + 20, little)
                if ifid >= nif or cap > blen - 32:
                    break
                lt, mul, div, off, _ = ifaces[ifid]
                high = _u32(buf, pos + 12, little)
                low = _u32(buf, pos + 16, little)
                ts: int
                if high < _FAST_TICKS_HIGH and div == 1 and 0 <= mul <= 1000:
                    # shifted as i64s (compiled, a plain int's shift is a call)
                    high64: i64 = high
                    low64: i64 = low
                    ticks: i64 = high64 << 32 | low64  # below 2**53: times mul below 2**63
                    ts = ticks * mul
                    ts += off  # as an int: the offset is the file's, of any size
                else:  # any resolution or value, as big ints
                    big = high << 32 | low
                    ts = big * mul + off if div == 1 else big * mul // div + off
                n += 1
                nbytes += cap
                self.packets_read = n
                self.bytes_read = nbytes
                self._ng_ts = ts
                start = pos + 28
                pos = nxt
                if sink.packet(ts, lt, buf, start, start + cap, _u32(buf, start - 4, little)):
                    self._pos = pos
                    return True

            # Careful path: one whole block, validated, whatever its type.
            if not self._fill(pos, 12):
                if self._buf:
                    self._cut(12, None, "block")
                else:
                    self._finish()
                return False
            buf = self._buf
            pos = self._pos
            bo = "<" if little else ">"
            if buf[pos:pos + 4] == _SHB_MAGIC:
                bom = buf[pos + 8:pos + 12]
                if bom not in (_BOM_LE, _BOM_BE):
                    self._damage(self._base + pos,
                                 f"section header byte-order magic 0x{bom.hex()}")
                    return False
                little = bom == _BOM_LE
                bo = "<" if little else ">"
            btype = _u32(buf, pos, little)
            blen = _u32(buf, pos + 4, little)
            problem = self._block_length_problem(btype, blen)
            if problem:
                self._damage(self._base + pos, problem)
                return False
            if not self._fill(pos, blen):
                self._cut(8, blen, f"block (type 0x{btype:08x})")
                return False
            buf = self._buf
            pos = self._pos
            end = len(buf)
            nxt = pos + blen
            trailer = _u32(buf, nxt - 4, little)
            if trailer != blen:
                self._damage(self._base + pos, f"block type 0x{btype:08x} length {blen} "
                             f"but trailing length {trailer}")
                return False
            if btype == BT_SHB:
                ifaces = []
                self._ng_bo = bo
                self._ng_ifaces = ifaces
            pkt, problem = self._block(btype, buf[pos + 8:nxt - 4], bo, ifaces, self._ng_ts)
            if problem:
                self._damage(self._base + pos, problem)
                return False
            pos = nxt
            if pkt is not None:
                ts, lt, data, orig = pkt
                self._ng_ts = ts
                n += 1
                nbytes += len(data)
                self.packets_read = n
                self.bytes_read = nbytes
                if sink.packet(ts, lt, data, 0, len(data), orig):
                    self._pos = pos
                    return True

    def _block(self, btype: int, body: bytes, bo: str, ifaces: list[_Iface],
               last_ts: int) -> tuple[Packet | None, str | None]:
        """Handle one validated pcapng block: ``(packet or None, problem or None)``."""
        if btype == BT_IDB:
            return None, self._idb(body, bo, ifaces)
        if btype in (BT_EPB, BT_PB):
            return self._epb(body, bo, ifaces, btype)
        if btype == BT_SPB:
            return self._spb(body, bo, ifaces, last_ts)
        if btype == BT_NRB:
            self._nrb(body, bo)
        elif btype == BT_ISB:
            self._isb(body, bo, ifaces)
        elif btype == BT_DSB:
            self._dsb(body, bo)
        elif btype == BT_SHB:
            self._shb(body, bo)
        return None, None  # SHB (options; the caller reads its byte order), custom, unknown

    @staticmethod
    def _block_length_problem(btype: int, blen: int) -> str | None:
        """Why a block total length cannot be right, or None."""
        if blen < 12:
            return f"block type 0x{btype:08x} length {blen} is less than 12"
        if blen & 3:
            return f"block type 0x{btype:08x} length {blen} is not a multiple of 4"
        if blen > HARD_CAP:
            return f"block type 0x{btype:08x} length {blen} is more than the {HARD_CAP}-byte limit"
        return None

    def _add_linktype(self, lt: int) -> None:
        if lt not in self.link_types:
            self.link_types.append(lt)

    def _idb(self, body: bytes, bo: str, ifaces: list[_Iface]) -> str | None:
        """Interface Description Block: link type, snaplen, if_tsresol, if_tsoffset."""
        if len(body) < 8:
            return f"interface description block too short ({len(body)} bytes)"
        lt, _, snaplen = struct.unpack_from(bo + "HHI", body, 0)
        lt = normalize(lt)
        mul, div, off = 1000, 1, 0
        text: dict[str, str] = {}
        for code, value in _options(body, 8, bo):
            if code == 9 and len(value) >= 1:
                mul, div = _tsresol(value[0])
            elif code == 14 and len(value) >= 8:
                off = struct.unpack_from(bo + "q", value)[0] * NS
            elif code in _IDB_TEXT:
                text[_IDB_TEXT[code]] = _text(value)
        ifaces.append((lt, mul, div, off, snaplen))
        self.interfaces.append(text)
        self._add_linktype(lt)
        return None

    @staticmethod
    def _epb(body: bytes, bo: str, ifaces: list[_Iface],
             btype: int) -> tuple[Packet | None, str | None]:
        """Enhanced Packet Block, or the obsolete Packet Block (16-bit interface id)."""
        name = "enhanced packet block" if btype == BT_EPB else "packet block"
        if len(body) < 20:
            return None, f"{name} too short ({len(body)} bytes)"
        if btype == BT_EPB:
            ifid, th, tl, cap, orig = struct.unpack_from(bo + "IIIII", body, 0)
        else:
            ifid, _, th, tl, cap, orig = struct.unpack_from(bo + "HHIIII", body, 0)
        if ifid >= len(ifaces):
            return None, f"{name} names interface {ifid}, but the section has {len(ifaces)}"
        if cap > len(body) - 20:
            return None, f"{name} captured length {cap} exceeds its block"
        lt, mul, div, off, _ = ifaces[ifid]
        ts = ((th << 32) | tl) * mul // div + off
        return (ts, lt, body[20:20 + cap], orig), None

    @staticmethod
    def _spb(body: bytes, bo: str, ifaces: list[_Iface],
             last_ts: int) -> tuple[Packet | None, str | None]:
        """Simple Packet Block: interface 0, no timestamp (the last one seen is used)."""
        if len(body) < 4:
            return None, f"simple packet block too short ({len(body)} bytes)"
        if not ifaces:
            return None, "simple packet block before any interface description block"
        orig = struct.unpack_from(bo + "I", body, 0)[0]
        lt, _, _, _, snaplen = ifaces[0]
        cap = min(orig, len(body) - 4)
        if snaplen:
            cap = min(cap, snaplen)
        return (last_ts, lt, body[4:4 + cap], orig), None

    def _shb(self, body: bytes, bo: str) -> None:
        """Section Header Block: its text options (after magic, version, section length)."""
        text: dict[str, str] = {}
        for code, value in _options(body, 16, bo):
            name = _SHB_TEXT.get(code)
            if name is not None:
                text[name] = _text(value)
        self.sections.append(text)

    def _nrb(self, body: bytes, bo: str) -> None:
        """Name Resolution Block: IPv4/IPv6 records, each an address and NUL-ended names."""
        pos = 0
        rec = struct.Struct(bo + "HH")
        while pos + 4 <= len(body):
            rtype, rlen = rec.unpack_from(body, pos)
            value = body[pos + 4:pos + 4 + rlen]
            pos += 4 + ((rlen + 3) & ~3)
            if rtype == 0:
                break
            size = {1: 4, 2: 16}.get(rtype)
            if size is None or len(value) < size:
                continue
            ip = str(ipaddress.ip_address(value[:size]))
            names = [p.decode("utf-8", "replace") for p in value[size:].split(b"\0") if p]
            if names:
                known = self.names.setdefault(ip, [])
                known.extend(nm for nm in names if nm not in known)

    def _isb(self, body: bytes, bo: str, ifaces: list[_Iface]) -> None:
        """Interface Statistics Block: its time and whichever ``isb_*`` counters it has."""
        if len(body) < 12:
            return
        ifid, th, tl = struct.unpack_from(bo + "III", body, 0)
        ticks = (th << 32) | tl
        ts_ns: int | None = None
        if ifid < len(ifaces):
            _, mul, div, off, _ = ifaces[ifid]
            ts_ns = ticks * mul // div + off
        stats: dict[str, Any] = {"interface_id": ifid, "ts_ns": ts_ns}
        for code, value in _options(body, 12, bo):
            key = _ISB_OPTIONS.get(code)
            if key and len(value) >= 8:
                stats[key] = struct.unpack_from(bo + "Q", value)[0]
        self.interface_stats.append(stats)

    def _dsb(self, body: bytes, bo: str) -> None:
        """Decryption Secrets Block: ``(secrets_type, data)`` appended to ``secrets``."""
        if len(body) < 8:
            return
        stype, slen = struct.unpack_from(bo + "II", body, 0)
        self.secrets.append((stype, body[8:8 + slen]))


def _text(value: bytes) -> str:
    """A pcapng string option (UTF-8, maybe NUL-padded) as text."""
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _options(body: bytes, pos: int, bo: str) -> Iterator[tuple[int, bytes]]:
    """``(code, value)`` of the pcapng options from ``pos``, stopping at opt_endofopt or the end."""
    opt = struct.Struct(bo + "HH")
    end = len(body)
    while pos + 4 <= end:
        code, olen = opt.unpack_from(body, pos)
        if code == 0:
            return
        yield code, body[pos + 4:pos + 4 + olen]
        pos += 4 + ((olen + 3) & ~3)


def _u32(buf: bytes, p: int, little: bool) -> int:
    """The 32-bit unsigned integer at ``buf[p]``, little- or big-endian."""
    # each byte read into an i64 before it is shifted: compiled, a shift of a plain int
    # is a call (``CPyTagged_Lshift``), three per value
    b0: i64 = buf[p]
    b1: i64 = buf[p + 1]
    b2: i64 = buf[p + 2]
    b3: i64 = buf[p + 3]
    if little:
        return b0 | b1 << 8 | b2 << 16 | b3 << 24
    return b0 << 24 | b1 << 16 | b2 << 8 | b3


@mypyc_attr(allow_interpreted_subclasses=True)
class PacketSink:
    """What :meth:`CaptureReader.deliver` hands each packet to, in place."""

    def packet(self, ts: int, lt: int, buf: bytes, start: int, stop: int, wire: int) -> bool:
        """One packet: its bytes are ``buf[start:stop]`` (``buf`` holds other packets
        too: keep a slice, never ``buf`` itself); ``wire``: its length on the wire.
        True: stop after this packet (:meth:`CaptureReader.deliver` returns)."""
        raise NotImplementedError


class _OnePacket(PacketSink):
    """Takes one packet as a tuple and stops (:meth:`CaptureReader.packets`)."""

    def __init__(self) -> None:
        self.taken: Packet | None = None

    def packet(self, ts: int, lt: int, buf: bytes, start: int, stop: int, wire: int) -> bool:
        self.taken = (ts, lt, buf[start:stop], wire)
        return True
