"""The issue's demand: "its own timers and the capture's view of the same requests
must agree".

The probe runs against the loopback lab while ``lo`` is captured (the
``LoopbackCapture`` of captures/make_antho.py, run in the lab process: kernel
nanosecond timestamps, pcapng), with the probe's own key log; netdiag's pipeline
then reads the capture with that key log, and every request, connection and DNS
transaction is compared: same counts, same endpoints, stream ids, statuses, TLS
versions and ciphers, DNS ids and answers, and the timings below. Two independent
measurements check netdiag's view of the wire, each of the same thing:

* **tshark's frame times of the same packets** (tests/crosscheck/hops_ref.py, when
  tshark is installed): every request's first request byte, first and last response
  byte, every connection's SYN, handshake ACK, ClientHello and Finished, every DNS
  query and answer must be the packets tshark finds, within ``WIRE_TOL_MS`` (they
  agree to the nanosecond). This is exact whatever the host's load: a packet's
  timestamp does not depend on who reads it.
* **The probe's own timers** (differences are probe minus capture):

  - Containment (strict, never retried): the probe stamps a request just before
    handing it to the kernel and an answer just after ``recv()`` returns it, so every
    probe span contains the wire span it corresponds to: every duration difference
    is >= 0, "request sent" is not after the request packet and "first byte" not
    before the response packet. ``SLACK_MS`` (0.05 ms) only absorbs clock-read
    granularity. A wrong packet or frame *earlier* than the right one (the server's
    SETTINGS, an earlier response) breaks this; a later one (the DATA frame after
    the HEADERS) is what the frame-clock unit test in test_probe_units.py covers, and
    the tshark comparison above catches on netdiag's side.
  - Agreement: what the wire does not see is user-space time -- the kernel's
    hand-over, a thread wake-up, OpenSSL's record work, the interpreter: 0.05-0.4 ms
    on an idle loopback. The *median* difference per phase must be under half of
    ``TOL_MS`` (2 ms, the issue's figure: a tenth of the 20 ms think time measured);
    for TLS and DNS of ``TOL_EXTRA_MS`` (3 ms), because the TLS timer also covers
    building the ClientHello and verifying the certificate chain, and the DNS probe's
    timer dnspython building the query and parsing the answer (over TCP the length
    prefix and the message are two waits; the HTTP probes' lookups are stamped at the
    query's send and the answer's ``recv()``, netdiag/probe/stamped_dns.py). A probe
    that systematically measures more than the wire by over 1 ms (1.5 ms) fails it.
    On the VMs of this project an idle vCPU wakes in 0.5-1 ms and Python work after a
    wait runs slow: a probe that parsed before reading on (``h2`` on a HEADERS frame,
    the resolver around its query) was 1-2 ms over the wire and failed here.
  - Load: these tests run on shared 2-core VMs. When every core is busy the moment a
    packet arrives, the woken probe waits for a core before ``recv()`` returns: with
    two CPU burners beside the test, 3-9 ms in 2 to 7 of 10 comparisons of a run
    (the scheduler lets the running burner finish its slice), once 28 ms under other
    suites. That is the host's load, not the probe's timing, and it only ever *adds*
    to the probe's span. So: the probe measures at a low real-time priority
    (:func:`_realtime`, SCHED_FIFO 10, as the lab's servers run), which makes it run
    as soon as its answer arrives whatever else the VM runs (with two or four burners
    the differences stay those of an idle host: under 1 ms); the TLS handshake is
    measured on ``RUNS`` x 5 fresh connections rather than 5. What remains is the
    hypervisor stealing the vCPU (2-6 ms in up to one comparison in ten): so at least
    ``SHARE_WITHIN`` (80 %) of a phase's differences must be under its tolerance,
    every one under ``HARD_MAX_MS`` (not absurd), and an attempt that fails *only* on
    these magnitudes is run again, up to ``ATTEMPTS`` times. A real disagreement
    fails every attempt; counts, identities, containment and the tshark comparison
    fail at once.

Every attempt's figures are printed (``-s`` shows them) and kept in ``AGREEMENT``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netdiag.probe.dns import run_dns_probe
from netdiag.probe.http import run_http_probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crosscheck"))

from hops_ref import WireReference, compare_requests, wire_reference
from tshark_ref import tshark_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                       reason="capturing on lo needs root on Linux"),
]

SLACK_MS = 0.05
TOL_MS = 2.0
TOL_EXTRA_MS = 3.0
HARD_MAX_MS = 50.0
SHARE_WITHIN = 0.8
WIRE_TOL_MS = 0.05
"""netdiag against tshark, the same packets."""
RT_PRIORITY = 10
"""SCHED_FIFO priority of the probe while it measures (netdiag/lab/serve.py's)."""
ATTEMPTS = 3
RUNS = 5
"""Probe runs per capture: with reuse, five samples of every connection-level phase;
without (TLS 1.2), five runs of five fresh connections."""
AGREEMENT: dict[str, dict[str, float]] = {}


class TooFar(AssertionError):
    """A difference over its tolerance, the containment holding: worth another attempt."""


def _agree(name: str, diffs: list[float], *, sign: int, tol: float = TOL_MS) -> None:
    """``diffs``: probe minus capture, ms; ``sign`` +1: the probe span must contain
    the wire's (probe >= capture), -1: the probe stamp must come first."""
    if not diffs:
        return
    mags = sorted(abs(d) for d in diffs)
    rec = AGREEMENT.setdefault(name, {"n": 0, "max": 0.0, "worst_median": 0.0})
    rec["n"] += len(diffs)
    rec["max"] = max(rec["max"], mags[-1])
    rec["worst_median"] = max(rec["worst_median"], mags[len(mags) // 2])
    print(f"probe vs capture, {name}: n={len(diffs)} median |diff| "
          f"{mags[len(mags) // 2]:.3f} ms, max {mags[-1]:.3f} ms, signed range "
          f"[{min(diffs):.3f}, {max(diffs):.3f}]")
    shown = [round(d, 3) for d in diffs]
    assert all(sign * d >= -SLACK_MS for d in diffs), f"{name}: containment broken {shown}"
    over = sum(1 for m in mags if m > tol)
    median = mags[len(mags) // 2] if len(mags) % 2 else (mags[len(mags) // 2 - 1]
                                                         + mags[len(mags) // 2]) / 2
    if median > tol / 2 or over > len(mags) - SHARE_WITHIN * len(mags) + 1e-9 \
            or mags[-1] > HARD_MAX_MS:
        raise TooFar(f"{name}: median {median:.3f} ms (at most {tol / 2} ms), {over} of "
                     f"{len(mags)} over {tol} ms (at most {1 - SHARE_WITHIN:.0%}), max "
                     f"{mags[-1]:.3f} ms (at most {HARD_MAX_MS} ms) in {shown}")


def _attempts(check: Callable[[int], None]) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            check(attempt)
            return
        except TooFar as exc:
            if attempt == ATTEMPTS:
                raise
            print(f"attempt {attempt}: {exc}; the host was busy? trying again")


@contextlib.contextmanager
def _realtime() -> Iterator[None]:
    """This thread at a low real-time priority while the body runs (root), so that a
    packet's arrival wakes the probe at once instead of after a busy core's time slice;
    unchanged where that is not permitted."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except (AttributeError, OSError):
        policy = param = None
    try:
        yield
    finally:
        if policy is not None and param is not None:
            os.sched_setscheduler(0, policy, param)


def _capture(lab: Any, tmp: Path, run: Callable[[Path], Any]) -> tuple[Any, Any, Any]:
    """Run ``run(keylog)`` while the lab captures lo; return (its result, the lab's
    HTTPS connections with TLS or requests, its DNS transactions), in time order.

    Only this lab's endpoints are kept: the capture filters by address, and another
    test run may be using the same 127.0.0.x addresses on other ports. netdiag's
    records are checked against tshark's reading of the same capture first
    (:func:`_check_wire`).
    """
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    tmp.mkdir(parents=True, exist_ok=True)
    pcap, keylog = tmp / "probe.pcapng", tmp / "probe.keys"
    keylog.write_text("")
    with lab.capture(pcap), _realtime():
        result = run(keylog)
    sink = CollectingSink()
    keys = KeyLog.from_file(keylog) if keylog.stat().st_size else None
    dns_servers = {lab.dns_slow, lab.dns_fast}
    dns_ports = frozenset({53, *(int(s.rsplit(":", 1)[1]) for s in dns_servers)})
    analyze([str(pcap)], sink, Options(dns_ports=dns_ports, keylog=keys))
    conns = sorted((c for c in sink.connections
                    if c.server in (lab.h2, lab.tls12) and (c.requests or c.tls is not None)),
                   key=lambda c: c.ts_ns)
    dns = sorted((t for t in sink.dns_records if t.server in dns_servers),
                 key=lambda t: t.ts_ns)
    if tshark_path() is not None:
        wire = wire_reference(pcap, keylog if keylog.stat().st_size else None,
                              dns_ports=sorted(dns_ports))
        _check_wire(wire, conns, dns)
    return result, conns, dns


def _check_wire(wire: WireReference, conns: list[Any], dns: list[Any]) -> None:
    """netdiag's records against tshark's frame times of the same packets."""
    tol = round(WIRE_TOL_MS * 1e6)
    problems = compare_requests(wire, conns, tol_ns=tol)
    for c in conns:
        w = wire.by_conn.get((c.client, c.server))
        if w is None:
            problems.append(f"{c.id} {c.client} -> {c.server}: not seen by tshark")
        elif len(w.requests) != len(c.requests):
            mine = ", ".join(f"sid={r.stream_id} {r.method} {r.path} estimated={r.estimated}"
                             for r in c.requests)
            theirs = ", ".join(r.describe() for r in w.requests)
            problems.append(f"{c.id} {c.client} -> {c.server} (tcp.stream {w.tcp_stream}, "
                            f"decrypted by netdiag: {c.tls is not None and c.tls.decrypted}): "
                            f"netdiag {len(c.requests)} requests [{mine}], tshark "
                            f"{len(w.requests)} [{theirs}]")
    if problems:
        raise AssertionError(f"netdiag and tshark disagree on {wire.capture}:\n"
                             + "\n".join(problems))

    def far(a: int | None, b: int | None) -> bool:
        return a is None or b is None or abs(a - b) > tol

    for c in conns:
        w = wire.by_conn[(c.client, c.server)]
        pairs = [("syn", c.syn_ns, w.syn_ns), ("handshake ack", c.handshake_ack_ns,
                                                w.handshake_ack_ns)]
        if c.tls is not None or w.tls is not None:
            assert c.tls is not None and w.tls is not None, (c.id, c.tls, w.tls)
            assert c.tls.version == w.tls.version, (c.id, c.tls.version, w.tls.version)
            pairs += [("ClientHello", c.tls.client_hello_ns, w.tls.client_hello_ns),
                      ("Finished", c.tls.finished_ns, w.tls.finished_ns)]
        problems += [f"{c.id} {c.client} -> {c.server}: {name} netdiag {a} vs tshark {b}"
                     for name, a, b in pairs if far(a, b)]
    ref = {d.key: d for d in wire.dns}
    for t in dns:
        d = ref.get((t.client, t.server, t.transport, t.id, t.qname))
        if d is None:
            problems.append(f"DNS {t.client} -> {t.server} id {t.id}: not seen by tshark")
        elif far(t.ts_ns, d.query_ns) or far(t.response_ts_ns, d.response_ns):
            problems.append(f"DNS {t.client} -> {t.server} id {t.id}: netdiag "
                            f"{t.ts_ns}..{t.response_ts_ns} vs tshark {d.query_ns}.."
                            f"{d.response_ns}")
    assert not problems, f"netdiag and tshark disagree on {wire.capture}:\n" + "\n".join(
        problems)


def _check_http(results: list[Any], conns: list[Any], dns: list[Any], *,
                tls_name: str) -> None:
    """Every request, connection and lookup of ``results`` (probe runs made one after
    the other) against the capture's records of them."""
    reqs = [r for res in results for r in res.requests]
    assert all(r.ok for r in reqs), [r.error for r in reqs]
    # the same connections, matched by the probe's local endpoint
    probe_conns = {r.local for r in reqs}
    assert len(conns) == len(probe_conns) == sum(res.connections for res in results)
    assert {c.client for c in conns} == probe_conns
    cap_reqs = sorted(((c, q) for c in conns for q in c.requests), key=lambda cq: cq[1].ts_ns)
    assert len(cap_reqs) == len(reqs)
    d_ttfb, d_ttlb, d_req, d_fb, d_conn, d_tls, d_dns = [], [], [], [], [], [], []
    for r, (c, q) in zip(reqs, cap_reqs, strict=True):
        assert c.client == r.local and c.server == r.remote
        assert q.status == r.status == 200
        assert not q.estimated
        if r.stream_id is not None:
            assert q.stream_id == r.stream_id
        ph = r.phases_ms()
        d_ttfb.append(ph["ttfb"] - (q.first_byte_ns - q.ts_ns) / 1e6)
        d_ttlb.append(ph["ttfb"] + ph["transfer"] - (q.last_byte_ns - q.ts_ns) / 1e6)
        # absolute: the probe's epoch stamps against the packets' timestamps
        d_req.append((r.epoch_ns("request") - q.ts_ns) / 1e6)
        d_fb.append((r.epoch_ns("first_byte") - q.first_byte_ns) / 1e6)
        if not r.reused:
            assert c.tls is not None and c.tls.version == r.tls_version == tls_name
            assert c.tls.cipher == r.cipher and c.tls.decrypted
            d_conn.append(ph["connect"] - (c.handshake_ack_ns - c.syn_ns) / 1e6)
            d_tls.append(ph["tls"] - (c.tls.finished_ns - c.tls.client_hello_ns) / 1e6)
    # DNS: one transaction per resolution the probe made, in the same order
    resolved = [r for r in reqs if r.phases_ms()["dns"] is not None]
    assert len(dns) == len(resolved)
    for r, t in zip(resolved, dns, strict=True):
        assert t.server == r.dns_source
        assert t.rcode == "NOERROR" and t.answers == [r.resolved]
        d_dns.append(r.phases_ms()["dns"] - (t.response_ts_ns - t.ts_ns) / 1e6)
    _judge([("ttfb", d_ttfb, +1, TOL_MS), ("ttfb+transfer (ttlb)", d_ttlb, +1, TOL_MS),
            ("request sent (epoch)", d_req, -1, TOL_MS), ("first byte (epoch)", d_fb, +1, TOL_MS),
            ("connect", d_conn, +1, TOL_MS), ("tls", d_tls, +1, TOL_EXTRA_MS),
            ("dns (resolver)", d_dns, +1, TOL_EXTRA_MS)])


def _judge(checks: list[tuple[str, list[float], int, float]]) -> None:
    """Every containment first (a failure there is never retried), then every
    magnitude, reported together."""
    for name, diffs, sign, _tol in checks:
        assert all(sign * d >= -SLACK_MS for d in diffs), f"{name}: containment {diffs}"
    too_far: list[str] = []
    for name, diffs, sign, tol in checks:
        try:
            _agree(name, diffs, sign=sign, tol=tol)
        except TooFar as exc:
            too_far.append(str(exc))
    if too_far:
        raise TooFar("; ".join(too_far))


def test_probe_reuse_h2_agrees_with_capture(lab: Any, tmp_path: Path) -> None:
    def check(attempt: int) -> None:
        def run(keylog: Path) -> Any:
            return [run_http_probe(lab.url(), count=3, reuse=True, keylog=keylog,
                                   dns_server=lab.dns_slow, cafile=str(lab.cafile))
                    for _ in range(RUNS)]

        results, conns, dns = _capture(lab, tmp_path / str(attempt), run)
        assert [res.connections for res in results] == [1] * RUNS
        _check_http(results, conns, dns, tls_name="TLS 1.3")

    _attempts(check)


def test_probe_fresh_tls12_agrees_with_capture(lab: Any, tmp_path: Path) -> None:
    def check(attempt: int) -> None:
        def run(keylog: Path) -> Any:
            return [run_http_probe(f"https://{lab.TLS12_NAME}:{lab.tls12_port}/v1/messages",
                                   count=5, reuse=False, keylog=keylog,
                                   dns_server=lab.dns_fast, cafile=str(lab.cafile))
                    for _ in range(RUNS)]

        results, conns, dns = _capture(lab, tmp_path / str(attempt), run)
        assert [res.connections for res in results] == [5] * RUNS
        _check_http(results, conns, dns, tls_name="TLS 1.2")

    _attempts(check)


def test_probe_http1_agrees_with_capture(lab: Any, tmp_path: Path) -> None:
    def check(attempt: int) -> None:
        def run(keylog: Path) -> Any:
            return [run_http_probe(lab.url(), count=2, reuse=True, http1=True, keylog=keylog,
                                   dns_server=lab.dns_fast, cafile=str(lab.cafile))
                    for _ in range(RUNS)]

        results, conns, dns = _capture(lab, tmp_path / str(attempt), run)
        assert {r.http_version for res in results for r in res.requests} == {"HTTP/1.1"}
        _check_http(results, conns, dns, tls_name="TLS 1.3")

    _attempts(check)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_dns_probe_agrees_with_capture(lab: Any, tmp_path: Path, tcp: bool) -> None:
    def check(attempt: int) -> None:
        def run(_keylog: Path) -> Any:
            return run_dns_probe(lab.H2_NAME, servers=[lab.dns_slow, lab.dns_fast], count=5,
                                 tcp=tcp, timeout=2.0)

        result, _conns, dns = _capture(lab, tmp_path / str(attempt), run)
        queries = result.queries
        assert len(dns) == len(queries) == 10
        diffs, sent = [], []
        for q, t in zip(queries, dns, strict=True):
            assert (t.server, t.id, t.transport) == (q.server, q.id, q.transport)
            assert t.client == q.client
            assert t.rcode == q.rcode == "NOERROR" and t.answers == q.answers
            assert t.retransmissions == 0
            diffs.append(q.latency_ns / 1e6 - (t.response_ts_ns - t.ts_ns) / 1e6)
            sent.append((q.ts_ns - t.ts_ns) / 1e6)
        name = "dns probe " + ("tcp" if tcp else "udp")
        _judge([(name, diffs, +1, TOL_EXTRA_MS), (name + " sent (epoch)", sent, -1, TOL_MS)])

    _attempts(check)
