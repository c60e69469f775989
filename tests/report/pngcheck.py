"""A tiny PNG reader (zlib only) for the screenshot test: size and pixel variety."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
"""Samples per pixel by PNG colour type."""


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_png(path: Path) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows of raw pixel bytes) of an 8-bit,
    non-interlaced PNG (what Chromium writes)."""
    data = Path(path).read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG")
    pos, idat = 8, []
    width = height = depth = ctype = interlace = -1
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if depth != 8 or interlace != 0 or ctype not in CHANNELS:
        raise ValueError(f"unsupported PNG (depth {depth}, type {ctype}, interlace {interlace})")
    bpp = CHANNELS[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        off = y * (stride + 1)
        ftype = raw[off]
        line = bytearray(raw[off + 1:off + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                line[i] = (line[i] + _paeth(a, b, c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def colours(rows: list[bytes], bpp: int, step: int = 3) -> set[bytes]:
    """Distinct pixel values, sampling every ``step``-th pixel of every ``step``-th row."""
    seen: set[bytes] = set()
    for y in range(0, len(rows), step):
        r = rows[y]
        for x in range(0, len(r) // bpp, step):
            seen.add(r[x * bpp:(x + 1) * bpp][:3])
    return seen


def write_png(path: Path, width: int, height: int, bpp: int, rows: list[bytes]) -> None:
    """Write rows back as a PNG (for looking at a crop while developing)."""
    ctype = {1: 0, 2: 4, 3: 2, 4: 6}[bpp]

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    raw = b"".join(b"\x00" + r for r in rows)
    Path(path).write_bytes(SIGNATURE + chunk(b"IHDR", struct.pack(
        ">IIBBBBB", width, height, 8, ctype, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b""))
