"""The parts of ``netdiag trace`` that need no network: hop summaries, attribution,
the text report, name resolution (against a DNS server on loopback), the CLI's
privilege check."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.rrset
import pytest

from netdiag.errors import InputError
from netdiag.paths.profile import parse_profile
from netdiag.trace import Probe, TraceError, TraceResult, attribute, summarize, trace
from netdiag.trace.render import render_text
from netdiag.trace.resolve import parse_server, resolve

REPO = Path(__file__).resolve().parents[2]


def probe(ttl: int, rnd: int, address: str | None, rtt: float | None = None,
          reply: str | None = None) -> Probe:
    return Probe(ttl=ttl, round=rnd, sent=1000.0 + rnd, address=address, rtt_ms=rtt,
                 reply=reply if reply is not None or address is None else "time-exceeded")


def result(probes: list[Probe], port: int | None = 443) -> TraceResult:
    r = TraceResult(host="api.test", address="10.0.0.9", proto="tcp", port=port, count=3,
                    max_hops=30, timeout=1.0, probes=probes, duration_s=1.5)
    r.hops = summarize(probes)
    return r


PROBES = [
    probe(1, 0, "10.0.1.1", 1.0), probe(1, 1, "10.0.1.1", 2.0), probe(1, 2, "10.0.1.1", 3.0),
    probe(2, 0, "10.0.2.1", 5.0), probe(2, 1, None), probe(2, 2, "10.0.2.2", 7.0),
    probe(3, 0, None), probe(3, 1, None), probe(3, 2, None),
    probe(4, 0, "10.0.0.9", 9.0, "syn-ack"), probe(4, 1, "10.0.0.9", 11.0, "syn-ack"),
    probe(4, 2, "10.0.0.9", 10.0, "rst"),
    probe(5, 0, "10.0.0.9", 9.5, "syn-ack"), probe(6, 0, "10.0.0.9", 9.5, "syn-ack"),
]


def test_summarize_per_hop() -> None:
    hops = summarize(PROBES)
    assert [h.ttl for h in hops] == [1, 2, 3, 4]  # past the destination's TTL: not shown
    h1, h2, h3, h4 = hops
    assert (h1.address, h1.sent, h1.received, h1.loss_pct) == ("10.0.1.1", 3, 3, 0.0)
    assert h1.rtt_ms == {"count": 3, "min": 1.0, "p50": 2.0, "p90": 2.8, "p99": 2.98,
                         "max": 3.0, "mean": 2.0}
    assert h2.addresses == ["10.0.2.1", "10.0.2.2"] and h2.received == 2
    assert h2.loss_pct == pytest.approx(100 / 3)
    assert (h3.address, h3.received, h3.loss_pct, h3.rtt_ms["p50"]) == (None, 0, 100.0, None)
    assert h4.destination and not h1.destination and h4.replies == {"rst": 1, "syn-ack": 2}
    r = result(PROBES)
    assert r.reached and r.destination_hop == 4


def test_summarize_destination_lost_in_a_later_round() -> None:
    probes = [probe(1, 0, "10.0.1.1", 1.0), probe(2, 0, "10.0.0.9", 2.0, "echo-reply"),
              probe(1, 1, "10.0.1.1", 1.0), probe(2, 1, None)]
    (_, h2) = summarize(probes)
    assert h2.destination and (h2.sent, h2.received) == (2, 1)


def test_summarize_without_the_destination() -> None:
    probes = [probe(1, 0, "10.0.1.1", 1.0), probe(2, 0, None), probe(3, 0, "10.0.3.1", 3.0),
              probe(4, 0, None), probe(5, 0, None)]
    hops = summarize(probes)
    assert [h.address for h in hops] == ["10.0.1.1", None, "10.0.3.1"]  # trailing * trimmed
    assert not any(h.destination for h in hops)
    assert summarize([probe(1, 0, None), probe(2, 0, None)]) == []
    stopped = summarize([probe(1, 0, "10.0.1.1", 1.0),
                         probe(2, 0, "10.0.2.1", 2.0, "unreachable:host"),
                         probe(3, 0, "10.0.2.1", 2.0, "unreachable:host")])
    assert [h.ttl for h in stopped] == [1, 2]


PROFILE = """
version = 1

