"""A chain of network namespaces for the traceroute tests, built and torn down per use.

::

    nd-c-<id> --veth-- nd-r1-<id> --veth-- nd-r2-<id> --veth-- nd-s-<id>
    10.77.1.2   10.77.1.1 | 10.77.2.1   10.77.2.2 | 10.77.3.1   10.77.3.2
    fd77:1::2   fd77:1::1 | fd77:2::1   fd77:2::2 | fd77:3::1   fd77:3::2

The routers forward (IPv4 and IPv6), every namespace answers ICMP without rate limit,
the client's only route is via r1, and no namespace has a route anywhere else, so
probes never leave the chain. ``nd-s`` listens on TCP 443 and answers DNS on UDP 53
(``srv.nd.test`` -> its addresses); ``10.77.4.1`` is an address of ``nd-s`` that r1
has no route to (it answers "net unreachable"). With ``delay_ms``, every packet r2
sends towards r1 waits that long (``tc netem`` on r2's veth when the kernel has
sch_netem; otherwise a user-space delaying L2 bridge, in a fifth namespace between r1
and r2, delays the frames going from r1 to r2). Namespace names carry the pid and a
counter, so parallel runs do not clash; the finalizer deletes them, failure or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
IP = shutil.which("ip")
TC = shutil.which("tc")

C, R1_C, R1_R2, R2_R1, R2_S, S = ("10.77.1.2", "10.77.1.1", "10.77.2.1", "10.77.2.2",
                                  "10.77.3.1", "10.77.3.2")
C6, R1_C6, R1_R26, R2_R16, R2_S6, S6 = ("fd77:1::2", "fd77:1::1", "fd77:2::1", "fd77:2::2",
                                        "fd77:3::1", "fd77:3::2")
UNROUTED = "10.77.4.1"
NAME = "srv.nd.test"

LISTENER = textwrap.dedent("""
    import socket, sys, time
    socks = [socket.create_server(("0.0.0.0", 443), backlog=128)]
    socks.append(socket.create_server(("::", 443), family=socket.AF_INET6, backlog=128,
                                      dualstack_ipv6=False))
    print("ready", flush=True)
    time.sleep(3600)
""")

DNS_SERVER = textwrap.dedent("""
    import socket, sys
    import dns.message, dns.rrset
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 53))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(4096)
        q = dns.message.from_wire(data)
        r = dns.message.make_response(q)
        qn = q.question[0]
        if qn.name.to_text() == "srv.nd.test." and qn.rdtype == 1:
            r.answer.append(dns.rrset.from_text(qn.name, 60, "IN", "A", "10.77.3.2"))
        elif qn.name.to_text() != "srv.nd.test.":
            r.set_rcode(3)
        s.sendto(r.to_wire(), peer)
""")

BRIDGE = textwrap.dedent("""
    import collections, socket, struct, sys, threading, time
    delay = float(sys.argv[1]) / 1000.0

    def csum(data):
        if len(data) % 2:
            data += b"\\0"
        total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        return ~total & 0xFFFF

    def fix(frame):
        # veth hands over TCP/UDP checksums the sender left to "hardware" (partial):
        # finish them, or the next host drops the frame.
        etype = frame[12:14]
        if etype == b"\\x08\\x00":
            ihl = (frame[14] & 15) * 4
            proto, l4 = frame[23], 14 + ihl
            end = 14 + struct.unpack("!H", frame[16:18])[0]
            pseudo = frame[26:34] + struct.pack("!BBH", 0, proto, end - l4)
        elif etype == b"\\x86\\xdd":
            proto, l4 = frame[20], 54
            end = l4 + struct.unpack("!H", frame[18:20])[0]
            pseudo = frame[22:54] + struct.pack("!IxxxB", end - l4, proto)
        else:
            return frame
        at = {6: 16, 17: 6}.get(proto)
        if at is None or end > len(frame) or end - l4 < at + 2:
            return frame
        seg = bytearray(frame[l4:end])
        seg[at:at + 2] = b"\\0\\0"
        value = csum(pseudo + bytes(seg)) or (0xFFFF if proto == 17 else 0)
        seg[at:at + 2] = struct.pack("!H", value)
        return frame[:l4] + bytes(seg) + frame[end:]
    socks = []
    for name in ("d0", "d1"):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
        s.bind((name, 0))
        socks.append(s)

    def pump(src, dst, wait):
        q = collections.deque()
        cv = threading.Condition()

        def sender():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, frame = q.popleft()
                left = due - time.monotonic()
                if left > 0:
                    time.sleep(left)
                try:
                    dst.send(frame)
                except OSError:  # e.g. a GSO frame over the MTU: dropped, as a wire would
                    pass

        threading.Thread(target=sender, daemon=True).start()
        while True:
            frame, addr = src.recvfrom(65535)
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            frame = fix(frame)
            with cv:
                q.append((time.monotonic() + wait, frame))
                cv.notify()

    threading.Thread(target=pump, args=(socks[0], socks[1], delay), daemon=True).start()
    print("ready", flush=True)
    pump(socks[1], socks[0], 0.0)
