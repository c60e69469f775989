"""``--max-memory``: the records a listing report holds are estimated as they arrive
(``netdiag.fleet.memory``), and once the estimate passes the budget the summary is
sketched as with ``--max-records``; a single capture that could pass it is reported the
fleet's way, and the same as the plain way while its records fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fleetcaps as fc
import jobs_capture as gen
import pytest
from click.testing import CliRunner

from netdiag import record_cost
from netdiag.cli import cli
from netdiag.fleet import memory


def report(*args: str, code: int = 0) -> bytes:
    r = CliRunner().invoke(cli, ["report", "--no-profile", *args], catch_exceptions=False)
    assert r.exit_code == code, r.stderr
    return r.stdout_bytes


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fc.rotated_hosts(tmp_path_factory.mktemp("budget") / "caps", "ab", 300, 2, 70)


def _estimate(doc: dict[str, Any]) -> int:
    """The estimate of every record of an exact report, from the module's constants."""
    return (sum(record_cost.CONNECTION_BYTES + record_cost.REQUEST_BYTES * len(c["requests"])
                + record_cost.GAP_BYTES * sum(len(r["chunk_gaps_ms"] or ())
                                              for r in c["requests"])
                for c in doc["connections"]) + record_cost.DNS_BYTES * len(doc["dns"]))


def test_the_budget_is_passed_by_the_estimate_of_the_records(two_hosts: Path) -> None:
    exact = json.loads(report(str(two_hosts), "--format", "json", "--max-memory", "none"))
    need = _estimate(exact)
    assert exact["connections"] and exact["dns"]
    assert "sketch" not in exact["summary"] and "max_memory" not in exact["capture"][
        "limits_hit"]
    fits = json.loads(report(str(two_hosts), "--format", "json", "--max-memory", str(need)))
    assert fits == exact
    over = json.loads(report(str(two_hosts), "--format", "json", "--max-memory",
                             str(need - 1)))
    assert over["summary"]["sketch"] == {"relative_accuracy": 0.01}
    assert over["connections"] == [] and over["dns"] == []
    assert over["capture"]["records_omitted"] == {"connections": len(exact["connections"]),
                                                  "dns": len(exact["dns"])}
    assert over["capture"]["limits_hit"]["max_memory"] == 1
    (w,) = [w for w in over["capture"]["warnings"] if w["kind"] == "limit"]
    assert "--max-memory" in w["message"] and "sketched" in w["message"]
    for sec, key in (("http", "ttfb_ms"), ("dns", "latency_ms")):
        a, b = exact["summary"][sec][key], over["summary"][sec][key]
        assert (a["count"], a["min"], a["max"]) == (b["count"], b["min"], b["max"])
        assert b["p50"] == pytest.approx(a["p50"], rel=0.02)
    text = report(str(two_hosts), "--max-memory", str(need - 1)).decode()
    assert "LIMIT" in text and "--max-memory" in text


def test_json_lines_is_never_bounded_by_memory(two_hosts: Path) -> None:
    lines = [json.loads(x) for x in report(str(two_hosts), "--format", "jsonl",
                                           "--max-memory", "1K").splitlines()]
    summary = next(x for x in lines if x["type"] == "summary")
    assert "sketch" not in summary
    exact = json.loads(report(str(two_hosts), "--format", "json", "--max-memory", "none"))
    assert [x["type"] for x in lines].count("connection") == len(exact["connections"])


def test_a_single_capture_that_may_pass_goes_the_fleet_way(tmp_path: Path) -> None:
    cap = tmp_path / "one.pcap"
    gen.write_mixed(cap, 400, seed=5)
    size = cap.stat().st_size
    edge = size * record_cost.RECORD_BYTES_PER_CAPTURE_BYTE
    assert record_cost.may_pass(size, edge - 1) and not record_cost.may_pass(size, edge)
    for fmt in ("json", "text", "html"):
        plain = report(str(cap), "--format", fmt, "--max-memory", str(edge))
        fleet = report(str(cap), "--format", fmt, "--max-memory", str(edge - 1))
        assert plain == fleet, fmt  # its records fit: the same report
    doc = json.loads(report(str(cap), "--format", "json", "--max-memory", "64K"))
    assert doc["summary"]["sketch"] and doc["connections"] == []


@pytest.mark.parametrize(("text", "want"), [
    ("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("200000", 200000),
    ("64kb", 64 << 10), ("none", None)])
def test_sizes(text: str, want: int | None) -> None:
    assert memory.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "3x", "-1G", "0", "G"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        memory.parse_size(text)


def test_auto_is_a_share_of_the_available_memory() -> None:
    avail = memory.available_bytes()
    assert avail is None or avail > 0
    auto = memory.parse_size("auto")
    assert auto == memory.default_max_memory()
    if avail is not None and auto is not None:
        assert 0 < auto <= avail


def test_a_bad_size_is_a_usage_error(two_hosts: Path) -> None:
    r = CliRunner().invoke(cli, ["report", str(two_hosts), "--max-memory", "lots"])
    assert r.exit_code == 2 and "not a size" in r.output


def test_a_dask_shard_has_no_budget_of_its_own() -> None:
    """A worker's flow shard sends its records back whatever they take: stopping it at
    its share of ``--max-memory`` would only have the whole set run once more, as one
    task holding them all (``netdiag.fleet.tasks``); the client's budget is kept where
    the records arrive."""
    from netdiag.fleet.tasks import task_options
    from netdiag.pipeline import Options

    plain, _keylog = task_options(Options(max_memory=1 << 20, max_records=10, jobs=2))
    assert plain.max_memory is None and plain.max_records is None and plain.jobs == 1
