"""Contract documents from the real pipeline on the shipped capture, for the report tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from report_docs import ANTHO, KEYS

from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog


def _run(keys: bool) -> tuple[CollectingSink, dict[str, Any]]:
    sink = CollectingSink()
    opts = Options(keylog=KeyLog.from_file(KEYS) if keys else None)
    result = analyze([str(ANTHO)], sink, opts)
    return sink, sink.document(result, headers=True)


@pytest.fixture(scope="session")
def antho_keys_run() -> tuple[CollectingSink, dict[str, Any]]:
    return _run(True)


@pytest.fixture(scope="session")
def antho_nokeys_run() -> tuple[CollectingSink, dict[str, Any]]:
    return _run(False)


@pytest.fixture
def doc_keys(antho_keys_run: tuple[CollectingSink, dict[str, Any]]) -> dict[str, Any]:
    """Decrypted with the key log: exact requests, decoded headers."""
    return copy.deepcopy(antho_keys_run[1])


@pytest.fixture
def doc_nokeys(antho_nokeys_run: tuple[CollectingSink, dict[str, Any]]) -> dict[str, Any]:
    """No key log: requests estimated from TLS record timing."""
    return copy.deepcopy(antho_nokeys_run[1])
