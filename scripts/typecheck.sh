#!/usr/bin/env bash
# mypy --strict on the modules mypyc compiles (COMPILED_MODULES in netdiag/_core.py) and on
# those that build the JSON contract's document (netdiag/contract.py types it), and the
# probes' DNS timers (netdiag/probe: dns, stamped_dns, marks).
# Modules they import are analysed for their types but not reported on (--follow-imports=silent).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t modules < <(python3 -c \
    'import runpy; print("\n".join(runpy.run_path("netdiag/_core.py")["COMPILED_MODULES"]))')
args=()
for m in "${modules[@]}" netdiag.contract netdiag.analysis.stats netdiag.analysis.summary \
        netdiag.analysis.findings netdiag.result netdiag.report.records_out \
        netdiag.probe.dns netdiag.probe.stamped_dns netdiag.probe.marks; do
    [[ " ${args[*]} " == *" $m "* ]] || args+=(-m "$m")
done
python3 -m mypy --strict --follow-imports=silent "${args[@]}"
