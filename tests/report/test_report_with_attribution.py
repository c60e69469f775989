"""The three formatters on a document whose paths the real path attribution filled
(``netdiag.paths.apply.apply_paths``): with the lab's profile, and without a profile
(inferred paths)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from report_docs import ANTHO, KEYS, ledger, profile

from netdiag.pipeline import Options, analyze
from netdiag.report.csv_out import write_csv
from netdiag.report.har import build_har
from netdiag.report.html import render_html
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

apply = pytest.importorskip("netdiag.paths.apply")


def expected_paths(with_profile: bool) -> set[str]:
    """The paths the attribution should find: the profile's, or without one (docs/
    profiles.md) ``via SERVER`` for the client-facing proxy (the ROC edge) and
    ``direct SERVER`` for each server the DPF clients reach directly."""
    if with_profile:
        return {p.name for p in profile().paths}
    lg = ledger()
    servers: dict[str, set[str]] = {c["path"]: set() for c in lg["connection_log"]}
    for c in lg["connection_log"]:
        servers[c["path"]].add(c["server"])
    assert servers["ROC"] == {lg["servers"]["edge"]["address"]}
    return ({f"via {s}" for s in servers["ROC"]}
            | {f"direct {s}" for s in servers["DPF"]})


@pytest.fixture(scope="module", params=[True, False], ids=["profile", "inferred"])
def attributed(request: pytest.FixtureRequest) -> tuple[bool, dict[str, Any]]:
    """(whether the profile was used, the document attributed with it or without)."""
    sink = CollectingSink()
    result = analyze([str(ANTHO)], sink, Options(keylog=KeyLog.from_file(KEYS)))
    d = sink.document(result, headers=True)
    apply.apply_paths(d, sink.connections, sink.dns_records,
                      profile() if request.param else None)
    return request.param, d


def test_attributed_document_in_every_format(attributed: tuple[bool, dict[str, Any]],
                                             tmp_path: Path) -> None:
    with_profile, doc = attributed
    paths = doc["summary"]["paths"]
    assert set(paths) == expected_paths(with_profile)
    assert all(p["inferred"] is not with_profile for p in paths.values())
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
