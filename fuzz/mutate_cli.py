"""Whole-file mutation of the shipped capture through ``netdiag report``, every format.

Usage::

    python fuzz/mutate_cli.py [--runs N] [--seed S] [--extra] [--subprocess] [--out DIR]

Each mutant is ``captures/antho.pcapng`` with 1 to 4 random mutations: byte flips, a
truncation, a duplicated block of bytes, or a corrupted length field (a pcapng block
length, an EPB captured length, an option length, an IPv4 total length, a TCP data
offset or a TLS record length inside a packet). It is written as ``antho.pcapng`` next
to a copy of ``antho.paths.toml`` (so the profile is found as it is for the shipped
capture) and run through ``netdiag report`` in every format: ``text``, ``json``,
``jsonl``, ``har``, ``html``, ``csv`` and, where pyarrow is installed, ``parquet`` (each
into a temporary directory), and
``--format jsonl --write-pcapng`` (whose output must then read back undamaged), and with
``--extra`` also ``netdiag paths --connections`` and ``netdiag diff ORIGINAL MUTANT``; every
other mutant with ``--keylog captures/antho.keys`` (one keyed mutant in eight with the
key log mutated too). ``N`` counts these command runs.

A run is a failure when it exits 4, prints a Python traceback, says "please report"
(an analyzer exception that the flow layer turned into a warning), takes more than
``--time-limit`` seconds (30), writes ``json``/``jsonl``/``har`` that is not strict
JSON (NaN, Infinity, not UTF-8), or writes a pcapng that does not read back whole.
Each failure is saved once per site under ``fuzz/crashes/cli/`` (the mutated capture,
the key log when mutated, and a ``.txt`` with the command and its output) and listed
at the end; the exit status is 1 when there was one.

Runs are in-process by default (``netdiag.cli.main`` under click's I/O isolation, with
a SIGALRM time limit, ``NETDIAG_DEBUG=1`` for tracebacks); ``--subprocess`` runs
``python -m netdiag`` instead, one at a time. Failures found in-process are confirmed
in a subprocess on the pure-Python core (``--debug-run ARGS``: the analyzer exceptions
the flow layer catches are printed with their tracebacks) before they are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CAPTURE = ROOT / "captures" / "antho.pcapng"
KEYS = ROOT / "captures" / "antho.keys"
PROFILE = ROOT / "captures" / "antho.paths.toml"
FORMATS = ("text", "json", "jsonl", "har", "html", "csv",
           *(("parquet",) if importlib.util.find_spec("pyarrow") else ()))
"""Every format of ``netdiag report``; Parquet where pyarrow (the ``scale`` extra) is
installed."""
MARKERS = ("Traceback (most recent call last)", "please report")
_TB_SITE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_INTERNAL = re.compile(r"internal error: ([\w.]+)")
_ANALYZER_FAIL = re.compile(r"analyzer failed at packet \d+ \((\w+): ([^)]{0,80})")


class CliTimeout(BaseException):
    """Raised by SIGALRM in an in-process run that took too long (not an Exception, so
    the CLI's own catch-all does not turn it into exit 4)."""


# -- mutations -----------------------------------------------------------------------------

def _length_fields(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, width, what) of the length fields of a little-endian pcapng file."""
    out: list[tuple[int, int, str]] = []
    pos = 0
    n = len(data)
    while pos + 12 <= n:
        btype, blen = struct.unpack_from("<II", data, pos)
        if blen < 12 or blen % 4 or pos + blen > n:
            break
        out.append((pos + 4, 4, "block length"))
        out.append((pos + blen - 4, 4, "trailing block length"))
        body = pos + 8
        if btype == 6 and blen >= 32:  # EPB
            out.append((body + 12, 4, "EPB captured length"))
            out.append((body + 16, 4, "EPB original length"))
            caplen = struct.unpack_from("<I", data, body + 12)[0]
            pkt = body + 20
            _packet_fields(data, pkt, min(caplen, blen - 32), out)
            opts = pkt + caplen + (-caplen % 4)
            _option_fields(data, opts, pos + blen - 4, out)
        elif btype == 1 and blen >= 20:  # IDB
            _option_fields(data, body + 8, pos + blen - 4, out)
        elif btype == 0x0A0D0D0A and blen >= 28:  # SHB
            out.append((body + 8, 8, "SHB section length"))
            _option_fields(data, body + 16, pos + blen - 4, out)
        elif btype == 0x0A and blen >= 20:  # DSB
            out.append((body + 4, 4, "DSB secrets length"))
        pos += blen
    return out


def _option_fields(data: bytes, pos: int, end: int, out: list[tuple[int, int, str]]) -> None:
    while pos + 4 <= end:
        code, olen = struct.unpack_from("<HH", data, pos)
        out.append((pos + 2, 2, "option length"))
        if code == 0:
            break
        pos += 4 + olen + (-olen % 4)


def _packet_fields(data: bytes, pkt: int, caplen: int, out: list[tuple[int, int, str]]
                   ) -> None:
    """IPv4 total length, TCP data offset and TLS record lengths of an Ethernet frame."""
    if caplen < 34 or data[pkt + 12:pkt + 14] != b"\x08\x00":
        return
    ip = pkt + 14
    out.append((ip + 2, 2, "IPv4 total length"))
    ihl = (data[ip] & 15) * 4
    if data[ip + 9] != 6 or caplen < 14 + ihl + 20:
        return
    tcp = ip + ihl
    out.append((tcp + 12, 1, "TCP data offset"))
    payload = tcp + (data[tcp + 12] >> 4) * 4
    end = pkt + caplen
    p = payload
    while p + 5 <= end and data[p] in (20, 21, 22, 23) and data[p + 1] == 3:
        out.append((p + 3, 2, "TLS record length"))
        p += 5 + struct.unpack_from(">H", data, p + 3)[0]


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """``data`` with 1 to 4 random mutations, and what they were."""
    buf = bytearray(data)
    done: list[str] = []
    for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
        kind = rng.choice(("flip", "flip", "length", "length", "length", "dup", "truncate"))
        if not buf:
            break
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(buf))
                if rng.random() < 0.5:
                    buf[i] ^= 1 << rng.randrange(8)
                else:
                    buf[i] = rng.randrange(256)
            done.append("flip")
        elif kind == "truncate":
            at = rng.randrange(len(buf))
            del buf[at:]
            done.append(f"truncate@{at}")
        elif kind == "dup":
            a = rng.randrange(len(buf))
            n = min(rng.choice((4, 16, 64, 512, 4096)), len(buf) - a)
            b = rng.randrange(len(buf) + 1)
            buf[b:b] = buf[a:a + n]
            done.append(f"dup {n}@{a}->{b}")
        else:
            fields = _length_fields(bytes(buf))
            if not fields:
                continue
            off, width, what = rng.choice(fields)
            old = int.from_bytes(buf[off:off + width],
                                 "big" if what.startswith(("IPv4", "TCP", "TLS")) else "little")
            top = (1 << (8 * width)) - 1
            new = rng.choice((0, 1, top, top >> 1, max(old - rng.randint(1, 16), 0),
                              min(old + rng.randint(1, 16), top), rng.randrange(top + 1)))
            order = "big" if what.startswith(("IPv4", "TCP", "TLS")) else "little"
            buf[off:off + width] = new.to_bytes(width, order)
            done.append(f"{what}@{off}={new}")
    return bytes(buf), done


def mutate_keys(data: bytes, rng: random.Random) -> bytes:
    """A key log with a line dropped, duplicated, cut or with a flipped character."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    k = rng.randrange(4)
    if k == 0:
        del lines[i]
    elif k == 1:
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
    elif k == 2:
        lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)]
    elif lines[i]:
        j = rng.randrange(len(lines[i]))
        lines[i] = lines[i][:j] + bytes([rng.randrange(256)]) + lines[i][j + 1:]
    return b"\n".join(lines)


