"""The lab with HTTP/3: the edge's QUIC listener, the h3 ROC client, its ledger."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from labtools import LIVE

from netdiag.lab import LabParams
from netdiag.lab import params as P

pytestmark = [pytest.mark.slow, LIVE, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def h3_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from netdiag.lab import run_lab

    out = tmp_path_factory.mktemp("h3") / "lab.pcapng"
    params = LabParams(requests=6, sse_share=0.5, client_protocol="h3", netns=True)
    return {"params": params, "out": out, "ledger": run_lab(out, params)}


def test_h3_requests_go_through_the_edge_to_the_origins(h3_run: dict[str, Any]) -> None:
    led, p = h3_run["ledger"], h3_run["params"]
    assert led["errors"] == [] and led["capture_drops"] == 0
    assert led["paths"]["ROC"]["statuses"] == {"200": 6}
    assert led["paths"]["DPF"]["statuses"] == {"200": 6}
    assert led["quic_connections"] == {"clients": 1}
    assert led["servers"]["edge"]["http3"]["address"] == f"{P.EDGE_IP}:{P.EDGE_PORT}"
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    assert {r["protocol"] for r in roc} == {"h3"}
    for r in roc:
        assert r["headers"]["via"] == "roc-edge" and r["headers"]["x-router"] == "roc-router"
        assert set(r["hops"]) == {"edge", "router", "origin"}
        if r["kind"] == "sse":
            assert r["events"] == p.sse_events
    chains = {c["request_id"]: c for c in led["chains"]}
    for r in roc:
        chain = chains[r["request_id"]]
        assert chain["client"] == {"client": r["client"], "server": "127.0.0.10:443",
                                   "stream_id": r["stream_id"], "ordinal": None}
        assert [u["hop"] for u in chain["upstream"]] == ["router", "token-store", "origin"]


def test_the_ledger_has_the_clients_timers(h3_run: dict[str, Any]) -> None:
    led = h3_run["ledger"]
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    quic = [c for c in led["connection_log"] if c.get("transport") == "quic"]
    assert len(quic) == 1 and quic[0]["alpn"] == "h3" and quic[0]["tls_version"] == "TLS 1.3"
    assert sorted(r["stream_id"] for r in roc) == [0, 4, 8, 12, 16, 20]
    for r in roc:
        assert r["client"] == quic[0]["client"] and r["client"].startswith("127.0.0.2:")
        assert r["sent_ts"] * 1e9 <= r["request_ns"] + 1000
        assert r["request_ns"] < r["first_byte_ns"] <= r["last_byte_ns"]
        assert 0 < r["client_ttfb_ms"] <= r["client_total_ms"]
        # the origin's think time is in the client's TTFB
        assert r["client_ttfb_ms"] >= led["delays_ms"]["roc_think"]
        assert r["hops"]["edge"]["received_ts"] * 1e9 >= r["request_ns"] - 1e6


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")
def test_the_capture_decrypts_with_its_embedded_keys(h3_run: dict[str, Any]) -> None:
    """tshark finds, with the key log the capture embeds, one request HEADERS frame
    per h3 request, on the client's UDP port and the ledger's stream ids."""
    led = h3_run["ledger"]
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    port = roc[0]["client"].rsplit(":", 1)[1]
    out = subprocess.run(
        ["tshark", "-r", str(h3_run["out"]), "-Y",
         f"udp.srcport == {port} && http3.frame_type == 1", "-T", "fields",
         "-e", "quic.stream.stream_id"], capture_output=True, text=True, timeout=60)
    ids = {int(x) for line in out.stdout.split() for x in line.split(",")}
    assert {r["stream_id"] for r in roc} <= ids, out.stdout


def test_http3_on_leaves_h2_clients_alone_and_advertises_alt_svc(
        tmp_path: Path) -> None:
    from netdiag.lab import run_lab

    led = run_lab(tmp_path / "lab.pcapng", LabParams(requests=3, http3=True, netns=True))
    assert led["errors"] == []
    roc = [r for r in led["request_log"] if r["path"] == "ROC"]
    assert roc and all("protocol" not in r for r in roc)
    assert {r["headers"]["alt-svc"] for r in roc} == {'h3=":443"'}
    assert {r["headers"]["alt-svc"] for r in led["request_log"] if r["path"] == "DPF"} == {
        None}
    assert "quic_connections" in led and led["quic_connections"] == {"clients": 0}
