"""The lab's load driver: ROC and DPF clients, a request mix, and a ledger of what they did.

* ROC clients connect from ``127.0.0.2`` to the edge (``api.roc.test``, resolved
  through the lab's DNS) over TLS 1.3 and HTTP/2 with httpx; pooled (keep-alive) or a
  new connection per request.
* DPF clients connect from ``127.0.0.3`` straight to an origin they pick with a
  stateless hash: ``xxh64(model|user|time bucket) % origins``; its name
  (``gpu-N.dpf.test``) is resolved through the lab's DNS (once per name and client).
* Each path gets ``requests`` requests, ``concurrency`` at a time; a share
  ``sse_share`` of them ask for a streamed answer (``/v1/stream``), the rest for JSON
  (``/v1/messages``). Every request carries ``x-model``, ``x-user`` and (unless
  ``request_ids`` is off) ``x-request-id``; all are ``POST`` with a small JSON body.
* Every TLS secret goes to the key log (the clients' ``ssl`` context ``keylog_filename``).

With ``LabParams.ramp`` the load is open loop instead (``netdiag.lab.ramp``): per
path, requests arrive at the times of a Poisson process whose rate ramps from
``from_rps`` to ``to_rps``; a scheduler launches each as a task of its own at its
time and never waits for an answer, over the lab's lean HTTP/2 client
(``netdiag.lab.h2client``, the one its proxies use: none of httpx's per-request pool
and model machinery), on connections opened before the clock starts and as many
more as the servers' stream limit asks for (``RAMP_MAX_CONNECTIONS`` per server).
The ramp's driver runs in a process of its own (``netdiag.lab.loadgen``).

The ledger records, per request, what the client saw (status, stream id, local
endpoint, response headers that name the hops, SSE events, ``scheduled_ts`` and
``sent_ts``), per connection its TLS facts, and every DNS query.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dns.asyncquery
import dns.message
import dns.rcode
import dns.rdatatype

from netdiag.lab import params as P
from netdiag.lab.errors import LabError
from netdiag.lab.h2client import H2ClientConnection, UpstreamError, open_shared
from netdiag.lab.sockets import bound_socket

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
TLS_NAMES = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2", "TLSv1.1": "TLS 1.1", "TLSv1": "TLS 1.0"}
HOP_HEADERS = ("server", "x-origin", "via", "x-router", "x-request-id", "server-timing",
               "x-envoy-upstream-service-time")
"""Response headers the ledger keeps per request (None when absent)."""
RAMP_LEAD_S = 0.2
"""The ramp's clock starts this long after its connections are open."""
RAMP_MAX_CONNECTIONS = 64
"""Connections a ramp client opens at most to one server (a new one only when every
other has as many streams open as the server allows)."""


@contextlib.contextmanager
def ramp_priority(realtime: bool) -> Iterator[None]:
    """During a ramp, the calling thread (the clients' event loop) one real-time
    priority above the servers (``netdiag.lab.serve.RT_PRIORITY`` + 1, when
    permitted), restored on exit. The clients
    stand for the world outside the system under test: the real-time servers keeping
    both cores busy must not hold back the moment a request leaves."""
    from netdiag.lab.serve import RT_PRIORITY

    previous: tuple[int, os.sched_param] | None = None
    if realtime:
        with contextlib.suppress(AttributeError, OSError, PermissionError):
            policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY + 1))
            previous = (policy, param)
    try:
        yield
    finally:
        if previous is not None:
            with contextlib.suppress(OSError, PermissionError):
                os.sched_setscheduler(0, *previous)


def dpf_pick(model: str, user: str, bucket: int, origins: int) -> int:
    """DPF's stateless origin choice (0-based): xxh64 of model, user and time bucket."""
    import xxhash

    return xxhash.xxh64_intdigest(f"{model}|{user}|{bucket}".encode()) % origins


@dataclass
class PlannedRequest:
    """One request of the plan."""

    rid: str
    """The lab's id (``roc-0001``): sent as ``x-request-id`` unless ids are off."""
    path: str
    """``ROC`` or ``DPF``."""
    sse: bool
    """Asks for a streamed answer (``/v1/stream``)."""
    model: str
    """``x-model`` and the body's model."""
    user: str
    """``x-user``."""

    @property
    def url_path(self) -> str:
        return "/v1/stream" if self.sse else "/v1/messages"

    def body(self) -> dict[str, Any]:
        return {"model": self.model, "stream": self.sse,
                "messages": [{"role": "user", "content": f"hello from {self.user}"}]}


