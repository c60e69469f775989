"""Documents for the report tests: paths filled in as path attribution fills them, and
what the lab's ledger and path profile say about the shipped capture."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from netdiag.capture.pcapng_writer import write_pcapng
from netdiag.capture.reader import CaptureReader
from netdiag.paths.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
LEDGER = ROOT / "captures" / "antho.expected.json"
PROFILE = ROOT / "captures" / "antho.paths.toml"


@cache
def ledger() -> dict[str, Any]:
    """What the lab's clients, edge and router did in the run that wrote the capture."""
    return json.loads(LEDGER.read_text(encoding="utf-8"))


@cache
def profile() -> Profile:
    """The path profile of the lab's topology."""
    return load_profile(str(PROFILE))


def host(endpoint: str) -> str:
    """``"127.0.0.2:50995"`` -> ``"127.0.0.2"``."""
    return endpoint.rsplit(":", 1)[0]


def strip_secrets(src: Path, dst: Path) -> Path:
    """``src`` rewritten to ``dst`` packet for packet, without its embedded TLS keys."""
    with CaptureReader(src) as reader, dst.open("wb") as out:
        write_pcapng(out, reader.packets(), None)
        assert reader.secrets, f"{src} embeds no TLS keys: nothing to strip"
    with CaptureReader(dst) as check:
        assert sum(1 for _ in check.packets()) == reader.packets_read
        assert check.secrets == []
    return dst


def lab_http_requests() -> int:
    """HTTP requests the lab made: the clients', the edge's (to the router, h2c) and the
    router's (one per new connection to an origin)."""
    lg = ledger()
    return (sum(lg["requests"].values()) + lg["edge"]["requests"]
            + len(lg["router"]["upstream_log"]))


def lab_requests() -> int:
    """Every request netdiag should report: the HTTP ones and the Redis commands."""
    return lab_http_requests() + ledger()["router"]["redis_commands"]


def lab_tls_requests() -> int:
    """HTTP requests inside TLS (estimated without keys): the clients' and the router's."""
    lg = ledger()
    return sum(lg["requests"].values()) + len(lg["router"]["upstream_log"])


