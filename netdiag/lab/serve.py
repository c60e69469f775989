"""One role of the lab in a process of its own: ``python -m netdiag.lab.serve ROLE``.

Protocol (JSON lines): the parent writes the configuration as the first line of
stdin; the child binds its sockets, starts serving and answers ``{"ready": true}``
(or ``{"error": "..."}`` and exits 1). Then each stdin line is a command answered by
one stdout line: ``stats``, ``reset``, ``close_pools``, ``stop``. End of stdin means
stop, and the kernel kills the child should the parent die (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from netdiag.lab import params as P
from netdiag.lab.errors import LabError

ROLES = ("dns", "edge", "router", "roc-origins", "dpf-origins")
REALTIME_ROLES = ("dns", "edge", "router", "roc-origins", "dpf-origins")
"""Roles whose timers carry injected delays: they run with a real-time priority, so
they wake up on time even when every core is busy (as if each had a host of its own)."""
RT_PRIORITY = 10


def _realtime() -> None:
    """SCHED_FIFO at a low real-time priority, when allowed (root); else unchanged."""
    with contextlib.suppress(AttributeError, OSError, PermissionError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))


class _Role:
    """The sockets, apps and statistics of one role."""

    def __init__(self, role: str, cfg: dict[str, Any]) -> None:
        from netdiag.lab.certs import client_ssl_context, server_ssl_context
        from netdiag.lab.servers import Edge, Origins, Router, listening_socket

        self.role = role
        params = dict(cfg["params"])
        params["models"] = tuple(params["models"])
        p = self.p = P.LabParams(**params)
        topo = P.Topology(p.origins)
        chain, key = Path(cfg["chain"]), Path(cfg["key"])
        keylog = Path(cfg["keylog"]) if cfg.get("keylog") else None
        self.socks: list[socket.socket] = []
        self.lean: list[tuple[Any, list[socket.socket], Any]] = []
        self.edge: Any = None
        self.router: Any = None
        self.apps: list[Any] = []
        self.cleartext = "h2"
        self.h3_sock: socket.socket | None = None
        self.h3_files: tuple[Path, Path, Path | None] | None = None
        """The edge's UDP socket and (chain, key, key log) of its HTTP/3 listener."""
        """What the role's cleartext listening sockets speak (the router's: h2c or http1)."""
        tcp = socket.SOCK_STREAM
        try:
            if role == "dns":
                self.udp = self._keep(listening_socket(P.DNS_IP, P.DNS_PORT, socket.SOCK_DGRAM))
                self.tcp = self._keep(listening_socket(P.DNS_IP, P.DNS_PORT, tcp))
            elif role == "edge":
                sock = self._keep(listening_socket(P.EDGE_IP, P.EDGE_PORT, tcp))
                self.edge = Edge(p)
                ctx = server_ssl_context(chain, key, tls12_only=False)
                self.lean.append((self.edge.handle, [sock], ctx))
                if p.http3:  # HTTP/3 on the same address and port, UDP
                    self.h3_sock = self._keep(
                        listening_socket(P.EDGE_IP, P.EDGE_PORT, socket.SOCK_DGRAM))
                    self.h3_files = (chain, key, keylog)
            elif role == "router":
                sock = self._keep(listening_socket(P.ROUTER_IP, P.ROUTER_PORT, tcp))
                ca_pem = Path(cfg["ca"]).read_bytes()
                alpn = ("http/1.1",) if p.origin_protocol == "http1" else ("h2",)
                self.router = Router(p, client_ssl_context(ca_pem, keylog, alpn=alpn))
                self.lean.append((self.router.handle, [sock], None))
                self.cleartext = "http1" if p.router_protocol == "http1" else "h2"
            elif role in ("roc-origins", "dpf-origins"):
                roc = role == "roc-origins"
                origins = topo.roc_origins if roc else topo.dpf_origins
                socks = [self._keep(listening_socket(ip, P.ORIGIN_PORT, tcp))
                         for ip, _ in origins]
                ctx = server_ssl_context(chain, key,
                                         tls12_only=not roc and p.dpf_tls == "1.2")
                app = Origins("ROC" if roc else "DPF", origins,
                              (p.roc_think if roc else p.dpf_think) / 1000, p.sse_events,
                              p.token_gap_ms / 1000,
                              pairing_s=(p.origin_pairing_ms / 1000
                                         if roc and p.origin_pairing_ms is not None else None))
                self.apps.append(app)
                self.lean.append((app.handle, socks, ctx))
            else:
                raise LabError(f"unknown lab role {role!r}")
        except BaseException:
            self.close()
            raise

    def _keep(self, sock: socket.socket) -> socket.socket:
        self.socks.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.close()

    def stats(self) -> dict[str, Any]:
        if self.edge is not None:
            e = self.edge.stats
            return {"requests": e.requests, "errors": e.errors,
                    "router_connections": sorted(e.router_connections), "log": e.log}
        if self.router is not None:
            r = self.router.stats
            return {"requests": r.requests, "denied": r.denied, "errors": r.errors,
                    "redis_commands": r.redis_commands, "upstream": r.upstream,
                    "redis_clients": self.router.store.opened[r.store_opened_before:],
                    "log": r.log}
        if self.role == "dns":
            return {"served": dict(self.dns.served)}
        return {"served": {k: v for app in self.apps for k, v in app.served.items()},
                "log": [x for app in self.apps for x in app.log]}

    def reset(self) -> None:
        from netdiag.lab.servers import EdgeStats, RouterStats

        if self.edge is not None:
            self.edge.stats = EdgeStats()
        if self.router is not None:
            self.router.stats = RouterStats(store_opened_before=len(self.router.store.opened))
            self.router._conns.clear()
        for app in self.apps:
            app.log.clear()

    async def close_pools(self) -> None:
        if self.edge is not None:
            await self.edge.close_pool()
        if self.router is not None:
            await self.router.close_pool()

    async def run(self, ready: Any, stop: asyncio.Event) -> None:
        from netdiag.lab.dns_server import DnsHandler, DnsUdp, tcp_client_handler

        loop = asyncio.get_running_loop()
        udp_transport = dns_tcp = udp_proto = None
        if self.role == "dns":
            self.dns = DnsHandler(P.Topology(self.p.origins).zone(), self.p.dns_delay_ms / 1000)
            self.dns.warm_up()
            udp_transport, udp_proto = await loop.create_datagram_endpoint(
                lambda: DnsUdp(self.dns), sock=self.udp)
            dns_tcp = await asyncio.start_server(tcp_client_handler(self.dns), sock=self.tcp)
        from netdiag.lab.h1 import start_http_server
        from netdiag.lab.h2server import stop_h2_server

        # an open-loop ramp may hold thousands of requests at once on one connection
        ramp = self.p.ramp is not None
        lean = [await start_http_server(handler, socks, ctx, self.cleartext,
                                        P.RAMP_MAX_STREAMS if ramp else None,
                                        P.RAMP_CONNECTION_WINDOW if ramp else None)
                for handler, socks, ctx in self.lean]
        h3 = h3_keylog = None
        if self.h3_sock is not None and self.h3_files is not None:
            from netdiag.lab.h3 import H3Server, open_keylog, server_configuration

            chain, key, keylog = self.h3_files
            h3_keylog = open_keylog(keylog)
            h3 = H3Server(self.edge.handle, self.h3_sock,
                          server_configuration(chain, key, h3_keylog))
            await h3.start()
        await asyncio.sleep(0)
        ready()
        try:
            await stop.wait()
            if h3 is not None:
                with contextlib.suppress(Exception):
                    await h3.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.close_pools(), 3)
            for servers, conns in lean:
                await stop_h2_server(servers, conns)
        finally:
            if h3_keylog is not None:
                h3_keylog.close()
            if dns_tcp is not None:
                dns_tcp.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(dns_tcp.wait_closed(), 2)
            if udp_transport is not None:
                udp_transport.close()
            if udp_proto is not None:
                for task in list(udp_proto.tasks):
                    task.cancel()
            self.close()


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _main(role: str) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    line = await reader.readline()
    if not line:
        return 1
    try:
        cfg = json.loads(line)
        state = _Role(role, cfg)
    except LabError as exc:
        _reply({"error": str(exc)})
        return 1
    if cfg.get("realtime") and role in REALTIME_ROLES:
        _realtime()
    stop = asyncio.Event()
    serving = asyncio.create_task(state.run(lambda: _reply({"ready": True}), stop))

    async def commands() -> None:
        while True:
            raw = await reader.readline()
            if not raw:
                stop.set()
                return
            cmd = raw.decode().strip()
            try:
                await run(cmd)
            except Exception as exc:  # answer, never leave the parent waiting
                _reply({"error": f"{role}: {cmd} failed: {exc!r}"})
            if cmd == "stop":
                stop.set()
                return

    async def run(cmd: str) -> None:
        if cmd == "stats":
            _reply({"stats": state.stats()})
        elif cmd == "reset":
            state.reset()
            _reply({"ok": True})
        elif cmd == "close_pools":
            await asyncio.wait_for(state.close_pools(), 5)
            _reply({"ok": True})
        elif cmd != "stop":
            _reply({"error": f"unknown command {cmd!r}"})

    control = asyncio.create_task(commands())
    try:
        await serving
    finally:
        control.cancel()
    _reply({"stopped": True})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ROLES:
        print(f"usage: python -m netdiag.lab.serve {{{','.join(ROLES)}}}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format=f"{args[0]}: %(levelname)s %(message)s")
    try:
        return asyncio.run(_main(args[0]))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
