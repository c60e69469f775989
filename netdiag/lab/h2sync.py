"""One blocking HTTP/2 request over a TLS connection that resumes a session (ssl + h2).

httpx cannot hand a session to a new connection; this is the lab's way to put a TLS
1.3 PSK (resumed) handshake in the capture.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from typing import Any

import h2.config
import h2.connection
import h2.events

from netdiag.lab.errors import LabError
from netdiag.lab.sockets import bind_source

TLS_NAMES = {"TLSv1.3": "TLS 1.3", "TLSv1.2": "TLS 1.2"}
HOP_HEADERS = ("server", "x-origin", "via", "x-router", "x-request-id", "server-timing",
               "x-envoy-upstream-service-time")


def h2_get_resumed(ctx: ssl.SSLContext, ip: str, port: int, name: str, source: str,
                   session: ssl.SSLSession, request_id: str | None, timeout: float,
                   user_agent: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``GET /v1/messages`` on a fresh connection resuming ``session``.

    ``request_id`` None sends no ``x-request-id``.
    Returns (connection record, request record). The client sends GOAWAY and lets the
    server close first, reading to EOF: closing with its answer unread would make the
    kernel answer with a RST.
    """
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(timeout)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        bind_source(raw, source)
        raw.connect((ip, port))
    except OSError as exc:
        raw.close()
        raise LabError(f"resumed connection to {ip}:{port} failed: {exc}") from exc
    with ctx.wrap_socket(raw, server_hostname=name, session=session) as tls:
        if tls.selected_alpn_protocol() != "h2":
            raise LabError("the resumed connection did not negotiate h2")
        local = tls.getsockname()
        cipher = tls.cipher()
        rec: dict[str, Any] = {
            "path": None, "client": f"{local[0]}:{local[1]}", "server": f"{ip}:{port}",
            "sni": name, "tls_version": TLS_NAMES.get(tls.version() or "", tls.version()),
            "cipher": cipher[0] if cipher else None, "alpn": tls.selected_alpn_protocol(),
            "resumed": bool(tls.session_reused), "requests": []}
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())
        sid = conn.get_next_available_stream_id()
        authority = name if port == 443 else f"{name}:{port}"
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", authority),
                   (":path", "/v1/messages"), ("accept", "application/json"),
                   ("user-agent", user_agent)]
        if request_id is not None:  # None: no correlation header on the wire
            headers.append(("x-request-id", request_id))
        conn.send_headers(sid, headers, end_stream=True)
        tls.sendall(conn.data_to_send())
        status: int | None = None
        headers: dict[str, str] = {}
        done = False
        while not done:
            data = tls.recv(65536)
            if not data:
                raise LabError("the server closed the resumed connection early")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == sid:
                    headers = {str(k): str(v) for k, v in event.headers}
                    status = int(headers[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    done = True
                elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    raise LabError(f"the resumed request failed: {event}")
            pending = conn.data_to_send()
            if pending:
                tls.sendall(pending)
        conn.close_connection()
        tls.sendall(conn.data_to_send())
        with contextlib.suppress(OSError):
            while tls.recv(65536):
                pass
    req = {"method": "GET", "path": "/v1/messages", "status": status, "stream_id": sid,
           "request_id": request_id,
           "headers": {h: headers.get(h) for h in HOP_HEADERS}}
    rec["requests"].append({k: v for k, v in req.items() if k != "headers"})
    return rec, req
