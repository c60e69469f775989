"""Seed corpora for the fuzz targets, from the tests' captures: ``fuzz/corpus/TARGET/``.

Usage: ``python fuzz/make_seeds.py [--out DIR] [TARGET...]`` (every target by default).

The streams are the ones the real pipeline hands its analyzers: the shipped capture
``captures/antho.pcapng`` (with ``captures/antho.keys``) and the third-party captures of
``../shared/captures/thirdparty`` (with their key logs) are analysed with every
analyzer wrapped in a recorder, and each connection's ``feed``/``gap`` sequence is
written in the stream framing of ``fuzz/harness.py``, filed by what the pipeline
picked (TLS with or without a key, HTTP/1, HTTP/2 in the clear or decrypted, RESP,
DNS over TCP; DNS over UDP messages; SSE bodies). Also: windows of packets for
``tcp``, small pcap/pcapng/gzip files for ``capture`` (the third-party files, the first
packets of the shipped capture, and the captures the tests build), key log lines, and
path profiles (the shipped one and those written in the tests), and the JSON reports of
the captures for ``diff``.

The corpus is generated and ignored by git; seeds above :data:`MAX_SEED` are cut.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.harness import (  # noqa: E402
    CAPTURES,
    THIRDPARTY,
    encode_packets,
    encode_stream,
    key_files,
)

MAX_SEED = 64 << 10
"""Largest seed written (bytes); longer ones are cut."""
PACKET_WINDOW = 48
"""Packets per ``tcp`` seed."""


def captures() -> list[tuple[Path, Path | None]]:
    """(capture, its key log or None) of the tests' captures."""
    out: list[tuple[Path, Path | None]] = [(CAPTURES / "antho.pcapng", CAPTURES / "antho.keys")]
    if THIRDPARTY.is_dir():
        for p in sorted(THIRDPARTY.iterdir()):
            if p.suffix in (".pcap", ".pcapng", ".cap"):
                keys = p.with_suffix(".keys")
                if not keys.exists():  # hotplace_http1_tls13.pcapng -> hotplace_http.keys
                    cands = [k for k in THIRDPARTY.glob("*.keys")
                             if p.stem.startswith(k.stem.split("_")[0])]
                    keys = cands[0] if len(cands) == 1 else None
                out.append((p, keys))
    return out


