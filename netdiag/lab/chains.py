"""The true chain of every client request: which upstream requests it caused.

Each hop of the lab logs, for every request it received, how it knows that request
-- its inbound connection's peer and local endpoints plus the HTTP/2 stream id or
the request's 0-based ordinal on its HTTP/1.1 connection -- and the same for every
request it sent upstream (its outbound connection's local endpoint, the server
endpoint, stream id or ordinal, and the hop it called), plus each Redis command with
its ordinal on its Redis connection. Nothing here reads a header: the join is on
(endpoints, stream id or ordinal) alone, so it holds with request ids off, with
pooled and multiplexed connections and with every proxy connecting from 127.0.0.1.

:func:`build_chains` joins the driver's requests with the edge's and the router's
logs into the ledger's ``chains`` (format in ``docs/lab.md``), and along the same
joins, each request's ``hops``: the timestamps every hop logged for it
(:func:`hop_times`).
"""

from __future__ import annotations

from typing import Any

Key = tuple[str, str, int | None, int | None]


def key_of(rec: dict[str, Any]) -> Key:
    """(client, server, stream id, ordinal) of a logged request."""
    return (rec["client"], rec["server"], rec.get("stream_id"), rec.get("ordinal"))


class _Index:
    """Log entries by :func:`key_of`. A key can name several requests over a run (a new
    connection per request reuses an ephemeral port), so a lookup takes the first entry
    received at or after the time the caller sent it (the last one when none is timed)."""

    def __init__(self, log: list[dict[str, Any]]) -> None:
        self.by: dict[Key, list[dict[str, Any]]] = {}
        for e in log:
            self.by.setdefault(key_of(e), []).append(e)

    def get(self, key: Key, after_ns: float | None = None) -> dict[str, Any] | None:
        found = self.by.get(key)
        if not found:
            return None
        if after_ns is None or len(found) == 1:
            return found[-1]
        timed = [e for e in found if e.get("received_ns") is not None
                 and e["received_ns"] >= after_ns - SLACK_NS]
        return min(timed, key=lambda e: e["received_ns"]) if timed else found[-1]


SLACK_NS = 1_000_000
"""A hop's clock read may precede its caller's by this much (both wall clocks)."""


def _ref(rec: dict[str, Any], hop: str | None = None, parent: int | None = None
         ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if hop is not None:
        out["hop"] = hop
    out.update({"client": rec["client"], "server": rec["server"],
                "stream_id": rec.get("stream_id"), "ordinal": rec.get("ordinal")})
    if parent is not None:
        out["parent"] = parent
    return out


HOP_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "edge": (("received", "forwarded"), ()),
    "router": (("received", "dispatched"), ("store_ms", "queue_ms", "early_ms", "denied")),
    "origin": (("received", "answered"), ()),
}
"""Per hop: its timestamp events (``<event>_ns`` in its log) and the fields copied as
they are."""


def hop_times(hop: str, entry: dict[str, Any], sent_ts: float | None) -> dict[str, Any]:
    """One hop's timestamps for the ledger: per event ``<event>_ts`` (epoch seconds)
    and ``<event>_ms`` (milliseconds after the client's ``sent_ts``; None without it),
    plus the hop's own durations (``store_ms``, ``queue_ms``) and flags as logged."""
    events, copied = HOP_FIELDS[hop]
    out: dict[str, Any] = {}
    for event in events:
        ns = entry.get(f"{event}_ns")
        out[f"{event}_ts"] = None if ns is None else round(ns / 1e9, 6)
    for event in events:
        ns = entry.get(f"{event}_ns")
        out[f"{event}_ms"] = (None if ns is None or sent_ts is None
                              else round((ns / 1e9 - sent_ts) * 1000, 3))
    for name in copied:
        out[name] = entry.get(name)
    return out


def build_chains(requests: list[dict[str, Any]], edge_log: list[dict[str, Any]],
                 router_log: list[dict[str, Any]], origin_log: list[dict[str, Any]],
                 hops: dict[str, dict[str, Any]] | None = None
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """(chains, problems): one chain per client request that got an answer.

    ``requests`` are the driver's records (``request_id``, ``path``, ``client``,
    ``server``, ``stream_id``); the logs are the hops' (``inbound_key`` fields plus
    ``upstream``). A problem is a request a hop says it sent that the next hop never
    logged receiving, or a client request no hop logged: the lab's bookkeeping failed.
    With ``hops``, fills ``hops[request_id]`` with ``{"edge": ..., "router": ...,
    "origin": ...}`` (:func:`hop_times` of each hop the chain reached; DPF: ``origin``
    only; a request no hop logged: ``{}``).
    """
    by_key = {"edge": _Index(edge_log), "router": _Index(router_log)}
    origins = _Index(origin_log)
    if hops is not None:
        for req in requests:
            hops[req["request_id"]] = {}
    problems: list[str] = []
    chains: list[dict[str, Any]] = []
    for req in sorted(requests, key=lambda r: r["request_id"]):
        if req.get("status") is None or not req.get("client") or req["client"] == "?":
            continue  # it failed before it had a connection: nothing to chain
        client = {"client": req["client"], "server": req["server"],
                  "stream_id": req.get("stream_id"), "ordinal": None}
        chain: dict[str, Any] = {"path": req["path"], "request_id": req["request_id"],
                                 "client": client, "upstream": [], "server_timing": None}
        chains.append(chain)
        mine: dict[str, Any] = {}
        if hops is not None:
            hops[req["request_id"]] = mine
        sent_ts = req.get("sent_ts")
        sent_ns = None if sent_ts is None else sent_ts * 1e9
        first = "edge" if req["path"] == "ROC" else "origin"
        if first == "origin":
            origin = origins.get(key_of(client), sent_ns)
            if origin is None:
                problems.append(f"{req['request_id']}: no origin logged {key_of(client)}")
            else:
                mine["origin"] = hop_times("origin", origin, sent_ts)
            continue
        edge = by_key["edge"].get(key_of(client), sent_ns)
        if edge is None:
            problems.append(f"{req['request_id']}: the edge logged no request {key_of(client)}")
            continue
        mine["edge"] = hop_times("edge", edge, sent_ts)
        chain["server_timing"] = edge.get("server_timing")
        # breadth over the hops: (log entry, its index in [client, upstream...])
        todo: list[tuple[dict[str, Any], int]] = [(edge, 0)]
        while todo:
            entry, parent = todo.pop(0)
            for out in entry["upstream"]:
                chain["upstream"].append(_ref(out, out["hop"], parent))
                index = len(chain["upstream"])
                hop = out["hop"]
                if hop == "router":
                    nxt = by_key["router"].get(key_of(out), entry.get("forwarded_ns"))
                    if nxt is None:
                        problems.append(f"{req['request_id']}: the router logged no request "
                                        f"{key_of(out)}")
                    else:
                        mine.setdefault("router", hop_times("router", nxt, sent_ts))
                        todo.append((nxt, index))
                elif hop == "origin":
                    origin = origins.get(key_of(out), entry.get("dispatched_ns"))
                    if origin is None:
                        problems.append(f"{req['request_id']}: no origin logged {key_of(out)}")
                    else:
                        mine.setdefault("origin", hop_times("origin", origin, sent_ts))
    return chains, problems
