"""Two contract documents side by side: what changed, and whether it is bigger than noise.

:func:`compare` takes two documents (``CollectingSink.document``, a ``netdiag report
--format json`` file, or the tshark engine's) and returns a JSON-ready dict:

* ``latency``: DNS latency, TCP handshake RTT, TLS handshake, TTFB and TTLB (HTTP
  requests; Redis connections apart, as in the summary), and Redis command latency when
  either side has Redis commands. For each,
  both percentile blocks, the deltas (B - A) of p50/p90/p99/mean, a two-sided
  Mann-Whitney U test on the per-item values (``dns[].latency_ms``,
  ``connections[].handshake_rtt_ms``, ``connections[].tls.handshake_ms``,
  ``requests[].ttfb_ms``/``ttlb_ms``) and a seeded bootstrap interval of the difference
  of medians; ``verdict`` says ``significant (p=0.003)``, ``within noise (p=0.41)``, or
  that there are too few values to tell.
* ``reuse``: connection reuse (``(requests - connections with requests) / requests``)
  on each side and a two-proportion z-test (reused requests over requests).
* ``counts``: transactions, connections, handshakes, requests, retransmissions, resets...
* ``paths``: per ``summary.paths`` entry (when either document has paths), requests and
  TTFB side by side, with the same test on the TTFB of the requests on that path.
* ``findings``: finding codes that appeared in B, went away, or stayed.

Everything is deterministic: the bootstrap is seeded (``seed``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from netdiag.analysis.stats import percentiles
from netdiag.diff.stats import (
    BOOTSTRAP_RESAMPLES,
    LEVEL,
    bootstrap_median_diff,
    mann_whitney_u,
    two_proportion_z,
)

DIFF_VERSION = 1
ALPHA = 0.05
LATENCIES = (
    ("dns.latency_ms", "DNS latency", ("dns", "latency_ms")),
    ("tcp.handshake_rtt_ms", "TCP handshake RTT", ("tcp", "handshake_rtt_ms")),
    ("tls.handshake_ms", "TLS handshake", ("tls", "handshake_ms")),
    ("http.ttfb_ms", "Time to first byte", ("http", "ttfb_ms")),
    ("http.ttlb_ms", "Time to last byte", ("http", "ttlb_ms")),
)
RESP_LATENCY = ("resp.latency_ms", "Redis command latency", ("resp", "latency_ms"))
"""Shown when either side has Redis (RESP) commands."""
COUNTS = (
    ("dns.transactions", "DNS transactions"),
    ("dns.unanswered", "DNS unanswered"),
    ("dns.retransmissions", "DNS retransmissions"),
    ("tcp.connections", "TCP connections"),
    ("tcp.retransmissions", "TCP retransmissions"),
    ("tcp.resets", "TCP resets"),
    ("tls.handshakes", "TLS handshakes"),
    ("tls.resumed", "TLS resumed"),
    ("http.requests", "HTTP requests"),
    ("http.connections", "Connections with requests"),
)
DELTA_KEYS = ("p50", "p90", "p99", "mean")


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# ----------------------------------------------------------------------------- samples


def _requests(doc: dict[str, Any], resp: bool = False
              ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """HTTP requests (as the summary counts them: Redis connections apart), or with
    ``resp`` the Redis commands."""
    for c in doc.get("connections") or []:
        if isinstance(c, dict) and (c.get("protocol") == "resp") == resp:
            for r in c.get("requests") or []:
                if isinstance(r, dict):
                    yield c, r


def samples(doc: dict[str, Any], metric: str, path: str | None = None) -> list[float]:
    """The per-item values of ``metric`` (a ``LATENCIES`` name) in ``doc``; for requests,
    only those on connections attributed to ``path`` when given."""
    out: list[float] = []
    if metric == "dns.latency_ms":
        out = [d.get("latency_ms") for d in doc.get("dns") or [] if isinstance(d, dict)]
    elif metric == "tcp.handshake_rtt_ms":
        out = [c.get("handshake_rtt_ms") for c in doc.get("connections") or []
               if isinstance(c, dict)]
    elif metric == "tls.handshake_ms":
        out = [(c.get("tls") or {}).get("handshake_ms") for c in doc.get("connections") or []
               if isinstance(c, dict) and isinstance(c.get("tls"), dict)]
    elif metric in ("http.ttfb_ms", "http.ttlb_ms"):
        key = metric.split(".")[1]
        # on a path: the client's requests (chain roots), not those another captured
        # request caused upstream (``caused_by``), as ``summary.paths`` counts them
        out = [r.get(key) for c, r in _requests(doc)
               if path is None or (_path_name(c) == path and not r.get("caused_by"))]
    elif metric == "resp.latency_ms":
        out = [r.get("ttfb_ms") for _, r in _requests(doc, resp=True)]
    return [float(v) for v in out if _num(v)]


def _path_name(conn: dict[str, Any]) -> str | None:
    path = conn.get("path")
    return path.get("name") if isinstance(path, dict) else None


def _get(doc: dict[str, Any], *keys: str) -> Any:
    cur: Any = doc.get("summary") or {}
    for k in keys:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(k)
    return cur


# ----------------------------------------------------------------------------- pieces


def _fmt_p(p: float) -> str:
    if p < 0.001:
        return "p<0.001"
    if p < 0.01:
        return f"p={p:.3f}"
    return f"p={p:.2f}"


def _latency_test(a: list[float], b: list[float], alpha: float, seed: int
                  ) -> dict[str, Any]:
    """Mann-Whitney U + bootstrap for one pair of samples."""
    out: dict[str, Any] = {"n_a": len(a), "n_b": len(b), "test": None, "median_diff": None,
                           "significant": None, "direction": None}
    if not a or not b:
        out["verdict"] = "no data" if not a and not b else \
            f"not comparable (no values in {'A' if not a else 'B'})"
        return out
    mw = mann_whitney_u(a, b)
    out["test"] = {"method": "mann-whitney-u", "approximation": mw.method, "u": mw.u,
                   "z": mw.z, "p_value": mw.p_value, "min_p_value": mw.min_p}
    point, lo, hi = bootstrap_median_diff(b, a, seed=seed)  # median(b) - median(a)
    out["median_diff"] = {"estimate": point, "ci_low": lo, "ci_high": hi, "level": LEVEL,
                          "method": "bootstrap", "resamples": BOOTSTRAP_RESAMPLES,
                          "seed": seed}
    significant = mw.p_value < alpha
    out["significant"] = significant
    if significant:
        out["verdict"] = f"significant ({_fmt_p(mw.p_value)})"
        out["direction"] = "higher" if point > 0 else "lower" if point < 0 else None
    elif mw.min_p >= alpha:
        out["verdict"] = (f"too few values to tell (n={len(a)} vs {len(b)}, "
                          f"{_fmt_p(mw.p_value)})")
        out["significant"] = None
    else:
        out["verdict"] = f"within noise ({_fmt_p(mw.p_value)})"
    return out


def _block(doc: dict[str, Any], keys: tuple[str, ...], values: list[float]
           ) -> dict[str, Any]:
    """The document's own percentile block when it has one, else computed."""
    block = _get(doc, *keys)
    if isinstance(block, dict) and block.get("count") == len(values):
        return block
    return percentiles(values)


