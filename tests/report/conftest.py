"""Contract documents from the real pipeline on the shipped capture, for the report tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from report_docs import ANTHO, KEYS, strip_secrets

from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog


def _run(capture: Path, keylog: KeyLog | None) -> tuple[CollectingSink, dict[str, Any]]:
    sink = CollectingSink()
    result = analyze([str(capture)], sink, Options(keylog=keylog))
    return sink, sink.document(result, headers=True)


@pytest.fixture(scope="session")
def antho_keys_run() -> tuple[CollectingSink, dict[str, Any]]:
    return _run(ANTHO, KeyLog.from_file(KEYS))


@pytest.fixture(scope="session")
def antho_nokeys_run(tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[CollectingSink, dict[str, Any]]:
    # the shipped capture embeds its keys: read a copy of its packets without them
    bare = strip_secrets(ANTHO, tmp_path_factory.mktemp("nokeys") / "antho-nokeys.pcapng")
    sink, doc = _run(bare, None)
    assert doc["summary"]["http"]["estimated"] is True
    assert not any((c["tls"] or {}).get("decrypted") for c in doc["connections"])
    return sink, doc


@pytest.fixture
def doc_keys(antho_keys_run: tuple[CollectingSink, dict[str, Any]]) -> dict[str, Any]:
    """Decrypted with the key log: exact requests, decoded headers."""
    return copy.deepcopy(antho_keys_run[1])


@pytest.fixture
def doc_nokeys(antho_nokeys_run: tuple[CollectingSink, dict[str, Any]]) -> dict[str, Any]:
    """No key log, and none embedded: requests inside TLS estimated from record timing."""
    return copy.deepcopy(antho_nokeys_run[1])
