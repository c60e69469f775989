"""The compiled core (mypyc) and its pure-Python twin give the same reports.

Each core runs in its own process (``NETDIAG_CORE=compiled`` / ``NETDIAG_CORE=python``,
see ``netdiag/_core.py``) on the shipped capture, a generated one and small crafted
captures for IPv6, VLAN, cooked, fragmented, out-of-order, gzip and damaged input; the
JSON documents (and exit codes and stderr) must be byte-identical. The comparisons
skip, saying why, when this install has no usable compiled core (a pure-Python build,
or a compiled module's source edited since it was compiled).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.compat import raw
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, TCP, UDP, fragment
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, fragment6
from scapy.layers.l2 import CookedLinuxV2, Dot1Q, Ether
from scapy.packet import Packet, Raw

import netdiag
from netdiag import _core

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
T0 = 1_700_000_000 * 10**9 + 123_456_789  # beyond 2**53 ns, as every capture time is

COMPILED_PROBLEM = _core.compiled_problem()
needs_compiled = pytest.mark.skipif(
    COMPILED_PROBLEM is not None,
    reason=f"no compiled core to compare with: {COMPILED_PROBLEM}")


def run(core: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, _core.ENV_VAR: core}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env=env)


def report_both(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    """The JSON report under each core; asserts they are identical and returns it."""
    cmd = ("-m", "netdiag", "report", *args, "--format", "json")
    compiled, pure = run("compiled", *cmd), run("python", *cmd)
    assert compiled.returncode in ok, compiled.stderr
    assert (compiled.returncode, compiled.stderr) == (pure.returncode, pure.stderr)
    assert compiled.stdout == pure.stdout, "the two cores' JSON reports differ"
    return compiled.stdout


# -- the same reports ----------------------------------------------------------------

@needs_compiled
@pytest.mark.parametrize("keylog", [True, False], ids=["keylog", "no-keylog"])
def test_shipped_capture(keylog: bool) -> None:
    args = (str(ANTHO), "--keylog", str(KEYS)) if keylog else (str(ANTHO),)
    doc = json.loads(report_both(*args))
    assert any(c["tls"] and c["tls"]["decrypted"] for c in doc["connections"])


@needs_compiled
def test_shipped_capture_without_embedded_keys(tmp_path: Path) -> None:
    """The keyless path: TLS handshakes and requests inferred from record timing."""
    from netdiag.capture.pcapng_writer import write_pcapng
    from netdiag.capture.reader import CaptureReader

    bare = tmp_path / "antho-nokeys.pcapng"
    with CaptureReader(ANTHO) as cap, open(bare, "wb") as f:
        write_pcapng(f, cap.packets(), None)
    doc = json.loads(report_both(str(bare)))
    assert doc["connections"] and not any(c["tls"] and c["tls"]["decrypted"]
                                          for c in doc["connections"])


@needs_compiled
def test_generated_capture(tmp_path: Path) -> None:
    big = tmp_path / "big.pcap"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_capture.py"),
                    "--packets", "20000", "--out", str(big), "--quiet"], check=True,
                   cwd=ROOT, timeout=240)
    doc = json.loads(report_both(str(big)))
    assert len(doc["connections"]) > 50 and doc["dns"]



@needs_compiled
@pytest.mark.parametrize("fmt", ["har", "html", "csv", "parquet"])
def test_shipped_capture_in_the_compiled_formats(fmt: str, tmp_path: Path) -> None:
    """HAR, CSV and Parquet are written by compiled modules (HTML reads HAR's): the same
    files, byte for byte, under either core."""
    files: dict[str, dict[str, bytes]] = {}
    for core in ("compiled", "python"):
        out = tmp_path / core
        p = run(core, "-m", "netdiag", "report", str(ANTHO), "--keylog", str(KEYS),
                "--format", fmt, "-o", str(out))
        assert p.returncode == 0, p.stderr
        files[core] = ({f.name: f.read_bytes() for f in out.iterdir()} if out.is_dir()
                       else {out.name: out.read_bytes()})
    assert files["compiled"] and all(files["compiled"].values())
    assert files["compiled"] == {k.replace("python", "compiled"): v
                                 for k, v in files["python"].items()}

# -- crafted input: link types, IPv6, fragments, reordering, gzip, damage -------------

MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}


def _tcp_exchange(ip: type[Packet], cli: str, srv: str, sport: int, dport: int,
                  request: bytes, response: bytes) -> list[Packet]:
    """A connection: handshake, request, response in three segments (the last two
    swapped, the first retransmitted), FIN both ways."""
    c, s = 1000, 5000

    def seg(from_client: bool, flags: str, seq: int, ack: int, data: bytes = b"") -> Packet:
        src, dst = (cli, srv) if from_client else (srv, cli)
        ports = {"sport": sport, "dport": dport} if from_client else {"sport": dport,
                                                                      "dport": sport}
        pkt = ip(src=src, dst=dst) / TCP(flags=flags, seq=seq, ack=ack, **ports)
        return pkt / Raw(data) if data else pkt

    third = len(response) // 3
    r1, r2, r3 = response[:third], response[third:2 * third], response[2 * third:]
    s1 = s + 1
    c1 = c + 1 + len(request)
    return [
        seg(True, "S", c, 0), seg(False, "SA", s, c + 1), seg(True, "A", c + 1, s1),
        seg(True, "PA", c + 1, s1, request),
        seg(False, "A", s1, c1, r1),
        seg(False, "PA", s1 + 2 * third, c1, r3),  # ahead of a gap
        seg(False, "A", s1 + third, c1, r2),  # fills it
        seg(False, "A", s1, c1, r1),  # a retransmission
        seg(True, "A", c1, s1 + len(response)),
        seg(True, "FA", c1, s1 + len(response)), seg(False, "FA", s1 + len(response), c1 + 1),
        seg(True, "A", c1 + 1, s1 + len(response) + 1),
    ]


def _dns_pair(ip: type[Packet], cli: str, srv: str, qid: int, name: str,
              answers: int) -> tuple[Packet, Packet]:
    q = ip(src=cli, dst=srv) / UDP(sport=40000 + qid, dport=53) / DNS(
        id=qid, rd=1, qd=DNSQR(qname=name, qtype="A"))
    an = [DNSRR(rrname=name, type="A", ttl=60, rdata=f"192.0.2.{i + 1}") for i in range(answers)]
    r = ip(src=srv, dst=cli) / UDP(sport=53, dport=40000 + qid) / DNS(
        id=qid, qr=1, rd=1, ra=1, qd=DNSQR(qname=name, qtype="A"), an=an)
    return q, r


HTTP_REQ = b"GET /cores HTTP/1.1\r\nHost: example.test\r\n\r\n"
HTTP_RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n" + b"x" * 30


def _frames() -> list[tuple[int, bytes]]:
    """(link type, frame bytes) of the crafted traffic, in capture order."""
    out: list[tuple[int, bytes]] = []
    # IPv6 over Ethernet with a VLAN tag: HTTP/1.1 in the clear, reordered
    for p in _tcp_exchange(IPv6, "2001:db8::1", "2001:db8::80", 50000, 80, HTTP_REQ,
                           HTTP_RESP):
        out.append((1, raw(Ether(**MAC) / Dot1Q(vlan=7) / p)))
    # IPv4 over Linux cooked capture v2 (what netdiag capture -i any writes)
    for p in _tcp_exchange(IP, "198.51.100.1", "198.51.100.80", 50001, 8080, HTTP_REQ,
                           HTTP_RESP):
        out.append((276, raw(CookedLinuxV2(proto=0x0800) / p)))
    # DNS over IPv4, the response in IPv4 fragments delivered last first
    q, r = _dns_pair(IP, "198.51.100.1", "198.51.100.53", 1, "frag4.example.test", 40)
    out.append((1, raw(Ether(**MAC) / q)))
    out.extend((1, raw(Ether(**MAC) / f)) for f in reversed(fragment(r, fragsize=256)))
    # DNS over IPv6 (raw IP link type), the response in IPv6 fragments
    q6, r6 = _dns_pair(IPv6, "2001:db8::1", "2001:db8::53", 2, "frag6.example.test", 40)
    out.append((101, raw(q6)))
    r6 = IPv6(src="2001:db8::53", dst="2001:db8::1") / IPv6ExtHdrFragment() / r6[UDP]
    out.extend((101, raw(f)) for f in fragment6(r6, 400))
    # a plain answered query and an unanswered one
    q, r = _dns_pair(IP, "198.51.100.1", "198.51.100.53", 3, "plain.example.test", 1)
    out += [(1, raw(Ether(**MAC) / q)), (1, raw(Ether(**MAC) / r))]
    q, _ = _dns_pair(IP, "198.51.100.1", "198.51.100.53", 4, "lost.example.test", 1)
    out.append((1, raw(Ether(**MAC) / q)))
    return out


def _pcapng(frames: list[tuple[int, bytes]]) -> bytes:
    """A pcapng file with one interface per link type, nanosecond timestamps."""
    def block(btype: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", btype, 12 + len(body)) + body + struct.pack("<I",
                                                                              12 + len(body))

    ifaces: dict[int, int] = {}
    blocks = [block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))]
    for i, (lt, data) in enumerate(frames):
        if lt not in ifaces:
            ifaces[lt] = len(ifaces)
            tsresol = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
            blocks.append(block(1, struct.pack("<HHI", lt, 0, 0) + tsresol))
        ts = T0 + i * 1_234_567
        blocks.append(block(6, struct.pack("<IIIII", ifaces[lt], ts >> 32, ts & 0xFFFFFFFF,
                                           len(data), len(data)) + data))
    return b"".join(blocks)


def _pcap(frames: list[bytes], start_ns: int) -> bytes:
    """A microsecond pcap of Ethernet frames."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)]
    for i, data in enumerate(frames):
        us = (start_ns + i * 777_000) // 1000
        out.append(struct.pack("<IIII", us // 10**6, us % 10**6, len(data), len(data)) + data)
    return b"".join(out)


@needs_compiled
def test_crafted_link_types_ipv6_fragments_reordering(tmp_path: Path) -> None:
    crafted = tmp_path / "crafted.pcapng"
    crafted.write_bytes(_pcapng(_frames()))
    doc = json.loads(report_both(str(crafted)))
    assert len(doc["connections"]) == 2
    assert all(c["out_of_order"] and c["retransmissions"] for c in doc["connections"])
    assert {c["client"] for c in doc["connections"]} == {"[2001:db8::1]:50000",
                                                        "198.51.100.1:50001"}
    names = {t["qname"] for t in doc["dns"]}
    assert {"frag4.example.test", "frag6.example.test", "plain.example.test"} <= names
    frag4 = next(t for t in doc["dns"] if t["qname"] == "frag4.example.test")
    assert len(frag4["answers"]) == 40


@needs_compiled
def test_crafted_gzip_and_damaged_files(tmp_path: Path) -> None:
    eth = [data for lt, data in _frames() if lt == 1]
    gz = tmp_path / "part.pcap.gz"
    gz.write_bytes(gzip.compress(_pcap(eth[: len(eth) // 2], T0)))
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(_pcap(eth[len(eth) // 2:], T0 + 500_000)[:-7])  # last record cut short
    doc = json.loads(report_both(str(gz), str(cut), ok=(3,)))
    assert doc["capture"]["warnings"]


@needs_compiled
def test_bytes_slices_whose_start_passes_their_end(tmp_path: Path) -> None:
    """``b"ab"[2:1]`` is ``b""``: mypyc's bytes slice made it a SystemError (a negative
    size) when both bounds lie inside the object, until setup.py fixed its runtime. An
    IPv6 fragment header whose payload length ends before the fragment data (the
    frame padded beyond it) cut one so and stopped the report."""
    frag = bytes([17, 0, 0, 8, 0, 0, 0, 1])  # next header UDP, offset 8, last fragment
    crafted = [raw(Ether(**MAC) / IPv6(src="2001:db8::1", dst="2001:db8::2", nh=44, plen=4)
                   / Raw(frag + b"\0" * 20))]
    eth = [data for lt, data in _frames() if lt == 1]
    path = tmp_path / "short-fragment.pcap"
    path.write_bytes(_pcap(crafted + eth, T0))
    doc = json.loads(report_both(str(path)))
    assert doc["capture"]["packets"] == 1 + len(eth) and doc["connections"]


# -- which core runs -------------------------------------------------------------------

PROBE = ("import importlib, json, netdiag._core as c\n"
         "print(json.dumps({'core': c.core_name(), 'files': {"
         "m: importlib.import_module(m).__file__ for m in c.COMPILED_MODULES}}))")


def test_pure_core_loads_python_sources() -> None:
    p = run("python", "-c", PROBE)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["core"] == _core.PURE
    assert all(f.endswith(".py") for f in got["files"].values()), got["files"]
    v = run("python", "-m", "netdiag", "--version")
    assert v.returncode == 0 and "(core: pure Python; NETDIAG_CORE=python)" in v.stdout


def test_compiled_core_is_active_when_built() -> None:
    if COMPILED_PROBLEM is not None:
        pytest.skip(f"the compiled core is not usable in this install: {COMPILED_PROBLEM}")
    for core in ("compiled", "auto"):
        p = run(core, "-c", PROBE)
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["core"] == _core.COMPILED
        assert all(not f.endswith(".py") for f in got["files"].values()), got["files"]
    assert _core.extension_path(_core.shared_library()) is not None
    v = run("auto", "-m", "netdiag", "--version")
    assert v.returncode == 0
    assert v.stdout.strip() == f"netdiag {netdiag.__version__} (core: compiled, mypyc)"


def test_bad_core_choice_fails_at_import() -> None:
    p = run("pyhton", "-c", "import netdiag")
    assert p.returncode != 0 and "NETDIAG_CORE='pyhton'" in p.stderr


def _fake_package(tmp_path: Path, record: object) -> Path:
    pkg = tmp_path / "netdiag"
    for m in _core.COMPILED_MODULES:
        src = Path(_core.source_path(m, str(pkg)))
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {m}\n")
        Path(str(src)[:-3] + ".abi3.so").write_bytes(b"")
    (pkg / (_core.shared_library().rpartition(".")[2] + ".abi3.so")).write_bytes(b"")
    (pkg / _core.BUILD_RECORD).write_text(json.dumps(record))
    return pkg


def test_compiled_core_is_refused_when_stale_partial_or_not_compiled(tmp_path: Path) -> None:
    digests = {m: hashlib.sha256(f"# {m}\n".encode()).hexdigest()
               for m in _core.COMPILED_MODULES}
    pkg = _fake_package(tmp_path / "ok", {"compiled": True, "sources": digests})
    assert _core.compiled_problem(str(pkg)) is None
    (pkg / "flows" / "table.py").write_text("# edited\n")
    assert "netdiag/flows/table.py changed" in str(_core.compiled_problem(str(pkg)))
    pkg = _fake_package(tmp_path / "partial", {"compiled": True, "sources": digests})
    (pkg / "flows" / "tcp.abi3.so").unlink()
    assert "netdiag.flows.tcp has no compiled extension" in str(_core.compiled_problem(str(pkg)))
    pkg = _fake_package(tmp_path / "pure", {"compiled": False, "reason": "no compiler"})
    assert "no compiler" in str(_core.compiled_problem(str(pkg)))
    (pkg / _core.BUILD_RECORD).unlink()
    assert "not compiled" in str(_core.compiled_problem(str(pkg)))


# -- records cross process boundaries (multi-process sharding pickles them) ---------------

PICKLE = """
import pickle
from netdiag import _core
from netdiag.records import (Connection, DnsTransaction, Finding, Request, TlsInfo,
                             Warning_)
from netdiag.flows.table import FlowTable
from netdiag.capture.reader import CaptureReader
import sys
tls = TlsInfo(version="TLS 1.3", sni="x.test", alpn_offered=["h2"], client_random=b"r" * 32,
              certificate={"subject": "CN=x", "chain_length": 2}, client_hello_ns=%(t0)d)
req = Request(ts_ns=%(t0)d, first_byte_ns=%(t0)d + 5, chunk_gaps_ns=[1, 2],
              request_headers=[(":method", "GET")], estimated=False)
conn = Connection(id="C1", ts_ns=%(t0)d, client="a:1", server="b:2", tls=tls,
                  requests=[req], http2={"goaway": None}, path={"name": "p"})
records = [conn, tls, req, Warning_(kind="tcp", message="m", packet=3),
           Finding("info", "c", "t", "d", ["C1"]),
           DnsTransaction(ts_ns=%(t0)d, client="a:1", server="b:53", transport="udp", id=7,
                          qname="x.test", qtype="A", answers=["192.0.2.1"])]
found = []
table = FlowTable(lambda flow, first: None, lambda flow: found.append(flow.conn),
                  lambda *a: None)
with CaptureReader(sys.argv[1]) as cap:
    table.scan(cap.packets())
table.finish_all()
records += found
for rec in records:
    back = pickle.loads(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is type(rec) and back == rec, rec
    assert back is not rec
    if hasattr(rec, "to_json"):
        assert back.to_json() == rec.to_json()
print(_core.core_name(), len(records))
"""


@pytest.mark.parametrize("core", ["python", "auto"])
def test_records_pickle_round_trip(core: str, tmp_path: Path) -> None:
    crafted = tmp_path / "crafted.pcapng"
    crafted.write_bytes(_pcapng(_frames()))
    p = run(core, "-c", PICKLE % {"t0": T0}, str(crafted))
    assert p.returncode == 0, p.stderr
    name, n = p.stdout.split("\n")[0].rsplit(" ", 1)
    assert int(n) == 8
    expected = _core.PURE if core == "python" or COMPILED_PROBLEM else _core.COMPILED
    assert name == expected

