#!/usr/bin/env bash
# mypy --strict on exactly the modules mypyc compiles (COMPILED_MODULES in netdiag/_core.py).
# Modules they import are analysed for their types but not reported on (--follow-imports=silent).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t modules < <(python3 -c \
    'import runpy; print("\n".join(runpy.run_path("netdiag/_core.py")["COMPILED_MODULES"]))')
args=()
for m in "${modules[@]}"; do args+=(-m "$m"); done
python3 -m mypy --strict --follow-imports=silent "${args[@]}"
