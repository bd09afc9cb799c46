"""The checkpoint directory layout and the cache root: names only, no loading.

A checkpoint directory is laid out like ``nvidia/personaplex-7b-v1`` and
``kyutai/moshiko-pytorch-bf16``:

- ``model.safetensors``: the LM (8- or 16-step depformer; a 16-step one is cut to 8 at load),
- ``tokenizer-e351c8d8-checkpoint125.safetensors``: Mimi,
- ``tokenizer_spm_32k_3.model``: the SentencePiece text tokenizer,
- ``voices/*.pt`` or ``voices.tgz``: PersonaPlex voice prompts (optional),
- ``lm_config.json``: LM dimensions overriding the Moshi 7B config (optional),
- ``mimi_config.json``: a Mimi config overriding the default one (optional; tiny models).

:mod:`.checkpoint` reads this layout and :mod:`.tiny` writes it; both import it from here, so
neither imports the other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

LM_NAME: Final = "model.safetensors"
MIMI_NAME: Final = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME: Final = "tokenizer_spm_32k_3.model"
LM_CONFIG_NAME: Final = "lm_config.json"
MIMI_CONFIG_NAME: Final = "mimi_config.json"
VOICES_DIR: Final = "voices"
VOICES_TGZ: Final = "voices.tgz"
HF_ALLOW_PATTERNS: Final = (
    LM_NAME,
    MIMI_NAME,
    TOKENIZER_NAME,
    LM_CONFIG_NAME,
    MIMI_CONFIG_NAME,
    VOICES_TGZ,
    f"{VOICES_DIR}/*.pt",
)


def cache_root() -> Path:
    """Where built-in models and extracted voices live (``DUPLEX_CACHE_DIR`` overrides)."""
    env = os.environ.get("DUPLEX_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "duplex-actors"
