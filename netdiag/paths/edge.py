"""Client-side attribution: name the edge a client talks to, and split its wait.

Most captures are taken on the client, where no hop behind the server is visible.
What one client capture can still say (docs/report.md, "Client-side split"):

* **How the wait splits**, where the answer tells: the W3C ``Server-Timing`` response
  header (:func:`parse_server_timing`) and Envoy's ``x-envoy-upstream-service-time``.
  :func:`request_split` turns them into ``requests[].upstream`` =
  ``{source, metric, upstream_ms, edge_ms, ...}``: ``upstream_ms`` is the time the
  answer says was spent upstream of the edge, ``edge_ms`` the rest of the client's
  time to first byte (the network to the edge and back, plus the edge's own work
  unless the metric counts it upstream).
* **Who the edge is** (:func:`identify_edge`, ``connections[].edge``): the response
  headers edges add (``server``, ``via``, ``cf-ray``, ``x-amz-cf-id``,
  ``x-served-by``...), else the address ranges edges publish
  (``netdiag/data/edge_ranges.json``, overridden and extended by a profile's
  ``[[edge]]`` entries); every inference lists its evidence, with the hop distance the
  IP TTL implies and whether TLS terminates where TCP does (handshake round trips).
* :func:`edge_findings`: one ``edge-split`` info finding per server and edge, in plain
  words, when requests carried a split.

Everything read from the capture is untrusted: header values are parsed in one pass
over at most :data:`MAX_FIELD` characters, durations that are negative, not finite or
above a day are rejected, strings put into the report are cut to a few hundred
characters with control characters replaced, and nothing raises on malformed input.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from netdiag.analysis.stats import quantile
from netdiag.paths.endpoint import split_endpoint
from netdiag.paths.profile import (
    INITIAL_TTLS,
    Profile,
    hop_distance,
    parse_ip,
)
from netdiag.records import NS_PER_MS, Connection, Finding, Request

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_FIELD = 8192
"""Characters of one header value (all lines of a field joined) that are parsed."""
MAX_METRICS = 64
"""Server-Timing metrics kept per response; later ones are ignored."""
MAX_NAME = 64
"""Characters of a metric name kept."""
MAX_DESC = 256
"""Characters of a ``desc`` parameter kept."""
RAW_MAX = 512
"""Characters of the header value copied into ``requests[].upstream.raw``."""
MAX_DUR_MS = 86_400_000.0
"""Largest duration accepted (one day, in ms); anything above is not a measurement."""
TTFB_SLACK_MS = 1.0
"""How far an upstream duration may exceed the client's time to first byte and still
count (integer-millisecond headers round up): ``edge_ms`` is then 0."""
MAX_EVIDENCE = 10
"""Evidence lines kept per edge."""
MAX_FINDING_EVIDENCE = 20
"""Connection ids listed per finding."""

UPSTREAM_METRICS: tuple[tuple[str, str], ...] = (
    ("server-timing", "cforigin"),
    ("server-timing", "cdn-upstream-fbl"),
    ("x-envoy-upstream-service-time", ""),
    ("server-timing", "origin"),
    ("server-timing", "upstream"),
    ("server-timing", "backend"),
    ("server-timing", "app"),
    ("server-timing", "application"),
)
"""Where ``upstream_ms`` comes from, first found wins: time spent upstream of the edge
(behind the hop the client talks to) excluding the edge's own work. Cloudflare's
``cfOrigin`` and CloudFront's ``cdn-upstream-fbl`` are the origin's first-byte time
as the edge measured it; Envoy's header the upstream's time as Envoy measured it;
the generic names as whoever set them measured them. Metric names are matched
case-insensitively."""
TOTAL_METRICS = ("cfrequestduration", "cdn-downstream-fbl", "total")
"""Time at the edge from receiving the request to sending the first byte of the
answer, *including* upstream (Cloudflare's ``cfRequestDuration``, CloudFront's
``cdn-downstream-fbl``, a generic ``total``)."""
EDGE_METRICS = ("cfedge", "edge")
"""The edge's own processing time, *excluding* upstream (Cloudflare's ``cfEdge``,
Akamai's ``edge``)."""

