"""Build the torch models of a checkpoint through moshi's own loaders, strictly.

The LM is built from ``moshi.models.loaders._lm_kwargs`` updated with the checkpoint's
``lm_config.json``; ``dep_q`` is always 8 (agent codebooks only). A PersonaPlex checkpoint
whose depformer has 16 steps (it also predicts the user's codes, which are teacher-forced
at inference) is cut to its first 8 steps: agent output is identical.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from .checkpoint import CheckpointFiles
from .errors import CheckpointError

if TYPE_CHECKING:
    import sentencepiece
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

AGENT_STEPS = 8
_STEP_KEY = re.compile(r"^linears\.(\d+)\.weight$")
# Per-step module lists of the depformer: keep entries < 8 (depformer_emb has one fewer).
_PER_STEP = re.compile(
    r"^(?:linears|depformer_in|depformer_emb"
    r"|depformer\.layers\.\d+\.(?:gating|self_attn\.in_projs|self_attn\.out_projs))\.(\d+)\."
)
# PersonaPlex's fused per-step projections: [steps * rows, cols], step-major.
_FUSED = re.compile(r"^depformer\.layers\.\d+\.self_attn\.(?:in_proj_weight|out_proj\.weight)$")


def lm_kwargs(files: CheckpointFiles) -> dict[str, Any]:
    from moshi.models import loaders

    kwargs = dict(loaders._lm_kwargs)
    kwargs.update(files.lm_config)
    kwargs["dep_q"] = AGENT_STEPS
    kwargs["depformer_context"] = AGENT_STEPS
    return kwargs


def depformer_steps(state: Mapping[str, torch.Tensor]) -> int:
    return sum(1 for key in state if _STEP_KEY.match(key))


def cut_depformer(state: dict[str, torch.Tensor], steps: int) -> dict[str, torch.Tensor]:
    """Keep the first 8 depformer steps of a ``steps``-step state dict."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = _PER_STEP.match(key)
        if m is not None:
            limit = AGENT_STEPS - 1 if key.startswith("depformer_emb.") else AGENT_STEPS
            if int(m.group(1)) >= limit:
                continue
        elif key.startswith("depformer.") and _FUSED.match(key):
            rows = value.shape[0]
            if rows % steps:
                raise CheckpointError(f"{key}: {rows} rows do not split into {steps} steps")
            value = value[: rows // steps * AGENT_STEPS]
        out[key] = value
    return out


def load_lm(files: CheckpointFiles, device: torch.device | str, dtype: torch.dtype) -> LMModel:
    from moshi.models import loaders
    from moshi.models.lm import LMModel
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    kwargs = lm_kwargs(files)
    try:
        state = load_file(files.lm, device=str(device))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{files.lm}: expected a safetensors LM checkpoint ({exc})") from exc
    steps = depformer_steps(state)
    try:
        if steps == AGENT_STEPS:
            del state
            return loaders.get_moshi_lm(files.lm, lm_kwargs=kwargs, device=device, dtype=dtype)
        if steps != 2 * AGENT_STEPS:
            raise CheckpointError(
                f"{files.lm}: depformer has {steps} steps; expected 8 (Moshi) or 16 (PersonaPlex)"
            )
        # Same as loaders.get_moshi_lm, on the cut state dict.
        state = cut_depformer(state, steps)
        for key, value in state.items():
            if value.dtype.is_floating_point:
                state[key] = value.to(dtype)
        model = LMModel(device=torch.device("meta"), dtype=dtype, **kwargs)
        model.load_state_dict(state, assign=True)
        model.eval()
        return model
    except RuntimeError as exc:
        raise CheckpointError(f"{files.lm}: does not match the LM config: {_first_lines(exc)}") from exc


def load_mimi(files: CheckpointFiles, device: torch.device | str) -> MimiModel:
    from moshi.models import loaders
    from safetensors import SafetensorError

    config = dict(files.mimi_config) if files.mimi_config is not None else None
    try:
        return loaders.get_mimi(files.mimi, mimi_config=config, device=device, num_codebooks=8)
    except (RuntimeError, SafetensorError, OSError) as exc:
        raise CheckpointError(
            f"{files.mimi}: not a Mimi checkpoint for this config: {_first_lines(exc)}"
        ) from exc


def load_tokenizer(files: CheckpointFiles) -> sentencepiece.SentencePieceProcessor:
    import sentencepiece

    tokenizer = sentencepiece.SentencePieceProcessor()
    try:
        tokenizer.Load(str(files.tokenizer))
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{files.tokenizer}: expected a SentencePiece model ({exc})") from exc
    return tokenizer


def _first_lines(exc: BaseException, n: int = 4) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:n])


@attrs.frozen(slots=True, eq=False)
class LoadedCheckpoint:
    files: CheckpointFiles
    lm: LMModel
    mimi: MimiModel
    tokenizer: sentencepiece.SentencePieceProcessor
    device: torch.device
    dtype: torch.dtype


def load_checkpoint(
    files: CheckpointFiles,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> LoadedCheckpoint:
    """Load LM, Mimi and tokenizer. Default dtype: float32 on CPU, bfloat16 on CUDA."""
    device = torch.device(device)
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    lm = load_lm(files, device, dtype)
    tokenizer = load_tokenizer(files)
    if tokenizer.vocab_size() > lm.text_card:
        raise CheckpointError(
            f"{files.tokenizer}: {tokenizer.vocab_size()} pieces, more than the LM's text_card {lm.text_card}"
        )
    return LoadedCheckpoint(
        files=files,
        lm=lm,
        mimi=load_mimi(files, device),
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
    )


def voice_path(files: CheckpointFiles, name: str) -> Path:
    return files.voices[name]
