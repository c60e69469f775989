"""The two sides of ``netdiag diff``: a capture (analysed now) or a saved JSON report."""

from __future__ import annotations

import json
from typing import Any

from netdiag.errors import InputError


def looks_like_json(path: str) -> bool:
    """A ``.json`` name, or a file whose first non-blank byte is ``{``."""
    if path.lower().endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    return head.startswith(b"{")


def load_report(path: str) -> dict[str, Any]:
    """A document written by ``netdiag report --format json`` (either engine)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not a JSON report (not UTF-8 text)") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        if first.startswith("{") and '"type"' in first:
            raise InputError(f"{path} is JSON Lines; diff needs `netdiag report "
                             "--format json`") from e
        raise InputError(f"{path} is not valid JSON: {e.msg} (line {e.lineno})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict) \
            or "connections" not in doc:
        raise InputError(f"{path} is JSON but not a netdiag report (expected the output of "
                         "`netdiag report --format json`)")
    return doc


def load_side(path: str, keylog: Any = None, dns_ports: frozenset[int] = frozenset({53}),
              profile: Any = None) -> dict[str, Any]:
    """The contract document of ``path``: read from a JSON report, or, for a capture,
    built as ``netdiag report --format json`` builds it (netdiag's engine, ``keylog`` a
    ``KeyLog`` or None, then paths from ``profile`` or inferred)."""
    if looks_like_json(path):
        return load_report(path)
    from netdiag.analysis.findings import Thresholds
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink

    sink = CollectingSink()
    options = Options(keylog=keylog, dns_ports=dns_ports)
    result = analyze([path], sink, options)
    doc = sink.document(result)
    try:
        from netdiag.paths.apply import apply_paths
    except ImportError:  # pragma: no cover - paths are part of netdiag
        return doc
    apply_paths(doc, sink.connections, sink.dns_records, profile, Thresholds())
    return doc
