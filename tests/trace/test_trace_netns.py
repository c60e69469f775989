"""``netdiag trace`` for real: run inside a client namespace against a chain of routers.

Every probe stays inside the namespaces the fixtures build (see conftest.py): the
ICMP time-exceeded and unreachable messages come from real Linux routers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from netns_chain import (
    NAME,
    R1_C,
    R1_C6,
    R2_R1,
    R2_R16,
    S6,
    UNROUTED,
    C,
    Chain,
    S,
)

pytestmark = pytest.mark.slow

FAST = ("--count", "3", "--interval", "0.05", "--timeout", "1")


def hop_addresses(doc: dict[str, Any]) -> list[str | None]:
    return [h["address"] for h in doc["hops"]]


def check_clean(doc: dict[str, Any], n_hops: int = 3, count: int = 3) -> None:
    """Every hop answered every probe with sane RTTs, the destination at the last."""
    assert doc["_exit"] == 0
    assert doc["reached"] is True and doc["destination_hop"] == n_hops
    for h in doc["hops"]:
        assert (h["sent"], h["received"], h["loss_pct"]) == (count, count, 0.0)
        assert h["rtt_ms"]["count"] == count
        assert 0 < h["rtt_ms"]["min"] <= h["rtt_ms"]["p50"] <= h["rtt_ms"]["max"] < 500
        assert len(h["addresses"]) == 1
    assert [h["destination"] for h in doc["hops"]] == [False] * (n_hops - 1) + [True]


def test_tcp_syn_trace_through_two_routers(chain: Chain) -> None:
    doc = chain.trace_json(S, "--port", "443", *FAST)
    assert hop_addresses(doc) == [R1_C, R2_R1, S]
    check_clean(doc)
    assert [h["replies"] for h in doc["hops"]] == [
        {"time-exceeded": 3}, {"time-exceeded": 3}, {"syn-ack": 3}]
    assert doc["target"] == {"host": S, "address": S, "proto": "tcp", "port": 443}
    probes = [p for p in doc["probes"] if p["ttl"] <= 3]
    assert len(probes) == 9 and all(p["rtt_ms"] is not None for p in probes)
    assert all(h["path"] is None for h in doc["hops"])


def test_tcp_closed_port_answers_rst(chain: Chain) -> None:
    doc = chain.trace_json(S, "--port", "444", *FAST)
    assert hop_addresses(doc) == [R1_C, R2_R1, S]
    check_clean(doc)
    assert doc["hops"][2]["replies"] == {"rst": 3}


def test_udp_trace(chain: Chain) -> None:
    doc = chain.trace_json(S, "--proto", "udp", *FAST)
    assert hop_addresses(doc) == [R1_C, R2_R1, S]
    check_clean(doc)
    assert doc["target"]["port"] == 33434
    assert doc["hops"][2]["replies"] == {"port-unreachable": 3}


def test_icmp_trace(chain: Chain) -> None:
    doc = chain.trace_json(S, "--proto", "icmp", *FAST)
    assert hop_addresses(doc) == [R1_C, R2_R1, S]
    check_clean(doc)
    assert doc["target"]["port"] is None
    assert doc["hops"][2]["replies"] == {"echo-reply": 3}


@pytest.mark.parametrize("proto", ["tcp", "udp", "icmp"])
def test_ipv6_trace(chain: Chain, proto: str) -> None:
    doc = chain.trace_json(S6, "--proto", proto, *FAST)
    assert hop_addresses(doc) == [R1_C6, R2_R16, S6]
    check_clean(doc)


def test_text_report(chain: Chain) -> None:
    code, out, err = chain.trace(S, "--count", "2", "--interval", "0")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"trace to {S}, tcp port 443, 2 probes per hop, max 30 hops"
    assert lines[1].split()[:5] == ["HOP", "ADDRESS", "LOSS%", "SENT", "RECV"]
    rows = [line.split() for line in lines[2:5]]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        ("1", R1_C, "0.0", "2", "2"), ("2", R2_R1, "0.0", "2", "2"), ("3", S, "0.0", "2", "2")]
    assert rows[2][-1] == "syn-ack"
    assert lines[5].startswith("destination reached at hop 3")


def test_profile_attributes_each_hop(chain: Chain, tmp_path: Path) -> None:
    profile = tmp_path / "paths.toml"
    profile.write_text(f"""
version = 1

[[path]]
name = "LAB"
hops = ["edge", "router", "origin"]

