"""``run_http3_probe``: the phases of HTTP/3 requests (``netdiag probe --http3``).

The same probe as :mod:`netdiag.probe.http`, over QUIC: a connected UDP socket,
aioquic's QUIC state machine (``QuicConnection``) and its HTTP/3 layer
(``H3Connection``) driven by hand, without an event loop, so that every timer sits
at the system call it names (``sendto`` / ``recv`` of the datagrams). Marks are
``time.perf_counter_ns()`` (durations) and ``time.time_ns()`` (epoch), as there.

Phases of one request
---------------------
``dns``
    As for HTTP/2 (``netdiag.probe.http._resolve``): skipped for IP literals and on a
    reused connection.
``handshake``
    The QUIC handshake, which is TCP's connect and TLS's handshake in one: from the
    ``send()`` of the client's first Initial datagram to the ``send()`` of the
    datagrams carrying our TLS Finished (aioquic reports the handshake complete when
    it has read the server's Finished; our Finished leaves in the very next flush).
    A capture of it spans the first Initial to the client's Handshake-space
    Finished. There is no ``connect`` or ``tls`` phase (both ``None``).
``send``
    Connection ready (handshake end, or the start of the request on a reused
    connection) -> the return of the last ``send()`` of the datagrams carrying the
    request (HEADERS, and DATA for a body).
``ttfb``
    The first ``send()`` of the request's datagrams -> the return of the ``recv()``
    whose datagram, once decrypted, yields the response's HEADERS frame on the
    request's stream (a QUIC packet is decrypted whole: the first byte and the whole
    HEADERS frame come in the same datagram unless the frame spans datagrams).
``wait``
    Request written -> first byte.
``transfer``
    First byte -> the ``recv()`` of the datagram that ends the request's stream (FIN).
``total``
    Start -> last byte.

Reuse
-----
With ``reuse`` one QUIC connection carries every request, each on a new
bidirectional stream (0, 4, 8, ...), one after the other; with ``reuse=False`` every
request resolves and handshakes afresh (no session resumption, no 0-RTT). A
connection is closed with CONNECTION_CLOSE (no error) at the end.

Failures (ICMP port unreachable -> "connection refused", handshake timeout, a TLS
alert in CONNECTION_CLOSE, a stream reset) are recorded per request, never raised; a
bad URL or option raises :class:`~netdiag.errors.InputError`.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from netdiag.errors import InputError
from netdiag.probe.dns import endpoint, parse_server, warm_up
from netdiag.probe.http import (
    NS_PER_MS,
    USER_AGENT,
    ProbeResult,
    RequestResult,
    _Deadline,
    _Failed,
    _is_ip,
    _reason,
    _resolve,
    _Target,
    _target,
    check_request_options,
    request_loop,
)
from netdiag.probe.marks import Mark

PHASES3 = ("dns", "handshake", "send", "wait", "ttfb", "transfer", "total")
"""Every duration an HTTP/3 request measures, in ``<phase>_ms`` fields (``connect_ms``
and ``tls_ms`` are there too, always null: QUIC has one handshake)."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_RECV = 65536


@dataclass(slots=True)
class H3RequestResult(RequestResult):
    """One HTTP/3 request: :class:`RequestResult` with ``handshake`` for
    ``connect`` + ``tls`` (marks ``handshake_start`` / ``handshake_end``)."""

    def phases_ns(self) -> dict[str, int | None]:
        return {
            "dns": self._span("dns_start", "dns_end"),
            "connect": None,
            "tls": None,
            "handshake": self._span("handshake_start", "handshake_end"),
            "send": self._span("ready", "written"),
            "wait": self._span("written", "first_byte"),
            "ttfb": self._span("request", "first_byte"),
            "transfer": self._span("first_byte", "last_byte"),
            "total": self._span("start", "last_byte"),
        }

    @property
    def failed_after_ms(self) -> float | None:
        if self.failed_phase is None:
            return None
        start = {"dns": "dns_start", "handshake": "handshake_start", "send": "ready",
                 "ttfb": "request", "transfer": "first_byte"}
        span = self._span(start.get(self.failed_phase, "start"), "failed")
        return None if span is None else span / NS_PER_MS


