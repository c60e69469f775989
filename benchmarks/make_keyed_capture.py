#!/usr/bin/env python3
"""Repeat the shipped lab capture into a large TLS 1.3 + HTTP/2 + DNS capture with a key log.

    python benchmarks/make_keyed_capture.py                  # 240 copies: ~200k packets
    python benchmarks/make_keyed_capture.py --copies 1200    # ~1M packets

``captures/antho.pcapng`` (a real lab run: TLS 1.3, HTTP/2, HTTP/1.1, DNS over UDP and
TCP, Redis) is written ``--copies`` times, one copy after the other in time, each copy's
client ports renumbered so that every connection of every copy is its own 4-tuple.
The same client randoms repeat, so one key log (``antho.keys``, copied next to the
output) decrypts every copy. Output: ``benchmarks/out/keyed-N.pcap`` and ``.keys``.
Nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import shutil
import struct
import sys
from pathlib import Path

import dpkt

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = REPO / "captures" / "antho.pcapng"
KEYS = REPO / "captures" / "antho.keys"
SERVER_PORTS = frozenset({53, 443, 6379, 8080, 8443})
GAP_S = 1.0
"""Quiet time between two copies."""


def _packets(path: Path) -> list[tuple[float, bytes]]:
    with open(path, "rb") as f:
        reader = dpkt.pcapng.Reader(f)
        if reader.datalink() != dpkt.pcap.DLT_EN10MB:
            raise SystemExit(f"{path}: expected Ethernet, got link type {reader.datalink()}")
        return [(ts, bytes(buf)) for ts, buf in reader]


def _port_offsets(buf: bytes) -> tuple[int, int] | None:
    """Byte offsets of the source and destination ports of an IPv4/IPv6 TCP/UDP frame."""
    et = struct.unpack_from("!H", buf, 12)[0]
    if et == 0x0800:
        l4 = 14 + ((buf[14] & 15) << 2)
        proto = buf[23]
    elif et == 0x86DD:
        l4, proto = 54, buf[20]
    else:
        return None
    if proto not in (6, 17):
        return None
    return l4, l4 + 2


def build(copies: int, out: Path) -> int:
    packets = _packets(SOURCE)
    first, last = packets[0][0], packets[-1][0]
    span = last - first + GAP_S
    next_port = 10000
    written = 0
    with open(out, "wb") as f:
        writer = dpkt.pcap.Writer(f, snaplen=262144, linktype=dpkt.pcap.DLT_EN10MB)
        for copy in range(copies):
            ports: dict[int, int] = {}
            for ts, buf in packets:
                offs = _port_offsets(buf)
                if offs is not None:
                    frame = bytearray(buf)
                    for off in offs:
                        port = struct.unpack_from("!H", frame, off)[0]
                        if port in SERVER_PORTS:
                            continue
                        new = ports.get(port)
                        if new is None:
                            new = ports[port] = next_port
                            next_port = 10000 if next_port >= 65000 else next_port + 1
                        struct.pack_into("!H", frame, off, new)
                    buf = bytes(frame)
                writer.writepkt(buf, ts=ts + copy * span)
                written += 1
    shutil.copyfile(KEYS, out.with_suffix(".keys"))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=240)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = args.out or HERE / "out" / f"keyed-{args.copies}.pcap"
    out.parent.mkdir(parents=True, exist_ok=True)
    n = build(args.copies, out)
    print(f"{out}: {n:,} packets; key log {out.with_suffix('.keys')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
