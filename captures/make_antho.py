#!/usr/bin/env python3
"""Produce ``captures/antho.pcapng`` live, on loopback.

Real servers, real clients, a real capture:

* a DNS server (dnspython wire format, asyncio, UDP and TCP) on 127.0.0.53:53 that
  answers ``A`` for ``api.roc.test`` and ``api.dpf.test`` and NXDOMAIN for anything
  else, after a configurable delay;
* ``api.roc.test`` on 127.0.0.10:443: hypercorn, TLS 1.3 only, HTTP/2 (ALPN h2);
* ``api.dpf.test`` on 127.0.0.20:443: hypercorn, TLS 1.2 only (ECDHE + AES-GCM),
  HTTP/2;
* both answer ``GET``/``POST /v1/messages`` with a small JSON body after a think time,
  and ``GET /v1/stream`` with server-sent events;
* clients: dnspython (resolver over UDP, ``dns.query.udp`` for the NXDOMAIN name,
  ``dns.query.tcp``), httpx with HTTP/2 writing an SSLKEYLOGFILE-style key log, and a
  small ssl + h2 client for one TLS 1.3 resumed connection (session ticket taken from
  the last httpx connection to ROC);
* scapy sniffs ``lo`` the whole time, keeps only packets to or from the lab's
  addresses, and writes pcapng with nanosecond timestamps.

The CA and leaf certificate are generated at run time and never written outside a
temporary directory. Requests run strictly one after the other, so the capture is
stable: the counts are deterministic, only the timings vary from run to run.

    python captures/make_antho.py --out captures/antho.pcapng --keylog captures/antho.keys

Importable: ``make_capture(out, keylog=None, **params) -> dict``. The dict (also
written beside the capture as ``<stem>.expected.json``) records what the clients
actually did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import os
import signal
import socket
import ssl
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.rrset
import h2.config
import h2.connection
import h2.events
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from scapy.arch.linux import L2Socket
from scapy.config import conf as scapy_conf
from scapy.data import DLT_EN10MB, ETH_P_ALL, SO_TIMESTAMPNS
from scapy.layers.l2 import Ether  # also maps ARPHRD_LOOPBACK to Ether
from scapy.sendrecv import AsyncSniffer
from scapy.utils import EDecimal, PcapNgWriter

log = logging.getLogger("netdiag.captures.antho")

HERE = Path(__file__).resolve().parent
USER_AGENT = "netdiag-lab/1 (antho capture)"

DEFAULT_PARAMS: dict[str, Any] = {
    "roc_name": "api.roc.test",
    "roc_ip": "127.0.0.10",
    "dpf_name": "api.dpf.test",
    "dpf_ip": "127.0.0.20",
    "https_port": 443,
    "dns_ip": "127.0.0.53",
    "dns_port": 53,
    "nx_name": "api.nowhere.test",
    "dns_delay_ms": 3.0,
    "roc_think_ms": 20.0,
    "dpf_think_ms": 10.0,
    "sse_events": 10,
    "sse_gap_ms": 5.0,
    # requests carried by each httpx connection to ROC, in order
    "roc_plan": [3, 1, 3, 1],
    # requests on the single DPF connection, before the SSE request
    "dpf_requests": 6,
    "dpf_sse": True,
    # one more ROC connection resuming the TLS 1.3 session of the last one
    "roc_resume": True,
    "pause_ms": 40.0,
    "request_gap_ms": 5.0,
    "client_timeout_s": 5.0,
    "overall_timeout_s": 60.0,
    "settle_s": 0.5,
}

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
TLS_NAMES = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2", "TLSv1.1": "TLS 1.1", "TLSv1": "TLS 1.0"}


class LabError(RuntimeError):
    """The lab could not run the traffic plan as intended."""


# --------------------------------------------------------------------------- certs


def _make_certs(names: list[str], workdir: Path) -> tuple[bytes, Path, Path]:
    """Self-signed CA and one leaf (EC P-256) with a SAN per name.

    Returns (CA PEM, leaf chain path, leaf key path); the files live in ``workdir``.
    """
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netdiag lab CA (throwaway)")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    chain = workdir / "leaf-chain.pem"
    key = workdir / "leaf-key.pem"
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + ca_pem)
    key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    return ca_pem, chain, key


def _server_ssl_context(chain: Path, key: Path, *, tls12_only: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_COMPRESSION  # RFC 9113 section 9.2.1
    if tls12_only:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers("ECDHE+AESGCM")
    else:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    ctx.load_cert_chain(chain, key)
    return ctx


def _client_ssl_context(ca_pem: bytes, keylog: Path | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode())
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    if keylog is not None:
        ctx.keylog_filename = str(keylog)
    return ctx


# --------------------------------------------------------------------------- servers


def _listening_socket(ip: str, port: int, kind: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if kind == socket.SOCK_STREAM:
            # inherited by accepted sockets (asyncio only sets it when proto is TCP)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((ip, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise LabError(f"cannot bind {ip}:{port}: {exc}") from exc
    return sock


class _LabHypercornConfig(HypercornConfig):
    """Hypercorn config using our ssl context and our pre-bound listening socket."""

    def __init__(self, ssl_context: ssl.SSLContext, sock: socket.socket) -> None:
        super().__init__()
        self._lab_ssl_context = ssl_context
        self._lab_socket = sock
        self.accesslog = None
        self.errorlog = logging.getLogger("netdiag.captures.antho.hypercorn")
        self.graceful_timeout = 2.0
        self.keep_alive_timeout = 10.0

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext:
        return self._lab_ssl_context

    def create_sockets(self) -> Sockets:
        return Sockets([self._lab_socket], [], [])


def _make_app(label: str, think_s: float, sse_events: int, sse_gap_s: float) -> Callable:
    served = Counter()

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        method, path = scope["method"], scope["path"]
        served[path] += 1
        if path == "/v1/messages" and method in ("GET", "POST"):
            await asyncio.sleep(think_s)
            payload = json.dumps(
                {
                    "id": f"{label.lower()}-{served[path]:04d}",
                    "server": label,
                    "method": method,
                    "received_bytes": len(body),
                    "text": "ok",
                },
                separators=(",", ":"),
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
        elif path == "/v1/stream" and method == "GET":
            await asyncio.sleep(think_s)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            for i in range(sse_events):
                if i:
                    await asyncio.sleep(sse_gap_s)
                event = json.dumps({"index": i, "token": f"tok{i}"}, separators=(",", ":"))
                await send(
                    {
                        "type": "http.response.body",
                        "body": f"data: {event}\n\n".encode(),
                        "more_body": i < sse_events - 1,
                    }
                )
            if sse_events == 0:
                await send({"type": "http.response.body", "body": b""})
        else:
            payload = b'{"error":"not found"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})

    return app


class _DnsHandler:
    def __init__(self, zone: dict[str, str], delay_s: float) -> None:
        self.zone = {k.rstrip(".").lower(): v for k, v in zone.items()}
        self.delay_s = delay_s
        self.served = Counter()

    def answer(self, wire: bytes) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # malformed: drop, like a real server would
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response.to_wire()
        question = query.question[0]
        name = question.name.to_text().rstrip(".").lower()
        if name not in self.zone:
            response.set_rcode(dns.rcode.NXDOMAIN)
            self.served["NXDOMAIN"] += 1
        else:
            self.served["NOERROR"] += 1
            if question.rdtype == dns.rdatatype.A:
                response.answer.append(
                    dns.rrset.from_text(question.name, 30, "IN", "A", self.zone[name])
                )
        return response.to_wire()


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, handler: _DnsHandler) -> None:
        self.handler = handler
        self.transport: asyncio.DatagramTransport | None = None
        self.tasks: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        task = asyncio.get_running_loop().create_task(self._reply(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reply(self, data: bytes, addr: tuple) -> None:
        await asyncio.sleep(self.handler.delay_s)
        wire = self.handler.answer(data)
        if wire is not None and self.transport is not None:
            self.transport.sendto(wire, addr)


class LabServers:
    """DNS + two HTTPS servers in one asyncio loop on a background thread."""

    def __init__(self, p: dict[str, Any], chain: Path, key: Path) -> None:
        self.p = p
        # Bind everything synchronously: errors surface here, and the kernel accepts
        # connections from now on, so there is no readiness race with the clients.
        self._socks: list[socket.socket] = []
        try:
            self._dns_udp = self._keep(
                _listening_socket(p["dns_ip"], p["dns_port"], socket.SOCK_DGRAM)
            )
            self._dns_tcp = self._keep(
                _listening_socket(p["dns_ip"], p["dns_port"], socket.SOCK_STREAM)
            )
            self._roc = self._keep(
                _listening_socket(p["roc_ip"], p["https_port"], socket.SOCK_STREAM)
            )
            self._dpf = self._keep(
                _listening_socket(p["dpf_ip"], p["https_port"], socket.SOCK_STREAM)
            )
        except BaseException:
            self._close_socks()
            raise
        self.roc_ssl = _server_ssl_context(chain, key, tls12_only=False)
        self.dpf_ssl = _server_ssl_context(chain, key, tls12_only=True)
        self.dns = _DnsHandler(
            {p["roc_name"]: p["roc_ip"], p["dpf_name"]: p["dpf_ip"]}, p["dns_delay_ms"] / 1000
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="antho-servers", daemon=True)

    def _keep(self, sock: socket.socket) -> socket.socket:
        self._socks.append(sock)
        return sock

    def _close_socks(self) -> None:
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise LabError("servers did not start within 10 s")
        if self._error is not None:
            raise LabError(f"servers failed to start: {self._error!r}") from self._error

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self._close_socks()
        if self._thread.is_alive():
            raise LabError(f"servers did not shut down within {timeout:.0f} s")
        if self._error is not None:
            raise LabError(f"server thread failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        p = self.p
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handler = self.dns
        udp_transport, udp_proto = await self._loop.create_datagram_endpoint(
            lambda: _DnsUdp(handler), sock=self._dns_udp
        )

        async def dns_tcp_client(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            try:
                while True:
                    try:
                        size = struct.unpack("!H", await reader.readexactly(2))[0]
                        wire = await reader.readexactly(size)
                    except (asyncio.IncompleteReadError, ConnectionError):
                        break
                    await asyncio.sleep(handler.delay_s)
                    answer = handler.answer(wire)
                    if answer is None:
                        break
                    writer.write(struct.pack("!H", len(answer)) + answer)
                    await writer.drain()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

        dns_tcp = await asyncio.start_server(dns_tcp_client, sock=self._dns_tcp)
        roc_app = _make_app(
            "ROC", p["roc_think_ms"] / 1000, p["sse_events"], p["sse_gap_ms"] / 1000
        )
        dpf_app = _make_app(
            "DPF", p["dpf_think_ms"] / 1000, p["sse_events"], p["sse_gap_ms"] / 1000
        )
        stop = self._stop
        https = [
            asyncio.create_task(
                serve(
                    roc_app,
                    _LabHypercornConfig(self.roc_ssl, self._roc),
                    shutdown_trigger=stop.wait,
                    mode="asgi",
                )
            ),
            asyncio.create_task(
                serve(
                    dpf_app,
                    _LabHypercornConfig(self.dpf_ssl, self._dpf),
                    shutdown_trigger=stop.wait,
                    mode="asgi",
                )
            ),
        ]
        self._ready.set()
        try:
            await stop.wait()
            results = await asyncio.wait_for(asyncio.gather(*https, return_exceptions=True), 8)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        finally:
            for task in https:
                task.cancel()
            dns_tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(dns_tcp.wait_closed(), 2)
            udp_transport.close()
            for task in list(udp_proto.tasks):
                task.cancel()


# --------------------------------------------------------------------------- capture


class _NsL2Socket(L2Socket):
    """L2Socket that keeps the kernel's nanosecond timestamp exactly (EDecimal).

    Unlike scapy's L2ListenSocket it drops the PACKET_OUTGOING copy, so each loopback
    packet is captured once, as tcpdump does. Packets come up as ``Raw`` (the link
    layer is kept in ``linktype``): dissecting every packet with scapy in the sniffer
    thread would take the GIL from the servers and clients and add jitter to the very
    timings the capture is for.
    """

    SNAPLEN = 262144

    def recv_raw(self, x: int = 0):  # type: ignore[override]
        pkt, ancdata, _flags, sa_ll = self.ins.recvmsg(self.SNAPLEN, socket.CMSG_LEN(4096))
        if not pkt or sa_ll[2] == socket.PACKET_OUTGOING:
            return None, None, None
        ts: Any = None
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = struct.unpack("qq", data[:16])
                ts = EDecimal(sec) + EDecimal(nsec) / EDecimal(1_000_000_000)
        if ts is None:
            ts = EDecimal(repr(time.time()))
        return scapy_conf.raw_layer, pkt, ts


class _NsPcapNgWriter(PcapNgWriter):
    """pcapng with if_tsresol = 9 (nanoseconds) and if_name = the capture interface."""

    def __init__(self, filename: str, ifname: str, linktype: int) -> None:
        super().__init__(filename)
        self.tsresol = 1_000_000_000
        self.linktype = linktype
        self._ifname = ifname.encode()

    def _write_block_idb(self, linktype: int, ifname: bytes | None = None) -> None:
        block = struct.pack("<HHI", linktype, 0, _NsL2Socket.SNAPLEN)
        name = self._ifname
        opts = struct.pack("<HH", 2, len(name)) + self._add_padding(name)  # if_name
        opts += struct.pack("<HHB3x", 9, 1, 9)  # if_tsresol: 10^-9
        opts += struct.pack("<HH", 0, 0)
        self.f.write(self.build_block(struct.pack("<I", 1), block, options=opts))

    def write_raw(self, raw: bytes, ts: Decimal) -> None:
        if not self.header_present:
            self._write_header(None)
        self._write_block_epb(raw, ifid=0, timestamp=Decimal(ts))


class LoopbackCapture:
    """AsyncSniffer on ``lo`` keeping only packets to/from the lab's addresses."""

    def __init__(self, addresses: list[str], iface: str = "lo") -> None:
        self.addresses = frozenset(addresses)
        self._lab = frozenset(socket.inet_aton(a) for a in addresses)
        self._loopback = socket.inet_aton("127.0.0.1")
        self.iface = iface
        self._marker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._marker.bind(("127.0.0.1", 0))
        self._marker_port = self._marker.getsockname()[1]
        self._token = b"netdiag-antho-marker-" + os.urandom(8).hex().encode()
        self._seen = threading.Event()
        hosts = " or ".join(f"host {a}" for a in sorted(self.addresses))
        bpf = f"({hosts}) or (udp and dst host 127.0.0.1 and dst port {self._marker_port})"
        try:
            self._sock = _NsL2Socket(iface=iface, type=ETH_P_ALL, filter=bpf)
        except Exception:  # no BPF compiler: lfilter alone does the job, more slowly
            log.debug("BPF filter unavailable, filtering in Python only", exc_info=True)
            self._sock = _NsL2Socket(iface=iface, type=ETH_P_ALL)
        if self._sock.LL is not Ether:  # Linux lo frames carry a fake Ethernet header
            self._sock.close()
            self._marker.close()
            raise LabError(f"unexpected link layer on {iface}: {self._sock.LL!r}")
        self.linktype = DLT_EN10MB
        self._sniffer = AsyncSniffer(opened_socket=self._sock, lfilter=self._keep, store=True)

    def _keep(self, pkt: Any) -> bool:
        """lfilter on the raw frame: IPv4 to or from a lab address (or our marker)."""
        data = bytes(pkt)
        if len(data) < 34 or data[12:14] != b"\x08\x00":
            return False
        src, dst = data[26:30], data[30:34]
        if src in self._lab or dst in self._lab:
            return True
        ihl = (data[14] & 0x0F) * 4
        udp = 14 + ihl
        if (
            data[23] == 17
            and dst == self._loopback
            and data[udp + 2 : udp + 4] == struct.pack("!H", self._marker_port)
            and data[udp + 8 :] == self._token
        ):
            self._seen.set()
        return False

    def start(self, timeout: float = 5.0) -> None:
        self._sniffer.start()
        deadline = time.monotonic() + timeout
        while not self._seen.is_set():
            if time.monotonic() > deadline:
                self.stop()
                raise LabError("the sniffer did not see its marker packet on lo")
            self._marker.sendto(self._token, ("127.0.0.1", self._marker_port))
            self._seen.wait(0.05)

    def stop(self) -> list:
        try:
            if self._sniffer.running:
                packets = self._sniffer.stop(join=True) or []
            else:
                packets = self._sniffer.results or []
        finally:
            with contextlib.suppress(OSError):
                self._sock.close()
            with contextlib.suppress(OSError):
                self._marker.close()
        return list(packets)

    def write(self, packets: list, out: Path) -> int:
        tmp = out.with_name(out.name + ".part")
        writer = _NsPcapNgWriter(str(tmp), self.iface, self.linktype)
        try:
            for pkt in packets:
                writer.write_raw(bytes(pkt.original), pkt.time)
        finally:
            writer.close()
        tmp.replace(out)
        return len(packets)


