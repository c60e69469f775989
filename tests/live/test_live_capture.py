"""``netdiag capture`` and :class:`netdiag.live.LiveCapture`, capturing loopback for real.

The live tests need root on Linux (a packet socket); they only send to 127.0.0.0/8,
on ports chosen free at run time, so they run next to other loopback tests. Every
file written is checked with tshark/capinfos (exit 0, nothing on stderr but tshark's
"running as root" notice) and with netdiag's own reader (not truncated).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netdiag.capture.pcapng_writer import TLS_KEY_LOG, write_pcapng
from netdiag.capture.reader import CaptureReader
from netdiag.live.capture import LiveCapture, embed_key_log, rotated_name

ROOT = Path(__file__).resolve().parents[2]
IS_ROOT_LINUX = sys.platform.startswith("linux") and os.geteuid() == 0
HAS_TSHARK = shutil.which("tshark") is not None and shutil.which("capinfos") is not None

live = [
    pytest.mark.slow,
    pytest.mark.skipif(not IS_ROOT_LINUX, reason="needs root on Linux (packet socket)"),
    pytest.mark.skipif(not HAS_TSHARK, reason="needs tshark and capinfos"),
]


def _live(f):  # type: ignore[no-untyped-def]
    for mark in reversed(live):
        f = mark(f)
    return f


# --------------------------------------------------------------------------- helpers


class Port:
    """A bound UDP socket on 127.0.0.1 (no ICMP unreachable noise), and a sender."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.rx.bind((host, 0))
        self.host = host
        self.port = self.rx.getsockname()[1]
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(self, payload: bytes) -> None:
        self.tx.sendto(payload, (self.host, self.port))

    def close(self) -> None:
        self.rx.close()
        self.tx.close()


