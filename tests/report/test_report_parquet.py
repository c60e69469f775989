"""Parquet export (issue 14): one typed table per record type, read back with pyarrow.

The documents are the real pipeline's on the shipped capture, with and without keys,
their paths, time series and knees filled by the real path attribution
(``netdiag.paths.apply.apply_paths``); the values are checked against the CSV writer's
own flattening of the same document (``netdiag.report.csv_out``), an independent
implementation of the same names.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from report_docs import ANTHO, HOSTILE, KEYS, ROOT, hostile_doc, profile, strip_secrets

from netdiag import CONTRACT_VERSION, __version__
from netdiag.errors import NetdiagError
from netdiag.paths.apply import apply_paths
from netdiag.pipeline import Options, analyze
from netdiag.report import csv_out
from netdiag.report.parquet_out import (
    EXTRA,
    TABLES,
    ParquetUnavailable,
    column_docs,
    require_pyarrow,
    write_parquet,
)
from netdiag.report.records_out import CollectingSink
from netdiag.tls.keylog import KeyLog

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")
pq = pytest.importorskip("pyarrow.parquet")

BASE = ["connections.parquet", "requests.parquet", "dns.parquet", "findings.parquet"]
LOAD = ["timeseries.parquet", "knees.parquet"]
DOCS = ROOT / "docs" / "report.md"


def _attributed(capture: Path, keylog: KeyLog | None) -> dict[str, Any]:
    """The report of ``capture`` as ``netdiag report --profile`` builds it (headers
    kept, as HAR and HTML ask for them)."""
    sink = CollectingSink()
    result = analyze([str(capture)], sink, Options(keylog=keylog))
    doc: dict[str, Any] = dict(sink.document(result, headers=True))
    apply_paths(doc, sink.connections, sink.dns_records, profile())
    return doc


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    bare = strip_secrets(ANTHO, tmp_path_factory.mktemp("pq") / "antho-nokeys.pcapng")
    return {"keys": _attributed(ANTHO, KeyLog.from_file(KEYS)),
            "nokeys": _attributed(bare, None)}


@pytest.fixture(params=["keys", "nokeys"])
def doc(request: pytest.FixtureRequest, docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(docs[request.param])


@pytest.fixture
def doc_keys(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(docs["keys"])


def knee(path: str = "ROC") -> dict[str, Any]:
    """A knee as ``netdiag.paths.load`` writes one (the shipped capture has none)."""
    return {"path": path, "metric": "ttfb_p99", "rate_per_s": 1150.0, "ci": [1080.0, 1210.0],
            "below_ms": 45.0, "above_ms": 820.0, "slope_ms_per_rps": 2.1, "points": 60,
            "below": 18, "above": 12, "hop": "router",
            "hops": {"router": {"below_ms": 10.0, "above_ms": 640.0},
                     "origin": {"below_ms": 20.0, "above_ms": None}},
            "evidence": ["p99 TTFB 45 ms over 18 intervals below 1150 req/s",
                         "router own time 10 -> 640 ms"],
            "sentence": "ROC's p99 time to first byte rises from 45 to 820 ms above 1,150 "
                        "req/s (95% CI 1,080-1,210)."}


def with_groups(doc: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``groups`` (``--by file``, as ``netdiag.fleet`` writes them): itself
    and ``other`` as two groups."""
    def group(key: str, d: dict[str, Any]) -> dict[str, Any]:
        cap = d["capture"]
        return {"key": key, "files": [key], "summary": d["summary"],
                "first_ts": cap["first_ts"], "last_ts": cap["last_ts"],
                "truncated": cap["truncated"]}

    doc["groups"] = [group("antho.pcapng", doc), group("antho-nokeys.pcapng", other)]
    return doc


def read_all(paths: list[Path]) -> dict[str, Any]:
    return {p.name: pq.read_table(p) for p in paths}


def rows(table: Any) -> list[dict[str, Any]]:
    return list(table.to_pylist())


def micros(ts: float) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=round(ts * 1e6))


# --- comparing with the document --------------------------------------------------------


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    """An object flattened with dots (as csv_out does), its nulls left out."""
    return {k: v for k, v in csv_out.flatten(obj).items() if v is not None}


def plain(value: Any, typ: Any) -> Any:
    """A value read back from Parquet in the document's shape: maps as dicts, header
    structs as ``[name, value]``, structs flattened without their nulls."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return {k: plain(v, typ.item_type) for k, v in value}
    if pa.types.is_list(typ):
        item = typ.value_type
        if pa.types.is_struct(item) and [f.name for f in item] == ["name", "value"]:
            return [[h["name"], h["value"]] for h in value]
        return [plain(v, item) for v in value]
    if pa.types.is_struct(typ):
        return {k: v for k, v in value.items() if v is not None}
    return value


def shaped(value: Any, typ: Any) -> Any:
    """A value of the document made comparable with :func:`plain`'s."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return {k: shaped(v, typ.item_type) for k, v in value.items()}
    if pa.types.is_list(typ) and pa.types.is_struct(typ.value_type) and isinstance(
            value[0] if value else None, dict):
        return [clean(v) for v in value]
    if pa.types.is_list(typ):
        return [list(v) if isinstance(v, tuple | list) else v for v in value]
    if pa.types.is_struct(typ):
        return clean(value)
    return value