# -- running -------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float
    timed_out: bool = False
    failure_tb: list[str] = field(default_factory=list)
    """Tracebacks of analyzer exceptions the flow layer caught (in-process only)."""


_caught: list[str] = []


def _patch_flow_failures() -> None:
    """Keep the traceback of each analyzer exception ``TcpFlow`` catches (in-process)."""
    from netdiag.flows import tcp

    orig = tcp.TcpFlow._failed

    def failed(self: object, e: Exception, pkt: int) -> None:
        _caught.append("".join(traceback.format_exception(e)))
        orig(self, e, pkt)  # type: ignore[arg-type]

    # a compiled core ignores the patch: the confirming --debug-run gives the traceback
    with contextlib.suppress(TypeError, AttributeError):
        tcp.TcpFlow._failed = failed  # type: ignore[method-assign]


def _alarm(_sig: int, _frame: object) -> None:
    raise CliTimeout


def run_inprocess(args: list[str], limit: float) -> Outcome:
    from click.testing import CliRunner

    from netdiag import cli, quick_exit

    # a finished report ends its process at once (netdiag.quick_exit): here it would end
    # this one, after the first report, with exit status 0 and nothing listed
    quick_exit.allow = lambda: None
    runner = CliRunner()
    del _caught[:]
    t0 = time.perf_counter()
    timed_out = False
    code = 0
    with runner.isolation(env={"NETDIAG_DEBUG": "1", "SSLKEYLOGFILE": None}) as (out, err, _):
        old_argv = sys.argv
        sys.argv = ["netdiag", *args]
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except CliTimeout:
            timed_out = True
            code = -1
        except BaseException:  # what main() let through: a bug too
            err.write(traceback.format_exc().encode())
            code = 4
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.argv = old_argv
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    return Outcome(code, stdout, stderr, time.perf_counter() - t0, timed_out, list(_caught))


