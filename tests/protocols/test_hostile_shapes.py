"""Hostile traffic shapes (issue 11): the analyzers stay linear and their state bounded.

No wall-clock assertion (project rule): linearity is shown by counting work -- scans
of a whole table (through a dict that counts its iterations), pieces of held input
handled, bytes handed to the HPACK decoder, flow-control bookkeeping steps -- and
boundedness by the size of the internal state once a cap is reached (and counted in
``limits_hit``). The normal part of each capture must still be read right.
"""

from __future__ import annotations

import random
import re
import struct
from typing import Any

import pytest
from hpack import Decoder, Encoder

from netdiag._core import is_compiled
from netdiag.flows import defrag as defrag_mod
from netdiag.flows.defrag import FRAGMENT_TIMEOUT_NS, Defragmenter
from netdiag.flows.table import FlowTable
from netdiag.flows.tcp import TcpFlow
from netdiag.protocols import http1 as http1_mod
from netdiag.protocols import http2 as http2_mod
from netdiag.protocols.http1 import Http1Analyzer
from netdiag.protocols.http2 import PREFACE, Http2Analyzer, _decode_block

T0 = 1_764_425_767_000_000_000
MS = 1_000_000


class CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts how often it is walked whole (iteration, keys/values/items) and
    how many entries those walks met (its size at each walk)."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.walks = 0
        self.visited = 0

    def _walk(self) -> None:
        self.walks += 1
        self.visited += len(self)

    def __iter__(self) -> Any:
        self._walk()
        return super().__iter__()

    def keys(self) -> Any:
        self._walk()
        return super().keys()

    def values(self) -> Any:
        self._walk()
        return super().values()

    def items(self) -> Any:
        self._walk()
        return super().items()


# -- HTTP/2 ------------------------------------------------------------------------------

def frame(ftype: int, flags: int, sid: int, body: bytes) -> bytes:
    n = len(body)
    return struct.pack("!HBBBL", n >> 8, n & 255, ftype, flags, sid) + body


def settings(*pairs: tuple[int, int]) -> bytes:
    return frame(4, 0, 0, b"".join(struct.pack("!HL", k, v) for k, v in pairs))


def window_update(sid: int, inc: int) -> bytes:
    return frame(8, 0, sid, struct.pack("!L", inc))


class H2:
    """Feeds an Http2Analyzer frame by frame, each at the next millisecond."""

    def __init__(self) -> None:
        self.a = Http2Analyzer(protocol="h2c")
        self.a._streams = CountingDict()
        self.enc = (Encoder(), Encoder())
        self.t = T0
        self.a.feed(0, self.t, PREFACE + settings(), 1)
        self.a.feed(1, self.t, settings(), 1)

    def send(self, direction: int, data: bytes) -> None:
        self.t += MS
        self.a.feed(direction, self.t, data, 1)

    def request(self, sid: int, end: bool = True) -> None:
        block = self.enc[0].encode([(":method", "GET"), (":path", f"/s{sid}"),
                                    (":authority", "h2.test"), (":scheme", "http")])
        self.send(0, frame(1, 0x4 | (1 if end else 0), sid, block))

    def respond(self, sid: int, body: bytes = b"ok", end: bool = True) -> None:
        block = self.enc[1].encode([(":status", "200")])
        self.send(1, frame(1, 0x4, sid, block) + frame(0, 1 if end else 0, sid, body))

    def fc_work(self) -> int:
        """Flow-control bookkeeping steps charged so far."""
        return self.a._fc_spent


def _streams_and_settings(n: int) -> H2:
    """``n`` streams, three in four answered, a SETTINGS changing INITIAL_WINDOW_SIZE
    every third stream."""
    h = H2()
    for i in range(n):
        sid = 2 * i + 1
        h.request(sid)
        if i % 4:
            h.respond(sid)
        if i % 3 == 2:
            h.send(0, settings((4, 65535 + 1000 * (i % 2))))
    return h


