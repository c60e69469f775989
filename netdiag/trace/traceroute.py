"""TCP SYN, UDP and ICMP traceroute with scapy, several probes per hop (mtr's report).

:func:`trace` sends rounds of probes: in each round one probe per TTL, from 1 up to
the destination's distance once it is known (the first round goes out in windows of
:data:`WINDOW` TTLs until the destination answers or ``max_hops`` is reached). A
probe is answered by

* ``time-exceeded`` (ICMP type 11 / ICMPv6 type 3) from a router on the way;
* ``syn-ack`` or ``rst`` from the destination (TCP), ``port-unreachable`` from the
  destination (UDP; or ``udp`` if a service answered), ``echo-reply`` (ICMP): the
  destination answered;
* ``unreachable:<code name>`` (any other ICMP destination unreachable): that hop
  refused to forward, the trace ends there.

scapy's ``sr`` matches replies to probes by the header quoted in the ICMP error, or by
the TCP/UDP ports (and TCP sequence number) or ICMP id/sequence of a direct answer;
every probe of a run has its own source port (TCP/UDP) or sequence number (ICMP),
so a late reply cannot be taken for another probe's. A probe's RTT is the receive
timestamp of its reply minus scapy's ``sent_time`` of the probe.

:func:`summarize` turns the probes into hops (pure, tested without the network):
per TTL the responding address (the most frequent one; every one in ``addresses``),
probes sent and answered, loss, RTT percentiles (:func:`netdiag.analysis.stats.percentiles`,
milliseconds) and whether the destination answered there. Hops past the first TTL
at which the destination answered are not shown; when it never answered, trailing
hops that never answered are not shown either.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from netdiag.analysis.stats import percentiles
from netdiag.errors import NetdiagError

WINDOW = 16
"""TTLs probed at once in the first round, before the destination's distance is known."""
PROTOCOLS = ("tcp", "udp", "icmp")
DEFAULT_PORTS = {"tcp": 443, "udp": 33434, "icmp": None}
"""Destination port per protocol when none is given (UDP: traceroute's base port)."""

DESTINATION_REPLIES = frozenset({"syn-ack", "rst", "port-unreachable", "udp", "echo-reply"})
"""Reply kinds that come from the destination itself."""


class TraceError(NetdiagError):
    """A traceroute cannot run (no privileges, bad target)."""

    exit_code = 1


@dataclass(slots=True)
class Probe:
    """One probe and what answered it."""

    ttl: int
    round: int
    """0-based round the probe belongs to."""
    sent: float
    """Epoch seconds the probe was sent (scapy's ``sent_time``)."""
    address: str | None = None
    """Who answered, None when nothing did within the timeout."""
    rtt_ms: float | None = None
    reply: str | None = None
    """``time-exceeded``, ``syn-ack``, ``rst``, ``port-unreachable``, ``udp``,
    ``echo-reply``, ``unreachable:<code>``, or ``other:<summary>``; None if lost."""

    @property
    def from_destination(self) -> bool:
        return self.reply in DESTINATION_REPLIES

    def to_json(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "round": self.round, "sent": self.sent,
                "address": self.address, "rtt_ms": self.rtt_ms, "reply": self.reply}


@dataclass(slots=True)
class Hop:
    """One TTL of the trace: mtr's report line."""

    ttl: int
    address: str | None
    """The address that answered most often; None when no probe was answered."""
    addresses: list[str]
    """Every address that answered (more than one: load-balanced paths)."""
    sent: int
    received: int
    rtt_ms: dict[str, Any]
    """``{count, min, p50, p90, p99, max, mean}`` of the answered probes, milliseconds."""
    destination: bool
    """The destination answered at this TTL."""
    replies: dict[str, int]
    """Reply kinds and how many probes got each."""
    path: dict[str, Any] | None = None
    """``{name, hop}`` from the path profile when one matches the address, else None."""

    @property
    def loss_pct(self) -> float:
        return 0.0 if not self.sent else 100.0 * (self.sent - self.received) / self.sent

    def to_json(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "address": self.address, "addresses": list(self.addresses),
                "sent": self.sent, "received": self.received,
                "loss_pct": round(self.loss_pct, 3), "rtt_ms": dict(self.rtt_ms),
                "destination": self.destination, "replies": dict(self.replies),
                "path": self.path}


