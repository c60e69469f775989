"""A real-nginx topology for the hop-chain tests: client -> nginx edge -> router -> origin.

Everything runs on loopback inside a private network namespace (``unshare --net``, lo
up), so nothing collides with other services on 127.0.0.x:

* **client** (``127.0.0.40``): httpx with ``http2=True`` over TLS, ``concurrency``
  workers over ``client_conns`` connections (one connection multiplexes several
  workers' streams), ``requests`` requests, all ``POST /v1/messages`` with a JSON body
  of varying size; some ask for a streamed (SSE) answer. Its TLS secrets go to
  ``keys.log``.
* **edge**: nginx listening on ``127.0.0.50:443 ssl http2`` (certificate from
  :func:`netdiag.lab.certs.make_certs`), ``proxy_pass`` to an ``upstream`` pool with
  ``keepalive 8`` over HTTP/1.1 (``proxy_set_header Connection ""``). nginx connects
  upstream from the default source address (127.0.0.1 on loopback), not from its listen
  address, unless ``bind_upstream`` (``proxy_bind``).
* **router** (``127.0.0.51:8080``): a second nginx (``router="nginx"``, same pooling)
  or a Python asyncio HTTP/1.1 proxy (``router="python"``) with a keep-alive pool of at
  most 8 idle connections that waits 10-25 ms (per request) before it forwards.
* **origin** (``127.0.0.52:8081``): a Python asyncio HTTP/1.1 server that thinks
  20-60 ms (per request) and answers JSON, or SSE (chunked, ``X-Accel-Buffering: no``).

Every client request carries ``x-lab-truth: N`` (nginx forwards unknown headers) and
every hop forwards it; with ``request_ids`` the client also sends ``x-request-id``
(otherwise no request id or ``traceparent`` exists anywhere). tcpdump captures ``lo``
(``netdiag.live.capture`` in a user namespace, where tcpdump cannot drop its
privileges) once every server is ready; afterwards tshark (with the key log) reads the
capture and finds, for each N, the request at each hop on the wire: its TCP stream,
endpoints, HTTP/2 stream id or HTTP/1.1 ordinal on the connection, and the frame times
of its first request byte, of its first response byte and of its connection's SYN.

Output directory: ``capture.pcap`` (``capture.pcapng`` from netdiag's capture),
``keys.log``, ``paths.toml`` (path ``ROC``, hops edge, router, origin), ``truth.json``
(parameters, the applications' own logs, capture statistics, the wire truth and
``problems``: empty when the run is complete), the nginx configurations and logs.

Standalone::

    python tests/paths/nginx_topology.py OUTDIR [--concurrency 16] [--requests 48]
        [--client-conns N] [--request-ids] [--router python|nginx] [--bind-upstream]
        [--capture auto|tcpdump|netdiag] [--seed N]

re-executes itself under ``unshare --net`` (``--inside`` is that inner run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()

CLIENT_IP = "127.0.0.40"
EDGE = ("127.0.0.50", 443)
ROUTER = ("127.0.0.51", 8080)
ORIGIN = ("127.0.0.52", 8081)
SNI = "api.nginx.test"
PATH = "/v1/messages"
TRUTH_HEADER = "x-lab-truth"
HOPS = ("edge", "router", "origin")
POOL_IDLE = 8
"""Idle keep-alive connections each proxy keeps per upstream (nginx ``keepalive 8``)."""
H2_HEADERS = "1"


@dataclass
class Params:
    """What one run of the topology does."""

    concurrency: int = 16
    requests: int = 48
    client_conns: int | None = None
    """Client connections (each an httpx client); None: one per worker."""
    request_ids: bool = False
    """Send ``x-request-id`` (else no request id exists anywhere)."""
    router: str = "python"
    """``python`` (asyncio proxy with a per-request delay) or ``nginx``."""
    bind_upstream: bool = False
    """Proxies connect upstream from their own listen address (nginx ``proxy_bind``)
    instead of the default source address."""
    seed: int = 1
    router_delay_ms: tuple[float, float] = (10.0, 25.0)
    think_ms: tuple[float, float] = (20.0, 60.0)
    sse_every: int = 4
    """Every this many requests (n % sse_every == sse_every - 1) asks for SSE."""
    capture: str = "auto"
    """``tcpdump``, ``netdiag`` or ``auto`` (tcpdump unless in a user namespace)."""
    timeout_s: float = 60.0
    upload_ms: tuple[float, float] = (0.0, 0.0)
    """Range of the time the client takes to send a request's body (in three parts
    after the headers; nginx buffers the body before it forwards the request)."""

    @property
    def conns(self) -> int:
        c = self.concurrency if self.client_conns is None else self.client_conns
        return max(1, min(c, self.concurrency))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["client_conns"] = self.conns
        return d

    def argv(self) -> list[str]:
        out = ["--concurrency", str(self.concurrency), "--requests", str(self.requests),
               "--client-conns", str(self.conns), "--router", self.router,
               "--seed", str(self.seed), "--timeout", str(self.timeout_s),
               "--capture", self.capture]
        if self.request_ids:
            out.append("--request-ids")
        if self.bind_upstream:
            out.append("--bind-upstream")
        if self.upload_ms[1] > 0:
            out += ["--upload-ms", str(self.upload_ms[0]), str(self.upload_ms[1])]
        return out


def _rng(seed: int, n: int, what: str) -> random.Random:
    return random.Random(f"{seed}:{n}:{what}")


def think_ms(p: Params, n: int) -> float:
    return _rng(p.seed, n, "think").uniform(*p.think_ms)


def router_delay_ms(p: Params, n: int) -> float:
    return _rng(p.seed, n, "router").uniform(*p.router_delay_ms)


def upload_ms(p: Params, n: int) -> float:
    return _rng(p.seed, n, "upload").uniform(*p.upload_ms) if p.upload_ms[1] > 0 else 0.0


async def _slowly(body: bytes, total_ms: float) -> AsyncIterator[bytes]:
    """The body in three parts, ``total_ms`` spread between them (httpx sends each as it
    comes: DATA frames apart in time)."""
    third = max(1, len(body) // 3)
    yield body[:third]
    await asyncio.sleep(total_ms / 2000)
    yield body[third:2 * third]
    await asyncio.sleep(total_ms / 2000)
    yield body[2 * third:]


def wants_sse(p: Params, n: int) -> bool:
    return p.sse_every > 0 and n % p.sse_every == p.sse_every - 1


# ----------------------------------------------------------------------------- HTTP/1.1


def _ep(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}"


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.append((k.strip(), v.strip()))
    return lines[0], headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    te = (_header(headers, "transfer-encoding") or "").lower()
    if "chunked" in te:
        out = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(_header(headers, "content-length") or 0)
    return await reader.readexactly(length) if length else b""


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, list[tuple[str, str]], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    start, headers = _parse_head(head)
    return start, headers, await _read_body(reader, headers)


HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "transfer-encoding",
              "content-length", "host", "upgrade", "trailer"}


class Origin:
    """HTTP/1.1 keep-alive server: thinks, then answers JSON or SSE."""

    def __init__(self, p: Params) -> None:
        self.p = p
        self.log: list[dict[str, Any]] = []
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        peer, local = _ep(writer.get_extra_info("peername")), _ep(
            writer.get_extra_info("sockname"))
        ordinal = 0
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                _start, headers, body = req
                n = int(_header(headers, TRUTH_HEADER) or -1)
                sse = False
                with contextlib.suppress(ValueError):
                    sse = bool(json.loads(body or b"{}").get("stream"))
                think = think_ms(self.p, n)
                self.log.append({"n": n, "peer": peer, "local": local, "ordinal": ordinal,
                                 "think_ms": think, "sse": sse,
                                 "request_id": _header(headers, "x-request-id")})
                ordinal += 1
                await asyncio.sleep(think / 1000)
                if sse:
                    await self._sse(writer, n)
                else:
                    pad = "x" * _rng(self.p.seed, n, "answer").randrange(50, 3000)
                    out = json.dumps({"id": f"msg_{n}", "type": "message",
                                      "content": [{"type": "text", "text": pad}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"{TRUTH_HEADER}: {n}\r\nContent-Length: {len(out)}\r\n\r\n"
                                 .encode() + out)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _sse(self, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
                     + f"{TRUTH_HEADER}: {n}\r\n".encode()
                     + b"Transfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        rng = _rng(self.p.seed, n, "sse")
        for k in range(rng.randrange(3, 6)):
            await asyncio.sleep(rng.uniform(3, 8) / 1000)
            ev = f"event: content_block_delta\ndata: {json.dumps({'n': n, 'k': k})}\n\n"
            data = ev.encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        data = b"event: message_stop\ndata: {}\n\n"
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
        await writer.drain()


class _Upstream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.local = _ep(writer.get_extra_info("sockname"))
        self.used = 0


class Router:
    """HTTP/1.1 keep-alive proxy with an upstream keep-alive pool and a delay."""

    def __init__(self, p: Params) -> None:
        self.p = p
        self.idle: list[_Upstream] = []
        self.all: set[asyncio.StreamWriter] = set()
        self.log: list[dict[str, Any]] = []

    async def _get(self) -> tuple[_Upstream, bool]:
        while self.idle:
            up = self.idle.pop()  # most recently used first, as nginx does
            if not up.reader.at_eof() and not up.writer.is_closing():
                return up, False
            up.writer.close()
        bind = (ROUTER[0], 0) if self.p.bind_upstream else None
        r, w = await asyncio.open_connection(*ORIGIN, local_addr=bind)
        self.all.add(w)
        return _Upstream(r, w), True

    def _put(self, up: _Upstream) -> None:
        if len(self.idle) < POOL_IDLE:
            self.idle.append(up)
        else:
            up.writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.all.add(writer)
        peer = _ep(writer.get_extra_info("peername"))
        ordinal = 0
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                start, headers, body = req
                n = int(_header(headers, TRUTH_HEADER) or -1)
                delay = router_delay_ms(self.p, n)
                await asyncio.sleep(delay / 1000)
                up, new = await self._get()
                entry = {"n": n, "peer": peer, "ordinal": ordinal, "delay_ms": delay,
                         "upstream": up.local, "upstream_ordinal": up.used, "new": new}
                self.log.append(entry)
                ordinal += 1
                up.used += 1
                out = [start]
                out += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
                out += [f"Host: {ORIGIN[0]}:{ORIGIN[1]}", f"Content-Length: {len(body)}"]
                up.writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
                await up.writer.drain()
                reusable = await self._relay(up.reader, writer)
                if reusable:
                    self._put(up)
                else:
                    up.writer.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.all.discard(writer)
            writer.close()

    async def _relay(self, up: asyncio.StreamReader, down: asyncio.StreamWriter) -> bool:
        """Relay one response (streaming chunked bodies chunk by chunk); whether the
        upstream connection can be reused."""
        head = await up.readuntil(b"\r\n\r\n")
        _status, headers = _parse_head(head)
        down.write(head)
        await down.drain()
        if "chunked" in (_header(headers, "transfer-encoding") or "").lower():
            while True:
                line = await up.readuntil(b"\r\n")
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    trailer = line
                    while True:
                        t = await up.readuntil(b"\r\n")
                        trailer += t
                        if t == b"\r\n":
                            break
                    down.write(trailer)
                    await down.drain()
                    return True
                down.write(line + await up.readexactly(size + 2))
                await down.drain()
        length = _header(headers, "content-length")
        if length is not None:
            down.write(await up.readexactly(int(length)))
            await down.drain()
            return (_header(headers, "connection") or "").lower() != "close"
        down.write(await up.read())
        await down.drain()
        return False

    def close(self) -> None:
        for w in list(self.all):
            w.close()


# ----------------------------------------------------------------------------- nginx


def in_user_namespace() -> bool:
    """Running in a user namespace that maps only some ids (``unshare --map-root-user``)."""
    try:
        first = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return first[:3] != ["0", "0", "4294967295"]


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
        None)


def _nginx_conf(workdir: Path, name: str, server: str, upstream: tuple[str, int],
                bind: str | None, tls: tuple[Path, Path] | None) -> Path:
    tmp = workdir / f"{name}-tmp"
    tmp.mkdir(exist_ok=True)
    listen = f"listen {server} ssl http2;" if tls is not None else f"listen {server};"
    ssl = "" if tls is None else (
        f"ssl_certificate {tls[0]};\n        ssl_certificate_key {tls[1]};\n"
        "        ssl_protocols TLSv1.2 TLSv1.3;")
    # as root the workers stay root (they touch nothing but this directory, and nginx
    # chowns its temp directories to that user); in a user namespace nginx cannot drop
    # privileges at all (initgroups is denied): one process, no workers
    user = "user root;" if os.geteuid() == 0 else ""
    master = "off" if in_user_namespace() else "on"
    text = f"""# netdiag test topology: {name} (generated by tests/paths/nginx_topology.py)
{user}
daemon off;
master_process {master};
worker_processes 1;
pid {workdir}/{name}.pid;
error_log {workdir}/{name}-error.log info;
events {{ worker_connections 1024; }}
http {{
    log_format lab '$remote_addr:$remote_port $server_protocol "$request" $status '
                   'truth=$http_x_lab_truth conn=$connection n=$connection_requests '
                   'up=$upstream_addr connect=$upstream_connect_time '
                   'header=$upstream_header_time rt=$request_time';
    access_log {workdir}/{name}-access.log lab;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream {name}_pool {{
        server {upstream[0]}:{upstream[1]};
        keepalive {POOL_IDLE};
    }}
    server {{
        {listen}
        server_name {SNI};
        {ssl}
        location / {{
            proxy_pass http://{name}_pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {f"proxy_bind {bind};" if bind else ""}
        }}
    }}
}}
"""
    path = workdir / f"{name}.conf"
    path.write_text(text)
    return path


def _start_nginx(workdir: Path, name: str, conf: Path) -> subprocess.Popen[bytes]:
    exe = nginx_binary()
    if exe is None:
        raise RuntimeError("nginx is not installed")
    out = (workdir / f"{name}-stderr.log").open("wb")
    return subprocess.Popen([exe, "-p", str(workdir), "-c", str(conf),
                             "-e", str(workdir / f"{name}-error.log")],
                            stdout=out, stderr=subprocess.STDOUT)


def _wait_port(addr: tuple[str, int], proc: subprocess.Popen[bytes] | None,
               timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {_ep(addr)} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(addr, timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{_ep(addr)} not listening after {timeout} s")


async def _wait_port_async(addr: tuple[str, int], proc: subprocess.Popen[bytes] | None) -> None:
    await asyncio.get_running_loop().run_in_executor(None, _wait_port, addr, proc)


def _stop(proc: subprocess.Popen[bytes], sig: int, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# ----------------------------------------------------------------------------- client


async def _client(p: Params, ca_pem: bytes, keylog: Path) -> list[dict[str, Any]]:
    import httpx

    from netdiag.lab.certs import client_ssl_context

    ctx = client_ssl_context(ca_pem, keylog)
    clients = [httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(http2=True, verify=ctx, local_address=CLIENT_IP,
                                           retries=0),
        timeout=httpx.Timeout(p.timeout_s / 2)) for _ in range(p.conns)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(p.requests):
        queue.put_nowait(n)
    log: list[dict[str, Any]] = []
    url = f"https://{EDGE[0]}:{EDGE[1]}{PATH}"

    async def worker(w: int) -> None:
        client = clients[w % len(clients)]
        while True:
            try:
                n = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            sse = wants_sse(p, n)
            pad = "y" * _rng(p.seed, n, "body").randrange(10, 2000)
            body = json.dumps({"model": "lab-1", "max_tokens": 64, "stream": sse,
                               "messages": [{"role": "user", "content": pad}]}).encode()
            headers = {"host": SNI, "content-type": "application/json", TRUTH_HEADER: str(n)}
            if sse:
                headers["accept"] = "text/event-stream"
            if p.request_ids:
                headers["x-request-id"] = f"req_{p.seed}_{n}_{random.getrandbits(48):012x}"
            entry: dict[str, Any] = {"n": n, "worker": w, "sse": sse, "body": len(body)}
            upload = upload_ms(p, n)
            content: bytes | AsyncIterator[bytes] = body
            if upload > 0:
                content = _slowly(body, upload)
                headers["content-length"] = str(len(body))
                entry["upload_ms"] = upload
            t0 = time.time()
            try:
                async with client.stream("POST", url, content=content, headers=headers,
                                         extensions={"sni_hostname": SNI}) as resp:
                    got = b"".join([c async for c in resp.aiter_bytes()])
                    entry.update(status=resp.status_code, http_version=resp.http_version,
                                 bytes=len(got), echoed=resp.headers.get(TRUTH_HEADER))
            except Exception as exc:  # recorded: the run is then incomplete
                entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["ms"] = (time.time() - t0) * 1000
            log.append(entry)

    try:
        await asyncio.gather(*(worker(w) for w in range(p.concurrency)))
    finally:
        for c in clients:
            await c.aclose()
    return sorted(log, key=lambda e: e["n"])


# ----------------------------------------------------------------------------- the run


def capture_tool(wanted: str = "auto") -> str:
    """``tcpdump``, or ``netdiag`` (``netdiag.live.capture``, an AF_PACKET socket) where
    tcpdump cannot run: in a user namespace it fails to drop its privileges."""
    if wanted != "auto":
        return wanted
    return "tcpdump" if shutil.which("tcpdump") and not in_user_namespace() else "netdiag"


class _Capture:
    """A capture of ``lo`` (TCP only) that is running once :meth:`start` returns."""

    def __init__(self, tool: str, out: Path) -> None:
        self.tool, self.out = tool, out
        self.proc: asyncio.subprocess.Process | None = None
        self.live: Any = None

    async def start(self) -> None:
        if self.tool == "tcpdump":
            self.proc = await _tcpdump(self.out)
            return
        from netdiag.live.capture import LiveCapture

        self.live = LiveCapture(self.out, iface="lo", bpf="tcp")
        await asyncio.get_running_loop().run_in_executor(None, self.live.start)

    async def stop(self) -> dict[str, Any]:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            assert self.proc.stderr is not None
            err = await asyncio.wait_for(self.proc.stderr.read(), 15)
            await self.proc.wait()
            return {"tool": "tcpdump", **tcpdump_stats(err.decode(errors="replace"))}
        st = await asyncio.get_running_loop().run_in_executor(None, self.live.stop)
        self.live = None
        return {"tool": "netdiag", "captured": st.packets, "dropped": st.drops,
                "error": st.error}

    def kill(self) -> None:
        """End a capture :meth:`stop` did not (after an error)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        if self.live is not None:
            with contextlib.suppress(Exception):
                self.live.stop()


