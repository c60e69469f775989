"""``netdiag report --jobs N``: the sharded analysis gives byte for byte what one process does.

The shipped capture (with and without its key log), a generated one with 10k
connections (``tests/jobs_capture.py``), the same split in two files, and the two
cases where the shards cannot be exact and the run falls back to one process. The
merge order is also checked on hand-made shard outputs.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jobs_capture as gen
import pytest
from click.testing import CliRunner

from netdiag import shard
from netdiag.capture.pcapng_writer import PcapngWriter
from netdiag.cli import cli
from netdiag.errors import InputError
from netdiag.flows.table import FlowTable, shard_of
from netdiag.pipeline import CaptureFacts, Options, analyze
from netdiag.records import Connection, DnsTransaction, Warning_
from netdiag.report.records_out import CollectingSink, JsonlSink

ROOT = Path(__file__).resolve().parent.parent
ANTHO = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"


@pytest.fixture(autouse=True)
def _no_env_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETDIAG_JOBS", raising=False)


@pytest.fixture
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs that fell back to one process."""
    seen: list[int] = []
    real = shard._sequential

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(shard, "_sequential", spy)
    return seen


def report(*args: str) -> bytes:
    result = CliRunner().invoke(cli, ["report", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout_bytes


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jobs") / "mixed.pcap"
    gen.write_mixed(path)
    return path


# -- byte-identical reports ---------------------------------------------------------------

@pytest.mark.parametrize("keys", [False, True], ids=["keyless", "keylog"])
@pytest.mark.parametrize("fmt", ["text", "json", "jsonl", "har", "html"])
def test_shipped_capture(fmt: str, keys: bool, fallbacks: list[int]) -> None:
    args = [str(ANTHO), "--format", fmt, *(["--keylog", str(KEYS)] if keys else [])]
    one = report(*args, "--jobs", "1")
    assert one
    for jobs in ("2", "3"):
        assert report(*args, "--jobs", jobs) == one, f"--jobs {jobs} differs"
    assert not fallbacks


def test_generated_capture_jsonl(mixed: Path, fallbacks: list[int]) -> None:
    one = report(str(mixed), "--format", "jsonl", "--jobs", "1")
    lines = one.decode().splitlines()
    types = {json.loads(line)["type"] for line in lines}
    assert types >= {"dns", "connection", "request", "summary", "capture"}
    cap = json.loads(lines[-1])
    assert cap["packets"] > 65536  # at least two sweeps
    assert len(cap["warnings"]) == 200 and cap["warnings_dropped"] > 0
    conns = [json.loads(line) for line in lines if '"type":"connection"' in line]
    assert len(conns) > 9900
    closes = {c["close"] for c in conns}
    assert closes == {"fin", "idle", "reused", "open"}
    assert any(c["client"].startswith("[") for c in conns)  # IPv6
    assert any(c["protocol"] == "dns" for c in conns)  # DNS over TCP
    for jobs in ("2", "3"):
        assert report(str(mixed), "--format", "jsonl", "--jobs", jobs) == one
    assert not fallbacks


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_generated_capture_collected(mixed: Path, fmt: str, fallbacks: list[int]) -> None:
    args = [str(mixed), "--format", fmt, "--no-profile"]
    assert report(*args, "--jobs", "2") == report(*args, "--jobs", "1")
    assert not fallbacks


def test_two_files(tmp_path: Path, fallbacks: list[int]) -> None:
    paths = [str(p) for p in gen.write_mixed(tmp_path / "two.pcap", 1500, seed=7, split=2)]
    for fmt in ("jsonl", "json"):
        args = [*paths, "--format", fmt, "--no-profile"]
        assert report(*args, "--jobs", "2") == report(*args, "--jobs", "1")
    assert not fallbacks


def test_records_past_the_memory_budget_start_over_in_one_process(
        mixed: Path, fallbacks: list[int]) -> None:
    """A listing report's shards hold every record until they merge: a shard whose
    records pass its share of ``--max-memory`` stops, and the capture is analyzed in one
    process (which sketches the summary past the budget)."""
    args = [str(mixed), "--format", "json", "--no-profile", "--max-memory", "1M"]
    one = report(*args, "--jobs", "1")
    assert not fallbacks
    assert report(*args, "--jobs", "2") == one
    assert fallbacks == [1]
    assert json.loads(one)["summary"]["sketch"]


def test_records_past_max_records_start_over_in_one_process(
        mixed: Path, fallbacks: list[int]) -> None:
    """``--max-records`` bounds what a listing report's shards hold as ``--max-memory``
    does: past its share, one process (which keeps no record past the count); JSON
    Lines' shards hold none, so nothing starts over."""
    args = [str(mixed), "--format", "json", "--no-profile", "--max-records", "100"]
    one = report(*args, "--jobs", "1")
    assert json.loads(one)["capture"]["records_omitted"]["connections"] > 0
    assert report(*args, "--jobs", "2") == one
    assert fallbacks == [1]
    args = [str(mixed), "--format", "jsonl", "--no-profile", "--max-records", "100"]
    assert report(*args, "--jobs", "2") == report(*args, "--jobs", "1")
    assert fallbacks == [1]


def test_json_lines_shards_spill_their_records_as_they_go(
        mixed: Path, fallbacks: list[int], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """JSON Lines streams: each shard writes its events to a file at every sweep instead
    of holding them, so a ``--max-memory`` far below the records' size starts nothing
    over; the parent merges the files. The files have no name: nothing could be left
    behind, even by a killed run."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    writes: list[tuple[int, int]] = []  # (events, last packet) per write, parent's shard
    real = shard._Spill.write

    def spy(self: Any, events: list[Any]) -> None:
        writes.append((len(events), max(e[0][0] for e in events)))
        assert list(tmp_path.iterdir()) == []  # while the files are written
        real(self, events)

    monkeypatch.setattr(shard._Spill, "write", spy)
    args = [str(mixed), "--format", "jsonl", "--no-profile"]
    one = report(*args, "--jobs", "1")
    assert not writes
    assert report(*args, "--jobs", "2", "--max-memory", "1M") == one
    assert not fallbacks
    total = sum(n for n, _last in writes)
    assert any(last < shard.END for _n, last in writes)  # written during the scan
    assert max(n for n, _last in writes) < total / 2
    assert list(tmp_path.iterdir()) == []


def test_json_lines_without_a_place_to_spill_runs_in_one_process(
        mixed: Path, fallbacks: list[int], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    args = [str(mixed), "--format", "jsonl", "--no-profile"]
    one = report(*args, "--jobs", "1")

    def read_only(**_kw: Any) -> Any:
        return open(os.devnull, "rb")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert report(*args, "--jobs", "2") == one  # the files cannot be written
    assert fallbacks == [1]

    def refuse(**_kw: Any) -> Any:
        raise OSError("read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    assert report(*args, "--jobs", "2") == one
    assert fallbacks == [1]  # never sharded


def test_real_process_streams_nothing_twice(tmp_path: Path) -> None:
    """The forked shards write nothing of the parent's (stdout buffers, the jsonl sink)."""
    def run(jobs: str) -> str:
        p = subprocess.run([sys.executable, "-m", "netdiag", "report", str(ANTHO), "--format",
                            "jsonl", "--no-profile", "--jobs", jobs], capture_output=True,
                           text=True, timeout=120, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        return p.stdout

    assert run("2") == run("1")


def test_damaged_and_compressed_input(tmp_path: Path) -> None:
    data = ANTHO.read_bytes()
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(data[: len(data) * 2 // 3])
    packed = tmp_path / "antho.pcapng.gz"
    packed.write_bytes(gzip.compress(data))
    for path, code in ((cut, 3), (packed, 0)):
        outs = []
        for jobs in ("1", "2"):
            r = CliRunner().invoke(cli, ["report", str(path), "--format", "json", "--jobs", jobs])
            assert r.exit_code == code, r.stderr
            outs.append((r.stdout_bytes, r.stderr_bytes))
        assert outs[0] == outs[1]


def test_written_pcapng_keys(tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"keys{jobs}.pcapng"
        report(str(ANTHO), "--format", "json", "--keylog", str(KEYS), "--write-pcapng",
               str(out), "--jobs", jobs)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        analyze([str(ANTHO), str(tmp_path / "missing.pcap")], CollectingSink(),
                Options(jobs=2))


# -- what only one process can reproduce: the fallback --------------------------------------

def _tls_packets(client: bytes, sport: int, t_ns: int) -> list[tuple[int, bytes]]:
    srv = gen._ip4(0x010101)
    rnd = bytes(range(sport % 200, sport % 200 + 32))
    ch = gen.client_hello(rnd, "x.example")
    sh = gen.server_hello(bytes(32)) + gen.app_data(100)
    return [(t_ns, gen.tcp(client, srv, sport, 443, 1000, 0, gen.SYN)),
            (t_ns + 1_000_000, gen.tcp(srv, client, 443, sport, 5000, 1001, gen.SYN | gen.ACK)),
            (t_ns + 2_000_000, gen.tcp(client, srv, sport, 443, 1001, 5001,
                                       gen.PSH | gen.ACK, ch)),
            (t_ns + 3_000_000, gen.tcp(srv, client, 443, sport, 5001, 1001 + len(ch),
                                       gen.PSH | gen.ACK, sh))]


def test_secrets_block_after_a_tls_decision(tmp_path: Path, fallbacks: list[int]) -> None:
    path = tmp_path / "late-keys.pcapng"
    t0 = 1_700_000_000 * 10**9
    first = [p for i in range(6) for p in _tls_packets(gen._ip4(0x0202 + i), 40000 + i,
                                                        t0 + i * 10**7)]
    later = [p for i in range(6) for p in _tls_packets(gen._ip4(0x0302 + i), 41000 + i,
                                                        t0 + 10**9 + i * 10**7)]
    rnd = bytes(range(41000 % 200, 41000 % 200 + 32))
    with open(path, "wb") as f:
        w = PcapngWriter(f)
        for ts, frame in first:
            w.packet(ts, 1, frame, len(frame))
        w.secrets(f"CLIENT_RANDOM {rnd.hex()} {'ab' * 48}\n".encode())
        for ts, frame in later:
            w.packet(ts, 1, frame, len(frame))
    args = [str(path), "--format", "jsonl", "--no-profile"]
    assert report(*args, "--jobs", "2") == report(*args, "--jobs", "1")
    assert fallbacks


def test_unusable_secrets_block_warned_once(tmp_path: Path, fallbacks: list[int]) -> None:
    path = tmp_path / "bad-keys.pcapng"
    t0 = 1_700_000_000 * 10**9
    with open(path, "wb") as f:
        w = PcapngWriter(f)
        w.secrets(b"CLIENT_RANDOM not-hex\n")
        for i in range(8):
            for ts, frame in _tls_packets(gen._ip4(0x0402 + i), 42000 + i, t0 + i * 10**7):
                w.packet(ts, 1, frame, len(frame))
    args = [str(path), "--format", "json", "--no-profile"]
    one = report(*args, "--jobs", "1")
    assert one.count(b"unusable decryption secrets block") == 1
    assert report(*args, "--jobs", "2") == one
    assert not fallbacks


def _ports_in_shards(a: bytes, b: bytes, resolver: bytes) -> tuple[int, int]:
    """A client port of ``a`` and of ``b`` towards ``resolver``:53 in different shards of 2."""
    def shard_at(client: bytes, port: int) -> int:
        return shard_of(client + resolver + struct.pack("!HH", port, 53), 2)

    pa = 30000
    pb = next(p for p in range(30000, 31000) if shard_at(b, p) != shard_at(a, pa))
    return pa, pb


def test_dns_expiry_out_of_activity_order(tmp_path: Path, fallbacks: list[int]) -> None:
    """One process's expiry stops at a transaction of the other shard (module docstring)."""
    s = 10**9
    res = gen._ip4(0x350035)
    ct, cu = gen._ip4(0x0901), gen._ip4(0x0902)
    pt, pu = _ports_in_shards(ct, cu, res)
    q = gen.dns_message(7, "t.example")
    r = gen.dns_message(7, "t.example", response=True)
    q2 = struct.pack("!H", len(q)) + q
    r2 = struct.pack("!H", len(r)) + r
    pkts = [
        (99 * s, gen.tcp(ct, res, pt, 53, 100, 0, gen.SYN)),
        (99 * s + 1000, gen.tcp(res, ct, 53, pt, 900, 101, gen.SYN | gen.ACK)),
        (99_900_000_000, gen.tcp(ct, res, pt, 53, 101, 901, gen.PSH | gen.ACK, q2)),
        (100 * s, gen.tcp(res, ct, 53, pt, 901, 101 + len(q2), gen.PSH | gen.ACK, r2[:5])),
        (100_200_000_000, gen.udp(cu, res, pu, 53, gen.dns_message(9, "u.example"))),
        # the response completes here, timed by its first segment (100.0 s)
        (100_500_000_000, gen.tcp(res, ct, 53, pt, 906, 101 + len(q2), gen.PSH | gen.ACK,
                                  r2[5:])),
    ]
    filler = gen.udp(gen._ip4(0x0903), gen._ip4(0x0904), 5000, 9, b"x")
    n = len(pkts)
    pkts += [(100_600_000_000 + i * 100_000, filler) for i in range(32767 - n)]
    pkts.append((105_150_000_000, filler))  # packet 32768: the sweep (limit 100.15 s)
    pkts += [(106 * s + i, filler) for i in range(10)]
    out = [struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)]
    for ts, frame in pkts:
        ts += 1_700_000_000 * s
        out.append(struct.pack("<IIII", ts // s, ts % s, len(frame), len(frame)) + frame)
    path = tmp_path / "expiry.pcap"
    path.write_bytes(b"".join(out))
    args = [str(path), "--format", "jsonl", "--no-profile"]
    one = report(*args, "--jobs", "1")
    assert report(*args, "--jobs", "2") == one
    assert fallbacks
    assert b'"qname":"t.example"' in one


# -- the parts ----------------------------------------------------------------------------

def test_shard_of_is_direction_independent_and_spreads() -> None:
    rng = random.Random(1)
    counts = [0, 0, 0]
    for _ in range(3000):
        a, b = rng.randbytes(4), rng.randbytes(4)
        pa, pb = rng.randrange(65536) & ~1, rng.randrange(65536)  # even ports, as Linux picks
        key = a + b + struct.pack("!HH", pa, pb)
        rkey = b + a + struct.pack("!HH", pb, pa)
        k = shard_of(key, 3)
        assert k == shard_of(rkey, 3)
        counts[k] += 1
    assert min(counts) > 900


def _reference_hash(key: bytes) -> int:
    """The documented hash of ``flow_hash`` in plain integers: the lower end point
    (address bytes, then port) first, as 16-bit words of a polynomial modulo 2**31 - 1."""
    alen = (len(key) - 4) // 2
    a, b = key[:alen], key[alen:2 * alen]
    pa, pb = key[2 * alen:2 * alen + 2], key[2 * alen + 2:]
    first, second = sorted([(a, pa), (b, pb)])
    h = 0
    for addr, port in (first, second):
        for i in range(0, alen, 2):
            h = (h * 1_000_003 + int.from_bytes(addr[i:i + 2], "big")) % ((1 << 31) - 1)
        h = (h * 1_000_003 + int.from_bytes(port, "big")) % ((1 << 31) - 1)
    return h


def test_shard_of_is_the_documented_hash_at_every_size() -> None:
    """The compiled hash runs in 64-bit integers: it must give the plain-integer value,
    largest addresses and ports included, IPv4 and IPv6 (and so the same shard in every
    process and core)."""
    rng = random.Random(7)
    keys = [b"\xff" * 12, b"\x00" * 12, b"\xff" * 36, b"\x00" * 34 + b"\xff\xff"]
    keys += [rng.randbytes(n) for n in (12, 36) for _ in range(500)]
    keys += [a * 4 + a * 4 + rng.randbytes(4) for a in (b"\x7f", b"\xfe")]  # equal addresses
    for key in keys:
        for shards in (2, 3, 7, (1 << 31) - 1):
            assert shard_of(key, shards) == _reference_hash(key) % shards, key.hex()


def test_shards_see_every_packet_and_keep_their_flows() -> None:
    def table(shard_: tuple[int, int] | None) -> tuple[FlowTable, list[Connection], list[int]]:
        done: list[Connection] = []
        udp: list[int] = []
        t = FlowTable(lambda flow, first: None, lambda flow: done.append(flow.conn),
                      lambda ts, src, dst, payload, pkt: udp.append(pkt), shard=shard_)
        from netdiag.capture.reader import CaptureReader

        with CaptureReader(ANTHO) as r:
            t.scan(r.packets())
        t.finish_all()
        return t, done, udp

    whole, conns, udp = table(None)
    parts = [table((k, 3)) for k in range(3)]
    for t, _c, _u in parts:
        assert (t.packets, t.undecoded, t.first_ns, t.last_ns) == (
            whole.packets, whole.undecoded, whole.first_ns, whole.last_ns)
    created = sorted(int(c.id[1:]) for _t, cs, _u in parts for c in cs)
    assert len(created) == len(conns) == len(set(created))
    assert sorted(p for _t, _c, us in parts for p in us) == udp
    assert all(c.id.startswith("#") for _t, cs, _u in parts for c in cs)


def _conn(created: int, client: str = "10.0.0.1:1000") -> Connection:
    return Connection(id=f"#{created}", ts_ns=created, client=client, server="10.0.0.2:443")


def _txn(i: int) -> DnsTransaction:
    return DnsTransaction(ts_ns=i, client="10.0.0.1:5", server="10.0.0.53:53", transport="udp",
                          id=i, qname=f"q{i}.example", qtype="A")


def _output(events: list[Any], **kw: Any) -> shard.ShardOutput:
    base: dict[str, Any] = {"udp_warnings": [], "udp_suppressed": 0, "dns_suppressed": 0,
                            "client_randoms": set(), "first_sync": None, "expire_heads": {},
                            "expired_last": {}, "limits_hit": {}}
    return shard.ShardOutput(events, **{**base, **kw})


def _two_shards() -> tuple[list[Any], list[Any]]:
    """The events of two shards, each in the order its run appends them."""
    end, conn_, expire, dns_end, packet = (shard.END, shard.CONN, shard.EXPIRE, shard.DNS_END,
                                           shard.PACKET)
    a = [  # shard 0
        ((5, packet, 0, 1), shard.CONNECTION, _conn(2), None),
        ((32768, conn_, 9, 2), shard.WARN, Warning_("tls", "#9 x -> y: tls: cut"), "#9"),
        ((32768, conn_, 9, 3), shard.CONNECTION, _conn(9), None),
        ((32768, expire, (7, packet, 0, 1), 4), shard.DNS, _txn(1), None),
        ((end, dns_end, (40000, packet, 0, 9), 5), shard.DNS, _txn(3), None),
    ]
    b = [  # shard 1
        ((6, packet, 0, 1), shard.CONNECTION, _conn(4), None),
        ((32768, conn_, 4, 2), shard.DNS, _txn(4), None),  # closed with its connection
        ((32768, conn_, 4, 3), shard.CONNECTION, _conn(3), None),
        ((32768, expire, (8, packet, 0, 2), 4), shard.DNS, _txn(2), None),
        ((40001, packet, 0, 5), shard.CONNECTION, _conn(40001), None),
        ((end, conn_, 1, 6), shard.CONNECTION, _conn(1), None),
    ]
    return a, b


def _order(merged: shard.Merged) -> list[tuple[int, str | None]]:
    return [(e[1], e[2].id if e[1] == shard.CONNECTION else getattr(e[2], "qname", None))
            for e in merged.events]


def test_merge_orders_as_one_process() -> None:
    a, b = _two_shards()
    merged = shard.merge([_output(a), _output(b)])
    assert merged is not None
    order = _order(merged)
    assert order == [
        (shard.CONNECTION, "#2"), (shard.CONNECTION, "#4"),
        (shard.DNS, "q4.example"), (shard.CONNECTION, "#3"),  # sweep: creation order
        (shard.WARN, None), (shard.CONNECTION, "#9"),
        (shard.DNS, "q1.example"), (shard.DNS, "q2.example"),  # expiry order
        (shard.CONNECTION, "#40001"), (shard.CONNECTION, "#1"), (shard.DNS, "q3.example")]
    assert merged.ids == {1: "C1", 2: "C2", 3: "C3", 4: "C4", 9: "C5", 40001: "C6"}

    got: list[str] = []
    sink = SimpleNamespace(connection=lambda c: got.append(c.id),
                           dns=lambda t: got.append(t.qname))
    res0 = SimpleNamespace(capture=CaptureFacts(files=["x"]))
    run0 = SimpleNamespace(readers=[], keylog=None)
    result = shard.replay(merged, sink, Options(), run0, res0)  # type: ignore[arg-type]
    assert got == ["C2", "C4", "q4.example", "C3", "C5", "q1.example", "q2.example", "C6",
                   "C1", "q3.example"]
    assert [w.message for w in result.capture.warnings] == ["C5 x -> y: tls: cut"]
    assert result.summary.tcp_connections == 6 and result.summary.dns_total == 4


def test_spilled_events_merge_as_held_ones(tmp_path: Path) -> None:
    with open(tmp_path / "0.events", "w+b") as f0, open(tmp_path / "1.events", "w+b") as f1:
        _spilled_events_merge_as_held_ones([f0, f1])


def _spilled_events_merge_as_held_ones(files: list[Any]) -> None:
    """Shards that wrote their events to files merge into the same order, ids and
    replay as shards that held them, each time the events are read."""
    held = shard.merge([_output(a) for a in _two_shards()])
    outputs = []
    for f, events in zip(files, _two_shards(), strict=True):
        run = SimpleNamespace(events=list(events), spill=shard._Spill(f))
        shard.ShardRun._spill_before(run, shard.END + 1)  # type: ignore[arg-type]
        run.spill.done()
        assert run.events == []
        outputs.append(_output([], spill=run.spill.fd, created=run.spill.created,
                               first_secrets=run.spill.first_secrets))
    spilled = shard.merge(outputs)
    assert held is not None and spilled is not None
    assert not isinstance(spilled.events, list)
    assert _order(spilled) == _order(held) == _order(spilled)
    assert spilled.ids == held.ids
    got: list[list[str]] = []
    for merged in (held, spilled):
        got.append([])
        sink = SimpleNamespace(connection=lambda c, out=got[-1]: out.append(c.id),
                               dns=lambda t, out=got[-1]: out.append(t.qname))
        shard.replay(merged, sink, Options(), SimpleNamespace(readers=[], keylog=None),
                     SimpleNamespace(capture=CaptureFacts(files=["x"])))  # type: ignore[arg-type]
    assert got[0] == got[1] and len(got[0]) == 10


def test_a_spill_writes_only_what_no_later_event_can_precede(tmp_path: Path) -> None:
    """At a sweep before packet 32768, the events of earlier packets go to the file, in
    order; those of the packet itself stay (its own events may still sort before them)."""
    a, _b = _two_shards()
    with open(tmp_path / "s.events", "w+b") as f:
        run = SimpleNamespace(events=list(reversed(a)), spill=shard._Spill(f))
        shard.ShardRun._spill_before(run, 32768)  # type: ignore[arg-type]
        run.spill.done()
        assert [e[0][0] for e in run.events] == [32768, 32768, 32768, shard.END]
        assert [e[0] for e in shard.read_spill(run.spill.fd)] == [a[0][0]]
    assert run.spill.created == [2]


def test_merge_refuses_an_expiry_one_process_would_have_stopped() -> None:
    p = 32768
    a = _output([((p, shard.EXPIRE, (9, 3, 0, 1), 2), shard.DNS, _txn(1), None)],
                expired_last={p: (9, 3, 0, 1)})
    b = _output([], expire_heads={p: (8, 3, 0, 1)})  # still active, and before it
    assert shard.merge([a, b]) is None
    b = _output([], expire_heads={p: (10, 3, 0, 1)})
    assert shard.merge([a, b]) is not None


def test_merge_refuses_secrets_read_after_the_first_tls_decision() -> None:
    facts = CaptureFacts(secrets=[(0x544C534B, b"x")])
    early = _output([], first_sync=((5, shard.PACKET, 0, 1), 0))
    late = _output([], first_sync=((9, shard.PACKET, 0, 1), 1))
    assert shard.merge([early, late], facts) is None
    assert shard.merge([late, _output([])], facts) is not None


def test_merge_keeps_the_secrets_warnings_of_the_first_sync() -> None:
    w = Warning_("tls", "unusable decryption secrets block: bad")
    a = _output([((9, shard.PACKET, 0, 1), shard.SECRETS_WARN, w, None)])
    b = _output([((4, shard.PACKET, 0, 1), shard.SECRETS_WARN, w, None)])
    merged = shard.merge([a, b])
    assert merged is not None
    assert [e[0][0] for e in merged.events] == [4]


def test_merge_lists_dns_warnings_as_one_analyzer() -> None:
    a = _output([], udp_warnings=[((2 * i, 3, 0, i), f"w{2 * i}") for i in range(150)],
                dns_suppressed=4)  # 4 from a DNS over TCP stream
    b = _output([], udp_warnings=[((2 * i + 1, 3, 0, i), f"w{2 * i + 1}") for i in range(150)])
    merged = shard.merge([a, b])
    assert merged is not None
    assert merged.dns_warnings[:200] == [f"w{i}" for i in range(200)]
    assert merged.dns_warnings[200:] == ["104 further DNS warnings were not listed"]


def test_records_cross_processes_as_field_tuples() -> None:
    sink = CollectingSink()
    analyze([str(ANTHO)], sink, Options())
    for c in sink.connections:
        back = shard.unpack_connection(shard.pack_connection(c))
        assert back.to_json(headers=True) == c.to_json(headers=True)


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_records_cross_in_batches(fmt: str, monkeypatch: pytest.MonkeyPatch,
                                  fallbacks: list[int]) -> None:
    """A shard sends its events a few at a time (the forked shards inherit the small
    batch); the parent puts them back together in order, and the report is the same."""
    batches: list[int] = []
    real = shard._unpack_events

    def counting(packed: list[Any], events: list[Any]) -> None:
        batches.append(len(packed))
        real(packed, events)

    monkeypatch.setattr(shard, "_unpack_events", counting)
    monkeypatch.setattr(shard, "TRANSFER_EVENTS", 3)
    args = [str(ANTHO), "--format", fmt, "--keylog", str(KEYS)]
    one = report(*args, "--jobs", "1")
    assert report(*args, "--jobs", "3") == one
    assert len(batches) > 4 and max(batches) == 3
    assert not fallbacks


def test_the_parent_unpacks_each_batch_as_it_arrives(monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """The parent unpacks a batch before it reads the next (the shard packs that one
    meanwhile), and a failure in place of a batch still ends the receiving."""
    sink = CollectingSink()
    analyze([str(ANTHO)], sink, Options())
    packed = [(i, shard.CONNECTION, shard.pack_connection(c), None)
              for i, c in enumerate(sink.connections)]
    log: list[str] = []

    class Pipe:
        def __init__(self, messages: list[bytes]) -> None:
            self.messages = messages

        def recv_bytes(self) -> bytes:
            log.append("read")
            return self.messages.pop(0)

    real = shard._unpack_events

    def unpack(batch: list[Any], events: list[Any]) -> None:
        log.append("unpack")
        real(batch, events)

    monkeypatch.setattr(shard, "_unpack_events", unpack)
    batches = [shard._BATCH + pickle.dumps(packed[i:i + 5]) for i in range(0, 15, 5)]
    head = (shard.ShardOutput([], [], 0, 0, set(), None, {}, {}), len(batches))
    out = shard._receive_output(Pipe(list(batches)), head)
    assert log == ["read", "unpack"] * 3
    assert [c.to_json() for _p, _k, c, _x in out.events] == [
        c.to_json() for c in sink.connections[:15]]
    failed = shard._FAILED + pickle.dumps(RuntimeError("shard 1 of 2 failed"))
    with pytest.raises(RuntimeError, match="shard 1 of 2 failed"):
        shard._receive_output(Pipe([batches[0], failed]), head)


def test_the_parents_shard_hands_its_events_over(monkeypatch: pytest.MonkeyPatch,
                                                 fallbacks: list[int]) -> None:
    """The parent's own shard run gives its events to the merge and keeps none: the run
    is garbage in a cycle that the tuned collector may keep until the exit, so events it
    still held would stay through the path analysis (measured: 2 MiB at the peak on the
    benchmark's 1M-packet capture)."""
    runs: list[shard.ShardRun] = []
    real = shard.ShardRun.output

    def output(self: shard.ShardRun) -> shard.ShardOutput:
        runs.append(self)
        return real(self)

    monkeypatch.setattr(shard.ShardRun, "output", output)
    sink = CollectingSink()
    analyze([str(ANTHO)], sink, Options(jobs=2))
    assert not fallbacks and len(runs) == 1  # the parent's (the other is forked)
    assert runs[0].events == []
    assert sink.connections


def test_a_shard_that_fails_while_sending_is_an_error_not_a_hang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(events: list[Any]) -> list[Any]:
        raise ValueError("cannot pack")

    monkeypatch.setattr(shard, "_pack_events", broken)
    with pytest.raises(RuntimeError, match=r"failed sending its records.*cannot pack"):
        shard.analyze_sharded([str(ANTHO)], CollectingSink(), Options(jobs=2))


def test_jsonl_rendering_with_the_placeholder_in_a_value() -> None:
    """A value equal to the id placeholder does not take the id's place."""
    from netdiag.report import records_out

    c = Connection(id="C7", ts_ns=1, client=records_out._ID, server="b:1")
    out = io.StringIO()
    s = JsonlSink(out)
    s.connection_rendered(c, s.render_connection(c))
    line = json.loads(out.getvalue())
    assert line["id"] == "C7" and line["client"] == records_out._ID


def test_resolve_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shard.resolve_jobs(3, [str(ANTHO)]) == 3
    assert shard.resolve_jobs(None, [str(ANTHO)]) == 1  # small
    assert shard.resolve_jobs(0, [str(tmp_path / "missing")]) == 1
    monkeypatch.setattr(shard, "AUTO_MIN_BYTES", 0)
    cpus = shard.available_cpus()
    assert shard.resolve_jobs(0, [str(ANTHO)]) == cpus
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        assert shard.resolve_jobs(None, [str(fifo)]) == 1


def test_jobs_option_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = shard.analyze_sharded

    def spy(paths: list[str], sink: Any, options: Options) -> Any:
        seen.append(options.jobs)
        return real(paths, sink, options)

    monkeypatch.setattr(shard, "analyze_sharded", spy)
    monkeypatch.setenv("NETDIAG_JOBS", "2")
    report(str(ANTHO), "--format", "json")
    report(str(ANTHO), "--format", "json", "--jobs", "3")
    monkeypatch.delenv("NETDIAG_JOBS")
    report(str(ANTHO), "--format", "json")  # small: one process, no shards
    assert seen == [2, 3]


def test_jobs_unset_takes_every_core_whatever_the_budget(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """``--jobs`` unset: big input takes every core, JSON Lines too (its shards spill
    their records, so ``--max-memory`` does not decide)."""
    seen: list[str] = []
    real = shard.analyze_sharded

    def spy(paths: list[str], sink: Any, options: Options) -> Any:
        seen.append(str(options.jobs))
        return real(paths, sink, options)

    monkeypatch.setattr(shard, "analyze_sharded", spy)
    monkeypatch.setattr(shard, "AUTO_MIN_BYTES", 0)
    monkeypatch.setattr(shard, "available_cpus", lambda: 2)
    small = f"{ANTHO.stat().st_size}B"
    report(str(ANTHO), "--format", "jsonl", "--max-memory", small)
    report(str(ANTHO), "--format", "jsonl", "--max-memory", "none")
    report(str(ANTHO), "--format", "json", "--max-memory", small)
    assert seen == ["2", "2", "2"]


def test_a_shard_ends_right_after_sending_everything(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """A shard process leaves (``os._exit(0)``) as soon as its output is sent and its end
    of the pipe closed, without freeing what it built first; everything is sent by
    then."""
    import multiprocessing

    class Left(Exception):
        pass

    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Left

    monkeypatch.setattr(shard.os, "_exit", fake_exit)
    monkeypatch.setattr(shard.signal, "signal", lambda *_args: None)  # not this process's
    receive, send = multiprocessing.Pipe(duplex=False)
    collecting = gc.isenabled()
    try:
        with pytest.raises(Left):  # called here, not forked: the exit is the fake one
            shard._child(send, [str(ANTHO)], Options(jobs=2), 1, 2, CollectingSink())
    finally:
        if collecting:
            gc.enable()  # the shard turns the collector off before it packs
    assert codes == [0] and send.closed
    status, head = pickle.loads(receive.recv_bytes())
    out = shard._receive_output(receive, head)
    assert status == "ok" and out.events
    receive.close()


_SETTLED = """
import gc, sys
from netdiag.pipeline import Options, analyze
from netdiag.report.records_out import CollectingSink
gc.enable()
sink = CollectingSink()
analyze([sys.argv[1]], sink, Options(jobs=2))
records = {id(c) for c in sink.connections} | {id(r) for c in sink.connections for r in c.requests}
walked = sum(1 for g in range(3) for o in gc.get_objects(g) if id(o) in records)
print(len(records), walked, gc.isenabled(), gc.get_freeze_count())
"""


def test_the_parent_settles_what_the_shards_sent() -> None:
    """After a sharded analysis, the merged records (the parent's and every shard's)
    are out of the collector's generations (``gcpolicy.settle``), with the collector on
    again: re-enabled over a few hundred thousand unpickled records, it walked them all
    at the next allocation (0.25 s of the key log benchmark). In a process of its own:
    the freeze is for the whole process."""
    run = subprocess.run([sys.executable, "-c", _SETTLED, str(ANTHO)], capture_output=True,
                         text=True, timeout=300, check=True)
    records, walked, enabled, frozen = run.stdout.split()
    assert int(records) > 50 and int(frozen) >= int(records)
    assert walked == "0" and enabled == "True"


def test_the_parent_does_not_wait_for_the_shards_to_end(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Once every shard has sent its output, the parent merges without waiting for
    them to end (a shard's exit gives back its memory, on its own core); the outputs
    are complete and the result the same as one process's."""
    joined: list[str] = []
    real_join = shard.multiprocessing.process.BaseProcess.join

    def join(self: Any, timeout: float | None = None) -> None:
        joined.append(self.name)
        real_join(self, timeout)

    monkeypatch.setattr(shard.multiprocessing.process.BaseProcess, "join", join)
    received: list[int] = []
    real_receive = shard._receive_output

    def receive(*args: Any) -> Any:
        out = real_receive(*args)
        received.append(len(out.events))
        return out

    monkeypatch.setattr(shard, "_receive_output", receive)
    one, two = CollectingSink(), CollectingSink()
    analyze([str(ANTHO)], one, Options(jobs=1))
    analyze([str(ANTHO)], two, Options(jobs=2))
    assert joined == [] and len(received) == 1 and received[0] > 0
    assert [c.to_json() for c in two.connections] == [c.to_json() for c in one.connections]
