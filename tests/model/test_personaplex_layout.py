"""A checkpoint laid out exactly like ``nvidia/personaplex-7b-v1`` at small dimensions, through the
loader (the depformer cut, the voices archive, the digest cache), and the 7B layout itself on the
meta device against moshi's ``LMModel`` at the real config (``-m slow``)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.digest import cached_sha256
from duplex_actors.model.factory import open_engine
from duplex_actors.model.layout import LM_NAME, MIMI_NAME, TOKENIZER_NAME, VOICES_TGZ
from duplex_actors.model.loading import lm_from_state
from duplex_actors.model.startup import DONE, PhaseReport
from duplex_actors.model.synthetic import PERSONAPLEX_VOICES, make_personaplex_layout, personaplex_layout

from .helpers import session_audio

# PersonaPlex's architecture at small dimensions (lm_config.json); everything else is the real layout.
SMALL_LM = {
    "dim": 64,
    "text_card": 256,
    "num_heads": 4,
    "num_layers": 2,
    "context": 250,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 132,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
}


@pytest.fixture(scope="module")
def layout_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    return make_personaplex_layout(
        tmp_path_factory.mktemp("layout") / "personaplex-7b-v1", lm_config=SMALL_LM
    )


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return dict(json.loads(f.read(size)))


def test_the_files_and_tensor_names_are_personaplexs(layout_dir):
    assert {p.name for p in layout_dir.iterdir()} == {
        LM_NAME,
        MIMI_NAME,
        TOKENIZER_NAME,
        VOICES_TGZ,
        "lm_config.json",  # the small dimensions
        "mimi_config.json",  # the tiny Mimi's
    }
    header = _header(layout_dir / LM_NAME)
    assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {"BF16"}
    # The 16-step depformer under PersonaPlex's fused names, step-major.
    assert header["depformer.layers.1.self_attn.in_proj_weight"]["shape"] == [16 * 3 * 32, 32]
    assert header["depformer.layers.1.self_attn.out_proj.weight"]["shape"] == [16 * 32, 32]
    assert header["transformer.layers.0.self_attn.in_proj_weight"]["shape"] == [3 * 64, 64]
    assert "linears.15.weight" in header and "depformer_emb.14.weight" in header
    assert "depformer.layers.0.gating.15.linear_in.weight" in header
    assert not any(".in_projs." in name or ".out_projs." in name for name in header)
    files = checkpoint_from_dir(layout_dir)
    assert sorted(files.voices) == sorted(PERSONAPLEX_VOICES) and len(files.voices) == 18
    assert all(path.is_file() for path in files.voices.values())  # extracted into the cache


def test_the_loader_cuts_the_depformer_and_frees_what_it_cut(layout_dir):
    phases: list[PhaseReport] = []
    # In the file's own dtype: a conversion would copy every tensor anyway and hide a view.
    engine = open_engine(str(layout_dir), slots=2, dtype="bfloat16", on_phase=phases.append)
    lm = engine.checkpoint.lm
    assert lm.dep_q == 8 and engine.checkpoint.dtype == torch.bfloat16
    assert engine.family.name == "personaplex" and len(engine.family.voices) == 18
    # Each fused projection was cut to 8 steps by a copy: no parameter's storage holds more than
    # the parameters on it (a view of the 16-step tensor would keep twice that alive).
    storages: dict[int, int] = {}
    for param in lm.parameters():
        storage = param.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    assert sum(storages.values()) == sum(p.numel() * p.element_size() for p in lm.parameters())
    layer: Any = lm.depformer.layers[0]
    projections = layer.self_attn.in_projs
    assert len(projections) == 8
    assert projections[0].weight.untyped_storage().nbytes() == 8 * projections[0].weight.nbytes
    assert [r.name for r in phases if r.state == DONE] == ["resolve", "load", "engine", "digest"]
    digest = [r for r in phases if r.name == "digest"]
    assert digest[-1].done == digest[-1].total == (layout_dir / LM_NAME).stat().st_size
    # Served frames are well-formed: 8 codes within the card, 1920 finite samples.
    engine.reset(0, engine.family.session_prompt(voice="VARM4.pt", persona="hi"))
    for frame in session_audio(2, 3):
        out = engine.step({0: frame})[0]
        assert len(out.agent_codes) == 8 and all(0 <= c < 2048 for c in out.agent_codes)
        assert out.pcm.shape == (1920,) and bool(np.isfinite(out.pcm).all())


def test_the_digest_is_read_once(layout_dir):
    lm = layout_dir / LM_NAME
    open_engine(str(layout_dir), slots=1, family="moshi")  # hashed, or cached by another test
    assert cached_sha256(lm) == hashlib.sha256(lm.read_bytes()).hexdigest()
    phases: list[PhaseReport] = []
    open_engine(str(layout_dir), slots=1, family="moshi", on_phase=phases.append)
    digest = [r for r in phases if r.name == "digest"]
    assert [r.state for r in digest] == ["running", "done"]  # no progress: nothing was read


@pytest.mark.slow
def test_the_7b_layout_is_what_moshis_lm_expects():
    """Every tensor of PersonaPlex's 7B file (names, shapes, on the meta device) goes through the
    loader's cut into moshi's ``LMModel`` at the real config, strictly; the counts are the ones
    known of the real model (8.371 B parameters in the file, 7.688 B after the cut, 28.6 GiB in
    float32)."""
    from moshi.models import loaders
    from moshi.models.lm import LMModel

    layout = personaplex_layout()
    assert sum(int(np.prod(shape)) for shape in layout.values()) == 8_371_408_896
    assert layout["depformer.layers.5.self_attn.in_proj_weight"] == (16 * 3 * 1024, 1024)
    assert layout["transformer.layers.31.self_attn.in_proj_weight"] == (3 * 4096, 4096)
    state = {name: torch.empty(shape, dtype=torch.bfloat16, device="meta") for name, shape in layout.items()}
    kwargs: dict[str, Any] = dict(loaders._lm_kwargs, dep_q=8, depformer_context=8)
    model = lm_from_state(state, kwargs, torch.bfloat16, Path("model.safetensors"))
    loaded = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    expected = {
        name: tuple(value.shape)
        for name, value in LMModel(device=torch.device("meta"), dtype=torch.bfloat16, **kwargs)
        .state_dict()
        .items()
    }
    assert loaded == expected
    kept = sum(int(np.prod(shape)) for shape in loaded.values())
    assert round(kept / 1e6) == 7688
    assert f"{kept * 4 / 2**30:.1f}" == "28.6"  # GiB in float32: more than a 24 GiB machine has
