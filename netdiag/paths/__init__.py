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

from netdiag.paths.apply import PathsAnalysis, analyze_paths, annotate_document, apply_paths
from netdiag.paths.attribute import attribute
from netdiag.paths.profile import Match, PathDef, Profile, Rule, load_profile, parse_profile

__all__ = [
    "Match",
    "PathDef",
    "PathsAnalysis",
    "Profile",
    "Rule",
    "analyze_paths",
    "annotate_document",
    "apply_paths",
    "attribute",
    "load_profile",
    "parse_profile",
]
