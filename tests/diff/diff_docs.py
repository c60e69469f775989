"""Synthetic contract documents for the diff tests: only what ``compare`` reads."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from netdiag.analysis.stats import percentiles


def normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    """``n`` positive draws of N(mean, sd), deterministic for ``seed``."""
    rng = random.Random(seed)
    return [max(0.001, rng.gauss(mean, sd)) for _ in range(n)]


def make_doc(*, dns: Sequence[float] = (), rtt: Sequence[float] = (),
             tls: Sequence[float] = (), ttfb: Sequence[float] = (),
             per_conn: int = 1, findings: Sequence[tuple[str, str, str]] = (),
             paths: dict[str, Sequence[float]] | None = None,
             files: Sequence[str] = ("a.pcapng",), estimated: bool = False
             ) -> dict[str, Any]:
    """A document whose per-item values are exactly the given samples.

    ``ttfb`` requests are spread ``per_conn`` per connection (connection reuse follows);
    ``paths`` adds, per path name, requests on connections attributed to it and
    ``summary.paths``; ``findings`` are (severity, code, title).
    """
    conns: list[dict[str, Any]] = []
    n_conn = max(len(rtt), len(tls))
    for i in range(n_conn):
        conns.append({"id": f"C{i + 1}", "ts": 1.0 + i, "client": f"10.0.0.1:{40000 + i}",
                      "server": "10.0.0.2:443",
                      "handshake_rtt_ms": rtt[i] if i < len(rtt) else None,
                      "tls": ({"handshake_ms": tls[i]} if i < len(tls) else None),
                      "path": None, "requests": []})

    def add_requests(values: Sequence[float], path: str | None) -> None:
        for k in range(0, len(values), per_conn):
            chunk = values[k:k + per_conn]
            conns.append({"id": f"C{len(conns) + 1}", "ts": 100.0 + len(conns),
                          "client": f"10.0.0.1:{50000 + len(conns)}",
                          "server": "10.0.0.3:443", "handshake_rtt_ms": None, "tls": None,
                          "path": None if path is None else {"name": path},
                          "requests": [{"ts": 100.0, "ttfb_ms": v, "ttlb_ms": v + 1.0,
                                        "estimated": estimated} for v in chunk]})

    add_requests(list(ttfb), None)
    summary_paths: dict[str, Any] = {}
    for name, values in (paths or {}).items():
        add_requests(list(values), name)
        n_req = len(values)
        n_c = -(-n_req // per_conn)
        summary_paths[name] = {"requests": n_req, "connections": n_c,
                               "reuse_rate": (n_req - n_c) / n_req if n_req else None,
                               "ttfb_ms": percentiles(list(values))}
    all_ttfb = [r["ttfb_ms"] for c in conns for r in c["requests"]]
    with_req = [c for c in conns if c["requests"]]
    n_req = len(all_ttfb)
    return {
        "contract": 1,
        "netdiag_version": "test",
        "capture": {"files": list(files), "packets": 100, "duration_ms": 1000.0,
                    "truncated": False},
        "summary": {
            "dns": {"transactions": len(dns), "unanswered": 0, "retransmissions": 0,
                    "latency_ms": percentiles(list(dns))},
            "tcp": {"connections": len(conns), "retransmissions": 0, "resets": 0,
                    "handshake_rtt_ms": percentiles([v for v in rtt])},
            "tls": {"handshakes": len(tls), "resumed": 0, "handshake_ms": percentiles(list(tls))},
            "http": {"requests": n_req, "connections": len(with_req),
                     "reuse_rate": (n_req - len(with_req)) / n_req if n_req else None,
                     "ttfb_ms": percentiles(all_ttfb),
                     "ttlb_ms": percentiles([v + 1.0 for v in all_ttfb]),
                     "estimated": estimated},
            "paths": summary_paths,
        },
        "dns": [{"ts": 1.0, "latency_ms": v} for v in dns],
        "connections": conns,
        "findings": [{"severity": s, "code": c, "title": t, "detail": "", "evidence": []}
                     for s, c, t in findings],
    }
