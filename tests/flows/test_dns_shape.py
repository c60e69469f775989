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


# -- through the pipeline ----------------------------------------------------------------

def _udp_frame(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    import socket
    import struct

    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    return bytes.fromhex("020000000002020000000001") + b"\x08\x00" + ip + udp


def _pcap(path, frames: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    import struct

    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for n, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1_700_000_000, n * 1000, len(fr), len(fr)) + fr)


def _dns_elsewhere_capture(path) -> None:  # type: ignore[no-untyped-def]
    client, server = ("10.0.0.1", 41000), ("10.0.0.53", 5354)
    frames = []
    for i, name in enumerate(["a.svc.local", "b.svc.local"]):
        q = dns.message.make_query(name, "A", id=100 + i)
        r = dns.message.make_response(q)
        r.answer.append(dns.rrset.from_text(name + ".", 30, "IN", "A", "10.1.1.1"))
        frames.append(_udp_frame(client, server, q.to_wire()))
        frames.append(_udp_frame(server, client, r.to_wire()))
    # answers on that server are parsed whatever they hold: one malformed
    frames.append(_udp_frame(server, client, b"\x00\x01garbage"))
    # not taken: mDNS to its multicast group, NetBIOS name service, QUIC on 443
    mdns = dns.message.make_query("printer.local", "PTR", id=0).to_wire()
    frames.append(_udp_frame(("10.0.0.1", 5353), ("224.0.0.251", 5353), mdns))
    nbns = dns.message.make_query("CKAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "A", id=7).to_wire()
    frames.append(_udp_frame(("10.0.0.1", 137), ("10.0.0.9", 137), nbns))
    frames.append(_udp_frame(("10.0.0.1", 50000), ("10.0.0.9", 443),
                             bytes.fromhex("c300000001088394c8f03e5157080000449e") + bytes(1200)))
    _pcap(path, frames)


@pytest.mark.parametrize("jobs", [1, 2])
def test_dns_on_another_port_is_found_by_its_shape(tmp_path, jobs: int) -> None:  # type: ignore[no-untyped-def]
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    path = tmp_path / "dns5354.pcap"
    _dns_elsewhere_capture(path)
    sink = CollectingSink()
    result = analyze([str(path)], sink, Options(jobs=jobs))
    doc = sink.document(result)
    got = [(t["qname"], t["server"], t["answers"], t["latency_ms"]) for t in doc["dns"]]
    assert got == [("a.svc.local", "10.0.0.53:5354", ["10.1.1.1"], 1.0),
                   ("b.svc.local", "10.0.0.53:5354", ["10.1.1.1"], 1.0)]
    assert result.capture.dns_ports_found == [5354]
    assert any("malformed DNS" in w["message"] for w in doc["capture"]["warnings"])
    # off: nothing; forced by --dns-port: the same transactions
    sink = CollectingSink()
    doc = sink.document(analyze([str(path)], sink, Options(dns_heuristic=False, jobs=jobs)))
    assert doc["dns"] == []
    sink = CollectingSink()
    forced = sink.document(analyze([str(path)], sink, Options(
        dns_heuristic=False, dns_ports=frozenset({53, 5354}), jobs=jobs)))
    assert [(t["qname"], t["latency_ms"]) for t in forced["dns"]] == [
        (g[0], g[3]) for g in got]
