"""``netdiag paths`` as a user meets it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from paths_synth import PROFILE

ROOT = Path(__file__).resolve().parents[2]
ANTHO = ROOT / "captures" / "antho.pcapng"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netdiag", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_listed_in_help() -> None:
    p = run("--help")
    assert p.returncode == 0 and "paths" in p.stdout
    p = run("paths", "--help")
    assert p.returncode == 0 and "--profile" in p.stdout


def test_text_without_profile() -> None:
    p = run("paths", str(ANTHO), "--connections", "--no-profile")
    assert p.returncode == 0, p.stderr
    assert "Latency budget" in p.stdout and "(inferred)" in p.stdout
    assert "time to first byte" in p.stdout and "Attribution" in p.stdout
    assert "Traceback" not in p.stderr


def test_json_with_profile(tmp_path: Path) -> None:
    prof = tmp_path / "paths.toml"
    prof.write_text(PROFILE)
    p = run("paths", str(ANTHO), "--profile", str(prof), "--format", "json",
            "-o", str(tmp_path / "out.json"))
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["contract"] == 1 and doc["profile"] == str(prof)
    assert set(doc) >= {"capture", "paths", "path_comparison", "findings", "connections"}
    for c in doc["connections"]:
        if c["protocol"] == "dns":
            assert c["path"] is None
        else:
            assert c["path"] is not None and set(c["path"]) == {"name", "hop", "evidence",
                                                                "inferred"}
    for name, block in doc["paths"].items():
        assert isinstance(name, str) and block["requests"] >= 0
        assert {"requests", "connections", "reuse_rate", "ttfb_ms", "phases"} <= set(block)


def test_bad_profile_is_one_line_with_the_line_number(tmp_path: Path) -> None:
    prof = tmp_path / "paths.toml"
    prof.write_text('version = 1\n[[path]]\nname = "A"\nhops = ["o"]\n[[path.rule]]\n'
                    'server = ["10.0.0.300/32"]\n')
    p = run("paths", str(ANTHO), "--profile", str(prof))
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        f'netdiag: error: {prof}:6: bad CIDR "10.0.0.300/32" in server: '
        "'10.0.0.300/32' does not appear to be an IPv4 or IPv6 network"]
    missing = run("paths", str(ANTHO), "--profile", str(tmp_path / "nope.toml"))
    assert missing.returncode == 1 and "cannot read profile" in missing.stderr


def test_missing_capture() -> None:
    p = run("paths", "/nonexistent.pcapng")
    assert p.returncode == 1 and "Traceback" not in p.stderr
