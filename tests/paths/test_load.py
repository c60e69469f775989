"""Load over time (netdiag.paths.load): binning, in-flight, reuse, sparse paths, the
interval choice, JSON/JSONL/paths output, and per-interval request counts against
tshark's own request frames on the shipped capture."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from netdiag.cli import cli as main
from netdiag.commands.common import parse_duration_ns
from netdiag.paths.load import (
    MAX_INTERVALS,
    TARGET_INTERVALS,
    LoadBuilder,
    choose_interval_ns,
    format_interval,
)

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"
MS = 1_000_000
S = 1_000_000_000
T0 = 1_800_000_000 * S  # a whole second


def _series(lb: LoadBuilder, interval_ns: int, path: str = "P") -> list[dict[str, Any]]:
    return lb.build(interval_ns).timeseries["paths"][path]


@pytest.mark.parametrize(("text", "ns"), [("500ms", 500 * MS), ("1s", S), ("2.5s", 2500 * MS),
                                          ("2m", 120 * S), ("2min", 120 * S), ("1h", 3600 * S),
                                          ("3", 3 * S), (" 10 s ", 10 * S)])
def test_durations(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "1x", "-1s", "0.1ms", "s", "1e3", "nan"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ns(text)


def test_default_interval_follows_the_capture_length() -> None:
    assert choose_interval_ns(0) == 100 * MS
    assert choose_interval_ns(2 * S) == 100 * MS
    assert choose_interval_ns(59 * S) == S
    assert choose_interval_ns(3600 * S) == 60 * S
    for span in (7 * S, 300 * S, 86_400 * S):
        assert span / choose_interval_ns(span) <= TARGET_INTERVALS
    assert format_interval(100 * MS) == "100ms"
    assert format_interval(S) == "1s"
    assert format_interval(120 * S) == "2min"


def test_requests_fall_in_the_interval_where_they_start() -> None:
    lb = LoadBuilder()
    # 3 requests in [0, 1 s), none in [1, 2), 2 in [2, 3); the first opens its connection
    starts = [T0 + 10 * MS, T0 + 500 * MS, T0 + 999 * MS, T0 + 2 * S, T0 + 2 * S + 1]
    for i, t in enumerate(starts):
        lb.request("P", t, t + 20 * MS, t + 30 * MS, 100 + i, i == 0, False)
    lb.connection("P", T0)
    lb.dns("P", T0 - 1 * MS)
    lb.retransmissions("P", [T0 + 2 * S + 5 * MS])
    built = lb.build(S)
    ts = built.timeseries
    assert ts["interval_ms"] == 1000
    assert ts["start_ts"] == (T0 - S) / 1e9  # the DNS lookup starts the first interval
    s = ts["paths"]["P"]
    assert [e["requests"] for e in s] == [0, 3, 0, 2]
    assert [e["start_ts"] for e in s] == [(T0 + k * S) / 1e9 for k in (-1, 0, 1, 2)]
    assert [e["dns_lookups"] for e in s] == [1, 0, 0, 0]
    assert [e["new_connections"] for e in s] == [0, 1, 0, 0]
    assert [e["retransmissions"] for e in s] == [0, 0, 0, 1]
    assert s[1]["reuse_rate"] == pytest.approx(2 / 3)
    assert s[3]["reuse_rate"] == 1.0 and s[2]["reuse_rate"] is None
    assert s[1]["bytes"] == 100 + 101 + 102
    assert s[1]["rate_per_s"] == 3.0
    assert s[1]["ttfb_ms"]["count"] == 3 and s[1]["ttfb_ms"]["p50"] == pytest.approx(20.0)
    assert s[2]["ttfb_ms"]["count"] == 0 and s[2]["ttfb_ms"]["p99"] is None
    assert sum(e["requests"] for e in s) == len(starts)


def test_in_flight_counts_requests_open_at_once() -> None:
    lb = LoadBuilder()
    # [0, 1.5 s) open across two intervals; two more overlap inside the second second
    lb.request("P", T0, T0 + 10 * MS, T0 + 1500 * MS, 0, True, False)
    lb.request("P", T0 + 1100 * MS, None, T0 + 1300 * MS, 0, False, False)
    lb.request("P", T0 + 1200 * MS, T0 + 1210 * MS, T0 + 1250 * MS, 0, False, False)
    lb.request("P", T0 + 1300 * MS, T0 + 1310 * MS, T0 + 1320 * MS, 0, False, False)
    s = _series(lb, S)
    assert [e["in_flight_max"] for e in s] == [1, 3]
    # an interval inside a long request counts it, although nothing starts there
    lb2 = LoadBuilder()
    lb2.request("P", T0, T0 + MS, T0 + 3500 * MS, 0, True, False)
    lb2.request("P", T0 + 3 * S, T0 + 3 * S + MS, T0 + 3 * S + 2 * MS, 0, False, False)
    assert [e["in_flight_max"] for e in _series(lb2, S)] == [1, 1, 1, 2]


def test_hop_own_times_per_interval() -> None:
    lb = LoadBuilder()
    for k in range(4):
        t = T0 + k * S
        lb.request("P", t, t + 50 * MS, t + 60 * MS, 0, k == 0, False,
                   {"router": (10 + 100 * k) * MS, "origin": 20 * MS})
    s = _series(lb, S)
    assert [e["hops"]["router"]["own_ms"]["p50"] for e in s] == [10, 110, 210, 310]
    assert {e["hops"]["origin"]["own_ms"]["p99"] for e in s} == {20}


def test_a_lone_hop_name_stands_for_the_whole_time_to_first_byte() -> None:
    """A chain of one request carries its hop's name, not a map: its own time there is its
    time to first byte, and it has none at any other hop (nor without a first byte)."""
    lb = LoadBuilder()
    for k in range(3):
        t = T0 + k * S
        lb.request("P", t, t + (30 + k) * MS, t + 60 * MS, 0, True, False, "origin")
        lb.request("P", t + MS, t + 45 * MS, None, 0, False, False,
                   {"router": 5 * MS, "origin": 40 * MS})
        lb.request("P", t + 2 * MS, None, None, 0, False, False, "origin")
    s = _series(lb, S)
    assert [e["hops"]["origin"]["own_ms"]["min"] for e in s] == [30, 31, 32]
    assert {e["hops"]["origin"]["own_ms"]["count"] for e in s} == {2}
    assert {e["hops"]["router"]["own_ms"]["count"] for e in s} == {1}


def test_a_sparse_path_lists_only_its_active_intervals() -> None:
    lb = LoadBuilder()
    lb.request("P", T0, T0 + MS, T0 + MS, 0, True, False)
    lb.request("P", T0 + 3600 * S, T0 + 3600 * S + MS, None, 0, True, False)
    lb.request("Q", T0 + 1800 * S, T0 + 1800 * S + MS, None, 0, True, False)
    built = lb.build(S)
    assert [e["requests"] for e in built.timeseries["paths"]["P"]] == [1, 1]
    assert built.timeseries["sparse"] == ["P"]
    assert len(built.timeseries["paths"]["Q"]) == 1


def test_a_tiny_interval_is_widened_with_a_warning() -> None:
    lb = LoadBuilder()
    lb.request("P", T0, None, None, 0, True, False)
    lb.request("P", T0 + 86_400 * S, None, None, 0, True, False)
    built = lb.build(MS)
    assert built.timeseries["interval_ms"] * MS * MAX_INTERVALS >= 86_400 * S
    assert built.warnings and "widened" in built.warnings[0]


def test_nothing_to_bin() -> None:
    built = LoadBuilder().build(None)
    assert built.timeseries["paths"] == {} and built.knees == [] and built.findings == []


def _report(*args: str) -> Any:
    res = CliRunner().invoke(main, ["report", str(ANTHO), *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_json_report_intervals_add_up_to_each_paths_requests() -> None:
    doc = json.loads(_report("--format", "json", "--interval", "250ms"))
    ts = doc["timeseries"]
    assert ts["interval_ms"] == 250
    assert round(ts["start_ts"] * 1000) % 250 == 0
    for name, p in doc["summary"]["paths"].items():
        assert sum(e["requests"] for e in ts["paths"][name]) == p["requests"], name
    roc = ts["paths"]["ROC"]
    assert any(e.get("hops", {}).get("router", {}).get("own_ms", {}).get("count") for e in roc)
    assert isinstance(doc["knees"], list)


def test_jsonl_writes_time_series_records_when_asked() -> None:
    plain = _report("--format", "jsonl")
    assert '"type":"timeseries"' not in plain
    lines = [json.loads(x) for x in _report("--format", "jsonl", "--interval", "1s").splitlines()]
    rows = [x for x in lines if x["type"] == "timeseries"]
    assert rows and all(r["interval_ms"] == 1000 for r in rows)
    by_path: dict[Any, int] = {}
    for r in rows:
        by_path[r["path"]] = by_path.get(r["path"], 0) + r["requests"]
    # the profile beside the capture names the client-facing hops: ROC's edge, DPF
    json_doc = json.loads(_report("--format", "json", "--interval", "1s"))
    for name in ("ROC", "DPF"):
        assert by_path[name] == json_doc["summary"]["paths"][name]["requests"]


def test_bad_interval_is_a_usage_error() -> None:
    res = CliRunner().invoke(main, ["report", str(ANTHO), "--interval", "fast"])
    assert res.exit_code == 2 and "not a duration" in res.output


def test_paths_json_has_the_time_series() -> None:
    res = CliRunner().invoke(main, ["paths", str(ANTHO), "--format", "json", "--interval",
                                    "200ms"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["timeseries"]["interval_ms"] == 200
    assert set(doc["timeseries"]["paths"]) >= {"ROC", "DPF"}


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_interval_counts_match_tsharks_request_frames() -> None:
    """Independent truth: tshark's HTTP/2 request HEADERS frames (decrypted with the
    capture's keys), to the client-facing servers the lab's ledger names per path,
    binned with the report's intervals. A request within 1 ms of an interval's edge
    may fall on either side (tshark times the packet completing the frame)."""
    ledger = json.loads((ROOT / "captures" / "antho.expected.json").read_text())
    servers = {"ROC": {ledger["servers"]["edge"]["address"]},
               "DPF": {o["address"] for o in ledger["servers"]["dpf_origins"]}}
    keys = ROOT / "captures" / "antho.keys"
    out = subprocess.run(
        ["tshark", "-n", "-r", str(ANTHO), "-o", f"tls.keylog_file:{keys}",
         "-Y", "http2.type == 1 && http2.headers.method", "-T", "fields", "-E", "occurrence=a",
         "-e", "frame.time_epoch", "-e", "ip.dst", "-e", "tcp.dstport",
         "-e", "http2.headers.method"],
        capture_output=True, text=True, check=True, timeout=120).stdout
    times: dict[str, list[float]] = {"ROC": [], "DPF": []}
    for line in out.splitlines():
        ts, ip, port, methods = line.split("\t")
        for name, eps in servers.items():
            if f"{ip}:{port}" in eps:
                times[name] += [float(ts)] * len(methods.split(","))
    doc = json.loads(_report("--format", "json", "--interval", "100ms"))
    ts_doc = doc["timeseries"]
    width = ts_doc["interval_ms"] / 1000
    for name, ref in times.items():
        assert len(ref) == ledger["paths"][name]["requests"]
        series = ts_doc["paths"][name]
        got = {round((e["start_ts"] - ts_doc["start_ts"]) / width): e["requests"] for e in series}
        want: dict[int, int] = {}
        edge = 0
        for t in ref:
            k = int((t - ts_doc["start_ts"]) // width)
            want[k] = want.get(k, 0) + 1
            frac = (t - ts_doc["start_ts"]) / width - k
            edge += frac < 0.01 or frac > 0.99
        diff = sum(abs(got.get(k, 0) - want.get(k, 0)) for k in set(got) | set(want))
        assert sum(got.values()) == len(ref)
        assert diff <= 2 * edge, (name, got, want)
