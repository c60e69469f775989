"""Unit and property tests of the passive DNS analyzer (netdiag.protocols.dns)."""

from __future__ import annotations

import io
import socket
import struct
from pathlib import Path

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netdiag.protocols.dns import DnsAnalyzer, DnsTcpStream, name_text, rdata_text
from netdiag.records import DnsTransaction

CLIENT = "10.0.0.1:40000"
SERVER = "10.0.0.53:53"
T0 = 1_764_425_767_123_456_789
MS = 1_000_000
S = 1_000_000_000
THIRDPARTY = Path(__file__).resolve().parents[2].parent / "shared" / "captures" / "thirdparty"


# -- helpers ---------------------------------------------------------------------------

def make_query(name: str = "api.roc.test", rdtype: str | int = "A",
               msg_id: int = 0x1234) -> dns.message.QueryMessage:
    """A query message with a fixed id."""
    q = dns.message.make_query(name, rdtype)
    q.id = msg_id
    return q


def make_response(query: dns.message.Message, *answers: tuple[str, str, str],
                  rcode: int = dns.rcode.NOERROR, tc: bool = False) -> bytes:
    """Wire bytes of a response to ``query`` with (owner, type, rdata) answers."""
    r = dns.message.make_response(query)
    for owner, rdtype, text in answers:
        r.answer.append(dns.rrset.from_text(owner, 60, "IN", rdtype, text))
    r.set_rcode(rcode)
    if tc:
        r.flags |= dns.flags.TC
    return r.to_wire()


class Rig:
    """An analyzer and the transactions it emitted."""

    def __init__(self, timeout_ns: int = 5 * S) -> None:
        self.out: list[DnsTransaction] = []
        self.dns = DnsAnalyzer(self.out.append, timeout_ns=timeout_ns)

    def query(self, ts: int, q: dns.message.Message, packet: int,
              client: str = CLIENT, server: str = SERVER) -> None:
        self.dns.on_udp(ts, client, server, q.to_wire(), packet)

    def answer(self, ts: int, wire: bytes, packet: int,
               client: str = CLIENT, server: str = SERVER) -> None:
        self.dns.on_udp(ts, server, client, wire, packet)

    def done(self) -> list[DnsTransaction]:
        self.dns.finish()
        return sorted(self.out, key=lambda t: (t.ts_ns, t.query_packet or 0, t.id))


def framed(*messages: bytes) -> bytes:
    """DNS-over-TCP framing: each message behind its 2-byte length."""
    return b"".join(struct.pack("!H", len(m)) + m for m in messages)


# -- UDP transactions --------------------------------------------------------------------

def test_simple_a_query_and_answer() -> None:
    rig = Rig()
    q = make_query()
    rig.query(T0, q, 1)
    rig.answer(T0 + 210_123, make_response(q, ("api.roc.test.", "A", "127.0.0.10")), 2)
    assert rig.out == []  # held for duplicates until it expires
    [t] = rig.done()
    assert (t.ts_ns, t.client, t.server, t.transport, t.id) == (T0, CLIENT, SERVER, "udp", 0x1234)
    assert (t.qname, t.qtype, t.rcode, t.answers) == ("api.roc.test", "A", "NOERROR",
                                                      ["127.0.0.10"])
    assert t.latency_ns == 210_123
    assert t.response_ts_ns == T0 + 210_123
    assert (t.query_packet, t.response_packet) == (1, 2)
    assert (t.retransmissions, t.responses, t.truncated) == (0, 1, False)
    assert t.to_json()["latency_ms"] == pytest.approx(0.210123)
    assert rig.dns.warnings == []
    assert rig.dns.stats["queries"] == 1 and rig.dns.stats["responses"] == 1


def test_expire_emits_after_timeout_of_last_activity() -> None:
    rig = Rig(timeout_ns=2 * S)
    q = make_query()
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, make_response(q, ("api.roc.test.", "A", "127.0.0.10")), 2)
    rig.dns.expire(T0 + MS + 2 * S)
    assert rig.out == []
    rig.dns.expire(T0 + MS + 2 * S + 1)
    assert len(rig.out) == 1 and rig.out[0].responses == 1
    assert rig.done() == rig.out  # nothing left to emit


def test_retransmitted_query_counts_and_keeps_start() -> None:
    rig = Rig()
    q = make_query()
    rig.query(T0, q, 1)
    rig.query(T0 + 1 * S, q, 2)
    rig.query(T0 + 2 * S, q, 3)
    rig.answer(T0 + 2 * S + 5 * MS, make_response(q, ("api.roc.test.", "A", "127.0.0.10")), 4)
    [t] = rig.done()
    assert t.ts_ns == T0 and t.query_packet == 1
    assert t.retransmissions == 2
    assert t.latency_ns == 2 * S + 5 * MS
    assert rig.dns.stats["retransmissions"] == 2


def test_unanswered_is_emitted_by_finish() -> None:
    rig = Rig()
    rig.query(T0, make_query(), 7)
    rig.dns.expire(T0 + 1 * S)
    assert rig.out == []
    [t] = rig.done()
    assert t.response_ts_ns is None and t.latency_ns is None
    assert t.rcode is None and t.answers == [] and t.responses == 0
    assert t.response_packet is None and t.query_packet == 7
    assert t.to_json()["latency_ms"] is None


