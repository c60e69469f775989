"""The analyzer interface the pipeline reads, and the TLS record sink.

- every analyzer the pipeline can pick exposes ``kind``, ``requests``, ``protocol``,
  ``http2``, ``client_random`` and ``warnings`` (``netdiag.protocols.base``), and the
  pipeline fills a connection from them alone, whatever the class;
- a :class:`TlsAnalyzer` given a record sink calls it once per complete record, with
  the record's direction, content type, version, body and first/last-byte times;
- the keyless record walk gives the same results however the segments cut the
  records (every byte boundary of a few segments, and cuts drawn by hypothesis).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.pipeline import CaptureFacts, Options, _Run
from netdiag.protocols.base import AnalyzerKind, StreamAnalyzer
from netdiag.protocols.dns import DnsAnalyzer
from netdiag.protocols.http1 import Http1Analyzer
from netdiag.protocols.http2 import Http2Analyzer
from netdiag.protocols.resp import RespAnalyzer
from netdiag.protocols.tls import Pieces, TlsAnalyzer
from netdiag.protocols.tls_decrypt import DecryptingTlsAnalyzer
from netdiag.records import Connection, DnsTransaction, Request
from netdiag.tls.keylog import KeyLog

MS = 1_000_000
CLIENT_RANDOM = bytes(range(32))

# ---------------------------------------------------------------------------------
# Hand-built TLS records
# ---------------------------------------------------------------------------------


def record(ctype: int, body: bytes, version: int = 0x0303) -> bytes:
    return struct.pack("!BHH", ctype, version, len(body)) + body


def handshake(mtype: int, body: bytes) -> bytes:
    return bytes([mtype]) + len(body).to_bytes(3, "big") + body


def vec8(data: bytes) -> bytes:
    return bytes([len(data)]) + data


def vec16(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def ext(etype: int, data: bytes) -> bytes:
    return struct.pack("!HH", etype, len(data)) + data


def alpn_ext(protocols: list[str]) -> bytes:
    return ext(16, vec16(b"".join(vec8(p.encode()) for p in protocols)))


def client_hello(alpn: list[str] | None = None) -> bytes:
    exts = ext(0, vec16(b"\x00" + vec16(b"api.example.test")))
    if alpn:
        exts += alpn_ext(alpn)
    body = (b"\x03\x03" + CLIENT_RANDOM + vec8(b"") + vec16(b"\x13\x01\xc0\x2f")
            + vec8(b"\x00") + vec16(exts))
    return handshake(1, body)


def server_hello(cipher: int, version: int | None, alpn: str | None = None) -> bytes:
    exts = b""
    if version is not None:
        exts += ext(43, struct.pack("!H", version))
    if alpn is not None:
        exts += alpn_ext([alpn])
    body = b"\x03\x03" + b"\x11" * 32 + vec8(b"") + struct.pack("!HB", cipher, 0) + vec16(exts)
    return handshake(2, body)


def filler(n: int, seed: int) -> bytes:
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


Burst = tuple[int, list[bytes]]
"""One flight of one direction: (direction, its records)."""


def tls13_conversation() -> list[Burst]:
    """A TLS 1.3 handshake, then requests and responses of several record sizes."""
    return [
        (0, [record(22, client_hello(["h2", "http/1.1"]), version=0x0301)]),
        (1, [record(22, server_hello(0x1301, 0x0304)), record(20, b"\x01"),
             record(23, filler(900, 1)), record(23, filler(60, 2))]),
        (0, [record(20, b"\x01"), record(23, filler(53, 3)), record(23, filler(120, 4))]),
        (1, [record(23, filler(300, 5)), record(23, filler(1400, 6)), record(23, filler(40, 7))]),
        (0, [record(23, filler(90, 8))]),
        (1, [record(23, filler(2100, 9)), record(23, filler(17 + 9, 10)),
             record(21, filler(19, 11))]),
    ]


def tls12_conversation() -> list[Burst]:
    """A full TLS 1.2 handshake (AES-GCM), then two exchanges and a close_notify."""
    return [
        (0, [record(22, client_hello(["http/1.1"]), version=0x0301)]),
        (1, [record(22, server_hello(0xC02F, None, "http/1.1")
                    + handshake(11, filler(700, 12)) + handshake(14, b""))]),
        (0, [record(22, handshake(16, filler(33, 13))), record(20, b"\x01"),
             record(22, filler(40, 14))]),
        (1, [record(22, handshake(4, filler(90, 15))), record(20, b"\x01"),
             record(22, filler(40, 16))]),
        (0, [record(23, filler(150, 17))]),
        (1, [record(23, filler(1200, 18)), record(23, filler(300, 19))]),
        (0, [record(23, filler(110, 20))]),
        (1, [record(23, filler(640, 21))]),
        (0, [record(21, filler(26, 22))]),
    ]


# ---------------------------------------------------------------------------------
# A record sink that keeps what it is told
# ---------------------------------------------------------------------------------


@dataclass
class Event:
    direction: int
    ctype: int
    version: int
    fragment: bytes | None
    first_ts: int
    last_ts: int
    first_packet: int
    pieces: Pieces | None


@dataclass
class Sink:
    events: list[Event] = field(default_factory=list)

    def __call__(self, direction: int, content_type: int, version: int,
                 fragment: bytearray | None, first_ts_ns: int, last_ts_ns: int,
                 first_packet: int, pieces: Pieces | None) -> None:
        self.events.append(Event(direction, content_type, version,
                                 None if fragment is None else bytes(fragment),
                                 first_ts_ns, last_ts_ns, first_packet,
                                 None if pieces is None else list(pieces)))


@dataclass
class Sent:
    """What a test fed: each record with the (ts, packet) of its first and last byte."""

    direction: int
    ctype: int
    version: int
    body: bytes
    first: tuple[int, int]
    last_ts: int


def play(an: StreamAnalyzer, bursts: list[Burst], cuts: list[list[int]] | None = None,
         close: bool = True) -> list[Sent]:
    """Feed ``bursts``; burst k is one segment, or cut at ``cuts[k]`` (offsets into the
    burst). Each segment has its own time (1 ms apart) and packet number."""
    ts = pkt = 0
    sent: list[Sent] = []
    for k, (direction, records) in enumerate(bursts):
        data = b"".join(records)
        points = sorted({c for c in (cuts[k] if cuts else []) if 0 < c < len(data)})
        bounds = [0, *points, len(data)]
        seg_at: list[tuple[int, int]] = []  # (ts, pkt) of each byte
        for a, b in itertools.pairwise(bounds):
            ts += MS
            pkt += 1
            an.feed(direction, ts, data[a:b], pkt)
            seg_at.extend([(ts, pkt)] * (b - a))
        pos = 0
        for rec in records:
            sent.append(Sent(direction, rec[0], (rec[1] << 8) | rec[2], rec[5:],
                             seg_at[pos], seg_at[pos + len(rec) - 1][0]))
            pos += len(rec)
    if close:
        an.close(ts + MS)
    return sent


# ---------------------------------------------------------------------------------
# Every analyzer kind
# ---------------------------------------------------------------------------------


def _interface(an: Any) -> tuple[AnalyzerKind, list[Request], str | None,
                                 dict[str, Any] | None, bytes | None, list[str]]:
    return an.kind, an.requests, an.protocol, an.http2, an.client_random, an.warnings


def test_every_analyzer_kind_exposes_the_interface() -> None:
    dns = DnsAnalyzer(lambda t: None)
    cases: list[tuple[Any, AnalyzerKind, str | None, bool]] = [
        (TlsAnalyzer(), "tls", None, False),
        (DecryptingTlsAnalyzer(KeyLog(), lambda alpn, first: None), "tls", None, False),
        (Http1Analyzer(), "http", "http/1.1", False),
        (Http1Analyzer(tls=True), "http", "http/1.1", False),
        (Http2Analyzer(protocol="h2c"), "http", "h2c", True),
        (Http2Analyzer(protocol="h2"), "http", "h2", True),
        (RespAnalyzer(), "resp", "resp", False),
        (dns.tcp_stream("10.0.0.1:5353", "10.0.0.2:53"), "dns", None, False),
    ]
    for an, kind, protocol, has_http2 in cases:
        got_kind, requests, got_protocol, http2, random, warnings = _interface(an)
        assert got_kind == kind, an
        assert requests == [] and isinstance(requests, list), an
        assert got_protocol == protocol, an
        assert (http2 is not None) == has_http2, an
        if http2 is not None:
            assert set(http2["frames"]) == {"client", "server"}
        assert random is None, an
        assert warnings == [], an


def test_tls_analyzers_report_alpn_and_client_random() -> None:
    bursts = tls13_conversation()
    bursts[1][1][0] = record(22, server_hello(0x1301, 0x0304, alpn="h2"))
    keyless = TlsAnalyzer()
    play(keyless, bursts)
    keyed = DecryptingTlsAnalyzer(KeyLog(), lambda alpn, first: None)
    play(keyed, bursts)
    for an in (keyless, keyed):
        assert an.kind == "tls"
        assert an.client_random == CLIENT_RANDOM
        assert an.protocol == "h2"
        assert an.http2 is None
        assert an.requests and all(r.estimated for r in an.requests)
    assert keyed.requests == keyless.requests
    assert keyed.info.to_json() == keyless.info.to_json()


def test_decrypting_analyzer_is_composed_and_lets_go_of_the_walk() -> None:
    an = DecryptingTlsAnalyzer(KeyLog(), lambda alpn, first: None)
    assert not isinstance(an, TlsAnalyzer)
    assert an.tls.record_sink is not None and an.tls.keep_bodies
    bursts = tls13_conversation()
    play(an, bursts[:2], close=False)
    # No key for this ClientHello: from the ServerHello on it costs what a keyless one does.
    assert an.tls.record_sink is None and not an.tls.keep_bodies
    assert an.app is None and an.exact_requests == []
    an.close(10**12)
    assert an.tls.closed


class _Flow:
    def __init__(self, conn: Connection, analyzer: Any) -> None:
        self.conn = conn
        self.analyzer = analyzer
        self.failure: str | None = None


class _Collect:
    def __init__(self) -> None:
        self.connections: list[Connection] = []

    def dns(self, t: DnsTransaction) -> None:
        pass

    def connection(self, c: Connection) -> None:
        self.connections.append(c)


class _Duck:
    """Not one of netdiag's classes: the pipeline must read it through the interface."""

    kind: AnalyzerKind = "resp"
    client_random = b"\x07" * 32

    def __init__(self) -> None:
        self.requests = [Request(ts_ns=5, method="GET")]
        self.protocol: str | None = "something/2"
        self.http2: dict[str, Any] | None = {"max_concurrent_streams": 3}
        self.warnings = ["odd bytes"]
        self.limits_hit = {"http2_open_streams": 2}

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        pass

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        pass

    def close(self, ts_ns: int) -> None:
        pass


