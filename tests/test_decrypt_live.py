"""Live decryption: real TLS servers and clients on loopback, a real capture, a real key
log; netdiag must find exactly the requests the clients made.

Two hypercorn servers (``netdiag.lab.asgi``: the origin of the first shipped capture,
which speaks HTTP/1.1 as well as HTTP/2) on addresses of their own, so that this test
and the lab (127.0.0.10..53) can run side by side, on free unprivileged ports:

* A ``a.live.test`` on 127.0.0.31: TLS 1.3 only; B ``b.live.test`` on 127.0.0.32:
  TLS 1.2 only (ECDHE + AES-GCM); both offer ALPN ``h2`` and ``http/1.1`` and answer
  ``GET``/``POST /v1/messages`` after a think time and ``GET /v1/stream`` with
  ``SSE_EVENTS`` server-sent events;
* httpx clients (``http2=True`` / ``http2=False``) writing one key log through their
  ssl contexts (``keylog_filename``), strictly one request after the other:

  ====  ======  =========  ===============================================
  conn  server  protocol   requests
  ====  ======  =========  ===============================================
  1     A 1.3   h2         GET, POST, GET ``/v1/messages``
  2     A 1.3   h2         GET ``/v1/messages``
  3     B 1.2   http/1.1   GET, POST, GET, POST ``/v1/messages`` (keep-alive)
  4     B 1.2   h2         GET ``/v1/stream`` (SSE)
  5     A 1.3   http/1.1   GET ``/v1/stream`` (SSE)
  ====  ======  =========  ===============================================

* ``netdiag.live.capture.LiveCapture`` captures ``lo`` (exact nanosecond times, each
  loopback packet once, only the two servers' addresses) into a pcapng.

Then, every expectation taken from what the clients saw (the ledger):

* in-process ``analyze`` with the key log: connections, per-connection requests
  (method, path, status, protocol, stream ids, ``estimated`` false, ttfb above the
  server's think time), SSE events and chunks, ``tls.decrypted`` and version, the
  summary's request count, reuse rate and protocols;
* ``netdiag report --keylog --write-pcapng out.pcapng``, then ``netdiag report
  out.pcapng`` without any key (they are in its decryption-secrets block) and with
  ``SSLKEYLOGFILE`` instead of ``--keylog``: the same requests; without any key at
  all: nothing decrypted;
* tshark reads ``out.pcapng`` without a key log option and decrypts it: its HTTP/2
  streams and HTTP/1.1 requests are the clients', and netdiag agrees with it request by
  request (tests/crosscheck/http_ref.py, TTFB within 0.05 ms).

Needs root on Linux (raw socket on ``lo``); the tshark part needs tshark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CROSSCHECK = ROOT / "tests" / "crosscheck"

A_IP, B_IP = "127.0.0.61", "127.0.0.62"
A_NAME, B_NAME = "a.live.test", "b.live.test"
THINK_MS = {"A": 15.0, "B": 10.0}
SSE_EVENTS = 6
SSE_GAP_MS = 4.0
TIMEOUT_S = 5.0
PLAN: list[tuple[str, bool, list[tuple[str, str]]]] = [
    # (server, http2, requests) - one httpx client, hence one connection, each
    ("A", True, [("GET", "/v1/messages"), ("POST", "/v1/messages"), ("GET", "/v1/messages")]),
    ("A", True, [("GET", "/v1/messages")]),
    ("B", False, [("GET", "/v1/messages"), ("POST", "/v1/messages"),
                  ("GET", "/v1/messages"), ("POST", "/v1/messages")]),
    ("B", True, [("GET", "/v1/stream")]),
    ("A", False, [("GET", "/v1/stream")]),
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.geteuid() != 0,
        reason="needs root on Linux (raw socket on lo)",
    ),
]

needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None,
                                  reason="tshark is not installed")


def _load_lab() -> Any:
    """The lab's building blocks this test uses (netdiag.lab), by their old names."""
    try:
        from netdiag.lab.asgi import LabHypercornConfig, make_origin_app, serve
        from netdiag.lab.certs import make_certs, server_ssl_context
        from netdiag.lab.driver import NODELAY, TLS_NAMES
        from netdiag.lab.servers import listening_socket
    except ImportError as exc:  # hypercorn, ... missing
        pytest.skip(f"the lab's dependencies are missing: {exc}")
    return SimpleNamespace(_listening_socket=listening_socket, _make_app=make_origin_app,
                           _LabHypercornConfig=LabHypercornConfig,
                           _server_ssl_context=server_ssl_context, serve=serve,
                           _make_certs=make_certs, NODELAY=NODELAY, TLS_NAMES=TLS_NAMES)


