"""Reference figures from tshark, for cross-checking netdiag (CONTRACT.md, TSHARK.md).

One tshark run per capture, ``-T json`` with ``-2``, ``-o tcp.reassemble_out_of_order:TRUE``,
the capture's key log when there is one (``-o tls.keylog_file:KEYS``; not needed for
the figures compared here, but harmless) and the extra options MANIFEST.tsv names.
The JSON is parsed keeping duplicate keys *in order* (``object_pairs_hook``), so a
packet that carries several DNS messages, TLS records or handshake messages yields
each of them, each next to the ``tcp.segments`` list that reassembled it.

tshark is run and its JSON read by the tshark engine's plumbing
(:mod:`netdiag.engines.tsjson`: :class:`TsharkRun`, :class:`Node`, field access), which
tshark_ref.py, http_ref.py and hops_ref.py share (:func:`tshark_layers`). The reference
figures are derived here, from tshark's fields, independently of both netdiag's
analyzers and the engine's figures (which ``netdiag verify`` compares): e.g. DNS
latency from ``dns.time`` and the handshake from ``tcp.analysis.initial_rtt``, which
the engine does not use.

What is extracted, per capture (:func:`reference`):

* :class:`DnsRef` - one per DNS transaction (first query, its retransmitted copies,
  its responses), on port 53 only (netdiag's default ``dns_ports``). ``latency_ms``
  is the reference latency, or ``None`` with ``why_not`` saying why it is not
  comparable (unanswered; query retransmitted, where tshark's ``dns.time`` counts from
  the last copy and the contract from the first).

  - UDP: tshark's ``dns.time`` of the *first* response (a duplicate response carries
    its own ``dns.time``, or none; the contract uses the first).
  - TCP: tshark reports a message at the packet that *completes* it, the contract times
    it by the packet carrying its *first* byte. The reference is therefore computed
    from frame times: (frame carrying the first byte of the response) - (frame
    carrying the first byte of the query), the "first byte" frame being the first
    entry of ``tcp.segments`` for a reassembled message, else the frame itself. When
    both messages fit in one segment this equals ``dns.time`` (checked: ``dns_time_ms``
    is kept alongside).

* :class:`TcpRef` - one per ``tcp.stream``: the client's first SYN, how many SYNs the
  client sent (and whether tshark flagged one as a retransmission), and
  ``tcp.analysis.initial_rtt``. tshark measures from the most recent SYN, the contract
  from the first, so a stream with a retransmitted SYN is not comparable.

* :class:`TlsRef` - one per ``tcp.stream`` that carries a ClientHello: SNI, offered
  ALPN (in order), negotiated version (ServerHello ``supported_versions`` if present,
  else the ServerHello's legacy version), resumption (TLS 1.3: the ServerHello carries
  extension 41 pre_shared_key; otherwise tshark's ``tls.resumed``), HelloRetryRequest
  (a ServerHello whose random is the HRR constant).

Run as a script to print the references: ``python tests/crosscheck/tshark_ref.py [FILE...]``.
"""

from __future__ import annotations

import functools
import ipaddress
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # netdiag, when not installed

from netdiag.engines.tshark import _qname as tshark_qname
from netdiag.engines.tshark import is_hrr, version_name
from netdiag.engines.tsjson import (
    Node,
    TsharkRun,
    dns_messages,
    find_all,
    find_first,
    has_key,
    nodes_with,
    require_tshark,
    to_int,
)
from netdiag.engines.tsjson import tshark_path as find_tshark

ROOT = Path(__file__).resolve().parents[2]
"""The project root (``/work/main``)."""
THIRDPARTY = ROOT.parent / "shared" / "captures" / "thirdparty"
"""Third-party captures, outside the project (README.md there); may be absent."""
PROJECT_CAPTURES = ROOT / "captures"
"""The project's own captures (``*.pcap``, ``*.pcapng``), key log beside as ``STEM.keys``."""

DNS_PORTS = frozenset({53})
"""Ports netdiag parses as DNS by default (``Options.dns_ports``)."""
JSON_PROTOCOLS = "frame ip ipv6 udp tcp tcp.segments dns tls icmp icmpv6"
"""What ``-J`` keeps of each packet (everything else is reported as ``filtered``)."""


# ----------------------------------------------------------------------------- captures


@dataclass(frozen=True)
class CaptureSpec:
    """One capture to cross-check and how tshark must read it."""

    name: str
    """File name (the test id)."""
    path: Path
    keylog: Path | None = None
    """TLS key log, if one exists."""
    extra_opts: tuple[str, ...] = ()
    """MANIFEST.tsv's ``tshark_extra_opts``."""
    origin: str = "thirdparty"
    """``thirdparty`` or ``project``."""


