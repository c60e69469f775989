"""QUIC connection scenarios on loopback, captured: aioquic server and client, tcpdump.

``python tests/protocols/quic_scenarios.py NAME OUTDIR`` writes ``OUTDIR/NAME.pcap``,
``OUTDIR/NAME.keys`` (the client's NSS key log) and ``OUTDIR/NAME.json``: what the
client did, with its own clock (``time.time_ns()``). Every address is 127.0.0.1 (the
client's dual-stack socket is bound to ``::ffff:127.0.0.1``). Scenarios:

- ``retry``: the server validates addresses with a Retry (``serve(retry=True)``); one
  HTTP/3 request.
- ``zero_rtt``: connection 1 obtains a session ticket (one request); connection 2
  resumes with it and sends its request before the handshake completes (0-RTT; aioquic's
  server always offers ``max_early_data`` in its tickets, so accepts it).
- ``migration``: one request, then the client moves to a second UDP socket (a new local
  port) and switches to the server's next connection id
  (``QuicConnection.change_connection_id``), then a second request.
- ``rebinding``: as ``migration`` but keeping the connection id (a NAT rebinding).
- ``vn_unknown`` (server port 4433): the client's first Initial carries version
  0x1a2a3a4a (aioquic's ``original_version``); the server, which supports version 1
  only, answers with Version Negotiation (1); the client starts again in version 1
  (a new ClientHello, the same Destination Connection ID) and sends one request.
- ``vn_v2``: the same with a version netdiag knows: the client starts in version 2
  (0x6b3343cf), the server supports only version 1.

The JSON: ``{"scenario", "port", "connections": [{"local_ports", "connect_ns" (clock
read before the first Initial is sent), "handshake_ns" (HandshakeCompleted),
"early_data_accepted", "session_resumed", "version" (at the end), "client_random" (of
the ClientHello that completed the handshake), "host_cids" (the
client's own ids), "peer_cids_used" (the server's ids the client used, in order),
"requests": [{"stream_id", "path", "sent_ns", "first_ns", "end_ns", "status",
"local_port"}]}]}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO, cast

from aioquic.asyncio import serve
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicProtocolVersion
from aioquic.tls import SessionTicket
from h3_peers import H3Client, H3Server, free_udp_port, tcpdump

SCENARIOS = ("retry", "zero_rtt", "migration", "rebinding", "vn_unknown", "vn_v2")
GREASE_VERSION = 0x1A2A3A4A
BODY = b"y" * 2000
HOST = "127.0.0.1"
QUIC_PORT = 4433
"""``vn_unknown``'s server port: one of netdiag's QUIC ports (docs/report.md: elsewhere
only long headers of a known version are read as QUIC)."""
CLIENT_BIND = ("::ffff:127.0.0.1", 0, 0, 0)


class _Server(H3Server):
    CHUNKS = (BODY,)


class _Client(H3Client):
    def facts(self) -> dict[str, Any]:
        q = self._quic
        hs = self.handshake
        return {"handshake_ns": self.handshake_ns,
                "early_data_accepted": None if hs is None else hs.early_data_accepted,
                "session_resumed": None if hs is None else hs.session_resumed,
                "version": q._version,
                "client_random": None if q.tls.client_random is None
                else q.tls.client_random.hex(),
                "host_cids": [c.cid.hex() for c in q._host_cids],
                "peer_cids_used": list(getattr(self, "peer_cids_used", []))}


def _udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(CLIENT_BIND)
    return sock


@contextlib.asynccontextmanager
async def _connect(port: int, cfg: QuicConfiguration, record: dict[str, Any],
                   tickets: list[SessionTicket] | None = None,
                   wait: bool = True) -> AsyncIterator[_Client]:
    """aioquic's ``connect`` with the client socket on loopback only."""
    loop = asyncio.get_running_loop()
    quic = QuicConnection(configuration=cfg,
                          session_ticket_handler=None if tickets is None else tickets.append)
    transport, proto = await loop.create_datagram_endpoint(
        lambda: _Client(quic), sock=_udp_socket())
    client = cast(_Client, proto)
    client.peer_cids_used = []  # type: ignore[attr-defined]
    record["local_ports"] = [client.local_port()]
    record["connect_ns"] = time.time_ns()
    client.connect(("::ffff:" + HOST, port, 0, 0), transmit=wait)
    try:
        if wait:
            await client.wait_connected()
        client.peer_cids_used.append(quic._peer_cid.cid.hex())  # type: ignore[attr-defined]
        yield client
    finally:
        client.close()
        await client.wait_closed()
        transport.close()
        record.update(client.facts())


