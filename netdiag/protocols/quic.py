"""QUIC connections from UDP datagrams, with or without keys (issue 15).

One :class:`QuicAnalyzer` per run holds every QUIC connection, found by address pair
first and by connection id next (a client that changed address or port keeps its
connection: a migration). Each :class:`QuicConnection` is a session of the flow table
(:class:`netdiag.flows.table.UdpSession`): the table numbers it with the TCP
connections and finishes it (idle, after CONNECTION_CLOSE, at the end of input).

Without keys: long headers (v1, v2, draft-29), connection ids, Version Negotiation,
Retry, 0-RTT attempts; the Initial packets are decrypted with the keys derived from
the client's Destination Connection ID (RFC 9001 section 5.2), their CRYPTO frames
reassembled (split and out of order included) and the ClientHello and ServerHello
read by the TLS analyzer's own parser (``TlsAnalyzer`` fed whole handshake messages).
After a Retry or a Version Negotiation the client restarts its handshake
(:meth:`QuicConnection._restart`): new Initial keys, a new ClientHello at CRYPTO offset 0
(its random is the key log's); the connection keeps its start. On :data:`QUIC_PORTS` a
client's Initial-sized datagram of an unknown version starts a connection, so that the
server's Version Negotiation is matched. Short-header packets to or from a known server
whose connection id matches no connection (a migration to a new connection id, invisible
without keys) are counted and reported by one warning (:func:`stray_warning`).

Timings (``docs/report.md``): ``tls.handshake_ms`` from the client's first Initial to
its first 1-RTT (short header) packet after the server's first Handshake packet (the
TLS 1.3 rule: the client's Finished, which rides with that flight);
``handshake_rtt_ms`` from the client's first Initial to the server's first answer
(Initial, Retry or Version Negotiation).

With the connection's secrets in the key log (NSS labels, by ClientHello random),
Handshake, 0-RTT and 1-RTT packets are decrypted too (``quic key``/``iv``/``hp``), their
frames parsed (``netdiag.protocols.quic_wire``), streams reassembled and HTTP/3 read
by :class:`netdiag.protocols.h3.Http3`. Key updates are decrypted (aioquic derives the
next phase per packet) but not followed.

Without keys for the 1-RTT packets (and the client offering ``h3``), the requests are
estimated from the 1-RTT packets' directions, times and sizes by :class:`_Estimator`
(``estimated=True``, ``protocol`` ``"h3"``; never beside decrypted ones: the first
1-RTT packet that decrypts drops the estimate). A packet's *payload* is its length less
the short header's first byte, the destination connection id and the 16-byte AEAD tag.

* Client packets with less than :data:`EST_CLIENT_MIN` bytes of payload are ACKs and
  stream-control chatter; up to :data:`EST_CLIENT_SURE` they count only when no response
  data came in the last :data:`EST_QUIET_NS` (else ACK + flow-control updates during a
  download). Server packets under :data:`EST_SERVER_MIN` are not response data.
* A request starts at each request-sized client packet, except one that continues the
  previous (that was a full packet, :data:`EST_FULL`, or came less than
  :data:`EST_SPLIT_NS` before, with no response between). HTTP/3 multiplexes, so
  unlike TLS's estimate (``tls_infer``, one exchange at a time, which merges concurrent
  requests: 21 for the 24 of ``captures/h3.pcapng``, 19 of them more than 1 ms or 5 ms
  off) several requests may wait for their answer at once, oldest first.
* Each server packet either starts the response of the oldest waiting request
  (``first_byte_ns``) or continues the response that started last: it continues when
  it comes within a burst (:data:`EST_BURST_NS`) of the previous server packet, or is a
  streamed chunk of about the previous one's size (:meth:`_Estimator._continues`).
  ``last_byte_ns`` is the last packet the response got before the next one started;
  ``response_bytes`` and ``request_bytes`` sum payloads; ``chunks`` counts bursts.
* The client's first 1-RTT flight (its Finished, HTTP/3 control streams, new connection
  ids) is a request only if the server answers after its handshake tail (its first
  burst, starting within two handshake RTTs: HANDSHAKE_DONE, tickets, SETTINGS) rather
  than the client sending first; after a 0-RTT request (its 0-RTT packets count as
  client packets) it is never one. Server data before that flight is 0.5-RTT data.
* After a NAT rebinding the path validation (:data:`EST_PATH_PACKETS`) is skipped.

Limits: requests sent together and answered in one burst are told apart only in order
(the second's first byte may come from the first's answer); a request sent while
another response streams is matched by the chunk sizes; two requests in one packet are
one; after a migration to a new connection id the new path is not linked (no keys;
its packets are counted in the warning).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from netdiag.contract import QuicJson
from netdiag.protocols import quic_wire as w
from netdiag.protocols.h3 import LIMIT_H3_REQUESTS, MAX_REQUESTS, Http3
from netdiag.protocols.tls import TlsAnalyzer
from netdiag.protocols.tls_infer import DEFAULT_TAIL_GAP_NS
from netdiag.records import Connection, Request

if TYPE_CHECKING:  # loaded by quic_wire at the first packet to decrypt
    from aioquic.quic.crypto import CryptoContext

QUIC_PORTS = frozenset({443, 4433, 8443})
MAX_STRAY = 4096
"""Server end points whose unmatched short-header packets are counted (a warning each)."""
"""UDP ports whose traffic is read as QUIC (any port for a long header of a known
version)."""
MAX_CIDS = 64
"""Connection ids one connection registers (more are not followed)."""
MAX_CRYPTO_HELD = 1 << 17
"""CRYPTO bytes held ahead of a gap in one packet-number space and direction."""
MAX_HS_MESSAGE = 1 << 16
"""A handshake message longer than this is skipped."""
MAX_STREAM_HELD = 1 << 20
"""Stream bytes held ahead of a gap in one stream direction; beyond, the stream is lost."""
MAX_STREAMS = 1 << 14
"""Streams (per direction) one connection reassembles; more are counted, not read."""
MAX_PENDING_0RTT = 64
"""0-RTT packets kept until the ServerHello brings their cipher suite (with keys)."""
MAX_PATHS = 16
"""Client endpoints one connection records."""
MAX_CONNECTIONS = 1 << 16
"""QUIC connections open at once; a new one beyond is not tracked (``limits_hit``)."""
MAX_WARNINGS = 20
MIN_INITIAL = 1200
"""A client's datagrams carrying Initial packets are at least this long (RFC 9000
section 14.1)."""
LIMIT_QUIC_CONNECTIONS = "quic_open_connections"
LIMIT_QUIC_STREAMS = "quic_streams_per_connection"
LIMIT_QUIC_HELD = "quic_held_bytes"

SPACE_INITIAL, SPACE_HANDSHAKE, SPACE_APP = 0, 1, 2
_SPACE_OF = {w.INITIAL: SPACE_INITIAL, w.HANDSHAKE: SPACE_HANDSHAKE, w.ZERO_RTT: SPACE_APP,
             w.ONE_RTT: SPACE_APP}
HS_CLIENT_HELLO, HS_SERVER_HELLO, HS_NEW_SESSION_TICKET = 1, 2, 4
HS_ENCRYPTED_EXTENSIONS, HS_FINISHED = 8, 20
EXT_ALPN, EXT_EARLY_DATA = 16, 42

AEAD_TAG = 16
"""Bytes every QUIC packet protection adds (AES-GCM, AES-CCM, ChaCha20-Poly1305)."""

Keys = Callable[[bytes], dict[str, bytes]]
"""The key log lookup: ClientHello random -> ``{label: secret}`` (empty when unknown)."""


class _Reassembly:
    """One ordered byte stream (CRYPTO of a space, or a QUIC stream) from frames at any
    offset, each piece delivered with the capture time of the packet that carried it."""

    __slots__ = ("done", "fin_ts", "final", "heap", "held", "lost", "next", "seq")

    def __init__(self) -> None:
        self.next = 0
        self.heap: list[tuple[int, int, bytes, int]] = []
        self.held = 0
        self.seq = 0
        self.final: int | None = None
        self.fin_ts = 0
        self.done = False
        self.lost = False

    def add(self, offset: int, data: bytes, ts: int, fin: bool, cap: int,
            ) -> list[tuple[bytes, int]] | None:
        """The pieces now in order; None when the cap of held bytes was exceeded."""
        if fin:
            self.final = offset + len(data)
            self.fin_ts = ts
        out: list[tuple[bytes, int]] = []
        if self.lost:
            return out
        end = offset + len(data)
        if end <= self.next:
            return out
        if offset > self.next:
            if self.held + len(data) > cap:
                self.lost = True
                self.heap = []
                self.held = 0
                return None
            self.seq += 1
            heapq.heappush(self.heap, (offset, self.seq, data, ts))
            self.held += len(data)
            return out
        out.append((data[self.next - offset:], ts))
        self.next = end
        heap = self.heap
        while heap and heap[0][0] <= self.next:
            off, _s, d, t = heapq.heappop(heap)
            self.held -= len(d)
            e = off + len(d)
            if e > self.next:
                out.append((d[self.next - off:], t))
                self.next = e
        return out

    def ended(self) -> bool:
        """The FIN's final size is reached (once: later calls say False)."""
        if self.done or self.final is None or self.next < self.final:
            return False
        self.done = True
        return True


