"""Analyzer interfaces: the stream interface the flow layer feeds (defined in
``netdiag.flows.stream`` and re-exported here), the HTTP one the TLS layer feeds, and
the shared warning helper.
"""

from __future__ import annotations

from typing import Any, Protocol

from netdiag.flows.stream import CLIENT, SERVER, AnalyzerKind, StreamAnalyzer
from netdiag.records import Request

__all__ = ["CLIENT", "SERVER", "AnalyzerKind", "HttpAnalyzer", "StreamAnalyzer", "add_warning"]


def add_warning(warnings: list[str], message: str, limit: int, dropped: str) -> None:
    """Append ``message`` while ``warnings`` holds fewer than ``limit``; once full, one
    last line (``dropped``) says that the rest were dropped."""
    n = len(warnings)
    if n < limit:
        warnings.append(message)
    elif n == limit:
        warnings.append(dropped)


class HttpAnalyzer(StreamAnalyzer, Protocol):
    """A StreamAnalyzer of HTTP (HTTP/2 or HTTP/1.x), fed cleartext or decrypted bytes.

    The same object serves a cleartext connection (fed by the flow layer) and a
    decrypted TLS connection (fed by the TLS layer with the plaintext of each record,
    split where the TCP segments split it, each piece with the capture time and
    packet number of the segment that carried its first byte).
    """

    @property
    def requests(self) -> list[Request]:
        """Exact requests (``estimated=False``) in the order they started."""
        ...

    @property
    def http2(self) -> dict[str, Any] | None:
        """HTTP/2 connection facts (see ``Connection.http2``), None for HTTP/1.x."""
        ...

    @property
    def protocol(self) -> str:
        """``h2``, ``h2c`` or ``http/1.1`` (``http/1.0``), as seen so far."""
        ...
