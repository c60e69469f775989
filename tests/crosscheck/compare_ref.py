"""Compare netdiag's contract JSON with tshark's reference figures (see tshark_ref.py).

Matching (CONTRACT.md keys; endpoints compared in canonical form):

* DNS: (client endpoint, server endpoint, transport, DNS id, question name - case
  folded), the candidate whose ``ts`` is nearest the first query's time; the question
  type only breaks ties. Compared: ``latency_ms`` within 0.01 ms, where tshark's
  reference exists (answered, query not retransmitted per tshark) and netdiag counts no
  retransmission. Every transaction tshark sees must be present in netdiag; extra
  netdiag transactions are ignored.
* TCP: (client endpoint, server endpoint) of the client's first SYN, the connection
  whose ``ts`` is nearest the stream's first packet. Compared: ``handshake_rtt_ms`` vs
  ``tcp.analysis.initial_rtt`` within 0.01 ms, unless the client's SYN was sent more
  than once (tshark measures from the last SYN, the contract from the first: detected
  from tshark's SYN count/flags or netdiag's ``syn_retransmissions``).
* TLS: the connection matched the same way, the client being the ClientHello's sender.
  Compared: ``tls.version``, ``sni``, ``alpn_offered`` (order matters; no ALPN
  extension = ``[]``, netdiag's ``null`` accepted as the same), ``resumed``,
  ``hello_retry``. Version and resumption only where tshark saw a ServerHello.

Each tshark item gives one :class:`Item` (agreed or not, with precise reasons) or one
:class:`Skip` (not comparable, with the reason).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tshark_ref import (
    ROOT,
    CaptureSpec,
    Reference,
    norm_endpoint,
    norm_qname,
    reference,
)

TOLERANCE_MS = 0.01
KINDS = ("dns", "tcp", "tls")
LABELS = {"dns": "DNS", "tcp": "TCP", "tls": "TLS"}


@dataclass
class Item:
    """One tshark item compared with netdiag."""

    kind: str
    desc: str
    problems: list[str] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)
    """What was compared, e.g. ``latency_ms 0.214 (tshark 0.214000000 [dns.time])``."""

    @property
    def agreed(self) -> bool:
        return not self.problems


@dataclass
class Skip:
    """One tshark item that could not be compared, and why."""

    kind: str
    desc: str
    reason: str


class Tally:
    """Counts over a capture's ``items`` and ``skips`` (of :class:`Outcome` and
    http_ref.py's ``HttpOutcome``)."""

    spec: CaptureSpec
    items: list[Item]
    skips: list[Skip]

    def compared(self, kind: str) -> int:
        return sum(1 for i in self.items if i.kind == kind)

    def agreed(self, kind: str) -> int:
        return sum(1 for i in self.items if i.kind == kind and i.agreed)

    def skipped(self, kind: str) -> int:
        return sum(1 for s in self.skips if s.kind == kind)

    def failures(self, kind: str | None = None) -> list[str]:
        """One line per item that disagreed (of ``kind``, or of every kind)."""
        return [f"{self.spec.name}: {i.desc}: " + "; ".join(i.problems)
                for i in self.items if (kind is None or i.kind == kind) and not i.agreed]


@dataclass
class Outcome(Tally):
    """Every comparison made for one capture."""

    spec: CaptureSpec
    ref: Reference
    doc: dict[str, Any]
    items: list[Item] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)

    def reference_items(self, kind: str) -> int:
        """How many items tshark has of this kind (compared or not)."""
        return {"dns": len(self.ref.dns), "tcp": len(self.ref.tcp),
                "tls": len(self.ref.tls)}[kind]

    def comparable_per_tshark(self, kind: str) -> int:
        """Items for which tshark gives a reference value."""
        if kind == "dns":
            return sum(1 for d in self.ref.dns if d.latency_ms is not None)
        if kind == "tcp":
            return sum(1 for t in self.ref.tcp
                       if t.initial_rtt_ms is not None and not t.syn_retransmitted)
        return len(self.ref.tls)


# ----------------------------------------------------------------------------- netdiag


def _import_netdiag() -> None:
    try:
        import netdiag  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))


