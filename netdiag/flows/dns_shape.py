"""Is a UDP payload on a port not known as DNS a DNS message? (a heuristic, as tshark's)

DNS runs on more ports than 53: mDNS (5353), LLMNR (5355), Consul (8600), local
resolvers and test servers on whatever port they were given. A payload is taken as DNS
when its header and its first question parse as RFC 1035 says and nothing else would
likely look so: opcode QUERY (0), NOTIFY (4) or UPDATE (5), the Z bit clear, exactly
one question, at most :data:`MAX_RECORDS` records in each other section, a question
name of valid labels (1 to 63 bytes, 255 in all, no compression pointer: nothing
precedes it to point to) ending where a known class follows, and either nothing after
the question (a query without records) or room for the records announced. Random
bytes pass with a probability below 2**-40; QUIC, RTP or game traffic does not pass.

The first payload that passes makes its server end point (the side with the lower
port, or the destination of a query) a DNS server for the rest of the capture, so that
answers and later queries are parsed whatever they hold.
"""

from __future__ import annotations

MIN_LENGTH = 17
"""Header (12) + the shortest question (root name, type, class: 5)."""
MAX_RECORDS = 64
"""Records allowed in the answer, authority and additional sections of a candidate."""
MIN_RECORD = 11
"""The shortest resource record: a root name (1), type, class, TTL, rdlength (10)."""
CLASSES = frozenset({1, 3, 4, 254, 255})
"""IN, CH, HS, NONE, ANY (mDNS may set the top bit: unicast response / cache flush)."""
OPCODES = frozenset({0, 4, 5})
"""QUERY, NOTIFY, UPDATE."""


def looks_like_dns(p: bytes) -> bool:
    """True when ``p`` parses as a DNS message with one question (module docstring)."""
    n = len(p)
    if n < MIN_LENGTH or p[4] != 0 or p[5] != 1:  # qdcount == 1
        return False
    if (p[2] >> 3) & 0xF not in OPCODES or p[3] & 0x40:
        return False
    an = (p[6] << 8) | p[7]
    ns = (p[8] << 8) | p[9]
    ar = (p[10] << 8) | p[11]
    if an > MAX_RECORDS or ns > MAX_RECORDS or ar > MAX_RECORDS:
        return False
    off = 12
    total = 0
    while True:
        if off >= n:
            return False
        length = p[off]
        if length == 0:
            off += 1
            break
        if length > 63:
            return False
        total += length + 1
        if total > 254:
            return False
        off += 1 + length
    if off + 4 > n:
        return False
    qtype = (p[off] << 8) | p[off + 1]
    qclass = ((p[off + 2] << 8) | p[off + 3]) & 0x7FFF
    if qtype == 0 or qclass not in CLASSES:
        return False
    rest = n - off - 4
    records = an + ns + ar
    if records == 0:
        return rest == 0
    return rest >= records * MIN_RECORD