def test_pipeline_fills_a_connection_from_the_interface_alone() -> None:
    sink = _Collect()
    run = _Run(sink, Options(), CaptureFacts(), [])
    conn = Connection(id="C1", ts_ns=0, client="10.0.0.1:40000", server="10.0.0.2:443",
                      protocol="tls")
    duck = _Duck()
    run._on_connection(_Flow(conn, duck))  # type: ignore[arg-type]
    assert sink.connections == [conn]
    assert conn.requests == duck.requests
    assert conn.protocol == "something/2"
    assert conn.http2 == {"max_concurrent_streams": 3}
    assert run.client_randoms == {b"\x07" * 32}
    assert run.limits.hit == {"http2_open_streams": 2}
    assert [(w.kind, w.message) for w in run.facts.warnings] == [
        ("resp", "C1 10.0.0.1:40000 -> 10.0.0.2:443: odd bytes")]
    # protocol None keeps what the decision said
    duck2 = _Duck()
    duck2.protocol = None
    conn2 = Connection(id="C2", ts_ns=0, client="a:1", server="b:2", protocol="dns")
    run._on_connection(_Flow(conn2, duck2))  # type: ignore[arg-type]
    assert conn2.protocol == "dns"


# ---------------------------------------------------------------------------------
# The record sink
# ---------------------------------------------------------------------------------


