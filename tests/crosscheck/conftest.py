"""Session tally of the tshark cross-checks, printed at the end of the run.

Each test in test_vs_tshark.py records, per capture and kind (DNS, TCP, TLS), how many
items it compared and how many agreed; the terminal summary prints the totals as
``crosscheck: DNS a/b, TCP c/d, TLS e/f agreed`` (plus what was skipped, and why).
"""

from __future__ import annotations

from typing import Any

import pytest

TALLY_KEY = pytest.StashKey[dict[tuple[str, str], dict[str, Any]]]()
KINDS = (("dns", "DNS"), ("tcp", "TCP"), ("tls", "TLS"))


def _tally(config: pytest.Config) -> dict[tuple[str, str], dict[str, Any]]:
    if TALLY_KEY not in config.stash:
        config.stash[TALLY_KEY] = {}
    return config.stash[TALLY_KEY]


@pytest.fixture
def crosscheck_tally(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(capture, kind): {"agreed", "compared", "skipped", "skip_reasons"}}`` for the session."""
    return _tally(request.config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    tally = config.stash.get(TALLY_KEY, None)
    if not tally:
        return
    parts = []
    skipped = []
    for kind, label in KINDS:
        rows = [v for (_, k), v in tally.items() if k == kind]
        agreed = sum(r["agreed"] for r in rows)
        compared = sum(r["compared"] for r in rows)
        parts.append(f"{label} {agreed}/{compared}")
        n_skip = sum(r["skipped"] for r in rows)
        if n_skip:
            skipped.append(f"{label} {n_skip}")
    captures = len({c for c, _ in tally})
    line = f"crosscheck: {', '.join(parts)} agreed ({captures} captures)"
    if skipped:
        line += f"; not comparable: {', '.join(skipped)}"
    terminalreporter.write_sep("-", "tshark cross-check")
    terminalreporter.write_line(line)
    for (capture, kind), row in sorted(tally.items()):
        for reason in row["skip_reasons"]:
            terminalreporter.write_line(f"  skipped {capture} {kind}: {reason}")
