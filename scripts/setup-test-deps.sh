#!/usr/bin/env bash
# The system packages the test suite drives, installed before pytest starts (`make test` runs
# this): libopus (Opus framings of the moshi/PersonaPlex clients), espeak-ng and sox (speech
# WAVs), Chromium and chromedriver (browser tests), HAProxy (scale-out), Node.js (the page's
# script check). Idempotent: when everything is there it only asks dpkg and exits. When
# something cannot be installed it says so in one line and exits 0: the tests that need it then
# skip with their reason, which fails a CI run (tests/conftest.py).
set -euo pipefail

# package: a file or command that shows it is installed
declare -A WANT=(
    [libopus0]=lib:libopus.so.0
    [espeak-ng]=cmd:espeak-ng
    [sox]=cmd:sox
    [chromium]=cmd:chromium
    [chromium-driver]=cmd:chromedriver
    [fonts-liberation]=file:/usr/share/fonts/truetype/liberation
    [haproxy]=cmd:haproxy
    [nodejs]=cmd:node
)

present() {
    local kind=${1%%:*} what=${1#*:}
    case $kind in
        cmd) command -v "$what" >/dev/null 2>&1 || [ -x "/usr/sbin/$what" ] ;;
        lib) ldconfig -p 2>/dev/null | grep -q "$what" ;;
        file) [ -e "$what" ] ;;
    esac
}

missing=()
for pkg in "${!WANT[@]}"; do
    present "${WANT[$pkg]}" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

why=""
if ! command -v apt-get >/dev/null 2>&1; then
    why="no apt-get on this machine"
elif [ "$(id -u)" -ne 0 ]; then
    why="apt-get needs root"
fi
if [ -z "$why" ]; then
    echo "installing test system packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    log=$(mktemp)
    if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        why="apt-get failed: $(tail -n 1 "$log")"
    fi
    rm -f "$log"
fi
still=()
for pkg in "${missing[@]}"; do
    present "${WANT[$pkg]}" || still+=("$pkg")
done
if [ ${#still[@]} -gt 0 ]; then
    echo "setup-test-deps: cannot install ${still[*]} (${why:-installed but still not found}); the tests that need them skip, and fail under CI=true" >&2
fi
exit 0
