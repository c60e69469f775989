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