@dataclass
class H3ProbeResult(ProbeResult):
    """The outcome of :func:`run_http3_probe` (``http`` is ``"3"`` in its JSON)."""

    http3: bool = True

    def summary(self) -> dict[str, Any]:
        from netdiag.analysis.stats import percentiles

        out = super().summary()  # (connect_ms and tls_ms: count 0)
        phases = [r.phases_ms() for r in self.requests]
        out["phases"]["handshake_ms"] = percentiles([p.get("handshake") for p in phases])
        out["handshakes"] = sum(1 for r in self.requests if "handshake_end" in r.marks)
        return out

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["http"] = "3"
        return out


# --------------------------------------------------------------------------- connection


class _QuicConn:
    """One QUIC connection on a connected UDP socket, driven synchronously."""

    def __init__(self, number: int, sock: socket.socket, quic: Any) -> None:
        from aioquic.h3.connection import H3Connection

        self.number = number
        self.sock = sock
        self.quic = quic
        self.h3: Any = None
        self._h3_class = H3Connection
        self.usable = True
        local, remote = sock.getsockname(), sock.getpeername()
        self.local = endpoint(local[0], local[1])
        self.remote = endpoint(remote[0], remote[1])
        self.addr = (remote[0], remote[1])
        self.cipher: str | None = None
        self.alpn: str | None = None
        self.handshake_done = False
        self.closed_reason: str | None = None
        self.first_headers: dict[int, tuple[Mark, int]] = {}
        """stream id -> (mark of the datagram that brought the response HEADERS, status)."""
        self.ended: dict[int, Mark] = {}
        """stream id -> mark of the datagram that ended the stream."""
        self.body_bytes: dict[int, int] = {}
        self.reset: dict[int, int] = {}

    def describe(self, rec: RequestResult) -> None:
        rec.connection = self.number
        rec.local, rec.remote = self.local, self.remote
        rec.tls_version, rec.cipher, rec.alpn = "TLS 1.3", self.cipher, self.alpn
        rec.http_version = "HTTP/3"

    def flush(self) -> None:
        """Send every datagram aioquic has ready (raises OSError)."""
        for data, _addr in self.quic.datagrams_to_send(now=time.monotonic()):
            self.sock.send(data)

    def _events(self, mark: Mark) -> None:
        from aioquic.h3.events import DataReceived, HeadersReceived
        from aioquic.quic.events import (
            ConnectionTerminated,
            HandshakeCompleted,
            StreamReset,
        )

        while True:
            event = self.quic.next_event()
            if event is None:
                return
            if isinstance(event, HandshakeCompleted):
                self.handshake_done = True
                self.alpn = event.alpn_protocol
                ks = getattr(self.quic.tls, "key_schedule", None)
                suite = getattr(ks, "cipher_suite", None)
                self.cipher = f"TLS_{suite.name}" if suite is not None else None
                self.h3 = self._h3_class(self.quic)
            elif isinstance(event, ConnectionTerminated):
                self.usable = False
                reason = event.reason_phrase or f"error 0x{event.error_code:x}"
                self.closed_reason = reason
            elif isinstance(event, StreamReset):
                self.reset[event.stream_id] = event.error_code
            if self.h3 is None:
                continue
            for h3_event in self.h3.handle_event(event):
                sid = getattr(h3_event, "stream_id", None)
                if not isinstance(sid, int):
                    continue
                if isinstance(h3_event, HeadersReceived) and sid not in self.first_headers:
                    status = next((v for k, v in h3_event.headers if k == b":status"), b"0")
                    self.first_headers[sid] = (mark, int(status))
                elif isinstance(h3_event, DataReceived):
                    self.body_bytes[sid] = self.body_bytes.get(sid, 0) + len(h3_event.data)
                if getattr(h3_event, "stream_ended", False) and sid not in self.ended:
                    self.ended[sid] = mark

    def pump(self, deadline: _Deadline, phase: str) -> Mark:
        """Wait for one datagram (or the QUIC timer), feed it; the mark of its recv()."""
        timer = self.quic.get_timer()
        left = deadline.left(phase)
        wait = left if timer is None else max(0.0, min(left, timer - time.monotonic()))
        self.sock.settimeout(wait if wait > 0 else 1e-6)
        try:
            data = self.sock.recv(_RECV)
        except TimeoutError:
            mark = Mark.now()
            if timer is not None and time.monotonic() >= timer:
                self.quic.handle_timer(now=time.monotonic())
                self._events(mark)
                self.flush()
            deadline.left(phase)  # raises at the deadline
            return mark
        mark = Mark.now()
        self.quic.receive_datagram(data, self.addr, now=time.monotonic())
        self._events(mark)
        self.flush()
        return mark

    def close(self) -> None:
        """CONNECTION_CLOSE (no error); no wait: QUIC needs no answer to it."""
        with contextlib.suppress(Exception):
            if self.closed_reason is None:
                self.quic.close(error_code=0, reason_phrase="")
                self.flush()
        with contextlib.suppress(OSError):
            self.sock.close()


