"""Caps on analysis state over all connections (issue 11): ``netdiag.limits``.

Each cap is driven past its value with a small one set in ``Limits``: what it drops is
counted (``limits_hit``), nothing is lost from the report that did not have to be
(every connection and DNS transaction is still reported once), the accounting returns
to zero, and a capture that stays under the caps is reported exactly as without them.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_tcp import MS, SRV, T0, Harness, frame, handshake

from netdiag.flows import tcp as tcp_mod
from netdiag.flows.table import FlowTable
from netdiag.limits import (
    LIMIT_CONNECTIONS,
    LIMIT_DNS_OPEN,
    LIMIT_HELD_BYTES,
    LIMIT_OUT_OF_ORDER,
    Limits,
)
from netdiag.pipeline import Options, analyze
from netdiag.protocols.dns import DnsAnalyzer
from netdiag.report.records_out import CollectingSink

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "captures" / "antho.pcapng"


def _client(i: int) -> tuple[str, int]:
    return (f"10.9.{i >> 8 & 255}.{i & 255}", 40000 + i % 20000)


def _limited(h: Harness, **caps: int) -> Limits:
    limits = Limits(**caps)
    h.table = FlowTable(h._decide, h._done, lambda *a: None, limits=limits)
    return limits


def test_connections_over_the_cap_are_finished_least_recent_first() -> None:
    h = Harness()
    limits = _limited(h, max_connections=40)
    for i in range(100):
        c = _client(i)
        h.send(T0 + i * MS, c, SRV, "S", 1000)
        h.send(T0 + i * MS + 10, c, SRV, "PA", 1001, f"req {i}".encode())
    assert h.table.open <= 40
    evicted = [f for f in h.finished if f.conn.close == "evicted"]
    assert limits.hit == {LIMIT_CONNECTIONS: len(evicted)} and len(evicted) == 60
    # the least recently active went first: every evicted one is older than any kept
    kept = [f for f, _d in h.table.flows.values()]
    assert max(f.conn.last_ns for f in evicted) < min(f.conn.last_ns for f in kept)
    flows = h.end()
    assert len(flows) == 100  # each connection reported once
    assert all(h.an(cid).stream(0) == f"req {int(cid[1:]) - 1}".encode() for cid in flows)


def test_held_bytes_over_all_connections_stay_under_the_cap() -> None:
    h = Harness()
    limits = _limited(h, max_held_bytes=20_000)
    rng = random.Random(7)
    seqs = {}
    for i in range(30):
        c = _client(i)
        seqs[i] = handshake(h, c=c, t=T0 + i * MS)[0]
        h.send(T0 + i * MS + 500, c, SRV, "PA", seqs[i], b"GET")
        seqs[i] += 3
    peak = 0
    for k in range(600):
        i = rng.randrange(30)
        # always past a 1-byte hole that is never filled
        h.send(T0 + 40 * MS + k * 10, _client(i), SRV, "PA", seqs[i] + 1 + k * 100,
               bytes(100))
        peak = max(peak, limits.held_bytes)
    assert peak <= 20_000
    assert limits.hit.get(LIMIT_HELD_BYTES, 0) > 0
    flows = h.end()
    assert limits.held_bytes == 0  # every held byte was accounted back
    lost = sum(f.conn.lost_bytes for f in flows.values())
    delivered = sum(len(h.an(cid).stream(0)) for cid in flows)
    assert delivered == 30 * 3 + 600 * 100 and lost > 0


def test_held_bytes_accounting_returns_to_zero_on_random_reordering() -> None:
    rng = random.Random(11)
    for _trial in range(20):
        h = Harness(claim=rng.random() < 0.8)
        limits = _limited(h, max_held_bytes=rng.choice([500, 5000, 1 << 30]))
        c, s = handshake(h)
        pieces = [(off, bytes([65 + off % 26]) * 10) for off in range(0, 400, 10)]
        rng.shuffle(pieces)
        for n, (off, data) in enumerate(pieces):
            src, dst, base = (C_, SRV, c) if n % 3 else (SRV, C_, s)
            h.send(T0 + n * MS, src, dst, "PA", base + off, data)
            assert 0 <= limits.held_bytes <= max(limits.max_held_bytes, 0) + 10
        h.end()
        assert limits.held_bytes == 0


C_ = ("10.0.0.1", 50000)


def test_server_bytes_before_the_client_speaks_count_as_held() -> None:
    h = Harness()
    limits = _limited(h, max_held_bytes=3000)
    for i in range(5):
        c = _client(i)
        _c, s = handshake(h, c=c, t=T0 + i * MS)
        h.send(T0 + 10 * MS + i, SRV, c, "PA", s, bytes(1000))
    assert limits.held_bytes <= 3000 and limits.hit == {LIMIT_HELD_BYTES: 2}
    flows = h.end()
    assert limits.held_bytes == 0
    gaps = [g for cid in flows for g in h.an(cid).gaps()]
    assert sorted(g[2] for g in gaps) == [1000, 1000]  # the two over the cap: lost, said so


def test_a_full_out_of_order_queue_is_counted() -> None:
    h = Harness()
    limits = _limited(h)
    c, _s = handshake(h)
    h.send(T0 + 1 * MS, C_, SRV, "PA", c, b"a")
    for i in range(tcp_mod.MAX_OOO_SEGMENTS + 1):
        h.send(T0 + 2 * MS + i, C_, SRV, "PA", c + 2 + i, b"x")
    assert limits.hit == {LIMIT_OUT_OF_ORDER: 1}
    h.end()
    assert limits.held_bytes == 0


def _dns_query(qid: int, name: str) -> bytes:
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack("!HH", 1, 1)


def test_dns_transactions_over_the_cap_are_finished_oldest_first() -> None:
    got: list[Any] = []
    limits = Limits(max_dns_open=50)
    dns = DnsAnalyzer(got.append, limits=limits)
    for i in range(200):
        dns.on_udp(T0 + i * 1000, f"10.1.0.{i % 200}:{30000 + i}", "10.0.0.53:53",
                   _dns_query(i, f"q{i}.example"), i + 1)
    assert len(dns._open) == 50 and limits.hit == {LIMIT_DNS_OPEN: 150}
    assert [t.qname for t in got] == [f"q{i}.example" for i in range(150)]
    # an answer to one still open is matched
    q = _dns_query(199, "q199.example")
    answer = q[:2] + b"\x81\x80" + q[4:6] + b"\x00\x01" + q[8:] + (
        b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes((192, 0, 2, 1)))
    dns.on_udp(T0 + 300_000, "10.0.0.53:53", "10.1.0.199:30199", answer, 201)
    dns.finish()
    assert len(got) == 200 and got[-1].qname == "q199.example" and got[-1].answers


def _write_pcap(path: Path, frames: list[bytes]) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for n, fr in enumerate(frames):
            s, us = divmod(n * 10, 1_000_000)
            f.write(struct.pack("<IIII", 1_700_000_000 + s, us, len(fr), len(fr)) + fr)


def _many_connections(n: int) -> list[bytes]:
    frames = []
    for i in range(n):
        c = _client(i)
        frames.append(frame(c, ("10.0.0.2", 80), "S", 1000))
        frames.append(frame(c, ("10.0.0.2", 80), "PA", 1001,
                            f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode()))
    return frames


def _report(path: Path, **options: Any) -> dict[str, Any]:
    sink = CollectingSink()
    result = analyze([str(path)], sink, Options(**options))
    return sink.document(result)


@pytest.mark.parametrize("jobs", [1, 2])
def test_report_lists_limits_hit_with_one_warning_per_cap(tmp_path: Path, jobs: int) -> None:
    path = tmp_path / "many.pcap"
    _write_pcap(path, _many_connections(300))
    doc = _report(path, max_connections=100, jobs=jobs)
    cap = doc["capture"]
    evicted = sum(1 for c in doc["connections"] if c["close"] == "evicted")
    assert cap["limits_hit"] == {LIMIT_CONNECTIONS: evicted} and evicted >= 200
    assert len(doc["connections"]) == 300
    assert sorted(r["path"] for c in doc["connections"] for r in c["requests"]) == sorted(
        f"/{i}" for i in range(300))
    limit_warnings = [w for w in cap["warnings"] if w["kind"] == "limit"]
    assert len(limit_warnings) == 1
    assert "--max-connections" in limit_warnings[0]["message"]
    # --jobs gives what one process gives, limits or not
    assert json.dumps(doc, sort_keys=True) == json.dumps(
        _report(path, max_connections=100, jobs=1), sort_keys=True)
    # under the caps: nothing hit, nothing evicted
    doc = _report(path, jobs=jobs)
    assert doc["capture"]["limits_hit"] == {}
    assert not any(c["close"] == "evicted" for c in doc["connections"])


@pytest.mark.skipif(not SHIPPED.exists(), reason="shipped capture absent")
def test_the_shipped_capture_hits_no_limit() -> None:
    doc = _report(SHIPPED)
    assert doc["capture"]["limits_hit"] == {}
    assert not [w for w in doc["capture"]["warnings"] if w["kind"] == "limit"]


def test_cli_flags_reach_the_caps(tmp_path: Path) -> None:
    path = tmp_path / "many.pcap"
    _write_pcap(path, _many_connections(50))
    out = subprocess.run([sys.executable, "-m", "netdiag", "report", str(path), "--format",
                          "json", "--max-connections", "10", "--max-held-mib", "1",
                          "--max-dns-pending", "5"], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    doc = json.loads(out.stdout)
    assert doc["capture"]["limits_hit"][LIMIT_CONNECTIONS] >= 40
    text = subprocess.run([sys.executable, "-m", "netdiag", "report", str(path),
                           "--max-connections", "10"], capture_output=True, text=True,
                          cwd=tmp_path, check=True).stdout
    assert "LIMIT: tcp_open_connections" in text and "--max-connections" in text
