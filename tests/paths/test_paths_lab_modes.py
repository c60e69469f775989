"""Issue 9's acceptance on live lab runs: in each proxy shape, the chains netdiag finds
are the ones the lab's ledger says, and each hop's own time is what tshark's frame
times of the same requests give.

The truth comes from outside netdiag: the ledger joins the hops' own logs (inbound
endpoint and stream id or ordinal -> outbound ones, no header read), and
``tests/crosscheck/hops_ref.py`` computes every hop's wait and own time from tshark
alone. Nothing is compared with a delay the lab injected. Each run is a small lab in
a network namespace of its own (``netns=True``), so it collides with nothing.

``NETDIAG_CHAIN_FIGURES=FILE`` appends each mode's figures (linked share, error
median / p95 / max per hop) to FILE as JSON lines.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crosscheck"))

from labtools import LIVE

from netdiag.lab import LabParams
from netdiag.paths.apply import analyze_paths
from netdiag.paths.profile import load_profile
from netdiag.pipeline import analyze
from netdiag.report.records_out import CollectingSink

pytestmark = [LIVE, pytest.mark.slow, pytest.mark.tshark,
              pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")]

BASE: dict[str, Any] = {"requests": 48, "think_ms": 15.0, "router_delay_ms": 5.0,
                        "token_gap_ms": 2.0, "sse_events": 4, "dns_delay_ms": 1.0,
                        "hash_bucket": 7, "settle_ms": 200.0, "netns": True,
                        "timeout_s": 60.0, "concurrency": 16}
MODES: dict[str, dict[str, Any]] = {
    "concurrency-16": {},
    "pooled-h2": {"upstream_pool": True},
    "pooled-http1": {"upstream_pool": True, "origin_protocol": "http1"},
    "upstream-from-127.0.0.1": {"upstream_source": "loopback", "upstream_pool": True},
    "no-request-ids": {"request_ids": False},
    "http1-router": {"router_protocol": "http1"},
    "all-at-once": {"request_ids": False, "upstream_source": "loopback",
                    "upstream_pool": True, "origin_protocol": "http1",
                    "router_protocol": "http1"},
}
HOPS = ("edge", "router", "token-store", "origin")


def _key(rec: dict[str, Any]) -> tuple[str, str, int]:
    ident = rec["stream_id"] if rec.get("stream_id") is not None else rec["ordinal"]
    return rec["client"], rec["server"], int(ident)


def _run(tmp: Path, mode: dict[str, Any]) -> tuple[dict[str, Any], Path, Any]:
    from netdiag.lab import run_lab

    cap = tmp / "lab.pcapng"
    ledger = run_lab(cap, LabParams(**{**BASE, **mode}))
    sink = CollectingSink()
    analyze([str(cap)], sink)
    analysis = analyze_paths(sink.connections, sink.dns_records,
                             load_profile(str(tmp / "lab.paths.toml")))
    return ledger, cap, analysis


@pytest.mark.parametrize("name", list(MODES))
def test_chains_and_hop_times_follow_the_ledger_and_tshark(name: str, tmp_path: Path
                                                           ) -> None:
    import hops_ref

    ledger, cap, analysis = _run(tmp_path, MODES[name])
    assert not [e for e in ledger["errors"] if str(e).startswith("chain")], ledger["errors"]
    truth = [c for c in ledger["chains"] if c["path"] == "ROC"]
    assert len(truth) >= BASE["requests"] * 0.9

    # 1. the chain of every client request, as the ledger says
    key_of = {}
    for node in analysis.chains.nodes.values():
        key_of[hops_ref.netdiag_key(node.conn, node.index)] = node
    right = 0
    wrong: list[str] = []
    for c in truth:
        root = key_of.get(hops_ref.request_key(*_key(c["client"])))
        assert root is not None, c["client"]
        want = [root] + [key_of.get(hops_ref.request_key(*_key(u))) for u in c["upstream"]]
        ok = root.parent is None and all(n is not None for n in want)
        if ok:
            for u, n in zip(c["upstream"], want[1:], strict=True):
                ok = ok and n.parent is want[u["parent"]]
            got = {s.node.key for s in analysis.chains.steps(root)}
            ok = ok and got == {n.key for n in want}
        right += ok
        if not ok:
            wrong.append(f"{c['request_id']}: " + ", ".join(
                f"{n.label}<-{n.parent.label if n.parent else None} [{n.link}]"
                for n in want if n is not None))
    share = right / len(truth)

    # 2. client requests are the clients' only
    roc = analysis.budgets["ROC"]
    assert roc.requests == len(truth), (roc.requests, len(truth))

    # 3. each hop's own time against tshark's frame times of the ledger's chain
    ref = hops_ref.wire_reference(cap)
    cmp_ = hops_ref.compare_chains(ref, analysis.chain_table,
                                   hops_ref.chains_from_ledger(ledger["chains"]))
    own_within = cmp_.share_within("own", 1.0)
    per_hop: dict[str, dict[str, float]] = {}
    for hop in HOPS:
        rows = [r for r in cmp_.rows
                if _hop_of(analysis, r["key"], hops_ref) == hop]
        errs = sorted(abs(a - b) for a, b in (r["own"] for r in rows)
                      if a is not None and b is not None)
        if errs:
            per_hop[hop] = {"n": len(errs), "median": errs[len(errs) // 2],
                            "p95": errs[min(len(errs) - 1, int(0.95 * len(errs)))],
                            "max": errs[-1]}
    figures = {"mode": name, "client_requests": len(truth), "linked_right": right,
               "linked_share": round(share, 4),
               "chains": analysis.summary()["ROC"]["chains"],
               "own_within_1ms": round(own_within, 4), "own_error_ms": per_hop}
    out = os.environ.get("NETDIAG_CHAIN_FIGURES")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(figures) + "\n")
    assert share >= 0.95, (figures, wrong[:8])
    assert own_within >= 0.95, (figures, cmp_.worst("own"))


def _hop_of(analysis: Any, key: Any, hops_ref: Any) -> str | None:
    for node in analysis.chains.nodes.values():
        if hops_ref.netdiag_key(node.conn, node.index) == key:
            p = node.conn.path
            return None if p is None else p.get("hop")
    return None


def test_client_only_view_splits_the_edge_as_its_header_says(tmp_path: Path) -> None:
    """Only the client's connections to the edge, as a capture on the client would
    have them: netdiag names the split the edge's Server-Timing gives, request by
    request, and the edge's upstream time it states agrees with the wire's router wait
    seen in the full capture (the edge's clock reads it, so within a few ms)."""
    ledger, cap, _ = _run(tmp_path, {"server_timing": True, "concurrency": 8,
                                     "requests": 24})
    sink = CollectingSink()
    analyze([str(cap)], sink)
    edge_ip = ledger["servers"]["edge"]["address"]
    client_side = [c for c in sink.connections if c.server == edge_ip]
    from netdiag.paths.edge import request_split

    sent = {c["request_id"]: c["server_timing"] for c in ledger["chains"]
            if c["path"] == "ROC" and c.get("server_timing")}
    assert len(sent) >= 20
    seen = 0
    for c in client_side:
        for r in c.requests:
            split = request_split(r)
            assert split is not None, r.response_headers
            rid = dict(r.request_headers or []).get("x-request-id")
            st = sent.get(rid or "")
            if st is None:
                continue
            seen += 1
            if split["source"] == "x-envoy-upstream-service-time":
                said = float(st["x-envoy-upstream-service-time"])
                assert split["raw"] == st["x-envoy-upstream-service-time"]
            else:
                assert split["source"] == "server-timing"
                assert split["raw"] == st["server-timing"]
                said = float(st["upstream_ms"])
            assert split["upstream_ms"] == pytest.approx(said, abs=1e-3)
            ttfb = (r.first_byte_ns - r.ts_ns) / 1e6
            assert split["edge_ms"] == pytest.approx(ttfb - split["upstream_ms"], abs=2e-3)
    assert seen >= 20
