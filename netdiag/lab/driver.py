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

The ledger records, per request, what the client saw (status, stream id, local
endpoint, response headers that name the hops, SSE events), per connection its TLS
facts, and every DNS query.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import dns.asyncquery
import dns.message
import dns.rcode
import dns.rdatatype

from netdiag.lab import params as P
from netdiag.lab.errors import LabError

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
TLS_NAMES = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2", "TLSv1.1": "TLS 1.1", "TLSv1": "TLS 1.0"}
HOP_HEADERS = ("server", "x-origin", "via", "x-router", "x-request-id", "server-timing",
               "x-envoy-upstream-service-time")
"""Response headers the ledger keeps per request (None when absent)."""


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


class Driver:
    """Runs the load of one ``drive()``."""

    def __init__(self, p: P.LabParams, ctx: ssl.SSLContext) -> None:
        self.p = p
        self.ctx = ctx
        self.ledger = Ledger()
        self.topology = P.Topology(p.origins)
        self._dns_cache: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._last_roc_session: ssl.SSLSession | None = None

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
        started = time.perf_counter()
        record: dict[str, Any] = {"request_id": req.rid, "path": req.path,
                                  "kind": "sse" if req.sse else "json", "method": "POST",
                                  "url_path": req.url_path, "model": req.model,
                                  "user": req.user, "sni": name, "server": f"{ip}:{port}",
                                  **(extra or {})}
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
        reqs = plan(self.p)
        await asyncio.gather(self._roc(reqs["ROC"]), self._dpf(reqs["DPF"]))

    # ------------------------------------------------------------------ resumption

    def resumed_request(self) -> None:
        """One more ROC request on a new connection resuming the last TLS 1.3 session."""
        from netdiag.lab.h2sync import h2_get_resumed

        session = self._last_roc_session
        if session is None:
            raise LabError("no ROC TLS session to resume")
        ip = self._dns_cache_result(P.ROC_CLIENT_IP, P.EDGE_NAME) or P.EDGE_IP
        rid = "roc-resumed"
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
            "headers": req.pop("headers")})

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
