"""``compare()`` on synthetic documents: deltas, significance, reuse, paths, findings."""

from __future__ import annotations

import json

import pytest
from diff_docs import make_doc, normal

from netdiag.diff.compare import compare


def _metric(result: dict, name: str) -> dict:
    return next(m for m in result["latency"] if m["metric"] == name)


def test_shifted_distributions_are_significant() -> None:
    a = make_doc(dns=normal(5, 0.5, 40, 1), rtt=normal(10, 1, 40, 2), tls=normal(20, 2, 40, 3),
                 ttfb=normal(100, 10, 60, 4))
    b = make_doc(dns=normal(8, 0.5, 40, 5), rtt=normal(10, 1, 40, 6), tls=normal(20, 2, 40, 7),
                 ttfb=normal(80, 10, 60, 8))
    r = compare(a, b)
    dns = _metric(r, "dns.latency_ms")
    assert dns["significant"] is True and dns["direction"] == "higher"
    assert dns["test"]["p_value"] < 0.001
    assert dns["verdict"] == "significant (p<0.001)"
    md = dns["median_diff"]
    assert md["ci_low"] < md["estimate"] < md["ci_high"]
    assert md["ci_low"] > 2 and md["ci_high"] < 4  # the true shift is 3 ms
    assert dns["delta"]["p50"] == pytest.approx(b["summary"]["dns"]["latency_ms"]["p50"]
                                                - a["summary"]["dns"]["latency_ms"]["p50"])
    ttfb = _metric(r, "http.ttfb_ms")
    assert ttfb["significant"] is True and ttfb["direction"] == "lower"
    for name in ("tcp.handshake_rtt_ms", "tls.handshake_ms"):
        m = _metric(r, name)
        assert m["significant"] is False, m
        assert m["verdict"].startswith("within noise (p=")
        assert m["test"]["p_value"] >= 0.05


def test_the_same_sample_is_within_noise_and_zero() -> None:
    a = make_doc(dns=normal(5, 0.5, 20, 1), ttfb=normal(50, 5, 20, 2))
    r = compare(a, json.loads(json.dumps(a)))
    for m in r["latency"]:
        if m["n_a"]:
            assert m["significant"] is False
            assert m["delta"]["p50"] == 0 and m["median_diff"]["estimate"] == 0
            assert m["test"]["p_value"] == pytest.approx(1.0)


def test_deterministic() -> None:
    a = make_doc(dns=normal(5, 0.5, 30, 1), ttfb=normal(50, 5, 30, 2), per_conn=3)
    b = make_doc(dns=normal(5.2, 0.5, 30, 3), ttfb=normal(52, 5, 30, 4), per_conn=2)
    assert json.dumps(compare(a, b)) == json.dumps(compare(a, b))
    assert compare(a, b, seed=1)["latency"][0]["median_diff"] != \
        compare(a, b, seed=2)["latency"][0]["median_diff"]


def test_too_few_values_and_missing_sides() -> None:
    a = make_doc(dns=[1.0, 2.0], rtt=[1.0])
    b = make_doc(dns=[5.0, 6.0])
    r = compare(a, b)
    dns = _metric(r, "dns.latency_ms")
    # 2 vs 2 can never reach p < 0.05 (smallest possible p = 2 / C(4, 2) = 0.33)
    assert dns["significant"] is None
    assert dns["verdict"].startswith("too few values to tell (n=2 vs 2")
    rtt = _metric(r, "tcp.handshake_rtt_ms")
    assert rtt["test"] is None and rtt["verdict"] == "not comparable (no values in B)"
    ttfb = _metric(r, "http.ttfb_ms")
    assert ttfb["verdict"] == "no data" and ttfb["delta"]["p50"] is None


def test_reuse_rate_proportion_test() -> None:
    a = make_doc(ttfb=normal(50, 5, 40, 1), per_conn=1)   # no reuse
    b = make_doc(ttfb=normal(50, 5, 40, 2), per_conn=10)  # 90% reuse
    r = compare(a, b)["reuse"]
    assert r["a"]["rate"] == 0 and r["b"]["rate"] == pytest.approx(0.9)
    assert r["delta"] == pytest.approx(0.9)
    assert r["significant"] is True and r["direction"] == "higher"
    assert r["test"]["method"] == "two-proportion-z" and r["test"]["p_value"] < 0.001
    same = compare(b, b)["reuse"]
    assert same["significant"] is False and same["verdict"] == "within noise (p=1.00)"
    none = compare(make_doc(), b)["reuse"]
    assert none["test"] is None and none["verdict"] == "not comparable (no requests in A)"