class Recorder:
    """An analyzer proxy that logs what it is fed: ``ops`` in the stream framing's terms."""

    def __init__(self, inner: Any, log: list[tuple[str, Any, list[Any]]], label: str) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "ops", [])
        log.append((label, self, self.ops))

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        self.ops.append(("feed", direction, ts_ns, bytes(data)))
        self.inner.feed(direction, ts_ns, data, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        self.ops.append(("gap", direction, ts_ns, nbytes))
        self.inner.gap(direction, ts_ns, nbytes)

    def close(self, ts_ns: int) -> None:
        self.inner.close(ts_ns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)


def record(path: Path, keys: Path | None) -> dict[str, list[bytes]]:
    """Seeds by target from one capture analysed by the pipeline."""
    from netdiag import pipeline
    from netdiag.protocols import sse as sse_mod
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    log: list[tuple[str, Any, list[Any]]] = []
    udp: list[tuple[str, int, int, bytes]] = []
    sse_feeds: dict[int, list[tuple[str, int, int, bytes]]] = defaultdict(list)
    keylog = KeyLog.from_file(keys) if keys else None

    class RecordingRun(pipeline._Run):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            on_udp = self.table.on_dns_udp

            def rec_udp(ts: int, src: str, dst: str, payload: bytes, pkt: int) -> None:
                d = 1 if src.endswith(":53") else 0
                udp.append(("udp", d, ts, bytes(payload)))
                on_udp(ts, src, dst, payload, pkt)

            self.table.on_dns_udp = rec_udp

        def _decide(self, flow: Any, first: bytes) -> Any:
            an = super()._decide(flow, first)
            if an is None:
                return None
            return Recorder(an, log, an.kind)

    orig_app = pipeline._app_for_tls
    orig_sse = sse_mod.SseCounter.feed

    def rec_app(alpn: str | None, first: bytes) -> Any:
        an = orig_app(alpn, first)
        return None if an is None else Recorder(an, log, "app")

    def rec_sse(self: Any, ts_ns: int, data: bytes) -> None:
        sse_feeds[id(self)].append(("feed", 1, ts_ns, bytes(data)))
        orig_sse(self, ts_ns, data)

    pipeline._app_for_tls = rec_app
    sse_mod.SseCounter.feed = rec_sse  # type: ignore[method-assign]
    try:
        pipeline._analyze([str(path)], CollectingSink(), pipeline.Options(keylog=keylog),
                          run_type=RecordingRun)
    finally:
        pipeline._app_for_tls = orig_app
        sse_mod.SseCounter.feed = orig_sse  # type: ignore[method-assign]

    out: dict[str, list[bytes]] = defaultdict(list)
    for label, rec, ops in log:
        if not ops:
            continue
        kind = rec.kind
        proto = rec.protocol or ""
        if kind == "tls" and label != "app":
            out["tls"].append(encode_stream(ops))
            random = rec.client_random
            if keylog is not None and random and random in keylog:
                out["tls_keys"].append(encode_stream(ops))
        elif kind == "http":
            out["http2" if proto.startswith("h2") else "http1"].append(encode_stream(ops))
        elif kind in ("resp", "dns"):
            out[kind].append(encode_stream(ops))
    for i in range(0, len(udp), 24):
        out["dns"].append(encode_stream(udp[i:i + 24]))
    for feeds in sse_feeds.values():
        out["sse"].append(encode_stream(feeds))
    return out


def packet_seeds(path: Path) -> list[bytes]:
    """Windows of :data:`PACKET_WINDOW` packets of a capture, packet-framed."""
    from netdiag.capture.reader import CaptureReader

    with CaptureReader(path) as r:
        pkts = list(r.packets())
    return [encode_packets(pkts[i:i + PACKET_WINDOW])
            for i in range(0, len(pkts), PACKET_WINDOW)]


def capture_seeds() -> list[bytes]:
    """Small capture files: third-party ones, the shipped capture's first packets as
    pcapng (with its keys embedded), pcap and gzip, and the captures the tests build."""
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    seeds = []
    for path, _keys in captures()[1:]:
        if path.stat().st_size <= MAX_SEED:
            seeds.append(path.read_bytes())
    with CaptureReader(CAPTURES / "antho.pcapng") as r:
        pkts = list(r.packets())
    keys = (CAPTURES / "antho.keys").read_bytes()
    for n in (1, 12, 60):
        buf = io.BytesIO()
        write_pcapng(buf, pkts[:n], keys[:600] if n > 1 else None, warn=None)
        seeds.append(buf.getvalue())
    seeds.append(gzip.compress(seeds[-2], mtime=0))
    first = (CAPTURES / "antho.pcapng").read_bytes()[:16384]
    seeds.append(first)  # cut mid-block: the truncation path
    seeds.extend(_test_built_captures())
    return seeds


def _test_built_captures() -> list[bytes]:
    """The captures ``tests/test_hostile_output.py`` and ``tests/crosscheck/synthetic.py``
    write (skipped when their imports fail)."""
    out = []
    tests = ROOT / "tests"
    for where, mod_name, func in ((tests, "test_hostile_output", "write_hostile"),
                                  (tests / "crosscheck", "synthetic", "write")):
        sys.path.insert(0, str(where))
        try:
            mod = __import__(mod_name)
            with tempfile.TemporaryDirectory() as tmp:
                p = Path(tmp) / "t.pcap"
                getattr(mod, func)(p)
                out.append(p.read_bytes())
        except Exception as e:  # a helper that moved: the other seeds still do
            print(f"make_seeds: skipped {mod_name}.{func}: {type(e).__name__}: {e}",
                  file=sys.stderr)
        finally:
            sys.path.remove(str(where))
    return out


def keylog_seeds() -> list[bytes]:
    """Whole key logs, each client random's lines, and a few edge lines."""
    seeds = []
    for f in key_files():
        data = f.read_bytes()
        seeds.append(data[:MAX_SEED])
        groups: dict[str, list[bytes]] = defaultdict(list)
        for line in data.splitlines(keepends=True):
            parts = line.split()
            if len(parts) >= 2:
                groups[parts[1].decode("ascii", "replace")].append(line)
        for lines in list(groups.values())[:6]:
            seeds.append(b"".join(lines))
    seeds += [b"# comment\n\n", b"\xef\xbb\xbfCLIENT_RANDOM " + b"00" * 32 + b" " + b"11" * 48,
              b"RSA 0011 2233\r\n", b"PMS_CLIENT_RANDOM " + b"aa" * 32 + b" " + b"bb" * 48]
    return seeds


def profile_seeds() -> list[bytes]:
    """The shipped profile and the TOML profiles written in the tests."""
    seeds = [(CAPTURES / "antho.paths.toml").read_bytes()]
    for py in sorted((ROOT / "tests").rglob("*.py")):
        try:
            tree = ast.parse(py.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and ("[[path" in node.value or "[[edge" in node.value)):
                seeds.append(node.value.encode("utf-8"))
    return seeds


def diff_seeds() -> list[bytes]:
    """``netdiag report --format json`` documents of the tests' captures (the small ones
    whole; the shipped capture's cut to its first connections)."""
    import json

    from netdiag.diff.load import load_side
    from netdiag.tls.keylog import KeyLog

    seeds = []
    for path, keys in captures():
        doc = load_side(str(path), KeyLog.from_file(keys) if keys else None)
        text = json.dumps(doc, indent=1)
        if len(text) > MAX_SEED:
            doc["connections"] = doc["connections"][:6]
            doc["dns"] = doc["dns"][:6]
            text = json.dumps(doc, indent=1)
        seeds.append(text.encode())
    return seeds


def build(out: Path, targets: list[str]) -> dict[str, int]:
    """Write the seeds of ``targets`` under ``out``; returns the count per target."""
    from fuzz.targets import TARGETS

    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise SystemExit(f"make_seeds: unknown target(s) {', '.join(bad)}")
    seeds: dict[str, list[bytes]] = defaultdict(list)
    want = set(targets)
    if want & {"tls", "tls_keys", "http1", "http2", "resp", "dns", "sse"}:
        for path, keys in captures():
            for name, items in record(path, keys).items():
                seeds[name].extend(items)
    if want & {"tcp", "report"}:
        for path, _keys in captures():
            seeds["tcp"].extend(packet_seeds(path))
        seeds["report"] = seeds["tcp"]
    if "capture" in want:
        seeds["capture"] = capture_seeds()
    if "keylog" in want:
        seeds["keylog"] = keylog_seeds()
    if "profile" in want:
        seeds["profile"] = profile_seeds()
    if "diff" in want:
        seeds["diff"] = diff_seeds()
    counts = {}
    for name in targets:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        n = 0
        for s in seeds.get(name, []):
            s = s[:MAX_SEED]
            if not s:
                continue
            (d / hashlib.sha1(s).hexdigest()).write_bytes(s)
            n += 1
        counts[name] = n
    return counts


def main() -> None:
    from fuzz.targets import TARGETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="*", help="targets (default: all)")
    ap.add_argument("--out", default=str(ROOT / "fuzz" / "corpus"))
    args = ap.parse_args()
    os.environ.setdefault("NETDIAG_CORE", "python")
    counts = build(Path(args.out), args.targets or list(TARGETS))
    for name, n in counts.items():
        print(f"{name}: {n} seeds")


if __name__ == "__main__":
    main()