class _Handshake:
    """Handshake messages of one space and direction, cut from the CRYPTO bytes."""

    __slots__ = ("buf", "pkt", "skip", "ts")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.ts = 0
        self.pkt = 0
        self.skip = 0


# -- requests estimated without keys ---------------------------------------------------

EST_CLIENT_MIN = 18
"""Client 1-RTT packets with less payload than this (bytes after the short header and
the AEAD tag, packet number included) are never a request: ACK-only packets are 7 or 8
bytes, with a QPACK decoder instruction or a control-stream frame 10 to 15
(``captures/h3.pcapng``), while a repeated request whose headers QPACK's dynamic table
compresses is 21 (``tests/protocols/h3_capture.py``)."""
EST_CLIENT_SURE = 40
"""Client packets from :data:`EST_CLIENT_MIN` up to this could also be ACKs with several
ranges or flow-control updates (ACK + MAX_DATA + MAX_STREAM_DATA is 16 to 29 bytes),
which a client sends while a response arrives: they start a request only when no
response data came in the last :data:`EST_QUIET_NS` (a request of that size on a
connection busy with a response is missed). The first request of a connection, with
its path a literal, is 37 to 44 bytes in ``tests/protocols/h3_capture.py``; the lab's
requests in ``captures/h3.pcapng`` 126 to 232. The usual suggestion of about 60 bytes
would miss every repeated request of an aioquic client."""
EST_SERVER_MIN = 20
"""Server packets with less payload are not response data: ACK, ACK+PING, QPACK decoder
instructions (7 to 14 bytes in ``captures/h3.pcapng``); the smallest response packet
there, a HEADERS frame, is 25. A response's final empty DATA frame with FIN is not seen
(``last_byte_ns`` is then the packet before it, about 0.2 ms earlier)."""
EST_QUIET_NS = 5_000_000
"""See :data:`EST_CLIENT_SURE`."""
EST_FULL = 1000
"""A client packet at least this long is full: the next one continues the same request
(a body longer than a packet)."""
EST_SPLIT_NS = 200_000
"""Two request-sized client packets less than this apart, with no response between, are
one request (its HEADERS and body sent in one flush); further apart, two concurrent
requests (HTTP/3 multiplexes them; one packet each in ``captures/h3.pcapng``, 0.96 to
3.4 ms apart)."""
EST_BURST_NS = DEFAULT_TAIL_GAP_NS
"""Server packets less than this apart (2 ms, the TLS estimate's handshake-tail gap) are
one burst of the same response (and one ``chunk``): a DATA frame follows its HEADERS up
to 1.4 ms later in ``captures/h3.pcapng``, another response's first packet 1.8 ms or
more after the previous server packet (at 1.8 ms it is taken as a continuation)."""
EST_TOGETHER_NS = 5_000_000
"""Requests sent less than this apart, before any answer, are answered together, in
order (:meth:`_Estimator._continues`)."""
EST_SIZE_TOL = 8
"""A server packet within this many bytes of the previous response packet's size, at the
cadence of that response (see :meth:`_Estimator._continues`), continues a streamed
response rather than answering a waiting request."""
EST_PATH_PACKETS = 1
"""After the client's address changes (a NAT rebinding), the server's next
response-sized packet is its PATH_CHALLENGE (RFC 9000 section 9.3: a new peer address is
validated before more than three times what it sent is sent to it; padded as far as
that allows), whenever it comes: a loaded server sent it 4.9 ms after the client's
packet, beyond two handshake round trips (4.8 ms) there. The client's next full packet
within two handshake round trips of the change, or of that challenge, is path validation
too (its PATH_RESPONSE, padded to 1,200 bytes). None of them is a request or an
answer."""
EST_MAX_PENDING = 256
"""Requests awaiting their first response byte at once; beyond, the oldest is no longer
matched (it stays, unanswered)."""
EST_MAX_GAPS = 1024
"""``chunk_gaps_ns`` entries kept per estimated request."""


