#!/usr/bin/env python3
"""Hostile traffic shapes at growing sizes: is netdiag's time linear in packets?

    python benchmarks/hostile.py                 # every shape at 1x, 4x, 16x (1x: 25k packets)
    python benchmarks/hostile.py --base 100000 --shapes h2,frag
    python benchmarks/hostile.py --netdiag-cmd "python -m netdiag" --json

Each shape of ``hostile_shapes.py`` (issue 11: HTTP/2 with thousands of streams and
repeated SETTINGS, incomplete IP fragments, pipelined unanswered HTTP/1.1 requests,
with and without Upgrade, many TCP connections, many servers; and, for memory,
out-of-order segments past a hole that is never filled (``ooo``), half-open connections
carrying data (``halfopen``) and a flood of mostly unanswered DNS queries (``dns``)) is
written at each size into a temporary directory, then ``netdiag report FILE --format
json`` and ``--format jsonl`` run on it in a child process each (output to /dev/null),
in one process (``NETDIAG_JOBS=1`` unless set: the peak RSS the kernel reports for the
child is then the whole run's). The table gives wall seconds per 100k packets for each
shape and size, after subtracting the start-up time (a report on a one-packet capture,
best of three): linear time shows as a flat row, and the ``16x/1x`` column is the 16x
figure over the 1x one (about 1.0 when linear). The last column, the peak RSS at the
largest size, is the one to watch for the memory shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hostile_shapes  # noqa: E402

DEFAULT_BASE = 25_000
"""Packets of the 1x size (the whole default run stays within about five minutes on two
shared cores)."""
DEFAULT_SIZES = (1, 4, 16)
FORMATS = ("text", "json", "jsonl", "html")
"""The terminal report (what users run), the collecting and the streaming document, and
the page: each shows paths its own way (the terminal and the page once grew with the
square of the servers where JSON did not)."""


def netdiag_cmd(override: str | None) -> list[str]:
    """How to start netdiag: ``override``, the console script next to this interpreter,
    ``netdiag`` on PATH, or ``python -m netdiag`` from this checkout."""
    if override:
        return shlex.split(override)
    exe = Path(sys.executable).with_name("netdiag")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("netdiag")
    return [found] if found else [sys.executable, "-m", "netdiag"]


def run_report(cmd: list[str], capture: Path, fmt: str, timeout: float) -> dict[str, Any]:
    """One ``netdiag report`` in a child: wall and CPU seconds, peak RSS, exit code."""
    argv = [*cmd, "report", str(capture), "--format", fmt, "-o", os.devnull]
    env = dict(os.environ)
    env.setdefault("NETDIAG_JOBS", "1")  # one process: its peak RSS is the whole run's
    if cmd[1:] == ["-m", "netdiag"] and "PYTHONPATH" not in env:
        env["PYTHONPATH"] = str(HERE.parent)  # this checkout
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = start + timeout
    status = 0
    rusage = None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            return {"wall_s": wall, "cpu_s": None, "rss_mib": None, "rc": "timeout",
                    "stderr": ""}
        time.sleep(0.01)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "cpu_s": rusage.ru_utime + rusage.ru_stime,
            "rss_mib": rusage.ru_maxrss / 1024, "rc": proc.returncode,
            "stderr": stderr.strip().splitlines()[-1:] if proc.returncode else []}


def measure_startup(cmd: list[str], out_dir: Path, formats: list[str],
                    timeout: float) -> dict[str, float]:
    """Wall seconds of a report on a one-packet capture, per format (best of three)."""
    path = out_dir / "one-packet.pcap"
    cap = hostile_shapes.Pcap(path)
    cap.add(0, hostile_shapes.ipv4(hostile_shapes.ip4(1), hostile_shapes.ip4(2), 17,
                                   hostile_shapes.UDP_HDR.pack(1000, 2000, 8, 0)))
    cap.close()
    return {fmt: min(run_report(cmd, path, fmt, timeout)["wall_s"] for _ in range(3))
            for fmt in formats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=int, default=DEFAULT_BASE, help="packets of the 1x size")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                    help="multiples of --base (default 1,4,16)")
    ap.add_argument("--shapes", default=",".join(hostile_shapes.SHAPES),
                    help="comma-separated, of: " + ", ".join(hostile_shapes.SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--netdiag-cmd", help="command that starts netdiag (default: see source)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per report run")
    ap.add_argument("--keep", metavar="DIR", help="write the captures here and keep them")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)

    sizes = [int(x) for x in args.sizes.split(",") if x]
    shapes = [s for s in args.shapes.split(",") if s]
    formats = [f for f in args.formats.split(",") if f]
    unknown = [s for s in shapes if s not in hostile_shapes.SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}")
    cmd = netdiag_cmd(args.netdiag_cmd)
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="netdiag-hostile-")
    out_dir = Path(args.keep) if args.keep else Path(tmp.name)  # type: ignore[union-attr]
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        startup = measure_startup(cmd, out_dir, formats, args.timeout)
        print("start-up: " + ", ".join(f"{f} {t:.2f} s" for f, t in startup.items()),
              file=sys.stderr)
        for shape in shapes:
            for size in sizes:
                path = out_dir / f"{shape}-{size}x.pcap"
                t0 = time.perf_counter()
                packets, facts = hostile_shapes.write(shape, args.base * size, path)
                gen_s = time.perf_counter() - t0
                row: dict[str, Any] = {"shape": shape, "size": size, "packets": packets,
                                       "facts": facts, "gen_s": gen_s,
                                       "bytes": path.stat().st_size}
                for fmt in formats:
                    r = run_report(cmd, path, fmt, args.timeout)
                    r["s_per_100k"] = max(r["wall_s"] - startup[fmt], 0.0) * 100_000 / packets
                    row[fmt] = r
                    print(f"  {shape:8} {size:>3}x {packets:>9,} pkts  {fmt:5} "
                          f"{r['wall_s']:7.2f} s  {r['s_per_100k']:6.2f} s/100k  "
                          f"rc={r['rc']}", file=sys.stderr, flush=True)
                results.append(row)
                if not args.keep:
                    path.unlink()
    finally:
        if tmp is not None:
            tmp.cleanup()
    total = time.perf_counter() - started
    print_table(results, args.base, sizes, formats)
    print(f"\ntotal {total:.0f} s; 1x = {args.base:,} packets; start-up subtracted: "
          + ", ".join(f"{f} {t:.2f} s" for f, t in startup.items())
          + f"; netdiag: {shlex.join(cmd)}")
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"note: 1-minute load average {load:.1f} on {os.cpu_count()} cores: wall times "
              f"include waiting for the CPU (compare the CPU seconds in --json)")
    if args.json:
        print(json.dumps(results, indent=2))
    failed = [r for r in results for f in formats if f in r and r[f]["rc"] != 0]
    return 1 if failed else 0


def print_table(results: list[dict[str, Any]], base: int, sizes: list[int],
                formats: list[str]) -> None:
    """Seconds per 100k packets, one row per shape and format, one column per size."""
    head = (["shape", "format"] + [f"{s}x s/100k pkts" for s in sizes]
            + [f"{sizes[-1]}x/{sizes[0]}x", f"{sizes[-1]}x wall s", f"{sizes[-1]}x MiB"])
    rows: list[list[str]] = []
    by = {(r["shape"], r["size"]): r for r in results}
    for shape in dict.fromkeys(r["shape"] for r in results):
        for fmt in formats:
            cells = [by.get((shape, s), {}).get(fmt) for s in sizes]
            if not any(cells):
                continue
            line = [shape, fmt]
            for c in cells:
                line.append("-" if c is None else
                            "timeout" if c["rc"] == "timeout" else f"{c['s_per_100k']:.2f}")
            first, last = cells[0], cells[-1]
            ok = first and last and first["rc"] == 0 and last["rc"] == 0
            line.append(f"{last['s_per_100k'] / first['s_per_100k']:.2f}" if ok else "-")
            line.append(f"{last['wall_s']:.1f}" if last else "-")
            line.append(f"{last['rss_mib']:.0f}" if last and last["rss_mib"] else "-")
            rows.append(line)
    packets = ["~packets", ""] + [f"{base * s:,}" for s in sizes] + ["", "", ""]
    table = [head, packets, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    print()
    for i, r in enumerate(table):
        print("  ".join(c.rjust(w) if j >= 2 else c.ljust(w) for j, (c, w) in
                        enumerate(zip(r, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    sys.exit(main())
