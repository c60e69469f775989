"""What a held record costs in memory, estimated from what it holds: the bound of
``report --max-memory`` (``netdiag.fleet.memory``), which a run in several processes
(``netdiag.shard``) also keeps, its shards holding every record until they merge.

The constants were measured on this project's captures: peak RSS of ``--format json``
less that of ``--format jsonl``, which streams.
"""

from __future__ import annotations

from netdiag.records import Connection, DnsTransaction

CONNECTION_BYTES = 8192
"""A connection record with its TCP, TLS and timing fields, and its share of the document."""
REQUEST_BYTES = 2048
"""Each request of a connection (its figures, headers read, SSE cadence)."""
GAP_BYTES = 8
"""Each gap between a response's chunks, as a record held keeps them
(:func:`~netdiag.records.compact_gaps`): an answer streamed token by token has one per
token, thousands where the rest of its request costs :data:`REQUEST_BYTES`."""
DNS_BYTES = 1024
"""A DNS transaction and its share of the document."""
RECORD_BYTES_PER_CAPTURE_BYTE = 16
"""The most record memory a byte of (uncompressed) capture has been seen to cost: a
capture of short connections (7 packets of 70 bytes: 8 KiB of record for 500 bytes of
packets). A single capture smaller than ``budget / this`` cannot pass the budget, and is
reported the plain way."""


def connection_bytes(c: Connection) -> int:
    """The estimated memory of a held connection record."""
    gaps = 0
    for r in c.requests:
        if r.chunk_gaps_ns is not None:
            gaps += len(r.chunk_gaps_ns)
    return CONNECTION_BYTES + REQUEST_BYTES * len(c.requests) + GAP_BYTES * gaps


def dns_bytes(_t: DnsTransaction) -> int:
    """The estimated memory of a held DNS transaction."""
    return DNS_BYTES


def may_pass(capture_bytes: int, budget: int | None) -> bool:
    """Could the records of captures of this size pass ``budget``?"""
    return budget is not None and capture_bytes * RECORD_BYTES_PER_CAPTURE_BYTE > budget