def debug_run(args: list[str]) -> None:
    """``netdiag ARGS`` on the pure-Python core, printing the traceback of every analyzer
    exception the flow layer catches (``--debug-run``: how a failure is confirmed)."""
    os.environ["NETDIAG_CORE"] = "python"
    os.environ["NETDIAG_DEBUG"] = "1"
    _patch_flow_failures()
    from netdiag import cli

    sys.argv = ["netdiag", *args]
    try:
        cli.main()
    finally:
        for tb in _caught:
            sys.stderr.write("analyzer exception caught by the flow layer:\n" + tb)


def run_subprocess(args: list[str], limit: float, debug: bool = False) -> Outcome:
    env = dict(os.environ, NETDIAG_DEBUG="1", PYTHONPATH=str(ROOT))
    env.pop("SSLKEYLOGFILE", None)
    t0 = time.perf_counter()
    cmd = ([sys.executable, str(Path(__file__).resolve()), "--debug-run", *args] if debug
           else [sys.executable, "-m", "netdiag", *args])
    try:
        p = subprocess.run(cmd, capture_output=True,
                           text=True, errors="replace", timeout=limit, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
        err = e.stderr if isinstance(e.stderr, str) else (e.stderr or b"").decode()
        return Outcome(-1, out, err, time.perf_counter() - t0, True)
    caught = p.stderr.split("analyzer exception caught by the flow layer:\n")[1:]
    return Outcome(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0,
                   failure_tb=caught)


def _files_text(d: Path) -> str:
    parts = []
    for f in sorted(d.rglob("*")):
        if f.is_file() and f.suffix in (".txt", ".json", ".jsonl", ".har", ".html", ".csv"):
            parts.append(f.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def problems(o: Outcome, outdir: Path, limit: float) -> list[tuple[str, str]]:
    """(site, detail) of everything wrong with one run."""
    found: list[tuple[str, str]] = []
    text = o.out + "\n" + o.err + "\n" + _files_text(outdir)
    if o.timed_out or o.seconds > limit:
        found.append(("timeout", f"took {o.seconds:.1f} s"))
    if o.code == 4 or "Traceback (most recent call last)" in text:
        sites = _TB_SITE.findall(o.err + o.out)
        ours = [s for s in sites if f"{os.sep}netdiag{os.sep}" in s[0]]
        last = (ours or sites or [("?", "?", "?")])[-1]
        m = _INTERNAL.search(o.err)
        etype = m.group(1) if m else "?"
        site = f"exit{o.code}:{etype}@{os.path.relpath(last[0], ROOT)}:{last[1]}"
        found.append((site, "\n".join((o.err + o.out).splitlines()[-25:])))
    if "please report" in text and o.code != 4:
        for tb in o.failure_tb or [""]:
            sites = _TB_SITE.findall(tb)
            ours = [s for s in sites if f"{os.sep}netdiag{os.sep}" in s[0]]
            if ours:
                etype = tb.strip().splitlines()[-1].split(":")[0]
                site = f"analyzer:{etype}@{os.path.relpath(ours[-1][0], ROOT)}:{ours[-1][1]}"
                found.append((site, tb))
            else:
                m = _ANALYZER_FAIL.search(text)
                found.append((f"analyzer:{m.group(1) if m else '?'}",
                              m.group(0) if m else "please report"))
    return found


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def check_json(path: Path, lines: bool) -> str | None:
    """Why a ``json``/``har`` (or, ``lines``, ``jsonl``) output is not strict JSON, or None."""
    import json

    if not path.exists():
        return "no output file"
    text = path.read_text(encoding="utf-8", errors="strict")
    try:
        for chunk in (text.splitlines() if lines else [text]):
            json.loads(chunk, parse_constant=_no_constant)
    except ValueError as e:
        return f"{type(e).__name__}: {e}"
    return None


def check_pcapng(path: Path) -> str | None:
    """Why a pcapng written by --write-pcapng does not read back whole, or None."""
    from netdiag.capture.reader import CaptureReader
    from netdiag.errors import InputError

    if not path.exists():
        return None
    try:
        with CaptureReader(path) as r:
            for _ in r.packets():
                pass
            if r.truncated or r.warnings:
                return "; ".join(w.message for w in r.warnings) or "truncated"
    except InputError as e:
        return f"InputError: {e}"
    return None


def commands(cap: Path, keys: Path | None, work: Path, extra: bool = False
             ) -> list[tuple[str, list[str]]]:
    """The runs of one mutant: ``report`` in every format and ``--write-pcapng``; with
    ``extra`` also ``paths --connections`` and ``diff ORIGINAL MUTANT`` (JSON)."""
    base = ["report", str(cap), "--no-progress"]
    if keys is not None:
        base += ["--keylog", str(keys)]
    cmds = []
    for fmt in FORMATS:
        target = work / (fmt if fmt in ("csv", "parquet") else f"out.{fmt}")
        cmds.append((fmt, [*base, "--format", fmt, "-o", str(target)]))
    cmds.append(("write-pcapng", [*base, "--format", "jsonl", "-o", str(work / "wp.jsonl"),
                                  "--write-pcapng", str(work / "out.pcapng")]))
    if extra:
        keys_args = base[3:]
        cmds.append(("paths", ["paths", str(cap), "--connections", "--format", "json",
                               "-o", str(work / "paths.json"), *keys_args]))
        cmds.append(("diff", ["diff", str(CAPTURE), str(cap), "--format", "json",
                              "-o", str(work / "diff.json"), *keys_args]))
    return cmds


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--debug-run":
        debug_run(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1500,
                    help="command runs (8 per mutant with pyarrow, else 7)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--subprocess", action="store_true", help="python -m netdiag per run")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--extra", action="store_true",
                    help="also netdiag paths and netdiag diff (2 runs more per mutant)")
    ap.add_argument("--out", default=str(ROOT / "fuzz" / "crashes" / "cli"))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner: Callable[[list[str], float], Outcome]
    if args.subprocess:
        runner = run_subprocess
    else:
        _patch_flow_failures()
        runner = run_inprocess
    original = CAPTURE.read_bytes()
    keys_bytes = KEYS.read_bytes()
    rng = random.Random(args.seed)
    sites: dict[str, Path] = {}
    runs = 0
    mutants = 0
    codes: dict[int, int] = {}
    slowest = 0.0
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="netdiag-mutate-") as tmp:
        while runs < args.runs:
            mutants += 1
            data, how = mutate(original, rng)
            keyed = mutants % 2 == 0
            bad_keys = keyed and rng.random() < 0.125
            work = Path(tmp) / f"m{mutants}"
            work.mkdir()
            cap = work / "antho.pcapng"
            cap.write_bytes(data)
            shutil.copy(PROFILE, work / "antho.paths.toml")
            keys: Path | None = None
            if keyed:
                keys = work / "antho.keys"
                keys.write_bytes(mutate_keys(keys_bytes, rng) if bad_keys else keys_bytes)
            for fmt, cmd in commands(cap, keys, work / "o", args.extra):
                if runs >= args.runs:
                    break
                outdir = work / "o"
                shutil.rmtree(outdir, ignore_errors=True)
                outdir.mkdir()
                o = runner(cmd, args.time_limit)
                runs += 1
                codes[o.code] = codes.get(o.code, 0) + 1
                slowest = max(slowest, o.seconds)
                found = problems(o, outdir, args.time_limit)
                if fmt == "write-pcapng" and o.code in (0, 3):
                    why = check_pcapng(outdir / "out.pcapng")
                    if why is not None:
                        found.append(("pcapng-readback", why))
                if fmt in ("json", "jsonl", "har", "paths", "diff") and o.code in (0, 3):
                    fname = {"paths": "paths.json", "diff": "diff.json"}.get(fmt, f"out.{fmt}")
                    try:
                        why = check_json(outdir / fname, fmt == "jsonl")
                    except UnicodeDecodeError as e:
                        why = f"not UTF-8: {e}"
                    if why is not None:
                        found.append((f"invalid-{fmt}", why))
                for site, detail in found:
                    if site in sites:
                        continue
                    if site != "timeout":
                        confirm = run_subprocess(cmd, args.time_limit * 2, debug=True)
                        again = problems(confirm, outdir, args.time_limit * 2)
                        if again and again[0][0].startswith("analyzer:") and not o.failure_tb:
                            site, detail = again[0]  # the site, from the pure-Python core
                            if site in sites:
                                continue
                        detail += (f"\n\n-- again in a subprocess (pure-Python core): exit "
                                   f"{confirm.code}\n"
                                   + "\n".join(confirm.err.splitlines()[-30:]))
                    h = hashlib.sha1(data).hexdigest()[:12]
                    name = re.sub(r"[^A-Za-z0-9_.@-]+", "_", site)[:90]
                    rep = out_dir / f"{name}-{h}.pcapng"
                    rep.write_bytes(data)
                    if bad_keys and keys is not None:
                        rep.with_suffix(".keys").write_bytes(keys.read_bytes())
                    shown = " ".join(c.replace(str(cap), str(rep)) for c in cmd)
                    rep.with_suffix(".txt").write_text(
                        f"site: {site}\nformat: {fmt}\nmutations: {how}\n"
                        f"command: netdiag {shown}\nexit: {o.code}  seconds: {o.seconds:.2f}"
                        f"\n\n{detail}\n", encoding="utf-8")
                    sites[site] = rep
                    print(f"[run {runs}] NEW {site} ({fmt}; {', '.join(how)}) -> {rep}",
                          flush=True)
            shutil.rmtree(work, ignore_errors=True)
            if mutants % 25 == 0:
                print(f"[{time.perf_counter() - t_start:.0f} s] {runs} runs, {mutants} "
                      f"mutants, exit codes {dict(sorted(codes.items()))}, "
                      f"{len(sites)} failure site(s)", flush=True)
    print(f"done: {runs} runs of {mutants} mutants in {time.perf_counter() - t_start:.0f} s "
          f"(slowest {slowest:.1f} s); exit codes {dict(sorted(codes.items()))}; "
          f"{len(sites)} failure site(s)")
    for site, rep in sites.items():
        print(f"  {site}: {rep}")
    return 1 if sites else 0


if __name__ == "__main__":
    sys.exit(main())
