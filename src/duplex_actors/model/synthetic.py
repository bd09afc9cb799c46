"""Random checkpoints laid out exactly like ``nvidia/personaplex-7b-v1``, at any LM size.

The real repository holds ``model.safetensors`` (the LM as PersonaPlex saves it: moshi's
``LMModel`` with a 16-step depformer, every attention's projections under PersonaPlex's fused
names ``self_attn.in_proj_weight`` ``[steps * 3 * dim, dim]`` and ``self_attn.out_proj.weight``,
in bfloat16), the Mimi codec file, the SentencePiece tokenizer and ``voices.tgz`` with 18 voice
prompts. :func:`make_personaplex_layout` writes the same files with random weights: the LM at
the dimensions of an ``lm_config.json`` written beside it (``None``: the real 7B dimensions,
and no ``lm_config.json``, as in the real repository), random voice prompts of that width,
and the tiny model's Mimi and tokenizer (``tiny_codec``) or a random Mimi at the real config.

The LM file is written one tensor at a time, so the 7B layout (16.7 GB) needs memory for its
largest tensor only. Deterministic for a seed.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .layout import LM_CONFIG_NAME, LM_NAME, MIMI_CONFIG_NAME, MIMI_NAME, TOKENIZER_NAME, VOICES_TGZ
from .meta_init import meta_init_skipped
from .personaplex import NUM_STREAMS, VOICE_RING

PERSONAPLEX_STEPS = 16
# The voice prompts of nvidia/personaplex-7b-v1's voices.tgz.
PERSONAPLEX_VOICES = tuple(
    f"{kind}{i}.pt"
    for kind, count in (("NATF", 4), ("NATM", 4), ("VARF", 5), ("VARM", 5))
    for i in range(count)
)
_PROJ = re.compile(r"^(.*\.self_attn\.)(in_projs|out_projs)\.(\d+)\.weight$")
_FUSED_NAME = {"in_projs": "in_proj_weight", "out_projs": "out_proj.weight"}
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def personaplex_lm_kwargs(lm_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """moshi's LM kwargs with ``lm_config`` over them and PersonaPlex's 16-step depformer."""
    from moshi.models import loaders

    kwargs = dict(loaders._lm_kwargs)
    kwargs.update(lm_config or {})
    kwargs["dep_q"] = PERSONAPLEX_STEPS
    return kwargs


def personaplex_layout(lm_config: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape of PersonaPlex's ``model.safetensors`` at these dimensions:
    the state dict of a 16-step ``LMModel`` (built on the meta device) with the per-step
    projections ``in_projs.N`` / ``out_projs.N`` of each attention fused step-major."""
    from moshi.models.lm import LMModel

    with meta_init_skipped():
        model = LMModel(device=torch.device("meta"), dtype=torch.bfloat16, **personaplex_lm_kwargs(lm_config))
    layout: dict[str, tuple[int, ...]] = {}
    for key, value in model.state_dict().items():
        shape = tuple(int(d) for d in value.shape)
        m = _PROJ.match(key)
        if m is None:
            layout[key] = shape
            continue
        fused = m.group(1) + _FUSED_NAME[m.group(2)]
        rows = layout.get(fused, (0, shape[1]))[0]
        layout[fused] = (rows + shape[0], shape[1])
    return layout


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Like PyTorch's own initialisation: norm scales 1, embeddings N(0, 1), a linear's
    weight N(0, 1 / fan_in) (activations keep their scale through 32 random layers)."""
    if name.endswith(".alpha"):
        return torch.ones(shape)
    values = torch.randn(shape, generator=gen)
    if "emb" in name.split(".")[0]:
        return values
    return values / math.sqrt(shape[-1]) if len(shape) == 2 else values


def write_safetensors(
    path: Path,
    tensors: Iterable[tuple[str, tuple[int, ...]]],
    make: Callable[[str, tuple[int, ...]], torch.Tensor] | None,
    dtype: torch.dtype,
) -> int:
    """Write a safetensors file one tensor at a time (``make(name, shape)`` gives each; None:
    no data, a sparse file of the full size whose tensors read as zeros); the format is an
    8-byte header length, the JSON header, then the tensors' bytes in order."""
    items = list(tensors)
    size = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in items:
        nbytes = math.prod(shape) * size
        header[name] = {
            "dtype": _ST_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        if make is None:
            f.truncate(8 + len(raw) + offset)
            return 8 + len(raw) + offset
        for name, shape in items:
            value = make(name, shape).to(dtype).contiguous()
            assert tuple(value.shape) == shape, (name, value.shape, shape)
            f.write(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return 8 + len(raw) + offset


def _voice_prompt(
    dim: int, card: int, text_card: int, positions: int, gen: torch.Generator
) -> dict[str, Any]:
    embeddings = torch.randn(positions, 1, 1, dim, generator=gen) * 0.1
    cache = torch.randint(0, card, (1, NUM_STREAMS, VOICE_RING), generator=gen)
    cache[0, 0] = torch.randint(0, text_card, (VOICE_RING,), generator=gen)
    return {"embeddings": embeddings.to(torch.bfloat16), "cache": cache}


def _write_voices(path: Path, kwargs: Mapping[str, Any], seed: int, positions: int) -> None:
    gen = torch.Generator().manual_seed(seed + 7)
    with tarfile.open(path, "w:gz") as tar:
        for name in PERSONAPLEX_VOICES:
            buffer = io.BytesIO()
            torch.save(
                _voice_prompt(kwargs["dim"], kwargs["card"], kwargs["text_card"], positions, gen), buffer
            )
            info = tarfile.TarInfo(f"voices/{name}")
            info.size = buffer.tell()
            info.mtime = 0
            buffer.seek(0)
            tar.addfile(info, buffer)


def make_personaplex_layout(
    out_dir: Path,
    *,
    lm_config: Mapping[str, Any] | None = None,
    seed: int = 0,
    tiny_codec: bool = True,
    voice_positions: int = 12,
    weights: bool = True,
) -> Path:
    """Write a random checkpoint in ``nvidia/personaplex-7b-v1``'s layout into ``out_dir``
    (created; must be empty or absent). ``lm_config``: the LM's dimensions over moshi's 7B
    ones, also written as ``lm_config.json`` (None: the 7B LM, no ``lm_config.json``).
    ``weights=False``: the LM file is sparse, its header real and its tensors zeros, taking no
    disk space (for what reads only the header: the start-up's memory check)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir}: not empty")
    kwargs = personaplex_lm_kwargs(lm_config)
    layout = personaplex_layout(lm_config)
    index = {name: i for i, name in enumerate(layout)}

    def make(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return _random_tensor(name, shape, torch.Generator().manual_seed(seed * 1_000_003 + index[name]))

    write_safetensors(out_dir / LM_NAME, layout.items(), make if weights else None, torch.bfloat16)
    if lm_config is not None:
        (out_dir / LM_CONFIG_NAME).write_text(json.dumps(dict(lm_config), indent=2, sort_keys=True) + "\n")
    if tiny_codec:
        from .tiny import ensure_builtin

        tiny = ensure_builtin("tiny")
        for name in (MIMI_NAME, MIMI_CONFIG_NAME, TOKENIZER_NAME):
            shutil.copyfile(tiny / name, out_dir / name)
    else:
        from moshi.models import loaders
        from safetensors.torch import save_file

        from .tiny import build_tokenizer_bytes

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            mimi = loaders.get_mimi(None, num_codebooks=8)
        save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(out_dir / MIMI_NAME))
        (out_dir / TOKENIZER_NAME).write_bytes(build_tokenizer_bytes())
    _write_voices(out_dir / VOICES_TGZ, kwargs, seed, voice_positions)
    return out_dir
