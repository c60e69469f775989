"""``netdiag verify``: netdiag's engine against tshark's, figure by figure.

Both engines read the same capture (and key log); their contract documents are
matched item by item and every figure is compared:

* a duration (``*_ms``, and request ``ts``) agrees when the two values are within the
  tolerance (default 0.05 ms) or both ``null``;
* any other figure (a count, a version, a name, a status) agrees when equal;
* an item only one engine has (a DNS transaction, a connection, a TLS handshake, a
  request) is one differing figure (``present``).

Matching: DNS transactions by (client, server, transport, id, question name and type)
and the nearest ``ts``; connections by (client, server) and the nearest ``ts``; the
requests of matched connections by HTTP/2 stream id, HTTP/1.x ones in order. Requests
netdiag *estimated* from encrypted records cannot be seen by tshark: they, and the HTTP
summary figures built on them, are listed as not comparable rather than compared.

Each figure carries the packets to look at: tshark's frame numbers (from the tshark
document's ``frames``) and netdiag's packet numbers (kept on its DNS and TLS records;
for connections and requests found from their timestamps among tshark's frame times).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TOLERANCE_MS = 0.05
MS_FIGURES = {"latency_ms", "handshake_rtt_ms", "handshake_ms", "ttfb_ms", "ttlb_ms",
              "duration_ms", "ts_ms", "p50", "p90", "p99", "first_ts_ms", "last_ts_ms"}


@dataclass
class Figure:
    """One figure as both engines measured it."""

    section: str
    """``capture``, ``dns``, ``tcp``, ``tls``, ``http`` or ``summary``."""
    item: str
    """Which record (human readable)."""
    name: str
    netdiag: Any
    tshark: Any
    differs: bool
    diff_ms: float | None = None
    netdiag_packets: dict[str, Any] = field(default_factory=dict)
    tshark_frames: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "item": self.item, "figure": self.name,
                "netdiag": self.netdiag, "tshark": self.tshark, "differs": self.differs,
                "diff_ms": self.diff_ms, "netdiag_packets": self.netdiag_packets,
                "tshark_frames": self.tshark_frames, "note": self.note}


@dataclass
class VerifyResult:
    """Every figure compared, and what could not be."""

    capture: list[str]
    tolerance_ms: float
    figures: list[Figure] = field(default_factory=list)
    not_comparable: list[dict[str, str]] = field(default_factory=list)
    truncated: bool = False
    engines: dict[str, Any] = field(default_factory=dict)

    @property
    def differences(self) -> list[Figure]:
        return [f for f in self.figures if f.differs]

    @property
    def ok(self) -> bool:
        return not self.differences

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in self.figures:
            row = out.setdefault(f.section, {"compared": 0, "differ": 0})
            row["compared"] += 1
            row["differ"] += int(f.differs)
        return out

    def summary_line(self) -> str:
        return f"{len(self.figures)} figures compared, {len(self.differences)} differ"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "capture": self.capture, "tolerance_ms": self.tolerance_ms,
                "truncated": self.truncated, "engines": self.engines,
                "compared": len(self.figures), "differ": len(self.differences),
                "by_section": self.counts(),
                "differences": [f.to_json() for f in self.differences],
                "not_comparable": self.not_comparable,
                "figures": [f.to_json() for f in self.figures]}


@dataclass
class NdPackets:
    """netdiag's packet numbers for its records (from the Python objects, whose times
    are exact nanoseconds): DNS by index in the document, TCP/TLS by connection id,
    requests by (connection id, index)."""

    dns: dict[int, dict[str, Any]] = field(default_factory=dict)
    tcp: dict[str, dict[str, Any]] = field(default_factory=dict)
    tls: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)


def netdiag_packets(dns_records: Sequence[Any], connections: Sequence[Any],
                    frame_times: dict[int, list[int]]) -> NdPackets:
    """:class:`NdPackets` from netdiag's records (``CollectingSink`` after ``document``):
    DNS and TLS records carry packet numbers; connection and request times are looked
    up among tshark's frame times."""
    def at(ns: int | None) -> Any:
        if ns is None:
            return None
        frames = frame_times.get(ns)
        return frames[0] if frames and len(frames) == 1 else frames

    out = NdPackets()
    for i, t in enumerate(dns_records):
        out.dns[i] = {"query": t.query_packet, "response": t.response_packet}
    for c in connections:
        out.tcp[c.id] = {"first": at(c.ts_ns), "syn": at(c.syn_ns),
                         "handshake_ack": at(c.handshake_ack_ns)}
        if c.tls is not None:
            out.tls[c.id] = {"client_hello": c.tls.client_hello_packet,
                             "finished": c.tls.finished_packet}
        for i, r in enumerate(c.requests):
            out.requests[(c.id, i)] = {"request": at(r.ts_ns), "response": at(r.first_byte_ns),
                                       "last": at(r.last_byte_ns)}
    return out