def assert_rows_match(table: Any, flat_rows: list[dict[str, Any]], where: str) -> None:
    """Every value of ``flat_rows`` (csv_out's rows of the same records) is in the
    table: under its own column, as an entry of a map column (``http2.settings.client.X``),
    or, for an object that is null or empty, as null in all the columns under it."""
    schema = table.schema
    names = set(schema.names)
    maps = [f.name for f in schema if pa.types.is_map(f.type)]
    got = rows(table)
    assert len(got) == len(flat_rows), where
    for i, (row, flat) in enumerate(zip(got, flat_rows, strict=True)):
        for k, v in flat.items():
            at = f"{where}[{i}].{k}"
            if k in names:
                typ = schema.field(k).type
                assert plain(row[k], typ) == shaped(v, typ), at
                continue
            parent = next((m for m in maps if k.startswith(m + ".")), None)
            if parent is not None:           # an entry of a map csv_out flattens
                entry = dict(row[parent] or [])
                assert entry[k[len(parent) + 1:]] == v, at
                continue
            under = [n for n in names if n.startswith(k + ".")]
            assert under, f"{at}: no column for a field of the document"
            assert v in (None, {}), at
            assert all(row[n] is None for n in under), at
        assert row[EXTRA] is None, (where, i, row[EXTRA])


# --- the files ------------------------------------------------------------------------


def test_one_file_per_table_with_every_record(doc: dict[str, Any], tmp_path: Path) -> None:
    paths = write_parquet(doc, tmp_path / "out")
    assert [p.name for p in paths] == BASE + LOAD
    assert all(p.parent == tmp_path / "out" and p.is_file() for p in paths)
    t = read_all(paths)
    reqs = [r for c in doc["connections"] for r in c["requests"]]
    assert t["connections.parquet"].num_rows == len(doc["connections"]) > 0
    assert t["requests.parquet"].num_rows == len(reqs) > 0
    assert t["dns.parquet"].num_rows == len(doc["dns"]) > 0
    assert t["findings.parquet"].num_rows == len(doc["findings"]) > 0
    intervals = sum(len(v) for v in doc["timeseries"]["paths"].values())
    assert t["timeseries.parquet"].num_rows == intervals > 0
    assert t["knees.parquet"].num_rows == len(doc["knees"])
    for p in paths:
        meta = pq.read_metadata(p)
        kv = meta.metadata
        # the document's versions, and nothing that changes from one run to the next
        assert kv[b"contract"] == str(doc["contract"]).encode()
        assert kv[b"netdiag_version"] == doc["netdiag_version"].encode()
        assert set(kv) == {b"contract", b"netdiag_version", b"ARROW:schema"}
        if meta.num_row_groups:
            col = meta.row_group(0).column(0)
            assert col.compression == ("ZSTD" if pa.Codec.is_available("zstd") else "SNAPPY")


def test_every_field_of_the_document_has_a_typed_column(doc: dict[str, Any],
                                                        tmp_path: Path) -> None:
    t = read_all(write_parquet(doc, tmp_path))
    assert_rows_match(t["dns.parquet"], csv_out.dns_rows(doc), "dns")
    assert_rows_match(t["connections.parquet"], csv_out.connection_rows(doc), "connections")
    # csv_out's request rows carry only the connection id and index of the context
    assert_rows_match(t["requests.parquet"], csv_out.request_rows(doc), "requests")
    assert_rows_match(t["findings.parquet"], [dict(f) for f in doc["findings"]], "findings")
    flat = [{k: v for k, v in r.items() if not k.startswith("hops.")}
            for r in csv_out.timeseries_rows(doc)[1]]
    assert_rows_match(t["timeseries.parquet"], flat, "timeseries")