@dataclass(slots=True)
class TraceResult:
    """A finished trace."""

    host: str
    """The target as given."""
    address: str
    """The address probed."""
    proto: str
    port: int | None
    count: int
    max_hops: int
    timeout: float
    hops: list[Hop] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    started: float = 0.0
    """Epoch seconds of the first probe."""
    duration_s: float = 0.0

    @property
    def reached(self) -> bool:
        return any(h.destination for h in self.hops)

    @property
    def destination_hop(self) -> int | None:
        return next((h.ttl for h in self.hops if h.destination), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": {"host": self.host, "address": self.address, "proto": self.proto,
                       "port": self.port},
            "count": self.count, "max_hops": self.max_hops, "timeout_s": self.timeout,
            "started": self.started, "duration_s": round(self.duration_s, 6),
            "reached": self.reached, "destination_hop": self.destination_hop,
            "hops": [h.to_json() for h in self.hops],
            "probes": [p.to_json() for p in self.probes],
        }


# -- pure parts ---------------------------------------------------------------------


def summarize(probes: list[Probe]) -> list[Hop]:
    """Hops from probes (see the module docstring)."""
    by_ttl: dict[int, list[Probe]] = {}
    for p in probes:
        by_ttl.setdefault(p.ttl, []).append(p)
    dest = min((p.ttl for p in probes if p.from_destination), default=None)
    stop = min((p.ttl for p in probes
                if p.reply is not None and p.reply.startswith("unreachable")), default=None)
    last = dest if dest is not None else stop
    if last is None:
        last = max((p.ttl for p in probes if p.reply is not None), default=0)
    hops = []
    for ttl in range(1, last + 1):
        ps = by_ttl.get(ttl, [])
        answered = [p for p in ps if p.reply is not None]
        counts = Counter(p.address for p in answered if p.address is not None)
        hops.append(Hop(
            ttl=ttl,
            address=counts.most_common(1)[0][0] if counts else None,
            addresses=sorted(counts, key=_addr_key),
            sent=len(ps), received=len(answered),
            rtt_ms=percentiles([p.rtt_ms for p in answered]),
            destination=any(p.from_destination for p in answered),
            replies=dict(sorted(Counter(p.reply for p in answered if p.reply).items())),
        ))
    return hops


def _addr_key(a: str) -> tuple[int, int]:
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return (9, 0)
    return (ip.version, int(ip))


MatchAddress = Callable[..., "tuple[str, str] | None"]


def attribute(result: TraceResult, match_address: MatchAddress) -> None:
    """Set ``hop.path`` from a profile's ``match_address(ip, port=None, hops=None)``.

    The destination hop is matched with the probed port; routers without a port (a
    rule's ``port`` list is not checked for them). ``hops`` is the number of routers
    before the hop (TTL - 1), the distance a profile's ``ttl_hops`` speaks of.
    """
    for hop in result.hops:
        if hop.address is None:
            continue
        port = result.port if hop.destination else None
        m = match_address(hop.address, port=port, hops=hop.ttl - 1)
        hop.path = None if m is None else {"name": m[0], "hop": m[1]}


# -- probing ------------------------------------------------------------------------


