"""``run_http_probe``: curl -w / httpstat done properly, over HTTP/2 or HTTP/1.1.

The client is written here, on a plain socket + :mod:`ssl` + the ``h2`` state
machine (HTTP/2) or a minimal HTTP/1.1 writer and reader, so that every timer is
ours and sits exactly at the system call it names.

Clocks
------
Each event is a *mark*: ``time.perf_counter_ns()`` (monotonic: every duration is a
difference of these) and ``time.time_ns()`` (epoch: the clock a capture stamps its
packets with, for request-by-request comparison with a capture). Durations are
derived from the marks in one place, :meth:`RequestResult.phases_ns`.

Phases of one request
---------------------
``dns``
    ``dns.resolver.Resolver.resolve()`` of the host connected to (A, then AAAA if
    there is no A): with ``dns_server`` a resolver asking only that server, else the
    system's configuration (``/etc/hosts`` first, as ``getaddrinfo`` does, then the
    ``/etc/resolv.conf`` nameservers). Timed from the first query handed to the
    kernel to the return of the ``recv()`` that brought the answer used
    (:mod:`netdiag.probe.stamped_dns`), across every query the resolver made (AAAA
    after an A without answer, TCP after a truncated answer): a capture's
    ``dns[].latency_ms`` of the same lookup, without the resolver's own work around
    it. A hosts-file answer, or a lookup that failed, is timed around the whole call.
    Skipped (``None``) when the host is an IP literal, and on a reused connection.
``connect``
    ``socket.connect()``: call to return, i.e. SYN sent -> SYN-ACK received (the
    kernel sends the final ACK before waking us). A capture's
    ``handshake_rtt_ms`` spans SYN -> ACK.
``tls``
    ``SSLSocket.do_handshake()``: call to return. It starts with building the
    ClientHello and ends once the handshake is complete on our side (TLS 1.3: our
    Finished is written; TLS 1.2 full handshake: the server's Finished is read),
    which is what a capture's ``tls.handshake_ms`` spans, plus the ClientHello's
    construction and the certificate verification.
``send``
    From the moment the connection is ready (handshake end, connect end for
    ``http://``, or the start of the request on a reused connection) to the return
    of the ``sendall()`` that hands the request's last byte to the kernel (curl's
    ``time_pretransfer`` plus the write). For HTTP/2 the first request also carries
    the connection preface and SETTINGS in the same write.
``ttfb``
    From the moment the request's first bytes -- the HEADERS frame (HTTP/2) or the
    request line (HTTP/1.1) -- are handed to ``sendall()`` to the moment the first
    byte of the response's first HEADERS frame on the request's stream (HTTP/2) or
    the first response byte (HTTP/1.1) is available to us. We only see bytes when
    ``recv()`` returns (after the kernel received the packet and OpenSSL decrypted
    the record), so the first-byte time is the return of the ``recv()`` whose data
    holds that first byte. This is the contract's ``requests[].ttfb_ms``, seen from
    user space: the capture measures the same span between the two packets.
``wait``
    Request fully written -> first byte (httpstat's "server processing"); equals
    ``ttfb`` minus the time the write took after its first byte was handed over.
``transfer``
    First byte -> last byte: the ``recv()`` return that completed the frame
    carrying END_STREAM (HTTP/2), or the last byte of the HTTP/1.1 message
    (Content-Length, chunked terminator, or the last data before the server closed
    a close-delimited body).
``total``
    Start of the request (before ``dns``, or at request start on a reused
    connection) -> last byte. ``dns + connect + tls + send + wait + transfer`` falls
    short of ``total`` only by the microseconds between the phases (creating the
    socket, wrapping it in TLS): each phase is timed tightly around its own system
    call so that it can be compared with a capture.

Absolute epoch times (``*_epoch_ns``) are kept for the start of every phase, for the
moment the request was handed to the socket (``request``) and for the first and last
byte.

Reuse
-----
With ``reuse`` (the default) one connection carries every request, one after the
other; only the first request resolves, connects and handshakes, later ones are
marked ``reused``. If the server ends the connection (GOAWAY, ``Connection: close``,
an error), the next request opens a new one. With ``reuse=False`` every request
resolves, connects and handshakes afresh (no TLS session resumption).

Failures
--------
Refused connections, timeouts, TLS failures, NXDOMAIN, a server closing early or
resetting the stream are recorded in the request (``ok=False``, ``error``,
``failed_phase``), never raised. ``timeout`` bounds each request as a whole (like
curl's ``--max-time``). A bad URL or option raises
:class:`~netdiag.errors.InputError`.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from netdiag import __version__
from netdiag.analysis.stats import percentiles
from netdiag.errors import InputError
from netdiag.gcpolicy import paused as gc_paused
from netdiag.probe.dns import endpoint, parse_server, warm_up
from netdiag.probe.marks import Mark

NS_PER_MS = 1_000_000
USER_AGENT = f"netdiag-probe/{__version__}"
PHASES = ("dns", "connect", "tls", "send", "wait", "ttfb", "transfer", "total")
"""Every duration a request reports, in ``<phase>_ms`` fields."""
TLS_NAMES = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2", "TLSv1.1": "TLS 1.1",
             "TLSv1": "TLS 1.0"}
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                         "upgrade", "host", "te"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_RECV = 65536
_H2_DEFER_BYTES = 16384
"""Received HTTP/2 bytes held back from ``h2`` while no frame needs it at once (see
:attr:`_H2FrameClock.attention`): parsing a HEADERS frame takes ``h2`` 0.2-1 ms, and
bytes that arrive meanwhile would be stamped when the parsing ends. A quarter of the
65,535-byte flow-control window that ``h2`` acknowledges at half: the server never
waits for a WINDOW_UPDATE that held-back bytes delay."""


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class RequestResult:
    """One request: its marks, what the connection was, what came back."""

    index: int
    """1-based position in the run."""
    method: str
    url: str
    marks: dict[str, Mark] = field(default_factory=dict)
    """``start``, ``dns_start``/``dns_end``, ``connect_start``/``connect_end``,
    ``tls_start``/``tls_end``, ``ready``, ``request`` (first request byte handed to the
    socket), ``written``, ``first_byte``, ``last_byte``, ``failed`` -- those reached."""
    connection: int | None = None
    """1-based number of the connection that carried it (None: none was established)."""
    reused: bool = False
    """Sent on a connection an earlier request opened."""
    resolved: str | None = None
    """Address connected to."""
    dns_source: str | None = None
    """``hosts``, the DNS server that answered (``ip:port``; ``system`` when the system
    configuration's servers did not answer) or None (IP literal, reused connection)."""
    local: str | None = None
    remote: str | None = None
    tls_version: str | None = None
    cipher: str | None = None
    """IANA name of the negotiated cipher suite."""
    alpn: str | None = None
    http_version: str | None = None
    """``HTTP/2`` or ``HTTP/1.1`` (``HTTP/1.0`` if the server answers so)."""
    stream_id: int | None = None
    status: int | None = None
    response_bytes: int | None = None
    """Response body bytes (decoded from chunked encoding)."""
    error: str | None = None
    failed_phase: str | None = None
    """``dns``, ``connect``, ``tls``, ``send``, ``ttfb`` or ``transfer``."""

    @property
    def ok(self) -> bool:
        """A complete response came back (any status)."""
        return self.error is None and "last_byte" in self.marks

    def mark(self, name: str) -> Mark:
        m = Mark.now()
        self.marks[name] = m
        return m

    def _span(self, a: str, b: str) -> int | None:
        ma, mb = self.marks.get(a), self.marks.get(b)
        return None if ma is None or mb is None else mb.perf_ns - ma.perf_ns

    def phases_ns(self) -> dict[str, int | None]:
        """Every phase's duration in ns (None when not reached or not done)."""
        return {
            "dns": self._span("dns_start", "dns_end"),
            "connect": self._span("connect_start", "connect_end"),
            "tls": self._span("tls_start", "tls_end"),
            "send": self._span("ready", "written"),
            "wait": self._span("written", "first_byte"),
            "ttfb": self._span("request", "first_byte"),
            "transfer": self._span("first_byte", "last_byte"),
            "total": self._span("start", "last_byte"),
        }

    def phases_ms(self) -> dict[str, float | None]:
        return {k: None if v is None else v / NS_PER_MS for k, v in self.phases_ns().items()}

    def epoch_ns(self, name: str) -> int | None:
        m = self.marks.get(name)
        return None if m is None else m.epoch_ns

    @property
    def failed_after_ms(self) -> float | None:
        """Time from the start of the failing phase to the failure."""
        if self.failed_phase is None:
            return None
        start = {"dns": "dns_start", "connect": "connect_start", "tls": "tls_start",
                 "send": "ready", "ttfb": "request", "transfer": "first_byte"}
        span = self._span(start.get(self.failed_phase, "start"), "failed")
        return None if span is None else span / NS_PER_MS

    def to_json(self) -> dict[str, Any]:
        ep = {name: m.epoch_ns for name, m in self.marks.items()}
        return {
            "index": self.index, "ok": self.ok, "method": self.method, "url": self.url,
            "connection": self.connection, "reused": self.reused,
            "ts": ep["start"] / 1e9 if "start" in ep else None,
            "request_ts": ep["request"] / 1e9 if "request" in ep else None,
            "first_byte_ts": ep["first_byte"] / 1e9 if "first_byte" in ep else None,
            "resolved": self.resolved, "dns_source": self.dns_source,
            "local": self.local, "remote": self.remote, "tls_version": self.tls_version,
            "cipher": self.cipher, "alpn": self.alpn, "http_version": self.http_version,
            "stream_id": self.stream_id, "status": self.status,
            "response_bytes": self.response_bytes,
            **{f"{k}_ms": v for k, v in self.phases_ms().items()},
            "error": self.error, "failed_phase": self.failed_phase,
            "failed_after_ms": self.failed_after_ms,
            "epoch_ns": ep,
        }


@dataclass
class ProbeResult:
    """The outcome of :func:`run_http_probe`."""

    url: str
    method: str
    count: int
    reuse: bool
    http1: bool
    requests: list[RequestResult] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    @property
    def succeeded(self) -> int:
        return sum(1 for r in self.requests if r.ok)

    @property
    def connections(self) -> int:
        """Connections established (TCP connected) during the run."""
        return len({r.connection for r in self.requests if r.connection is not None})

    def summary(self) -> dict[str, Any]:
        """Counts, and a percentile block per phase over the requests that measured it."""
        phases = [r.phases_ms() for r in self.requests]
        return {
            "requests": len(self.requests), "ok": self.succeeded, "failures": self.failures,
            "connections": self.connections,
            "reused": sum(1 for r in self.requests if r.reused),
            "statuses": {str(k): v for k, v in sorted(
                Counter(r.status for r in self.requests if r.status is not None).items())},
            "http_versions": dict(Counter(r.http_version for r in self.requests
                                          if r.http_version is not None)),
            "errors": dict(Counter(f"{r.failed_phase}: {r.error}" for r in self.requests
                                   if not r.ok)),
            "phases": {f"{k}_ms": percentiles([p[k] for p in phases]) for k in PHASES},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url, "method": self.method, "count": self.count,
            "mode": "reuse" if self.reuse else "fresh",
            "http": "1.1" if self.http1 else "2",
            "summary": self.summary(),
            "requests": [r.to_json() for r in self.requests],
        }


# --------------------------------------------------------------------------- input


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str
    """Host of the URL (no brackets): SNI, certificate name, authority."""
    port: int
    authority: str
    path: str
    connect_host: str
    connect_port: int


def _split_host_port(text: str, what: str) -> tuple[str, int | None]:
    s = text.strip()
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise InputError(f"bad {what} {text!r}: missing ']'")
        host, rest = s[1:end], s[end + 1:]
        port_text = rest[1:] if rest.startswith(":") else (None if not rest else "x")
    elif s.count(":") == 1:
        host, port_text = s.split(":")
    elif s.count(":") > 1:  # bare IPv6
        host, port_text = s, None
    else:
        host, port_text = s, None
    if not host:
        raise InputError(f"bad {what} {text!r}: no host")
    if port_text in (None, ""):
        return host, None
    assert port_text is not None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(f"bad {what} {text!r}: port must be 1-65535")
    return host, int(port_text)


def _target(url: str, connect_to: str | None) -> _Target:
    text = url.strip()
    if "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InputError(f"bad URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise InputError(f"bad URL {url!r}: only http:// and https:// can be probed")
    host = parts.hostname
    if not host:
        raise InputError(f"bad URL {url!r}: no host")
    if port == 0:
        raise InputError(f"bad URL {url!r}: port must be 1-65535")
    default = 443 if scheme == "https" else 80
    port = port or default
    shown = f"[{host}]" if ":" in host else host
    authority = shown if port == default else f"{shown}:{port}"
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if any(c in path for c in " \r\n"):
        raise InputError(f"bad URL {url!r}: spaces or line breaks in the path")
    chost, cport = host, port
    if connect_to:
        h, p = _split_host_port(connect_to, "--connect-to (HOST:PORT)")
        chost, cport = h, p or port
    return _Target(scheme, host, port, authority, path, chost, cport)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _ssl_context(http1: bool, keylog: str | Path | None, insecure: bool,
                 cafile: str | None) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"cannot load CA file {cafile}: {exc}") from None
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.set_alpn_protocols(["http/1.1"] if http1 else ["h2", "http/1.1"])
    if keylog is not None:
        try:
            with open(keylog, "a", encoding="ascii"):
                pass
            ctx.keylog_filename = str(keylog)
        except OSError as exc:
            raise InputError(f"cannot write key log {keylog}: {exc}") from None
    return ctx


