"""The lab's proxy shapes (issue 9): pooling, concurrency, source addresses, protocols,
no request ids, server timing -- and the true chain its ledger records.

Each live mode runs one small lab (in a network namespace of its own) and checks the
ledger against the capture, read back with netdiag's pipeline:

* every client request has a chain; on ROC: a router request (parent 0), then a
  token-store call and an origin request (both parent 1);
* every hop the ledger names is a request in the capture: its TCP connection (client
  and server endpoints), and on it the HTTP/2 stream id or the request at that
  ordinal (HTTP/1.1, Redis), whose path (or command) is the client's;
* the profile the lab wrote puts every connection on its path and hop;
* no connection is reset;
* and what the mode is about: pooled connections are shared, sources are 127.0.0.1,
  no correlation header is on the wire, server-timing is on every edge answer.

The pure parts (the chain join, the profile, HTTP/1.1 framing, the pools, the netns
decision) are tested without root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from labtools import LIVE, children, descendants, ip_of

from netdiag.lab import LabParams
from netdiag.lab import params as P
from netdiag.lab.chains import build_chains
from netdiag.lab.profile import profile_doc

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {"requests": 24, "concurrency": 4, "think_ms": 10.0,
                        "router_delay_ms": 5.0, "token_gap_ms": 2.0, "sse_events": 4,
                        "dns_delay_ms": 1.0, "hash_bucket": 7, "settle_ms": 200.0,
                        "netns": True, "timeout_s": 40.0}
MODES: dict[str, dict[str, Any]] = {
    "concurrency-16": {"concurrency": 16, "requests": 32},
    "concurrency-64": {"concurrency": 64, "requests": 64},
    "pool-h2": {"upstream_pool": True, "concurrency": 8, "origin_pairing_ms": 500.0},
    "pool-http1": {"upstream_pool": True, "origin_protocol": "http1", "concurrency": 8},
    "http1-per-request": {"origin_protocol": "http1"},
    "loopback": {"upstream_source": "loopback", "concurrency": 8, "upstream_pool": True,
                 "origin_pairing_ms": 500.0},
    "ids-off": {"request_ids": False, "roc_resume": True},
    "router-http1": {"router_protocol": "http1", "concurrency": 8,
                     "upstream_max_connections": 6},
    "server-timing": {"server_timing": True, "concurrency": 8},
}
HOP_OF_SERVER = {f"{P.EDGE_IP}:{P.EDGE_PORT}": ("ROC", "edge"),
                 f"{P.ROUTER_IP}:{P.ROUTER_PORT}": ("ROC", "router"),
                 f"{P.REDIS_IP}:{P.REDIS_PORT}": ("ROC", "token-store")}
for _ip, _ in P.Topology(3).roc_origins:
    HOP_OF_SERVER[f"{_ip}:{P.ORIGIN_PORT}"] = ("ROC", "origin")
for _ip, _ in P.Topology(3).dpf_origins:
    HOP_OF_SERVER[f"{_ip}:{P.ORIGIN_PORT}"] = ("DPF", "origin")
ROC_ORIGINS = {s for s, (path, hop) in HOP_OF_SERVER.items() if (path, hop) == ("ROC", "origin")}


# ---------------------------------------------------------------------- pure parts


def test_new_params_default_to_todays_lab_and_are_checked() -> None:
    p = LabParams()
    assert (p.upstream_pool, p.upstream_source, p.router_protocol, p.origin_protocol,
            p.request_ids, p.server_timing) == (False, "own", "h2c", "h2", True, False)
    assert p.source_ip(P.ROUTER_IP) == P.ROUTER_IP
    assert LabParams(upstream_source="loopback").source_ip(P.ROUTER_IP) == "127.0.0.1"
    for bad in ({"upstream_source": "host"}, {"router_protocol": "h3"},
                {"origin_protocol": "h2c"}, {"upstream_max_connections": 0}):
        with pytest.raises(ValueError):
            LabParams(**bad)
    assert json.loads(json.dumps(LabParams(netns=True).to_json()))["netns"] is True


def test_profile_never_requires_a_client_address_with_loopback_sources() -> None:
    own = profile_doc(3)
    rules = {r["hop"]: r for r in own["path"][0]["rule"]}
    assert rules["router"]["client"] == ["127.0.0.10/32"]
    assert rules["token-store"]["client"] == ["127.0.0.11/32"]
    loop = profile_doc(3, params=LabParams(upstream_source="loopback"))
    for path in loop["path"]:
        for rule in path["rule"]:
            assert "client" not in rule, rule
            assert rule["server"] and rule["port"], rule  # named by server and port
    tls = {r["hop"]: r for r in loop["path"][0]["rule"]}
    assert tls["edge"]["sni"] == ["api.roc.test"] and tls["origin"]["sni"] == ["gpu-*.roc.test"]


def test_chains_join_on_endpoints_and_stream_ids_or_ordinals() -> None:
    requests = [
        {"request_id": "roc-0001", "path": "ROC", "status": 200, "client": "127.0.0.2:5000",
         "server": "127.0.0.10:443", "stream_id": 1},
        {"request_id": "roc-0002", "path": "ROC", "status": 200, "client": "127.0.0.2:5000",
         "server": "127.0.0.10:443", "stream_id": 3},
        {"request_id": "dpf-0001", "path": "DPF", "status": 200, "client": "127.0.0.3:6000",
         "server": "127.0.0.31:443", "stream_id": 1},
        {"request_id": "roc-0003", "path": "ROC", "status": None, "client": "?",
         "server": "127.0.0.10:443", "stream_id": None},
    ]

    def edge(sid: int, ordinal: int) -> dict[str, Any]:
        return {"client": "127.0.0.2:5000", "server": "127.0.0.10:443", "stream_id": sid,
                "ordinal": None, "server_timing": None, "upstream": [
                    {"hop": "router", "client": "127.0.0.1:7000", "server": "127.0.0.11:8080",
                     "stream_id": None, "ordinal": ordinal}]}

    def router(ordinal: int, redis: int, origin_sid: int) -> dict[str, Any]:
        return {"client": "127.0.0.1:7000", "server": "127.0.0.11:8080", "stream_id": None,
                "ordinal": ordinal, "request_id": None, "upstream": [
                    {"hop": "token-store", "client": "127.0.0.1:7100",
                     "server": "127.0.0.12:6379", "stream_id": None, "ordinal": redis},
                    {"hop": "origin", "client": "127.0.0.1:7200", "server": "127.0.0.21:443",
                     "stream_id": origin_sid, "ordinal": None}]}

    origins = [{"client": "127.0.0.1:7200", "server": "127.0.0.21:443", "stream_id": s,
                "ordinal": None} for s in (1, 3)]
    origins.append({"client": "127.0.0.3:6000", "server": "127.0.0.31:443", "stream_id": 1,
                    "ordinal": None})
    # the second request reached the router first: the logs are out of order
    chains, problems = build_chains(requests, [edge(3, 0), edge(1, 1)],
                                    [router(1, 1, 3), router(0, 0, 1)], origins)
    assert problems == []
    assert [c["request_id"] for c in chains] == ["dpf-0001", "roc-0001", "roc-0002"]
    dpf, first, second = chains
    assert dpf["upstream"] == []
    assert [(u["hop"], u["parent"]) for u in first["upstream"]] == [
        ("router", 0), ("token-store", 1), ("origin", 1)]
    assert first["upstream"][0]["ordinal"] == 1 and first["upstream"][1]["ordinal"] == 1
    assert first["upstream"][2]["stream_id"] == 3
    assert second["upstream"][0]["ordinal"] == 0 and second["upstream"][2]["stream_id"] == 1
    # a hop that never logged receiving what was sent to it is a problem, not a guess
    _chains, problems = build_chains(requests[:1], [edge(1, 5)], [router(0, 0, 1)], origins)
    assert problems and "router logged no request" in problems[0]


def test_netns_default_falls_back_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    import netdiag.lab.lab as lab_mod
    import netdiag.lab.netns as netns_mod
    from netdiag.lab import LabError, run_lab

    seen: list[Any] = []
    monkeypatch.setattr(netns_mod, "netns_unavailable", lambda: "no permission (test)")
    monkeypatch.setattr(lab_mod, "run_lab_here",
                        lambda out, p, keylog=None, netns=None: seen.append(netns) or {})
    run_lab(tmp_path / "x.pcapng", LabParams())
    assert seen == [{"used": False, "note": "not in a network namespace of its own "
                                            "(no permission (test))"}]
    run_lab(tmp_path / "x.pcapng", LabParams(netns=False))
    assert seen[-1] == {"used": False, "note": None}
    with pytest.raises(LabError, match=r"network namespace.*no permission"):
        run_lab(tmp_path / "x.pcapng", LabParams(netns=True))


def test_http1_body_framing() -> None:
    from netdiag.lab.h1 import _Body

    body = _Body(None, True)
    buf = bytearray(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n")
    assert b"".join(body.feed(buf)) == b"hello world" and not body.done
    buf += b"\r\nGET"
    assert body.feed(buf) == [] and body.done and buf == b"GET"
    fixed = _Body(3, False)
    buf = bytearray(b"abcdef")
    assert fixed.feed(buf) == [b"abc"] and fixed.done and buf == b"def"


def _listener() -> tuple[socket.socket, int]:
    """A non-blocking listening socket on an ephemeral port of 127.0.0.1, and the port."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.setblocking(False)
    return lsock, lsock.getsockname()[1]


