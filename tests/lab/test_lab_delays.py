"""A lab run with known delays on known hops: netdiag must measure each one as tshark does.

One run (module fixture): DNS answers held 7 ms, the ROC router's own time 25 ms, the
origins think 30 ms, SSE tokens every 5 ms. The capture is reported with netdiag's
pipeline, using only the keys embedded in it, and each figure is compared with an
independent measurement of the *same* thing: tshark's frame times of the same packets
(tests/crosscheck/hops_ref.py, which reads the capture with tshark alone and computes
every hop's wait, setup and own time from them). Never with the injected delay nor a
server's own clock: on a busy machine a Python server's 25 ms sleep takes 31 ms, and
that is what the wire shows and what netdiag must report. So:

* DNS latency, per transaction, is tshark's (first query to first response; for UDP
  also tshark's ``dns.time``), within ``WIRE_TOL_MS`` (the same packets: they agree
  to the nanosecond);
* the TTFB of every DPF request (client -> origin) and of every router -> origin
  request is tshark's HEADERS-to-HEADERS time, within ``WIRE_TOL_MS``;
* per ROC request, matched across hops by ``x-request-id`` (decrypted on the TLS hops,
  cleartext h2c between edge and router, an argument of the ``EVALSHA``): the
  router's own time as the lab recovers it from netdiag's records (edge -> router TTFB
  minus the Redis command latency minus the upstream exchange, SYN to the origin's
  first response byte) is tshark's own time of that hop, within ``OWN_TOL_MS`` for
  every request; netdiag's hop chains (``analyze_paths`` with the lab's profile) give
  every hop tshark's own time within ``OWN_TOL_MS`` for at least ``SHARE`` of the hops;
* ``recover()``'s summary (median DNS latency, router own time, origin think times,
  token gap) is the median of tshark's figures of the same requests;
* requests, connections and reuse per path, the router's upstream connections and its
  Redis commands are the ledger's, exactly.

The injected delays remain only as loose sanity bounds (:func:`sane`): what is measured
is at least 0.8 times what was injected (a sleep never ends early) and not absurd.
"""

from __future__ import annotations

import json
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from labtools import LIVE

from netdiag.lab import LabParams, run_lab
from netdiag.lab import params as P
from netdiag.lab.recover import recover, redis_commands
from netdiag.pipeline import Options, analyze
from netdiag.records import Connection, DnsTransaction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crosscheck"))

from hops_ref import (
    WireReference,
    all_hop_times,
    chains_by_request_id,
    compare_chains,
    netdiag_key,
    wire_reference,
)
from tshark_ref import tshark_path

pytestmark = [pytest.mark.slow, LIVE]

DNS_MS, ROUTER_MS, THINK_MS, GAP_MS = 7.0, 25.0, 30.0, 5.0
WIRE_TOL_MS = 0.05
"""netdiag and tshark timing the same packets."""
OWN_TOL_MS = 1.0
"""An own time, netdiag's against tshark's."""
SHARE = 0.95


def sane(found: float, injected: float) -> bool:
    """A measured delay against the one the lab injected: never shorter than most of
    it, never absurdly longer (a busy host stretches a sleep, it does not triple it)."""
    return 0.8 * injected <= found <= 3 * injected + 50.0


def ip(ep: str) -> str:
    return ep.rpartition(":")[0]


def header(req: Any, name: str) -> str | None:
    return next((v for k, v in req.request_headers or () if k == name), None)


def resp_header(req: Any, name: str) -> str | None:
    return next((v for k, v in req.response_headers or () if k == name), None)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lab") / "lab.pcapng"
    params = LabParams(requests=16, concurrency=4, dns_delay_ms=DNS_MS,
                       router_delay_ms=ROUTER_MS, think_ms=THINK_MS, token_gap_ms=GAP_MS)
    ledger = run_lab(out, params)
    records: list[Any] = []

    class _Sink:
        def dns(self, t: DnsTransaction) -> None:
            records.append(t)

        def connection(self, c: Connection) -> None:
            records.append(c)

    result = analyze([str(out)], _Sink(), Options())  # keys: the embedded DSB only
    conns = [r for r in records if isinstance(r, Connection)]
    dns = [r for r in records if isinstance(r, DnsTransaction)]
    return {"out": out, "ledger": ledger, "conns": conns, "dns": dns, "result": result}


@pytest.fixture(scope="module")
def wire(run: dict[str, Any]) -> WireReference:
    """tshark's reference of the same capture (keys: the embedded ones)."""
    if tshark_path() is None:
        pytest.skip("tshark is not installed: nothing independent to compare with")
    return wire_reference(run["out"])