def tshark_path() -> str | None:
    """The tshark binary (the engine's choice), or None when it is not installed."""
    return find_tshark()


def _manifest(folder: Path) -> dict[str, dict[str, str]]:
    path = folder / "MANIFEST.tsv"
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        return {}
    header = lines[0].split("\t")
    rows = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        row = dict(zip(header, line.split("\t"), strict=False))
        rows[row.get("file", "")] = row
    return rows


def thirdparty_captures(folder: Path = THIRDPARTY) -> list[CaptureSpec]:
    """Every capture in the third-party folder (empty when the folder is absent)."""
    if not folder.is_dir():
        return []
    manifest = _manifest(folder)
    specs = []
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".pcap", ".pcapng", ".cap") or not path.is_file():
            continue
        row = manifest.get(path.name, {})
        keylog = None
        words = row.get("key_log_file", "-").split()
        if words and words[0] != "-" and (folder / words[0]).is_file():
            keylog = folder / words[0]
        extra = row.get("tshark_extra_opts", "-").strip()
        opts = () if extra in ("", "-") else tuple(shlex.split(extra))
        specs.append(CaptureSpec(path.name, path, keylog, opts, "thirdparty"))
    return specs


def project_captures(folder: Path = PROJECT_CAPTURES) -> list[CaptureSpec]:
    """Every ``*.pcap``/``*.pcapng`` the project ships under ``captures/``."""
    if not folder.is_dir():
        return []
    specs = []
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".pcap", ".pcapng") or not path.is_file():
            continue
        keylog = path.with_suffix(".keys")
        specs.append(CaptureSpec(path.name, path, keylog if keylog.is_file() else None, (),
                                 "project"))
    return specs


def all_captures() -> list[CaptureSpec]:
    """Third-party captures, then the project's own."""
    return thirdparty_captures() + project_captures()


# ----------------------------------------------------------------------------- tshark


def tshark_layers(capture: str | Path, keylog: str | Path | None, extra_opts: Sequence[str],
                  protocols: str) -> tuple[list[Node], int, str]:
    """One tshark run (``-n -2 -o tcp.reassemble_out_of_order:TRUE``, the key log, the
    extra options, ``-T json -J PROTOCOLS``) through the engine's
    :class:`~netdiag.engines.tsjson.TsharkRun`: the packets' ``layers`` objects (duplicate
    keys kept in order), exit status, stderr.

    tshark exits 2 on a capture that is cut short but still prints every complete
    packet: that is accepted; anything else non-zero raises.
    """
    prefs = {"tcp.reassemble_out_of_order": "TRUE"}
    if keylog is not None:
        prefs["tls.keylog_file"] = str(keylog)
    run = TsharkRun(require_tshark(), str(capture), prefs=prefs, extra_args=extra_opts,
                    protocols=protocols)
    layers = list(run)
    return layers, run.returncode or 0, run.stderr


def run_tshark(spec: CaptureSpec) -> tuple[list[Node], int, str]:
    """Run tshark on ``spec``; the packets' ``layers`` objects, exit status, stderr."""
    return tshark_layers(spec.path, spec.keylog, spec.extra_opts, JSON_PROTOCOLS)


# ----------------------------------------------------------------------------- records


def norm_ip(ip: str) -> str:
    """An address in its canonical text form (IPv6 compressed, lower case)."""
    try:
        return ipaddress.ip_address(ip.strip("[]")).compressed
    except ValueError:
        return ip


def endpoint(ip: str, port: int) -> str:
    """The contract's endpoint string: ``ip:port``, IPv6 in brackets."""
    ip = norm_ip(ip)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def norm_endpoint(ep: str) -> str:
    """Canonical form of a contract endpoint string (for matching)."""
    host, _, port = ep.rpartition(":")
    try:
        return endpoint(host, int(port))
    except ValueError:
        return ep


def norm_qname(name: str) -> str:
    """tshark's question name in netdiag's form: no trailing dot, root as ``.``, lower case."""
    return tshark_qname(name).lower()


def _ms(seconds: Decimal | None) -> Decimal | None:
    return None if seconds is None else seconds * 1000


