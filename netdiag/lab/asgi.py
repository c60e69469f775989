"""The ASGI origin of the first shipped capture, on hypercorn (HTTP/2 and HTTP/1.1).

The lab's own hops are lean HTTP/2 servers (``netdiag.lab.servers``); this is the
general-purpose server ``captures/make_antho.py`` used to run, kept for tests that also
need HTTP/1.1 (``tests/test_decrypt_live.py``): hypercorn with our ssl context and
pre-bound sockets, and an app answering JSON after a think time or server-sent events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]

__all__ = ["LabHypercornConfig", "make_origin_app", "serve"]


class LabHypercornConfig(HypercornConfig):
    """Hypercorn config using our ssl context (or none: h2c) and pre-bound sockets."""

    def __init__(self, ssl_context: ssl.SSLContext | None,
                 socks: socket.socket | list[socket.socket]) -> None:
        super().__init__()
        self._lab_ssl_context = ssl_context
        self._lab_sockets = [socks] if isinstance(socks, socket.socket) else list(socks)
        self.accesslog = None
        self.errorlog = logging.getLogger("netdiag.lab.hypercorn")
        self.graceful_timeout = 2.0
        self.keep_alive_timeout = 60.0
        self.include_server_header = False

    @property
    def ssl_enabled(self) -> bool:
        return self._lab_ssl_context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._lab_ssl_context

    def create_sockets(self) -> Sockets:
        if self._lab_ssl_context is None:
            return Sockets([], list(self._lab_sockets), [])
        return Sockets(list(self._lab_sockets), [], [])


async def _lifespan(receive: Callable[[], Awaitable[dict[str, Any]]],
                    send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Callable[[], Awaitable[dict[str, Any]]]) -> bytes | None:
    """The request body, or None when the client went away."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return bytes(v).decode("latin-1")
    return None


async def _send_json(send: Callable[[dict[str, Any]], Awaitable[None]], status: int,
                     doc: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(doc, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})


def make_origin_app(label: str, think_s: float, sse_events: int, sse_gap_s: float,
                    identities: dict[str, tuple[str, str]] | None = None) -> ASGIApp:
    """An origin ("GPU") server.

    ``GET``/``POST /v1/messages``: a small JSON answer after ``think_s``;
    ``GET``/``POST /v1/stream``: ``sse_events`` server-sent events, the first after
    ``think_s``, then one every ``sse_gap_s``. ``identities`` maps the local address a
    request arrived on to (``server`` header, ``x-origin`` header), so one app serves
    several origins.
    """
    served: Counter[str] = Counter()

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                  send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        if body is None:
            return
        method, path = scope["method"], scope["path"]
        local = (scope.get("server") or ("", 0))[0]
        server_name, origin = (identities or {}).get(local, (label, label))
        served[origin] += 1
        headers = [(b"server", server_name.encode()), (b"x-origin", origin.encode())]
        rid = _header(scope, b"x-request-id")
        if rid is not None:
            headers.append((b"x-request-id", rid.encode()))
        model = None
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                model = json.loads(body).get("model")
        if path == "/v1/messages" and method in ("GET", "POST"):
            await asyncio.sleep(think_s)
            await _send_json(send, 200, {
                "id": f"{origin}-{served[origin]:04d}", "server": label, "origin": origin,
                "method": method, "model": model, "received_bytes": len(body), "text": "ok"},
                headers)
        elif path == "/v1/stream" and method in ("GET", "POST"):
            await asyncio.sleep(think_s)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"),
                                    (b"cache-control", b"no-cache"), *headers]})
            for i in range(sse_events):
                if i:
                    await asyncio.sleep(sse_gap_s)
                event = json.dumps({"index": i, "token": f"tok{i}"}, separators=(",", ":"))
                await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode(),
                            "more_body": i < sse_events - 1})
            if sse_events == 0:
                await send({"type": "http.response.body", "body": b""})
        else:
            await _send_json(send, 404, {"error": "not found"}, headers)

    app.served = served  # type: ignore[attr-defined]
    return app