def test_unanswered_is_emitted_by_expire() -> None:
    rig = Rig(timeout_ns=1 * S)
    rig.query(T0, make_query(), 1)
    rig.dns.expire(T0 + 1 * S + 1)
    assert len(rig.out) == 1 and rig.out[0].responses == 0


def test_duplicate_responses() -> None:
    rig = Rig()
    q = make_query()
    first = make_response(q, ("api.roc.test.", "A", "127.0.0.10"))
    second = make_response(q, ("api.roc.test.", "A", "127.0.0.99"))
    rig.query(T0, q, 1)
    rig.answer(T0 + 3 * MS, first, 2)
    rig.answer(T0 + 4 * MS, second, 3)
    [t] = rig.done()
    assert t.responses == 2
    assert t.response_packet == 2 and t.latency_ns == 3 * MS
    assert t.answers == ["127.0.0.10"]
    assert rig.dns.stats["duplicate_responses"] == 1


def test_nxdomain() -> None:
    rig = Rig()
    q = make_query("nope.roc.test")
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, make_response(q, rcode=dns.rcode.NXDOMAIN), 2)
    [t] = rig.done()
    assert t.rcode == "NXDOMAIN" and t.answers == []


def test_extended_rcode_from_opt() -> None:
    rig = Rig()
    q = make_query()
    q.use_edns(0)
    r = dns.message.make_response(q)
    r.set_rcode(dns.rcode.BADCOOKIE)
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, r.to_wire(), 2)
    [t] = rig.done()
    assert t.rcode == "BADCOOKIE"


def test_aaaa_and_cname_answers_in_wire_order() -> None:
    rig = Rig()
    q = make_query("www.example.com", "AAAA")
    wire = make_response(q,
                         ("www.example.com.", "CNAME", "edge.example.net."),
                         ("edge.example.net.", "AAAA", "2001:db8::1"),
                         ("edge.example.net.", "AAAA", "2001:db8::2"))
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, wire, 2)
    [t] = rig.done()
    assert t.qtype == "AAAA"
    assert t.answers == ["edge.example.net", "2001:db8::1", "2001:db8::2"]


def test_interleaved_answers_keep_wire_order() -> None:
    """dnspython would merge RRsets; the walk keeps the answer section's own order."""
    q = make_query("a.example", "A")
    r = dns.message.make_response(q)
    wire = bytearray(r.to_wire())
    rrs = [("a.example.", "CNAME", "b.example."), ("b.example.", "A", "192.0.2.1"),
           ("b.example.", "CNAME", "c.example."), ("b.example.", "A", "192.0.2.2")]
    for owner, rdtype, text in rrs:
        out = io.BytesIO()
        dns.rrset.from_text(owner, 60, "IN", rdtype, text).to_wire(out)
        wire += out.getvalue()
    struct.pack_into("!H", wire, 6, len(rrs))
    rig = Rig()
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, bytes(wire), 2)
    [t] = rig.done()
    assert t.answers == ["b.example", "192.0.2.1", "c.example", "192.0.2.2"]


def test_names_inside_rdata_lose_their_trailing_dot() -> None:
    rig = Rig()
    q = make_query("example.com", "MX")
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, make_response(q, ("example.com.", "MX", "10 mail.example.com."),
                                      ("example.com.", "MX", "0 .")), 2)
    q2 = make_query("example.com", "TXT", msg_id=2)
    rig.query(T0 + 1, q2, 3)
    rig.answer(T0 + MS, make_response(q2, ("example.com.", "TXT", '"v=spf1 @ -all"')), 4)
    t1, t2 = rig.done()
    assert t1.answers == ["10 mail.example.com", "0 ."]
    assert t2.answers == ['"v=spf1 @ -all"']


def test_truncated_flag() -> None:
    rig = Rig()
    q = make_query("big.example", "TXT")
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, make_response(q, tc=True), 2)
    [t] = rig.done()
    assert t.truncated is True


def test_unknown_type_and_root_name() -> None:
    rig = Rig()
    q1 = make_query("odd.example", 65534, msg_id=1)
    q2 = make_query(".", "NS", msg_id=2)
    rig.query(T0, q1, 1)
    rig.query(T0 + 1, q2, 2)
    t1, t2 = rig.done()
    assert t1.qtype == "TYPE65534"
    assert (t2.qname, t2.qtype) == (".", "NS")


def test_name_case_is_ignored_for_matching_and_kept_for_reporting() -> None:
    rig = Rig()
    q = make_query("Api.ROC.test")
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, make_response(make_query("api.roc.TEST"),
                                      ("api.roc.test.", "A", "127.0.0.10")), 2)
    [t] = rig.done()
    assert t.qname == "Api.ROC.test" and t.responses == 1


def test_escaped_label_text_matches_dnspython() -> None:
    rig = Rig()
    name = dns.name.Name([b"we ird.", b"x\\y\x00", b"example", b""])
    q = make_query()
    q.question[0] = dns.rrset.RRset(name, 1, 1)
    rig.query(T0, q, 1)
    [t] = rig.done()
    assert t.qname == name.to_text(omit_final_dot=True)


