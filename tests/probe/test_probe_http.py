"""``run_http_probe`` against real servers on loopback (the ``lab`` fixture)."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from netdiag.errors import InputError
from netdiag.probe.http import PHASES, run_http_probe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="uses 127.0.0.x addresses other than 127.0.0.1"),
]


def _phases(r: Any) -> dict[str, float | None]:
    return r.phases_ms()


ORDER = ("start", "dns_start", "dns_end", "connect_start", "connect_end", "tls_start",
         "tls_end", "ready", "request", "written", "first_byte", "last_byte")


def _sane(r: Any) -> None:
    """Marks in order on both clocks, phases non-negative and within the total.

    (How far the phases fall short of the total is checked exactly on synthetic marks
    in test_probe_units.py: here a preemption between two phases, on a busy host,
    could add milliseconds.)"""
    marks = [r.marks[k] for k in ORDER if k in r.marks]
    assert [m.perf_ns for m in marks] == sorted(m.perf_ns for m in marks)
    assert [m.epoch_ns for m in marks] == sorted(m.epoch_ns for m in marks)
    ph = _phases(r)
    for name in ("send", "wait", "ttfb", "transfer", "total"):
        assert ph[name] is not None and ph[name] >= 0, (name, ph)
    parts = sum(ph[p] or 0.0 for p in ("dns", "connect", "tls", "send", "wait", "transfer"))
    assert parts <= ph["total"] + 1e-6
    assert ph["wait"] <= ph["ttfb"] + 1e-6


def test_reuse_one_connection(lab: Any) -> None:
    result = run_http_probe(lab.url(), count=5, reuse=True, dns_server=lab.dns_fast,
                            cafile=str(lab.cafile))
    reqs = result.requests
    assert [r.ok for r in reqs] == [True] * 5, [r.error for r in reqs]
    assert [r.status for r in reqs] == [200] * 5
    assert result.connections == 1 and len({r.local for r in reqs}) == 1
    assert [r.reused for r in reqs] == [False, True, True, True, True]
    assert [r.stream_id for r in reqs] == [1, 3, 5, 7, 9]
    first, rest = reqs[0], reqs[1:]
    assert all(_phases(first)[p] is not None for p in ("dns", "connect", "tls"))
    for r in rest:
        assert all(_phases(r)[p] is None for p in ("dns", "connect", "tls"))
    for r in reqs:
        _sane(r)
        assert (r.http_version, r.alpn, r.tls_version) == ("HTTP/2", "h2", "TLS 1.3")
        assert r.cipher and r.cipher.startswith("TLS_")
        assert r.remote == lab.h2 and r.resolved == lab.H2_IP
        assert r.response_bytes and r.response_bytes > 0
    s = result.summary()
    assert (s["requests"], s["ok"], s["failures"], s["connections"], s["reused"]) == (5, 5, 0,
                                                                                     1, 4)
    assert s["phases"]["dns_ms"]["count"] == 1 and s["phases"]["ttfb_ms"]["count"] == 5
    assert s["statuses"] == {"200": 5}


def test_fresh_connection_each_time(lab: Any) -> None:
    result = run_http_probe(lab.url(), count=5, reuse=False, dns_server=lab.dns_fast,
                            cafile=str(lab.cafile))
    reqs = result.requests
    assert all(r.ok for r in reqs), [r.error for r in reqs]
    assert result.connections == 5 and len({r.local for r in reqs}) == 5
    assert [r.connection for r in reqs] == [1, 2, 3, 4, 5]
    assert not any(r.reused for r in reqs)
    for r in reqs:
        _sane(r)
        assert all(_phases(r)[p] is not None for p in ("dns", "connect", "tls"))
        assert r.stream_id == 1
    assert result.summary()["phases"]["tls_ms"]["count"] == 5


def test_http1(lab: Any) -> None:
    result = run_http_probe(lab.url(), count=3, http1=True, dns_server=lab.dns_fast,
                            cafile=str(lab.cafile))
    reqs = result.requests
    assert all(r.ok for r in reqs), [r.error for r in reqs]
    assert {(r.http_version, r.alpn) for r in reqs} == {("HTTP/1.1", "http/1.1")}
    assert result.connections == 1 and [r.reused for r in reqs] == [False, True, True]
    assert all(r.status == 200 and r.response_bytes for r in reqs)
    assert all(r.stream_id is None for r in reqs)
    for r in reqs:
        _sane(r)
        assert _phases(r)["ttfb"] >= lab.H2_THINK_MS


def test_think_time_shows_in_ttfb_and_tls12(lab: Any) -> None:
    h2 = run_http_probe(lab.url(), count=3, dns_server=lab.dns_fast, cafile=str(lab.cafile))
    t12 = run_http_probe(f"https://{lab.TLS12_NAME}:{lab.tls12_port}/v1/messages", count=3,
                         dns_server=lab.dns_fast, cafile=str(lab.cafile))
    for r in h2.requests:
        assert r.ok and _phases(r)["ttfb"] >= lab.H2_THINK_MS
        # the server's think time is in wait/ttfb, not in the transfer
        assert _phases(r)["transfer"] < lab.H2_THINK_MS / 2
    for r in t12.requests:
        assert r.ok, r.error
        assert r.tls_version == "TLS 1.2" and r.http_version == "HTTP/2"
        assert r.cipher is not None and r.cipher.startswith("TLS_ECDHE_")
        assert _phases(r)["ttfb"] >= lab.TLS12_THINK_MS


def test_streamed_answer_time_is_in_transfer(lab: Any) -> None:
    # /v1/stream: headers after the think time, then 3 server-sent events 5 ms apart
    result = run_http_probe(lab.url(path="/v1/stream"), count=2, dns_server=lab.dns_fast,
                            cafile=str(lab.cafile))
    for r in result.requests:
        assert r.ok and r.status == 200, r.error
        assert r.response_bytes is not None and r.response_bytes > 3 * len("data: {}")
        ph = _phases(r)
        assert ph["ttfb"] >= lab.H2_THINK_MS
        # the last event leaves at least two 5 ms gaps after the headers: a floor for
        # request -> last byte whatever the scheduling of our own process
        assert ph["ttfb"] + ph["transfer"] >= lab.H2_THINK_MS + 2 * 5.0
        assert ph["transfer"] > 0
        _sane(r)



def test_h2_parsing_time_is_not_in_the_transfer(lab: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab's server writes a response's HEADERS and DATA as separate segments, well
    under a millisecond apart. Bytes that arrive while ``h2`` parses the HEADERS must be
    stamped when ``recv()`` could have returned them, not when the parsing ends: with
    every parse made 200 ms slow, the transfer stays far below 200 ms."""
    import h2.connection

    slow_s = 0.2
    parse = h2.connection.H2Connection.receive_data

    def slow_parse(self: Any, data: bytes) -> Any:
        time.sleep(slow_s)
        return parse(self, data)

    monkeypatch.setattr(h2.connection.H2Connection, "receive_data", slow_parse)
    result = run_http_probe(lab.url(), count=3, dns_server=lab.dns_fast,
                            cafile=str(lab.cafile), timeout=10)
    assert result.connections == 1
    for r in result.requests:
        assert r.ok and r.status == 200 and r.response_bytes, r.error
        transfer = _phases(r)["transfer"]
        assert transfer is not None and transfer < slow_s * 1000 / 2, transfer


