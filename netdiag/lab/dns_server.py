"""The lab's DNS server: asyncio + dnspython wire format, UDP and TCP, with a delay.

Answers ``A`` for the names of its zone (authoritative), NOERROR without answers for
other types of those names, NXDOMAIN for anything else; every answer leaves
``delay_s`` after its query arrived (the answer is built first, then held).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import Counter

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

from netdiag.lab.timing import sleep_until


class DnsHandler:
    """Answers one query (wire format in, wire format out)."""

    def __init__(self, zone: dict[str, str], delay_s: float) -> None:
        self.zone = {k.rstrip(".").lower(): v for k, v in zone.items()}
        self.delay_s = delay_s
        self.served: Counter[str] = Counter()

    def warm_up(self) -> None:
        """Answer one query of each kind in-process, so that dnspython's lazy imports do
        not delay the first real answer past its deadline."""
        for name in (next(iter(self.zone), "a.test"), "nowhere.invalid"):
            self.answer(dns.message.make_query(name + ".", "A").to_wire())
        self.served.clear()

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


class DnsUdp(asyncio.DatagramProtocol):
    """UDP side: one task per query, so a delay never blocks the next query."""

    def __init__(self, handler: DnsHandler) -> None:
        self.handler = handler
        self.transport: asyncio.DatagramTransport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.get_running_loop().create_task(self._reply(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reply(self, data: bytes, addr: tuple[str, int]) -> None:
        arrived = asyncio.get_running_loop().time()
        wire = self.handler.answer(data)
        await sleep_until(arrived + self.handler.delay_s)
        if wire is not None and self.transport is not None:
            self.transport.sendto(wire, addr)


def tcp_client_handler(handler: DnsHandler):  # type: ignore[no-untyped-def]
    """An ``asyncio.start_server`` callback serving DNS over TCP (length-prefixed)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    size = struct.unpack("!H", await reader.readexactly(2))[0]
                    arrived = asyncio.get_running_loop().time()
                    wire = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                answer = handler.answer(wire)
                await sleep_until(arrived + handler.delay_s)
                if answer is None:
                    break
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return serve