def _check_events(events: list[Event], sent: list[Sent], bodies: bool) -> None:
    assert len(events) == len(sent)  # each record once
    for ev, s in zip(events, sent, strict=True):
        assert (ev.direction, ev.ctype, ev.version) == (s.direction, s.ctype, s.version)
        assert (ev.first_ts, ev.first_packet) == s.first
        assert ev.last_ts == s.last_ts
        if bodies:
            assert ev.fragment == s.body
            assert ev.pieces is not None and ev.pieces[0][0] == 0
            offsets = [p[0] for p in ev.pieces]
            assert offsets == sorted(set(offsets)) and offsets[-1] < max(len(s.body), 1)
        elif ev.fragment is not None:
            assert ev.fragment == s.body and ev.ctype in (21, 22)


def test_record_sink_sees_each_record_once_with_its_times() -> None:
    for bursts in (tls13_conversation(), tls12_conversation()):
        for cuts in (None, [[7, 300, 301]] * len(bursts), [list(range(1, 5000, 97))] * 9):
            sink = Sink()
            an = TlsAnalyzer(record_sink=sink)
            sent = play(an, bursts, cuts)
            _check_events(sink.events, sent, bodies=False)
            # Without keep_bodies only parsed records are collected: no application data.
            assert all(e.fragment is None for e in sink.events if e.ctype == 23)
            assert all(e.fragment is not None for e in sink.events[:2])  # the hellos
            assert an.warnings == []


