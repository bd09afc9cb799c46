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
from .meta_init import meta_init_skipped

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
    """Keep the first 8 depformer steps of a ``steps``-step state dict. Takes the tensors out
    of ``state`` as it goes (it ends empty), so that each dropped one is freed at once."""
    out: dict[str, torch.Tensor] = {}
    for key in list(state):
        value = state.pop(key)
        m = _PER_STEP.match(key)
        if m is not None:
            limit = AGENT_STEPS - 1 if key.startswith("depformer_emb.") else AGENT_STEPS
            if int(m.group(1)) >= limit:
                continue
        elif key.startswith("depformer.") and _FUSED.match(key):
            rows = value.shape[0]
            if rows % steps:
                raise CheckpointError(f"{key}: {rows} rows do not split into {steps} steps")
            # A copy: a view would keep the whole fused tensor (every step) alive.
            value = value[: rows // steps * AGENT_STEPS].clone()
        out[key] = value
    return out


def lm_header(files: CheckpointFiles) -> dict[str, torch.Tensor]:
    """The LM file's tensors as meta tensors (names, shapes, dtypes; no data is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(files.lm), framework="pt") as f:  # type: ignore[no-untyped-call]
            out = {}
            for key in f.keys():
                part = f.get_slice(key)
                dtype = _SAFETENSORS_DTYPES.get(part.get_dtype())
                if dtype is None:
                    raise CheckpointError(f"{files.lm}: {key}: unsupported dtype {part.get_dtype()}")
                out[key] = torch.empty(part.get_shape(), dtype=dtype, device="meta")
            return out
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{files.lm}: expected a safetensors LM checkpoint ({exc})") from exc


_SAFETENSORS_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}


def lm_from_state(
    state: dict[str, torch.Tensor], kwargs: Mapping[str, Any], dtype: torch.dtype, where: Path
) -> LMModel:
    """An ``LMModel`` (``dep_q`` 8) holding ``state``, a 16-step PersonaPlex state dict (cut
    here) or an 8-step one, loaded strictly; also on the meta device (the 7B layout check).
    Takes the tensors out of ``state`` (it ends empty): no original outlives its conversion."""
    from moshi.models.lm import LMModel

    steps = depformer_steps(state)
    if steps not in (AGENT_STEPS, 2 * AGENT_STEPS):
        raise CheckpointError(f"{where}: depformer has {steps} steps; expected 8 (Moshi) or 16 (PersonaPlex)")
    kept = cut_depformer(state, steps) if steps != AGENT_STEPS else {k: state.pop(k) for k in list(state)}
    for key, value in kept.items():
        if value.dtype.is_floating_point:
            kept[key] = value.to(dtype)
    try:
        with meta_init_skipped():
            model = LMModel(device=torch.device("meta"), dtype=dtype, **kwargs)
        model.load_state_dict(kept, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{where}: does not match the LM config: {_first_lines(exc)}") from exc
    model.eval()
    return model


def load_lm(files: CheckpointFiles, device: torch.device | str, dtype: torch.dtype) -> LMModel:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    kwargs = lm_kwargs(files)
    try:
        state = load_file(files.lm, device=str(device))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{files.lm}: expected a safetensors LM checkpoint ({exc})") from exc
    model = lm_from_state(state, kwargs, dtype, files.lm)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the cut's dropped steps go back to the device
    return model


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
