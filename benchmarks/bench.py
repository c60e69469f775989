#!/usr/bin/env python3
"""Measure netdiag as users run it against tshark on the same captures: time, memory, ratios.

    python benchmarks/bench.py                     # 1M packets; builds the captures if missing
    python benchmarks/bench.py --packets 200000 --repeat 3
    python benchmarks/bench.py --scaling           # also 1x / 4x / 16x of packets/16
    python benchmarks/bench.py --file x.pcap --keylog x.keys --formats text --jobs 1

Three cases by default: a synthetic capture without keys (make_big_capture.py), the
shipped lab capture repeated (make_keyed_capture.py) without keys, and the same with its
key log. In each, tshark runs once (with ``tls.keylog_file`` when there are keys), then
netdiag for every format (text, json, jsonl; ``--formats`` adds har, html, csv and
parquet, the last two written into a temporary directory) and every ``--jobs`` value
(1, 2); the table gives each run's wall and CPU seconds and peak memory, and its ratios to tshark,
to jsonl and to ``--jobs 1``, then whether each target of issue 10 is met.

Each tool runs in its own child process; the child is reaped with ``os.wait4``, whose
rusage belongs to that child alone (and to the processes it reaped), so ``ru_maxrss`` is
the exact peak RSS of the largest single process. Because netdiag may fan out to worker
processes, the process tree is also sampled every 20 ms (sum of PSS over the tree from
/proc); the reported peak is the larger of the two figures.

Targets: terminal format, one core: at least 10x tshark's speed without keys, 6x with
keys; two cores at least 1.6x one core; peak memory at most 1/10 of tshark's; any
format at most 1.2x jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"

SPEED_TARGET = 10.0
"""tshark time / netdiag time, terminal format, one core, no keys: at least this."""
SPEED_TARGET_KEYS = 6.0
"""The same with a key log."""
JOBS2_TARGET = 1.6
"""--jobs 2 against --jobs 1: at least this much faster."""
MEMORY_TARGET = 0.1
"""netdiag peak RSS / tshark peak RSS: at most this."""
FORMAT_TARGET = 1.2
"""Any format against jsonl on the same capture and jobs: at most this much slower."""
LAB_PACKETS = 840
"""Packets of captures/antho.pcapng, which make_keyed_capture.py repeats."""

TSHARK_FIELDS = [
    "frame.time_epoch", "tcp.stream", "tcp.analysis.initial_rtt",
    "tcp.analysis.retransmission", "dns.id", "dns.time", "dns.qry.name",
    "tls.handshake.type", "tls.handshake.extensions_server_name",
    "tls.handshake.extensions_alpn_str", "tls.handshake.extensions.supported_version",
    "tls.handshake.ciphersuite", "tls.record.content_type", "http2.streamid", "http2.type",
    "http.request.method", "http.response.code",
]


def tshark_cmd(tshark: str, capture: Path, keylog: Path | None = None) -> list[str]:
    cmd = [tshark, "-2", "-n", "-r", str(capture), "-o", "tcp.reassemble_out_of_order:TRUE",
           "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|"]
    if keylog is not None:
        cmd += ["-o", f"tls.keylog_file:{keylog}"]
    for field in TSHARK_FIELDS:
        cmd += ["-e", field]
    return cmd


def netdiag_base(override: str | None) -> list[str]:
    if override:
        return shlex.split(override)
    if (exe := Path(sys.executable).with_name("netdiag")).exists():
        return [str(exe)]  # the console script next to this interpreter (not a pyenv shim)
    if exe := shutil.which("netdiag"):
        return [exe]
    return [sys.executable, "-m", "netdiag"]


# ---------------------------------------------------------------------------
# Capture helpers
# ---------------------------------------------------------------------------


def count_packets(path: Path) -> int:
    """Count the packets of a pcap or pcapng file by walking its record headers."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        size = len(m)
        if size < 24:
            return 0
        magic = m[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            endian = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            endian = ">"
        elif magic == b"\x0a\x0d\x0d\x0a":
            return _count_pcapng(m)
        else:
            raise ValueError(f"{path}: not a pcap or pcapng file")
        caplen_at = struct.Struct(endian + "I").unpack_from
        n, off = 0, 24
        while off + 16 <= size:
            off += 16 + caplen_at(m, off + 8)[0]
            n += 1
        return n if off <= size else n - 1  # a cut last record is not a packet


def _count_pcapng(m: mmap.mmap) -> int:
    size = len(m)
    n, off, endian = 0, 0, "<"
    while off + 12 <= size:
        if m[off:off + 4] == b"\x0a\x0d\x0d\x0a":
            endian = "<" if m[off + 8:off + 12] == b"\x4d\x3c\x2b\x1a" else ">"
        btype, blen = struct.unpack_from(endian + "II", m, off)
        if blen < 12:
            break
        if btype in (3, 6, 0x80000001):  # SPB, EPB, obsolete PB
            n += 1
        off += blen
    return n


def ensure_capture(packets: int) -> Path:
    path = OUT / f"capture-{packets}.pcap"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"building {path} ({packets:,} packets) ...", file=sys.stderr)
        subprocess.run([sys.executable, str(HERE / "make_big_capture.py"),
                        "--packets", str(packets), "--out", str(path)], check=True)
    return path


