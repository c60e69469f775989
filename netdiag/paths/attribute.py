"""Give every connection its path: ``{name, hop, evidence, inferred}`` or None.

1. **Profile.** The first path whose rule matches (``inferred: false``), with one
   evidence line per key of the rule.
2. **Inferred from the chains** (:mod:`netdiag.paths.chains`), for connections no rule
   matches (or without a profile), each with the evidence it rests on:

   * a connection whose requests were caused by requests of another connection belongs
     to that connection's path; its hop is named by what it does: ``proxy`` (it calls
     further hops; ``proxy 2``, ``proxy 3`` deeper down), ``store`` (Redis commands)
     or ``origin`` (it calls nothing);
   * a connection whose requests nothing captured caused is client-facing: to a proxy
     server (one whose requests consistently contain upstream requests from its
     address, or link by request id) it is path ``via SERVER``, hop ``edge``;
     otherwise path ``direct SERVER``, hop ``origin`` (``store`` for Redis);
   * a connection without requests takes the path of another connection between the
     same client address and server (``no request seen``), else stays None.
3. **None** otherwise (DNS connections, lone connections without requests): never a
   silent guess.
"""

from __future__ import annotations

from typing import Any

from netdiag.paths.chains import Chains, Node, is_resp, link_requests
from netdiag.paths.endpoint import split_endpoint
from netdiag.paths.profile import Profile
from netdiag.records import Connection


def _path(name: str, hop: str, evidence: list[str], inferred: bool) -> dict[str, Any]:
    return {"name": name, "hop": hop, "evidence": evidence, "inferred": inferred}


def attribute(connections: list[Connection], profile: Profile | None) -> Chains:
    """Set ``conn.path`` on every connection; returns the request call graph it used."""
    for c in connections:
        c.path = None
    trusted: list[str] = []
    if profile is not None:
        for c in connections:
            m = profile.match(c)
            if m is not None:
                c.path = m.to_path()
                trusted.append(c.id)
    hop_order = {p.name: list(p.hops) for p in profile.paths} if profile is not None else {}
    chains = link_requests(connections, trusted, hop_order)
    _infer(connections, chains, profile)
    return chains


def _role(chains: Chains, conn: Connection, nodes: list[Node], depth: int) -> str:
    """Hop name for an inferred hop from what its requests (``nodes``) do."""
    if any(n.children for n in nodes) or chains.is_proxy(conn.server):
        return "proxy" if depth <= 1 else f"proxy {depth}"
    if is_resp(conn) or any(r.protocol == "resp" for r in conn.requests):
        return "store"
    return "origin"


def _conn_nodes(chains: Chains, conn: Connection) -> list[Node]:
    """The linked requests of ``conn``, in its order."""
    return [n for i in range(len(conn.requests)) if (n := chains.node(conn.id, i)) is not None]


def _conn_depth(chains: Chains, nodes: list[Node]) -> int:
    """How many hops below the client the shallowest of a connection's requests is."""
    return min((chains.depth(n) for n in nodes), default=0)


def _infer(connections: list[Connection], chains: Chains, profile: Profile | None) -> None:
    unmatched_note = ["no rule of the profile matches"] if profile is not None else []
    by_id = {c.id: c for c in connections}
    with_requests = [c for c in connections if c.requests and c.path is None]
    nodes_of = [_conn_nodes(chains, c) for c in with_requests]
    depth_of = [_conn_depth(chains, nodes) for nodes in nodes_of]
    # a client-facing connection's path depends on its server and on what its requests
    # did, not on the connection: one dict for all of a server's alike (read, never
    # changed in place), not one per connection
    roots: dict[tuple[str, bool, bool], dict[str, Any]] = {}
    # parents before children: shallowest first
    for k in sorted(range(len(with_requests)),
                    key=lambda k: (depth_of[k], with_requests[k].ts_ns)):
        c, nodes = with_requests[k], nodes_of[k]
        parents: list[Node] = [n.parent for n in nodes if n.parent is not None]
        if parents:
            _infer_child(c, nodes, parents, depth_of[k], chains, by_id, unmatched_note)
        else:
            calls = any(n.children for n in nodes)
            resp = is_resp(c) or any(r.protocol == "resp" for r in c.requests)
            key = (c.server, calls, resp)
            path = roots.get(key)
            if path is None:
                path = roots[key] = _root_path(c.server, calls, resp, chains,
                                               unmatched_note)
            c.path = path
    # connections without requests: same client address and server as an attributed one
    peers: dict[tuple[str, str], Connection] = {}
    for o in connections:
        if o.path is not None and o.requests:
            peers.setdefault((split_endpoint(o.client)[0], o.server), o)
    for c in connections:
        if c.path is not None or c.requests or c.protocol == "dns":
            continue
        peer = peers.get((split_endpoint(c.client)[0], c.server))
        if peer is None or peer.path is None:
            continue
        c.path = _path(peer.path["name"], peer.path["hop"], [
            *unmatched_note, f"no request seen on it; {peer.id} from the same client "
            f"address to the same server {c.server} is on {peer.path['name']} "
            f"({peer.path['hop']})"], True)


