"""Which paths a report shows one by one, when there are many.

Without a profile every server is a path of its own: a capture of a host that talked
to thousands of servers gave the terminal a latency budget table per one or two paths
and the HTML page a histogram per path. The terminal (``netdiag report``, ``netdiag
paths``) and the page show :data:`PATHS_SHOWN` of them and count the rest in one
sentence; JSON, CSV and Parquet keep every path. One rule for both, so that they show
the same paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

PATHS_SHOWN = 12
"""Most paths shown one by one (in the attribution line, the latency budget, the hop
trees, the load over time and the page's charts)."""


class PathSize(NamedTuple):
    """What the choice reads of a path."""

    name: str
    inferred: bool
    """No profile names it."""
    multi_hop: bool
    """It has hops behind its client-facing one (a proxy's path)."""
    requests: int
    """Its client requests."""


def shown_names(paths: Sequence[PathSize], limit: int = PATHS_SHOWN) -> set[str]:
    """The names of the paths shown: all of them when at most ``limit``, else those a
    profile names, then those through a proxy, then those with the most client
    requests (ties by name), ``limit`` in all."""
    if len(paths) <= limit:
        return {p.name for p in paths}
    ranked = sorted(paths, key=lambda p: (p.inferred, not p.multi_hop, -p.requests, p.name))
    return {p.name for p in ranked[:limit]}


def not_shown_sentence(paths: Sequence[PathSize], shown: set[str]) -> str | None:
    """The sentence that counts the paths :func:`shown_names` left out, and their
    client requests (None when it left none out)."""
    rest = [p for p in paths if p.name not in shown]
    if not rest:
        return None
    requests = sum(p.requests for p in rest)
    return (f"{len(rest):,} more path{'s' if len(rest) != 1 else ''} with {requests:,} "
            f"client request{'s' if requests != 1 else ''} not shown: the {len(shown)} "
            "shown are those a profile names, through a proxy, or with the most requests; "
            "--format json has every path")