def warm_page_cache(path: Path) -> None:
    """Read the file once so that every tool starts from the same warm page cache."""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def measure_warm(label: str, cmd: list[str], path: Path, packets: int, env: dict | None,
                 timeout: float | None) -> dict:
    """:func:`measure`, the capture read into the page cache just before: the kernel
    may take cached pages back between runs (this VM's proactive reclaim took 26 MB of
    the 791 MB capture's within 30 s), and a run that reads some of them from the disk
    is then slower for a reason that is neither tool's."""
    warm_page_cache(path)
    return measure(label, cmd, packets, env, timeout)


# ---------------------------------------------------------------------------
# Measuring one child process
# ---------------------------------------------------------------------------

PAGE = os.sysconf("SC_PAGE_SIZE")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _memory(pid: int, proportional: bool) -> tuple[int, int]:
    """(resident, anonymous) bytes of one process; proportional (PSS) when pages are shared.

    File-backed pages (the interpreter, libraries, an mmap of the capture) are in the
    first figure only; the second is what the process allocated itself.
    """
    name, anon_name = ("Pss:", "Pss_Anon:") if proportional else ("VmRSS:", "RssAnon:")
    path = f"/proc/{pid}/smaps_rollup" if proportional else f"/proc/{pid}/status"
    total = anon = 0
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    total = int(line.split()[1]) * 1024
                elif line.startswith(anon_name):
                    anon = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total, anon


class TreeSampler(threading.Thread):
    """Samples the summed memory of a process tree until stopped."""

    def __init__(self, pid: int, interval: float = 0.02, skip_root: bool = False) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.skip_root = pid, interval, skip_root
        self.peak = 0
        self.peak_anon = 0
        self.max_procs = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pids = _descendants(self.pid)[1 if self.skip_root else 0:]
            if not pids:
                self._stop_event.wait(0.002)
                continue
            self.max_procs = max(self.max_procs, len(pids))
            several = len(pids) > 1
            figures = [_memory(p, several) for p in pids]
            self.peak = max(self.peak, sum(f[0] for f in figures))
            self.peak_anon = max(self.peak_anon, sum(f[1] for f in figures))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _kill_group(pid: int) -> None:
    print(f"  timeout: killing process group {pid}", file=sys.stderr)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


