"""HTTP/3 options of the lab: their checks and the command line (no servers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netdiag.lab import LabParams

ROOT = Path(__file__).resolve().parents[2]


def test_http3_is_off_by_default_and_h3_clients_imply_it() -> None:
    p = LabParams()
    assert (p.http3, p.client_protocol) == (False, "h2")
    assert LabParams(client_protocol="h3").http3 is True
    assert LabParams(http3=True).client_protocol == "h2"
    assert LabParams(client_protocol="h3").to_json()["http3"] is True
    for bad in ({"client_protocol": "h1"}, {"client_protocol": "h3", "roc_resume": True},
                {"client_protocol": "h3", "ramp": (1, 2, 3)}):
        with pytest.raises(ValueError):
            LabParams(**bad)


def test_lab_command_has_the_options_and_refuses_h3_ramps() -> None:
    run = [sys.executable, "-m", "netdiag", "lab"]
    p = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and "--http3" in p.stdout and "--client-protocol" in p.stdout
    p = subprocess.run([*run, "-w", "/nonexistent/x.pcapng", "--client-protocol", "h4"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
