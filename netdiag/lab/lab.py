"""``Lab``: start the topology, capture it, drive load through it, stop it cleanly.

    from netdiag.lab import Lab, LabParams, run_lab

    with Lab(LabParams(router_delay_ms=25)) as lab:   # servers + redis-server up
        lab.start_capture()
        ledger = lab.drive()                           # what the clients did
        lab.stop_capture()
        lab.write_capture(Path("lab.pcapng"))          # keys embedded (DSB)

    result = run_lab(Path("captures/antho.pcapng"), LabParams())  # all of the above,
    # plus <stem>.paths.toml and <stem>.expected.json beside the capture

``Lab`` binds the lab's addresses in the caller's network namespace; ``run_lab`` runs
the whole lab in a namespace of its own when it can (``LabParams.netns``,
``netdiag.lab.netns``). Everything is bounded in time (``LabParams.timeout_s``) and
torn down on any exit (with a ramp, the limit is ``LabParams.run_timeout_s``):
the servers' thread joined, the sniffer stopped, ``redis-server`` terminated (and
killed by the kernel should this process die first), temporary files removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from netdiag.lab import params as P
from netdiag.lab.errors import LabError

log = logging.getLogger("netdiag.lab")


def _redis_version() -> str | None:
    from netdiag.lab.redis_store import find_redis_server

    exe = find_redis_server()
    if exe is None:
        return None
    with contextlib.suppress(Exception):
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5)
        for word in out.stdout.split():
            if word.startswith("v="):
                return word[2:]
    return None


@contextlib.contextmanager
def _sigint_held() -> Any:
    """Defer SIGINT (in the main thread) until the block is done, then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