def by_hop(conns: list[Connection]) -> dict[str, list[Connection]]:
    roc_origins = {a for a, _ in P.Topology(3).roc_origins}
    dpf_origins = {a for a, _ in P.Topology(3).dpf_origins}
    return {
        "roc": [c for c in conns if ip(c.client) == P.ROC_CLIENT_IP and ip(c.server) == P.EDGE_IP],
        "dpf": [c for c in conns
                if ip(c.client) == P.DPF_CLIENT_IP and ip(c.server) in dpf_origins],
        "router": [c for c in conns if c.server == f"{P.ROUTER_IP}:{P.ROUTER_PORT}"],
        "upstream": [c for c in conns
                     if ip(c.client) == P.ROUTER_IP and ip(c.server) in roc_origins],
        "redis": [c for c in conns if c.server == f"{P.REDIS_IP}:{P.REDIS_PORT}"],
    }


def test_files_and_capture(run: dict[str, Any]) -> None:
    out, ledger = run["out"], run["ledger"]
    assert json.loads(out.with_name("lab.expected.json").read_text()) == json.loads(
        json.dumps(ledger))
    profile = tomllib.loads(out.with_name("lab.paths.toml").read_text())
    assert profile["version"] == 1
    paths = {p["name"]: p for p in profile["path"]}
    assert paths["ROC"]["hops"] == ["edge", "router", "token-store", "origin"]
    assert paths["DPF"]["hops"] == ["origin"]
    rules = {(p, r["hop"]): r for p in paths for r in paths[p]["rule"]}
    assert rules[("ROC", "edge")]["server"] == ["127.0.0.10/32"]
    assert rules[("ROC", "edge")]["sni"] == ["api.roc.test"]
    assert rules[("ROC", "router")]["port"] == [8080]
    assert rules[("ROC", "token-store")]["server"] == ["127.0.0.12/32"]
    assert rules[("DPF", "origin")]["server"] == [f"127.0.0.3{n}/32" for n in (1, 2, 3)]
    assert ledger["capture_drops"] == 0 and ledger["errors"] == []
    assert out.stat().st_size < 1_000_000
    assert ledger["packets"] == run["result"].capture.packets
    # only the lab's addresses, and every TLS connection decrypted with the embedded keys
    lab = set(P.Topology(3).addresses())
    for c in run["conns"]:
        assert ip(c.client) in lab and ip(c.server) in lab
        if c.tls is not None:
            assert c.tls.decrypted, c.id
            assert all(not r.estimated for r in c.requests)


def test_counts_per_path_equal_the_ledger(run: dict[str, Any]) -> None:
    led, hops = run["ledger"], by_hop(run["conns"])
    for name, key in (("ROC", "roc"), ("DPF", "dpf")):
        conns = hops[key]
        reqs = [r for c in conns for r in c.requests]
        assert len(reqs) == led["paths"][name]["requests"] == 16
        assert len(conns) == led["paths"][name]["connections"]
        assert sorted(str(r.status) for r in reqs) == sorted(
            k for k, v in led["paths"][name]["statuses"].items() for _ in range(v))
        logged = {c["client"]: c for c in led["connection_log"] if c["path"] == name}
        assert {c.client for c in conns} == set(logged)
        for c in conns:
            want = [(r["stream_id"], r["path"], r["status"]) for r in logged[c.client]["requests"]]
            assert [(r.stream_id, r.path, r.status) for r in c.requests] == want
        n, k = len(reqs), len(conns)
        assert (n - k) / n == pytest.approx(led["paths"][name]["reuse_rate"])
    # ROC: the client keeps one connection to the edge, the edge one to the router,
    # the router opens a new one to an origin for every request: reuse 0 there
    assert len(hops["router"]) == led["edge"]["router_connections"] == 1
    assert sum(len(c.requests) for c in hops["router"]) == 16
    assert len(hops["upstream"]) == led["router"]["upstream_connections"] == 16
    assert all(len(c.requests) == 1 for c in hops["upstream"])
    roc_reuse = led["paths"]["ROC"]["reuse_rate"]
    dpf_reuse = led["paths"]["DPF"]["reuse_rate"]
    assert roc_reuse == pytest.approx(15 / 16)
    assert dpf_reuse == pytest.approx((16 - led["paths"]["DPF"]["connections"]) / 16)
    assert roc_reuse >= dpf_reuse  # one edge for all ROC clients, one origin each for DPF
    cmds = [x for x in redis_commands(run["out"]) if x["command"] == "EVALSHA"]
    assert len(cmds) == led["router"]["redis_commands"] == 16
    assert led["router"]["redis_server_calls"]["evalsha"] == 16
    assert {c.client for c in hops["redis"]} == {x["client"] for x in cmds}
    assert all(ip(c.client) == P.ROUTER_IP for c in hops["redis"])
    # SSE answers carried the configured number of events end to end
    sse = [r for c in hops["roc"] + hops["dpf"] for r in c.requests if r.sse_events]
    assert len(sse) == led["sse_streams"] == 8
    assert all(r.sse_events == 8 for r in sse)


