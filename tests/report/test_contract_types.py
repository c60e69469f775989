"""netdiag/contract.py says what the document holds: its TypedDicts' keys are the keys of
the report of the shipped capture, at every level they type."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest

from netdiag import contract
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
ANTHO = CAPTURES / "antho.pcapng"
H3 = CAPTURES / "h3.pcapng"


def _check(value: Any, kind: Any, where: str, seen: set[str]) -> None:
    """``value`` has every required key of ``kind``, no key it does not name, and so on
    down (into lists of typed dicts too); ``seen`` collects the typed dicts' names."""
    if typing.is_typeddict(kind):
        seen.add(kind.__name__)
        hints = typing.get_type_hints(kind)
        # (contract.py's postponed annotations hide NotRequired from __required_keys__)
        extras = typing.get_type_hints(kind, include_extras=True)
        required = {k for k, h in extras.items()
                    if typing.get_origin(h) is not typing.NotRequired}
        assert required <= set(value) <= set(hints), (where, set(value) ^ set(hints))
        for key in value:
            _check(value[key], hints[key], f"{where}.{key}", seen)
    elif typing.get_origin(kind) is list and isinstance(value, list):
        (item,) = typing.get_args(kind)
        for i, v in enumerate(value):
            _check(v, item, f"{where}[{i}]", seen)
    elif typing.get_origin(kind) in (typing.Union, types.UnionType) and value is not None:
        for arm in typing.get_args(kind):
            if typing.is_typeddict(arm) and isinstance(value, dict):
                _check(value, arm, where, seen)


@pytest.mark.parametrize("capture", [ANTHO, H3], ids=["antho", "h3"])
def test_typed_contract_matches_the_document(capture: Path) -> None:
    sink = CollectingSink()
    doc = sink.document(analyze([str(capture)], sink, Options()))
    seen: set[str] = set()
    _check(doc, contract.Document, "document", seen)
    assert doc["summary"]["http"]["ttfb_ms"]["count"] > 0  # a typed level was reached
    if capture == H3:  # the QUIC additions were there to be checked
        quic = [c for c in doc["connections"] if c.get("transport") == "udp"]
        assert quic and all(set(c) >= {"transport", "quic"} for c in quic)
        for c in quic:
            _check(c["quic"], contract.QuicJson, f"connection {c['id']}.quic", seen)
        assert {"QuicSummary", "QuicJson", "ZeroRttJson"} <= seen, seen


def test_typed_timeseries_matches_the_document() -> None:
    """``timeseries`` and its intervals, as the paths analysis writes them."""
    from netdiag.paths.apply import apply_paths
    from netdiag.paths.profile import load_profile

    sink = CollectingSink()
    doc: dict[str, Any] = dict(sink.document(analyze([str(ANTHO)], sink, Options())))
    profile = load_profile(str(ANTHO.with_name("antho.paths.toml")))
    apply_paths(doc, sink.connections, sink.dns_records, profile)
    ts = doc["timeseries"]
    hints = typing.get_type_hints(contract.TimeseriesJson)
    assert set(ts) <= set(hints) and {"interval_ms", "start_ts", "paths"} <= set(ts)
    interval_keys = set(typing.get_type_hints(contract.IntervalJson))
    seen = 0
    for entries in ts["paths"].values():
        for e in entries:
            assert set(e) <= interval_keys and interval_keys - {"hops"} <= set(e)
            _check(e["ttfb_ms"], contract.Percentiles, "interval.ttfb_ms", set())
            seen += 1
    assert seen > 0
    knee_keys = set(typing.get_type_hints(contract.KneeJson))
    for k in doc["knees"]:
        assert set(k) == knee_keys
