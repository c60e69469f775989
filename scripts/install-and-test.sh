#!/usr/bin/env bash
# Installs everything the tests need (Debian packages included) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need=""
for pkg_cmd in tshark:tshark tcpdump:tcpdump redis-server:redis-server chromium:chromium \
        iproute2:ip nginx:nginx tinyproxy:tinyproxy; do
    command -v "${pkg_cmd#*:}" >/dev/null || need="$need ${pkg_cmd%%:*}"
done
if [ -n "$need" ]; then
    apt-get update -qq
    # the tests run nginx themselves with their own configuration: keep the package from
    # starting it as a system service (policy-rc.d exit 101 = "action forbidden")
    rcd=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        rcd=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$rcd" && chmod +x "$rcd"
    fi
    # shellcheck disable=SC2086
    apt-get install -y -qq $need >/dev/null
    if [ -n "$rcd" ]; then rm -f "$rcd"; fi
fi
# builds the compiled core (mypyc), or pure Python when it cannot: --version says which
python3 -m pip install -q -e '.[test]'
python3 -m netdiag --version
# these machines have a C compiler: a pure-Python build here is a broken build (the
# comparisons of the two cores would all skip); NETDIAG_PURE_PYTHON=1 asks for one
if [ "${NETDIAG_PURE_PYTHON:-0}" = "0" ]; then
    NETDIAG_CORE=compiled python3 -c 'import netdiag' || {
        echo "the compiled core was not built (pip install -v -e . says why)" >&2; exit 1; }
fi
python3 -m ruff check .
lint-imports --no-cache  # the layer contract (pyproject.toml [tool.importlinter])
bash scripts/typecheck.sh
python3 -m pytest -q "$@"
# the pure-Python twin of the compiled modules, on the tests of the layers they make up
NETDIAG_CORE=python python3 -m pytest -q tests/flows tests/capture tests/protocols \
    tests/analysis tests/paths/test_paths_matching.py tests/paths/test_chains_scale.py \
    tests/paths/test_paths_chains.py tests/paths/test_paths_budget.py \
    tests/paths/test_paths_attribute.py tests/paths/test_load.py