def test_dns_delay_shows_in_dns_phase(lab: Any) -> None:
    slow = run_http_probe(lab.url(), count=2, reuse=False, dns_server=lab.dns_slow,
                          cafile=str(lab.cafile))
    fast = run_http_probe(lab.url(), count=2, reuse=False, dns_server=lab.dns_fast,
                          cafile=str(lab.cafile))
    slow_dns = [_phases(r)["dns"] for r in slow.requests]
    fast_dns = [_phases(r)["dns"] for r in fast.requests]
    assert all(d is not None and d >= lab.DNS_DELAY_MS for d in slow_dns), slow_dns
    assert all(d is not None for d in fast_dns)
    assert min(fast_dns) < lab.DNS_DELAY_MS, fast_dns
    assert {r.dns_source for r in slow.requests} == {lab.dns_slow}


def test_connect_to_and_ip_literal(lab: Any) -> None:
    # URL names the host (SNI, certificate, :authority); --connect-to says where to go
    via = run_http_probe(lab.url(name="api.probe.test", port=443), connect_to=lab.h2,
                         cafile=str(lab.cafile))
    r = via.requests[0]
    assert r.ok, r.error
    assert r.remote == lab.h2 and _phases(r)["dns"] is None and r.dns_source is None
    # an IP literal: no lookup; the lab certificate has no IP SAN, so -k is needed
    ip = run_http_probe(f"https://{lab.h2}/v1/messages", insecure=True)
    assert ip.requests[0].ok and _phases(ip.requests[0])["dns"] is None
    strict = run_http_probe(f"https://{lab.h2}/v1/messages", cafile=str(lab.cafile))
    assert strict.requests[0].failed_phase == "tls"
    assert "certificate verify failed" in (strict.requests[0].error or "")


