"""The lab's pure parts: parameters, the request plan, DPF's hash, the profile, RESP."""

from __future__ import annotations

import json
import tomllib

import pytest

from netdiag.lab import LabParams
from netdiag.lab.driver import dpf_pick, plan
from netdiag.lab.profile import profile_doc, profile_toml
from netdiag.lab.recover import _resp_args
from netdiag.lab.redis_store import BUDGET_SCRIPT, script_sha
from netdiag.lab.resp import encode


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="origins"):
        LabParams(origins=12)
    with pytest.raises(ValueError, match="router_delay_ms"):
        LabParams(router_delay_ms=-1)
    with pytest.raises(ValueError, match="dpf_tls"):
        LabParams(dpf_tls="1.1")
    with pytest.raises(ValueError, match="sse_share"):
        LabParams(sse_share=1.5)
    doc = json.loads(json.dumps(LabParams(think_ms=7, dpf_think_ms=3).to_json()))
    assert (doc["roc_think_ms"], doc["dpf_think_ms"]) == (7, 3)


def test_plan_is_the_seeds_and_mixes_as_asked() -> None:
    p = LabParams(requests=20, sse_share=0.25, seed=3)
    a, b = plan(p), plan(p)
    assert [(r.rid, r.sse, r.model, r.user) for r in a["ROC"]] == [
        (r.rid, r.sse, r.model, r.user) for r in b["ROC"]]
    for path in ("ROC", "DPF"):
        assert len(a[path]) == 20 and sum(r.sse for r in a[path]) == 5
        assert {r.url_path for r in a[path]} == {"/v1/messages", "/v1/stream"}
    assert a["ROC"][0].rid == "roc-0001" and a["DPF"][-1].rid == "dpf-0020"
    assert plan(LabParams(seed=4))["ROC"] != plan(LabParams(seed=3))["ROC"]


def test_dpf_pick_is_stateless_xxh64() -> None:
    import xxhash

    assert dpf_pick("m", "u", 7, 3) == xxhash.xxh64_intdigest(b"m|u|7") % 3
    picks = {dpf_pick("lab-small", f"user-{i:02d}", 1, 3) for i in range(32)}
    assert picks == {0, 1, 2}


def test_profile_is_valid_toml_of_the_topology() -> None:
    text = profile_toml(2)
    doc = tomllib.loads(text)
    assert doc == profile_doc(2)
    roc, dpf = doc["path"]
    assert [r["hop"] for r in roc["rule"]] == ["edge", "router", "token-store", "origin"]
    assert roc["rule"][3]["server"] == ["127.0.0.21/32", "127.0.0.22/32"]
    assert dpf["rule"][0]["sni"] == ["gpu-*.dpf.test"]


def test_resp_round_trip_and_script_sha() -> None:
    wire = encode("EVALSHA", "ab", 1, "k", 5, "roc-0001")
    assert wire.startswith(b"*6\r\n$7\r\nEVALSHA\r\n")
    assert _resp_args(wire) == [b"EVALSHA", b"ab", b"1", b"k", b"5", b"roc-0001"]
    assert len(script_sha(BUDGET_SCRIPT)) == 40