def test_same_id_different_names_are_two_transactions() -> None:
    rig = Rig()
    qa, qb = make_query("a.example", msg_id=7), make_query("b.example", msg_id=7)
    rig.query(T0, qa, 1)
    rig.query(T0 + 1, qb, 2)
    rig.answer(T0 + 5 * MS, make_response(qb, ("b.example.", "A", "192.0.2.2")), 3)
    rig.answer(T0 + 9 * MS, make_response(qa, ("a.example.", "A", "192.0.2.1")), 4)
    ta, tb = rig.done()
    assert (ta.qname, ta.answers, ta.latency_ns, ta.retransmissions) == (
        "a.example", ["192.0.2.1"], 9 * MS, 0)
    assert (tb.qname, tb.answers, tb.latency_ns, tb.retransmissions) == (
        "b.example", ["192.0.2.2"], 5 * MS - 1, 0)


def test_same_id_and_name_other_type_or_client_are_separate() -> None:
    rig = Rig()
    rig.query(T0, make_query("a.example", "A", msg_id=7), 1)
    rig.query(T0 + 1, make_query("a.example", "AAAA", msg_id=7), 2)
    rig.query(T0 + 2, make_query("a.example", "A", msg_id=7), 3, client="10.0.0.2:40000")
    assert [t.retransmissions for t in rig.done()] == [0, 0, 0]


def test_id_reuse_after_completion_is_a_new_transaction() -> None:
    rig = Rig()
    q = make_query()
    wire = make_response(q, ("api.roc.test.", "A", "127.0.0.10"))
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, wire, 2)
    rig.query(T0 + 2 * MS, q, 3)
    assert len(rig.out) == 1  # the answered one is emitted when the id is reused
    rig.answer(T0 + 5 * MS, wire, 4)
    t1, t2 = rig.done()
    assert (t1.query_packet, t1.response_packet, t1.responses) == (1, 2, 1)
    assert (t2.query_packet, t2.response_packet, t2.responses) == (3, 4, 1)
    assert t2.latency_ns == 3 * MS and t1.retransmissions == t2.retransmissions == 0


def test_repeat_after_timeout_without_answer_is_a_new_transaction() -> None:
    rig = Rig(timeout_ns=1 * S)
    q = make_query()
    rig.query(T0, q, 1)
    rig.query(T0 + 3 * S, q, 2)  # no expire() call in between: same outcome
    t1, t2 = rig.done()
    assert (t1.query_packet, t1.retransmissions, t1.responses) == (1, 0, 0)
    assert (t2.query_packet, t2.retransmissions) == (2, 0)


def test_response_after_timeout_is_unmatched() -> None:
    rig = Rig(timeout_ns=1 * S)
    q = make_query()
    rig.query(T0, q, 1)
    rig.answer(T0 + 2 * S, make_response(q), 2)
    [t] = rig.done()
    assert t.responses == 0
    assert rig.dns.stats["unmatched_responses"] == 1


def test_unmatched_response_is_counted_not_emitted() -> None:
    rig = Rig()
    rig.answer(T0, make_response(make_query()), 1)
    assert rig.done() == []
    assert rig.dns.stats["unmatched_responses"] == 1
    assert rig.dns.warnings == []


def test_response_without_question_matches_by_id() -> None:
    rig = Rig()
    q = make_query(msg_id=99)
    rig.query(T0, q, 1)
    formerr = struct.pack("!HHHHHH", 99, 0x8000 | 0x0100 | 0x0080 | dns.rcode.FORMERR,
                          0, 0, 0, 0)
    rig.answer(T0 + MS, formerr, 2)
    [t] = rig.done()
    assert (t.rcode, t.responses, t.latency_ns) == ("FORMERR", 1, MS)
    assert rig.dns.warnings == []


def test_response_without_question_is_unmatched_when_ambiguous() -> None:
    rig = Rig()
    rig.query(T0, make_query("a.example", msg_id=99), 1)
    rig.query(T0, make_query("b.example", msg_id=99), 2)
    rig.answer(T0 + MS, struct.pack("!HHHHHH", 99, 0x8002, 0, 0, 0, 0), 3)
    assert [t.responses for t in rig.done()] == [0, 0]
    assert rig.dns.stats["unmatched_responses"] == 1


def test_ipv6_endpoints() -> None:
    rig = Rig()
    client, server = "[2001:db8::1]:5353", "[2001:db8::53]:53"
    q = make_query()
    rig.query(T0, q, 1, client=client, server=server)
    rig.answer(T0 + MS, make_response(q), 2, client=client, server=server)
    [t] = rig.done()
    assert (t.client, t.server, t.responses) == (client, server, 1)


# -- bad bytes ---------------------------------------------------------------------------

