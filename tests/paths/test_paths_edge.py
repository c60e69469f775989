"""Client-side attribution (netdiag.paths.edge): Server-Timing and Envoy splits, edge
identity from headers, published ranges, TTL and handshakes, the profile's [[edge]],
the document and the finding; and one live capture of a real server on loopback."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import math
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from paths_synth import MS, conn, req

from netdiag.errors import InputError
from netdiag.paths.apply import apply_paths
from netdiag.paths.edge import (
    MAX_METRICS,
    RAW_MAX,
    Metric,
    edge_findings,
    header_signals,
    identify_edge,
    parse_duration,
    parse_server_timing,
    range_match,
    request_split,
    shipped_ranges,
    tls_termination,
    ttl_evidence,
)
from netdiag.paths.profile import parse_profile
from netdiag.records import Connection, Request

ROOT = Path(__file__).resolve().parents[2]

CF_L4 = ('cfL4;desc="?proto=TCP&rtt=12345&min_rtt=4257&rtt_var=2477&sent=6&recv=6&lost=0'
         '&retrans=0&sent_bytes=4509&recv_bytes=531&delivery_rate=571652&cwnd=54'
         '&unsent_bytes=0&cid=&ts=52&x=0"')


def names(metrics: list[Metric]) -> list[tuple[str, float | None, str | None]]:
    return [(m.name, m.dur, m.desc) for m in metrics]


# --------------------------------------------------------------------------- parser


def test_w3c_examples() -> None:
    # the examples of the W3C Server Timing specification
    assert names(parse_server_timing("miss, db;dur=53, app;dur=47.2")) == [
        ("miss", None, None), ("db", 53.0, None), ("app", 47.2, None)]
    assert names(parse_server_timing("customView, dc;desc=atl")) == [
        ("customView", None, None), ("dc", None, "atl")]
    assert names(parse_server_timing('cache;desc="Cache Read";dur=23.2')) == [
        ("cache", 23.2, "Cache Read")]
    assert names(parse_server_timing("total;dur=123.4")) == [("total", 123.4, None)]
    # OWS around separators, parameter names in any case, first occurrence wins
    assert names(parse_server_timing(" a ; DUR = 1.5 ; Desc = x ; dur=9 ,b")) == [
        ("a", 1.5, "x"), ("b", None, None)]


def test_multiple_field_lines_are_one_list() -> None:
    got = parse_server_timing(["cfEdge;dur=7", "cfOrigin;dur=70, cfCacheStatus;desc=MISS"])
    assert names(got) == [("cfEdge", 7.0, None), ("cfOrigin", 70.0, None),
                          ("cfCacheStatus", None, "MISS")]


def test_cloudflare_shapes() -> None:
    got = parse_server_timing(f"cfRequestDuration;dur=80.3, {CF_L4}")
    assert got[0] == Metric("cfRequestDuration", 80.3, None)
    assert got[1].name == "cfL4" and got[1].dur is None
    assert got[1].desc is not None and got[1].desc.startswith("?proto=TCP&rtt=12345&")
    # cfExtPri and friends: names without parameters
    assert [m.name for m in parse_server_timing("cfExtPri, cfEdge;dur=12")] == [
        "cfExtPri", "cfEdge"]


def test_quoted_strings() -> None:
    got = parse_server_timing(r'a;desc="x, \"y\"; z";dur=1, b;dur="2.5"')
    assert names(got) == [("a", 1.0, 'x, "y"; z'), ("b", 2.5, None)]
    # an unterminated quoted string runs to the end (W3C processing model)
    assert names(parse_server_timing('a;desc="open, b;dur=1')) == [("a", None, "open, b;dur=1")]


@pytest.mark.parametrize("bad", ["-1", "nan", "NaN", "inf", "-inf", "1e400", "1_0", "0x10",
                                 " ", "", "+5", "1.2.3", "86400001", "9" * 40, "١٢"])
def test_bad_durations_are_rejected(bad: str) -> None:
    assert parse_duration(bad) is None
    got = parse_server_timing(f'm;dur="{bad}", n;dur=4')
    assert got[-1] == Metric("n", 4.0, None)
    assert all(m.dur is None for m in got[:-1])


def test_good_durations() -> None:
    assert parse_duration("0") == 0.0
    assert parse_duration("12.") == 12.0
    assert parse_duration(".5") == 0.5
    assert parse_duration("1e3") == 1000.0
    assert parse_duration("86400000") == 86_400_000.0


def test_malformed_elements_are_dropped_and_parsing_goes_on() -> None:
    got = parse_server_timing('bad metric;dur=3, "q";dur=2, ;dur=1, ok;dur=4, x;=5, '
                              'y;dur=6 junk, z;dur=7,,, ')
    assert names(got) == [("ok", 4.0, None), ("z", 7.0, None)]
    assert parse_server_timing("") == [] and parse_server_timing(",,, ,") == []
    assert parse_server_timing([]) == []


def test_limits() -> None:
    many = ", ".join(f"m{i};dur={i}" for i in range(500))
    assert len(parse_server_timing(many)) == MAX_METRICS
    long = parse_server_timing("x" * 1000 + ";desc=" + '"' + "d" * 5000 + '"')
    assert len(long[0].name) == 64 and long[0].desc is not None and len(long[0].desc) == 256


def test_linear_on_hostile_input() -> None:
    for s in ('a;desc="' + '\\"' * 200_000, ";" * 10**6, "a" + ";b" * 10**6,
              '"' * 10**6, ("a=" * 10**6), "\x00" * 10**6):
        t = time.perf_counter()
        parse_server_timing(s)
        assert time.perf_counter() - t < 0.5


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    _alphabet = st.sampled_from([*'ab;=,"\\ \t.0123456789-edurscD', "\x00", "é"])

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet=_alphabet, max_size=200) | st.text(max_size=200))
    def test_fuzz_parser_never_raises(s: str) -> None:
        for m in parse_server_timing(s):
            assert m.name and len(m.name) <= 64
            assert m.dur is None or (math.isfinite(m.dur) and 0 <= m.dur <= 86_400_000)
        split = request_split(Request(ts_ns=0, first_byte_ns=50 * MS, response_headers=[
            ("server-timing", s), ("x-envoy-upstream-service-time", s[:12])]))
        if split is not None:
            json.dumps(split)
            assert split["upstream_ms"] >= 0 and len(split["raw"]) <= RAW_MAX + 3


# --------------------------------------------------------------------------- splits


def _r(ttfb: float | None, *headers: tuple[str, str], t0: float = 0.0) -> Request:
    return req(t0, None if ttfb is None else t0 + ttfb, None if ttfb is None else t0 + ttfb,
               headers=list(headers))


def test_split_with_an_upstream_duration() -> None:
    s = request_split(_r(88.0, ("server-timing", "cfEdge;dur=3, cfOrigin;dur=70")))
    assert s is not None
    assert (s["source"], s["metric"], s["upstream_ms"], s["edge_ms"]) == (
        "server-timing", "cfOrigin", 70.0, 18.0)
    assert s["includes_edge"] is False and s["edge_own_ms"] == 3.0
    assert s["raw"] == "cfEdge;dur=3, cfOrigin;dur=70" and s["ttfb_ms"] == 88.0


def test_split_with_cf_request_duration_counts_the_edge_upstream() -> None:
    s = request_split(_r(88.3, ("Server-Timing", f"cfRequestDuration;dur=80.3, {CF_L4}")))
    assert s is not None
    assert s["metric"] == "cfRequestDuration" and s["upstream_ms"] == 80.3
    assert s["edge_ms"] == 8.0 and s["includes_edge"] is True
    assert s["edge_rtt_ms"] == 12.345


def test_split_total_minus_edge() -> None:
    s = request_split(_r(100.0, ("server-timing", "total;dur=90, edge;dur=10")))
    assert s is not None and s["upstream_ms"] == 80.0 and s["edge_ms"] == 20.0
    assert s["metric"] == "total - edge" and s["includes_edge"] is False


def test_envoy_header() -> None:
    s = request_split(_r(50.0, ("x-envoy-upstream-service-time", "42")))
    assert s is not None
    assert (s["source"], s["metric"], s["upstream_ms"], s["edge_ms"], s["raw"]) == (
        "x-envoy-upstream-service-time", None, 42.0, 8.0, "42")
    # Envoy's own measurement beats an application's generic metric ...
    s = request_split(_r(50.0, ("server-timing", "app;dur=30"),
                         ("x-envoy-upstream-service-time", "42")))
    assert s is not None and s["source"] == "x-envoy-upstream-service-time"
    # ... but not the CDN's origin time
    s = request_split(_r(50.0, ("server-timing", "cdn-upstream-fbl;dur=40"),
                         ("x-envoy-upstream-service-time", "42")))
    assert s is not None and s["metric"] == "cdn-upstream-fbl" and s["upstream_ms"] == 40.0
    for bad in ("-3", "4.5", "", "abc", "99999999999", "１２"):
        assert request_split(_r(50.0, ("x-envoy-upstream-service-time", bad))) is None


def test_header_names_match_in_any_case() -> None:
    """As ``str.lower`` has it: any case matches; a name that only looks alike, or
    whose lower case is longer (U+0130) or not ASCII (a dotless i), does not."""
    s = request_split(_r(50.0, ("X-ENVOY-UPSTREAM-SERVICE-TIME", "42"),
                         ("SERVER-TIMING", "app;dur=30")))
    assert s is not None and s["source"] == "x-envoy-upstream-service-time"
    s = request_split(_r(50.0, ("Server-Timing", "cfOrigin;dur=20")))
    assert s is not None and s["upstream_ms"] == 20.0
    for name, value in (("x-envoy-upstream-service-t\u0131me", "5"),
                        ("X-ENVOY-UPSTREAM-SERVICE-T\u0130ME", "5"),
                        ("server-t\u0130ming", "a;dur=5"), ("server-timing ", "a;dur=5"),
                        ("server_timing", "a;dur=5")):
        assert request_split(_r(50.0, (name, value))) is None, name


def test_no_split_where_the_answer_does_not_tell() -> None:
    assert request_split(_r(50.0)) is None
    assert request_split(_r(50.0, ("server", "cloudflare"))) is None
    assert request_split(_r(50.0, ("server-timing", "cfEdge;dur=3, miss, db;dur=2"))) is None
    assert request_split(_r(50.0, ("server-timing", "origin;dur=-4"))) is None
    assert request_split(Request(ts_ns=0)) is None


def test_upstream_longer_than_the_wait() -> None:
    s = request_split(_r(50.0, ("x-envoy-upstream-service-time", "51")))
    assert s is not None and s["edge_ms"] == 0.0 and s["exceeds_ttfb"] is False
    s = request_split(_r(50.0, ("server-timing", "origin;dur=75")))
    assert s is not None and s["edge_ms"] is None and s["exceeds_ttfb"] is True
    s = request_split(_r(None, ("server-timing", "origin;dur=75")))
    assert s is not None and s["edge_ms"] is None and s["ttfb_ms"] is None


def test_raw_is_capped_and_cleaned() -> None:
    s = request_split(_r(50.0, ("server-timing", "origin;dur=5, x;desc=\x1b[31m" + "y" * 2000)))
    assert s is not None and len(s["raw"]) == RAW_MAX + 3 and "\x1b" not in s["raw"]


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize(("headers", "name"), [
    ([("server", "cloudflare"), ("cf-ray", "8a1b2c3d4e5f6a7b-AMS")], "cloudflare"),
    ([("cf-cache-status", "DYNAMIC")], "cloudflare"),
    ([("via", "1.1 0123abcd.cloudfront.net (CloudFront)"), ("x-amz-cf-pop", "FRA56-P1"),
      ("x-amz-cf-id", "abc==")], "cloudfront"),
    ([("x-cache", "Miss from cloudfront")], "cloudfront"),
    ([("x-served-by", "cache-fra-eddf8230112-FRA"), ("via", "1.1 varnish")], "fastly"),
    ([("x-served-by", "cache-ams21023-AMS, cache-lhr7321-LHR")], "fastly"),
    ([("x-fastly-request-id", "0f1e")], "fastly"),
    ([("server", "AkamaiGHost")], "akamai"),
    ([("x-akamai-transformed", "9 - 0 pmb=mRUM,1")], "akamai"),
    ([("server", "envoy")], "envoy"),
    ([("server", "istio-envoy"), ("x-envoy-upstream-service-time", "3")], "envoy"),
    ([("via", "1.1 varnish (Varnish/7.4)"), ("x-varnish", "32770")], "varnish"),
    ([("server", "nginx/1.25.3")], "nginx"),
    ([("server", "openresty")], "nginx"),
    ([("via", "2 roc-edge")], "proxy"),
    ([("server", "nginx"), ("via", "1.1 squid")], "proxy"),
    ([("server", "gws")], "google"),
])
def test_header_identity(headers: list[tuple[str, str]], name: str) -> None:
    c = conn("C1", "10.0.0.2:40000", "192.0.2.10:443", [_r(10.0, *headers)], sni="api.x.test")
    e = identify_edge(c)
    assert e is not None and e["name"] == name and e["inferred"] is True
    assert any(line.startswith("response header ") for line in e["evidence"])


def test_unknown_servers_are_not_edges() -> None:
    for headers in ([("server", "BaseHTTP/0.6 Python/3.11")], [("server", "gwsfoo")], []):
        c = conn("C1", "10.0.0.2:40000", "192.0.2.10:443", [_r(10.0, *headers)])
        assert identify_edge(c) is None
    dns_conn = conn("C2", "10.0.0.2:40001", "104.16.0.1:53", [], protocol="dns")
    assert identify_edge(dns_conn) is None


def test_server_header_names_the_client_facing_cdn() -> None:
    # Cloudflare in front of CloudFront: CloudFront's headers pass through
    c = conn("C1", "10.0.0.2:40000", "192.0.2.10:443", [_r(10.0, (
        "x-amz-cf-id", "abc=="), ("server", "cloudflare"), ("cf-ray", "1-AMS"))])
    e = identify_edge(c)
    assert e is not None and e["name"] == "cloudflare"
    assert any("(cloudfront)" in line for line in e["evidence"])
    # without a server header, the CDN whose ranges hold the address
    c = conn("C1", "10.0.0.2:40000", "13.32.1.1:443", [_r(10.0, (
        "x-amz-cf-id", "abc=="), ("cf-ray", "1-AMS"))])
    e = identify_edge(c)
    assert e is not None and e["name"] == "cloudfront"


def test_header_values_are_capped_and_never_crash() -> None:
    hostile: list[Any] = [("server", "cloudflare\x1b[2J" + "x" * 10_000), ("via", ""),
                          ("x-served-by", "," * 10_000), (None, "x"), ("a",), "junk"]
    sig = header_signals(hostile)
    assert sig[0][0] == "cloudflare" and len(sig[0][1]) < 200 and "\x1b" not in sig[0][1]
    assert header_signals(None) == [] and header_signals([]) == []


def test_server_names_are_remembered_within_a_bound() -> None:
    """A capture of endless distinct ``server`` values neither grows the memo past its
    bound nor changes a name: a value remembered or not is named the same."""
    from netdiag.paths import edge

    cap = edge._server_name.cache_info().maxsize
    assert cap is not None
    values = [f"cloudflare-{i}" if i % 3 else f"acme/{i}" for i in range(cap + 500)]
    for _ in range(2):  # the second pass reads the values remembered, then the others
        for v in values:
            expected = [("cloudflare", f"server: {v}")] if v.startswith("cloudflare") else []
            assert header_signals([("Server", v)]) == expected
        assert edge._server_name.cache_info().currsize <= cap


# --------------------------------------------------------------------------- ranges


def test_shipped_ranges_are_dated_and_sourced() -> None:
    data = json.loads((ROOT / "netdiag" / "data" / "edge_ranges.json").read_text())
    assert data["compiled"]
    for e in data["edges"]:
        assert e["source"].startswith("https://") and "as_of" in e and e["ranges"]
        assert e["notes"] and isinstance(e["complete"], bool)
    got = {r.name: r for r in shipped_ranges()}
    assert set(got) == {"cloudflare", "fastly", "cloudfront"}
    assert got["cloudflare"].complete and not got["cloudfront"].complete
    v = {n.version for r in got.values() for n in r.networks}
    assert v == {4, 6}
    # no two edges claim the same address
    nets = [(n, r.name) for r in got.values() for n in r.networks]
    for i, (a, na) in enumerate(nets):
        for b, nb in nets[i + 1:]:
            assert na == nb or a.version != b.version or not a.overlaps(b), (a, b)


@pytest.mark.parametrize(("ip", "name"), [
    ("104.16.132.229:443", "cloudflare"), ("172.67.1.1", "cloudflare"),
    ("[2606:4700:3030::6815:1001]:443", "cloudflare"), ("2a06:98c7::1", "cloudflare"),
    ("151.101.1.69:443", "fastly"), ("[2a04:4e42::81]:443", "fastly"),
    ("13.33.1.1:443", "cloudfront"), ("[2600:9000:2345::1]:443", "cloudfront"),
])
def test_range_lookup(ip: str, name: str) -> None:
    hit = range_match(ip)
    assert hit is not None and hit[0] == name


@pytest.mark.parametrize("ip", ["8.8.8.8:443", "1.1.1.1:443", "[2001:db8::1]:443",
                                "127.0.0.1:443", "not-an-ip:443", "", "[::ffff:1.2.3.4]:1"])
def test_range_misses(ip: str) -> None:
    assert range_match(ip) is None


def test_range_identity_without_headers() -> None:
    c = conn("C1", "10.0.0.2:40000", "104.16.132.229:443", [], server_ttl=57)
    e = identify_edge(c)
    assert e is not None and e["name"] == "cloudflare"
    assert e["evidence"][0] == ("server 104.16.132.229:443 is in 104.16.0.0/13 (cloudflare, "
                                "published ranges as of 2024-06-25)")
    assert e["hops"] == 7 and "server TTL 57: 7 hops away (initial TTL 64)" in e["evidence"]


def test_profile_edge_overrides_and_extends() -> None:
    prof = parse_profile('version = 1\n\n[[edge]]\nname = "corp-edge"\n'
                         'ranges = ["10.0.0.0/8", "fd00::/8"]\n\n[[edge]]\nname = "cloudflare"\n'
                         'ranges = "192.0.2.0/24"\n')
    assert [e.name for e in prof.edges] == ["corp-edge", "cloudflare"]
    assert prof.edges[0].line == 3 and prof.paths == []
    e = identify_edge(conn("C1", "10.9.0.2:40000", "10.1.2.3:443", []), prof)
    assert e is not None and e["name"] == "corp-edge"
    assert e["evidence"][0] == "server 10.1.2.3:443 is in 10.0.0.0/8 (corp-edge, profile [[edge]])"
    e = identify_edge(conn("C1", "10.9.0.2:40000", "[fd12::1]:443", []), prof)
    assert e is not None and e["name"] == "corp-edge"
    # extends a shipped edge with more ranges
    e = identify_edge(conn("C1", "10.9.0.2:40000", "192.0.2.7:443", []), prof)
    assert e is not None and e["name"] == "cloudflare"
    # a profile range wins over response headers and shipped ranges
    c = conn("C1", "10.9.0.2:40000", "10.1.2.3:443", [_r(5.0, ("server", "envoy"))])
    e = identify_edge(c, prof)
    assert e is not None and e["name"] == "corp-edge"
    assert "also response header server: envoy (envoy)" in e["evidence"]
    prof2 = parse_profile('version = 1\n[[edge]]\nname = "mine"\nranges = ["104.16.0.0/16"]\n')
    e = identify_edge(conn("C1", "10.9.0.2:40000", "104.16.132.229:443", []), prof2)
    assert e is not None and e["name"] == "mine"
    # no edge without a match
    assert identify_edge(conn("C1", "10.9.0.2:40000", "192.168.1.1:443", []), prof) is None


@pytest.mark.parametrize(("text", "line", "message"), [
    ('version = 1\n[[edge]]\nranges = ["10.0.0.0/8"]\n', 2, "needs a name"),
    ('version = 1\n[[edge]]\nname = "e"\n', 2, "has no ranges"),
    ('version = 1\n[[edge]]\nname = "e"\nranges = []\n', 4, "must not be empty"),
    ('version = 1\n[[edge]]\nname = "e"\nranges = ["10.0.0.300/8"]\n', 4, "bad CIDR"),
    ('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\n[[path.rule]]\nserver = "10.0.0.1"\n'
     '[[edge]]\nname = "e"\nrange = ["10.0.0.0/8"]\n', 9, "did you mean 'ranges'"),
    ('version = 1\nedge = "x"\n', 2, "must be an array of tables"),
])
def test_profile_edge_errors(text: str, line: int, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_profile(text, "p.toml")
    assert str(err.value).startswith(f"p.toml:{line}: ") and message in str(err.value)


# --------------------------------------------------------------------------- TTL, TLS


def test_ttl_distance() -> None:
    assert ttl_evidence(52)[0] == 12 and ttl_evidence(64)[0] == 0
    assert ttl_evidence(120) == (8, "server TTL 120: 8 hops away (initial TTL 128)")
    assert ttl_evidence(243)[0] == 12 and ttl_evidence(255)[0] == 0
    for bad in (None, 0, -1, 256, 10**9, True):
        assert ttl_evidence(bad) == (None, None)  # type: ignore[arg-type]


def _tls_conn(rtt: float, hs: float, version: str = "TLS 1.3", *, resumed: bool = False,
              hrr: bool = False, ttfb: float | None = None) -> Connection:
    c = conn("C1", "10.0.0.2:40000", "104.16.0.1:443",
             [] if ttfb is None else [_r(ttfb, t0=rtt + hs + 1)],
             syn=0.0, ack=rtt, tls=(rtt, rtt + hs), sni="api.x.test")
    assert c.tls is not None
    c.tls.version, c.tls.resumed, c.tls.hello_retry = version, resumed, hrr
    return c


def test_tls_terminates_where_tcp_does() -> None:
    ok, line = tls_termination(_tls_conn(20.0, 22.0))
    assert ok is True and line is not None and "TLS terminates where TCP does" in line
    assert "1 expected" in line
    assert tls_termination(_tls_conn(20.0, 43.0, "TLS 1.2"))[0] is True
    assert tls_termination(_tls_conn(20.0, 23.0, "TLS 1.2", resumed=True))[0] is True
    assert tls_termination(_tls_conn(20.0, 42.0, hrr=True))[0] is True
    # loopback: the RTT is nothing, the handshake is the server's crypto
    assert tls_termination(_tls_conn(0.03, 3.0))[0] is True


def test_tls_terminates_behind_the_tcp_peer() -> None:
    ok, line = tls_termination(_tls_conn(2.0, 60.0))
    assert ok is False and line is not None and "behind the hop that answers TCP" in line
    assert tls_termination(_tls_conn(10.0, 90.0, "TLS 1.2"))[0] is False
    ok, line = tls_termination(_tls_conn(20.0, 35.0))
    assert ok is None and line is not None and "inconclusive" in line


def test_tls_rule_needs_the_handshakes() -> None:
    c = _tls_conn(20.0, 22.0)
    c.syn_retransmissions = 1
    assert tls_termination(c) == (None, None)
    c = conn("C1", "10.0.0.2:40000", "104.16.0.1:443", [], sni="x")  # no SYN seen
    assert tls_termination(c) == (None, None)
    c = _tls_conn(20.0, 22.0, "")
    assert tls_termination(c) == (None, None)
    assert tls_termination(conn("C1", "10.0.0.2:1", "104.16.0.1:80", [], syn=0, ack=1)) == (
        None, None)


def test_time_behind_the_terminating_hop_is_evidence() -> None:
    e = identify_edge(_tls_conn(10.0, 11.0, ttfb=88.0))
    assert e is not None and e["tls_at_tcp_peer"] is True
    assert ("median time to first byte 88.0 ms is 8.8 round trips: about 78.0 ms is spent "
            "behind the hop that terminates TCP and TLS") in e["evidence"]


# --------------------------------------------------------------------------- end to end


def _cf_connections(n: int = 12) -> list[Connection]:
    out = []
    for i in range(n):
        t0 = 100.0 * i
        ttfb = 86.0 + (i % 5)
        up = 78.0 + (i % 5)
        out.append(conn(
            f"C{i + 1}", f"10.0.0.2:{40000 + i}", "104.16.132.229:443",
            [req(t0, t0 + ttfb, t0 + ttfb + 1, authority="api.x.test", headers=[
                (":status", "200"), ("server", "cloudflare"),
                ("cf-ray", f"8a1b2c3d4e5f{i:04x}-AMS"),
                ("server-timing", f"cfRequestDuration;dur={up}"),
                ("server-timing", CF_L4)])],
            syn=t0 - 30, ack=t0 - 20, tls=(t0 - 20, t0 - 9), sni="api.x.test", alpn="h2",
            server_ttl=55))
    return out


def test_apply_paths_writes_the_fields_and_the_finding() -> None:
    conns = _cf_connections()
    conns.append(conn("C99", "10.0.0.2:50000", "192.0.2.1:443",
                      [req(5000, 5010, 5011, authority="plain.test")], sni="plain.test"))
    doc: dict[str, Any] = {"contract": 1, "summary": {"http": {}, "paths": {}},
                           "connections": [c.to_json() for c in conns], "findings": []}
    analysis = apply_paths(doc, conns, [], None)
    json.dumps(doc)
    cj = {c["id"]: c for c in doc["connections"]}
    edge = cj["C1"]["edge"]
    assert edge["name"] == "cloudflare" and edge["inferred"] is True
    assert edge["evidence"][0].startswith("server 104.16.132.229:443 is in 104.16.0.0/13")
    assert "response header server: cloudflare" in edge["evidence"]
    assert "server TTL 55: 9 hops away (initial TTL 64)" in edge["evidence"]
    assert edge["hops"] == 9 and edge["tls_at_tcp_peer"] is True
    up = cj["C1"]["requests"][0]["upstream"]
    assert up["source"] == "server-timing" and up["metric"] == "cfRequestDuration"
    assert up["upstream_ms"] == 78.0 and up["edge_ms"] == 8.0 and up["includes_edge"]
    assert up["edge_rtt_ms"] == 12.345 and up["raw"].startswith("cfRequestDuration;dur=78.0, cfL4")
    assert cj["C99"]["edge"] is None and cj["C99"]["requests"][0]["upstream"] is None
    found = [f for f in doc["findings"] if f["code"] == "edge-split"]
    assert len(found) == 1
    f = found[0]
    assert f["severity"] == "info"
    assert f["title"] == ("api.x.test is served through cloudflare: of the 88 ms median time "
                          "to first byte, 80 ms is upstream of the edge (Server-Timing "
                          "cfRequestDuration, 12 requests)")
    assert f["evidence"] == [f"C{i}" for i in range(1, 13)]
    assert "edge's own processing" in f["detail"]
    assert any(x.code == "edge-split" for x in analysis.findings)


def test_no_finding_without_samples() -> None:
    conns = _cf_connections(3)
    for c in conns:
        for r in c.requests:
            r.response_headers = [("server", "cloudflare")]
    assert edge_findings(conns) == []
    assert edge_findings([]) == []


def test_finding_without_a_recognised_edge_and_mixed_sources() -> None:
    conns = [conn(f"C{i}", f"10.0.0.2:{4000 + i}", "192.0.2.5:443",
                  [_r(50.0, ("server-timing", "origin;dur=40") if i % 2 else
                      ("x-envoy-upstream-service-time", "40"), t0=100.0 * i)], sni="svc.test")
             for i in range(1, 5)]
    conns.append(conn("C9", "10.0.0.2:4999", "192.0.2.6:443", [
        _r(30.0, ("server", "envoy"), ("server-timing", "upstream;dur=10")),
        _r(30.0, ("server", "envoy"), ("x-envoy-upstream-service-time", "12"), t0=50),
        _r(30.0, ("server", "envoy"), ("x-envoy-upstream-service-time", "14"), t0=90)],
        sni="mixed.test"))
    titles = sorted(f.title for f in edge_findings(conns))
    assert titles == [
        "mixed.test is served through envoy: of the 30 ms median time to first byte, 12 ms "
        "is upstream of the edge (x-envoy-upstream-service-time and others, 3 requests)",
        "svc.test is served through envoy: of the 50 ms median time to first byte, 40 ms is "
        "upstream of the edge (x-envoy-upstream-service-time, 2 requests)",
        "svc.test: of the 50 ms median time to first byte, 40 ms is upstream of the "
        "server's first hop (Server-Timing origin, 2 requests)"]
    by_title = {f.title[:12]: f.evidence for f in edge_findings(conns)}
    assert by_title["mixed.test i"] == ["C9"]


def test_exceeding_splits_are_left_out_and_said() -> None:
    conns = [conn("C1", "10.0.0.2:4000", "192.0.2.5:443",
                  [_r(50.0, ("server-timing", "origin;dur=40"), ("server", "envoy")),
                   _r(50.0, ("server-timing", "origin;dur=400"), t0=100)], sni="a.test")]
    (f,) = edge_findings(conns)
    assert "1 request)" in f.title and "1 more said more time upstream" in f.detail


def test_annotate_only_touches_known_connections() -> None:
    from netdiag.paths.apply import analyze_paths, annotate_document

    conns = _cf_connections(1)
    doc: dict[str, Any] = {"connections": [{"id": "C999", "requests": [{}]},
                                           conns[0].to_json(), "junk"]}
    annotate_document(doc, conns, analyze_paths(conns, []))
    assert doc["connections"][0] == {"id": "C999", "requests": [{}]}
    assert doc["connections"][1]["edge"]["name"] == "cloudflare"
    assert doc["connections"][2] == "junk"


# --------------------------------------------------------------------------- live


Plan = list[list[tuple[str, str]]]
"""Response headers to send, one list per request, in order."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_name_header = "envoy"
    plan: ClassVar[Plan] = []
    think_s = 0.03

    def version_string(self) -> str:
        return self.server_name_header

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        time.sleep(self.think_s)
        headers = self.plan.pop(0) if self.plan else []
        body = b'{"ok": true}'
        self.send_response(200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(handler: type[_Handler], ctx: ssl.SSLContext | None
           ) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if ctx is not None:
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv, t


LIVE = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                          reason="needs root on Linux (packet socket on lo)")