def test_request_identity_and_hop_headers(run: dict[str, Any]) -> None:
    hops = by_hop(run["conns"])
    ids = {h: {header(r, "x-request-id") for c in hops[h] for r in c.requests}
           for h in ("roc", "router", "upstream")}
    want = {f"roc-{i:04d}" for i in range(1, 17)}
    assert ids["roc"] == ids["router"] == ids["upstream"] == want
    for c in hops["roc"]:
        for r in c.requests:
            assert resp_header(r, "via") == "roc-edge"
            assert resp_header(r, "x-router") == "roc-router"
            assert (resp_header(r, "server") or "").startswith("origin-")
            assert (resp_header(r, "x-origin") or "").startswith("gpu-")
            assert resp_header(r, "x-request-id") == header(r, "x-request-id")
    for c in hops["dpf"]:
        for r in c.requests:
            n = ip(c.server).rpartition(".")[2][-1]
            assert resp_header(r, "x-origin") == f"gpu-{n}"
            assert resp_header(r, "via") is None and resp_header(r, "x-router") is None


def test_dns_delay_recovered(run: dict[str, Any], wire: WireReference) -> None:
    lat = {(t.client, t.server, t.transport, t.id, t.qname): t.latency_ns for t in run["dns"]
           if t.latency_ns is not None}
    assert len(lat) == run["ledger"]["dns_queries"] >= 2
    ref = {d.key: d for d in wire.dns}
    assert set(lat) == set(ref)
    for key, ns in lat.items():
        d = ref[key]
        assert d.latency_ns is not None, d
        assert abs(ns - d.latency_ns) / 1e6 <= WIRE_TOL_MS, (key, ns, d)
        if d.transport == "udp" and d.copies == 1:
            # one packet each way: tshark's own dns.time agrees (after a retransmitted
            # query it counts from the last copy, the contract from the first)
            assert d.dns_time_ns == d.latency_ns, d
    found = statistics.median(lat.values()) / 1e6
    assert sane(found, DNS_MS), sorted(v / 1e6 for v in lat.values())


def test_think_time_recovered_at_dpf_origins(run: dict[str, Any], wire: WireReference) -> None:
    ttfb = []
    for c in by_hop(run["conns"])["dpf"]:
        for i, r in enumerate(c.requests):
            w = wire.requests[netdiag_key(c, i)]
            got = (r.first_byte_ns - r.ts_ns) / 1e6
            assert w.wait_ns is not None and abs(got - w.wait_ns / 1e6) <= WIRE_TOL_MS, \
                (w.describe(), got, w.wait_ns)
            ttfb.append(got)
    assert len(ttfb) == 16
    assert sane(statistics.median(ttfb), THINK_MS), sorted(ttfb)


def test_router_delay_recovered(run: dict[str, Any], wire: WireReference) -> None:
    hops = by_hop(run["conns"])
    upstream = {header(r, "x-request-id"): (c, i, r) for c in hops["upstream"]
                for i, r in enumerate(c.requests)}
    store = {x["args"][-1]: x for x in redis_commands(run["out"]) if x["command"] == "EVALSHA"}
    # tshark's chains, from the request ids it decodes, and each hop's times
    chains = chains_by_request_id(wire)
    assert len(chains) == 16
    truth = all_hop_times(wire, chains)
    # a command that opened its Redis connection (the router's pool grows under
    # concurrent requests) was decided at the SYN: the call spans the setup too
    first_on = {c.client: c for c in hops["redis"] if c.syn_ns is not None and c.requests}
    own, ref_own, think = [], [], []
    for c in hops["router"]:
        for i, r in enumerate(c.requests):
            rid = header(r, "x-request-id")
            uc, ui, ur = upstream[rid]
            cmd = store[rid]
            assert r.ts_ns < cmd["ts_ns"] < uc.syn_ns < ur.first_byte_ns < r.first_byte_ns
            router_ttfb = r.first_byte_ns - r.ts_ns
            exchange = ur.first_byte_ns - uc.syn_ns  # TCP + TLS setup + origin TTFB
            call = cmd["latency_ns"]
            rc = first_on.get(cmd["client"])
            if rc is not None and rc.requests[0].ts_ns == cmd["ts_ns"] \
                    and r.ts_ns <= rc.syn_ns <= cmd["ts_ns"]:
                call += cmd["ts_ns"] - rc.syn_ns
            mine = (router_ttfb - call - exchange) / 1e6
            # the same hop as tshark sees it: its own time, and its callees in the chain
            hop = truth[netdiag_key(c, i)]
            assert hop.own_ms is not None
            assert abs(mine - hop.own_ms) <= OWN_TOL_MS, (rid, mine, hop)
            origin = truth[netdiag_key(uc, ui)]
            assert origin.opened and origin.start_ns == uc.syn_ns, (rid, origin)
            assert origin.wait_ns is not None
            got_think = (ur.first_byte_ns - ur.ts_ns) / 1e6
            assert abs(got_think - origin.wait_ns / 1e6) <= WIRE_TOL_MS, (rid, got_think, origin)
            own.append(mine)
            ref_own.append(hop.own_ms)
            think.append(got_think)
    assert len(own) == 16
    print(f"router own time: median {statistics.median(own):.3f} ms (tshark "
          f"{statistics.median(ref_own):.3f} ms; {ROUTER_MS} ms injected)")
    assert sane(statistics.median(own), ROUTER_MS), sorted(own)
    # the origins behind the router think as long as the DPF ones: at least most of it
    assert sane(statistics.median(think), THINK_MS), sorted(think)


