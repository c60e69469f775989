"""HAR 1.2 from a contract document: one entry per HTTP request, timings from packets.

A pure formatter: :func:`build_har` reads the document ``CollectingSink.document``
returns (``headers=True`` for decoded headers) and returns the HAR as a dict, ready
for ``json.dump``. Nothing here reads a capture.

How HAR's timing phases are filled (all in milliseconds, rounded to the microsecond):

* ``send`` = ``send_ms`` (request first byte to last byte; 0 when unknown);
  ``wait`` = ``ttfb_ms - send``; ``receive`` = ``ttlb_ms - ttfb_ms`` (each >= 0; a
  response that began before the request finished shows as ``wait`` 0).
* The **first** request on a connection whose SYN was captured also pays for the
  connection: ``connect`` = TCP handshake RTT + TLS handshake (HAR counts ``ssl``
  inside ``connect``), ``ssl`` = the TLS handshake (``-1`` for cleartext), and ``dns``
  = the latency of the DNS transaction attributed to the connection (see
  :func:`attribute_dns`; ``-1`` when none). ``blocked`` is the rest of the time
  between the start of the entry and the request: the pause between the DNS answer
  and the SYN, and between the end of the handshake and the request.
  ``startedDateTime`` is then the start of the earliest phase counted (the DNS query,
  else the SYN), so that a HAR viewer draws the bar where it happened, and
  ``time`` (the sum of the phases) ends at the response's last byte. The contract's
  request ``ts`` is kept in ``_netdiag.request_ts``.
* Later requests on the connection (reused), and requests on connections whose
  handshake was not captured: ``blocked``, ``dns``, ``connect`` and ``ssl`` are
  ``-1`` and ``startedDateTime`` is the request's own ``ts``.

Times outside what ISO 8601 dates can say (before year 1 or after 9999: a pcapng
interface with an extreme ``if_tsoffset``) are written clamped to
:data:`ISO_MIN`/:data:`ISO_MAX`; the entry's ``comment`` and the log's say so, and
:func:`build_har` reports the count through its ``warn`` callback.

Redis commands (``protocol`` ``resp``) are not HTTP and are left out. Requests
inferred from encrypted TLS records say so in ``comment``; what they cannot show
(method, path, status, headers) is empty. netdiag's own facts (connection, stream,
path attribution, streaming) are in the ``_netdiag`` custom field of each entry.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from netdiag.report.json_encode import Encode
from netdiag.report.json_out import Encoded
from netdiag.report.spill import TextSpill
from netdiag.textsafe import print_warning

ESTIMATED_COMMENT = "estimated from encrypted TLS record timing (no key log)"
DNS_WINDOW_S = 5.0
"""Longest pause between a DNS answer and the SYN for the lookup to count as the
connection's own (a lookup reused from a cache much later is not this connection's)."""
TS_SLACK_S = 1e-6
"""Float epoch seconds carry ~0.25 µs of rounding; comparisons allow this much."""

HTTP_VERSIONS = {"h2": "HTTP/2", "h2c": "HTTP/2", "http/1.1": "HTTP/1.1",
                 "http/1.0": "HTTP/1.0", "h3": "HTTP/3"}


ISO_MIN = "0001-01-01T00:00:00.000000Z"
"""The earliest ``startedDateTime`` written (a time before it is clamped to it)."""
ISO_MAX = "9999-12-31T23:59:59.999999Z"
"""The latest ``startedDateTime`` written (a time after it is clamped to it)."""
_TS_MIN = datetime(1, 1, 1, tzinfo=UTC).timestamp()
_TS_MAX = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
CLAMPED_COMMENT = ("startedDateTime clamped: the capture's time is outside the years "
                   "1-9999 ISO 8601 can write")


def in_iso_range(ts: float) -> bool:
    """``ts`` (epoch seconds) is a date ISO 8601 can write (years 1 to 9999)."""
    return math.isfinite(ts) and _TS_MIN <= ts < _TS_MAX + 1


def iso8601(ts: float) -> str:
    """Epoch seconds to ISO 8601 UTC with microseconds (``2026-11-29T15:00:30.935948Z``);
    a time outside years 1-9999 is clamped to :data:`ISO_MIN` / :data:`ISO_MAX`."""
    if not in_iso_range(ts):
        return ISO_MIN if ts < 0 else ISO_MAX
    try:
        dt = datetime.fromtimestamp(ts, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return ISO_MIN if ts < 0 else ISO_MAX
    return dt.isoformat(timespec="microseconds").replace("+00:00", "Z")


def split_endpoint(ep: str | None) -> tuple[str, int | None]:
    """``"ip:port"`` / ``"[v6]:port"`` to (ip, port)."""
    if not ep:
        return "", None
    if ep.startswith("["):
        host, _, rest = ep[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = ep.rpartition(":")
        if not sep or ":" in host:
            return ep, None
    try:
        return host, int(port)
    except ValueError:
        return host, None


def is_http(conn: dict[str, Any], req: dict[str, Any]) -> bool:
    """An HTTP exchange (not a Redis command)."""
    return req.get("protocol") != "resp" and conn.get("protocol") != "resp"


def _num(v: Any) -> float | None:
    t = v.__class__
    if t is float:  # most values: no isinstance
        return v  # type: ignore[no-any-return]
    if t is int:
        return float(v)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def handshake_seen(conn: dict[str, Any]) -> bool:
    """The connection's opening was captured (its setup belongs in a timeline)."""
    seen = conn.get("handshake_seen")
    if seen is None:
        return _num(conn.get("handshake_rtt_ms")) is not None
    return bool(seen)