@dataclass
class DnsRef:
    """One DNS transaction as tshark sees it."""

    client: str
    server: str
    transport: str
    id: int
    qname: str
    """Normalised (see :func:`norm_qname`)."""
    qtype: int
    query_frame: int
    """Frame completing the first query."""
    query_ts: Decimal
    """Time of the frame carrying the first byte of the first query."""
    query_first_frame: int
    query_copies: int = 1
    """Copies of the query; tshark flags the extra ones ``dns.retransmission``."""
    retransmitted: bool = False
    responses: int = 0
    response_frame: int | None = None
    """Frame completing the first response."""
    response_first_frame: int | None = None
    response_first_ts: Decimal | None = None
    dns_time_ms: Decimal | None = None
    """tshark's ``dns.time`` on the first response, in ms (None if absent)."""
    latency_ms: Decimal | None = None
    """The reference latency, or None when not comparable."""
    source: str = ""
    """Where ``latency_ms`` comes from."""
    why_not: str | None = None
    """Why ``latency_ms`` is None."""

    def describe(self) -> str:
        return (f"DNS {self.transport} {self.client} -> {self.server} id=0x{self.id:04x} "
                f"{self.qname} type {self.qtype} (tshark frames query={self.query_frame}"
                f" response={self.response_frame})")


@dataclass
class TcpRef:
    """One ``tcp.stream`` as tshark sees it."""

    stream: int
    client: str | None
    """The first SYN's sender (None when no SYN was captured)."""
    server: str | None
    first_ts: Decimal
    """Time of the stream's first packet."""
    first_frame: int
    syn_ts: Decimal | None = None
    syn_frame: int | None = None
    syns: int = 0
    """SYNs (without ACK) the client sent."""
    syn_flagged_retransmission: bool = False
    initial_rtt_ms: Decimal | None = None
    """``tcp.analysis.initial_rtt`` in ms."""

    @property
    def syn_retransmitted(self) -> bool:
        return self.syns > 1 or self.syn_flagged_retransmission

    def describe(self) -> str:
        return (f"TCP stream {self.stream} {self.client} -> {self.server} "
                f"(tshark SYN frame {self.syn_frame})")


@dataclass
class TlsRef:
    """The TLS handshake of one ``tcp.stream`` as tshark sees it."""

    stream: int
    client: str
    """The ClientHello's sender."""
    server: str
    first_ts: Decimal
    """Time of the stream's first packet."""
    client_hello_frame: int
    sni: str | None = None
    alpn_offered: list[str] = field(default_factory=list)
    server_hello_frame: int | None = None
    version: str | None = None
    resumed: bool | None = None
    hello_retry: bool = False

    def describe(self) -> str:
        return (f"TLS stream {self.stream} {self.client} -> {self.server} "
                f"(tshark ClientHello frame {self.client_hello_frame}, "
                f"ServerHello frame {self.server_hello_frame})")


@dataclass
class Reference:
    """Everything tshark says about one capture that the cross-check compares."""

    spec: CaptureSpec
    dns: list[DnsRef]
    tcp: list[TcpRef]
    tls: list[TlsRef]
    tshark_status: int
    frames: int
    orphan_responses: int = 0
    """DNS responses tshark could not tie to any query (e.g. the query is not captured)."""


@dataclass
class _Packet:
    frame: int
    ts: Decimal
    src: str | None
    dst: str | None
    transport: str | None
    sport: int | None
    dport: int | None
    stream: int | None
    layers: Node


def _packet(layers: Node) -> _Packet | None:
    frame_layer = layers.get("frame")
    if not isinstance(frame_layer, Node):
        return None
    number = to_int(frame_layer.get("frame.number"))
    epoch = frame_layer.get("frame.time_epoch")
    if number is None or epoch is None:
        return None
    src = dst = transport = None
    sport = dport = stream = None
    for key, value in layers:
        if src is None and key in ("ip", "ipv6") and isinstance(value, Node):
            src = value.get(f"{key}.src")
            dst = value.get(f"{key}.dst")
        if transport is None and key in ("udp", "tcp") and isinstance(value, Node):
            transport = key
            sport = to_int(value.get(f"{key}.srcport"))
            dport = to_int(value.get(f"{key}.dstport"))
            stream = to_int(value.get(f"{key}.stream"))
    return _Packet(number, Decimal(epoch), src, dst, transport, sport, dport, stream, layers)


