"""The lab's server processes, seen from the parent: start, command, stop.

Each role (``netdiag.lab.serve.ROLES``) is ``python -m netdiag.lab.serve ROLE`` in a
session of its own (a Ctrl-C reaches the parent only, which then stops everything in
order), killed by the kernel should the parent die first. Commands and answers are
JSON lines on the child's stdin and stdout; its stderr goes to a log file in the
lab's temporary directory, whose last line explains a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import netdiag
from netdiag.lab.errors import LabError
from netdiag.lab.redis_store import _die_with_parent


class ServerProcess:
    """One role's process."""

    def __init__(self, role: str, cfg: dict[str, Any], logdir: Path) -> None:
        self.role = role
        self.cfg = cfg
        self.log = logdir / f"{role}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()

    def launch(self) -> None:
        env = dict(os.environ)
        root = str(Path(netdiag.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        env.pop("SSLKEYLOGFILE", None)  # only the lab decides where secrets go
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "netdiag.lab.serve", self.role],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, bufsize=0,
                start_new_session=True, preexec_fn=_die_with_parent, close_fds=True)
        self._send(json.dumps(self.cfg))

    def _send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise LabError(f"the lab's {self.role} process is gone{self._why()}") from exc

    def _read(self, timeout: float) -> dict[str, Any]:
        """The child's next answer line (read in large chunks: a ``stats`` answer with
        the hop logs of a long run is megabytes)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + max(timeout, 0.0)
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
            if not ready:
                raise LabError(f"the lab's {self.role} process did not answer within "
                               f"{timeout:.0f} s{self._why()}")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(2)
                raise LabError(f"the lab's {self.role} process exited{self._why()}")
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise LabError(str(reply["error"]))
        return reply

    def _why(self) -> str:
        try:
            lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()}" if lines else ""

    def wait_ready(self, timeout: float) -> None:
        self._read(timeout)

    def command(self, cmd: str, timeout: float = 10.0) -> dict[str, Any]:
        self._send(cmd)
        return self._read(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.write(b"stop\n")
                    proc.stdin.flush()
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(3)
        finally:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


class LabServers:
    """Every role of the lab, each in its process."""

    def __init__(self, cfg: dict[str, Any], logdir: Path) -> None:
        from netdiag.lab.serve import ROLES

        self.procs = {role: ServerProcess(role, cfg, logdir) for role in ROLES}

    def start(self, timeout: float = 20.0) -> None:
        """Launch every role at once, then wait until each is bound and serving."""
        try:
            for proc in self.procs.values():
                proc.launch()
            deadline = time.monotonic() + timeout
            for proc in self.procs.values():
                proc.wait_ready(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise

    def command(self, role: str, cmd: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.procs[role].command(cmd, timeout)

    def stats(self, role: str) -> dict[str, Any]:
        return dict(self.command(role, "stats")["stats"])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every role (all asked at once, then each waited for)."""
        for proc in self.procs.values():
            if proc.proc is not None and proc.proc.poll() is None and proc.proc.stdin:
                with contextlib.suppress(OSError):
                    proc.proc.stdin.write(b"stop\n")
                    proc.proc.stdin.flush()
        errors: list[BaseException] = []
        for proc in self.procs.values():
            try:
                proc.stop(timeout)
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
