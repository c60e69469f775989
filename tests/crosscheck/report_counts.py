#!/usr/bin/env python3
"""Print, per capture and in total, how many DNS transactions, TCP handshakes and TLS
handshakes were compared with tshark and how many agreed (the same comparisons as
test_vs_tshark.py).

    python tests/crosscheck/report_counts.py [-v] [CAPTURE_NAME...]

``-v`` also lists every disagreement and every item that was not comparable.
Exit status: 0 all compared items agree, 1 some disagree, 2 tshark or netdiag missing.

Then, unless ``--no-http``, the HTTP comparisons of test_http_vs_tshark.py (http_ref.py):
per capture, the connections whose request count agrees with tshark's and
the requests whose TTFB is within 0.05 ms of tshark's, ending with the line
``crosscheck HTTP: streams/requests a/b connections agreed, TTFB c/d within 0.05 ms``.
Its disagreements count towards the exit status like the others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_ref import KINDS, LABELS, compare_capture
from tshark_ref import all_captures, tshark_path

HTTP_KINDS = (("count", "requests per connection"), ("ttfb", "TTFB"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="*", help="capture file names to restrict to")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list disagreements and items not compared")
    parser.add_argument("--no-http", action="store_true",
                        help="skip the HTTP request counts and TTFB comparisons")
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
    status = 0
    if disagreements:
        print(f"\n{len(disagreements)} disagreement(s):")
        for line in disagreements:
            print(f"  {line}")
        status = 1
    if not args.no_http:
        status = max(status, _http(args))
    return status


def _http(args: argparse.Namespace) -> int:
    """The HTTP table (test_http_vs_tshark.py's comparisons); its exit status."""
    from http_ref import (
        compare_http,
        http_captures,
        http_summary_line,
        other_thirdparty_captures,
    )

    # the captures without HTTP too: netdiag must report no request there either
    specs = http_captures() + other_thirdparty_captures()
    if args.captures:
        specs = [s for s in specs if s.name in args.captures]
    if not specs:
        return 0
    width = max(len(s.name) for s in specs)
    header = f"{'capture':<{width}}  " + "  ".join(
        f"{label + ' agreed/compared (excluded)':>40}" for _, label in HTTP_KINDS)
    print()
    print(header)
    print("-" * len(header))
    rows: list[dict] = []
    disagreements: list[str] = []
    for spec in specs:
        try:
            out = compare_http(spec)
        except ImportError as exc:
            print(f"netdiag is not importable: {exc}", file=sys.stderr)
            return 2
        cells = []
        for kind, _ in HTTP_KINDS:
            agreed, compared, skipped = out.agreed(kind), out.compared(kind), out.skipped(kind)
            rows.append({"kind": kind, "agreed": agreed, "compared": compared,
                         "skipped": skipped})
            mark = " " if agreed == compared else "!"
            cells.append(f"{f'{agreed}/{compared} ({skipped})':>39}{mark}")
        disagreements += out.failures()
        print(f"{spec.name:<{width}}  " + "  ".join(cells))
        if args.verbose:
            for skip in out.skips:
                print(f"    not compared: {skip.desc}: {skip.reason}")
    print("-" * len(header))
    totals = [[sum(r[k] for r in rows if r["kind"] == kind)
               for k in ("agreed", "compared", "skipped")] for kind, _ in HTTP_KINDS]
    print(f"{'total':<{width}}  " + "  ".join(
        f"{f'{a}/{c} ({s})':>39} " for a, c, s in totals))
    print(http_summary_line(rows))
    if disagreements:
        print(f"\n{len(disagreements)} HTTP disagreement(s):")
        for line in disagreements:
            print(f"  {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
