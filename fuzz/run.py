"""Run one fuzz target under atheris (libFuzzer), or replay files through it.

Usage::

    python fuzz/run.py TARGET [--keep-going] [CORPUS_DIR...] [-libfuzzer_flag=value...]
    python fuzz/run.py --replay TARGET FILE_OR_DIR...

Without a corpus directory, ``fuzz/corpus/TARGET`` is used (``fuzz/make_seeds.py``
fills it). Unless given, ``-timeout=10`` (seconds per input), ``-rss_limit_mb=1024``,
``-max_len`` (:data:`MAX_LEN`) and ``-artifact_prefix=fuzz/crashes/TARGET/`` are added.
netdiag's pure-Python core is used (``NETDIAG_CORE=python``), since atheris instruments
Python bytecode only; every module loaded when fuzzing starts is instrumented
(``atheris.instrument_all``). Targets listed in ``fuzz/mutators.py`` (``diff``) get a
structure-aware custom mutator.

``--keep-going`` (as ``scripts/fuzz.sh`` runs it) records each exception in the
target instead of stopping at the first: the first input per crash site (exception
type and innermost netdiag frame) is saved in ``fuzz/crashes/TARGET/`` as
``crash-SITE`` with its traceback in ``crash-SITE.txt``, and fuzzing goes on.
Time-outs and memory blow-ups still stop libFuzzer (its ``timeout-``/``oom-`` files).

``--replay`` needs no atheris: each file goes through the plain target function, and
a failure prints its traceback (exit status 1 when any failed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("NETDIAG_CORE", "python")

DEFAULTS = {"-timeout": "10", "-rss_limit_mb": "1024"}
MAX_LEN = {"profile": 8192, "keylog": 16384, "sse": 16384, "dns": 16384, "resp": 32768}
"""``-max_len`` where the seeds are small (libFuzzer's default is the largest seed): room
for deep nesting, long numbers and long lines; 65536 for the other targets."""


def _files(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in args:
        p = Path(a)
        out.extend(sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p])
    return out


def replay(target: str, args: list[str]) -> int:
    """Run every file of ``args`` through ``target``; 1 when one raised."""
    from fuzz.targets import TARGETS

    fn = TARGETS[target]
    failed = 0
    for f in _files(args):
        t0 = time.perf_counter()
        try:
            fn(f.read_bytes())
            status = "ok"
        except Exception:
            failed += 1
            status = "FAILED"
            traceback.print_exc()
        print(f"{status} {f} ({time.perf_counter() - t0:.3f} s)", flush=True)
    return 1 if failed else 0


def crash_site(e: BaseException) -> str:
    """``Type@file:line`` of the innermost frame of ``e`` in netdiag (else the last one)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if f"{os.sep}netdiag{os.sep}" in f.filename]
    f = (ours or frames)[-1] if (ours or frames) else None
    where = "?" if f is None else f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}"
    return f"{type(e).__name__}@{where}"


def keep_going(target: str, fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``fn``, recording every exception by crash site instead of raising it."""
    crashes = ROOT / "fuzz" / "crashes" / target
    crashes.mkdir(parents=True, exist_ok=True)
    seen: set[str] = {p.name[len("crash-"):] for p in crashes.glob("crash-*")
                      if not p.name.endswith(".txt")}

    def wrapped(data: bytes) -> None:
        try:
            fn(data)
        except Exception as e:
            site = crash_site(e)
            name = "".join(c if c.isalnum() or c in "._-@" else "_" for c in site)
            if name in seen:
                return
            seen.add(name)
            (crashes / f"crash-{name}").write_bytes(data)
            (crashes / f"crash-{name}.txt").write_text(
                "".join(traceback.format_exception(e)), encoding="utf-8")
            print(f"\n==== new crash site {site} ({len(data)} bytes) -> "
                  f"{crashes / ('crash-' + name)}", file=sys.stderr, flush=True)

    return wrapped


def warm_up(target: str) -> None:
    """Import everything the target reaches (so it is instrumented): one call per seed."""
    from fuzz.targets import TARGETS

    fn = TARGETS[target]
    corpus = ROOT / "fuzz" / "corpus" / target
    seeds = sorted(corpus.iterdir())[:20] if corpus.is_dir() else []
    for data in [*(f.read_bytes() for f in seeds), b""]:
        with contextlib.suppress(Exception):
            fn(data)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--replay":
        if len(argv) < 4:
            print(__doc__, file=sys.stderr)
            return 2
        return replay(argv[2], argv[3:])
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    target = argv[1]
    from fuzz.targets import TARGETS

    if target not in TARGETS:
        print(f"unknown target {target}; one of: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    import atheris

    rest = argv[2:]
    going = "--keep-going" in rest
    rest = [a for a in rest if a != "--keep-going"]
    flags = [a for a in rest if a.startswith("-")]
    dirs = [a for a in rest if not a.startswith("-")]
    if not dirs:
        corpus = ROOT / "fuzz" / "corpus" / target
        corpus.mkdir(parents=True, exist_ok=True)
        dirs = [str(corpus)]
    given = {f.split("=", 1)[0] for f in flags}
    for k, v in {**DEFAULTS, "-max_len": str(MAX_LEN.get(target, 65536))}.items():
        if k not in given:
            flags.append(f"{k}={v}")
    if "-artifact_prefix" not in given:
        crashes = ROOT / "fuzz" / "crashes" / target
        crashes.mkdir(parents=True, exist_ok=True)
        flags.append(f"-artifact_prefix={crashes}/")
    warm_up(target)
    fn = keep_going(target, TARGETS[target]) if going else TARGETS[target]
    from fuzz.mutators import MUTATORS

    extra = {}
    structured = MUTATORS.get(target)
    if structured is not None:
        def mutator(data: bytes, max_size: int, seed: int) -> bytes:
            return structured(data, max_size, seed, atheris.Mutate)

        extra["custom_mutator"] = mutator
    atheris.instrument_all()
    atheris.Setup([argv[0], *flags, *dirs], fn, **extra)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
