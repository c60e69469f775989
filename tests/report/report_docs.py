"""Documents for the report tests: paths filled in as path attribution fills them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"


def pct(*values: float) -> dict[str, Any]:
    v = sorted(values)
    return {"count": len(v), "min": v[0], "p50": v[len(v) // 2], "p90": v[-1], "p99": v[-1],
            "max": v[-1], "mean": sum(v) / len(v)}


def with_paths(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with paths filled the way path attribution fills them (two paths, ROC with
    two hops), written here so that the report tests do not depend on the attribution."""
    names = {"127.0.0.10:443": ("ROC", "edge"), "127.0.0.20:443": ("DPF", "origin")}
    for c in doc["connections"]:
        if c["server"] in names:
            name, hop = names[c["server"]]
            c["path"] = {"name": name, "hop": hop, "inferred": False,
                         "evidence": [f"server {c['server']} matches {name}.{hop}"]}
    doc["summary"]["paths"] = {
        "DPF": {"inferred": False, "hops": ["origin"], "requests": 7, "connections": 1,
                "reuse_rate": 6 / 7, "ttfb_ms": pct(11.3, 12.5, 13.2),
                "ttlb_ms": pct(11.7, 13.4, 61.6),
                "phases": {"dns_ms": pct(4.5), "tcp_ms": pct(0.03), "tls_ms": pct(2.6),
                           "hops": {"origin": {"own_ms": pct(11.3, 12.5, 13.2)}},
                           "think_ms": pct(12.5), "transfer_ms": pct(0.4, 0.8, 47.0)},
                "estimated": False},
        "ROC": {"inferred": False, "hops": ["edge", "origin"], "requests": 9,
                "connections": 5, "reuse_rate": 4 / 9, "ttfb_ms": pct(21.6, 23.1, 24.3),
                "ttlb_ms": pct(22.0, 23.4, 28.8),
                "phases": {"dns_ms": pct(3.9, 4.1, 5.3), "tcp_ms": pct(0.025, 0.033),
                           "tls_ms": pct(1.1, 2.4, 3.7),
                           "hops": {"edge": {"own_ms": pct(3.0, 3.2, 4.0),
                                             "setup_ms": pct(1.5, 2.0)},
                                    "origin": {"own_ms": pct(18.0, 19.9, 20.3)}},
                           "think_ms": pct(18.0, 19.9, 20.3),
                           "transfer_ms": pct(0.3, 0.6, 4.5)},
                "estimated": False},
    }
    doc["summary"]["path_comparison"] = [
        {"a": "ROC", "b": "DPF", "phase": "ttfb", "supported": True,
         "sentence": "ROC's time to first byte is 10.6 ms longer than DPF's (medians; "
                     "95% CI 9.8–11.7 ms)"},
        {"a": "ROC", "b": "DPF", "phase": "dns", "supported": False,
         "sentence": "ROC vs DPF, DNS lookup: not enough evidence (5 samples against 1)"},
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
