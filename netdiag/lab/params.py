"""The lab's parameters and its fixed topology (loopback addresses only)."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from dataclasses import dataclass
from typing import Any

DNS_IP, DNS_PORT = "127.0.0.53", 53
EDGE_IP, EDGE_PORT, EDGE_NAME = "127.0.0.10", 443, "api.roc.test"
ROUTER_IP, ROUTER_PORT, ROUTER_NAME = "127.0.0.11", 8080, "router.roc.test"
REDIS_IP, REDIS_PORT, REDIS_NAME = "127.0.0.12", 6379, "redis.roc.test"
ROC_CLIENT_IP = "127.0.0.2"
DPF_CLIENT_IP = "127.0.0.3"
ORIGIN_PORT = 443
NX_NAME = "api.nowhere.test"
LOOPBACK_SOURCE_IP = "127.0.0.1"
"""Where every proxy connects from with ``upstream_source="loopback"``."""
UPSTREAM_SOURCES = ("own", "loopback")
ROUTER_PROTOCOLS = ("h2c", "http1")
ORIGIN_PROTOCOLS = ("h2", "http1")
CLIENT_PROTOCOLS = ("h2", "h3")
CORRELATION_HEADERS = ("x-request-id", "x-correlation-id", "request-id", "traceparent")
"""Headers that tie a request to its hops; none of them is sent with ``request_ids=False``."""
MAX_ORIGINS = 9
"""Origins per path: ROC ``127.0.0.21..29``, DPF ``127.0.0.31..39``."""
MAX_RAMP_RPS = 100_000.0
"""Highest rate a ramp may ask for (requests per second per path)."""
MAX_RAMP_S = 3600.0
"""Longest ramp."""
RAMP_MAX_STREAMS = 4096
"""With a ramp, the concurrent streams every lab HTTP/2 server allows per connection
(h2's default is 100), so that neither the clients nor the edge's one connection to
the router wait for a stream while the router's queue holds requests."""
RAMP_CONNECTION_WINDOW = 1 << 30
"""With a ramp, every lab HTTP/2 server's connection-level receive window (the
protocol's initial one is 65,535 bytes): the request bodies of thousands of requests
in flight never wait for a WINDOW_UPDATE from a busy server (the open loop keeps
sending; TCP and the servers' own pace are what hold them)."""
RAMP_TIMEOUT_MARGIN_S = 60.0
"""With a ramp, the run's time limit is at least its duration plus this (start, the
queue draining, stop)."""


def roc_origin(n: int) -> tuple[str, str]:
    """(address, name) of ROC origin ``n`` (1-based)."""
    return f"127.0.0.{20 + n}", f"gpu-{n}.roc.test"


def dpf_origin(n: int) -> tuple[str, str]:
    """(address, name) of DPF origin ``n`` (1-based)."""
    return f"127.0.0.{30 + n}", f"gpu-{n}.dpf.test"


@dataclass
class LabParams:
    """Everything a lab run can be told. Every delay is a parameter (milliseconds)."""

    requests: int = 16
    """Requests per path (ROC and DPF each)."""
    concurrency: int = 4
    """Requests in flight at once, per path."""
    sse_share: float = 0.25
    """Share of requests that ask for a streamed (SSE) answer; the rest get JSON."""
    origins: int = 3
    """Origin ("GPU") servers per path."""
    dns_delay_ms: float = 2.0
    """The DNS server waits this long before answering."""
    router_delay_ms: float = 10.0
    """The ROC router's coordination time, added after its token-budget script."""
    think_ms: float = 20.0
    """Origin think time before the first byte (both paths unless overridden)."""
    roc_think_ms: float | None = None
    """Think time of the ROC origins (default: ``think_ms``)."""
    dpf_think_ms: float | None = None
    """Think time of the DPF origins (default: ``think_ms``)."""
    token_gap_ms: float = 5.0
    """Gap between two SSE token events."""
    sse_events: int = 8
    """Events in a streamed answer."""
    roc_keepalive: bool = True
    """ROC clients keep their connection to the edge (else a new one per request)."""
    dpf_pool: bool = True
    """DPF clients pool connections to the origins (else a new one per request)."""
    max_connections: int = 8
    """Client pool limit (connections per client pool)."""
    request_gap_ms: float = 0.0
    """Pause of each client worker between two of its requests."""
    models: tuple[str, ...] = ("lab-small", "lab-large")
    """Model ids the load uses (DPF hashes them; the router budgets per model)."""
    users: int = 8
    """Distinct user ids of the load."""
    hash_bucket_s: int = 60
    """DPF's time bucket: the origin is xxh64(model|user|bucket) % origins, where
    bucket = unix time // hash_bucket_s."""
    hash_bucket: int | None = None
    """A fixed bucket instead of the current one (a run whose choices never change)."""
    budget_tokens: int = 1_000_000
    """Per-model token budget the router keeps in Redis."""
    refill_per_s: int = 10_000
    """Budget refill rate."""
    request_cost: int = 100
    """Tokens one request takes from the budget."""
    dpf_tls: str = "1.3"
    """TLS version of the DPF origins: ``1.3`` or ``1.2`` (ECDHE + AES-GCM)."""
    dpf_dns_transport: str = "udp"
    """How DPF clients resolve origin names: ``udp`` or ``tcp``."""
    nx_lookup: bool = False
    """The ROC client first looks up a name that does not exist (NXDOMAIN)."""
    roc_resume: bool = False
    """After the load, one more ROC connection resuming the TLS 1.3 session of the last."""
    realtime: bool = True
    """Run the DNS, router and origin processes with a real-time scheduling priority
    (when permitted) so their injected delays hold on a busy machine."""
    seed: int = 1
    """Seed of the request mix."""
    user_agent: str = "netdiag-lab/1"
    """The clients' ``user-agent``."""
    client_timeout_s: float = 10.0
    """Per-request timeout of the clients."""
    timeout_s: float = 60.0
    """Hard limit of a whole run (start, drive, stop)."""
    settle_ms: float = 300.0
    """Wait after the load so the last FIN/ACKs reach the capture."""
    upstream_pool: bool = False
    """The ROC router keeps pooled keep-alive connections to each origin, shared by
    concurrent requests (HTTP/2: one multiplexed connection per origin; HTTP/1.1: a
    pool of connections, each carrying one request at a time, a new one opened only
    when all are busy, at most ``upstream_max_connections``). Off: a new connection
    per request."""
    origin_pairing_ms: float | None = None
    """Each ROC origin holds an HTTP/2 answer (after its think time) until another
    request is open on the same connection, or this long at most; the waits are in
    the origins' log (``paired_ns``). Multiplexing on the router's pooled connections
    is then certain rather than likely, whatever the machine's load (the lab's tests of
    pooling). None: an answer leaves after the think time alone."""
    upstream_max_connections: int = 64
    """Cap of every HTTP/1.1 upstream pool (the edge's to the router, the router's to
    each origin); a request waits for a free connection beyond it."""
    upstream_source: str = "own"
    """Where the proxies connect upstream from: ``own`` (the edge from ``127.0.0.10``,
    the router from ``127.0.0.11``, Redis included) or ``loopback`` (every proxy from
    ``127.0.0.1``, as nginx or Envoy connect from the host's address); either way
    from a source port of :data:`netdiag.lab.sockets.SOURCE_PORTS`."""
    router_protocol: str = "h2c"
    """Edge -> router: ``h2c`` (one pooled cleartext HTTP/2 connection, prior
    knowledge) or ``http1`` (a pool of cleartext HTTP/1.1 keep-alive connections, one
    request at a time each, so concurrency opens several)."""
    origin_protocol: str = "h2"
    """Router -> ROC origins over TLS: ``h2`` or ``http1`` (ALPN ``http/1.1``, keep-alive,
    server-sent events in chunked encoding)."""
    request_ids: bool = True
    """Clients send ``x-request-id`` and every hop forwards (origins echo) it. Off: no
    correlation header anywhere (no ``x-request-id``, ``x-correlation-id``,
    ``request-id`` or ``traceparent``), and the router's ``EVALSHA`` gets ``-`` for the id."""
    server_timing: bool = False
    """The edge adds ``server-timing: edge;dur=<own ms>, upstream;dur=<router ms>`` and
    ``x-envoy-upstream-service-time: <whole ms>`` to each answer, measured on its own
    clock from forwarding the request to reading the router's response headers."""
    netns: bool | None = None
    """``run_lab`` runs the whole lab (servers, redis-server, DNS, clients, sniffer) in a
    fresh network namespace with only ``lo`` up, so it never collides with anything on
    ``127.0.0.x`` and several labs can run at once. None: when root and a namespace can
    be created, else in the current namespace (the ledger's ``netns`` says which)."""
    ramp: tuple[float, float, float] | None = None
    """(from_rps, to_rps, duration_s): an open-loop load instead of the closed loop.
    Per path, requests arrive as a Poisson process whose rate ramps linearly from
    ``from_rps`` to ``to_rps`` requests per second over ``duration_s`` seconds, each
    sent at its scheduled time whatever the servers do (``netdiag.lab.driver``); the
    schedule comes from ``seed``. ``requests``, ``concurrency``, ``request_gap_ms`` and
    ``max_connections`` are then ignored, and the run's time limit is at least
    ``duration_s`` + ``RAMP_TIMEOUT_MARGIN_S`` (``run_timeout_s``). None: the closed
    loop (docs/lab.md, "Ramps")."""
    router_budget_per_s: float | None = None
    """The ROC router's request budget per second, kept in Redis as a queue: each
    request takes the next free slot (slots ``1/router_budget_per_s`` apart, one key
    for the router), the router holds it until its slot comes, and refuses it (429)
    when more than ``router_queue_limit`` slots are ahead of it. None: no queue, the
    per-model token budget script alone (today's router)."""
    router_queue_limit: int = 50
    """Requests that may wait in the router's queue (``router_budget_per_s``); one more
    is refused with 429."""
    http3: bool = False
    """The edge also serves HTTP/3 (QUIC, aioquic) on UDP at its address and port
    (``127.0.0.10:443``), with the lab's certificate and key log, and advertises it
    with ``alt-svc: h3=":443"`` on its HTTP/2 (and HTTP/1.1) answers. An h3 request
    is handled exactly as an h2 one (``netdiag.lab.h3``)."""
    client_protocol: str = "h2"
    """What the ROC clients speak to the edge: ``h2`` (httpx, TLS over TCP) or ``h3``
    (QUIC from ``127.0.0.2``; implies ``http3``). DPF clients speak HTTP/2 to the
    origins either way."""

    def __post_init__(self) -> None:
        if self.requests < 0:
            raise ValueError("requests must be >= 0")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 1 <= self.origins <= MAX_ORIGINS:
            raise ValueError(f"origins must be 1..{MAX_ORIGINS}")
        if not 0.0 <= self.sse_share <= 1.0:
            raise ValueError("sse_share must be within 0..1")
        for name in ("dns_delay_ms", "router_delay_ms", "think_ms", "token_gap_ms",
                     "request_gap_ms", "settle_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("roc_think_ms", "dpf_think_ms", "origin_pairing_ms"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.sse_events < 0 or self.max_connections < 1 or self.users < 1:
            raise ValueError("sse_events >= 0, max_connections >= 1 and users >= 1")
        if self.dpf_tls not in ("1.3", "1.2"):
            raise ValueError("dpf_tls must be '1.3' or '1.2'")
        if self.dpf_dns_transport not in ("udp", "tcp"):
            raise ValueError("dpf_dns_transport must be 'udp' or 'tcp'")
        if not self.models:
            raise ValueError("models must not be empty")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if self.upstream_max_connections < 1:
            raise ValueError("upstream_max_connections must be >= 1")
        if self.upstream_source not in UPSTREAM_SOURCES:
            raise ValueError(f"upstream_source must be one of {', '.join(UPSTREAM_SOURCES)}")
        if self.router_protocol not in ROUTER_PROTOCOLS:
            raise ValueError(f"router_protocol must be one of {', '.join(ROUTER_PROTOCOLS)}")
        if self.origin_protocol not in ORIGIN_PROTOCOLS:
            raise ValueError(f"origin_protocol must be one of {', '.join(ORIGIN_PROTOCOLS)}")
        if self.ramp is not None:
            try:
                ramp = tuple(float(x) for x in self.ramp)
            except (TypeError, ValueError):
                raise ValueError("ramp must be (from_rps, to_rps, duration_s)") from None
            if len(ramp) != 3 or not all(math.isfinite(x) for x in ramp):
                raise ValueError("ramp must be (from_rps, to_rps, duration_s)")
            lo, hi, duration = ramp
            if lo < 0 or hi <= 0 or duration <= 0:
                raise ValueError("ramp needs from_rps >= 0, to_rps > 0 and duration_s > 0")
            if max(lo, hi) > MAX_RAMP_RPS:
                raise ValueError(f"ramp rates are at most {MAX_RAMP_RPS:g} requests/s")
            if duration > MAX_RAMP_S:
                raise ValueError(f"ramp duration is at most {MAX_RAMP_S:g} s")
            self.ramp = (lo, hi, duration)
        if self.router_budget_per_s is not None and not (
                math.isfinite(self.router_budget_per_s) and self.router_budget_per_s > 0):
            raise ValueError("router_budget_per_s must be > 0")
        if self.router_queue_limit < 0:
            raise ValueError("router_queue_limit must be >= 0")
        if self.client_protocol not in CLIENT_PROTOCOLS:
            raise ValueError(f"client_protocol must be one of {', '.join(CLIENT_PROTOCOLS)}")
        if self.client_protocol == "h3":
            if self.ramp is not None:
                raise ValueError("client_protocol 'h3' does not drive ramps (yet): use h2")
            if self.roc_resume:
                raise ValueError("client_protocol 'h3' has no TLS resumption request: "
                                 "drop roc_resume")
            self.http3 = True

    def source_ip(self, own: str) -> str:
        """The address a proxy whose own address is ``own`` connects upstream from."""
        return LOOPBACK_SOURCE_IP if self.upstream_source == "loopback" else own

    @property
    def roc_think(self) -> float:
        """ROC origin think time in ms."""
        return self.think_ms if self.roc_think_ms is None else self.roc_think_ms

    @property
    def dpf_think(self) -> float:
        """DPF origin think time in ms."""
        return self.think_ms if self.dpf_think_ms is None else self.dpf_think_ms

    @property
    def run_timeout_s(self) -> float:
        """The run's hard time limit: ``timeout_s``, with a ramp at least its duration
        plus ``RAMP_TIMEOUT_MARGIN_S``."""
        if self.ramp is None:
            return self.timeout_s
        return max(self.timeout_s, self.ramp[2] + RAMP_TIMEOUT_MARGIN_S)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = list(self.models)
        out["ramp"] = list(self.ramp) if self.ramp is not None else None
        out["roc_think_ms"] = self.roc_think
        out["dpf_think_ms"] = self.dpf_think
        return out


@dataclass(frozen=True)
class Topology:
    """Addresses, ports and names of one lab."""

    origins: int

    @property
    def roc_origins(self) -> list[tuple[str, str]]:
        return [roc_origin(n) for n in range(1, self.origins + 1)]

    @property
    def dpf_origins(self) -> list[tuple[str, str]]:
        return [dpf_origin(n) for n in range(1, self.origins + 1)]

    def zone(self) -> dict[str, str]:
        """Every name the lab's DNS answers, with its address."""
        zone = {EDGE_NAME: EDGE_IP, ROUTER_NAME: ROUTER_IP, REDIS_NAME: REDIS_IP}
        for ip, name in self.roc_origins + self.dpf_origins:
            zone[name] = ip
        return zone

    def server_addresses(self) -> list[str]:
        """Every address a lab server listens on."""
        return [DNS_IP, EDGE_IP, ROUTER_IP, REDIS_IP] + [ip for ip, _ in self.roc_origins] + [
            ip for ip, _ in self.dpf_origins]

    def addresses(self) -> list[str]:
        """Every lab address, clients included."""
        return [ROC_CLIENT_IP, DPF_CLIENT_IP, *self.server_addresses()]

    def check(self) -> None:
        for ip in self.addresses():
            if not ipaddress.ip_address(ip).is_loopback:  # pragma: no cover - constants
                raise ValueError(f"{ip} is not a loopback address")