async def _tcpdump(pcap: Path) -> asyncio.subprocess.Process:
    exe = shutil.which("tcpdump") or "/usr/bin/tcpdump"
    proc = await asyncio.create_subprocess_exec(
        exe, "-i", "lo", "-n", "-U", "--immediate-mode", "-B", "32768", "-s", "0",
        *(["-Z", "root"] if os.geteuid() == 0 else []), "-w", str(pcap), "tcp",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen = b""
    while b"listening on" not in seen:
        line = await asyncio.wait_for(proc.stderr.readline(), 15)
        if not line:
            raise RuntimeError(f"tcpdump exited: {seen.decode(errors='replace')}")
        seen += line
    await asyncio.sleep(0.1)
    return proc


async def _inside(outdir: Path, p: Params) -> dict[str, Any]:
    from netdiag.lab.certs import make_certs

    outdir.mkdir(parents=True, exist_ok=True)
    tls_dir = outdir / "tls"
    tls_dir.mkdir(exist_ok=True)
    ca_pem, chain, key = make_certs([SNI], tls_dir)
    (tls_dir / "ca.pem").write_bytes(ca_pem)
    keylog = outdir / "keys.log"
    keylog.unlink(missing_ok=True)
    tool = capture_tool(p.capture)
    pcap = outdir / ("capture.pcap" if tool == "tcpdump" else "capture.pcapng")
    profile = outdir / "paths.toml"
    profile.write_text(profile_text())
    origin = Origin(p)
    router = Router(p) if p.router == "python" else None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    problems: list[str] = []
    stats: dict[str, Any] = {}
    client_log: list[dict[str, Any]] = []
    servers: list[asyncio.AbstractServer] = []
    cap: _Capture | None = None
    try:
        servers.append(await asyncio.start_server(origin.handle, *ORIGIN, backlog=256))
        if router is not None:
            servers.append(await asyncio.start_server(router.handle, *ROUTER, backlog=256))
        else:
            conf = _nginx_conf(outdir, "router", f"{ROUTER[0]}:{ROUTER[1]}", ORIGIN,
                               ROUTER[0] if p.bind_upstream else None, None)
            procs["router"] = _start_nginx(outdir, "router", conf)
        conf = _nginx_conf(outdir, "edge", f"{EDGE[0]}:{EDGE[1]}", ROUTER,
                           EDGE[0] if p.bind_upstream else None, (chain, key))
        procs["edge"] = _start_nginx(outdir, "edge", conf)
        await _wait_port_async(ROUTER, procs.get("router"))
        await _wait_port_async(EDGE, procs["edge"])
        await asyncio.sleep(0.2)  # the readiness probes' connections are closed
        cap = _Capture(tool, pcap)
        await cap.start()
        try:
            client_log = await asyncio.wait_for(_client(p, ca_pem, keylog), p.timeout_s)
        except TimeoutError:
            problems.append(f"client did not finish within {p.timeout_s} s")
        # graceful shutdown inside the capture: nginx closes its keep-alive pools
        for name in ("edge", "router"):
            if name in procs:
                await asyncio.get_running_loop().run_in_executor(
                    None, _stop, procs[name], signal.SIGQUIT)
        if router is not None:
            router.close()
        for w in list(origin.writers):
            w.close()
        await asyncio.sleep(0.5)
        stats = await cap.stop()
    finally:
        if cap is not None:
            cap.kill()
        for s in servers:
            s.close()
        for proc in procs.values():
            _stop(proc, signal.SIGTERM)
    for e in client_log:
        if e.get("error") or e.get("status") != 200:
            problems.append(f"request {e['n']}: {e.get('error') or e.get('status')}")
    if len(client_log) != p.requests:
        problems.append(f"client finished {len(client_log)} of {p.requests} requests")
    if stats.get("dropped"):
        problems.append(f"the capture dropped {stats['dropped']} packets")
    if stats.get("error"):
        problems.append(f"the capture ended early: {stats['error']}")
    truth: dict[str, Any] = {
        "params": p.to_json(),
        "addresses": {"client": CLIENT_IP, "edge": _ep(EDGE), "router": _ep(ROUTER),
                      "origin": _ep(ORIGIN)},
        "files": {"capture": pcap.name, "keylog": keylog.name, "profile": profile.name},
        "capture": stats, "client_log": client_log, "origin_log": origin.log,
        "router_log": router.log if router is not None else None,
    }
    if shutil.which("tshark"):
        wire, wire_problems = wire_truth(pcap, keylog, p.requests)
        truth["wire"] = {str(n): hops for n, hops in sorted(wire.items())}
        problems += wire_problems
    else:
        truth["wire"] = None
        problems.append("tshark is not installed: no wire truth")
    truth["problems"] = problems
    (outdir / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def tcpdump_stats(stderr: str) -> dict[str, Any]:
    out: dict[str, Any] = {"stderr": stderr.strip().splitlines()[-4:]}
    for line in stderr.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0].isdigit():
            if "captured" in line:
                out["captured"] = int(words[0])
            elif "dropped by kernel" in line:
                out["dropped"] = int(words[0])
            elif "received by filter" in line:
                out["received"] = int(words[0])
    return out


def profile_text() -> str:
    rules = "".join(
        f'\n[[path.rule]]\nhop = "{hop}"\nserver = ["{addr[0]}/32"]\nport = [{addr[1]}]\n'
        for hop, addr in zip(HOPS, (EDGE, ROUTER, ORIGIN), strict=True))
    return ("# netdiag test topology: client -> nginx edge -> router -> origin\n"
            'version = 1\n\n[[path]]\nname = "ROC"\nhops = ["edge", "router", "origin"]\n'
            + rules)


# ----------------------------------------------------------------------------- tshark


class _Obj(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs, duplicate keys kept in order."""

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self:
            if k == key:
                return v
        return default


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, _Obj):
        for k, v in value:
            yield k, v
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


def _all(value: Any, key: str) -> list[str]:
    out: list[str] = []
    for k, v in _walk(value):
        if k == key:
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, list) and not isinstance(v, _Obj):
                out += [x for x in v if isinstance(x, str)]
    return out


def _first(value: Any, key: str) -> str | None:
    found = _all(value, key)
    return found[0] if found else None


@dataclass
class WireReq:
    """One request at one hop, as tshark sees it."""

    tcp_stream: int
    client: str
    server: str
    stream_id: int | None
    """HTTP/2 stream id; None for HTTP/1.1."""
    ts_ns: int
    """Frame time of its first byte (HEADERS frame / request line)."""
    truth: int | None
    request_id: str | None = None
    first_byte_ns: int | None = None
    ordinal: int = 0
    """0-based, by first byte, among the requests of its connection."""
    syn_ns: int | None = None
    """Its connection's first SYN."""
    first_on_conn: bool = False
    frames: list[int] = field(default_factory=list)
    """Frames of the request and of its first response byte (for reading them up)."""


def _ns(epoch: str) -> int:
    return int(Decimal(epoch) * 1_000_000_000)


def tshark_packets(pcap: Path, keylog: Path | None) -> list[_Obj]:
    """Each packet's ``layers`` (tshark ``-T json``, duplicate keys kept)."""
    cmd = ["tshark", "-n", "-2", "-o", "tcp.reassemble_out_of_order:TRUE",
           "-d", f"tcp.port=={ROUTER[1]},http", "-d", f"tcp.port=={ORIGIN[1]},http"]
    if keylog is not None and keylog.exists():
        cmd += ["-o", f"tls.keylog_file:{keylog}"]
    cmd += ["-r", str(pcap), "-T", "json", "-J", "frame ip tcp tcp.segments http http2"]
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"tshark exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    out = []
    for pkt in json.loads(proc.stdout or b"[]", object_pairs_hook=_Obj):
        src = pkt.get("_source")
        lay = src.get("layers") if isinstance(src, _Obj) else None
        if isinstance(lay, _Obj):
            out.append(lay)
    return out


def _h2_headers(stream: _Obj) -> dict[str, str]:
    names = _all(stream, "http2.header.name")
    values = _all(stream, "http2.header.value")
    return {k.lower(): v for k, v in zip(names, values, strict=False)}


def _h1_headers(msg: _Obj) -> dict[str, str]:
    out = {}
    for line in _all(msg, "http.request.line") + _all(msg, "http.response.line"):
        k, _, v = line.partition(":")
        out[k.strip().lower()] = v.strip()
    return out


def wire_truth(pcap: Path, keylog: Path | None, requests: int
               ) -> tuple[dict[int, dict[str, dict[str, Any]]], list[str]]:
    """For each ``x-lab-truth`` N, its request at each hop (:class:`WireReq` as a dict),
    and what is missing or ambiguous."""
    hop_of = {_ep(EDGE): "edge", _ep(ROUTER): "router", _ep(ORIGIN): "origin"}
    times: dict[int, int] = {}
    syn: dict[int, tuple[int, str, str]] = {}
    reqs: list[WireReq] = []
    h2_open: dict[tuple[int, int], WireReq] = {}
    h1_pending: dict[int, list[WireReq]] = {}
    for lay in tshark_packets(pcap, keylog):
        frame = lay.get("frame")
        tcp = lay.get("tcp")
        ip = lay.get("ip")
        if not isinstance(frame, _Obj) or not isinstance(tcp, _Obj) or not isinstance(ip, _Obj):
            continue
        num = int(frame.get("frame.number"))
        t = _ns(frame.get("frame.time_epoch"))
        times[num] = t
        stream = int(tcp.get("tcp.stream"))
        src = f"{ip.get('ip.src')}:{tcp.get('tcp.srcport')}"
        dst = f"{ip.get('ip.dst')}:{tcp.get('tcp.dstport')}"
        if (_first(tcp, "tcp.flags.syn") == "1" and _first(tcp, "tcp.flags.ack") == "0"
                and stream not in syn):
            syn[stream] = (t, src, dst)
        segs = lay.get("tcp.segments")
        first_t = t
        if isinstance(segs, _Obj):
            s = _all(segs, "tcp.segment")
            if s and int(s[0]) in times:
                first_t = times[int(s[0])]
        k = 0  # messages seen in this packet: only the first starts in a reassembled PDU
        for key, value in lay:
            if key == "http2" and isinstance(value, _Obj):
                for fkey, fr in value:
                    if fkey != "http2.stream" or not isinstance(fr, _Obj):
                        continue
                    if fr.get("http2.type") != H2_HEADERS:
                        if fr.get("http2.type") is not None:
                            k += 1
                        continue
                    sid = int(fr.get("http2.streamid"))
                    at = first_t if k == 0 else t
                    k += 1
                    hdrs = _h2_headers(fr)
                    if dst in hop_of and (stream, sid) not in h2_open:
                        tr = hdrs.get(TRUTH_HEADER)
                        w = WireReq(stream, src, dst, sid, at,
                                    int(tr) if tr and tr.isdigit() else None,
                                    hdrs.get("x-request-id"), frames=[num])
                        h2_open[(stream, sid)] = w
                        reqs.append(w)
                    elif src in hop_of:
                        w2 = h2_open.get((stream, sid))
                        if w2 is not None and w2.first_byte_ns is None:
                            w2.first_byte_ns = at
                            w2.frames.append(num)
            elif key == "http" and isinstance(value, _Obj):
                at = first_t if k == 0 else t
                k += 1
                if _first(value, "http.request.method") is not None and dst in hop_of:
                    hdrs = _h1_headers(value)
                    tr = hdrs.get(TRUTH_HEADER)
                    w = WireReq(stream, src, dst, None, at,
                                int(tr) if tr and tr.isdigit() else None,
                                hdrs.get("x-request-id"), frames=[num])
                    reqs.append(w)
                    h1_pending.setdefault(stream, []).append(w)
                elif _first(value, "http.response.code") is not None and src in hop_of:
                    pend = h1_pending.get(stream) or []
                    if pend:
                        w = pend.pop(0)
                        w.first_byte_ns = at
                        w.frames.append(num)
    by_conn: dict[int, list[WireReq]] = {}
    for w in reqs:
        by_conn.setdefault(w.tcp_stream, []).append(w)
    for stream, lst in by_conn.items():
        lst.sort(key=lambda w: (w.ts_ns, w.stream_id or 0))
        s = syn.get(stream)
        for i, w in enumerate(lst):
            w.ordinal = i
            w.first_on_conn = i == 0
            w.syn_ns = s[0] if s is not None else None
    problems: list[str] = []
    ends: dict[tuple[str, str], set[int]] = {}
    for w in reqs:
        ends.setdefault((w.client, w.server), set()).add(w.tcp_stream)
    for (c, s), streams in ends.items():
        if len(streams) > 1:
            problems.append(f"endpoints {c} -> {s} carry several TCP streams {sorted(streams)}")
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for w in reqs:
        hop = hop_of[w.server]
        if w.truth is None:
            problems.append(f"a request at the {hop} (tcp.stream {w.tcp_stream}) has no "
                            f"{TRUTH_HEADER}")
            continue
        slot = out.setdefault(w.truth, {})
        if hop in slot:
            problems.append(f"request {w.truth} seen twice at the {hop}")
            continue
        slot[hop] = asdict(w)
    for n in range(requests):
        for hop in HOPS:
            got = out.get(n, {}).get(hop)
            if got is None:
                problems.append(f"request {n}: not seen at the {hop}")
            elif got["first_byte_ns"] is None:
                problems.append(f"request {n}: no response at the {hop}")
    return out, problems


# ----------------------------------------------------------------------------- entry points


def unshare_prefix() -> list[str] | None:
    """How to enter a private network namespace here, or None when it is impossible."""
    exe = shutil.which("unshare")
    if exe is None or shutil.which("ip") is None:
        return None
    for cmd in ([exe, "--net"], [exe, "--net", "--map-root-user"]):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*cmd, "sh", "-c", "ip link set lo up"], capture_output=True,
                              timeout=20).returncode == 0:
                return cmd
    return None