# ----------------------------------------------------------------------------- servers


class _Servers:
    """The two HTTPS servers in one asyncio loop on a background thread."""

    def __init__(self, lab: Any, chain: Path, key: Path) -> None:
        self._socks: dict[str, socket.socket] = {}
        try:
            for name, ip in (("A", A_IP), ("B", B_IP)):
                self._socks[name] = lab._listening_socket(ip, 0, socket.SOCK_STREAM)
        except BaseException:
            self._close()
            raise
        self.address = {n: "{}:{}".format(*s.getsockname()) for n, s in self._socks.items()}
        self._configs = [
            (lab._make_app(name, THINK_MS[name] / 1000, SSE_EVENTS, SSE_GAP_MS / 1000),
             lab._LabHypercornConfig(
                 lab._server_ssl_context(chain, key, tls12_only=name == "B"), sock))
            for name, sock in self._socks.items()]
        self._serve = lab.serve
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="decrypt-live-servers",
                                        daemon=True)

    def _close(self) -> None:
        for sock in self._socks.values():
            with contextlib.suppress(OSError):
                sock.close()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"servers did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.ident is not None:
            self._thread.join(10)
        self._close()
        if self._thread.is_alive():
            raise RuntimeError("servers did not shut down within 10 s")

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        tasks = [asyncio.create_task(self._serve(app, config, shutdown_trigger=stop.wait,
                                                 mode="asgi"))
                 for app, config in self._configs]
        self._ready.set()
        try:
            await stop.wait()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 8)
        finally:
            for task in tasks:
                task.cancel()


# ----------------------------------------------------------------------------- clients


def _client_context(ca_pem: bytes, keylog: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode())
    ctx.keylog_filename = str(keylog)
    return ctx


def _run_plan(lab: Any, ca_pem: bytes, keylog: Path, servers: _Servers) -> list[dict]:
    """Drive the clients; return one record per connection of what they saw."""
    import httpx

    ledger = []
    for server, http2, requests in PLAN:
        ip_port = servers.address[server]
        name = A_NAME if server == "A" else B_NAME
        # a context per client: httpcore sets its ALPN list on the context it is given
        transport = httpx.HTTPTransport(http2=http2, verify=_client_context(ca_pem, keylog),
                                        trust_env=False, socket_options=lab.NODELAY)
        conn: dict[str, Any] | None = None
        with httpx.Client(transport=transport, trust_env=False, base_url=f"https://{ip_port}",
                          timeout=TIMEOUT_S, headers={"Host": name}) as client:
            for i, (method, path) in enumerate(requests):
                if i:
                    time.sleep(0.005)
                ext = {"sni_hostname": name}
                events = None
                if path == "/v1/stream":
                    with client.stream("GET", path, extensions=ext,
                                       headers={"Accept": "text/event-stream"}) as resp:
                        events = sum(1 for line in resp.iter_lines()
                                     if line.startswith("data:"))
                elif method == "POST":
                    resp = client.post(path, json={"q": i}, extensions=ext)
                else:
                    resp = client.get(path, extensions=ext)
                sock = resp.extensions["network_stream"].get_extra_info("socket")
                client_ep = "{}:{}".format(*sock.getsockname())
                if conn is None:
                    conn = {"server_name": server, "server": ip_port, "client": client_ep,
                            "http2": http2, "tls_version": lab.TLS_NAMES[sock.version()],
                            "alpn": sock.selected_alpn_protocol(), "requests": []}
                    ledger.append(conn)
                assert conn["client"] == client_ep, "httpx opened a second connection"
                conn["requests"].append({
                    "method": method, "path": path, "status": resp.status_code,
                    "http_version": resp.http_version,
                    "stream_id": resp.extensions.get("stream_id"), "events": events})
        time.sleep(0.02)
    return ledger


# ----------------------------------------------------------------------------- fixture


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict[str, Any]:
    lab = _load_lab()
    tmp = tmp_path_factory.mktemp("decrypt_live")
    capture_path, keylog = tmp / "live.pcapng", tmp / "live.keys"
    keylog.write_text("")
    before = set(threading.enumerate())
    started = time.monotonic()
    from netdiag.live.capture import LiveCapture

    with tempfile.TemporaryDirectory(prefix="decrypt-live-certs-") as certs:
        ca_pem, chain, key = lab._make_certs([A_NAME, B_NAME], Path(certs))
        servers = _Servers(lab, chain, key)
        capture = None
        try:
            servers.start()
            capture = LiveCapture(capture_path, iface="lo", bpf=f"host {A_IP} or host {B_IP}",
                                  keep_addresses={A_IP, B_IP})
            capture.start()
            ledger = _run_plan(lab, ca_pem, keylog, servers)
            time.sleep(0.3)  # the last FIN/ACKs
        finally:
            try:
                if capture is not None:
                    assert capture.stop().drops == 0
            finally:
                servers.stop()
    leftover = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    return {"capture": capture_path, "keylog": keylog, "ledger": ledger, "tmp": tmp,
            "leftover": leftover, "servers": servers.address,
            "lab_s": time.monotonic() - started}