@pytest.mark.parametrize("payload, reason", [
    (b"", "shorter than the 12-byte header"),
    (b"\x12\x34\x01\x00\x00\x01", "shorter than the 12-byte header"),
    (struct.pack("!HHHHHH", 1, 0x0100, 0, 0, 0, 0), "query without a question"),
    (struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x05abc", "past the end"),
    (struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x45abc\x00\x00\x01\x00\x01",
     "unknown label type"),
    (struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",
     "does not point backwards"),
    (struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x03abc\x00\x00",
     "question cut short"),
])
def test_malformed_query_is_a_warning(payload: bytes, reason: str) -> None:
    rig = Rig()
    rig.dns.on_udp(T0, CLIENT, SERVER, payload, 12)
    assert rig.done() == []
    [w] = rig.dns.warnings
    assert w.startswith(f"packet 12: malformed DNS message from {CLIENT} (")
    assert reason in w
    assert rig.dns.stats["malformed"] == 1


def test_response_with_broken_question_matches_by_id_with_warning() -> None:
    rig = Rig()
    q = make_query(msg_id=5)
    rig.query(T0, q, 1)
    wire = make_response(q, ("api.roc.test.", "A", "127.0.0.10"))
    rig.answer(T0 + MS, wire[:16], 2)  # cut inside the question name
    [t] = rig.done()
    assert (t.responses, t.rcode, t.answers) == (1, "NOERROR", [])
    [w] = rig.dns.warnings
    assert w.startswith(f"packet 2: malformed DNS message from {SERVER} (")
    assert "matching it by id only" in w


def test_response_cut_at_snaplen_keeps_whole_answers() -> None:
    rig = Rig()
    q = make_query()
    wire = make_response(q, ("api.roc.test.", "A", "127.0.0.10"),
                         ("api.roc.test.", "A", "127.0.0.11"),
                         ("api.roc.test.", "A", "127.0.0.12"))
    with pytest.raises(dns.exception.DNSException):
        dns.message.from_wire(wire[:-2])
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, wire[:-2], 2)
    [t] = rig.done()
    assert (t.responses, t.rcode, t.latency_ns) == (1, "NOERROR", MS)
    assert t.answers == ["127.0.0.10", "127.0.0.11"]
    [w] = rig.dns.warnings
    assert "answer 3 cut short" in w and "kept 2 of 3 answers" in w
    assert rig.dns.stats["partial"] == 1


def test_bad_rdata_is_skipped_and_the_walk_goes_on() -> None:
    q = make_query()
    wire = bytearray(make_response(q, ("api.roc.test.", "A", "127.0.0.10")))
    bad = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 3) + b"\x01\x02\x03"  # A with 3 bytes
    good = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([192, 0, 2, 9])
    wire += bad + good
    struct.pack_into("!H", wire, 6, 3)
    rig = Rig()
    rig.query(T0, q, 1)
    rig.answer(T0 + MS, bytes(wire), 2)
    [t] = rig.done()
    assert t.answers == ["127.0.0.10", "192.0.2.9"]
    [w] = rig.dns.warnings
    assert "answer 2: bad A rdata" in w


def test_thirdparty_snaplen_truncated_response() -> None:
    path = THIRDPARTY / "dpkt_truncated_dns_cut.pcap"
    if not path.exists():
        pytest.skip("third-party captures absent")
    data = path.read_bytes()
    incl = struct.unpack_from("<I", data, 24 + 8)[0]
    frame = data[40:40 + incl]
    ihl = (frame[14] & 0x0F) * 4
    payload = frame[14 + ihl + 8:]
    with pytest.raises(dns.exception.DNSException):
        dns.message.from_wire(payload)
    question = dns.message.from_wire(payload, question_only=True)
    q = make_query(question.question[0].name.to_text(), "A", msg_id=question.id)
    rig = Rig()
    rig.query(T0, q, 1, client="192.168.1.101:1297", server="192.168.1.100:53")
    rig.answer(T0 + MS, payload, 2, client="192.168.1.101:1297", server="192.168.1.100:53")
    [t] = rig.done()
    assert t.qname == "mycelium-wallet.s3.amazonaws.com"
    assert t.answers == ["s3-1-w.amazonaws.com", "52.217.101.4"]
    assert t.latency_ns == MS


# -- DNS over TCP ------------------------------------------------------------------------

def tcp_rig() -> tuple[Rig, DnsTcpStream]:
    rig = Rig()
    return rig, rig.dns.tcp_stream(CLIENT, SERVER)


def test_tcp_two_messages_in_one_segment() -> None:
    rig, stream = tcp_rig()
    qa, qb = make_query("a.example", msg_id=1), make_query("b.example", msg_id=2)
    stream.feed(0, T0, framed(qa.to_wire(), qb.to_wire()), 4)
    stream.feed(1, T0 + 7 * MS, framed(make_response(qb, ("b.example.", "A", "192.0.2.2")),
                                       make_response(qa, ("a.example.", "A", "192.0.2.1"))), 5)
    stream.close(T0 + 8 * MS)
    assert len(rig.out) == 2  # closing the connection finishes its transactions
    ta, tb = rig.done()
    assert (ta.transport, ta.client, ta.server) == ("tcp", CLIENT, SERVER)
    assert (ta.qname, ta.answers, ta.latency_ns, ta.query_packet, ta.response_packet) == (
        "a.example", ["192.0.2.1"], 7 * MS, 4, 5)
    assert (tb.qname, tb.answers, tb.latency_ns) == ("b.example", ["192.0.2.2"], 7 * MS)
    assert stream.warnings == [] and rig.dns.warnings == []


def test_tcp_message_split_over_three_segments_is_timed_by_its_first_byte() -> None:
    rig, stream = tcp_rig()
    q = make_query()
    stream.feed(0, T0, framed(q.to_wire()), 4)
    resp = framed(make_response(q, ("api.roc.test.", "A", "127.0.0.10"),
                                ("api.roc.test.", "A", "127.0.0.11")))
    stream.feed(1, T0 + 10 * MS, resp[:1], 5)  # the first byte of the length prefix
    stream.feed(1, T0 + 11 * MS, resp[1:20], 6)
    stream.feed(1, T0 + 12 * MS, resp[20:], 7)
    stream.close(T0 + 20 * MS)
    [t] = rig.done()
    assert t.latency_ns == 10 * MS
    assert t.response_packet == 5
    assert t.answers == ["127.0.0.10", "127.0.0.11"]


