#!/usr/bin/env python3
"""Measure netdiag against tshark on a large capture: wall time, packets/s, peak memory.

    python benchmarks/bench.py                     # 1M packets, builds the capture if missing
    python benchmarks/bench.py --packets 200000 --repeat 3
    python benchmarks/bench.py --file some.pcap --skip-tshark --json

Each tool runs in its own child process; the child is reaped with ``os.wait4``, whose
rusage belongs to that child alone (and to the processes it reaped), so ``ru_maxrss`` is
the exact peak RSS of the largest single process. Because netdiag may fan out to worker
processes, the process tree is also sampled every 20 ms (sum of PSS over the tree from
/proc); the reported peak is the larger of the two figures.

Targets: netdiag at least 3x faster than tshark, at most 1/5 of its peak memory.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"

SPEED_TARGET = 3.0  # tshark_time / netdiag_time must be at least this
MEMORY_TARGET = 0.2  # netdiag_rss / tshark_rss must be at most this

TSHARK_FIELDS = [
    "frame.time_epoch", "tcp.stream", "tcp.analysis.initial_rtt",
    "tcp.analysis.retransmission", "dns.id", "dns.time", "dns.qry.name",
    "tls.handshake.type", "tls.handshake.extensions_server_name",
    "tls.handshake.extensions_alpn_str", "tls.handshake.extensions.supported_version",
    "tls.handshake.ciphersuite", "tls.record.content_type",
]


def tshark_cmd(tshark: str, capture: Path) -> list[str]:
    cmd = [tshark, "-2", "-n", "-r", str(capture), "-o", "tcp.reassemble_out_of_order:TRUE",
           "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|"]
    for field in TSHARK_FIELDS:
        cmd += ["-e", field]
    return cmd


def netdiag_cmd(override: str | None, capture: Path) -> list[str]:
    if override:
        base = shlex.split(override)
    elif (exe := Path(sys.executable).with_name("netdiag")).exists():
        base = [str(exe)]  # the console script next to this interpreter (not a pyenv shim)
    elif exe := shutil.which("netdiag"):
        base = [exe]
    else:
        base = [sys.executable, "-m", "netdiag"]
    return [*base, "report", str(capture), "--format", "jsonl"]


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
# Report
# ---------------------------------------------------------------------------


def compare(nd: dict | None, ts: dict | None) -> dict:
    if not (nd and ts and nd.get("ok") and ts.get("ok")):
        return {}
    speed = ts["wall_s"] / nd["wall_s"] if nd["wall_s"] else float("inf")
    memory = nd["peak_rss_mib"] / ts["peak_rss_mib"] if ts["peak_rss_mib"] else float("inf")
    return {
        "speed_ratio": round(speed, 2),
        "cpu_ratio": round(ts["cpu_s"] / nd["cpu_s"], 2) if nd["cpu_s"] else None,
        "memory_ratio": round(memory, 3),
        "speed_target": SPEED_TARGET,
        "memory_target": MEMORY_TARGET,
        "speed_met": speed >= SPEED_TARGET,
        "memory_met": memory <= MEMORY_TARGET,
    }


def print_table(capture: dict, results: list[dict], ratios: dict) -> None:
    print(f"capture: {capture['path']}  ({capture['packets']:,} packets, "
          f"{capture['size_mb']} MB)")
    meta = capture.get("meta")
    if meta:
        print(f"         {meta.get('connections', '?')} TCP/TLS connections "
              f"(median {meta.get('median_concurrent_connections', '?')}, "
              f"peak {meta.get('max_concurrent_connections', '?')} open), "
              f"{meta.get('dns_packets', '?')} DNS packets, "
              f"{meta.get('duration_s', '?')} s of traffic")
    header = (f"{'tool':<9} {'packets':>10} {'wall s':>8} {'packets/s':>11} "
              f"{'peak RSS MiB':>13} {'anon MiB':>9} {'CPU s':>7}  status")
    print(header)
    print("-" * len(header))
    for r in results:
        if r.get("ok"):
            print(f"{r['tool']:<9} {r['packets']:>10,} {r['wall_s']:>8.2f} "
                  f"{r['packets_per_s']:>11,} {r['peak_rss_mib']:>13.1f} "
                  f"{r['sampled_anon_peak_mib']:>9.1f} {r['cpu_s']:>7.2f}  ok")
        else:
            status = (f"FAILED (exit {r['exit_code']})" if "exit_code" in r
                      else "FAILED to start")
            print(f"{r['tool']:<9} {r.get('packets', 0):>10,} {'-':>8} {'-':>11} {'-':>13} "
                  f"{'-':>9} {'-':>7}  {status}")
    if ratios:
        def verdict(met: bool) -> str:
            return "MET" if met else "NOT MET"

        print(f"speed ratio  (tshark time / netdiag time): {ratios['speed_ratio']:6.2f}x   "
              f"target >= {SPEED_TARGET:g}x   {verdict(ratios['speed_met'])}")
        print(f"memory ratio (netdiag RSS / tshark RSS):   {ratios['memory_ratio']:6.3f}    "
              f"target <= {MEMORY_TARGET:g} (1/5)  {verdict(ratios['memory_met'])}")
        if ratios.get("cpu_ratio") is not None:
            print(f"CPU ratio    (tshark CPU / netdiag CPU):   {ratios['cpu_ratio']:6.2f}x   "
                  "(informative: insensitive to other load on the machine)")
    else:
        print("ratios: n/a (need successful netdiag and tshark runs)")
    busy = [r for r in results if r.get("ok") and r.get("load_avg_1m", 0) > 1.5]
    for r in busy:
        print(f"note: 1-min load average {r['load_avg_1m']:.2f} at the end of the {r['tool']} "
              f"run on {os.cpu_count()} CPUs (the run itself counts ~1): other work on the "
              "machine inflates wall time; compare CPU s too")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=1_000_000,
                    help="size of the generated capture (default 1,000,000)")
    ap.add_argument("--file", type=Path, help="benchmark this existing capture instead")
    ap.add_argument("--repeat", type=int, default=1, help="take the best of N runs per tool")
    ap.add_argument("--skip-tshark", action="store_true")
    ap.add_argument("--skip-netdiag", action="store_true")
    ap.add_argument("--netdiag-cmd", help="netdiag command prefix (default: `netdiag` on "
                    "PATH, else `python -m netdiag` from this checkout)")
    ap.add_argument("--tshark", default=shutil.which("tshark") or "/usr/bin/tshark")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="kill a run after this many seconds (default 1800, 0 = never)")
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON only")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    capture_path = args.file.resolve() if args.file else ensure_capture(args.packets)
    if not capture_path.exists():
        ap.error(f"{capture_path} does not exist")
    packets = count_packets(capture_path)
    capture = {"path": str(capture_path), "packets": packets,
               "size_mb": round(capture_path.stat().st_size / 1e6, 1)}
    meta_path = capture_path.with_name(capture_path.name + ".json")
    if meta_path.exists():
        with contextlib.suppress(ValueError):
            capture["meta"] = json.loads(meta_path.read_text())
    warm_page_cache(capture_path)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    jobs: list[tuple[str, list[str], dict | None]] = []
    if not args.skip_netdiag:
        jobs.append(("netdiag", netdiag_cmd(args.netdiag_cmd, capture_path), env))
    if not args.skip_tshark:
        jobs.append(("tshark", tshark_cmd(args.tshark, capture_path), None))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in jobs}
    for _ in range(args.repeat):  # alternate the tools so that drifting load hits both
        for name, cmd, job_env in jobs:
            if runs[name] and not runs[name][-1].get("ok"):
                continue  # a tool that failed once is not retried
            runs[name].append(measure(name, cmd, packets, job_env, args.timeout))
    results = [best_of(r) for r in runs.values()]
    by_tool = {r["tool"]: r for r in results}
    ratios = compare(by_tool.get("netdiag"), by_tool.get("tshark"))

    if args.json:
        print(json.dumps({"capture": capture, "results": by_tool, "ratios": ratios,
                          "load_average": os.getloadavg()}, indent=2))
    else:
        print_table(capture, results, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
