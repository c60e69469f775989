"""The one rich console for diagnostics: stderr, so stdout stays the report's."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def stderr_console() -> Any:
    """A rich Console writing to standard error."""
    from rich.console import Console

    return Console(stderr=True)