def _configuration(target: _Target, keylog: TextIO | None, insecure: bool,
                   cafile: str | None) -> Any:
    from aioquic.h3.connection import H3_ALPN
    from aioquic.quic.configuration import QuicConfiguration

    cfg = QuicConfiguration(is_client=True, alpn_protocols=list(H3_ALPN),
                            server_name=None if _is_ip(target.host) else target.host,
                            secrets_log_file=keylog)
    if insecure:
        cfg.verify_mode = ssl.CERT_NONE
    elif cafile is not None:
        try:
            cfg.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise InputError(f"cannot load CA file {cafile}: {exc}") from None
    return cfg


def _open(target: _Target, cfg: Any, number: int, rec: H3RequestResult,
          deadline: _Deadline, dns_server: str | None) -> _QuicConn:
    from aioquic.quic.connection import QuicConnection

    host = target.connect_host
    addr = (str(ipaddress.ip_address(host)) if _is_ip(host)
            else _resolve(host, dns_server, deadline, rec))
    rec.resolved = addr
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.connect((addr, target.connect_port))  # ICMP unreachable -> ECONNREFUSED
    except OSError as exc:
        sock.close()
        raise _Failed("handshake", _reason(exc, deadline.timeout)) from None
    conn = _QuicConn(number, sock, QuicConnection(configuration=cfg))
    rec.local, rec.remote = conn.local, conn.remote
    rec.connection = number  # endpoints known even if the handshake fails
    try:
        rec.mark("handshake_start")
        conn.quic.connect(conn.addr, now=time.monotonic())
        conn.flush()
        while not conn.handshake_done:
            if conn.closed_reason is not None:
                raise _Failed("handshake", f"QUIC handshake failed: {conn.closed_reason}")
            conn.pump(deadline, "handshake")
        conn.flush()  # our Finished (already sent by pump's flush, normally)
        rec.mark("handshake_end")
    except _Failed:
        conn.close()
        raise
    except OSError as exc:
        conn.close()
        reason = _reason(exc, deadline.timeout)
        if isinstance(exc, ConnectionRefusedError):
            reason += " (nothing listens on that UDP port)"
        raise _Failed("handshake", reason) from None
    conn.describe(rec)
    if conn.alpn not in ("h3",):
        conn.close()
        raise _Failed("handshake", f"the server chose ALPN {conn.alpn!r}, not h3")
    return conn