def test_method_headers_and_404(lab: Any) -> None:
    post = run_http_probe(lab.url(), method="post", headers=[("X-Probe", "1")],
                          dns_server=lab.dns_fast, cafile=str(lab.cafile))
    assert post.method == "POST" and post.requests[0].status == 200
    missing = run_http_probe(lab.url(path="/nope"), count=2, dns_server=lab.dns_fast,
                             cafile=str(lab.cafile), http1=True)
    assert [r.status for r in missing.requests] == [404, 404]
    assert all(r.ok for r in missing.requests)  # a complete answer, whatever its status
    assert missing.connections == 1


def test_failures_are_recorded_not_raised(lab: Any) -> None:
    refused = run_http_probe(f"https://{lab.refused}/", count=2, timeout=2)
    assert refused.failures == 2 and refused.succeeded == 0 and refused.connections == 0
    for r in refused.requests:
        assert (r.ok, r.failed_phase, r.error) == (False, "connect", "connection refused")
        assert r.failed_after_ms is not None and _phases(r)["total"] is None
    nx = run_http_probe(lab.url(name=lab.NX_NAME), dns_server=lab.dns_fast,
                        cafile=str(lab.cafile))
    r = nx.requests[0]
    assert r.failed_phase == "dns" and r.error.startswith("NXDOMAIN")
    dns_timeout = run_http_probe(lab.url(), dns_server=lab.blackhole, timeout=0.3)
    r = dns_timeout.requests[0]
    assert r.failed_phase == "dns" and "timeout" in r.error
    untrusted = run_http_probe(lab.url(), dns_server=lab.dns_fast)  # system CAs only
    r = untrusted.requests[0]
    assert r.failed_phase == "tls" and "certificate verify failed" in r.error
    assert r.connection == 1 and untrusted.connections == 1
    wrong_name = run_http_probe(lab.url(name="other.probe.test"), connect_to=lab.h2,
                                cafile=str(lab.cafile))
    assert wrong_name.requests[0].failed_phase == "tls"
    insecure = run_http_probe(lab.url(name="other.probe.test"), connect_to=lab.h2,
                              insecure=True)
    assert insecure.requests[0].ok


def test_tls_handshake_timeout(lab: Any) -> None:
    # a listener that never answers: the kernel completes the TCP handshake, nobody
    # ever sends a ServerHello
    with socket.socket() as silent:
        silent.bind(("127.0.0.157", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        result = run_http_probe(f"https://127.0.0.157:{port}/", timeout=0.3, insecure=True,
                                count=2)
    for r in result.requests:
        assert r.failed_phase == "tls" and r.error == "timeout after 0.3 s"
        assert 250 <= r.failed_after_ms < 2000
        assert _phases(r)["connect"] is not None
    assert result.connections == 2  # the failed connection was not reused


def test_json_and_keylog(lab: Any, tmp_path: Path) -> None:
    keylog = tmp_path / "keys.log"
    result = run_http_probe(lab.url(), count=3, reuse=False, keylog=keylog,
                            dns_server=lab.dns_fast, cafile=str(lab.cafile))
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["mode"] == "fresh" and doc["http"] == "2" and doc["count"] == 3
    assert len(doc["requests"]) == 3
    for r in doc["requests"]:
        assert {f"{p}_ms" for p in PHASES} <= set(r)
        assert r["ok"] and r["status"] == 200 and r["reused"] is False
        assert r["epoch_ns"]["request"] <= r["epoch_ns"]["first_byte"]
        assert abs(r["request_ts"] - r["epoch_ns"]["request"] / 1e9) < 1e-6
    assert set(doc["summary"]["phases"]["ttfb_ms"]) == {"count", "min", "p50", "p90", "p99",
                                                        "max", "mean"}
    lines = keylog.read_text().splitlines()
    randoms = {ln.split()[1] for ln in lines if ln.startswith("CLIENT_TRAFFIC_SECRET_0")}
    assert len(randoms) == 3  # one TLS 1.3 session per fresh connection


def test_bad_input_raises_input_error(lab: Any) -> None:
    for url in ("ftp://example.test/", "https://", "https://host:99999/", "https://h/a b"):
        with pytest.raises(InputError):
            run_http_probe(url)
    with pytest.raises(InputError):
        run_http_probe(lab.url(), count=0)
    with pytest.raises(InputError):
        run_http_probe(lab.url(), dns_server="not-an-ip")
    with pytest.raises(InputError):
        run_http_probe(lab.url(), connect_to="host:0")
    with pytest.raises(InputError):
        run_http_probe(lab.url(), headers=[("Bad Name", "x")])
    with pytest.raises(InputError):
        run_http_probe(lab.url(), cafile="/nonexistent/ca.pem")
