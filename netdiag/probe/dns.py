"""``run_dns_probe``: dig's query, repeated and compared across servers.

One question (name, type) is asked ``count`` times of every server, round-robin
(round 1 of every server, then round 2...), so that a change in conditions during
the run touches every server alike. Every query is a fresh message (new DNS id) on
a fresh socket, like ``dig``: a UDP socket per query, or over TCP a connection per
query (``dig +tcp``).

Timing, per query:

* ``latency`` -- from just before the query is handed to the kernel (``send``) to
  just after the ``recv()`` that returned its answer, on an already created -- and for
  TCP already connected -- socket (:mod:`netdiag.probe.stamped_dns`). Serialising the
  query and parsing the answer are outside it: a capture measures the same round trip
  from the query packet to the response packet (CONTRACT.md ``dns[].latency_ms``). On
  a virtual machine whose idle vCPUs wake slowly, dnspython's own work around the
  exchange took 0.5-0.75 ms (median) when it was inside the timer.
* ``connect`` (TCP only) -- the TCP handshake before the query, kept apart so that
  ``latency`` means the same thing over UDP and TCP.
* ``ts_ns`` -- ``time.time_ns()`` at the same instant as the start of ``latency``: the
  epoch time a capture's query packet carries, give or take the scheduling jitter.

A query that gets no answer within ``timeout`` is a *timeout* (latency ``None``);
other failures (connection refused over TCP, a malformed answer) are *errors*.
Neither raises: they are counted per server. Bad arguments raise
:class:`~netdiag.errors.InputError`.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from netdiag.analysis.stats import percentiles
from netdiag.contract import Percentiles
from netdiag.errors import InputError
from netdiag.gcpolicy import paused as gc_paused

NS_PER_MS = 1_000_000


def parse_server(text: str, default_port: int = 53) -> tuple[str, int]:
    """``"IP"``, ``"IP:PORT"``, ``"IPv6"`` or ``"[IPv6]:PORT"`` -> (ip, port).

    Raises :class:`InputError` for anything else (server names are not resolved:
    which resolver would be asked is exactly what is being measured).
    """
    s = text.strip()
    host, port_text = s, None
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise InputError(f"bad server {text!r}: missing ']'")
        host, rest = s[1:end], s[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise InputError(f"bad server {text!r}: expected [IPv6]:PORT")
            port_text = rest[1:]
    elif s.count(":") == 1:
        host, port_text = s.split(":")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"bad server {text!r}: not an IP address (IP, IP:PORT or "
                         "[IPv6]:PORT)") from None
    port = default_port
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InputError(f"bad server {text!r}: port must be 1-65535")
        port = int(port_text)
    return str(ip), port


def endpoint(ip: str, port: int) -> str:
    """``ip:port``, IPv6 in brackets (the contract's endpoint format)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def system_nameservers() -> list[str]:
    """The nameservers of the system resolver (``/etc/resolv.conf``), as ``ip:port``."""
    import dns.resolver

    try:
        resolver = dns.resolver.Resolver()
    except Exception as exc:  # NoResolverConfiguration, unreadable file...
        raise InputError(f"no --server given and the system resolver configuration "
                         f"cannot be read: {exc}") from None
    out = []
    for ns in resolver.nameservers:
        text = str(ns)
        try:
            ip = str(ipaddress.ip_address(text))
        except ValueError:  # a DoH/DoT nameserver object: not for this probe
            continue
        out.append(endpoint(ip, resolver.port))
    if not out:
        raise InputError("no --server given and the system resolver has no nameserver")
    return out


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / NS_PER_MS


@dataclass(slots=True)
class DnsQuery:
    """One query and what came back."""

    server: str
    """Server asked, ``ip:port``."""
    seq: int
    """1-based round number."""
    transport: str
    """``udp`` or ``tcp``."""
    id: int
    """DNS message id of the query."""
    ts_ns: int
    """``time.time_ns()`` just before the query was sent."""
    client: str | None = None
    """Local endpoint the query left from, where known."""
    latency_ns: int | None = None
    """Query sent -> response parsed (module docstring); None without a response."""
    connect_ns: int | None = None
    """TCP handshake before the query (TCP only)."""
    rcode: str | None = None
    """Response code (``NOERROR``, ``NXDOMAIN``, ``SERVFAIL``...); None without one."""
    answers: list[str] = field(default_factory=list)
    """Answer-section rdata of the queried type, as text."""
    truncated: bool = False
    """The (UDP) response had the TC bit set."""
    error: str | None = None
    """``timeout``, ``connection refused``...; None when a response came back."""

    @property
    def ok(self) -> bool:
        """A response came back (whatever its rcode)."""
        return self.rcode is not None

    @property
    def timed_out(self) -> bool:
        return self.error == "timeout"

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server, "seq": self.seq, "transport": self.transport,
            "id": self.id, "ts": self.ts_ns / 1e9, "ts_ns": self.ts_ns,
            "client": self.client, "latency_ms": _ms(self.latency_ns),
            "connect_ms": _ms(self.connect_ns), "rcode": self.rcode,
            "answers": list(self.answers), "truncated": self.truncated, "error": self.error,
        }


