"""Run a whole lab in a fresh network namespace: ``python -m netdiag.lab.netns``.

The lab binds fixed loopback addresses (``127.0.0.10:443``, ``127.0.0.53:53``, ...):
two labs on one machine (tests, other users) would collide, and anything else
listening there (a local DNS stub on ``127.0.0.53``) would break it. In a network
namespace of its own the lab has a private ``lo`` and nothing else:

* the parent (:func:`run_in_netns`) starts ``python -m netdiag.lab.netns`` with a
  ``preexec_fn`` that calls ``unshare(CLONE_NEWNET)`` (libc, through ctypes: Python
  3.11 has no ``os.unshare``) and ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, in a session
  of its own; the job (capture path, parameters, key log path) goes on its stdin;
* the child brings ``lo`` up (``SIOCSIFFLAGS``, no ``ip`` binary needed), runs the lab
  exactly as in the current namespace (servers, ``redis-server``, DNS, clients and the
  sniffer are all its descendants, so all in the namespace), writes the capture,
  profile and ledger to the (shared) file system, and the ledger to a result file;
* the parent waits (bounded by the lab's time limit), then returns that ledger. A
  Ctrl-C, an error or a time-out in the parent is forwarded as SIGINT, so the child
  tears the lab down in order; should it not exit in time it is killed, and the
  kernel kills its own children with it (each dies with its parent). The namespace
  disappears with its last process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from netdiag.lab.errors import LabError

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
GRACE_S = 20.0
"""How long the child may take to tear down after SIGINT before it is killed."""

_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _enter_netns() -> None:  # pragma: no cover - runs in the child, before exec
    """preexec: a new network namespace, and die with the parent."""
    libc = _libc
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def netns_unavailable() -> str | None:
    """Why a network namespace cannot be created here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "creating a network namespace needs root"
    true = shutil.which("true") or "/bin/true"
    try:
        _load_libc()
        subprocess.run([true], preexec_fn=_enter_netns, close_fds=True, timeout=10,
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare(CLONE_NEWNET) failed: {exc}"
    return None


def lo_up() -> None:
    """Bring the namespace's ``lo`` up (then ``127.0.0.0/8`` is routed on it)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, ifreq))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS,
                        struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _stop_child(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGINT (the child tears the lab down), then SIGKILL if it takes too long."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


def run_in_netns(out: Path, params: Any, keylog: Path | None) -> dict[str, Any]:
    """``run_lab`` in a child process in a new network namespace; its ledger."""
    import dataclasses

    import netdiag

    _load_libc()
    work = Path(tempfile.mkdtemp(prefix="netdiag-netns-"))
    result_file = work / "result.json"
    job = {"out": str(Path(out).resolve()), "keylog": str(Path(keylog).resolve()) if keylog
           else None, "params": dataclasses.asdict(params), "result": str(result_file)}
    env = dict(os.environ)
    root = str(Path(netdiag.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "netdiag.lab.netns"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, env=env, preexec_fn=_enter_netns,
                start_new_session=True, close_fds=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise LabError(f"cannot run the lab in a network namespace: {exc}") from exc
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
            rc = proc.wait(params.run_timeout_s + 30)
        except subprocess.TimeoutExpired:
            _stop_child(proc, GRACE_S)
            raise LabError(f"the lab in its network namespace did not finish within "
                           f"{params.run_timeout_s + 30:g} s; stopped") from None
        except BaseException:  # Ctrl-C, a watchdog: the child tears down first
            _stop_child(proc, GRACE_S)
            raise
        try:
            reply = json.loads(result_file.read_text())
        except (OSError, ValueError):
            reply = {"error": f"the lab's namespace process exited with status {rc} "
                              "without a result"}
        if reply.get("interrupted"):
            raise KeyboardInterrupt
        if "error" in reply:
            raise LabError(str(reply["error"]))
        return dict(reply["result"])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def _child() -> int:  # pragma: no cover - runs in the namespace
    from netdiag.lab.lab import run_lab_here
    from netdiag.lab.params import LabParams

    job = json.loads(sys.stdin.read())
    result_file = Path(job["result"])

    def reply(obj: dict[str, Any]) -> None:
        result_file.write_text(json.dumps(obj))

    try:
        lo_up()
        raw = dict(job["params"])
        raw["models"] = tuple(raw["models"])
        params = LabParams(**raw)
        keylog = Path(job["keylog"]) if job["keylog"] else None
        result = run_lab_here(Path(job["out"]), params, keylog=keylog,
                              netns={"used": True, "note": None})
    except LabError as exc:
        reply({"error": str(exc)})
        return 1
    except KeyboardInterrupt:
        reply({"interrupted": True})
        return 130
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            reply({"error": f"in the lab's network namespace: {exc}"})
            return 1
        raise
    except Exception as exc:
        if os.environ.get("NETDIAG_DEBUG"):
            import traceback

            traceback.print_exc()
        reply({"error": f"internal error in the lab's network namespace: "
                        f"{type(exc).__name__}: {exc}"})
        return 4
    reply({"result": result})
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_child())
