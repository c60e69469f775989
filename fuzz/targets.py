"""One fuzz target per parser: ``TARGETS[name](data: bytes)``.

Each target drives the public entry points the pipeline itself uses, and returns
normally for every input netdiag handles as documented: an analyzer must never raise
(bad bytes are warnings), the capture reader, key log and profile loaders may raise
only :class:`netdiag.errors.InputError` (the CLI's exit 1). Anything else that
escapes a target is a crash: a bug, which the CLI would turn into exit 4 or (for an
analyzer, whose exception the flow layer catches) into a "please report this netdiag
bug" warning and a connection left half analysed.

The TLS targets get their analyzer from ``netdiag.pipeline`` (``_Run._decide``, the
choice a real connection gets), not from a class name, so they follow the TLS
layer's refactoring. Plain functions: no atheris is needed to call them (the
regression test replays ``fuzz/regressions/`` through them).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import tempfile
from collections.abc import Callable
from functools import cache
from typing import Any

from fuzz.harness import (
    BASE_NS,
    decode_packets,
    decode_stream,
    drive_stream,
    load_keys,
    new_flow,
    new_run,
    raise_guarded,
    strict_json,
    temp_dir,
)
from netdiag.errors import InputError

TLS_PROBE = b"\x16\x03\x01\x00\xc0\x01"
"""The first bytes of a ClientHello: what makes the pipeline pick its TLS analyzer."""
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RESP_PROBE = b"*1\r\n$4\r\nPING\r\n"
MAX_PACKETS = 200_000
"""Packets read from one capture input at most (a fuzz input is far smaller)."""


@cache
def _keys() -> Any:
    return load_keys()


@cache
def _scratch(name: str) -> str:
    """A per-process scratch file for targets that must hand a path to netdiag."""
    fd, path = tempfile.mkstemp(prefix=f"netdiag-fuzz-{name}-", dir=temp_dir())
    os.close(fd)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _write(name: str, data: bytes) -> str:
    path = _scratch(name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _stream_target(run: Any, server_port: int, probe: bytes, kind: str,
                   data: bytes) -> None:
    flow = new_flow(run, server_port)
    an = run._decide(flow, probe)
    if an is None or an.kind != kind:
        raise AssertionError(f"the pipeline picked {an!r} for {probe!r}")
    drive_stream(run, flow, an, data)


# -- targets ---------------------------------------------------------------------------------

def capture(data: bytes) -> None:
    """The capture reader (pcap, pcapng, gzip) on a file of these bytes, then the pcapng
    writer (``--write-pcapng``) on what it read."""
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    path = _write("capture", data)
    try:
        reader = CaptureReader(path)
    except InputError:
        return
    packets = []
    with reader:
        try:
            for p in reader.packets():
                packets.append(p)
                if len(packets) >= MAX_PACKETS:
                    break
        except InputError:
            return
        reader.progress()
    for w in reader.warnings:
        w.to_json()
    key_text = b"".join(body for _t, body in reader.secrets) or None
    write_pcapng(io.BytesIO(), packets, key_text, warn=None)


def tcp(data: bytes) -> None:
    """Link/IP/TCP/UDP decode, IP defragmentation, TCP reassembly and the whole pipeline
    behind them (``FlowTable.scan`` of packet-framed frames, with the tests' keys)."""
    run = new_run(_keys())
    run.table.scan(decode_packets(data))
    run.table.finish_all()
    run._sync_secrets()
    run.dns.finish()
    raise_guarded(run)
    strict_json(run.summary.build())


def dns(data: bytes) -> None:
    """DNS over UDP (``DnsAnalyzer.on_udp``; ``op`` bit 3) and over TCP (the stream the
    pipeline gives a port-53 connection), expiry included."""
    run = new_run()
    flow = new_flow(run, 53)
    an = run._decide(flow, b"")
    if an is None or an.kind != "dns":
        raise AssertionError(f"the pipeline picked {an!r} for port 53")
    client, server = "10.0.0.1:40001", "10.0.0.2:53"
    last = [BASE_NS]

    def on_udp(d: int, ts: int, payload: bytes, packet: int) -> None:
        src, dst = (server, client) if d else (client, server)
        run.dns.on_udp(ts, src, dst, payload, packet)
        if ts - last[0] > 1_000_000_000:
            run.dns.expire(ts)
            last[0] = ts

    drive_stream(run, flow, an, data, on_udp)
    run.dns.finish()
    for w in run.dns.warnings:
        str(w)


def tls(data: bytes) -> None:
    """TLS without keys: handshake parsing, record walk, request inference."""
    _stream_target(new_run(), 443, TLS_PROBE, "tls", data)


def tls_keys(data: bytes) -> None:
    """TLS with the tests' key logs: decryption, the hidden handshake, HTTP behind it."""
    _stream_target(new_run(_keys()), 443, TLS_PROBE, "tls", data)


def http1(data: bytes) -> None:
    """HTTP/1.x in the clear (and an h2c upgrade from it)."""
    _stream_target(new_run(), 80, b"GET ", "http", data)


def http2(data: bytes) -> None:
    """HTTP/2 (h2c with its preface) with HPACK."""
    _stream_target(new_run(), 8080, H2_PREFACE, "http", data)


def resp(data: bytes) -> None:
    """Redis RESP2/RESP3."""
    _stream_target(new_run(), 6379, RESP_PROBE, "resp", data)


SSE_REQUEST = b"GET /v1/stream HTTP/1.1\r\nHost: sse.test\r\n\r\n"
SSE_RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"connection: close\r\n\r\n")


