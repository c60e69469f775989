"""A lab run with known delays on known hops: the report must find each within 2 ms.

One run (module fixture): DNS answers held 7 ms, the ROC router's own time 25 ms, the
origins think 30 ms, SSE tokens every 5 ms. The capture is reported with netdiag's
pipeline, using only the keys embedded in it, and:

* the median DNS latency is the DNS delay;
* the median TTFB of the DPF requests (client -> origin) is the think time;
* per ROC request, matched across hops by ``x-request-id`` (decrypted on the TLS hops,
  cleartext h2c between edge and router, an argument of the ``EVALSHA``): the
  edge -> router TTFB minus the router's Redis command latency minus its upstream
  exchange (SYN to the origin's first response byte: TCP + TLS setup + origin TTFB)
  is the router's own time, whose median is the router delay;
* requests, connections and reuse per path, the router's upstream connections and its
  Redis commands are the ledger's, exactly.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from typing import Any

import pytest
from labtools import LIVE

from netdiag.lab import LabParams, run_lab
from netdiag.lab import params as P
from netdiag.lab.recover import recover, redis_commands
from netdiag.pipeline import Options, analyze
from netdiag.records import Connection, DnsTransaction

pytestmark = [pytest.mark.slow, LIVE]

DNS_MS, ROUTER_MS, THINK_MS, GAP_MS = 7.0, 25.0, 30.0, 5.0
TOLERANCE_MS = 2.0


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


def test_dns_delay_recovered(run: dict[str, Any]) -> None:
    lat = [t.latency_ns / 1e6 for t in run["dns"] if t.latency_ns is not None]
    assert len(lat) == run["ledger"]["dns_queries"] >= 2
    assert abs(statistics.median(lat) - DNS_MS) <= TOLERANCE_MS, lat


def test_think_time_recovered_at_dpf_origins(run: dict[str, Any]) -> None:
    ttfb = [(r.first_byte_ns - r.ts_ns) / 1e6 for c in by_hop(run["conns"])["dpf"]
            for r in c.requests]
    assert len(ttfb) == 16
    assert abs(statistics.median(ttfb) - THINK_MS) <= TOLERANCE_MS, sorted(ttfb)


def test_router_delay_recovered(run: dict[str, Any]) -> None:
    hops = by_hop(run["conns"])
    upstream = {header(r, "x-request-id"): (c, r) for c in hops["upstream"] for r in c.requests}
    store = {x["args"][-1]: x for x in redis_commands(run["out"]) if x["command"] == "EVALSHA"}
    own = []
    for c in hops["router"]:
        for r in c.requests:
            rid = header(r, "x-request-id")
            uc, ur = upstream[rid]
            cmd = store[rid]
            assert r.ts_ns < cmd["ts_ns"] < uc.syn_ns < ur.first_byte_ns < r.first_byte_ns
            router_ttfb = r.first_byte_ns - r.ts_ns
            exchange = ur.first_byte_ns - uc.syn_ns  # TCP + TLS setup + origin TTFB
            own.append((router_ttfb - cmd["latency_ns"] - exchange) / 1e6)
    assert len(own) == 16
    assert abs(statistics.median(own) - ROUTER_MS) <= TOLERANCE_MS, sorted(own)
    # the origins behind the router think as long as the DPF ones
    think = [(ur.first_byte_ns - ur.ts_ns) / 1e6 for _, ur in upstream.values()]
    assert abs(statistics.median(think) - THINK_MS) <= TOLERANCE_MS, sorted(think)


def test_token_gap_and_recover_summary_agree(run: dict[str, Any]) -> None:
    found = recover(run["out"], run["ledger"]["delays_ms"])
    d = found["delays_ms"]
    for key, want in (("dns", DNS_MS), ("router", ROUTER_MS), ("roc_think", THINK_MS),
                      ("dpf_think", THINK_MS), ("token_gap", GAP_MS)):
        assert d[key]["injected"] == want
        assert abs(d[key]["found"] - want) <= TOLERANCE_MS, (key, d[key])
    assert found["router_requests_matched"] == 16
    assert found["paths"]["ROC"]["requests"] == found["paths"]["DPF"]["requests"] == 16
