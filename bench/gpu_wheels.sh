#!/usr/bin/env bash
# Download into .whl/ the wheels that the GPU machine (Python 3.12, torch 2.11, no moshi)
# lacks, for bench/run_gpu.sh. .whl/ is git-ignored; copy it beside the checkout on the CUDA machine.
#
# Pinned to the versions of the local .venv. moshi is installed with --no-deps there, so
# only what `import moshi.models` and duplex_actors.model import is carried; the rest of
# their runtime deps (numpy, torch, filelock, fsspec, packaging, pyyaml, requests, tqdm,
# typing_extensions, hf-xet) are already in that machine's image.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
    moshi==0.2.13
    einops==0.8.2
    safetensors==0.7.0
    sentencepiece==0.2.3
    sphn==0.2.0
    huggingface_hub==0.36.2
    attrs==26.1.0
    cattrs==26.2.1
)
DEST=${1:-.whl}
PYVER=${PYVER:-3.12}
mkdir -p "$DEST"
for spec in "${PACKAGES[@]}"; do
    python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "$spec"
done
ls -la "$DEST"
du -sh "$DEST"