def test_http1_server_client_and_pool_on_an_ephemeral_port() -> None:
    """Keep-alive reuse, ordinals on both sides, chunked SSE, connection: close."""
    from netdiag.lab.h1 import H1ClientConnection, H1Pool, start_http_server
    from netdiag.lab.h2server import stop_h2_server
    from netdiag.lab.sockets import bound_socket

    seen: list[tuple[int | None, str, str, bytes]] = []

    async def handler(stream: Any) -> None:
        body = await stream.body()
        seen.append((stream.ordinal, stream.method, stream.path, body))
        if stream.path == "/sse":
            stream.send_headers(200, [("content-type", "text/event-stream")])
            for i in range(3):
                await stream.send_data(f"data: {i}\n\n".encode())
            await stream.send_data(b"", end_stream=True)
        else:
            stream.send_headers(200, [("content-length", "2")])
            await stream.send_data(b"ok", end_stream=True)

    async def main() -> None:
        lsock, port = _listener()
        servers, conns = await start_http_server(handler, [lsock], None, "http1")
        pool = H1Pool("127.0.0.1", port, None, None, "127.0.0.1", 5.0, cap=2)
        heads = [(":method", "POST"), (":path", "/x"), (":authority", "t")]

        async def one(path: str) -> tuple[str, int, bytes]:
            conn = await pool.acquire()
            try:
                ex = conn.start([(k, path if k == ":path" else v) for k, v in heads], b"{}")
                status, _headers = await ex.response()
                data = b"".join([c async for c in ex.body()])
                assert status == 200
                return conn.local, ex.ordinal, data
            finally:
                pool.release(conn)

        results = await asyncio.gather(*(one("/sse" if i % 2 else "/x") for i in range(6)))
        assert {r[2] for r in results} == {b"ok", b"data: 0\n\ndata: 1\n\ndata: 2\n\n"}
        locals_ = Counter(r[0] for r in results)
        assert len(locals_) <= 2 and sum(locals_.values()) == 6  # the cap holds, reused
        per_conn: dict[str, list[int]] = {}
        for local, ordinal, _ in results:
            per_conn.setdefault(local, []).append(ordinal)
        assert all(sorted(v) == list(range(len(v))) for v in per_conn.values())
        assert sorted(o for o, *_ in seen) == sorted(o for _, o, _ in results)
        await pool.close()
        # a request of its own with connection: close: the server closes first
        single = await H1ClientConnection.open("127.0.0.1", port, None, None,
                                               bound_socket("127.0.0.1"), 5.0)
        ex = single.start(heads, b"", close=True)
        assert (await ex.response())[0] == 200
        assert b"".join([c async for c in ex.body()]) == b"ok"
        await asyncio.wait_for(single.close(), 3)
        await stop_h2_server(servers, conns)

    asyncio.run(main())