""")

_counter = [0]
_NS_NAME = re.compile(r"nd-(?:c|r1|r2|s|d)-(\d+)-\d+")


def _die_with_parent() -> None:
    """In the child before exec: be killed when the test process dies, however it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def remove_stale() -> None:
    """Delete namespaces this module made in test runs whose process is gone."""
    assert IP is not None
    listing = _run(IP, "netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_NAME.fullmatch(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _run(IP, "netns", "del", name, check=False)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=60)


def netns_usable() -> str | None:
    """None when namespaces can be made here, else why not."""
    if IP is None:
        return "iproute2 (ip) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"nd-probe-{os.getpid()}"
    r = _run(IP, "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _run(IP, "netns", "del", probe, check=False)
    remove_stale()
    return None


@dataclass
class Chain:
    """A built chain: namespace names, how delay was injected, processes to stop."""

    ns: dict[str, str]
    delay_ms: float = 0.0
    delay_method: str | None = None
    """``netem`` or ``bridge`` when ``delay_ms`` was asked for."""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def exec(self, where: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert IP is not None
        return _run(IP, "netns", "exec", self.ns[where], *args, check=check)

    def spawn(self, where: str, *args: str) -> subprocess.Popen[str]:
        assert IP is not None
        p = subprocess.Popen([IP, "netns", "exec", self.ns[where], *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_die_with_parent)
        self.procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            p.kill()
            raise RuntimeError(f"{args[:3]} in {where} did not start: {line!r} "
                               f"{p.stderr.read() if p.stderr else ''}")
        return p

    def trace(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        """``python -m netdiag trace ARGS`` run inside the client namespace."""
        assert IP is not None
        env = dict(os.environ, PYTHONPATH=str(REPO))
        r = subprocess.run([IP, "netns", "exec", self.ns["c"], sys.executable, "-m",
                            "netdiag", "trace", *args], capture_output=True, text=True,
                           cwd=REPO, env=env, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def trace_json(self, *args: str) -> dict[str, Any]:
        code, out, err = self.trace(*args, "--format", "json")
        assert out, f"exit {code}, stderr: {err}"
        doc: dict[str, Any] = json.loads(out)
        doc["_exit"] = code
        return doc

    def destroy(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(Exception):
                p.communicate(timeout=10)
        for name in self.ns.values():
            if IP is not None:
                _run(IP, "netns", "del", name, check=False)


def _netem_works(chain: Chain) -> bool:
    if TC is None:
        return False
    r = chain.exec("r2", TC, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                   check=False)
    if r.returncode != 0:
        return False
    chain.exec("r2", TC, "qdisc", "del", "dev", "lo", "root", check=False)
    return True


def build_chain(delay_ms: float = 0.0) -> Chain:
    """Build the chain (see the module docstring); the caller must ``destroy`` it."""
    assert IP is not None
    _counter[0] += 1
    tag = f"{os.getpid()}-{_counter[0]}"
    names = ["c", "r1", "r2", "s"]
    chain = Chain(ns={n: f"nd-{n}-{tag}" for n in names}, delay_ms=delay_ms)
    try:
        _build(chain, tag, delay_ms)
    except BaseException:
        chain.destroy()
        raise
    return chain


def _build(chain: Chain, tag: str, delay_ms: float) -> None:
    assert IP is not None
    ns = chain.ns
    ip = IP

    def sh(*args: str) -> None:
        _run(ip, *args)

    for n in list(ns):
        sh("netns", "add", ns[n])
        sh("-n", ns[n], "link", "set", "lo", "up")
    bridge = False
    if delay_ms:
        bridge = not _netem_works(chain)
        chain.delay_method = "bridge" if bridge else "netem"
    links = [("c", "c0", "r1", "r1a"), ("r2", "r2b", "s", "s0")]
    if bridge:
        ns["d"] = f"nd-d-{tag}"
        sh("netns", "add", ns["d"])
        sh("-n", ns["d"], "link", "set", "lo", "up")
        links += [("r1", "r1b", "d", "d0"), ("d", "d1", "r2", "r2a")]
    else:
        links += [("r1", "r1b", "r2", "r2a")]
    for a, ia, b, ib in links:
        sh("link", "add", ia, "netns", ns[a], "type", "veth", "peer", "name", ib,
           "netns", ns[b])
        sh("-n", ns[a], "link", "set", ia, "up")
        sh("-n", ns[b], "link", "set", ib, "up")
    addrs = [("c", "c0", C, C6), ("r1", "r1a", R1_C, R1_C6), ("r1", "r1b", R1_R2, R1_R26),
             ("r2", "r2a", R2_R1, R2_R16), ("r2", "r2b", R2_S, R2_S6), ("s", "s0", S, S6)]
    for n, dev, v4, v6 in addrs:
        sh("-n", ns[n], "addr", "add", f"{v4}/24", "dev", dev)
        sh("-n", ns[n], "-6", "addr", "add", f"{v6}/64", "dev", dev, "nodad")
    sh("-n", ns["s"], "addr", "add", f"{UNROUTED}/32", "dev", "lo")
    sh("-n", ns["c"], "route", "add", "default", "via", R1_C)
    sh("-n", ns["c"], "-6", "route", "add", "default", "via", R1_C6)
    sh("-n", ns["r1"], "route", "add", "10.77.3.0/24", "via", R2_R1)
    sh("-n", ns["r1"], "-6", "route", "add", "fd77:3::/64", "via", R2_R16)
    sh("-n", ns["r2"], "route", "add", "10.77.1.0/24", "via", R1_R2)
    sh("-n", ns["r2"], "-6", "route", "add", "fd77:1::/64", "via", R1_R26)
    sh("-n", ns["s"], "route", "add", "default", "via", R2_S)
    sh("-n", ns["s"], "-6", "route", "add", "default", "via", R2_S6)
    for n in ("c", "r1", "r2", "s"):
        settings = ["net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0"]
        if n in ("r1", "r2"):
            settings += ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]
        chain.exec(n, "sysctl", "-qw", *settings)
    if delay_ms and not bridge:
        assert TC is not None
        chain.exec("r2", TC, "qdisc", "add", "dev", "r2a", "root", "netem", "delay",
                   f"{delay_ms}ms")
    if bridge:
        chain.spawn("d", sys.executable, "-c", BRIDGE, str(delay_ms))
    chain.spawn("s", sys.executable, "-c", LISTENER)
    chain.spawn("s", sys.executable, "-c", DNS_SERVER)
    # Resolve neighbours (ARP/ND) once so the first probes do not pay for it.
    for target in (S, S6):
        chain.exec("c", sys.executable, "-c",
                   "import socket,sys\n"
                   f"s=socket.create_connection(({target!r},443),timeout=5); s.close()")
