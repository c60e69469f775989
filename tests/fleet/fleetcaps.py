"""Captures for the fleet tests: rotated files cut from one capture, pcapng with metadata.

Everything is written here from packets (``tests/jobs_capture.py`` generates them, or a
reader gives them): pcap files keep their records byte for byte; pcapng files get the
section and interface options given (``shb_hardware``, ``shb_os``, ``shb_userappl``,
``if_name``, ``if_description``).
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from netdiag.capture.reader import CaptureReader

Packet = tuple[int, int, bytes, int]


def read_packets(path: Path) -> list[Packet]:
    with CaptureReader(path) as r:
        return list(r.packets())


def pcap_records(path: Path) -> tuple[bytes, list[bytes]]:
    """A classic pcap's file header and its records, as bytes (16-byte headers)."""
    data = path.read_bytes()
    header, pos, recs = data[:24], 24, []
    while pos + 16 <= len(data):
        incl = struct.unpack_from("<I", data, pos + 8)[0]
        recs.append(data[pos:pos + 16 + incl])
        pos += 16 + incl
    return header, recs


def cuts(n_items: int, parts: int) -> list[tuple[int, int]]:
    size = -(-n_items // parts)
    return [(i * size, min(n_items, (i + 1) * size)) for i in range(parts)]


def split_pcap(path: Path, names: Sequence[Path]) -> list[Path]:
    """``path`` cut by packet count into ``len(names)`` files (records unchanged)."""
    header, recs = pcap_records(path)
    for name, (a, b) in zip(names, cuts(len(recs), len(names)), strict=True):
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_bytes(header + b"".join(recs[a:b]))
    return list(names)


def _opt(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(btype: int, body: bytes) -> bytes:
    return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def pcapng_bytes(packets: Iterable[Packet], *, hardware: str | None = None,
                 os_name: str | None = None, userappl: str | None = "fleetcaps",
                 if_name: str | None = "eth0", if_description: str | None = None) -> bytes:
    """One section, one interface (the first packet's link type, ns resolution)."""
    opts = b""
    for code, value in ((2, hardware), (3, os_name), (4, userappl)):
        if value is not None:
            opts += _opt(code, value.encode())
    out = [_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + opts
                  + _opt(0, b""))]
    pkts = list(packets)
    lt = pkts[0][1] if pkts else 1
    iopts = b""
    for code, value in ((2, if_name), (3, if_description)):
        if value is not None:
            iopts += _opt(code, value.encode())
    iopts += _opt(9, b"\x09") + _opt(0, b"")
    out.append(_block(1, struct.pack("<HHI", lt, 0, 262144) + iopts))
    for ts, _lt, data, wire in pkts:
        body = struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), wire)
        out.append(_block(6, body + data + b"\0" * (-len(data) % 4)))
    return b"".join(out)


def split_pcapng(packets: Sequence[Packet], names: Sequence[Path], **meta: str | None
                 ) -> list[Path]:
    for name, (a, b) in zip(names, cuts(len(packets), len(names)), strict=True):
        name.parent.mkdir(parents=True, exist_ok=True)
        data = pcapng_bytes(packets[a:b], **meta)
        name.write_bytes(gzip.compress(data, 1) if name.suffix == ".gz" else data)
    return list(names)


def ring_names(folder: Path, prefix: str, n: int, ext: str = ".pcapng",
               t0: int = 20261201093000) -> list[Path]:
    """dumpcap ring-buffer names: ``prefix_00001_20261201093000.pcapng``..."""
    return [folder / f"{prefix}_{i:05d}_{t0 + 100 * i}{ext}" for i in range(1, n + 1)]


def rotated_hosts(caps: Path, hosts: str, connections: int, files: int, seed: int) -> Path:
    """Under ``caps``: a folder ``host-<h>`` per letter of ``hosts``, each holding one
    generated capture (``connections`` connections, seed ``seed`` + its index) cut into
    ``files`` ring files (the whole capture beside ``caps``); returns ``caps``."""
    import jobs_capture as gen

    for i, h in enumerate(hosts):
        src = caps.parent / f"{h}.pcap"
        gen.write_mixed(src, connections, seed=seed + i)
        split_pcap(src, ring_names(caps / f"host-{h}", "ring", files, ".pcap"))
    return caps


def cut_mid_packet(path: Path) -> None:
    """Cut the file inside its last packet record (a capture cut short)."""
    data = path.read_bytes()
    path.write_bytes(data[:-7])