def test_origin_pairing_holds_an_answer_until_another_request_shares_its_connection() -> None:
    """``origin_pairing_ms``: the first answer waits for a second request on the same
    HTTP/2 connection (so the two overlap on the wire), a lone one for the limit."""
    from netdiag.lab.h1 import start_http_server
    from netdiag.lab.h2client import H2ClientConnection
    from netdiag.lab.h2server import stop_h2_server
    from netdiag.lab.servers import Origins
    from netdiag.lab.sockets import bound_socket

    pairing_s = 0.3
    origins = Origins("ROC", [], 0.0, 0, 0.0, pairing_s=pairing_s)
    heads = [(":method", "GET"), (":path", "/v1/messages"), (":authority", "t"),
             (":scheme", "http")]

    async def main() -> None:
        lsock, port = _listener()
        servers, conns = await start_http_server(origins.handle, [lsock], None, "h2")

        async def connection() -> H2ClientConnection:
            return await H2ClientConnection.open("127.0.0.1", port, None, None,
                                                 bound_socket("127.0.0.1"), 5.0)

        shared = await connection()
        first = await shared.request(heads, b"")
        answered = asyncio.ensure_future(first.response())
        await asyncio.sleep(pairing_s / 3)
        assert not answered.done(), "answered with no other request on its connection"
        second = await shared.request(heads, b"")
        assert (await answered)[0] == 200 and (await second.response())[0] == 200
        lone = await connection()
        alone = await lone.request(heads, b"")
        assert (await alone.response())[0] == 200
        for c in (shared, lone):
            await asyncio.wait_for(c.close(), 3)
        await stop_h2_server(servers, conns)

    asyncio.run(main())
    a, b, c = origins.log
    # the first answer left once the second request was in, not before
    assert a["paired_ns"] is not None and a["answered_ns"] >= b["received_ns"]
    # the second found the first open: it had company from its arrival
    assert b["paired_ns"] is not None
    assert a["client"] == b["client"] != c["client"]
    # the lone request waited the whole limit (a lower bound: it holds on a busy machine)
    assert c["paired_ns"] is None
    assert c["answered_ns"] - c["received_ns"] >= pairing_s * 1e9 * 0.99