def check_privileges() -> None:
    """Raise :class:`TraceError` unless raw sockets can be opened (root or CAP_NET_RAW)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except PermissionError:
        raise TraceError("traceroute needs root or CAP_NET_RAW") from None
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            raise TraceError("traceroute needs root or CAP_NET_RAW") from None
        raise TraceError(f"cannot open a raw socket: {e.strerror or e}") from None
    s.close()


def trace(dst: str, *, proto: str = "tcp", port: int | None = 443, count: int = 3,
          max_hops: int = 30, timeout: float = 1.0, iface: str | None = None,
          interval: float = 0.0, host: str | None = None) -> TraceResult:
    """Trace the route to the address ``dst`` (IPv4 or IPv6) and summarize it per hop.

    ``proto``: ``tcp`` (SYN to ``port``), ``udp`` (to ``port``) or ``icmp`` (echo);
    ``count`` rounds of probes; ``timeout`` seconds waited for the replies of a round
    after its last probe; ``interval`` seconds from the start of one round to the
    start of the next (at least; routers rate-limit their ICMP errors, Linux to a
    burst of 6 then 1/s per destination, so ``count`` above 5 wants ``interval`` 1);
    ``iface`` the interface to send on (default: the route's).
    """
    if proto not in PROTOCOLS:
        raise TraceError(f"unknown protocol {proto!r} (tcp, udp or icmp)")
    try:
        addr = ipaddress.ip_address(dst)
    except ValueError:
        raise TraceError(f"not an IP address: {dst!r}") from None
    if proto != "icmp" and port is None:
        port = DEFAULT_PORTS[proto]
    if proto == "icmp":
        port = None
    check_privileges()
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    logging.getLogger("scapy").setLevel(logging.ERROR)
    from scapy.sendrecv import sr

    maker = _ProbeMaker(str(addr), addr.version, proto, port)
    result = TraceResult(host=host or str(addr), address=str(addr), proto=proto, port=port,
                         count=count, max_hops=max_hops, timeout=timeout)
    start = time.monotonic()
    result.started = time.time()
    probes: list[Probe] = []
    limit: int | None = None
    for rnd in range(count):
        round_start = time.monotonic()
        if rnd == 0:
            lo = 1
            while lo <= max_hops:
                hi = min(max_hops, lo + WINDOW - 1)
                got = _send_round(sr, maker, range(lo, hi + 1), rnd, timeout, iface)
                probes.extend(got)
                end = _last_ttl(got)
                if end is not None:
                    limit = end
                    break
                lo = hi + 1
        else:
            got = _send_round(sr, maker, range(1, (limit or max_hops) + 1), rnd, timeout,
                              iface)
            probes.extend(got)
            end = _last_ttl(probes)
            if end is not None:
                limit = end if limit is None else min(limit, end)
        if rnd + 1 < count:
            wait = interval - (time.monotonic() - round_start)
            if wait > 0:
                time.sleep(wait)
    result.duration_s = time.monotonic() - start
    result.probes = sorted(probes, key=lambda p: (p.round, p.ttl))
    result.hops = summarize(result.probes)
    return result


def _last_ttl(probes: list[Probe]) -> int | None:
    """The TTL at which the trace ends: the destination's, or an unreachable's."""
    ends = [p.ttl for p in probes if p.from_destination
            or (p.reply is not None and p.reply.startswith("unreachable"))]
    return min(ends) if ends else None


def _send_round(sr: Any, maker: _ProbeMaker, ttls: range, rnd: int, timeout: float,
                iface: str | None) -> list[Probe]:
    packets = [maker.make(ttl) for ttl in ttls]
    kwargs: dict[str, Any] = {"timeout": timeout, "verbose": 0}
    if iface:
        kwargs["iface"] = iface
    ans, unans = sr(packets, **kwargs)
    out: list[Probe] = []
    for snd, rcv in ans:
        ttl = maker.ttl_of(snd)
        sent = float(snd.sent_time)
        rtt = max(0.0, (float(rcv.time) - sent) * 1000.0)
        out.append(Probe(ttl=ttl, round=rnd, sent=sent, address=str(rcv.src),
                         rtt_ms=rtt, reply=maker.classify(rcv)))
    for snd in unans:
        sent = float(getattr(snd, "sent_time", None) or time.time())
        out.append(Probe(ttl=maker.ttl_of(snd), round=rnd, sent=sent))
    return out


_UNREACH4 = {0: "net", 1: "host", 2: "protocol", 3: "port", 4: "fragmentation-needed",
             5: "source-route-failed", 6: "net-unknown", 7: "host-unknown",
             9: "net-prohibited", 10: "host-prohibited", 11: "net-tos", 12: "host-tos",
             13: "admin-prohibited", 14: "precedence-violation", 15: "precedence-cutoff"}
_UNREACH6 = {0: "no-route", 1: "admin-prohibited", 2: "beyond-scope", 3: "address",
             4: "port", 5: "source-policy", 6: "reject-route"}


class _ProbeMaker:
    """Builds the probes of one trace (unique ports / sequence numbers) and reads replies."""

    def __init__(self, dst: str, version: int, proto: str, port: int | None) -> None:
        self.dst = dst
        self.v6 = version == 6
        self.proto = proto
        self.port = port
        self.serial = 0
        self.base_port = random.randint(33000, 50000)
        self.icmp_id = (os.getpid() ^ random.randint(0, 0xFFFF)) & 0xFFFF

    def make(self, ttl: int) -> Any:
        from scapy.layers.inet import ICMP, IP, TCP, UDP
        from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6

        n = self.serial
        self.serial += 1
        ip = IPv6(dst=self.dst, hlim=ttl) if self.v6 else IP(dst=self.dst, ttl=ttl)
        sport = self.base_port + n % 15000
        if self.proto == "tcp":
            l4 = TCP(sport=sport, dport=self.port, flags="S",
                     seq=random.randint(0, 0xFFFFFFFF), window=64240,
                     options=[("MSS", 1460)])
        elif self.proto == "udp":
            l4 = UDP(sport=sport, dport=self.port)
        elif self.v6:
            l4 = ICMPv6EchoRequest(id=self.icmp_id, seq=n & 0xFFFF)
        else:
            l4 = ICMP(id=self.icmp_id, seq=n & 0xFFFF)
        return ip / l4

    def ttl_of(self, pkt: Any) -> int:
        return int(pkt.hlim if self.v6 else pkt.ttl)

    def classify(self, rcv: Any) -> str:
        """The kind of reply (see :class:`Probe`)."""
        from scapy.layers.inet import ICMP, TCP, UDP
        from scapy.layers.inet6 import (
            ICMPv6DestUnreach,
            ICMPv6EchoReply,
            ICMPv6TimeExceeded,
        )

        src = str(rcv.src)
        if self.v6:
            if rcv.haslayer(ICMPv6TimeExceeded):
                return "time-exceeded"
            if rcv.haslayer(ICMPv6DestUnreach):
                code = int(rcv[ICMPv6DestUnreach].code)
                if code == 4 and src == self.dst:
                    return "port-unreachable"
                return f"unreachable:{_UNREACH6.get(code, code)}"
            if rcv.haslayer(ICMPv6EchoReply) and src == self.dst:
                return "echo-reply"
        else:
            if rcv.haslayer(ICMP):
                icmp = rcv[ICMP]
                kind, code = int(icmp.type), int(icmp.code)
                if kind == 11:
                    return "time-exceeded"
                if kind == 3:
                    if code == 3 and src == self.dst:
                        return "port-unreachable"
                    return f"unreachable:{_UNREACH4.get(code, code)}"
                if kind == 0 and src == self.dst:
                    return "echo-reply"
        if rcv.haslayer(TCP) and src == self.dst:
            flags = int(rcv[TCP].flags)
            if flags & 0x12 == 0x12:
                return "syn-ack"
            if flags & 0x04:
                return "rst"
        if rcv.haslayer(UDP) and src == self.dst and self.proto == "udp":
            return "udp"
        return f"other:{rcv.summary()}"[:80]
