#!/bin/sh
# Installs everything the test suite needs on a fresh machine: the Python packages
# (requirements-dev.txt: torch pinned to the 2.13.0 CPU build, colltrace editable, the test
# extra) and a headless Chromium for the dashboard's browser test. The README's test command
# and .ci/run both call this file, so what CI runs is what a new developer runs.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The CI machines keep the torch wheel on disk.
[ -d /opt/wheels ] && export PIP_FIND_LINKS="${PIP_FIND_LINKS:-/opt/wheels}"
"$PY" -m pip install -q -r requirements-dev.txt

# Chromium: Debian's package where apt can install it (Playwright's own download cannot run
# on machines without general internet access); elsewhere Playwright's build.
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    if { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } >/dev/null 2>&1; then
        exit 0
    fi
    echo "colltrace tests: apt-get could not install chromium; trying Playwright's build" >&2
fi
if "$PY" -m playwright install chromium >/dev/null 2>&1; then
    exit 0
fi
echo "colltrace tests: no Chromium for the dashboard's browser test: install Debian's 'chromium' (apt-get install chromium) or run 'python3 -m playwright install chromium'" >&2
exit 1