# ---------------------------------------------------------------------- live runs


class _Sink:
    def __init__(self) -> None:
        self.dns_records: list[Any] = []
        self.connections: list[Any] = []

    def dns(self, t: Any) -> None:
        self.dns_records.append(t)

    def connection(self, c: Any) -> None:
        self.connections.append(c)


@pytest.fixture(scope="module", params=list(MODES))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> dict[str, Any]:
    from netdiag.lab import run_lab
    from netdiag.pipeline import analyze

    if not (sys.platform.startswith("linux") and os.geteuid() == 0):
        pytest.skip("needs root on Linux")
    mode = request.param
    out = tmp_path_factory.mktemp(mode) / "lab.pcapng"
    params = LabParams(**{**BASE, **MODES[mode]})
    started = time.monotonic()
    before = children()
    ledger = run_lab(out, params)
    took = time.monotonic() - started
    sink = _Sink()
    analyze([str(out)], sink)
    conns = sorted(sink.connections, key=lambda c: int(c.id[1:]))
    return {"mode": mode, "params": params, "out": out, "ledger": ledger, "conns": conns,
            "dns": sink.dns_records, "took": took, "leftover": children() - before}


def _by_endpoints(conns: list[Any]) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for c in conns:
        assert (c.client, c.server) not in out, f"4-tuple reused: {c.client} {c.server}"
        out[(c.client, c.server)] = c
    return out


