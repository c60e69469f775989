"""The bytes of an HTTP ``CONNECT`` tunnel, analysed as the connection they carry.

Clients behind an egress proxy send ``CONNECT api.example:443`` and, after a ``2xx``,
speak TLS (or HTTP/2 with prior knowledge, or HTTP/1.1) through the proxy's
connection. :class:`Tunnel` receives those bytes from the HTTP/1 analyzer of the
proxy connection and hands them to the analyzer that ``pick`` chooses from the
client's first tunnelled bytes (the pipeline's choice, as for a connection of its
own); until the client speaks, the server's bytes are held (at most
:data:`MAX_PENDING` bytes, the rest a gap), as the flow layer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netdiag.flows.stream import AnalyzerKind, StreamAnalyzer
from netdiag.records import Request

MAX_PENDING = 64 << 10
"""Server bytes held while the client has not yet spoken in the tunnel."""

TunnelPicker = Callable[["Tunnel", bytes], "StreamAnalyzer | None"]
"""The analyzer of a tunnel's bytes, from the tunnel and the client's first bytes (None:
not analysed)."""


class Tunnel:
    """One CONNECT tunnel (a ``StreamAnalyzer`` fed by the proxy connection's analyzer)."""

    def __init__(self, pick: TunnelPicker, authority: str | None) -> None:
        self.pick = pick
        self.authority = authority
        """The CONNECT request's target (``host:port``)."""
        self.inner: StreamAnalyzer | None = None
        """The analyzer of the tunnelled bytes, once the client spoke."""
        self._decided = False
        self._pending: list[tuple[int, int, bytes, int, int]] = []
        self._pending_bytes = 0

    def feed(self, direction: int, ts_ns: int, data: bytes, packet: int) -> None:
        """Tunnelled bytes of ``direction``."""
        if not data:
            return
        if not self._decided:
            if direction == 1:
                if self._pending_bytes + len(data) <= MAX_PENDING:
                    self._pending.append((1, ts_ns, bytes(data), packet, 0))
                    self._pending_bytes += len(data)
                else:
                    self._pending.append((1, ts_ns, b"", 0, len(data)))
                return
            self._decide(bytes(data))
        if self.inner is not None:
            self.inner.feed(direction, ts_ns, data, packet)

    def gap(self, direction: int, ts_ns: int, nbytes: int) -> None:
        """Tunnelled bytes that were never captured."""
        if not self._decided:
            self._pending.append((direction, ts_ns, b"", 0, nbytes))
        elif self.inner is not None:
            self.inner.gap(direction, ts_ns, nbytes)

    def close(self, ts_ns: int) -> None:
        """The proxy connection ended."""
        if not self._decided:
            self._decide(b"")
        if self.inner is not None:
            self.inner.close(ts_ns)

    def _decide(self, first: bytes) -> None:
        self._decided = True
        inner = self.inner = self.pick(self, first) if first else None
        pending, self._pending = self._pending, []
        if inner is None:
            return
        for d, ts, data, pkt, gap in pending:
            if gap:
                inner.gap(d, ts, gap)
            else:
                inner.feed(d, ts, data, pkt)

    # what the proxy connection's analyzer passes on
    @property
    def requests(self) -> list[Request]:
        """The tunnelled requests (exact or estimated)."""
        return list(self.inner.requests) if self.inner is not None else []

    @property
    def warnings(self) -> list[str]:
        """The inner analyzer's warnings, said to be from inside the tunnel."""
        if self.inner is None:
            return []
        return [f"in the CONNECT tunnel to {self.authority}: {w}" for w in self.inner.warnings]

    @property
    def kind(self) -> AnalyzerKind | None:
        """What the tunnel carries (``tls``, ``http``...), None until known."""
        return self.inner.kind if self.inner is not None else None

    @property
    def protocol(self) -> str | None:
        """The tunnelled protocol (ALPN, ``h2c``, ``http/1.1``...) as far as known."""
        if self.inner is None:
            return None
        return self.inner.protocol or self.inner.kind

    @property
    def http2(self) -> dict[str, Any] | None:
        """HTTP/2 facts of the tunnelled connection."""
        return self.inner.http2 if self.inner is not None else None

    @property
    def client_random(self) -> bytes | None:
        """The tunnelled TLS ClientHello's random (its keys are found and embedded)."""
        return self.inner.client_random if self.inner is not None else None

    @property
    def limits_hit(self) -> dict[str, int]:
        """Caps the inner analysis reached."""
        return self.inner.limits_hit if self.inner is not None else {}

    def to_json(self) -> dict[str, Any]:
        """``connections[].tunnel``: the target and what it carries."""
        return {"authority": self.authority, "protocol": self.protocol,
                "requests": len(self.requests)}
