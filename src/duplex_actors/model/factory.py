"""From a ``--model`` spec to a ready engine: built-in tiny models, local directories, HF repos."""

from __future__ import annotations

import torch

from .checkpoint import CheckpointFiles, checkpoint_from_dir, find_checkpoint
from .engine import DEFAULT_CONTEXT_POLICY
from .errors import CheckpointError
from .loading import load_checkpoint
from .moshi_engine import MoshiEngine, PrefillMode
from .tiny import ensure_builtin

BUILTIN_MODELS = ("tiny", "tiny-parrot")


def resolve_checkpoint(spec: str, revision: str | None = None) -> CheckpointFiles:
    """``tiny`` / ``tiny-parrot`` (built on first use), a local directory, or an HF repo id."""
    if spec in BUILTIN_MODELS:
        return checkpoint_from_dir(ensure_builtin(spec), model_id=spec)
    found = find_checkpoint(spec, revision)
    if found is None:
        raise CheckpointError(
            f"{spec}: not a built-in model ({', '.join(BUILTIN_MODELS)}), an existing directory, "
            "or a Hugging Face repo id (owner/name)"
        )
    return found


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
    context_policy: str = DEFAULT_CONTEXT_POLICY,
    pin_max: int | None = None,
) -> MoshiEngine:
    files = resolve_checkpoint(model, revision=revision)
    loaded = load_checkpoint(files, device=device, dtype=dtype)
    return MoshiEngine(
        loaded,
        slots=slots,
        family=family,
        prefill=prefill,
        torch_threads=torch_threads,
        context_policy=context_policy,
        pin_max=pin_max,
    )
