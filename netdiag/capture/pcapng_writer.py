"""Writing pcapng: packets with exact nanosecond times, and TLS keys embedded (DSB).

The output opens in Wireshark and tshark, which decrypt TLS from the embedded key
log without any option (``editcap --inject-secrets`` makes the same kind of file).

What pcapng cannot hold is never a crash. Timestamps are unsigned 64-bit nanoseconds
from the epoch; a packet outside that range (a negative time, or one past 2554, as a
pcapng interface with an extreme ``if_tsoffset`` produces) is written on an interface
of its own whose ``if_tsoffset`` option carries whole multiples of :data:`TS_SPAN_S`
seconds, so its time stays exact. A packet whose link type does not fit pcapng's 16-bit
field (a pcap header can claim up to 26 bits), or whose time is beyond even a signed
64-bit ``if_tsoffset``, is skipped: :attr:`PcapngWriter.skipped` counts them by reason
and :func:`write_pcapng` reports them in one warning line.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import BinaryIO

from netdiag.capture.reader import SECRETS_TLS_KEY_LOG
from netdiag.textsafe import print_warning

SHB = 0x0A0D0D0A
IDB = 0x00000001
EPB = 0x00000006
DSB = 0x0000000A
BYTE_ORDER_MAGIC = 0x1A2B3C4D
TLS_KEY_LOG = SECRETS_TLS_KEY_LOG
"""Decryption-secrets type of an NSS key log (the reader's constant, one definition)."""
OPT_IF_NAME = 2
OPT_ENDOFOPT = 0
OPT_SHB_USERAPPL = 4
OPT_IF_TSRESOL = 9
OPT_IF_TSOFFSET = 14
NS = 1_000_000_000
LINKTYPE_MAX = 0xFFFF
"""Largest link type an Interface Description Block can name (16 bits)."""
TS_MAX = (1 << 64) - 1
"""Largest timestamp (ns since the epoch) an interface without offset can carry."""
TS_SPAN_S = 1 << 34
"""Granularity in seconds of ``if_tsoffset`` for out-of-range times (2**34 s is about
544 years; 2**34 * 10**9 ns still fits the 64-bit timestamp)."""
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
U32_MAX = 0xFFFFFFFF
SKIP_LINKTYPE = "link type above 65535 (pcapng names it in 16 bits)"
"""Reason of :attr:`PcapngWriter.skipped`: pcapng's interface link type is 16 bits."""
SKIP_TIME = "time beyond a 64-bit if_tsoffset"
"""Reason of :attr:`PcapngWriter.skipped`: beyond a signed 64-bit ``if_tsoffset``."""


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _block(btype: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", btype, total) + body + struct.pack("<I", total)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + _pad(value)


class PcapngWriter:
    """Streams a one-section pcapng: SHB, optional DSB, IDBs as link types appear, EPBs."""

    def __init__(self, out: BinaryIO, application: str = "netdiag") -> None:
        self.out = out
        self._interfaces: dict[int, int] = {}
        """Interface id by link type, for times in range (no ``if_tsoffset``)."""
        self._offset_interfaces: dict[tuple[int, int], int] = {}
        """Interface id by (link type, ``if_tsoffset`` seconds), for times out of range."""
        self.skipped: dict[str, int] = {}
        """Packets not written, by reason (:data:`SKIP_LINKTYPE`, :data:`SKIP_TIME`)."""
        opts = _option(OPT_SHB_USERAPPL, application.encode()) + _option(OPT_ENDOFOPT, b"")
        body = struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1) + opts
        out.write(_block(SHB, body))

    def secrets(self, key_log: bytes, secrets_type: int = TLS_KEY_LOG) -> None:
        """Embed secrets in a decryption-secrets block (by default an NSS key log)."""
        body = struct.pack("<II", secrets_type, len(key_log)) + _pad(key_log)
        self.out.write(_block(DSB, body))

    def interface(self, linktype: int, name: str | None = None, snaplen: int = 0) -> int:
        """Describe the interface of ``linktype`` now (with its name and snap length),
        so that a capture without packets still says what was captured; later packets
        of that link type use it. Returns its interface id."""
        return self._interface(linktype, 0, name, snaplen)

    def _skip(self, reason: str) -> bool:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        return False

    def _interface(self, linktype: int, offset_s: int, name: str | None = None,
                   snaplen: int = 0) -> int:
        """The interface of ``linktype`` with ``if_tsoffset`` ``offset_s`` (created on
        first use, with ``name`` and ``snaplen`` when given)."""
        if offset_s == 0:
            ifid = self._interfaces.get(linktype)
        else:
            ifid = self._offset_interfaces.get((linktype, offset_s))
        if ifid is not None:
            return ifid
        ifid = len(self._interfaces) + len(self._offset_interfaces)
        opts = _option(OPT_IF_NAME, name.encode()) if name is not None else b""
        opts += _option(OPT_IF_TSRESOL, b"\x09")
        if offset_s == 0:
            self._interfaces[linktype] = ifid
        else:
            self._offset_interfaces[(linktype, offset_s)] = ifid
            opts += _option(OPT_IF_TSOFFSET, struct.pack("<q", offset_s))
        opts += _option(OPT_ENDOFOPT, b"")
        self.out.write(_block(IDB, struct.pack("<HHI", linktype, 0, snaplen) + opts))
        return ifid

    def packet(self, ts_ns: int, linktype: int, data: bytes, wire_len: int) -> bool:
        """One packet; its interface is the one of its link type (created on first use).
        False when pcapng cannot hold it (counted in :attr:`skipped`, nothing written)."""
        if not 0 <= linktype <= LINKTYPE_MAX:
            return self._skip(SKIP_LINKTYPE)
        offset_s = 0
        ticks = ts_ns
        if not 0 <= ts_ns <= TS_MAX:
            secs = ts_ns // NS
            offset_s = secs - secs % TS_SPAN_S
            if not _INT64_MIN <= offset_s <= _INT64_MAX:
                return self._skip(SKIP_TIME)
            ticks = ts_ns - offset_s * NS
        ifid = self._interface(linktype, offset_s)
        body = struct.pack("<IIIII", ifid, ticks >> 32, ticks & 0xFFFFFFFF, len(data),
                           min(max(wire_len, len(data)), U32_MAX)) + _pad(bytes(data))
        self.out.write(_block(EPB, body))
        return True


def skipped_message(skipped: dict[str, int]) -> str | None:
    """One line saying which packets were not written and why; None when none were."""
    if not skipped:
        return None
    total = sum(skipped.values())
    why = ", ".join(f"{n} with a {reason}" for reason, n in sorted(skipped.items()))
    return f"pcapng: {total} packet{'s' if total != 1 else ''} not written: {why}"


def write_pcapng(out: BinaryIO, packets: Iterable[tuple[int, int, bytes, int]],
                 key_log: bytes | None = None,
                 warn: Callable[[str], None] | None = print_warning) -> int:
    """Write ``packets`` (reader tuples) with ``key_log`` embedded first; returns the
    count written. Packets pcapng cannot hold are skipped and reported in one line to
    ``warn`` (default: standard error; None: silent)."""
    w = PcapngWriter(out)
    if key_log:
        w.secrets(key_log)
    n = 0
    for ts, lt, data, wire in packets:
        if w.packet(ts, lt, data, wire):
            n += 1
    message = skipped_message(w.skipped)
    if message is not None and warn is not None:
        warn(message)
    return n