def _cipher_names(ctx: ssl.SSLContext) -> dict[str, str]:
    """OpenSSL cipher name -> IANA name."""
    from netdiag.tls.names import cipher_name

    return {c["name"]: cipher_name(c["id"] & 0xFFFF) for c in ctx.get_ciphers()}


# --------------------------------------------------------------------------- errors


class _Failed(Exception):
    """A request failed in ``phase``; carries the one-line reason."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message


def _reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"timeout after {timeout:g} s"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by peer"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class _Deadline:
    """The request's time budget, applied to each blocking call."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout

    def left(self, phase: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise _Failed(phase, f"timeout after {self.timeout:g} s")
        return left

    def arm(self, sock: socket.socket, phase: str) -> None:
        sock.settimeout(self.left(phase))


# --------------------------------------------------------------------------- dns


def _hosts_lookup(host: str, path: str = "/etc/hosts") -> str | None:
    """First address for ``host`` in the hosts file, like ``getaddrinfo``'s 'files'."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = host.rstrip(".").lower()
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and want in (n.lower() for n in fields[1:]) and _is_ip(fields[0]):
            return fields[0]
    return None


def _resolve(host: str, dns_server: str | None, deadline: _Deadline,
             rec: RequestResult) -> str:
    import dns.exception
    import dns.resolver

    from netdiag.probe.stamped_dns import Stamps, stamped

    rec.mark("dns_start")
    if dns_server is None:
        addr = _hosts_lookup(host)
        if addr is not None:
            rec.dns_source = "hosts"
            rec.mark("dns_end")
            return addr
    stamps = Stamps()
    try:
        if dns_server is None:
            resolver = dns.resolver.Resolver()
            rec.dns_source = "system"
        else:
            ip, port = parse_server(dns_server)
            resolver = dns.resolver.Resolver(configure=False)
            resolver.nameservers = [ip]
            resolver.port = port
            rec.dns_source = endpoint(ip, port)
        resolver.nameservers = stamped(resolver.nameservers, resolver.nameserver_ports,
                                       resolver.port, stamps)
        resolver.cache = None
        budget = deadline.left("dns")
        resolver.timeout = budget
        resolver.lifetime = budget
        for rdtype in ("A", "AAAA"):
            answer = resolver.resolve(host, rdtype, raise_on_no_answer=False)
            if answer.rrset:
                rec.mark("dns_end")
                if stamps.first_sent is not None and stamps.answered is not None:
                    rec.marks["dns_start"] = stamps.first_sent
                    rec.marks["dns_end"] = stamps.answered
                if answer.nameserver:  # the server that answered, not just the config
                    rec.dns_source = endpoint(str(answer.nameserver), answer.port)
                return str(answer.rrset[0].address)
    except dns.resolver.NXDOMAIN:
        raise _Failed("dns", f"NXDOMAIN: {host} does not exist") from None
    except dns.exception.Timeout:
        raise _Failed("dns", f"timeout after {deadline.timeout:g} s") from None
    except dns.resolver.NoNameservers as exc:
        raise _Failed("dns", f"no nameserver answered ({exc})") from None
    except InputError:
        raise
    except (dns.exception.DNSException, OSError) as exc:
        raise _Failed("dns", f"{type(exc).__name__}: {exc}") from None
    raise _Failed("dns", f"no A or AAAA record for {host}")


# --------------------------------------------------------------------------- connection


class _H2FrameClock:
    """Finds where each HTTP/2 frame starts in the received byte stream.

    ``h2`` reports a frame once it is complete; the first byte of a frame may have
    arrived in an earlier ``recv()``. This keeps, for every frame header, the mark of
    the ``recv()`` that delivered its first byte.
    """

    def __init__(self) -> None:
        self._skip = 0
        self._header = b""
        self._header_mark: Mark | None = None
        self._notable = False
        self.first_headers: dict[int, Mark] = {}
        """stream id -> mark of the first byte of its first HEADERS frame."""
        self.attention = False
        """A frame that ``h2`` must see now has been received whole since the flag was
        last cleared: one that ends a stream (END_STREAM), or any frame but DATA and
        HEADERS (a reset, GOAWAY, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION...)."""

    def feed(self, data: bytes, mark: Mark) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                take = min(self._skip, n - i)
                i += take
                self._skip -= take
                if not self._skip and self._notable:
                    self.attention = True
                continue
            if not self._header:
                self._header_mark = mark
            take = min(9 - len(self._header), n - i)
            self._header += data[i:i + take]
            i += take
            if len(self._header) == 9:
                h = self._header
                length = int.from_bytes(h[0:3], "big")
                ftype = h[3]
                stream = int.from_bytes(h[5:9], "big") & 0x7FFFFFFF
                if ftype == 0x1 and stream not in self.first_headers:
                    assert self._header_mark is not None
                    self.first_headers[stream] = self._header_mark
                self._notable = ftype > 0x1 or bool(h[4] & 0x1)
                if not length and self._notable:
                    self.attention = True
                self._skip = length
                self._header = b""


class _Connection:
    """One established connection: socket, TLS facts, protocol state."""

    def __init__(self, number: int, sock: socket.socket, target: _Target) -> None:
        self.number = number
        self.sock = sock
        self.target = target
        self.usable = True
        self.h2: Any = None
        self.clock: _H2FrameClock | None = None
        self.preface_sent = False
        local, remote = sock.getsockname(), sock.getpeername()
        self.local = endpoint(local[0], local[1])
        self.remote = endpoint(remote[0], remote[1])
        self.tls_version: str | None = None
        self.cipher: str | None = None
        self.alpn: str | None = None

    @property
    def http_version(self) -> str:
        return "HTTP/2" if self.h2 is not None else "HTTP/1.1"

    def describe(self, rec: RequestResult) -> None:
        rec.connection = self.number
        rec.local, rec.remote = self.local, self.remote
        rec.tls_version, rec.cipher, rec.alpn = self.tls_version, self.cipher, self.alpn
        rec.http_version = self.http_version

    def close(self) -> None:
        """Close politely: GOAWAY (HTTP/2), FIN, then read until the server closes.

        Closing with unread data, or data still to come, would make our kernel answer
        with a RST, which a capture of the run would then report as a reset. The
        wait is bounded (0.5 s) and is no part of any request's timing.
        """
        with contextlib.suppress(Exception):
            if self.h2 is not None and self.usable:
                self.h2.close_connection()
                self.sock.sendall(self.h2.data_to_send())
            # the TCP socket's shutdown, not SSLSocket.shutdown (which drops the TLS
            # state): the server's close_notify can still be read after our FIN
            socket.socket.shutdown(self.sock, socket.SHUT_WR)
            self.sock.settimeout(0.5)
            while self.sock.recv(_RECV):
                pass
        with contextlib.suppress(OSError):
            self.sock.close()


def _open(target: _Target, ctx: ssl.SSLContext | None, ciphers: dict[str, str],
          number: int, rec: RequestResult, deadline: _Deadline, dns_server: str | None,
          http1: bool) -> _Connection:
    """Resolve, connect, handshake; marks every phase in ``rec``; raises _Failed."""
    host = target.connect_host
    if _is_ip(host):
        addr = str(ipaddress.ip_address(host))
    else:
        addr = _resolve(host, dns_server, deadline, rec)
    rec.resolved = addr
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    raw = socket.socket(family, socket.SOCK_STREAM)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline.arm(raw, "connect")
        rec.mark("connect_start")
        try:
            raw.connect((addr, target.connect_port))
        except OSError as exc:
            raise _Failed("connect", _reason(exc, deadline.timeout)) from None
        rec.mark("connect_end")
        if ctx is None:
            conn = _Connection(number, raw, target)
            conn.describe(rec)
            return conn
        try:
            # an IP literal host: ssl sends no SNI and checks the certificate's IP SANs
            tls = ctx.wrap_socket(raw, server_hostname=target.host,
                                  do_handshake_on_connect=False)
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise _Failed("tls", _reason(exc, deadline.timeout)) from None
        raw = tls  # closed on failure below
        conn = _Connection(number, tls, target)
        conn.describe(rec)  # endpoints known even if the handshake fails
        deadline.arm(tls, "tls")
        rec.mark("tls_start")
        try:
            tls.do_handshake()
        except (OSError, ssl.SSLError) as exc:
            raise _Failed("tls", _reason(exc, deadline.timeout)) from None
        rec.mark("tls_end")
        version = tls.version()
        conn.tls_version = TLS_NAMES.get(version or "", version)
        cipher = tls.cipher()
        conn.cipher = ciphers.get(cipher[0], cipher[0]) if cipher else None
        conn.alpn = tls.selected_alpn_protocol()
        if conn.alpn == "h2" and not http1:
            import h2.config
            import h2.connection

            conn.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
                client_side=True, header_encoding="utf-8"))
            conn.h2.initiate_connection()
            conn.clock = _H2FrameClock()
        conn.describe(rec)
        return conn
    except BaseException:
        with contextlib.suppress(OSError):
            raw.close()
        raise


# --------------------------------------------------------------------------- HTTP/2


def _h2_exchange(conn: _Connection, rec: RequestResult, method: str,
                 headers: list[tuple[str, str]], deadline: _Deadline) -> None:
    import h2.events
    import h2.exceptions

    h2c = conn.h2
    assert conn.clock is not None
    t = conn.target
    authority = t.authority
    extra: list[tuple[str, str]] = []
    for name, value in headers:
        lname = name.lower()
        if lname == "host":
            authority = value
        elif lname not in _HOP_BY_HOP:
            extra.append((lname, value))
    names = {n for n, _ in extra}
    req = [(":method", method), (":scheme", t.scheme), (":authority", authority),
           (":path", t.path)]
    if "user-agent" not in names:
        req.append(("user-agent", USER_AGENT))
    if "accept" not in names:
        req.append(("accept", "*/*"))
    req += extra
    try:
        sid = h2c.get_next_available_stream_id()
        rec.stream_id = sid
        h2c.send_headers(sid, req, end_stream=True)
        data = h2c.data_to_send()
        deadline.arm(conn.sock, "send")
        rec.mark("request")
        conn.sock.sendall(data)
        rec.mark("written")
    except h2.exceptions.H2Error as exc:
        conn.usable = False
        raise _Failed("send", f"HTTP/2: {exc}") from None
    except OSError as exc:
        conn.usable = False
        raise _Failed("send", _reason(exc, deadline.timeout)) from None
    size = 0
    unread = bytearray()
    while True:
        phase = "transfer" if "first_byte" in rec.marks else "ttfb"
        try:
            deadline.arm(conn.sock, phase)
            data = conn.sock.recv(_RECV)
        except OSError as exc:
            conn.usable = False
            raise _Failed(phase, _reason(exc, deadline.timeout)) from None
        mark = Mark.now()
        if not data:
            conn.usable = False
            raise _Failed(phase, "connection closed by the server")
        conn.clock.feed(data, mark)
        if "first_byte" not in rec.marks and sid in conn.clock.first_headers:
            rec.marks["first_byte"] = conn.clock.first_headers[sid]
        unread += data
        if not conn.clock.attention and len(unread) < _H2_DEFER_BYTES:
            continue  # back to recv() at once: the next bytes are not stamped late
        conn.clock.attention = False
        try:
            events = h2c.receive_data(bytes(unread))
        except h2.exceptions.H2Error as exc:
            conn.usable = False
            raise _Failed(phase, f"HTTP/2 protocol error: {exc}") from None
        unread.clear()
        ended = False
        for ev in events:
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                rec.status = int(dict(ev.headers).get(":status", 0)) or None
            elif isinstance(ev, h2.events.DataReceived):
                h2c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if ev.stream_id == sid:
                    size += len(ev.data)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                ended = True
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                raise _Failed(phase, f"stream reset by the server ({ev.error_code!s})")
            elif isinstance(ev, h2.events.ConnectionTerminated):
                conn.usable = False
                if not ended:
                    raise _Failed(phase, f"GOAWAY from the server ({ev.error_code!s})")
        pending = h2c.data_to_send()
        if pending:
            with contextlib.suppress(OSError):
                conn.sock.sendall(pending)
        if ended:
            rec.marks["last_byte"] = mark
            rec.response_bytes = size
            return


# --------------------------------------------------------------------------- HTTP/1.1


class _H1Response:
    """Incremental HTTP/1.x response reader: head, then a body by its framing."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.buf = b""
        self.status: int | None = None
        self.version: str | None = None
        self.keep_alive = True
        self.mode: str | None = None  # "none", "length", "chunked", "close"
        self.remaining = 0
        self.body = 0
        self.done = False
        self._chunk_state = "size"

    def _head(self) -> bool:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 65536:
                    raise ValueError("response head longer than 64 KiB")
                return False
            head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
            lines = head.split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                continue  # informational: the real head follows
            self.version, self.status = parts[0], status
            fields: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                key = name.strip().lower()
                fields[key] = (fields[key] + ", " if key in fields else "") + value.strip()
            conn = {t.strip().lower() for t in fields.get("connection", "").split(",")}
            self.keep_alive = ("keep-alive" in conn if self.version == "HTTP/1.0"
                               else "close" not in conn)
            if (self.method == "HEAD" or status in (204, 304) or status == 101):
                self.mode = "none"
            elif "chunked" in fields.get("transfer-encoding", "").lower():
                self.mode = "chunked"
            elif "content-length" in fields:
                value = fields["content-length"].split(",")[0].strip()
                if not value.isdigit():
                    raise ValueError(f"bad Content-Length {value!r}")
                self.mode, self.remaining = "length", int(value)
            else:
                self.mode, self.keep_alive = "close", False
            return True

    def feed(self, data: bytes) -> None:
        self.buf += data
        if self.mode is None and not self._head():
            return
        if self.mode == "none":
            self.done = True
        elif self.mode == "length":
            take = min(self.remaining, len(self.buf))
            self.body += take
            self.remaining -= take
            self.buf = self.buf[take:]
            self.done = self.remaining == 0
        elif self.mode == "close":
            self.body += len(self.buf)
            self.buf = b""
        else:
            self._chunked()

    def _chunked(self) -> None:
        while not self.done:
            if self._chunk_state == "size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size_text = self.buf[:end].split(b";")[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
                self.buf = self.buf[end + 2:]
                self.remaining = size
                self._chunk_state = "data" if size else "trailer"
            elif self._chunk_state == "data":
                take = min(self.remaining, len(self.buf))
                self.body += take
                self.remaining -= take
                self.buf = self.buf[take:]
                if self.remaining:
                    return
                self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(self.buf) < 2:
                    return
                self.buf = self.buf[2:]
                self._chunk_state = "size"
            else:  # trailer section, ends with an empty line
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                if not line:
                    self.done = True


def _h1_exchange(conn: _Connection, rec: RequestResult, method: str,
                 headers: list[tuple[str, str]], deadline: _Deadline) -> None:
    t = conn.target
    lines = [f"{method} {t.path} HTTP/1.1"]
    names = {n.lower() for n, _ in headers}
    if "host" not in names:
        lines.append(f"Host: {t.authority}")
    if "user-agent" not in names:
        lines.append(f"User-Agent: {USER_AGENT}")
    if "accept" not in names:
        lines.append("Accept: */*")
    lines += [f"{n}: {v}" for n, v in headers]
    if method in _BODY_METHODS and "content-length" not in names:
        lines.append("Content-Length: 0")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    try:
        deadline.arm(conn.sock, "send")
        rec.mark("request")
        conn.sock.sendall(data)
        rec.mark("written")
    except OSError as exc:
        conn.usable = False
        raise _Failed("send", _reason(exc, deadline.timeout)) from None
    resp = _H1Response(method)
    last: Mark | None = None
    while not resp.done:
        phase = "transfer" if last is not None else "ttfb"
        try:
            deadline.arm(conn.sock, phase)
            chunk = conn.sock.recv(_RECV)
        except OSError as exc:
            conn.usable = False
            raise _Failed(phase, _reason(exc, deadline.timeout)) from None
        mark = Mark.now()
        if not chunk:
            conn.usable = False
            if resp.mode == "close" and last is not None:
                break  # close-delimited body: its last byte came with the last data
            raise _Failed(phase, "connection closed by the server before the end of "
                                 "the response")
        if last is None:
            rec.marks["first_byte"] = mark
        last = mark
        try:
            resp.feed(chunk)
        except ValueError as exc:
            conn.usable = False
            raise _Failed(phase, f"bad HTTP/1.1 response: {exc}") from None
    assert last is not None
    rec.marks["last_byte"] = last
    rec.status = resp.status
    rec.http_version = resp.version
    rec.response_bytes = resp.body
    if not resp.keep_alive or resp.buf:
        conn.usable = False


# --------------------------------------------------------------------------- driver


class ProbeConnection(Protocol):
    """What the request loop needs of a connection (TCP+TLS here, QUIC in ``http3``)."""

    usable: bool
    remote: str
    """The server's endpoint (``ip:port``, ``[v6]:port``)."""

    def describe(self, rec: RequestResult) -> None: ...

    def close(self) -> None: ...


Conn = TypeVar("Conn", bound=ProbeConnection)
Rec = TypeVar("Rec", bound=RequestResult)


def check_request_options(count: int, timeout: float, method: str,
                          headers: list[tuple[str, str]] | None
                          ) -> tuple[str, list[tuple[str, str]]]:
    """The method (upper case) and headers of a probe, or :class:`InputError`."""
    if count < 1:
        raise InputError("--count must be at least 1")
    if not timeout > 0:
        raise InputError("--timeout must be positive")
    method = method.upper()
    if not method.isalpha():
        raise InputError(f"bad method {method!r}")
    hdrs = list(headers or [])
    for name, value in hdrs:
        if not name or any(c in name for c in " :\r\n") or any(c in value for c in "\r\n"):
            raise InputError(f"bad header {name!r}: {value!r}")
    return method, hdrs


def request_loop(count: int, reuse: bool, timeout: float, new_record: Callable[[int], Rec],
                 open_conn: Callable[[int, Rec, _Deadline], Conn],
                 exchange: Callable[[Conn, Rec, _Deadline], None]) -> None:
    """Send ``count`` requests, each timed in its record (``new_record(index)``): on the
    previous request's connection when ``reuse`` and it is still usable, else on a new
    one (``open_conn(number, rec, deadline)``, which marks ``ready``); a failure is the
    record's, and closes the connection. A connection number is used once its
    endpoints are known (``rec.connection`` set), whether or not its handshake ends."""
    conn: Conn | None = None
    opened = 0
    try:
        for i in range(1, count + 1):
            rec = new_record(i)
            if conn is not None and not (reuse and conn.usable):
                conn.close()
                conn = None
            deadline = _Deadline(timeout)
            try:
                with gc_paused():
                    rec.mark("start")
                    if conn is not None:
                        rec.reused = True
                        rec.resolved = conn.remote.rsplit(":", 1)[0].strip("[]")
                        conn.describe(rec)
                        rec.marks["ready"] = rec.marks["start"]
                    else:
                        conn = open_conn(opened + 1, rec, deadline)
                        opened += 1
                    exchange(conn, rec, deadline)
            except _Failed as exc:
                rec.mark("failed")
                rec.error, rec.failed_phase = exc.message, exc.phase
                if rec.connection is not None:
                    opened = max(opened, rec.connection)
            if conn is not None and (not reuse or not conn.usable or not rec.ok):
                conn.close()
                conn = None
    finally:
        if conn is not None:
            conn.close()


def run_http_probe(url: str, *, count: int = 1, reuse: bool = True, http1: bool = False,
                   method: str = "GET", keylog: str | Path | None = None,
                   dns_server: str | None = None, connect_to: str | None = None,
                   timeout: float = 10.0, insecure: bool = False, cafile: str | None = None,
                   headers: list[tuple[str, str]] | None = None) -> ProbeResult:
    """Send ``count`` requests to ``url`` and time every phase of each (module docstring).

    ``reuse``: one connection for all requests (a new one only if the server ends
    it); else a fresh DNS lookup, connection and handshake per request. ``http1``:
    offer only ``http/1.1`` in ALPN (HTTP/2 is used when the server selects ``h2``;
    ``http://`` URLs always use HTTP/1.1). ``keylog``: append the TLS secrets to this
    file (NSS key log format). ``dns_server``: ``IP`` or ``IP:PORT`` to resolve with,
    instead of the system configuration. ``connect_to``: ``HOST:PORT`` to connect to
    instead of the URL's host and port (like curl ``--connect-to``; SNI and
    ``:authority`` stay the URL's). ``timeout``: seconds per request, all phases
    together. ``insecure``: skip certificate verification; ``cafile``: PEM file of
    trusted CAs. ``headers``: extra request headers.

    Failures of a request are recorded in it, never raised; a bad URL or option
    raises :class:`InputError`.
    """
    method, hdrs = check_request_options(count, timeout, method, headers)
    target = _target(url, connect_to)
    if dns_server is not None:
        parse_server(dns_server)  # InputError now, not a failure per request
    ctx = _ssl_context(http1, keylog, insecure, cafile) if target.scheme == "https" else None
    # first-use costs outside every timer: dnspython's lazy imports, h2's modules
    if not _is_ip(target.connect_host):
        warm_up()
    if ctx is not None and not http1:
        try:
            for module in ("h2.config", "h2.connection", "h2.events", "h2.exceptions"):
                importlib.import_module(module)
        except ImportError:
            raise InputError("HTTP/2 needs the 'h2' package (pip install h2); or probe "
                             "with --http1.1") from None
    ciphers = _cipher_names(ctx) if ctx is not None else {}
    result = ProbeResult(url=url, method=method, count=count, reuse=reuse, http1=http1)

    def new_record(i: int) -> RequestResult:
        rec = RequestResult(index=i, method=method, url=url)
        result.requests.append(rec)
        return rec

    def open_conn(number: int, rec: RequestResult, deadline: _Deadline) -> _Connection:
        conn = _open(target, ctx, ciphers, number, rec, deadline, dns_server, http1)
        rec.marks["ready"] = rec.marks.get("tls_end") or rec.marks["connect_end"]
        return conn

    def exchange(conn: _Connection, rec: RequestResult, deadline: _Deadline) -> None:
        if conn.h2 is not None:
            _h2_exchange(conn, rec, method, hdrs, deadline)
        else:
            _h1_exchange(conn, rec, method, hdrs, deadline)

    request_loop(count, reuse, timeout, new_record, open_conn, exchange)
    return result
