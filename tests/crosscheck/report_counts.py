#!/usr/bin/env python3
"""Print, per capture and in total, how many DNS transactions, TCP handshakes and TLS
handshakes were compared with tshark and how many agreed (the same comparisons as
test_vs_tshark.py).

    python tests/crosscheck/report_counts.py [-v] [CAPTURE_NAME...]

``-v`` also lists every disagreement and every item that was not comparable.
Exit status: 0 all compared items agree, 1 some disagree, 2 tshark or netdiag missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_ref import KINDS, LABELS, compare_capture
from tshark_ref import all_captures, tshark_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="*", help="capture file names to restrict to")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list disagreements and items not compared")
    args = parser.parse_args(argv)
    if tshark_path() is None:
        print("tshark is not installed", file=sys.stderr)
        return 2
    specs = all_captures()
    if args.captures:
        specs = [s for s in specs if s.name in args.captures]
    if not specs:
        print("no captures found", file=sys.stderr)
        return 2
    width = max(len(s.name) for s in specs)
    header = f"{'capture':<{width}}  " + "  ".join(
        f"{LABELS[k] + ' agreed/compared (skipped)':>28}" for k in KINDS)
    print(header)
    print("-" * len(header))
    totals = {k: [0, 0, 0] for k in KINDS}
    disagreements: list[str] = []
    for spec in specs:
        try:
            out = compare_capture(spec)
        except ImportError as exc:
            print(f"netdiag is not importable: {exc}", file=sys.stderr)
            return 2
        cells = []
        for kind in KINDS:
            agreed, compared, skipped = out.agreed(kind), out.compared(kind), out.skipped(kind)
            totals[kind][0] += agreed
            totals[kind][1] += compared
            totals[kind][2] += skipped
            mark = " " if agreed == compared else "!"
            cells.append(f"{f'{agreed}/{compared} ({skipped})':>27}{mark}")
            disagreements += out.failures(kind)
        print(f"{spec.name:<{width}}  " + "  ".join(cells))
        if args.verbose:
            for skip in out.skips:
                print(f"    not compared: {skip.desc}: {skip.reason}")
    print("-" * len(header))
    print(f"{'total':<{width}}  " + "  ".join(
        f"{f'{a}/{c} ({s})':>27} " for a, c, s in (totals[k] for k in KINDS)))
    print("crosscheck: " + ", ".join(f"{LABELS[k]} {totals[k][0]}/{totals[k][1]}"
                                     for k in KINDS) + " agreed")
    if disagreements:
        print(f"\n{len(disagreements)} disagreement(s):")
        for line in disagreements:
            print(f"  {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