@functools.cache
def netdiag_document(spec: CaptureSpec) -> dict[str, Any]:
    """netdiag's contract document for one capture, computed in-process (cached)."""
    _import_netdiag()
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    sink = CollectingSink()
    result = analyze([str(spec.path)], sink, Options())
    return sink.document(result)


# ----------------------------------------------------------------------------- matching


def _nearest(candidates: list[dict[str, Any]], ts: Decimal,
             prefer: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
    if not candidates:
        return None

    def key(rec: dict[str, Any]) -> tuple[int, float]:
        preferred = 0 if prefer is None or prefer(rec) else 1
        rts = rec.get("ts")
        dist = abs(float(ts) - rts) if isinstance(rts, int | float) else float("inf")
        return preferred, dist

    return min(candidates, key=key)


def _fmt(value: Any) -> str:
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return repr(value)


def _close(netdiag_ms: Any, tshark_ms: Decimal) -> bool:
    return (isinstance(netdiag_ms, int | float) and not isinstance(netdiag_ms, bool)
            and abs(Decimal(repr(netdiag_ms)) - tshark_ms) <= Decimal(str(TOLERANCE_MS)))


def _qtype_text(qtype: int) -> str:
    try:
        import dns.rdatatype

        return dns.rdatatype.to_text(qtype)
    except Exception:
        return f"TYPE{qtype}"


class _Pool:
    """netdiag records by a key, each usable once."""

    def __init__(self, records: Sequence[dict[str, Any]],
                 key: Callable[[dict[str, Any]], tuple]) -> None:
        self.key = key
        self.by_key: dict[tuple, list[dict[str, Any]]] = {}
        for rec in records:
            self.by_key.setdefault(key(rec), []).append(rec)

    def take(self, key: tuple, ts: Decimal,
             prefer: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
        cands = self.by_key.get(key, [])
        rec = _nearest(cands, ts, prefer)
        if rec is not None:
            cands.remove(rec)
        return rec


def _conn_key(rec: dict[str, Any]) -> tuple[str, str]:
    return norm_endpoint(str(rec.get("client"))), norm_endpoint(str(rec.get("server")))


def _missing_conn(conns: Sequence[dict[str, Any]], client: str, server: str) -> str:
    reversed_ = [c["id"] for c in conns if _conn_key(c) == (server, client)]
    hint = (f" (netdiag has {', '.join(reversed_)} with client and server swapped)"
            if reversed_ else "")
    return f"netdiag has no connection {client} -> {server}{hint}"


# ----------------------------------------------------------------------------- per kind


def _compare_dns(out: Outcome) -> None:
    records = out.doc.get("dns") or []
    pool = _Pool(records, lambda r: (
        norm_endpoint(str(r.get("client"))), norm_endpoint(str(r.get("server"))),
        str(r.get("transport")), r.get("id"), norm_qname(str(r.get("qname") or ""))))
    for ref in out.ref.dns:
        key = (ref.client, ref.server, ref.transport, ref.id, ref.qname)
        qtype = _qtype_text(ref.qtype)
        rec = pool.take(key, ref.query_ts, lambda r, q=qtype: r.get("qtype") == q)
        desc = ref.describe()
        if rec is None:
            same_id = [r for r in records if r.get("id") == ref.id
                       and norm_endpoint(str(r.get("client"))) == ref.client]
            hint = (f" (netdiag has id 0x{ref.id:04x} from that client as "
                    + ", ".join(f"{r.get('transport')} {r.get('server')} {r.get('qname')!r}"
                                for r in same_id) + ")") if same_id else ""
            out.items.append(Item("dns", desc, [f"missing in netdiag{hint}"]))
            continue
        if ref.latency_ms is None:
            out.skips.append(Skip("dns", desc, ref.why_not or "no reference"))
            continue
        retrans = rec.get("retransmissions")
        if isinstance(retrans, int) and retrans > 0:
            out.skips.append(Skip("dns", desc, f"netdiag counts retransmissions={retrans} "
                                               f"(tshark flags none)"))
            continue
        item = Item("dns", desc)
        got = rec.get("latency_ms")
        item.compared.append(f"latency_ms netdiag {_fmt(got)} vs tshark "
                             f"{_fmt(ref.latency_ms)} [{ref.source}]")
        if not _close(got, ref.latency_ms):
            diff = ("" if not isinstance(got, int | float)
                    else f", diff {float(Decimal(repr(got)) - ref.latency_ms):+.6f} ms")
            item.problems.append(f"latency_ms: netdiag {_fmt(got)} vs tshark "
                                 f"{_fmt(ref.latency_ms)} [{ref.source}]{diff}")
        out.items.append(item)


def _compare_tcp(out: Outcome, pool: _Pool) -> None:
    conns = out.doc.get("connections") or []
    for ref in out.ref.tcp:
        desc = ref.describe()
        if ref.client is None or ref.server is None:
            out.skips.append(Skip("tcp", desc, "no SYN captured"))
            continue
        rec = pool.take((ref.client, ref.server), ref.first_ts)
        if rec is None:
            out.items.append(Item("tcp", desc, [_missing_conn(conns, ref.client, ref.server)]))
            continue
        desc = f"{desc} = netdiag {rec.get('id')}"
        nd_syn = rec.get("syn_retransmissions")
        if ref.syn_retransmitted:
            out.skips.append(Skip("tcp", desc, f"client SYN sent {ref.syns} times (tshark "
                                               f"measures from the last, the contract from "
                                               f"the first); netdiag syn_retransmissions="
                                               f"{nd_syn}"))
            continue
        if isinstance(nd_syn, int) and nd_syn > 0:
            out.skips.append(Skip("tcp", desc, f"netdiag counts syn_retransmissions={nd_syn} "
                                               f"but tshark saw one SYN"))
            continue
        if ref.initial_rtt_ms is None:
            out.skips.append(Skip("tcp", desc, "tshark has no tcp.analysis.initial_rtt "
                                               "(handshake not completed)"))
            continue
        item = Item("tcp", desc)
        got = rec.get("handshake_rtt_ms")
        item.compared.append(f"handshake_rtt_ms netdiag {_fmt(got)} vs tshark initial_rtt "
                             f"{_fmt(ref.initial_rtt_ms)}")
        if not _close(got, ref.initial_rtt_ms):
            item.problems.append(f"handshake_rtt_ms: netdiag {_fmt(got)} vs tshark "
                                 f"tcp.analysis.initial_rtt {_fmt(ref.initial_rtt_ms)} ms")
        out.items.append(item)


def _compare_tls(out: Outcome) -> None:
    conns = out.doc.get("connections") or []
    pool = _Pool(conns, _conn_key)
    for ref in out.ref.tls:
        desc = ref.describe()
        rec = pool.take((ref.client, ref.server), ref.first_ts)
        if rec is None:
            out.items.append(Item("tls", desc, [_missing_conn(conns, ref.client, ref.server)]))
            continue
        desc = f"{desc} = netdiag {rec.get('id')}"
        tls = rec.get("tls")
        if not isinstance(tls, dict):
            out.items.append(Item("tls", desc, [f"netdiag has no tls object (tls={tls!r}, "
                                                f"protocol={rec.get('protocol')!r})"]))
            continue
        expected: dict[str, Any] = {"sni": ref.sni, "alpn_offered": ref.alpn_offered,
                                    "hello_retry": ref.hello_retry}
        if ref.server_hello_frame is not None:
            expected["version"] = ref.version
            expected["resumed"] = ref.resumed
        item = Item("tls", desc)
        for name, want in expected.items():
            got = tls.get(name)
            same = got == want or (name == "alpn_offered" and not got and not want)
            item.compared.append(f"{name} {got!r}")
            if not same:
                item.problems.append(f"tls.{name}: netdiag {got!r} vs tshark {want!r}")
        out.items.append(item)


@functools.cache
def compare_capture(spec: CaptureSpec) -> Outcome:
    """Run tshark and netdiag on one capture and compare them (cached)."""
    ref = reference(spec)
    doc = netdiag_document(spec)
    out = Outcome(spec, ref, doc)
    _compare_dns(out)
    _compare_tcp(out, _Pool(doc.get("connections") or [], _conn_key))
    _compare_tls(out)
    return out