def test_tcp_segments_mixing_message_ends_and_starts() -> None:
    """A segment that ends one message and starts the next times the next one."""
    rig, stream = tcp_rig()
    queries = [make_query(f"n{i}.example", msg_id=i) for i in range(3)]
    data = framed(*(q.to_wire() for q in queries))
    cut1, cut2 = 10, len(framed(queries[0].to_wire())) + 5
    stream.feed(0, T0, data[:cut1], 1)
    stream.feed(0, T0 + 1 * MS, data[cut1:cut2], 2)
    stream.feed(0, T0 + 2 * MS, data[cut2:], 3)
    stream.close(T0 + 3 * MS)
    ts = {t.qname: (t.ts_ns, t.query_packet) for t in rig.done()}
    assert ts == {"n0.example": (T0, 1), "n1.example": (T0 + MS, 2),
                  "n2.example": (T0 + 2 * MS, 3)}


def test_tcp_byte_by_byte() -> None:
    rig, stream = tcp_rig()
    q = make_query()
    data = framed(q.to_wire(), make_query("x.example", msg_id=3).to_wire())
    for i, byte in enumerate(data):
        stream.feed(0, T0 + i, bytes([byte]), 100 + i)
    stream.close(T0 + len(data))
    t1, t2 = rig.done()
    assert (t1.ts_ns, t1.query_packet) == (T0, 100)
    second = len(framed(q.to_wire()))
    assert (t2.ts_ns, t2.query_packet) == (T0 + second, 100 + second)


def test_tcp_gap_stops_that_direction() -> None:
    rig, stream = tcp_rig()
    q1, q2 = make_query("a.example", msg_id=1), make_query("b.example", msg_id=2)
    stream.feed(0, T0, framed(q1.to_wire(), q2.to_wire()), 1)
    r1 = framed(make_response(q1, ("a.example.", "A", "192.0.2.1")))
    stream.feed(1, T0 + MS, r1[:8], 2)
    stream.gap(1, T0 + 2 * MS, 100)
    stream.feed(1, T0 + 3 * MS, r1[8 + 100:] + framed(make_response(q2)), 3)
    stream.close(T0 + 4 * MS)
    t1, t2 = rig.done()
    # too little of the first response came before the gap to read its header
    assert (t1.responses, t1.rcode, t1.latency_ns, t1.answers) == (0, None, None, [])
    assert t2.responses == 0
    assert any("not captured" in w for w in stream.warnings)
    assert any("cut short by a gap" in w for w in stream.warnings)


def test_tcp_gap_inside_a_response_salvages_its_question() -> None:
    rig, stream = tcp_rig()
    q = make_query()
    stream.feed(0, T0, framed(q.to_wire()), 1)
    r = framed(make_response(q, ("api.roc.test.", "A", "127.0.0.10")))
    stream.feed(1, T0 + MS, r[:-3], 2)
    stream.gap(1, T0 + 2 * MS, 3)
    stream.feed(1, T0 + 3 * MS, b"\x00\x10" + b"x" * 16, 3)  # ignored after the gap
    stream.close(T0 + 4 * MS)
    [t] = rig.done()
    assert (t.responses, t.rcode, t.latency_ns, t.answers) == (1, "NOERROR", MS, [])
    assert t.response_packet == 2


def test_tcp_connection_ending_inside_a_message() -> None:
    rig, stream = tcp_rig()
    q = make_query()
    q.use_edns(0)
    stream.feed(0, T0, framed(q.to_wire())[:-4], 1)  # cut inside the OPT record
    stream.close(T0 + MS)
    [t] = rig.done()  # header and name were whole: the query still counts
    assert t.qname == "api.roc.test"
    [w] = stream.warnings
    assert "cut short by the end of the connection" in w


def test_tcp_malformed_message_goes_to_the_stream_warnings() -> None:
    rig, stream = tcp_rig()
    stream.feed(0, T0, framed(b"\x00\x01\x02"), 9)
    stream.feed(0, T0 + 1, framed(make_query().to_wire()), 10)  # framing continues
    stream.close(T0 + 2)
    [t] = rig.done()
    assert t.query_packet == 10
    [w] = stream.warnings
    assert w.startswith(f"packet 9: malformed DNS message from {CLIENT} (")
    assert rig.dns.warnings == []


def test_tcp_and_udp_are_separate_transactions() -> None:
    rig, stream = tcp_rig()
    q = make_query()
    rig.query(T0, q, 1)
    stream.feed(0, T0 + 1, framed(q.to_wire()), 2)
    stream.close(T0 + 2)
    assert sorted(t.transport for t in rig.done()) == ["tcp", "udp"]


# -- property tests ----------------------------------------------------------------------

def _valid_messages() -> list[bytes]:
    q = make_query("www.example.com", "AAAA")
    q.use_edns(0, payload=1232, options=[dns.edns.GenericOption(10, b"12345678")])
    return [
        q.to_wire(),
        make_response(q, ("www.example.com.", "CNAME", "edge.example.net."),
                      ("edge.example.net.", "AAAA", "2001:db8::1")),
        make_response(make_query("example.com", "MX"), ("example.com.", "MX", "10 mx.example.com."),
                      ("example.com.", "TXT", '"hello world"'),
                      ("example.com.", "SOA", "ns. host. 1 2 3 4 5")),
    ]