def _deltas(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    delta: dict[str, Any] = {}
    pct: dict[str, Any] = {}
    for k in DELTA_KEYS:
        va, vb = a.get(k), b.get(k)
        if _num(va) and _num(vb):
            delta[k] = vb - va
            pct[k] = (vb - va) / va * 100 if va else None
        else:
            delta[k] = pct[k] = None
    return delta, pct


def _latency(doc_a: dict[str, Any], doc_b: dict[str, Any], metric: str, label: str,
             keys: tuple[str, ...], alpha: float, seed: int) -> dict[str, Any]:
    a, b = samples(doc_a, metric), samples(doc_b, metric)
    block_a, block_b = _block(doc_a, keys, a), _block(doc_b, keys, b)
    delta, pct = _deltas(block_a, block_b)
    out = {"metric": metric, "label": label, "unit": "ms", "a": block_a, "b": block_b,
           "delta": delta, "delta_pct": pct}
    out.update(_latency_test(a, b, alpha, seed))
    if metric.startswith("http."):
        out["estimated"] = {"a": bool(_get(doc_a, "http", "estimated")),
                            "b": bool(_get(doc_b, "http", "estimated"))}
    return out


def _reuse(doc_a: dict[str, Any], doc_b: dict[str, Any], alpha: float) -> dict[str, Any]:
    def side(doc: dict[str, Any]) -> tuple[int, int]:
        return (int(_get(doc, "http", "requests") or 0),
                int(_get(doc, "http", "connections") or 0))

    (ra, ca), (rb, cb) = side(doc_a), side(doc_b)
    out: dict[str, Any] = {
        "label": "Connection reuse",
        "a": {"rate": _get(doc_a, "http", "reuse_rate"), "requests": ra, "connections": ca},
        "b": {"rate": _get(doc_b, "http", "reuse_rate"), "requests": rb, "connections": cb},
        "delta": None, "test": None, "significant": None, "direction": None,
    }
    if not ra or not rb:
        out["verdict"] = "no data" if not ra and not rb else \
            f"not comparable (no requests in {'A' if not ra else 'B'})"
        return out
    t = two_proportion_z(ra - ca, ra, rb - cb, rb)
    out["delta"] = t.diff
    out["test"] = {"method": "two-proportion-z", "z": t.z, "p_value": t.p_value,
                   "ci_low": t.ci_low, "ci_high": t.ci_high, "level": LEVEL}
    significant = t.p_value < alpha
    out["significant"] = significant
    if significant:
        out["verdict"] = f"significant ({_fmt_p(t.p_value)})"
        out["direction"] = "higher" if t.diff > 0 else "lower"
    else:
        out["verdict"] = f"within noise ({_fmt_p(t.p_value)})"
    return out


def _counts(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, label in COUNTS:
        va, vb = _get(doc_a, *name.split(".")), _get(doc_b, *name.split("."))
        out.append({"name": name, "label": label, "a": va, "b": vb,
                    "delta": vb - va if _num(va) and _num(vb) else None})
    return out


def _paths(doc_a: dict[str, Any], doc_b: dict[str, Any], alpha: float, seed: int
           ) -> list[dict[str, Any]]:
    pa = _get(doc_a, "paths") or {}
    pb = _get(doc_b, "paths") or {}
    if not isinstance(pa, dict) or not isinstance(pb, dict):
        return []
    out = []
    for name in sorted(set(pa) | set(pb), key=str):
        ea = pa.get(name) if isinstance(pa.get(name), dict) else None
        eb = pb.get(name) if isinstance(pb.get(name), dict) else None
        a = samples(doc_a, "http.ttfb_ms", path=name)
        b = samples(doc_b, "http.ttfb_ms", path=name)
        block_a = (ea or {}).get("ttfb_ms") if isinstance((ea or {}).get("ttfb_ms"), dict) \
            else percentiles(a)
        block_b = (eb or {}).get("ttfb_ms") if isinstance((eb or {}).get("ttfb_ms"), dict) \
            else percentiles(b)
        delta, pct = _deltas(block_a, block_b)
        entry: dict[str, Any] = {
            "name": name, "in_a": ea is not None, "in_b": eb is not None,
            "requests": {"a": (ea or {}).get("requests"), "b": (eb or {}).get("requests")},
            "reuse_rate": {"a": (ea or {}).get("reuse_rate"),
                           "b": (eb or {}).get("reuse_rate")},
            "ttfb": {"metric": f"paths.{name}.ttfb_ms", "label": f"{name} time to first byte",
                     "unit": "ms", "a": block_a, "b": block_b, "delta": delta,
                     "delta_pct": pct},
        }
        entry["ttfb"].update(_latency_test(a, b, alpha, seed))
        entry["figures"] = _path_figures(ea or {}, eb or {})
        out.append(entry)
    return out


def _path_figures(ea: dict[str, Any], eb: dict[str, Any]) -> dict[str, Any]:
    """Other figures of a ``summary.paths`` entry side by side: numbers, and the median
    of each percentile block (``ttlb_ms``, ``phases.dns_ms``...)."""
    out: dict[str, Any] = {}

    def add(name: str, va: Any, vb: Any) -> None:
        if _num(va) or _num(vb):
            out[name] = {"a": va, "b": vb,
                         "delta": vb - va if _num(va) and _num(vb) else None}

    def visit(prefix: str, da: dict[str, Any], db: dict[str, Any], depth: int) -> None:
        for key in sorted(set(da) | set(db), key=str):
            va, vb = da.get(key), db.get(key)
            name = f"{prefix}{key}"
            if name in ("requests", "reuse_rate", "ttfb_ms"):
                continue
            if isinstance(va, dict) or isinstance(vb, dict):
                ba = va if isinstance(va, dict) else {}
                bb = vb if isinstance(vb, dict) else {}
                if "p50" in ba or "p50" in bb:
                    add(f"{name}.p50", ba.get("p50"), bb.get("p50"))
                elif depth < 1:
                    visit(f"{name}.", ba, bb, depth + 1)
            else:
                add(name, va, vb)

    visit("", ea, eb, 0)
    return out


def _findings(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    def by_code(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for f in doc.get("findings") or []:
            if isinstance(f, dict) and f.get("code") is not None:
                out.setdefault(str(f["code"]), f)
        return out

    fa, fb = by_code(doc_a), by_code(doc_b)

    def entry(f: dict[str, Any]) -> dict[str, Any]:
        return {"code": f.get("code"), "severity": f.get("severity"), "title": f.get("title")}

    return {
        "appeared": [entry(fb[c]) for c in fb if c not in fa],
        "gone": [entry(fa[c]) for c in fa if c not in fb],
        "unchanged": [{"code": c, "severity": fb[c].get("severity"),
                       "title_a": fa[c].get("title"), "title_b": fb[c].get("title")}
                      for c in fb if c in fa],
    }


def _latencies(doc_a: dict[str, Any], doc_b: dict[str, Any]
               ) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    if any(True for d in (doc_a, doc_b) for _ in _requests(d, resp=True)):
        return (*LATENCIES, RESP_LATENCY)
    return LATENCIES


def describe(doc: dict[str, Any], label: str | None = None) -> dict[str, Any]:
    """What a side of the diff is: its label, files, and a few capture facts."""
    cap = doc.get("capture") or {}
    files = [str(f) for f in cap.get("files") or []]
    engine = doc.get("engine")
    return {"label": label or (", ".join(os.path.basename(f) for f in files) or "?"),
            "files": files, "packets": cap.get("packets"), "first_ts": cap.get("first_ts"),
            "duration_ms": cap.get("duration_ms"), "truncated": cap.get("truncated"),
            "engine": engine.get("name") if isinstance(engine, dict) else "netdiag",
            "netdiag_version": doc.get("netdiag_version")}


def compare(doc_a: dict[str, Any], doc_b: dict[str, Any], *, alpha: float = ALPHA,
            seed: int = 0, label_a: str | None = None, label_b: str | None = None
            ) -> dict[str, Any]:
    """B against A (deltas are B - A); see the module docstring for the shape."""
    return {
        "diff": DIFF_VERSION,
        "a": describe(doc_a, label_a),
        "b": describe(doc_b, label_b),
        "alpha": alpha,
        "seed": seed,
        "latency": [_latency(doc_a, doc_b, metric, label, keys, alpha, seed)
                    for metric, label, keys in _latencies(doc_a, doc_b)],
        "reuse": _reuse(doc_a, doc_b, alpha),
        "counts": _counts(doc_a, doc_b),
        "paths": _paths(doc_a, doc_b, alpha, seed),
        "findings": _findings(doc_a, doc_b),
    }
