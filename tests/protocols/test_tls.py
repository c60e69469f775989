"""Tests of the TLS record/handshake analyzer (netdiag.protocols.tls).

Three kinds of input: hand-built records (struct), genuine handshakes produced by
Python's ssl module over memory BIOs (no sockets), and, when present, the
third-party captures under ../shared/captures/thirdparty/.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import random
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netdiag.protocols.tls import HRR_RANDOM, TlsAnalyzer, looks_like_tls
from netdiag.tls.names import cipher_name, record_overhead, version_name

MS = 1_000_000

# ---------------------------------------------------------------------------------
# Hand-built TLS records
# ---------------------------------------------------------------------------------


def record(ctype: int, body: bytes, version: int = 0x0303) -> bytes:
    """One TLS record."""
    return struct.pack("!BHH", ctype, version, len(body)) + body


def handshake(mtype: int, body: bytes) -> bytes:
    """One handshake message (type + 24-bit length + body)."""
    return struct.pack("!B", mtype) + len(body).to_bytes(3, "big") + body


def ext(etype: int, data: bytes) -> bytes:
    """One hello extension."""
    return struct.pack("!HH", etype, len(data)) + data


def vec8(data: bytes) -> bytes:
    return bytes([len(data)]) + data


def vec16(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def sni_ext(name: str) -> bytes:
    return ext(0, vec16(b"\x00" + vec16(name.encode())))


def alpn_ext(protocols: list[str]) -> bytes:
    return ext(16, vec16(b"".join(vec8(p.encode()) for p in protocols)))


def client_hello(*, sni: str | None = None, alpn: list[str] | None = None, sid: bytes = b"",
                 rnd: bytes = bytes(range(32)), ticket: bytes | None = None,
                 psk: bool = False, versions: list[int] | None = None,
                 extra: bytes = b"") -> bytes:
    """A ClientHello handshake message."""
    exts = b""
    if sni is not None:
        exts += sni_ext(sni)
    if alpn is not None:
        exts += alpn_ext(alpn)
    if ticket is not None:
        exts += ext(35, ticket)
    if versions is not None:
        exts += ext(43, vec8(b"".join(struct.pack("!H", v) for v in versions)))
    exts += extra
    if psk:  # pre_shared_key must be last
        exts += ext(41, vec16(vec16(b"ticket") + b"\0\0\0\0") + vec16(vec8(bytes(32))))
    body = (b"\x03\x03" + rnd + vec8(sid) + vec16(b"\x13\x01\x13\x02\xc0\x2f")
            + vec8(b"\x00") + vec16(exts))
    return handshake(1, body)


def server_hello(*, cipher: int = 0x1301, sid: bytes = b"", rnd: bytes = b"\x11" * 32,
                 version: int | None = None, alpn: str | None = None, psk: bool = False,
                 legacy: int = 0x0303, with_extensions: bool = True) -> bytes:
    """A ServerHello message; ``version`` adds supported_versions."""
    exts = b""
    if version is not None:
        exts += ext(43, struct.pack("!H", version))
    if alpn is not None:
        exts += alpn_ext([alpn])
    if psk:
        exts += ext(41, b"\x00\x00")
    body = struct.pack("!H", legacy) + rnd + vec8(sid) + struct.pack("!HB", cipher, 0)
    if with_extensions:
        body += vec16(exts)
    return handshake(2, body)


def hello_retry(cipher: int = 0x1302) -> bytes:
    return server_hello(cipher=cipher, rnd=HRR_RANDOM, version=0x0304)


CCS = record(20, b"\x01")


def appdata(n: int) -> bytes:
    return record(23, bytes(n))


class Feeder:
    """Feeds an analyzer with increasing timestamps (1 ms per segment) and packet numbers."""

    def __init__(self, analyzer: TlsAnalyzer | None = None) -> None:
        self.an = analyzer if analyzer is not None else TlsAnalyzer()
        self.ts = 0
        self.pkt = 0

    def send(self, direction: int, data: bytes, chunk: int | None = None,
             step_ns: int = MS) -> tuple[int, int]:
        """Send ``data`` as one segment (or ``chunk``-byte segments); returns the
        (ts, packet) of the first segment."""
        first: tuple[int, int] | None = None
        size = chunk or max(len(data), 1)
        for i in range(0, len(data), size):
            self.ts += step_ns
            self.pkt += 1
            if first is None:
                first = (self.ts, self.pkt)
            self.an.feed(direction, self.ts, data[i:i + size], self.pkt)
        assert first is not None
        return first

    def close(self) -> TlsAnalyzer:
        self.an.close(self.ts + MS)
        return self.an


# ---------------------------------------------------------------------------------
# looks_like_tls, names
# ---------------------------------------------------------------------------------


def test_looks_like_tls() -> None:
    ch = record(22, client_hello(sni="a.example"), version=0x0301)
    assert looks_like_tls(ch)
    assert looks_like_tls(ch[:3])
    assert looks_like_tls(ch[:5])
    assert not looks_like_tls(ch[:2])
    assert not looks_like_tls(b"GET / HTTP/1.1\r\n")
    assert not looks_like_tls(record(23, b"x" * 10))
    assert not looks_like_tls(b"\x16\x03\x05\x00\x10\x01")          # version 3.5
    assert not looks_like_tls(b"\x16\x03\x01\xff\xff\x01")          # too long
    assert not looks_like_tls(b"\x16\x03\x01\x00\x10\x02")          # not a ClientHello
    assert looks_like_tls(b"\x80\x2e\x01\x03\x01\x00\x15")          # SSLv2 compat
    assert not looks_like_tls(b"\x80\x2e\x01\x00\x02\x00\x15")      # pure SSLv2


def test_names() -> None:
    assert cipher_name(0x1302) == "TLS_AES_256_GCM_SHA384"
    assert cipher_name(0xC02F) == "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    assert cipher_name(0xCCA8) == "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"
    assert cipher_name(0x1234) == "0x1234"
    assert cipher_name(0xABCD) == "0xabcd"
    assert version_name(0x0303) == "TLS 1.2"
    assert version_name(0x0300) == "SSL 3.0"
    assert version_name(0x0304) == "TLS 1.3"
    assert record_overhead(0x0304, 0x1301) == 17
    assert record_overhead(0x0303, 0xC02F) == 24
    assert record_overhead(0x0303, 0xCCA8) == 16
    assert record_overhead(0x0303, 0xC013) is None  # CBC
    assert record_overhead(None, None) is None


# ---------------------------------------------------------------------------------
# Hand-built handshakes
# ---------------------------------------------------------------------------------


def test_client_hello_fields() -> None:
    f = Feeder()
    ts, pkt = f.send(0, record(22, client_hello(sni="api.roc.test", alpn=["h2", "http/1.1"],
                                                ticket=b"T" * 40), version=0x0301))
    info = f.an.info
    assert info.sni == "api.roc.test"
    assert info.alpn_offered == ["h2", "http/1.1"]
    assert info.client_random == bytes(range(32))
    assert info.session_ticket_offered
    assert (info.client_hello_ns, info.client_hello_packet) == (ts, pkt)
    assert info.version is None and info.resumed is None
    assert f.an.warnings == []


@pytest.mark.parametrize(("kwargs", "offered"), [
    ({"ticket": b""}, False), ({"ticket": b"x"}, True), ({"psk": True}, True), ({}, False),
])
def test_session_ticket_offered(kwargs: dict, offered: bool) -> None:
    f = Feeder()
    f.send(0, record(22, client_hello(**kwargs)))
    assert f.an.info.session_ticket_offered is offered


def tls13_handshake(f: Feeder, *, psk: bool = False, cipher: int = 0x1302,
                    alpn: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """A TLS 1.3 handshake: returns the (ts, packet) of the interesting flights."""
    out = {}
    out["ch"] = f.send(0, record(22, client_hello(sni="x.test", alpn=alpn, psk=psk,
                                                  versions=[0x0304, 0x0303]), version=0x0301))
    out["sh"] = f.send(1, record(22, server_hello(cipher=cipher, version=0x0304, psk=psk))
                       + CCS + appdata(40) + appdata(900) + appdata(300) + appdata(53))
    out["fin"] = f.send(0, CCS + appdata(53))
    return out


def test_tls13_full() -> None:
    f = Feeder()
    t = tls13_handshake(f, alpn=["h2"])
    info = f.an.info
    assert info.version == "TLS 1.3"
    assert info.cipher == "TLS_AES_256_GCM_SHA384"
    assert info.resumed is False
    assert info.hello_retry is False
    assert info.alpn is None  # encrypted in 1.3
    assert (info.client_hello_ns, info.client_hello_packet) == t["ch"]
    assert (info.finished_ns, info.finished_packet) == t["fin"]
    assert info.handshake_ns == t["fin"][0] - t["ch"][0]
    # application data afterwards does not move the Finished
    f.send(0, appdata(200))
    f.send(1, appdata(500))
    assert (info.finished_ns, info.finished_packet) == t["fin"]
    f.close()
    assert f.an.warnings == []
    assert len(f.an.requests) == 1


def test_tls13_psk_resumed() -> None:
    f = Feeder()
    tls13_handshake(f, psk=True)
    assert f.an.info.resumed is True
    assert f.an.info.session_ticket_offered


def test_tls13_finished_in_separate_segment_after_ccs() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(22, server_hello(version=0x0304)) + CCS)
    f.send(1, appdata(1000))
    f.send(0, CCS)
    fin = f.send(0, appdata(53))
    assert f.an.info.finished_ns == fin[0]


def test_hello_retry_request() -> None:
    f = Feeder()
    ch1 = f.send(0, record(22, client_hello(sni="hrr.test", versions=[0x0304]), version=0x0301))
    f.send(1, record(22, hello_retry()) + CCS)
    assert f.an.info.hello_retry
    assert f.an.info.finished_ns is None
    f.send(0, CCS + record(22, client_hello(sni="hrr.test", versions=[0x0304],
                                            rnd=b"\x07" * 32)))
    # no client Finished before the real ServerHello
    assert f.an.info.finished_ns is None
    f.send(1, record(22, server_hello(cipher=0x1301, version=0x0304)) + appdata(800))
    fin = f.send(0, appdata(53))
    info = f.an.info
    assert info.hello_retry
    assert info.version == "TLS 1.3"
    assert info.cipher == "TLS_AES_128_GCM_SHA256"
    assert info.client_hello_ns == ch1[0]
    assert info.client_random == bytes(range(32))  # the first ClientHello's
    assert info.finished_ns == fin[0]
    assert info.sni == "hrr.test"
    assert info.resumed is False


def tls12_full(f: Feeder, *, cipher: int = 0xC02F, alpn: str | None = None,
               sid: bytes = b"", server_sid: bytes = b"\x22" * 32,
               nst: bool = False) -> dict[str, tuple[int, int]]:
    out = {}
    out["ch"] = f.send(0, record(22, client_hello(alpn=["h2", "http/1.1"], sid=sid),
                                 version=0x0301))
    flight = (server_hello(cipher=cipher, sid=server_sid, alpn=alpn)
              + handshake(11, b"\x00" * 900) + handshake(12, b"\x01" * 300)
              + handshake(14, b""))
    out["sh"] = f.send(1, record(22, flight))
    out["cfin"] = f.send(0, record(22, handshake(16, b"\x02" * 66)) + CCS
                         + record(22, b"\xaa" * 40))
    server = (record(22, handshake(4, b"\x03" * 200)) if nst else b"") + CCS
    out["sfin"] = f.send(1, server + record(22, b"\xbb" * 40))
    return out


def test_tls12_full() -> None:
    f = Feeder()
    t = tls12_full(f, alpn="h2")
    info = f.an.info
    assert info.version == "TLS 1.2"
    assert info.cipher == "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
    assert info.alpn == "h2"
    assert info.resumed is False
    assert (info.client_hello_ns, info.client_hello_packet) == t["ch"]
    assert (info.finished_ns, info.finished_packet) == t["sfin"]
    assert f.an.warnings == []


def test_tls12_full_with_ticket_and_split_flights() -> None:
    f = Feeder()
    t = tls12_full(f, nst=True)
    assert f.an.info.resumed is False
    assert f.an.info.finished_ns == t["sfin"][0]


def test_tls12_server_finished_first_byte_time() -> None:
    # The Finished record starts in a later segment than the CCS.
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(22, server_hello(cipher=0xC02F) + handshake(11, b"") + handshake(14, b"")))
    f.send(0, record(22, handshake(16, b"k" * 33)) + CCS + record(22, b"f" * 40))
    f.send(1, CCS)
    fin_rec = record(22, b"f" * 40)
    fin = f.send(1, fin_rec[:3])
    f.send(1, fin_rec[3:])
    assert (f.an.info.finished_ns, f.an.info.finished_packet) == fin


def test_tls12_abbreviated_by_session_id() -> None:
    f = Feeder()
    sid = b"\x42" * 32
    f.send(0, record(22, client_hello(sid=sid)))
    f.send(1, record(22, server_hello(cipher=0xC030, sid=sid)) + CCS + record(22, b"s" * 40))
    assert f.an.info.resumed is True
    assert f.an.info.finished_ns is None  # the client's Finished ends it
    fin = f.send(0, CCS + record(22, b"c" * 40))
    assert f.an.info.finished_ns == fin[0]
    assert f.an.info.cipher == "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"


def test_tls12_abbreviated_by_ticket() -> None:
    # Session ticket resumption: the server does not echo the id but sends its
    # CCS before the client's.
    f = Feeder()
    f.send(0, record(22, client_hello(sid=b"\x01" * 32, ticket=b"T" * 100)))
    f.send(1, record(22, server_hello(cipher=0xC02F, sid=b"")))
    assert f.an.info.resumed is False
    f.send(1, record(22, handshake(4, b"\x05" * 150)) + CCS + record(22, b"s" * 40))
    assert f.an.info.resumed is True
    fin = f.send(0, CCS + record(22, b"c" * 40))
    assert f.an.info.finished_ns == fin[0]


def test_session_id_not_echoed_is_full() -> None:
    f = Feeder()
    tls12_full(f, sid=b"\x01" * 32, server_sid=b"\x02" * 32)
    assert f.an.info.resumed is False


def test_unknown_cipher_and_old_version() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(22, server_hello(cipher=0x1234, legacy=0x0301)))
    assert f.an.info.cipher == "0x1234"
    assert f.an.info.version == "TLS 1.0"


def test_server_hello_without_extensions() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello(), version=0x0300))
    f.send(1, record(22, server_hello(cipher=0x000A, legacy=0x0300, with_extensions=False),
                     version=0x0300))
    assert f.an.info.version == "SSL 3.0"
    assert f.an.info.cipher == "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
    assert f.an.warnings == []


def test_messages_split_over_records_and_segments() -> None:
    ch = client_hello(sni="split.test", alpn=["h2"])
    recs = b"".join(record(22, ch[i:i + 7]) for i in range(0, len(ch), 7))
    f = Feeder()
    first = f.send(0, recs, chunk=3)
    assert f.an.info.sni == "split.test"
    assert f.an.info.alpn_offered == ["h2"]
    assert f.an.info.client_hello_ns == first[0]
    # ServerHello and the rest of a 1.2 flight in one record, cut across segments
    flight = record(22, server_hello(cipher=0xC02B, alpn="h2") + handshake(11, b"c" * 5000)
                    + handshake(14, b""))
    f.send(1, flight, chunk=1)
    assert f.an.info.cipher == "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
    assert f.an.info.alpn == "h2"
    assert f.an.warnings == []


def test_large_certificate_message_over_many_records() -> None:
    cert = handshake(11, b"z" * 40000)
    body = server_hello(cipher=0xC02F) + cert + handshake(14, b"")
    recs = b"".join(record(22, body[i:i + 16384]) for i in range(0, len(body), 16384))
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, recs, chunk=1448)
    f.send(0, record(22, handshake(16, b"k" * 33)) + CCS + record(22, b"f" * 40))
    fin = f.send(1, CCS + record(22, b"f" * 40))
    assert f.an.info.finished_ns == fin[0]
    assert f.an.warnings == []


# ---------------------------------------------------------------------------------
# Alerts, garbage, gaps
# ---------------------------------------------------------------------------------


def test_plaintext_alert_from_server() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(21, b"\x02\x28"))
    f.close()
    assert f.an.info.alert == "fatal handshake_failure from server"
    assert f.an.info.finished_ns is None


def test_plaintext_alert_from_client_after_server_hello() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(22, server_hello(version=0x0304)) + appdata(900))
    f.send(0, record(21, b"\x02\x30"))  # unknown_ca
    assert f.an.info.alert == "fatal unknown_ca from client"


def test_encrypted_alert_and_first_alert_wins() -> None:
    f = Feeder()
    tls12_full(f)
    f.send(0, record(21, b"\x99" * 26))
    assert f.an.info.alert == "encrypted from client"
    f.send(1, record(21, b"\x01\x00"))
    assert f.an.info.alert == "encrypted from client"


def test_unknown_alert_description_is_kept_by_its_number() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(21, b"\x01\xee"))
    assert f.an.info.alert == "warning unknown_238 from server"
    assert f.an.warnings == []


@pytest.mark.parametrize("level", [0, 3, 7, 255])
def test_alert_level_neither_warning_nor_fatal_is_flagged(level: int) -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.send(1, record(21, bytes([level, 0x28])))
    assert f.an.info.alert == f"invalid alert (level {level}, description 40) from server"
    assert len(f.an.warnings) == 1 and f"level {level}" in f.an.warnings[0]
    assert "malformed" in f.an.warnings[0]


def test_garbage_client_stream_warns() -> None:
    f = Feeder()
    f.send(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    f.send(0, b"more bytes")
    f.send(1, b"HTTP/1.1 200 OK\r\n\r\n")
    f.close()
    assert len(f.an.warnings) == 2
    assert "client stream is not TLS" in f.an.warnings[0]
    assert "server stream is not TLS" in f.an.warnings[1]
    assert f.an.requests == []


def test_sslv2_compatible_client_hello() -> None:
    """Read as the ClientHello it stands for (tests/protocols/test_tls_sslv2.py has more)."""
    f = Feeder()
    first = f.send(0, b"\x80\x2e\x01\x03\x01\x00\x15\x00\x00\x00\x10" + bytes(21)
                   + b"\x01" * 16)
    assert f.an.warnings == []
    assert (f.an.info.client_hello_ns, f.an.info.client_hello_packet) == first
    assert f.an.info.client_random == bytes(16) + b"\x01" * 16


def test_garbage_after_handshake_stops_that_direction_only() -> None:
    f = Feeder()
    tls13_handshake(f)
    f.send(0, appdata(100))
    f.send(1, appdata(300))
    f.send(1, b"\x00garbage!")
    f.send(1, appdata(300))
    f.send(0, appdata(100))
    f.close()
    assert len(f.an.warnings) == 1
    assert "server" in f.an.warnings[0]
    assert len(f.an.requests) == 2
    assert f.an.requests[1].first_byte_ns is None


def test_malformed_client_hello_warns() -> None:
    bad = handshake(1, b"\x03\x03" + bytes(32) + b"\x20")  # session id overruns
    f = Feeder()
    ts, _ = f.send(0, record(22, bad))
    assert any("malformed ClientHello" in w for w in f.an.warnings)
    assert f.an.info.client_hello_ns == ts


def test_gap_in_handshake_stops_direction() -> None:
    f = Feeder()
    f.send(0, record(22, client_hello()))
    f.an.gap(1, f.ts, 100)
    f.send(1, record(22, server_hello(version=0x0304)))
    assert f.an.info.version is None
    assert "not captured" in f.an.warnings[0]


def test_gap_inside_application_data_keeps_walking() -> None:
    f = Feeder()
    tls13_handshake(f)
    f.send(0, appdata(300))
    rec = appdata(5000)
    resp = f.send(1, rec[:1000])
    f.an.gap(1, f.ts, 2000)
    f.send(1, rec[3000:])
    f.send(0, appdata(300))
    f.send(1, appdata(700))
    f.close()
    assert len(f.an.requests) == 2
    assert f.an.requests[0].first_byte_ns == resp[0]
    assert f.an.requests[0].response_bytes == 5005 - 5 + 0  # record length, not bytes seen
    assert f.an.requests[1].first_byte_ns is not None
    assert len(f.an.warnings) == 1


def test_close_inside_record() -> None:
    f = Feeder()
    tls13_handshake(f)
    f.send(0, appdata(300))
    resp = f.send(1, appdata(10000)[:4000])
    f.close()
    assert "ended inside" in f.an.warnings[0]
    assert f.an.requests[0].first_byte_ns == resp[0]
    f.an.close(0)  # idempotent


def test_many_warnings_are_capped() -> None:
    an = TlsAnalyzer()
    for i in range(100):
        an.gap(i % 2, i, 10)
    for i in range(100):
        an.feed(i % 2, i, b"\xff" * 10, i)
    assert len(an.warnings) <= 21


# ---------------------------------------------------------------------------------
# Record hook for the decryption issue
# ---------------------------------------------------------------------------------


class Recorder(TlsAnalyzer):
    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.events: list[tuple] = []
        self.pieces: list[list[tuple[int, int, int]] | None] = []
        self.keep_bodies = keep

    def on_record(self, direction: int, content_type: int, version: int,
                  fragment: bytes | None, first_ts_ns: int, last_ts_ns: int,
                  first_packet: int, pieces: list[tuple[int, int, int]] | None = None) -> None:
        self.events.append((direction, content_type, version, fragment, first_ts_ns,
                            last_ts_ns, first_packet))
        self.pieces.append(pieces)


def test_on_record_hook_times_and_bodies() -> None:
    f = Feeder(Recorder())
    tls13_handshake(f)
    body = bytes(range(256)) * 10
    rec = record(23, body)
    first = f.send(1, rec, chunk=1000)  # 3 segments
    last_ts = f.ts
    an = f.an
    assert isinstance(an, Recorder)
    ev = an.events[-1]
    assert ev[:3] == (1, 23, 0x0303)
    assert ev[3] is None  # skipped body
    assert (ev[4], ev[5], ev[6]) == (first[0], last_ts, first[1])
    ch = an.events[0]
    assert ch[1] == 22 and ch[3] is not None and ch[3][0] == 1
    # with keep_bodies, application data bodies come through intact
    f2 = Feeder(Recorder(keep=True))
    tls13_handshake(f2)
    first2 = f2.send(1, rec, chunk=1000)
    assert f2.an.events[-1][3] == body  # type: ignore[attr-defined]
    assert len(f2.an.events) == len(an.events)  # type: ignore[attr-defined]
    # each segment's share of the body, with its own time and packet
    pieces = f2.an.pieces[-1]  # type: ignore[attr-defined]
    assert [p[0] for p in pieces] == [0, 995, 1995]
    assert pieces[0][1:] == first2
    assert len({p[1] for p in pieces}) == 3


def test_infer_requests_can_be_switched_off() -> None:
    an = TlsAnalyzer()
    an.infer_requests = False
    f = Feeder(an)
    tls13_handshake(f)
    f.send(0, appdata(300))
    f.send(1, appdata(300))
    f.close()
    assert an.requests == []


# ---------------------------------------------------------------------------------
# Genuine handshakes from Python's ssl module over memory BIOs
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cert_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed EC certificate for api.roc.test."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.roc.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("api.roc.test")]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("tlscert")
    cpath, kpath = d / "cert.pem", d / "key.pem"
    cpath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kpath.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    return str(cpath), str(kpath)


@dataclass
class Segment:
    direction: int
    ts: int
    packet: int
    data: bytes


@dataclass
class Wire:
    """What a capture point next to the client would see: segments with times."""

    mss: int = 1400
    now: int = 1_700_000_000 * 1_000_000_000
    segments: list[Segment] = field(default_factory=list)

    def send(self, direction: int, data: bytes) -> tuple[int, int]:
        """One flight at the current time (MSS-sized segments 10 µs apart)."""
        first = None
        for i in range(0, len(data), self.mss):
            seg = Segment(direction, self.now, len(self.segments) + 1, data[i:i + self.mss])
            self.segments.append(seg)
            if first is None:
                first = (seg.ts, seg.packet)
            self.now += 10_000
        assert first is not None
        return first

    def replay(self, analyzer: TlsAnalyzer | None = None, chunking: str = "segment",
               seed: int = 0) -> TlsAnalyzer:
        """Feed every segment; ``bytes`` feeds one byte at a time, ``random`` random
        pieces (each piece keeps its segment's time and packet number)."""
        an = analyzer if analyzer is not None else TlsAnalyzer()
        rng = random.Random(seed)
        for seg in self.segments:
            data = seg.data
            if chunking == "segment":
                an.feed(seg.direction, seg.ts, data, seg.packet)
                continue
            if chunking == "memoryview":
                an.feed(seg.direction, seg.ts, memoryview(bytearray(data)), seg.packet)
                continue
            i = 0
            while i < len(data):
                n = 1 if chunking == "bytes" else rng.randint(1, 300)
                an.feed(seg.direction, seg.ts, data[i:i + n], seg.packet)
                i += n
        an.close(self.now)
        return an


def make_contexts(cert_files: tuple[str, str], *, max_version: ssl.TLSVersion | None = None,
                  alpn: list[str] | None = None, server_alpn: list[str] | None = None,
                  ciphers: str | None = None, tickets: bool = True,
                  server_curve: str | None = None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(*cert_files)
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.verify_mode = ssl.CERT_NONE
    if max_version is not None:
        cctx.maximum_version = max_version
    if alpn is not None:
        cctx.set_alpn_protocols(alpn)
    if server_alpn is not None:
        sctx.set_alpn_protocols(server_alpn)
    if ciphers is not None:
        sctx.set_ciphers(ciphers)
    if not tickets:
        sctx.options |= ssl.OP_NO_TICKET
    if server_curve is not None:
        sctx.set_ecdh_curve(server_curve)
    return cctx, sctx


class TlsPair:
    """A client and a server SSLObject talking through a :class:`Wire`.

    Every flight is stamped at the capture point (next to the client): a server
    flight arrives ``rtt`` after the client flight that triggered it.
    """

    def __init__(self, cctx: ssl.SSLContext, sctx: ssl.SSLContext, wire: Wire | None = None,
                 session: ssl.SSLSession | None = None, rtt_ns: int = MS,
                 sni: str = "api.roc.test") -> None:
        self.wire = wire if wire is not None else Wire()
        self.rtt = rtt_ns
        self.ci, self.co, self.si, self.so = (ssl.MemoryBIO(), ssl.MemoryBIO(),
                                              ssl.MemoryBIO(), ssl.MemoryBIO())
        self.client = cctx.wrap_bio(self.ci, self.co, server_hostname=sni, session=session)
        self.server = sctx.wrap_bio(self.si, self.so, server_side=True)
        self.flights: list[tuple[int, int, int, bytes]] = []
        self.server_done = False

    def _flush(self, direction: int) -> tuple[int, int] | None:
        out, peer_in = (self.co, self.si) if direction == 0 else (self.so, self.ci)
        data = out.read()
        if not data:
            return None
        first = self.wire.send(direction, data)
        self.flights.append((direction, first[0], first[1], data))
        peer_in.write(data)
        return first

    def handshake(self) -> None:
        """Pump until the client has finished and sent its last flight (the server
        processes that flight only with the first request, as on a real network)."""
        client_done = False
        while not client_done:
            try:
                self.client.do_handshake()
                client_done = True
            except ssl.SSLWantReadError:
                pass
            self._flush(0)
            if client_done:
                break
            self.wire.now += self.rtt
            try:
                self.server.do_handshake()
                self.server_done = True
            except ssl.SSLWantReadError:
                pass
            self._flush(1)

    def _server_catch_up(self) -> None:
        if not self.server_done:
            self.server.do_handshake()
            self.server_done = True
            self.wire.now += self.rtt
            self._flush(1)  # TLS 1.3 NewSessionTickets

    def exchange(self, request: bytes, response: bytes, proc_ns: int = 20 * MS,
                 think_ns: int = 100_000) -> dict[str, tuple[int, int]]:
        """One request/response; returns the first (ts, packet) of each flight."""
        self.wire.now += think_ns
        self.client.write(request)
        req = self._flush(0)
        assert req is not None
        self._server_catch_up()
        got = b""
        while len(got) < len(request):
            got += self.server.read(65536)
        self.wire.now += proc_ns
        self.server.write(response)
        resp = self._flush(1)
        assert resp is not None
        last = (self.wire.segments[-1].ts, self.wire.segments[-1].packet)
        got = b""
        while len(got) < len(response):
            try:
                got += self.client.read(65536)
            except ssl.SSLWantReadError:
                break
        assert got == response
        return {"req": req, "resp": resp, "last": last}

    def close(self) -> None:
        self.wire.now += MS
        with contextlib.suppress(ssl.SSLWantReadError):
            self.client.unwrap()
        self._flush(0)


REQ = b"GET /v1/items HTTP/1.1\r\nHost: api.roc.test\r\nAccept: */*\r\n\r\n"


def resp(n: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n + b"x" * n


def first_flight(pair: TlsPair, direction: int, nth: int = 0) -> tuple[int, int]:
    fl = [f for f in pair.flights if f[0] == direction][nth]
    return fl[1], fl[2]


def test_real_tls13_full(cert_files: tuple[str, str]) -> None:
    cctx, sctx = make_contexts(cert_files, alpn=["h2", "http/1.1"], server_alpn=["h2"])
    pair = TlsPair(cctx, sctx)
    pair.handshake()
    assert pair.client.version() == "TLSv1.3"
    exchanges = [pair.exchange(REQ, resp(n)) for n in (100, 5000, 70000)]
    pair.close()
    an = pair.wire.replay()
    info = an.info
    assert info.version == "TLS 1.3"
    assert info.cipher == pair.client.cipher()[0]
    assert info.sni == "api.roc.test"
    assert info.alpn_offered == ["h2", "http/1.1"]
    assert info.alpn is None
    assert info.resumed is False
    assert info.hello_retry is False
    assert (info.client_hello_ns, info.client_hello_packet) == first_flight(pair, 0, 0)
    # the client's second flight: CCS + Finished
    assert (info.finished_ns, info.finished_packet) == first_flight(pair, 0, 1)
    assert info.alert is None  # close_notify is encrypted inside type 23 in TLS 1.3
    assert an.warnings == []
    assert len(an.requests) == 3
    for r, x in zip(an.requests, exchanges, strict=True):
        assert r.estimated
        assert r.ts_ns == x["req"][0]
        assert r.first_byte_ns == x["resp"][0]  # NewSessionTickets were not the answer
        assert r.last_byte_ns == x["last"][0]
        assert r.stream_id is None and r.method is None
    assert an.requests[2].chunks == 5  # 70 KB in 16 KB records
    assert an.requests[2].chunk_gaps_ns is not None
    assert len(an.requests[2].chunk_gaps_ns) == 4
    assert an.requests[0].chunk_gaps_ns is None


def test_real_tls12_full(cert_files: tuple[str, str]) -> None:
    cctx, sctx = make_contexts(cert_files, max_version=ssl.TLSVersion.TLSv1_2,
                               alpn=["h2", "http/1.1"], server_alpn=["h2", "http/1.1"],
                               ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    pair = TlsPair(cctx, sctx)
    pair.handshake()
    assert pair.client.version() == "TLSv1.2"
    xs = [pair.exchange(REQ, resp(n)) for n in (10, 20, 30, 40)]
    pair.close()
    an = pair.wire.replay()
    info = an.info
    assert info.version == "TLS 1.2"
    assert info.cipher == "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
    assert info.alpn == "h2"
    assert info.resumed is False
    assert info.client_hello_ns == first_flight(pair, 0, 0)[0]
    # full handshake: the server's last flight (NewSessionTicket, CCS, Finished)
    assert (info.finished_ns, info.finished_packet) == first_flight(pair, 1, 1)
    assert info.alert == "encrypted from client"  # close_notify after CCS
    assert info.session_tickets == 1  # TLS 1.2's NewSessionTicket is in the clear
    assert [r.ts_ns for r in an.requests] == [x["req"][0] for x in xs]
    assert [r.first_byte_ns for r in an.requests] == [x["resp"][0] for x in xs]
    assert an.warnings == []


@pytest.mark.parametrize("tickets", [True, False], ids=["ticket", "session-id"])
def test_real_tls12_resumption(cert_files: tuple[str, str], tickets: bool) -> None:
    cctx, sctx = make_contexts(cert_files, max_version=ssl.TLSVersion.TLSv1_2,
                               tickets=tickets)
    first = TlsPair(cctx, sctx)
    first.handshake()
    first.exchange(REQ, resp(10))
    session = first.client.session
    assert first.wire.replay().info.resumed is False
    assert first.wire.replay().info.session_tickets == (1 if tickets else 0)
    # keep ``first`` alive: OpenSSL drops a session from the server cache when a
    # connection that was not shut down is freed

    pair = TlsPair(cctx, sctx, session=session)
    pair.handshake()
    assert pair.client.session_reused
    x = pair.exchange(REQ, resp(10))
    an = pair.wire.replay()
    assert an.info.resumed is True
    assert an.info.session_ticket_offered is tickets
    # abbreviated: the client's Finished (its second flight) ends the handshake
    assert (an.info.finished_ns, an.info.finished_packet) == first_flight(pair, 0, 1)
    assert len(an.requests) == 1
    assert an.requests[0].first_byte_ns == x["resp"][0]


def test_real_tls13_resumption(cert_files: tuple[str, str]) -> None:
    cctx, sctx = make_contexts(cert_files)
    first = TlsPair(cctx, sctx)
    first.handshake()
    first.exchange(REQ, resp(10))
    session = first.client.session
    assert session.has_ticket
    pair = TlsPair(cctx, sctx, session=session)
    pair.handshake()
    assert pair.client.session_reused
    xs = [pair.exchange(REQ, resp(10)) for _ in range(2)]
    an = pair.wire.replay()
    assert an.info.resumed is True
    assert an.info.session_ticket_offered
    assert an.info.finished_ns == first_flight(pair, 0, 1)[0]
    assert [r.first_byte_ns for r in an.requests] == [x["resp"][0] for x in xs]


def test_real_tls13_hello_retry(cert_files: tuple[str, str]) -> None:
    # The server only accepts secp384r1; the client's first key share is x25519.
    cctx, sctx = make_contexts(cert_files, server_curve="secp384r1")
    pair = TlsPair(cctx, sctx)
    pair.handshake()
    x = pair.exchange(REQ, resp(10))
    an = pair.wire.replay()
    info = an.info
    assert info.hello_retry is True
    assert info.version == "TLS 1.3"
    assert info.client_hello_ns == first_flight(pair, 0, 0)[0]
    # client flights: CH1, CCS + CH2, Finished
    assert (info.finished_ns, info.finished_packet) == first_flight(pair, 0, 2)
    assert an.requests[0].first_byte_ns == x["resp"][0]


@pytest.mark.parametrize("chunking", ["bytes", "random", "memoryview"])
def test_real_streams_any_chunking_same_result(cert_files: tuple[str, str],
                                               chunking: str) -> None:
    cctx, sctx = make_contexts(cert_files, alpn=["h2", "http/1.1"], server_alpn=["h2"])
    pair = TlsPair(cctx, sctx)
    pair.handshake()
    for n in (10, 40000, 300):
        pair.exchange(REQ, resp(n))
    pair.close()
    ref = pair.wire.replay()
    for seed in range(3):
        other = pair.wire.replay(chunking=chunking, seed=seed)
        assert other.info == ref.info
        assert other.requests == ref.requests
        assert other.warnings == ref.warnings == []
        if chunking != "random":
            break


def test_request_body_in_several_records_is_one_request(cert_files: tuple[str, str]) -> None:
    cctx, sctx = make_contexts(cert_files)
    pair = TlsPair(cctx, sctx)
    pair.handshake()
    body = b"p" * 50000  # several records from one write
    x = pair.exchange(b"POST /up HTTP/1.1\r\nContent-Length: 50000\r\n\r\n" + body, resp(2))
    an = pair.wire.replay()
    assert len(an.requests) == 1
    assert an.requests[0].ts_ns == x["req"][0]


# ---------------------------------------------------------------------------------
# Property tests: bad bytes never raise
# ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _sample_stream() -> tuple[tuple[int, bytes], ...]:
    """Client/server flights of a hand-built TLS 1.2 and a 1.3 connection."""
    flights = [
        (0, record(22, client_hello(sni="a.test", alpn=["h2"], ticket=b"t", psk=True,
                                    versions=[0x0304]))),
        (1, record(22, server_hello(version=0x0304, psk=True)) + CCS + appdata(100)),
        (0, CCS + appdata(53) + appdata(120)),
        (1, appdata(3000) + record(21, b"\x01\x00")),
        (0, record(22, client_hello(sid=b"s" * 32))),
        (1, record(22, server_hello(sid=b"s" * 32, cipher=0xC02F, alpn="h2")
                   + handshake(11, b"c" * 60) + handshake(14, b"")) + CCS
         + record(22, b"f" * 40)),
        (0, CCS + record(22, b"f" * 40) + appdata(80) + record(21, b"\x02\x0a")),
    ]
    return tuple(flights)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=300)), max_size=20),
       st.booleans())
