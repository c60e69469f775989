"""The ROC router's token store: a real ``redis-server`` and its scripts.

The lab starts Debian's ``redis-server`` on its own address with no persistence,
loads a Lua script and the router calls it with ``EVALSHA`` once per request:

* ``BUDGET_SCRIPT`` (the default): refills a per-model budget hash by the time
  elapsed and takes the request's cost from it, atomically, as the original ROC
  design did;
* ``QUEUE_SCRIPT`` (``LabParams.router_budget_per_s``): a queueing rate limit, the
  "virtual scheduling" form of GCRA. One key (``QUEUE_KEY``) holds the time (ms, a
  float string) at which the router's next slot frees; a request arriving at
  ``now`` starts at ``max(now, next_free)``, slots ``1000 / R`` ms apart, and is
  refused when more than ``Q`` slots are ahead of it (it would wait longer than
  ``Q * 1000 / R`` ms). The reply says how long to hold the request.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import inspect
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from netdiag.lab.errors import LabError

BUDGET_SCRIPT = """
-- KEYS[1]: the budget hash of one model
-- ARGV: now_ms, cost, capacity, refill_per_s, request id (kept as last_request)
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local refill = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'last_request', ARGV[5] or '')
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'tokens', capacity, 'ts', now)
end
local last = tonumber(redis.call('HGET', KEYS[1], 'ts'))
local add = math.floor((now - last) * refill / 1000)
if add > 0 then
  local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
  if tokens + add > capacity then add = capacity - tokens end
  if add > 0 then redis.call('HINCRBY', KEYS[1], 'tokens', add) end
  redis.call('HSET', KEYS[1], 'ts', now)
end
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
if tokens < cost then
  return {0, tokens}
end
return {1, redis.call('HINCRBY', KEYS[1], 'tokens', -cost)}
"""

QUEUE_SCRIPT = """
-- KEYS[1]: the router's queue: the time (ms, a float string) its next slot frees
-- ARGV: now_ms (fractional), budget per second R, queue limit Q, request id (unused)
-- returns {1, wait_ms} (hold the request wait_ms, then serve it) or {0, wait_ms}
-- (refused: more than Q requests are already waiting); wait_ms is a string
local now = tonumber(ARGV[1])
local interval = 1000 / tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local start = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if start < now then start = now end
local wait = start - now
if wait > limit * interval + 1e-6 then
  return {0, string.format('%.6f', wait)}
end
redis.call('SET', KEYS[1], string.format('%.17g', start + interval))
return {1, string.format('%.6f', wait)}
"""
QUEUE_KEY = "roc:queue"
"""The Redis key of the router's queue (``QUEUE_SCRIPT``)."""

PR_SET_PDEATHSIG = 1


def script_sha(script: str) -> str:
    """The SHA1 ``EVALSHA`` names a script by."""
    import hashlib

    return hashlib.sha1(script.encode()).hexdigest()


def budget_key(model: str) -> str:
    """The Redis key of a model's budget hash."""
    return f"roc:budget:{model}"


def quiet_client_kwargs(cls: Any) -> dict[str, Any]:
    """Client options that make redis-py send only our commands (no CLIENT SETINFO)."""
    params = inspect.signature(cls.__init__).parameters
    if "driver_info" in params:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def find_redis_server() -> str | None:
    """Path of the ``redis-server`` binary, or None."""
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/sbin/redis-server",
                      "/usr/local/bin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec: the kernel kills redis-server if the lab's process dies first."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def check_port_free(ip: str, port: int, kind: int = socket.SOCK_STREAM) -> None:
    """Raise LabError when ``ip:port`` is taken."""
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ip, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise LabError(f"{ip}:{port} is already in use (another lab running?)") from exc
        if exc.errno == errno.EACCES:
            raise LabError(f"cannot bind {ip}:{port}: permission denied (run as root)") from exc
        raise LabError(f"cannot bind {ip}:{port}: {exc.strerror or exc}") from exc
    finally:
        sock.close()


class RedisServer:
    """A ``redis-server`` subprocess on ``ip:port``: no persistence, gone on stop."""

    def __init__(self, ip: str, port: int, workdir: Path) -> None:
        self.ip = ip
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "redis.log"

    def start(self, timeout: float = 10.0) -> None:
        exe = find_redis_server()
        if exe is None:
            raise LabError("redis-server not found: install redis-server "
                           "(apt-get install redis-server)")
        check_port_free(self.ip, self.port)
        args = [exe, "--bind", self.ip, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
                "--dir", str(self.workdir), "--logfile", str(self.log),
                "--loglevel", "warning", "--databases", "1", "--unixsocket", ""]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent, close_fds=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                detail = self._log_tail()
                self.proc = None
                raise LabError(f"redis-server exited at start{': ' + detail if detail else ''}")
            if self._ping():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LabError(f"redis-server did not answer on {self.ip}:{self.port} "
                               f"within {timeout:.0f} s")
            time.sleep(0.02)

    def _ping(self) -> bool:
        try:
            with socket.create_connection((self.ip, self.port), timeout=0.5) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def queue_reply(reply: Any) -> tuple[bool, float]:
    """(admitted, wait in ms) of a ``QUEUE_SCRIPT`` reply."""
    allowed, wait = reply
    return bool(int(allowed)), float(wait.decode() if isinstance(wait, bytes) else wait)


def prepare_store(ip: str, port: int, models: list[str], capacity: int,
                  queue: bool = False) -> str:
    """Load the budget script, fill each model's budget, zero the command statistics.

    With ``queue``, also load ``QUEUE_SCRIPT`` and empty the router's queue. Runs
    before the capture starts; returns the budget script's SHA1 for ``EVALSHA``.
    """
    import redis

    client = redis.Redis(host=ip, port=port, socket_timeout=5, protocol=2,
                         **quiet_client_kwargs(redis.Redis))
    try:
        sha = str(client.script_load(BUDGET_SCRIPT))
        now = int(time.time() * 1000)
        for model in models:
            client.hset(budget_key(model), mapping={"tokens": capacity, "ts": now})
        if queue:
            client.script_load(QUEUE_SCRIPT)
            client.delete(QUEUE_KEY)
        client.config_resetstat()
    except redis.RedisError as exc:
        raise LabError(f"cannot prepare the token store: {exc}") from exc
    finally:
        client.close()
    return sha


def command_stats(ip: str, port: int) -> dict[str, int]:
    """Calls per command since ``prepare_store`` (``INFO commandstats``)."""
    import redis

    client = redis.Redis(host=ip, port=port, socket_timeout=5, protocol=2,
                         **quiet_client_kwargs(redis.Redis))
    try:
        info = client.info("commandstats")
    finally:
        client.close()
    out: dict[str, int] = {}
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        if name in ("info", "config|resetstat"):
            continue
        out[name] = int(value["calls"]) if isinstance(value, dict) else 0
    return out
