#!/usr/bin/env bash
# Create or refresh ./.venv at the repository root with everything duplex-actors needs.
# Idempotent: a stamp file records the inputs, so a second run does nothing unless
# pyproject.toml or this script changed.
#
# Why the order matters: moshi 0.2.13 pins torch<2.10 (and bitsandbytes, sounddevice);
# a resolver that sees that pin replaces the torch we want with a multi-GB CUDA build.
# So torch goes in first, moshi goes in with --no-deps, and this package (which lists
# moshi's light runtime deps itself) goes in last.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VENV=.venv
STAMP=$VENV/.duplex-setup-stamp
want=$( (cat pyproject.toml scripts/setup-venv.sh scripts/pick-python.sh; echo "$TORCH_SPEC ${PYTHON:-}") | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi

# The interpreter: PYTHON when given, otherwise the fastest Python 3.11 here (pick-python.sh).
PYTHON=${PYTHON:-$(scripts/pick-python.sh)}
PYTHON=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')
echo "setting up $VENV (python: $PYTHON, torch: $TORCH_SPEC)" >&2
if [ -x "$VENV/bin/python" ]; then
    made_from=$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null || true)
    if [ "$made_from" != "$PYTHON" ]; then
        echo "$VENV was made from ${made_from:-an interpreter that no longer runs}: making it again from $PYTHON" >&2
        rm -rf "$VENV"
    fi
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
fi
# The rest goes in with uv when it installs (pip took 176 s of CPU for it on a 2-core VM, uv 23 s,
# the same packages and versions); with pip otherwise. torch stays with pip above: its CPU wheel
# comes from pip's own configuration (PIP_FIND_LINKS, TORCH_INDEX_URL).
if "$VENV/bin/python" -m uv --version >/dev/null 2>&1 || pip install uv 2>/dev/null; then
    # uv reads its own variables: a package index configured for pip is passed on.
    if [ -n "${PIP_INDEX_URL:-}" ] && [ -z "${UV_DEFAULT_INDEX:-}" ]; then
        export UV_DEFAULT_INDEX=$PIP_INDEX_URL
    fi
    install() { "$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python" "$@"; }
else
    echo "uv did not install: the packages go in with pip (slower)" >&2
    install() { pip install "$@"; }
fi
install --no-deps "moshi==0.2.13"
# dev: the tools and test clients; frameworks: the voice-agent frameworks the e2e tests drive.
install -e ".[dev,frameworks]"
# The resolver must not have replaced torch: fail loudly if it did.
"$VENV/bin/python" - <<'PY'
import torch, moshi
assert moshi.__version__ == "0.2.13", moshi.__version__
print(f"torch {torch.__version__} (cuda build: {torch.version.cuda is not None}), moshi {moshi.__version__}")
PY
echo "$want" > "$STAMP"
