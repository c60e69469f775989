"""The lab's servers: DNS, the ROC edge and router, and the origins of both paths.

Each role runs in a process of its own (``netdiag.lab.serve``, managed by
``netdiag.lab.processes``), so one hop's work never delays another hop's timers: the
delays the lab injects are the delays the capture sees. Every listening socket is
bound before the role reports ready, so a port in use is an error before anything
runs and the kernel accepts connections from then on (no readiness race, no
readiness probes in the capture).

All of them are lean servers (``netdiag.lab.h2server`` for HTTP/2, ``netdiag.lab.h1``
for HTTP/1.1): a general-purpose ASGI server spends one to three milliseconds of
Python per request, which on a small machine would blur the delays the lab injects
(``netdiag.lab.asgi`` keeps the hypercorn origin of the first shipped capture).

* edge (``api.roc.test``): TLS 1.3 + HTTP/2 for clients; forwards each request to the
  router over one pooled cleartext HTTP/2 connection (h2c, prior knowledge), or a
  pool of HTTP/1.1 keep-alive connections (``router_protocol="http1"``), from the
  edge's address (or ``127.0.0.1``: ``upstream_source="loopback"``); adds
  ``via: roc-edge`` (and with ``server_timing``, ``server-timing`` and
  ``x-envoy-upstream-service-time``) to the answer; with ``http3``, also HTTP/3 on
  UDP at the same address and port (``netdiag.lab.h3``, the same handler), and
  ``alt-svc: h3=":443"`` on its HTTP/2 and HTTP/1.1 answers;
* router: h2c or HTTP/1.1; per request one ``EVALSHA`` of the budget script in Redis
  (or, with ``router_budget_per_s``, of the queue script: the request is then held
  for the wait Redis grants it, or refused with 429), then its coordination time,
  then a ROC origin (round robin) over a NEW TLS connection per request, or pooled
  ones (``upstream_pool``), HTTP/2 or HTTP/1.1 (``origin_protocol``), from the
  router's address (or ``127.0.0.1``); adds ``x-router: roc-router``;
* origins: TLS + HTTP/2 or HTTP/1.1 (by ALPN); JSON after a think time, or server-sent
  events (the first after the think time, then one every token gap; chunked over
  HTTP/1.1); ``server: origin-N``, ``x-origin: gpu-N``; ``x-request-id`` echoed when
  there is one.

Every hop logs what it received and what it sent upstream, by endpoints and stream
id or ordinal (``inbound_key``, ``outbound_key``): ``netdiag.lab.chains`` joins the
logs into the ledger's true chains. Each entry also carries the hop's own wall-clock
timestamps (``time.time_ns()``, the clock the capture's kernel timestamps use):
``received_ns`` (the request's HEADERS read), and per hop ``forwarded_ns`` (edge),
``queue_ms`` and ``dispatched_ns`` (router), ``answered_ns`` (origins).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from netdiag.lab import params as P
from netdiag.lab.errors import LabError
from netdiag.lab.h1 import H1Stream
from netdiag.lab.h2client import H2ClientConnection, UpstreamError
from netdiag.lab.h2server import H2ServerProtocol as H2Protocol
from netdiag.lab.h2server import Stream
from netdiag.lab.redis_store import (
    BUDGET_SCRIPT,
    QUEUE_KEY,
    QUEUE_SCRIPT,
    budget_key,
    queue_reply,
    script_sha,
)
from netdiag.lab.resp import RespPool
from netdiag.lab.sockets import bound_socket
from netdiag.lab.timing import sleep_until

log = logging.getLogger("netdiag.lab")

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
              "te", "trailer", "host", "content-length", "date"}

LISTEN_BACKLOG = 1024
"""Listen queue of every lab server (the kernel caps it at ``net.core.somaxconn``)."""


def listening_socket(ip: str, port: int, kind: int) -> socket.socket:
    """A bound (and for TCP listening) non-blocking socket with TCP_NODELAY inherited."""
    sock = socket.socket(socket.AF_INET, kind)
    try:
        if kind == socket.SOCK_STREAM:
            # (for UDP, SO_REUSEADDR would let a second lab share the port silently)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # inherited by accepted sockets (asyncio only sets it when proto is TCP)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((ip, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        what = "in use (another lab running?)" if exc.errno == 98 else (exc.strerror or exc)
        if exc.errno == 13:
            what = "permission denied (run as root)"
        raise LabError(f"cannot bind {ip}:{port}: {what}") from exc
    return sock


def endpoint_of(addr: tuple[str, int] | Any) -> str:
    """``"ip:port"`` of a socket address."""
    return f"{addr[0]}:{addr[1]}"


def inbound_key(stream: Any) -> dict[str, Any]:
    """How a hop names a request it received: its connection's peer and local endpoints,
    its HTTP/2 stream id or its 0-based ordinal on an HTTP/1.1 connection."""
    return {"client": endpoint_of(stream.proto.peer), "server": endpoint_of(stream.local),
            "stream_id": stream.stream_id, "ordinal": stream.ordinal}


def outbound_key(hop: str, conn: Any, server: str, ex: Any) -> dict[str, Any]:
    """How a hop names a request it sent upstream (``ex``, on connection ``conn``)."""
    return {"hop": hop, "client": conn.local, "server": server,
            "stream_id": ex.stream_id, "ordinal": ex.ordinal}


def _relayed(resp_headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in resp_headers if k not in HOP_BY_HOP or k == "content-length"]


@dataclass
class EdgeStats:
    """What the edge did since the last ``reset``."""

    requests: int = 0
    """Requests received from clients."""
    errors: int = 0
    """Requests the router could not answer (the edge answered 502)."""
    router_connections: set[str] = field(default_factory=set)
    """Local endpoints of the connections the edge opened to the router."""
    log: list[dict[str, Any]] = field(default_factory=list)
    """Per request received: ``inbound_key`` + ``upstream`` (the router request it
    sent, ``outbound_key``) + ``server_timing`` (the headers it added, or None) +
    ``received_ns`` (wall clock at which its HEADERS were read) and ``forwarded_ns``
    (at which it was handed to the router connection; None if it never was)."""


class Edge:
    """Terminates the clients' TLS and HTTP/2; forwards to the router.

    ``router_protocol="h2c"``: one cleartext HTTP/2 connection to the router carries
    every request (a new one opens if the router closes it); a request's HEADERS are
    forwarded the moment they arrive, its body when complete. ``"http1"``: a pool of
    HTTP/1.1 keep-alive connections, one request at a time each (a request is
    forwarded whole once its body is complete). Either way from the edge's address
    (``upstream_source="own"``) or ``127.0.0.1``; the router's HEADERS are relayed from
    the callback that reads them, with ``via: roc-edge`` (and, with ``server_timing``,
    ``server-timing`` and ``x-envoy-upstream-service-time``) added.
    """

    def __init__(self, p: P.LabParams) -> None:
        from netdiag.lab.h1 import H1Pool
        from netdiag.lab.h2client import H2Pool

        self.p = p
        self.timeout = p.client_timeout_s
        self.stats = EdgeStats()
        source = p.source_ip(P.EDGE_IP)

        def opened(conn: Any) -> None:
            self.stats.router_connections.add(conn.local)

        self.h1: H1Pool | None = None
        self.h2: H2Pool | None = None
        if p.router_protocol == "http1":
            self.h1 = H1Pool(P.ROUTER_IP, P.ROUTER_PORT, None, None, source, self.timeout,
                             p.upstream_max_connections, opened)
        else:
            self.h2 = H2Pool(P.ROUTER_IP, P.ROUTER_PORT, None, None, source, self.timeout,
                             opened)

    async def close_pool(self) -> None:
        """Close the pooled router connections (new ones open on the next request)."""
        if self.h2 is not None:
            await self.h2.close()
        if self.h1 is not None:
            await self.h1.close()

    async def handle(self, stream: Stream | H1Stream) -> None:
        loop = asyncio.get_running_loop()
        self.stats.requests += 1
        entry: dict[str, Any] = {**inbound_key(stream), "upstream": [], "server_timing": None,
                                 "received_ns": stream.wall_headers, "forwarded_ns": None}
        self.stats.log.append(entry)
        via = [("via", "roc-edge")]
        if self.p.http3 and getattr(stream, "protocol", None) != "h3":
            via.append(("alt-svc", f'h3=":{P.EDGE_PORT}"'))  # RFC 7838 / RFC 9114 3.1.1
        authority = stream.header(":authority") or P.EDGE_NAME
        headers = [(":method", stream.method), (":scheme", "http"), (":authority", authority),
                   (":path", stream.path)]
        headers += [(k, v) for k, v in stream.headers
                    if not k.startswith(":") and k not in HOP_BY_HOP]
        headers.append(("via", "2 roc-edge"))
        forwarded: list[float] = []

        def relay(status: int, resp_headers: list[tuple[str, str]], started: float) -> None:
            mine = list(via)
            if self.p.server_timing and forwarded:
                upstream_s = started - forwarded[0]
                own_s = (loop.time() - stream.t_headers) - upstream_s
                timing = f"edge;dur={own_s * 1000:.3f}, upstream;dur={upstream_s * 1000:.3f}"
                envoy = str(int(upstream_s * 1000))
                mine += [("server-timing", timing), ("x-envoy-upstream-service-time", envoy)]
                entry["server_timing"] = {"server-timing": timing,
                                          "x-envoy-upstream-service-time": envoy,
                                          "edge_ms": round(own_s * 1000, 3),
                                          "upstream_ms": round(upstream_s * 1000, 3)}
            stream.send_headers(status, _relayed(resp_headers) + mine)

        ex: Any = None
        h1conn: Any = None
        try:
            if self.h2 is not None:
                conn = await self.h2.get()
                await conn.stream_slot()
                ended = stream.ended
                forwarded.append(loop.time())
                entry["forwarded_ns"] = time.time_ns()
                ex = conn.start(headers, end_stream=ended, on_headers=relay)
                if not ended:
                    ex.send_body(await stream.body())
            else:
                assert self.h1 is not None
                body = await stream.body()
                conn = h1conn = await self.h1.acquire()
                forwarded.append(loop.time())
                entry["forwarded_ns"] = time.time_ns()
                ex = conn.start(headers, body, on_headers=relay)
            entry["upstream"].append(outbound_key("router", conn,
                                                  f"{P.ROUTER_IP}:{P.ROUTER_PORT}", ex))
            await ex.response()
            async for chunk in ex.body():
                await stream.send_data(chunk)
            await stream.send_data(b"", end_stream=True)
            ex = None
        except UpstreamError as exc:
            self.stats.errors += 1
            log.warning("edge: router request failed: %s", exc)
            with contextlib.suppress(Exception):
                await _answer_json(stream, 502, {"error": "router unreachable"}, via)
        finally:
            if ex is not None:  # the client went away (or the relay failed) mid-answer
                ex.cancel()
            if h1conn is not None and self.h1 is not None:
                self.h1.release(h1conn)


@dataclass
class RouterStats:
    """What the router did since the last ``reset``."""

    requests: int = 0
    """Requests received from the edge."""
    denied: int = 0
    """Requests the token budget (or the queue, when full) refused (429)."""
    errors: int = 0
    """Requests that failed at the token store (503) or the origin (502)."""
    redis_commands: int = 0
    """``EVALSHA`` calls attempted."""
    upstream: list[dict[str, Any]] = field(default_factory=list)
    """One entry per upstream (origin) connection used: client, server, sni,
    tls_version, protocol, request_id (of its first request), requests."""
    store_opened_before: int = 0
    """Redis connections opened before the last ``reset`` (not this load's)."""
    log: list[dict[str, Any]] = field(default_factory=list)
    """Per request received: ``inbound_key`` + ``request_id`` (the header, or None) +
    ``upstream``: the token-store call and the origin request it made, in order; and
    ``received_ns`` (wall clock at which its HEADERS were read), ``store_ms`` (the
    ``EVALSHA`` round trip), ``queue_ms`` (the wait the queue granted, or would have
    had when refused; None without ``router_budget_per_s``), ``denied`` (answered
    429), ``dispatched_ns`` (when it sent the origin request on a pooled connection,
    or began opening the request's own connection; None if it never did)."""


class Router:
    """Token budget (or queue) in Redis, coordination time, then the origin.

    With ``router_budget_per_s`` the ``EVALSHA`` is of ``QUEUE_SCRIPT`` on one key for
    the router: Redis grants each request a start time (slots ``1/R`` apart) and the
    router holds the request until then (that is the queue), or refuses it with 429
    when ``router_queue_limit`` requests are already waiting. The wait is added to the
    time below; without it, the per-model token budget as always.

    ``router_delay_ms`` is the router's own time per request as the wire sees it: from
    the request's arrival to its answer, minus the ``EVALSHA`` round trip and minus the
    upstream exchange (SYN, or the request on a pooled connection, to the origin's
    first answer byte). Its Python processing counts inside that budget: it sends the
    upstream request (or opens its connection) at the request's arrival + the Redis
    round trip + the delay - the time it expects to spend relaying the answer (a
    running average of what relaying took so far), and relays the origin's HEADERS
    from the very callback that reads them.

    Upstream, by ``origin_protocol`` and ``upstream_pool``: a new TLS + HTTP/2 (or
    HTTP/1.1, ``connection: close``) connection per request, or pooled connections per
    origin (HTTP/2: one, multiplexed; HTTP/1.1: keep-alive, one request at a time each).
    Origins are taken round robin.
    """

    RELAY_PRIOR_S = 0.0003
    """Relay time assumed before any was measured."""

    def __init__(self, p: P.LabParams, upstream_ctx: ssl.SSLContext) -> None:
        self.p = p
        self.sha = script_sha(BUDGET_SCRIPT)
        self.queue_sha = script_sha(QUEUE_SCRIPT)
        self.ctx = upstream_ctx
        self.stats = RouterStats()
        self.origins = P.Topology(p.origins).roc_origins
        self._next = 0
        self.relay_s = self.RELAY_PRIOR_S
        self.source = p.source_ip(P.ROUTER_IP)
        self.store = RespPool(P.REDIS_IP, P.REDIS_PORT, self.source, p.client_timeout_s)
        self._pools: dict[str, Any] = {}
        self._conns: dict[str, dict[str, Any]] = {}

    async def close_pool(self) -> None:
        """Close the Redis connections and the pooled origin connections."""
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(pool.close() for pool in pools), return_exceptions=True)
        await self.store.close()

    def _pool(self, ip: str, sni: str) -> Any:
        from netdiag.lab.h1 import H1Pool
        from netdiag.lab.h2client import H2Pool

        pool = self._pools.get(ip)
        if pool is None:
            p = self.p
            if p.origin_protocol == "http1":
                pool = H1Pool(ip, P.ORIGIN_PORT, sni, self.ctx, self.source, p.client_timeout_s,
                              p.upstream_max_connections)
            else:
                pool = H2Pool(ip, P.ORIGIN_PORT, sni, self.ctx, self.source, p.client_timeout_s)
            self._pools[ip] = pool
        return pool

    def _used(self, conn: Any, server: str, sni: str, rid: str | None) -> None:
        rec = self._conns.get(conn.local)
        if rec is None or rec["server"] != server:
            rec = self._conns[conn.local] = {
                "client": conn.local, "server": server, "sni": sni,
                "tls_version": conn.tls_version,
                "protocol": "http/1.1" if self.p.origin_protocol == "http1" else "h2",
                "request_id": rid, "requests": 0}
            self.stats.upstream.append(rec)
        rec["requests"] += 1

    async def handle(self, stream: Stream | H1Stream) -> None:
        from netdiag.lab.h1 import H1ClientConnection

        p = self.p
        loop = asyncio.get_running_loop()
        self.stats.requests += 1
        mine = [("x-router", "roc-router")]
        rid = stream.header("x-request-id")
        entry: dict[str, Any] = {**inbound_key(stream), "request_id": rid, "upstream": [],
                                 "received_ns": stream.wall_headers, "store_ms": None,
                                 "queue_ms": None, "denied": False, "dispatched_ns": None,
                                 "early_ms": None}
        self.stats.log.append(entry)
        model = stream.header("x-model") or p.models[0]
        budget = p.router_budget_per_s
        queued = budget is not None
        wait_s = 0.0
        try:
            self.stats.redis_commands += 1
            sent = loop.time()
            if budget is not None:
                reply, local, ordinal = await self.store.call_traced(
                    "EVALSHA", self.queue_sha, 1, QUEUE_KEY, f"{time.time_ns() / 1e6:.3f}",
                    repr(float(budget)), p.router_queue_limit, rid or "-")
            else:
                reply, local, ordinal = await self.store.call_traced(
                    "EVALSHA", self.sha, 1, budget_key(model), int(time.time() * 1000),
                    p.request_cost, p.budget_tokens, p.refill_per_s, rid or "-")
            store_s = loop.time() - sent
            entry["store_ms"] = round(store_s * 1000, 3)
            if queued:
                allowed, wait_ms = queue_reply(reply)
                entry["queue_ms"] = round(wait_ms, 3)
                wait_s = wait_ms / 1000
            else:
                allowed = bool(int(reply[0]))
            entry["upstream"].append({"hop": "token-store", "client": local,
                                      "server": f"{P.REDIS_IP}:{P.REDIS_PORT}",
                                      "stream_id": None, "ordinal": ordinal})
        except Exception as exc:
            self.stats.errors += 1
            log.warning("router: token store failed: %r", exc)
            await _answer_json(stream, 503, {"error": "token store unavailable"}, mine)
            return
        body = await stream.body()
        if not allowed:
            self.stats.denied += 1
            entry["denied"] = True
            what = "queue full" if queued else "token budget exhausted"
            await _answer_json(stream, 429, {"error": what}, mine)
            return
        if wait_s > 0:  # the queue: hold the request until its slot
            await sleep_until(stream.t_headers + store_s + wait_s)
        ip, sni = self.origins[self._next % len(self.origins)]
        self._next += 1
        server = f"{ip}:{P.ORIGIN_PORT}"
        headers = [(":method", stream.method), (":scheme", "https"), (":authority", sni),
                   (":path", stream.path)]
        headers += [(k, v) for k, v in stream.headers
                    if not k.startswith(":") and k not in HOP_BY_HOP]
        http1 = p.origin_protocol == "http1"
        sock = None if p.upstream_pool else bound_socket(self.source)  # ready before the clock
        entry["early_ms"] = round(self.relay_s * 1000, 3)
        try:
            await sleep_until(stream.t_headers + store_s + wait_s + p.router_delay_ms / 1000
                              - self.relay_s)
        except BaseException:
            if sock is not None:
                sock.close()
            raise

        def relay(status: int, resp_headers: list[tuple[str, str]], started: float) -> None:
            stream.send_headers(status, _relayed(resp_headers) + mine)
            self.relay_s += (loop.time() - started - self.relay_s) / 4

        upstream: Any = None  # a connection of this request alone
        pooled: Any = None  # (pool, connection) of an HTTP/1.1 pool
        ex: Any = None
        try:
            if sock is not None:
                entry["dispatched_ns"] = time.time_ns()
            if sock is not None and http1:
                upstream = conn = await H1ClientConnection.open(
                    ip, P.ORIGIN_PORT, sni, self.ctx, sock, p.client_timeout_s)
                ex = conn.start(headers, body, relay, close=True)
            elif sock is not None:
                upstream = conn = await H2ClientConnection.open(
                    ip, P.ORIGIN_PORT, sni, self.ctx, sock, p.client_timeout_s,
                    first=(headers, body, relay))
                ex = conn.first
            elif http1:
                pool = self._pool(ip, sni)
                conn = await pool.acquire()
                pooled = (pool, conn)
                entry["dispatched_ns"] = time.time_ns()
                ex = conn.start(headers, body, relay)
            else:
                conn = await self._pool(ip, sni).get()
                await conn.stream_slot()
                entry["dispatched_ns"] = time.time_ns()
                ex = conn.start(headers, not body, relay)
                if body:
                    conn.send_data(ex.stream_id, body)
            assert ex is not None
            self._used(conn, server, sni, rid)
            entry["upstream"].append(outbound_key("origin", conn, server, ex))
            await ex.response()
            async for chunk in ex.body():
                await stream.send_data(chunk)
            await stream.send_data(b"", end_stream=True)
            ex = None
        except UpstreamError as exc:
            self.stats.errors += 1
            log.warning("router: %s", exc)
            with contextlib.suppress(Exception):
                await _answer_json(stream, 502, {"error": "origin unreachable"}, mine)
        finally:
            if ex is not None:
                ex.cancel()
            if pooled is not None:
                pooled[0].release(pooled[1])
            if upstream is not None:
                await upstream.close()