# --------------------------------------------------------------------------- clients


class Ledger:
    """What the clients actually did."""

    def __init__(self) -> None:
        self.dns: list[dict[str, Any]] = []
        self.connections: list[dict[str, Any]] = []


def _dns_lookup(ledger: Ledger, p: dict[str, Any], name: str, how: str) -> list[str]:
    """One DNS transaction; ``how`` is 'resolver' (UDP), 'udp' or 'tcp'."""
    qname = name.rstrip(".") + "."
    timeout = p["client_timeout_s"]
    answers: list[str] = []
    if how == "resolver":
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [p["dns_ip"]]
        resolver.port = p["dns_port"]
        resolver.timeout = timeout
        resolver.lifetime = timeout
        resolver.cache = None
        try:
            result = resolver.resolve(qname, "A", search=False, raise_on_no_answer=False)
            rcode = dns.rcode.to_text(result.response.rcode())
            answers = [r.address for r in result] if result.rrset is not None else []
        except dns.resolver.NXDOMAIN:
            rcode = "NXDOMAIN"
        transport = "udp"
    else:
        query = dns.message.make_query(qname, "A")
        send = dns.query.udp if how == "udp" else dns.query.tcp
        response = send(query, p["dns_ip"], timeout=timeout, port=p["dns_port"])
        rcode = dns.rcode.to_text(response.rcode())
        for rrset in response.answer:
            answers += [r.address for r in rrset if r.rdtype == dns.rdatatype.A]
        transport = how
    ledger.dns.append(
        {
            "qname": name,
            "qtype": "A",
            "transport": transport,
            "server": f"{p['dns_ip']}:{p['dns_port']}",
            "rcode": rcode,
            "answers": answers,
        }
    )
    return answers


