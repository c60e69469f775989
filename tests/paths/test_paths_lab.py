"""End to end on the shipped lab capture: attribution per the ledger, injected delays.

``captures/antho.pcapng`` (keys embedded), ``antho.paths.toml`` and
``antho.expected.json`` come from ``netdiag lab``; the ledger names every client
endpoint the lab's clients, edge and router used, and the delays it injected
(``params``). Skipped while the shipped capture predates the lab.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from netdiag.paths.apply import PathsAnalysis, analyze_paths
from netdiag.paths.budget import median
from netdiag.paths.profile import load_profile
from netdiag.pipeline import analyze
from netdiag.records import Connection

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = Path(os.environ.get("NETDIAG_PATHS_LAB", ROOT / "captures" / "antho.pcapng"))
"""The lab capture; ``NETDIAG_PATHS_LAB=/tmp/x/lab.pcapng`` checks another lab run."""
STEM = CAPTURE.name.split(".")[0]
PROFILE = CAPTURE.with_name(f"{STEM}.paths.toml")
EXPECTED = CAPTURE.with_name(f"{STEM}.expected.json")
REDIS = "127.0.0.12:6379"
TOLERANCE_MS = 2.0


def _ledger() -> dict[str, Any]:
    if not (CAPTURE.exists() and PROFILE.exists() and EXPECTED.exists()):
        pytest.skip("the shipped capture has no lab profile yet (netdiag lab writes it)")
    led = json.loads(EXPECTED.read_text())
    if "params" not in led or "router" not in led:
        pytest.skip("antho.expected.json is not a lab ledger")
    return dict(led)


class _Sink:
    def __init__(self) -> None:
        self.dns_records: list[Any] = []
        self.connections: list[Connection] = []

    def dns(self, t: Any) -> None:
        self.dns_records.append(t)

    def connection(self, c: Connection) -> None:
        self.connections.append(c)


@pytest.fixture(scope="module")
def lab() -> tuple[dict[str, Any], list[Connection], list[Any]]:
    led = _ledger()
    sink = _Sink()
    analyze([str(CAPTURE)], sink)
    sink.connections.sort(key=lambda c: int(c.id[1:]))
    return led, sink.connections, sink.dns_records


def _expected_hops(led: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Client endpoint -> (path, hop), from what the lab's clients, edge and router
    say they used."""
    out: dict[str, tuple[str, str]] = {}
    for c in led["connection_log"]:
        out[c["client"]] = (c["path"], "edge" if c["path"] == "ROC" else "origin")
    for ep in led["edge"]["router_clients"]:
        out[ep] = ("ROC", "router")
    for u in led["router"]["upstream_log"]:
        out[u["client"]] = ("ROC", "origin")
    return out


def _analysis(lab: Any, with_profile: bool) -> PathsAnalysis:
    _led, conns, dns = lab
    return analyze_paths(conns, dns, load_profile(str(PROFILE)) if with_profile else None)


def test_profile_puts_every_connection_on_its_path_and_hop(lab: Any) -> None:
    led, conns, _dns = lab
    _analysis(lab, True)
    expected = _expected_hops(led)
    seen = 0
    for c in conns:
        if c.protocol == "dns" or c.server.endswith(":53"):
            assert c.path is None, c.id
            continue
        want = ("ROC", "token-store") if c.server == REDIS else expected.get(c.client)
        assert want is not None, f"{c.id} {c.client} -> {c.server} is not in the ledger"
        assert c.path is not None, c.id
        assert (c.path["name"], c.path["hop"], c.path["inferred"]) == (*want, False), c.id
        seen += 1
    assert seen >= len(expected)


def test_inferred_paths_without_profile_follow_the_topology(lab: Any) -> None:
    led, conns, _dns = lab
    _analysis(lab, False)
    expected = _expected_hops(led)
    role = {"edge": "edge", "router": "proxy", "token-store": "store", "origin": "origin"}
    for c in conns:
        if c.server.endswith(":53"):
            continue
        want = ("ROC", "token-store") if c.server == REDIS else expected[c.client]
        assert c.path is not None and c.path["inferred"], c.id
        if want[0] == "ROC":
            assert c.path["name"] == "via 127.0.0.10:443", c.id
            if c.requests or want[1] != "token-store":
                assert c.path["hop"] == role[want[1]], (c.id, c.path)
        else:
            assert c.path["name"] == f"direct {c.server}", c.id
            assert c.path["hop"] == "origin"


def test_every_roc_request_has_its_chain(lab: Any) -> None:
    led, _conns, _dns = lab
    a = _analysis(lab, True)
    roc = a.budgets["ROC"]
    forwarded = [r for r in led["request_log"] if r["path"] == "ROC"
                 and str(r.get("status")) == "200"]
    assert roc.requests == len([r for r in led["request_log"] if r["path"] == "ROC"])
    assert len(roc.hops["origin"].own) == len(forwarded)
    assert len(roc.hops["router"].own) == roc.requests


def test_budget_recovers_the_injected_delays(lab: Any) -> None:
    """The lab injects ``router_delay_ms`` as the router's own time on the wire (its
    answer minus the EVALSHA round trip and the upstream exchange, SYN included) and
    ``*_think_ms`` as the origins' time to first byte."""
    led, _conns, _dns = lab
    p = led["params"]
    a = _analysis(lab, True)
    roc, dpf = a.budgets["ROC"], a.budgets["DPF"]
    router = roc.hops["router"]
    assert median(router.own) == pytest.approx(p["router_delay_ms"], abs=TOLERANCE_MS)
    # most of it is spent between the token-store call and the origin call
    between = median(router.own_split["between_calls"])
    assert between <= median(router.own)
    assert between == pytest.approx(p["router_delay_ms"], abs=2 * TOLERANCE_MS)
    assert median(roc.think) == pytest.approx(p["roc_think_ms"], abs=TOLERANCE_MS)
    assert median(dpf.think) == pytest.approx(p["dpf_think_ms"], abs=TOLERANCE_MS)
    diffs = {d.phase: d for d in a.differences if (d.a, d.b) == ("ROC", "DPF")}
    if p["router_delay_ms"] >= 5:
        d = diffs["hop:router"]
        assert d.supported and d.ci_low_ms is not None and d.ci_high_ms is not None
        assert d.ci_low_ms - TOLERANCE_MS <= p["router_delay_ms"] <= d.ci_high_ms + TOLERANCE_MS