def test_router_chains_agree_with_tshark(run: dict[str, Any], wire: WireReference) -> None:
    """netdiag's own hop chains (the paths analysis the report prints) against
    tshark's, hop by hop."""
    from netdiag.paths.apply import analyze_paths
    from netdiag.paths.profile import load_profile

    profile = load_profile(str(run["out"].with_name("lab.paths.toml")))
    analysis = analyze_paths(run["conns"], run["dns"], profile)
    cmp = compare_chains(wire, analysis.chain_table)
    for f in ("own", "wait", "setup"):
        st = cmp.stats(f)
        print(f"netdiag chains vs tshark, {f}: n={st['n']} median {st['median']:.6f} "
              f"p95 {st['p95']:.6f} max {st['max']:.6f} ms")
    for line in cmp.relinked:
        print("relinked:", line)
    assert not cmp.missing, cmp.missing
    assert len(cmp.rows) == 16 * 4
    for f in ("own", "wait", "setup"):
        assert cmp.share_within(f, OWN_TOL_MS) >= SHARE, (f, cmp.worst(f))
    router = [a for row in cmp.rows if row["key"][1] == f"{P.ROUTER_IP}:{P.ROUTER_PORT}"
              for a, _ in [row["own"]]]
    assert len(router) == 16
    assert sane(statistics.median(router), ROUTER_MS), sorted(router)


def test_token_gap_and_recover_summary_agree(run: dict[str, Any], wire: WireReference) -> None:
    found = recover(run["out"], run["ledger"]["delays_ms"])
    d = found["delays_ms"]
    roc_origins = {a for a, _ in P.Topology(3).roc_origins}
    dpf_origins = {a for a, _ in P.Topology(3).dpf_origins}
    reqs = list(wire.requests.values())
    router = f"{P.ROUTER_IP}:{P.ROUTER_PORT}"
    truth = all_hop_times(wire)

    def ms(values: list[int | None]) -> list[float]:
        return [v / 1e6 for v in values if v is not None]

    # the same figures from tshark's frame times of the same requests
    ref = {
        "dns": ms([t.latency_ns for t in wire.dns]),
        "router": ms([h.own_ns for k, h in truth.items() if k[1] == router]),
        "roc_think": ms([r.wait_ns for r in reqs if ip(r.server) in roc_origins
                         and r.status == 200]),
        "dpf_think": ms([r.wait_ns for r in reqs if ip(r.server) in dpf_origins
                         and ip(r.client) == P.DPF_CLIENT_IP and r.status == 200]),
        "token_gap": ms([g for r in reqs if ip(r.server) in dpf_origins
                         and ip(r.client) == P.DPF_CLIENT_IP and r.sse for g in r.gaps_ns]),
    }
    assert len(ref["router"]) == len(ref["roc_think"]) == len(ref["dpf_think"]) == 16
    streamed = [r for r in reqs if ip(r.server) in dpf_origins and r.sse]
    assert streamed and len(ref["token_gap"]) == 7 * len(streamed)  # 8 events each
    for key, want in (("dns", DNS_MS), ("router", ROUTER_MS), ("roc_think", THINK_MS),
                      ("dpf_think", THINK_MS), ("token_gap", GAP_MS)):
        assert d[key]["injected"] == want
        assert d[key]["samples"] == len(ref[key]), (key, d[key], ref[key])
        tol = OWN_TOL_MS if key == "router" else WIRE_TOL_MS
        tshark = statistics.median(ref[key])
        assert abs(d[key]["found"] - tshark) <= tol, (key, d[key], tshark, sorted(ref[key]))
        assert sane(d[key]["found"], want), (key, d[key])
    assert found["router_requests_matched"] == 16
    assert found["paths"]["ROC"]["requests"] == found["paths"]["DPF"]["requests"] == 16
