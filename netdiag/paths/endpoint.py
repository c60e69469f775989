"""End points as the records write them (``"ip:port"``, ``"[v6]:port"``), split.

Compiled with the path analysis (:data:`netdiag._core.COMPILED_MODULES`): it asks for the
same few thousand end points hundreds of thousands of times, and a call from compiled
code into an interpreted function cost more than the split itself.
"""

from __future__ import annotations

_SPLIT_MEMO: dict[str, tuple[str, int | None]] = {}
_SPLIT_MEMO_SIZE = 1 << 16
"""End points :func:`split_endpoint` remembers; emptied when full."""


def split_endpoint(ep: str) -> tuple[str, int | None]:
    """``"ip:port"`` / ``"[v6]:port"`` -> (ip, port); a bare address -> (ip, None)."""
    got = _SPLIT_MEMO.get(ep)
    if got is None:
        if len(_SPLIT_MEMO) >= _SPLIT_MEMO_SIZE:
            _SPLIT_MEMO.clear()
        got = _SPLIT_MEMO[ep] = _split_endpoint(ep)
    return got


def _split_endpoint(ep: str) -> tuple[str, int | None]:
    if ep.startswith("["):
        host, _, rest = ep[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() else None
    if ep.count(":") == 1:
        host, _, port = ep.partition(":")
        return host, int(port) if port.isdigit() else None
    return ep, None
