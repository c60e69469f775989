"""What several commands share: where the TLS keys come from, how a result is printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from netdiag.console import stderr_console


def keylog_paths(paths: tuple[str, ...] | list[str], doing: str = "reporting") -> list[str]:
    """The key log files to use: those named, else ``$SSLKEYLOGFILE``'s when it exists
    (a warning says so when it names a missing file; ``doing`` completes the sentence)."""
    if paths:
        return list(paths)
    env = os.environ.get("SSLKEYLOGFILE")
    if not env:
        return []
    if not os.path.exists(env):
        stderr_console().print(f"[yellow]warning:[/] SSLKEYLOGFILE names {env}, which does "
                               f"not exist; {doing} without keys", highlight=False)
        return []
    return [env]


def load_keylogs(paths: tuple[str, ...] | list[str]) -> Any:
    """The key logs of :func:`keylog_paths`, merged into one ``KeyLog``; None without any."""
    from netdiag.tls.keylog import KeyLog

    files = keylog_paths(paths)
    if not files:
        return None
    merged = KeyLog()
    for p in files:
        merged.merge(KeyLog.from_file(p))
    return merged


def print_result(fmt: str, result: Any, render: Callable[[Any, Any], None]) -> None:
    """``--format json``: the result's JSON on stdout; else ``render`` into a rich console
    that is at least 140 columns wide when stdout is not a terminal."""
    if fmt == "json":
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))
    render(result, console)
