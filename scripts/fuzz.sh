#!/usr/bin/env bash
# Fuzz one parser for MINUTES (docs/fuzzing.md): scripts/fuzz.sh TARGET MINUTES [libFuzzer flags]
# Installs atheris when missing, builds the seed corpus when missing, keeps going past
# crashes (one reproducer per crash site in fuzz/crashes/TARGET/) and restarts after a
# time-out or memory limit until the time is up. Prints the executions run at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    echo "usage: scripts/fuzz.sh TARGET MINUTES [libFuzzer flags]" >&2
    echo "targets: $(python3 -c 'import sys; sys.path.insert(0, "."); from fuzz.targets import TARGETS; print(" ".join(TARGETS))')" >&2
    exit 2
fi
target=$1
minutes=$2
shift 2
python3 -c "import atheris" 2>/dev/null || python3 -m pip install -q atheris
corpus="fuzz/corpus/$target"
if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then
    python3 fuzz/make_seeds.py "$target"
fi
crashes="fuzz/crashes/$target"
mkdir -p "$crashes"
log="$crashes/fuzz.log"
end=$(( $(date +%s) + minutes * 60 ))
execs=0
runs=0
while :; do
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 5 ] || break
    runs=$((runs + 1))
    runlog=$(mktemp)
    set +e
    python3 fuzz/run.py "$target" --keep-going "$corpus" -max_total_time="$left" \
        -timeout=10 -rss_limit_mb=1024 -artifact_prefix="$crashes/" -print_final_stats=1 \
        "$@" >"$runlog" 2>&1
    set -e
    grep -aE "new crash site|^==[0-9]+== ERROR|Test unit written|DONE" "$runlog" || true
    n=$(grep -a "stat::number_of_executed_units" "$runlog" | tail -1 | awk '{print $2}' || true)
    if [ -z "$n" ]; then  # died on a time-out, the memory limit or a signal: its last status
        n=$(grep -aoE "^#[0-9]+" "$runlog" | tail -1 | tr -d '#' || true)
    fi
    execs=$(( execs + ${n:-0} ))
    cat "$runlog" >>"$log"
    rm -f "$runlog"
    echo "---- end of run $runs: ${n:-0} executions" >>"$log"
    if [ "${n:-0}" -eq 0 ]; then
        echo "fuzz.sh: the run did not fuzz (see $log)" >&2
        tail -n 20 "$log" >&2
        break
    fi
done
echo "fuzz.sh: $target: $execs executions in $runs run(s) over $minutes min; crash sites: \
$(find "$crashes" -name 'crash-*' ! -name '*.txt' | wc -l), time-outs: \
$(find "$crashes" -name 'timeout-*' | wc -l), memory: $(find "$crashes" -name 'oom-*' | wc -l)"
