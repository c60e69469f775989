"""Writing pcapng: packets with exact nanosecond times, and TLS keys embedded (DSB).

The output opens in Wireshark and tshark, which decrypt TLS from the embedded key
log without any option (``editcap --inject-secrets`` makes the same kind of file).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import BinaryIO

SHB = 0x0A0D0D0A
IDB = 0x00000001
EPB = 0x00000006
DSB = 0x0000000A
BYTE_ORDER_MAGIC = 0x1A2B3C4D
TLS_KEY_LOG = 0x544C534B
OPT_ENDOFOPT = 0
OPT_SHB_USERAPPL = 4
OPT_IF_TSRESOL = 9


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
        opts = _option(OPT_SHB_USERAPPL, application.encode()) + _option(OPT_ENDOFOPT, b"")
        body = struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1) + opts
        out.write(_block(SHB, body))

    def secrets(self, key_log: bytes) -> None:
        """Embed an NSS key log in a decryption-secrets block."""
        body = struct.pack("<II", TLS_KEY_LOG, len(key_log)) + _pad(key_log)
        self.out.write(_block(DSB, body))

    def packet(self, ts_ns: int, linktype: int, data: bytes, wire_len: int) -> None:
        """One packet; its interface is the one of its link type (created on first use)."""
        ifid = self._interfaces.get(linktype)
        if ifid is None:
            ifid = self._interfaces[linktype] = len(self._interfaces)
            opts = _option(OPT_IF_TSRESOL, b"\x09") + _option(OPT_ENDOFOPT, b"")
            self.out.write(_block(IDB, struct.pack("<HHI", linktype, 0, 0) + opts))
        body = struct.pack("<IIIII", ifid, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(data),
                           max(wire_len, len(data))) + _pad(bytes(data))
        self.out.write(_block(EPB, body))


def write_pcapng(out: BinaryIO, packets: Iterable[tuple[int, int, bytes, int]],
                 key_log: bytes | None = None) -> int:
    """Write ``packets`` (reader tuples) with ``key_log`` embedded first; returns the count."""
    w = PcapngWriter(out)
    if key_log:
        w.secrets(key_log)
    n = 0
    for ts, lt, data, wire in packets:
        w.packet(ts, lt, data, wire)
        n += 1
    return n
