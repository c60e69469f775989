"""Equal facts of different connections kept once per analysis.

Most connections of a capture repeat the facts of many others: the same HTTP/2
settings from the same client library and server, the same server certificate, the same
ALPN list. Each connection's analyzer builds its own copies (dicts and lists of a few
hundred bytes each), and a report that holds its records (the terminal format, JSON)
then holds tens of thousands of equal copies: 30 MB of the 340 MB peak of the
benchmark's 1M-packet key log report. :class:`FactSharer` gives a finished connection
the copy an earlier connection of the run already holds where they are equal, so the
records keep one.

The shared objects are the records' own (the dicts in ``Connection.http2["settings"]``,
``TlsInfo.certificate``, the list ``TlsInfo.alpn_offered``): nothing in netdiag changes a
record's facts once its connection is finished, and nothing may, as for
:data:`netdiag.protocols.http2.SHARED_HEADERS_MAX`'s shared header fields. A fact
that cannot be a dictionary key (a list inside a certificate's facts) stays the
connection's own.
"""

from __future__ import annotations

from typing import Any, Final

from netdiag.records import Connection

SHARED_FACTS_MAX: Final = 1 << 12
"""Distinct facts a :class:`FactSharer` keeps; once it holds this many, later distinct
ones stay each connection's own (hostile traffic with a new certificate per connection
grows the records, not this table)."""


class FactSharer:
    """Shares equal facts among the connections of one analysis (see the module
    docstring)."""

    def __init__(self) -> None:
        self._seen: dict[Any, Any] = {}
        """The first copy of each fact, by its kind and value."""

    def __len__(self) -> int:
        return len(self._seen)

    def _one(self, key: Any, value: Any) -> Any:
        """The copy kept for ``key``, else ``value`` (kept for ``key`` while there is
        room)."""
        seen = self._seen
        try:
            got = seen.get(key)
        except TypeError:  # a part of the fact is not hashable: it stays its own
            return value
        if got is not None:
            return got
        if len(seen) < SHARED_FACTS_MAX:
            seen[key] = value
        return value

    def connection(self, conn: Connection) -> None:
        """Give ``conn`` the copies kept of its HTTP/2 settings, its certificate facts
        and its offered ALPN list where an earlier connection had equal ones."""
        h2 = conn.http2
        if h2 is not None:
            settings = h2.get("settings")
            if type(settings) is dict and len(settings) == 2:
                client, server = settings.get("client"), settings.get("server")
                if type(client) is dict and type(server) is dict:
                    # the sides' order too: a dict written in another order is another
                    key = ("settings", tuple(settings), tuple(client.items()),
                           tuple(server.items()))
                    h2["settings"] = self._one(key, settings)
        tls = conn.tls
        if tls is not None:
            cert = tls.certificate
            if cert is not None:
                tls.certificate = self._one(("certificate", tuple(cert.items())), cert)
            alpn = tls.alpn_offered
            if alpn:
                tls.alpn_offered = self._one(("alpn", tuple(alpn)), alpn)
