#!/usr/bin/env bash
# Installs everything the tests need (Debian packages included) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need=""
for pkg_cmd in tshark:tshark tcpdump:tcpdump redis-server:redis-server chromium:chromium \
        iproute2:ip; do
    command -v "${pkg_cmd#*:}" >/dev/null || need="$need ${pkg_cmd%%:*}"
done
if [ -n "$need" ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq $need >/dev/null
fi
python3 -m pip install -q -e '.[test]'
python3 -m ruff check .
python3 -m pytest -q "$@"
