"""CSV export: one file per record type, stable columns, RFC 4180 round trip."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from report_docs import lab_requests, ledger, profile, with_paths

from netdiag.report.csv_out import (
    CONNECTION_COLUMNS,
    DNS_COLUMNS,
    FINDING_COLUMNS,
    REQUEST_COLUMNS,
    flatten,
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
    # every record, Redis commands and requests estimated without keys included: as many
    # as the lab's ledger says it made
    n_requests = sum(len(c["requests"]) for c in doc["connections"])
    assert len(tables["dns.csv"][1]) == len(doc["dns"]) == ledger()["dns_queries"]
    assert (len(tables["connections.csv"][1]) == len(doc["connections"])
            == sum(ledger()["tcp_connections"].values()))
    assert len(tables["requests.csv"][1]) == n_requests == lab_requests()
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
        assert row["request_headers"] == cell(r["request_headers"])
        if r["request_headers"] is None:         # Redis commands have no headers: empty
            assert r["protocol"] == "resp" and row["request_headers"] == ""
        else:                                    # compact JSON
            assert json.loads(row["request_headers"]) == r["request_headers"]
    assert {row["request_headers"] == "" for row in rows} == {True, False}
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
    # the first connection on a path with more than one request (its row and its rows
    # in requests.csv are found by position: one row per record, in document order)
    ci, conn = next((i, c) for i, c in enumerate(doc["connections"])
                    if c["path"] and len(c["requests"]) > 1)
    conn["requests"][0]["caused_by"] = {"connection": "C9", "request": 2}
    first = sum(len(c["requests"]) for c in doc["connections"][:ci])
    paths = dict(zip(NAMES, write_csv(doc, tmp_path), strict=True))
    _, conns = read(paths["connections.csv"])
    assert conns[ci]["id"] == conn["id"]
    assert (conns[ci]["path.name"], conns[ci]["path.hop"]) == (conn["path"]["name"],
                                                               conn["path"]["hop"])
    assert conns[ci]["path.name"] in {p.name for p in profile().paths}
    assert json.loads(conns[ci]["path.evidence"]) == conn["path"]["evidence"]
    _, reqs = read(paths["requests.csv"])
    assert (reqs[first]["connection"], reqs[first]["index"]) == (conn["id"], "0")
    assert (reqs[first]["caused_by.connection"], reqs[first]["caused_by.request"]) == (
        "C9", "2")
    assert (reqs[first + 1]["connection"], reqs[first + 1]["index"]) == (conn["id"], "1")
    assert reqs[first + 1]["caused_by.connection"] == ""
    _, summary = read(paths["summary.csv"])
    kv = {r["key"]: r["value"] for r in summary}
    assert kv["paths.ROC.phases.hops.edge.own_ms.p50"] == "3.2"
    assert kv["path_comparison.0.supported"] == "true"


HOSTILE = 'a,b "quoted"\r\nnext line; =cmd|\' /C calc\'!A0'


def test_rfc4180_quoting_round_trips_hostile_text(doc_keys: dict[str, Any],
                                                  tmp_path: Path) -> None:
    # the first TLS connection with a request, and that request's row in requests.csv
    ci, conn = next((i, c) for i, c in enumerate(doc_keys["connections"])
                    if c["tls"] and c["requests"])
    ri = sum(len(c["requests"]) for c in doc_keys["connections"][:ci])
    doc_keys["dns"][0]["qname"] = HOSTILE
    conn["tls"]["sni"] = HOSTILE
    conn["requests"][0]["path"] = HOSTILE
    doc_keys["findings"][0]["detail"] = HOSTILE
    paths = dict(zip(NAMES, write_csv(doc_keys, tmp_path), strict=True))
    assert read(paths["dns.csv"])[1][0]["qname"] == HOSTILE
    assert read(paths["connections.csv"])[1][ci]["tls.sni"] == HOSTILE
    assert read(paths["requests.csv"])[1][ri]["path"] == HOSTILE
    assert read(paths["findings.csv"])[1][0]["detail"] == HOSTILE
    raw = paths["dns.csv"].read_bytes()
    assert raw.count(b"\r\n") >= len(doc_keys["dns"]) + 2 and not raw.startswith(
        b"\xef\xbb\xbf")
    assert b'"a,b ""quoted""\r\nnext line;' in raw


def test_excel_safe_defuses_formulas_but_not_numbers(doc_keys: dict[str, Any],
                                                     tmp_path: Path) -> None:
    doc_keys["dns"][0]["qname"] = "=HYPERLINK(\"x\")"
    doc_keys["dns"][0]["latency_ms"] = -1.5
    p = write_csv(doc_keys, tmp_path, excel_safe=True)[0]
    row = read(p)[1][0]
    assert row["qname"] == "'=HYPERLINK(\"x\")"
    assert row["latency_ms"] == "-1.5"


def test_a_lazy_document_renders_each_connection_once(doc_keys: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """``netdiag report --format csv`` hands a document whose connections are made as
    they are read (``Records``): both tables come from one pass, and the files are those
    of the plain document."""
    from netdiag.report.json_out import Records

    rendered: list[int] = []

    def render(i: int) -> dict[str, Any]:
        rendered.append(i)
        return json.loads(json.dumps(doc_keys["connections"][i]))

    conns = doc_keys["connections"]
    lazy = dict(doc_keys, connections=Records(list(range(len(conns))), render))
    plain = write_csv(doc_keys, tmp_path / "plain")
    made = write_csv(lazy, tmp_path / "lazy")
    assert sorted(rendered) == list(range(len(conns)))  # each once
    for a, b in zip(plain, made, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()


def test_text_of_a_str_subclass_is_defused_too(tmp_path: Path) -> None:
    class Text(str):
        pass

    doc = {"dns": [{"qname": Text("=HYPERLINK(1)"), "id": 1, "ok": True, "x": 1.5}],
           "connections": [], "findings": []}
    write_csv(doc, tmp_path)
    _header, rows = read(tmp_path / "dns.csv")
    assert rows[0]["qname"] == "'=HYPERLINK(1)"
    assert rows[0]["ok"] == "true" and rows[0]["x"] == "1.5" and rows[0]["id"] == "1"


def _flatten_reference(obj: dict[Any, Any], prefix: str = "", lists: bool = False
                       ) -> dict[str, Any]:
    """The plain recursive definition :func:`flatten` must keep to."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten_reference(v, key + ".", lists))
        elif lists and isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(_flatten_reference(x, f"{key}.{i}.", lists))
        else:
            out[key] = v
    return out