class _Estimator:
    """Requests guessed from the sizes and times of 1-RTT packets (no keys; module doc of
    :mod:`netdiag.protocols.quic`, ``docs/report.md``). O(1) per packet, bounded state."""

    __slots__ = ("active", "chunk_start", "gap", "last_client", "last_client_len",
                 "last_resp_ns", "last_server", "last_server_len", "limits_hit",
                 "path_client", "path_server", "path_until", "path_window", "pending",
                 "requests", "server_since", "setup", "started", "tail")

    def __init__(self, limits_hit: dict[str, int]) -> None:
        """``limits_hit``: the connection's cap counts."""
        self.requests: list[Request] = []
        self.limits_hit = limits_hit
        self.pending: deque[Request] = deque()
        """Requests awaiting their first response byte, oldest first."""
        self.active: Request | None = None
        """The request whose response the last server packet continued."""
        self.chunk_start = 0
        self.gap = 0
        """The last pause (a burst or longer) between server packets: a stream's cadence."""
        self.last_client: int | None = None
        self.last_client_len = 0
        self.last_server: int | None = None
        self.last_server_len = 0
        self.last_resp_ns: int | None = None
        self.server_since = True
        """A response packet came since the last request started."""
        self.setup: Request | None = None
        """The client's first flight (its Finished, HTTP/3 control streams, new
        connection ids), a request only if an answer follows the handshake tail."""
        self.tail = 0
        """0 before the server's first burst after the client's first flight, 1 inside
        it, 2 after. That burst is the handshake's tail (HANDSHAKE_DONE, tickets, new
        connection ids: the server's answer to the client's Finished, which the first
        flight carries or follows) whenever it comes: a loaded server sent it 4.6 ms
        after the first flight, beyond the two handshake round trips and a burst
        (4.4 ms) that once bounded it, and the estimate took it for the answer to a
        request."""
        self.started = False
        """The client's first 1-RTT flight was seen (a request-sized packet)."""
        self.path_until = 0
        self.path_window = 0
        """How long after the change, or the server's challenge, the client's may come."""
        self.path_client = 0
        """The client's path-validation packets still to skip until :attr:`path_until`."""
        self.path_server = 0
        """The server's path-validation packets still to skip (its next response-sized)."""

    def path_changed(self, ts: int, window: int) -> None:
        """The client sent from a new address at ``ts``; ``window``: how long after it,
        or after the server's challenge, the client's validation may come
        (:data:`EST_PATH_PACKETS`)."""
        self.path_window = window
        self.path_until = ts + window
        self.path_client = self.path_server = EST_PATH_PACKETS

    def packet(self, d: int, ts: int, size: int, early: bool = False) -> None:
        """A 1-RTT packet not decrypted: direction (0 client, 1 server), capture time,
        and its payload size (the packet less its short header's first byte, destination
        connection id and AEAD tag: packet number and frames). ``early``: a 0-RTT
        packet (its payload from the packet number on), never the setup flight."""
        if d == 0:
            self._client(ts, size, early)
        else:
            self._server(ts, size)

    def _client(self, ts: int, size: int, early: bool = False) -> None:
        if size < EST_CLIENT_MIN:
            return
        if self.path_client and size >= EST_FULL and ts <= self.path_until:
            self.path_client -= 1
            return  # PATH_RESPONSE or PATH_CHALLENGE, padded
        if (size < EST_CLIENT_SURE and self.last_resp_ns is not None
                and ts - self.last_resp_ns < EST_QUIET_NS):
            return  # an ACK or flow-control update while a response arrives
        last = self.last_client
        self.last_client = ts
        cur = self.requests[-1] if self.requests else None
        if (cur is not None and not self.server_since and last is not None
                and (self.last_client_len >= EST_FULL or ts - last < EST_SPLIT_NS)):
            cur.end_ns = ts
            cur.request_bytes = (cur.request_bytes or 0) + size
            self.last_client_len = size
            return
        self.last_client_len = size
        setup = self.setup
        if setup is not None and setup.first_byte_ns is None:
            # a new request before any answer: the first flight was the setup (always
            # the latest request: the next one clears it)
            if self.requests and self.requests[-1] is setup:
                self.requests.pop()
            if self.pending and self.pending[-1] is setup:
                self.pending.pop()
        self.setup = None
        if len(self.requests) >= MAX_REQUESTS:
            self.limits_hit[LIMIT_H3_REQUESTS] = self.limits_hit.get(LIMIT_H3_REQUESTS, 0) + 1
            return
        req = Request(ts_ns=ts, end_ns=ts, request_bytes=size, estimated=True,
                      protocol="h3")
        if not self.started and not early:
            self.started = True
            if self.requests:
                return  # the request went as 0-RTT data: this flight is the setup
            self.setup = req
        self.requests.append(req)
        if len(self.pending) >= EST_MAX_PENDING:
            self.pending.popleft()
        self.pending.append(req)
        self.server_since = False

    def _server(self, ts: int, size: int) -> None:
        if size < EST_SERVER_MIN:
            return
        if self.path_server:
            self.path_server -= 1
            self.path_client = EST_PATH_PACKETS  # the client answers it
            self.path_until = ts + self.path_window
            return  # PATH_CHALLENGE to the client's new address
        prev, prev_len = self.last_server, self.last_server_len
        self.last_server, self.last_server_len = ts, size
        if not self.started:
            return  # before the client's first 1-RTT flight: 0.5-RTT data, not an answer
        gap = ts - prev if prev is not None else None
        if self.tail < 2:
            if self.tail == 0:
                self.tail = 1
            elif gap is None or gap >= EST_BURST_NS:
                self.tail = 2
            if self.tail == 1:
                return  # the handshake tail: HANDSHAKE_DONE, tickets, SETTINGS
        if not self.requests:
            return
        self.server_since = True
        self.last_resp_ns = ts
        active = self.active
        if self.pending and (active is None or prev is None
                             or not self._continues(ts - prev, size, prev, prev_len)):
            req = self.pending.popleft()
            req.first_byte_ns = req.last_byte_ns = ts
            req.response_bytes = size
            req.chunks = 1
            self.active = req
            self.chunk_start = ts
            if gap is not None and gap >= EST_BURST_NS:
                self.gap = gap
            return
        if active is None:
            return
        if gap is not None and gap >= EST_BURST_NS:
            assert active.chunks is not None
            active.chunks += 1
            gaps = active.chunk_gaps_ns
            if gaps is None:
                gaps = active.chunk_gaps_ns = []
            assert isinstance(gaps, list)  # built here, not yet kept (compact_gaps)
            if len(gaps) < EST_MAX_GAPS:
                gaps.append(ts - self.chunk_start)
            self.chunk_start = ts
        if gap is not None and gap >= EST_BURST_NS:
            self.gap = gap
        active.last_byte_ns = ts
        active.response_bytes = (active.response_bytes or 0) + size

    def _continues(self, gap: int, size: int, prev: int, prev_len: int) -> bool:
        """Whether a server packet continues the active response though a request waits.

        Within a burst it does, unless the active response has just started and the
        waiting request was sent together with the active one (less than
        :data:`EST_TOGETHER_NS` after it, before any answer): concurrent requests sent
        together are answered together, in order. After a pause it does when it is a
        streamed chunk: about the previous packet's size (and not a full packet), and
        either the waiting request was sent before that previous packet (the stream
        went on after it), or it comes at most twice the last pause between server
        packets (plus a burst) after it.
        """
        req = self.pending[0]
        active = self.active
        assert active is not None and active.first_byte_ns is not None
        if gap < EST_BURST_NS:
            return not (req.ts_ns - active.ts_ns < EST_TOGETHER_NS
                        and req.ts_ns < active.first_byte_ns
                        and prev - active.first_byte_ns < EST_BURST_NS)
        if abs(size - prev_len) > EST_SIZE_TOL or size >= EST_FULL:
            return False
        return req.ts_ns < prev or (self.gap > 0 and gap <= 2 * self.gap + EST_BURST_NS)

    def close(self) -> list[Request]:
        """The estimated requests; a first flight never answered is dropped (setup)."""
        setup = self.setup
        if (setup is not None and setup.first_byte_ns is None and self.requests
                and self.requests[-1] is setup):
            self.requests.pop()
        self.setup = None
        self.pending.clear()
        return self.requests


