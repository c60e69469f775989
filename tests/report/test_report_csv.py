"""CSV export: one file per record type, stable columns, RFC 4180 round trip."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from report_docs import with_paths

from netdiag.report.csv_out import (
    CONNECTION_COLUMNS,
    DNS_COLUMNS,
    FINDING_COLUMNS,
    REQUEST_COLUMNS,
    write_csv,
)

NAMES = ["dns.csv", "connections.csv", "requests.csv", "findings.csv", "summary.csv"]


def read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        rows = list(r)
        return list(r.fieldnames or []), rows


def cell(v: Any) -> str:
    """What a JSON value becomes in a cell (the module's documented encoding)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("fixture", ["doc_keys", "doc_nokeys"])
def test_one_file_per_record_type_with_every_record(fixture: str, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    doc = request.getfixturevalue(fixture)
    paths = write_csv(doc, tmp_path / "out")
    assert [p.name for p in paths] == NAMES
    assert all(p.parent == tmp_path / "out" and p.is_file() for p in paths)
    tables = {p.name: read(p) for p in paths}
    n_requests = sum(len(c["requests"]) for c in doc["connections"])
    assert len(tables["dns.csv"][1]) == len(doc["dns"]) == 7
    assert len(tables["connections.csv"][1]) == len(doc["connections"]) == 7
    assert len(tables["requests.csv"][1]) == n_requests == 16
    assert len(tables["findings.csv"][1]) == len(doc["findings"])
    keys = [r["key"] for r in tables["summary.csv"][1]]
    assert len(keys) == len(set(keys))
    assert keys[:2] == ["contract", "netdiag_version"]
    for k in ("capture.packets", "dns.latency_ms.p50", "http.reuse_rate", "http.ttfb_ms.p99"):
        assert k in keys


def test_values_round_trip(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    paths = dict(zip(NAMES, write_csv(doc_keys, tmp_path), strict=True))
    header, rows = read(paths["dns.csv"])
    assert header == list(DNS_COLUMNS)
    for d, row in zip(doc_keys["dns"], rows, strict=True):
        assert row == {k: cell(d.get(k)) for k in header}
        assert float(row["ts"]) == d["ts"]                    # full precision
        assert json.loads(row["answers"]) == d["answers"]

    header, rows = read(paths["connections.csv"])
    assert header[:len(CONNECTION_COLUMNS)] == list(CONNECTION_COLUMNS)
    for c, row in zip(doc_keys["connections"], rows, strict=True):
        assert row["id"] == c["id"]
        assert row["requests"] == str(len(c["requests"]))
        assert row["handshake_rtt_ms"] == cell(c["handshake_rtt_ms"])
        tls = c["tls"] or {}
        assert row["tls.sni"] == cell(tls.get("sni"))
        assert row["tls.handshake_ms"] == cell(tls.get("handshake_ms"))
        assert row["tls.certificate.subject"] == cell((tls.get("certificate") or {})
                                                      .get("subject"))
        assert row["path.name"] == ""
    assert "tls" not in header and "path" not in header      # only their flattened columns
    assert any(h.startswith("http2.settings.client.") for h in header)

    header, rows = read(paths["requests.csv"])
    assert header[:len(REQUEST_COLUMNS)] == list(REQUEST_COLUMNS)
    flat = [(c["id"], i, r) for c in doc_keys["connections"]
            for i, r in enumerate(c["requests"])]
    for (cid, i, r), row in zip(flat, rows, strict=True):
        assert (row["connection"], row["index"]) == (cid, str(i))
        for k in ("ts", "method", "path", "status", "ttfb_ms", "estimated", "stream_id"):
            assert row[k] == cell(r[k])
        assert json.loads(row["request_headers"]) == r["request_headers"]
    sse = [row for row in rows if row["path"] == "/v1/stream"]
    assert json.loads(sse[0]["chunk_gaps_ms"]) == next(
        r for _, _, r in flat if r["path"] == "/v1/stream")["chunk_gaps_ms"]

    header, rows = read(paths["findings.csv"])
    assert header == list(FINDING_COLUMNS)
    for f, row in zip(doc_keys["findings"], rows, strict=True):
        assert row["title"] == f["title"] and json.loads(row["evidence"]) == f["evidence"]

    _, rows = read(paths["summary.csv"])
    kv = {r["key"]: r["value"] for r in rows}
    s = doc_keys["summary"]
    assert float(kv["http.ttfb_ms.p50"]) == s["http"]["ttfb_ms"]["p50"]
    assert kv["tls.versions.TLS 1.3"] == str(s["tls"]["versions"]["TLS 1.3"])
    assert json.loads(kv["capture.files"]) == doc_keys["capture"]["files"]


def test_header_does_not_depend_on_the_data(doc_keys: dict[str, Any],
                                             doc_nokeys: dict[str, Any],
                                             tmp_path: Path) -> None:
    a = write_csv(doc_keys, tmp_path / "a")
    b = write_csv(doc_nokeys, tmp_path / "b")
    empty = write_csv({}, tmp_path / "c")
    for pa, pb, pc in zip(a, b, empty, strict=True):
        if pa.name in ("connections.csv", "requests.csv"):
            known = CONNECTION_COLUMNS if pa.name == "connections.csv" else REQUEST_COLUMNS
            for p in (pa, pb, pc):
                assert read(p)[0][:len(known)] == list(known)
        elif pa.name != "summary.csv":
            assert read(pa)[0] == read(pb)[0] == read(pc)[0]
    assert read(empty[0]) == (list(DNS_COLUMNS), [])


def test_paths_and_chains_are_flattened(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    doc = with_paths(doc_keys)
    doc["connections"][0]["requests"][0]["caused_by"] = {"connection": "C9", "request": 2}
    paths = dict(zip(NAMES, write_csv(doc, tmp_path), strict=True))
    _, conns = read(paths["connections.csv"])
    assert conns[0]["path.name"] == "ROC" and conns[0]["path.hop"] == "edge"
    assert json.loads(conns[0]["path.evidence"]) == doc["connections"][0]["path"]["evidence"]
    _, reqs = read(paths["requests.csv"])
    assert (reqs[0]["caused_by.connection"], reqs[0]["caused_by.request"]) == ("C9", "2")
    assert reqs[1]["caused_by.connection"] == ""
    _, summary = read(paths["summary.csv"])
    kv = {r["key"]: r["value"] for r in summary}
    assert kv["paths.ROC.phases.hops.edge.own_ms.p50"] == "3.2"
    assert kv["path_comparison.0.supported"] == "true"


HOSTILE = 'a,b "quoted"\r\nnext line; =cmd|\' /C calc\'!A0'


def test_rfc4180_quoting_round_trips_hostile_text(doc_keys: dict[str, Any],
                                                  tmp_path: Path) -> None:
    doc_keys["dns"][0]["qname"] = HOSTILE
    doc_keys["connections"][0]["tls"]["sni"] = HOSTILE
    doc_keys["connections"][0]["requests"][0]["path"] = HOSTILE
    doc_keys["findings"][0]["detail"] = HOSTILE
    paths = dict(zip(NAMES, write_csv(doc_keys, tmp_path), strict=True))
    assert read(paths["dns.csv"])[1][0]["qname"] == HOSTILE
    assert read(paths["connections.csv"])[1][0]["tls.sni"] == HOSTILE
    assert read(paths["requests.csv"])[1][0]["path"] == HOSTILE
    assert read(paths["findings.csv"])[1][0]["detail"] == HOSTILE
    raw = paths["dns.csv"].read_bytes()
    assert raw.count(b"\r\n") >= 8 and not raw.startswith(b"\xef\xbb\xbf")
    assert b'"a,b ""quoted""\r\nnext line;' in raw


def test_excel_safe_defuses_formulas_but_not_numbers(doc_keys: dict[str, Any],
                                                     tmp_path: Path) -> None:
    doc_keys["dns"][0]["qname"] = "=HYPERLINK(\"x\")"
    doc_keys["dns"][0]["latency_ms"] = -1.5
    p = write_csv(doc_keys, tmp_path, excel_safe=True)[0]
    row = read(p)[1][0]
    assert row["qname"] == "'=HYPERLINK(\"x\")"
    assert row["latency_ms"] == "-1.5"
