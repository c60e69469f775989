"""One pipeline from capture files to records: read, scan, analyze, summarize.

``analyze`` is the only entry point the CLI needs. Records are handed to a
:class:`Sink` as soon as they are complete (DNS transactions when answered or
expired, connections when closed or idle), so a streaming output holds nothing.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter

from netdiag.analysis.findings import Thresholds, build_findings
from netdiag.analysis.summary import NoSummary, SummaryBuilder
from netdiag.capture.linktypes import linktype_name
from netdiag.capture.reader import SECRETS_TLS_KEY_LOG, CaptureReader
from netdiag.capture.sources import open_capture
from netdiag.errors import InputError
from netdiag.flows.table import FlowTable, UdpSession
from netdiag.flows.tcp import TcpFlow
from netdiag.limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_DNS_OPEN,
    DEFAULT_MAX_HELD_BYTES,
    Limits,
)
from netdiag.protocols.base import StreamAnalyzer
from netdiag.protocols.dns import DnsAnalyzer
from netdiag.protocols.http1 import Http1Analyzer
from netdiag.protocols.http2 import Http2Analyzer
from netdiag.protocols.quic import QuicAnalyzer, QuicConnection, stray_warning
from netdiag.protocols.resp import RESP_PORTS, RespAnalyzer, looks_like_resp
from netdiag.protocols.tls import TlsAnalyzer, looks_like_tls
from netdiag.protocols.tls_decrypt import DecryptingTlsAnalyzer
from netdiag.protocols.tunnel import Tunnel, TunnelPicker
from netdiag.records import Connection, DnsTransaction, Warning_
from netdiag.result import CaptureFacts, Result, Sink, renders
from netdiag.shared_facts import FactSharer

__all__ = ["CaptureFacts", "Options", "Result", "Sink", "analyze", "export_pcapng",
           "record_limits"]
from netdiag.tls.keylog import KeyLog

DSB_TLS_KEY_LOG = SECRETS_TLS_KEY_LOG
"""pcapng decryption-secrets type of an NSS key log (the reader's constant)."""
HTTP1_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"PATCH ", b"OPTIONS ",
                 b"CONNECT ", b"TRACE ")
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Options:
    """What a report run may be told."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    """Finding thresholds."""
    dns_ports: frozenset[int] = frozenset({53})
    """Ports whose UDP and TCP traffic is parsed as DNS."""
    dns_heuristic: bool = True
    """Also parse UDP on other ports as DNS where it looks like DNS
    (``netdiag.flows.dns_shape``)."""
    progress: Callable[[int, int], None] | None = None
    """Called now and then with (bytes done, bytes total) over all files."""
    keylog: KeyLog | None = None
    """TLS secrets (NSS key log) from ``--keylog`` or ``SSLKEYLOGFILE``; pcapng
    decryption-secrets blocks are added to it as the capture is read."""
    jobs: int = 1
    """Processes to analyze in (``netdiag.shard``): each reads all the input and keeps
    the flows of its shard, and the records are merged into exactly what one process
    gives. 1: this process only; 0: as many as there are cores, 1 for small input."""
    shard: tuple[int, int] | None = None
    """Set by ``netdiag.shard`` for each of its runs: ``(k, n)``, keep shard k of n."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """TCP connections open at once before the least recently active are finished."""
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES
    """Payload bytes TCP reassembly may hold over all connections."""
    max_dns_open: int = DEFAULT_MAX_DNS_OPEN
    """DNS transactions awaiting an answer at once before the oldest are finished."""
    summarize: bool = True
    """Build the result's summary and findings; False where the caller counts the records
    itself (a fleet's set): the result's summary is then empty."""
    max_memory: int | None = None
    """Estimated bytes of records (``netdiag.record_cost``) a run in several processes
    may hold: its shards hold every record until they merge (unless a streaming sink's
    spill them, ``netdiag.shard``), and one whose share passes this has the input
    analyzed again in one process (``--max-memory``). None: no bound."""
    max_records: int | None = None
    """Records (connections and DNS transactions) a run in several processes may hold,
    the same way (``--max-records``: past it, a listing report keeps none). None: no
    bound."""

    def limits(self) -> Limits:
        """Fresh caps for one run (a shard's: its share of each, see ``netdiag.shard``)."""
        n = self.shard[1] if self.shard is not None else 1
        return Limits(max_connections=max(1, self.max_connections // n),
                      max_held_bytes=max(1, self.max_held_bytes // n),
                      max_dns_open=max(1, self.max_dns_open // n))


def _port(ep: str) -> int:
    return int(ep.rpartition(":")[2])


class _Run:
    """State of one ``analyze`` call."""

    def __init__(self, sink: Sink, options: Options, facts: CaptureFacts,
                 readers: list[CaptureReader]) -> None:
        self.sink = sink
        self.options = options
        self.facts = facts
        self.readers = readers
        self.keylog = options.keylog if options.keylog is not None else KeyLog()
        self._secrets_seen = 0
        self.client_randoms: set[bytes] = set()
        """ClientHello randoms of every TLS connection (for embedding their keys)."""
        self._tunnels: dict[int, Tunnel] = {}
        """The CONNECT tunnel of each connection that has one, by ``id`` of the connection."""
        self.shared = None if renders(sink) else FactSharer()
        """Equal facts of the connections emitted, kept once; None for a sink that
        streams (it keeps no record)."""
        self.summary = SummaryBuilder() if options.summarize else NoSummary()
        self.limits = options.limits()
        """Caps over all connections and the hits of every cap (analyzers' included)."""
        self.dns = DnsAnalyzer(self._on_dns, limits=self.limits)
        self.table = FlowTable(self._decide, self._on_connection, self.dns.on_udp,
                               options.dns_ports, shard=options.shard, limits=self.limits,
                               dns_heuristic=options.dns_heuristic)
        self.table.sweep_hooks.append(self.dns.expire)
        self.quic = QuicAnalyzer(self._new_quic, self._quic_keys)
        """Every QUIC connection (UDP datagrams the flow table routes to it)."""
        self.table.on_quic = self.quic.on_datagram
        self.table.on_session = self._on_session

    def stage(self, name: str) -> None:
        """The end of the input: ``finish`` (connections), ``secrets``, ``dns``, in order.

        A hook for the shard runs of ``netdiag.shard``, which order what they emit by it.
        """

    def _on_dns(self, t: DnsTransaction) -> None:
        self.summary.add_dns(t)
        self.sink.dns(t)

    def _decide(self, flow: TcpFlow, first: bytes) -> StreamAnalyzer | None:
        """The analyzer of a new connection, from its ports and the client's first bytes.

        The connection's protocol starts as the analyzer's (its kind while it can tell
        no more, e.g. ``tls`` before the ServerHello) and ``_on_connection`` refines it.
        """
        conn = flow.conn
        ports = self.options.dns_ports
        an: StreamAnalyzer | None = None
        if _port(conn.server) in ports or _port(conn.client) in ports:
            an = self.dns.tcp_stream(conn.client, conn.server)
        else:
            an = self._stream_analyzer(conn, first)
            if an is None and (_port(conn.server) in RESP_PORTS or looks_like_resp(first)):
                an = RespAnalyzer()
        if an is not None:
            conn.protocol = an.protocol or an.kind
        return an

    def _stream_analyzer(self, conn: Connection, first: bytes) -> StreamAnalyzer | None:
        """TLS (with keys when known), HTTP/2 with prior knowledge or HTTP/1.x, from the
        client's first bytes; None for anything else."""
        if looks_like_tls(first):
            self._sync_secrets()
            tls: TlsAnalyzer | DecryptingTlsAnalyzer
            if len(self.keylog):
                tls = DecryptingTlsAnalyzer(self.keylog, _app_for_tls)
            else:
                tls = TlsAnalyzer()
            conn.tls = tls.info
            return tls
        if first.startswith(H2_PREFACE[:14]):
            return Http2Analyzer(protocol="h2c")
        if first.startswith(HTTP1_METHODS):
            return Http1Analyzer(tunnel_picker=self._tunnel_picker(conn))
        return None

    def _tunnel_picker(self, conn: Connection) -> TunnelPicker:
        """How the bytes of a CONNECT tunnel on ``conn`` are read: as a connection of its
        own would be (TLS, with keys when known; HTTP/2 prior knowledge; HTTP/1.x)."""

        def pick(tunnel: Tunnel, first: bytes) -> StreamAnalyzer | None:
            self._tunnels[id(conn)] = tunnel
            return self._stream_analyzer(conn, first)

        return pick

    def _sync_secrets(self) -> None:
        """Add TLS key-log secrets from pcapng decryption-secrets blocks read so far."""
        blocks = [b for r in self.readers for b in r.secrets]
        if len(blocks) == self._secrets_seen:
            return
        for stype, data in blocks[self._secrets_seen:]:
            if stype != DSB_TLS_KEY_LOG:
                continue
            try:
                self.keylog.merge(KeyLog.parse(data, "decryption secrets block"))
            except InputError as e:
                self.facts.warn(Warning_("tls", f"unusable decryption secrets block: {e}"))
        self._secrets_seen = len(blocks)

    def _new_quic(self, qc: QuicConnection) -> str:
        return self.table.new_session(qc)

    def _quic_keys(self, client_random: bytes) -> dict[str, bytes]:
        """The key-log secrets of a QUIC connection (pcapng blocks read so far included)."""
        self._sync_secrets()
        if not len(self.keylog):
            return {}
        return self.keylog.secrets_for(client_random)

    def _on_session(self, session: UdpSession) -> None:
        """A QUIC connection finished: emitted as a TCP connection is."""
        conn = session.conn
        if isinstance(session, QuicConnection):
            if session.secrets:
                random = conn.tls.client_random if conn.tls is not None else None
                if random:
                    self.client_randoms.add(bytes(random))
            if session.limits_hit:
                self.limits.add(session.limits_hit)
            where = f"{conn.id} {conn.client} -> {conn.server}"
            for msg in session.warnings:
                self.facts.warn(Warning_("quic", f"{where}: {msg}"))
        self._emit(conn)

    def _emit(self, conn: Connection) -> None:
        """A finished connection (TCP or QUIC) to the summary and the sink."""
        if self.shared is not None:
            self.shared.connection(conn)
        self.summary.add_connection(conn)
        self.sink.connection(conn)

    def _on_connection(self, flow: TcpFlow) -> None:
        conn = flow.conn
        an = flow.analyzer
        if an is not None:
            conn.requests = an.requests
            random = an.client_random
            if random:
                self.client_randoms.add(random)
            protocol = an.protocol
            if protocol is not None:
                conn.protocol = protocol
            conn.http2 = an.http2
            tunnel = self._tunnels.pop(id(conn), None)
            if tunnel is not None:
                conn.tunnel = tunnel.to_json()
            hits = an.limits_hit
            if hits:
                self.limits.add(hits)
            warnings = an.warnings
            if warnings or flow.failure is not None:
                kind = an.kind
                where = f"{conn.id} {conn.client} -> {conn.server}"
                for msg in warnings:
                    self.facts.warn(Warning_(kind, f"{where}: {msg}"))
                if flow.failure is not None:
                    self.facts.warn(Warning_(kind, f"{where}: {kind} {flow.failure}; "
                                                   "please report this netdiag bug"))
        self._emit(conn)


def _app_for_tls(alpn: str | None, first: bytes) -> StreamAnalyzer | None:
    """The analyzer of a decrypted connection's data (HTTP/2, HTTP/1.x, RESP), from ALPN
    or its first bytes; None when it is none of those."""
    if alpn == "h2" or first.startswith(H2_PREFACE[:14]):
        return Http2Analyzer(protocol="h2")
    if first.startswith(HTTP1_METHODS):
        return Http1Analyzer(tls=True)
    if looks_like_resp(first):
        return RespAnalyzer()
    return None


def _merged(readers: list[CaptureReader]) -> Iterator[tuple[int, int, bytes, int]]:
    if len(readers) == 1:
        return readers[0].packets()
    return heapq.merge(*(r.packets() for r in readers), key=itemgetter(0))


def _open_all(paths: list[str]) -> list[CaptureReader]:
    """A reader of every path (a local file or a URL: ``netdiag.capture.sources``); the
    ones opened are closed again when one cannot be."""
    readers: list[CaptureReader] = []
    try:
        for p in paths:
            readers.append(open_capture(os.fspath(p)))
    except BaseException:
        for r in readers:
            r.close()
        raise
    return readers


def analyze(paths: list[str], sink: Sink, options: Options | None = None) -> Result:
    """Read every capture in ``paths`` (merged by time) and feed ``sink`` as records finish.

    With ``options.jobs`` other than 1, ``netdiag.shard`` runs the analysis in several
    processes; ``sink`` then receives every record, in the same order, after the input
    has been read.
    """
    options = options or Options()
    if options.jobs != 1 and options.shard is None:
        from netdiag.shard import analyze_sharded

        return analyze_sharded(paths, sink, options)
    return _analyze(paths, sink, options)[0]


def _analyze(paths: list[str], sink: Sink, options: Options,
             run_type: Callable[[Sink, Options, CaptureFacts, list[CaptureReader]], _Run] = _Run,
             ) -> tuple[Result, _Run]:
    """One process's analysis (of one shard when ``options.shard`` is set)."""
    facts = CaptureFacts(files=[os.fspath(p) for p in paths])
    readers = _open_all(paths)
    run = run_type(sink, options, facts, readers)
    try:
        total = sum((r.progress()[1] or 0) for r in readers)
        if options.progress is not None:
            prog = options.progress

            def _progress(_now: int) -> None:
                prog(sum(r.progress()[0] for r in readers), total)

            run.table.sweep_hooks.append(_progress)
        if len(readers) == 1:
            run.table.scan_reader(readers[0])  # in place: no object per packet
        else:
            run.table.scan(_merged(readers))
        run.stage("finish")
        run.table.finish_all()
        for server, n in sorted(run.quic.stray.items()):  # no connection left to carry them
            run.facts.warn(Warning_("quic", stray_warning(n, server)))
        run.stage("secrets")
        run._sync_secrets()
        run.stage("dns")
        run.dns.finish()
    finally:
        for r in readers:
            r.close()
    for r in readers:
        facts.packets += r.packets_read
        facts.bytes += r.bytes_read
        facts.truncated = facts.truncated or r.truncated
        for w in r.warnings:
            facts.warn(w)
        facts.secrets.extend(r.secrets)
        for lt in r.link_types:
            name = linktype_name(lt)
            if name not in facts.link_types:
                facts.link_types.append(name)
    facts.first_ns = run.table.first_ns
    facts.last_ns = run.table.last_ns
    facts.undecoded = run.table.undecoded
    facts.dns_ports_found = sorted({int.from_bytes(e[-2:], "big")
                                    for e in run.table.dns_servers} - options.dns_ports)
    for msg in run.dns.warnings:
        facts.warn(Warning_("dns", msg))
    run.limits.add(run.table.defrag.limits_hit)
    run.limits.add(run.quic.limits_hit)
    record_limits(facts, run.limits)
    findings = build_findings(run.summary, options.thresholds, facts.truncated)
    if options.progress is not None:
        options.progress(total, total)
    return Result(facts, run.summary, findings, options.thresholds, run.client_randoms,
                  run.keylog), run


def record_limits(facts: CaptureFacts, limits: Limits) -> None:
    """``capture.limits_hit`` from ``limits``, with one warning per cap reached."""
    facts.limits_hit = dict(sorted(limits.hit.items()))
    for name, times in facts.limits_hit.items():
        facts.warn(Warning_("limit", limits.warning_text(name, times)))


def export_pcapng(paths: list[str], out_path: str, result: Result) -> tuple[int, int]:
    """Write ``paths`` (merged by time) to one pcapng with the keys of their TLS connections.

    Only the secrets of connections seen in the capture are embedded, never the rest
    of the key log. Returns (packets written, connections whose keys were embedded).
    """
    from netdiag.capture.pcapng_writer import write_pcapng

    keylog = result.keylog
    lines: list[str] = []
    embedded = 0
    if keylog is not None:
        for random in sorted(result.client_randoms):
            secrets = keylog.secrets_for(random)
            if secrets:
                embedded += 1
                lines.extend(f"{label} {random.hex()} {secret.hex()}"
                             for label, secret in sorted(secrets.items()))
    key_text = ("\n".join(lines) + "\n").encode() if lines else None
    readers = _open_all(paths)
    try:
        with open(out_path, "wb") as out:
            n = write_pcapng(out, _merged(readers), key_text)
    except OSError as e:
        raise InputError(f"cannot write {out_path}: {e.strerror or e}") from e
    finally:
        for r in readers:
            r.close()
    return n, embedded
