#!/usr/bin/env bash
# The test command's pytest part (`make test`): the tests not marked `serial` in two worker
# processes, each test module's tests in one of them (with the module's server), then the
# `serial` ones alone: those measure latency or pacing against their own baseline, which a
# neighbouring test's load would move. pytest's arguments pass through to both phases; a phase
# that selects no test is not a failure when the other ran some.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
WORKERS=${DUPLEX_TEST_WORKERS:-2}
DEFAULT="not slow and not gpu"

"$PY" -m pytest -n "$WORKERS" --dist loadfile -m "not serial and $DEFAULT" "$@"
parallel=$?
"$PY" -m pytest -m "serial and $DEFAULT" "$@"
serial=$?

# pytest's exit status 5: no test was selected.
if [ $parallel -eq 5 ] && [ $serial -eq 5 ]; then exit 5; fi
for status in $parallel $serial; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
exit 0
