"""build_findings is a table of rules: each rule yields its own code, once."""

from __future__ import annotations

import pytest

from netdiag.analysis.findings import RULES, Thresholds, build_findings
from netdiag.analysis.summary import SummaryBuilder
from netdiag.records import Connection, Request


def test_empty_summary_has_no_finding_and_damage_is_one() -> None:
    s = SummaryBuilder()
    assert build_findings(s, Thresholds()) == []
    assert [f.code for f in build_findings(s, Thresholds(), truncated=True)] == [
        "capture-truncated"]


def _conn(i: int, rtt_ms: float, ttfb_ms: float, resets: int = 0) -> Connection:
    t = 1_000_000_000 * (i + 1)
    c = Connection(id=f"C{i}", ts_ns=t, client=f"10.0.0.1:{40000 + i}",
                   server="10.0.0.2:80", last_ns=t + 10**9, protocol="http/1.1",
                   syn_ns=t, handshake_ack_ns=t + int(rtt_ms * 1e6), resets=resets,
                   packets=10, handshake_seen=True)
    c.requests = [Request(ts_ns=t + 2_000_000, method="GET", path="/", estimated=False,
                          first_byte_ns=t + 2_000_000 + int(ttfb_ms * 1e6),
                          last_byte_ns=t + 3_000_000 + int(ttfb_ms * 1e6), status=200)]
    return c


@pytest.mark.parametrize(("kw", "code"), [
    ({"rtt_ms": 250.0, "ttfb_ms": 5.0}, "slow-tcp-handshake"),
    ({"rtt_ms": 1.0, "ttfb_ms": 2500.0}, "slow-ttfb"),
    ({"rtt_ms": 1.0, "ttfb_ms": 5.0, "resets": 1}, "connection-resets"),
])
def test_each_rule_says_its_own_code_once(kw: dict, code: str) -> None:  # type: ignore[type-arg]
    s = SummaryBuilder()
    for i in range(6):
        s.add_connection(_conn(i, **kw))
    codes = [f.code for f in build_findings(s, Thresholds())]
    assert codes.count(code) == 1
    assert "low-connection-reuse" in codes  # six requests on six connections
    assert len(codes) == len(set(codes)) <= len(RULES)