def attribute_dns(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The DNS transaction each connection waited for: connection id -> DNS record.

    For each connection whose SYN was captured, in order of start: the answered
    transaction whose answers contain the server's address, that completed before the
    connection started (at most :data:`DNS_WINDOW_S` before), not already given to an
    earlier connection; asked from the connection's own client address when there is
    one, and otherwise the most recent. A connection made from a cached answer gets
    none.
    """
    by_ip: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    for i, d in enumerate(doc.get("dns") or []):
        if not isinstance(d, dict) or not isinstance(d.get("answers"), list):
            continue
        ts, lat = _num(d.get("ts")), _num(d.get("latency_ms"))
        if ts is None or lat is None:
            continue
        for a in set(map(str, d["answers"])):
            by_ip.setdefault(a, []).append((ts + lat / 1000.0, i, d))
    out: dict[str, dict[str, Any]] = {}
    if not by_ip:
        return out
    for lst in by_ip.values():
        lst.sort(key=lambda t: (t[0], t[1]))
    used: set[int] = set()
    # what is needed of each connection, not the connection: a document made as it is
    # read (``Records``) then holds none of them
    conns = [(c["ts"], str(c.get("server") or ""), str(c.get("client") or ""),
              str(c.get("id")))
             for c in doc.get("connections") or []
             if isinstance(c, dict) and handshake_seen(c) and _num(c.get("ts")) is not None]
    conns.sort(key=itemgetter(0))
    for conn_ts, server, client, conn_id in conns:
        server_ip, _ = split_endpoint(server)
        client_ip, _ = split_endpoint(client)
        cands = by_ip.get(server_ip)
        if not cands:
            continue
        best: tuple[tuple[bool, float], int, dict[str, Any]] | None = None
        k = bisect.bisect_right(cands, conn_ts + TS_SLACK_S, key=lambda t: t[0])
        while k > 0:
            k -= 1
            end, i, d = cands[k]
            if conn_ts - end > DNS_WINDOW_S:
                break
            if i in used:
                continue
            key = (split_endpoint(str(d.get("client") or ""))[0] == client_ip, end)
            if best is None or key > best[0]:
                best = (key, i, d)
        if best is not None:
            used.add(best[1])
            out[conn_id] = best[2]
    return out


def request_phases(req: dict[str, Any]) -> tuple[float, float, float]:
    """(send, wait, receive) in ms, each >= 0, from ``send_ms``, ``ttfb_ms``, ``ttlb_ms``."""
    send = max(_num(req.get("send_ms")) or 0.0, 0.0)
    ttfb, ttlb = _num(req.get("ttfb_ms")), _num(req.get("ttlb_ms"))
    first = send if ttfb is None else max(ttfb, send)
    last = first if ttlb is None else max(ttlb, first)
    return send, first - send, last - first


def connection_setup(conn: dict[str, Any], dns: dict[str, Any] | None
                     ) -> dict[str, float | None]:
    """The setup a connection's first request waited for, in ms (None: not measured):
    ``dns``, ``tcp`` (handshake RTT), ``tls`` (handshake), plus ``dns_ts`` (the DNS
    query's epoch seconds) when a lookup is attributed."""
    tls = conn.get("tls") or {}
    return {
        "dns": None if dns is None else _num(dns.get("latency_ms")),
        "dns_ts": None if dns is None else _num(dns.get("ts")),
        "tcp": _num(conn.get("handshake_rtt_ms")),
        "tls": _num(tls.get("handshake_ms")) if isinstance(tls, dict) else None,
    }


def _headers(pairs: Any) -> list[dict[str, str]]:
    if not pairs:
        return []
    out = []
    for p in pairs:
        if isinstance(p, (list, tuple)) and len(p) == 2:
            out.append({"name": str(p[0]), "value": str(p[1])})
    return out


def _header(pairs: Any, name: str) -> str | None:
    for p in pairs or []:
        if isinstance(p, (list, tuple)) and len(p) == 2 and str(p[0]).lower() == name:
            return str(p[1])
    return None


def _http_version(conn: dict[str, Any], req: dict[str, Any]) -> str:
    proto = req.get("protocol")
    if not proto:
        tls = conn.get("tls") or {}
        proto = conn.get("protocol") if conn.get("protocol") not in (None, "tls") else (
            tls.get("alpn") if isinstance(tls, dict) else None)
    return HTTP_VERSIONS.get(str(proto).lower(), "") if proto else ""


def request_url(conn: dict[str, Any], req: dict[str, Any]) -> str:
    """Absolute URL: scheme from TLS, host from ``:authority``/Host, else SNI, else the
    server address (with its port when not the scheme's default)."""
    tls = conn.get("tls")
    scheme = "https" if tls else "http"
    path = req.get("path")
    if isinstance(path, str) and path.lower().startswith(("http://", "https://")):
        return path.split("#", 1)[0]          # absolute-form (a proxy request)
    host = req.get("authority") or _header(req.get("request_headers"), "host")
    if not host:
        ip, port = split_endpoint(conn.get("server"))
        name = (tls.get("sni") if isinstance(tls, dict) else None) or (
            f"[{ip}]" if ":" in ip else ip)
        default = 443 if scheme == "https" else 80
        host = name if port in (None, default) else f"{name}:{port}"
    if not isinstance(path, str) or not path:
        path = "/"
    elif not path.startswith("/"):
        path = "/" + path
    return f"{scheme}://{host}{path.split('#', 1)[0]}"


def _query(url: str) -> list[dict[str, str]]:
    if "?" not in url:  # no query to split (most requests)
        return []
    try:
        q = urlsplit(url).query
        return [{"name": k, "value": v} for k, v in parse_qsl(q, keep_blank_values=True)]
    except ValueError:
        return []


def _entry(conn: dict[str, Any], req: dict[str, Any], first: bool,
           dns: dict[str, Any] | None, page: str | None
           ) -> tuple[float, dict[str, Any]] | None:
    ts = _num(req.get("ts"))
    if ts is None:
        return None
    send, wait, receive = request_phases(req)
    blocked = dns_ms = connect = ssl = -1.0
    start = ts
    setup = connection_setup(conn, dns) if first and handshake_seen(conn) else None
    if setup is not None:
        conn_ts = _num(conn.get("ts"))
        tcp, tls = setup["tcp"], setup["tls"]
        if tcp is not None or tls is not None:
            connect = (tcp or 0.0) + (tls or 0.0)
            ssl = tls if tls is not None else -1.0
            if conn_ts is not None:
                start = min(start, conn_ts)
        if setup["dns"] is not None and setup["dns_ts"] is not None:
            dns_ms = setup["dns"]
            start = min(start, setup["dns_ts"])
        if start < ts:
            blocked = max((ts - start) * 1000.0 - max(dns_ms, 0.0) - max(connect, 0.0), 0.0)
    timings = {"blocked": round(blocked, 3), "dns": round(dns_ms, 3),
               "connect": round(connect, 3), "send": round(send, 3), "wait": round(wait, 3),
               "receive": round(receive, 3), "ssl": round(ssl, 3)}
    total = sum(v for k, v in timings.items() if k != "ssl" and v >= 0)
    version = _http_version(conn, req)
    estimated = bool(req.get("estimated"))
    url = request_url(conn, req)
    req_headers = req.get("request_headers")
    resp_headers = req.get("response_headers")
    status = req.get("status")
    location = _header(resp_headers, "location")
    request_bytes = req.get("request_bytes")
    response_bytes = req.get("response_bytes")
    mime = req.get("content_type") or _header(resp_headers, "content-type") or ""
    content: dict[str, Any] = {
        "size": response_bytes if isinstance(response_bytes, int) else 0,
        "mimeType": str(mime),
    }
    if estimated:
        content["comment"] = "TLS record payload bytes of the response (headers included)"
    server_ip, _ = split_endpoint(conn.get("server"))
    tls_info = conn.get("tls") if isinstance(conn.get("tls"), dict) else None
    custom: dict[str, Any] = {
        "connection": conn.get("id"), "client": conn.get("client"),
        "server": conn.get("server"), "stream_id": req.get("stream_id"),
        "estimated": estimated, "protocol": req.get("protocol"),
        "request_ts": ts, "ttfb_ms": req.get("ttfb_ms"), "ttlb_ms": req.get("ttlb_ms"),
        "send_ms": req.get("send_ms"), "chunks": req.get("chunks"),
        "chunk_gaps_ms": req.get("chunk_gaps_ms"), "sse_events": req.get("sse_events"),
        "first_event_ms": req.get("first_event_ms"), "reset": req.get("reset"),
        "reset_by": req.get("reset_by"), "stall_ms": req.get("stall_ms"),
        "reused_connection": not first, "path": conn.get("path"),
    }
    if tls_info is not None:
        custom["tls"] = {k: tls_info.get(k) for k in
                         ("version", "sni", "alpn", "cipher", "resumed", "decrypted")}
    if setup is not None and dns is not None:
        custom["dns"] = {k: dns.get(k) for k in
                         ("ts", "qname", "qtype", "server", "latency_ms", "answers")}
    for k in ("chain", "caused_by"):
        if k in req:
            custom[k] = req[k]
    entry: dict[str, Any] = {
        "startedDateTime": iso8601(start),
        "time": round(total, 3),
        "request": {
            "method": str(req.get("method") or ""),
            "url": url,
            "httpVersion": version,
            "cookies": [],
            "headers": _headers(req_headers),
            "queryString": _query(url),
            "headersSize": -1,
            "bodySize": request_bytes if isinstance(request_bytes, int) else -1,
        },
        "response": {
            "status": status if isinstance(status, int) and not isinstance(status, bool)
            else 0,
            "statusText": "",
            "httpVersion": version,
            "cookies": [],
            "headers": _headers(resp_headers),
            "content": content,
            "redirectURL": location or "",
            "headersSize": -1,
            "bodySize": (response_bytes if isinstance(response_bytes, int) and not estimated
                         else -1),
        },
        "cache": {},
        "timings": timings,
        "serverIPAddress": server_ip,
        "connection": str(conn.get("id") or ""),
        "_netdiag": custom,
    }
    if page is not None:
        entry["pageref"] = page
    notes = [ESTIMATED_COMMENT] if estimated else []
    if not in_iso_range(start):
        custom["started_clamped"] = True
        notes.append(CLAMPED_COMMENT)
    if notes:
        entry["comment"] = "; ".join(notes)
    return start, entry


def build_har(doc: dict[str, Any], warn: Callable[[str], None] | None = print_warning,
              dns_of: dict[str, dict[str, Any]] | None = None,
              encode: Encode | None = None) -> dict[str, Any]:
    """HAR 1.2 (``{"log": {...}}``) of every HTTP request in a contract document.

    ``warn`` gets one line when times had to be clamped (default: printed on standard
    error; None: only the HAR's comments say so). ``dns_of``: what
    :func:`attribute_dns` gives for ``doc``, where the caller has it cheaper.
    ``encode``: where given, each entry is kept as its JSON text, in a
    :class:`~netdiag.report.spill.TextSpill` (on disk), not as a dict in memory until
    the whole HAR is written; ``log.entries`` is then an
    :class:`~netdiag.report.json_out.Encoded` list that reads them back in order, once,
    for :func:`~netdiag.report.json_out.write_json` with the same encoder."""
    if dns_of is None:
        dns_of = attribute_dns(doc)
    cap = doc.get("capture") or {}
    files = [str(f) for f in cap.get("files") or []]
    first_ts = _num(cap.get("first_ts"))
    page = "capture" if first_ts is not None else None
    entries: list[tuple[float, int, int, Any]] = []
    spill = None if encode is None else TextSpill()
    estimated = clamped = 0
    for ci, conn in enumerate(doc.get("connections") or []):
        reqs = [r for r in conn.get("requests") or [] if is_http(conn, r)
                and _num(r.get("ts")) is not None]
        reqs.sort(key=lambda r: r["ts"])
        for i, r in enumerate(reqs):
            made = _entry(conn, r, i == 0, dns_of.get(str(conn.get("id"))), page)
            if made is not None:
                start, entry = made
                if str(entry.get("comment", "")).startswith(ESTIMATED_COMMENT):
                    estimated += 1
                if entry["_netdiag"].get("started_clamped"):
                    clamped += 1
                entries.append((start, ci, i, entry if spill is None or encode is None
                                else spill.add(encode(entry))))
    entries.sort(key=lambda t: t[:3])
    log: dict[str, Any] = {
        "version": "1.2",
        "creator": {"name": "netdiag", "version": str(doc.get("netdiag_version") or ""),
                    "comment": f"report contract {doc.get('contract')}"},
    }
    if page is not None and first_ts is not None:
        log["pages"] = [{
            "startedDateTime": iso8601(first_ts),
            "id": page,
            "title": ", ".join(files) or "capture",
            "pageTimings": {"onContentLoad": -1, "onLoad": -1},
            "comment": "the whole capture; entries are its HTTP requests",
        }]
    in_order = [e for *_, e in entries]
    if spill is None:
        log["entries"] = in_order
    else:
        spill.done()
        log["entries"] = Encoded(spill.read(in_order), len(in_order))
    notes = [f"measured by netdiag from packet capture {', '.join(files) or '(unnamed)'}"]
    if estimated:
        notes.append(f"{estimated} of {len(entries)} entries are {ESTIMATED_COMMENT}")
    if first_ts is not None and not in_iso_range(first_ts):
        clamped += 1
        log["pages"][0]["comment"] += f"; {CLAMPED_COMMENT}"
    if clamped:
        what = (f"{clamped} startedDateTime value{'s' if clamped != 1 else ''} clamped to "
                f"{ISO_MIN[:4]}..{ISO_MAX[:4]} (capture times outside the years ISO 8601 "
                "can write; the _netdiag fields keep the epoch seconds)")
        notes.append(what)
        if warn is not None:
            warn(f"HAR: {what}")
    log["comment"] = "; ".join(notes)
    return {"log": log}
