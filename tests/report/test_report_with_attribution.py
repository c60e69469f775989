"""The three formatters on a document whose paths the real path attribution filled
(``netdiag.paths.apply.apply_paths``, without a profile: inferred paths)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from report_docs import ANTHO, KEYS

from netdiag.pipeline import Options, analyze
from netdiag.report.csv_out import write_csv
from netdiag.report.har import build_har
from netdiag.report.html import render_html
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

apply = pytest.importorskip("netdiag.paths.apply")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    sink = CollectingSink()
    result = analyze([str(ANTHO)], sink, Options(keylog=KeyLog.from_file(KEYS)))
    d = sink.document(result, headers=True)
    apply.apply_paths(d, sink.connections, sink.dns_records, None)
    return d


def test_attributed_document_in_every_format(doc: dict[str, Any], tmp_path: Path) -> None:
    paths = doc["summary"]["paths"]
    assert len(paths) == 2
    har = build_har(doc)
    schema = json.loads((Path(__file__).parent / "har12.schema.json").read_text())
    jsonschema.validate(har, schema, cls=jsonschema.Draft7Validator)
    names = {e["_netdiag"]["path"]["name"] for e in har["log"]["entries"]}
    assert names == set(paths)

    out = render_html(doc)
    assert "<h2>Latency budget per path</h2>" in out
    assert out.count('aria-label="histogram of time to first byte') == len(paths)
    assert "http://" not in out and "https://" not in out

    files = write_csv(doc, tmp_path)
    conns = files[1].read_text(encoding="utf-8")
    for name in paths:
        assert name in conns
