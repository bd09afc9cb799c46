#!/usr/bin/env bash
# One command for a CUDA machine without internet access (Python 3.12 with torch, nothing else).
# First, on a machine with a package index: bench/gpu_wheels.sh (fills the git-ignored .whl/).
# Then, on the CUDA machine, with .whl/ copied beside the checkout: bash bench/run_gpu.sh
# Extra arguments go to bench/engine_gpu.py (e.g. --batches 1,8 --steps 10).
#
# NO_TORCH_COMPILE=1: moshi would torch.compile its RMSNorm on CUDA; with CUDA graphs on
# (moshi's default on CUDA) the graphs already remove most launch overhead, and the compile
# time (per shape, per fresh LM) would come out of the 5-minute budget of this run.
cd "$(dirname "$0")/.." || exit
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:src || exit
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
NO_TORCH_COMPILE=1 PYTHONUNBUFFERED=1 python3 bench/engine_gpu.py "$@" 2>&1 | tee "${OUT:-/tmp}/engine_gpu.log"