def _dns_refs(packets: list[_Packet]) -> tuple[list[DnsRef], int]:
    times = {p.frame: p.ts for p in packets}
    refs: list[DnsRef] = []
    latest: dict[tuple, DnsRef] = {}
    by_query_frame: dict[int, DnsRef] = {}
    first_responses: dict[int, tuple[_Packet, Node, list[int]]] = {}
    orphans = 0
    for pkt in packets:
        if (pkt.src is None or pkt.transport is None or pkt.sport is None
                or pkt.dport is None or pkt.layers.get("icmp") is not None
                or pkt.layers.get("icmpv6") is not None):
            continue
        if pkt.sport not in DNS_PORTS and pkt.dport not in DNS_PORTS:
            continue
        for msg, segments in dns_messages(pkt.layers):
            msg_id = to_int(msg.get("dns.id"))
            flags = find_first(msg, "dns.flags.response")
            names = find_all(msg, "dns.qry.name")
            types = find_all(msg, "dns.qry.type")
            if msg_id is None or flags is None or not names:
                continue
            qname = norm_qname(names[0])
            qtype = to_int(types[0]) if types else 0
            first_frame = segments[0] if segments else pkt.frame
            src = endpoint(pkt.src, pkt.sport)
            dst = endpoint(pkt.dst or "", pkt.dport)
            if flags == "0":
                key = (src, dst, pkt.transport, msg_id, qname, qtype)
                retrans = find_first(msg, "dns.retransmission") is not None
                prior = latest.get(key)
                if retrans and prior is not None:
                    prior.query_copies += 1
                    prior.retransmitted = True
                    by_query_frame[pkt.frame] = prior
                    continue
                ref = DnsRef(src, dst, pkt.transport, msg_id, qname, qtype or 0, pkt.frame,
                             times.get(first_frame, pkt.ts), first_frame)
                refs.append(ref)
                latest[key] = ref
                by_query_frame[pkt.frame] = ref
            else:
                key = (dst, src, pkt.transport, msg_id, qname, qtype)
                response_to = to_int(find_first(msg, "dns.response_to"))
                ref = by_query_frame.get(response_to) if response_to is not None else None
                if ref is None:
                    ref = latest.get(key)
                if ref is None or ref.query_ts > pkt.ts:
                    orphans += 1
                    continue
                ref.responses += 1
                if ref.response_frame is None:
                    ref.response_frame = pkt.frame
                    ref.response_first_frame = first_frame
                    ref.response_first_ts = times.get(first_frame, pkt.ts)
                    dns_time = find_first(msg, "dns.time")
                    ref.dns_time_ms = _ms(Decimal(dns_time)) if dns_time else None
                    first_responses[id(ref)] = (pkt, msg, segments)
    for ref in refs:
        if ref.response_frame is None:
            ref.why_not = "unanswered"
        elif ref.retransmitted:
            ref.why_not = (f"query retransmitted ({ref.query_copies} copies): tshark's "
                           "dns.time counts from the last copy, the contract from the first")
        elif ref.transport == "udp":
            if ref.dns_time_ms is None:
                ref.why_not = "tshark gives no dns.time on the first response"
            else:
                ref.latency_ms = ref.dns_time_ms
                ref.source = "dns.time"
        else:
            assert ref.response_first_ts is not None
            ref.latency_ms = _ms(ref.response_first_ts - ref.query_ts)
            single = (ref.query_first_frame == ref.query_frame
                      and ref.response_first_frame == ref.response_frame)
            ref.source = ("frame times (= dns.time, both messages in one segment)" if single
                          else f"frame times of first segments (query frame "
                               f"{ref.query_first_frame}, response frame "
                               f"{ref.response_first_frame}; dns.time={ref.dns_time_ms} ms)")
    return refs, orphans


def _tcp_refs(packets: list[_Packet]) -> list[TcpRef]:
    streams: dict[int, TcpRef] = {}
    for pkt in packets:
        if pkt.transport != "tcp" or pkt.stream is None or pkt.src is None:
            continue
        tcp = pkt.layers.get("tcp")
        ref = streams.get(pkt.stream)
        if ref is None:
            ref = streams[pkt.stream] = TcpRef(pkt.stream, None, None, pkt.ts, pkt.frame)
        syn = find_first(tcp, "tcp.flags.syn") == "1"
        ack = find_first(tcp, "tcp.flags.ack") == "1"
        src = endpoint(pkt.src, pkt.sport or 0)
        dst = endpoint(pkt.dst or "", pkt.dport or 0)
        if syn and not ack:
            if ref.client is None:
                ref.client, ref.server = src, dst
                ref.syn_ts, ref.syn_frame = pkt.ts, pkt.frame
            if src == ref.client:
                ref.syns += 1
                if find_first(tcp, "tcp.analysis.retransmission") is not None or \
                        find_first(tcp, "tcp.analysis.spurious_retransmission") is not None:
                    ref.syn_flagged_retransmission = True
        rtt = find_first(tcp, "tcp.analysis.initial_rtt")
        if rtt is not None and ref.initial_rtt_ms is None:
            ref.initial_rtt_ms = _ms(Decimal(rtt))
    return sorted(streams.values(), key=lambda r: r.stream)