def pct(*values: float) -> dict[str, Any]:
    v = sorted(values)
    return {"count": len(v), "min": v[0], "p50": v[len(v) // 2], "p90": v[-1], "p99": v[-1],
            "max": v[-1], "mean": sum(v) / len(v)}


def with_paths(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with paths filled the way path attribution fills them (the profile's two
    paths, ROC with its four hops), written here so that the report tests do not depend
    on the attribution: each client-facing connection (one to the server of its path's
    first hop, per the profile) is put on its path; the budgets are made up."""
    prof = profile()
    hops = {p.name: list(p.hops) for p in prof.paths}
    counts = {p.name: [0, 0] for p in prof.paths}            # connections, requests
    for c in doc["connections"]:
        ip, _, port = c["server"].rpartition(":")
        hit = prof.match_address(ip, int(port))
        if hit is None or hit[1] != hops[hit[0]][0]:
            continue
        name, hop = hit
        c["path"] = {"name": name, "hop": hop, "inferred": False,
                     "evidence": [f"server {c['server']} matches {name}.{hop}"]}
        counts[name][0] += 1
        counts[name][1] += len(c["requests"])
    assert set(counts) == {"ROC", "DPF"} and all(n for n, _ in counts.values()), counts

    def usage(name: str) -> dict[str, Any]:
        conns, reqs = counts[name]
        return {"inferred": False, "hops": hops[name], "requests": reqs,
                "connections": conns, "reuse_rate": 1 - conns / reqs}

    doc["summary"]["paths"] = {
        "DPF": {**usage("DPF"), "ttfb_ms": pct(20.4, 20.5, 21.1),
                "ttlb_ms": pct(20.4, 20.7, 55.3),
                "phases": {"dns_ms": pct(3.1, 3.2, 3.2), "tcp_ms": pct(0.02, 0.03, 0.04),
                           "tls_ms": pct(2.5, 2.9, 8.0),
                           "hops": {"origin": {"own_ms": pct(20.4, 20.5, 21.1)}},
                           "think_ms": pct(20.4, 20.5, 21.1),
                           "transfer_ms": pct(0.06, 0.1, 34.9)},
                "estimated": False},
        "ROC": {**usage("ROC"), "ttfb_ms": pct(35.1, 36.1, 37.8),
                "ttlb_ms": pct(35.4, 36.9, 72.6),
                "phases": {"dns_ms": pct(3.1), "tcp_ms": pct(0.015, 0.042),
                           "tls_ms": pct(1.1, 2.8),
                           "hops": {"edge": {"own_ms": pct(3.0, 3.2, 4.0),
                                             "setup_ms": pct(1.5, 2.0)},
                                    "router": {"own_ms": pct(10.5, 10.6, 11.0),
                                               "setup_ms": pct(1.7, 2.4, 2.7)},
                                    "token-store": {"own_ms": pct(0.18, 0.23, 1.36)},
                                    "origin": {"own_ms": pct(20.4, 20.8, 21.3)}},
                           "think_ms": pct(20.4, 20.8, 21.3),
                           "transfer_ms": pct(0.3, 0.6, 34.8)},
                "estimated": False},
    }
    doc["summary"]["path_comparison"] = [
        {"a": "ROC", "b": "DPF", "phase": "ttfb", "supported": True,
         "sentence": "ROC's time to first byte is 15.7 ms longer than DPF's (medians; "
                     "95% CI 15.2–16.4 ms)"},
        {"a": "ROC", "b": "DPF", "phase": "dns", "supported": False,
         "sentence": "ROC vs DPF, DNS lookup: not enough evidence (1 sample against 3)"},
    ]
    return doc


HOSTILE = ("<script>alert(1)</script>\"><img src=x onerror=alert(1)></svg><script>alert(2)"
           "</script>' onmouseover='alert(3)' <a href=\"javascript:alert(4)\">x</a> "
           "<link rel=stylesheet href=https://evil.example/x.css> \u202eevil\u0000")


def hostile_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """Every string of a real document that the capture controls, made hostile."""
    doc = with_paths(doc)
    doc["netdiag_version"] = HOSTILE
    cap = doc["capture"]
    cap["files"] = [HOSTILE]
    cap["link_types"] = [HOSTILE]
    cap["truncated"] = True
    cap["warnings"] = [{"kind": "capture", "message": HOSTILE, "file": HOSTILE,
                        "offset": 1, "packet": 2}]
    for d in doc["dns"]:
        d.update(qname=HOSTILE, qtype=HOSTILE, rcode=HOSTILE, server=HOSTILE,
                 transport=HOSTILE)
        d["answers"] = [*d["answers"], HOSTILE]
    doc["dns"][0]["latency_ms"] = HOSTILE                 # a string where a number goes
    for c in doc["connections"]:
        c.update(client=HOSTILE, protocol=HOSTILE, close=HOSTILE)
        if c["tls"]:
            c["tls"].update(sni=HOSTILE, version=HOSTILE, alpn=HOSTILE)
        if c["path"]:
            c["path"].update(hop=HOSTILE, evidence=[HOSTILE])
        for r in c["requests"]:
            r.update(method=HOSTILE, path=HOSTILE, authority=HOSTILE, content_type=HOSTILE,
                     reset=HOSTILE)
            r["request_headers"] = [[HOSTILE, HOSTILE], [":path", HOSTILE]]
            r["response_headers"] = [[HOSTILE, HOSTILE]]
    doc["connections"][0]["id"] = HOSTILE
    doc["connections"][1]["requests"][0]["status"] = HOSTILE
    doc["connections"][1]["requests"][0]["ttfb_ms"] = HOSTILE
    doc["findings"].append({"severity": HOSTILE, "code": HOSTILE, "title": HOSTILE,
                            "detail": HOSTILE, "evidence": [HOSTILE]})
    for f in doc["findings"]:
        f.update(title=HOSTILE, detail=HOSTILE, evidence=[HOSTILE, "C1"])
    s = doc["summary"]
    s["paths"][HOSTILE] = s["paths"].pop("ROC")
    s["paths"][HOSTILE]["phases"]["hops"][HOSTILE] = s["paths"][HOSTILE]["phases"]["hops"]
    for c in doc["connections"]:
        if c["path"] and c["path"]["name"] == "ROC":
            c["path"]["name"] = HOSTILE
    s["path_comparison"][0]["sentence"] = HOSTILE
    s["tls"]["versions"] = {HOSTILE: 1}
    s["http"]["protocols"] = {HOSTILE: 16}
    s["dns"]["rcodes"] = {HOSTILE: 7}
    return doc
