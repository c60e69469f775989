"""The address a trace probes: an IP literal as is, else a name looked up once.

With ``dns_server`` the name is asked of that server with dnspython (A first, then
AAAA, or only the family asked for); without it the system resolver answers
(``getaddrinfo``: ``/etc/hosts``, then the configured nameservers).
"""

from __future__ import annotations

import ipaddress
import socket

from netdiag.errors import InputError


def parse_server(text: str) -> tuple[str, int]:
    """``IP``, ``IP:PORT``, ``[V6]:PORT`` or a bare IPv6 address -> (ip, port)."""
    text = text.strip()
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise InputError(f"not a DNS server address: {text!r}")
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        if not p.isdigit():
            raise InputError(f"not a DNS server address: {text!r}")
        port = int(p)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"not a DNS server address: {text!r} (an IP address is "
                         "needed)") from None
    if not 0 < port < 65536:
        raise InputError(f"not a DNS server port: {port}")
    return host, port


def resolve(host: str, *, dns_server: str | None = None, family: int | None = None,
            timeout: float = 5.0) -> str:
    """One address of ``host`` (``family`` 4 or 6 to choose; default IPv4 first)."""
    name = host.strip("[]")
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        if family is not None and ip.version != family:
            raise InputError(f"{host} is not an IPv{family} address")
        return str(ip)
    if dns_server is not None:
        return _ask(name, dns_server, family, timeout)
    fams = [socket.AF_INET, socket.AF_INET6] if family is None else \
        [socket.AF_INET if family == 4 else socket.AF_INET6]
    last: Exception | None = None
    for fam in fams:
        try:
            infos = socket.getaddrinfo(name, None, fam, socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            last = e
            continue
        if infos:
            return str(infos[0][4][0])
    why = getattr(last, "strerror", None) or str(last or "no address")
    raise InputError(f"cannot resolve {host}: {why}")


def _ask(name: str, server: str, family: int | None, timeout: float) -> str:
    import dns.exception
    import dns.resolver

    ip, port = parse_server(server)
    res = dns.resolver.Resolver(configure=False)
    res.nameservers = [ip]
    res.port = port
    res.timeout = res.lifetime = timeout
    rdtypes = ["A", "AAAA"] if family is None else ["A" if family == 4 else "AAAA"]
    problems = []
    for rdtype in rdtypes:
        try:
            answer = res.resolve(name, rdtype, search=False)
        except dns.resolver.NXDOMAIN:
            raise InputError(f"cannot resolve {name}: NXDOMAIN from {server}") from None
        except dns.resolver.NoAnswer:
            problems.append(f"no {rdtype} record")
            continue
        except dns.exception.Timeout:
            raise InputError(f"cannot resolve {name}: {server} did not answer in "
                             f"{timeout:g} s") from None
        except dns.exception.DNSException as e:
            raise InputError(f"cannot resolve {name} with {server}: {e}") from None
        for rr in answer:
            return str(rr.address)
        problems.append(f"no {rdtype} record")
    raise InputError(f"cannot resolve {name}: {', '.join(problems)} at {server}")