class QuicConnection:
    """One QUIC connection: its record (``conn``) and the state that fills it."""

    def __init__(self, analyzer: QuicAnalyzer, conn: Connection, version: int) -> None:
        self.analyzer = analyzer
        self.conn = conn
        """The record (``transport`` ``udp``), a session of the flow table."""
        self.tls = TlsAnalyzer()
        """Reads the ClientHello and ServerHello (its ``info`` is ``conn.tls``)."""
        conn.tls = self.tls.info
        conn.tls.version = "TLS 1.3"
        self.version = version
        self.versions_offered: list[int] | None = None
        self.retry = False
        self.client_cids: list[bytes] = []
        self.server_cids: list[bytes] = []
        self.cids = 0
        self.paths: list[str] = [conn.client]
        self.keys_dcid: bytes | None = None
        self.ctx: list[list[CryptoContext | None]] = [[None, None], [None, None],
                                                      [None, None]]
        self.largest: list[list[int]] = [[-1, -1], [-1, -1], [-1, -1]]
        self.crypto: dict[tuple[int, int], _Reassembly] = {}
        self.hs: dict[tuple[int, int], _Handshake] = {}
        self.streams: dict[tuple[int, int], _Reassembly] = {}
        self.h3: Http3 | None = None
        self.app_alpn: str | None = None
        self.server_handshake = False
        self.server_spoke = False
        """The server sent a packet other than Version Negotiation and Retry."""
        self.zero_rtt_packets = 0
        self.zero_rtt_accepted: bool | None = None
        self.pending_0rtt: list[tuple[int, int, bytes, int]] = []
        self.packet_counts = [0] * 6
        self.undecrypted = 0
        self.frames: dict[str, int] = {}
        self.close_info: dict[str, Any] | None = None
        self.handshake_done_ns: int | None = None
        self.keyed = False
        self.app_decrypted = False
        """A 1-RTT packet was decrypted: the requests are read, not estimated."""
        self.estimator: _Estimator | None = None
        """Requests estimated from the 1-RTT packets while none decrypts (h3 offered)."""
        self.estimate = True
        self.secrets: dict[str, bytes] | None = None
        self.warnings: list[str] = []
        self.limits_hit: dict[str, int] = {}
        self.failure: str | None = None
        """Why the analyzer stopped reading this connection (a bug), else None."""
        self.trace: list[dict[str, Any]] | None = [] if analyzer.trace else None
        """Per decrypted packet (tests): packet number, space, frames."""

    # -- session interface (flow table) ------------------------------------------------
    def finish(self, ts: int, reason: str) -> None:
        """The connection ends: fill the record."""
        conn = self.conn
        if conn.close == "open":
            conn.close = reason
        self.analyzer.forget(self)
        h3 = self.h3
        if h3 is not None:
            conn.requests = h3.requests
            for k, v in h3.limits_hit.items():
                self.limits_hit[k] = self.limits_hit.get(k, 0) + v
            for msg in h3.warnings:
                self.warn(msg)
        estimator, self.estimator = self.estimator, None
        if estimator is not None and h3 is None and not self.app_decrypted:
            conn.requests = estimator.close()
        info = conn.tls
        assert info is not None
        alpn = info.alpn
        if alpn is not None:
            conn.protocol = alpn
        elif any(a.startswith("h3") for a in info.alpn_offered):
            conn.protocol = "h3"
        else:
            conn.protocol = "quic"
        for msg in self.tls.warnings:
            self.warn(msg)
        zero_rtt = self.zero_rtt_packets > 0
        facts: QuicJson = {
            "version": w.version_name(self.version),
            "zero_rtt": {"attempted": zero_rtt,
                         "accepted": self.zero_rtt_accepted if zero_rtt else False,
                         "packets": self.zero_rtt_packets},
            "retry": self.retry,
            "version_negotiation": (None if self.versions_offered is None
                                    else [w.version_name(v) for v in self.versions_offered]),
            "migrations": len(self.paths) - 1,
            "client_endpoints": list(self.paths),
            "connection_ids": {"client": [c.hex() for c in self.client_cids],
                               "server": [c.hex() for c in self.server_cids]},
            "packets": {name: n for name, n in zip(w.TYPE_NAMES, self.packet_counts,
                                                   strict=True) if n},
            "undecrypted": self.undecrypted,
            "frames": dict(sorted(self.frames.items())) if self.keyed else None,
            "close": self.close_info,
            "handshake_done_ms": (None if self.handshake_done_ns is None
                                  else (self.handshake_done_ns - conn.ts_ns) / 1e6),
            "h3": None if h3 is None else h3.to_json(),
        }
        conn.quic = dict(facts)

    def warn(self, msg: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(msg)

    def _hit(self, name: str) -> None:
        self.limits_hit[name] = self.limits_hit.get(name, 0) + 1

    # -- packets ----------------------------------------------------------------------
    def datagram(self, d: int, ts: int, data: bytes, pkt: int) -> None:
        """One UDP payload of this connection, from the client (0) or the server (1)."""
        conn = self.conn
        conn.packets += 1
        conn.last_ns = ts
        if d == 0:
            conn.bytes_to_server += len(data)
        else:
            conn.bytes_to_client += len(data)
        p = 0
        n = len(data)
        while p < n:
            first = data[p]
            if not first & 0x80:
                if first & 0x40:  # else padding or junk after the coalesced packets
                    self._short(d, ts, data[p:], pkt)
                return
            try:
                hdr = w.parse_long(data, p)
            except w.QuicMalformed as e:
                if p == 0:
                    self.warn(f"quic: unreadable long header (packet {pkt}): {e}")
                return  # the rest of a datagram after padding or junk
            self._long(d, ts, data, hdr, pkt)
            p = hdr.end

    def _long(self, d: int, ts: int, data: bytes, hdr: w.LongHeader, pkt: int) -> None:
        conn = self.conn
        ptype = hdr.ptype
        self.packet_counts[ptype] += 1
        if d == 1 and conn.initial_answer_ns is None and ptype in (
                w.INITIAL, w.RETRY, w.VERSION_NEGOTIATION):
            conn.initial_answer_ns = ts
        if ptype == w.VERSION_NEGOTIATION:
            if d == 1:
                # RFC 9000 section 6.2: a client acts on the first VN only, before any
                # other server packet, and only when it does not list its own version
                if (self.versions_offered is None and not self.server_spoke
                        and self.version not in hdr.versions):
                    self._restart()  # its next Initial: the new version's keys
                self.versions_offered = hdr.versions[:16]
            return
        if ptype == w.RETRY:
            if d == 1:
                # RFC 9000 section 17.2.5.2: one Retry, before any other server packet
                if not self.retry and not self.server_spoke:
                    self._restart()  # the client's next Initial brings the new keys
                self.retry = True
                self._server_cid(hdr.scid)
            return
        if d == 1:
            self.server_spoke = True
        if hdr.version != self.version:
            self.version = hdr.version
        if hdr.version not in w.KNOWN_VERSIONS:
            # a version we cannot read beyond its connection ids (RFC 8999): counted as
            # an Initial, not decrypted; the client's starts the handshake's clock
            if d == 0:
                self._client_cid(hdr.scid)
                if conn.initial_ns is None:
                    conn.initial_ns = ts
            else:
                self._server_cid(hdr.scid)
            return
        if d == 0:
            self._client_cid(hdr.scid)
            if ptype == w.INITIAL:
                if conn.initial_ns is None:
                    conn.initial_ns = ts
                if self.keys_dcid is None:
                    self.keys_dcid = hdr.dcid
                    if hdr.version in w.KNOWN_VERSIONS:
                        c, s = w.initial_contexts(hdr.dcid, hdr.version)
                        self.ctx[SPACE_INITIAL] = [c, s]
            elif ptype == w.ZERO_RTT:
                self.zero_rtt_packets += 1
        else:
            self._server_cid(hdr.scid)
            if ptype == w.HANDSHAKE:
                self.server_handshake = True
        space = _SPACE_OF[ptype]
        packet = data[hdr.start:hdr.end]
        ctx = self.ctx[space][d]
        if ptype == w.ZERO_RTT and self.secrets is None:
            ctx = None
            if len(self.pending_0rtt) < MAX_PENDING_0RTT:
                self.pending_0rtt.append((ts, pkt, packet, hdr.pn_offset - hdr.start))
            self._estimate(d, ts, hdr.end - hdr.pn_offset - AEAD_TAG, True)
            return
        if ptype == w.ZERO_RTT:
            ctx = self._zero_rtt_ctx()
        self._decrypt(ctx, space, d, ts, packet, hdr.pn_offset - hdr.start, pkt,
                      w.TYPE_NAMES[ptype])

    def _restart(self) -> None:
        """After a Retry or a Version Negotiation the client starts its handshake again:
        new Initial keys (from the Destination Connection ID of its next Initial, and
        that Initial's version) and a new ClientHello at CRYPTO offset 0 with a new
        random (the key log's). The handshake keeps its start: ``client_hello_ns`` and
        the connection's first Initial (``docs/report.md``)."""
        self.keys_dcid = None
        self.ctx[SPACE_INITIAL] = [None, None]
        key = (SPACE_INITIAL, 0)
        self.crypto.pop(key, None)
        self.hs.pop(key, None)
        old = self.tls
        first = old.info
        for msg in old.warnings:
            self.warn(msg)
        self.tls = TlsAnalyzer()
        info = self.conn.tls = self.tls.info
        info.version = "TLS 1.3"
        info.client_hello_ns = first.client_hello_ns
        info.client_hello_packet = first.client_hello_packet

    def _short(self, d: int, ts: int, packet: bytes, pkt: int) -> None:
        conn = self.conn
        self.packet_counts[w.ONE_RTT] += 1
        if d == 1:
            self.server_spoke = True
        info = conn.tls
        assert info is not None
        if d == 0 and self.server_handshake and info.finished_ns is None:
            info.finished_ns = ts
            info.finished_packet = pkt
        cid_len = len(self.server_cids[0] if d == 0 and self.server_cids
                      else self.client_cids[0] if d == 1 and self.client_cids else b"")
        if self._decrypt(self.ctx[SPACE_APP][d], SPACE_APP, d, ts, packet, 1 + cid_len, pkt,
                         "1rtt"):
            self.app_decrypted = True
            self.estimator = None
            self.estimate = False
            return
        self._estimate(d, ts, len(packet) - 1 - cid_len - AEAD_TAG)

    def _estimate(self, d: int, ts: int, size: int, early: bool = False) -> None:
        """Feed a packet not decrypted to the request estimate (module doc)."""
        if not self.estimate:
            return
        est = self.estimator
        if est is None:
            # only for HTTP/3 (the client offered it), and never beside decrypted ones
            info = self.conn.tls
            assert info is not None
            self.estimate = any(a.startswith("h3") for a in info.alpn_offered)
            if not self.estimate:
                return
            est = self.estimator = _Estimator(self.limits_hit)
        est.packet(d, ts, size, early)

    def _decrypt(self, ctx: CryptoContext | None, space: int, d: int, ts: int,
                 packet: bytes, pn_offset: int, pkt: int, what: str) -> bool:
        """Decrypt and read one packet; False when it could not be decrypted."""
        if ctx is None:
            self.undecrypted += 1
            return False
        try:
            _hdr, payload, pn = w.unprotect(ctx, packet, pn_offset, self.largest[space][d] + 1)
        except w.QuicMalformed:
            self.undecrypted += 1
            return False
        if pn > self.largest[space][d]:
            self.largest[space][d] = pn
        if space != SPACE_INITIAL:
            self.keyed = True
            info = self.conn.tls
            assert info is not None
            info.decrypted = True
        try:
            frames = w.parse_frames(payload)
        except w.QuicMalformed as e:
            self.warn(f"quic: {what} packet {pn} from the "
                      f"{'client' if d == 0 else 'server'} (packet {pkt}): {e}")
            return True
        if self.trace is not None:
            self.trace.append({"packet": pkt, "direction": d, "type": what, "pn": pn,
                               "frames": [f.name for f in frames],
                               "frame_types": [f.ftype for f in frames],
                               "stream_ids": [f.stream_id for f in frames
                                              if f.name == "STREAM"]})
        for f in frames:
            self._frame(space, d, ts, pkt, f)
        return True

    # -- frames -----------------------------------------------------------------------
    def _frame(self, space: int, d: int, ts: int, pkt: int, f: w.Frame) -> None:
        ft = f.ftype
        name = f.name
        self.frames[name] = self.frames.get(name, 0) + 1
        if ft == w.CRYPTO:
            self._crypto(space, d, ts, pkt, f)
        elif w.STREAM_BASE <= ft <= 0x0F and space == SPACE_APP:
            self._stream(d, ts, f)
        elif ft == w.NEW_CONNECTION_ID:
            if d == 1:
                self._server_cid(f.data)
            else:
                self._client_cid(f.data)
        elif ft in (w.CONNECTION_CLOSE, w.CONNECTION_CLOSE_APP):
            if self.close_info is None:
                self.close_info = {
                    "from": "client" if d == 0 else "server", "error": f.value,
                    "application": ft == w.CONNECTION_CLOSE_APP,
                    "frame_type": f.extra if ft == w.CONNECTION_CLOSE else None,
                    "reason": f.data[:200].decode("utf-8", "replace"),
                    "ts": ts / 1e9}
            self.conn.close = "close"
        elif ft == w.HANDSHAKE_DONE:
            if self.handshake_done_ns is None:
                self.handshake_done_ns = ts
        elif ft == w.RESET_STREAM and self.h3 is not None and f.stream_id is not None:
            self.h3.reset(d, f.stream_id, f.value)

    def _crypto(self, space: int, d: int, ts: int, pkt: int, f: w.Frame) -> None:
        key = (space, d)
        r = self.crypto.get(key)
        if r is None:
            r = self.crypto[key] = _Reassembly()
            self.hs[key] = _Handshake()
        pieces = r.add(f.offset, f.data, ts, False, MAX_CRYPTO_HELD)
        if pieces is None:
            self._hit(LIMIT_QUIC_HELD)
            self.warn(f"quic: CRYPTO data of the {'client' if d == 0 else 'server'} "
                      f"held beyond {MAX_CRYPTO_HELD} bytes; the handshake is not read")
            return
        hs = self.hs[key]
        for data, t in pieces:
            self._messages(space, d, hs, data, t, pkt)

    def _messages(self, space: int, d: int, hs: _Handshake, data: bytes, ts: int,
                  pkt: int) -> None:
        p = 0
        while p < len(data):
            if hs.skip:
                take = min(hs.skip, len(data) - p)
                hs.skip -= take
                p += take
                continue
            if not hs.buf:
                hs.ts, hs.pkt = ts, pkt
            buf = hs.buf
            need = 4 if len(buf) < 4 else 4 + int.from_bytes(buf[1:4], "big")
            if len(buf) >= 4 and need - 4 > MAX_HS_MESSAGE:
                hs.skip = need - len(buf)
                buf.clear()
                continue
            take = min(need - len(buf), len(data) - p)
            buf += data[p:p + take]
            p += take
            if (len(buf) == need and need > 4) or (len(buf) == 4 and need == 4
                                                 and buf[1:4] == b"\0\0\0"):
                msg = bytes(buf)
                buf.clear()
                self._message(space, d, msg[0], msg[4:], hs.ts, hs.pkt)

    def _message(self, space: int, d: int, mtype: int, body: bytes, ts: int, pkt: int) -> None:
        info = self.conn.tls
        assert info is not None
        if space == SPACE_INITIAL and mtype in (HS_CLIENT_HELLO, HS_SERVER_HELLO):
            first_ch, first_pkt = info.client_hello_ns, info.client_hello_packet
            self.tls._on_hello(d, mtype, body, ts, pkt)
            if first_ch is not None:  # a ClientHello after a Retry or VN: the first's time
                info.client_hello_ns, info.client_hello_packet = first_ch, first_pkt
            if mtype == HS_SERVER_HELLO and d == 1:
                self._server_hello()
        elif mtype == HS_ENCRYPTED_EXTENSIONS and d == 1:
            self._encrypted_extensions(body)
        elif mtype == HS_NEW_SESSION_TICKET and d == 1:
            info.session_tickets += 1

    def _server_hello(self) -> None:
        info = self.conn.tls
        assert info is not None
        random = info.client_random
        cipher = self.tls.cipher_suite
        info.version = "TLS 1.3"
        if random is None or cipher is None or self.secrets is not None:
            return
        secrets = self.analyzer.keys(bytes(random))
        if not secrets:
            return
        self.secrets = secrets
        self.analyzer.client_randoms.add(bytes(random))
        labels = ((SPACE_HANDSHAKE, "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
                   "SERVER_HANDSHAKE_TRAFFIC_SECRET"),
                  (SPACE_APP, "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"))
        try:
            for space, cl, sl in labels:
                c, s = secrets.get(cl), secrets.get(sl)
                self.ctx[space] = [None if c is None else w.context(cipher, c, self.version),
                                   None if s is None else w.context(cipher, s, self.version)]
        except (KeyError, ValueError):
            info.decrypt_error = f"cipher suite 0x{cipher:04x} is not supported for QUIC"
            self.ctx[SPACE_HANDSHAKE] = [None, None]
            self.ctx[SPACE_APP] = [None, None]
            return
        pending, self.pending_0rtt = self.pending_0rtt, []
        ctx = self._zero_rtt_ctx()
        for ts, pkt, packet, pn_off in pending:
            self._decrypt(ctx, SPACE_APP, 0, ts, packet, pn_off, pkt, "0rtt")

    def _zero_rtt_ctx(self) -> CryptoContext | None:
        secrets = self.secrets
        cipher = self.tls.cipher_suite
        if not secrets or cipher is None:
            return None
        early = secrets.get("CLIENT_EARLY_TRAFFIC_SECRET")
        if early is None:
            return None
        try:
            return w.context(cipher, early, self.version)
        except (KeyError, ValueError):
            return None

    def _encrypted_extensions(self, body: bytes) -> None:
        from netdiag.protocols.tls import _alpn_list, _extensions

        info = self.conn.tls
        assert info is not None
        try:
            exts = _extensions(body, 0)
            alpn = exts.get(EXT_ALPN)
            if alpn is not None:
                names = _alpn_list(alpn)
                if names:
                    info.alpn = names[0]
            self.zero_rtt_accepted = EXT_EARLY_DATA in exts
        except Exception:
            self.warn("quic: malformed EncryptedExtensions")

    def _stream(self, d: int, ts: int, f: w.Frame) -> None:
        sid = f.stream_id
        assert sid is not None
        key = (sid, d)
        r = self.streams.get(key)
        if r is None:
            if len(self.streams) >= MAX_STREAMS:
                self._hit(LIMIT_QUIC_STREAMS)
                return
            r = self.streams[key] = _Reassembly()
        if self.h3 is None:
            info = self.conn.tls
            assert info is not None
            alpn = info.alpn or (info.alpn_offered[0] if info.alpn_offered else None)
            if alpn is None or not alpn.startswith("h3"):
                return
            self.h3 = Http3()
        h3 = self.h3
        pieces = r.add(f.offset, f.data, ts, f.fin, MAX_STREAM_HELD)
        if pieces is None:
            self._hit(LIMIT_QUIC_HELD)
            h3.lost(d, sid)
            return
        for data, t in pieces:
            h3.data(d, sid, t, data, False)
        if r.ended():
            h3.data(d, sid, r.fin_ts, b"", True)

    # -- connection ids -----------------------------------------------------------------
    def _client_cid(self, cid: bytes) -> None:
        if cid and cid not in self.client_cids and self.cids < MAX_CIDS:
            self.cids += 1
            self.client_cids.append(cid)
            self.analyzer.register(cid, self)

    def _server_cid(self, cid: bytes) -> None:
        if cid and cid not in self.server_cids and self.cids < MAX_CIDS:
            self.cids += 1
            self.server_cids.append(cid)
            self.analyzer.register(cid, self, server=True)


NewSession = Callable[[QuicConnection], str]
"""Gives a new connection its id (the flow table numbers it with the TCP ones)."""


class QuicAnalyzer:
    """Every QUIC connection of one run, by address pair and by connection id."""

    def __init__(self, new_session: NewSession, keys: Keys | None = None,
                 trace: bool = False) -> None:
        self.new_session = new_session
        self.keys: Keys = keys if keys is not None else (lambda _r: {})
        self.trace = trace
        self.by_pair: dict[tuple[str, str], tuple[QuicConnection, int]] = {}
        self.by_cid: dict[bytes, QuicConnection] = {}
        self.server_cid_lengths: set[int] = set()
        self.open = 0
        self.client_randoms: set[bytes] = set()
        """ClientHello randoms of the connections decrypted (their keys are embedded by
        ``--write-pcapng``)."""
        self.limits_hit: dict[str, int] = {}
        self.unmatched = 0
        """Datagrams that belonged to no connection seen from its first Initial."""
        self.servers: dict[str, int] = {}
        """Server end points of the connections seen (at most :data:`MAX_CONNECTIONS`):
        their open connections."""
        self.stray: dict[str, int] = {}
        """Per server end point, short-header packets that matched no connection id, not
        yet reported (:func:`stray_warning`, by its last open connection to finish)."""
        self.stray_reported = 0

    def register(self, cid: bytes, qc: QuicConnection, server: bool = False) -> None:
        """A connection id of ``qc`` (``server``: one the server chose)."""
        self.by_cid[cid] = qc
        if server:
            self.server_cid_lengths.add(len(cid))

    def forget(self, qc: QuicConnection) -> None:
        """``qc`` is finished: drop its keys from the tables."""
        for cid in qc.client_cids + qc.server_cids:
            if self.by_cid.get(cid) is qc:
                del self.by_cid[cid]
        for client in qc.paths:
            for pair in ((client, qc.conn.server), (qc.conn.server, client)):
                e = self.by_pair.get(pair)
                if e is not None and e[0] is qc:
                    del self.by_pair[pair]
        self.open -= 1
        server = qc.conn.server
        n = self.servers.get(server)
        if n is not None and n > 1:
            self.servers[server] = n - 1
        elif n is not None:
            # its last open connection: report the packets no connection id matched
            # (kept, and counted, until the server has a connection again)
            self.servers[server] = 0
            stray = self.stray.pop(server, 0)
            if stray:
                self.stray_reported += stray
                qc.warn(stray_warning(stray, server))

    def on_datagram(self, ts: int, src: str, dst: str, data: bytes, pkt: int) -> None:
        """One UDP payload the flow table routed as QUIC."""
        if not data:
            return
        entry = self.by_pair.get((src, dst))
        if entry is None:
            entry = self._find(ts, src, dst, data, pkt)
            if entry is None:
                self.unmatched += 1
                return
        qc, d = entry
        if qc.failure is not None:
            qc.conn.packets += 1
            qc.conn.last_ns = ts
            return
        try:
            qc.datagram(d, ts, data, pkt)
        except Exception as e:  # a bug: the connection keeps what it had, and says so
            qc.failure = f"{type(e).__name__} at packet {pkt}"
            qc.warnings.append(f"quic analyzer failed ({qc.failure}); please report this "
                               "netdiag bug")

    def _find(self, ts: int, src: str, dst: str, data: bytes,
              pkt: int) -> tuple[QuicConnection, int] | None:
        first = data[0]
        qc: QuicConnection | None = None
        if first & 0x80:
            try:
                hdr = w.parse_long(data, 0)
            except w.QuicMalformed:
                return None
            qc = self.by_cid.get(hdr.dcid)
            if qc is None:
                if hdr.ptype != w.INITIAL:
                    return None
                if hdr.version in w.KNOWN_VERSIONS:
                    if not (_port(dst) in QUIC_PORTS or (_port(src) not in QUIC_PORTS
                                                         and len(data) >= MIN_INITIAL)):
                        return None  # a server's Initial whose client's was not captured
                elif _port(dst) not in QUIC_PORTS or len(data) < MIN_INITIAL:
                    # an unknown version starts a connection only as a client's first
                    # datagram (Initial-sized, RFC 9000 section 14.1) to a QUIC port,
                    # where the server answers it with Version Negotiation
                    return None
                return self._new(ts, src, dst, hdr.version)
        else:
            for n in self.server_cid_lengths:
                qc = self.by_cid.get(data[1:1 + n])
                if qc is not None:
                    break
            if qc is None:
                self._stray(src, dst)
                return None
        conn = qc.conn
        if dst == conn.server:  # the client from a new address: a migration
            if src not in qc.paths:
                if len(qc.paths) >= MAX_PATHS:
                    return None
                qc.paths.append(src)
                est = qc.estimator
                if est is not None:
                    rtt = max((conn.initial_answer_ns or 0) - (conn.initial_ns or 0), 0)
                    est.path_changed(ts, 2 * rtt + EST_BURST_NS)
            entry = (qc, 0)
            self.by_pair[(src, dst)] = entry
            self.by_pair[(dst, src)] = (qc, 1)
            return entry
        if src == conn.server and dst in qc.paths:
            entry = (qc, 1)
            self.by_pair[(src, dst)] = entry
            return entry
        return None

    def _stray(self, src: str, dst: str) -> None:
        """A short-header packet whose connection id matches no connection: counted
        against the server end point of a connection seen, if either end is one."""
        servers = self.servers
        server = dst if dst in servers else src if src in servers else None
        if server is None:  # no connection seen to either end: a QUIC port's end point
            server = dst if _port(dst) in QUIC_PORTS else src if _port(src) in QUIC_PORTS \
                else None
            if server is None or (server not in self.stray and len(self.stray) >= MAX_STRAY):
                return
        self.stray[server] = self.stray.get(server, 0) + 1

    def _new(self, ts: int, client: str, server: str,
             version: int) -> tuple[QuicConnection, int] | None:
        if self.open >= MAX_CONNECTIONS:
            self.limits_hit[LIMIT_QUIC_CONNECTIONS] = (
                self.limits_hit.get(LIMIT_QUIC_CONNECTIONS, 0) + 1)
            return None
        conn = Connection(id="", ts_ns=ts, client=client, server=server, transport="udp",
                          last_ns=ts, protocol="quic")
        qc = QuicConnection(self, conn, version)
        conn.id = self.new_session(qc)
        self.open += 1
        servers = self.servers
        if server in servers or len(servers) < MAX_CONNECTIONS:
            servers[server] = servers.get(server, 0) + 1
        entry = (qc, 0)
        self.by_pair[(client, server)] = entry
        self.by_pair[(server, client)] = (qc, 1)
        return entry


def stray_warning(n: int, server: str) -> str:
    """The warning for ``n`` packets to or from ``server`` that match no connection."""
    return (f"{n} QUIC packet{'s' if n != 1 else ''} to or from {server} match no "
            "connection id seen (a migration to a new connection id, invisible without "
            "keys, or a connection that started before the capture)")


def _port(ep: str) -> int:
    return int(ep.rpartition(":")[2])


def requests_of(qc: QuicConnection) -> list[Request]:
    """The requests of a finished connection (decoded HTTP/3, else estimated, else none)."""
    return qc.conn.requests