def test_random_bytes_never_raise(pieces: list[tuple[int, bytes]], prefix: bool) -> None:
    an = TlsAnalyzer()
    ts = 0
    if prefix:
        an.feed(0, 0, record(22, client_hello())[:20], 1)
    for i, (direction, data) in enumerate(pieces):
        ts += 1000
        if i % 7 == 6:
            an.gap(direction, ts, len(data))
        else:
            an.feed(direction, ts, data, i + 1)
    an.close(ts)
    assert isinstance(an.warnings, list)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_streams_never_raise(data: st.DataObject) -> None:
    flights = list(_sample_stream())
    which = data.draw(st.integers(0, len(flights) - 1))
    direction, payload = flights[which]
    buf = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(buf)))
        buf = buf[:cut]
    flights[which] = (direction, bytes(buf))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    an = TlsAnalyzer()
    ts = 0
    for direction, payload in flights:
        i = 0
        while i < len(payload):
            n = rng.randint(1, 64)
            ts += 1000
            an.feed(direction, ts, payload[i:i + n], ts)
            i += n
    an.close(ts)
    if an.info.client_hello_ns is not None and an.info.finished_ns is not None:
        assert an.info.finished_ns >= an.info.client_hello_ns


# ---------------------------------------------------------------------------------
# Third-party captures (skipped when absent)
# ---------------------------------------------------------------------------------