# The tool is started by this tiny launcher rather than by the benchmark process itself:
# Linux carries a process's RSS high-water mark over fork/vfork and exec (the kernel's
# signal->maxrss), so a child forked by a big parent (this script maps the capture to
# count its packets) would report the parent's peak as its own ru_maxrss. The launcher
# is a bare interpreter of ~10 MB: that is the floor of any figure measured this way.
LAUNCHER = """
import json, os, sys, time
cmd = sys.argv[1:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.execvp(cmd[0], cmd)
    except BaseException as exc:
        os.write(2, f"cannot run {cmd[0]}: {exc}\\n".encode())
    os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "code": os.waitstatus_to_exitcode(status),
                  "maxrss_kib": ru.ru_maxrss, "cpu": ru.ru_utime + ru.ru_stime}))
"""


def measure(name: str, cmd: list[str], packets: int, env: dict | None = None,
            timeout: float | None = None) -> dict:
    """Run ``cmd`` with stdout to /dev/null; return wall time, CPU time and peak memory."""
    print(f"running {name}: {shlex.join(cmd)}", file=sys.stderr)
    with tempfile.TemporaryFile() as err:
        launcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, *cmd],
                                    stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO,
                                    start_new_session=True)
        sampler = TreeSampler(launcher.pid, skip_root=True)
        sampler.start()
        timer = None
        if timeout:
            timer = threading.Timer(timeout, _kill_group, (launcher.pid,))
            timer.start()
        out, _ = launcher.communicate()
        if timer:
            timer.cancel()
        sampler.stop()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    try:
        child = json.loads(out)
    except ValueError:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        print(f"  {name}: the launcher failed (exit {launcher.returncode}):\n{_indent(tail)}",
              file=sys.stderr)
        return {"tool": name, "ok": False, "exit_code": launcher.returncode, "packets": packets,
                "error": tail, "command": cmd}
    code, wall = child["code"], child["wall"]
    maxrss = child["maxrss_kib"] * 1024  # Linux reports KiB
    peak = max(maxrss, sampler.peak)
    result = {
        "tool": name,
        "ok": code == 0,
        "exit_code": code,
        "packets": packets,
        "wall_s": round(wall, 3),
        "cpu_s": round(child["cpu"], 3),
        "packets_per_s": round(packets / wall) if wall > 0 else None,
        "peak_rss_mib": round(peak / 2**20, 1),
        "maxrss_single_process_mib": round(maxrss / 2**20, 1),
        "sampled_tree_peak_mib": round(sampler.peak / 2**20, 1),
        "sampled_anon_peak_mib": round(sampler.peak_anon / 2**20, 1),
        "processes": sampler.max_procs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "command": cmd,
    }
    if code != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        result["error"] = tail
        status = "could not start" if code == 127 else f"failed (exit {code})"
        print(f"  {name} {status} after {wall:.2f} s:\n{_indent(tail)}", file=sys.stderr)
    else:
        print(f"  {name}: {wall:.2f} s, {result['peak_rss_mib']} MiB", file=sys.stderr)
    return result


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) or "    (no stderr)"


def best_of(runs: list[dict]) -> dict:
    """The fastest successful run, with the lowest peak memory seen over the runs."""
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return runs[-1]
    best = dict(min(ok, key=lambda r: r["wall_s"]))
    best["peak_rss_mib"] = min(r["peak_rss_mib"] for r in ok)
    best["runs"] = len(runs)
    best["wall_s_all"] = [r["wall_s"] for r in ok]
    return best


# ---------------------------------------------------------------------------
# What two cores give on this machine
# ---------------------------------------------------------------------------

SPIN = "import time\nt = time.process_time()\nx = 0\nfor i in range(12_000_000): x += i\n" \
       "print(time.process_time() - t)"
"""A fixed pure-Python loop: the same work in every process, no memory to speak of."""


