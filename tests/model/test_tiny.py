"""Tiny checkpoints: deterministic bytes, real loaders, codebooks that are not all zero."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.personaplex import load_voice_prompt
from duplex_actors.model.tiny import make_tiny_model

from .helpers import session_audio


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("parrot", [False, True], ids=["tiny", "parrot"])
def test_same_seed_same_bytes_in_any_directory(tmp_path, parrot):
    a = make_tiny_model(tmp_path / "a" / "first", parrot=parrot)
    b = make_tiny_model(tmp_path / "elsewhere" / "second-dir", parrot=parrot)
    da, db = digests(a), digests(b)
    assert set(da) == {
        "model.safetensors",
        "tokenizer-e351c8d8-checkpoint125.safetensors",
        "tokenizer_spm_32k_3.model",
        "lm_config.json",
        "mimi_config.json",
        "voices/NATF0.pt",
        "voices/NATF2.pt",
        "voices/NATM1.pt",
    }
    assert da == db
    for path in a.rglob("*"):
        if path.is_file():
            assert str(tmp_path).encode() not in path.read_bytes(), f"{path} stores a path"


def test_other_seed_other_weights(tmp_path):
    a = digests(make_tiny_model(tmp_path / "s0", seed=0))
    b = digests(make_tiny_model(tmp_path / "s1", seed=1))
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["tokenizer_spm_32k_3.model"] == b["tokenizer_spm_32k_3.model"]


def test_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("mine")
    with pytest.raises(FileExistsError):
        make_tiny_model(tmp_path / "x")


def test_tiny_mimi_codebooks_are_real(tiny_dir):
    """A fresh Mimi encodes everything to code 0; the tiny one must tell inputs apart."""
    mimi = load_checkpoint(checkpoint_from_dir(tiny_dir)).mimi
    audio = np.concatenate(session_audio(3, 12))
    with torch.no_grad(), mimi.streaming(1):
        codes = mimi.encode(torch.from_numpy(audio)[None, None])[0]
    assert codes.shape == (8, 12)
    for k in range(8):
        assert len(set(codes[k, 2:].tolist())) >= 5, f"codebook {k}: {codes[k].tolist()}"


def test_voice_prompts_have_personaplex_format(tiny_dir):
    for name in ("NATF0.pt", "NATF2.pt", "NATM1.pt"):
        voice = load_voice_prompt(tiny_dir / "voices" / name, dim=128)
        assert voice.embeddings.shape[1:] == (1, 1, 128) and voice.embeddings.shape[0] >= 10
        assert voice.cache.shape == (1, 17, 4) and voice.cache.dtype == torch.int64
        data = torch.load(tiny_dir / "voices" / name, map_location="cpu", weights_only=True)
        assert set(data) == {"embeddings", "cache"}


def test_make_tiny_model_command(tmp_path):
    exe = Path(sys.executable).with_name("duplex-actors")
    out = subprocess.run(
        [str(exe), "make-tiny-model", str(tmp_path / "m"), "--parrot", "--seed", "3"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote parrot checkpoint (seed 3)" in out.stdout
    assert (tmp_path / "m" / "voices" / "NATF2.pt").is_file()
    again = subprocess.run([str(exe), "make-tiny-model", str(tmp_path / "m")], capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_package_import_disables_torch_compile_unless_set():
    code = "import os, duplex_actors; print(os.environ['NO_TORCH_COMPILE'])"
    env = {"PATH": "/usr/bin:/bin"}
    assert (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
        == "1"
    )
    env["NO_TORCH_COMPILE"] = "0"
    assert (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
        == "0"
    )
