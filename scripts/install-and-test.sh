#!/usr/bin/env bash
# Installs everything the tests need (Debian packages included) and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
if ! command -v tshark >/dev/null || ! command -v tcpdump >/dev/null \
        || ! command -v redis-server >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq tshark tcpdump redis-server >/dev/null
fi
python3 -m pip install -q -e '.[test]'
python3 -m ruff check .
python3 -m pytest -q "$@"
