"""Tests of the request/response inference from encrypted records (tls_infer).

Unit tests feed record events to :class:`ExchangeInferrer` directly; integration
tests run real HTTP/2 (the ``h2`` library) and HTTP/1.1 over genuine TLS produced
by Python's ssl module over memory BIOs, and check what :class:`TlsAnalyzer`
infers from the ciphertext alone.
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from netdiag.protocols.tls import TlsAnalyzer
from netdiag.protocols.tls_infer import ExchangeInferrer

MS = 1_000_000
C, S = 0, 1


def feed(inf: ExchangeInferrer, events: list[tuple[int, int, int]]) -> None:
    """(direction, ts_ms, length) events, each record 0.1 ms long."""
    for i, (direction, ts_ms, length) in enumerate(events):
        ts = ts_ms * MS
        inf.record(direction, ts, ts + 100_000, length, i + 1)


# ---------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------


def test_substantive_with_unknown_overhead_uses_small() -> None:
    inf = ExchangeInferrer(small=40)
    assert not inf.substantive(40)
    assert inf.substantive(41)
    inf = ExchangeInferrer(small=100)
    assert not inf.substantive(60)


@pytest.mark.parametrize(("plain", "expected"), [
    (2, False),     # TLS 1.3 encrypted alert
    (9, False),     # SETTINGS ACK / empty END_STREAM DATA
    (13, False),    # WINDOW_UPDATE
    (15, True),     # curl's repeated HEADERS on a reused connection (HPACK-indexed)
    (17, True),     # httpx's repeated HEADERS (collides with PING, which counts)
    (22, False),    # SETTINGS ACK + WINDOW_UPDATE
    (26, False),    # two WINDOW_UPDATEs
    (27, True),
    (45, True),     # curl's first HEADERS
    (500, True),
])
def test_substantive_with_known_overhead(plain: int, expected: bool) -> None:
    for overhead in (17, 24, 16):
        assert ExchangeInferrer(overhead=overhead).substantive(plain + overhead) is expected


# ---------------------------------------------------------------------------------
# Exchanges
# ---------------------------------------------------------------------------------


def test_sequential_exchanges() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [
        (S, 1, 300),                # NewSessionTicket before any request: not an answer
        (C, 10, 100), (C, 11, 60),  # one request in two records
        (S, 30, 200), (S, 31, 1000), (S, 33, 26),  # 26 = 9 + 17: control, not counted
        (C, 40, 100),
        (S, 50, 500),
        (C, 60, 80),                # never answered
    ])
    inf.close()
    r = inf.requests
    assert len(r) == 3
    assert all(x.estimated for x in r)
    assert r[0].ts_ns == 10 * MS
    assert r[0].first_byte_ns == 30 * MS
    assert r[0].last_byte_ns == 31 * MS + 100_000
    assert r[0].response_bytes == 1200
    assert r[0].chunks == 2
    assert r[0].chunk_gaps_ns == [1 * MS]
    assert (r[1].ts_ns, r[1].first_byte_ns, r[1].chunks, r[1].chunk_gaps_ns) == (
        40 * MS, 50 * MS, 1, None)
    assert r[2].ts_ns == 60 * MS
    assert (r[2].first_byte_ns, r[2].last_byte_ns, r[2].response_bytes, r[2].chunks,
            r[2].chunk_gaps_ns) == (None, None, None, None, None)


def test_small_client_records_do_not_start_requests() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [
        (C, 0, 200),
        (S, 10, 16401), (C, 11, 26 + 17), (S, 12, 16401), (C, 13, 13 + 17),
        (S, 14, 16401), (C, 15, 9 + 17),
        (C, 20, 15 + 17),  # a tiny HPACK-indexed HEADERS: a new request
        (S, 30, 100),
    ])
    inf.close()
    assert [r.ts_ns for r in inf.requests] == [0, 20 * MS]
    assert inf.requests[0].chunks == 3
    assert inf.requests[0].chunk_gaps_ns == [2 * MS, 2 * MS]


def test_goaway_at_idle_close_does_not_stretch_the_last_response() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [(C, 0, 200), (S, 10, 400), (S, 4000, 17 + 17), (S, 5000, 17 + 17),
               (S, 5001, 2 + 17)])  # PING, GOAWAY, close_notify
    inf.close()
    assert inf.requests[0].last_byte_ns == 10 * MS + 100_000


def test_17_byte_server_record_counts_when_data_follows() -> None:
    # A small indexed response HEADERS then DATA: the HEADERS is the first byte.
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [(C, 0, 200), (S, 10, 17 + 17), (S, 11, 17 + 17), (S, 12, 500),
               (C, 20, 200), (S, 30, 17 + 17)])
    inf.close()
    r0, r1 = inf.requests
    assert (r0.first_byte_ns, r0.chunks, r0.response_bytes) == (10 * MS, 2, 534)
    # the only answer there was
    assert (r1.first_byte_ns, r1.chunks) == (30 * MS, 1)


def test_unknown_overhead_falls_back_to_small() -> None:
    inf = ExchangeInferrer(small=40)
    feed(inf, [(C, 0, 30), (C, 1, 64), (S, 2, 40), (S, 3, 500), (C, 4, 64), (S, 5, 64)])
    inf.close()
    assert [(r.ts_ns, r.first_byte_ns) for r in inf.requests] == [(1 * MS, 3 * MS),
                                                                  (4 * MS, 5 * MS)]


def test_streamed_response_chunk_gaps() -> None:
    inf = ExchangeInferrer(overhead=17)
    events = [(C, 0, 300)] + [(S, 100 + 50 * i, 120) for i in range(10)]
    feed(inf, events)
    inf.close()
    (r,) = inf.requests
    assert r.chunks == 10
    assert r.chunk_gaps_ns == [50 * MS] * 9
    assert r.response_bytes == 1200


def test_requests_list_is_shared() -> None:
    out: list = []
    inf = ExchangeInferrer(requests=out)
    feed(inf, [(C, 0, 300), (S, 1, 300)])
    assert out == []  # the exchange is still open
    assert inf.pending
    inf.close()
    assert len(out) == 1 and inf.requests is out
    assert not inf.pending


# ---------------------------------------------------------------------------------
# The handshake tail
# ---------------------------------------------------------------------------------


def test_tail_dropped_when_the_answer_comes_after_a_pause() -> None:
    inf = ExchangeInferrer(overhead=17, tail_gap_ns=2 * MS)
    inf.arm_tail()
    feed(inf, [(C, 0, 300), (S, 10, 250), (S, 11, 250), (S, 40, 500), (S, 41, 500)])
    inf.close()
    (r,) = inf.requests
    assert r.first_byte_ns == 40 * MS
    assert r.chunks == 2
    assert r.response_bytes == 1000
    assert r.chunk_gaps_ns == [1 * MS]


def test_tail_kept_when_nothing_follows() -> None:
    # A fast server: tickets and answer in one burst; then the next request.
    inf = ExchangeInferrer(overhead=17, tail_gap_ns=2 * MS)
    inf.arm_tail()
    feed(inf, [(C, 0, 300), (S, 10, 250), (S, 11, 400), (C, 20, 300), (S, 30, 400),
               (S, 60, 400)])
    inf.close()
    r0, r1 = inf.requests
    assert (r0.first_byte_ns, r0.chunks) == (10 * MS, 2)
    # only the first exchange has a tail
    assert (r1.first_byte_ns, r1.chunks) == (30 * MS, 2)


def test_tail_disarmed_by_server_data_before_the_request() -> None:
    inf = ExchangeInferrer(overhead=17)
    inf.arm_tail()
    feed(inf, [(S, 1, 250), (C, 100, 300), (S, 110, 100), (S, 200, 100)])
    inf.close()
    assert inf.requests[0].first_byte_ns == 110 * MS


def test_tail_deadline() -> None:
    inf = ExchangeInferrer(overhead=17)
    inf.arm_tail(deadline_ns=5 * MS)
    feed(inf, [(C, 100, 300), (S, 110, 100), (S, 200, 100)])
    inf.close()
    assert inf.requests[0].first_byte_ns == 110 * MS
    assert inf.requests[0].chunks == 2


def test_tail_only_control_records_are_ignored() -> None:
    inf = ExchangeInferrer(overhead=17)
    inf.arm_tail()
    feed(inf, [(C, 0, 300), (S, 1, 9 + 17), (S, 30, 300)])
    inf.close()
    assert inf.requests[0].first_byte_ns == 30 * MS


def test_arm_after_answer_has_no_effect() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [(C, 0, 300), (S, 1, 300)])
    inf.arm_tail()
    feed(inf, [(S, 50, 300)])
    inf.close()
    assert inf.requests[0].first_byte_ns == 1 * MS


# ---------------------------------------------------------------------------------
# Real TLS carrying HTTP/2 and HTTP/1.1
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ssl.SSLContext]:
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
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("infercert")
    (d / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    out = {}
    for label, maxv in (("1.3", None), ("1.2", ssl.TLSVersion.TLSv1_2)):
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain(str(d / "c.pem"), str(d / "k.pem"))
        sctx.set_alpn_protocols(["h2", "http/1.1"])
        cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        cctx.check_hostname = False
        cctx.verify_mode = ssl.CERT_NONE
        cctx.set_alpn_protocols(["h2", "http/1.1"])
        if maxv is not None:
            cctx.maximum_version = maxv
        out["client" + label] = cctx
        out["server" + label] = sctx
    return out


@dataclass
class Lab:
    """Client and server SSLObjects on a simulated wire seen next to the client."""

    cctx: ssl.SSLContext
    sctx: ssl.SSLContext
    rtt: int = 1 * MS
    now: int = 1_700_000_000 * 1_000_000_000
    segments: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    greeting: Callable[[], bytes] | None = None
    """What the server application sends as soon as its handshake completes."""

    def __post_init__(self) -> None:
        self.ci, self.co, self.si, self.so = (ssl.MemoryBIO() for _ in range(4))
        self.client = self.cctx.wrap_bio(self.ci, self.co, server_hostname="api.roc.test")
        self.server = self.sctx.wrap_bio(self.si, self.so, server_side=True)
        self.server_done = False

    def flush(self, direction: int) -> int | None:
        """Move what one side wrote onto the wire now; its first segment's time."""
        out, peer = (self.co, self.si) if direction == C else (self.so, self.ci)
        data = out.read()
        if not data:
            return None
        first = self.now
        for i in range(0, len(data), 1400):
            self.segments.append((direction, self.now, len(self.segments) + 1,
                                  data[i:i + 1400]))
            self.now += 10_000
        peer.write(data)
        return first

    def handshake(self) -> None:
        while True:
            try:
                self.client.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            self.flush(C)
            if done:
                return
            self.now += self.rtt
            if not self.server_done:
                try:
                    self.server.do_handshake()
                    self._server_ready()
                except ssl.SSLWantReadError:
                    pass
            self.flush(S)

    def _server_ready(self) -> None:
        self.server_done = True
        if self.greeting is not None:
            self.server.write(self.greeting())

    def catch_up(self) -> None:
        """The server reads the client's last handshake flight (TLS 1.3: and
        answers with its NewSessionTickets one RTT later)."""
        if not self.server_done:
            self.server.do_handshake()
            self._server_ready()
            self.now += self.rtt
            self.flush(S)

    def server_read(self) -> bytes:
        self.catch_up()
        return _drain(self.server)

    def client_read(self) -> bytes:
        return _drain(self.client)

    def replay(self) -> TlsAnalyzer:
        an = TlsAnalyzer()
        for direction, ts, pkt, data in self.segments:
            an.feed(direction, ts, data, pkt)
        an.close(self.now)
        return an


