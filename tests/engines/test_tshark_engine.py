"""The tshark engine against netdiag's, on the project's capture and the third-party ones
(``../shared/captures/thirdparty/``, skipped when absent), and on synthetic edge cases.

The cross-check helpers of tests/crosscheck/ give the captures, their key logs and the
tshark options MANIFEST.tsv names, and the synthetic capture with a retransmitted DNS
query, DNS over TCP split over segments, a retransmitted SYN and a resumed TLS 1.2
handshake.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crosscheck"))

import synthetic
from tshark_ref import CaptureSpec, all_captures, thirdparty_captures, tshark_path

from netdiag.engines.tshark import tshark_analysis, tshark_document
from netdiag.engines.verify import verify_capture
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
CAPTURES = all_captures()

pytestmark = [
    pytest.mark.tshark,
    pytest.mark.skipif(tshark_path() is None, reason="tshark is not installed"),
]


def _netdiag(path: Path, keys: Path | None = None) -> dict:
    return _netdiag_sink(path, keys)[0]


def _netdiag_sink(path: Path, keys: Path | None = None) -> tuple[dict, CollectingSink]:
    sink = CollectingSink()
    kl = KeyLog.from_file(str(keys)) if keys is not None else None
    return sink.document(analyze([str(path)], sink, Options(keylog=kl))), sink


def _keys(doc: object) -> object:
    """The shape of a document: its keys, recursively (first list element only)."""
    if isinstance(doc, dict):
        return {k: _keys(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_keys(doc[0])] if doc and isinstance(doc[0], dict) else []
    return None


def test_antho_document_is_the_contract_and_matches_netdiag() -> None:
    ts = tshark_document([str(ANTHO)], str(KEYS))
    nd, sink = _netdiag_sink(ANTHO, KEYS)
    assert ts["contract"] == 1 and ts["engine"]["name"] == "tshark"
    assert ts["engine"]["tshark_version"][0].isdigit()
    assert "tls.keylog_file:KEYLOG" in ts["engine"]["command"]
    # every field netdiag's document has, the tshark one has too (but for the two objects
    # the tshark engine does not measure: they are null)
    def covered(mine: object, theirs: object, where: str = "") -> None:
        if where in (".connections.tls.certificate", ".connections.http2"):
            assert theirs is None, where
            return
        if where == ".summary.resp.by_command":  # no RESP in tshark 4.0: no commands
            assert theirs == {}, where
            return
        if isinstance(mine, dict):
            assert isinstance(theirs, dict), where
            for k, v in mine.items():
                assert k in theirs, f"{where}.{k}"
                covered(v, theirs[k], f"{where}.{k}")
        elif isinstance(mine, list) and mine:
            covered(mine[0], theirs[0] if isinstance(theirs, list) and theirs else None, where)
    covered(_keys(nd), _keys(ts))
    # identical summary arithmetic on identical measurements
    for part in ("dns", "tcp", "tls"):
        assert ts["summary"][part] == nd["summary"][part], part
    assert ts["summary"]["http"]["ttfb_ms"] == nd["summary"]["http"]["ttfb_ms"]
    assert ts["summary"]["http"]["reuse_rate"] == nd["summary"]["http"]["reuse_rate"]
    assert ts["summary"]["http"]["requests"] > 0 and ts["summary"]["tls"]["decrypted"] > 0
    assert ts["capture"]["packets"] == nd["capture"]["packets"]
    # netdiag's Redis commands are its own (tshark 4.0 has no RESP dissector)
    resp = {c["id"] for c in nd["connections"] if c["protocol"] == "resp"}
    assert [f["code"] for f in ts["findings"]] == [f["code"] for f in nd["findings"]] or resp
    # frames next to the figures: the same packets netdiag names
    assert [d["frames"] for d in ts["dns"]] == [
        {"query": t.query_packet, "response": t.response_packet} for t in sink.dns_records]
    tls = [c for c in ts["connections"] if c["tls"] is not None]
    assert tls and all({"syn", "handshake_ack", "client_hello", "finished"} <= set(c["frames"])
                       for c in tls)
    by_id = {c.id: c for c in sink.connections}
    assert [c["frames"]["client_hello"] for c in tls] == [
        by_id[c["id"]].tls.client_hello_packet for c in tls]
    reqs = [r for c in ts["connections"] for r in c["requests"]]
    assert reqs and all(r["frames"]["request"] and r["frames"]["request_how"] for r in reqs)


def test_frame_times_index_every_frame() -> None:
    a = tshark_analysis([str(ANTHO)], str(KEYS))
    assert sum(len(v) for v in a.frame_times.values()) == a.document["capture"]["packets"]


@pytest.mark.parametrize("spec", CAPTURES, ids=[s.name for s in CAPTURES])
def test_engines_agree(spec: CaptureSpec) -> None:
    keys = [str(spec.keylog)] if spec.keylog else []
    result = verify_capture(str(spec.path), keys, extra_args=spec.extra_opts)
    diffs = [f"{f.item}: {f.name} netdiag {f.netdiag!r} tshark {f.tshark!r} "
             f"(netdiag {f.netdiag_packets}, tshark {f.tshark_frames}; {f.note})"
             for f in result.differences]
    assert not diffs, "\n".join(diffs)
    assert result.figures
    # with the key logs nothing is estimated; only Redis commands stay netdiag's own
    assert all("RESP" in s["reason"] or s["reason"].startswith("QUIC:")
               for s in result.not_comparable), result.not_comparable


def test_antho_without_keys(tmp_path: Path) -> None:
    # a copy without the pcapng's decryption-secrets blocks, if it has any
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    keyless = tmp_path / "antho-keyless.pcapng"
    reader = CaptureReader(str(ANTHO))
    try:
        with open(keyless, "wb") as out:
            write_pcapng(out, reader.packets())
    finally:
        reader.close()
    result = verify_capture(str(keyless))
    nd = _netdiag(keyless)
    assert nd["summary"]["tls"]["decrypted"] == 0
    # netdiag, without keys, does not count the TLS 1.2 NewSessionTicket it could read in
    # the clear (tshark does); nothing else may differ
    assert {(f.section, f.name) for f in result.differences} <= {("tls", "session_tickets")}
    sections = result.counts()
    assert sections["dns"]["differ"] == 0 and sections["tcp"]["differ"] == 0
    # requests estimated from encrypted records (and Redis commands) are not comparable
    skipped = [c for c in nd["connections"]
               if any(r["estimated"] for r in c["requests"]) or c["protocol"] == "resp"]
    assert any(r["estimated"] for c in skipped for r in c["requests"])
    assert len([s for s in result.not_comparable if s["section"] == "http"]) == len(skipped)
    tls = [f for f in result.figures if f.section == "tls" and f.name == "handshake_ms"]
    assert len(tls) == nd["summary"]["tls"]["handshakes"] and not any(f.differs for f in tls)


def test_synthetic_edge_cases(tmp_path: Path) -> None:
    path = synthetic.write(tmp_path / "synthetic.pcap")
    exp = synthetic.EXPECTED
    doc = tshark_document([str(path)])
    dns = {d["qname"]: d for d in doc["dns"]}
    split = dns[exp["dns_tcp_split"]["qname"]]
    assert split["latency_ms"] == pytest.approx(exp["dns_tcp_split"]["latency_ms"])
    assert split["transport"] == "tcp"
    retry = dns[exp["dns_udp_retransmitted"]["qname"]]
    assert retry["latency_ms"] == pytest.approx(exp["dns_udp_retransmitted"]["latency_ms"])
    assert retry["retransmissions"] == exp["dns_udp_retransmitted"]["retransmissions"]
    conns = {c["client"]: c for c in doc["connections"]}
    syn = conns[exp["tcp_syn_retransmitted"]["client"]]
    assert syn["handshake_rtt_ms"] == pytest.approx(
        exp["tcp_syn_retransmitted"]["handshake_rtt_ms"])  # from the first SYN
    assert syn["syn_retransmissions"] == 1
    tls = conns[exp["tls12_resumed"]["client"]]["tls"]
    for k in ("version", "sni", "alpn_offered", "resumed", "hello_retry"):
        assert tls[k] == exp["tls12_resumed"][k], k
    assert verify_capture(str(path)).ok


def test_several_files_are_merged() -> None:
    specs = {s.name: s for s in thirdparty_captures()}
    names = ("zeek_dns_two_responses.pcap", "wireshark_dns.cap")
    if not all(n in specs for n in names):
        pytest.skip("third-party captures absent")
    paths = [str(specs[n].path) for n in names]
    ts = tshark_document(paths)
    nd = CollectingSink()
    nd_doc = nd.document(analyze(paths, nd, Options()))
    assert ts["capture"]["files"] == paths
    assert ts["capture"]["packets"] == nd_doc["capture"]["packets"]
    assert ts["summary"]["dns"] == nd_doc["summary"]["dns"]
    assert "MERGED" in ts["engine"]["command"]


def test_truncated_capture() -> None:
    specs = {s.name: s for s in thirdparty_captures()}
    spec = specs.get("dpkt_truncated_dns_cut.pcap")
    if spec is None:
        pytest.skip("third-party captures absent")
    doc = tshark_document([str(spec.path)])
    assert doc["capture"]["truncated"] is True
    assert doc["capture"]["warnings"][0]["kind"] == "capture"
    assert [f["code"] for f in doc["findings"]][:1] == ["capture-truncated"]