THIRDPARTY = Path(__file__).resolve().parents[2].parent / "shared" / "captures" / "thirdparty"


def _tcp_streams(path: Path) -> dict[tuple, list[tuple[int, int, int, bytes]]]:
    """Naive reassembly: per connection, in-order (direction, ts_ns, packet, bytes).

    Direction 0 is the side that sent the SYN. Out-of-order segments wait for the
    bytes before them; retransmitted bytes are dropped.
    """
    dpkt = pytest.importorskip("dpkt")
    out: dict[tuple, list[tuple[int, int, int, bytes]]] = {}
    state: dict[tuple, dict] = {}
    with path.open("rb") as fh:
        try:
            reader = dpkt.pcap.Reader(fh)
        except ValueError:
            fh.seek(0)
            reader = dpkt.pcapng.Reader(fh)
        link = reader.datalink()
        for no, (ts, buf) in enumerate(reader, 1):
            if link == dpkt.pcap.DLT_NULL:
                raw = buf[4:]
                ip = dpkt.ip.IP(raw) if raw[0] >> 4 == 4 else dpkt.ip6.IP6(raw)
            elif link == dpkt.pcap.DLT_EN10MB:
                ip = dpkt.ethernet.Ethernet(buf).data
            elif link == dpkt.pcap.DLT_LINUX_SLL:
                ip = dpkt.sll.SLL(buf).data
            else:
                pytest.skip(f"link type {link}")
            tcp = getattr(ip, "data", None)
            if not isinstance(tcp, dpkt.tcp.TCP):
                continue
            a, b = (ip.src, tcp.sport), (ip.dst, tcp.dport)
            key = (a, b) if (a, b) in state or (b, a) not in state else (b, a)
            if key not in state:
                state[key] = {"next": {}, "pending": {}}
                out[key] = []
            direction = 0 if (a, b) == key else 1
            st_ = state[key]
            if tcp.flags & dpkt.tcp.TH_SYN:
                st_["next"][direction] = tcp.seq + 1
                continue
            data = bytes(tcp.data)
            if not data:
                continue
            st_["next"].setdefault(direction, tcp.seq)
            pend = st_["pending"].setdefault(direction, {})
            pend[tcp.seq] = (round(float(ts) * 1e9), no, data)
            while True:
                nxt = st_["next"][direction]
                hit = next((s for s, v in pend.items() if s <= nxt < s + len(v[2])), None)
                if hit is None:
                    for s in [s for s, v in pend.items() if s + len(v[2]) <= nxt]:
                        del pend[s]
                    break
                t, n, d = pend.pop(hit)
                new = d[nxt - hit:]
                st_["next"][direction] = nxt + len(new)
                out[key].append((direction, t, n, new))
    return out