def run(outdir: Path, p: Params, timeout: float | None = None) -> dict[str, Any]:
    """Run the topology in a private network namespace; the truth document."""
    prefix = unshare_prefix()
    if prefix is None:
        raise RuntimeError("cannot enter a private network namespace (unshare --net)")
    outdir.mkdir(parents=True, exist_ok=True)
    script = 'ip link set lo up && exec "$0" "$@"'
    cmd = [*prefix, "sh", "-c", script, sys.executable, str(HERE), str(outdir), "--inside",
           *p.argv()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.pop("SSLKEYLOGFILE", None)
    # its own process group: on a timeout nginx and tcpdump go too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=str(ROOT), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout or p.timeout_s + 60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        (outdir / "driver.log").write_bytes(out)
        raise RuntimeError(f"topology driver timed out:\n{out.decode(errors='replace')[-3000:]}"
                           ) from None
    (outdir / "driver.log").write_bytes(out)
    truth_path = outdir / "truth.json"
    if proc.returncode != 0 or not truth_path.exists():
        tail = out.decode(errors="replace")[-3000:]
        raise RuntimeError(f"topology driver exited {proc.returncode}:\n{tail}")
    return dict(json.loads(truth_path.read_text()))


def _params(ns: argparse.Namespace) -> Params:
    return Params(concurrency=ns.concurrency, requests=ns.requests,
                  client_conns=ns.client_conns, request_ids=ns.request_ids,
                  router=ns.router, bind_upstream=ns.bind_upstream, seed=ns.seed,
                  timeout_s=ns.timeout, capture=ns.capture,
                  upload_ms=tuple(ns.upload_ms) if ns.upload_ms else (0.0, 0.0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--client-conns", type=int, default=None)
    ap.add_argument("--request-ids", action="store_true")
    ap.add_argument("--router", choices=("python", "nginx"), default="python")
    ap.add_argument("--bind-upstream", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--capture", choices=("auto", "tcpdump", "netdiag"), default="auto")
    ap.add_argument("--upload-ms", type=float, nargs=2, default=None)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    p = _params(ns)
    if ns.inside:
        sys.path.insert(0, str(ROOT))
        truth = asyncio.run(_inside(ns.outdir.resolve(), p))
    else:
        truth = run(ns.outdir.resolve(), p)
    problems = truth["problems"]
    print(f"{ns.outdir}: {len(truth['client_log'])} requests, "
          f"{truth['capture'].get('captured')} packets, "
          f"{len(truth['wire'] or {})} with wire truth, {len(problems)} problems")
    for msg in problems[:20]:
        print(f"  {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
