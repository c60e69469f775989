"""Live lab: run captures/make_antho.py and check the capture against the lab's ledger.

The script runs the netdiag lab (DNS, ROC edge, router, Redis, origins, DPF origins on
127.0.0.0/8) with the shipped parameters into a temporary directory; tshark then
reads the capture (keys from the key log, and from the capture's own
decryption-secrets block) and every figure is compared with what the lab's clients,
edge and router say they did. None is hard-coded. Needs root on Linux, redis-server
and tshark.
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
        reason="needs root on Linux (packet socket on lo, ports 53 and 443)",
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None
                       and not os.access("/usr/bin/redis-server", os.X_OK),
                       reason="needs redis-server"),
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


def _children() -> set[int]:
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry.name))
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    module = _load_script()
    tmp = tmp_path_factory.mktemp("antho")
    out, keylog = tmp / "antho.pcapng", tmp / "antho.keys"
    before, children = set(threading.enumerate()), _children()
    result = module.make_capture(out, keylog)
    leftover = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    return {"out": out, "keylog": keylog, "result": result, "leftover": leftover,
            "children": _children() - children}


def _ip(ep: str) -> str:
    return ep.rpartition(":")[0]


@pytest.mark.timeout(120)
def test_capture_is_written_and_clean(lab):
    out, result = lab["out"], lab["result"]
    assert lab["leftover"] == [], "servers or the capture left threads behind"
    assert lab["children"] == set(), "server processes or redis-server left behind"
    assert out.stat().st_size < 1_000_000
    expected = json.loads(out.with_name("antho.expected.json").read_text())
    assert expected == json.loads(json.dumps(result))
    assert out.with_name("antho.paths.toml").read_text().startswith("# Path profile")
    assert result["capture_drops"] == 0 and result["errors"] == []
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
    servers = result["servers"]
    lab_ips = {_ip(servers[k]["address"]) for k in ("dns", "edge", "router", "token_store")}
    lab_ips |= {_ip(o["address"]) for o in servers["roc_origins"] + servers["dpf_origins"]}
    lab_ips |= set(servers["clients"].values())
    for src, dst in _tshark(out, "ip", "ip.src", "ip.dst"):
        assert src in lab_ips and dst in lab_ips


@pytest.mark.timeout(120)
def test_dns_matches(lab):
    out, result = lab["out"], lab["result"]
    queries = _tshark(out, "dns.flags.response == 0", "dns.qry.name", "ip.src")
    assert len(queries) == result["dns_queries"]
    assert sorted((q[0], q[1]) for q in queries) == sorted(
        (d["qname"], d["client"]) for d in result["dns_log"])
    over_tcp = _tshark(out, "dns.flags.response == 0 && tcp", "dns.qry.name")
    assert len(over_tcp) == result["dns_transports"].get("tcp", 0) >= 1
    nxdomain = _tshark(out, "dns.flags.response == 1 && dns.flags.rcode == 3", "dns.qry.name")
    assert len(nxdomain) == result["dns_nxdomain"] >= 1
    answered = _tshark(out, "dns.flags.response == 1", "dns.id")
    assert len(answered) == result["dns_queries"]


@pytest.mark.timeout(120)
def test_connections_and_tls_match(lab):
    out, result = lab["out"], lab["result"]
    servers = result["servers"]
    syns = _tshark(out, "tcp.flags.syn == 1 && tcp.flags.ack == 0", "ip.src", "ip.dst",
                   "tcp.dstport")
    to = Counter(f"{dst}:{port}" for _src, dst, port in syns)
    edge = servers["edge"]["address"]
    roc_origins = {o["address"] for o in servers["roc_origins"]}
    dpf_origins = {o["address"] for o in servers["dpf_origins"]}
    tcp = result["tcp_connections"]
    assert to[edge] == result["connections"]["roc"]
    assert sum(to[a] for a in dpf_origins) == result["connections"]["dpf"]
    assert to[servers["router"]["address"]] == tcp["edge_router"] == 1
    assert sum(to[a] for a in roc_origins) == tcp["router_origin"] == (
        result["router"]["upstream_connections"]) == result["requests"]["roc"]
    assert to[servers["token_store"]["address"]] == tcp["router_redis"]
    assert to[servers["dns"]["address"]] == tcp["dns"] == result["dns_transports"]["tcp"]
    assert len(syns) == sum(tcp.values())
    # each hop connects from its own address
    by_src = Counter(src for src, _dst, _port in syns)
    for path in ("roc", "dpf"):
        client = servers["clients"][path]
        dns_tcp = sum(1 for d in result["dns_log"]
                      if d["transport"] == "tcp" and d["client"] == client)
        assert by_src[client] == result["connections"][path] + dns_tcp
    assert by_src["127.0.0.10"] == tcp["edge_router"]
    assert by_src["127.0.0.11"] == tcp["router_origin"] + tcp["router_redis"]
    hellos = _tshark(
        out,
        "tls.handshake.type == 2",
        "tls.handshake.extensions.supported_version",
        "tls.handshake.extension.type",
    )
    versions = Counter("TLS 1.3" if row[0] == "0x0304" else "TLS 1.2" for row in hellos)
    assert dict(versions) == result["tls_versions"]
    resumed = [row for row in hellos if "41" in row[1].split(",")]  # pre_shared_key
    assert len(resumed) == result["tls_resumed"] == 1
    assert _tshark(out, "tcp.flags.reset == 1", "frame.number") == []


@pytest.mark.timeout(120)
def test_http2_requests_decrypt_and_match(lab):
    out, keylog, result = lab["out"], lab["keylog"], lab["result"]
    servers = result["servers"]
    assert keylog.stat().st_size > 0
    rows = _tshark(
        out,
        "http2.headers.method",
        "ip.dst",
        "tcp.dstport",
        "http2.headers.method",
        "http2.headers.path",
        keylog=keylog,
    )
    by_server: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    for dst, port, methods, frame_paths in rows:
        by_server[f"{dst}:{port}"] += len(methods.split(","))
        paths.update(frame_paths.split(","))
    roc, dpf = result["requests"]["roc"], result["requests"]["dpf"]
    assert by_server[servers["edge"]["address"]] == roc
    assert by_server[servers["router"]["address"]] == roc == result["edge"]["requests"]
    assert sum(by_server[o["address"]] for o in servers["roc_origins"]) == roc
    assert sum(by_server[o["address"]] for o in servers["dpf_origins"]) == dpf
    logged = Counter(r["path"] for c in result["connection_log"] for r in c["requests"])
    roc_logged = Counter(r["url_path"] for r in result["request_log"] if r["path"] == "ROC")
    assert paths == logged + roc_logged + roc_logged  # clients, edge -> router, router -> origin
    # every request got its response: as many response HEADERS with :status
    statuses = _tshark(out, "http2.headers.status", "http2.headers.status", keylog=keylog)
    assert sum(len(s[0].split(",")) for s in statuses) == dpf + 3 * roc
    # the capture decrypts by itself: its decryption-secrets block holds the same keys
    assert len(_tshark(out, "http2.headers.method", "frame.number")) == len(rows)
    # the request id travels from the ROC client through the edge and the router
    ids = _tshark(out, 'http2.header.name == "x-request-id" && http2.headers.method',
                  "ip.dst", "http2.header.value")
    seen: dict[str, set[str]] = {}
    for dst, values in ids:
        rid = next(v for v in values.split(",") if v.startswith(("roc-", "dpf-")))
        seen.setdefault(rid, set()).add(dst)
    for r in result["request_log"]:
        if r["path"] == "ROC":
            hops = seen[r["request_id"]]
            assert {"127.0.0.10", "127.0.0.11"} <= hops and len(hops) == 3, (r, hops)
    # the streams carried the configured number of events
    streamed = [r for r in result["request_log"] if r["kind"] == "sse"]
    assert len(streamed) == result["sse_streams"] >= 1
    assert all(r["events"] == result["params"]["sse_events"] for r in streamed)