def sse(data: bytes) -> None:
    """Server-sent events: ``SseCounter`` on the server's chunks, and the same chunks as
    the body of an HTTP/1.1 ``text/event-stream`` response. The count may not depend
    on where the body is cut: the chunks fed one by one, the whole body at once and the
    HTTP/1.1 response must all count the same events."""
    from netdiag.protocols.sse import SseCounter, is_event_stream

    counter = SseCounter()
    run = new_run()
    flow = new_flow(run, 80)
    an = run._decide(flow, b"GET ")
    flow.analyzer = an
    an.feed(0, BASE_NS, SSE_REQUEST, 1)
    an.feed(1, BASE_NS + 1000, SSE_RESPONSE, 2)
    ts = BASE_NS
    body: list[bytes] = []
    gaps = False
    for packet, (kind, d, ts, payload) in enumerate(decode_stream(data), 3):
        if kind == "gap":
            an.gap(1, ts, payload)
            gaps = True
            continue
        if d:
            is_event_stream(payload[:200].decode("latin-1"))
        counter.feed(ts, payload)
        body.append(payload)
        an.feed(1, ts, payload, packet)
    counter.gaps()
    an.close(ts)
    run._on_connection(flow)
    whole = SseCounter()
    whole.feed(ts, b"".join(body))
    if sum(map(len, body)) < SseCounter.MAX_TAIL and whole.events != counter.events:
        raise AssertionError(f"SseCounter: {counter.events} events fed in pieces, "
                             f"{whole.events} fed whole")
    reqs = an.requests
    if not gaps and len(reqs) == 1 and (reqs[0].sse_events or 0) != counter.events:
        raise AssertionError(f"HTTP/1.1 counted {reqs[0].sse_events} events, "
                             f"SseCounter {counter.events}")


def keylog(data: bytes) -> None:
    """``KeyLog.parse`` (bytes and text) and ``KeyLog.from_file`` with small limits; what
    parses must give itself back through ``to_bytes``."""
    from netdiag.tls.keylog import KeyLog

    try:
        log = KeyLog.parse(data, "fuzz")
    except InputError:
        log = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        try:
            again = KeyLog.parse(text, "fuzz")
        except InputError:
            again = None
        if (log is None) != (again is None):
            raise AssertionError("KeyLog.parse of bytes and of their text disagree")
    path = _write("keylog", data)
    with contextlib.suppress(InputError):
        KeyLog.from_file(path, max_bytes=1 << 16, max_line=1 << 10)
    if log is None:
        return
    repr(log)
    out = log.to_bytes()
    back = KeyLog.parse(out, "round trip")
    if back.to_bytes() != out or len(back) != len(log):
        raise AssertionError("KeyLog.to_bytes does not read back as the same secrets")
    for r in log.client_randoms():
        log.secrets_for(r)
        if r not in log:
            raise AssertionError("a client random of the log is not in it")
    merged = KeyLog()
    merged.merge(log)
    merged.merge(back)


@cache
def _antho_records() -> tuple[list[Any], list[Any]]:
    """The connections and DNS transactions of the shipped capture (with its keys)."""
    from fuzz.harness import CAPTURES
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    sink = CollectingSink()
    keys = _keys()
    analyze([str(CAPTURES / "antho.pcapng")], sink, Options(keylog=keys))
    return sink.connections, sink.dns_records


