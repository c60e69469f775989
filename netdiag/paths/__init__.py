"""Paths: which named path and hop each connection belongs to, and where the time goes.

* :mod:`netdiag.paths.profile` reads a path profile (``docs/profiles.md``) and matches
  connections and addresses against it;
* :mod:`netdiag.paths.chains` links each client request to the upstream requests and
  token-store commands it caused, and splits its wait into the time of each hop;
* :mod:`netdiag.paths.attribute` gives every connection its ``path`` (profile match,
  else inferred from the chains, else None);
* :mod:`netdiag.paths.budget` builds the latency budget per path and compares paths
  with a bootstrap confidence interval;
* :mod:`netdiag.paths.findings` turns them into findings;
* :mod:`netdiag.paths.apply` puts it all together for ``netdiag report --profile``
  and ``netdiag paths``.

Everything here is a pure function of records: nothing prints, reads the clock or
touches a socket.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "PathsAnalysis": "apply", "analyze_paths": "apply", "annotate_document": "apply",
    "apply_paths": "apply", "attribute": "attribute", "Match": "profile", "PathDef": "profile",
    "Profile": "profile", "Rule": "profile", "load_profile": "profile",
    "parse_profile": "profile",
}
"""The package's names and their modules, imported at first use: reading a profile
(``--format jsonl`` does) then does not load the linker, budgets and findings."""

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
