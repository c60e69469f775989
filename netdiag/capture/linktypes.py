"""Link-layer header types (LINKTYPE_* values of pcap and pcapng) and their names.

Values are the ones written in capture files (https://www.tcpdump.org/linktypes.html).
The names are libpcap's ``DLT_`` names without the prefix, as ``tshark -G`` and
``capinfos`` show them. Two historic DLT_RAW values (12, and 14 on OpenBSD) are
found in old files; :func:`normalize` maps them to :data:`LINKTYPE_RAW`, and the
capture reader yields the normalized value.
"""

from __future__ import annotations

LINKTYPE_NULL = 0
"""BSD loopback: 4-byte protocol family in the capturing host's byte order."""
LINKTYPE_ETHERNET = 1
"""Ethernet (libpcap ``EN10MB``)."""
LINKTYPE_PPP = 9
"""PPP, RFC 1661 framing."""
LINKTYPE_RAW = 101
"""Raw IP: the packet starts with an IPv4 or IPv6 header."""
LINKTYPE_IEEE802_11 = 105
"""IEEE 802.11 wireless LAN."""
LINKTYPE_LOOP = 108
"""OpenBSD loopback: 4-byte protocol family in network byte order."""
LINKTYPE_LINUX_SLL = 113
"""Linux "cooked" capture, version 1 (16-byte header)."""
LINKTYPE_IEEE802_11_RADIOTAP = 127
"""IEEE 802.11 with a radiotap header."""
LINKTYPE_IPV4 = 228
"""Raw IPv4."""
LINKTYPE_IPV6 = 229
"""Raw IPv6."""
LINKTYPE_LINUX_SLL2 = 276
"""Linux "cooked" capture, version 2 (20-byte header)."""

RAW_ALIASES: frozenset[int] = frozenset({12, 14})
"""DLT_RAW as some BSDs wrote it into files; read as :data:`LINKTYPE_RAW`."""

_NAMES: dict[int, str] = {
    LINKTYPE_NULL: "NULL",
    LINKTYPE_ETHERNET: "EN10MB",
    LINKTYPE_PPP: "PPP",
    LINKTYPE_RAW: "RAW",
    12: "RAW",
    14: "RAW",
    LINKTYPE_IEEE802_11: "IEEE802_11",
    LINKTYPE_LOOP: "LOOP",
    LINKTYPE_LINUX_SLL: "LINUX_SLL",
    LINKTYPE_IEEE802_11_RADIOTAP: "IEEE802_11_RADIO",
    LINKTYPE_IPV4: "IPV4",
    LINKTYPE_IPV6: "IPV6",
    LINKTYPE_LINUX_SLL2: "LINUX_SLL2",
}


def normalize(lt: int) -> int:
    """The link type a decoder should switch on: DLT_RAW aliases become ``LINKTYPE_RAW``."""
    return LINKTYPE_RAW if lt in RAW_ALIASES else lt


def linktype_name(lt: int) -> str:
    """libpcap's name for a link type (``EN10MB``, ``LINUX_SLL2``...), else ``LINKTYPE_<n>``."""
    return _NAMES.get(lt, f"LINKTYPE_{lt}")
