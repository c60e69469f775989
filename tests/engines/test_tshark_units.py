"""The tshark engine's building blocks that need no tshark: JSON reading, times, the TCP
byte map and TLS record framing."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import pytest

from netdiag.engines.tshark import _explicit_nonce, _qname, tshark_document
from netdiag.engines.tsjson import (
    Node,
    TsharkMissing,
    TsharkRun,
    epoch_ns,
    find_all,
    find_first,
    has_key,
    to_int,
)
from netdiag.engines.tsstream import Direction
from netdiag.errors import InputError


def test_epoch_ns_is_exact() -> None:
    assert epoch_ns("1795964430.931777562") == 1795964430931777562
    assert epoch_ns("1362692587.372372000") == 1362692587372372000
    assert epoch_ns("12.5") == 12_500_000_000
    assert epoch_ns("7") == 7_000_000_000


def test_to_int() -> None:
    assert to_int("12") == 12 and to_int("0x0c") == 12 and to_int("0012") == 12
    assert to_int("x") is None and to_int(None) is None


def test_json_packets_keep_duplicate_keys_in_order() -> None:
    text = (b'[\n  {\n    "_index": "p",\n    "_source": {\n      "layers": {\n'
            b'        "frame": {"frame.number": "1"},\n'
            b'        "tls": {"tls.record": {"tls.record.length": "5"}},\n'
            b'        "http2": {"http2.stream": {"http2.type": "1"}},\n'
            b'        "tls": {"tls.record": {"tls.record.length": "7"}},\n'
            b'        "http2": {"http2.stream": {"http2.type": "0"}}\n'
            b'      }\n    }\n  },\n'
            b'  {\n    "_source": {\n      "layers": {\n        "frame": {"frame.number": "2"}'
            b'\n      }\n    }\n  }\n]\n')
    run = TsharkRun("tshark", "x.pcap")
    layers = list(run._packets(io.BytesIO(text)))
    assert len(layers) == 2 and run.packets == 2
    first = layers[0]
    assert [k for k, _ in first] == ["frame", "tls", "http2", "tls", "http2"]
    assert find_all(first, "tls.record.length") == ["5", "7"]
    assert find_all(first, "http2.type") == ["1", "0"]
    assert find_first(layers[1], "frame.number") == "2"
    assert has_key(first, "http2.stream") and not has_key(first, "dns")
    assert isinstance(first.get("frame"), Node) and first.all("tls")[1].get("tls.record")


def test_command_line() -> None:
    run = TsharkRun("/usr/bin/tshark", "c.pcapng", prefs={"tls.keylog_file": "k.log"},
                    decode_as=["udp.port==5353,dns"], extra_args=["-d", "tcp.port==8443,tls"])
    assert run.command[:3] == ["/usr/bin/tshark", "-n", "-2"]
    assert run.command[3:5] == ["-o", "tls.keylog_file:k.log"]
    assert "-d" in run.command and "udp.port==5353,dns" in run.command
    assert run.command[-4:-2] == ["-T", "json"]


def test_missing_tshark_is_an_input_error(tmp_path: Any) -> None:
    cap = tmp_path / "x.pcap"
    cap.write_bytes(b"")
    with pytest.raises(TsharkMissing) as e:
        tshark_document([str(cap)], tshark=str(tmp_path / "no-such-tshark"))
    assert isinstance(e.value, InputError) and "tshark is not installed" in str(e.value)


def test_names() -> None:
    assert _qname("<Root>") == "." and _qname("a.example.") == "a.example"
    assert _explicit_nonce(0x0304, "TLS_AES_128_GCM_SHA256") == 0
    assert _explicit_nonce(0x0303, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384") == 8
    assert _explicit_nonce(0x0303, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256") == 0
    assert _explicit_nonce(0x0303, "TLS_RSA_WITH_AES_128_CBC_SHA") == 16
    assert _explicit_nonce(0x0301, "TLS_RSA_WITH_AES_128_CBC_SHA") == 0
    assert _explicit_nonce(0x0303, "TLS_RSA_WITH_3DES_EDE_CBC_SHA") == 8
    assert _explicit_nonce(0x0303, None) is None


@dataclass(eq=False)
class Seg:
    frame: int
    ts: int
    seq: int | None
    payload: bytes
    records: list[Any] = field(default_factory=list)


def test_direction_maps_bytes_to_their_first_packet() -> None:
    # bytes 1..10 in frame 1, a retransmission of 6..10 plus 11..15 in frame 2 (first
    # transmission wins), 21..25 in frame 3 (16..20 never captured)
    segs = [Seg(1, 100, 1, b"a" * 10), Seg(2, 200, 6, b"b" * 10), Seg(3, 300, 21, b"c" * 5)]
    d = Direction(segs, syn_seen=True)
    assert d.packet_at(1).frame == 1 and d.packet_at(10).frame == 1
    assert d.packet_at(11).frame == 2 and d.packet_at(15).frame == 2
    assert d.packet_at(16) is None and d.packet_at(21).frame == 3
    assert d.first_bytes == 20 and d.lost_bytes == 5
    assert d.data(9, 13) == b"aabb" and d.data(14, 18) is None
    assert d.completed_at(1, 16).frame == 2 and d.completed_at(1, 18) is None


def test_direction_frames_tls_records_against_tshark() -> None:
    rec1 = bytes([22, 3, 3, 0, 4]) + b"ABCD"
    rec2 = bytes([23, 3, 3, 0, 6]) + b"EFGHIJ"
    stream = rec1 + rec2  # 9 + 11 bytes: record 2 spans frames 1 and 2
    n1 = Node([("tls.record.length", "4")])
    n2 = Node([("tls.record.length", "6"), ("tls.record.content_type", "23")])
    segs = [Seg(1, 100, 1, stream[:12], [n1]), Seg(2, 200, 13, stream[12:], [n2])]
    d = Direction(segs, syn_seen=True)
    recs = d.records()
    assert recs is not None and [(r.start, r.length, r.outer_type) for r in recs] == [
        (1, 4, 22), (10, 6, 23)]
    assert recs[1].done.frame == 2 and recs[1].node is n2
    assert d.packet_at(recs[1].start).frame == 1  # its first byte came earlier
    wrong = Direction([Seg(1, 100, 1, stream[:12], [Node([("tls.record.length", "5")])]),
                       Seg(2, 200, 13, stream[12:], [n2])], syn_seen=True)
    assert wrong.records() is None and "tshark [5]" in (wrong.records_why or "")
    not_tls = Direction([Seg(1, 100, 1, b"GET / HTTP/1.1\r\n")], syn_seen=True)
    assert not_tls.records() is None and "no TLS record header" in (not_tls.records_why or "")