class Lab:
    """The ROC/DPF topology on loopback; a context manager."""

    def __init__(self, params: P.LabParams | None = None, *, keylog: Path | None = None
                 ) -> None:
        self.params = params or P.LabParams()
        self.topology = P.Topology(self.params.origins)
        self.topology.check()
        self._keylog_arg = keylog
        self.keylog: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._redis: Any = None
        self.servers: Any = None
        self._capture: Any = None
        self._ca_pem: bytes | None = None
        self._client_ctx: Any = None
        self.redis_sha: str | None = None
        self.deadline: float | None = None
        self.packets = 0
        self.capture_drops = 0

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.stop()
            return
        try:  # an error is already on its way: do not hide it behind a teardown error
            self.stop()
        except Exception:
            log.warning("lab teardown failed while handling %s", exc_type.__name__,
                        exc_info=True)

    def start(self) -> None:
        import dataclasses

        from netdiag.lab.certs import client_ssl_context, make_certs
        from netdiag.lab.processes import LabServers
        from netdiag.lab.redis_store import RedisServer, check_port_free, prepare_store

        p = self.params
        self.deadline = time.monotonic() + p.run_timeout_s
        try:
            self._tmp = tempfile.TemporaryDirectory(prefix="netdiag-lab-")
            tmp = Path(self._tmp.name)
            self.keylog = self._keylog_arg or tmp / "keys.log"
            self.keylog.parent.mkdir(parents=True, exist_ok=True)
            self.keylog.write_text("")  # the contexts append; start from an empty file
            names = [P.EDGE_NAME] + [n for _, n in self.topology.roc_origins] + [
                n for _, n in self.topology.dpf_origins]
            certs = tmp / "certs"
            certs.mkdir()
            self._ca_pem, chain, key = make_certs(names, certs)
            (certs / "ca.pem").write_bytes(self._ca_pem)
            self._client_ctx = client_ssl_context(self._ca_pem, self.keylog)
            cfg = {"params": dataclasses.asdict(p), "chain": str(chain), "key": str(key),
                   "ca": str(certs / "ca.pem"), "keylog": str(self.keylog),
                   "realtime": p.realtime}
            # every server binds its sockets first: a port in use fails before redis starts
            check_port_free(P.REDIS_IP, P.REDIS_PORT)
            self.servers = LabServers(cfg, tmp)
            self.servers.start(timeout=min(30.0, self._remaining()))
            self._redis = RedisServer(P.REDIS_IP, P.REDIS_PORT, tmp)
            self._redis.start(timeout=min(10.0, self._remaining()))
            self.redis_sha = prepare_store(P.REDIS_IP, P.REDIS_PORT, list(p.models),
                                           p.budget_tokens,
                                           queue=p.router_budget_per_s is not None)
        except BaseException:
            self.stop()
            raise

    def _remaining(self) -> float:
        if self.deadline is None:
            return self.params.run_timeout_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise LabError(f"the lab's overall time limit ({self.params.run_timeout_s:g} s) "
                           "was reached")
        return left

    def pids(self) -> dict[str, int]:
        """Process ids of the lab's server roles and of ``redis-server``, while running."""
        out: dict[str, int] = {}
        if self.servers is not None:
            for role, proc in self.servers.procs.items():
                if proc.proc is not None:
                    out[role] = proc.proc.pid
        if self._redis is not None and self._redis.proc is not None:
            out["redis-server"] = self._redis.proc.pid
        return out

    def stop(self) -> None:
        """Tear everything down; safe to call twice and after a failed start.

        A Ctrl-C during the teardown is held until it is complete, then raised."""
        with _sigint_held():
            self._stop()

    def _stop(self) -> None:
        errors: list[BaseException] = []
        if self._capture is not None:
            try:
                self.stop_capture()
            except BaseException as exc:
                errors.append(exc)
        if self.servers is not None:
            try:
                self.servers.stop()
            except BaseException as exc:
                errors.append(exc)
            self.servers = None
        if self._redis is not None:
            try:
                self._redis.stop()
            except BaseException as exc:
                errors.append(exc)
            self._redis = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ capture

    def start_capture(self) -> None:
        """Start capturing ``lo`` (only the lab's addresses); returns once capturing.

        ``netdiag.live.capture.LiveCapture`` streams the packets to a file in the lab's
        temporary directory; :meth:`write_capture` then embeds the key log.
        """
        from netdiag.live.capture import CapturePermissionError, LiveCapture

        if self._capture is not None:
            raise LabError("the capture is already running")
        if self._tmp is None:
            raise LabError("the lab is not started")
        self._raw = Path(self._tmp.name) / "capture.pcapng"
        addresses = self.topology.addresses()
        bpf = " or ".join(f"host {a}" for a in addresses)
        cap = LiveCapture(self._raw, iface="lo", bpf=bpf, keep_addresses=set(addresses))
        try:
            cap.start()
        except CapturePermissionError as exc:
            raise LabError(f"cannot capture on lo: {exc}") from exc
        self._capture = cap
        self._captured = False

    def stop_capture(self) -> int:
        """Stop capturing; returns the packets captured."""
        cap, self._capture = self._capture, None
        if cap is None:
            return self.packets
        stats = cap.stop()
        self._captured = True
        self.packets = stats.packets
        self.capture_drops = stats.drops
        if stats.error:
            raise LabError(f"the capture ended early: {stats.error}")
        return self.packets

    def key_log(self) -> bytes:
        """The TLS key log written so far by the lab's clients (driver and router)."""
        if self.keylog is None or not self.keylog.exists():
            return b""
        return self.keylog.read_bytes()

    def write_capture(self, out: Path) -> int:
        """Write the stopped capture to ``out`` (pcapng, keys embedded); packets written."""
        from netdiag.live.capture import embed_key_log

        if not getattr(self, "_captured", False):
            raise LabError("no capture to write (start_capture / stop_capture first)")
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        return embed_key_log(self._raw, out, self.key_log())

    # ------------------------------------------------------------------ load

    def drive(self) -> dict[str, Any]:
        """Run the request mix of both paths; return the ledger of what happened."""
        from netdiag.lab.driver import Driver

        if self.servers is None:
            raise LabError("the lab is not started")
        p = self.params
        self.servers.command("edge", "reset")
        self.servers.command("router", "reset")
        driver = Driver(p, self._client_ctx, self._ca_pem)
        started = time.monotonic()
        remaining = self._remaining()

        async def run() -> None:
            try:
                await asyncio.wait_for(driver.run(), remaining)
            except TimeoutError:
                raise LabError(f"the load did not finish within the lab's time limit "
                               f"({p.run_timeout_s:g} s)") from None

        if p.ramp is not None:
            # the open loop's clock must not share this process's interpreter lock
            # with the capture's thread: the clients run in a process of their own
            from netdiag.lab.loadgen import run_load

            assert self._tmp is not None
            tmp = Path(self._tmp.name)
            with self._ramp_priorities():
                driver.ledger = run_load(p, tmp / "certs" / "ca.pem", self.keylog, remaining,
                                         tmp)
        else:
            asyncio.run(run())
            if p.roc_resume:
                driver.resumed_request()
        # close the pooled hop connections so their ends are in the capture too
        self.servers.command("edge", "close_pools", timeout=min(10.0, self._remaining()))
        self.servers.command("router", "close_pools", timeout=min(10.0, self._remaining()))
        elapsed = time.monotonic() - started
        return self._ledger(driver, elapsed)

    @contextlib.contextmanager
    def _ramp_priorities(self) -> Any:
        """During a ramp (with ``realtime``), ``redis-server`` at the servers' real-time
        priority and the capture's thread one above (with the clients,
        ``netdiag.lab.driver.ramp_priority``), so that neither is starved when the
        real-time servers keep both cores busy (a starved sniffer drops packets, a
        starved Redis stalls the router); restored afterwards."""
        from netdiag.lab.serve import RT_PRIORITY

        targets: list[tuple[int, int]] = []
        if self.params.realtime:
            if self._redis is not None and self._redis.proc is not None:
                targets.append((self._redis.proc.pid, RT_PRIORITY))
            # the sniffer is the instrument: above the servers, as the clients are
            targets += [(t.native_id, RT_PRIORITY + 1) for t in threading.enumerate()
                        if t.name == "netdiag-capture" and t.native_id is not None]
        previous: list[tuple[int, int, Any]] = []
        for tid, priority in targets:
            with contextlib.suppress(OSError, PermissionError):
                policy, param = os.sched_getscheduler(tid), os.sched_getparam(tid)
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
                previous.append((tid, policy, param))
        try:
            yield
        finally:
            for tid, policy, param in previous:
                with contextlib.suppress(OSError, PermissionError):
                    os.sched_setscheduler(tid, policy, param)

    def token_store_stats(self) -> dict[str, int]:
        """Redis calls per command since the lab started (``INFO commandstats``)."""
        from netdiag.lab.redis_store import command_stats

        return command_stats(P.REDIS_IP, P.REDIS_PORT)

    def _ledger(self, driver: Any, elapsed: float) -> dict[str, Any]:
        from collections import Counter

        from netdiag.lab.chains import build_chains
        from netdiag.lab.driver import summarize

        led = driver.ledger
        router = self.servers.stats("router")
        edge = self.servers.stats("edge")
        origin_log = [x for role in ("roc-origins", "dpf-origins")
                      for x in self.servers.stats(role)["log"]]
        hops: dict[str, dict[str, Any]] = {}
        chains, problems = build_chains(led.requests, edge.pop("log"), router.pop("log"),
                                        origin_log, hops)
        for r in led.requests:
            r["hops"] = hops.get(r["request_id"], {})
        conns = list(led.connections.values())
        for c in conns:
            c["requests"].sort(key=lambda r: r["stream_id"] or 0)
        paths = summarize(led)
        tls = Counter(c["tls_version"] for c in conns)
        tls.update(u["tls_version"] for u in router["upstream"])
        tls_names = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2"}
        tls_versions = Counter()
        for k, v in tls.items():
            tls_versions[tls_names.get(k, k)] += v
        requests = sorted(led.requests, key=lambda r: r["request_id"])
        extra: dict[str, Any] = {}
        p = self.params
        if p.http3:  # the clients' QUIC connections (the edge's UDP port)
            extra["quic_connections"] = {
                "clients": sum(1 for c in conns if c.get("transport") == "quic")}
        if p.origin_pairing_ms is not None:  # how each held ROC answer ended
            held = [x["paired_ns"] for x in origin_log if "paired_ns" in x]
            extra["origin_pairing"] = {
                "paired": sum(1 for t in held if t is not None),
                "alone": sum(1 for t in held if t is None)}
        if p.ramp is not None:
            from netdiag.lab.ramp import ramp_summary

            extra["ramp"] = ramp_summary(p.ramp, p.router_budget_per_s, p.router_queue_limit,
                                         requests, led.ramp_start_ts or 0.0, led.offered)
        return {
            "elapsed_s": round(elapsed, 3),
            "paths": paths,
            "edge": {"requests": edge["requests"], "errors": edge["errors"],
                     "router_connections": len(edge["router_connections"]),
                     "router_clients": edge["router_connections"]},
            "router": {"requests": router["requests"], "denied": router["denied"],
                       "errors": router["errors"],
                       "upstream_connections": len(router["upstream"]),
                       "redis_commands": router["redis_commands"],
                       "redis_connections": len(router["redis_clients"]),
                       "redis_clients": router["redis_clients"],
                       "upstream_log": router["upstream"]},
            "dns_queries": len(led.dns),
            "dns_nxdomain": sum(1 for d in led.dns if d["rcode"] == "NXDOMAIN"),
            "dns_transports": dict(Counter(d["transport"] for d in led.dns)),
            "connections": {"roc": paths["ROC"]["connections"],
                            "dpf": paths["DPF"]["connections"]},
            "requests": {"roc": paths["ROC"]["requests"], "dpf": paths["DPF"]["requests"]},
            "tls_versions": dict(sorted(tls_versions.items())),
            "tls_resumed": sum(1 for c in conns if c["resumed"]),
            "tcp_connections": {
                "clients": sum(1 for c in conns if c.get("transport") != "quic"),
                "edge_router": len(edge["router_connections"]),
                "router_origin": len(router["upstream"]),
                "router_redis": len(router["redis_clients"]),
                "dns": sum(1 for d in led.dns if d["transport"] == "tcp")},
            "sse_streams": sum(1 for r in led.requests if r["kind"] == "sse"),
            "errors": led.errors + [f"chain: {x}" for x in problems],
            "dns_log": led.dns,
            "connection_log": conns,
            "request_log": requests,
            "chains": chains,
            **extra,
        }

    def describe(self) -> dict[str, Any]:
        """The lab's servers: names, addresses, protocols, and how the proxies connect."""
        p = self.params
        dpf_tls = "TLS 1.2" if p.dpf_tls == "1.2" else "TLS 1.3"
        router_proto = "http/1.1" if p.router_protocol == "http1" else "h2c"
        origin_proto = "http/1.1" if p.origin_protocol == "http1" else "h2"
        out = {
            "dns": {"address": f"{P.DNS_IP}:{P.DNS_PORT}", "transports": ["udp", "tcp"]},
            "edge": {"name": P.EDGE_NAME, "address": f"{P.EDGE_IP}:{P.EDGE_PORT}",
                     "tls": "TLS 1.3", "protocol": "h2",
                     "upstream": {"protocol": router_proto, "pooled": True,
                                  "source": p.source_ip(P.EDGE_IP),
                                  "server_timing": p.server_timing}},
            "router": {"address": f"{P.ROUTER_IP}:{P.ROUTER_PORT}", "protocol": router_proto,
                       "upstream": {"protocol": origin_proto, "pooled": p.upstream_pool,
                                    "source": p.source_ip(P.ROUTER_IP)}},
            "token_store": {"address": f"{P.REDIS_IP}:{P.REDIS_PORT}",
                            "software": f"redis-server {_redis_version() or '?'}"},
            "roc_origins": [{"name": n, "address": f"{ip}:{P.ORIGIN_PORT}", "tls": "TLS 1.3",
                             "protocols": ["h2", "http/1.1"]}
                            for ip, n in self.topology.roc_origins],
            "dpf_origins": [{"name": n, "address": f"{ip}:{P.ORIGIN_PORT}", "tls": dpf_tls}
                            for ip, n in self.topology.dpf_origins],
            "clients": {"roc": P.ROC_CLIENT_IP, "dpf": P.DPF_CLIENT_IP},
        }
        if p.http3:
            out["edge"]["http3"] = {"address": f"{P.EDGE_IP}:{P.EDGE_PORT}",
                                    "transport": "udp", "alpn": "h3",
                                    "alt_svc": f'h3=":{P.EDGE_PORT}"'}
            out["clients"]["roc_protocol"] = p.client_protocol
        return out


