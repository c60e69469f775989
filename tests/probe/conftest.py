"""The probe tests' live lab: ``lab_server.py`` in its own process (see its docstring).

The ``lab`` fixture (session scope) starts it, reads where everything listens, and
stops it at the end. Only loopback addresses (127.0.0.151-156) and free ports.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REFUSED_IP = "127.0.0.156"


def _free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """Where everything listens, the CA to trust, and the capture switch."""

    H2_IP, TLS12_IP = "127.0.0.151", "127.0.0.152"
    DNS_SLOW_IP, DNS_FAST_IP, BLACKHOLE_IP = "127.0.0.153", "127.0.0.154", "127.0.0.155"
    H2_NAME, TLS12_NAME, NX_NAME = "api.probe.test", "tls12.probe.test", "nowhere.probe.test"
    H2_THINK_MS, TLS12_THINK_MS, DNS_DELAY_MS = 20.0, 10.0, 10.0

    proc: subprocess.Popen[str]
    cafile: Path
    h2: str
    tls12: str
    dns_slow: str
    dns_fast: str
    blackhole: str
    refused: str

    @property
    def h2_port(self) -> int:
        return int(self.h2.rsplit(":", 1)[1])

    @property
    def tls12_port(self) -> int:
        return int(self.tls12.rsplit(":", 1)[1])

    def url(self, name: str | None = None, port: int | None = None,
            path: str = "/v1/messages") -> str:
        return f"https://{name or self.H2_NAME}:{port or self.h2_port}{path}"

    def _ask(self, line: str, timeout: float = 30.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return _readline(self.proc, timeout)

    @contextlib.contextmanager
    def capture(self, out: Path) -> Iterator[None]:
        """Sniff ``lo`` (the lab's addresses) in the lab process while the body runs."""
        answer = self._ask(f"capture {out}")
        assert answer == "ok", answer
        try:
            yield
        finally:
            answer = self._ask("stop")
            assert answer.startswith("ok "), answer


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        raise RuntimeError(f"the lab process did not answer (exit status {proc.poll()})")
    return box[0].strip()


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("probe-lab")
    proc = subprocess.Popen([sys.executable, str(HERE / "lab_server.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info: dict[str, Any] = json.loads(_readline(proc, 60))
        cafile = tmp / "ca.pem"
        cafile.write_text(info.pop("ca_pem"))
        yield Lab(proc=proc, cafile=cafile, refused=f"{REFUSED_IP}:{_free_port(REFUSED_IP)}",
                  **info)
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
