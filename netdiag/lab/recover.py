"""What the report finds in a lab capture, hop by hop, against what the lab injected.

Runs netdiag's own pipeline on the capture (keys from its decryption-secrets block),
then uses what a lab capture is known to contain (the addresses of each hop) to say,
per path, how many requests and connections the capture shows and their reuse and
TTFB, and to recover each injected delay from the wire:

* DNS delay: the median DNS answer latency;
* origin think time: the median TTFB at the origins (DPF: client -> origin; ROC:
  router -> origin);
* token gap: the median gap between SSE events at the DPF origins;
* router delay, per ROC request matched across the hops by the ledger's chains
  (endpoints and stream ids or ordinals) or else by ``x-request-id``: the edge ->
  router request's TTFB minus the router's Redis command latency (its ``EVALSHA``)
  minus the router -> origin exchange (from the upstream SYN, on a connection opened
  for the request, or from the request on a pooled one, to the origin's first
  response byte). What remains is the router's own time: its coordination delay
  plus its processing.

netdiag's RESP analyzer times each Redis command but keeps only its first key, and
the request id is the script's last argument: so the commands are cut from the TCP
payload of the capture here, which is enough for the lab's one-command-per-packet
traffic.
"""

from __future__ import annotations

import statistics
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netdiag.lab import params as P
from netdiag.records import Connection, DnsTransaction

NS_PER_MS = 1_000_000


@dataclass
class _Sink:
    dns_records: list[DnsTransaction] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)

    def dns(self, t: DnsTransaction) -> None:
        self.dns_records.append(t)

    def connection(self, c: Connection) -> None:
        self.connections.append(c)


def _ip(ep: str) -> str:
    return ep.rpartition(":")[0].strip("[]")


def _port(ep: str) -> int:
    return int(ep.rpartition(":")[2])


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _header(req: Any, name: str) -> str | None:
    for k, v in req.request_headers or ():
        if k.lower() == name:
            return str(v)
    return None


def _resp_args(payload: bytes) -> list[bytes] | None:
    """The arguments of one RESP array command (``*N\\r\\n$len\\r\\narg\\r\\n...``)."""
    if not payload.startswith(b"*"):
        return None
    try:
        head, _, rest = payload.partition(b"\r\n")
        args: list[bytes] = []
        for _ in range(int(head[1:])):
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line[1:])
            args.append(rest[:size])
            rest = rest[size + 2:]
        return args
    except ValueError:
        return None