def _infer_child(c: Connection, nodes: list[Node], parents: list[Node], depth: int,
                 chains: Chains, by_id: dict[str, Connection], note: list[str]) -> None:
    names: dict[str, int] = {}  # a plain dict: a Counter per connection cost more here
    for p in parents:
        if p.conn.path is not None:
            k = p.conn.path["name"]
            names[k] = names.get(k, 0) + 1
    if not names:
        return
    name = max(names, key=names.__getitem__)  # the first seen of the most common
    hop = _role(chains, c, nodes, depth)
    pconns = sorted({p.conn.id for p in parents}, key=lambda i: int(i[1:])
                    if i[1:].isdigit() else 0)
    pconn = by_id[pconns[0]]
    phop = pconn.path["hop"] if pconn.path is not None else "?"
    sender = split_endpoint(c.client)[0]
    linked = sum(1 for n in nodes if n.parent is not None)
    shown = ", ".join(pconns[:5]) + (f" and {len(pconns) - 5} more" if len(pconns) > 5 else "")
    links = {n.link for n in nodes if n.parent is not None}
    how = ("the same request id" if links == {"request-id"} else
           "time containment" + (" and the same request id" if "request-id" in links else ""))
    if "ambiguous" in links:
        how += " (some ambiguous: concurrent candidates were equally good)"
    if any(n.from_parent_address for n in nodes if n.parent is not None):
        how += f"; sent from {split_endpoint(pconn.server)[0]}, where {pconn.server} listens"
    ev = [*note,
          f"{linked} of {len(nodes)} requests on it were sent from {sender} while it served "
          f"requests of {shown} ({name}, {phop}); linked by {how}"]
    pev = chains.proxies.get(pconn.server)
    if pev is not None and pev.is_proxy:
        ev.append(pev.sentence)
    if len(names) > 1:
        others = sorted(names.items(), key=lambda kv: kv[1], reverse=True)[1:]
        ev.append("requests of other paths caused some of its requests too: " +
                  ", ".join(f"{k} {v}" for k, v in others))
    c.path = _path(name, hop, ev, True)


def _root_path(server: str, calls: bool, resp: bool, chains: Chains, note: list[str]
               ) -> dict[str, Any]:
    """The path of a connection to ``server`` that no captured request caused: its
    requests caused others (``calls``), it carries Redis commands (``resp``)."""
    pev = chains.proxies.get(server)
    if (pev is not None and pev.is_proxy) or calls:
        ev = [*note]
        if pev is not None:
            ev.append(pev.sentence + ("" if pev.is_proxy else
                                      " (linked by request id)"))
        ev.append(f"no captured request caused the requests on it: {server} is the "
                  "client-facing hop")
        return _path(f"via {server}", "edge", ev, True)
    hop = "store" if resp else "origin"
    ip = split_endpoint(server)[0]
    if pev is None:
        why = (f"none of the requests to {server} contained requests to another server "
               f"from {ip} or in steady timing")
    else:
        why = (pev.sentence + " (not taken for a proxy: that needs 80% of at least 3 "
               "requests, and from another address a steady timing)")
    return _path(f"direct {server}", hop, [
        *note, f"no captured request caused the requests on it, and {why}"], True)
