"""The lab's one error type."""

from __future__ import annotations

from netdiag.errors import NetdiagError


class LabError(NetdiagError):
    """The lab could not start, run its load or stop as intended (one clear line)."""

    exit_code = 1