def test_h2_repeated_settings_do_not_walk_the_open_streams() -> None:
    """Thousands of unanswered streams and a window-changing SETTINGS every few streams:
    the work (streams met by walks of the stream table, flow-control steps) grows like
    the streams; every SETTINGS used to walk them all, twice (quadratic: ~330,000 stream
    visits for the 2,000 streams here)."""
    small, big = _streams_and_settings(500), _streams_and_settings(2000)
    assert big.a._streams.visited <= 3 * 2000
    assert big.a._streams.visited <= 5 * small.a._streams.visited  # x4 streams, not x16
    assert big.fc_work() <= 3 * 2000 and big.fc_work() <= 5 * small.fc_work()
    h = big
    h.a.close(h.t)
    n = 2000
    reqs = h.a.requests
    assert len(reqs) == n and not h.a.limits_hit
    assert [r.status for r in reqs[:8]] == [None, 200, 200, 200, None, 200, 200, 200]
    assert all(r.path == f"/s{2 * i + 1}" for i, r in enumerate(reqs))
    h2 = h.a.http2
    assert h2["max_concurrent_streams"] == n // 4 + 1 and h2["flow_control_stalls"] == 0
    assert h2["settings"]["client"]["INITIAL_WINDOW_SIZE"] == 65535 + 1000 * (1997 % 2)


def test_h2_open_streams_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond MAX_OPEN_STREAMS unanswered streams the oldest stop being followed (counted,
    one warning); streams answered on time are still matched."""
    monkeypatch.setattr(http2_mod, "MAX_OPEN_STREAMS", 50)
    h = H2()
    sizes = []
    for i in range(400):
        sid = 2 * i + 1
        h.request(sid)
        if i % 2:
            h.respond(sid, b"x" * i)
        sizes.append(len(h.a._streams))
    assert max(sizes) == 50 and len(h.a._open_order) <= 2 * 50 + 64 + 1
    # From stream 99 on, each answered request finds the 50 unanswered ones open.
    assert h.a.limits_hit == {"http2_open_streams": (400 - 99 + 1) // 2}
    assert sum("no longer followed" in w for w in h.a.warnings) == 1
    h.respond(1)  # a forgotten stream answered late: ignored, not "unmatched"
    h.a.close(h.t)
    reqs = h.a.requests
    assert len(reqs) == 400
    assert all(r.status == 200 and r.response_bytes == i for i, r in enumerate(reqs) if i % 2)
    assert all(r.status is None for i, r in enumerate(reqs) if not i % 2)
    assert h.a.http2["max_concurrent_streams"] == 50 and h.a.http2["unmatched_streams"] == 0


def test_h2_stall_toggling_is_bounded_by_the_bookkeeping_allowance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection window toggled shut and open stalls every pending stream each time:
    past FC_WORK_PER_FRAME steps a frame, flow control is no longer tracked (counted)."""
    monkeypatch.setattr(http2_mod, "FC_WORK_BASE", 2000)
    h = H2()
    for i in range(300):
        h.request(2 * i + 1)
    h.send(1, frame(1, 0x4, 1, h.enc[1].encode([(":status", "200")])))
    h.send(1, frame(0, 0, 1, b"x" * 16000) * 4 + frame(0, 0, 1, b"x" * 1535))  # 65535: shut
    for _ in range(200):
        h.send(0, window_update(0, 1))
        h.send(1, frame(0, 0, 1, b"y"))
    assert h.a.limits_hit == {"http2_flow_control": 1}
    assert not h.a._fc_ok and not h.a._stalled
    assert h.fc_work() <= 2000 + http2_mod.FC_WORK_PER_FRAME * 1000 + 2 * 300
    stalls = h.a.http2["flow_control_stalls"]
    h.send(0, window_update(0, 1))
    h.send(1, frame(0, 0, 1, b"y"))
    assert h.a.http2["flow_control_stalls"] == stalls  # no longer tracked
    assert sum("flow control is no longer tracked" in w for w in h.a.warnings) == 1