VALID = _valid_messages()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message with random byte changes, cuts and insertions."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.integers(0, 2))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == 0 and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == 1:
            del data[pos:]
        else:
            data[pos:pos] = draw(st.binary(max_size=8))
    if draw(st.booleans()) and len(data) >= 3:  # flip QR so both paths are exercised
        data[2] ^= 0x80
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80), mutated()), min_size=1, max_size=6))
def test_udp_never_raises(payloads: list[bytes]) -> None:
    out: list[DnsTransaction] = []
    analyzer = DnsAnalyzer(out.append, timeout_ns=10)
    for i, payload in enumerate(payloads):
        src, dst = (CLIENT, SERVER) if i % 2 == 0 else (SERVER, CLIENT)
        analyzer.on_udp(T0 + i, src, dst, VALID[0], 2 * i)
        analyzer.on_udp(T0 + i, dst, src, payload, 2 * i + 1)
        analyzer.expire(T0 + i)
    analyzer.finish()
    assert analyzer._open == {} and analyzer._by_id == {}
    assert len(out) == analyzer.stats["transactions"]
    for t in out:
        assert isinstance(t.qname, str) and isinstance(t.qtype, str)
        assert all(isinstance(a, str) for a in t.answers)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.one_of(st.binary(max_size=40), mutated()),
                          st.integers(0, 12)), min_size=1, max_size=8))
def test_tcp_stream_never_raises(segments: list[tuple[int, bytes, int]]) -> None:
    out: list[DnsTransaction] = []
    analyzer = DnsAnalyzer(out.append)
    stream = analyzer.tcp_stream(CLIENT, SERVER)
    for i, (direction, data, action) in enumerate(segments):
        if action == 0:
            stream.gap(direction, T0 + i, len(data) + 1)
        elif action < 4:
            stream.feed(direction, T0 + i, framed(data), i)
        else:
            stream.feed(direction, T0 + i, data, i)
    stream.close(T0 + 100)
    stream.feed(0, T0 + 101, framed(VALID[0]), 99)  # after close: ignored
    assert not stream._keys
    analyzer.finish()
    assert all(t.transport == "tcp" for t in out)


@settings(max_examples=300, deadline=None)
@given(st.one_of(mutated(), st.binary(min_size=12, max_size=60)))
def test_question_reading_agrees_with_dnspython(wire: bytes) -> None:
    """Where dnspython reads a first question, ours reads the same one, and vice versa."""
    try:
        theirs = dns.message.from_wire(wire, question_only=True).question
    except Exception:
        theirs = None
    analyzer = DnsAnalyzer(lambda t: None)
    query = bytearray(wire)
    if len(query) >= 4:
        query[2] &= 0x7F  # as a query, so that ours starts a transaction from it
    analyzer.on_udp(T0, CLIENT, SERVER, bytes(query), 1)
    ours = next(iter(analyzer._open.values())).rec if analyzer._open else None
    qdcount = struct.unpack_from("!H", wire, 4)[0] if len(wire) >= 12 else 0
    if theirs:
        assert ours is not None
        assert ours.qname == theirs[0].name.to_text(omit_final_dot=True)
        assert ours.qtype == dns.rdatatype.to_text(theirs[0].rdtype)
    elif qdcount == 1 and not wire[2] & 0x78:  # opcode QUERY (dnspython reads UPDATE apart)
        assert ours is None


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_answers_agree_with_dnspython(wire: bytes) -> None:
    """Where dnspython reads the whole response, our answers are its answers, in order."""
    try:
        msg = dns.message.from_wire(wire, one_rr_per_rrset=True, ignore_trailing=True)
    except Exception:
        return
    if not msg.question or not msg.flags & dns.flags.QR:
        return
    rig = Rig()
    question = msg.question[0]
    q = make_query(question.name.to_text(), question.rdtype, msg_id=msg.id)
    rig.query(T0, q, 1)
    rig.answer(T0 + 1, wire, 2)
    [t] = rig.done()
    assert t.responses == 1
    assert t.answers == [rdata_text(rd) for rrset in msg.answer for rd in rrset]
    assert t.rcode == dns.rcode.to_text(msg.rcode())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=6))
def test_name_text_matches_dnspython(labels: list[bytes]) -> None:
    if sum(len(label) + 1 for label in labels) + 1 > 255:
        return
    assert name_text(labels) == dns.name.Name([*labels, b""]).to_text(omit_final_dot=True)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0, 1, 2]), st.data())
def test_tcp_any_segmentation_gives_the_same_transactions(which: int,
                                                          data: st.DataObject) -> None:
    """However the bytes are cut, the same messages come out, timed by their first byte."""
    q = make_query("seg.example", msg_id=which)
    msgs = [q.to_wire(), make_query("other.example", msg_id=9).to_wire()]
    stream_bytes = framed(*msgs)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(stream_bytes) - 1), max_size=8))))
    rig, stream = tcp_rig()
    bounds = [0, *cuts, len(stream_bytes)]
    for i in range(len(bounds) - 1):
        stream.feed(0, T0 + bounds[i], stream_bytes[bounds[i]:bounds[i + 1]], bounds[i])
    stream.close(T0 + len(stream_bytes))
    txns = rig.done()
    second = len(framed(msgs[0]))
    start_of_second = max(b for b in bounds[:-1] if b <= second)
    assert [(t.qname, t.ts_ns) for t in txns] == [
        ("seg.example", T0), ("other.example", T0 + start_of_second)]
    assert stream.warnings == []


