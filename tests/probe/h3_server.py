"""A real HTTP/3 server for the ``probe --http3`` tests: ``python h3_server.py``.

aioquic behind ``netdiag.lab.h3.H3Server`` (the lab edge's QUIC listener), in a
process of its own (the probe's timers must not share a GIL with the server), on
127.0.0.1 and a free UDP port, with the lab's throwaway certificates
(``netdiag.lab.certs``) for ``api.probe.test``. Answers ``/v1/messages`` with JSON
after ``THINK_MS``, ``/v1/stream`` with 3 server-sent events 5 ms apart, anything
else 404. Prints one JSON line (``h3``: ``ip:port``, ``ca_pem``); stops at the end
of stdin.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

IP, NAME, THINK_MS = "127.0.0.1", "api.probe.test", 20.0


async def handler(stream: Any) -> None:
    await stream.body()
    path = stream.path.partition("?")[0]
    if path == "/v1/messages":
        await asyncio.sleep(THINK_MS / 1000)
        payload = json.dumps({"ok": True, "method": stream.method}).encode()
        stream.send_headers(200, [("content-type", "application/json"),
                                  ("content-length", str(len(payload)))])
        await stream.send_data(payload, end_stream=True)
    elif path == "/v1/stream":
        await asyncio.sleep(THINK_MS / 1000)
        stream.send_headers(200, [("content-type", "text/event-stream")])
        for i in range(3):
            if i:
                await asyncio.sleep(0.005)
            await stream.send_data(f"data: {i}\n\n".encode(), end_stream=i == 2)
    else:
        stream.send_headers(404, [("content-length", "0")], end_stream=True)


async def main() -> int:
    from netdiag.lab.certs import make_certs
    from netdiag.lab.h3 import H3Server, server_configuration

    with tempfile.TemporaryDirectory(prefix="probe-h3-") as tmp:
        ca_pem, chain, key = make_certs([NAME], Path(tmp))
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((IP, 0))
        sock.setblocking(False)
        server = H3Server(handler, sock, server_configuration(chain, key, None))
        await server.start()
        port = sock.getsockname()[1]
        sys.stdout.write(json.dumps({"h3": f"{IP}:{port}", "ca_pem": ca_pem.decode()}) + "\n")
        sys.stdout.flush()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        await server.stop(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