def _drain(obj: ssl.SSLObject) -> bytes:
    got = b""
    while True:
        try:
            chunk = obj.read(1 << 20)
        except ssl.SSLWantReadError:
            return got
        if not chunk:
            return got
        got += chunk


REQUEST_HEADERS = [(":method", "GET"), (":authority", "api.roc.test"), (":scheme", "https"),
                   (":path", "/v1/items"), ("accept", "*/*"),
                   ("accept-encoding", "gzip, deflate"), ("user-agent", "python-httpx/0.28")]


def run_h2(lab: Lab, sizes: list[int], proc_ns: int = 20 * MS) -> list[tuple[int, int]]:
    """Sequential HTTP/2 GETs with responses of ``sizes`` bytes; returns the
    (request HEADERS time, response HEADERS time) of each."""
    import h2.config
    import h2.connection
    import h2.events

    cli = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    srv = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))

    def greeting() -> bytes:
        srv.initiate_connection()
        return srv.data_to_send()

    lab.greeting = greeting
    lab.handshake()
    assert lab.client.selected_alpn_protocol() == "h2"
    cli.initiate_connection()
    lab.client.write(cli.data_to_send())  # preface + SETTINGS in their own record
    truth = []
    for i, size in enumerate(sizes):
        sid = 2 * i + 1
        lab.now += 100_000
        cli.send_headers(sid, REQUEST_HEADERS, end_stream=True)
        lab.client.write(cli.data_to_send())
        req_ts = lab.flush(C)
        assert req_ts is not None
        # the server's ACKs go out at once
        lab.now += lab.rtt
        srv.receive_data(lab.server_read())
        out = srv.data_to_send()
        if out:
            lab.server.write(out)
            lab.flush(S)
        cli.receive_data(lab.client_read())
        lab.client.write(cli.data_to_send())
        lab.flush(C)
        # the answer after the server's processing time, under flow control
        lab.now += proc_ns
        srv.receive_data(lab.server_read())
        srv.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                               ("content-length", str(size))])
        lab.server.write(srv.data_to_send())
        resp_ts = lab.flush(S)
        assert resp_ts is not None
        truth.append((req_ts, resp_ts))
        left = size
        while True:
            while left:
                window = min(srv.local_flow_control_window(sid), srv.max_outbound_frame_size)
                if window <= 0:
                    break
                n = min(window, left)
                left -= n
                srv.send_data(sid, b"y" * n, end_stream=left == 0)
            lab.server.write(srv.data_to_send())
            lab.flush(S)
            for ev in cli.receive_data(lab.client_read()):
                if isinstance(ev, h2.events.DataReceived):
                    cli.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            out = cli.data_to_send()
            if out:
                lab.now += 200_000
                lab.client.write(out)  # WINDOW_UPDATEs
                lab.flush(C)
            if not left:
                break
            lab.now += lab.rtt
            srv.receive_data(lab.server_read())
    return truth


