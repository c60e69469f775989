"""The path profile of the lab's topology (``docs/profiles.md``, version 1)."""

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


def profile_doc(origins: int) -> dict[str, Any]:
    """The profile as data: paths with their hops and rules."""
    topo = P.Topology(origins)
    roc = [ip for ip, _ in topo.roc_origins]
    dpf = [ip for ip, _ in topo.dpf_origins]
    return {"version": 1, "path": [
        {"name": "ROC", "hops": ["edge", "router", "token-store", "origin"], "rule": [
            {"hop": "edge", "server": [f"{P.EDGE_IP}/32"], "port": [P.EDGE_PORT],
             "sni": [P.EDGE_NAME]},
            {"hop": "router", "server": [f"{P.ROUTER_IP}/32"], "port": [P.ROUTER_PORT],
             "client": [f"{P.EDGE_IP}/32"]},
            {"hop": "token-store", "server": [f"{P.REDIS_IP}/32"], "port": [P.REDIS_PORT],
             "client": [f"{P.ROUTER_IP}/32"]},
            {"hop": "origin", "server": [f"{ip}/32" for ip in roc], "port": [P.ORIGIN_PORT],
             "sni": ["gpu-*.roc.test"]},
        ]},
        {"name": "DPF", "hops": ["origin"], "rule": [
            {"hop": "origin", "server": [f"{ip}/32" for ip in dpf], "port": [P.ORIGIN_PORT],
             "sni": ["gpu-*.dpf.test"]},
        ]},
    ]}


def profile_toml(origins: int) -> str:
    """The profile as TOML text, with comments naming the lab's software per hop."""
    doc = profile_doc(origins)
    notes = {
        ("ROC", "edge"): "TLS 1.3 + HTTP/2 for clients (hypercorn); via: roc-edge",
        ("ROC", "router"): "cleartext HTTP/2 (h2c) from the edge; x-router: roc-router",
        ("ROC", "token-store"): "redis-server: one EVALSHA of the budget script per request",
        ("ROC", "origin"): "a new TLS + HTTP/2 connection from the router per request",
        ("DPF", "origin"): "clients connect directly: xxh64(model|user|bucket) % origins",
    }
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