def _analyze_capture(name: str) -> list[TlsAnalyzer]:
    path = THIRDPARTY / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    result = []
    for key, segs in _tcp_streams(path).items():
        if not segs or key[1][1] not in (443, 8400, 8443, 9000):
            continue
        an = TlsAnalyzer()
        for direction, ts, no, data in segs:
            an.feed(direction, ts, data, no)
        an.close(segs[-1][1])
        result.append(an)
    return result


@pytest.mark.parametrize(("name", "version", "cipher", "ch_pkt", "fin_pkt", "extra"), [
    ("illustrated_tls13.pcap", "TLS 1.3", "TLS_AES_256_GCM_SHA384", 5, 9, {}),
    ("illustrated_tls12.pcap", "TLS 1.2", "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", 5, 11, {}),
    ("zeek_tls13_hrr.pcap", "TLS 1.3", "TLS_AES_256_GCM_SHA384", 4, 13, {"hello_retry": True}),
    ("cryptohack_tls3_h2.pcapng", "TLS 1.3", "TLS_AES_256_GCM_SHA384", 8, 14,
     {"sni": "tls3.cryptohack.org", "alpn_offered": ["h2", "http/1.1"]}),
    ("zeek_tls12_stream_keylog.pcap", "TLS 1.2", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 4, 12,
     {"sni": "www.heise.de", "alpn": "http/1.1"}),
])
def test_thirdparty_handshakes(name: str, version: str, cipher: str, ch_pkt: int,
                               fin_pkt: int, extra: dict) -> None:
    (an,) = _analyze_capture(name)
    info = an.info
    assert info.version == version
    assert info.cipher == cipher
    assert info.client_hello_packet == ch_pkt
    assert info.finished_packet == fin_pkt
    assert info.resumed is False
    for k, v in extra.items():
        assert getattr(info, k) == v
    assert an.warnings == []