[[path]]
name = "ROC"
hops = ["edge", "router", "origin"]

[[path.rule]]
hop = "edge"
server = ["10.0.1.0/24"]

[[path.rule]]
hop = "router"
server = ["10.0.2.1/32"]
ttl_hops = [1]

[[path.rule]]
hop = "origin"
server = ["10.0.0.9/32"]
port = [443]
"""


def test_attribution_with_a_profile() -> None:
    r = result(PROBES)
    attribute(r, parse_profile(PROFILE).match_address)
    assert [h.path for h in r.hops] == [
        {"name": "ROC", "hop": "edge"}, {"name": "ROC", "hop": "router"}, None,
        {"name": "ROC", "hop": "origin"}]
    other = result(PROBES, port=8443)
    attribute(other, parse_profile(PROFILE).match_address)
    assert other.hops[3].path is None  # the origin rule wants port 443


def test_attribution_asks_with_port_only_for_the_destination() -> None:
    calls: list[tuple[Any, ...]] = []

    def match(ip: str, port: int | None = None, hops: int | None = None) -> None:
        calls.append((ip, port, hops))

    attribute(result(PROBES), match)
    assert calls == [("10.0.1.1", None, 0), ("10.0.2.1", None, 1), ("10.0.0.9", 443, 3)]


def test_text_report() -> None:
    r = result(PROBES)
    attribute(r, parse_profile(PROFILE).match_address)
    lines = render_text(r).splitlines()
    assert lines[0] == ("trace to api.test (10.0.0.9), tcp port 443, 3 probes per hop, "
                        "max 30 hops")
    assert lines[1].split() == ["HOP", "ADDRESS", "LOSS%", "SENT", "RECV", "MIN", "P50", "P90",
                                "MAX", "REPLY", "PATH/HOP"]
    assert lines[2].split() == ["1", "10.0.1.1", "0.0", "3", "3", "1.00", "2.00", "2.80",
                                "3.00", "time-exceeded", "ROC/edge"]
    assert lines[4].split() == ["also:", "10.0.2.2"]
    assert lines[5].split() == ["3", "???", "100.0", "3", "0", "-", "-", "-", "-", "-", "-"]
    assert lines[6].split()[-2:] == ["rstx1,syn-ackx2", "ROC/origin"]
    assert lines[7] == "destination reached at hop 4 (1.5 s)"
    lost = result([probe(1, 0, "10.0.1.1", 1.0), probe(2, 0, None)])
    assert render_text(lost).splitlines()[-1] == (
        "destination not reached: no answer from it within 30 hops (1.5 s)")


def test_json_document() -> None:
    doc = result(PROBES).to_json()
    assert doc["target"] == {"host": "api.test", "address": "10.0.0.9", "proto": "tcp",
                             "port": 443}
    assert doc["reached"] is True and doc["destination_hop"] == 4
    assert [h["ttl"] for h in doc["hops"]] == [1, 2, 3, 4]
    assert doc["hops"][1]["loss_pct"] == 33.333
    assert len(doc["probes"]) == len(PROBES)
    assert set(doc["hops"][0]) == {"ttl", "address", "addresses", "sent", "received",
                                   "loss_pct", "rtt_ms", "destination", "replies", "path"}


def test_trace_rejects_bad_arguments() -> None:
    with pytest.raises(TraceError, match="unknown protocol"):
        trace("10.0.0.1", proto="sctp")
    with pytest.raises(TraceError, match="not an IP address"):
        trace("example.test")


# -- resolution ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("192.0.2.1", ("192.0.2.1", 53)), ("192.0.2.1:5353", ("192.0.2.1", 5353)),
    ("[2001:db8::1]:54", ("2001:db8::1", 54)), ("2001:db8::1", ("2001:db8::1", 53)),
])
def test_parse_server(text: str, expected: tuple[str, int]) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize("text", ["dns.example", "192.0.2.1:x", "[::1]x", "1.2.3.4:70000"])
def test_parse_server_rejects(text: str) -> None:
    with pytest.raises(InputError):
        parse_server(text)


def test_resolve_literals_and_hosts_file() -> None:
    assert resolve("192.0.2.7") == "192.0.2.7"
    assert resolve("[2001:db8::7]") == "2001:db8::7"
    assert resolve("localhost", family=4) == "127.0.0.1"
    with pytest.raises(InputError, match="not an IPv6 address"):
        resolve("192.0.2.7", family=6)
    with pytest.raises(InputError, match="cannot resolve"):
        resolve("no-such-host.invalid")


@pytest.fixture
def dns_server() -> Iterator[str]:
    """A DNS server on loopback: api.test -> 192.0.2.10 / 2001:db8::10, v4only.test ->
    192.0.2.11, anything else NXDOMAIN; silent.test is never answered."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()
    records = {("api.test.", 1): ("A", "192.0.2.10"), ("api.test.", 28): ("AAAA", "2001:db8::10"),
               ("v4only.test.", 1): ("A", "192.0.2.11")}

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            q = dns.message.from_wire(data)
            qn = q.question[0]
            name = qn.name.to_text()
            if name == "silent.test.":
                continue
            r = dns.message.make_response(q)
            rec = records.get((name, qn.rdtype))
            if rec is not None:
                r.answer.append(dns.rrset.from_text(qn.name, 60, "IN", *rec))
            elif not any(k[0] == name for k in records):
                r.set_rcode(3)
            sock.sendto(r.to_wire(), peer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        sock.close()


def test_resolve_with_a_dns_server(dns_server: str) -> None:
    assert resolve("api.test", dns_server=dns_server) == "192.0.2.10"
    assert resolve("api.test", dns_server=dns_server, family=6) == "2001:db8::10"
    assert resolve("v4only.test", dns_server=dns_server) == "192.0.2.11"
    with pytest.raises(InputError, match="no AAAA record"):
        resolve("v4only.test", dns_server=dns_server, family=6)
    with pytest.raises(InputError, match="NXDOMAIN"):
        resolve("other.test", dns_server=dns_server)
    with pytest.raises(InputError, match="did not answer"):
        resolve("silent.test", dns_server=dns_server, timeout=0.3)


# -- the command --------------------------------------------------------------------


def _netdiag(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*(prefix or []), sys.executable, "-m", "netdiag", *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)


def test_without_raw_socket_privilege_one_line_and_exit_1() -> None:
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv is needed to drop CAP_NET_RAW as root")
        prefix = [setpriv, "--inh-caps=-net_raw", "--bounding-set=-net_raw"]
    r = _netdiag("trace", "127.0.0.1", "--count", "1", prefix=prefix)
    assert r.returncode == 1, r.stderr
    assert r.stderr == "netdiag: error: traceroute needs root or CAP_NET_RAW\n"
    assert r.stdout == ""


def test_help_and_registration() -> None:
    r = _netdiag("--help")
    assert r.returncode == 0 and "trace" in r.stdout
    r = _netdiag("trace", "--help")
    assert r.returncode == 0
    for opt in ("--port", "--count", "--max-hops", "--timeout", "--profile", "--format",
                "--dns-server", "--proto"):
        assert opt in r.stdout


def test_bad_profile_fails_before_probing(tmp_path: Path) -> None:
    bad = tmp_path / "paths.toml"
    bad.write_text("version = 1\n[[path]]\nname = 1\n")
    r = _netdiag("trace", "192.0.2.1", "--profile", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith(f"netdiag: error: {bad}:3:") and r.stderr.count("\n") == 1
