#!/usr/bin/env bash
# One command for a CUDA machine without internet access (Python 3.12 with torch, nothing else
# installed): serve the full-size random-weight PersonaPlex architecture and run the tick-policy
# arms (bench/serving.py) against it at the largest B whose p90 step fits (bench/gpu_serving.py; `--mode ramp`: the
# former `duplex-load --ramp --sync-start`), within 5 minutes.
#
# First, here (fills the git-ignored .whl/ with cp312 wheels: bench/gpu_wheels.sh's moshi set
# plus the server and client stack below, ~25 MiB in all):
#   bash bench/gpu_serving.sh --fetch-wheels
# Then, on the CUDA machine, with .whl/ copied beside the checkout:
#   bash bench/gpu_serving.sh                 (about 5 minutes)
# Extra arguments go to bench/gpu_serving.py (e.g. --slots 16 --seconds 6).
# A check of the whole path on CPU here, tiny dims, without the wheels:
#   PYTHON=.venv/bin/python SKIP_WHEELS=1 bash bench/gpu_serving.sh --dry-run-cpu
#
# NO_TORCH_COMPILE=1 as in bench/run_gpu.sh: compile time would come out of the 5 minutes.
cd "$(dirname "$0")/.." || exit
set -o pipefail

# The server and client stack for Python 3.12 (versions of the local .venv): quart-trio,
# hypercorn, trio, trio-websocket, crc32c and their dependencies. matplotlib is left out:
# duplex-load then reports "could not draw" and keeps every number.
SERVER_WHEELS=(
    aiofiles==25.1.0 blinker==1.9.0 click==8.5.1 crc32c==2.9.post0 flask==3.1.3 h11==0.16.0
    h2==4.4.1 hpack==4.2.0 hypercorn==0.18.0 hyperframe==6.1.0 idna==3.20 itsdangerous==2.2.0
    jinja2==3.1.6 markupsafe==3.0.4 outcome==1.3.0.post0 priority==2.0.0 quart==0.22.0
    quart-trio==0.12.0 sniffio==1.3.1 sortedcontainers==2.4.0 trio==0.35.0 trio-websocket==0.12.2
    werkzeug==3.1.9 wsproto==1.3.2
)

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    set -e
    DEST=${2:-.whl}
    PYVER=${PYVER:-3.12}
    bash bench/gpu_wheels.sh "$DEST"
    for spec in "${SERVER_WHEELS[@]}"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 -d "$DEST" "$spec"
    done
    ls "$DEST"
    du -sh "$DEST"
    exit 0
fi

PYTHON=${PYTHON:-python3}
if [[ -z "${SKIP_WHEELS:-}" ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:src || exit
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
export NO_TORCH_COMPILE=1 PYTHONUNBUFFERED=1
mkdir -p "${OUT:=/tmp/gpu-serving-out}"
export OUT
timeout -k 10 300 "$PYTHON" bench/gpu_serving.py "$@" 2>&1 | tee "$OUT/gpu_serving.log"