# ----------------------------------------------------------------------------- compare


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


class _Comparer:
    def __init__(self, result: VerifyResult, packets: NdPackets) -> None:
        self.r = result
        self.packets = packets
        self.tol = result.tolerance_ms

    def fig(self, section: str, item: str, name: str, nd: Any, ts: Any, *,
            ms: bool | None = None, nd_packets: dict[str, Any] | None = None,
            ts_frames: dict[str, Any] | None = None, note: str | None = None) -> None:
        is_ms = name in MS_FIGURES if ms is None else ms
        diff_ms = None
        if is_ms and _num(nd) and _num(ts):
            diff_ms = float(nd) - float(ts)
            differs = abs(diff_ms) > self.tol + 1e-9
        elif is_ms:
            differs = not (nd is None and ts is None)
        else:
            differs = nd != ts
        self.r.figures.append(Figure(section, item, name, nd, ts, differs, diff_ms,
                                     {k: v for k, v in (nd_packets or {}).items()
                                      if v is not None},
                                     {k: v for k, v in (ts_frames or {}).items()
                                      if v is not None}, note))

    def skip(self, section: str, item: str, reason: str) -> None:
        self.r.not_comparable.append({"section": section, "item": item, "reason": reason})


def _take(pool: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any], want: Any,
          ts: Any) -> dict[str, Any] | None:
    cands = [r for r in pool if key(r) == want]
    if not cands:
        return None

    def dist(r: dict[str, Any]) -> float:
        t = r.get("ts")
        return abs(t - ts) if _num(t) and _num(ts) else math.inf

    best = min(cands, key=dist)
    pool.remove(best)
    return best


def _dns_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r.get("client"), r.get("server"), r.get("transport"), r.get("id"),
            str(r.get("qname") or "").lower(), r.get("qtype"))


def _dns_label(r: dict[str, Any]) -> str:
    rid = r.get("id")
    rid_text = f"0x{rid:04x}" if isinstance(rid, int) else str(rid)
    return (f"DNS {r.get('transport')} {r.get('client')} -> {r.get('server')} id {rid_text} "
            f"{r.get('qname')} {r.get('qtype')}")


def _compare_dns(c: _Comparer, nd: list[dict[str, Any]], ts: list[dict[str, Any]]) -> None:
    pool = list(ts)
    for i, rec in enumerate(nd):
        other = _take(pool, _dns_key, _dns_key(rec), rec.get("ts"))
        label = _dns_label(rec)
        npk = c.packets.dns.get(i, {})
        if other is None:
            c.fig("dns", label, "present", True, False, ms=False, nd_packets=npk)
            continue
        tfr = other.get("frames") or {}
        for name in ("latency_ms", "rcode", "retransmissions", "responses", "truncated"):
            c.fig("dns", label, name, rec.get(name), other.get(name), nd_packets=npk,
                  ts_frames=tfr)
    for other in pool:
        c.fig("dns", _dns_label(other), "present", False, True, ms=False,
              ts_frames=other.get("frames") or {})


def _conn_key(r: dict[str, Any]) -> tuple[Any, Any]:
    return r.get("client"), r.get("server")


def _conn_label(r: dict[str, Any], other: dict[str, Any] | None = None) -> str:
    ids = f"netdiag {r.get('id')}" + (f" / tshark {other.get('id')}" if other else "")
    return f"TCP {r.get('client')} -> {r.get('server')} ({ids})"


def _compare_connections(c: _Comparer, nd: list[dict[str, Any]], ts: list[dict[str, Any]],
                         estimated_ok: list[bool]) -> None:
    pool = list(ts)
    for rec in nd:
        cid = str(rec.get("id"))
        npk = c.packets.tcp.get(cid, {})
        other = _take(pool, _conn_key, _conn_key(rec), rec.get("ts"))
        if other is None:
            c.fig("tcp", _conn_label(rec), "present", True, False, ms=False,
                  nd_packets={"first": npk.get("first")})
            continue
        label = _conn_label(rec, other)
        tfr = other.get("frames") or {}
        tcp_frames = {k: tfr.get(k) for k in ("first", "syn", "handshake_ack", "tcp_stream")}
        note = None
        if (rec.get("syn_retransmissions") or 0) or (other.get("syn_retransmissions") or 0):
            note = ("the client's SYN was retransmitted: both engines time the handshake "
                    "from the first SYN (tshark's own tcp.analysis.initial_rtt starts at "
                    "the last)")
        for name in ("handshake_rtt_ms", "syn_retransmissions", "retransmissions",
                     "out_of_order", "resets", "packets", "bytes_to_server",
                     "bytes_to_client", "lost_bytes", "duration_ms"):
            c.fig("tcp", label, name, rec.get(name), other.get(name), nd_packets=npk,
                  ts_frames=tcp_frames, note=note if name == "handshake_rtt_ms" else None)
        _compare_tls(c, label, rec, other, c.packets.tls.get(cid, {}))
        _compare_requests(c, label, rec, other, estimated_ok)
    for other in pool:
        c.fig("tcp", _conn_label(other), "present", False, True, ms=False,
              ts_frames={"first": (other.get("frames") or {}).get("first")})


