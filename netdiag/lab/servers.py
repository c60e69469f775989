"""The lab's servers: DNS, the ROC edge and router, and the origins of both paths.

Each role runs in a process of its own (``netdiag.lab.serve``, managed by
``netdiag.lab.processes``), so one hop's work never delays another hop's timers: the
delays the lab injects are the delays the capture sees. Every listening socket is
bound before the role reports ready, so a port in use is an error before anything
runs and the kernel accepts connections from then on (no readiness race, no
readiness probes in the capture).

All of them are lean HTTP/2 servers (``netdiag.lab.h2server``): a general-purpose
ASGI server spends one to three milliseconds of Python per request, which on a small
machine would blur the delays the lab injects (``netdiag.lab.asgi`` keeps the hypercorn
origin of the first shipped capture for tests that need HTTP/1.1).

* edge (``api.roc.test``): TLS 1.3 + HTTP/2 for clients; forwards each request to the
  router over one pooled cleartext HTTP/2 connection (h2c, prior knowledge) from the
  edge's address, and adds ``via: roc-edge`` to the answer;
* router: h2c; per request one ``EVALSHA`` of the budget script in Redis, then its
  coordination time, then a NEW TLS + HTTP/2 connection from the router's address to
  a ROC origin (round robin); adds ``x-router: roc-router``;
* origins: TLS + HTTP/2; JSON after a think time, or server-sent events (the first
  after the think time, then one every token gap); ``server: origin-N``,
  ``x-origin: gpu-N``; ``x-request-id`` echoed.
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
from netdiag.lab.h2client import H2ClientConnection, UpstreamError, bound_socket
from netdiag.lab.h2server import Stream
from netdiag.lab.redis_store import BUDGET_SCRIPT, budget_key, script_sha
from netdiag.lab.resp import RespPool
from netdiag.lab.timing import sleep_until

log = logging.getLogger("netdiag.lab")

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
              "te", "trailer", "host", "content-length", "date"}

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
            sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        what = "in use (another lab running?)" if exc.errno == 98 else (exc.strerror or exc)
        if exc.errno == 13:
            what = "permission denied (run as root)"
        raise LabError(f"cannot bind {ip}:{port}: {what}") from exc
    return sock


@dataclass
class EdgeStats:
    requests: int = 0
    errors: int = 0
    router_connections: set[str] = field(default_factory=set)


class Edge:
    """Terminates the clients' TLS and HTTP/2; forwards to the router over pooled h2c.

    One cleartext HTTP/2 connection from the edge's address to the router carries
    every request (a new one opens if the router closes it). A request's HEADERS are
    forwarded the moment they arrive, its body when complete; the router's HEADERS
    are relayed from the callback that reads them, with ``via: roc-edge`` added.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.stats = EdgeStats()
        self._conn: H2ClientConnection | None = None
        self._lock = asyncio.Lock()

    async def _router(self) -> H2ClientConnection:
        async with self._lock:
            if self._conn is None or self._conn.closed:
                sock = bound_socket(P.EDGE_IP)
                self._conn = await H2ClientConnection.open(
                    P.ROUTER_IP, P.ROUTER_PORT, None, None, sock, self.timeout)
                self.stats.router_connections.add(self._conn.local)
            return self._conn

    async def close_pool(self) -> None:
        """Close the pooled router connection (a new one opens on the next request)."""
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def handle(self, stream: Stream) -> None:
        self.stats.requests += 1
        via = [("via", "roc-edge")]
        authority = stream.header(":authority") or P.EDGE_NAME
        headers = [(":method", stream.method), (":scheme", "http"), (":authority", authority),
                   (":path", stream.path)]
        headers += [(k, v) for k, v in stream.headers
                    if not k.startswith(":") and k not in HOP_BY_HOP]
        headers.append(("via", "2 roc-edge"))

        def relay(status: int, resp_headers: list[tuple[str, str]], _started: float) -> None:
            out = [(k, v) for k, v in resp_headers if k not in HOP_BY_HOP or k == "content-length"]
            stream.send_headers(status, out + via)

        ex = None
        try:
            conn = await self._router()
            ended = stream.ended
            ex = conn.start(headers, end_stream=ended, on_headers=relay)
            if not ended:
                ex.send_body(await stream.body())
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


@dataclass
class RouterStats:
    requests: int = 0
    denied: int = 0
    errors: int = 0
    redis_commands: int = 0
    upstream: list[dict[str, Any]] = field(default_factory=list)
    store_opened_before: int = 0