def _random_h2(r: random.Random) -> list[tuple[int, int, str, Any]]:
    """Random flow-controlled traffic: (direction, time, "feed"/"gap", bytes/count)."""
    ec, es = Encoder(), Encoder()
    events: list[tuple[int, int, str, Any]] = []
    t = T0

    def emit(d: int, data: bytes, lose: int = 0) -> None:
        nonlocal t
        t += r.choice([0, MS, 5 * MS])
        if lose:
            events.append((d, t, "feed", data[:-lose]))
            events.append((d, t, "gap", lose))
        else:
            events.append((d, t, "feed", data))

    emit(0, PREFACE + settings((4, r.choice([1, 100, 1000, 65535]))))
    emit(1, settings())
    sids: list[int] = []
    for _ in range(r.randint(10, 150)):
        k = r.random()
        if k < 0.3 or not sids:
            sid = 2 * len(sids) + 1
            sids.append(sid)
            block = ec.encode([(":method", "GET"), (":path", f"/{sid}"), (":scheme", "http"),
                               (":authority", "a")])
            emit(0, frame(1, 0x4 | (1 if r.random() < 0.5 else 0), sid, block))
        elif k < 0.4:
            emit(1, frame(1, 0x4, r.choice(sids), es.encode([(":status", "200")])))
        elif k < 0.65:
            n = r.choice([1, 50, 500, 5000])
            lose = r.choice([0] * 6 + [1, 2])
            emit(1, frame(0, 1 if r.random() < 0.15 else 0, r.choice(sids), b"d" * n), lose)
        elif k < 0.8:
            emit(0, window_update(r.choice([*sids, 0, 0]), r.choice([1, 100, 1000, 70000])))
        elif k < 0.9:
            emit(0, settings((4, r.choice([0, 1, 10, 100, 1000, 65535, 200000]))))
        else:
            emit(r.randint(0, 1), frame(3, 0, r.choice(sids), struct.pack("!L", 8)))
    return events


def _run_h2(events: list[tuple[int, int, str, Any]]) -> Http2Analyzer:
    a = Http2Analyzer(protocol="h2c")
    t = T0
    for d, t, kind, x in events:
        if kind == "feed":
            a.feed(d, t, x, 1)
        else:
            a.gap(d, t, x)
    a.close(t + MS)
    return a


def test_h2_stalls_through_the_window_heaps_match_the_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stalls found through the heaps (every connection indexed) are those a scan of
    every stream finds, lost DATA bytes (windows and stalls disagreeing) included."""
    stalls = 0
    for seed in range(250):
        events = _random_h2(random.Random(seed))
        monkeypatch.setattr(http2_mod, "FC_INDEX_OVER", 1 << 30)
        scan = _run_h2(events)
        monkeypatch.setattr(http2_mod, "FC_INDEX_OVER", 0)
        indexed = _run_h2(events)
        assert [vars_of(r) for r in indexed.requests] == [vars_of(r) for r in scan.requests]
        assert indexed.http2 == scan.http2 and indexed.warnings == scan.warnings
        stalls += scan.http2["flow_control_stalls"]
    assert stalls > 500  # the traffic does stall


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def test_hpack_table_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer allowed a 1 MiB table may use up to MAX_HPACK_TABLE; growing beyond makes
    its later headers undecoded (counted once, one warning), not the connection."""
    monkeypatch.setattr(http2_mod, "MAX_HPACK_TABLE", 8192)
    h = H2()
    h.send(1, settings((1, 1 << 20)))  # the server allows the client a 1 MiB table
    h.enc[0].header_table_size = 8192
    h.request(1)
    h.respond(1)
    h.enc[0].header_table_size = 100_000  # beyond the cap: lost from here on
    h.request(3)
    h.request(5)
    h.respond(3)
    h.a.close(h.t)
    r1, r3, r5 = h.a.requests
    assert r1.path == "/s1" and r1.status == 200
    assert r3.path is None and r5.path is None and r3.status == 200
    assert h.a.limits_hit == {"http2_hpack_table": 1}
    assert sum("beyond the 8192 bytes netdiag keeps (it was allowed 1048576)" in w
               for w in h.a.warnings) == 1
    assert h.a.http2["settings"]["server"]["HEADER_TABLE_SIZE"] == 1 << 20
    assert h.a._dirs[0].decoder.max_allowed_table_size == 8192