def _client_cfg(keys: TextIO, **kw: Any) -> QuicConfiguration:
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="quic.test",
                            secrets_log_file=keys, **kw)
    cfg.verify_mode = 0  # ssl.CERT_NONE
    return cfg


async def _run(name: str, out: Path, port: int) -> list[dict[str, Any]]:
    from netdiag.lab.certs import make_certs

    _ca, chain, key = make_certs(["quic.test"], out)
    scfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
    if name.startswith("vn_"):
        scfg.supported_versions = [QuicProtocolVersion.VERSION_1]
    scfg.load_cert_chain(str(chain), str(key))
    store: dict[bytes, SessionTicket] = {}
    server = await serve(HOST, port, configuration=scfg, create_protocol=_Server,
                         retry=name == "retry",
                         session_ticket_fetcher=store.pop,
                         session_ticket_handler=lambda t: store.__setitem__(t.ticket, t))
    conns: list[dict[str, Any]] = []
    try:
        with open(out / f"{name}.keys", "w") as keys:
            if name == "zero_rtt":
                tickets: list[SessionTicket] = []
                rec: dict[str, Any] = {}
                async with _connect(port, _client_cfg(keys), rec, tickets) as c:
                    rec["requests"] = [await c.get("/ticket")]
                    for _ in range(50):
                        if tickets:
                            break
                        await asyncio.sleep(0.01)
                conns.append(rec)
                assert tickets, "no session ticket"
                await asyncio.sleep(0.05)
                rec = {}
                async with _connect(port, _client_cfg(keys, session_ticket=tickets[-1]),
                                    rec, wait=False) as c:
                    rec["requests"] = [await c.get("/early")]
                    await asyncio.sleep(0.03)
                conns.append(rec)
            elif name in ("migration", "rebinding"):
                rec = {}
                loop = asyncio.get_running_loop()
                async with _connect(port, _client_cfg(keys), rec) as c:
                    reqs = [await c.get("/before")]
                    await asyncio.sleep(0.05)
                    old = c._transport
                    # the protocol's transport becomes the new socket's (connection_made)
                    await loop.create_datagram_endpoint(lambda: c, sock=_udp_socket())
                    rec["local_ports"].append(c.local_port())
                    if name == "migration":
                        c._quic.change_connection_id()
                        c.peer_cids_used.append(  # type: ignore[attr-defined]
                            c._quic._peer_cid.cid.hex())
                    reqs.append(await c.get("/after"))
                    await asyncio.sleep(0.05)
                    rec["requests"] = reqs
                old.close()
                conns.append(rec)
            else:
                kw: dict[str, Any] = {}
                if name == "vn_unknown":
                    kw.update(original_version=GREASE_VERSION,
                                     supported_versions=[GREASE_VERSION,
                                                         QuicProtocolVersion.VERSION_1])
                elif name == "vn_v2":
                    kw["original_version"] = QuicProtocolVersion.VERSION_2
                rec = {}
                async with _connect(port, _client_cfg(keys, **kw), rec) as c:
                    rec["requests"] = [await c.get(f"/{name}")]
                    await asyncio.sleep(0.03)
                conns.append(rec)
            keys.flush()
            await asyncio.sleep(0.05)
    finally:
        server.close()
    return conns


def make(name: str, out: Path) -> dict[str, Any]:
    """Run scenario ``name`` under tcpdump; returns what the client did (also in
    ``OUTDIR/NAME.json``)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
    out.mkdir(parents=True, exist_ok=True)
    port = free_udp_port(HOST, QUIC_PORT if name == "vn_unknown" else 0)
    with tcpdump(out / f"{name}.pcap", f"udp port {port} and host {HOST}"):
        conns = asyncio.run(asyncio.wait_for(_run(name, out, port), 20))
    result = {"scenario": name, "port": port, "connections": conns}
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    names = SCENARIOS if sys.argv[1] == "all" else (sys.argv[1],)
    for n in names:
        print(json.dumps(make(n, Path(sys.argv[2]))))