def ramp_plan(p: P.LabParams) -> dict[str, list[tuple[float, PlannedRequest]]]:
    """Per path, (scheduled offset in s, request) of a ramp: the schedule
    (``netdiag.lab.ramp.ramp_schedule``) and a mix drawn from the seed."""
    from netdiag.lab.ramp import ramp_schedule

    assert p.ramp is not None
    out: dict[str, list[tuple[float, PlannedRequest]]] = {}
    for path in ("ROC", "DPF"):
        times = ramp_schedule(p.ramp, p.seed, path)
        rng = random.Random(f"netdiag-lab-mix|{p.seed}|{path}")
        width = max(4, len(str(len(times))))
        out[path] = [(t, PlannedRequest(f"{path.lower()}-{i + 1:0{width}d}", path,
                                        rng.random() < p.sse_share, rng.choice(p.models),
                                        f"user-{rng.randrange(p.users) + 1:02d}"))
                     for i, t in enumerate(times)]
    return out


def plan(p: P.LabParams) -> dict[str, list[PlannedRequest]]:
    """The request mix of both paths, from the seed (the same on every run)."""
    rng = random.Random(p.seed)
    out: dict[str, list[PlannedRequest]] = {}
    for path in ("ROC", "DPF"):
        n_sse = round(p.requests * p.sse_share)
        kinds = [True] * n_sse + [False] * (p.requests - n_sse)
        rng.shuffle(kinds)
        out[path] = [PlannedRequest(f"{path.lower()}-{i + 1:04d}", path, sse,
                                    rng.choice(p.models), f"user-{rng.randrange(p.users) + 1:02d}")
                     for i, sse in enumerate(kinds)]
    return out


@dataclass
class Ledger:
    """What the clients actually did."""

    dns: list[dict[str, Any]] = field(default_factory=list)
    """Every DNS query and its answer."""
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Client connections by local endpoint, with their TLS facts and requests."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Every request: what the client sent and saw."""
    errors: list[str] = field(default_factory=list)
    """Requests that failed, one line each."""
    ramp_start_ts: float | None = None
    """Wall clock (epoch s) at which a ramp's schedule starts (None: no ramp)."""
    offered: dict[str, int] = field(default_factory=dict)
    """Requests a ramp scheduled, per path."""

    def connection(self, path: str, client: str, server: str, sni: str,
                   ssl_object: Any) -> dict[str, Any]:
        rec = self.connections.get(client)
        if rec is None:
            cipher = ssl_object.cipher() if ssl_object is not None else None
            version = ssl_object.version() if ssl_object is not None else None
            rec = self.connections[client] = {
                "path": path, "client": client, "server": server, "sni": sni,
                "tls_version": TLS_NAMES.get(version or "", version),
                "cipher": cipher[0] if cipher else None,
                "alpn": ssl_object.selected_alpn_protocol() if ssl_object is not None else None,
                "resumed": bool(ssl_object.session_reused) if ssl_object is not None else False,
                "requests": [],
            }
        return rec


