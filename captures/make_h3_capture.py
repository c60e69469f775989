#!/usr/bin/env python3
"""Produce ``captures/h3.pcapng``: one run of the netdiag lab whose ROC clients speak HTTP/3.

The lab (``netdiag lab --client-protocol h3``, ``netdiag/lab/``) with the edge's QUIC
listener on (``http3``): the ROC client sends its requests over one QUIC connection
(UDP ``127.0.0.2:<port>`` -> ``127.0.0.10:443``, ALPN ``h3``, aioquic) to the edge,
which forwards them over h2c to the router and on to the origins exactly as it does
HTTP/2 requests; the DPF clients speak HTTP/2 to their origins as always. Everything
is captured live on ``lo`` by the lab's own sniffer, in the lab's network namespace
(the same capture path as ``antho.pcapng``: pcapng, nanosecond timestamps, the key
log embedded in a decryption-secrets block -- the edge's QUIC secrets and the TLS
secrets of every TCP client).

    python captures/make_h3_capture.py              # captures/h3.{pcapng,keys,ledger.json,...}
    python captures/make_h3_capture.py --out /tmp/h3.pcapng

Writes ``h3.pcapng``, ``h3.keys`` (the key log as a file), ``h3.paths.toml`` and
``h3.expected.json`` (the lab's whole ledger), and ``h3.ledger.json``: the h3 client's
own record of every request, for cross-checks of a QUIC / HTTP/3 analyzer against
the capture (see ``ledger()`` for the fields). Needs root and redis-server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from netdiag.lab import LabError, LabParams, run_lab
from netdiag.lab.lab import sibling

HERE = Path(__file__).resolve().parent

H3 = LabParams(
    requests=24, concurrency=2, origins=3, sse_share=0.25, sse_events=8,
    dns_delay_ms=2.0, router_delay_ms=10.0, think_ms=20.0, token_gap_ms=5.0,
    seed=1, hash_bucket=7, client_protocol="h3", http3=True,
    user_agent="netdiag-lab/1 (h3 capture)")
"""The parameters of the shipped h3 capture: 24 requests per path, 2 at a time (so
the QUIC connection carries two streams at once), a quarter of them streamed."""


def ledger(result: dict[str, Any]) -> dict[str, Any]:
    """The h3 client's ledger: per QUIC connection and per request what the client did.

    Per request: ``request_id``, ``stream_id`` (the QUIC stream), ``method``, ``path``,
    ``status``, ``kind`` (``json``/``sse``), ``events`` (SSE), ``connection`` (the
    client's UDP endpoint ``127.0.0.2:port``; ``local_port`` alone too), ``server``,
    ``request_ns`` (``time.time_ns()`` right before the request's HEADERS were handed
    to QUIC: the send), ``first_byte_ns`` / ``last_byte_ns`` (``time.time_ns()`` when
    the client read the datagram that brought the response's HEADERS / ended its
    stream), ``client_ttfb_ms`` / ``client_total_ms`` (the lab's usual client timers,
    from ``sent_ts``, which for the first request includes the QUIC handshake), and
    ``edge_received_ns`` (the edge's wall clock when it read the request's HEADERS).
    Every time is on the clock the capture's kernel timestamps use.
    """
    reqs = []
    for r in result["request_log"]:
        if r.get("protocol") != "h3":
            continue
        edge = (r.get("hops") or {}).get("edge") or {}
        client = r.get("client")
        reqs.append({
            "request_id": r["request_id"], "stream_id": r.get("stream_id"),
            "method": r["method"], "path": r["url_path"], "status": r.get("status"),
            "kind": r["kind"], "events": r.get("events"),
            "connection": client,
            "local_port": int(client.rsplit(":", 1)[1]) if client else None,
            "server": r["server"], "sent_ts": r["sent_ts"],
            "request_ns": r.get("request_ns"), "first_byte_ns": r.get("first_byte_ns"),
            "last_byte_ns": r.get("last_byte_ns"),
            "client_ttfb_ms": r.get("client_ttfb_ms"),
            "client_total_ms": r.get("client_total_ms"),
            "edge_received_ns": (round(edge["received_ts"] * 1e9)
                                 if edge.get("received_ts") is not None else None),
            "error": r.get("error")})
    reqs.sort(key=lambda x: (x["request_ns"] or 0, x["request_id"]))
    conns = [{k: c.get(k) for k in ("client", "server", "sni", "alpn", "tls_version",
                                    "cipher")}
             | {"transport": "udp", "requests": len(c["requests"]),
                "stream_ids": sorted(q["stream_id"] for q in c["requests"])}
             for c in result["connection_log"] if c.get("transport") == "quic"]
    return {
        "capture": result["capture"], "keylog": result.get("keylog"),
        "protocol": "h3", "alpn": "h3", "server": "127.0.0.10:443",
        "clock": "epoch ns (time.time_ns), the capture's clock",
        "connections": conns, "requests": reqs,
        "edge_alt_svc": 'h3=":443"',
        "errors": result["errors"],
    }


def make_capture(out: Path, keylog: Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Run the lab with :data:`H3` (with ``overrides``); write everything; the result."""
    out = Path(out)
    result = run_lab(out, dataclasses.replace(H3, **overrides), keylog=keylog)
    doc = ledger(result)
    sibling(out, ".ledger.json").write_text(json.dumps(doc, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "h3.pcapng")
    parser.add_argument("--keylog", type=Path, default=None,
                        help="default: <stem>.keys beside --out")
    args = parser.parse_args(argv)
    keylog = args.keylog or sibling(args.out, ".keys")
    try:
        result = make_capture(args.out, keylog)
    except LabError as exc:
        print(f"make_h3_capture: {exc}", file=sys.stderr)
        return 1
    roc = result["paths"]["ROC"]
    print(f"wrote {args.out} ({result['packets']} packets), {keylog}, "
          f"{sibling(args.out, '.ledger.json')}: ROC {roc['requests']} h3 requests "
          f"{roc['statuses']}, errors {len(result['errors'])}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