# -- third-party captures (optional) -----------------------------------------------------

def _udp_and_tcp_payloads(path: Path) -> list[tuple[int, str, str, str, bytes, int, int]]:
    """(ts_ns, src, dst, proto, payload, sport, packet) of DNS packets in a capture."""
    dpkt = pytest.importorskip("dpkt")
    out = []
    with path.open("rb") as f:
        reader = dpkt.pcap.Reader(f)
        for number, (ts, buf) in enumerate(reader, 1):
            ip = dpkt.ethernet.Ethernet(buf).data
            l4 = ip.data
            if not isinstance(l4, dpkt.udp.UDP | dpkt.tcp.TCP) or 53 not in (l4.sport, l4.dport):
                continue
            family = socket.AF_INET6 if len(ip.src) == 16 else socket.AF_INET
            src = f"{socket.inet_ntop(family, ip.src)}:{l4.sport}"
            dst = f"{socket.inet_ntop(family, ip.dst)}:{l4.dport}"
            proto = "udp" if isinstance(l4, dpkt.udp.UDP) else "tcp"
            out.append((round(ts * S), src, dst, proto, bytes(l4.data), l4.sport, number))
    return out


def _run_capture(name: str) -> tuple[list[DnsTransaction], DnsAnalyzer]:
    path = THIRDPARTY / name
    if not path.exists():
        pytest.skip("third-party captures absent")
    out: list[DnsTransaction] = []
    analyzer = DnsAnalyzer(out.append)
    streams: dict[tuple[str, str], DnsTcpStream] = {}
    for ts, src, dst, proto, payload, sport, number in _udp_and_tcp_payloads(path):
        if proto == "udp":
            analyzer.on_udp(ts, src, dst, payload, number)
        elif payload:
            client, server, direction = (dst, src, 1) if sport == 53 else (src, dst, 0)
            if (client, server) not in streams:
                streams[client, server] = analyzer.tcp_stream(client, server)
            streams[client, server].feed(direction, ts, payload, number)
    for stream in streams.values():
        stream.close(0)
        assert stream.warnings == []
    analyzer.finish()
    return sorted(out, key=lambda t: t.ts_ns), analyzer


def test_thirdparty_wireshark_dns_cap_agrees_with_tshark() -> None:
    txns, analyzer = _run_capture("wireshark_dns.cap")
    assert len(txns) == 19 and all(t.responses == 1 for t in txns)
    assert analyzer.warnings == []
    # tshark -Y dns.flags.response==1 -T fields -e frame.number -e dns.time
    assert txns[0].latency_ns == pytest.approx(530_000, abs=1_000)
    assert txns[1].latency_ns == pytest.approx(832_133_000, abs=1_000)
    nx = [t for t in txns if t.qname == "www.example.notginh"]
    assert [t.rcode for t in nx] == ["NXDOMAIN"]
    mx = next(t for t in txns if t.qtype == "MX")
    assert "10 smtp5.google.com" in mx.answers


def test_thirdparty_zeek_two_responses() -> None:
    [t], _ = _run_capture("zeek_dns_two_responses.pcap")
    assert (t.qname, t.responses, t.response_packet) == ("www.cmu.edu", 2, 2)


def test_thirdparty_suricata_dns_over_tcp() -> None:
    txns, _ = _run_capture("suricata_dns_tcp.pcap")
    assert [(t.transport, t.qname, t.responses) for t in txns] == [
        ("tcp", "google.com", 1), ("tcp", "aol.com", 1)]
    assert len(txns[0].answers) == 11 and txns[1].answers[0] == "205.188.100.58"


# -- rdata read without dnspython ---------------------------------------------------------

def _answer_message(rrs: list[tuple[str, str]], compress: bool) -> bytes:
    """A response with these (type, rdata) answers, names compressed by dnspython's
    renderer or written out in full."""
    owner = dns.name.from_text("svc.example.com.")
    q = make_query("svc.example.com", "A")
    if compress:
        r = dns.message.make_response(q)
        for rdtype, text in rrs:
            r.answer.append(dns.rrset.from_text(owner, 60, "IN", rdtype, text))
        return r.to_wire()
    wire = bytearray(dns.message.make_response(q).to_wire())
    struct.pack_into("!H", wire, 6, len(rrs))
    for rdtype, text in rrs:
        rd = dns.rdata.from_text("IN", rdtype, text)
        body = rd.to_wire()  # no compression table: names in full
        wire += owner.to_wire() + struct.pack("!HHIH", rd.rdtype, 1, 60, len(body)) + body
    return bytes(wire)


RDATA_SAMPLES = [
    ("A", "192.0.2.1"), ("AAAA", "2001:db8::1"), ("AAAA", "::ffff:192.0.2.1"),
    ("AAAA", "::"), ("AAAA", "2001:db8:0:0:1:0:0:1"), ("CNAME", "edge.example.com."),
    ("CNAME", "svc.example.com."), ("CNAME", "."), ("CNAME", r"we\.ird\032name.example."),
    ("NS", "ns1.example.com."), ("PTR", "host.example.net."),
    ("TXT", '"v=spf1 -all" "two"'), ("CAA", '0 issue "ca.example"'),
    ("HTTPS", '1 . alpn="h2,h3" port=443'), ("HTTPS", '1 svc.example.com. alpn="h3"'),
    ("SVCB", "0 svc.example.com."), ("MX", "10 mail.example.com."),
]


