"""``run_dns_probe`` against the lab's DNS servers: delayed, immediate, blackhole."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from netdiag.errors import InputError
from netdiag.probe.dns import run_dns_probe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="uses 127.0.0.x addresses other than 127.0.0.1"),
]


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_three_servers_compared(lab: Any, tcp: bool) -> None:
    result = run_dns_probe(lab.H2_NAME, servers=[lab.dns_slow, lab.dns_fast, lab.blackhole],
                           count=5, tcp=tcp, timeout=0.3)
    slow, fast, hole = result.servers
    assert [s.server for s in result.servers] == [lab.dns_slow, lab.dns_fast, lab.blackhole]
    assert result.transport == ("tcp" if tcp else "udp")
    for s in (slow, fast):
        assert (len(s.queries), s.answered, s.timeouts, s.errors) == (5, 5, 0, 0)
        assert s.rcodes == {"NOERROR": 5}
        assert s.answers == {lab.H2_IP: 5}
        assert all(q.transport == result.transport for q in s.queries)
        assert all((q.connect_ns is not None) == tcp for q in s.queries)
    ls, lf = slow.latency_ms(), fast.latency_ms()
    assert ls["count"] == lf["count"] == 5
    assert ls["min"] >= lab.DNS_DELAY_MS  # the delay is a floor: always
    assert lf["p50"] < lab.DNS_DELAY_MS
    for k in ("min", "p50"):  # robust to one scheduling hiccup on a busy host
        assert ls[k] > lf[k]
    if tcp:  # a blackhole for UDP is a closed port for TCP: refused, not a timeout
        assert (hole.answered, hole.errors) == (0, 5)
        assert {q.error for q in hole.queries} == {"connection refused"}
    else:
        assert (hole.answered, hole.timeouts, hole.errors) == (0, 5, 0)
        assert hole.latency_ms()["count"] == 0 and not hole.rcodes
    # round-robin: every server's n-th query before anyone's n+1-th
    assert [q.seq for q in result.queries] == [i for i in range(1, 6) for _ in range(3)]


def test_nxdomain_and_empty_answers_counted(lab: Any) -> None:
    nx = run_dns_probe(lab.NX_NAME, servers=[lab.dns_fast, lab.dns_slow], count=3)
    for s in nx.servers:
        assert s.rcodes == {"NXDOMAIN": 3} and s.answered == 3 and not s.answers
    aaaa = run_dns_probe(lab.H2_NAME, servers=[lab.dns_fast], rdtype="aaaa", count=2, tcp=True)
    assert aaaa.rdtype == "AAAA"
    assert aaaa.servers[0].rcodes == {"NOERROR": 2} and not aaaa.servers[0].answers


def test_refused_udp_port_is_an_error_not_a_timeout(lab: Any) -> None:
    result = run_dns_probe(lab.H2_NAME, servers=[lab.refused], count=2, timeout=1.0)
    s = result.servers[0]
    assert s.answered == 0 and s.errors + s.timeouts == 2
    # a connected UDP socket hears the ICMP port unreachable
    assert {q.error for q in s.queries} <= {"connection refused", "timeout"}


def test_json(lab: Any) -> None:
    result = run_dns_probe(lab.H2_NAME, servers=[lab.dns_fast, lab.blackhole], count=2,
                           timeout=0.2)
    doc = json.loads(json.dumps(result.to_json()))
    assert (doc["name"], doc["type"], doc["transport"], doc["count"]) == (lab.H2_NAME, "A",
                                                                          "udp", 2)
    fast, hole = doc["servers"]
    assert fast["rcodes"] == {"NOERROR": 2} and fast["latency_ms"]["count"] == 2
    assert hole["timeouts"] == 2 and hole["latency_ms"]["p50"] is None
    assert len(doc["queries"]) == 4
    q = doc["queries"][0]
    assert set(q) >= {"server", "seq", "id", "ts", "ts_ns", "client", "latency_ms", "rcode",
                      "answers", "error"}
    assert q["client"].startswith("127.0.0.1:") or q["client"].startswith("127.")


def test_bad_input() -> None:
    for kwargs in ({"servers": ["dns.example"]}, {"servers": ["1.2.3.4:0"]}, {"servers": []},
                   {"servers": ["127.0.0.1"], "rdtype": "BOGUS"},
                   {"servers": ["127.0.0.1"], "count": 0},
                   {"servers": ["127.0.0.1"], "timeout": 0}):
        with pytest.raises(InputError):
            run_dns_probe("example.test", **kwargs)
    with pytest.raises(InputError):
        run_dns_probe("a..b", servers=["127.0.0.1"])