def test_long_header_blocks_cost_linear_hpack_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """hpack copies the rest of its input at every literal field: a long block goes to it
    in runs of fields, so the bytes it copies grow with the block, not its square."""
    copied = 0
    original = Decoder._decode_literal

    def counting(self: Decoder, data: Any, should_index: bool) -> Any:
        nonlocal copied
        copied += len(data)
        return original(self, data, should_index)

    monkeypatch.setattr(Decoder, "_decode_literal", counting)
    fields = [("x-f", f"{i:04d}") for i in range(4000)]
    block = Encoder().encode(fields, huffman=False)
    got = list(_decode_block(Decoder(max_header_list_size=1 << 20), block))
    assert [(k.decode(), v.decode()) for k, v in got] == fields
    assert copied <= 4000 * (http2_mod.HPACK_PIECE + 64)  # one call copies ~len/2 a field
    assert len(block) * 4000 // 4 > 10 * copied

    # Through the analyzer, as HEADERS + CONTINUATIONs: decoded, timed, one request.
    h = H2()
    h.send(0, frame(1, 0x1, 1, block[:16000]) + frame(9, 0, 1, block[16000:32000])
           + frame(9, 0x4, 1, block[32000:]))
    assert h.a.requests[0].request_headers == fields


def _norm(exc: Exception) -> tuple[str, str]:
    return type(exc).__name__, re.sub(r"<memory at 0x[0-9a-f]+>", "<memory>", str(exc))


def test_decoding_in_runs_is_hpack_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same headers, same table, same exception (type and message) as one hpack call,
    damaged blocks and misplaced table size updates included, at any run length."""
    for piece in (1, 7, 512):
        monkeypatch.setattr(http2_mod, "HPACK_WHOLE", 0)
        monkeypatch.setattr(http2_mod, "HPACK_PIECE", piece)
        for seed in range(150):
            r = random.Random(seed)
            enc = Encoder()
            enc.header_table_size = r.choice([0, 300, 4096])
            limit = r.choice([1 << 20, 2000])
            one, runs = Decoder(max_header_list_size=limit), Decoder(max_header_list_size=limit)
            for _ in range(3):
                hdrs = [(r.choice(["x-a", "cookie", ":path", "x-" + str(r.randint(0, 9))]),
                         "v" * r.randint(0, 200)) for _ in range(r.randint(1, 60))]
                block = bytearray(enc.encode(hdrs, huffman=r.random() < 0.5))
                if r.random() < 0.2:
                    block.insert(r.randint(0, len(block)), 0x20 | r.randint(0, 31))
                if r.random() < 0.2:
                    block[r.randrange(len(block))] = r.randrange(256)
                if r.random() < 0.15:
                    del block[r.randint(0, len(block)):]
                try:
                    want: Any = [tuple(x) for x in one.decode(bytes(block), raw=True)]
                except Exception as exc:
                    want = _norm(exc)
                try:
                    got: Any = [tuple(x) for x in _decode_block(runs, bytes(block))]
                except Exception as exc:
                    got = _norm(exc)
                assert got == want, (piece, seed)
                if isinstance(want, tuple):
                    break
                assert runs.header_table.dynamic_entries == one.header_table.dynamic_entries
                assert runs.max_header_list_size == limit


# -- HTTP/1.1 -------------------------------------------------------------------------------

def _get(i: int, upgrade: bool = False) -> bytes:
    extra = "Connection: Upgrade\r\nUpgrade: websocket\r\n" if upgrade else ""
    return f"GET /r/{i} HTTP/1.1\r\nHost: h1.test\r\n{extra}\r\n".encode()


def test_h1_pipelined_upgrade_requests_hold_each_byte_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined Upgrade requests nobody answers: each release used to re-hold all that
    followed (a hold's worth of bytes per request: quadratic); now only the rest of the
    piece being read goes back, and every request is read (one warning, counted)."""
    monkeypatch.setattr(http1_mod, "MAX_HELD", 2000)
    held = 0
    original = Http1Analyzer._hold

    def counting(self: Http1Analyzer, cli: Any, ts: int, data: bytes, packet: int) -> None:
        nonlocal held
        held += len(data)
        original(self, cli, ts, data, packet)

    monkeypatch.setattr(Http1Analyzer, "_hold", counting)
    a = Http1Analyzer()
    stream = b"".join(_get(i, upgrade=True) for i in range(3000))
    segments = [stream[k:k + 97] for k in range(0, len(stream), 97)]
    for n, seg in enumerate(segments):
        a.feed(0, T0 + n * MS, seg, n + 1)
    a.feed(1, T0 + len(segments) * MS, b"HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n", 99)
    a.close(T0 + (len(segments) + 1) * MS)
    assert held <= 2 * len(stream)  # was about 3,000 x 2,000 bytes: 25 times the stream
    reqs = a.requests
    assert [r.path for r in reqs] == [f"/r/{i}" for i in range(3000)]
    assert reqs[0].status == 400 and all(r.status is None for r in reqs[1:])
    assert a.limits_hit.get("http1_held_bytes", 0) >= 1
    assert sum("after an Upgrade/CONNECT request" in w for w in a.warnings) == 1