def redis_commands(capture: Path) -> list[dict[str, Any]]:
    """Each Redis command in the capture: client, name, args, ts and latency (ns)."""
    from netdiag.capture.reader import CaptureReader

    redis_ip = bytes(int(x) for x in P.REDIS_IP.split("."))
    pending: dict[tuple[bytes, int], dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    with CaptureReader(capture) as reader:
        for ts, linktype, data, _wire in reader.packets():
            if linktype != 1 or len(data) < 54 or data[12:14] != b"\x08\x00":
                continue
            ihl = (data[14] & 0x0F) * 4
            if data[23] != 6:
                continue
            total = struct.unpack_from("!H", data, 16)[0]
            src, dst = data[26:30], data[30:34]
            tcp = 14 + ihl
            sport, dport = struct.unpack_from("!HH", data, tcp)
            doff = (data[tcp + 12] >> 4) * 4
            payload = data[tcp + doff: 14 + total]
            if not payload:
                continue
            if dst == redis_ip and dport == P.REDIS_PORT:
                args = _resp_args(payload)
                key = (src, sport)
                if args and key not in pending:
                    rec = {"client": f"{'.'.join(map(str, src))}:{sport}",
                           "command": args[0].decode(errors="replace").upper(),
                           "args": [a.decode(errors="replace") for a in args[1:]],
                           "ts_ns": ts, "latency_ns": None}
                    pending[key] = rec
                    out.append(rec)
            elif src == redis_ip and sport == P.REDIS_PORT:
                rec = pending.pop((dst, dport), None)
                if rec is not None:
                    rec["latency_ns"] = ts - rec["ts_ns"]
    return out


def _path_figures(conns: list[Connection]) -> dict[str, Any]:
    with_reqs = [c for c in conns if c.requests]
    n = sum(len(c.requests) for c in with_reqs)
    ttfb = [(r.first_byte_ns - r.ts_ns) / NS_PER_MS for c in with_reqs for r in c.requests
            if r.first_byte_ns is not None]
    return {"requests": n, "connections": len(conns),
            "reuse_rate": None if not n else round((n - len(with_reqs)) / n, 6),
            "ttfb_ms": _median(ttfb),
            "estimated": any(r.estimated for c in conns for r in c.requests)}


def _exchange_start(uc: Connection, index: int, ur: Any, parent_ts: int) -> int | None:
    """When the router's upstream exchange began: the SYN of a connection opened for
    this request, else the request itself (a pooled connection)."""
    if index == 0 and uc.syn_ns is not None and uc.syn_ns > parent_ts:
        return uc.syn_ns
    return int(ur.ts_ns)


def _router_own_by_chains(conns: list[Connection], commands: list[dict[str, Any]],
                          chains: list[dict[str, Any]]) -> list[float]:
    """The router's own time per ROC request, the hops joined by the ledger's chains
    (endpoints and stream ids or ordinals: no header needed)."""
    by_key: dict[tuple[str, str, int | None, int | None], tuple[Connection, int, Any]] = {}
    for c in conns:
        for i, r in enumerate(c.requests):
            sid = r.stream_id
            by_key[(c.client, c.server, sid, None if sid is not None else i)] = (c, i, r)
    per_client: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cmd in commands:
        per_client[cmd["client"]].append(cmd)
    own: list[float] = []
    for chain in chains:
        if chain.get("path") != "ROC":
            continue
        ups = chain.get("upstream") or []
        for n, hop in enumerate(ups, 1):
            if hop["hop"] != "router":
                continue
            kids = [u for u in ups if u.get("parent") == n]
            store = next((u for u in kids if u["hop"] == "token-store"), None)
            origin = next((u for u in kids if u["hop"] == "origin"), None)
            found = by_key.get((hop["client"], hop["server"], hop["stream_id"], hop["ordinal"]))
            if found is None or store is None or origin is None:
                continue
            _c, _i, r = found
            up = by_key.get((origin["client"], origin["server"], origin["stream_id"],
                             origin["ordinal"]))
            cmds = per_client.get(store["client"], [])
            k = store["ordinal"]
            if up is None or k is None or k >= len(cmds) or r.first_byte_ns is None:
                continue
            cmd = cmds[k]
            uc, ui, ur = up
            start = _exchange_start(uc, ui, ur, r.ts_ns)
            if cmd["latency_ns"] is None or ur.first_byte_ns is None or start is None:
                continue
            value = ((r.first_byte_ns - r.ts_ns) - cmd["latency_ns"]
                     - (ur.first_byte_ns - start))
            own.append(value / NS_PER_MS)
    return own


def recover(capture: Path, delays: dict[str, float] | None = None,
            chains: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per-path figures and the delays found, from ``capture`` alone.

    ``delays`` (the ledger's ``delays_ms``) only adds the injected values next to the
    found ones. ``chains`` (the ledger's) joins the router's requests to their
    token-store call and origin request by endpoints and stream ids or ordinals;
    without them, by ``x-request-id`` (which a run with ``request_ids`` off lacks).
    """
    from netdiag.pipeline import Options, analyze

    sink = _Sink()
    analyze([str(capture)], sink, Options())
    conns = sink.connections
    roc_origins = {f"127.0.0.{20 + n}" for n in range(1, P.MAX_ORIGINS + 1)}
    dpf_origins = {f"127.0.0.{30 + n}" for n in range(1, P.MAX_ORIGINS + 1)}
    roc = [c for c in conns if _ip(c.client) == P.ROC_CLIENT_IP and _ip(c.server) == P.EDGE_IP]
    dpf = [c for c in conns if _ip(c.client) == P.DPF_CLIENT_IP and _ip(c.server) in dpf_origins]
    hop = [c for c in conns if _ip(c.server) == P.ROUTER_IP and _port(c.server) == P.ROUTER_PORT]
    # the router's origin connections (from 127.0.0.11, or 127.0.0.1 with
    # upstream_source="loopback"): every connection to a ROC origin
    upstream = [c for c in conns if _ip(c.server) in roc_origins
                and _port(c.server) == P.ORIGIN_PORT]
    store = [c for c in conns if _ip(c.server) == P.REDIS_IP]
    commands = redis_commands(capture)

    # --- router delay, per ROC request, matched by x-request-id across the hops
    up_by_rid: dict[str, tuple[Connection, Any]] = {}
    for c in upstream:
        for r in c.requests:
            rid = _header(r, "x-request-id")
            if rid:
                up_by_rid[rid] = (c, r)
    cmd_by_rid: dict[str, dict[str, Any]] = {}
    for cmd in commands:
        if cmd["command"] == "EVALSHA" and cmd["args"]:
            cmd_by_rid[cmd["args"][-1]] = cmd
    router_ms: list[float] = []
    matched = 0
    for c in hop if chains is None else ():
        for r in c.requests:
            rid = _header(r, "x-request-id")
            if not rid or r.first_byte_ns is None:
                continue
            up, cmd = up_by_rid.get(rid), cmd_by_rid.get(rid)
            if up is None or cmd is None or cmd["latency_ns"] is None:
                continue
            uc, ur = up
            if uc.syn_ns is None or ur.first_byte_ns is None:
                continue
            matched += 1
            own = (r.first_byte_ns - r.ts_ns) - cmd["latency_ns"] - (ur.first_byte_ns - uc.syn_ns)
            router_ms.append(own / NS_PER_MS)
    if chains is not None:
        router_ms = _router_own_by_chains(conns, commands, chains)
        matched = len(router_ms)

    def ttfbs(cs: list[Connection]) -> list[float]:
        return [(r.first_byte_ns - r.ts_ns) / NS_PER_MS for c in cs for r in c.requests
                if r.first_byte_ns is not None and r.status == 200]

    gaps = [g / NS_PER_MS for c in dpf for r in c.requests for g in (r.chunk_gaps_ns or ())
            if r.sse_events]
    found = {
        "dns": ([t.latency_ns / NS_PER_MS for t in sink.dns_records
                 if t.latency_ns is not None]),
        "router": router_ms,
        "roc_think": ttfbs(upstream),
        "dpf_think": ttfbs(dpf),
        "token_gap": gaps,
    }
    delays_out: dict[str, Any] = {}
    for name, values in found.items():
        delays_out[name] = {"injected": (delays or {}).get(name), "found": _median(values),
                            "samples": len(values)}
    per_rid = defaultdict(list)
    for c in hop:
        for r in c.requests:
            per_rid[_header(r, "x-request-id")].append(r)
    return {
        "paths": {"ROC": _path_figures(roc), "DPF": _path_figures(dpf)},
        "hops": {
            "edge_router": _path_figures(hop),
            "router_origin": _path_figures(upstream),
            "token_store": {"connections": len(store), "commands": len(commands),
                            "evalsha": sum(1 for x in commands if x["command"] == "EVALSHA"),
                            "latency_ms": _median([x["latency_ns"] / NS_PER_MS for x in commands
                                                   if x["latency_ns"] is not None])},
        },
        "router_requests_matched": matched,
        "delays_ms": delays_out,
    }
