"""HTTP/3 requests estimated from QUIC 1-RTT packet sizes and times, without keys.

The truth is netdiag's own decrypted reading of the same capture (with its keys): the
shipped lab capture ``captures/h3.pcapng`` (24 requests on one connection, two in flight
at a time, a quarter of them streamed) analysed once with the key log it embeds and once
from a copy without its decryption-secrets blocks; and, where root and tcpdump are
available, the live aioquic capture of ``tests/protocols/h3_capture.py``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from netdiag.pipeline import Options, analyze
from netdiag.protocols import quic
from netdiag.records import Connection, Request
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "captures" / "h3.pcapng"
PCAPNG_DSB = 0x0000000A
"""pcapng Decryption Secrets Block."""
PCAPNG_SHB = 0x0A0D0D0A


def strip_secrets(src: Path, dst: Path) -> int:
    """Copy a pcapng without its decryption-secrets blocks; returns how many were left out."""
    data = src.read_bytes()
    out = bytearray()
    p = 0
    order = "<"
    dropped = 0
    while p + 12 <= len(data):
        btype = struct.unpack_from("<I", data, p)[0]
        if btype == PCAPNG_SHB:  # a section: its byte-order magic says its endianness
            order = "<" if data[p + 8:p + 12] == b"\x4d\x3c\x2b\x1a" else ">"
        blen = struct.unpack_from(order + "I", data, p + 4)[0]
        btype = struct.unpack_from(order + "I", data, p)[0]
        assert blen >= 12 and p + blen <= len(data), f"damaged block at {p}"
        if btype == PCAPNG_DSB:
            dropped += 1
        else:
            out += data[p:p + blen]
        p += blen
    dst.write_bytes(bytes(out))
    return dropped


def _quic(paths: list[Path], keylog: KeyLog | None = None) -> list[Connection]:
    sink = CollectingSink()
    analyze([str(p) for p in paths], sink, Options(keylog=keylog))
    return [c for c in sink.connections if c.transport == "udp"]


def _in_their_slots(keyed: Connection, est: list[Request]) -> None:
    """Each true request of a live exchange has an estimate at most 1 ms after it and
    after the one before it was sent (the connection's start for the first). A client's
    packets that a loaded machine spreads out (its control streams, then the request
    several ms later) can read as one request starting at the first: the estimate is
    then early, within the request's slot, never a neighbour's."""
    truth = sorted(keyed.requests, key=lambda r: r.ts_ns)
    since = keyed.ts_ns
    for t in truth:
        assert any(since <= e.ts_ns <= t.ts_ns + 1_000_000 for e in est), (
            t.ts_ns, since, [e.ts_ns for e in est])
        since = t.ts_ns + 1


def _nearest(est: list[Request], t: Request) -> Request:
    """The estimate nearest in time to true request ``t``: how a true request and its
    estimate are paired."""
    return min(est, key=lambda r: abs(r.ts_ns - t.ts_ns))


def _answers_in_their_slots(truth: list[Request], est: list[Request]) -> None:
    """Each true request's nearest estimate (:func:`_nearest`) has its
    first byte at or after its own start and at most 1 ms after the true first byte. A
    loaded machine can make the estimate early (a server packet that answers no request,
    such as a second burst of the handshake's tail, or another request's answer, that
    came after the estimated start: the estimate takes it for the answer), never late:
    the true answer's first packet is a server packet after the request, which the
    estimate would have taken."""
    for t in truth:
        e = _nearest(est, t)
        assert t.first_byte_ns is not None and e.first_byte_ns is not None
        assert e.ts_ns <= e.first_byte_ns <= t.first_byte_ns + 1_000_000, (
            e.ts_ns, e.first_byte_ns, t.ts_ns, t.first_byte_ns)


def _agreement(truth: list[Request], est: list[Request]) -> dict[str, Any]:
    """Per true request, the estimate nearest in time: ts and TTFB differences (ms)."""
    dts, dttfb = [], []
    for t in truth:
        e = _nearest(est, t)
        dts.append((e.ts_ns - t.ts_ns) / 1e6)
        assert t.first_byte_ns is not None
        dttfb.append(None if e.first_byte_ns is None else
                     ((e.first_byte_ns - e.ts_ns) - (t.first_byte_ns - t.ts_ns)) / 1e6)
    return {"true": len(truth), "estimated": len(est), "dts": dts, "dttfb": dttfb}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Connection]]:
    saved = os.environ.pop("SSLKEYLOGFILE", None)
    try:
        copy = tmp_path_factory.mktemp("h3") / "h3-nokeys.pcapng"
        assert strip_secrets(SHIPPED, copy) >= 1
        return {"keyed": _quic([SHIPPED]), "keyless": _quic([copy])}
    finally:
        if saved is not None:
            os.environ["SSLKEYLOGFILE"] = saved


def test_keyless_estimates_match_the_decrypted_requests(
        shipped: dict[str, list[Connection]]) -> None:
    [keyed] = shipped["keyed"]
    [keyless] = shipped["keyless"]
    assert keyed.tls is not None and keyed.tls.decrypted
    assert keyless.tls is not None and not keyless.tls.decrypted
    truth = sorted(keyed.requests, key=lambda r: r.ts_ns)
    est = keyless.requests
    assert len(truth) == 24 and not any(r.estimated for r in truth)  # never both
    assert est and all(r.estimated and r.protocol == "h3" and r.stream_id is None
                       for r in est)
    assert keyless.protocol == "h3"
    a = _agreement(truth, est)
    print(f"h3.pcapng keyless: {a['estimated']} estimated of {a['true']} requests; "
          f"ts diff max {max(map(abs, a['dts'])):.3f} ms; TTFB diff "
          f"{sorted(round(x, 3) for x in a['dttfb'])}")
    assert a["estimated"] == a["true"]  # within 10% is the bar; exact on this capture
    assert max(abs(x) for x in a["dts"]) <= 1.0
    assert None not in a["dttfb"]
    dttfb = [abs(x) for x in a["dttfb"]]
    # concurrent requests answered in one burst: the second's first byte is taken from
    # the first's burst (3 pairs, 2.1 to 3.8 ms early), and one answer 1.8 ms after
    # another response's chunk is taken as its burst (2.6 ms late); the other 20 exact
    assert max(dttfb) <= 5.0
    assert sum(x <= 0.001 for x in dttfb) >= 20
    assert statistics.median(dttfb) <= 0.001
    for r in est:
        assert r.request_bytes and r.request_bytes > 0 and r.end_ns is not None
        assert r.first_byte_ns is not None and r.last_byte_ns is not None
        assert r.ts_ns < r.first_byte_ns <= r.last_byte_ns
        assert r.response_bytes and r.chunks and r.chunks >= 1


def test_keyless_report_json(shipped: dict[str, list[Connection]]) -> None:
    """The estimates go out with the contract's fields, ``estimated: true``."""
    [keyless] = shipped["keyless"]
    out = [r.to_json(keyless.id) for r in keyless.requests]
    assert all(o["estimated"] is True and o["protocol"] == "h3" and o["ttfb_ms"] > 0
               for o in out)
    json.dumps(out)


def _events(seed: int, n: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    ts = 1_700_000_000 * 10**9
    out = []
    for _ in range(n):
        ts += rng.choice((0, 1, 1000, 50_000, 300_000, 1_500_000, 3_000_000, 40_000_000,
                          -2_000_000))  # capture times may go back
        out.append((rng.randrange(2), ts, rng.choice((-17, 0, 7, 8, 15, 19, 21, 25, 39,
                                                      41, 69, 150, 999, 1000, 1175,
                                                      rng.randrange(-50, 70_000)))))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_hostile_sizes_and_times_stay_capped(seed: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quic, "MAX_REQUESTS", 300)
    hits: dict[str, int] = {}
    est = quic._Estimator(hits)
    for d, ts, size in _events(seed, 20_000):
        est.packet(d, ts, size)
        assert len(est.pending) <= quic.EST_MAX_PENDING
    reqs = est.close()
    assert len(reqs) <= 300
    assert hits.get(quic.LIMIT_H3_REQUESTS, 0) > 0
    for r in reqs:
        assert r.estimated and (r.chunk_gaps_ns is None
                                or len(r.chunk_gaps_ns) <= quic.EST_MAX_GAPS)


def test_hostile_one_long_response_keeps_bounded_gaps() -> None:
    est = quic._Estimator({})
    est.packet(0, 0, 200)
    est.packet(1, 1_000_000, 300)  # the handshake tail of the first flight
    est.packet(1, 50_000_000, 300)
    for i in range(5000):  # one streamed answer, a chunk every 3 ms
        est.packet(1, 60_000_000 + 3_000_000 * i, 69)
    [r] = est.close()
    assert r.chunks == 5001 and r.chunk_gaps_ns is not None
    assert len(r.chunk_gaps_ns) == quic.EST_MAX_GAPS


def test_linear_time() -> None:
    events = _events(99, 200_000)
    t0 = time.perf_counter()
    est = quic._Estimator({})
    for d, ts, size in events[:20_000]:
        est.packet(d, ts, size)
    small = time.perf_counter() - t0
    t0 = time.perf_counter()
    est = quic._Estimator({})
    for d, ts, size in events:
        est.packet(d, ts, size)
    est.close()
    big = time.perf_counter() - t0
    assert big < 30 * small + 0.5, (small, big)


def test_first_flight_and_handshake_tail() -> None:
    """The client's first flight (control streams, connection ids) followed by the
    server's tail and a new client request is setup, not a request; a first flight
    answered after the tail is one (a request sent with the Finished)."""
    est = quic._Estimator({})
    for d, ts, size in ((0, 0, 230), (1, 800_000, 207), (0, 1_100_000, 37),
                        (1, 23_000_000, 1175), (1, 23_100_000, 1175)):
        est.packet(d, ts, size)
    [r] = est.close()
    assert (r.ts_ns, r.first_byte_ns, r.last_byte_ns) == (1_100_000, 23_000_000, 23_100_000)
    est = quic._Estimator({})
    for d, ts, size in ((0, 0, 230), (1, 800_000, 207), (1, 30_000_000, 400)):
        est.packet(d, ts, size)
    [r] = est.close()
    assert (r.ts_ns, r.first_byte_ns) == (0, 30_000_000)
    est = quic._Estimator({})  # only the setup flight: no request
    for d, ts, size in ((0, 0, 230), (1, 800_000, 207), (0, 2_000_000, 8)):
        est.packet(d, ts, size)
    assert est.close() == []


def test_a_late_handshake_tail_is_still_the_tail() -> None:
    """A loaded server answered the client's Finished (and first flight) 4.6 ms later,
    beyond two handshake round trips and a burst (a capture beside two CPU burners,
    ``tests/protocols/h3_capture.py``): its HANDSHAKE_DONE packet is still no answer,
    and the request that follows it, 0.2 ms later and small enough to pass for an ACK
    while a response arrives, is the request. Timed by that window, the estimate took
    the tail for the answer to the first flight, 4.8 ms early, and lost the request."""
    est = quic._Estimator({})
    for d, ts, size in ((0, 2_331_000, 230), (1, 6_930_000, 207), (0, 7_132_000, 37),
                        (1, 10_562_000, 10), (0, 10_614_000, 8), (1, 27_931_000, 1175),
                        (1, 27_951_000, 1175), (1, 27_963_000, 698), (0, 29_361_000, 8)):
        est.packet(d, ts, size)
    [r] = est.close()
    assert (r.ts_ns, r.first_byte_ns, r.last_byte_ns) == (7_132_000, 27_931_000, 27_963_000)
    assert r.response_bytes == 1175 + 1175 + 698


def test_zero_rtt_request_and_path_validation() -> None:
    """A request sent as 0-RTT data is timed by its 0-RTT packet (the first 1-RTT flight
    is then the setup, the server's 0.5-RTT data and tail no answer); after a NAT
    rebinding the PATH_CHALLENGE and the padded PATH_RESPONSE are no exchange (the
    packet sizes of ``tests/protocols/quic_scenarios.py``)."""
    ms = 1_000_000
    est = quic._Estimator({})
    for d, ts, size, early in ((0, 0, 39, True), (1, 1 * ms, 771, False),
                               (0, 2 * ms, 1020, False), (1, 3 * ms, 300, False),
                               (1, 22 * ms, 1175, False), (1, 24 * ms, 860, False)):
        est.packet(d, ts, size, early)
    est.path_changed(70 * ms, 6 * ms)
    for d, ts, size in ((0, 70 * ms, 46), (1, 71 * ms, 188), (0, 71 * ms + 200_000, 1175),
                        (1, 91 * ms, 1175), (1, 91 * ms + 60_000, 867)):
        est.packet(d, ts, size)
    a, b = est.close()
    assert (a.ts_ns, a.first_byte_ns, a.last_byte_ns) == (0, 22 * ms, 24 * ms)
    assert (b.ts_ns, b.first_byte_ns, b.last_byte_ns) == (70 * ms, 91 * ms, 91 * ms + 60_000)


def test_a_late_path_challenge_is_still_path_validation() -> None:
    """A loaded server sends its PATH_CHALLENGE to the client's new address later than two
    handshake round trips after the client's packet (4.9 ms against 4.8 ms in a capture
    beside two CPU burners); it is still no answer, and the client's padded
    PATH_RESPONSE right after it no request. Timed by the window alone, the challenge
    answered the request 21 ms early and the response started a request of its own."""
    ms = 1_000_000
    est = quic._Estimator({})
    for d, ts, size in ((0, 2 * ms, 300), (1, 3 * ms, 200), (0, 7 * ms, 46),
                        (1, 31 * ms, 1175), (1, 31 * ms + 10_000, 860)):
        est.packet(d, ts, size)
    est.path_changed(82 * ms, 2 * 1_420_000 + quic.EST_BURST_NS)
    for d, ts, size in ((0, 82 * ms, 46), (1, 82 * ms + 4_870_000, 188),
                        (0, 82 * ms + 5_050_000, 1175), (1, 108 * ms, 1175),
                        (1, 108 * ms + 30_000, 867)):
        est.packet(d, ts, size)
    a, b = est.close()
    assert (a.ts_ns, a.first_byte_ns) == (7 * ms, 31 * ms)
    assert (b.ts_ns, b.first_byte_ns, b.last_byte_ns) == (82 * ms, 108 * ms, 108 * ms + 30_000)


def test_acks_and_flow_control_do_not_start_requests() -> None:
    est = quic._Estimator({})
    est.packet(0, 0, 230)
    est.packet(1, 500_000, 200)
    est.packet(0, 1_000_000, 150)  # the request
    t = 40_000_000
    for i in range(50):  # a download; the client ACKs and opens flow control
        est.packet(1, t + i * 100_000, 1175)
        if i % 5 == 0:
            est.packet(0, t + i * 100_000 + 50_000, 8)
            est.packet(0, t + i * 100_000 + 60_000, 28)
    [r] = est.close()
    assert r.first_byte_ns == t and r.last_byte_ns == t + 49 * 100_000
    assert r.response_bytes == 50 * 1175


# -- the live aioquic capture (tests/protocols/h3_capture.py) ----------------------------

@pytest.mark.slow
def test_live_capture_keyless(tmp_path: Path) -> None:
    """Several requests one after the other on one connection (their headers shrunk by
    QPACK's dynamic table to 21 bytes of payload), one on another: keyless estimates
    against the decrypted requests."""
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed")
    if os.geteuid() != 0:
        pytest.skip("capturing on lo needs root")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "protocols" / "h3_capture.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    if proc.returncode != 0:
        pytest.fail(f"the h3 capture failed: {proc.stderr[-2000:]}")
    pcap = tmp_path / "h3.pcap"
    keyed = _quic([pcap], KeyLog.from_file(str(tmp_path / "h3.keys")))
    keyless = _quic([pcap])
    assert [len(c.requests) for c in keyed] == [4, 1]
    for k, e in zip(keyed, keyless, strict=True):
        assert not any(r.estimated for r in k.requests)
        assert all(r.estimated for r in e.requests)
        a = _agreement(k.requests, e.requests)
        print(f"live {k.client}: {a}")
        assert a["estimated"] == a["true"]
        assert max(abs(x) for x in a["dts"]) <= 1.0
        assert None not in a["dttfb"] and max(abs(x) for x in a["dttfb"]) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["retry", "zero_rtt", "rebinding", "vn_v2"])
def test_live_scenarios_keyless(name: str, tmp_path: Path) -> None:
    """The QUIC scenarios of ``tests/protocols/quic_scenarios.py`` (a Retry, 0-RTT
    requests, a NAT rebinding, Version Negotiation): every request estimated at its own
    time and TTFB. The truth is the decrypted requests, or where netdiag cannot decrypt
    (after a Retry, see ``tests/crosscheck/test_quic_scenarios.py``) the client's record."""
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed")
    if os.geteuid() != 0:
        pytest.skip("capturing on lo needs root")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "protocols" /
                                               "quic_scenarios.py"), name, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    if proc.returncode != 0:
        if "Address already in use" in proc.stderr:
            pytest.skip(f"{name}: its server port is taken")
        pytest.fail(f"the {name} capture failed: {proc.stderr[-2000:]}")
    pcap = tmp_path / f"{name}.pcap"
    keyed = _quic([pcap], KeyLog.from_file(str(tmp_path / f"{name}.keys")))
    keyless = _quic([pcap])
    assert len(keyed) == len(keyless) >= 1
    for k, e in zip(keyed, keyless, strict=True):
        assert all(r.estimated for r in e.requests)
        assert k.tls is not None
        if not k.tls.decrypted:  # netdiag cannot decrypt it: the client's own timers
            assert [r.ts_ns for r in k.requests] == [r.ts_ns for r in e.requests]
            record = json.loads((tmp_path / f"{name}.json").read_text())
            port = int(k.client.rpartition(":")[2])
            [conn] = [c for c in record["connections"] if port in c["local_ports"]]
            assert len(conn["requests"]) == len(e.requests)
            for want, got in zip(conn["requests"], e.requests, strict=True):
                assert got.first_byte_ns is not None
                # the client's clock readings bracket the wire's request and answer
                assert want["sent_ns"] - 200_000 <= got.ts_ns < want["first_ns"]
                assert got.ts_ns < got.first_byte_ns <= want["first_ns"] + 200_000
            continue
        a = _agreement(k.requests, e.requests)
        print(f"{name} {k.client}: {a}")
        # a live exchange's timing is the machine's: on a loaded one a late stream-setup
        # packet reads as one more request and an answer can interleave with another's
        # (two CPU burners: one extra request, one TTFB 13 ms off; on an idle CI run a
        # request estimated 4.7 ms early, at the client's stream setup, took a server
        # packet 27.5 ms before the answer for its first byte); the exact agreement
        # is the fixed capture's (test_keyless_estimates_match_the_decrypted_requests)
        assert a["true"] <= a["estimated"] <= a["true"] + 1
        _in_their_slots(k, e.requests)
        _answers_in_their_slots(k.requests, e.requests)
