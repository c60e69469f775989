"""The tshark hop reference (hops_ref.py) on the shipped lab capture, and netdiag's hop
chains against it.

``captures/antho.pcapng`` (keys embedded) is read by tshark alone: every request of
every hop (HTTP/2 streams; the router's Redis commands from the TCP payload), the true
chains from the request ids the capture shows (``x-request-id`` on every HTTP hop, the
``EVALSHA`` argument on the token store), and per hop wait, setup and own time
(netdiag/paths/chains.py's definition). netdiag's chains (``analyze_paths`` with the
shipped profile) must give each hop the same own time within 1 ms for at least 95 %
of the hops (on this capture they agree to the nanosecond), the same wait and setup,
and link the same chains.

The reference's own pieces are checked too: the request counts and request ids
against the ledger, its first-byte packets against http_ref.py's (an independent
implementation of the same rules, on every HTTP capture there is), the arithmetic of
:func:`hops_ref.hop_times` on a hand-made reference, RESP parsing, the ledger-chain
conversion. The tshark-driven tests skip when tshark is absent.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from hops_ref import (
    HopTimes,
    WireConnection,
    WireReference,
    WireRequest,
    chains_by_request_id,
    chains_from_ledger,
    compare_chains,
    compare_requests,
    hop_times,
    netdiag_key,
    parse_epoch_ns,
    request_ids,
    resp_commands,
    wire_reference,
)
from http_ref import http_captures, http_reference
from tshark_ref import ROOT, tshark_path

CAPTURE = ROOT / "captures" / "antho.pcapng"
PROFILE = ROOT / "captures" / "antho.paths.toml"
LEDGER = ROOT / "captures" / "antho.expected.json"
OWN_TOL_MS = 1.0
SHARE = 0.95

needs_tshark = pytest.mark.skipif(tshark_path() is None, reason="tshark is not installed")
tshark = pytest.mark.tshark
needs_capture = pytest.mark.skipif(
    not (CAPTURE.exists() and PROFILE.exists() and LEDGER.exists()),
    reason="the shipped lab capture, profile or ledger is missing")


@pytest.fixture(scope="module")
def ledger() -> dict[str, Any]:
    led = json.loads(LEDGER.read_text())
    if "router" not in led or "connection_log" not in led:
        pytest.skip("antho.expected.json is not a lab ledger")
    return dict(led)


@pytest.fixture(scope="module")
def ref() -> WireReference:
    return wire_reference(CAPTURE)  # the keys are embedded (decryption-secrets block)


class _Sink:
    def __init__(self) -> None:
        self.dns_records: list[Any] = []
        self.connections: list[Any] = []

    def dns(self, t: Any) -> None:
        self.dns_records.append(t)

    def connection(self, c: Any) -> None:
        self.connections.append(c)


@pytest.fixture(scope="module")
def netdiag_run() -> tuple[list[Any], list[Any], Any]:
    from netdiag.paths.apply import analyze_paths
    from netdiag.paths.profile import load_profile
    from netdiag.pipeline import analyze

    sink = _Sink()
    analyze([str(CAPTURE)], sink)
    analysis = analyze_paths(sink.connections, sink.dns_records, load_profile(str(PROFILE)))
    return sink.connections, sink.dns_records, analysis


# ----------------------------------------------------------------------------- the reference


@tshark
@needs_tshark
@needs_capture
def test_reference_sees_the_ledgers_requests(ref: WireReference, ledger: dict[str, Any]) -> None:
    by_server: dict[str, list[WireRequest]] = {}
    for r in ref.requests.values():
        by_server.setdefault(r.server.rpartition(":")[0], []).append(r)
    roc = [r for r in by_server["127.0.0.10"] if r.client.startswith("127.0.0.2:")]
    assert len(roc) == ledger["paths"]["ROC"]["requests"] == 13
    dpf = [r for ip in ("127.0.0.31", "127.0.0.32", "127.0.0.33") for r in by_server.get(ip, [])]
    assert len(dpf) == ledger["paths"]["DPF"]["requests"] == 12
    assert len(by_server["127.0.0.11"]) == ledger["router"]["requests"] == 13
    store = by_server["127.0.0.12"]
    assert len(store) == ledger["router"]["redis_commands"] == 13
    assert all(r.kind == "resp" and r.method == "EVALSHA" and r.pipelined == 1 for r in store)
    assert sorted(r.ident for r in store) == list(range(13))
    assert {r.client for r in store} == set(ledger["router"]["redis_clients"])
    # the request ids, per client connection and per upstream connection, are the ledger's
    want = {(c["client"], q["stream_id"]): q["request_id"] for c in ledger["connection_log"]
            for q in c["requests"]}
    got = {(r.client, r.ident): r.request_id for r in roc + dpf}
    assert got == want
    ups = {u["client"]: u["request_id"] for u in ledger["router"]["upstream_log"]}
    origin = [r for ip in ("127.0.0.21", "127.0.0.22", "127.0.0.23")
              for r in by_server.get(ip, [])]
    assert {r.client: r.request_id for r in origin} == ups
    ids = request_ids(ref)
    assert sorted(ids[r.key] for r in store) == sorted(ups.values())
    # every time is exact on this loopback capture (no reassembly)
    assert all(r.approx is None for r in ref.requests.values())
    assert all(r.first_byte_ns is not None and r.last_byte_ns is not None
               and r.ts_ns < r.first_byte_ns <= r.last_byte_ns for r in ref.requests.values())
    # SSE answers: 8 events, 7 gaps, each at least most of the 5 ms the origin waits
    sse = [r for r in dpf if r.sse]
    assert len(sse) == 3 and all(len(r.event_ns) == 8 for r in sse)
    assert all(g > 3_000_000 for r in sse for g in r.gaps_ns)


@tshark
@needs_tshark
@needs_capture
def test_chains_from_request_ids(ref: WireReference) -> None:
    chains = chains_by_request_id(ref)
    assert len(chains) == 13
    first = min(chains, key=lambda k: ref.requests[k].ts_ns)
    for root, callees in chains.items():
        assert root[1] == "127.0.0.10:443"
        hops = hop_times(ref, root, callees)
        servers = [h.key[1].rpartition(":")[0] for h in hops]
        assert servers[:3] == ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
        assert servers[3] in ("127.0.0.21", "127.0.0.22", "127.0.0.23")
        assert [h.parent for h in hops] == [None, 0, 1, 1]
        assert [h.depth for h in hops] == [0, 1, 2, 2]
        edge, router, store, origin = hops
        # a new TLS connection per request to the origin: its handshakes are setup
        assert origin.opened and origin.setup_ns is not None and origin.setup_ns > 0
        # the edge's pooled connection to the router and the router's to Redis were
        # opened during the first ROC request, for it
        assert not edge.opened
        assert router.opened == store.opened == (root == first)
        # nested, sequential calls: own + setup add up to the client's TTFB exactly
        assert sum(h.own_ns or 0 for h in hops) + sum(h.setup_ns or 0 for h in hops) \
            == edge.wait_ns
        assert router.own_parts_ns is not None and sum(router.own_parts_ns) == router.own_ns
        assert store.own_ns == store.wait_ns and origin.own_ns == origin.wait_ns


@tshark
@needs_tshark
@pytest.mark.parametrize("spec", http_captures(), ids=lambda s: s.name)
def test_first_bytes_agree_with_http_ref(spec: Any) -> None:
    """hops_ref.py's request and response first-byte packets are http_ref.py's (a
    second implementation of the same first-byte rules), request by request."""
    ref = wire_reference(spec.path, spec.keylog, extra_opts=spec.extra_opts)
    compared = 0
    for s in http_reference(spec).streams:
        if s.client is None or s.server is None or not s.requests:
            continue
        h1 = [r for r in s.requests if r.stream_id is None]
        for r in s.requests:
            if r.kind == "upgrade" or r.request is None or r.response is None:
                continue
            ident = r.stream_id if r.stream_id is not None else h1.index(r)
            w = ref.requests.get((s.client, s.server, ident))
            assert w is not None, r.describe()
            assert w.ts_ns == parse_epoch_ns(str(r.request.ts)), r.describe()
            assert w.first_byte_ns == parse_epoch_ns(str(r.response.ts)), r.describe()
            compared += 1
    if not compared:
        pytest.skip(f"{spec.name}: no request with both first bytes placed")


# ----------------------------------------------------------------------------- netdiag


@tshark
@needs_tshark
@needs_capture
def test_netdiag_hop_times_agree_with_tshark(ref: WireReference, netdiag_run: Any) -> None:
    _conns, _dns, analysis = netdiag_run
    cmp = compare_chains(ref, analysis.chain_table)
    stats = {f: cmp.stats(f) for f in ("own", "wait", "setup")}
    print("netdiag vs tshark per hop, |error| ms: " + "; ".join(
        f"{f} n={s['n']} median {s['median']:.6f} p95 {s['p95']:.6f} max {s['max']:.6f}"
        for f, s in stats.items()))
    assert not cmp.missing, cmp.missing
    assert not cmp.relinked, cmp.relinked
    assert stats["own"]["n"] == 13 * 4
    assert cmp.share_within("own", OWN_TOL_MS) >= SHARE, cmp.worst("own")
    assert cmp.share_within("wait", OWN_TOL_MS) >= SHARE, cmp.worst("wait")
    # setup: present on the same hops, and the same time
    assert all(e != float("inf") for e in cmp.errors("setup")), cmp.worst("setup")
    assert cmp.share_within("setup", OWN_TOL_MS) >= SHARE, cmp.worst("setup")
    # the router's own time per request, as netdiag's chains say, is tshark's
    router = [row["own"] for row in cmp.rows if row["key"][1] == "127.0.0.11:8080"]
    assert len(router) == 13
    assert all(abs(a - b) <= OWN_TOL_MS for a, b in router), router
    print(f"router own time, median: netdiag {statistics.median(a for a, _ in router):.3f} "
          f"ms, tshark {statistics.median(b for _, b in router):.3f} ms")


@tshark
@needs_tshark
@needs_capture
def test_netdiag_request_times_are_the_same_packets(ref: WireReference,
                                                    netdiag_run: Any) -> None:
    conns, dns, _analysis = netdiag_run
    assert compare_requests(ref, conns) == []
    keys = {netdiag_key(c, i) for c in conns for i in range(len(c.requests))}
    assert keys == set(ref.requests)
    by_key = {(c.client, c.server): c for c in conns}
    for w in ref.connections:
        c = by_key[w.key]
        assert c.syn_ns == w.syn_ns and c.handshake_ack_ns == w.handshake_ack_ns, c.id
        if w.tls is not None:
            assert c.tls.client_hello_ns == w.tls.client_hello_ns, c.id
            assert c.tls.finished_ns == w.tls.finished_ns, c.id
    want = {d.key: d for d in ref.dns}
    assert len(dns) == len(want) == 5
    for t in dns:
        d = want[(t.client, t.server, t.transport, t.id, t.qname)]
        assert t.ts_ns == d.query_ns and t.response_ts_ns == d.response_ns
        assert d.dns_time_ns == d.latency_ns  # no retransmission: tshark's dns.time agrees
    # token gaps: netdiag's SSE event gaps are tshark's DATA frame gaps
    for c in conns:
        for i, r in enumerate(c.requests):
            w = ref.requests[netdiag_key(c, i)]
            if w.sse:
                assert r.sse_events == len(w.event_ns)
                assert r.chunk_gaps_ns == w.gaps_ns


# ----------------------------------------------------------------------------- units


def _req(client: str, server: str, ident: int, ts: int, fb: int | None, lb: int | None = None,
         kind: str = "h2") -> WireRequest:
    return WireRequest((client, server, ident), 0, kind, ts, 0, fb, 0, lb)


def _synthetic() -> WireReference:
    """A parent on P (ts 100, first byte 1000) that called A (a new connection, SYN
    at 150, request 200, first byte 400), B (pooled, 300 -> 500: overlaps A), C (700,
    no answer), D (after the parent's first byte: 1100 -> 1200) and E on a connection
    opened before the parent started (SYN 50, request 800 -> 900), from another address."""
    P, A, B = "10.0.0.1:1000", "10.0.0.2:1001", "10.0.0.2:1002"
    C, D, E = "10.0.0.2:1003", "10.0.0.2:1004", "10.0.0.9:1005"
    conns = [
        WireConnection(0, P, "10.0.0.2:80", 90, 2000, syn_ns=90,
                       requests=[_req(P, "10.0.0.2:80", 1, 100, 1000, 1500)]),
        WireConnection(1, A, "10.0.0.3:443", 150, 2000, syn_ns=150,
                       requests=[_req(A, "10.0.0.3:443", 1, 200, 400, 450)]),
        WireConnection(2, B, "10.0.0.4:6379", 10, 2000, syn_ns=10,
                       requests=[_req(B, "10.0.0.4:6379", 0, 5, 8, 8, "resp"),
                                 _req(B, "10.0.0.4:6379", 1, 300, 500, 500, "resp")]),
        WireConnection(3, C, "10.0.0.5:80", 650, 2000, syn_ns=650,
                       requests=[_req(C, "10.0.0.5:80", 0, 700, None, None, "http1")]),
        WireConnection(4, D, "10.0.0.6:80", 1050, 2000, syn_ns=1050,
                       requests=[_req(D, "10.0.0.6:80", 0, 1100, 1200, 1250, "http1")]),
        WireConnection(5, E, "10.0.0.7:80", 50, 2000, syn_ns=50,
                       requests=[_req(E, "10.0.0.7:80", 0, 800, 900, 950, "http1")]),
    ]
    return WireReference("synthetic", None, conns, [], 0)


def test_hop_times_arithmetic() -> None:
    ref = _synthetic()
    root = ("10.0.0.1:1000", "10.0.0.2:80", 1)
    callees = [(("10.0.0.2:1001", "10.0.0.3:443", 1), 0),
               (("10.0.0.2:1002", "10.0.0.4:6379", 1), 0),
               (("10.0.0.2:1003", "10.0.0.5:80", 0), 0),
               (("10.0.0.2:1004", "10.0.0.6:80", 0), 0),
               (("10.0.0.9:1005", "10.0.0.7:80", 0), 0)]
    hops = hop_times(ref, root, callees)
    p, a, b, c, d, e = hops
    assert isinstance(p, HopTimes) and p.wait_ns == 900
    # A: opened for it (first request, SYN inside the parent's wait): setup 50, from 150
    assert a.opened and a.setup_ns == 50 and a.start_ns == 150 and a.wait_ns == 200
    # B: not its connection's first request; C: no answer (runs to the parent's first
    # byte); D: after the parent's first byte; E: connection opened before the parent
    assert not b.opened and b.setup_ns is None and b.start_ns == 300
    assert c.opened and c.setup_ns == 50 and c.wait_ns is None and c.own_ns is None
    assert d.opened is False and d.setup_ns is None  # its SYN is after the parent's first byte
    assert not e.opened and e.setup_ns is None
    # union of [150, 400] + [300, 500] + [650, 1000] (+ D clipped away, E inside C's)
    assert p.own_ns == 900 - (350 + 350)
    assert p.own_parts_ns == (50, 150, 0)
    assert a.own_ns == 200 and e.own_ns == 100
    with pytest.raises(ValueError):
        hop_times(ref, root, [(callees[0][0], 1)])


def test_chains_by_request_id_and_ledger() -> None:
    ref = _synthetic()
    for c in ref.connections:
        for r in c.requests:
            if r.kind != "resp":
                r.headers = [("x-request-id", "rid-1")]
    ref.requests[("10.0.0.2:1002", "10.0.0.4:6379", 1)].args = ["EVALSHA", "abc", "1", "rid-1"]
    chains = chains_by_request_id(ref)
    root = ("10.0.0.1:1000", "10.0.0.2:80", 1)
    assert list(chains) == [root]
    order = [root] + [k for k, _ in chains[root]]
    got = dict(chains[root])
    # E, sent from an address no candidate serves on, goes to the innermost request
    # with its id that had not ended: C (no answer, so no last byte), not the root
    assert got[("10.0.0.9:1005", "10.0.0.7:80", 0)] == order.index(
        ("10.0.0.2:1003", "10.0.0.5:80", 0))
    # the others were sent from the root's server address: the root, even B, which
    # started while A (same id, another server) was open; D too (before the root's
    # last byte; hop_times clips it away)
    for k in (("10.0.0.2:1001", "10.0.0.3:443", 1), ("10.0.0.2:1002", "10.0.0.4:6379", 1),
              ("10.0.0.2:1003", "10.0.0.5:80", 0), ("10.0.0.2:1004", "10.0.0.6:80", 0)):
        assert got[k] == 0, k
    assert ("10.0.0.2:1002", "10.0.0.4:6379", 0) not in got  # a command without the id
    assert order == sorted(order, key=lambda k: ref.requests[k].ts_ns)
    led = [{"client": {"client": "10.0.0.1:1000", "server": "10.0.0.2:80", "stream_id": 1,
                       "ordinal": None},
            "upstream": [{"hop": "origin", "client": "10.0.0.2:1001", "server": "10.0.0.3:443",
                          "stream_id": 1, "ordinal": None, "parent": 0},
                         {"hop": "token-store", "client": "10.0.0.2:1002",
                          "server": "10.0.0.4:6379", "stream_id": None, "ordinal": 1,
                          "parent": 1}]},
           {"client": {"client": "10.0.0.9:1", "server": "10.0.0.2:80", "stream_id": 3,
                       "ordinal": None}, "upstream": []}]
    assert chains_from_ledger(led) == {root: [(("10.0.0.2:1001", "10.0.0.3:443", 1), 0),
                                              (("10.0.0.2:1002", "10.0.0.4:6379", 1), 1)]}


def test_resp_commands() -> None:
    one = b"*3\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$8\r\nroc-0001\r\n"
    assert resp_commands(one) == [["EVALSHA", "abc", "roc-0001"]]
    assert resp_commands(one + b"PING\r\n" + b"*1\r\n$4\r\nQUIT\r\n") == [
        ["EVALSHA", "abc", "roc-0001"], ["PING"], ["QUIT"]]
    assert resp_commands(one[:-5]) == []  # incomplete


def test_parse_epoch_ns() -> None:
    assert parse_epoch_ns("1795968575.630009297") == 1795968575630009297
    assert parse_epoch_ns("12.5") == 12_500_000_000
    assert parse_epoch_ns("7") == 7_000_000_000


def test_module_runs_as_a_script(tmp_path: Path) -> None:
    import hops_ref

    assert hops_ref.main([]) == 1
