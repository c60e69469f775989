"""A simulated edge -> router -> (token store, origin) topology with concurrency and pools.

Unlike ``paths_synth`` (one hand-placed request at a time), this draws arrivals,
delays and think times at random, sends every proxy's upstream requests over pooled
keep-alive connections (HTTP/1.1: one request at a time per connection; HTTP/2:
multiplexed on one), from a configurable source address, with or without request ids,
and records the true chain of every client request. Times in milliseconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from paths_synth import ns

from netdiag.records import Connection, Request

EDGE = "127.0.0.10:443"
ROUTER = "127.0.0.11:8080"
REDIS = "127.0.0.12:6379"
ORIGINS = ["127.0.0.21:443", "127.0.0.22:443", "127.0.0.23:443"]
DIRECT = "127.0.0.31:443"


@dataclass
class SimParams:
    """What the simulated proxies do."""

    requests: int = 64
    concurrency: int = 16
    """Client requests in flight at once (arrivals are spread so that about this many
    overlap)."""
    source: str = "own"
    """``own``: each proxy connects upstream from its listen address; ``loopback``: from
    127.0.0.1, like the client."""
    upstream: str = "http1"
    """``http1`` (a pool of keep-alive connections, one request at a time each) or
    ``h2`` (one multiplexed connection per upstream server)."""
    request_ids: bool = False
    router_ms: tuple[float, float] = (8.0, 14.0)
    """Range of the router's own time between its token call and its origin call."""
    think_ms: tuple[float, float] = (15.0, 60.0)
    """Range of the origin's think time."""
    upload_ms: tuple[float, float] = (0.0, 0.0)
    """Range of the time the client's request body takes to arrive. The edge forwards
    the headers at once and the body as it comes; the router reads the whole body
    before it calls the token store (it counts the prompt's tokens), over a pool of
    connections to it."""
    direct: int = 0
    """Unrelated requests from another client straight to an origin-like server, at
    random times (a second path)."""
    seed: int = 1


@dataclass
class Truth:
    """The true chain of one client request: (connection id, request index) per hop."""

    client: tuple[str, int]
    router: tuple[str, int]
    store: tuple[str, int]
    origin: tuple[str, int]
    router_own_ms: float
    origin_wait_ms: float


@dataclass
class _Pool:
    """Keep-alive upstream connections of one proxy to one server."""

    server: str
    source_ip: str
    protocol: str
    prefix: str
    conns: list[Connection] = field(default_factory=list)
    busy_until: list[float] = field(default_factory=list)
    port: int = 50000

    def take(self, at: float, until: float, mux: bool) -> Connection:
        if mux and self.conns:
            return self.conns[0]
        for i, b in enumerate(self.busy_until):
            if b <= at:
                self.busy_until[i] = until
                return self.conns[i]
        self.port += 1
        c = Connection(id="", ts_ns=ns(at - 0.3), client=f"{self.source_ip}:{self.port}",
                       server=self.server, syn_ns=ns(at - 0.3), handshake_ack_ns=ns(at - 0.25),
                       handshake_seen=True, protocol=self.protocol)
        self.conns.append(c)
        self.busy_until.append(until)
        return c