def _spin(n: int) -> float:
    """Wall seconds of ``n`` copies of :data:`SPIN` started together."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN], stdout=subprocess.PIPE)
             for _ in range(n)]
    for p in procs:
        p.communicate()
    return time.perf_counter() - t0


def parallel_capacity(trials: int = 5) -> dict:
    """How much more CPU-bound work two processes get done at once than one: 2 x (one
    alone) / (two at once), from the fastest of ``trials`` runs of each, alternated (a
    slow moment of a drifting machine then counts on neither side). 2.0 is two whole
    cores; a virtual machine whose two vCPUs share a physical core, or whose host is
    busy, gives less, and no ``--jobs 2`` can beat it (its shards are independent
    CPU-bound processes)."""
    alone, together = [], []
    for _ in range(trials):
        alone.append(_spin(1))
        together.append(_spin(2))
    return {"ratio": round(2 * min(alone) / min(together), 2),
            "alone_s": [round(t, 2) for t in alone],
            "together_s": [round(t, 2) for t in together]}


# ---------------------------------------------------------------------------
# The matrix: cases x formats x jobs, each against tshark on the same capture
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """One capture as users run it: a name, the file, and the key log (None: no keys)."""

    name: str
    path: Path
    keylog: Path | None = None


def ensure_keyed_capture(packets: int) -> Path:
    """The shipped lab capture repeated to about ``packets`` packets, with its key log."""
    copies = max(1, -(-packets // LAB_PACKETS))
    path = OUT / f"keyed-{copies}.pcap"
    if not path.exists() or not path.with_suffix(".keys").exists():
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"building {path} ({copies} copies of the lab capture) ...", file=sys.stderr)
        subprocess.run([sys.executable, str(HERE / "make_keyed_capture.py"),
                        "--copies", str(copies), "--out", str(path)], check=True)
    return path


def netdiag_supports_jobs(base: list[str], env: dict) -> bool:
    out = subprocess.run([*base, "report", "--help"], capture_output=True, text=True, env=env,
                         cwd=REPO)
    return "--jobs" in out.stdout


def netdiag_core(base: list[str], env: dict) -> str:
    """Which core ``netdiag --version`` says runs (``compiled, mypyc``, or ``pure Python``
    and why: a source edited after the build makes an editable install fall back)."""
    out = subprocess.run([*base, "--version"], capture_output=True, text=True, env=env,
                         cwd=REPO)
    line = out.stdout.strip()
    return line.partition("(core: ")[2].rstrip(")") or line or f"exit {out.returncode}"


FILE_FORMATS = ("csv", "parquet")
"""Formats that write a directory of files (``-o DIR``) rather than standard output."""


def run_matrix(cases: list[Case], formats: list[str], jobs: list[int], args: argparse.Namespace,
               env: dict) -> list[dict]:
    base = netdiag_base(args.netdiag_cmd)
    has_jobs = netdiag_supports_jobs(base, env)
    rows: list[dict] = []
    for case in cases:
        packets = count_packets(case.path)
        plan = [(fmt, j) for fmt in formats for j in jobs if j == 1 or has_jobs]
        runs: dict[tuple[str, int], list[dict]] = {key: [] for key in plan}
        tshark_runs: list[dict] = []
        # the repeats in rounds: tshark once, then every row once, per round. A VM whose
        # speed drifts during a case then slows tshark and every row alike, and the best
        # of each is taken over the same stretch of time (all of tshark's runs first, then
        # each row's, put minutes between what a ratio compares)
        cores: list[str] = []  # the core before each round and after the last
        for _ in range(args.repeat):
            if (core := netdiag_core(base, env)) not in cores:
                cores.append(core)
            if not args.skip_tshark:
                tshark_runs.append(measure_warm(
                    f"tshark [{case.name}]", tshark_cmd(args.tshark, case.path, case.keylog),
                    case.path, packets, None, args.timeout))
            for fmt, j in plan:
                cmd = [*base, "report", str(case.path), "--format", fmt, "--no-profile"]
                if case.keylog is not None:
                    cmd += ["--keylog", str(case.keylog)]
                if has_jobs:
                    cmd += ["--jobs", str(j)]
                with contextlib.ExitStack() as stack:
                    if fmt in FILE_FORMATS:  # they write files into a directory
                        cmd += ["-o", stack.enter_context(
                            tempfile.TemporaryDirectory(prefix="netdiag-bench-"))]
                    runs[(fmt, j)].append(measure_warm(
                        f"netdiag {fmt} jobs {j} [{case.name}]", cmd, case.path, packets,
                        env, args.timeout))
        if (core := netdiag_core(base, env)) not in cores:
            cores.append(core)
        ts = best_of(tshark_runs) if tshark_runs else None
        for fmt, j in plan:
            rows.append({"case": case.name, "format": fmt, "jobs": j, "cores": cores,
                         "netdiag": best_of(runs[(fmt, j)]), "tshark": ts,
                         "packets": packets,
                         "size_mb": round(case.path.stat().st_size / 1e6, 1)})
    by = {(r["case"], r["format"], r["jobs"]): r for r in rows}
    for r in rows:
        nd, ts = r["netdiag"], r["tshark"]
        ok = nd.get("ok")
        r["vs_tshark"] = (round(ts["wall_s"] / nd["wall_s"], 2)
                          if ok and ts and ts.get("ok") else None)
        r["memory_vs_tshark"] = (round(nd["peak_rss_mib"] / ts["peak_rss_mib"], 3)
                                 if ok and ts and ts.get("ok") else None)
        ref = by.get((r["case"], "jsonl", r["jobs"]))
        r["vs_jsonl"] = (round(nd["wall_s"] / ref["netdiag"]["wall_s"], 2)
                         if ok and ref and ref["netdiag"].get("ok") else None)
        one = by.get((r["case"], r["format"], 1))
        r["vs_jobs1"] = (round(one["netdiag"]["wall_s"] / nd["wall_s"], 2)
                         if ok and r["jobs"] != 1 and one and one["netdiag"].get("ok") else None)
    return rows


def run_scaling(base_packets: int, factors: list[int], formats: list[str], jobs: list[int],
                args: argparse.Namespace, env: dict) -> list[dict]:
    """Time and memory at 1x, 4x, 16x: cost must grow with packets, memory with flows
    (JSON lines also with more than one process: its shards spill their records)."""
    base = netdiag_base(args.netdiag_cmd)
    if not netdiag_supports_jobs(base, env):
        jobs = [0]
    out = []
    for f in factors:
        path = ensure_capture(base_packets * f)
        packets = count_packets(path)
        for fmt in formats:
            for j in jobs:
                if j != 1 and fmt != "jsonl" and 1 in jobs:
                    continue  # the listing formats hold every record whatever the jobs
                jobs_flag = ["--jobs", str(j)] if j else []
                cmd = [*base, "report", str(path), "--format", fmt, "--no-profile", *jobs_flag]
                r = best_of([measure_warm(f"netdiag {fmt} {f}x jobs {j or '-'}", cmd, path,
                                          packets, env, args.timeout)
                             for _ in range(args.repeat)])
                out.append({"factor": f, "format": fmt, "jobs": j or None, "packets": packets,
                            "netdiag": r, "us_per_packet": (round(r["wall_s"] / packets * 1e6, 2)
                                                            if r.get("ok") else None)})
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_matrix(rows: list[dict], capacity: dict | None = None) -> None:
    cases: dict[str, dict] = {}
    for r in rows:
        cases.setdefault(r["case"], r)
    for name, r in cases.items():
        ts = r["tshark"]
        tsl = (f"tshark {ts['wall_s']:.2f} s, {ts['peak_rss_mib']:.0f} MiB" if ts and ts.get("ok")
               else "tshark not run")
        print(f"[{name}] {r['packets']:,} packets, {r['size_mb']} MB; {tsl}; "
              f"netdiag core: {', then '.join(r['cores'])}")
    header = (f"{'case':<18} {'format':<6} {'jobs':>4} {'wall s':>7} {'CPU s':>7} "
              f"{'peak MiB':>8} {'x tshark':>8} {'mem/tshark':>10} {'/jsonl':>6} {'/jobs1':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        nd = r["netdiag"]
        if not nd.get("ok"):
            print(f"{r['case']:<18} {r['format']:<6} {r['jobs']:>4}  FAILED "
                  f"(exit {nd.get('exit_code')})")
            continue
        speed = _fmt(r["vs_tshark"], ".2f") + ("x" if r["vs_tshark"] is not None else "")
        print(f"{r['case']:<18} {r['format']:<6} {r['jobs']:>4} {nd['wall_s']:>7.2f} "
              f"{nd['cpu_s']:>7.2f} {nd['peak_rss_mib']:>8.1f} {speed:>8} "
              f"{_fmt(r['memory_vs_tshark'], '>10.3f')} {_fmt(r['vs_jsonl'], '>6.2f')} "
              f"{_fmt(r['vs_jobs1'], '>6.2f')}")
    print()
    for line in verdicts(rows, capacity):
        print(line)


def verdicts(rows: list[dict], capacity: dict | None = None) -> list[str]:
    """The issue's targets, each MET / NOT MET from the rows measured."""
    out = []

    def say(what: str, value: float | None, target: str, met: bool | None) -> None:
        v = "-" if value is None else f"{value:.2f}"
        out.append(f"{what:<58} {v:>7}  target {target:<8} "
                   f"{'n/a' if met is None else 'MET' if met else 'NOT MET'}")

    for name in dict.fromkeys(r["case"] for r in rows if len(r["cores"]) > 1):
        cores = next(r["cores"] for r in rows if r["case"] == name)
        out.append(f"WARNING [{name}]: netdiag's core changed during the case "
                   f"({' then '.join(cores)}): its rows mix two builds; run it again")
    for r in rows:
        if r["format"] == "text" and r["jobs"] == 1 and r["vs_tshark"] is not None:
            keyed = "key log" in r["case"]
            target = SPEED_TARGET_KEYS if keyed else SPEED_TARGET
            say(f"speed vs tshark, text, one core [{r['case']}]", r["vs_tshark"],
                f">= {target:g}x", r["vs_tshark"] >= target)
    for r in rows:
        if r["format"] == "text" and r["jobs"] == 2:
            say(f"two cores vs one, text [{r['case']}]", r["vs_jobs1"], f">= {JOBS2_TARGET:g}x",
                None if r["vs_jobs1"] is None else r["vs_jobs1"] >= JOBS2_TARGET)
    if capacity is not None and any(r["jobs"] == 2 for r in rows):
        out.append(f"{'(this machine: two CPU-bound processes at once do':<58} "
                   f"{capacity['ratio']:>7.2f}x the work of one: one alone "
                   f"{min(capacity['alone_s']):.2f} s, two at once "
                   f"{min(capacity['together_s']):.2f} s, best of "
                   f"{len(capacity['alone_s'])})")
    worst_mem = max((r["memory_vs_tshark"] for r in rows if r["memory_vs_tshark"] is not None),
                    default=None)
    say("peak memory vs tshark (worst row)", worst_mem, f"<= {MEMORY_TARGET:g}",
        None if worst_mem is None else worst_mem <= MEMORY_TARGET)
    worst_fmt = max((r["vs_jsonl"] for r in rows if r["vs_jsonl"] is not None
                     and r["format"] != "jsonl"), default=None)
    say("any format vs jsonl, same capture and jobs (worst row)", worst_fmt,
        f"<= {FORMAT_TARGET:g}x", None if worst_fmt is None else worst_fmt <= FORMAT_TARGET)
    return out