def _tls_refs(packets: list[_Packet], tcp: list[TcpRef]) -> list[TlsRef]:
    first_ts = {r.stream: r.first_ts for r in tcp}
    refs: dict[int, TlsRef] = {}
    resumed12: set[int] = set()
    server_hellos: dict[int, list[tuple[int, Node]]] = {}
    for pkt in packets:
        if pkt.transport != "tcp" or pkt.stream is None or pkt.src is None:
            continue
        for key, tls in pkt.layers:
            if key != "tls":
                continue
            if has_key(tls, "tls.resumed"):
                resumed12.add(pkt.stream)
            for hs in nodes_with(tls, "tls.handshake.type"):
                hs_type = hs.get("tls.handshake.type")
                if hs_type == "1" and pkt.stream not in refs:
                    refs[pkt.stream] = TlsRef(
                        pkt.stream, endpoint(pkt.src, pkt.sport or 0),
                        endpoint(pkt.dst or "", pkt.dport or 0),
                        first_ts.get(pkt.stream, pkt.ts), pkt.frame,
                        sni=find_first(hs, "tls.handshake.extensions_server_name"),
                        alpn_offered=find_all(hs, "tls.handshake.extensions_alpn_str"))
                elif hs_type == "2":
                    server_hellos.setdefault(pkt.stream, []).append((pkt.frame, hs))
    for stream, ref in refs.items():
        hellos = server_hellos.get(stream, [])
        hrr = [(f, hs) for f, hs in hellos if is_hrr(hs)]
        real = [(f, hs) for f, hs in hellos if (f, hs) not in hrr]
        ref.hello_retry = bool(hrr)
        chosen = real[0] if real else (hrr[0] if hrr else None)
        if chosen is None:
            continue
        frame, hs = chosen
        ref.server_hello_frame = frame
        ref.version = version_name(to_int(
            find_first(hs, "tls.handshake.extensions.supported_version")
            or hs.get("tls.handshake.version")))
        if ref.version == "TLS 1.3":
            ref.resumed = "41" in find_all(hs, "tls.handshake.extension.type")
        else:
            ref.resumed = stream in resumed12
    return sorted(refs.values(), key=lambda r: r.stream)


@functools.cache
def reference(spec: CaptureSpec) -> Reference:
    """tshark's reference figures for one capture (cached per spec)."""
    layers, status, _ = run_tshark(spec)
    packets = [p for p in (_packet(lay) for lay in layers) if p is not None]
    dns, orphans = _dns_refs(packets)
    tcp = _tcp_refs(packets)
    tls = _tls_refs(packets, tcp)
    return Reference(spec, dns, tcp, tls, status, len(packets), orphans)


def _print(ref: Reference) -> None:
    print(f"== {ref.spec.name} ({ref.frames} frames, tshark exit {ref.tshark_status}, "
          f"key log {ref.spec.keylog.name if ref.spec.keylog else '-'})")
    for d in ref.dns:
        lat = f"{d.latency_ms} ms [{d.source}]" if d.latency_ms is not None else d.why_not
        print(f"  {d.describe()} responses={d.responses}: {lat}")
    if ref.orphan_responses:
        print(f"  ({ref.orphan_responses} DNS responses without a captured query)")
    for t in ref.tcp:
        print(f"  {t.describe()} syns={t.syns} flagged={t.syn_flagged_retransmission} "
              f"initial_rtt={t.initial_rtt_ms} ms")
    for s in ref.tls:
        print(f"  {s.describe()} version={s.version} sni={s.sni} alpn={s.alpn_offered} "
              f"resumed={s.resumed} hrr={s.hello_retry}")


def main(argv: list[str]) -> int:
    if tshark_path() is None:
        print("tshark is not installed", file=sys.stderr)
        return 1
    specs = all_captures()
    if argv:
        wanted = set(argv)
        specs = [s for s in specs if s.name in wanted or str(s.path) in wanted]
        known = {s.name for s in specs} | {str(s.path) for s in specs}
        specs += [CaptureSpec(Path(a).name, Path(a), None, (), "argv")
                  for a in argv if a not in known]
    for spec in specs:
        _print(reference(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