def test_thirdparty_http1_keepalive_requests() -> None:
    # tshark -o tls.keylog_file:... -Y http.request: 16 GETs at these times
    (an,) = _analyze_capture("zeek_tls12_stream_keylog.pcap")
    expected = [1646150638.735969, 1646150638.944774, 1646150638.976118, 1646150639.009370,
                1646150639.041575, 1646150639.073066, 1646150639.106451, 1646150639.430891,
                1646150639.690193, 1646150643.420192, 1646150643.452981, 1646150643.486461,
                1646150643.519345, 1646150643.551413, 1646150643.583149, 1646150644.662554]
    assert [round(r.ts_ns / 1e9, 6) for r in an.requests] == expected


def test_thirdparty_tls13_tickets_are_not_the_answer() -> None:
    # hotplace: 11 GETs on the second connection; the first answer (frame 29) comes
    # 95 ms after the request, the NewSessionTickets (frames 25, 27) within 1.5 ms.
    ans = _analyze_capture("hotplace_http1_tls13.pcapng")
    an = max(ans, key=lambda a: len(a.requests))
    assert len(an.requests) == 11
    r = an.requests[0]
    assert r.first_byte_ns is not None
    assert 90 * MS < r.first_byte_ns - r.ts_ns < 100 * MS
    # cryptohack (h2): tickets + SETTINGS at +22 ms, the answer (frame 27) at +44 ms
    (an,) = _analyze_capture("cryptohack_tls3_h2.pcapng")
    assert len(an.requests) == 1
    r = an.requests[0]
    assert r.first_byte_ns is not None
    assert 43 * MS < r.first_byte_ns - r.ts_ns < 45 * MS
