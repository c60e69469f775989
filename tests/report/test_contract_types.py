"""netdiag/contract.py says what the document holds: its TypedDicts' keys are the keys of
the report of the shipped capture, at every level they type."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from netdiag import contract
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink

ANTHO = Path(__file__).resolve().parents[2] / "captures" / "antho.pcapng"


def _check(value: Any, kind: Any, where: str) -> None:
    if typing.is_typeddict(kind):
        hints = typing.get_type_hints(kind)
        assert set(value) == set(hints), (where, set(value) ^ set(hints))
        for key, hint in hints.items():
            _check(value[key], hint, f"{where}.{key}")


def test_typed_contract_matches_the_document() -> None:
    sink = CollectingSink()
    doc = sink.document(analyze([str(ANTHO)], sink, Options()))
    _check(doc, contract.Document, "document")
    assert doc["summary"]["http"]["ttfb_ms"]["count"] > 0  # a typed level was reached


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
            _check(e["ttfb_ms"], contract.Percentiles, "interval.ttfb_ms")
            seen += 1
    assert seen > 0
    knee_keys = set(typing.get_type_hints(contract.KneeJson))
    for k in doc["knees"]:
        assert set(k) == knee_keys
