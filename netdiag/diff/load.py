"""The two sides of ``netdiag diff``: a capture (analysed now) or a saved JSON report."""

from __future__ import annotations

import json
import math
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
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as e:
        raise InputError(f"{path} is not a netdiag report: it holds the number {e}, which "
                         "no report writes") from e
    except RecursionError as e:
        raise InputError(f"{path} is not a netdiag report: nested too deep") from e
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
    wrong = _shape_error(doc)
    if wrong is not None:
        raise InputError(f"{path} is not a netdiag report: {wrong}")
    return doc


class _NotFinite(ValueError):
    """A JSON number that is not finite (NaN, Infinity, or a literal beyond a float)."""


def _no_constant(name: str) -> float:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise _NotFinite(text if len(text) <= 40 else text[:40] + "...")
    return x


def _is_count(x: Any) -> bool:
    return x is None or (isinstance(x, int | float) and not isinstance(x, bool))


def _shape_error(doc: dict[str, Any]) -> str | None:
    """What in ``doc`` is not where a report puts it, for every field ``diff`` reads."""
    for key in ("connections", "dns", "findings"):
        items = doc.get(key)
        if items is not None and not isinstance(items, list):
            return f"`{key}` is not a list"
        if items is not None and any(not isinstance(x, dict) for x in items):
            return f"an item of `{key}` is not an object"
    for c in doc.get("connections") or []:
        reqs = c.get("requests")
        if reqs is not None and not isinstance(reqs, list):
            return f"`requests` of connection {str(c.get('id'))[:40]} is not a list"
        for field in ("tls", "path"):
            if c.get(field) is not None and not isinstance(c.get(field), dict):
                return f"`{field}` of connection {str(c.get('id'))[:40]} is not an object"
    cap = doc.get("capture")
    if cap is not None and not isinstance(cap, dict):
        return "`capture` is not an object"
    if isinstance(cap, dict) and cap.get("files") is not None and \
            not isinstance(cap.get("files"), list):
        return "`capture.files` is not a list"
    for name, part in doc["summary"].items():
        if part is not None and not isinstance(part, dict | list | str | int | float):
            return f"`summary.{name}` is not an object"
    http = doc["summary"].get("http")
    if isinstance(http, dict):
        for key in ("requests", "connections", "reuse_rate"):
            if not _is_count(http.get(key)):
                return f"`summary.http.{key}` is not a number"
    return None


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