class _Key(str):
    """A str subclass as a key: the flattened key is a plain str all the same."""


_keys = st.sampled_from(["a", "b", "a.b", "0", ""]) | st.integers(0, 3) | st.builds(
    _Key, st.sampled_from(["a", "c"]))
_nested = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.dictionaries(_keys, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _nested, max_size=5), st.booleans())
def test_flatten_keeps_the_recursive_definition(obj: dict[Any, Any], lists: bool) -> None:
    got, want = flatten(obj, lists=lists), _flatten_reference(obj, lists=lists)
    assert list(got.items()) == list(want.items())
    assert all(type(k) is str for k in got)


def test_rows_of_different_keys_each_land_in_their_columns(tmp_path: Path) -> None:
    """Rows are kept as values with a shared tuple of keys (``Rows``): rows whose keys
    differ, in set or in order, still put each value under its own column, and a key that
    is only the parent of another row's flattened columns writes no cell."""
    from netdiag.report.csv_out import Rows, _write, columns

    dicts = [{"b": 1, "a": "x", "tls": None},
             {"a": "y", "b": 2.5, "tls": None},
             {"tls.version": "TLS 1.3", "a": "=z"},
             {"b": [1, 2], "a": None, "tls": None}]
    rows = Rows(dicts)
    assert len(rows.shapes) == 3 and len(rows) == 4
    got_keys = [keys for keys, _values in rows]
    assert got_keys[0] is got_keys[3]  # one tuple per distinct shape
    header = columns(rows.shapes, ("a",))
    assert header == ["a", "b", "tls.version"]  # "tls" only a parent: no column
    path = tmp_path / "t.csv"
    _write(path, header, rows, excel_safe=True)
    got = read(path)
    assert got == (header, [dict(zip(header, cells, strict=True)) for cells in (
        ["x", "1", ""], ["y", "2.5", ""], ["'=z", "", "TLS 1.3"], ["", "[1,2]", ""])])


_CELL_TEXT = st.text(alphabet=st.sampled_from(
    ["a", " ", ",", '"', "\r", "\n", "\x00", "=", "+", "-", "@", "\t", "é", "\u2028", "'"]),
    max_size=6)