def _exchange(conn: _QuicConn, rec: H3RequestResult, method: str,
              headers: list[tuple[str, str]], target: _Target, deadline: _Deadline) -> None:
    names = {n.lower() for n, _ in headers}
    fields = [(b":method", method.encode()), (b":scheme", b"https"),
              (b":authority", target.authority.encode()), (b":path", target.path.encode())]
    if "user-agent" not in names:
        fields.append((b"user-agent", USER_AGENT.encode()))
    if "accept" not in names:
        fields.append((b"accept", b"*/*"))
    fields += [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    body = method in _BODY_METHODS and "content-length" not in names
    if body:
        fields.append((b"content-length", b"0"))
    sid = conn.quic.get_next_available_stream_id()
    rec.stream_id = sid
    try:
        conn.h3.send_headers(sid, fields, end_stream=True)
        datagrams = conn.quic.datagrams_to_send(now=time.monotonic())
        rec.mark("request")
        for data, _addr in datagrams:
            conn.sock.send(data)
        rec.mark("written")
    except OSError as exc:
        conn.usable = False
        raise _Failed("send", _reason(exc, deadline.timeout)) from None
    try:
        while sid not in conn.first_headers:
            if conn.closed_reason is not None:
                raise _Failed("ttfb", f"connection closed by the server: {conn.closed_reason}")
            if sid in conn.reset:
                raise _Failed("ttfb", f"stream reset by the server "
                                      f"(error 0x{conn.reset[sid]:x})")
            conn.pump(deadline, "ttfb")
        mark, status = conn.first_headers[sid]
        rec.marks["first_byte"] = mark
        rec.status = status
        while sid not in conn.ended:
            if conn.closed_reason is not None:
                raise _Failed("transfer", f"connection closed by the server: "
                                          f"{conn.closed_reason}")
            if sid in conn.reset:
                raise _Failed("transfer", f"stream reset by the server "
                                          f"(error 0x{conn.reset[sid]:x})")
            conn.pump(deadline, "transfer")
    except OSError as exc:
        conn.usable = False
        phase = "transfer" if "first_byte" in rec.marks else "ttfb"
        raise _Failed(phase, _reason(exc, deadline.timeout)) from None
    except _Failed:
        conn.usable = False
        raise
    rec.marks["last_byte"] = conn.ended[sid]
    rec.response_bytes = conn.body_bytes.get(sid, 0)
    conn.first_headers.pop(sid, None)
    conn.ended.pop(sid, None)
    conn.body_bytes.pop(sid, None)


def _open_keylog(keylog: str | Path | None) -> TextIO | None:
    if keylog is None:
        return None
    try:
        return open(keylog, "a", encoding="ascii", buffering=1)
    except OSError as exc:
        raise InputError(f"cannot write key log {keylog}: {exc}") from None


def run_http3_probe(url: str, *, count: int = 1, reuse: bool = True, method: str = "GET",
                    keylog: str | Path | None = None, dns_server: str | None = None,
                    connect_to: str | None = None, timeout: float = 10.0,
                    insecure: bool = False, cafile: str | None = None,
                    headers: list[tuple[str, str]] | None = None) -> H3ProbeResult:
    """Send ``count`` HTTP/3 requests to ``url`` and time every phase of each.

    The options mean what they mean for :func:`netdiag.probe.http.run_http_probe`
    (``connect_to`` names a UDP port); ``keylog`` receives the QUIC connection's TLS
    secrets (NSS key log). Failures are recorded per request; a bad URL or option
    raises :class:`InputError`.
    """
    method, hdrs = check_request_options(count, timeout, method, headers)
    target = _target(url, connect_to)
    if target.scheme != "https":
        raise InputError(f"bad URL {url!r}: HTTP/3 needs https://")
    if dns_server is not None:
        parse_server(dns_server)
    try:
        for module in ("aioquic.quic.connection", "aioquic.h3.connection",
                       "aioquic.h3.events", "aioquic.quic.events"):
            importlib.import_module(module)
    except ImportError:
        raise InputError("--http3 needs the 'aioquic' package (pip install aioquic)") from None
    if not _is_ip(target.connect_host):
        warm_up()
    log_file = _open_keylog(keylog)
    result = H3ProbeResult(url=url, method=method, count=count, reuse=reuse, http1=False)

    def new_record(i: int) -> H3RequestResult:
        rec = H3RequestResult(index=i, method=method, url=url)
        result.requests.append(rec)
        return rec

    def open_conn(number: int, rec: H3RequestResult, deadline: _Deadline) -> _QuicConn:
        conn = _open(target, cfg, number, rec, deadline, dns_server)
        rec.marks["ready"] = rec.marks["handshake_end"]
        return conn

    def exchange(conn: _QuicConn, rec: H3RequestResult, deadline: _Deadline) -> None:
        _exchange(conn, rec, method, hdrs, target, deadline)

    try:
        cfg = _configuration(target, log_file, insecure, cafile)
        request_loop(count, reuse, timeout, new_record, open_conn, exchange)
    finally:
        if log_file is not None:
            log_file.close()
    return result