async def _answer_json(stream: Stream | H1Stream, status: int, doc: dict[str, Any],
                       headers: list[tuple[str, str]]) -> None:
    payload = json.dumps(doc, separators=(",", ":")).encode()
    stream.send_headers(status, [("content-type", "application/json"),
                                 ("content-length", str(len(payload))), *headers])
    await stream.send_data(payload, end_stream=True)


class Origins:
    """The origin ("GPU") servers of one path, answering from the request's arrival.

    ``POST``/``GET /v1/messages``: JSON, whose HEADERS leave ``think_s`` after the
    request's HEADERS arrived (and never before its body is complete);
    ``/v1/stream``: server-sent events, the first at that same time, then one every
    ``gap_s`` (on a fixed schedule, so the cadence does not drift). With ``pairing_s``
    an HTTP/2 answer also waits, at most that long, until another request is or was open
    on its connection with it (the schedule of its events then starts later).
    Headers: ``server: origin-N``, ``x-origin: gpu-N``, ``x-request-id`` echoed.
    """

    def __init__(self, label: str, origins: list[tuple[str, str]], think_s: float,
                 sse_events: int, gap_s: float, pairing_s: float | None = None) -> None:
        self.label = label
        self.identity = {ip: (f"origin-{n}", name.split(".")[0])
                         for n, (ip, name) in enumerate(origins, 1)}
        self.think_s = think_s
        self.sse_events = sse_events
        self.gap_s = gap_s
        self.served: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        """Every request received: ``inbound_key`` + ``received_ns`` (wall clock at
        which its HEADERS were read) + ``answered_ns`` (at which the first byte of the
        answer was handed to the connection); with ``pairing_s``, ``paired_ns`` too (at
        which another request was open on the connection; None: none came in time)."""
        self.pairing_s = pairing_s
        """Hold each HTTP/2 answer until another request is open on its connection, or
        this long (``LabParams.origin_pairing_ms``); None: no hold."""
        self._open: dict[H2Protocol, set[asyncio.Event]] = {}
        """For each connection, one event per request open on it: set once another
        request is or was open on that connection with it."""

    async def handle(self, stream: Stream | H1Stream) -> None:
        conn = stream.proto if self.pairing_s is not None and isinstance(stream, Stream) \
            else None
        if conn is None:
            await self._answer(stream, None)
            return
        company = asyncio.Event()
        others = self._open.setdefault(conn, set())
        for other in others:
            other.set()
        if others:
            company.set()
        others.add(company)
        try:
            await self._answer(stream, company)
        finally:
            others.discard(company)
            if not others:
                del self._open[conn]

    async def _in_company(self, company: asyncio.Event) -> int | None:
        """Wait until another request is or was open on this one's connection with it
        (``company`` is set), at most ``pairing_s``; when it was seen (wall clock), or
        None."""
        assert self.pairing_s is not None
        try:
            await asyncio.wait_for(company.wait(), self.pairing_s)
        except TimeoutError:
            return None
        return time.time_ns()

    async def _answer(self, stream: Stream | H1Stream,
                      company: asyncio.Event | None) -> None:
        server_name, origin = self.identity.get(stream.local[0], (self.label, self.label))
        self.served[origin] += 1
        entry: dict[str, Any] = {**inbound_key(stream), "received_ns": stream.wall_headers,
                                 "answered_ns": None}
        self.log.append(entry)
        body = await stream.body()
        headers = [("server", server_name), ("x-origin", origin)]
        rid = stream.header("x-request-id")
        if rid is not None:
            headers.append(("x-request-id", rid))
        model = None
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                model = json.loads(body).get("model")
        path, method = stream.path.partition("?")[0], stream.method
        if method not in ("GET", "POST") or path not in ("/v1/messages", "/v1/stream"):
            entry["answered_ns"] = time.time_ns()
            await _answer_json(stream, 404, {"error": "not found"}, headers)
            return
        start = stream.t_headers + self.think_s
        await sleep_until(start)
        if company is not None:
            entry["paired_ns"] = await self._in_company(company)
            start = max(start, asyncio.get_running_loop().time())
        entry["answered_ns"] = time.time_ns()
        if path == "/v1/messages":
            await _answer_json(stream, 200, {
                "id": f"{origin}-{self.served[origin]:04d}", "server": self.label,
                "origin": origin, "method": method, "model": model,
                "received_bytes": len(body), "text": "ok"}, headers)
            return
        stream.send_headers(200, [("content-type", "text/event-stream"),
                                  ("cache-control", "no-cache"), *headers],
                            end_stream=self.sse_events == 0)
        for i in range(self.sse_events):
            if i:
                await sleep_until(start + i * self.gap_s)
            event = json.dumps({"index": i, "token": f"tok{i}"}, separators=(",", ":"))
            await stream.send_data(f"data: {event}\n\n".encode(),
                                   end_stream=i == self.sse_events - 1)