def sibling(out: Path, suffix: str) -> Path:
    """``captures/antho.pcapng`` -> ``captures/antho<suffix>``."""
    return out.with_name(out.name.split(".")[0] + suffix)


def run_lab(out: Path, params: P.LabParams | None = None, *, keylog: Path | None = None
            ) -> dict[str, Any]:
    """Start the lab, capture, drive, stop; write the capture, profile and ledger.

    Writes ``out`` (pcapng with the TLS keys embedded), ``<stem>.paths.toml`` and
    ``<stem>.expected.json``; with ``keylog``, the key log there too. Returns the
    ledger (the content of ``<stem>.expected.json``).

    ``params.netns`` True runs it all in a fresh network namespace
    (``netdiag.lab.netns``), False in the current one, None in a namespace when one can
    be created (root), else here; the ledger's ``netns`` says which, with a note.
    """
    p = params or P.LabParams()
    note = None
    if p.netns is None or p.netns:
        from netdiag.lab.netns import netns_unavailable, run_in_netns

        why = netns_unavailable()
        if why is None:
            return run_in_netns(Path(out), p, keylog)
        if p.netns:
            raise LabError(f"cannot run the lab in a network namespace: {why}")
        note = f"not in a network namespace of its own ({why})"
    return run_lab_here(Path(out), p, keylog=keylog, netns={"used": False, "note": note})