def test_schema_is_fixed_and_typed(doc: dict[str, Any], tmp_path: Path) -> None:
    t = read_all(write_parquet(doc, tmp_path))
    empty = read_all(write_parquet({"timeseries": {}, "knees": []}, tmp_path / "empty"))
    for name, table in t.items():
        # the schema of TABLES, whatever the data, the same for an empty report
        assert table.schema.names == [n for n, _ in TABLES[name.removesuffix(".parquet")]]
        assert table.schema.equals(empty[name].schema, check_metadata=True), name
        for field in table.schema:
            _check_units(field.name, field.type, name)
    s = {n: t[n].schema for n in t}
    f64, i64, b, text = pa.float64(), pa.int64(), pa.bool_(), pa.string()
    when = pa.timestamp("us", tz="UTC")
    expect = {
        "dns.parquet": {"ts": f64, "time": when, "id": i64, "qname": text,
                        "answers": pa.list_(text), "latency_ms": f64, "truncated": b},
        "connections.parquet": {
            "id": text, "ts": f64, "time": when, "handshake_rtt_ms": f64, "packets": i64,
            "requests": i64, "handshake_seen": b, "tls.version": text,
            "tls.alpn_offered": pa.list_(text), "tls.handshake_ms": f64, "tls.resumed": b,
            "path.name": text, "path.hop": text, "path.evidence": pa.list_(text),
            "http2.settings.client": pa.map_(text, i64), "http2.goaway.ts": f64},
        "requests.parquet": {
            "connection": text, "index": i64, "client": text, "server": text,
            "path.name": text, "connection.protocol": text, "ts": f64, "time": when,
            "status": i64, "stream_id": i64, "ttfb_ms": f64, "ttlb_ms": f64,
            "chunk_gaps_ms": pa.list_(f64), "estimated": b, "protocol": text,
            "request_headers": pa.list_(pa.struct([("name", text), ("value", text)]))},
        "findings.parquet": {"severity": text, "evidence": pa.list_(text)},
        "timeseries.parquet": {"path": text, "start_ts": f64, "start_time": when,
                               "requests": i64, "ttfb_ms.p99": f64, "ttfb_ms.count": i64,
                               "reuse_rate": f64, "estimated": b},
        "knees.parquet": {"ci": pa.list_(f64), "ci_low": f64, "points": i64, "hop": text},
    }
    for name, fields in expect.items():
        for col, typ in fields.items():
            assert s[name].field(col).type == typ, (name, col)
    assert s["connections.parquet"].field(EXTRA).type == pa.map_(text, text)


def _check_units(name: str, typ: Any, where: str) -> None:
    """``*_ms`` and ``ts`` columns (and struct fields, list items, map values) are
    float64, but a percentile block's ``count``; ``time`` columns timestamps."""
    last = name.rsplit(".", 1)[-1]
    if pa.types.is_list(typ):
        _check_units(name, typ.value_type, where)
    elif pa.types.is_map(typ):
        _check_units(name, typ.item_type, where)
    elif pa.types.is_struct(typ):
        for f in typ:
            _check_units(f"{name}.{f.name}", f.type, where)
    elif last in ("ts", "start_ts") or (last != "count" and "_ms" in name and
                                         any(p.endswith("_ms") for p in name.split("."))):
        assert typ == pa.float64(), (where, name, typ)
    elif last in ("time", "start_time"):
        assert typ == pa.timestamp("us", tz="UTC"), (where, name, typ)
    elif last == "count":
        assert typ == pa.int64(), (where, name, typ)


