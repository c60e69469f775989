"""Synthetic connections and requests for the path tests (times in milliseconds)."""

from __future__ import annotations

from typing import Any

from netdiag.records import Connection, DnsTransaction, Request, TlsInfo

MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000
"""An epoch-ish origin so the numbers look like capture times."""


def ns(ms: float) -> int:
    return T0 + round(ms * MS)


def req(ts: float, fb: float | None, lb: float | None = None, *, method: str = "GET",
        path: str | None = "/v1/messages", authority: str | None = None,
        rid: str | None = None, protocol: str | None = "h2", estimated: bool = False,
        headers: list[tuple[str, str]] | None = None, gaps: list[float] | None = None,
        stream_id: int | None = None) -> Request:
    rh = [(":method", method)]
    if path is not None:
        rh.append((":path", path))
    if authority is not None:
        rh.append((":authority", authority))
    if rid is not None:
        rh.append(("x-request-id", rid))
    return Request(
        ts_ns=ns(ts), first_byte_ns=None if fb is None else ns(fb),
        last_byte_ns=None if lb is None else ns(lb), method=method, authority=authority,
        path=path, status=None if protocol == "resp" else 200, estimated=estimated,
        protocol=protocol, request_headers=None if protocol == "resp" else rh,
        response_headers=headers,
        chunk_gaps_ns=None if gaps is None else [round(g * MS) for g in gaps],
        sse_events=None if gaps is None else len(gaps) + 1, stream_id=stream_id)


def resp(ts: float, fb: float, command: str = "EVALSHA", key: str = "roc:budget:m"
         ) -> Request:
    return req(ts, fb, fb, method=command, path=key, protocol="resp")


def conn(cid: str, client: str, server: str, requests: list[Request], *,
         syn: float | None = None, ack: float | None = None,
         tls: tuple[float, float] | None = None, sni: str | None = None,
         alpn: str | None = None, protocol: str | None = "h2", **kw: Any) -> Connection:
    first = min([r.ts_ns for r in requests] + ([ns(syn)] if syn is not None else []),
                default=T0)
    last = max([r.last_byte_ns or r.first_byte_ns or r.ts_ns for r in requests] + [first])
    info = None
    if tls is not None or sni is not None:
        info = TlsInfo(version="TLS 1.3", sni=sni, alpn=alpn,
                       client_hello_ns=None if tls is None else ns(tls[0]),
                       finished_ns=None if tls is None else ns(tls[1]), decrypted=True)
    c = Connection(id=cid, ts_ns=first, client=client, server=server,
                   syn_ns=None if syn is None else ns(syn),
                   handshake_ack_ns=None if ack is None else ns(ack), tls=info,
                   protocol=protocol, requests=requests, last_ns=last,
                   handshake_seen=syn is not None, **kw)
    return c


def dns(ts: float, latency: float, qname: str, answers: list[str]) -> DnsTransaction:
    return DnsTransaction(ts_ns=ns(ts), client="127.0.0.2:5353", server="127.0.0.53:53",
                          transport="udp", id=1, qname=qname, qtype="A", rcode="NOERROR",
                          answers=answers, response_ts_ns=ns(ts + latency), responses=1)


EDGE = "127.0.0.10:443"
ROUTER = "127.0.0.11:8080"
REDIS = "127.0.0.12:6379"
ORIGIN = "127.0.0.21:443"
DPF_ORIGIN = "127.0.0.31:443"


def roc_request(t0: float, n: int, *, router_delay: float = 10.0, think: float = 20.0,
                redis_ms: float = 0.5, edge_ms: float = 1.0, new_origin_conn: bool = False,
                reuse_edge: list[Connection] | None = None) -> list[Connection]:
    """Connections of one ROC request at ``t0``: client->edge, edge->router,
    router->redis, router->origin (one connection each, ``n`` numbers the ids).

    Timeline (ms after t0): client request 0; edge forwards at ``edge_ms``; router calls
    redis at +1 for ``redis_ms``; waits ``router_delay``; calls the origin (opening a
    connection first when ``new_origin_conn``: SYN, 0.2 ms to the ACK, 0.3 ms more to
    the request); origin answers after ``think``; router answers 0.5 ms later, edge
    ``edge_ms`` after that.
    """
    e0 = t0 + edge_ms
    r0 = e0 + 1.0
    r1 = r0 + redis_ms
    o_syn = r1 + router_delay
    o0 = o_syn + (0.5 if new_origin_conn else 0.0)
    o_fb = o0 + think
    rt_fb = o_fb + 0.5
    e_fb = rt_fb + edge_ms
    c_fb = e_fb
    return [
        conn(f"C{n}", f"127.0.0.2:{40000 + n}", EDGE,
             [req(t0, c_fb, c_fb + 1, authority="api.roc.test", rid=f"r{n}")],
             syn=t0 - 2, ack=t0 - 1.9, tls=(t0 - 1.8, t0 - 0.5), sni="api.roc.test",
             alpn="h2"),
        conn(f"C{n + 1}", f"127.0.0.10:{41000 + n}", ROUTER,
             [req(e0, rt_fb, rt_fb + 0.6, authority="router.roc.test")],
             protocol="h2c"),
        conn(f"C{n + 2}", f"127.0.0.11:{42000 + n}", REDIS, [resp(r0, r1)],
             protocol="resp"),
        conn(f"C{n + 3}", f"127.0.0.11:{43000 + n}", ORIGIN,
             [req(o0, o_fb, o_fb + 0.2, authority="gpu-1.roc.test")],
             syn=o_syn if new_origin_conn else None,
             ack=o_syn + 0.2 if new_origin_conn else None, sni="gpu-1.roc.test",
             alpn="h2"),
    ]


def dpf_request(t0: float, n: int, *, think: float = 20.0) -> Connection:
    return conn(f"C{n}", f"127.0.0.3:{45000 + n}", DPF_ORIGIN,
                [req(t0, t0 + think, t0 + think + 1, authority="gpu-1.dpf.test")],
                syn=t0 - 2, ack=t0 - 1.9, tls=(t0 - 1.8, t0 - 0.6), sni="gpu-1.dpf.test",
                alpn="h2")


PROFILE = """\
version = 1

[[path]]
name = "ROC"
hops = ["edge", "router", "token-store", "origin"]

[[path.rule]]
hop = "edge"
server = ["127.0.0.10/32"]
port = [443]
sni = ["api.roc.test"]

[[path.rule]]
hop = "router"
server = ["127.0.0.11/32"]

[[path.rule]]
hop = "token-store"
server = ["127.0.0.12/32"]
port = [6379]

[[path.rule]]
hop = "origin"
server = ["127.0.0.20/30"]
client = ["127.0.0.11/32"]

[[path]]
name = "DPF"
hops = ["origin"]

[[path.rule]]
hop = "origin"
server = ["127.0.0.30/28"]
sni = ["*.dpf.test"]
"""