def run_lab_here(out: Path, params: P.LabParams, *, keylog: Path | None = None,
                 netns: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`run_lab` in the current network namespace (``netns``: what the ledger
    says about namespaces)."""
    from netdiag.lab.profile import profile_toml

    p = params
    out = Path(out)
    started = time.monotonic()
    with Lab(p) as lab:
        lab.start_capture()
        try:
            ledger = lab.drive()
            time.sleep(p.settle_ms / 1000)  # let the last FIN/ACKs reach the sniffer
        finally:
            lab.stop_capture()
        store = lab.token_store_stats()
        n_packets = lab.write_capture(out)
        if keylog is not None:
            keylog = Path(keylog)
            keylog.parent.mkdir(parents=True, exist_ok=True)
            keylog.write_bytes(lab.key_log())
        servers = lab.describe()
    ledger["router"]["redis_server_calls"] = store
    ledger["capture_drops"] = lab.capture_drops
    profile = sibling(out, ".paths.toml")
    profile.write_text(profile_toml(p.origins, params=p))
    result = {
        "capture": out.name,
        "keylog": keylog.name if keylog is not None else None,
        "profile": profile.name,
        "packets": n_packets,
        "duration_s": round(time.monotonic() - started, 3),
        "params": p.to_json(),
        "netns": netns or {"used": False, "note": None},
        "delays_ms": {"dns": p.dns_delay_ms, "router": p.router_delay_ms,
                      "roc_think": p.roc_think, "dpf_think": p.dpf_think,
                      "token_gap": p.token_gap_ms},
        "servers": servers,
        **ledger,
    }
    sibling(out, ".expected.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