class Router:
    """Token budget in Redis, coordination time, a new upstream connection per request.

    ``router_delay_ms`` is the router's own time per request as the wire sees it: from
    the request's arrival to its answer, minus the ``EVALSHA`` round trip and minus the
    upstream exchange (SYN to the origin's first answer byte). Its Python processing
    counts inside that budget: it opens the upstream connection at the request's
    arrival + the Redis round trip + the delay - the time it expects to spend relaying
    the answer (a running average of what relaying took so far), and relays the
    origin's HEADERS from the very callback that reads them.
    """

    RELAY_PRIOR_S = 0.0003
    """Relay time assumed before any was measured."""

    def __init__(self, p: P.LabParams, upstream_ctx: ssl.SSLContext) -> None:
        self.p = p
        self.sha = script_sha(BUDGET_SCRIPT)
        self.ctx = upstream_ctx
        self.stats = RouterStats()
        self.origins = P.Topology(p.origins).roc_origins
        self._next = 0
        self.relay_s = self.RELAY_PRIOR_S
        self.store = RespPool(P.REDIS_IP, P.REDIS_PORT, P.ROUTER_IP, p.client_timeout_s)

    async def close_pool(self) -> None:
        """Close the Redis connections."""
        await self.store.close()

    async def handle(self, stream: Stream) -> None:
        p = self.p
        loop = asyncio.get_running_loop()
        self.stats.requests += 1
        mine = [("x-router", "roc-router")]
        rid = stream.header("x-request-id")
        model = stream.header("x-model") or p.models[0]
        try:
            self.stats.redis_commands += 1
            sent = loop.time()
            allowed, _left = await self.store.call(
                "EVALSHA", self.sha, 1, budget_key(model), int(time.time() * 1000),
                p.request_cost, p.budget_tokens, p.refill_per_s, rid or "-")
            store_s = loop.time() - sent
        except Exception as exc:
            self.stats.errors += 1
            log.warning("router: token store failed: %r", exc)
            await _answer_json(stream, 503, {"error": "token store unavailable"}, mine)
            return
        body = await stream.body()
        if not int(allowed):
            self.stats.denied += 1
            await _answer_json(stream, 429, {"error": "token budget exhausted"}, mine)
            return
        ip, sni = self.origins[self._next % len(self.origins)]
        self._next += 1
        headers = [(":method", stream.method), (":scheme", "https"), (":authority", sni),
                   (":path", stream.path)]
        headers += [(k, v) for k, v in stream.headers
                    if not k.startswith(":") and k not in HOP_BY_HOP]
        sock = bound_socket(P.ROUTER_IP)  # ready before the clock runs out
        try:
            await sleep_until(stream.t_headers + store_s + p.router_delay_ms / 1000
                              - self.relay_s)
        except BaseException:
            sock.close()
            raise

        def relay(status: int, resp_headers: list[tuple[str, str]], started: float) -> None:
            out = [(k, v) for k, v in resp_headers if k not in HOP_BY_HOP or k == "content-length"]
            stream.send_headers(status, out + mine)
            self.relay_s += (loop.time() - started - self.relay_s) / 4

        upstream: H2ClientConnection | None = None
        try:
            upstream = await H2ClientConnection.open(ip, P.ORIGIN_PORT, sni, self.ctx, sock,
                                                     p.client_timeout_s,
                                                     first=(headers, body, relay))
            self.stats.upstream.append({"client": upstream.local,
                                        "server": f"{ip}:{P.ORIGIN_PORT}", "sni": sni,
                                        "tls_version": upstream.tls_version,
                                        "request_id": rid})
            ex = upstream.first
            assert ex is not None
            await ex.response()
            async for chunk in ex.body():
                await stream.send_data(chunk)
            await stream.send_data(b"", end_stream=True)
        except UpstreamError as exc:
            self.stats.errors += 1
            log.warning("router: %s", exc)
            with contextlib.suppress(Exception):
                await _answer_json(stream, 502, {"error": "origin unreachable"}, mine)
        finally:
            if upstream is not None:
                await upstream.close()


async def _answer_json(stream: Stream, status: int, doc: dict[str, Any],
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
    ``gap_s`` (on a fixed schedule, so the cadence does not drift).
    Headers: ``server: origin-N``, ``x-origin: gpu-N``, ``x-request-id`` echoed.
    """

    def __init__(self, label: str, origins: list[tuple[str, str]], think_s: float,
                 sse_events: int, gap_s: float) -> None:
        self.label = label
        self.identity = {ip: (f"origin-{n}", name.split(".")[0])
                         for n, (ip, name) in enumerate(origins, 1)}
        self.think_s = think_s
        self.sse_events = sse_events
        self.gap_s = gap_s
        self.served: Counter[str] = Counter()
        self.trace: list = []

    async def handle(self, stream: Stream) -> None:
        server_name, origin = self.identity.get(stream.local[0], (self.label, self.label))
        self.served[origin] += 1
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
            await _answer_json(stream, 404, {"error": "not found"}, headers)
            return
        start = stream.t_headers + self.think_s
        await sleep_until(start)
        self.trace.append((rid, stream.wall_headers, time.time_ns()))
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
