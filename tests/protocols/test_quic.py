"""QUIC without keys: wire parsing, Initial decryption, CRYPTO reassembly, hostile input."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.capture.reader import CaptureReader
from netdiag.flows.table import FlowTable
from netdiag.pipeline import Options, analyze
from netdiag.protocols import quic_wire as w
from netdiag.protocols.quic import QuicAnalyzer, QuicConnection, _Reassembly
from netdiag.records import Connection
from netdiag.report.records_out import CollectingSink

THIRDPARTY = Path(__file__).resolve().parents[2] / ".." / "shared" / "captures" / "thirdparty"
JA4 = ("ja4_quic_tls_handshake.pcapng", "ja4_quic_several_tls_frames.pcapng")


def _report(path: Path) -> list[Connection]:
    sink = CollectingSink()
    analyze([str(path)], sink, Options())
    return list(sink.connections)


def test_varint() -> None:
    assert w.varint(bytes([0x25]), 0) == (37, 1)
    assert w.varint(bytes([0x7B, 0xBD]), 0) == (15293, 2)
    assert w.varint(bytes.fromhex("9d7f3e7d"), 0) == (494878333, 4)
    assert w.varint(bytes.fromhex("c2197c5eff14e88c"), 0) == (151288809941952652, 8)
    with pytest.raises(w.QuicMalformed):
        w.varint(bytes([0x40]), 0)


def test_rfc9001_initial_secrets() -> None:
    """RFC 9001 appendix A.1 and RFC 9369 appendix A.1 client Initial secrets."""
    dcid = bytes.fromhex("8394c8f03e515708")
    c, s = w.initial_secrets(dcid, w.VERSION_1)
    assert c.hex() == "c00cf151ca5be075ed0ebfb5c80323c42d6b7db67881289af4008f1f6c357aea"
    assert s.hex() == "3c199828fd139efd216c155ad844cc81fb82fa8d7446fa7d78be803acdda951b"
    c2, _s2 = w.initial_secrets(dcid, w.VERSION_2)
    assert c2.hex() == "14ec9d6eb9fd7af83bf5a668bc17a7e283766aade7ecd0891f70f9ff7f4bf47b"


def test_reassembly_out_of_order_and_overlap() -> None:
    r = _Reassembly()
    assert r.add(5, b"fghij", 2, False, 100) == []
    assert r.add(3, b"de", 3, False, 100) == []
    got = r.add(0, b"abcd", 1, False, 100)
    assert got is not None
    assert b"".join(d for d, _t in got) == b"abcdefghij"
    assert [t for _d, t in got] == [1, 3, 2]  # each byte keeps its own packet's time
    assert r.add(2, b"cd", 4, True, 100) == []  # a retransmission
    assert r.add(0, b"", 0, False, 100) == []
    big = _Reassembly()
    assert big.add(10, b"x" * 101, 1, False, 100) is None  # the cap says so


def test_frames_every_stream_variant() -> None:
    # STREAM without LEN runs to the end of the packet, so it goes last
    payload = (bytes([0x0A, 0x04, 0x02]) + b"hi"          # LEN
               + bytes([0x0E, 0x04, 0x05, 0x01]) + b"!"   # OFF|LEN
               + bytes([0x0F, 0x04, 0x06, 0x00])          # OFF|LEN|FIN, empty
               + bytes([0x02, 0x05, 0x0A, 0x00, 0x01])    # ACK largest 5 delay 10
               + bytes([0x1E, 0x01])                      # HANDSHAKE_DONE, PING
               + bytes([0x18, 0x01, 0x00, 0x04]) + b"cidx" + bytes(16)
               + bytes([0x1D, 0x00, 0x02]) + b"by"        # CONNECTION_CLOSE (app)
               + bytes([0x0C, 0x08, 0x07]) + b"rest")    # OFF, to the end
    frames = w.parse_frames(payload)
    names = [f.name for f in frames]
    assert names == ["STREAM", "STREAM", "STREAM", "ACK", "HANDSHAKE_DONE", "PING",
                     "NEW_CONNECTION_ID", "CONNECTION_CLOSE", "STREAM"]
    assert (frames[0].stream_id, frames[0].offset, frames[0].data) == (4, 0, b"hi")
    assert (frames[1].offset, frames[1].data, frames[1].fin) == (5, b"!", False)
    assert frames[2].fin and frames[2].offset == 6
    assert (frames[3].value, frames[3].extra) == (5, 10)
    assert frames[6].data == b"cidx"
    assert frames[7].data == b"by"
    assert (frames[8].stream_id, frames[8].offset, frames[8].data) == (8, 7, b"rest")
    with pytest.raises(w.QuicMalformed):
        w.parse_frames(bytes([0x06, 0x00, 0x10]) + b"short")


def test_long_header_versions() -> None:
    for version, first in ((w.VERSION_1, 0xC0), (w.VERSION_2, 0xD0), (w.DRAFT_29, 0xC0)):
        pkt = (bytes([first]) + version.to_bytes(4, "big") + b"\x04abcd\x02xy" + b"\x00"
               + bytes([0x40, 30]) + bytes(30))
        h = w.parse_long(pkt, 0)
        assert (h.ptype, h.dcid, h.scid, h.end) == (w.INITIAL, b"abcd", b"xy", len(pkt))
    vn = b"\x80" + bytes(4) + b"\x02xy\x04abcd" + (1).to_bytes(4, "big") + bytes.fromhex(
        "6b3343cf")
    h = w.parse_long(vn, 0)
    assert h.ptype == w.VERSION_NEGOTIATION and h.versions == [1, w.VERSION_2]
    assert w.version_name(w.DRAFT_29) == "draft-29"


@pytest.mark.parametrize("name", JA4)
def test_ja4_client_hello(name: str) -> None:
    path = THIRDPARTY / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    (conn,) = _report(path)
    assert conn.transport == "udp" and conn.protocol == "h3"
    assert conn.tls is not None and conn.tls.alpn_offered == ["h3"]
    assert conn.tls.sni in ("www.google.com", "ogs.google.com")
    assert conn.quic is not None and conn.quic["version"] == "1"
    assert conn.tls.client_hello_ns == conn.initial_ns == conn.ts_ns
    assert conn.tls.handshake_ns is None  # no server flight in the capture
    assert conn.to_json()["handshake_rtt_ms"] is None


def _datagrams(path: Path) -> list[bytes]:
    out = []
    with CaptureReader(str(path)) as r:
        for _ts, _lt, data, _wl in r.packets():
            out.append(bytes(data[42:]))  # Ethernet + IPv4 + UDP
    return out


def _analyzer() -> tuple[QuicAnalyzer, list[QuicConnection]]:
    made: list[QuicConnection] = []

    def new(qc: QuicConnection) -> str:
        made.append(qc)
        return f"C{len(made)}"

    return QuicAnalyzer(new), made


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=1400), st.integers(0, 3))
def test_fuzz_random_datagrams(data: bytes, kind: int) -> None:
    an, made = _analyzer()
    if kind == 1:  # a long header of a known version in front
        data = b"\xc0\x00\x00\x00\x01" + data
    elif kind == 2:
        data = bytes([0x40]) + data
    an.on_datagram(1, "10.0.0.1:5000", "10.0.0.2:443", data, 1)
    an.on_datagram(2, "10.0.0.2:443", "10.0.0.1:5000", data[::-1], 2)
    for qc in made:
        qc.finish(3, "open")


def test_fuzz_mutated_initials() -> None:
    path = THIRDPARTY / JA4[0]
    if not path.exists():
        pytest.skip(f"{path} is absent")
    (base,) = _datagrams(path)
    rng = random.Random(15)
    for i in range(400):
        d = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            d[rng.randrange(len(d))] = rng.randrange(256)
        if i % 5 == 0:
            d = d[:rng.randrange(1, len(d))]
        an, made = _analyzer()
        an.on_datagram(i, "10.0.0.1:5000", "10.0.0.2:443", bytes(d), i)
        an.on_datagram(i, "10.0.0.2:443", "10.0.0.1:5000", bytes(d), i)
        for qc in made:
            qc.finish(i, "open")
            assert qc.conn.quic is not None


def test_table_routes_quic_and_leaves_dns() -> None:
    seen: list[str] = []
    dns: list[str] = []
    table = FlowTable(lambda f, b: None, lambda f: None, lambda *a: dns.append(a[1]))
    table.on_quic = lambda ts, s, d, p, n: seen.append(s)

    def udp(sport: int, dport: int, payload: bytes, rev: bool = False) -> bytes:
        ip = (bytes([0x45, 0, 0, 28 + len(payload), 0, 0, 0, 0, 64, 17, 0, 0])
              + (bytes([10, 0, 0, 2, 10, 0, 0, 1]) if rev else bytes([10, 0, 0, 1, 10, 0, 0, 2])))
        return (ip + sport.to_bytes(2, "big") + dport.to_bytes(2, "big")
                + (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload)

    pkts = [
        udp(5000, 443, b"\x40" + bytes(30)),                 # short header on 443
        udp(5000, 443, b"\x00" + bytes(30)),                 # no fixed bit: not QUIC
        udp(5000, 9999, b"\xc0\x00\x00\x00\x01" + bytes(30)),  # Initial, other port
        udp(9999, 5000, b"\x40" + bytes(30), rev=True),      # that server's short header
        udp(5001, 7777, b"\x40" + bytes(30)),                # unknown: not QUIC
        udp(5353, 53, bytes(12)),                            # DNS stays DNS
    ]
    table.scan((i, 228, p, len(p)) for i, p in enumerate(pkts))
    assert seen == ["10.0.0.1:5000", "10.0.0.1:5000", "10.0.0.2:9999"]
    assert dns == ["10.0.0.1:5353"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_frames_only_malformed(payload: bytes) -> None:
    with contextlib.suppress(w.QuicMalformed):
        w.parse_frames(payload)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 13), st.integers(0, 1), st.binary(max_size=200),
                          st.booleans()), max_size=12))
def test_fuzz_h3_and_crypto_streams(chunks: list[tuple[int, int, bytes, bool]]) -> None:
    """Decrypted but hostile bytes: HTTP/3 streams and CRYPTO handshake messages."""
    from netdiag.protocols.h3 import Http3

    h3 = Http3()
    an, made = _analyzer()
    an.on_datagram(1, "10.0.0.1:5000", "10.0.0.2:443",
                   b"\xc0\x00\x00\x00\x01\x00\x00\x00\x16" + bytes(22), 1)
    for sid, d, data, fin in chunks:
        h3.data(d, sid, 5, data, fin)
        for qc in made:
            qc._crypto(sid % 3, d, 5, 1, w.Frame(w.CRYPTO, offset=sid * 7, data=data))
    for qc in made:
        qc.finish(6, "open")
    assert all(r.protocol == "h3" for r in h3.requests)


def _initial(version: int, dcid: bytes, scid: bytes, size: int = 1242) -> bytes:
    """A client Initial-shaped datagram (its payload not decryptable)."""
    head = b"\xc0" + version.to_bytes(4, "big") + bytes([len(dcid)]) + dcid + bytes(
        [len(scid)]) + scid + b"\x00"
    n = size - len(head) - 2
    return head + bytes([0x40 | n >> 8, n & 0xFF]) + bytes(n)


def test_unknown_version_initial_starts_a_connection_on_a_quic_port_only() -> None:
    grease = 0x1A2A3A4A
    dcid, scid = bytes(range(8)), bytes(range(8, 16))
    client, server = "10.0.0.1:5000", "10.0.0.2:4433"
    an, made = _analyzer()
    an.on_datagram(1, client, "10.0.0.2:9999", _initial(grease, dcid, scid), 1)  # not QUIC
    an.on_datagram(2, "10.0.0.1:5001", server, _initial(grease, dcid, scid, 600), 2)  # small
    an.on_datagram(3, "10.0.0.1:5002", server,  # a 21-byte DCID: not a QUIC long header
                   b"\xc0" + grease.to_bytes(4, "big") + b"\x15" + bytes(1236), 3)
    assert made == [] and an.unmatched == 3
    an.on_datagram(10, client, server, _initial(grease, dcid, scid), 10)
    (qc,) = made
    # the server's Version Negotiation (to the client's Source Connection ID)
    vn = b"\x80" + bytes(4) + bytes([8]) + scid + bytes([8]) + dcid + (1).to_bytes(4, "big")
    an.on_datagram(20, server, client, vn, 11)
    an.on_datagram(30, client, server, _initial(w.VERSION_1, dcid, scid), 12)
    assert len(made) == 1
    qc.finish(40, "open")
    conn = qc.conn
    assert conn.quic is not None
    assert conn.quic["version"] == "1" and conn.quic["version_negotiation"] == ["1"]
    assert conn.quic["packets"] == {"initial": 2, "version_negotiation": 1}
    assert conn.quic["undecrypted"] == 1  # the v1 Initial (garbage); not the unknown one
    assert (conn.ts_ns, conn.initial_ns, conn.initial_answer_ns) == (10, 10, 20)


def test_unknown_version_initials_keep_the_connection_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from netdiag.protocols import quic

    monkeypatch.setattr(quic, "MAX_CONNECTIONS", 4)
    an, made = _analyzer()
    for i in range(10):
        an.on_datagram(i, f"10.0.0.1:{5000 + i}", "10.0.0.2:443",
                       _initial(0x0A0A0A0A, i.to_bytes(8, "big"), b"s" * 8), i)
    assert len(made) == 4 and an.limits_hit == {"quic_open_connections": 6}


def test_short_headers_matching_no_connection_id_are_warned() -> None:
    client, server = "10.0.0.1:5000", "10.0.0.2:443"
    an, made = _analyzer()
    an.on_datagram(1, client, server, _initial(w.VERSION_1, b"d" * 8, b"c" * 8), 1)
    # a Retry: the server's connection id (its length is how short headers are read)
    retry = (b"\xf0" + (1).to_bytes(4, "big") + b"\x08" + b"c" * 8 + b"\x08" + b"s" * 8
             + b"token" + bytes(16))
    an.on_datagram(2, server, client, retry, 2)
    (qc,) = made
    an.on_datagram(3, client, server, b"\x40" + b"s" * 8 + bytes(40), 3)  # matched
    for i in range(3):  # another client port, connection ids never seen
        an.on_datagram(4 + i, "10.0.0.1:6000", server, b"\x40" + b"n" * 8 + bytes(40), 4)
    an.on_datagram(8, server, "10.0.0.1:6000", b"\x40" + b"m" * 8 + bytes(40), 8)
    # to a QUIC port of a server with no connection seen: counted against it (the
    # pipeline warns of it at the end of the capture)
    an.on_datagram(9, "10.0.0.9:1", "10.0.0.8:443", b"\x40" + b"n" * 8 + bytes(40), 9)
    # neither end on a QUIC port nor a server seen: not counted
    an.on_datagram(10, "10.0.0.9:1", "10.0.0.7:9000", b"\x40" + b"n" * 8 + bytes(40), 10)
    assert an.stray == {server: 4, "10.0.0.8:443": 1} and an.unmatched == 6
    qc.finish(10, "open")
    assert qc.conn.packets == 3 and an.stray == {"10.0.0.8:443": 1}
    assert qc.warnings == [
        "4 QUIC packets to or from 10.0.0.2:443 match no connection id seen (a migration "
        "to a new connection id, invisible without keys, or a connection that started "
        "before the capture)"]


def test_a_capture_that_starts_mid_connection_says_so(tmp_path: Path) -> None:
    """The shipped h3 capture without its first 300 packets (the QUIC handshake): its
    short-header packets match no connection id netdiag saw, so there is no QUIC
    connection, and one warning counts them (every one of them, counted here with dpkt),
    the same with --jobs 2."""
    import json

    import dpkt
    from click.testing import CliRunner

    from netdiag.cli import cli

    shipped = Path(__file__).resolve().parents[2] / "captures" / "h3.pcapng"
    cut = tmp_path / "cut.pcap"
    short = 0
    with open(shipped, "rb") as f, open(cut, "wb") as out:
        reader = dpkt.pcapng.Reader(f)
        writer = dpkt.pcap.Writer(out, linktype=reader.datalink())
        for i, (ts, buf) in enumerate(reader):
            if i < 300:
                continue
            writer.writepkt(buf, ts)
            ip = dpkt.ethernet.Ethernet(buf).data
            udp = getattr(ip, "data", None)
            if isinstance(udp, dpkt.udp.UDP) and 443 in (udp.sport, udp.dport) \
                    and udp.data and not udp.data[0] & 0x80:
                short += 1
    outs = []
    for jobs in ("1", "2"):
        r = CliRunner().invoke(cli, ["report", str(cut), "--format", "json", "--no-profile",
                                     "--jobs", jobs], catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert short > 100 and not [c for c in doc["connections"] if c["transport"] == "udp"]
    quic = [w["message"] for w in doc["capture"]["warnings"] if w["kind"] == "quic"]
    assert quic == [f"{short} QUIC packets to or from 127.0.0.10:443 match no connection id "
                    "seen (a migration to a new connection id, invisible without keys, or a "
                    "connection that started before the capture)"]
