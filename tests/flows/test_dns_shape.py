"""The DNS heuristic for UDP on other ports (issue 12): DNS passes, other traffic does not."""

from __future__ import annotations

import random

import dns.flags
import dns.message
import dns.rrset
import pytest

from netdiag.flows.dns_shape import looks_like_dns


def _messages() -> list[bytes]:
    out = []
    for name, rdtype in [("example.com", "A"), ("api.internal.corp", "AAAA"),
                         ("_http._tcp.svc.consul", "SRV"), ("x" * 63 + ".io", "TXT"),
                         (".", "NS")]:
        for edns in (False, True):
            q = dns.message.make_query(name, rdtype, use_edns=0 if edns else None)
            out.append(q.to_wire())
            r = dns.message.make_response(q)
            if rdtype == "A":
                r.answer.append(dns.rrset.from_text(name + ".", 60, "IN", "A", "192.0.2.1",
                                                    "192.0.2.2"))
            out.append(r.to_wire())
            r.set_rcode(3)
            out.append(r.to_wire())
    return out


@pytest.mark.parametrize("wire", _messages())
def test_dns_messages_pass(wire: bytes) -> None:
    assert looks_like_dns(wire)


def test_random_and_other_protocols_do_not_pass() -> None:
    rng = random.Random(5)
    for _ in range(100_000):
        assert not looks_like_dns(rng.randbytes(rng.randrange(0, 1300)))
    # QUIC Initial (long header, version 1) and a short-header packet
    assert not looks_like_dns(bytes.fromhex("c300000001088394c8f03e5157080000449e") + bytes(1200))
    assert not looks_like_dns(bytes([0x40]) + rng.randbytes(40))
    # RTP version 2, payload type 0
    assert not looks_like_dns(bytes.fromhex("80000001000000a0deadbeef") + rng.randbytes(160))


def test_damaged_dns_does_not_pass() -> None:
    wire = dns.message.make_query("example.com", "A").to_wire()
    assert not looks_like_dns(wire[:-1])  # cut in the question
    assert not looks_like_dns(wire + b"\x00")  # trailing byte, no record announced
    two = wire[:4] + b"\x00\x02" + wire[6:]
    assert not looks_like_dns(two)  # two questions
    z = wire[:3] + bytes([wire[3] | 0x40]) + wire[4:]
    assert not looks_like_dns(z)  # Z bit
    bad_class = wire[:-2] + b"\x00\x09"
    assert not looks_like_dns(bad_class)