@dataclass
class DnsServerResult:
    """Every query asked of one server, and their summary."""

    server: str
    queries: list[DnsQuery] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(1 for q in self.queries if q.ok)

    @property
    def timeouts(self) -> int:
        return sum(1 for q in self.queries if q.timed_out)

    @property
    def errors(self) -> int:
        """Failures other than timeouts."""
        return sum(1 for q in self.queries if q.error is not None and not q.timed_out)

    @property
    def rcodes(self) -> Counter[str]:
        return Counter(q.rcode for q in self.queries if q.rcode is not None)

    @property
    def answers(self) -> Counter[str]:
        """How many responses carried each answer rdata."""
        return Counter(a for q in self.queries for a in dict.fromkeys(q.answers))

    def latency_ms(self) -> Percentiles:
        """Percentile block of the answered queries' latency."""
        return percentiles([_ms(q.latency_ns) for q in self.queries])

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server, "queries": len(self.queries), "answered": self.answered,
            "timeouts": self.timeouts, "errors": self.errors,
            "rcodes": dict(sorted(self.rcodes.items())),
            "answers": dict(self.answers.most_common()),
            "latency_ms": self.latency_ms(),
            "connect_ms": percentiles([_ms(q.connect_ns) for q in self.queries]),
            "error_kinds": dict(Counter(q.error for q in self.queries
                                        if q.error is not None and not q.timed_out)),
        }


@dataclass
class DnsProbeResult:
    """The outcome of :func:`run_dns_probe`."""

    name: str
    rdtype: str
    transport: str
    count: int
    timeout: float
    servers: list[DnsServerResult]

    @property
    def queries(self) -> list[DnsQuery]:
        """Every query, in the order asked."""
        return sorted((q for s in self.servers for q in s.queries), key=lambda q: q.ts_ns)

    @property
    def answered(self) -> int:
        return sum(s.answered for s in self.servers)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.rdtype, "transport": self.transport,
            "count": self.count, "timeout_s": self.timeout,
            "servers": [s.to_json() for s in self.servers],
            "queries": [q.to_json() for q in self.queries],
        }


def warm_up(rdtypes: tuple[str, ...] = ("A", "AAAA")) -> None:
    """Load what dnspython loads lazily on first use, before anything is timed.

    dnspython imports the module of an rdata type the first time it meets one, and
    its first wire round trip warms more code; on a first timed query that costs
    about a millisecond that no capture would see.
    """
    import dns.message
    import dns.rdata
    import dns.rdataclass
    import dns.rdatatype
    import dns.resolver  # imported here, not inside a timed lookup
    import dns.rrset

    samples = {"A": "192.0.2.1", "AAAA": "2001:db8::1"}
    for t in rdtypes:
        rdtype = dns.rdatatype.from_text(t)
        dns.rdata.get_rdata_class(dns.rdataclass.IN, rdtype)  # type: ignore[no-untyped-call]
        query = dns.message.make_query("warm.up.invalid.", rdtype)
        response = dns.message.make_response(query)
        if t in samples:
            response.answer.append(dns.rrset.from_text("warm.up.invalid.", 30, "IN", t,
                                                       samples[t]))
        parsed = dns.message.from_wire(response.to_wire())
        query.is_response(parsed)
        parsed.find_rrset(parsed.answer, query.question[0].name, dns.rdataclass.IN, rdtype)


def _local(sock: socket.socket) -> str | None:
    try:
        addr = sock.getsockname()
    except OSError:
        return None
    return endpoint(addr[0], addr[1]) if addr and addr[1] else None


