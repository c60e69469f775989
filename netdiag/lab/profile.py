"""The path profile of the lab's topology (``docs/profiles.md``, version 1).

Every hop is named by its server address and port (and SNI where it is TLS); a
``client`` condition is added only where the lab's proxies connect from their own
addresses (``upstream_source="own"``), never with ``"loopback"``, where the router
and the token store see every connection come from ``127.0.0.1``.
"""

from __future__ import annotations

from typing import Any

from netdiag.lab import params as P


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {v!r}")


def profile_doc(origins: int, *, params: P.LabParams | None = None) -> dict[str, Any]:
    """The profile as data: paths with their hops and rules (``params``: the lab's mode,
    default the default parameters)."""
    p = params or P.LabParams(origins=origins)
    own = p.upstream_source == "own"
    topo = P.Topology(origins)
    roc = [ip for ip, _ in topo.roc_origins]
    dpf = [ip for ip, _ in topo.dpf_origins]
    router: dict[str, Any] = {"hop": "router", "server": [f"{P.ROUTER_IP}/32"],
                              "port": [P.ROUTER_PORT]}
    store: dict[str, Any] = {"hop": "token-store", "server": [f"{P.REDIS_IP}/32"],
                             "port": [P.REDIS_PORT]}
    if own:
        router["client"] = [f"{P.EDGE_IP}/32"]
        store["client"] = [f"{P.ROUTER_IP}/32"]
    return {"version": 1, "path": [
        {"name": "ROC", "hops": ["edge", "router", "token-store", "origin"], "rule": [
            {"hop": "edge", "server": [f"{P.EDGE_IP}/32"], "port": [P.EDGE_PORT],
             "sni": [P.EDGE_NAME]},
            router,
            store,
            {"hop": "origin", "server": [f"{ip}/32" for ip in roc], "port": [P.ORIGIN_PORT],
             "sni": ["gpu-*.roc.test"]},
        ]},
        {"name": "DPF", "hops": ["origin"], "rule": [
            {"hop": "origin", "server": [f"{ip}/32" for ip in dpf], "port": [P.ORIGIN_PORT],
             "sni": ["gpu-*.dpf.test"]},
        ]},
    ]}


def _notes(p: P.LabParams) -> dict[tuple[str, str], str]:
    edge_src = p.source_ip(P.EDGE_IP)
    router_src = p.source_ip(P.ROUTER_IP)
    if p.router_protocol == "http1":
        to_router = (f"cleartext HTTP/1.1 keep-alive from the edge ({edge_src}), pooled, "
                     "one request at a time per connection")
    else:
        to_router = f"cleartext HTTP/2 (h2c) from the edge ({edge_src}), one pooled connection"
    origin_proto = "HTTP/1.1" if p.origin_protocol == "http1" else "HTTP/2"
    if not p.upstream_pool:
        to_origin = f"a new TLS + {origin_proto} connection from the router per request"
    elif p.origin_protocol == "http1":
        to_origin = "pooled TLS + HTTP/1.1 keep-alive connections from the router"
    else:
        to_origin = "one pooled, multiplexed TLS + HTTP/2 connection per origin from the router"
    return {
        ("ROC", "edge"): "TLS 1.3 + HTTP/2 for clients; via: roc-edge",
        ("ROC", "router"): f"{to_router}; x-router: roc-router",
        ("ROC", "token-store"): (f"redis-server: one EVALSHA of the budget script per request, "
                                 f"from {router_src}"),
        ("ROC", "origin"): f"{to_origin} ({router_src})",
        ("DPF", "origin"): "clients connect directly: xxh64(model|user|bucket) % origins",
    }


def profile_toml(origins: int, *, params: P.LabParams | None = None) -> str:
    """The profile as TOML text, with comments naming the lab's software per hop."""
    p = params or P.LabParams(origins=origins)
    doc = profile_doc(origins, params=p)
    notes = _notes(p)
    lines = ["# Path profile of the netdiag lab (docs/profiles.md).",
             f"# Clients: ROC from {P.ROC_CLIENT_IP}, DPF from {P.DPF_CLIENT_IP}; "
             f"DNS {P.DNS_IP}:{P.DNS_PORT}.",
             f"version = {doc['version']}"]
    for path in doc["path"]:
        lines += ["", "[[path]]", f"name = {_toml_value(path['name'])}",
                  f"hops = {_toml_value(path['hops'])}"]
        for rule in path["rule"]:
            lines += ["", f"# {notes[(path['name'], rule['hop'])]}", "[[path.rule]]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in rule.items()]
    return "\n".join(lines) + "\n"
