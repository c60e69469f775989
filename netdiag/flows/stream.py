"""The interface the flow layer feeds: one TCP connection's two byte streams.

The flow layer reassembles each direction of a TCP connection in sequence order and
calls ``feed`` once per captured segment's new bytes, in stream order, with the
capture time of the packet that carried them. Direction 0 is client to server,
1 is server to client. When bytes were never captured, ``gap`` is called instead,
and the analyzer must resynchronise or stop parsing that direction; it must never
raise for bad bytes (it records a warning instead).

When the connection is finished, the pipeline reads what the analyzer found through
the same interface (``kind``, ``requests``, ``protocol``, ``http2``,
``client_random``, ``warnings``, ``limits_hit``), never by asking which class it is.

It lives here, beside the code that calls it, so that ``flows`` imports nothing from
the layers above it; ``netdiag.protocols`` implements it (and re-exports it from
``netdiag.protocols.base``).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from netdiag.records import Request

AnalyzerKind = Literal["tls", "http", "resp", "dns"]
"""What an analyzer reads; also the ``kind`` of the warnings it raises."""

CLIENT = 0
"""Direction: client to server."""
SERVER = 1
"""Direction: server to client."""


class StreamAnalyzer(Protocol):
    """A sans-IO analyzer of one TCP connection's two byte streams."""

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        """New in-order bytes of ``direction``; ``ts_ns``/``packet`` of the segment."""

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """``nbytes`` of ``direction`` were lost before the next ``feed``."""

    def close(self, ts_ns: int) -> None:
        """The connection ended (FIN/RST/end of capture/idle expiry)."""

    @property
    def warnings(self) -> list[str]:
        """Plain sentences about bytes the analyzer could not parse."""
        ...

    @property
    def kind(self) -> AnalyzerKind:
        """``tls``, ``http`` (HTTP/1.x or HTTP/2 in the clear), ``resp`` or ``dns``."""
        ...

    @property
    def requests(self) -> list[Request]:
        """The connection's requests in the order they started (exact or estimated);
        empty for analyzers without requests (DNS, whose transactions go elsewhere)."""
        ...

    @property
    def protocol(self) -> str | None:
        """The application protocol as seen so far (``h2``, ``http/1.1``, ``resp``, a TLS
        connection's ALPN), or None when the analyzer cannot tell more than its ``kind``."""
        ...

    @property
    def http2(self) -> dict[str, Any] | None:
        """HTTP/2 connection facts (see ``Connection.http2``), None without HTTP/2."""
        ...

    @property
    def client_random(self) -> bytes | None:
        """A TLS connection's ClientHello random (to find or embed its keys), else None."""
        ...

    @property
    def limits_hit(self) -> dict[str, int]:
        """Caps this connection's analysis reached, by ``capture.limits_hit`` name (times
        each was hit); empty when none was."""
        ...