def _analyze(path: Path, keylog: Path | None) -> dict[str, Any]:
    from netdiag.pipeline import Options, analyze
    from netdiag.report.records_out import CollectingSink
    from netdiag.tls.keylog import KeyLog

    sink = CollectingSink()
    result = analyze([str(path)], sink,
                     Options(keylog=KeyLog.from_file(keylog) if keylog else None))
    return sink.document(result)


def _cli(*args: str, env_keylog: Path | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "SSLKEYLOGFILE"}
    if env_keylog is not None:
        env["SSLKEYLOGFILE"] = str(env_keylog)
    proc = subprocess.run([sys.executable, "-m", "netdiag", "report", *args,
                           "--format", "json", "--no-progress"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"netdiag {args} exited {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


REQUEST_FIELDS = ("stream_id", "ts", "method", "authority", "path", "status", "ttfb_ms",
                  "ttlb_ms", "response_bytes", "chunks", "estimated", "protocol",
                  "sse_events")


def _requests(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each connection's requests (the fields that must not depend on how keys came)."""
    return {c["client"]: [{k: r.get(k) for k in REQUEST_FIELDS} for r in c["requests"]]
            for c in doc["connections"]}


# ----------------------------------------------------------------------------- tests


@pytest.mark.timeout(120)
def test_lab_ran_as_planned(live) -> None:
    assert live["leftover"] == [], "servers or sniffer left threads behind"
    ledger = live["ledger"]
    assert [(c["server_name"], c["http2"], [(r["method"], r["path"]) for r in c["requests"]])
            for c in ledger] == PLAN
    for conn in ledger:
        want = "h2" if conn["http2"] else "http/1.1"
        assert conn["alpn"] == want
        assert conn["tls_version"] == ("TLS 1.3" if conn["server_name"] == "A" else "TLS 1.2")
        for req in conn["requests"]:
            assert req["status"] == 200
            assert req["http_version"] == ("HTTP/2" if conn["http2"] else "HTTP/1.1")
            if req["path"] == "/v1/stream":
                assert req["events"] == SSE_EVENTS
    assert live["capture"].stat().st_size > 0


@pytest.mark.timeout(120)
def test_netdiag_decrypts_every_request(live) -> None:
    doc = _analyze(live["capture"], live["keylog"])
    ledger = live["ledger"]
    conns = {c["client"]: c for c in doc["connections"]}
    assert sorted(conns) == sorted(c["client"] for c in ledger), (
        f"netdiag connections {[(c['client'], c['server']) for c in doc['connections']]}")
    n_requests = 0
    for exp in ledger:
        conn = conns[exp["client"]]
        where = f"{conn['id']} {exp['client']} -> {exp['server']}"
        assert conn["server"] == exp["server"], where
        want_proto = "h2" if exp["http2"] else "http/1.1"
        assert conn["protocol"] == want_proto, where
        tls = conn["tls"]
        assert tls["decrypted"] is True, f"{where}: {tls}"
        assert tls["version"] == exp["tls_version"], where
        assert tls["alpn"] == want_proto, where
        got = sorted(conn["requests"], key=lambda r: r["ts"])
        assert len(got) == len(exp["requests"]), f"{where}: {got}"
        think = THINK_MS[exp["server_name"]]
        for i, (g, e) in enumerate(zip(got, exp["requests"], strict=True)):
            what = f"{where} request {i + 1} {e['method']} {e['path']}"
            assert g["estimated"] is False, what
            assert (g["method"], g["path"], g["status"]) == (e["method"], e["path"],
                                                             e["status"]), what
            assert g["protocol"] == want_proto, what
            assert g["authority"] == (A_NAME if exp["server_name"] == "A" else B_NAME), what
            if exp["http2"]:
                assert g["stream_id"] == e["stream_id"] == 2 * i + 1, what
            else:
                assert g["stream_id"] is None, what
            assert g["ttfb_ms"] > think, f"{what}: ttfb {g['ttfb_ms']} ms <= think {think}"
            assert g["ttlb_ms"] >= g["ttfb_ms"], what
            if e["path"] == "/v1/stream":
                assert g["sse_events"] == e["events"] == SSE_EVENTS, what
                assert g["chunks"] == SSE_EVENTS, f"{what}: chunks {g['chunks']}"
                assert g["ttlb_ms"] > g["ttfb_ms"] + (SSE_EVENTS - 1) * SSE_GAP_MS * 0.9
            else:
                assert g["sse_events"] in (None, 0), what
        n_requests += len(got)

    http = doc["summary"]["http"]
    with_requests = sum(1 for c in ledger if c["requests"])
    assert http["requests"] == n_requests == sum(len(c["requests"]) for c in ledger)
    assert http["connections"] == with_requests
    assert http["reuse_rate"] == pytest.approx((n_requests - with_requests) / n_requests,
                                               abs=1e-3)
    assert http["estimated"] is False
    want_protocols: dict[str, int] = {}
    for c in ledger:
        key = "h2" if c["http2"] else "http/1.1"
        want_protocols[key] = want_protocols.get(key, 0) + len(c["requests"])
    assert http["protocols"] == want_protocols
    assert doc["summary"]["tls"]["decrypted"] == len(ledger)


@pytest.mark.timeout(120)
def test_keys_travel_in_the_pcapng_and_sslkeylogfile(live) -> None:
    capture, keylog, tmp = live["capture"], live["keylog"], live["tmp"]
    reference = _requests(_analyze(capture, keylog))
    out = tmp / "with_keys.pcapng"
    first = _cli(str(capture), "--keylog", str(keylog), "--write-pcapng", str(out))
    assert _requests(first) == reference
    assert out.stat().st_size > 0
    # the keys are in the decryption-secrets block: no key log needed any more
    again = _cli(str(out))
    assert _requests(again) == reference
    assert all(c["tls"]["decrypted"] for c in again["connections"])
    # SSLKEYLOGFILE instead of --keylog
    assert _requests(_cli(str(capture), env_keylog=keylog)) == reference
    # and without any key, nothing is decrypted (the key log is what made the difference)
    bare = _cli(str(capture))
    assert not any(c["tls"]["decrypted"] for c in bare["connections"])
    assert all(r["estimated"] for c in bare["connections"] for r in c["requests"])


@needs_tshark
@pytest.mark.tshark
@pytest.mark.timeout(120)
def test_tshark_decrypts_the_written_pcapng(live) -> None:
    capture, keylog, tmp = live["capture"], live["keylog"], live["tmp"]
    out = tmp / "for_tshark.pcapng"
    _cli(str(capture), "--keylog", str(keylog), "--write-pcapng", str(out))
    sys.path.insert(0, str(CROSSCHECK))
    try:
        from http_ref import compare_http, http_reference
        from tshark_ref import CaptureSpec
    finally:
        sys.path.remove(str(CROSSCHECK))
    spec = CaptureSpec(out.name, out, None, (), "live")  # no key log for tshark either
    ref = http_reference(spec)
    ledger = live["ledger"]
    by_client = {s.client: s for s in ref.streams}
    mine = {c["client"]: c for c in _cli(str(out))["connections"]}
    for exp in ledger:
        stream = by_client.get(exp["client"])
        assert stream is not None, f"tshark has no connection from {exp['client']}"
        got = [(r.kind, r.method, r.path, r.status) for r in stream.requests]
        kind = "h2" if exp["http2"] else "http1"
        # seen once beside two CPU burners (tshark found no request on the first
        # connection) and not since: what netdiag saw of the same file, to tell a
        # capture that lost or reordered packets from a written file tshark misreads
        c = mine.get(exp["client"], {})
        seen = {k: c.get(k) for k in ("id", "packets", "retransmissions", "out_of_order",
                                      "lost_bytes", "protocol")}
        seen["tls"] = {k: (c.get("tls") or {}).get(k) for k in ("version", "decrypted")}
        seen["requests"] = len(c.get("requests") or [])
        assert got == [(kind, r["method"], r["path"], r["status"])
                       for r in exp["requests"]], (
            f"tshark without a key log: {got}; netdiag on the same file: {seen}; "
            f"files kept in {tmp}")
    out_cmp = compare_http(spec)
    assert not out_cmp.failures(), "\n".join(out_cmp.failures())
    assert out_cmp.compared("count") == len(ledger)
    assert out_cmp.compared("ttfb") + out_cmp.skipped("ttfb") == sum(
        len(c["requests"]) for c in ledger)