def _conn_record(label: str, server: str, sni: str, sock: Any) -> dict[str, Any]:
    client = sock.getsockname()
    cipher = sock.cipher()
    return {
        "path": label,
        "client": f"{client[0]}:{client[1]}",
        "server": server,
        "sni": sni,
        "tls_version": TLS_NAMES.get(sock.version(), sock.version()),
        "cipher": cipher[0] if cipher else None,
        "alpn": sock.selected_alpn_protocol(),
        "resumed": bool(sock.session_reused),
        "requests": [],
    }


def _https_connection(
    ledger: Ledger,
    p: dict[str, Any],
    ctx: ssl.SSLContext,
    label: str,
    name: str,
    ip: str,
    requests: list[tuple[str, str]],
    keep_session: bool = False,
) -> ssl.SSLSession | None:
    """One httpx client = one TLS connection carrying ``requests`` sequentially."""
    port = p["https_port"]
    base = f"https://{ip}:{port}" if port != 443 else f"https://{ip}"
    server = f"{ip}:{port}"
    record: dict[str, Any] | None = None
    session = None
    gap = p["request_gap_ms"] / 1000
    transport = httpx.HTTPTransport(http2=True, verify=ctx, trust_env=False, socket_options=NODELAY)
    with httpx.Client(
        transport=transport,
        trust_env=False,
        base_url=base,
        timeout=p["client_timeout_s"],
        headers={"Host": name, "User-Agent": USER_AGENT},
    ) as client:
        for i, (method, path) in enumerate(requests):
            if i:
                time.sleep(gap)
            ext = {"sni_hostname": name}
            if path == "/v1/stream":
                events = 0
                with client.stream(
                    "GET", path, extensions=ext, headers={"Accept": "text/event-stream"}
                ) as resp:
                    for line in resp.iter_lines():
                        if line.startswith("data:"):
                            events += 1
                    extra: dict[str, Any] = {"events": events}
            elif method == "POST":
                body = {"model": "lab", "messages": [{"role": "user", "content": f"q{i}"}]}
                resp = client.post(path, json=body, extensions=ext)
                extra = {}
            else:
                resp = client.get(path, extensions=ext, headers={"Accept": "application/json"})
                extra = {}
            if resp.http_version != "HTTP/2":
                raise LabError(f"{label}: expected HTTP/2, got {resp.http_version}")
            sock = resp.extensions["network_stream"].get_extra_info("socket")
            if record is None:
                record = _conn_record(label, server, name, sock)
                ledger.connections.append(record)
            elif record["client"] != "{}:{}".format(*sock.getsockname()):
                raise LabError(f"{label}: httpx opened a second connection unexpectedly")
            record["requests"].append(
                {
                    "method": method,
                    "path": path,
                    "status": resp.status_code,
                    "stream_id": resp.extensions.get("stream_id"),
                    **extra,
                }
            )
            if keep_session and i == len(requests) - 1:
                session = sock.session
    return session