_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_OWS = " \t"
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_RTT = re.compile(r"(?:^|[?&])rtt=([0-9]{1,12})(?:&|$)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: str, limit: int = 120) -> str:
    """A capture-borne string made safe to show: control characters replaced by ``?``,
    cut to ``limit`` characters (with ``...``)."""
    cut = text[:limit + 1]
    out = _CONTROL.sub("?", cut)
    return out if len(cut) <= limit else out[:limit] + "..."


# --- Server-Timing -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric of a ``Server-Timing`` header."""

    name: str
    """Metric name as sent (a token, at most :data:`MAX_NAME` characters)."""
    dur: float | None
    """``dur`` in milliseconds; None when absent, empty, or not a finite number between
    0 and :data:`MAX_DUR_MS`."""
    desc: str | None
    """``desc`` (a quoted string unquoted), at most :data:`MAX_DESC` characters."""


def _token_end(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _TCHAR:
        i += 1
    return i


def _skip_ows(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _OWS:
        i += 1
    return i


def _quoted(s: str, i: int) -> tuple[str, int]:
    """The quoted-string starting at ``s[i] == '"'``, and the index after it. An
    unterminated string runs to the end (as the W3C processing model reads it)."""
    out: list[str] = []
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n:
            out.append(s[i + 1])
            i += 2
        elif c == '"':
            return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), n


def _skip_element(s: str, i: int) -> int:
    """Index of the comma ending the (malformed) list element at ``i``, quoted strings
    skipped, or the end."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == ",":
            return i
        if c == '"':
            _, i = _quoted(s, i)
            continue
        i += 1
    return n


def parse_duration(value: str | None) -> float | None:
    """A ``dur`` value in ms, or None unless it is a plain decimal number in
    ``[0, MAX_DUR_MS]`` (no sign, no ``nan``/``inf``, at most 32 characters)."""
    if not value or len(value) > 32 or not _NUMBER.fullmatch(value):
        return None
    try:
        x = float(value)
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(x) or x < 0 or x > MAX_DUR_MS:
        return None
    return x


def parse_server_timing(value: str | Iterable[str]) -> list[Metric]:
    """The metrics of a ``Server-Timing`` field value (or of several field lines, which
    are one comma-separated list as RFC 9110 combines them).

    Grammar (W3C Server Timing, RFC 9110 lists)::

        Server-Timing = #metric
        metric        = token *( OWS ";" OWS param )
        param         = token [ OWS "=" OWS ( token / quoted-string ) ]

    Parameter names are case-insensitive and the first occurrence of each wins; only
    ``dur`` and ``desc`` are kept. Empty list elements are skipped; an element that
    does not follow the grammar is dropped whole (up to the next comma outside a
    quoted string), and parsing goes on. At most :data:`MAX_FIELD` characters and
    :data:`MAX_METRICS` metrics are read; one pass, never raises.
    """
    if isinstance(value, str):
        s = value
    else:
        parts: list[str] = []
        size = 0
        for v in value:
            if not isinstance(v, str):
                continue
            parts.append(v)
            size += len(v) + 2
            if size > MAX_FIELD:
                break
        s = ", ".join(parts)
    s = s[:MAX_FIELD]
    out: list[Metric] = []
    n = len(s)
    i = 0
    while i < n and len(out) < MAX_METRICS:
        i = _skip_ows(s, i)
        if i >= n:
            break
        if s[i] == ",":
            i += 1
            continue
        j = _token_end(s, i)
        if j == i:
            i = _skip_element(s, i)
            continue
        name = s[i:j]
        i = j
        params: dict[str, str | None] = {}
        ok = True
        while True:
            i = _skip_ows(s, i)
            if i >= n or s[i] == ",":
                break
            if s[i] != ";":
                ok = False
                break
            i = _skip_ows(s, i + 1)
            k = _token_end(s, i)
            if k == i:
                ok = False
                break
            pname = s[i:k].lower()
            i = _skip_ows(s, k)
            pval: str | None = None
            if i < n and s[i] == "=":
                i = _skip_ows(s, i + 1)
                if i < n and s[i] == '"':
                    pval, i = _quoted(s, i)
                else:
                    k = _token_end(s, i)
                    pval = s[i:k]
                    i = k
            params.setdefault(pname, pval)
        if not ok:
            i = _skip_element(s, i)
            continue
        desc = params.get("desc")
        out.append(Metric(name[:MAX_NAME], parse_duration(params.get("dur")),
                          None if desc is None else desc[:MAX_DESC]))
    return out


# --- the split of one request --------------------------------------------------------


_SERVER_TIMING = "server-timing"
_ENVOY_TIME = "x-envoy-upstream-service-time"


def _timing_values(headers: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The values of a response's ``server-timing`` and ``x-envoy-upstream-service-time``
    headers (names in any case), in one pass that lowers only the names of either length:
    a name whose lower case is ASCII has that length already."""
    timing: list[str] = []
    envoy: list[str] = []
    for h in headers:
        if not ((isinstance(h, tuple) or isinstance(h, list)) and len(h) == 2  # noqa: SIM101
                and isinstance(h[0], str)
                and isinstance(h[1], str)):
            continue
        size = len(h[0])
        if size == len(_SERVER_TIMING):
            if h[0].lower() == _SERVER_TIMING:
                timing.append(h[1])
        elif size == len(_ENVOY_TIME) and h[0].lower() == _ENVOY_TIME:
            envoy.append(h[1])
    return timing, envoy


def _envoy_ms(values: list[str]) -> float | None:
    """``x-envoy-upstream-service-time``: a non-negative integer of ms (the first line)."""
    if not values:
        return None
    v = values[0].strip()
    if not v.isascii() or not v.isdigit() or len(v) > 9:
        return None
    x = float(int(v))
    return x if x <= MAX_DUR_MS else None


def _first(metrics: dict[str, Metric], names: Iterable[str]) -> Metric | None:
    for n in names:
        m = metrics.get(n)
        if m is not None:
            return m
    return None


def request_split(req: Request) -> dict[str, Any] | None:
    """``requests[].upstream`` for one request, or None when its answer does not tell.

    Let T be the client's time to first byte, and from the answer U an upstream
    duration (:data:`UPSTREAM_METRICS`), X a total at the edge
    (:data:`TOTAL_METRICS`), E the edge's own time (:data:`EDGE_METRICS`):

    * U known: ``upstream_ms = U`` (``includes_edge: false``);
    * else X and E known: ``upstream_ms = X - E`` (when not negative);
    * else X known: ``upstream_ms = X`` (``includes_edge: true``: the edge's own work is
      counted upstream, so ``edge_ms`` is the network between client and edge);
    * else (E alone, or nothing usable): None.

    ``edge_ms = T - upstream_ms`` (rounded to the microsecond); when ``upstream_ms``
    exceeds T by up to :data:`TTFB_SLACK_MS` it is 0, beyond that it is None and
    ``exceeds_ttfb`` is true (the header measured something else, e.g. to the last
    byte). ``edge_own_ms`` is E where given, ``edge_rtt_ms`` the edge's own TCP round
    trip to the client where it says (Cloudflare ``cfL4`` ``rtt``, in microseconds).
    """
    headers = req.response_headers
    if not headers:
        return None
    st_values, envoy_values = _timing_values(headers)
    if not st_values and not envoy_values:
        return None
    metrics: dict[str, Metric] = {}
    for m in parse_server_timing(st_values) if st_values else []:
        metrics.setdefault(m.name.lower(), m)
    timed = {k: m for k, m in metrics.items() if m.dur is not None}
    envoy = _envoy_ms(envoy_values)

    upstream: float | None = None
    source = metric = None
    includes_edge = False
    for src, name in UPSTREAM_METRICS:
        if src == "server-timing":
            found = timed.get(name)
            if found is not None and found.dur is not None:
                upstream, source, metric = found.dur, src, found.name
                break
        elif envoy is not None:
            upstream, source, metric = envoy, src, None
            break
    total = _first(timed, TOTAL_METRICS)
    own = _first(timed, EDGE_METRICS)
    if upstream is None and total is not None and total.dur is not None:
        source = "server-timing"
        if own is not None and own.dur is not None and own.dur <= total.dur:
            upstream = total.dur - own.dur
            metric = f"{total.name} - {own.name}"
        else:
            upstream, metric, includes_edge = total.dur, total.name, True
    if upstream is None or source is None:
        return None

    ttfb = (None if req.first_byte_ns is None
            else (req.first_byte_ns - req.ts_ns) / NS_PER_MS)
    edge_ms: float | None = None
    exceeds = False
    if ttfb is not None and ttfb >= 0:
        rest = ttfb - upstream
        if rest >= 0:
            edge_ms = round(rest, 3)
        elif rest >= -TTFB_SLACK_MS:
            edge_ms = 0.0
        else:
            exceeds = True
    rtt_ms = None
    l4 = metrics.get("cfl4")
    if l4 is not None and l4.desc:
        hit = _RTT.search(l4.desc)
        if hit is not None and int(hit.group(1)) <= MAX_DUR_MS * 1000:
            rtt_ms = int(hit.group(1)) / 1000
    raw_values = st_values if source == "server-timing" else envoy_values
    return {
        "source": source,
        "metric": None if metric is None else clean(metric, MAX_NAME * 2 + 3),
        "upstream_ms": upstream,
        "edge_ms": edge_ms,
        "includes_edge": includes_edge,
        "edge_own_ms": None if own is None else own.dur,
        "edge_rtt_ms": rtt_ms,
        "ttfb_ms": ttfb,
        "exceeds_ttfb": exceeds,
        "raw": clean(", ".join(raw_values), RAW_MAX),
    }


# --- who the edge is -----------------------------------------------------------------

VENDOR_ORDER = ("cloudflare", "cloudfront", "fastly", "akamai", "google", "envoy",
                "varnish", "proxy", "nginx", "haproxy", "traefik", "trafficserver",
                "aws-elb", "caddy")
"""Edge names from headers, most specific first: when a response carries signs of
several, the ``server`` header's CDN, else one whose published ranges hold the server
address, else the first of this order is named."""
_SERVER_NAMES = (
    ("cloudflare", "cloudflare"), ("cloudfront", "cloudfront"),
    ("akamaighost", "akamai"), ("akamainetstorage", "akamai"), ("akamai", "akamai"),
    ("google frontend", "google"), ("gfe", "google"), ("gws", "google"),
    ("envoy", "envoy"), ("varnish", "varnish"), ("openresty", "nginx"),
    ("nginx", "nginx"), ("haproxy", "haproxy"), ("traefik", "traefik"),
    ("ats", "trafficserver"), ("trafficserver", "trafficserver"), ("awselb", "aws-elb"),
    ("caddy", "caddy"),
)
_EXACT = ("gfe", "gws", "ats")
"""Server values matched only whole or before a ``/`` (too short to look for inside)."""
_CDNS = ("cloudflare", "cloudfront", "fastly", "akamai", "google")
_FASTLY_NODE = re.compile(r"cache-[a-z0-9]+(?:-[a-z0-9]+)*", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _server_name(value: str) -> str | None:
    """The edge a ``server`` header value names, remembered per value (a capture repeats
    a few; the cache is bounded, whatever the capture sends)."""
    v = value.strip().lower()
    for needle, name in _SERVER_NAMES:
        if needle in _EXACT:
            if v == needle or v.startswith(needle + "/"):
                return name
        elif needle in v:
            return name
    return None


def header_signals(headers: Sequence[object] | None) -> list[tuple[str, str]]:
    """(edge name, evidence) for each header of one response that names an edge
    (``headers``: name/value pairs; anything else in it is skipped)."""
    out: list[tuple[str, str]] = []
    if not headers:
        return out
    for h in headers[:512]:
        # two checks, not ``tuple | list``: that builds a union object per header
        if not ((isinstance(h, tuple) or isinstance(h, list)) and len(h) == 2):  # noqa: SIM101
            continue
        k, v = h
        if not isinstance(k, str) or not isinstance(v, str):
            continue
        key = k.lower()
        val = v[:1024]
        name: str | None = None
        if key == "server":
            name = _server_name(val)
        elif key in ("cf-ray", "cf-cache-status"):
            name = "cloudflare"
        elif key in ("x-amz-cf-id", "x-amz-cf-pop"):
            name = "cloudfront"
        elif key == "via":
            low = val.lower()
            if "cloudfront" in low:
                name = "cloudfront"
            elif "varnish" in low:
                name = "varnish"
            elif val.strip():
                name = "proxy"
        elif key == "x-cache":
            name = "cloudfront" if "cloudfront" in val.lower() else "proxy"
        elif key == "x-fastly-request-id" or key.startswith("fastly-"):
            name = "fastly"
        elif key == "x-served-by":
            if any(_FASTLY_NODE.fullmatch(p.strip()) for p in val.split(",")[:8]):
                name = "fastly"
        elif key.startswith("x-akamai-") or key in ("akamai-grn", "akamai-cache-status"):
            name = "akamai"
        elif key.startswith("x-envoy-"):
            name = "envoy"
        elif key == "x-varnish":
            name = "varnish"
        if name is not None:  # the evidence line only for a header that names an edge
            out.append((name, f"{clean(key, 40)}: {clean(val)}"))
    return out


@dataclass(frozen=True, slots=True)
class EdgeRanges:
    """The shipped published ranges of one edge (``netdiag/data/edge_ranges.json``)."""

    name: str
    """Edge name (``cloudflare``...)."""
    networks: tuple[IPNetwork, ...]
    """Its prefixes."""
    source: str
    """Where the list is published."""
    as_of: str | None
    """Date of the copy the list was taken from, where known."""
    complete: bool
    """The whole published list (False: a representative subset)."""


@lru_cache(maxsize=1)
def shipped_ranges() -> tuple[EdgeRanges, ...]:
    """The published ranges netdiag ships (read once)."""
    text = resources.files("netdiag").joinpath("data/edge_ranges.json").read_text("utf-8")
    data = json.loads(text)
    out = []
    for e in data.get("edges", []):
        nets = tuple(ipaddress.ip_network(r, strict=True) for r in e["ranges"])
        out.append(EdgeRanges(e["name"], nets, e.get("source", ""), e.get("as_of"),
                              bool(e.get("complete"))))
    return tuple(out)


def _addr(ep: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    host, _ = split_endpoint(ep)
    return parse_ip(host.strip("[]"))


def range_match(ip: str, profile: Profile | None = None
                ) -> tuple[str, IPNetwork, str] | None:
    """(edge name, network, where) of the first range holding address (or endpoint)
    ``ip``: a profile ``[[edge]]`` entry first (``where`` = ``profile``), then the shipped
    lists (``where`` = the list's source and date)."""
    edges = getattr(profile, "edges", ()) or ()
    if not edges:
        return _shipped_match_of(ip)
    addr = _addr(ip)
    if addr is None:
        return None
    for e in edges:
        for net in e.ranges:
            if net.version == addr.version and addr in net:
                return e.name, net, "profile"
    return _shipped_match(addr)


@functools.lru_cache(maxsize=1 << 16)
def _shipped_match_of(ip: str) -> tuple[str, IPNetwork, str] | None:
    """:func:`_shipped_match` of an address or endpoint as written: a capture's
    connections name a few servers, and parsing the address took longer than the
    rest of a connection's edge facts."""
    addr = _addr(ip)
    return None if addr is None else _shipped_match(addr)


@functools.lru_cache(maxsize=1 << 16)
def _shipped_match(addr: ipaddress.IPv4Address | ipaddress.IPv6Address
                   ) -> tuple[str, IPNetwork, str] | None:
    """The first shipped range holding ``addr`` (the lists never change during a run;
    a capture has one lookup per server address, not per connection)."""
    for r in shipped_ranges():
        for net in r.networks:
            if net.version == addr.version and addr in net:
                what = "published" if r.complete else "a subset of the published"
                when = f" as of {r.as_of}" if r.as_of else ""
                return r.name, net, f"{what} ranges{when}"
    return None


def ttl_evidence(ttl: int | None) -> tuple[int | None, str | None]:
    """(hops, evidence) from the server's IP TTL: hops = the nearest usual initial TTL
    at or above it (32, 64, 128, 255) minus it."""
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 < ttl <= 255:
        return None, None
    hops = hop_distance(ttl)
    initial = next(i for i in INITIAL_TTLS if ttl <= i)
    where = "the same host or link" if hops == 0 else f"{hops} hop{'s' if hops != 1 else ''} away"
    return hops, f"server TTL {ttl}: {where} (initial TTL {initial})"


def _span_ms(a: int | None, b: int | None) -> float | None:
    if a is None or b is None or b < a:
        return None
    return (b - a) / NS_PER_MS


def tls_termination(conn: Connection) -> tuple[bool | None, str | None]:
    """Whether TLS terminates where TCP does, from the handshake times, with the line
    saying why (None, None when the capture cannot tell).

    R = the TCP handshake RTT (SYN to the client's ACK, captured at the client), H = the
    TLS handshake (ClientHello to the closing Finished), n = the round trips H needs:
    1 for TLS 1.3 (2 after a HelloRetryRequest) and an abbreviated TLS 1.2 handshake,
    2 for a full TLS 1.2 (or older) one. With ``extra = H - n*R``: TLS terminates at the
    TCP peer when ``extra <= max(n*R/2, 5 ms)`` (the rest is the server's crypto); it
    terminates further behind (TCP is cut at a layer-4 hop in front) when ``extra >=
    n*R`` and above 5 ms; in between the line says it is inconclusive. Needs the SYN in
    the capture and no SYN retransmission.
    """
    tls = conn.tls
    if tls is None or not conn.handshake_seen or conn.syn_retransmissions:
        return None, None
    rtt = _span_ms(conn.syn_ns, conn.handshake_ack_ns)
    hs = _span_ms(tls.client_hello_ns, tls.finished_ns)
    if rtt is None or hs is None or rtt <= 0:
        return None, None
    version = tls.version or ""
    if version == "TLS 1.3":
        n = 2 if tls.hello_retry else 1
    elif version.startswith(("TLS 1.", "SSL")):
        n = 1 if tls.resumed else 2
    else:
        return None, None
    extra = hs - n * rtt
    trips = hs / rtt
    base = (f"{clean(version, 12)} handshake {_num(hs)} ms = {trips:.1f} round trips of "
            f"the {_num(rtt)} ms TCP RTT ({n} expected)")
    if extra <= max(n * rtt / 2, 5.0):
        if extra > n * rtt / 2:
            return True, (f"{clean(version, 12)} handshake {_num(hs)} ms, within 5 ms of "
                          f"{n} round trip{'s' if n > 1 else ''} of the {_num(rtt)} ms TCP "
                          "RTT (the rest is the server's crypto): TLS terminates where "
                          "TCP does")
        return True, f"{base}: TLS terminates where TCP does"
    if extra >= n * rtt and extra > 5.0:
        return False, (f"{base}: TLS terminates behind the hop that answers TCP "
                       f"(about {extra / n:.1f} ms further per round trip)")
    return None, f"{base}: inconclusive"


def _num(ms: float) -> str:
    """Milliseconds for evidence: 3 decimals below 1 ms (loopback), else 1."""
    return f"{ms:.3f}" if ms < 1 else f"{ms:.1f}"


def _ttfbs(conn: Connection) -> list[float]:
    out = []
    for r in conn.requests:
        if r.protocol == "resp":
            continue
        t = _span_ms(r.ts_ns, r.first_byte_ns)
        if t is not None:
            out.append(t)
    return out


def identify_edge(conn: Connection, profile: Profile | None = None) -> dict[str, Any] | None:
    """``connections[].edge``: ``{name, evidence, inferred: true, hops, tls_at_tcp_peer}``
    when the server is recognised as an edge, else None.

    Order: a profile ``[[edge]]`` range holding the server address; else the response
    headers (the ``server`` header's CDN, else a CDN the shipped ranges confirm, else
    the first of :data:`VENDOR_ORDER`); else the shipped published ranges. The
    evidence lists the lines for the name chosen, then other names the headers
    suggested, the hop distance from the IP TTL and the TCP/TLS handshake rule
    (:func:`tls_termination`), and, when TLS terminates where TCP does, how much of the
    median time to first byte is spent behind that hop.
    """
    if conn.protocol in ("dns", "resp"):
        return None
    by_name: dict[str, list[str]] = {}
    server_cdn: str | None = None
    for r in conn.requests:
        for vendor, ev in header_signals(r.response_headers):
            lines = by_name.setdefault(vendor, [])
            if ev not in lines and len(lines) < 2:
                lines.append(ev)
            if (server_cdn is None and ev.startswith("server: ") and vendor in _CDNS):
                server_cdn = vendor
    ranged = range_match(conn.server, profile)
    range_line = None
    if ranged is not None:
        rname, net, where = ranged
        range_line = (f"server {clean(conn.server, 60)} is in {net} ({rname}, "
                      f"{'profile [[edge]]' if where == 'profile' else where})")
    name: str | None = None
    if ranged is not None and ranged[2] == "profile":
        name = ranged[0]
    elif by_name:
        if server_cdn is not None:
            name = server_cdn
        elif ranged is not None and ranged[0] in by_name:
            name = ranged[0]
        else:
            name = min(by_name, key=lambda n: VENDOR_ORDER.index(n)
                       if n in VENDOR_ORDER else len(VENDOR_ORDER))
    elif ranged is not None:
        name = ranged[0]
    if name is None:
        return None
    evidence: list[str] = []
    if range_line is not None and ranged is not None and ranged[0] == name:
        evidence.append(range_line)
    evidence.extend(f"response header {ev}" for ev in by_name.get(name, []))
    for other, lines in by_name.items():
        if other != name:
            evidence.append(f"also response header {lines[0]} ({other})")
    if range_line is not None and ranged is not None and ranged[0] != name:
        evidence.append(f"but {range_line}")
    evidence = evidence[:MAX_EVIDENCE - 3]
    hops, ttl_line = ttl_evidence(conn.server_ttl)
    if ttl_line is not None:
        evidence.append(ttl_line)
    at_peer, tls_line = tls_termination(conn)
    if tls_line is not None:
        evidence.append(tls_line)
    if at_peer:
        rtt = _span_ms(conn.syn_ns, conn.handshake_ack_ns)
        waits = sorted(_ttfbs(conn))
        if rtt and waits:
            med = quantile(waits, 0.5)
            if med >= 2 * rtt:
                evidence.append(
                    f"median time to first byte {_num(med)} ms is {med / rtt:.1f} round "
                    f"trips: about {_num(med - rtt)} ms is spent behind the hop that "
                    "terminates TCP and TLS")
    return {"name": name, "evidence": evidence, "inferred": True, "hops": hops,
            "tls_at_tcp_peer": at_peer}


# --- findings and the document -------------------------------------------------------


def _host(conn: Connection) -> str:
    if conn.tls is not None and conn.tls.sni:
        return clean(conn.tls.sni, 80)
    for r in conn.requests:
        if r.authority and r.protocol != "resp":
            return clean(r.authority, 80)
    return clean(conn.server, 80)


def _fmt(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


@dataclass
class _Group:
    host: str
    edge: str | None
    ttfb: list[float]
    upstream: list[float]
    edge_ms: list[float]
    labels: Counter[str]
    includes_edge: int = 0
    exceeded: int = 0
    conns: dict[str, None] = field(default_factory=dict)
    """Connection ids, in order (a dict as an ordered set)."""


def edge_findings(connections: Sequence[Connection],
                  profile: Profile | None = None) -> list[Finding]:
    """One ``edge-split`` info finding per (server name, edge) whose requests carried a
    split with both ``upstream_ms`` and ``edge_ms``: the median time to first byte and
    the median time upstream of the edge, naming the header and the request count;
    evidence the connection ids. Nothing when no request carried one."""
    groups: dict[tuple[str, str | None], _Group] = {}
    for conn in connections:
        if conn.protocol in ("dns", "resp"):
            continue
        splits = [s for s in (request_split(r) for r in conn.requests) if s is not None]
        if not splits:
            continue
        ident = identify_edge(conn, profile)
        edge = None if ident is None else ident["name"]
        key = (_host(conn), edge)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(key[0], edge, [], [], [], Counter())
        used = False
        for s in splits:
            if s["exceeds_ttfb"]:
                g.exceeded += 1
                continue
            if s["edge_ms"] is None or s["ttfb_ms"] is None:
                continue
            used = True
            g.ttfb.append(s["ttfb_ms"])
            g.upstream.append(s["upstream_ms"])
            g.edge_ms.append(s["edge_ms"])
            label = ("Server-Timing " + (s["metric"] or "") if s["source"] == "server-timing"
                     else s["source"])
            g.labels[label] += 1
            g.includes_edge += bool(s["includes_edge"])
        if used:
            g.conns.setdefault(conn.id)
    out: list[Finding] = []
    for g in sorted(groups.values(), key=lambda g: (-len(g.ttfb), g.host, g.edge or "")):
        n = len(g.ttfb)
        if n == 0:
            continue
        ttfb = quantile(sorted(g.ttfb), 0.5)
        up = quantile(sorted(g.upstream), 0.5)
        near = quantile(sorted(g.edge_ms), 0.5)
        label, _ = g.labels.most_common(1)[0]
        if len(g.labels) > 1:
            label += " and others"
        reqs = f"{n} request{'s' if n != 1 else ''}"
        if g.edge is None:
            who = f"{g.host}: of the"
            boundary = "the server's first hop"
        else:
            served = "a proxy" if g.edge == "proxy" else g.edge
            who = f"{g.host} is served through {served}: of the"
            boundary = "the edge"
        title = (f"{who} {_fmt(ttfb)} median time to first byte, {_fmt(up)} is upstream of "
                 f"{boundary} ({label}, {reqs})")
        near_what = ("the network between the client and the edge"
                     if g.includes_edge == n else
                     "the network between the client and the edge and the edge's own work")
        detail = (f"Median upstream {up:.1f} ms, median rest {near:.1f} ms ({near_what}), "
                  f"p90 time to first byte {quantile(sorted(g.ttfb), 0.9):.1f} ms, as the "
                  "responses' timing headers say (docs/report.md, Client-side split).")
        if g.includes_edge:
            detail += (f" For {g.includes_edge} of them the header counts the edge's own "
                       "processing as upstream (a total such as cfRequestDuration).")
        if g.exceeded:
            detail += (f" {g.exceeded} more said more time upstream than the client waited "
                       "and are left out.")
        out.append(Finding("info", "edge-split", title, detail,
                           list(g.conns)[:MAX_FINDING_EVIDENCE]))
    return out


def annotate_edge(cj: dict[str, Any], conn: Connection, profile: Profile | None = None) -> None:
    """Write ``edge`` into one connection's dict ``cj`` and ``upstream`` into each of its
    request dicts (in order)."""
    cj["edge"] = identify_edge(conn, profile)
    reqs = cj.get("requests")
    if isinstance(reqs, list):
        requests = conn.requests
        for i in range(min(len(reqs), len(requests))):  # a zip() with a keyword is a slow call
            rj = reqs[i]
            if isinstance(rj, dict):
                rj["upstream"] = request_split(requests[i])
