"""``s3://`` inputs through fsspec (s3fs) against a real S3 server on loopback: moto's
server (``ThreadedMotoServer``, HTTP on 127.0.0.1), which the test starts and stops. The
client and every worker reach it through the standard AWS environment
(``AWS_ENDPOINT_URL``), as they would reach a bucket on AWS with its credentials."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fleetcaps as fc
import pytest
from click.testing import CliRunner

from netdiag.cli import cli

BUCKET = "incident-42"
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var, value in (("AWS_ENDPOINT_URL", s3_server), ("AWS_ACCESS_KEY_ID", "testing"),
                       ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION",
                                                              "us-east-1")):
        monkeypatch.setenv(var, value)
    for var in ("NETDIAG_JOBS", "NETDIAG_EXECUTOR", "NETDIAG_DASK_SCHEDULER", "AWS_PROFILE",
                "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server})
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hosts of three rotated files each, connections crossing the cuts."""
    return fc.rotated_hosts(tmp_path_factory.mktemp("s3caps") / "caps", "ab", 300, 3, 40)


def report(*args: str, code: int = 0) -> dict[str, Any]:
    r = CliRunner().invoke(cli, ["report", "--no-profile", "--format", "json", *args],
                           catch_exceptions=False)
    assert r.exit_code == code, r.stderr
    return json.loads(r.stdout)


def _without_files(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    doc["capture"]["files"] = None
    for g in doc.get("groups") or []:
        g["files"] = [f.rpartition("/")[2] for f in g["files"]]
    return doc


def _upload(fs: Any, caps: Path, prefix: str) -> list[str]:
    urls = []
    for p in sorted(caps.rglob("*.pcap")):
        key = f"{BUCKET}/{prefix}/{p.relative_to(caps).as_posix()}"
        fs.pipe(key, p.read_bytes())
        urls.append(f"s3://{key}")
    return urls


def test_s3_bucket_reports_as_local_files(s3_env: Any, hosts: Path) -> None:
    urls = _upload(s3_env, hosts, "serial")
    local = report(str(hosts), "--by", "host", "--executor", "serial")
    for src in (f"s3://{BUCKET}/serial", f"s3://{BUCKET}/serial/host-*/ring_*.pcap"):
        doc = report(src, "--by", "host", "--executor", "serial")
        assert doc["capture"]["files"] == urls
        assert [g["key"] for g in doc["groups"]] == [g["key"] for g in local["groups"]]
        assert _without_files(doc) == _without_files(local)
    r = CliRunner().invoke(cli, ["report", f"s3://{BUCKET}/serial/nothing.pcap"])
    assert r.exit_code == 1 and "no such file" in str(r.exception)


@pytest.mark.slow
def test_s3_on_a_local_dask_cluster(s3_env: Any, hosts: Path) -> None:
    """The workers (spawned processes) open the objects themselves, with the
    environment's endpoint and credentials."""
    pytest.importorskip("distributed")
    _upload(s3_env, hosts, "dask")
    serial = report(f"s3://{BUCKET}/dask", "--by", "host", "--executor", "serial")
    # in a process of its own: a local cluster leaves multiprocessing's resource tracker
    # running in the process that started it
    got = subprocess.run([sys.executable, "-m", "netdiag", "report", "--no-profile",
                          "--format", "json", f"s3://{BUCKET}/dask", "--by", "host",
                          "--executor", "dask", "--workers", "2"],
                         capture_output=True, timeout=300, cwd=ROOT, env=os.environ.copy())
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    assert json.loads(got.stdout) == serial