[[path.rule]]
hop = "edge"
server = ["{R1_C}/32"]

[[path.rule]]
hop = "router"
server = ["10.77.2.0/24"]
ttl_hops = [1]

[[path.rule]]
hop = "origin"
server = ["{S}/32"]
port = [443]
""")
    doc = chain.trace_json(S, "--port", "443", *FAST, "--profile", str(profile))
    check_clean(doc)
    assert [h["path"] for h in doc["hops"]] == [
        {"name": "LAB", "hop": "edge"}, {"name": "LAB", "hop": "router"},
        {"name": "LAB", "hop": "origin"}]
    assert doc["profile"] == str(profile)
    code, out, _ = chain.trace(S, "--count", "1", "--profile", str(profile))
    assert code == 0 and "PATH/HOP" in out and "LAB/origin" in out
    # The origin rule names port 443: probing another port leaves the destination unnamed.
    doc = chain.trace_json(S, "--port", "444", *FAST, "--profile", str(profile))
    assert [h["path"] and h["path"]["hop"] for h in doc["hops"]] == ["edge", "router", None]


def test_name_resolved_with_dns_server(chain: Chain) -> None:
    doc = chain.trace_json(NAME, "--dns-server", S, *FAST)
    assert doc["target"]["host"] == NAME and doc["target"]["address"] == S
    check_clean(doc)
    code, _, err = chain.trace("nope.nd.test", "--dns-server", S, "--count", "1")
    assert code == 1 and err.strip() == (f"netdiag: error: cannot resolve nope.nd.test: "
                                         f"NXDOMAIN from {S}")


def test_unreachable_network_ends_the_trace(chain: Chain) -> None:
    # r1 has no route to UNROUTED. Linux rate-limits these errors per destination (a
    # burst of 5, then 1/s: a host-wide setting we leave alone), and the time-exceeded
    # messages of earlier tests used up that budget (they share its state), so wait
    # for it to refill, run once, and do not ask every probe to be answered.
    time.sleep(2.5)
    doc = chain.trace_json(UNROUTED, "--count", "2", "--interval", "0", "--timeout", "0.5")
    assert doc["_exit"] == 1 and doc["reached"] is False and doc["destination_hop"] is None
    assert hop_addresses(doc) == [R1_C]
    hop = doc["hops"][0]
    assert hop["sent"] == 2 and hop["received"] >= 1
    assert hop["replies"] == {"unreachable:net": hop["received"]}


def test_unanswered_probes_count_as_loss(chain: Chain) -> None:
    # r2 cannot route what it sends itself back to the client (a policy rule for
    # locally generated packets), so its time-exceeded messages are never sent; the
    # traffic it forwards is unaffected.
    rule = ("rule", "add", "iif", "lo", "to", f"{C}/32", "lookup", "100", "pref", "100")
    chain.exec("r2", "ip", *rule)
    chain.exec("r2", "ip", "route", "add", "blackhole", f"{C}/32", "table", "100")
    try:
        doc = chain.trace_json(S, "--count", "2", "--interval", "0", "--timeout", "0.5")
    finally:
        chain.exec("r2", "ip", "rule", "del", "pref", "100")
        chain.exec("r2", "ip", "route", "flush", "table", "100")
    assert doc["reached"] is True and hop_addresses(doc) == [R1_C, None, S]
    lost = doc["hops"][1]
    assert (lost["sent"], lost["received"], lost["loss_pct"]) == (2, 0, 100.0)
    assert lost["rtt_ms"]["count"] == 0 and lost["rtt_ms"]["p50"] is None
    assert lost["replies"] == {} and lost["addresses"] == []


@pytest.mark.parametrize("proto", ["tcp", "udp", "icmp"])
def test_injected_delay_shows_from_the_delayed_hop_on(make_chain: Any, proto: str) -> None:
    delay = 40.0
    chain = make_chain(delay_ms=delay)
    doc = chain.trace_json(S, "--proto", proto, "--count", "5", "--interval", "0.05",
                           "--timeout", "2")
    check_clean(doc, count=5)
    assert hop_addresses(doc) == [R1_C, R2_R1, S]
    first, second, third = (h["rtt_ms"] for h in doc["hops"])
    assert first["p50"] < 5, (chain.delay_method, first)
    for rtt in (second, third):
        assert delay <= rtt["min"], (chain.delay_method, rtt)
        assert rtt["p50"] < delay + 15, (chain.delay_method, rtt)