class _RampPool:
    """A ramp client's HTTP/2 connections to one server (TLS, from ``source``).

    A request takes the first connection with a stream to spare (under the server's
    ``SETTINGS_MAX_CONCURRENT_STREAMS``); a new connection opens only when every one is
    full, at most ``RAMP_MAX_CONNECTIONS``; beyond that a request waits for a stream.
    """

    def __init__(self, ip: str, port: int, sni: str, ctx: ssl.SSLContext, source: str,
                 timeout: float) -> None:
        self.ip = ip
        self.port = port
        self.sni = sni
        self.ctx = ctx
        self.source = source
        self.timeout = timeout
        self.conns: list[H2ClientConnection] = []
        self._opening: asyncio.Future[H2ClientConnection] | None = None

    @staticmethod
    def _room(conn: H2ClientConnection) -> bool:
        return (not conn.closed
                and len(conn.exchanges) < conn.conn.remote_settings.max_concurrent_streams)

    async def warm(self) -> None:
        """Open the first connection now (before the ramp's clock starts)."""
        await self.get()

    async def get(self) -> H2ClientConnection:
        """A connection with a free stream (opened now if need be)."""
        while True:
            self.conns = [c for c in self.conns if not c.closed]
            for conn in self.conns:
                if self._room(conn):
                    return conn
            if self._opening is not None:
                await asyncio.shield(self._opening)
                continue
            if len(self.conns) >= RAMP_MAX_CONNECTIONS:
                await min(self.conns, key=lambda c: len(c.exchanges)).stream_slot()
                continue
            fut: asyncio.Future[H2ClientConnection] = (
                asyncio.get_running_loop().create_future())
            self._opening = fut
            try:
                conn = await open_shared(fut, self.source, self.ip, self.port, self.sni,
                                         self.ctx, self.timeout)
            finally:
                self._opening = None
            self.conns.append(conn)
            fut.set_result(conn)
            return conn

    async def close(self) -> None:
        """GOAWAY on every connection; the server closes first."""
        conns, self.conns = self.conns, []
        with contextlib.suppress(Exception):
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


