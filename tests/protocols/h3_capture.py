"""A real HTTP/3 exchange on loopback, captured: aioquic server and client, tcpdump.

``python tests/protocols/h3_capture.py OUTDIR`` writes ``OUTDIR/h3.pcap``,
``OUTDIR/h3.keys`` (the client's NSS key log) and ``OUTDIR/timers.json``: per request,
the connection number, stream id, path and the client's own clock
(``time.time_ns()``) when it handed the request HEADERS to its QUIC connection to be
sent and when the first response event (HEADERS) arrived. Connection 1 carries
``N_FIRST`` requests one after the other, connection 2 one request.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aioquic.asyncio import connect, serve
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from h3_peers import H3Client, H3Server, free_udp_port, tcpdump

N_FIRST = 4
BODY = b"x" * 3000


class _Server(H3Server):
    CHUNKS = (BODY, b"end")


class _Client(H3Client):
    AUTHORITY = b"h3.test"


async def _run(out: Path, port: int) -> list[dict[str, Any]]:
    from netdiag.lab.certs import make_certs

    _ca, chain, key = make_certs(["h3.test"], out)
    scfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
    scfg.load_cert_chain(str(chain), str(key))
    server = await serve("127.0.0.1", port, configuration=scfg, create_protocol=_Server)
    timers: list[dict[str, Any]] = []
    try:
        with open(out / "h3.keys", "w") as keys:
            for n, count in ((1, N_FIRST), (2, 1)):
                ccfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                                         server_name="h3.test", secrets_log_file=keys)
                ccfg.verify_mode = 0  # ssl.CERT_NONE
                async with connect("127.0.0.1", port, configuration=ccfg,
                                   create_protocol=_Client) as client:
                    assert isinstance(client, _Client)
                    await client.wait_connected()
                    for i in range(count):
                        t = await client.get(f"/c{n}/r{i}")
                        t["connection"] = n
                        timers.append(t)
                        await asyncio.sleep(0.03)
                keys.flush()
                await asyncio.sleep(0.05)
    finally:
        server.close()
    return timers


def make(out: Path) -> dict[str, Any]:
    """Run the exchange under tcpdump; returns the timers (also in ``timers.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_udp_port()
    with tcpdump(out / "h3.pcap", f"udp port {port}"):
        timers = asyncio.run(_run(out, port))
    result = {"port": port, "requests": timers}
    (out / "timers.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    print(json.dumps(make(Path(sys.argv[1]))))