_CELL = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
         | _CELL_TEXT | st.lists(st.integers(0, 9) | _CELL_TEXT, max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _CELL, max_size=4),
                max_size=12),
       st.booleans(), st.sampled_from([1, 2, 512]))
def test_lines_are_what_the_csv_module_writes(dicts: list[dict[str, Any]], excel_safe: bool,
                                              batch: int) -> None:
    """``_write`` makes each line itself (the ``csv`` module's writer looked at every
    character of every cell): the same bytes as that writer gives for the same cells,
    whatever the text (commas, quotes, line ends, NULs, formulas), numbers, empty cells
    and lists, defused or not, however many lines go in one write."""
    import io
    import tempfile

    import netdiag.report.csv_out as csv_out
    from netdiag.report.csv_out import Rows, _write, defuse

    header = ["a", "b", "c", "d"]
    want = io.StringIO()
    w = csv.writer(want, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    w.writerow(header)
    for d in dicts:
        cells: list[Any] = []
        for k in header:
            v = d.get(k)
            if isinstance(v, str):
                v = defuse(v) if excel_safe else v
            elif v is not None and type(v) not in (int, float):
                v = cell(v)
            cells.append(v)
        w.writerow(cells)
    old = csv_out.LINES_BATCH
    csv_out.LINES_BATCH = batch
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.csv"
            _write(path, header, Rows(dicts), excel_safe)
            got = path.read_bytes()
    finally:
        csv_out.LINES_BATCH = old
    assert got == want.getvalue().encode("utf-8")


def test_a_table_of_one_column_is_what_the_csv_module_writes(tmp_path: Path) -> None:
    """A table of one column follows the ``csv`` module's rule for a row of one empty
    cell (``""``, not an empty line): the same bytes as that writer for empty, missing,
    quoted, numeric and formula cells."""
    import io

    from netdiag.report.csv_out import Rows, _write

    dicts: list[dict[str, Any]] = [{"a": ""}, {}, {"a": None}, {"a": 'x,"y"'}, {"a": 1.5},
                                   {"a": 7}, {"a": "=1+1"}, {"a": [1, 2]}, {"b": "no column"}]
    want = io.StringIO()
    w = csv.writer(want, lineterminator="\r\n")
    w.writerow(["a"])
    for v in ["", None, None, 'x,"y"', 1.5, 7, "'=1+1", "[1,2]", None]:
        w.writerow([v])
    path = tmp_path / "one.csv"
    _write(path, ["a"], Rows(dicts), excel_safe=True)
    assert path.read_bytes() == want.getvalue().encode("utf-8")
    assert path.read_bytes().count(b'\r\n""\r\n') >= 1  # an empty row is not a blank line


@pytest.mark.parametrize("batch", [1, 3, 10_000])
def test_rows_kept_in_batches_write_the_same_files(doc_keys: dict[str, Any], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  batch: int) -> None:
    """A table's rows wait for the header ``ROWS_BATCH`` at a time in a temporary file
    (``Rows``): every batch size writes the same bytes as rows all kept in memory, and
    the temporary file is let go once its table is written."""
    import netdiag.report.csv_out as csv_out
    from netdiag.report.spill import BatchSpill

    whole = write_csv(doc_keys, tmp_path / "whole")
    assert sum(1 for _ in (tmp_path / "whole" / "requests.csv").open()) > 4  # batches below
    monkeypatch.setattr(csv_out, "ROWS_BATCH", batch)
    spills: list[BatchSpill] = []
    added = {"batches": 0}
    real_init, real_add = BatchSpill.__init__, BatchSpill.add

    def tracked(self: BatchSpill) -> None:
        real_init(self)
        spills.append(self)

    def counted(self: BatchSpill, batch: Any) -> None:
        added["batches"] += 1
        real_add(self, batch)

    monkeypatch.setattr(BatchSpill, "__init__", tracked)
    monkeypatch.setattr(BatchSpill, "add", counted)
    batched = write_csv(doc_keys, tmp_path / "batched")
    for p, q in zip(whole, batched, strict=True):
        assert p.name == q.name and p.read_bytes() == q.read_bytes(), p.name
    assert (added["batches"] > 0) is (batch < 10_000)
    assert spills and all(not s.on_disk for s in spills)  # each file let go