@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_h2_sequential_requests(contexts: dict[str, ssl.SSLContext], version: str) -> None:
    lab = Lab(contexts["client" + version], contexts["server" + version])
    sizes = [50, 300, 200_000, 20, 5_000, 20, 20, 150_000, 64]
    truth = run_h2(lab, sizes)
    an = lab.replay()
    assert an.warnings == []
    assert an.info.version == f"TLS {version}"
    got = [(r.ts_ns, r.first_byte_ns) for r in an.requests]
    assert got == truth
    big = an.requests[2]
    assert big.response_bytes is not None and big.response_bytes > 200_000
    assert big.chunks is not None and big.chunks > 12


def test_h2_fast_server_first_answer_merges_with_tickets(
        contexts: dict[str, ssl.SSLContext]) -> None:
    # With no processing time the tickets and the answer form one burst: the
    # first byte is the tickets' (documented limit), the count stays right.
    lab = Lab(contexts["client1.3"], contexts["server1.3"])
    truth = run_h2(lab, [100, 100, 100], proc_ns=100_000)
    an = lab.replay()
    assert [r.ts_ns for r in an.requests] == [t[0] for t in truth]
    first = an.requests[0].first_byte_ns
    assert first is not None and first <= truth[0][1]
    assert [r.first_byte_ns for r in an.requests[1:]] == [t[1] for t in truth[1:]]


