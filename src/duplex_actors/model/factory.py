"""One call from a ``--model`` spec to a ready engine."""

from __future__ import annotations

import torch

from .checkpoint import resolve_checkpoint
from .loading import load_checkpoint
from .moshi_engine import MoshiEngine, PrefillMode


def open_engine(
    model: str = "tiny",
    *,
    slots: int = 8,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    family: str | None = None,
    revision: str | None = None,
    prefill: PrefillMode = "snapshot",
    torch_threads: int | None = 1,
) -> MoshiEngine:
    files = resolve_checkpoint(model, revision=revision)
    loaded = load_checkpoint(files, device=device, dtype=dtype)
    return MoshiEngine(loaded, slots=slots, family=family, prefill=prefill, torch_threads=torch_threads)
