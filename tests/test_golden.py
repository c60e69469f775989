"""Golden test: the report on the shipped capture against what the lab did and a baseline.

``captures/antho.pcapng`` is one run of the lab (``captures/make_antho.py``): its
ledger ``antho.expected.json`` says what the clients, the edge and the router did.
The capture embeds its TLS keys, so it is checked twice: as shipped (decrypted from
its decryption-secrets block) and rewritten without that block (the estimated view).

Counts must match exactly; timings within a tolerance, so that regenerating the
capture keeps the test stable. Set ``NETDIAG_UPDATE_GOLDEN=1`` to rewrite the baseline
after an intended change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from netdiag.capture.pcapng_writer import write_pcapng
from netdiag.capture.reader import CaptureReader
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
EXPECTED = ROOT / "captures" / "antho.expected.json"
GOLDEN = ROOT / "tests" / "data" / "antho.golden.json"


def _report(path: Path) -> dict[str, Any]:
    sink = CollectingSink()
    result = analyze([str(path)], sink, Options())
    return sink.document(result)


@pytest.fixture(scope="module")
def exp() -> dict[str, Any]:
    return dict(json.loads(EXPECTED.read_text()))


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    """The report as shipped: decrypted with the keys embedded in the capture."""
    return _report(ANTHO)


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report on the same packets without the decryption-secrets block."""
    bare = tmp_path_factory.mktemp("golden") / "antho-nokeys.pcapng"
    with CaptureReader(ANTHO) as reader, open(bare, "wb") as f:
        write_pcapng(f, reader.packets())
    return _report(bare)


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
            "tls_decrypted": s["tls"]["decrypted"],
            "requests": s["http"]["requests"],
            "request_connections": s["http"]["connections"],
            "protocols": s["http"]["protocols"],
        },
        "timings_ms": {
            "dns_p50": s["dns"]["latency_ms"]["p50"],
            "tcp_rtt_p50": s["tcp"]["handshake_rtt_ms"]["p50"],
            "tls_p50": s["tls"]["handshake_ms"]["p50"],
            "ttfb_p50": s["http"]["ttfb_ms"]["p50"],
        },
    }


def _tls_connections(exp: dict[str, Any]) -> list[dict[str, Any]]:
    """Every TLS connection the lab made: the clients', then the router's upstream ones."""
    ups = [{"path": "ROC", "client": u["client"], "server": u["server"], "sni": u["sni"],
            "tls_version": "TLS 1.3", "resumed": False, "requests": [{}]}
           for u in exp["router"]["upstream_log"]]
    return list(exp["connection_log"]) + ups


def _n_requests(exp: dict[str, Any]) -> int:
    """HTTP requests on the wire: each client request, and each ROC one twice more
    (edge -> router, router -> origin)."""
    clients = exp["requests"]["roc"] + exp["requests"]["dpf"]
    return clients + exp["edge"]["requests"] + exp["router"]["upstream_connections"]


def test_ledger_is_consistent(exp: dict[str, Any]) -> None:
    roc = exp["requests"]["roc"]
    assert exp["edge"]["requests"] == exp["router"]["requests"] == roc
    assert exp["router"]["upstream_connections"] == exp["router"]["redis_commands"] == roc
    assert exp["router"]["redis_server_calls"]["evalsha"] == roc
    assert exp["errors"] == [] and exp["capture_drops"] == 0


def test_matches_what_the_lab_did(doc: dict[str, Any], exp: dict[str, Any]) -> None:
    s = doc["summary"]
    assert s["dns"]["transactions"] == exp["dns_queries"]
    assert s["dns"]["unanswered"] == 0
    assert s["dns"]["rcodes"].get("NXDOMAIN", 0) == exp["dns_nxdomain"] >= 1
    dns_names = sorted((t["qname"], t["transport"], t["rcode"]) for t in doc["dns"])
    assert dns_names == sorted((d["qname"], d["transport"], d["rcode"]) for d in exp["dns_log"])
    assert all(t["latency_ms"] >= exp["params"]["dns_delay_ms"] for t in doc["dns"])
    assert s["tcp"]["connections"] == sum(exp["tcp_connections"].values())
    tls = _tls_connections(exp)
    assert s["tls"]["handshakes"] == len(tls)
    assert s["tls"]["versions"] == exp["tls_versions"]
    assert set(exp["tls_versions"]) == {"TLS 1.3", "TLS 1.2"}
    assert s["tls"]["resumed"] == exp["tls_resumed"] == 1
    assert s["tls"]["decrypted"] == len(tls)  # keys from the capture itself
    by_client = {c["client"]: c for c in doc["connections"]}
    for logged in tls:
        c = by_client[logged["client"]]
        assert c["server"] == logged["server"]
        assert c["tls"]["sni"] == logged["sni"]
        assert c["tls"]["version"] == logged["tls_version"]
        assert c["tls"]["resumed"] == logged["resumed"]
        assert "h2" in c["tls"]["alpn_offered"]
        assert len(c["requests"]) == len(logged["requests"]), c["id"]
        assert not any(r["estimated"] for r in c["requests"])
    # the edge's pooled cleartext HTTP/2 connection to the router carries every ROC request
    (hop,) = [c for c in doc["connections"]
              if c["client"] in exp["edge"]["router_clients"]]
    assert hop["protocol"] == "h2c" and len(hop["requests"]) == exp["requests"]["roc"]
    http = s["http"]
    n_req = _n_requests(exp)
    conns = len(tls) + exp["edge"]["router_connections"]
    assert http["requests"] == n_req
    assert http["protocols"] == {"h2": n_req - exp["requests"]["roc"],
                                 "h2c": exp["requests"]["roc"]}
    assert http["estimated"] is False
    assert http["reuse_rate"] == pytest.approx((n_req - conns) / n_req)


def test_keyless_inference_finds_every_request(keyless: dict[str, Any],
                                               exp: dict[str, Any]) -> None:
    """One request at a time per connection: without keys, the inference from record
    timing must find exactly the requests the clients and the router made."""
    s = keyless["summary"]
    assert s["tls"]["decrypted"] == 0
    by_client = {c["client"]: c for c in keyless["connections"]}
    tls = _tls_connections(exp)
    for logged in tls:
        c = by_client[logged["client"]]
        assert len(c["requests"]) == len(logged["requests"]), c["id"]
        assert all(r["estimated"] and r["ttfb_ms"] is not None for r in c["requests"])
    http = s["http"]
    n_req = _n_requests(exp)
    conns = len(tls) + exp["edge"]["router_connections"]
    assert http["requests"] == n_req
    assert http["estimated"] is True
    assert http["reuse_rate"] == pytest.approx((n_req - conns) / n_req)


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
    assert abs(got_counts.pop("packets") - want["counts"]["packets"]) <= 40
    assert got_counts == counts
    for name, value in want["timings_ms"].items():
        assert got["timings_ms"][name] == pytest.approx(value, rel=0.5, abs=2.0), name