def _error_text(exc: BaseException) -> str:
    import dns.exception

    if isinstance(exc, (dns.exception.Timeout, TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, EOFError):
        return "connection closed before the answer"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return f"bad response: {type(exc).__name__}: {exc}".rstrip(": ")


def _ask(qname: Any, rdtype: Any, ip: str, port: int, seq: int, tcp: bool,
         timeout: float) -> DnsQuery:
    """One query of one server; never raises for network trouble."""
    import dns.exception
    import dns.flags
    import dns.message
    import dns.rcode

    from netdiag.probe.stamped_dns import Stamps, send_tcp, send_udp, tcp_answer, udp_answer

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    query = dns.message.make_query(qname, rdtype)
    server = endpoint(ip, port)
    rec = DnsQuery(server=server, seq=seq, transport="tcp" if tcp else "udp", id=query.id,
                   ts_ns=time.time_ns())
    sock = socket.socket(family, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
    try:
        if tcp:
            sock.settimeout(timeout)
            t0 = time.perf_counter_ns()
            try:
                sock.connect((ip, port))
            except (OSError, TimeoutError) as exc:
                rec.error = _error_text(exc)
                rec.client = _local(sock)
                return rec
            rec.connect_ns = time.perf_counter_ns() - t0
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            # a connected UDP socket: the source address is known before sending, only
            # the server's datagrams are delivered, and an ICMP port unreachable comes
            # back as "connection refused" instead of a timeout
            sock.connect((ip, port))
        stamps = Stamps()
        wire = query.to_wire()
        deadline = time.monotonic() + timeout
        try:
            if tcp:
                send_tcp(sock, wire, stamps)
                response = tcp_answer(sock, query, deadline, stamps)
            else:
                send_udp(sock, wire, stamps)
                response = udp_answer(sock, query, deadline, stamps)
        except (dns.exception.DNSException, OSError, EOFError, ValueError) as exc:
            rec.error = _error_text(exc)
            return rec
        finally:
            if stamps.first_sent is not None:
                rec.ts_ns = stamps.first_sent.epoch_ns
            rec.client = rec.client or _local(sock)
        assert stamps.first_sent is not None and stamps.answered is not None
        rec.latency_ns = stamps.answered.perf_ns - stamps.first_sent.perf_ns
        rec.rcode = dns.rcode.to_text(response.rcode())
        rec.truncated = bool(response.flags & dns.flags.TC)
        for rrset in response.answer:
            if rrset.rdtype == query.question[0].rdtype:
                rec.answers.extend(r.to_text() for r in rrset)
        return rec
    finally:
        sock.close()


def run_dns_probe(name: str, *, servers: list[str], count: int = 1, rdtype: str = "A",
                  tcp: bool = False, timeout: float = 2.0) -> DnsProbeResult:
    """Ask every server in ``servers`` for ``name``/``rdtype`` ``count`` times.

    ``servers`` are ``"IP"`` (port 53) or ``"IP:PORT"`` (``"[IPv6]:PORT"``). Queries
    go round-robin over the servers, one at a time. Timeouts and other failures are
    counted in the result, never raised; bad arguments raise ``InputError``.
    """
    import dns.name
    import dns.rdatatype

    if count < 1:
        raise InputError("--count must be at least 1")
    if not timeout > 0:
        raise InputError("--timeout must be positive")
    if not servers:
        raise InputError("at least one DNS server is needed")
    try:
        qname = dns.name.from_text(name)
    except Exception as exc:
        raise InputError(f"bad name {name!r}: {exc}") from None
    try:
        qtype = dns.rdatatype.from_text(rdtype.upper())
    except Exception:
        raise InputError(f"unknown record type {rdtype!r}") from None
    parsed = [parse_server(s) for s in servers]
    warm_up((dns.rdatatype.to_text(qtype),))
    results: dict[tuple[str, int], DnsServerResult] = {}
    for ip, port in parsed:
        results.setdefault((ip, port), DnsServerResult(endpoint(ip, port)))
    for seq in range(1, count + 1):
        for (ip, port), res in results.items():
            with gc_paused():
                query = _ask(qname, qtype, ip, port, seq, tcp, timeout)
            res.queries.append(query)
    return DnsProbeResult(name=qname.to_text(omit_final_dot=True) or ".",
                          rdtype=dns.rdatatype.to_text(qtype), transport="tcp" if tcp else "udp",
                          count=count, timeout=timeout, servers=list(results.values()))