def _request_at(conns: dict[tuple[str, str], Any], hop: dict[str, Any]) -> Any:
    """The capture's request a ledger hop names (stream id or ordinal)."""
    c = conns.get((hop["client"], hop["server"]))
    assert c is not None, f"no TCP connection {hop['client']} -> {hop['server']} in the capture"
    if hop["stream_id"] is not None:
        found = [r for r in c.requests if r.stream_id == hop["stream_id"]]
        assert len(found) == 1, (hop, [r.stream_id for r in c.requests])
        return found[0]
    assert hop["ordinal"] is not None
    assert hop["ordinal"] < len(c.requests), (hop, len(c.requests))
    return c.requests[hop["ordinal"]]


def _max_in_flight(reqs: list[Any]) -> int:
    events = sorted([(r.ts_ns, 1) for r in reqs] + [(r.last_byte_ns, -1) for r in reqs
                                                     if r.last_byte_ns is not None])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(120)
def test_run_is_clean(run: dict[str, Any]) -> None:
    """No errors, drops, resets or leftover processes. (How long the run took is not
    asserted: wall time on a shared machine says nothing; the timeout bounds a hang.)"""
    led = run["ledger"]
    p = run["params"]
    assert led["netns"] == {"used": True, "note": None}
    assert led["errors"] == [] and led["capture_drops"] == 0
    for path in ("ROC", "DPF"):
        assert led["paths"][path]["statuses"] == {"200": p.requests + (
            1 if path == "ROC" and p.roc_resume else 0)}
    assert run["leftover"] == set(), "the lab's namespace process is still running"
    assert sum(c.resets for c in run["conns"]) == 0, [
        (c.client, c.server) for c in run["conns"] if c.resets]
    assert all(not r.estimated for c in run["conns"] if c.tls for r in c.requests)


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(120)
def test_every_roc_request_has_its_true_chain_in_the_capture(run: dict[str, Any]) -> None:
    led, conns = run["ledger"], _by_endpoints(run["conns"])
    chains = led["chains"]
    by_id = {r["request_id"]: r for r in led["request_log"]}
    assert sorted(c["request_id"] for c in chains) == sorted(by_id)
    commands = 0
    for chain in chains:
        req = by_id[chain["request_id"]]
        client = _request_at(conns, chain["client"])
        assert client.path == req["url_path"]
        ups = chain["upstream"]
        if chain["path"] == "DPF":
            assert ups == []
            continue
        assert [(u["hop"], u["parent"]) for u in ups] == [
            ("router", 0), ("token-store", 1), ("origin", 1)], chain
        router, store, origin = (_request_at(conns, u) for u in ups)
        assert router.path == origin.path == req["url_path"]
        assert store.method == "EVALSHA"
        commands += 1
        # the upstream requests lie inside the one that caused them, on the wire
        assert client.ts_ns < router.ts_ns < store.ts_ns < origin.ts_ns
        assert origin.first_byte_ns < router.first_byte_ns < client.first_byte_ns
    assert commands == led["router"]["redis_commands"]
    # each hop request is named by exactly one chain
    hops = Counter((u["client"], u["server"], u["stream_id"], u["ordinal"])
                   for c in chains for u in c["upstream"])
    assert max(hops.values()) == 1


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(120)
def test_profile_puts_every_connection_on_its_hop(run: dict[str, Any]) -> None:
    from netdiag.paths.apply import analyze_paths
    from netdiag.paths.profile import load_profile

    profile = load_profile(str(run["out"].with_name("lab.paths.toml")))
    analyze_paths(run["conns"], run["dns"], profile)
    for c in run["conns"]:
        want = HOP_OF_SERVER.get(c.server)
        if want is None:
            assert c.server == f"{P.DNS_IP}:{P.DNS_PORT}", c.server
            continue
        assert c.path is not None and not c.path["inferred"], (c.server, c.path)
        assert (c.path["name"], c.path["hop"]) == want, (c.client, c.server, c.path)


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(120)
def test_the_mode_is_on_the_wire(run: dict[str, Any]) -> None:
    p, led, conns = run["params"], run["ledger"], run["conns"]
    n = p.requests + (1 if p.roc_resume else 0)
    origin_conns = [c for c in conns if c.server in ROC_ORIGINS]
    origin_reqs = [r for c in origin_conns for r in c.requests]
    router_conns = [c for c in conns if c.server == f"{P.ROUTER_IP}:{P.ROUTER_PORT}"]
    store_conns = [c for c in conns if c.server == f"{P.REDIS_IP}:{P.REDIS_PORT}"]
    assert len(origin_reqs) == n
    assert {c.client for c in origin_conns} == {u["client"] for u in led["router"]["upstream_log"]}
    if p.upstream_pool:
        assert len(origin_conns) < n, "pooled, yet a connection per request"
        assert max(len(c.requests) for c in origin_conns) > 1
        if p.origin_protocol == "h2":
            assert len(origin_conns) <= p.origins  # one multiplexed connection per origin
            # the origins held answers for company (origin_pairing_ms): the ledger says
            # some found it, and the wire must show those requests overlapping
            assert led["origin_pairing"]["paired"] > 0, led["origin_pairing"]
            assert max(_max_in_flight(c.requests) for c in origin_conns) > 1
    else:
        assert len(origin_conns) == n and all(len(c.requests) == 1 for c in origin_conns)
    proto = "http/1.1" if p.origin_protocol == "http1" else "h2"
    assert {c.protocol for c in origin_conns} == {proto}
    if proto == "http/1.1":  # one request at a time on each connection
        for c in origin_conns:
            for a, b in zip(c.requests, c.requests[1:], strict=False):
                assert a.last_byte_ns <= b.ts_ns
        sse = [r for r in origin_reqs if r.path == "/v1/stream"]
        assert sse and all(r.sse_events == p.sse_events for r in sse)

    if p.router_protocol == "http1":
        assert {c.protocol for c in router_conns} == {"http/1.1"}
        assert 1 < len(router_conns) <= p.upstream_max_connections
        assert len(router_conns) == led["edge"]["router_connections"]
        for c in router_conns:
            for a, b in zip(c.requests, c.requests[1:], strict=False):
                assert a.last_byte_ns <= b.ts_ns
    else:
        assert len(router_conns) == 1 and router_conns[0].protocol == "h2c"

    sources = {ip_of(c.client) for c in router_conns + store_conns + origin_conns}
    if p.upstream_source == "loopback":
        assert sources == {"127.0.0.1"}
        for chain in led["chains"]:
            assert {ip_of(u["client"]) for u in chain["upstream"]} <= {"127.0.0.1"}
    else:
        assert {ip_of(c.client) for c in router_conns} == {P.EDGE_IP}
        assert {ip_of(c.client) for c in store_conns + origin_conns} == {P.ROUTER_IP}

    headers = Counter(k.lower() for c in conns for r in c.requests
                      for k, _ in (r.request_headers or []) + (r.response_headers or []))
    correlation = {h: headers[h] for h in P.CORRELATION_HEADERS if headers[h]}
    evalsha = [r for c in store_conns for r in c.requests if r.method == "EVALSHA"]
    assert len(evalsha) == led["router"]["redis_commands"] == n
    if p.request_ids:
        assert correlation.get("x-request-id")
    else:
        assert correlation == {}, "a correlation header went on the wire"
        from netdiag.lab.recover import redis_commands

        args = [x["args"][-1] for x in redis_commands(run["out"]) if x["command"] == "EVALSHA"]
        assert args == ["-"] * n

    edge_conns = [c for c in conns if c.server == f"{P.EDGE_IP}:{P.EDGE_PORT}"]
    timing = {}
    for chain in led["chains"]:
        if chain["path"] == "ROC":
            cl = chain["client"]
            timing[(cl["client"], cl["stream_id"])] = chain["server_timing"]
    for c in edge_conns:
        for r in c.requests:
            got = dict(r.response_headers or [])
            sent = timing[(c.client, r.stream_id)]
            if p.server_timing:
                assert got["server-timing"] == sent["server-timing"]
                assert got["x-envoy-upstream-service-time"] == sent[
                    "x-envoy-upstream-service-time"]
                assert got["server-timing"].startswith("edge;dur=")
            else:
                assert "server-timing" not in got and sent is None
    if p.concurrency >= 16:
        client_reqs = [r for c in edge_conns for r in c.requests]
        assert _max_in_flight(client_reqs) >= 8
        assert _max_in_flight(router_conns[0].requests) >= 8