def test_record_sink_with_bodies_gets_every_body_and_its_pieces() -> None:
    for bursts in (tls13_conversation(), tls12_conversation()):
        for cuts in (None, [[1, 2, 3, 600, 1000]] * len(bursts)):
            sink = Sink()
            an = TlsAnalyzer(record_sink=sink)
            an.keep_bodies = True
            sent = play(an, bursts, cuts)
            _check_events(sink.events, sent, bodies=True)


def test_record_sink_pieces_follow_the_segments() -> None:
    sink = Sink()
    an = TlsAnalyzer(record_sink=sink)
    an.keep_bodies = True
    body = filler(2500, 3)
    rec = record(23, body)
    an.feed(1, 10, rec[:1000], 1)
    an.feed(1, 20, rec[1000:2000], 2)
    an.feed(1, 30, rec[2000:], 3)
    (ev,) = sink.events
    assert ev.fragment == body
    assert ev.pieces == [(0, 10, 1), (995, 20, 2), (1995, 30, 3)]
    assert (ev.first_ts, ev.last_ts, ev.first_packet) == (10, 30, 1)


def test_record_sink_can_detach_itself() -> None:
    bursts = tls13_conversation()
    seen: list[int] = []
    an = TlsAnalyzer()

    def once(direction: int, content_type: int, version: int, fragment: bytearray | None,
             first_ts_ns: int, last_ts_ns: int, first_packet: int,
             pieces: Pieces | None) -> None:
        seen.append(content_type)
        an.record_sink = None

    an.record_sink = once
    play(an, bursts)
    assert seen == [22]
    reference = TlsAnalyzer()
    play(reference, bursts)
    assert an.requests == reference.requests
    assert an.info.to_json() == reference.info.to_json()


# ---------------------------------------------------------------------------------
# The keyless walk does not depend on where segments cut the records
# ---------------------------------------------------------------------------------


def _result(an: TlsAnalyzer, sink: Sink) -> tuple[Any, ...]:
    return (an.info.to_json(), [r.to_json() for r in an.requests], list(an.warnings),
            [(e.direction, e.ctype, e.version, e.fragment, e.first_ts, e.last_ts,
              e.first_packet) for e in sink.events])


def play_same_times(an: TlsAnalyzer, bursts: list[Burst], cuts: list[list[int]],
                    keep_bodies: bool = False) -> None:
    """Like :func:`play`, but every segment of a burst has the burst's time and packet,
    so that where the burst is cut cannot change any result."""
    an.keep_bodies = keep_bodies
    ts = 0
    for k, (direction, records) in enumerate(bursts):
        data = b"".join(records)
        ts += MS
        points = sorted({c for c in cuts[k] if 0 < c < len(data)}) if k < len(cuts) else []
        bounds = [0, *points, len(data)]
        for a, b in itertools.pairwise(bounds):
            an.feed(direction, ts, data[a:b], k + 1)
    an.close(ts + MS)


def _walk_result(bursts: list[Burst], cuts: list[list[int]],
                 keep_bodies: bool = False) -> tuple[Any, ...]:
    sink = Sink()
    an = TlsAnalyzer(record_sink=sink)
    play_same_times(an, bursts, cuts, keep_bodies)
    return _result(an, sink)


def test_walk_is_the_same_cut_at_every_byte_boundary() -> None:
    for bursts in (tls13_conversation(), tls12_conversation()):
        whole = _walk_result(bursts, [])
        assert whole[1], "the conversation infers requests"
        for k, (_, records) in enumerate(bursts):
            size = sum(len(r) for r in records)
            if size > 1600:
                continue  # every boundary of the smaller bursts; the large ones below
            one_byte: list[list[int]] = [[]] * k + [list(range(1, size))]
            assert _walk_result(bursts, one_byte) == whole
            for cut in range(1, size):
                assert _walk_result(bursts, [[]] * k + [[cut]]) == whole, (k, cut)
        # every burst in 1-byte segments at once, with and without bodies
        tiny = [list(range(1, sum(len(r) for r in recs))) for _, recs in bursts]
        assert _walk_result(bursts, tiny) == whole
        assert _walk_result(bursts, tiny, keep_bodies=True)[:3] == whole[:3]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), tls13=st.booleans(), keep_bodies=st.booleans())
def test_walk_is_the_same_however_the_segments_cut(data: st.DataObject, tls13: bool,
                                                    keep_bodies: bool) -> None:
    bursts = tls13_conversation() if tls13 else tls12_conversation()
    cuts = [data.draw(st.lists(st.integers(1, sum(len(r) for r in recs) - 1), max_size=12))
            for _, recs in bursts]
    whole = _walk_result(bursts, [], keep_bodies)
    assert _walk_result(bursts, cuts, keep_bodies) == whole