class Driver:
    """Runs the load of one ``drive()``."""

    def __init__(self, p: P.LabParams, ctx: ssl.SSLContext, ca_pem: bytes | None = None
                 ) -> None:
        self.p = p
        self.ctx = ctx
        self.ca_pem = ca_pem
        """The lab's CA (PEM): what the h3 client trusts (``client_protocol="h3"``)."""
        self.ledger = Ledger()
        self.topology = P.Topology(p.origins)
        self._dns_cache: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._last_roc_session: ssl.SSLSession | None = None
        self._last_roc_ssl: Any = None
        """A ramp's last ROC ``SSLObject`` (its ``session`` costs most of a millisecond
        to take: only for ``roc_resume``, after the load)."""
        self._pools: dict[tuple[str, str], _RampPool] = {}

    # ------------------------------------------------------------------ DNS

    async def lookup(self, name: str, source: str, transport: str, path: str) -> list[str]:
        """One DNS query for ``A name`` from ``source``; logged in the ledger."""
        query = dns.message.make_query(name.rstrip(".") + ".", "A")
        send = dns.asyncquery.udp if transport == "udp" else dns.asyncquery.tcp
        try:
            response = await send(query, P.DNS_IP, timeout=self.p.client_timeout_s,
                                  port=P.DNS_PORT, source=source)
        except Exception as exc:
            raise LabError(f"DNS query for {name} failed: {exc!r}") from exc
        answers = [r.address for rrset in response.answer for r in rrset
                   if r.rdtype == dns.rdatatype.A]
        self.ledger.dns.append({
            "qname": name, "qtype": "A", "transport": transport, "path": path,
            "client": source, "server": f"{P.DNS_IP}:{P.DNS_PORT}",
            "rcode": dns.rcode.to_text(response.rcode()), "answers": answers})
        return answers

    async def resolve(self, name: str, source: str, transport: str, path: str) -> str:
        """The address of ``name``, looked up once per (client, name)."""
        key = (source, name)
        fut = self._dns_cache.get(key)
        if fut is None:
            fut = self._dns_cache[key] = asyncio.get_running_loop().create_future()
            try:
                answers = await self.lookup(name, source, transport, path)
                if len(answers) != 1:
                    raise LabError(f"DNS answer for {name} was {answers}")
                fut.set_result(answers[0])
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # retrieved: a lookup cut by Ctrl-C prints no traceback
                del self._dns_cache[key]
                raise
        return await asyncio.shield(fut)

    # ------------------------------------------------------------------ HTTP

    def _client(self, source: str) -> Any:
        import httpx

        p = self.p
        transport = httpx.AsyncHTTPTransport(
            http2=True, verify=self.ctx, trust_env=False, local_address=source, retries=0,
            socket_options=NODELAY,
            limits=httpx.Limits(max_connections=p.max_connections,
                                max_keepalive_connections=p.max_connections,
                                keepalive_expiry=60.0))
        return httpx.AsyncClient(transport=transport, trust_env=False,
                                 timeout=p.client_timeout_s)

    async def _request(self, client: Any, req: PlannedRequest, ip: str, port: int,
                       name: str, extra: dict[str, Any] | None = None) -> None:
        authority = name if port == 443 else f"{name}:{port}"
        headers = {"host": authority, "user-agent": self.p.user_agent}
        if self.p.request_ids:
            headers["x-request-id"] = req.rid
        headers.update({"x-model": req.model, "x-user": req.user,
                        "accept": "text/event-stream" if req.sse else "application/json"})
        url = f"https://{ip}:{port}{req.url_path}"
        record: dict[str, Any] = {"request_id": req.rid, "path": req.path,
                                  "kind": "sse" if req.sse else "json", "method": "POST",
                                  "url_path": req.url_path, "model": req.model,
                                  "user": req.user, "sni": name, "server": f"{ip}:{port}",
                                  **(extra or {}), "scheduled_ts": None,
                                  "sent_ts": round(time.time(), 6)}
        started = time.perf_counter()
        try:
            async with client.stream("POST", url, json=req.body(), headers=headers,
                                     extensions={"sni_hostname": name}) as resp:
                first = time.perf_counter()
                events = 0
                if req.sse and resp.status_code == 200:
                    async for line in resp.aiter_lines():
                        if line.startswith("data:"):
                            events += 1
                else:
                    await resp.aread()
                stream = resp.extensions.get("network_stream")
                addr = stream.get_extra_info("client_addr") if stream is not None else None
                ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
                if resp.http_version != "HTTP/2":
                    raise LabError(f"{req.path}: expected HTTP/2, got {resp.http_version}")
                client_ep = f"{addr[0]}:{addr[1]}" if addr else "?"
                record.update({
                    "status": resp.status_code, "stream_id": resp.extensions.get("stream_id"),
                    "client": client_ep,
                    "headers": {h: resp.headers.get(h) for h in HOP_HEADERS},
                    "client_ttfb_ms": round((first - started) * 1000, 3),
                    "client_total_ms": round((time.perf_counter() - started) * 1000, 3)})
                if self.p.http3:  # the edge advertises its HTTP/3 listener
                    record["headers"]["alt-svc"] = resp.headers.get("alt-svc")
                if req.sse:
                    record["events"] = events
                conn = self.ledger.connection(req.path, client_ep, f"{ip}:{port}", name,
                                              ssl_object)
                entry = {"method": "POST", "path": req.url_path, "status": resp.status_code,
                         "stream_id": record["stream_id"], "request_id": req.rid}
                if req.sse:
                    entry["events"] = events
                conn["requests"].append(entry)
                if req.path == "ROC" and ssl_object is not None:
                    self._last_roc_session = ssl_object.session
        except LabError:
            raise
        except Exception as exc:
            record.update({"status": None, "error": repr(exc)})
            self.ledger.errors.append(f"{req.rid}: {exc!r}")
        self.ledger.requests.append(record)

    async def _roc(self, reqs: list[PlannedRequest]) -> None:
        p = self.p
        if p.nx_lookup:
            answers = await self.lookup(P.NX_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
            if answers:
                raise LabError(f"{P.NX_NAME} unexpectedly resolved to {answers}")
        pooled = self._client(P.ROC_CLIENT_IP) if p.roc_keepalive else None
        queue: asyncio.Queue[PlannedRequest] = asyncio.Queue()
        for r in reqs:
            queue.put_nowait(r)

        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                ip = await self.resolve(P.EDGE_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
                if pooled is not None:
                    await self._request(pooled, req, ip, P.EDGE_PORT, P.EDGE_NAME)
                else:
                    async with self._client(P.ROC_CLIENT_IP) as fresh:
                        await self._request(fresh, req, ip, P.EDGE_PORT, P.EDGE_NAME)
                if p.request_gap_ms:
                    await asyncio.sleep(p.request_gap_ms / 1000)

        try:
            await asyncio.gather(*(worker() for _ in range(min(p.concurrency, len(reqs)))))
        finally:
            if pooled is not None:
                await pooled.aclose()

    async def _dpf(self, reqs: list[PlannedRequest]) -> None:
        p = self.p
        origins = self.topology.dpf_origins
        pooled = self._client(P.DPF_CLIENT_IP) if p.dpf_pool else None
        queue: asyncio.Queue[PlannedRequest] = asyncio.Queue()
        for r in reqs:
            queue.put_nowait(r)

        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                bucket = (p.hash_bucket if p.hash_bucket is not None
                          else int(time.time() // p.hash_bucket_s))
                index = dpf_pick(req.model, req.user, bucket, len(origins))
                _ip, name = origins[index]
                ip = await self.resolve(name, P.DPF_CLIENT_IP, p.dpf_dns_transport, "DPF")
                extra = {"hash": {"bucket": bucket, "origin": index + 1}}
                if pooled is not None:
                    await self._request(pooled, req, ip, P.ORIGIN_PORT, name, extra)
                else:
                    async with self._client(P.DPF_CLIENT_IP) as fresh:
                        await self._request(fresh, req, ip, P.ORIGIN_PORT, name, extra)
                if p.request_gap_ms:
                    await asyncio.sleep(p.request_gap_ms / 1000)

        try:
            await asyncio.gather(*(worker() for _ in range(min(p.concurrency, len(reqs)))))
        finally:
            if pooled is not None:
                await pooled.aclose()

    async def run(self) -> None:
        if self.p.ramp is not None:
            await self._ramp()
            return
        reqs = plan(self.p)
        roc = self._roc_h3 if self.p.client_protocol == "h3" else self._roc
        await asyncio.gather(roc(reqs["ROC"]), self._dpf(reqs["DPF"]))

    # ------------------------------------------------------------------ HTTP/3

    async def _roc_h3(self, reqs: list[PlannedRequest]) -> None:
        """The ROC path over HTTP/3 (QUIC from ``127.0.0.2`` to the edge): one
        connection shared by the workers (``roc_keepalive``), else one per request."""
        from netdiag.lab.h3 import H3Client

        p = self.p
        if p.nx_lookup:
            answers = await self.lookup(P.NX_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
            if answers:
                raise LabError(f"{P.NX_NAME} unexpectedly resolved to {answers}")
        shared: list[H3Client] = []
        opening = asyncio.Lock()
        queue: asyncio.Queue[PlannedRequest] = asyncio.Queue()
        for r in reqs:
            queue.put_nowait(r)

        async def fresh(ip: str) -> H3Client:
            return await H3Client.open(ip, P.EDGE_PORT, P.EDGE_NAME, self.ca_pem,
                                       P.ROC_CLIENT_IP, p.client_timeout_s)

        async def pooled(ip: str) -> H3Client:
            async with opening:
                if not shared or shared[-1].closed:
                    shared.append(await fresh(ip))
                return shared[-1]

        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                ip = await self.resolve(P.EDGE_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
                if p.roc_keepalive:
                    await self._h3_request(pooled, req, ip, own=False)
                else:
                    await self._h3_request(fresh, req, ip, own=True)
                if p.request_gap_ms:
                    await asyncio.sleep(p.request_gap_ms / 1000)

        try:
            await asyncio.gather(*(worker() for _ in range(min(p.concurrency, len(reqs)))))
        finally:
            await asyncio.gather(*(c.aclose() for c in shared), return_exceptions=True)

    async def _h3_request(self, connect: Any, req: PlannedRequest, ip: str, own: bool
                          ) -> None:
        """One ROC request over HTTP/3, recorded as the HTTP/2 ones are, plus the
        epoch nanoseconds of its HEADERS handed to QUIC (``request_ns``) and of the
        datagrams that brought the answer's first and last byte."""
        p = self.p
        loop = asyncio.get_running_loop()
        name, port = P.EDGE_NAME, P.EDGE_PORT
        record: dict[str, Any] = {"request_id": req.rid, "path": req.path,
                                  "kind": "sse" if req.sse else "json", "method": "POST",
                                  "url_path": req.url_path, "model": req.model,
                                  "user": req.user, "sni": name, "server": f"{ip}:{port}",
                                  "protocol": "h3", "scheduled_ts": None,
                                  "sent_ts": round(time.time(), 6)}
        body = json.dumps(req.body(), separators=(",", ":")).encode()
        headers = self._ramp_headers(req, name, body)
        started = loop.time()
        conn: Any = None
        try:
            conn = await connect(ip)
            record["request_ns"] = time.time_ns()
            ex = conn.start(headers, body)
            status, resp_headers = await asyncio.wait_for(ex.response(), p.client_timeout_s)

            async def read() -> list[bytes]:
                return [chunk async for chunk in ex.body()]

            chunks = await asyncio.wait_for(read(), p.client_timeout_s)
            first = ex.first_byte or (loop.time(), time.time_ns())
            last = ex.last_byte or (loop.time(), time.time_ns())
            got = dict(resp_headers)
            record.update({
                "status": status, "stream_id": ex.stream_id, "client": conn.local,
                "headers": {h: got.get(h) for h in HOP_HEADERS},
                "client_ttfb_ms": round((first[0] - started) * 1000, 3),
                "client_total_ms": round((last[0] - started) * 1000, 3),
                "first_byte_ns": first[1], "last_byte_ns": last[1]})
            events = 0
            if req.sse and status == 200:
                events = sum(1 for line in b"".join(chunks).split(b"\n")
                             if line.startswith(b"data:"))
                record["events"] = events
            rec = self.ledger.connections.get(conn.local)
            if rec is None:
                rec = self.ledger.connections[conn.local] = {
                    "path": req.path, "client": conn.local, "server": f"{ip}:{port}",
                    "sni": name, "transport": "quic", "tls_version": "TLS 1.3",
                    "cipher": conn.cipher, "alpn": "h3", "resumed": False, "requests": []}
            entry = {"method": "POST", "path": req.url_path, "status": status,
                     "stream_id": ex.stream_id, "request_id": req.rid}
            if req.sse:
                entry["events"] = events
            rec["requests"].append(entry)
        except Exception as exc:
            record.update({"status": None, "error": repr(exc)})
            self.ledger.errors.append(f"{req.rid}: {exc!r}")
        finally:
            if own and conn is not None:
                await conn.aclose()
        self.ledger.requests.append(record)

    # ------------------------------------------------------------------ ramp

    def _ramp_headers(self, req: PlannedRequest, name: str, body: bytes
                      ) -> list[tuple[str, str]]:
        headers = [(":method", "POST"), (":scheme", "https"), (":authority", name),
                   (":path", req.url_path), ("user-agent", self.p.user_agent)]
        if self.p.request_ids:
            headers.append(("x-request-id", req.rid))
        headers += [("x-model", req.model), ("x-user", req.user),
                    ("accept", "text/event-stream" if req.sse else "application/json"),
                    ("content-type", "application/json"),
                    ("content-length", str(len(body)))]
        return headers

    def _dpf_target(self, req: PlannedRequest) -> tuple[int, int, str]:
        """(bucket, 0-based origin, origin name) DPF's hash picks for ``req`` now."""
        p = self.p
        bucket = (p.hash_bucket if p.hash_bucket is not None
                  else int(time.time() // p.hash_bucket_s))
        origins = self.topology.dpf_origins
        index = dpf_pick(req.model, req.user, bucket, len(origins))
        return bucket, index, origins[index][1]

    async def _ramp(self) -> None:
        """The open loop: every request its own task, launched at its scheduled time."""
        p = self.p
        assert p.ramp is not None
        loop = asyncio.get_running_loop()
        schedule = ramp_plan(p)
        self.ledger.offered = {path: len(items) for path, items in schedule.items()}
        if p.nx_lookup:
            answers = await self.lookup(P.NX_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
            if answers:
                raise LabError(f"{P.NX_NAME} unexpectedly resolved to {answers}")
        # names and connections before the clock starts: the schedule pays for neither
        edge_ip = await self.resolve(P.EDGE_NAME, P.ROC_CLIENT_IP, "udp", "ROC")
        warm: list[Any] = []
        if p.roc_keepalive:
            warm.append(self._ramp_pool(P.ROC_CLIENT_IP, edge_ip, P.EDGE_PORT,
                                        P.EDGE_NAME).warm())
        names = {self._dpf_target(req)[2] for _, req in schedule["DPF"]}
        for name in sorted(names):
            ip = await self.resolve(name, P.DPF_CLIENT_IP, p.dpf_dns_transport, "DPF")
            if p.dpf_pool:
                warm.append(self._ramp_pool(P.DPF_CLIENT_IP, ip, P.ORIGIN_PORT, name).warm())
        try:
            await asyncio.gather(*warm)
        except UpstreamError as exc:
            raise LabError(f"the ramp's first connections failed: {exc}") from exc
        t0 = loop.time() + RAMP_LEAD_S
        wall0 = time.time() + (t0 - loop.time())
        self.ledger.ramp_start_ts = wall0
        tasks: set[asyncio.Task[None]] = set()

        async def scheduler(items: list[tuple[float, PlannedRequest]]) -> None:
            for offset, req in items:
                delay = t0 + offset - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = loop.create_task(self._ramp_request(req, wall0 + offset))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        try:
            with ramp_priority(p.realtime):
                await asyncio.gather(scheduler(schedule["ROC"]), scheduler(schedule["DPF"]))
                while tasks:
                    await asyncio.gather(*list(tasks))
        finally:
            for task in list(tasks):
                task.cancel()
            pools, self._pools = list(self._pools.values()), {}
            await asyncio.gather(*(pool.close() for pool in pools), return_exceptions=True)

    def _ramp_pool(self, source: str, ip: str, port: int, name: str) -> _RampPool:
        pool = self._pools.get((source, ip))
        if pool is None:
            pool = self._pools[(source, ip)] = _RampPool(ip, port, name, self.ctx, source,
                                                   self.p.client_timeout_s)
        return pool

    async def _ramp_request(self, req: PlannedRequest, scheduled: float) -> None:
        """One request of a ramp, launched at its time (``scheduled``, epoch s)."""
        p = self.p
        loop = asyncio.get_running_loop()
        record: dict[str, Any] = {"request_id": req.rid, "path": req.path,
                                  "kind": "sse" if req.sse else "json", "method": "POST",
                                  "url_path": req.url_path, "model": req.model,
                                  "user": req.user}
        if req.path == "ROC":
            source, port, name, pooled = P.ROC_CLIENT_IP, P.EDGE_PORT, P.EDGE_NAME, p.roc_keepalive
            transport = "udp"
        else:
            bucket, index, name = self._dpf_target(req)
            source, port, pooled = P.DPF_CLIENT_IP, P.ORIGIN_PORT, p.dpf_pool
            transport = p.dpf_dns_transport
            record["hash"] = {"bucket": bucket, "origin": index + 1}
        record.update({"sni": name, "server": None, "scheduled_ts": round(scheduled, 6),
                       "sent_ts": None})
        own: H2ClientConnection | None = None
        ex: Any = None
        try:
            ip = await self.resolve(name, source, transport, req.path)
            record["server"] = f"{ip}:{port}"
            body = json.dumps(req.body(), separators=(",", ":")).encode()
            headers = self._ramp_headers(req, name, body)
            first: list[float] = []

            def on_headers(status: int, hdrs: list[tuple[str, str]], started: float) -> None:
                first.append(started)

            if pooled:
                conn = await self._ramp_pool(source, ip, port, name).get()
                sent = loop.time()
                before = time.time()
                record["sent_ts"] = round(before, 6)
                ex = conn.start(headers, False, on_headers)
                record["written_ts"] = [round(before, 6), round(time.time(), 6)]
                await conn.send_data_when_open(ex.stream_id, body)
            else:
                sock = bound_socket(source)
                sent = loop.time()
                record["sent_ts"] = round(time.time(), 6)
                conn = own = await H2ClientConnection.open(
                    ip, port, name, self.ctx, sock, p.client_timeout_s,
                    first=(headers, body, on_headers))
                ex = conn.first
                if conn.first_written is not None:
                    record["written_ts"] = [round(t, 6) for t in conn.first_written]
            assert ex is not None
            stream_id = ex.stream_id
            status, resp_headers = await ex.response()
            ttfb = (first[0] if first else loop.time()) - sent
            chunks = [chunk async for chunk in ex.body()]
            ex = None
            total = loop.time() - sent
            got = dict(resp_headers)
            ssl_object = conn.transport.get_extra_info("ssl_object") if conn.transport else None
            record.update({
                "status": status, "stream_id": stream_id,
                "client": conn.local,
                "headers": {h: got.get(h) for h in HOP_HEADERS},
                "client_ttfb_ms": round(ttfb * 1000, 3),
                "client_total_ms": round(total * 1000, 3)})
            events = 0
            if req.sse and status == 200:
                events = sum(1 for line in b"".join(chunks).split(b"\n")
                             if line.startswith(b"data:"))
                record["events"] = events
            conn_rec = self.ledger.connection(req.path, conn.local, f"{ip}:{port}", name,
                                              ssl_object)
            entry = {"method": "POST", "path": req.url_path, "status": status,
                     "stream_id": record["stream_id"], "request_id": req.rid}
            if req.sse:
                entry["events"] = events
            conn_rec["requests"].append(entry)
            if req.path == "ROC" and ssl_object is not None:
                self._last_roc_ssl = ssl_object
        except Exception as exc:  # recorded, as in the closed loop: the ramp goes on
            record.update({"status": None, "error": repr(exc)})
            self.ledger.errors.append(f"{req.rid}: {exc!r}")
        finally:
            if ex is not None:
                ex.cancel()
            if own is not None:
                await own.close()
        self.ledger.requests.append(record)

    # ------------------------------------------------------------------ resumption

    def resumed_request(self) -> None:
        """One more ROC request on a new connection resuming the last TLS 1.3 session."""
        from netdiag.lab.h2sync import h2_get_resumed

        session = self._last_roc_session
        if self._last_roc_ssl is not None:
            session = self._last_roc_ssl.session
        if session is None:
            raise LabError("no ROC TLS session to resume")
        ip = self._dns_cache_result(P.ROC_CLIENT_IP, P.EDGE_NAME) or P.EDGE_IP
        rid = "roc-resumed"
        sent_ts = round(time.time(), 6)
        rec, req = h2_get_resumed(self.ctx, ip, P.EDGE_PORT, P.EDGE_NAME, P.ROC_CLIENT_IP,
                                  session, rid if self.p.request_ids else None,
                                  self.p.client_timeout_s, self.p.user_agent)
        rec["path"] = "ROC"
        for entry in rec["requests"]:
            entry["request_id"] = rid  # the lab's id, also when none went on the wire
        if not rec["resumed"]:
            raise LabError("the TLS 1.3 resumption attempt did a full handshake")
        self.ledger.connections[rec["client"]] = rec
        self.ledger.requests.append({
            "request_id": rid, "path": "ROC", "kind": "json", "method": req["method"],
            "url_path": req["path"], "model": self.p.models[0], "user": "user-resume",
            "sni": P.EDGE_NAME, "server": rec["server"], "status": req["status"],
            "stream_id": req["stream_id"], "client": rec["client"],
            "headers": req.pop("headers"), "scheduled_ts": None, "sent_ts": sent_ts})

    def _dns_cache_result(self, source: str, name: str) -> str | None:
        fut = self._dns_cache.get((source, name))
        if fut is not None and fut.done() and not fut.exception():
            return fut.result()
        return None


def summarize(ledger: Ledger) -> dict[str, Any]:
    """Per path: requests, statuses, connections (distinct client endpoints), streams."""
    out: dict[str, Any] = {}
    for path in ("ROC", "DPF"):
        reqs = [r for r in ledger.requests if r["path"] == path]
        conns = [c for c in ledger.connections.values() if c["path"] == path]
        n = len(reqs)
        streams = sum(len(c["requests"]) for c in conns)
        out[path] = {
            "client": P.ROC_CLIENT_IP if path == "ROC" else P.DPF_CLIENT_IP,
            "requests": n,
            "statuses": {str(k): v for k, v in sorted(Counter(
                str(r.get("status")) for r in reqs).items())},
            "json": sum(1 for r in reqs if r["kind"] == "json"),
            "sse": sum(1 for r in reqs if r["kind"] == "sse"),
            "connections": len(conns),
            "streams": streams,
            "reuse_rate": None if not streams else round((streams - len(conns)) / streams, 6),
            "resumed": sum(1 for c in conns if c["resumed"]),
            "errors": sum(1 for r in reqs if r.get("error")),
        }
    return out
