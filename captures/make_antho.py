#!/usr/bin/env python3
"""Produce ``captures/antho.pcapng``: one run of the netdiag lab with fixed parameters.

The capture is the lab's (``netdiag lab``, ``netdiag/lab/``): real DNS, edge, router,
Redis and origin servers on loopback addresses, real clients, captured live on ``lo``.
This script only fixes the parameters (``ANTHO``), so that the shipped capture is
small, its counts are the same on every run, and it shows every feature the tests
rely on: both paths, SSE, TLS 1.3 (the ROC hops) and TLS 1.2 (the DPF origins), a
TLS 1.3 resumption, DNS over UDP and TCP and one NXDOMAIN. Requests run one at a time
per path (the paths run side by side), so that even without keys the inference from
record timing finds every request.

    python captures/make_antho.py                      # captures/antho.{pcapng,keys,...}
    python captures/make_antho.py --out /tmp/x.pcapng --keylog /tmp/x.keys

Writes the capture (TLS keys embedded), ``<stem>.paths.toml``, ``<stem>.expected.json``
(the ledger) and the key log. Needs root (ports 53 and 443, a packet socket on ``lo``)
and redis-server.

Importable: ``make_capture(out, keylog=None, **overrides) -> dict`` (the ledger). The
old building blocks (``_make_certs``, ``_server_ssl_context``, ``_listening_socket``,
``_DnsHandler``, ``_DnsUdp``, ``_make_app``, ``_LabHypercornConfig``, ``LoopbackCapture``,
...) stay importable from here for the tests that load this file; they now live in
``netdiag.lab``.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from netdiag.lab import LabError, LabParams, run_lab
from netdiag.lab.asgi import LabHypercornConfig as _LabHypercornConfig
from netdiag.lab.asgi import make_origin_app as _make_app
from netdiag.lab.asgi import serve
from netdiag.lab.certs import client_ssl_context as _client_ssl_context
from netdiag.lab.certs import make_certs as _make_certs
from netdiag.lab.certs import server_ssl_context as _server_ssl_context
from netdiag.lab.dns_server import DnsHandler as _DnsHandler
from netdiag.lab.dns_server import DnsUdp as _DnsUdp
from netdiag.lab.driver import TLS_NAMES
from netdiag.lab.servers import listening_socket as _listening_socket

HERE = Path(__file__).resolve().parent

ANTHO = LabParams(
    requests=12, concurrency=1, origins=3, sse_share=0.25, sse_events=8,
    dns_delay_ms=3.0, router_delay_ms=10.0, think_ms=20.0, token_gap_ms=5.0,
    dpf_tls="1.2", dpf_dns_transport="tcp", nx_lookup=True, roc_resume=True,
    seed=1, hash_bucket=7, user_agent="netdiag-lab/1 (antho capture)")
"""The parameters of the shipped capture (bucket 7 spreads DPF over its 3 origins)."""

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

__all__ = ["ANTHO", "NODELAY", "TLS_NAMES", "LabError", "LoopbackCapture", "_DnsHandler",
           "_DnsUdp", "_LabHypercornConfig", "_client_ssl_context", "_listening_socket",
           "_make_app", "_make_certs", "_server_ssl_context", "make_capture", "serve"]


def make_capture(out: Path, keylog: Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Run the lab with the shipped parameters (``overrides`` replace some); the ledger."""
    return run_lab(Path(out), dataclasses.replace(ANTHO, **overrides), keylog=keylog)


class LoopbackCapture:
    """The old script's sniffer interface, on ``netdiag.live.capture.LiveCapture``.

    ``start()`` returns once capturing; ``stop()`` returns the packets (reader tuples
    ``(ts_ns, linktype, data, wire_len)``); ``write(packets, out)`` writes them as pcapng
    with nanosecond times and returns how many.
    """

    def __init__(self, addresses: list[str], iface: str = "lo") -> None:
        from netdiag.live.capture import LiveCapture

        self.addresses = frozenset(addresses)
        self._tmp = tempfile.TemporaryDirectory(prefix="loopback-capture-")
        self._file = Path(self._tmp.name) / "capture.pcapng"
        bpf = " or ".join(f"host {a}" for a in sorted(self.addresses))
        self._cap = LiveCapture(self._file, iface=iface, bpf=bpf,
                                keep_addresses=set(self.addresses))

    def start(self) -> None:
        try:
            self._cap.start()
        except Exception:
            self._tmp.cleanup()
            raise

    def stop(self) -> list[tuple[int, int, bytes, int]]:
        from netdiag.capture.reader import CaptureReader

        try:
            self._cap.stop()
            with CaptureReader(self._file) as reader:
                return list(reader.packets())
        finally:
            self._tmp.cleanup()

    def write(self, packets: list[tuple[int, int, bytes, int]], out: Path) -> int:
        from netdiag.capture.pcapng_writer import write_pcapng

        out = Path(out)
        tmp = out.with_name(out.name + ".part")
        with open(tmp, "wb") as f:
            n = write_pcapng(f, packets)
        tmp.replace(out)
        return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "antho.pcapng")
    parser.add_argument("--keylog", type=Path, default=HERE / "antho.keys")
    parser.add_argument("--no-keylog", action="store_true",
                        help="do not write a separate key log (the capture embeds the keys)")
    parser.add_argument("--timeout", type=float, default=ANTHO.timeout_s,
                        help="hard overall time limit in seconds (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        result = make_capture(args.out, None if args.no_keylog else args.keylog,
                              timeout_s=args.timeout)
    except LabError as exc:
        print(f"make_antho: {exc}", file=sys.stderr)
        return 1
    size = args.out.stat().st_size
    paths = result["paths"]
    print(f"{args.out}: {result['packets']} packets, {size} bytes, "
          f"{result['dns_queries']} DNS queries ({result['dns_nxdomain']} NXDOMAIN), "
          f"ROC {paths['ROC']['requests']} requests on {paths['ROC']['connections']} "
          f"connections, DPF {paths['DPF']['requests']} on {paths['DPF']['connections']}, "
          f"router upstream connections {result['router']['upstream_connections']}, "
          f"TLS {result['tls_versions']} ({result['tls_resumed']} resumed), "
          f"{result['duration_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