TLS_FIGURES = ("version", "sni", "alpn_offered", "alpn", "cipher", "resumed", "hello_retry",
               "decrypted", "alert", "session_tickets", "key_updates", "handshake_ms")


def _compare_tls(c: _Comparer, label: str, rec: dict[str, Any], other: dict[str, Any],
                 npk: dict[str, Any]) -> None:
    a, b = rec.get("tls"), other.get("tls")
    if a is None and b is None:
        return
    label = label.replace("TCP ", "TLS ", 1)
    tfr = other.get("frames") or {}
    tls_frames = {k: tfr.get(k) for k in ("client_hello", "server_hello", "finished",
                                          "session_ticket")}
    if a is None or b is None:
        c.fig("tls", label, "present", a is not None, b is not None, ms=False,
              nd_packets=npk, ts_frames=tls_frames)
        return
    for name in TLS_FIGURES:
        va, vb = a.get(name), b.get(name)
        if name == "alpn_offered":
            va, vb = list(va or []), list(vb or [])
        c.fig("tls", label, name, va, vb, nd_packets=npk, ts_frames=tls_frames,
              note=tfr.get("finished_how") if name == "handshake_ms" else None)


def _compare_requests(c: _Comparer, label: str, rec: dict[str, Any], other: dict[str, Any],
                      estimated_ok: list[bool]) -> None:
    mine = [r for r in rec.get("requests") or [] if isinstance(r, dict)]
    theirs = [r for r in other.get("requests") or [] if isinstance(r, dict)]
    label = label.replace("TCP ", "HTTP ", 1)
    cid = str(rec.get("id"))
    not_http = [r for r in mine if not _is_http(r, rec)]
    if not_http:
        protos = sorted({str(r.get("protocol") or rec.get("protocol")) for r in not_http})
        c.skip("http", label.replace("HTTP ", "", 1),
               f"netdiag's {len(not_http)} {'/'.join(protos)} request(s): the tshark "
               "engine decodes HTTP only (tshark 4.0 has no RESP dissector)")
        mine = [r for r in mine if _is_http(r, rec)]
    estimated = [r for r in mine if r.get("estimated")]
    if estimated:
        estimated_ok[0] = False
        c.skip("http", label, f"netdiag's {len(estimated)} request(s) are estimated from "
                              "encrypted records; tshark decodes no HTTP it cannot decrypt")
        mine = [r for r in mine if not r.get("estimated")]
        if not mine and not theirs:
            return
    if not mine and not theirs:
        return
    c.fig("http", label, "requests", len(mine), len(theirs), ms=False,
          nd_packets={"first": c.packets.tcp.get(cid, {}).get("first")},
          ts_frames={"first": (other.get("frames") or {}).get("first")})
    index = {id(r): i for i, r in enumerate(rec.get("requests") or [])}
    by_sid = {r.get("stream_id"): r for r in theirs if r.get("stream_id") is not None}
    h1 = [r for r in theirs if r.get("stream_id") is None]
    used: set[int] = set()
    for r in mine:
        sid = r.get("stream_id")
        o = by_sid.get(sid) if sid is not None else (h1.pop(0) if h1 else None)
        if o is None and sid is not None and h1:
            o = h1.pop(0)  # an h2c upgrade: an HTTP/1.1 request answered on stream 1
        what = (f"{label} stream {sid}" if sid is not None else label) + \
            f" {r.get('method')} {r.get('path')}"
        npk = c.packets.requests.get((cid, index.get(id(r), -1)), {})
        if o is None:
            c.fig("http", what, "present", True, False, ms=False,
                  nd_packets={"request": npk.get("request")})
            continue
        used.add(id(o))
        tfr = o.get("frames") or {}
        frames = {k: tfr.get(k) for k in ("request", "response", "last")}
        ts_a = r.get("ts") * 1000 if _num(r.get("ts")) else None
        ts_b = o.get("ts") * 1000 if _num(o.get("ts")) else None
        c.fig("http", what, "ts_ms", ts_a, ts_b, nd_packets=npk, ts_frames=frames,
              note=tfr.get("request_how"))
        for name in ("ttfb_ms", "ttlb_ms", "method", "path", "authority", "status"):
            c.fig("http", what, name, r.get(name), o.get(name), nd_packets=npk,
                  ts_frames=frames,
                  note=tfr.get("response_how") if name == "ttfb_ms" else None)
        if r.get("protocol") in ("h2", "h2c") and o.get("response_bytes") is not None:
            c.fig("http", what, "response_bytes", r.get("response_bytes"),
                  o.get("response_bytes"), nd_packets=npk, ts_frames=frames)
    for o in theirs:
        if id(o) not in used:
            c.fig("http", f"{label} stream {o.get('stream_id')} {o.get('method')} "
                          f"{o.get('path')}", "present", False, True, ms=False,
                  ts_frames={k: (o.get("frames") or {}).get(k) for k in ("request",)})