SQUAT = """
import json, socket, sys
from pathlib import Path
from netdiag.lab import LabParams, run_lab
from netdiag.lab.netns import lo_up

lo_up()
squatter = socket.socket()
squatter.bind(("127.0.0.10", 443))
squatter.listen(1)
led = run_lab(Path(sys.argv[1]), LabParams(**json.loads(sys.argv[2])))
print(json.dumps({"netns": led["netns"], "errors": led["errors"],
                  "statuses": led["paths"]["ROC"]["statuses"]}))
"""


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(60)
def test_a_lab_in_its_namespace_ignores_squatted_addresses(tmp_path: Path) -> None:
    """127.0.0.10:443 taken where the lab is started (a namespace of the test's own, so
    that no other lab on this machine is disturbed): the lab runs in its own."""
    params = json.dumps({**BASE, "requests": 4})
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", SQUAT,
                           str(tmp_path / "ns.pcapng"), params], cwd=ROOT,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    led = json.loads(proc.stdout.strip().splitlines()[-1])
    assert led == {"netns": {"used": True, "note": None}, "errors": [],
                   "statuses": {"200": 4}}
    assert children() == set()


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(90)
def test_ctrl_c_stops_a_lab_in_its_namespace(tmp_path: Path) -> None:
    out = tmp_path / "int.pcapng"
    env = {**os.environ, "NETDIAG_LAB_NETNS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "netdiag", "lab", "-w", str(out), "--requests", "2000",
         "--concurrency", "2", "--think-ms", "30", "--no-report"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen |= descendants(proc.pid)
            cmdlines = []
            for pid in seen:
                with contextlib.suppress(OSError):
                    cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            if sum(b"netdiag.lab.serve" in c for c in cmdlines) == 5 and any(
                    b"redis-server" in c for c in cmdlines):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the lab did not come up")
        time.sleep(1.0)  # well into the load
        seen |= descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    from labtools import alive

    assert [pid for pid in seen if alive(pid)] == []
    assert not out.exists()


@pytest.mark.slow
@LIVE
@pytest.mark.timeout(90)
def test_netdiag_lab_reports_on_the_profile_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "cli.pcapng"
    env = {**os.environ, "NETDIAG_LAB_NETNS": "1", "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "netdiag", "lab", "-w", str(out), "--requests", "8",
         "--concurrency", "4", "--think-ms", "5", "--router-delay-ms", "2",
         "--upstream-source", "loopback", "--upstream-pool", "--origin-protocol", "http1",
         "--router-protocol", "http1", "--no-request-ids", "--server-timing"],
        cwd=ROOT, capture_output=True, text=True, timeout=80, env=env)
    assert proc.returncode == 0, proc.stderr
    led = json.loads(out.with_name("cli.expected.json").read_text())
    assert led["params"]["upstream_source"] == "loopback" and led["netns"]["used"]
    # every connection on a path of the profile, none inferred
    line = next(x for x in proc.stdout.splitlines() if x.endswith("(profile)"))
    assert "inferred" not in line and "on ROC (profile)" in line, line
    assert "router: own time" in proc.stdout