def test_h1_pending_requests_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond MAX_PENDING_REQUESTS unanswered requests the oldest stop being followed
    (counted, one warning); responses that come late still match in order."""
    monkeypatch.setattr(http1_mod, "MAX_PENDING_REQUESTS", 100)
    a = Http1Analyzer()
    t = T0
    for i in range(5):  # answered on time
        a.feed(0, t, _get(i), 1)
        a.feed(1, t + MS, f"HTTP/1.1 200 OK\r\nContent-Length: {i}\r\n\r\n".encode()
               + b"x" * i, 2)
        t += 2 * MS
    sizes = []
    for i in range(5, 305):  # 300 pipelined, then their 300 responses
        a.feed(0, t, _get(i), 3)
        sizes.append(len(a._fifo))
        t += MS
    for i in range(5, 305):
        a.feed(1, t, f"HTTP/1.1 201 OK\r\nContent-Length: {i}\r\n\r\n".encode() + b"y" * i, 4)
        t += MS
    a.close(t)
    assert max(sizes) == 100 and a._skip == 0 and not a._fifo
    assert a.limits_hit == {"http1_pending_requests": 200}
    assert sum("no longer followed" in w for w in a.warnings) == 1
    reqs = a.requests
    # the 200 no longer followed are dropped (their responses were read and discarded):
    # a client that pipelines without end holds at most the cap's worth of records
    assert len(reqs) == 105 and len(a._requests) <= 2 * 105 + 1024
    assert all(r.status == 200 and r.response_bytes == i for i, r in enumerate(reqs[:5]))
    assert [r.path for r in reqs[5:]] == [f"/r/{i}" for i in range(205, 305)]
    assert all(r.status == 201 and r.response_bytes == i
               for i, r in enumerate(reqs[5:], start=205))


def test_h1_records_of_requests_no_longer_followed_do_not_pile_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1_mod, "MAX_PENDING_REQUESTS", 100)
    a = Http1Analyzer()
    held = []
    for i in range(20_000):  # pipelined, never answered
        a.feed(0, T0 + i * MS, _get(i), i + 1)
        held.append(len(a._requests))
    assert max(held) <= 2 * 100 + 1024 + 1
    a.close(T0 + 30_000 * MS)
    assert [r.path for r in a.requests] == [f"/r/{i}" for i in range(19_900, 20_000)]
    assert a.limits_hit == {"http1_pending_requests": 19_900}


# -- IP fragments -----------------------------------------------------------------------

def test_incomplete_fragments_never_walk_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tens of thousands of first fragments that never complete: the table stays at
    MAX_PENDING (the oldest dropped, counted) without ever being scanned, expiry works
    from the heap, and the datagrams that do complete in between come out whole."""
    monkeypatch.setattr(defrag_mod, "MAX_PENDING", 500)
    d = Defragmenter()
    d._pending = CountingDict()
    whole = 0
    for i in range(20_000):
        ts = T0 + i * 10_000  # 10 µs apart: nothing times out
        assert d.add(ts, b"src" + bytes([i % 7]), b"dst", i, 17, 0, True, b"a" * 16) is None
        if i % 50 == 0:  # a datagram in two fragments, second first
            data = bytes(range(200)) * 3
            assert d.add(ts, b"dns", b"dst", i, 17, 304, False, data[304:]) is None
            assert d.add(ts, b"dns", b"dst", i, 17, 0, True, data[:304]) == data
            whole += 1
        assert len(d._pending) <= 500
    assert whole == 400 and d._pending.walks == 0
    assert len(d._order) <= 2 * 500 + 64 + 1
    assert d.limits_hit == {"ip_fragments_pending": 20_000 - 500}
    d.expire(T0 + 20_000 * 10_000 + FRAGMENT_TIMEOUT_NS)
    assert len(d._pending) == 0 and d._pending.walks == 0
    assert d.dropped == 20_000 and d.limits_hit == {"ip_fragments_pending": 19_500}


