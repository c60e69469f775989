"""The pcapng writer: exact times, several link types, embedded key log; readable back."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from netdiag.capture.pcapng_writer import TLS_KEY_LOG, write_pcapng
from netdiag.capture.reader import CaptureReader

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"


def test_roundtrip_exact_ns_linktypes_and_secrets(tmp_path: Path) -> None:
    packets = [
        (1_764_425_767_123_456_789, 1, b"\x00" * 14 + b"\x45" + b"\x00" * 19, 1500),
        (1_764_425_767_123_456_790, 113, b"\x01" * 21, 21),
        (1_764_425_768_000_000_001, 1, b"\x02" * 3, 3),
    ]
    keys = b"CLIENT_RANDOM " + b"ab" * 32 + b" " + b"cd" * 48 + b"\n"
    out = tmp_path / "o.pcapng"
    with open(out, "wb") as f:
        assert write_pcapng(f, packets, keys) == 3
    r = CaptureReader(out)
    got = list(r.packets())
    assert got == packets
    assert r.secrets == [(TLS_KEY_LOG, keys)]
    assert r.link_types == [1, 113]
    assert not r.truncated


def test_padding_of_odd_lengths() -> None:
    buf = io.BytesIO()
    write_pcapng(buf, [(5, 1, b"x" * n, n) for n in range(1, 9)], b"odd")
    assert len(buf.getvalue()) % 4 == 0


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_reads_the_copy_of_the_shipped_capture(tmp_path: Path) -> None:
    out = tmp_path / "copy.pcapng"
    with open(out, "wb") as f:
        n = write_pcapng(f, CaptureReader(ANTHO).packets(), b"# no keys\n")
    p = subprocess.run(["tshark", "-n", "-r", str(out), "-T", "fields", "-e", "frame.time_epoch"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    times = p.stdout.split()
    assert len(times) == n
    orig = [ts for ts, *_ in CaptureReader(ANTHO).packets()]
    assert [t.replace(".", "") for t in times] == [str(ts) for ts in orig]
