"""Path findings, and filling a contract document with paths (what report calls)."""

from __future__ import annotations

import json

from paths_synth import MS, PROFILE, dns, dpf_request, roc_request

from netdiag.analysis.findings import Thresholds
from netdiag.paths.apply import analyze_paths, annotate_document, apply_paths
from netdiag.paths.findings import PathThresholds
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection, Finding


def _lab(k: int = 6, *, redis_ms: float = 0.5, keepalive: bool = True,
         roc_gaps: list[float] | None = None, origin_gaps: list[float] | None = None
         ) -> list[Connection]:
    per = [roc_request(i * 100, 1 + 4 * i, new_origin_conn=True, redis_ms=redis_ms)
           for i in range(k)]
    if keepalive:  # client->edge, edge->router and router->redis on one connection each
        for n in (0, 1, 2):
            for p in per[1:]:
                per[0][n].requests += p[n].requests
        out = per[0] + [p[3] for p in per[1:]]
    else:
        out = [c for p in per for c in p]
    roots = [c for c in out if c.server == "127.0.0.10:443"]
    origins = [c for c in out if c.server == "127.0.0.21:443"]
    if roc_gaps is not None:
        for c in roots:
            for r in c.requests:
                r.chunk_gaps_ns = [round(g * MS) for g in roc_gaps]
                r.sse_events = len(roc_gaps) + 1
    if origin_gaps is not None:
        for c in origins:
            for r in c.requests:
                r.chunk_gaps_ns = [round(g * MS) for g in origin_gaps]
    out += [dpf_request(10_000 + i * 100, 1000 + i, think=10) for i in range(k)]
    return out


def _codes(fs: list[Finding]) -> list[tuple[str, str]]:
    return [(f.code, f.title) for f in fs]


def test_dominant_hop_reuse_and_difference() -> None:
    a = analyze_paths(_lab(), [], parse_profile(PROFILE))
    by_code: dict[str, list[Finding]] = {}
    for f in a.findings:
        by_code.setdefault(f.code, []).append(f)
    dom = {f.title.split(":")[0]: f for f in by_code["path-dominant-hop"]}
    assert dom["ROC"].title == ("ROC: the origin takes 20.0 ms of the 34.5 ms median time "
                                "to first byte (58%)")
    assert "edge 2.0 ms, router 11.5 ms, token-store 0.5 ms, origin 20.0 ms" in \
        dom["ROC"].detail
    assert "connection setup to the origin 0.5 ms" in dom["ROC"].detail
    assert dom["ROC"].evidence == ["C4", "C8", "C12", "C16", "C20", "C24"]
    assert dom["DPF"].title.startswith("DPF: the origin takes 10.0 ms of the 10.0 ms")
    # the router opens a new connection to the origin per request; the DPF clients too
    low = {f.title for f in by_code["path-low-reuse"]}
    assert low == {"ROC: 100% of requests to the origin opened a new connection",
                   "DPF: 100% of requests to the origin opened a new connection"}
    roc_low = next(f for f in by_code["path-low-reuse"] if f.title.startswith("ROC"))
    assert "Each new connection to it cost a median 0.5 ms" in roc_low.detail
    (diff,) = by_code["path-difference"]
    assert diff.title == "ROC adds 11.5 ms at the router (95% CI 11.5–11.5 ms, 6 linked requests)"
    assert "ROC's time to first byte is 24.5 ms longer than DPF's" in diff.detail
    assert diff.evidence == ["C2"]
    assert "token-store-latency" not in by_code and "path-streaming-stalls" not in by_code
    assert [f.severity for f in a.findings] == sorted(
        (f.severity for f in a.findings), key=["critical", "warning", "info"].index)


