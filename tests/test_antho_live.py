"""Live lab: run captures/make_antho.py and check the capture against what it did.

Starts real DNS and HTTPS servers on 127.0.0.10/20/53, drives real clients, sniffs
``lo``; needs root (raw socket, ports 53 and 443) and tshark for the cross-checks.
Every figure compared comes from the returned dict, none is hard-coded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "captures" / "make_antho.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tshark,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.geteuid() != 0,
        reason="needs root on Linux (raw socket on lo, ports 53 and 443)",
    ),
]


def _load_script():
    spec = importlib.util.spec_from_file_location("make_antho", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tshark(capture: Path, display_filter: str, *fields: str, keylog: Path | None = None):
    cmd = ["tshark", "-n", "-r", str(capture)]
    if keylog is not None:
        cmd += ["-o", f"tls.keylog_file:{keylog}"]
    cmd += ["-Y", display_filter, "-T", "fields"]
    for field in fields:
        cmd += ["-e", field]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    module = _load_script()
    tmp = tmp_path_factory.mktemp("antho")
    out, keylog = tmp / "antho.pcapng", tmp / "antho.keys"
    before = set(threading.enumerate())
    result = module.make_capture(out, keylog)
    leftover = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    return {"out": out, "keylog": keylog, "result": result, "leftover": leftover}


@pytest.mark.timeout(120)
def test_capture_is_written_and_clean(lab):
    out, result = lab["out"], lab["result"]
    assert lab["leftover"] == [], "servers or sniffer left threads behind"
    assert out.stat().st_size < 500_000
    expected = json.loads(out.with_name("antho.expected.json").read_text())
    assert expected == json.loads(json.dumps(result))
    # tshark reads it without complaint
    proc = subprocess.run(
        ["tshark", "-n", "-r", str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "appears to have been cut short" not in proc.stderr
    frames = _tshark(out, "frame", "frame.time_epoch")
    assert len(frames) == result["packets"]
    # at least microsecond resolution: the file keeps the kernel's nanoseconds
    stamps = [row[0] for row in frames]
    assert all(len(s.split(".")[1]) >= 6 for s in stamps)
    assert any(not s.endswith("000") for s in stamps)
    # only the lab's addresses, nothing else from loopback
    lab_ips = {result["params"][k] for k in ("roc_ip", "dpf_ip", "dns_ip")}
    for src, dst in _tshark(out, "ip", "ip.src", "ip.dst"):
        assert src in lab_ips or dst in lab_ips


@pytest.mark.timeout(120)
def test_dns_matches(lab):
    out, result = lab["out"], lab["result"]
    queries = _tshark(out, "dns.flags.response == 0", "dns.qry.name")
    assert len(queries) == result["dns_queries"]
    assert sorted(q[0] for q in queries) == sorted(d["qname"] for d in result["dns_log"])
    over_tcp = _tshark(out, "dns.flags.response == 0 && tcp", "dns.qry.name")
    assert len(over_tcp) == result["dns_transports"].get("tcp", 0)
    nxdomain = _tshark(out, "dns.flags.response == 1 && dns.flags.rcode == 3", "dns.qry.name")
    assert len(nxdomain) == result["dns_nxdomain"]
    answered = _tshark(out, "dns.flags.response == 1", "dns.id")
    assert len(answered) == result["dns_queries"]


@pytest.mark.timeout(120)
def test_connections_and_tls_match(lab):
    out, result = lab["out"], lab["result"]
    params = result["params"]
    syns = _tshark(out, "tcp.flags.syn == 1 && tcp.flags.ack == 0", "ip.dst", "tcp.dstport")
    per_server = Counter((ip, int(port)) for ip, port in syns)
    port = params["https_port"]
    assert per_server[(params["roc_ip"], port)] == result["connections"]["roc"]
    assert per_server[(params["dpf_ip"], port)] == result["connections"]["dpf"]
    assert per_server[(params["dns_ip"], params["dns_port"])] == (
        result["dns_transports"].get("tcp", 0)
    )
    assert sum(per_server.values()) == (
        sum(result["connections"].values()) + result["dns_transports"].get("tcp", 0)
    )
    hellos = _tshark(
        out,
        "tls.handshake.type == 2",
        "tls.handshake.extensions.supported_version",
        "tls.handshake.extension.type",
    )
    versions = Counter("TLS 1.3" if row[0] == "0x0304" else "TLS 1.2" for row in hellos)
    assert dict(versions) == result["tls_versions"]
    resumed = [row for row in hellos if "41" in row[1].split(",")]  # pre_shared_key
    assert len(resumed) == result["tls_resumed"]
    assert _tshark(out, "tcp.flags.reset == 1", "frame.number") == []


@pytest.mark.timeout(120)
def test_http2_requests_decrypt_and_match(lab):
    out, keylog, result = lab["out"], lab["keylog"], lab["result"]
    params = result["params"]
    assert keylog.stat().st_size > 0
    rows = _tshark(
        out,
        "http2.headers.method",
        "ip.dst",
        "http2.headers.method",
        "http2.headers.path",
        keylog=keylog,
    )
    by_server: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for dst, methods, frame_paths in rows:
        by_server[dst] += len(methods.split(","))
        paths.update(frame_paths.split(","))
    assert by_server[params["roc_ip"]] == result["requests"]["roc"]
    assert by_server[params["dpf_ip"]] == result["requests"]["dpf"]
    logged = Counter(r["path"] for c in result["connection_log"] for r in c["requests"])
    assert paths == logged
    # every request got its response: as many response HEADERS with :status
    statuses = _tshark(out, "http2.headers.status", "http2.headers.status", keylog=keylog)
    assert sum(len(s[0].split(",")) for s in statuses) == sum(result["requests"].values())
    # the stream carried the configured number of events
    streamed = [
        r for c in result["connection_log"] for r in c["requests"] if r["path"] == "/v1/stream"
    ]
    assert len(streamed) == result["sse_streams"]
    assert all(r["events"] == params["sse_events"] for r in streamed)
