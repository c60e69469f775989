#!/usr/bin/env python3
"""Fleet benchmark (docs/scale.md): one capture set of rotated files on each executor.

    python benchmarks/fleet.py                        # 2M packets in 20 files; 1, 2, 4 workers
    python benchmarks/fleet.py --packets 200000 --files 10 --workers 1,2
    python benchmarks/fleet.py --tiny 200             # also the per-task overhead of Dask
    python benchmarks/fleet.py --json                 # machine-readable

The set is ``benchmarks/make_big_capture.py --packets N`` cut by packet count into
``--files`` dumpcap-style ring files (``host-a/ring_00001_<time>.pcap``...), written to
``benchmarks/out/`` once and reused. Each row is one ``netdiag report DIR --format json
--no-profile`` in a fresh process: the local executor (``--jobs N``, the fork pool, one
set), and ``--executor dask`` with a local cluster of W single-threaded workers and W
flow shards (``--workers W --jobs W``), cluster start included. Memory is each
process's peak resident set (VmHWM, polled from /proc over the process tree): the
parent (the client) and the largest worker (for the fork pool the parent is shard 0, so
the largest of all). Every row's output is compared with the serial one: the report
must be the same bytes.

The per-task overhead (``--tiny N``): N sets of one tiny file each (a handful of
packets), analyzed by ``run_fleet`` in this process, serially and on an already started
one-worker local cluster; ``(dask - serial) / N`` is what a task costs beyond its work
(submission, scheduling, the round trips, packing and unpacking the records).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"
sys.path.insert(0, str(ROOT))


def big_capture(packets: int) -> Path:
    path = OUT / f"capture-{packets}.pcap"
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_capture.py"),
                        "--packets", str(packets), "--quiet"], check=True)
    return path


def split(src: Path, files: int, hosts: bool = False) -> Path:
    """``src`` cut into ``files`` ring files (records unchanged) under one folder; with
    ``hosts``, each file in a folder of its own (``host-NN/``): as many capture sets."""
    folder = OUT / f"fleet-{src.stem}-x{files}{'-hosts' if hosts else ''}"
    done = folder / ".done"
    if done.exists():
        return folder
    total = json.loads(src.with_name(src.name + ".json").read_text()).get("packets")
    with open(src, "rb") as f:
        header = f.read(24)
        per = -(-int(total) // files) if total else None
        for k in range(files):
            host = folder / (f"host-{k + 1:02d}" if hosts else "host-a")
            host.mkdir(parents=True, exist_ok=True)
            name = host / f"ring_{k + 1:05d}_{20261201090000 + k * 100}.pcap"
            with open(name, "wb") as out:
                out.write(header)
                n = 0
                while per is None or n < per:
                    rec = f.read(16)
                    if len(rec) < 16:
                        break
                    incl = struct.unpack_from("<I", rec, 8)[0]
                    out.write(rec + f.read(incl))
                    n += 1
    done.write_text("")
    return folder


def _hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; wall time, peak RSS of the parent and of its largest descendant,
    and the digest of its standard output."""
    import resource

    import psutil

    out = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    root = psutil.Process(proc.pid)
    peaks: dict[int, int] = {}
    while proc.poll() is None:
        try:
            pids = [proc.pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.Error:
            pids = [proc.pid]
        for pid in pids:
            kb = _hwm_kb(pid)
            if kb is not None:
                peaks[pid] = max(peaks.get(pid, 0), kb)
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err}")
    out.seek(0)
    digest = hashlib.sha256(out.read()).hexdigest()
    out.close()
    parent = peaks.pop(proc.pid, 0)
    workers = max(peaks.values(), default=0)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 1),
            "load": round(os.getloadavg()[0], 1),
            "parent_mb": round(parent / 1024),
            "worker_mb": round(workers / 1024), "processes": 1 + len(peaks),
            "sha256": digest}


def best(cmd: list[str], repeat: int) -> dict[str, Any]:
    """:func:`measure` ``repeat`` times: the run of least wall time, and the most memory."""
    runs = [measure(cmd) for _ in range(max(1, repeat))]
    out = min(runs, key=lambda r: r["wall_s"])
    out["parent_mb"] = max(r["parent_mb"] for r in runs)
    out["worker_mb"] = max(r["worker_mb"] for r in runs)
    assert len({r["sha256"] for r in runs}) == 1, "a run's output differs from the others'"
    return out


def report_cmd(folder: Path, fmt: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "netdiag", "report", str(folder), "--format", fmt,
            "--no-profile", "--no-progress", *extra]


