#!/usr/bin/env bash
# Print the Python 3.11 interpreter that ./.venv is made from (stdout), saying why (stderr).
#
# The candidates: every python3.11 on PATH, then /usr/bin and /usr/local/bin, each once (by the
# executable a shim such as pyenv's resolves to), each one that can create a venv. The first one
# is the choice unless another runs Python code at least 1.15x faster. How a CPython was built
# sets the server's CPU per frame: on the 2-core VM of BENCHMARKS.md ("Which CPython"), a pyenv
# build without PGO or LTO, linked to a shared libpython, spent 1.2x Debian's python3.11 per
# session-frame with the same code. The speed is measured, not read from the build's flags:
# distributions build with PGO without saying so in sysconfig. The probe is dictionary and string
# work, not bench/machine.py's python_call_ns (a bare call): the two builds here differ by
# 1.6-1.8x on it and by only 1.19-1.35x on a bare call, too close to the margin to decide on.
set -euo pipefail

probe='
import os, sys, time
assert sys.version_info[:2] == (3, 11), sys.version
import ensurepip, venv  # noqa: F401 (it must be able to create a venv)
def step(i, d):
    d[i & 255] = i
    return len(str(i))
best = float("inf")
for _ in range(5):
    d = {}
    t = time.perf_counter_ns()
    for i in range(50_000):
        step(i, d)
    best = min(best, (time.perf_counter_ns() - t) / 50_000)
print(os.path.realpath(sys.executable), sys.version.split()[0], f"{best:.0f}")
'

paths=()
while IFS= read -r p; do paths+=("$p"); done < <(which -a python3.11 2>/dev/null || true)
paths+=(/usr/bin/python3.11 /usr/local/bin/python3.11)

declare -A seen=()
names=() versions=() ns=()
for p in "${paths[@]}"; do
    [ -x "$p" ] || continue
    if ! out=$("$p" -c "$probe" 2>/dev/null); then
        continue  # not 3.11, a broken shim, or no venv/ensurepip
    fi
    read -r exe version t <<<"$out"
    [ -n "${seen[$exe]:-}" ] && continue
    seen[$exe]=1
    names+=("$exe") versions+=("$version") ns+=("$t")
done

if [ "${#names[@]}" -eq 0 ]; then
    echo "pick-python: no Python 3.11 that can create a venv (python3.11 with its venv module," \
        "e.g. apt-get install python3.11 python3.11-venv); or set PYTHON" >&2
    exit 1
fi

# A second measurement of each, in turn, so that one slow moment of a shared machine does not
# decide; each keeps its best (its first when this one fails).
for i in "${!names[@]}"; do
    if out=$("${names[$i]}" -c "$probe" 2>/dev/null); then
        read -r _ _ t <<<"$out"
        [ "$t" -lt "${ns[$i]}" ] && ns[$i]=$t
    fi
done

choice=0
for i in "${!names[@]}"; do
    # faster by at least 1.15x than the first candidate (integer arithmetic: 100 * t * 1.15)
    if [ $((ns[i] * 115)) -le $((ns[0] * 100)) ] && [ "${ns[i]}" -lt "${ns[choice]}" ]; then
        choice=$i
    fi
done
for i in "${!names[@]}"; do
    mark=" "
    [ "$i" -eq "$choice" ] && mark="*"
    echo "pick-python: $mark ${names[$i]} (${versions[$i]}): ${ns[$i]} ns per probe step" >&2
done
echo "${names[$choice]}"