@st.composite
def answer_messages(draw: st.DrawFn) -> bytes:
    """Responses with a few answers of the types read without dnspython, compressed or
    not, sometimes with bytes changed."""
    rrs = draw(st.lists(st.sampled_from(RDATA_SAMPLES), min_size=1, max_size=4))
    data = bytearray(_answer_message(rrs, draw(st.booleans())))
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(12, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    return bytes(data)


def _dnspython_answers(wire: bytes) -> tuple[list[str], int, str | None]:
    """What ``DnsAnalyzer._answers`` returns when dnspython decodes every rdata."""
    from netdiag.protocols import dns as nd

    analyzer = DnsAnalyzer(lambda _t: None)
    saved = nd._NAME_TYPES, nd._MEMO_TYPES
    nd._NAME_TYPES, nd._MEMO_TYPES = frozenset(), frozenset()  # type: ignore[misc]
    try:
        return analyzer._answers(wire, _after_question(wire), _ancount(wire), 0)
    finally:
        nd._NAME_TYPES, nd._MEMO_TYPES = saved  # type: ignore[misc]


def _ancount(wire: bytes) -> int:
    return struct.unpack_from("!H", wire, 6)[0]


def _after_question(wire: bytes) -> int:
    from netdiag.protocols.dns import _skip_name

    return _skip_name(wire, 12) + 4


@settings(max_examples=400, deadline=None)
@given(answer_messages())
def test_rdata_read_without_dnspython_matches_it(wire: bytes) -> None:
    from netdiag.protocols.dns import _Malformed

    try:
        start = _after_question(wire)
    except _Malformed:
        return
    analyzer = DnsAnalyzer(lambda _t: None)
    got = analyzer._answers(wire, start, _ancount(wire), 0)
    assert got == _dnspython_answers(wire)
    # a second time, from the memo
    assert analyzer._answers(wire, start, _ancount(wire), 0) == got


def test_rdata_samples_read_without_dnspython() -> None:
    """Every sample, compressed and not, once unchanged (the property test mutates)."""
    for compress in (True, False):
        wire = _answer_message(RDATA_SAMPLES, compress)
        got = DnsAnalyzer(lambda _t: None)._answers(wire, _after_question(wire),
                                                   len(RDATA_SAMPLES), 0)
        assert got == _dnspython_answers(wire)
        assert len(got[0]) == len(RDATA_SAMPLES) and got[2] is None


def _one_answer(rdtype: int, rdata: bytes, rdclass: int = 1) -> bytes:
    wire = bytearray(dns.message.make_response(make_query("svc.example.com", "A")).to_wire())
    struct.pack_into("!H", wire, 6, 1)
    return bytes(wire + b"\xc0\x0c" + struct.pack("!HHIH", rdtype, rdclass, 60, len(rdata))
                 + rdata)


@pytest.mark.parametrize(("rdtype", "rdata"), [
    (5, b"\x04edge\xc0\x0c\x00"),          # a byte after the name: rdata longer than it
    (5, b"\x04edge\x07exam"),              # the name runs past the rdata
    (5, b"\xc0\x30"),                      # a pointer forwards
    (5, b"\x03www\xc0\x2b"),               # a pointer into this very name
    (2, b"\x00"), (12, b"\x02ab\xc0\x10"),  # root; a pointer into the question name
    (1, b"\x01\x02\x03"), (1, b"\x01\x02\x03\x04\x05"), (28, bytes(15)),  # bad lengths
    (65, b"\x00\x01\xc0\x0c\x00"),         # HTTPS with a compressed target
    (65, b"\x00\x01\x00\x00\x01\x00\x03\x02h3"),
])
@pytest.mark.parametrize("rdclass", [1, 3])
def test_rdata_edge_cases_match_dnspython(rdtype: int, rdata: bytes, rdclass: int) -> None:
    wire = _one_answer(rdtype, rdata, rdclass)
    analyzer = DnsAnalyzer(lambda _t: None)
    got = analyzer._answers(wire, _after_question(wire), 1, 0)
    assert got == _dnspython_answers(wire)
    assert analyzer._answers(wire, _after_question(wire), 1, 0) == got


def test_rdata_memo_never_serves_a_name_read_elsewhere_in_the_message() -> None:
    """Rdata naming the question name through a compression pointer (MX reads it; HTTPS
    must not be compressed, which dnspython refuses): the same rdata bytes in messages
    with other question names, through one analyzer, decode as dnspython decodes each."""
    analyzer = DnsAnalyzer(lambda _t: None)
    for rdtype, rdata in ((15, b"\x00\x0a\xc0\x0c"), (65, b"\x00\x01\xc0\x0c\x00")):
        texts = []
        for qname in ("one.example", "two.example"):
            wire = bytearray(dns.message.make_response(make_query(qname, "A")).to_wire())
            struct.pack_into("!H", wire, 6, 1)
            wire += b"\xc0\x0c" + struct.pack("!HHIH", rdtype, 1, 60, len(rdata)) + rdata
            got = analyzer._answers(bytes(wire), _after_question(bytes(wire)), 1, 0)
            assert got == _dnspython_answers(bytes(wire))
            texts.append(got[0])
        assert rdtype != 15 or texts[0] != texts[1]