def tiny_overhead(n: int) -> dict[str, Any]:
    """Per-task overhead of Dask on ``n`` one-file sets of a few packets each."""
    from distributed import LocalCluster

    sys.path.insert(0, str(ROOT / "tests"))
    import jobs_capture as gen

    from netdiag.fleet import make_plan
    from netdiag.fleet.engine import FleetOptions, run_fleet
    from netdiag.pipeline import Options
    from netdiag.report.records_out import CollectingSink

    d = Path(tempfile.mkdtemp(prefix="netdiag-tiny-"))
    src = d / "src.pcap"
    gen.write_mixed(src, 2, seed=1)
    data = src.read_bytes()
    names = []
    for i in range(n):
        p = d / f"host-{i:04d}" / "ring_00001.pcap"
        p.parent.mkdir()
        p.write_bytes(data)
        names.append(str(p))
    plan = make_plan(names)
    assert len(plan.sets) == n

    def run(**kw: Any) -> float:
        t0 = time.perf_counter()
        run_fleet(plan, CollectingSink(), Options(), FleetOptions(**kw))
        return time.perf_counter() - t0

    serial = min(run(executor="serial") for _ in range(2))
    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    startup = time.perf_counter() - t0
    try:
        dask = min(run(executor="dask", scheduler=cluster.scheduler_address)
                   for _ in range(2))
    finally:
        cluster.close()
    return {"tasks": n, "serial_s": round(serial, 3), "dask_s": round(dask, 3),
            "overhead_ms_per_task": round((dask - serial) / n * 1000, 2),
            "local_cluster_start_s": round(startup, 2),
            "packets_per_file": len(data) and sum(1 for _ in _records(data))}


def _records(data: bytes) -> Any:
    pos = 24
    while pos + 16 <= len(data):
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
        yield pos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--workers", default="1,2,4", help="Dask worker counts (comma-separated)")
    ap.add_argument("--jobs", default="1,2", help="--jobs values of the local executor")
    ap.add_argument("--tiny", type=int, default=200, help="tasks of the overhead run (0: skip)")
    ap.add_argument("--formats", default="jsonl,json",
                    help="report formats (jsonl: the analysis; json: also paths and the "
                         "document, in the client)")
    ap.add_argument("--layouts", default="set,hosts",
                    help="set: the files as one capture set; hosts: each file its own host")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row (the fastest is kept)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--from-json", type=Path, help="print the table of an earlier --json run")
    args = ap.parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        print_table(data, args.files)
        return 0
    src = big_capture(args.packets)
    rows: list[dict[str, Any]] = []
    size = 0
    for layout in [x for x in args.layouts.split(",") if x]:
        folder = split(src, args.files, hosts=layout == "hosts")
        size = sum(p.stat().st_size for p in folder.rglob("*.pcap"))
        for fmt in [x for x in args.formats.split(",") if x]:
            if layout == "hosts" and fmt == "json":
                continue  # paths over 20 hosts' records: the client's part, measured above
            first = len(rows)
            for jobs in [j for j in args.jobs.split(",") if j]:
                r = best(report_cmd(folder, fmt, "--executor", "local", "--jobs", jobs),
                         args.repeat)
                rows.append({"layout": layout, "format": fmt, "run": f"local --jobs {jobs}",
                             **r})
                print(rows[-1], file=sys.stderr)
            for w in [w for w in args.workers.split(",") if w]:
                extra = ["--jobs", w] if layout == "set" else []
                r = best(report_cmd(folder, fmt, "--executor", "dask", "--workers", w,
                                    *extra), args.repeat)
                rows.append({"layout": layout, "format": fmt,
                             "run": f"dask, {w} worker{'s' if w != '1' else ''}", **r})
                print(rows[-1], file=sys.stderr)
            for r in rows[first:]:
                r["same_report"] = r["sha256"] == rows[first]["sha256"]
    tiny = tiny_overhead(args.tiny) if args.tiny else None
    data = {"packets": args.packets, "files": args.files, "bytes": size,
            "cpus": os.cpu_count(), "rows": rows, "tiny": tiny}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print_table(data, args.files)
    return 0


def print_table(data: dict[str, Any], files: int) -> None:
    """The markdown table of a run (``--json`` gives the same as data)."""
    rows, tiny, size = data["rows"], data["tiny"], data["bytes"]
    print(f"{data['packets']:,} packets in {files} files ({size / 1e6:.0f} MB), "
          f"{data['cpus']} CPUs\n")
    print("| files as | format | run | wall s | CPU s | parent peak MB | largest worker peak MB "
          "| processes | same report | load |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        sets = "1 set" if r["layout"] == "set" else f"{files} sets"
        print(f"| {sets} | {r['format']} | {r['run']} | {r['wall_s']} | {r['cpu_s']} | "
              f"{r['parent_mb']} | "
              f"{r['worker_mb'] or '-'} | {r['processes']} | "
              f"{'yes' if r['same_report'] else 'NO'} | {r['load']} |")
    if tiny:
        print(f"\nDask per-task overhead: {tiny['tasks']} one-file sets of "
              f"{tiny['packets_per_file']} packets: serial {tiny['serial_s']} s, dask (1 worker, "
              f"cluster already up) {tiny['dask_s']} s: {tiny['overhead_ms_per_task']} ms per "
              f"task; starting a 1-worker local cluster: {tiny['local_cluster_start_s']} s")


if __name__ == "__main__":
    sys.exit(main())