@pytest.mark.slow
@LIVE
def test_live_capture_reports_the_split_the_server_said(tmp_path: Path) -> None:
    """A real HTTP/1.1 server (cleartext, Envoy-shaped headers) and a real HTTPS server
    (TLS 1.3, Cloudflare-shaped headers) on 127.0.0.1, captured on lo; ``netdiag report
    --format json`` must give back exactly the upstream durations the headers said."""
    from netdiag.lab.certs import client_ssl_context, make_certs, server_ssl_context
    from netdiag.live.capture import LiveCapture

    ca_pem, chain, key = make_certs(["edge.live.test"], tmp_path)
    keylog = tmp_path / "keys.log"
    keylog.write_text("")

    class Envoy(_Handler):
        server_name_header = "envoy"
        plan: ClassVar[Plan] = [[("x-envoy-upstream-service-time", str(v)),
                 ("server-timing", f"origin;dur={v - 1}.5")] for v in (20, 21, 22)]

    class Cloudflare(_Handler):
        server_name_header = "cloudflare"
        plan: ClassVar[Plan] = [[("cf-ray", f"8a1b2c3d4e5f600{i}-AMS"),
                 ("server-timing", f"cfRequestDuration;dur={v}"),
                 ("server-timing", CF_L4)] for i, v in enumerate((24.5, 25.25, 26.0))]

    sent = {"envoy": [p[0][1] for p in Envoy.plan],
            "cloudflare": [p[1][1] for p in Cloudflare.plan]}
    plain, _ = _serve(Envoy, None)
    tls_srv, _ = _serve(Cloudflare, server_ssl_context(chain, key, tls12_only=False))
    ports = {"envoy": plain.server_address[1], "cloudflare": tls_srv.server_address[1]}
    cap_path = tmp_path / "live.pcapng"
    capture = LiveCapture(cap_path, iface="lo",
                          bpf=f"tcp and host 127.0.0.1 and (port {ports['envoy']} or "
                              f"port {ports['cloudflare']})",
                          keep_addresses={"127.0.0.1"})
    try:
        capture.start()
        c1 = http.client.HTTPConnection("127.0.0.1", ports["envoy"], timeout=5)
        ctx = client_ssl_context(ca_pem, keylog, alpn=("http/1.1",))
        sock = socket.create_connection(("127.0.0.1", ports["cloudflare"]), timeout=5)
        c2 = http.client.HTTPConnection("127.0.0.1", ports["cloudflare"], timeout=5)
        c2.sock = ctx.wrap_socket(sock, server_hostname="edge.live.test")
        for c, host in ((c1, "api.envoy.test"), (c2, "edge.live.test")):
            for _ in range(3):
                c.request("GET", "/v1/messages", headers={"host": host})
                r = c.getresponse()
                assert r.status == 200
                r.read()
            if c is c2:
                with contextlib.suppress(OSError, ValueError):
                    c2.sock = c2.sock.unwrap()  # close_notify, then the TCP close
            c.close()
        time.sleep(0.3)
    finally:
        with contextlib.suppress(Exception):
            capture.stop()
        for srv in (plain, tls_srv):
            srv.shutdown()
            srv.server_close()
    p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(cap_path),
                        "--keylog", str(keylog), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    by_port = {int(c["server"].rsplit(":", 1)[1]): c for c in doc["connections"]}
    envoy_c, cf_c = by_port[ports["envoy"]], by_port[ports["cloudflare"]]
    assert envoy_c["edge"]["name"] == "envoy" and envoy_c["edge"]["inferred"] is True
    assert cf_c["edge"]["name"] == "cloudflare" and cf_c["tls"]["decrypted"] is True
    assert "response header cf-ray: 8a1b2c3d4e5f6000-AMS" in cf_c["edge"]["evidence"]
    for c, name, source in ((envoy_c, "envoy", "x-envoy-upstream-service-time"),
                            (cf_c, "cloudflare", "server-timing")):
        reqs = c["requests"]
        assert len(reqs) == 3
        for r, raw in zip(reqs, sent[name], strict=True):
            up = r["upstream"]
            assert up["source"] == source
            said = float(raw) if source != "server-timing" else float(raw.split("=")[1])
            assert up["upstream_ms"] == said
            assert r["ttfb_ms"] > said  # the server slept 30 ms before answering
            assert up["edge_ms"] == round(r["ttfb_ms"] - said, 3)
            assert up["raw"].startswith(raw)
    codes = [(f["code"], f["evidence"]) for f in doc["findings"] if f["code"] == "edge-split"]
    assert (("edge-split", [envoy_c["id"]]) in codes and ("edge-split", [cf_c["id"]]) in codes)