def test_findings_appeared_and_gone() -> None:
    a = make_doc(findings=[("warning", "low-connection-reuse", "56% opened a new connection"),
                           ("warning", "slow-dns", "2 DNS answers took longer than 100 ms")])
    b = make_doc(findings=[("warning", "slow-dns", "1 DNS answer took longer than 100 ms"),
                           ("critical", "retransmissions", "40 TCP retransmissions")])
    f = compare(a, b)["findings"]
    assert [e["code"] for e in f["appeared"]] == ["retransmissions"]
    assert f["appeared"][0]["severity"] == "critical"
    assert [e["code"] for e in f["gone"]] == ["low-connection-reuse"]
    assert [(e["code"], e["title_a"], e["title_b"]) for e in f["unchanged"]] == [
        ("slow-dns", "2 DNS answers took longer than 100 ms",
         "1 DNS answer took longer than 100 ms")]


def test_paths_side_by_side() -> None:
    a = make_doc(paths={"ROC": normal(100, 5, 30, 1), "DPF": normal(50, 5, 30, 2)})
    b = make_doc(paths={"ROC": normal(130, 5, 30, 3), "DPF": normal(50, 5, 30, 4),
                        "NEW": [10.0, 11.0]})
    paths = {p["name"]: p for p in compare(a, b)["paths"]}
    assert set(paths) == {"DPF", "NEW", "ROC"}
    roc = paths["ROC"]["ttfb"]
    assert roc["significant"] is True and roc["direction"] == "higher"
    assert roc["n_a"] == roc["n_b"] == 30
    assert paths["DPF"]["ttfb"]["significant"] is False
    new = paths["NEW"]
    assert new["in_a"] is False and new["in_b"] is True
    assert new["requests"] == {"a": None, "b": 2}
    assert new["ttfb"]["verdict"] == "not comparable (no values in A)"
    # the overall TTFB mixes both paths
    assert compare(a, b)["latency"][3]["n_a"] == 60


def test_counts_and_sides() -> None:
    a = make_doc(dns=[1.0] * 3, files=["/x/before.pcapng"])
    b = make_doc(dns=[1.0] * 5, files=["/x/after.pcapng"])
    r = compare(a, b, label_b="after fix")
    assert r["a"]["label"] == "before.pcapng" and r["b"]["label"] == "after fix"
    counts = {c["name"]: c for c in r["counts"]}
    assert counts["dns.transactions"] == {"name": "dns.transactions",
                                          "label": "DNS transactions", "a": 3, "b": 5,
                                          "delta": 2}
    assert r["diff"] == 1 and r["alpha"] == 0.05


def test_estimated_requests_are_flagged() -> None:
    a = make_doc(ttfb=[1.0, 2.0, 3.0], estimated=True)
    b = make_doc(ttfb=[1.0, 2.0, 3.0])
    m = _metric(compare(a, b), "http.ttfb_ms")
    assert m["estimated"] == {"a": True, "b": False}


def test_path_samples_are_the_client_requests() -> None:
    a = make_doc(paths={"ROC": normal(100, 5, 10, 1)})
    b = make_doc(paths={"ROC": normal(100, 5, 10, 2)})
    # an upstream hop of the same path: requests the client's requests caused
    for doc in (a, b):
        doc["connections"].append({
            "id": "C99", "ts": 1.0, "client": "10.0.0.9:1", "server": "10.0.0.10:8080",
            "path": {"name": "ROC", "hop": "router"}, "protocol": "h2c",
            "requests": [{"ts": 1.0, "ttfb_ms": 5000.0, "ttlb_ms": 5001.0,
                          "caused_by": {"connection": "C1", "request": 0}}] * 10})
        doc["connections"].append({
            "id": "C98", "ts": 1.0, "client": "10.0.0.9:2", "server": "10.0.0.12:6379",
            "path": {"name": "ROC", "hop": "token-store"}, "protocol": "resp",
            "requests": [{"ts": 1.0, "ttfb_ms": 0.2, "protocol": "resp"}] * 3})
    r = compare(a, b)
    roc = r["paths"][0]["ttfb"]
    assert roc["n_a"] == roc["n_b"] == 10 and roc["a"]["count"] == 10
    # the overall TTFB counts every HTTP request (as summary.http does), Redis apart
    assert r["latency"][3]["n_a"] == 20
    redis = next(m for m in r["latency"] if m["metric"] == "resp.latency_ms")
    assert redis["n_a"] == 3 and redis["label"] == "Redis command latency"
