"""Golden test: the report on the shipped capture against what its script did and a baseline.

Counts must match exactly; timings within a tolerance, so that regenerating the
capture (``python captures/make_antho.py``) keeps the test stable. Set
``NETDIAG_UPDATE_GOLDEN=1`` to rewrite the baseline after an intended change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
EXPECTED = ROOT / "captures" / "antho.expected.json"
GOLDEN = ROOT / "tests" / "data" / "antho.golden.json"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    sink = CollectingSink()
    result = analyze([str(ANTHO)], sink, Options())
    return sink.document(result)


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["summary"]
    return {
        "counts": {
            "packets": doc["capture"]["packets"],
            "dns_transactions": s["dns"]["transactions"],
            "dns_unanswered": s["dns"]["unanswered"],
            "tcp_connections": s["tcp"]["connections"],
            "tls_handshakes": s["tls"]["handshakes"],
            "tls_versions": s["tls"]["versions"],
            "tls_resumed": s["tls"]["resumed"],
            "requests": s["http"]["requests"],
            "request_connections": s["http"]["connections"],
        },
        "timings_ms": {
            "dns_p50": s["dns"]["latency_ms"]["p50"],
            "tcp_rtt_p50": s["tcp"]["handshake_rtt_ms"]["p50"],
            "tls_p50": s["tls"]["handshake_ms"]["p50"],
            "ttfb_p50": s["http"]["ttfb_ms"]["p50"],
        },
    }


def test_matches_what_the_capture_script_did(doc: dict[str, Any]) -> None:
    exp = json.loads(EXPECTED.read_text())
    s = doc["summary"]
    assert s["dns"]["transactions"] == exp["dns_queries"]
    assert s["dns"]["unanswered"] == 0
    assert s["dns"]["rcodes"].get("NXDOMAIN", 0) == exp["dns_nxdomain"]
    tcp_dns = exp["dns_transports"].get("tcp", 0)
    tls_conns = sum(exp["connections"].values())
    assert s["tcp"]["connections"] == tls_conns + tcp_dns
    assert s["tls"]["handshakes"] == tls_conns
    assert s["tls"]["versions"] == exp["tls_versions"]
    assert s["tls"]["resumed"] == exp["tls_resumed"]
    by_client = {c["client"]: c for c in doc["connections"]}
    for logged in exp["connection_log"]:
        c = by_client[logged["client"]]
        assert c["server"].startswith(exp["servers"][logged["path"].lower()]["address"][:-4])
        assert c["tls"]["sni"] == logged["sni"]
        assert c["tls"]["version"] == logged["tls_version"]
        assert c["tls"]["resumed"] == logged["resumed"]
        assert "h2" in c["tls"]["alpn_offered"]
        # Sequential requests, one at a time: the inference from record timing must
        # find exactly the requests the client made.
        assert len(c["requests"]) == len(logged["requests"]), c["id"]
        assert all(r["estimated"] and r["ttfb_ms"] is not None for r in c["requests"])
    http = s["http"]
    n_req = sum(exp["requests"].values())
    assert http["requests"] == n_req
    assert http["reuse_rate"] == pytest.approx((n_req - tls_conns) / n_req)
    dns_names = sorted((t["qname"], t["transport"], t["rcode"]) for t in doc["dns"])
    assert dns_names == sorted((d["qname"], d["transport"], d["rcode"]) for d in exp["dns_log"])
    delay = exp["params"]["dns_delay_ms"]
    assert all(t["latency_ms"] >= delay for t in doc["dns"])


def test_against_golden_baseline(doc: dict[str, Any]) -> None:
    got = _figures(doc)
    if os.environ.get("NETDIAG_UPDATE_GOLDEN") or not GOLDEN.exists():
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        if not os.environ.get("NETDIAG_UPDATE_GOLDEN"):
            pytest.fail(f"{GOLDEN} was missing and has been written; commit it")
    want = json.loads(GOLDEN.read_text())
    counts = dict(want["counts"])
    counts.pop("packets")  # a regenerated capture differs by a few ACKs
    got_counts = dict(got["counts"])
    assert abs(got_counts.pop("packets") - want["counts"]["packets"]) <= 20
    assert got_counts == counts
    for name, value in want["timings_ms"].items():
        assert got["timings_ms"][name] == pytest.approx(value, rel=0.5, abs=2.0), name
