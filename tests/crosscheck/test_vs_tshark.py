"""netdiag agrees with tshark, capture by capture (CONTRACT.md "cross-check" column).

For every capture in ``../shared/captures/thirdparty/`` (skipped cleanly when the
folder is absent) and every ``captures/*.pcap``/``*.pcapng`` of the project:

* DNS: each transaction's ``latency_ms`` vs tshark's ``dns.time`` (UDP) or the first-
  segment frame times (TCP), within 0.01 ms, where neither side saw a retransmitted
  query;
* TCP: each connection's ``handshake_rtt_ms`` vs ``tcp.analysis.initial_rtt``, within
  0.01 ms, where the client's SYN was not retransmitted;
* TLS: each handshake's version, SNI, offered ALPN, resumption and HelloRetryRequest.

How references are taken and items matched: tshark_ref.py and compare_ref.py. Every item
tshark has must be found in netdiag (a missing one fails); items only netdiag has are
ignored. A test that ends up comparing nothing although tshark has reference values
fails too. Counts: the session summary (conftest.py) and report_counts.py.

``test_synthetic_edge_cases`` runs the same comparison on a capture written by
synthetic.py with the cases the real captures lack (DNS over TCP split over segments,
a retransmitted DNS query, a retransmitted SYN, a resumed TLS 1.2 handshake), checking
the reference method as well as netdiag; it is not part of the counts.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import synthetic
from compare_ref import LABELS, Outcome, compare_capture
from tshark_ref import CaptureSpec, all_captures, reference, tshark_path

CAPTURES = all_captures()

pytestmark = [
    pytest.mark.tshark,
    pytest.mark.skipif(tshark_path() is None, reason="tshark is not installed"),
]


def _check(spec: CaptureSpec, kind: str, tally: dict[tuple[str, str], dict[str, Any]]) -> None:
    out: Outcome = compare_capture(spec)
    label = LABELS[kind]
    compared, agreed = out.compared(kind), out.agreed(kind)
    reasons = [f"{s.desc}: {s.reason}" for s in out.skips if s.kind == kind]
    tally[(spec.name, kind)] = {"agreed": agreed, "compared": compared,
                                "skipped": len(reasons), "skip_reasons": reasons}
    failures = out.failures(kind)
    if failures:
        pytest.fail(f"{len(failures)} of {compared} {label} items disagree with tshark:\n  "
                    + "\n  ".join(failures), pytrace=False)
    if compared == 0:
        if out.comparable_per_tshark(kind):
            pytest.fail(f"{spec.name}: tshark has {out.comparable_per_tshark(kind)} "
                        f"comparable {label} items but none was compared:\n  "
                        + "\n  ".join(reasons), pytrace=False)
        if reasons:
            pytest.skip(f"no comparable {label} item: " + "; ".join(reasons))
        pytest.skip(f"tshark sees no {label} item in {spec.name}")


@pytest.mark.parametrize("spec", CAPTURES, ids=[s.name for s in CAPTURES])
def test_dns_latency(spec: CaptureSpec, crosscheck_tally) -> None:
    _check(spec, "dns", crosscheck_tally)


@pytest.mark.parametrize("spec", CAPTURES, ids=[s.name for s in CAPTURES])
def test_handshake_rtt(spec: CaptureSpec, crosscheck_tally) -> None:
    _check(spec, "tcp", crosscheck_tally)


@pytest.mark.parametrize("spec", CAPTURES, ids=[s.name for s in CAPTURES])
def test_tls_parameters(spec: CaptureSpec, crosscheck_tally) -> None:
    _check(spec, "tls", crosscheck_tally)


def test_synthetic_edge_cases(tmp_path) -> None:
    path = synthetic.write(tmp_path / "synthetic.pcap")
    spec = CaptureSpec("synthetic.pcap", path, None, (), "synthetic")
    ref = reference(spec)
    exp = synthetic.EXPECTED
    dns = {d.qname: d for d in ref.dns}
    split = dns[exp["dns_tcp_split"]["qname"]]
    # tshark's dns.time spans the last segments; the reference uses the first ones.
    assert split.dns_time_ms == Decimal(str(exp["dns_tcp_split"]["tshark_dns_time_ms"]))
    assert split.latency_ms == Decimal(str(exp["dns_tcp_split"]["latency_ms"]))
    assert split.query_first_frame < split.query_frame
    assert dns[exp["dns_udp_retransmitted"]["qname"]].latency_ms is None
    assert dns[exp["dns_udp_retransmitted"]["qname"]].retransmitted
    tcp = {t.client: t for t in ref.tcp}
    synr = tcp[exp["tcp_syn_retransmitted"]["client"]]
    assert synr.syn_retransmitted
    tshark_rtt = exp["tcp_syn_retransmitted"]["tshark_initial_rtt_ms"]
    assert synr.initial_rtt_ms == Decimal(str(tshark_rtt))

    tls = exp["tls12_resumed"]
    assert [(t.client, t.server, t.version, t.sni, t.alpn_offered, t.resumed, t.hello_retry)
            for t in ref.tls] == [(tls["client"], tls["server"], tls["version"], tls["sni"],
                                   tls["alpn_offered"], tls["resumed"], tls["hello_retry"])]

    out = compare_capture(spec)
    for kind in ("dns", "tcp", "tls"):
        assert not out.failures(kind), out.failures(kind)
    assert (out.compared("dns"), out.agreed("dns"), out.skipped("dns")) == (2, 2, 1)
    assert (out.compared("tcp"), out.agreed("tcp"), out.skipped("tcp")) == (3, 3, 1)
    assert (out.compared("tls"), out.agreed("tls"), out.skipped("tls")) == (1, 1, 0)

    # What tshark cannot cross-check, the construction can (CONTRACT.md definitions).
    nd_dns = {d["qname"]: d for d in out.doc["dns"]}
    retry = nd_dns[exp["dns_udp_retransmitted"]["qname"]]
    assert retry["retransmissions"] == exp["dns_udp_retransmitted"]["retransmissions"]
    assert retry["latency_ms"] == pytest.approx(exp["dns_udp_retransmitted"]["latency_ms"],
                                                abs=0.01)
    nd_conn = {c["client"]: c for c in out.doc["connections"]}
    conn = nd_conn[exp["tcp_syn_retransmitted"]["client"]]
    assert conn["syn_retransmissions"] == 1
    assert conn["handshake_rtt_ms"] == pytest.approx(
        exp["tcp_syn_retransmitted"]["handshake_rtt_ms"], abs=0.01)