def _is_http(r: dict[str, Any], conn: dict[str, Any]) -> bool:
    """A request the tshark engine can see: HTTP/2, h2c, HTTP/1.x, or estimated HTTP."""
    if conn.get("protocol") == "resp":
        return False
    proto = r.get("protocol")
    return proto is None or proto in ("h2", "h2c") or str(proto).startswith("http/")


SUMMARY_BLOCKS = (("dns", "latency_ms"), ("tcp", "handshake_rtt_ms"), ("tls", "handshake_ms"),
                  ("http", "ttfb_ms"), ("http", "ttlb_ms"))
SUMMARY_COUNTS = (("dns", "transactions"), ("dns", "answered"), ("dns", "retransmissions"),
                  ("tcp", "connections"), ("tcp", "retransmissions"), ("tcp", "resets"),
                  ("tls", "handshakes"), ("tls", "resumed"), ("tls", "hello_retry"),
                  ("tls", "decrypted"), ("tls", "versions"), ("http", "requests"),
                  ("http", "connections"), ("http", "reuse_rate"), ("http", "protocols"))


def _compare_summary(c: _Comparer, a: dict[str, Any], b: dict[str, Any],
                     http_comparable: bool, skip: tuple[str, ...] = ()) -> None:
    for sec, name in SUMMARY_COUNTS:
        if (sec == "http" and not http_comparable) or sec in skip:
            continue
        c.fig("summary", f"summary.{sec}", name, (a.get(sec) or {}).get(name),
              (b.get(sec) or {}).get(name), ms=False)
    for sec, name in SUMMARY_BLOCKS:
        if (sec == "http" and not http_comparable) or sec in skip:
            continue
        pa = (a.get(sec) or {}).get(name) or {}
        pb = (b.get(sec) or {}).get(name) or {}
        for q in ("count", "p50", "p90", "p99"):
            c.fig("summary", f"summary.{sec}.{name}", q, pa.get(q), pb.get(q),
                  ms=q != "count")
    if not http_comparable:
        c.skip("summary", "summary.http", "netdiag's HTTP figures include requests "
                                          "estimated from encrypted records")


def compare_documents(nd_doc: dict[str, Any], ts_doc: dict[str, Any], *,
                      tolerance_ms: float = DEFAULT_TOLERANCE_MS,
                      packets: NdPackets | None = None) -> VerifyResult:
    """Compare netdiag's document with the tshark engine's (see the module docstring).

    ``packets`` (:func:`netdiag_packets`) adds netdiag's packet numbers to each figure;
    without it only tshark's frames are given.
    """
    result = VerifyResult(list((nd_doc.get("capture") or {}).get("files") or []),
                          tolerance_ms)
    result.truncated = bool((nd_doc.get("capture") or {}).get("truncated")
                            or (ts_doc.get("capture") or {}).get("truncated"))
    result.engines = {"netdiag": nd_doc.get("netdiag_version"),
                      "tshark": (ts_doc.get("engine") or {}).get("tshark_version")}
    c = _Comparer(result, packets or NdPackets())
    ca, cb = nd_doc.get("capture") or {}, ts_doc.get("capture") or {}
    for name in ("packets", "bytes", "truncated"):
        c.fig("capture", "capture", name, ca.get(name), cb.get(name), ms=False)
    for name in ("first_ts", "last_ts"):
        va, vb = ca.get(name), cb.get(name)
        c.fig("capture", "capture", f"{name}_ms", va * 1000 if _num(va) else va,
              vb * 1000 if _num(vb) else vb, ms=True)
    _compare_dns(c, list(nd_doc.get("dns") or []), list(ts_doc.get("dns") or []))
    estimated_ok = [True]
    conns = list(nd_doc.get("connections") or [])
    quic = [r for r in conns if r.get("transport") == "udp"]
    for r in quic:
        c.skip("tcp", f"QUIC {r.get('client')} -> {r.get('server')} (netdiag {r.get('id')})",
               "QUIC: the tshark engine does not build QUIC connections")
    _compare_connections(c, [r for r in conns if r.get("transport") != "udp"],
                         list(ts_doc.get("connections") or []), estimated_ok)
    http_ok = estimated_ok[0] and not (nd_doc.get("summary") or {}).get("http", {}).get(
        "estimated")
    _compare_summary(c, nd_doc.get("summary") or {}, ts_doc.get("summary") or {}, http_ok,
                     skip=("tcp", "tls", "http") if quic else ())
    if quic:
        c.skip("summary", "summary.tcp", "QUIC: netdiag's connection and TLS counts include "
                                         "QUIC connections, the tshark engine's do not")
    return result