def test_values_round_trip(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    t = read_all(write_parquet(doc_keys, tmp_path))
    conns = rows(t["connections.parquet"])
    reqs = rows(t["requests.parquet"])
    flat = [(c, i, r) for c in doc_keys["connections"] for i, r in enumerate(c["requests"])]
    for (c, i, r), row in zip(flat, reqs, strict=True):
        assert (row["connection"], row["index"]) == (c["id"], i)
        assert row["ts"] == r["ts"]                                    # bit for bit
        assert row["time"] == micros(r["ts"])
        assert row["ttfb_ms"] == r["ttfb_ms"] and row["status"] == r["status"]
        path = c["path"] or {}
        assert (row["client"], row["server"], row["connection.protocol"]) == (
            c["client"], c["server"], c["protocol"])
        assert (row["path.name"], row["path.hop"]) == (path.get("name"), path.get("hop"))
    assert {r["path.name"] for r in reqs} >= {"ROC", "DPF"}
    sse = next(row for row in reqs if row["path"] == "/v1/stream")
    gaps = next(r for _, _, r in flat if r["path"] == "/v1/stream")["chunk_gaps_ms"]
    assert isinstance(sse["chunk_gaps_ms"], list) and sse["chunk_gaps_ms"] == gaps
    chained = [(row, r) for row, (_, _, r) in zip(reqs, flat, strict=True) if r.get("chain")]
    assert chained
    for row, r in chained:
        assert [s["hop"] for s in row["chain"]] == [s["hop"] for s in r["chain"]]
        assert row["chain"][0]["own_split_ms.before_calls"] == (
            r["chain"][0]["own_split_ms"] or {}).get("before_calls")
    for c, row in zip(doc_keys["connections"], conns, strict=True):
        assert row["id"] == c["id"] and row["ts"] == c["ts"]
        assert row["time"] == micros(c["ts"])
        assert row["requests"] == len(c["requests"])
        tls = c["tls"] or {}
        assert row["tls.version"] == tls.get("version")
        assert row["tls.handshake_ms"] == tls.get("handshake_ms")
        assert row["tls.alpn_offered"] == (None if not c["tls"] else tls["alpn_offered"])
        assert row["path.name"] == (c["path"] or {}).get("name")
        h2 = c["http2"] or {}
        settings = (h2.get("settings") or {}).get("client")
        assert row["http2.settings.client"] == (None if settings is None
                                                else list(settings.items()))
    for d, row in zip(doc_keys["dns"], rows(t["dns.parquet"]), strict=True):
        assert (row["ts"], row["qname"], row["latency_ms"]) == (d["ts"], d["qname"],
                                                                d["latency_ms"])
        assert isinstance(row["answers"], list) and row["answers"] == d["answers"]
    for f, row in zip(doc_keys["findings"], rows(t["findings.parquet"]), strict=True):
        assert row["evidence"] == f["evidence"] and row["title"] == f["title"]


def test_timeseries_and_knees(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    ts = doc_keys["timeseries"]
    doc_keys["knees"] = [knee()]
    ts["sparse"] = ["DPF"]
    t = read_all(write_parquet(doc_keys, tmp_path))
    got = rows(t["timeseries.parquet"])
    want = [(None if name == "null" else name, iv) for name, ivs in ts["paths"].items()
            for iv in ivs]
    assert None in {p for p, _ in want}           # requests on no path: key "null"
    for (path, iv), row in zip(want, got, strict=True):
        assert row["path"] == path and row["interval_ms"] == ts["interval_ms"]
        assert row["sparse"] is (path == "DPF")
        assert row["start_ts"] == iv["start_ts"] and row["start_time"] == micros(iv["start_ts"])
        assert row["ttfb_ms.p99"] == iv["ttfb_ms"]["p99"]
        hops = iv.get("hops")
        assert plain(row["hops"], t["timeseries.parquet"].schema.field("hops").type) == (
            None if hops is None else {h: clean(v) for h, v in hops.items()})
    assert any(row["hops"] for row in got)
    (k,) = rows(t["knees.parquet"])
    assert (k["ci"], k["ci_low"], k["ci_high"]) == ([1080.0, 1210.0], 1080.0, 1210.0)
    assert dict(k["hops"]) == {"router": {"below_ms": 10.0, "above_ms": 640.0},
                               "origin": {"below_ms": 20.0, "above_ms": None}}
    assert k["evidence"] == knee()["evidence"] and k[EXTRA] is None


def test_groups(docs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    doc = with_groups(copy.deepcopy(docs["keys"]), docs["nokeys"])
    paths = write_parquet(doc, tmp_path)
    assert [p.name for p in paths] == [*BASE, *LOAD, "groups.parquet"]
    table = pq.read_table(paths[-1])
    got = rows(table)
    assert [g["key"] for g in got] == ["antho.pcapng", "antho-nokeys.pcapng"]
    for g, row in zip(doc["groups"], got, strict=True):
        s = g["summary"]
        assert row["files"] == g["files"] and row["truncated"] is False
        assert (row["first_ts"], row["last_ts"]) == (g["first_ts"], g["last_ts"])
        assert (row["first_time"], row["last_time"]) == (micros(g["first_ts"]),
                                                         micros(g["last_ts"]))
        assert row["summary.http.requests"] == s["http"]["requests"]
        assert row["summary.http.ttfb_ms.p99"] == s["http"]["ttfb_ms"]["p99"]
        assert row["summary.http.estimated"] is s["http"]["estimated"]
        assert dict(row["summary.tls.versions"]) == s["tls"]["versions"]
        budgets = dict(row["summary.paths"])
        assert set(budgets) == set(s["paths"])
        roc = budgets["ROC"]
        assert roc["ttfb_ms.p50"] == s["paths"]["ROC"]["ttfb_ms"]["p50"]
        assert roc["hops"] == s["paths"]["ROC"]["hops"]
        hops = dict(roc["phases.hops"])
        assert hops["router"]["own_ms.p50"] == (
            s["paths"]["ROC"]["phases"]["hops"]["router"]["own_ms"]["p50"])
        assert [d["phase"] for d in row["summary.path_comparison"]] == [
            d["phase"] for d in s["path_comparison"]]
        assert row[EXTRA] is None, row[EXTRA]           # every summary field is typed


# --- empty, concatenated, deterministic -----------------------------------------------


def test_empty_document_writes_typed_empty_tables(doc_keys: dict[str, Any],
                                                  tmp_path: Path) -> None:
    paths = write_parquet({}, tmp_path / "empty")
    assert [p.name for p in paths] == BASE
    full = read_all(write_parquet(with_groups(doc_keys, doc_keys), tmp_path / "full"))
    for p in paths:
        table = pq.read_table(p)
        assert table.num_rows == 0
        assert table.schema.equals(full[p.name].schema, check_metadata=True)
        kv = pq.read_metadata(p).metadata
        assert (kv[b"contract"], kv[b"netdiag_version"]) == (
            str(CONTRACT_VERSION).encode(), __version__.encode())
    bare = write_parquet({"timeseries": {"paths": {}}, "knees": [], "groups": []},
                         tmp_path / "bare")
    assert [p.name for p in bare] == [*BASE, *LOAD, "groups.parquet"]
    for p in bare:
        assert pq.read_table(p).num_rows == 0
        assert pq.read_table(p).schema.equals(full[p.name].schema)


def test_files_of_different_captures_concatenate(docs: dict[str, dict[str, Any]],
                                                 tmp_path: Path) -> None:
    a = read_all(write_parquet(copy.deepcopy(docs["keys"]), tmp_path / "a"))
    b = read_all(write_parquet(copy.deepcopy(docs["nokeys"]), tmp_path / "b"))
    c = read_all(write_parquet({}, tmp_path / "c"))
    for name in BASE:
        both = pa.concat_tables([a[name], b[name], c[name]])
        assert both.num_rows == a[name].num_rows + b[name].num_rows
    # and as one dataset, the way DuckDB or Spark read a directory of runs
    ds = pq.ParquetDataset([str(tmp_path / d / "requests.parquet") for d in "abc"])
    assert ds.read().num_rows == a["requests.parquet"].num_rows + b["requests.parquet"].num_rows


def test_same_document_same_bytes(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    doc = with_groups(doc_keys, doc_keys)
    doc["knees"] = [knee()]
    src = tmp_path / "doc.json"
    src.write_text(json.dumps(doc), encoding="utf-8")
    loaded = json.loads(src.read_text(encoding="utf-8"))
    first = write_parquet(loaded, tmp_path / "one")
    second = write_parquet(copy.deepcopy(loaded), tmp_path / "two")
    # another process, another hash seed
    code = ("import json, sys; from pathlib import Path; "
            "from netdiag.report.parquet_out import write_parquet; "
            "write_parquet(json.loads(Path(sys.argv[1]).read_text(encoding='utf-8')), "
            "Path(sys.argv[2]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "three")],
                   check=True, env=env, cwd=ROOT, timeout=120)
    for p, q in zip(first, second, strict=True):
        assert p.read_bytes() == q.read_bytes(), p.name
        assert p.read_bytes() == (tmp_path / "three" / p.name).read_bytes(), p.name


# --- hostile input --------------------------------------------------------------------

ANSI = "\x1b[31mred\x1b[0m\x1b]8;;http://evil.example\x07link\x1b]8;;\x07\x9b2J"
NUL = "a\x00b"
HUGE = "x" * (2 * 1024 * 1024)
LONE = "bad\ud800surrogate\udfff"
PAIR = "\ud83d\ude00"                      # a surrogate pair: U+1F600 in UTF-16


def test_hostile_document_does_not_raise(docs: dict[str, dict[str, Any]],
                                         tmp_path: Path) -> None:
    doc = hostile_doc(copy.deepcopy(docs["keys"]))   # hostile text, text where numbers go
    doc["netdiag_version"] = LONE
    doc["dns"][0]["qname"] = NUL + ANSI
    doc["dns"][1]["qname"] = LONE
    doc["dns"][2]["qname"] = HUGE
    doc["dns"][3]["answers"] = [PAIR, LONE, 7]
    doc["dns"][4]["ts"] = float("nan")
    conn = next(c for c in doc["connections"] if c["tls"] and c["http2"] and c["requests"])
    conn["tls"]["sni"] = LONE
    conn["http2"]["settings"]["client"][LONE] = 2**70          # beyond int64
    conn["retransmissions"] = 1.5                              # a fraction for a count
    conn["resets"] = True                                      # a flag for a count
    conn["packets"] = 12.0                                     # an integral float: kept
    conn["bytes_to_server"] = 2**63                            # one past int64
    conn["bytes_to_client"] = -(2**63)                         # int64's least: kept
    conn["ts"] = 1e13                                          # beyond the year 9999
    conn["surprise"] = {"new": [LONE]}                         # a field of a later netdiag
    r = conn["requests"][0]
    r["path"] = LONE + HUGE
    r["method"] = ANSI
    r["chunk_gaps_ms"] = [1.0, "soon", None]
    r["chain"] = [{"hop": LONE, "own_ms": "many", "own_split_ms": None}, "a step?", None,
                  {"hop": "origin", "depth": 2**64}]
    conn["requests"][1]["chunk_gaps_ms"] = [0.5, True, 2]      # a flag among fractions
    other = next(i for i, c in enumerate(doc["connections"]) if c is not conn and c["tls"])
    doc["connections"][other]["tls"] = ["not", "an", "object"]
    doc["connections"].append("not a connection")
    doc["findings"][0]["evidence"] = [LONE, NUL]
    doc["knees"] = [{**knee(LONE), "points": "n", "ci": [1.0]}]
    doc["timeseries"]["paths"][LONE] = doc["timeseries"]["paths"].pop("ROC")
    doc["groups"] = [{"key": LONE, "files": [LONE], "summary": doc["summary"]},
                     {"key": 3, "files": "x", "summary": None}]
    doc["summary"]["tls"]["versions"][LONE] = 1

    paths = write_parquet(doc, tmp_path)
    t = {p.name: pq.read_table(p) for p in paths}           # every file reads back
    fixed = "bad\ufffdsurrogate\ufffd"                       # U+FFFD for each lone one
    assert pq.read_metadata(paths[0]).metadata[b"netdiag_version"] == fixed.encode()
    dns = rows(t["dns.parquet"])
    assert dns[0]["qname"] == NUL + ANSI                       # stored as it is
    assert dns[1]["qname"] == fixed
    assert dns[2]["qname"] == HUGE
    assert dns[3]["answers"] == ["\U0001f600", fixed, None]
    assert json.loads(dict(dns[3][EXTRA])["answers.2"]) == 7
    assert math.isnan(dns[4]["ts"]) and dns[4]["time"] is None
    assert dns[0]["latency_ms"] is None                        # hostile_doc put text there
    assert json.loads(dict(dns[0][EXTRA])["latency_ms"]) == doc["dns"][0]["latency_ms"]

    conns = rows(t["connections.parquet"])
    assert len(conns) == len(doc["connections"]) - 1          # the string is no record
    i = doc["connections"].index(conn)
    row = conns[i]
    extra = {k: json.loads(v) for k, v in row[EXTRA]}
    assert row["tls.sni"] == fixed
    assert extra[f"http2.settings.client.{fixed}"] == 2**70
    assert dict(row["http2.settings.client"])[fixed] is None
    assert (row["retransmissions"], row["resets"], row["packets"]) == (None, None, 12)
    assert (row["bytes_to_server"], row["bytes_to_client"]) == (None, -(2**63))
    assert extra["bytes_to_server"] == 2**63
    assert (extra["retransmissions"], extra["resets"]) == (1.5, True)
    assert row["ts"] == 1e13 and row["time"] is None
    assert extra["surprise"] == {"new": [LONE]}                # exact, through \u escapes
    assert json.loads(dict(conns[other][EXTRA])["tls"]) == ["not", "an", "object"]
    assert conns[other]["tls.version"] is None

    reqs = rows(t["requests.parquet"])
    req = next(x for x in reqs if x["connection"] == conn["id"] and x["index"] == 0)
    rextra = {k: json.loads(v) for k, v in req[EXTRA]}
    assert req["path"] == fixed + HUGE and req["method"] == ANSI
    assert req["client"] == req["connection.protocol"] == HOSTILE    # as it is, NUL included
    assert req["chunk_gaps_ms"] == [1.0, None, None] and rextra["chunk_gaps_ms.1"] == "soon"
    assert req["chain"][0]["hop"] == fixed and req["chain"][0]["own_ms"] is None
    assert rextra["chain.0.own_ms"] == "many"
    assert req["chain"][1] is None and rextra["chain.1"] == "a step?"
    assert req["chain"][2] is None and "chain.2" not in rextra
    assert req["chain"][3]["hop"] == "origin" and req["chain"][3]["depth"] is None
    assert rextra["chain.3.depth"] == 2**64
    req1 = next(x for x in reqs if x["connection"] == conn["id"] and x["index"] == 1)
    assert req1["chunk_gaps_ms"] == [0.5, None, 2.0]
    assert json.loads(dict(req1[EXTRA])["chunk_gaps_ms.1"]) is True
    assert any(x["status"] is None and x[EXTRA] and "status" in dict(x[EXTRA])
               for x in reqs)                                  # hostile_doc's text status

    assert rows(t["findings.parquet"])[0]["evidence"] == [fixed, NUL]
    (k,) = rows(t["knees.parquet"])
    assert k["path"] == fixed and k["points"] is None and (k["ci_low"], k["ci_high"]) == (
        None, None)
    assert fixed in {x["path"] for x in rows(t["timeseries.parquet"])}
    groups = rows(t["groups.parquet"])
    assert groups[0]["key"] == fixed and dict(groups[0]["summary.tls.versions"])[fixed] == 1
    assert groups[1]["key"] is None and json.loads(dict(groups[1][EXTRA])["key"]) == 3
    assert json.loads(dict(groups[1][EXTRA])["files"]) == "x"


def test_time_is_the_ts_to_the_microsecond(tmp_path: Path) -> None:
    values = [0.0, -1.5, 1764425767.1234565, 1764425767.1234575, 253402300799.5,
              253402300800.0, -62135596800.0, -62135596801.0, float("inf"), None]
    doc = {"dns": [{"ts": v, "qname": "x"} for v in values]}
    got = [r["time"] for r in rows(pq.read_table(write_parquet(doc, tmp_path)[2]))]
    want = [None if v is None or not math.isfinite(v) or not (
        -62135596800 <= v < 253402300800) else micros(v) for v in values]
    assert got == want
    assert got[0] == datetime(1970, 1, 1, tzinfo=UTC)
    assert got[4] == datetime(9999, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)
    assert got[6] == datetime(1, 1, 1, tzinfo=UTC) and got[7] is None


def test_without_pyarrow_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    for mod in ("pyarrow", "pyarrow.compute", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, mod, None)       # import raises ImportError
    with pytest.raises(ParquetUnavailable):
        require_pyarrow()                                 # what the CLI checks first
    with pytest.raises(ParquetUnavailable) as e:
        write_parquet({}, tmp_path / "out")
    assert isinstance(e.value, NetdiagError) and e.value.exit_code == 1
    assert "pyarrow" in str(e.value) and "pip install" in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


# --- queries --------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's and DuckDB's
    quantile_cont)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def test_one_query_per_table_with_pyarrow_compute(doc_keys: dict[str, Any],
                                                  tmp_path: Path) -> None:
    doc = with_groups(doc_keys, doc_keys)
    doc["knees"] = [knee(), {**knee("DPF"), "metric": "ttfb_p50", "rate_per_s": 300.0}]
    t = read_all(write_parquet(doc, tmp_path))

    # requests: p99 time to first byte per path
    reqs = t["requests.parquet"]
    by_path = reqs.group_by("path.name").aggregate([("ttfb_ms", "count")])
    counts = dict(zip(by_path["path.name"].to_pylist(), by_path["ttfb_ms_count"].to_pylist(),
                      strict=True))
    for name in ("ROC", "DPF"):
        mine = [r["ttfb_ms"] for c in doc["connections"] if (c["path"] or {}).get("name") == name
                for r in c["requests"] if r["ttfb_ms"] is not None]
        assert counts[name] == len(mine)
        sel = reqs.filter(pc.equal(reqs["path.name"], name))["ttfb_ms"]
        p99 = pc.quantile(sel, q=0.99, interpolation="linear")[0].as_py()
        assert p99 == pytest.approx(_quantile(mine, 0.99))

    # connections: handshakes per TLS version, as the summary counts them
    conns = t["connections.parquet"]
    tls = conns.filter(pc.is_valid(conns["tls.version"]))
    per = tls.group_by("tls.version").aggregate([("id", "count")])
    assert dict(zip(per["tls.version"].to_pylist(), per["id_count"].to_pylist(),
                    strict=True)) == doc["summary"]["tls"]["versions"]

    # dns: the slowest answer and every address answered
    dns = t["dns.parquet"]
    assert pc.max(dns["latency_ms"]).as_py() == doc["summary"]["dns"]["latency_ms"]["max"]
    assert set(pc.list_flatten(dns["answers"]).to_pylist()) == {
        a for d in doc["dns"] for a in d["answers"]}

    # findings: evidence per finding
    f = t["findings.parquet"]
    assert pc.list_value_length(f["evidence"]).to_pylist() == [
        len(x["evidence"]) for x in doc["findings"]]

    # timeseries: a path's intervals add up to its client requests (the contract)
    ts = t["timeseries.parquet"]
    per_path = ts.group_by("path").aggregate([("requests", "sum")])
    sums = dict(zip(per_path["path"].to_pylist(), per_path["requests_sum"].to_pylist(),
                    strict=True))
    for name, budget in doc["summary"]["paths"].items():
        assert sums[name] == budget["requests"], name

    # knees: the p99 knees, by rate
    k = t["knees.parquet"]
    p99 = k.filter(pc.equal(k["metric"], "ttfb_p99")).sort_by("rate_per_s")
    assert p99["path"].to_pylist() == ["ROC"] and p99["ci_high"].to_pylist() == [1210.0]

    # groups: slowest first
    g = t["groups.parquet"].sort_by([("summary.http.ttfb_ms.p99", "descending")])
    assert g["summary.http.ttfb_ms.p99"][0].as_py() == doc["summary"]["http"]["ttfb_ms"]["p99"]


def parquet_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("\n## Parquet\n")
    end = text.index("\n## ", start + 1)
    assert text[end:].startswith("\n## HAR, HTML, CSV\n")        # just before it
    return text[start:end]


def test_docs_list_every_table_and_column() -> None:
    section = parquet_section()
    for table in TABLES:
        line = next(x for x in section.splitlines() if x.startswith(f"- `{table}.parquet`:"))
        listed = re.findall(r"`([^`]+)` ", line.split(":", 1)[1] + " ")
        assert listed == [n for n, _ in column_docs(table)], table
        assert f"FROM 'out/{table}.parquet'" in section
        assert f'pd.read_parquet("out/{table}.parquet")' in section


def test_docs_queries_run_in_duckdb(doc_keys: dict[str, Any], tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    doc = with_groups(doc_keys, doc_keys)
    doc["knees"] = [knee()]
    write_parquet(doc, tmp_path / "out")
    queries = re.findall(r"```sql\n(.*?)```", parquet_section(), flags=re.S)
    assert len(queries) == len(TABLES)
    con = duckdb.connect()
    for q in queries:
        result = con.execute(q.replace("'out/", f"'{tmp_path}/out/")).fetchall()
        assert result, q


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_engine_frames_go_to_extra(tmp_path: Path) -> None:
    """``--engine tshark`` records carry ``frames`` (frame numbers), which the schema does
    not type: kept in ``_extra``, as docs/report.md says, and nothing else is."""
    from netdiag.engines.tshark import tshark_analysis

    a = tshark_analysis([str(ANTHO)], [str(KEYS)])
    doc = a.document
    apply_paths(doc, a.connections, a.dns_records, profile())
    t = read_all(write_parquet(doc, tmp_path))
    for name in ("connections.parquet", "requests.parquet", "dns.parquet"):
        for row in rows(t[name]):
            assert row[EXTRA] is not None and [k for k, _ in row[EXTRA]] == ["frames"], name
    assert t["requests.parquet"].num_rows == sum(len(c["requests"])
                                                 for c in doc["connections"])


def test_the_report_command_writes_parquet(tmp_path: Path) -> None:
    """``netdiag report --format parquet -o DIR``; without -o a usage error (exit 2)."""
    from click.testing import CliRunner

    from netdiag.cli import cli

    capture = Path(__file__).resolve().parents[2] / "captures" / "antho.pcapng"
    out = tmp_path / "pq"
    res = CliRunner().invoke(cli, ["report", str(capture), "--format", "parquet", "-o",
                                   str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"connections.parquet", "requests.parquet", "dns.parquet",
            "findings.parquet", "timeseries.parquet", "knees.parquet"} <= names
    assert pq.read_table(out / "requests.parquet").num_rows > 0
    res = CliRunner().invoke(cli, ["report", str(capture), "--format", "parquet"])
    assert res.exit_code == 2 and "-o DIRECTORY" in res.output


def test_a_lazy_document_renders_each_connection_once(doc_keys: dict[str, Any],
                                                      tmp_path: Path) -> None:
    """``netdiag report --format parquet`` hands a document whose connections and DNS
    transactions are made as they are read (``Records``): each connection is rendered
    once for both tables, and the files are those of the plain document."""
    from netdiag.report.json_out import Records

    rendered: list[int] = []
    conns, dns = doc_keys["connections"], doc_keys["dns"]

    def render(i: int) -> dict[str, Any]:
        rendered.append(i)
        return copy.deepcopy(conns[i])

    lazy = dict(doc_keys, connections=Records(list(range(len(conns))), render),
                dns=Records(list(range(len(dns))), lambda i: copy.deepcopy(dns[i])))
    plain = write_parquet(doc_keys, tmp_path / "plain")
    made = write_parquet(lazy, tmp_path / "lazy")
    assert sorted(rendered) == list(range(len(conns)))  # each once
    for a, b in zip(plain, made, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()


def test_columns_gathered_from_each_row_are_what_arrow_gathers(doc: dict[str, Any]) -> None:
    """``to_table`` gathers each column from the rows' own keys, not by looking every
    column up in every row as ``Table.from_pylist`` does: the same table as pyarrow's own
    gathering, on the real rows plus a row with none of the columns, a row with a key no
    column has, and a row whose keys come in another order (the derived ``time`` aside,
    which ``to_table`` computes from ``ts``)."""
    from netdiag.report.parquet_out import TIME_OF, connection_and_request_rows, to_table

    conns: list[dict[str, Any]] = []
    reqs: list[dict[str, Any]] = []
    connection_and_request_rows(doc, conns, reqs)
    assert conns and reqs
    for name, got in (("connections", conns), ("requests", reqs)):
        first = got[0]
        made = [*got, {}, {"no such column": 1, **first},
                dict(reversed(list(first.items())))]
        ours = to_table(name, made, {"k": "v"})
        schema = ours.schema
        theirs = pa.Table.from_pylist(made, schema=schema)
        assert schema.metadata == {b"k": b"v"}
        for field in schema:
            if field.name in TIME_OF:
                continue
            assert ours.column(field.name).to_pylist() == \
                theirs.column(field.name).to_pylist(), (name, field.name)
        assert ours.num_rows == len(made)


@pytest.mark.parametrize("batch", [1, 3, 10_000])
def test_rows_taken_in_batches_give_the_same_tables(doc_keys: dict[str, Any], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    batch: int) -> None:
    """The connections and requests tables are built ``BATCH_ROWS`` rows at a time (a big
    document's rows are never all dicts at once): every batch size gives the same
    tables, row for row, and the same bytes for the same document."""
    import netdiag.report.parquet_out as parquet_out

    whole = read_all(write_parquet(doc_keys, tmp_path / "whole"))
    assert whole["requests.parquet"].num_rows > 3  # several batches below
    monkeypatch.setattr(parquet_out, "BATCH_ROWS", batch)
    first = write_parquet(doc_keys, tmp_path / "one")
    again = write_parquet(copy.deepcopy(doc_keys), tmp_path / "two")
    for p, q in zip(first, again, strict=True):
        assert p.read_bytes() == q.read_bytes(), p.name
    batched = read_all(first)
    assert batched.keys() == whole.keys()
    for name, table in whole.items():
        assert batched[name].schema.equals(table.schema, check_metadata=True), name
        assert rows(batched[name]) == rows(table), name