def profile(data: bytes) -> None:
    """The path profile loader (``load_profile``: UTF-8, TOML, validation), then the
    profile applied to the shipped capture's connections (matching, attribution, chains,
    budgets)."""
    from netdiag.paths.apply import analyze_paths
    from netdiag.paths.profile import load_profile

    path = _write("profile", data)
    try:
        prof = load_profile(path)
    except InputError:
        return
    connections, dns_records = _antho_records()
    for c in connections[:8]:
        prof.match(c)
    for ip in ("127.0.0.10", "::1", "10.0.0.1"):
        prof.match_address(ip, 443, 1)
    analyze_paths(connections, dns_records, prof, resamples=20)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in a JSON output")


@cache
def _antho_profile() -> Any:
    from fuzz.harness import CAPTURES
    from netdiag.paths.profile import load_profile

    return load_profile(str(CAPTURES / "antho.paths.toml"))


def report(data: bytes) -> None:
    """The report formats on what the pipeline makes of fuzzed packets: the packet
    framing of ``tcp`` written as a pcapng (``--write-pcapng``'s writer), analysed by
    ``pipeline.analyze`` with the tests' keys and the shipped profile, and rendered as
    ``text``, ``json``, ``jsonl``, ``har``, ``html`` and ``csv`` as ``netdiag report`` does
    (JSON outputs must be strict JSON)."""
    import json
    import shutil

    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink, JsonlSink

    path = _scratch("report")
    with open(path, "wb") as f:
        write_pcapng(f, decode_packets(data), None, warn=None)
    options = Options(keylog=_keys())
    sink = CollectingSink()
    result = analyze([path], sink, options)
    prof = _antho_profile()
    out = io.StringIO()
    jsink = JsonlSink(out)
    jresult = analyze([path], jsink, Options(keylog=_keys()))
    jsink.end(jresult)
    for line in out.getvalue().splitlines():
        json.loads(line, parse_constant=_no_constant)
    csv_dir = path + ".csv"
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _formats(result, sink, options, prof, csv_dir)
    finally:
        shutil.rmtree(csv_dir, ignore_errors=True)


def _formats(result: Any, sink: Any, options: Any, prof: Any, csv_dir: str) -> None:
    import json

    from netdiag.commands import report as report_cmd

    report_cmd._write_text(result, sink.connections, sink.dns_records, options, io.StringIO(),
                           prof)
    for fmt in ("json", "har", "html", "csv"):
        out = io.StringIO()
        doc = sink.document(result, headers=fmt in ("har", "html"))
        report_cmd._write_collected(fmt, result, doc, sink.connections, sink.dns_records,
                                    options, out, prof, csv_dir)
        if fmt in ("json", "har"):
            json.loads(out.getvalue(), parse_constant=_no_constant)


def diff(data: bytes) -> None:
    """``netdiag diff`` of a saved JSON report: ``load_report`` (which may raise only
    InputError), then the comparison both ways with a small capture's report, rendered
    as JSON, text and HTML."""
    from rich.console import Console

    from netdiag.diff.compare import compare
    from netdiag.diff.load import load_report
    from netdiag.diff.render import render_html, render_json, render_text

    path = _write("diff", data)
    try:
        doc = load_report(path)
    except InputError:
        return
    base = _small_document()
    for a, b in ((doc, base), (base, doc)):
        result = compare(a, b, seed=0)
        render_json(result, io.StringIO())
        render_html(result)
    render_text(result, Console(file=io.StringIO(), width=120))


@cache
def _small_document() -> dict[str, Any]:
    """The report document of a capture of two DNS transactions and two connections
    (the shipped capture's first 40 packets)."""
    import json

    from fuzz.harness import CAPTURES
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader
    from netdiag.diff.load import load_side

    with CaptureReader(CAPTURES / "antho.pcapng") as r:
        packets = [p for _, p in zip(range(40), r.packets(), strict=False)]
    path = _scratch("diff-base")
    with open(path, "wb") as f:
        write_pcapng(f, packets, None, warn=None)
    return json.loads(json.dumps(load_side(path, _keys())))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "capture": capture,
    "tcp": tcp,
    "dns": dns,
    "tls": tls,
    "tls_keys": tls_keys,
    "http1": http1,
    "http2": http2,
    "resp": resp,
    "sse": sse,
    "keylog": keylog,
    "profile": profile,
    "report": report,
    "diff": diff,
}
"""Target name -> function(data). ``fuzz/run.py NAME`` runs one under atheris."""