@pytest.fixture
def ports():  # type: ignore[no-untyped-def]
    made: list[Port] = []

    def make(host: str = "127.0.0.1") -> Port:
        p = Port(host)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def tshark_ok(path: Path | str, *fields: str) -> list[list[str]]:
    """tshark reads ``path`` with exit 0 and no complaint; capinfos too. Returns fields."""
    args = ["tshark", "-r", str(path)]
    if fields:
        args += ["-T", "fields", *(x for f in fields for x in ("-e", f))]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert _complaints(p.stderr) == [], p.stderr
    c = subprocess.run(["capinfos", str(path)], capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stderr
    assert _complaints(c.stderr) == [], c.stderr
    return [line.split("\t") for line in p.stdout.splitlines()]


def _complaints(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.strip() and not line.startswith("Running as user")]


def read_all(path: Path | str) -> tuple[list[tuple[int, int, bytes, int]], CaptureReader]:
    with CaptureReader(path) as r:
        packets = list(r.packets())
    assert not r.truncated, r.warnings
    return packets, r


def udp_payloads(packets: list[tuple[int, int, bytes, int]]) -> list[bytes]:
    out = []
    for _ts, lt, data, _wire in packets:
        off = 14 if lt == 1 else 20 if lt == 276 else 0
        ihl = (data[off] & 0x0F) * 4
        out.append(bytes(data[off + ihl + 8:]))
    return out


def run_cli(*args: str, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-m", "netdiag", "capture", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_started(path: Path, proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    """The CLI writes the file header once its socket is bound: wait for it."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        if proc.poll() is not None:
            _out, err = proc.communicate()
            pytest.fail(f"capture exited early ({proc.returncode}): {err}")
        assert time.monotonic() < deadline, "capture did not start"
        time.sleep(0.02)


# --------------------------------------------------------------------------- API


@_live
def test_filter_and_count_on_lo(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    good, other = ports(), ports()
    out = tmp_path / "c.pcapng"
    cap = LiveCapture(out, iface="lo", bpf=f"udp port {good.port}", count=5)
    cap.start()
    for i in range(20):  # sent right after start(): the first five must be there
        good.send(b"seq-%02d" % i)
        other.send(b"other-%02d" % i)
    assert cap.wait(10)
    stats = cap.stop()
    assert stats.packets == 5 and stats.files == [str(out)] and stats.error is None
    assert cap.stop() is stats  # idempotent
    packets, reader = read_all(out)
    assert reader.link_types == [1]
    assert udp_payloads(packets) == [b"seq-%02d" % i for i in range(5)]
    rows = tshark_ok(out, "udp.dstport")
    assert rows == [[str(good.port)]] * 5
    ts = [p[0] for p in packets]
    assert ts == sorted(ts) and any(t % 1000 for t in ts)  # kernel ns, not us


@_live
def test_any_does_not_double_loopback(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "any.pcapng"
    with LiveCapture(out, iface="any", bpf=f"udp and dst port {p.port}") as cap:
        for i in range(10):
            p.send(b"any-%d" % i)
        time.sleep(0.3)
    assert cap.stats.packets == 10
    packets, reader = read_all(out)
    assert reader.link_types == [276]  # LINUX_SLL2, as tcpdump -i any writes
    assert udp_payloads(packets) == [b"any-%d" % i for i in range(10)]
    rows = tshark_ok(out, "sll.pkttype", "udp.dstport", "frame.interface_name")
    assert rows == [["0", str(p.port), "any"]] * 10  # incoming copy only


@_live
def test_any_filter_on_link_fields(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    """Filters reading the cooked header (inbound, ip) work in the kernel on 'any'."""
    p = ports()
    out = tmp_path / "in.pcapng"
    with LiveCapture(out, iface="any", bpf=f"inbound and ip and udp port {p.port}") as cap:
        for i in range(4):
            p.send(b"in-%d" % i)
        time.sleep(0.3)
    assert cap.stats.packets == 4
    assert len(tshark_ok(out)) == 4


@_live
def test_duration_ends_capture(tmp_path: Path) -> None:
    out = tmp_path / "d.pcapng"
    cap = LiveCapture(out, iface="lo", bpf="udp port 9", duration=0.5)
    t0 = time.monotonic()
    cap.start()
    assert cap.wait(5)
    took = time.monotonic() - t0
    stats = cap.stop()
    # it ended by itself (wait returned), not before its duration
    assert took >= 0.45 and 0.45 <= stats.elapsed_s < 5.0
    assert stats.packets == 0
    packets, reader = read_all(out)
    assert packets == [] and reader.link_types == [1]  # the IDB is written up front
    tshark_ok(out)


@_live
def test_rotation_by_size(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "rot.pcapng"
    with LiveCapture(out, iface="lo", bpf=f"udp port {p.port}", rotate_bytes=3000) as cap:
        for i in range(100):
            p.send(b"r%03d" % i + b"." * 96)
        time.sleep(0.3)
    files = cap.stats.files
    assert len(files) >= 4
    assert files == [str(rotated_name(out, i)) for i in range(1, len(files) + 1)]
    assert not out.exists()
    got: list[bytes] = []
    for f in files:
        packets, _ = read_all(f)
        assert len(tshark_ok(f)) == len(packets) > 0
        got += udp_payloads(packets)
    assert got == [b"r%03d" % i + b"." * 96 for i in range(100)]
    for f in files[:-1]:
        assert os.path.getsize(f) >= 3000


@_live
def test_rotation_by_time(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "t.pcapng"
    with LiveCapture(out, iface="lo", bpf=f"udp port {p.port}", rotate_seconds=0.25) as cap:
        for i in range(12):
            p.send(b"t%02d" % i)
            time.sleep(0.1)
    files = cap.stats.files
    assert len(files) >= 3
    got: list[bytes] = []
    for f in files:
        packets, _ = read_all(f)
        tshark_ok(f)
        got += udp_payloads(packets)
        span = packets[-1][0] - packets[0][0] if packets else 0
        assert span < 0.25e9
    assert got == [b"t%02d" % i for i in range(12)]


@_live
def test_keep_addresses_and_key_log(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    a, b = ports("127.0.0.1"), ports("127.0.0.2")
    keys = b"CLIENT_RANDOM " + b"11" * 32 + b" " + b"22" * 48 + b"\n"
    out = tmp_path / "k.pcapng"
    with LiveCapture(out, iface="lo", bpf="udp", keep_addresses={"127.0.0.2"},
                     key_log=keys) as cap:
        for i in range(5):
            a.send(b"a%d" % i)
            b.send(b"b%d" % i)
        time.sleep(0.3)
    packets, reader = read_all(out)
    assert [x for x in udp_payloads(packets) if x[:1] in b"ab"] == [b"b%d" % i for i in range(5)]
    assert reader.secrets == [(TLS_KEY_LOG, keys)]
    assert cap.stats.packets == len(packets)
    tshark_ok(out)


@_live
def test_snaplen_keeps_original_length(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "snap.pcapng"
    for iface, header in (("lo", 14), ("any", 20)):
        with LiveCapture(out, iface=iface, bpf=f"udp port {p.port}", snaplen=60) as cap:
            for _ in range(3):
                p.send(b"s" * 200)
            time.sleep(0.3)
        assert cap.stats.bytes == 3 * (header + 20 + 8 + 200)
        packets, _ = read_all(out)
        assert [(len(d), w) for _, _, d, w in packets] == [(60, header + 228)] * 3
        assert tshark_ok(out, "frame.cap_len", "frame.len") == [["60", str(header + 228)]] * 3


@_live
def test_start_errors(tmp_path: Path) -> None:
    from netdiag.errors import InputError

    with pytest.raises(InputError, match="invalid capture filter"):
        LiveCapture(tmp_path / "x.pcapng", iface="lo", bpf="udp prt 9").start()
    with pytest.raises(InputError, match="no such interface"):
        LiveCapture(tmp_path / "x.pcapng", iface="nonexistent0").start()
    with pytest.raises(InputError, match="cannot write"):
        LiveCapture(tmp_path / "no" / "x.pcapng", iface="lo").start()
    assert not (tmp_path / "x.pcapng").exists()


@_live
def test_memory_stays_flat(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "big.pcapng"
    n = 200_000
    sender = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
              f"for i in range({n}): s.sendto(b'm'*16, ('127.0.0.1', {p.port}))\n")
    cap = LiveCapture(out, iface="lo", bpf=f"udp port {p.port}")
    cap.start()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    subprocess.run([sys.executable, "-c", sender], check=True, timeout=120)
    time.sleep(1.0)
    stats = cap.stop()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert stats.packets + stats.drops == n  # what the thread missed, the kernel counted
    assert stats.packets > 0
    assert grown_kb < 30 * 1024, f"RSS grew by {grown_kb} kB"
    packets, _ = read_all(out)
    assert len(packets) == stats.packets


# --------------------------------------------------------------------------- CLI


@_live
def test_cli_filter_and_count(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    good, other = ports(), ports()
    out = tmp_path / "cli.pcapng"
    proc = run_cli("-i", "lo", "-f", f"udp port {good.port}", "-c", "5", "-w", str(out))
    deadline = time.monotonic() + 30
    i = 0
    while proc.poll() is None and time.monotonic() < deadline:
        good.send(b"c%d" % i)
        other.send(b"o%d" % i)
        i += 1
        time.sleep(0.02)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "5 packets" in err and str(out) in err
    rows = tshark_ok(out, "udp.dstport")
    assert rows == [[str(good.port)]] * 5
    read_all(out)


@_live
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_signal_leaves_complete_file(tmp_path: Path, ports, sig: int) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "sig.pcapng"
    proc = run_cli("-i", "lo", "-f", f"udp port {p.port}", "-w", str(out))
    wait_started(out, proc)
    for i in range(300):
        p.send(b"s%03d" % i + b"-" * 200)
    time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "interrupted" in err
    packets, _ = read_all(out)
    assert udp_payloads(packets) == [b"s%03d" % i + b"-" * 200 for i in range(300)]
    assert len(tshark_ok(out)) == 300


@_live
def test_cli_sigint_while_traffic_flows(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "flow.pcapng"
    proc = run_cli("-i", "any", "-f", f"udp port {p.port}", "-w", str(out))
    wait_started(out, proc)
    stop = threading.Event()
    sent = 0

    def blast() -> None:
        nonlocal sent
        while not stop.is_set():
            p.send(b"f" * 500)
            sent += 1

    t = threading.Thread(target=blast)
    t.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    stop.set()
    t.join()
    assert proc.returncode == 0, err
    packets, _ = read_all(out)  # not truncated: the last block is whole
    assert 0 < len(packets) <= sent
    assert len(tshark_ok(out)) == len(packets)


@_live
def test_cli_duration_and_rotation(tmp_path: Path, ports) -> None:  # type: ignore[no-untyped-def]
    p = ports()
    out = tmp_path / "dur.pcapng"
    proc = run_cli("-i", "lo", "-f", f"udp port {p.port}", "--duration", "1.5",
                   "--rotate-size", "2k", "-w", str(out))
    wait_started(rotated_name(out, 1), proc)
    for _ in range(60):
        p.send(b"x" * 100)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    files = sorted(tmp_path.glob("dur-*.pcapng"))
    assert len(files) >= 3
    assert sum(len(read_all(f)[0]) for f in files) == 60
    for f in files:
        tshark_ok(f)


@_live
@pytest.mark.parametrize("args,message", [
    (["-f", "udp prt 9"], "netdiag: error: invalid capture filter 'udp prt 9'"),
    (["-i", "nonexistent0"], "netdiag: error: no such interface: 'nonexistent0'"),
])
def test_cli_bad_input_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "bad.pcapng"
    proc = run_cli(*args, "-w", str(out))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert not out.exists()


def _unprivileged() -> list[str]:
    """Run as nobody when the interpreter is reachable by it, else as root without CAP_NET_RAW."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux)")
    nobody = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run([*nobody, sys.executable, "-c", "import netdiag.cli, scapy"],
                           cwd=ROOT, capture_output=True, timeout=60)
    if probe.returncode == 0:
        return nobody
    return [setpriv, "--bounding-set=-net_raw", "--inh-caps=-net_raw"]


@_live
def test_cli_without_privilege(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o777)
    out = tmp_path / "np.pcapng"
    p = subprocess.run([*_unprivileged(), sys.executable, "-m", "netdiag", "capture", "-i",
                        "lo", "-w", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("netdiag: error: capturing needs root or CAP_NET_RAW ("), p.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- netns


@pytest.fixture
def veth_pair():  # type: ignore[no-untyped-def]
    """Two network namespaces of our own joined by a veth pair (10.213.0.1 <-> .2)."""
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2")
    tag = f"{os.getpid() % 100000}"
    a, b = f"ndcap{tag}a", f"ndcap{tag}b"
    va, vb = f"ndc{tag}a", f"ndc{tag}b"
    cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
            ["ip", "link", "add", va, "netns", a, "type", "veth", "peer", "name", vb,
             "netns", b],
            ["ip", "-n", a, "addr", "add", "10.213.0.1/30", "dev", va],
            ["ip", "-n", b, "addr", "add", "10.213.0.2/30", "dev", vb],
            ["ip", "-n", a, "link", "set", va, "up"], ["ip", "-n", b, "link", "set", vb, "up"]]
    try:
        for cmd in cmds:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                pytest.skip(f"cannot set up network namespaces: {r.stderr.strip()}")
        yield a, b, va
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.213.0.2", 7777))
print("ready", flush=True)
for _ in range(3):
    data, peer = s.recvfrom(100)
    s.sendto(data, peer)
"""
SEND = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
for i in range(3):
    s.sendto(b"ping-%d" % i, ("10.213.0.2", 7777))
    assert s.recv(100) == b"ping-%d" % i
"""


@_live
@pytest.mark.parametrize("iface", ["veth", "any"])
def test_outgoing_kept_on_real_interfaces(tmp_path: Path, veth_pair, iface: str) -> None:  # type: ignore[no-untyped-def]
    """Only loopback's outgoing copy is dropped: on Ethernet both directions are kept."""
    ns_a, ns_b, va = veth_pair
    out = tmp_path / "veth.pcapng"
    proc = subprocess.Popen(["ip", "netns", "exec", ns_a, sys.executable, "-m", "netdiag",
                             "capture", "-i", va if iface == "veth" else "any", "-f",
                             "udp port 7777", "-c", "6", "-w", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    echo = subprocess.Popen(["ip", "netns", "exec", ns_b, sys.executable, "-c", ECHO],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        wait_started(out, proc)
        subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", SEND], check=True,
                       timeout=30)
        _, err = proc.communicate(timeout=30)
    finally:
        for p in (proc, echo):
            if p.poll() is None:
                p.kill()
            p.wait(10)
    assert proc.returncode == 0, err
    packets, reader = read_all(out)
    assert reader.link_types == ([1] if iface == "veth" else [276])
    rows = tshark_ok(out, "ip.src", "ip.dst")
    assert rows == [["10.213.0.1", "10.213.0.2"], ["10.213.0.2", "10.213.0.1"]] * 3
    assert udp_payloads(packets) == [b"ping-%d" % (i // 2) for i in range(6)]


@_live
def test_interface_gone_ends_capture_with_error(tmp_path: Path, veth_pair) -> None:  # type: ignore[no-untyped-def]
    ns_a, ns_b, va = veth_pair
    out = tmp_path / "gone.pcapng"
    proc = subprocess.Popen(["ip", "netns", "exec", ns_a, sys.executable, "-m", "netdiag",
                             "capture", "-i", va, "-w", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_started(out, proc)
    subprocess.run(["ip", "netns", "del", ns_b], check=True, timeout=30)  # takes the veth
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith(f"netdiag: error: capture on {va} stopped")
    read_all(out)
    tshark_ok(out)


# --------------------------------------------------------------------------- key log


def _some_packets() -> list[tuple[int, int, bytes, int]]:
    return [(1_700_000_000_000_000_000 + i * 1001, 1, b"\x00" * 14 + bytes([i]) * 30, 44)
            for i in range(5)]


def test_embed_key_log_in_place(tmp_path: Path) -> None:
    src = tmp_path / "k.pcapng"
    with open(src, "wb") as f:
        write_pcapng(f, _some_packets())
    keys = b"CLIENT_RANDOM " + b"aa" * 32 + b" " + b"bb" * 48 + b"\n"
    assert embed_key_log(src, src, keys) == 5
    packets, reader = read_all(src)
    assert packets == _some_packets()
    assert reader.secrets == [(TLS_KEY_LOG, keys)]
    assert not (tmp_path / "k.pcapng.part").exists()
    if HAS_TSHARK:
        tshark_ok(src)


def test_embed_key_log_merges_existing_keys(tmp_path: Path) -> None:
    old = b"CLIENT_RANDOM " + b"01" * 32 + b" " + b"02" * 48 + b"\n"
    new = b"CLIENT_RANDOM " + b"03" * 32 + b" " + b"04" * 48 + b"\n"
    src, dst = tmp_path / "a.pcapng", tmp_path / "b.pcapng"
    with open(src, "wb") as f:
        write_pcapng(f, _some_packets(), old)
    assert embed_key_log(src, dst, new + old) == 5
    packets, reader = read_all(dst)
    assert packets == _some_packets()
    assert reader.secrets == [(TLS_KEY_LOG, old + new)]


def test_rotated_names() -> None:
    assert rotated_name("/x/antho.pcapng", 1) == Path("/x/antho-00001.pcapng")
    assert rotated_name("cap", 12) == Path("cap-00012")


def test_size_option() -> None:
    from netdiag.commands.capture import _Size

    s = _Size()
    assert s.convert("100M", None, None) == 100_000_000
    assert s.convert("64KiB", None, None) == 65536
    assert s.convert("1.5G", None, None) == 1_500_000_000
    assert s.convert("4096", None, None) == 4096
    with pytest.raises(Exception, match="not a size"):
        s.convert("lots", None, None)


# --------------------------------------------------------------------------- probes


HAS_PROBES = importlib.util.find_spec("netdiag.probe") is not None
PROBE_LAB = ROOT / "tests" / "probe" / "lab_server.py"


@pytest.fixture
def probe_lab(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The probe tests' loopback lab (HTTPS on 127.0.0.151, DNS on 127.0.0.154), as a
    process: its JSON line of endpoints, with the CA written to a file."""
    if not HAS_PROBES or not PROBE_LAB.exists():
        pytest.skip("netdiag.probe or its lab is not there")
    proc = subprocess.Popen([sys.executable, str(PROBE_LAB)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(60)
        assert box and box[0], f"the probe lab did not start ({proc.poll()})"
        info = json.loads(box[0])
        ca = tmp_path / "ca.pem"
        ca.write_text(info.pop("ca_pem"))
        info["cafile"] = str(ca)
        yield info
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@_live
def test_cli_probe_embeds_keys_and_reports(tmp_path: Path, probe_lab) -> None:  # type: ignore[no-untyped-def]
    h2_ip, h2_port = probe_lab["h2"].rsplit(":", 1)
    dns_ip, dns_port = probe_lab["dns_fast"].rsplit(":", 1)
    url = f"https://api.probe.test:{h2_port}/v1/messages"
    out = tmp_path / "probe.pcapng"
    keylog = tmp_path / "keys.log"
    p = subprocess.run(
        [sys.executable, "-m", "netdiag", "capture", "-i", "any", "-f",
         f"(host {h2_ip} and port {h2_port}) or (host {dns_ip} and port {dns_port})",
         "--probe", url, "--probe-dns", "api.probe.test",
         "--probe-count", "3", "--dns-server", probe_lab["dns_fast"], "--cafile",
         probe_lab["cafile"], "--keylog", str(keylog), "-w", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "3/3 ok" in p.stderr and "3/3 answered" in p.stderr, p.stderr
    packets, reader = read_all(out)
    assert packets
    assert reader.secrets and reader.secrets[0][0] == TLS_KEY_LOG
    assert keylog.read_bytes() == reader.secrets[0][1]
    assert "Latency" in p.stdout and "DNS answer" in p.stdout  # the report
    # the embedded keys decrypt the capture, for netdiag and for tshark
    rep = subprocess.run([sys.executable, "-m", "netdiag", "report", "--format", "json",
                          "--dns-port", dns_port, str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    requests = [r for c in doc["connections"] for r in c["requests"]]
    assert len(requests) == 3 and all(r["status"] == 200 for r in requests)
    # three probe queries, and the HTTP probe's own resolution through --dns-server
    assert len([t for t in doc["dns"] if t["qname"].rstrip(".") == "api.probe.test"]) == 4
    rows = tshark_ok(out, "http2.header.value")
    assert any("/v1/messages" in r[0] for r in rows)


@_live
def test_cli_probe_no_report(tmp_path: Path, probe_lab) -> None:  # type: ignore[no-untyped-def]
    h2_ip, h2_port = probe_lab["h2"].rsplit(":", 1)
    out = tmp_path / "quiet.pcapng"
    p = subprocess.run(
        [sys.executable, "-m", "netdiag", "capture", "-i", "lo", "-f",
         f"host {h2_ip} and port {h2_port}",
         "--probe", f"https://{h2_ip}:{h2_port}/v1/messages", "--insecure",
         "--probe-count", "2", "--no-report", "-w", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    _, reader = read_all(out)
    assert reader.secrets and reader.secrets[0][0] == TLS_KEY_LOG