def test_datagram_of_many_fragments_is_assembled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A datagram in 4,000 fragments, in random order: coverage is kept as intervals, the
    sorting reassembly runs once (it ran at every fragment once the last was seen)."""
    if is_compiled(defrag_mod):
        pytest.skip("compiled by mypyc, defrag calls the builtin sorted() directly, so it "
                    "cannot be counted; the pure-Python core run (NETDIAG_CORE=python) does")
    sorts = 0

    def counting_sorted(x: Any) -> Any:
        nonlocal sorts
        sorts += 1
        return sorted(x)

    monkeypatch.setattr(defrag_mod, "sorted", counting_sorted, raising=False)
    data = bytes(random.Random(1).getrandbits(8) for _ in range(32_000))
    order = list(range(4000))
    random.Random(2).shuffle(order)
    order.remove(3999)
    order.insert(0, 3999)  # the last fragment first: the total is known from the start
    d = Defragmenter()
    out = None
    for k in order:
        assert out is None
        out = d.add(T0, b"s", b"d", 9, 17, 8 * k, k != 3999, data[8 * k:8 * k + 8])
    assert out == data and sorts == 1 and not d._pending


def test_held_fragment_bytes_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defrag_mod, "MAX_PENDING_BYTES", 10_000)
    d = Defragmenter()
    for i in range(100):
        d.add(T0 + i, b"s", b"d", i, 17, 0, True, b"z" * 1000)
    assert len(d._pending) == 10 and d._held == 10_000
    assert d.limits_hit == {"ip_fragment_bytes": 90}
    assert sorted(k[2] for k in d._pending) == list(range(90, 100))  # the oldest went


def _udp_frag(src: bytes, dst: bytes, ident: int, frag: int, payload: bytes) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident, frag, 64, 17, 0,
                     src, dst)
    return b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00" + ip + payload


def test_flow_table_reads_fragmented_dns_among_a_flood_of_fragments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the flow table: incomplete fragments fill the table (counted), the
    fragmented port-53 datagrams among them still reach the DNS handler whole."""
    monkeypatch.setattr(defrag_mod, "MAX_PENDING", 200)
    got: list[tuple[int, str, str, bytes, int]] = []

    def decide(flow: TcpFlow, first: bytes) -> None:
        return None

    table = FlowTable(decide, lambda flow: None, lambda *a: got.append(a))
    table.defrag._pending = CountingDict()
    frames = []
    server = bytes((10, 0, 0, 53))
    sent = []
    for i in range(3000):
        src = bytes((10, 1, i >> 8 & 255, i & 255))
        frames.append(_udp_frag(src, server, i, 0x2000,
                                struct.pack("!HHHH", 5000, 9999, 1008, 0) + bytes(992)))
        if i % 100 == 0:
            query = bytes([i & 255]) * 700
            udp = struct.pack("!HHHH", 40000, 53, 8 + len(query), 0) + query
            client = bytes((10, 2, 0, i // 100))
            frames.append(_udp_frag(client, server, i, 0x2000, udp[:504]))
            frames.append(_udp_frag(client, server, i, 504 >> 3, udp[504:]))
            sent.append(query)
    table.scan((T0 + n * 10_000, 1, f, len(f)) for n, f in enumerate(frames))
    assert [a[3] for a in got] == sent
    assert table.defrag._pending.walks == 0 and len(table.defrag._pending) <= 200
    assert table.defrag.limits_hit == {"ip_fragments_pending": 3000 - 200}