def print_scaling(rows: list[dict]) -> None:
    print(f"{'factor':>6} {'format':<6} {'jobs':>4} {'packets':>10} {'wall s':>7} "
          f"{'us/packet':>9} {'peak MiB':>8}")
    for r in rows:
        nd = r["netdiag"]
        jobs = r.get("jobs") or "-"
        if nd.get("ok"):
            print(f"{r['factor']:>5}x {r['format']:<6} {jobs:>4} {r['packets']:>10,} "
                  f"{nd['wall_s']:>7.2f} {r['us_per_packet']:>9.2f} {nd['peak_rss_mib']:>8.1f}")
        else:
            print(f"{r['factor']:>5}x {r['format']:<6} {jobs:>4} FAILED")


def compile_bytecode() -> None:
    """Write the package's bytecode, as ``pip install .`` does for a user: an editable
    checkout run with ``PYTHONDONTWRITEBYTECODE`` set (these machines set it) would
    otherwise compile every interpreted module from source at each run (0.08 s here)."""
    import compileall

    compileall.compile_dir(str(REPO / "netdiag"), quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=1_000_000,
                    help="size of the generated captures (default 1,000,000)")
    ap.add_argument("--file", type=Path, help="benchmark this existing capture instead")
    ap.add_argument("--keylog", type=Path, help="with --file: its key log")
    ap.add_argument("--formats", default="text,json,jsonl")
    ap.add_argument("--jobs", default="1,2", help="netdiag --jobs values (default 1,2)")
    ap.add_argument("--cases", default="synthetic,lab,lab-keys",
                    help="synthetic (no keys), lab (no keys), lab-keys (default: all three)")
    ap.add_argument("--scaling", action="store_true",
                    help="also time text and jsonl at 1x, 4x and 16x of packets/16")
    ap.add_argument("--scaling-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="take the best of N runs")
    ap.add_argument("--skip-tshark", action="store_true")
    ap.add_argument("--netdiag-cmd", help="netdiag command prefix (default: `netdiag` next to "
                    "this interpreter, else on PATH, else `python -m netdiag`)")
    ap.add_argument("--tshark", default=shutil.which("tshark") or "/usr/bin/tshark")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="kill a run after this many seconds (default 1800, 0 = never)")
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    formats = [f for f in args.formats.split(",") if f]
    jobs = [int(j) for j in args.jobs.split(",") if j]

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    compile_bytecode()
    cases: list[Case] = []
    if args.file:
        if not args.file.exists():
            ap.error(f"{args.file} does not exist")
        cases.append(Case(args.file.name + (" key log" if args.keylog else ""),
                          args.file.resolve(), args.keylog))
    elif not args.scaling_only:
        wanted = args.cases.split(",")
        if "synthetic" in wanted:
            cases.append(Case("synthetic", ensure_capture(args.packets)))
        if "lab" in wanted or "lab-keys" in wanted:
            keyed = ensure_keyed_capture(args.packets)
            if "lab" in wanted:
                cases.append(Case("lab", keyed))
            if "lab-keys" in wanted:
                cases.append(Case("lab key log", keyed, keyed.with_suffix(".keys")))
    rows = run_matrix(cases, formats, jobs, args, env) if cases else []
    capacity = parallel_capacity() if any(j != 1 for j in jobs) and rows else None
    scaling = (run_scaling(max(1000, args.packets // 16), [1, 4, 16], ["text", "jsonl"], jobs,
                           args, env) if args.scaling or args.scaling_only else [])
    if args.json:
        print(json.dumps({"rows": rows, "scaling": scaling,
                          "verdicts": verdicts(rows, capacity), "parallel_capacity": capacity,
                          "load_average": os.getloadavg(), "cpus": os.cpu_count()}, indent=2))
        return 0
    if rows:
        print_matrix(rows, capacity)
    if scaling:
        print()
        print_scaling(scaling)
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"note: 1-min load average {load:.2f} on {os.cpu_count()} CPUs at the end: other "
              "work inflates wall time; compare CPU s too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
