"""A ramp's clients in a process of their own: ``python -m netdiag.lab.loadgen``.

An open-loop load is only as good as its clock: every request must leave at its
scheduled time. In the lab's own process the driver would share the interpreter
lock with the capture's thread (which parses every packet in Python), and a busy
sniffer would hold the schedule back; so with ``LabParams.ramp`` the driver
(``netdiag.lab.driver.Driver``) runs here, alone, at a real-time priority when
permitted, and hands its ledger back as JSON.

Protocol: the parent writes one JSON job on stdin (``params``, ``ca``, ``keylog``,
``timeout_s``, ``result``); the child runs the load (and the ``roc_resume`` request),
writes ``{"ledger": ...}`` or ``{"error": ...}`` to the ``result`` file and exits. It
is in a session of its own (a Ctrl-C reaches the parent, which stops it) and the
kernel kills it should the parent die first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from netdiag.lab.errors import LabError

GRACE_S = 5.0
"""How long the child may take beyond the load's time limit to write its ledger."""


def run_load(params: Any, ca: Path, keylog: Path | None, timeout_s: float,
             workdir: Path) -> Any:
    """Run a ramp's load in a child process; its ``netdiag.lab.driver.Ledger``."""
    import netdiag
    from netdiag.lab.driver import Ledger
    from netdiag.lab.redis_store import _die_with_parent

    result = workdir / "load.json"
    result.unlink(missing_ok=True)
    job = {"params": dataclasses.asdict(params), "ca": str(ca),
           "keylog": str(keylog) if keylog is not None else None,
           "timeout_s": timeout_s, "result": str(result)}
    env = dict(os.environ)
    root = str(Path(netdiag.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("SSLKEYLOGFILE", None)  # only the lab decides where secrets go
    log = workdir / "loadgen.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "netdiag.lab.loadgen"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                env=env, start_new_session=True, preexec_fn=_die_with_parent,
                                close_fds=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
        try:
            proc.wait(timeout_s + GRACE_S)
        except subprocess.TimeoutExpired:
            raise LabError(f"the load did not finish within the lab's time limit "
                           f"({params.run_timeout_s:g} s)") from None
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(3)
    try:
        reply = json.loads(result.read_text())
    except (OSError, ValueError):
        tail = ""
        with contextlib.suppress(OSError):
            lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
            tail = f": {lines[-1].strip()}" if lines else ""
        raise LabError(f"the lab's load process exited with status {proc.returncode} "
                       f"without a ledger{tail}") from None
    if "error" in reply:
        raise LabError(str(reply["error"]))
    return Ledger(**reply["ledger"])


def _child() -> int:  # pragma: no cover - runs in the child
    from netdiag.lab.certs import client_ssl_context
    from netdiag.lab.driver import Driver
    from netdiag.lab.params import LabParams

    job = json.loads(sys.stdin.read())
    result = Path(job["result"])
    raw = dict(job["params"])
    raw["models"] = tuple(raw["models"])
    p = LabParams(**raw)
    ctx = client_ssl_context(Path(job["ca"]).read_bytes(),
                             Path(job["keylog"]) if job["keylog"] else None)
    driver = Driver(p, ctx)

    async def run() -> None:
        try:
            await asyncio.wait_for(driver.run(), job["timeout_s"])
        except TimeoutError:
            raise LabError(f"the load did not finish within the lab's time limit "
                           f"({p.run_timeout_s:g} s)") from None

    try:
        asyncio.run(run())
        if p.roc_resume:
            driver.resumed_request()
    except LabError as exc:
        result.write_text(json.dumps({"error": str(exc)}))
        return 1
    except KeyboardInterrupt:
        return 130
    result.write_text(json.dumps({"ledger": dataclasses.asdict(driver.ledger)}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child())
