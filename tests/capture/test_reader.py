"""Tests of netdiag.capture.reader: pcap/pcapng parsing, exact timestamps, damage handling."""

from __future__ import annotations

import atexit
import csv
import gzip
import io
import os
import random
import shutil
import struct
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

import dpkt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import netdiag.capture.reader as reader_mod
from netdiag.capture import linktypes
from netdiag.capture.reader import SECRETS_TLS_KEY_LOG, CaptureReader
from netdiag.errors import CaptureFormatError, InputError

NS = 1_000_000_000
THIRDPARTY = Path(__file__).resolve().parents[2] / ".." / "shared" / "captures" / "thirdparty"

# -- builders ------------------------------------------------------------------------------


def pcap_bytes(records: list[tuple[int, int, bytes, int]], *, bo: str = "<", nano: bool = False,
               linktype: int = 1, snaplen: int = 65535) -> bytes:
    """A pcap file: records are (sec, frac, data, wire_len)."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(bo + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for sec, frac, data, wire in records:
        out.append(struct.pack(bo + "IIII", sec, frac, len(data), wire) + data)
    return b"".join(out)


def _pad(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def block(btype: int, body: bytes, bo: str = "<") -> bytes:
    body = _pad(body)
    blen = 12 + len(body)
    return struct.pack(bo + "II", btype, blen) + body + struct.pack(bo + "I", blen)


def opt(code: int, value: bytes, bo: str = "<") -> bytes:
    return struct.pack(bo + "HH", code, len(value)) + _pad(value)


def shb(bo: str = "<") -> bytes:
    return block(0x0A0D0D0A, struct.pack(bo + "IHHq", 0x1A2B3C4D, 1, 0, -1), bo)


def idb(lt: int, snaplen: int = 0, tsresol: int | None = None, tsoffset: int | None = None,
        bo: str = "<") -> bytes:
    opts = b""
    if tsresol is not None:
        opts += opt(9, bytes([tsresol]), bo)
    if tsoffset is not None:
        opts += opt(14, struct.pack(bo + "q", tsoffset), bo)
    if opts:
        opts += opt(0, b"", bo)
    return block(1, struct.pack(bo + "HHI", lt, 0, snaplen) + opts, bo)


def epb(ifid: int, ticks: int, data: bytes, wire: int | None = None, bo: str = "<") -> bytes:
    head = struct.pack(bo + "IIIII", ifid, ticks >> 32, ticks & 0xFFFFFFFF, len(data),
                       len(data) if wire is None else wire)
    return block(6, head + data, bo)


def spb(data: bytes, wire: int, bo: str = "<") -> bytes:
    return block(3, struct.pack(bo + "I", wire) + data, bo)


def nrb(entries: list[tuple[int, bytes, list[str]]], bo: str = "<") -> bytes:
    body = b""
    for rtype, addr, names in entries:
        value = addr + b"".join(n.encode() + b"\0" for n in names)
        body += opt(rtype, value, bo)
    return block(4, body + opt(0, b"", bo), bo)


def isb(ifid: int, ticks: int, ifrecv: int, ifdrop: int, bo: str = "<") -> bytes:
    body = struct.pack(bo + "III", ifid, ticks >> 32, ticks & 0xFFFFFFFF)
    body += opt(4, struct.pack(bo + "Q", ifrecv), bo) + opt(5, struct.pack(bo + "Q", ifdrop), bo)
    return block(5, body + opt(0, b"", bo), bo)


def dsb(stype: int, data: bytes, bo: str = "<") -> bytes:
    return block(0x0A, struct.pack(bo + "II", stype, len(data)) + data, bo)


def write(tmp_path: Path, data: bytes, name: str = "t.pcap") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def read_all(path: Path | str) -> tuple[CaptureReader, list[tuple[int, int, bytes, int]]]:
    with CaptureReader(path) as r:
        return r, list(r.packets())


# -- pcap ------------------------------------------------------------------------------------

@pytest.mark.parametrize("bo", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
def test_pcap_exact_timestamps(tmp_path: Path, bo: str, nano: bool) -> None:
    frac = 123456789 if nano else 123456
    recs = [(1700000000, frac, b"\x01" * 60, 60), (4000000000, 0, b"\x02" * 10, 1500)]
    r, pkts = read_all(write(tmp_path, pcap_bytes(recs, bo=bo, nano=nano)))
    first = 1700000000 * NS + (123456789 if nano else 123456000)
    assert pkts == [(first, 1, b"\x01" * 60, 60), (4000000000 * NS, 1, b"\x02" * 10, 1500)]
    assert r.format == "pcap" and r.link_types == [1]
    assert r.packets_read == 2 and r.bytes_read == 70
    assert not r.truncated and r.warnings == []


@pytest.mark.parametrize("nano", [False, True])
def test_pcap_written_by_dpkt(tmp_path: Path, nano: bool) -> None:
    buf = io.BytesIO()
    w = dpkt.pcap.Writer(buf, snaplen=262144, linktype=113, nano=nano)
    w.writepkt(b"a" * 40, ts=1700000000.25)
    w.writepkt(b"b" * 1000, ts=1700000001.5)
    r, pkts = read_all(write(tmp_path, buf.getvalue()))
    assert [(t, lt, len(d), n) for t, lt, d, n in pkts] == [
        (1700000000 * NS + 250_000_000, 113, 40, 40),
        (1700000001 * NS + 500_000_000, 113, 1000, 1000)]
    assert r.link_types == [113]


def test_pcap_caplen_above_snaplen_accepted(tmp_path: Path) -> None:
    recs = [(1, 0, b"x" * 300, 300)]
    _, pkts = read_all(write(tmp_path, pcap_bytes(recs, snaplen=96)))
    assert len(pkts) == 1 and len(pkts[0][2]) == 300


def test_pcap_raw_alias_normalized(tmp_path: Path) -> None:
    r, pkts = read_all(write(tmp_path, pcap_bytes([(1, 0, b"\x45", 1)], linktype=12)))
    assert pkts[0][1] == linktypes.LINKTYPE_RAW and r.link_types == [101]


def test_modified_pcap_magic(tmp_path: Path) -> None:
    data = struct.pack("<IHHiIII", 0xA1B2CD34, 2, 4, 0, 0, 65535, 1)
    data += struct.pack("<IIII", 5, 7, 3, 3) + b"\0" * 8 + b"abc"
    _, pkts = read_all(write(tmp_path, data))
    assert pkts == [(5 * NS + 7000, 1, b"abc", 3)]


def test_counters_follow_iteration(tmp_path: Path) -> None:
    recs = [(i, 0, b"z" * (i + 1), i + 1) for i in range(5)]
    with CaptureReader(write(tmp_path, pcap_bytes(recs))) as r:
        it = r.packets()
        next(it)
        next(it)
        assert (r.packets_read, r.bytes_read) == (2, 3)
        assert list(r.packets()) == [(i * NS, 1, b"z" * (i + 1), i + 1) for i in range(2, 5)]


# -- pcapng ------------------------------------------------------------------------------------

def _two_section_capture() -> bytes:
    le = "<"
    sec1 = b"".join([
        shb(le),
        idb(1, 65535, bo=le),                         # usec (default)
        idb(101, 0, tsresol=9, tsoffset=10, bo=le),   # nsec, +10 s
        dsb(SECRETS_TLS_KEY_LOG, b"CLIENT_RANDOM aa bb\n", le),
        nrb([(1, bytes([10, 0, 0, 1]), ["api.test", "alt.test"]),
             (2, bytes(15) + b"\x01", ["six.test"])], le),
        epb(0, 1700000000_123456, b"\xaa" * 60, bo=le),
        block(0x40000BAD, b"\0\0\x7f\x00custom", le),  # custom block: skipped
        block(0x12345678, b"unknown", le),             # unknown block: skipped
        epb(1, 1700000000_987654321, b"\x45" * 20, wire=1500, bo=le),
        spb(b"\xbb" * 30, 30, le),
        idb(113, 0, tsresol=0x94, bo=le),              # 2^-20 s
        epb(2, (1700000000 << 20) + 1, b"\xcc" * 16, bo=le),
        isb(0, 1700000001_000000, 12345, 7, le),
    ])
    be = ">"
    sec2 = b"".join([
        shb(be),
        idb(276, 0, tsresol=3, bo=be),                # msec; interface ids restart at 0
        epb(0, 1700000002_001, b"\xdd" * 8, bo=be),
        spb(b"\xee" * 12, 20, be),                    # captured length = block data
    ])
    return sec1 + sec2


def test_pcapng_sections_interfaces_and_blocks(tmp_path: Path) -> None:
    r, pkts = read_all(write(tmp_path, _two_section_capture(), "t.pcapng"))
    assert r.format == "pcapng"
    assert pkts == [
        (1700000000_123456_000, 1, b"\xaa" * 60, 60),
        (1700000000_987654321 + 10 * NS, 101, b"\x45" * 20, 1500),
        (1700000000_987654321 + 10 * NS, 1, b"\xbb" * 30, 30),   # SPB: last ts, interface 0
        (1700000000 * NS + 953, 113, b"\xcc" * 16, 16),           # floor(1e9 / 2^20) = 953
        (1700000002_001_000000, 276, b"\xdd" * 8, 8),
        (1700000002_001_000000, 276, b"\xee" * 12, 20),
    ]
    assert r.link_types == [1, 101, 113, 276]
    assert r.secrets == [(SECRETS_TLS_KEY_LOG, b"CLIENT_RANDOM aa bb\n")]
    assert r.names == {"10.0.0.1": ["api.test", "alt.test"], "::1": ["six.test"]}
    assert r.interface_stats == [{"interface_id": 0, "ts_ns": 1700000001 * NS,
                                  "isb_ifrecv": 12345, "isb_ifdrop": 7}]
    assert not r.truncated and r.warnings == []
    assert r.packets_read == 6 and r.bytes_read == 60 + 20 + 30 + 16 + 8 + 12


def test_timestamps_at_the_edges_of_native_arithmetic(tmp_path: Path) -> None:
    """Timestamps are exact whatever their size: the compiled reader converts the usual
    ones in 64-bit arithmetic and must fall back, not overflow or raise, beyond it."""
    last_sec = 0xFFFFFFFF
    p = write(tmp_path, pcap_bytes([(last_sec, 999_999, b"a", 1), (1, 0, b"b", 1)]))
    assert [t for t, *_ in read_all(p)[1]] == [last_sec * NS + 999_999_000, NS]
    p = write(tmp_path, pcap_bytes([(last_sec, 999_999_999, b"a", 1)], nano=True, bo=">"),
              "n.pcap")
    assert [t for t, *_ in read_all(p)[1]] == [last_sec * NS + 999_999_999]
    huge_offset = (1 << 63) - 1  # seconds: far beyond 64 bits once in nanoseconds
    edge = (1 << 53) - 1  # the largest tick count converted natively
    cases = [(0, edge), (0, edge + 1), (0, (1 << 64) - 1), (1, edge), (1, 1 << 60),
             (2, edge), (3, 5)]
    data = b"".join([
        shb(),
        idb(1, 0),                                   # usec
        idb(1, 0, tsresol=9),                        # nsec
        idb(1, 0, tsresol=6, tsoffset=huge_offset),  # usec, offset of 2**63 - 1 s
        idb(1, 0, tsresol=0x94, tsoffset=-huge_offset - 1),  # 2**-20 s, offset -2**63 s
        *(epb(i, ticks, b"x") for i, ticks in cases),
    ])
    got = [t for t, *_ in read_all(write(tmp_path, data, "t.pcapng"))[1]]
    per_tick = [(1000, 1, 0), (1, 1, 0), (1000, 1, huge_offset * NS),
                (NS, 1 << 20, -(huge_offset + 1) * NS)]
    assert got == [ticks * per_tick[i][0] // per_tick[i][1] + per_tick[i][2]
                   for i, ticks in cases]


def test_pcapng_written_by_dpkt(tmp_path: Path) -> None:
    pn = dpkt.pcapng
    idb0 = pn.InterfaceDescriptionBlockLE(linktype=1, snaplen=65535)
    idb1 = pn.InterfaceDescriptionBlockLE(linktype=229, snaplen=0, opts=[
        pn.PcapngOptionLE(code=pn.PCAPNG_OPT_IF_TSRESOL, data=b"\x09"),
        pn.PcapngOptionLE(code=pn.PCAPNG_OPT_ENDOFOPT)])
    buf = io.BytesIO()
    w = pn.Writer(buf, idb=[idb0, idb1])
    w.writepkt(b"e" * 54, ts=1700000000.5)
    ts = 1700000000_123456789
    w.writepkt(pn.EnhancedPacketBlockLE(iface_id=1, ts_high=ts >> 32, ts_low=ts & 0xFFFFFFFF,
                                        pkt_data=b"\x60" + b"6" * 39, pkt_len=40))
    r, pkts = read_all(write(tmp_path, buf.getvalue(), "d.pcapng"))
    assert [(t, lt, len(d), n) for t, lt, d, n in pkts] == [
        (1700000000_500000000, 1, 54, 54), (ts, 229, 40, 40)]
    assert r.link_types == [1, 229]


def test_pcapng_obsolete_packet_block_and_isb_of_unknown_interface(tmp_path: Path) -> None:
    pb = block(2, struct.pack("<HHIIII", 0, 3, 0, 1500, 4, 60) + b"abcd")
    data = shb() + idb(1, tsresol=3) + pb + isb(9, 5, 1, 0)
    r, pkts = read_all(write(tmp_path, data, "pb.pcapng"))
    assert pkts == [(1_500_000_000, 1, b"abcd", 60)]
    assert r.interface_stats == [{"interface_id": 9, "ts_ns": None, "isb_ifrecv": 1,
                                  "isb_ifdrop": 0}]
    assert not r.truncated


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_tiny_chunks_give_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      chunk: int) -> None:
    ng = write(tmp_path, _two_section_capture(), "t.pcapng")
    recs = [(i, i, bytes([i]) * (i * 37 % 500), 600) for i in range(60)]
    pc = write(tmp_path, pcap_bytes(recs, nano=True), "t.pcap")
    want = [read_all(ng)[1], read_all(pc)[1]]
    monkeypatch.setattr(reader_mod, "CHUNK_SIZE", chunk)
    assert [read_all(ng)[1], read_all(pc)[1]] == want


# -- gzip, progress, lifecycle ------------------------------------------------------------------

def _random_pcap(n: int, seed: int = 1) -> tuple[bytes, list[tuple[int, int, bytes, int]]]:
    rnd = random.Random(seed)
    recs = [(1700000000 + i, rnd.randrange(1000000), rnd.randbytes(rnd.randrange(20, 200)), 1514)
            for i in range(n)]
    return pcap_bytes(recs), [(s * NS + f * 1000, 1, d, w) for s, f, d, w in recs]


def test_gzip_pcap_and_progress(tmp_path: Path) -> None:
    raw, want = _random_pcap(500)
    p = write(tmp_path, gzip.compress(raw), "t.pcap.gz")
    with CaptureReader(p) as r:
        assert r.progress()[1] == p.stat().st_size
        assert list(r.packets()) == want
        assert r.progress() == (p.stat().st_size, p.stat().st_size)
        assert not r.truncated


def test_progress_plain(tmp_path: Path) -> None:
    raw, want = _random_pcap(50)
    p = write(tmp_path, raw)
    with CaptureReader(p) as r:
        assert list(r.packets()) == want
        assert r.progress() == (len(raw), len(raw))


def test_gzip_cut_midway(tmp_path: Path) -> None:
    raw, want = _random_pcap(3000)
    comp = gzip.compress(raw)
    p = write(tmp_path, comp[: len(comp) // 2], "t.pcap.gz")
    r, pkts = read_all(p)
    assert 0 < len(pkts) < len(want) and pkts == want[: len(pkts)]
    assert r.truncated and len(r.warnings) == 1
    w = r.warnings[0]
    assert w.kind == "capture" and w.packet == len(pkts) + 1
    assert w.offset == 24 + sum(16 + len(d) for _, _, d, _ in pkts)
    assert "unreadable" in w.message and str(p) in w.message


def test_gzip_corrupt_midway(tmp_path: Path) -> None:
    raw, want = _random_pcap(3000)
    comp = bytearray(gzip.compress(raw))
    for i in range(len(comp) // 2, len(comp) // 2 + 64):
        comp[i] ^= 0x5A
    r, pkts = read_all(write(tmp_path, bytes(comp), "t.pcap.gz"))
    assert r.truncated and len(r.warnings) == 1
    assert len(want) // 3 < len(pkts) < len(want)
    assert pkts[: len(want) // 3] == want[: len(want) // 3]


def test_gzip_crc_error_after_all_packets(tmp_path: Path) -> None:
    raw, want = _random_pcap(20)
    comp = bytearray(gzip.compress(raw))
    comp[-8] ^= 0xFF  # CRC32 in the trailer
    r, pkts = read_all(write(tmp_path, bytes(comp), "t.pcap.gz"))
    assert pkts == want
    assert r.truncated and "incorrect data check" in r.warnings[0].message
    assert (r.warnings[0].offset, r.warnings[0].packet) == (len(raw), 21)


def test_gzip_multi_member_and_zero_padding(tmp_path: Path) -> None:
    raw, want = _random_pcap(40)
    comp = gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]) + bytes(100)
    r, pkts = read_all(write(tmp_path, comp, "m.pcap.gz"))
    assert pkts == want and not r.truncated


def test_close_and_context_manager(tmp_path: Path) -> None:
    raw, _ = _random_pcap(10)
    r = CaptureReader(write(tmp_path, raw))
    it = r.packets()
    next(it)
    r.close()
    assert list(it) == []
    with CaptureReader(write(tmp_path, gzip.compress(raw), "g.gz")) as g:
        assert g.format == "pcap"
    assert list(g.packets()) == []


# -- damage ----------------------------------------------------------------------------------

def test_cut_inside_packet_data(tmp_path: Path) -> None:
    recs = [(1, 0, b"a" * 100, 100), (2, 0, b"b" * 100, 100), (3, 0, b"c" * 1500, 1500)]
    data = pcap_bytes(recs)[:-1300]
    r, pkts = read_all(write(tmp_path, data, "antho.pcap"))
    assert [d[:1] for _, _, d, _ in pkts] == [b"a", b"b"]
    assert r.truncated
    (w,) = r.warnings
    assert (w.kind, w.offset, w.packet) == ("capture", 24 + 2 * 116, 3)
    assert w.file == str(tmp_path / "antho.pcap")
    assert w.message == (f"{w.file}: cut short at byte offset 256 in packet 3 (record header "
                         "claims 1500 bytes, 200 left); packets before it are reported")


def test_cut_inside_record_header(tmp_path: Path) -> None:
    data = pcap_bytes([(1, 0, b"a" * 10, 10)]) + b"\x01\x02\x03"
    r, pkts = read_all(write(tmp_path, data))
    assert len(pkts) == 1 and r.truncated
    assert (r.warnings[0].offset, r.warnings[0].packet) == (50, 2)
    assert "3 of 16 bytes" in r.warnings[0].message


def test_absurd_pcap_length_is_not_allocated(tmp_path: Path) -> None:
    data = pcap_bytes([(1, 0, b"a" * 10, 10)])
    data += struct.pack("<IIII", 2, 0, 0x7FFFFFFF, 0x7FFFFFFF) + b"x" * 100
    tracemalloc.start()
    try:
        t = time.process_time()
        r, pkts = read_all(write(tmp_path, data))
        elapsed = time.process_time() - t
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 1 and peak < 8 << 20
    assert len(pkts) == 1 and r.truncated
    assert (r.warnings[0].offset, r.warnings[0].packet) == (50, 2)
    assert "limit" in r.warnings[0].message


def test_large_claim_with_huge_snaplen_reads_only_what_exists(tmp_path: Path) -> None:
    data = pcap_bytes([], snaplen=0xFFFFFFFF) + struct.pack("<IIII", 2, 0, 0x0FFFFFFF, 0)
    data += b"x" * 50
    tracemalloc.start()
    try:
        r, pkts = read_all(write(tmp_path, data))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    assert pkts == [] and r.truncated
    assert "claims 268435455 bytes, 50 left" in r.warnings[0].message


def _ng_prefix() -> bytes:
    return shb() + idb(1) + epb(0, 1, b"p" * 20)


@pytest.mark.parametrize(("tail", "needle"), [
    (struct.pack("<II", 6, 0x7FFFFFF0) + b"\0" * 40, "limit"),
    (struct.pack("<II", 6, 34) + b"\0" * 40, "multiple of 4"),
    (struct.pack("<II", 6, 8) + b"\0" * 40, "less than 12"),
    (epb(0, 2, b"q" * 8)[:-4] + struct.pack("<I", 99), "trailing length"),
    (epb(5, 2, b"q" * 8), "interface 5"),
    (block(6, struct.pack("<IIIII", 0, 0, 0, 500, 500) + b"r" * 8), "exceeds its block"),
    (epb(0, 2, b"q" * 40)[:30], "block (type 0x00000006) header claims 72 bytes, 22 left"),
    (b"\x06\0\0", "block header incomplete: 3 of 12 bytes"),
    (block(0x0A0D0D0A, b"\x11\x22\x33\x44" + b"\0" * 12), "byte-order magic"),
])
def test_pcapng_damage(tmp_path: Path, tail: bytes, needle: str) -> None:
    prefix = _ng_prefix()
    r, pkts = read_all(write(tmp_path, prefix + tail, "d.pcapng"))
    assert pkts == [(1000, 1, b"p" * 20, 20)]
    assert r.truncated
    (w,) = r.warnings
    assert (w.offset, w.packet) == (len(prefix), 2)
    assert needle in w.message


# -- not a capture ------------------------------------------------------------------------------

def test_missing_file() -> None:
    with pytest.raises(InputError, match=r"cannot read /nonexistent/x\.pcap: No such file"):
        CaptureReader("/nonexistent/x.pcap")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        CaptureReader(tmp_path)


def test_not_a_capture(tmp_path: Path) -> None:
    p = write(tmp_path, b"GET / HTTP/1.1\r\n\r\n", "x.txt")
    with pytest.raises(CaptureFormatError,
                       match=r"x.txt is not a pcap or pcapng capture \(magic 0x47455420\)"):
        CaptureReader(p)


def test_empty_file(tmp_path: Path) -> None:
    with pytest.raises(CaptureFormatError, match="is empty"):
        CaptureReader(write(tmp_path, b""))
    with pytest.raises(CaptureFormatError, match="is empty"):
        CaptureReader(write(tmp_path, gzip.compress(b""), "e.gz"))


def test_header_cut_short(tmp_path: Path) -> None:
    with pytest.raises(CaptureFormatError, match="header cut short"):
        CaptureReader(write(tmp_path, pcap_bytes([])[:10]))
    with pytest.raises(CaptureFormatError, match="header cut short"):
        CaptureReader(write(tmp_path, shb()[:9], "s.pcapng"))


def test_bad_gzip(tmp_path: Path) -> None:
    with pytest.raises(CaptureFormatError, match="cannot be decompressed"):
        CaptureReader(write(tmp_path, b"\x1f\x8b\x08\x00garbage-garbage-garbage", "b.gz"))


def test_linktype_names() -> None:
    assert linktypes.linktype_name(1) == "EN10MB"
    assert linktypes.linktype_name(113) == "LINUX_SLL"
    assert linktypes.linktype_name(276) == "LINUX_SLL2"
    assert [linktypes.linktype_name(x) for x in (0, 108, 101, 12, 14, 228, 229)] == [
        "NULL", "LOOP", "RAW", "RAW", "RAW", "IPV4", "IPV6"]
    assert linktypes.linktype_name(4242) == "LINKTYPE_4242"
    assert linktypes.normalize(14) == linktypes.LINKTYPE_RAW
    assert linktypes.normalize(1) == 1


# -- third-party captures --------------------------------------------------------------------------

def _manifest() -> list[dict[str, str]]:
    path = THIRDPARTY / "MANIFEST.tsv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.mark.skipif(not THIRDPARTY.is_dir(), reason="shared third-party captures absent")
@pytest.mark.parametrize("row", _manifest(), ids=lambda row: row["file"])
def test_thirdparty_packet_counts(row: dict[str, str]) -> None:
    r, pkts = read_all(THIRDPARTY / row["file"])
    assert len(pkts) == int(row["packet_count"]) == r.packets_read
    assert r.truncated == (row["file"] == "dpkt_truncated_dns_cut.pcap")
    assert all(lt in r.link_types for _, lt, _, _ in pkts)
    if r.truncated:
        (w,) = r.warnings
        assert (w.offset, w.packet) == (240, 2)


@pytest.mark.tshark
@pytest.mark.skipif(not THIRDPARTY.is_dir() or shutil.which("tshark") is None,
                    reason="tshark or third-party captures absent")
@pytest.mark.parametrize("name", ["zeek_pcapng_multi_interface.pcapng", "cryptohack_tls3_h2.pcapng",
                                  "zeek_linux_sll2.pcap"])
def test_thirdparty_timestamps_match_tshark(name: str) -> None:
    out = subprocess.run(
        ["tshark", "-r", str(THIRDPARTY / name), "-T", "fields", "-e", "frame.time_epoch",
         "-e", "frame.cap_len", "-e", "frame.len"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    want = []
    for line in out.splitlines():
        ts, cap, wire = line.split("\t")
        sec, _, frac = ts.partition(".")
        want.append((int(sec) * NS + int((frac + "000000000")[:9]), int(cap), int(wire)))
    _, pkts = read_all(THIRDPARTY / name)
    assert [(t, len(d), w) for t, _, d, w in pkts] == want


# -- properties: never a traceback ----------------------------------------------------------

_TMP = tempfile.mkdtemp(prefix="netdiag-reader-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # not one directory per run left
_VALID = [
    pcap_bytes([(1, 2, b"abc" * 20, 60), (3, 4, b"d" * 9, 9)]),
    pcap_bytes([(1, 2, b"abc" * 20, 60)], bo=">", nano=True),
    _two_section_capture(),
    gzip.compress(pcap_bytes([(1, 2, b"x" * 30, 30)] * 3)),
]


def _never_raises(data: bytes) -> None:
    path = os.path.join(_TMP, "h.bin")
    with open(path, "wb") as f:
        f.write(data)
    try:
        r = CaptureReader(path)
    except (CaptureFormatError, InputError):
        return
    with r:
        pkts = list(r.packets())
    assert r.packets_read == len(pkts)
    assert r.bytes_read == sum(len(d) for _, _, d, _ in pkts)
    assert r.truncated == bool(r.warnings)
    for ts, lt, d, wire in pkts:
        assert type(ts) is int and type(lt) is int and type(d) is bytes and type(wire) is int


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([b"", b"\xd4\xc3\xb2\xa1", b"\x0a\x0d\x0d\x0a", b"\x1f\x8b"]),
       st.binary(max_size=300))
def test_random_bytes_never_raise(prefix: bytes, data: bytes) -> None:
    _never_raises(prefix + data)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_VALID),
       st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=6),
       st.one_of(st.none(), st.integers(0, 4000)))
def test_mutated_captures_never_raise(base: bytes, edits: list[tuple[int, int]],
                                      cut: int | None) -> None:
    data = bytearray(base)
    for pos, value in edits:
        data[pos % len(data)] = value
    _never_raises(bytes(data[:cut]))