def _h2_resumed_connection(
    ledger: Ledger,
    p: dict[str, Any],
    ctx: ssl.SSLContext,
    label: str,
    name: str,
    ip: str,
    path: str,
    session: ssl.SSLSession,
) -> None:
    """One GET over a fresh TLS connection that resumes ``session`` (ssl + h2)."""
    port = p["https_port"]
    timeout = p["client_timeout_s"]
    raw = socket.create_connection((ip, port), timeout=timeout)
    raw.setsockopt(*NODELAY[0])
    with ctx.wrap_socket(raw, server_hostname=name, session=session) as tls:
        if tls.selected_alpn_protocol() != "h2":
            raise LabError(f"{label}: resumed connection did not negotiate h2")
        record = _conn_record(label, f"{ip}:{port}", name, tls)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())
        sid = conn.get_next_available_stream_id()
        authority = name if port == 443 else f"{name}:{port}"
        conn.send_headers(
            sid,
            [
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", authority),
                (":path", path),
                ("accept", "application/json"),
                ("user-agent", USER_AGENT),
            ],
            end_stream=True,
        )
        tls.sendall(conn.data_to_send())
        status = None
        done = False
        while not done:
            data = tls.recv(65536)
            if not data:
                raise LabError(f"{label}: server closed the resumed connection early")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    status = int(dict(event.headers)[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    done = True
                elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    raise LabError(f"{label}: resumed request failed: {event}")
            pending = conn.data_to_send()
            if pending:
                tls.sendall(pending)
        # GOAWAY, then let the server close first (close_notify + FIN) and read to EOF:
        # closing with its answer unread would make our kernel answer with a RST.
        conn.close_connection()
        tls.sendall(conn.data_to_send())
        with contextlib.suppress(OSError):
            while tls.recv(65536):
                pass
        record["requests"].append(
            {"method": "GET", "path": path, "status": status, "stream_id": sid}
        )
        ledger.connections.append(record)


def _run_plan(p: dict[str, Any], ctx: ssl.SSLContext, deadline: float) -> Ledger:
    ledger = Ledger()
    pause = p["pause_ms"] / 1000

    def step() -> None:
        if time.monotonic() > deadline:
            raise LabError("overall timeout reached while running the traffic plan")
        time.sleep(pause)

    def roc_requests(n: int, k: int) -> list[tuple[str, str]]:
        cycle = [("GET", "/v1/messages"), ("POST", "/v1/messages")]
        return [cycle[(k + i) % 2] for i in range(n)]

    def resolve(name: str, how: str, expected_ip: str) -> str:
        answers = _dns_lookup(ledger, p, name, how)
        if answers != [expected_ip]:
            raise LabError(f"DNS answer for {name} was {answers}, expected {expected_ip}")
        return answers[0]

    session = None
    plan = list(p["roc_plan"])
    for k, n in enumerate(plan):
        step()
        ip = resolve(p["roc_name"], "resolver", p["roc_ip"])
        if k == 0:
            step()
            if _dns_lookup(ledger, p, p["nx_name"], "udp"):
                raise LabError(f"{p['nx_name']} unexpectedly resolved")
        step()
        session = _https_connection(
            ledger,
            p,
            ctx,
            "ROC",
            p["roc_name"],
            ip,
            roc_requests(n, k),
            keep_session=k == len(plan) - 1,
        )

    if p["dpf_requests"] or p["dpf_sse"]:
        step()
        ip = resolve(p["dpf_name"], "tcp", p["dpf_ip"])
        step()
        reqs = [
            ("GET", "/v1/messages") if i % 2 == 0 else ("POST", "/v1/messages")
            for i in range(p["dpf_requests"])
        ]
        if p["dpf_sse"]:
            reqs.append(("GET", "/v1/stream"))
        _https_connection(ledger, p, ctx, "DPF", p["dpf_name"], ip, reqs)

    if p["roc_resume"] and session is not None:
        step()
        ip = resolve(p["roc_name"], "resolver", p["roc_ip"])
        step()
        _h2_resumed_connection(ledger, p, ctx, "ROC", p["roc_name"], ip, "/v1/messages", session)
        if not ledger.connections[-1]["resumed"]:
            raise LabError("the TLS 1.3 resumption attempt did a full handshake")
    return ledger


# --------------------------------------------------------------------------- driver


def _summary(ledger: Ledger, p: dict[str, Any]) -> dict[str, Any]:
    conns = Counter(c["path"].lower() for c in ledger.connections)
    reqs = Counter()
    for c in ledger.connections:
        reqs[c["path"].lower()] += len(c["requests"])
    return {
        "dns_queries": len(ledger.dns),
        "dns_nxdomain": sum(1 for d in ledger.dns if d["rcode"] == "NXDOMAIN"),
        "dns_transports": dict(Counter(d["transport"] for d in ledger.dns)),
        "connections": {"roc": conns.get("roc", 0), "dpf": conns.get("dpf", 0)},
        "requests": {"roc": reqs.get("roc", 0), "dpf": reqs.get("dpf", 0)},
        "tls_versions": dict(Counter(c["tls_version"] for c in ledger.connections)),
        "tls_resumed": sum(1 for c in ledger.connections if c["resumed"]),
        "sse_streams": sum(
            1 for c in ledger.connections for r in c["requests"] if r["path"] == "/v1/stream"
        ),
        "servers": {
            "roc": {
                "name": p["roc_name"],
                "address": f"{p['roc_ip']}:{p['https_port']}",
                "tls": "TLS 1.3",
            },
            "dpf": {
                "name": p["dpf_name"],
                "address": f"{p['dpf_ip']}:{p['https_port']}",
                "tls": "TLS 1.2",
            },
            "dns": {"address": f"{p['dns_ip']}:{p['dns_port']}"},
        },
        "dns_log": ledger.dns,
        "connection_log": ledger.connections,
    }


def make_capture(out: Path, keylog: Path | None = None, **params: Any) -> dict[str, Any]:
    """Run the lab and write the capture to ``out``; return what the clients did."""
    unknown = set(params) - set(DEFAULT_PARAMS)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p = {**DEFAULT_PARAMS, **params}
    for key in ("roc_ip", "dpf_ip", "dns_ip"):
        if not ipaddress.ip_address(p[key]).is_loopback:
            raise ValueError(f"{key}={p[key]} is not a loopback address")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if keylog is not None:
        keylog = Path(keylog)
        keylog.parent.mkdir(parents=True, exist_ok=True)
        keylog.write_text("")  # the context appends; start from an empty file
    started = time.monotonic()
    deadline = started + p["overall_timeout_s"] - 5  # leave time to shut down

    with tempfile.TemporaryDirectory(prefix="antho-certs-") as tmp:
        ca_pem, chain, key = _make_certs([p["roc_name"], p["dpf_name"]], Path(tmp))
        client_ctx = _client_ssl_context(ca_pem, keylog)
        servers = LabServers(p, chain, key)
        capture: LoopbackCapture | None = None
        packets: list = []
        try:
            servers.start()
            capture = LoopbackCapture([p["roc_ip"], p["dpf_ip"], p["dns_ip"]])
            capture.start()
            ledger = _run_plan(p, client_ctx, deadline)
            time.sleep(p["settle_s"])  # let the last FIN/ACKs reach the sniffer
        finally:
            if capture is not None:
                packets = capture.stop()
            servers.stop()
    assert capture is not None
    n_packets = capture.write(packets, out)

    result = _summary(ledger, p)
    result = {
        "capture": out.name,
        "keylog": keylog.name if keylog is not None else None,
        "packets": n_packets,
        "duration_s": round(time.monotonic() - started, 3),
        **result,
        "params": p,
    }
    expected = out.with_name(out.name.split(".")[0] + ".expected.json")
    expected.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "antho.pcapng")
    parser.add_argument("--keylog", type=Path, default=HERE / "antho.keys")
    parser.add_argument("--no-keylog", action="store_true", help="do not write a key log")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_PARAMS["overall_timeout_s"],
        help="hard overall time limit in seconds (default %(default)s)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # Last resort: whatever hangs, the process dies (SIGALRM's default action).
    signal.alarm(int(args.timeout) + 15)
    try:
        result = make_capture(
            args.out, None if args.no_keylog else args.keylog, overall_timeout_s=args.timeout
        )
    except LabError as exc:
        print(f"make_antho: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
    size = args.out.stat().st_size
    print(
        f"{args.out}: {result['packets']} packets, {size} bytes, "
        f"{result['dns_queries']} DNS queries ({result['dns_nxdomain']} NXDOMAIN), "
        f"connections {result['connections']}, requests {result['requests']}, "
        f"TLS {result['tls_versions']} ({result['tls_resumed']} resumed), "
        f"{result['duration_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
