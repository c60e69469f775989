"""What every fuzz target shares: the input framings, the pipeline-built analyzers, and
the guard that turns an analyzer exception (which the flow layer would swallow into a
``please report this netdiag bug`` warning) back into a crash with its traceback.

Framings are invertible on purpose, so that ``make_seeds.py`` can write the real
streams of the tests' captures as seeds and a crash file reads back as the same feeds.

Stream framing (targets ``dns``, ``tls``, ``tls_keys``, ``http1``, ``http2``, ``resp``,
``sse``): a sequence of records, each a 5-byte header and its bytes::

    op (1 byte) | dt (2 bytes, big endian) | length (2 bytes, big endian) | data

``op`` bit 0: direction (0 client to server, 1 server to client); bit 1: a ``gap`` of
``length`` bytes instead of a ``feed`` (no data follows; bit 4 shifts the length left by
16 bits); bit 2: the time goes back by ``dt`` instead of forward; bit 3 (``dns`` only):
a UDP message rather than TCP stream bytes. ``dt`` counts :data:`DT_UNIT_NS`. Data cut
short by the end of the input is fed as it is; a header cut short is ignored.

Packet framing (target ``tcp``): the same header, ``data`` being one captured frame;
``op`` bits 0-2 pick its link type from :data:`LINKTYPES`, bit 3 sends the time back.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from netdiag.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
"""The project root."""
CAPTURES = ROOT / "captures"
THIRDPARTY = ROOT.parent / "shared" / "captures" / "thirdparty"
"""Third-party captures the tests use (beside the repository), when present."""

HEADER = struct.Struct(">BHH")
OP_SERVER = 0x01
OP_GAP = 0x02
OP_BACK = 0x04
OP_UDP = 0x08
OP_BIG_GAP = 0x10
DT_UNIT_NS = 50_000
"""One ``dt`` step: 50 µs (a record's ``dt`` reaches 3.3 s)."""
BASE_NS = 1_700_000_000 * 1_000_000_000
"""Capture time of the first record."""
MAX_CHUNK = 0xFFFF

LINKTYPES = (1, 113, 276, 0, 108, 101, 228, 229)
"""Link types of the packet framing: Ethernet, Linux SLL, SLL2, NULL, LOOP, RAW, IPv4,
IPv6 (what ``FlowTable.scan`` decodes)."""

Op = tuple[str, int, int, Any]
"""``(kind, direction, ts_ns, data or nbytes)``; kind ``feed``, ``gap`` or ``udp``."""


# -- framings --------------------------------------------------------------------------

def decode_stream(data: bytes) -> Iterator[Op]:
    """The operations of a stream-framed input (see the module docstring)."""
    pos = 0
    ts = BASE_NS
    n = len(data)
    while pos + HEADER.size <= n:
        op, dt, length = HEADER.unpack_from(data, pos)
        pos += HEADER.size
        ts = ts - dt * DT_UNIT_NS if op & OP_BACK else ts + dt * DT_UNIT_NS
        d = op & OP_SERVER
        if op & OP_GAP:
            yield "gap", d, ts, length << 16 if op & OP_BIG_GAP else length
            continue
        chunk = data[pos:pos + length]
        pos += length
        yield ("udp" if op & OP_UDP else "feed"), d, ts, chunk


def encode_stream(ops: list[Op]) -> bytes:
    """A stream-framed input giving ``ops`` back (times rounded to :data:`DT_UNIT_NS`)."""
    out = bytearray()
    prev: int | None = None
    for kind, d, ts, payload in ops:
        if prev is None:
            prev = ts
        delta = (ts - prev) // DT_UNIT_NS
        back = delta < 0
        delta = min(abs(delta), 0xFFFF)
        prev = prev - delta * DT_UNIT_NS if back else prev + delta * DT_UNIT_NS
        op = (d & 1) | (OP_BACK if back else 0)
        if kind == "gap":
            nbytes = int(payload)
            if nbytes > 0xFFFF:
                out += HEADER.pack(op | OP_GAP | OP_BIG_GAP, delta, min(nbytes >> 16, 0xFFFF))
            else:
                out += HEADER.pack(op | OP_GAP, delta, nbytes)
            continue
        if kind == "udp":
            op |= OP_UDP
        chunk = bytes(payload)
        first = True
        for i in range(0, max(len(chunk), 1), MAX_CHUNK):
            out += HEADER.pack(op, delta if first else 0, len(chunk[i:i + MAX_CHUNK]))
            out += chunk[i:i + MAX_CHUNK]
            first = False
    return bytes(out)


def decode_packets(data: bytes) -> list[tuple[int, int, bytes, int]]:
    """The ``(ts_ns, linktype, frame, wire_len)`` packets of a packet-framed input."""
    out = []
    pos = 0
    ts = BASE_NS
    n = len(data)
    while pos + HEADER.size <= n:
        op, dt, length = HEADER.unpack_from(data, pos)
        pos += HEADER.size
        ts = ts - dt * DT_UNIT_NS if op & 0x08 else ts + dt * DT_UNIT_NS
        frame = data[pos:pos + length]
        pos += length
        out.append((ts, LINKTYPES[op & 7], frame, len(frame)))
    return out


def encode_packets(packets: list[tuple[int, int, bytes, int]]) -> bytes:
    """A packet-framed input of reader tuples whose link type is in :data:`LINKTYPES`."""
    out = bytearray()
    prev: int | None = None
    for ts, lt, frame, _wire in packets:
        if lt not in LINKTYPES:
            continue
        if prev is None:
            prev = ts
        delta = (ts - prev) // DT_UNIT_NS
        back = delta < 0
        delta = min(abs(delta), 0xFFFF)
        prev = prev - delta * DT_UNIT_NS if back else prev + delta * DT_UNIT_NS
        frame = frame[:MAX_CHUNK]
        out += HEADER.pack(LINKTYPES.index(lt) | (0x08 if back else 0), delta, len(frame))
        out += frame
    return bytes(out)


# -- the pipeline, as the report runs it ---------------------------------------------------

def strict_json(obj: Any) -> str:
    """``obj`` as JSON; ValueError for NaN or an infinity, which no JSON parser reads."""
    return json.dumps(obj, allow_nan=False)


class JsonSink:
    """A report sink that turns every record into strict JSON, as the output formats do."""

    def __init__(self) -> None:
        self.records = 0

    def dns(self, t: Any) -> None:
        strict_json(t.to_json())
        self.records += 1

    def connection(self, c: Any) -> None:
        strict_json(c.to_json(headers=True))
        self.records += 1


class Guard:
    """Wraps an analyzer; an exception from it is kept (with its traceback) and raised
    again, so that the flow layer's catch-all does not hide it from the fuzzer."""

    __slots__ = ("errors", "inner")

    def __init__(self, inner: Any, errors: list[BaseException]) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "errors", errors)

    def _call(self, name: str, *args: Any) -> None:
        try:
            getattr(self.inner, name)(*args)
        except Exception as e:
            self.errors.append(e)
            raise

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        self._call("feed", direction, ts_ns, data, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        self._call("gap", direction, ts_ns, nbytes)

    def close(self, ts_ns: int) -> None:
        self._call("close", ts_ns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)


def new_run(keylog: Any = None) -> Any:
    """A ``pipeline._Run`` with no reader (packets are handed to its flow table), a JSON
    sink, and analyzers wrapped in :class:`Guard`; ``run.fuzz_errors`` collects."""
    from netdiag import pipeline

    facts = pipeline.CaptureFacts(files=["<fuzz>"])
    run = pipeline._Run(JsonSink(), pipeline.Options(keylog=keylog), facts, [])
    errors: list[BaseException] = []
    decide = run._decide

    def guarded(flow: Any, first: bytes) -> Any:
        an = decide(flow, first)
        return None if an is None else Guard(an, errors)

    run.table.decide = guarded
    run.fuzz_errors = errors
    return run


def raise_guarded(run: Any) -> None:
    """Raise the first analyzer exception of ``run`` (see :class:`Guard`), if any."""
    if run.fuzz_errors:
        raise run.fuzz_errors[0]


def new_flow(run: Any, server_port: int, client_port: int = 40000) -> Any:
    """A TCP flow of ``run`` (not in its table) from 10.0.0.1 to 10.0.0.2:``server_port``."""
    from netdiag.flows.tcp import TcpFlow
    from netdiag.records import Connection

    conn = Connection(id="C1", ts_ns=BASE_NS, client=f"10.0.0.1:{client_port}",
                      server=f"10.0.0.2:{server_port}", last_ns=BASE_NS)
    flow = TcpFlow(conn, run._decide)
    flow.decided = True
    return flow


def drive_stream(run: Any, flow: Any, an: Any, data: bytes,
                 on_udp: Callable[[int, int, bytes, int], None] | None = None) -> None:
    """Feed ``an`` the operations of stream-framed ``data``, close it and hand the
    connection to the pipeline (interface read, summary, JSON), as ``FlowTable`` does."""
    flow.analyzer = an
    ts = BASE_NS
    for packet, (kind, d, ts, payload) in enumerate(decode_stream(data), 1):
        if kind == "gap":
            an.gap(d, ts, payload)
        elif kind == "udp":
            if on_udp is not None:
                on_udp(d, ts, payload, packet)
        else:
            an.feed(d, ts, payload, packet)
    flow.conn.last_ns = ts
    an.close(ts)
    run._on_connection(flow)
    strict_json(run.summary.build())


# -- keys ------------------------------------------------------------------------------------

def key_files() -> list[Path]:
    """The key logs of the tests' captures: the shipped capture's and the third-party ones."""
    files = [CAPTURES / "antho.keys"]
    if THIRDPARTY.is_dir():
        files.extend(sorted(THIRDPARTY.glob("*.keys")))
    return [f for f in files if f.is_file()]


def load_keys() -> Any:
    """One KeyLog of every key log of :func:`key_files`."""
    from netdiag.tls.keylog import KeyLog

    log = KeyLog()
    for f in key_files():
        try:
            log.merge(KeyLog.from_file(f))
        except InputError:
            continue
    return log


def temp_dir() -> str:
    """A directory for the files a target writes (RAM-backed when there is one)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else (
        os.environ.get("TMPDIR") or "/tmp")
