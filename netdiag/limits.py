"""Caps on the analysis state that grows with the input, and how often each was hit.

Per-connection caps (a direction's out-of-order queue, an HTTP/2 connection's open
streams, ...) live beside the state they bound, as constants. The caps here bound state
summed over all connections, so that no capture, however crafted, makes one report
hold more than they allow:

* ``tcp_open_connections``: connections in the flow table at once. Beyond it the
  least recently active eighth is finished early (``close: evicted``), with what was
  measured so far.
* ``tcp_held_bytes``: payload bytes held by TCP reassembly over all connections
  (out-of-order segments, and server bytes held until the client speaks). Beyond it,
  the connection that adds more declares its missing bytes lost (as when its own
  queue is full) and hands on what it held.
* ``dns_open_transactions``: DNS transactions awaiting their answer (or duplicates of
  it). Beyond it the least recently active is finished early, as when it times out.

Each hit is counted in :attr:`Limits.hit` under the cap's name; the report lists the
counts in ``capture.limits_hit`` with one warning per cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

LIMIT_CONNECTIONS = "tcp_open_connections"
"""``limits_hit`` key: connections finished early because :attr:`Limits.max_connections`
were open."""
LIMIT_HELD_BYTES = "tcp_held_bytes"
"""``limits_hit`` key: times a connection gave up held bytes because all connections
together held :attr:`Limits.max_held_bytes`."""
LIMIT_DNS_OPEN = "dns_open_transactions"
"""``limits_hit`` key: DNS transactions finished early because
:attr:`Limits.max_dns_open` were open."""
LIMIT_OUT_OF_ORDER = "tcp_out_of_order"
"""``limits_hit`` key: times one direction's out-of-order queue was full (its
:data:`netdiag.flows.tcp.MAX_OOO_SEGMENTS` segments or ``MAX_OOO_BYTES`` bytes) and the
bytes it waited for were declared lost."""

GLOBAL_LIMITS = frozenset({LIMIT_CONNECTIONS, LIMIT_HELD_BYTES, LIMIT_DNS_OPEN})
"""Caps whose hits depend on every connection of the input, not on one alone."""

DEFAULT_MAX_CONNECTIONS = 50_000
DEFAULT_MAX_HELD_BYTES = 128 << 20
DEFAULT_MAX_DNS_OPEN = 100_000

FLAGS = {
    LIMIT_CONNECTIONS: "--max-connections",
    LIMIT_HELD_BYTES: "--max-held-mib",
    LIMIT_DNS_OPEN: "--max-dns-pending",
}
"""The ``netdiag report`` flag that raises each global cap."""

DESCRIPTIONS = {
    LIMIT_CONNECTIONS: "connections were open at once: the least recently active were "
                       "finished early (close: evicted)",
    LIMIT_HELD_BYTES: "bytes were held by TCP reassembly over all connections: "
                      "missing bytes were declared lost sooner",
    LIMIT_DNS_OPEN: "DNS transactions awaited an answer at once: the least recently "
                    "active were finished early",
    LIMIT_OUT_OF_ORDER: "out-of-order segments (or bytes) were held in one direction of a "
                        "connection: the bytes they waited for were declared lost",
    "ip_fragments_pending": "IP datagrams awaited their missing fragments at once: the "
                            "oldest were dropped",
    "ip_fragment_bytes": "bytes of incomplete IP datagrams were held: the oldest were dropped",
    "http1_pending_requests": "HTTP/1.x requests awaited a response on one connection: the "
                              "oldest are no longer followed (their records dropped)",
    "http1_held_bytes": "bytes followed an unanswered Upgrade/CONNECT request: they were "
                        "read as HTTP/1.x",
    "http2_open_streams": "HTTP/2 streams were open at once on one connection: the oldest "
                          "are no longer followed",
    "http2_hpack_table": "bytes of HPACK dynamic table were asked for: that connection's "
                         "headers are no longer decoded",
    "http2_flow_control": "HTTP/2 flow-control steps were tracked on one connection: flow "
                          "control is no longer tracked there",
}
"""What hitting each cap did, for the one warning per cap."""


@dataclass
class Limits:
    """The global caps of one analysis and the hits of every cap, by name."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once (``--max-connections``)."""
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES
    """Payload bytes held by TCP reassembly over all connections (``--max-held-mib``)."""
    max_dns_open: int = DEFAULT_MAX_DNS_OPEN
    """DNS transactions awaiting an answer at once (``--max-dns-pending``)."""
    held_bytes: int = 0
    """Payload bytes TCP reassembly holds now, over all connections."""
    hit: dict[str, int] = field(default_factory=dict)
    """Times each cap was reached, by its ``limits_hit`` name."""
    on_global_hit: Callable[[str], None] | None = None
    """Called when a cap of :data:`GLOBAL_LIMITS` is reached (``netdiag.shard`` then
    redoes the analysis in one process, whose caps see every connection)."""

    def count(self, name: str, times: int = 1) -> None:
        """Record that cap ``name`` was reached ``times`` more times."""
        self.hit[name] = self.hit.get(name, 0) + times
        if self.on_global_hit is not None and name in GLOBAL_LIMITS:
            self.on_global_hit(name)

    def add(self, hits: dict[str, int]) -> None:
        """Add the hits a connection's analyzer (or another layer) counted itself."""
        for name, times in hits.items():
            if times:
                self.hit[name] = self.hit.get(name, 0) + times

    def warning_text(self, name: str, times: int) -> str:
        """The one warning sentence about cap ``name``, reached ``times`` times."""
        what = DESCRIPTIONS.get(name, "the cap was reached")
        cap = {LIMIT_CONNECTIONS: f"{self.max_connections:,}",
               LIMIT_HELD_BYTES: f"{self.max_held_bytes >> 20:,} MiB of",
               LIMIT_DNS_OPEN: f"{self.max_dns_open:,}"}.get(name, "too many")
        flag = FLAGS.get(name)
        more = f"; {flag} raises it" if flag else ""
        return f"limit {name} reached {times:,} time(s): {cap} {what}{more}"