def test_token_store_latency() -> None:
    a = analyze_paths(_lab(redis_ms=14.0), [], parse_profile(PROFILE))
    (f,) = [f for f in a.findings if f.code == "token-store-latency"]
    assert f.title == "ROC: EVALSHA at the token-store takes 14.0 ms at p99 (threshold 10.0 ms)"
    assert "EVALSHA: median 14.0 ms, p99 14.0 ms over 6" in f.detail
    assert f.evidence == ["C3"]
    quiet = analyze_paths(_lab(redis_ms=14.0), [], parse_profile(PROFILE),
                          path_thresholds=PathThresholds(resp_slow_ms=20.0))
    assert not [f for f in quiet.findings if f.code == "token-store-latency"]


def test_streaming_stalls_say_where_the_pause_is() -> None:
    at_origin = analyze_paths(_lab(roc_gaps=[5, 700, 5], origin_gaps=[5, 699, 5]), [],
                              parse_profile(PROFILE))
    (f,) = [f for f in at_origin.findings if f.code == "path-streaming-stalls"]
    assert f.title == "ROC: streamed answers stalled 6 time(s) for more than 500.0 ms"
    assert "already at the origin (6)" in f.detail and f.evidence == ["C1"]
    added = analyze_paths(_lab(roc_gaps=[5, 700, 5], origin_gaps=[5, 5, 5]), [],
                          parse_profile(PROFILE), thresholds=Thresholds(stall_ms=500))
    (g,) = [f for f in added.findings if f.code == "path-streaming-stalls"]
    assert "not at the origin (6)" in g.detail


def test_apply_paths_fills_the_document() -> None:
    conns = _lab()
    dns_records = [dns(-10, 2.0, "api.roc.test", ["127.0.0.10"])]
    doc = {"contract": 1,
           "summary": {"http": {}, "paths": {}},
           "connections": [c.to_json() for c in conns],
           "findings": [{"severity": "info", "code": "x", "title": "t", "detail": "d",
                         "evidence": []},
                        {"severity": "critical", "code": "y", "title": "t", "detail": "d",
                         "evidence": []}]}
    analysis = apply_paths(doc, conns, dns_records, parse_profile(PROFILE))
    json.dumps(doc)  # serialisable
    cj = {c["id"]: c for c in doc["connections"]}
    assert cj["C1"]["path"]["name"] == "ROC" and cj["C1"]["path"]["hop"] == "edge"
    assert all(c["path"] is not None for c in doc["connections"])
    chain = cj["C1"]["requests"][0]["chain"]
    assert [(s["hop"], s["own_ms"]) for s in chain] == [
        ("edge", 2.0), ("router", 11.5), ("token-store", 0.5), ("origin", 20.0)]
    assert chain[3]["setup_ms"] == 0.5 and chain[0]["setup_ms"] is None
    assert "caused_by" not in cj["C1"]["requests"][0]
    assert cj["C2"]["requests"][1]["caused_by"] == {"connection": "C1", "request": 1}
    assert "chain" not in cj["C2"]["requests"][0]
    assert "chain" not in cj["C1000"]["requests"][0]  # a direct request causes nothing
    s = doc["summary"]
    assert set(s["paths"]) == {"ROC", "DPF"} and s["paths"]["ROC"]["requests"] == 6
    assert s["paths"]["ROC"]["phases"]["dns_ms"]["count"] == 1
    assert s["path_comparison"][0]["phase"] == "ttfb"
    assert doc["findings"][0]["code"] == "y"
    assert doc["findings"][-1]["code"] in {"x", "path-difference", "path-dominant-hop"}
    assert {f.code for f in analysis.findings} <= {f["code"] for f in doc["findings"]}


def test_annotate_only_touches_known_connections() -> None:
    conns = _lab(3)
    a = analyze_paths(conns, [], None)
    doc = {"connections": [{"id": "C999", "path": None, "requests": [{}]},
                           *[c.to_json() for c in conns]]}
    annotate_document(doc, conns, a)
    assert doc["connections"][0] == {"id": "C999", "path": None, "requests": [{}]}
    assert doc["connections"][1]["path"]["name"] == "via 127.0.0.10:443"