def verify_capture(path: str, keylogs: Sequence[str] = (), *,
                   tolerance_ms: float = DEFAULT_TOLERANCE_MS,
                   dns_ports: frozenset[int] = frozenset({53}),
                   extra_args: Sequence[str] = (), tshark: str | None = None) -> VerifyResult:
    """Run both engines on ``path`` with the key logs and compare them."""
    from netdiag.engines.tshark import tshark_analysis
    from netdiag.engines.tsjson import require_tshark
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    require_tshark(tshark)  # before the (longer) netdiag run
    keylog = None
    if keylogs:
        keylog = KeyLog()
        for k in keylogs:
            keylog.merge(KeyLog.from_file(k))
    sink = CollectingSink()
    result = analyze([path], sink, Options(keylog=keylog, dns_ports=dns_ports))
    nd_doc = sink.document(result)  # (sorts the sink's records into document order)
    # DNS netdiag found on other ports by its shape: tshark is told to decode it too
    found = frozenset(result.capture.dns_ports_found)
    ts = tshark_analysis([path], list(keylogs), dns_ports=dns_ports | found,
                         extra_args=extra_args, tshark=tshark)
    packets = netdiag_packets(sink.dns_records, sink.connections, ts.frame_times)
    out = compare_documents(nd_doc, ts.document, tolerance_ms=tolerance_ms, packets=packets)
    out.capture = [path]
    return out


# ----------------------------------------------------------------------------- text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".") if abs(v) < 1e12 else f"{v:.3f}"
    return repr(v) if isinstance(v, str) else str(v)


def _packets(d: dict[str, Any]) -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, list):
            v = "/".join(str(x) for x in v)
        parts.append(f"{k} {v}")
    return ", ".join(parts) if parts else "-"


def render_text(result: VerifyResult) -> str:
    """Every differing figure, grouped by item, then the count line."""
    lines = [f"netdiag verify {' '.join(result.capture)}: netdiag {result.engines.get('netdiag')}"
             f" vs tshark {result.engines.get('tshark')}, tolerance "
             f"{result.tolerance_ms:g} ms"]
    if result.truncated:
        lines.append("the capture is cut short: both engines compared up to the damage")
    last_item = None
    for f in result.differences:
        if f.item != last_item:
            lines.append("")
            lines.append(f.item)
            last_item = f.item
        delta = f" (diff {f.diff_ms:+.6f} ms)" if f.diff_ms is not None else ""
        if f.name == "present":
            lines.append(f"  only {'netdiag' if f.netdiag else 'tshark'} has it")
        else:
            lines.append(f"  {f.name}: netdiag {_fmt(f.netdiag)} vs tshark "
                         f"{_fmt(f.tshark)}{delta}")
        lines.append(f"    look at: netdiag packets {_packets(f.netdiag_packets)}; tshark "
                     f"frames {_packets(f.tshark_frames)}")
        if f.note:
            lines.append(f"    tshark side: {f.note}")
    if result.not_comparable:
        lines.append("")
        lines.append(f"not comparable ({len(result.not_comparable)}):")
        for s in result.not_comparable:
            lines.append(f"  {s['item']}: {s['reason']}")
    counts = result.counts()
    if counts:
        lines.append("")
        lines.append("by section: " + ", ".join(
            f"{sec} {row['compared'] - row['differ']}/{row['compared']} agree"
            for sec, row in counts.items()))
    lines.append(result.summary_line())
    return "\n".join(lines) + "\n"