def simulate(p: SimParams) -> tuple[list[Connection], list[Truth]]:
    """Connections (ids assigned, requests in time order) and the truth per request."""
    rng = random.Random(p.seed)
    mean_total = 1.0 + sum(p.router_ms) / 2 + sum(p.think_ms) / 2 + 2.0
    gap = mean_total / p.concurrency
    src_edge = "127.0.0.1" if p.source == "loopback" else EDGE.split(":")[0]
    src_router = "127.0.0.1" if p.source == "loopback" else ROUTER.split(":")[0]
    proto = "http/1.1" if p.upstream == "http1" else "h2c"
    mux = p.upstream == "h2"
    to_router = _Pool(ROUTER, src_edge, proto, "R")
    to_redis = _Pool(REDIS, src_router, "resp", "S")
    to_origin = {o: _Pool(o, src_router, "http/1.1" if p.upstream == "http1" else "h2",
                          "O") for o in ORIGINS}
    clients: list[Connection] = []
    placed: list[tuple[Connection, Request, str]] = []
    truths: list[tuple[Connection, Request, Connection, Request, Connection, Request,
                       Connection, Request, float, float]] = []
    t = 0.0
    redis_free = 0.0
    for i in range(p.requests):
        t += rng.expovariate(1.0 / gap)
        body = rng.randrange(40, 400)
        rid = [("x-request-id", f"r{i}")] if p.request_ids else []
        size = rng.randrange(50, 2000)
        # edge: forwards 0.2-0.6 ms after the client's request
        e0 = t + rng.uniform(0.2, 0.6)
        c_end, r_end = t, e0
        if p.upload_ms[1] > 0:  # (drawn only then: the other topologies stay the same)
            c_end = t + rng.uniform(*p.upload_ms)
            r_end = max(e0, c_end + rng.uniform(0.05, 0.2))
        # router: calls redis 0.1-0.4 ms after arrival; redis serialises (one connection).
        # With uploads, once the body is in, over a pool: the commands go out in the
        # order the bodies came, not the requests, and a connection opened for one
        # (its SYN 0.3 ms before the command) is opened 0.1-0.4 ms after the body
        if p.upload_ms[1]:
            s0 = r_end + 0.3 + rng.uniform(0.1, 0.4)
        else:
            s0 = max(e0 + rng.uniform(0.1, 0.4), redis_free)
        s1 = s0 + rng.uniform(0.1, 0.5)
        redis_free = s1
        own = rng.uniform(*p.router_ms)
        o0 = s1 + own
        think = rng.uniform(*p.think_ms)
        o_fb = o0 + think
        o_lb = o_fb + rng.uniform(0.1, 3.0)
        r_fb = o_fb + rng.uniform(0.1, 0.4)
        r_lb = o_lb + rng.uniform(0.1, 0.4)
        e_fb = r_fb + rng.uniform(0.1, 0.4)
        e_lb = r_lb + rng.uniform(0.1, 0.4)

        def http(ts: float, fb: float, lb: float, proto_: str, auth: str, body: int = body,
                 size: int = size, rid: list[tuple[str, str]] = rid) -> Request:
            return Request(ts_ns=ns(ts), first_byte_ns=ns(fb), last_byte_ns=ns(lb),
                           method="POST", path="/v1/messages", authority=auth,
                           status=200, estimated=False, protocol=proto_,
                           request_bytes=body, response_bytes=size,
                           request_headers=[(":method", "POST"), (":path", "/v1/messages"),
                                            *rid])

        cr = http(t, e_fb, e_lb, "h2", "api.test")
        cr.end_ns = ns(c_end)
        cc = Connection(id="", ts_ns=ns(t - 2), client=f"127.0.0.1:{30000 + i}", server=EDGE,
                        syn_ns=ns(t - 2), handshake_ack_ns=ns(t - 1.9), handshake_seen=True,
                        protocol="h2")
        cc.requests.append(cr)
        clients.append(cc)
        rr = http(e0, r_fb, r_lb, proto, "router")
        rr.end_ns = ns(r_end)
        rc = to_router.take(e0, r_lb, mux)
        sr = Request(ts_ns=ns(s0), first_byte_ns=ns(s1), last_byte_ns=ns(s1), method="EVALSHA",
                     path="budget", estimated=False, protocol="resp")
        sc = to_redis.take(s0, s1, not p.upload_ms[1])
        origin = ORIGINS[i % len(ORIGINS)]
        orq = http(o0, o_fb, o_lb, "http/1.1" if p.upstream == "http1" else "h2", "origin")
        oc = to_origin[origin].take(o0, o_lb, mux)
        for c, r in ((rc, rr), (sc, sr), (oc, orq)):
            placed.append((c, r, ""))
        truths.append((cc, cr, rc, rr, sc, sr, oc, orq, own, think))
    for c, r, _ in placed:
        c.requests.append(r)
    direct: list[Connection] = []
    end = t + mean_total
    for k in range(p.direct):
        ts = rng.uniform(0, end)
        think = rng.uniform(*p.think_ms)
        dc = Connection(id="", ts_ns=ns(ts - 2), client=f"127.0.0.3:{20000 + k}",
                        server=DIRECT, syn_ns=ns(ts - 2), handshake_ack_ns=ns(ts - 1.9),
                        handshake_seen=True, protocol="h2")
        dc.requests.append(Request(ts_ns=ns(ts), first_byte_ns=ns(ts + think),
                                   last_byte_ns=ns(ts + think + 1), method="POST",
                                   path="/v1/messages", status=200, estimated=False,
                                   protocol="h2", request_bytes=100, response_bytes=100))
        direct.append(dc)
    upstream = [c for pool in (to_router, to_redis, *to_origin.values()) for c in pool.conns]
    conns = clients + upstream + direct
    for n, c in enumerate(conns, 1):
        c.id = f"C{n}"
        c.requests.sort(key=lambda r: r.ts_ns)
        c.last_ns = max(r.last_byte_ns or r.ts_ns for r in c.requests) + 1_000_000

    def key(c: Connection, r: Request) -> tuple[str, int]:
        return c.id, next(k for k, x in enumerate(c.requests) if x is r)

    out = [Truth(key(cc, cr), key(rc, rr), key(sc, sr), key(oc, orq), own, think)
           for cc, cr, rc, rr, sc, sr, oc, orq, own, think in truths]
    return conns, out