@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_http1_keepalive_requests(contexts: dict[str, ssl.SSLContext], version: str) -> None:
    lab = Lab(contexts["client" + version], contexts["server" + version])
    lab.handshake()
    lab.catch_up()
    truth = []
    for i, size in enumerate([10, 100_000, 3, 777]):
        lab.now += 5 * MS
        lab.client.write(b"GET /r/%d HTTP/1.1\r\nHost: api.roc.test\r\n\r\n" % i)
        req = lab.flush(C)
        lab.now += lab.rtt
        lab.server_read()
        lab.now += 30 * MS
        lab.server.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"z" * size)
        resp = lab.flush(S)
        lab.client_read()
        truth.append((req, resp, lab.segments[-1][1]))
    an = lab.replay()
    assert [(r.ts_ns, r.first_byte_ns, r.last_byte_ns) for r in an.requests] == truth


def test_client_goaway_at_close_is_not_a_request() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [(C, 0, 200), (S, 10, 400), (C, 20, 17 + 17), (C, 21, 2 + 17)])
    inf.close()
    assert [r.ts_ns for r in inf.requests] == [0]


def test_unanswered_real_request_at_close_is_kept() -> None:
    inf = ExchangeInferrer(overhead=17)
    feed(inf, [(C, 0, 200), (S, 10, 400), (C, 20, 60 + 17)])
    inf.close()
    assert [r.ts_ns for r in inf.requests] == [0, 20 * MS]
    assert inf.requests[1].first_byte_ns is None
