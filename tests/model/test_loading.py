"""Checkpoint resolution and strict loading: local dirs, the HF cache, depformer layouts, voices."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.engine import SessionPrompt
from duplex_actors.model.errors import CheckpointError, InvalidVoice
from duplex_actors.model.factory import resolve_checkpoint
from duplex_actors.model.family import PersonaPlexFamily, detect_family
from duplex_actors.model.layout import LM_CONFIG_NAME, LM_NAME, MIMI_NAME, TOKENIZER_NAME
from duplex_actors.model.loading import load_checkpoint

from .helpers import Session, engine, first_divergence, run_alone, session_audio


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_builtin_tiny_resolves_and_loads(tiny_dir):
    files = resolve_checkpoint("tiny")
    assert files.root == tiny_dir
    assert sorted(files.voices) == ["NATF0.pt", "NATF2.pt", "NATM1.pt"]
    loaded = load_checkpoint(files)
    assert loaded.lm.dep_q == 8 and loaded.lm.card == 2048 and loaded.lm.context == 250
    assert loaded.mimi.frame_size == 1920 and loaded.mimi.sample_rate == 24_000
    assert loaded.dtype == torch.float32


@pytest.mark.parametrize(
    "missing, expected",
    [(LM_NAME, "LM weights"), (MIMI_NAME, "Mimi"), (TOKENIZER_NAME, "SentencePiece")],
)
def test_missing_file_is_named(tiny_dir, tmp_path, missing, expected):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    (ckpt / missing).unlink()
    with pytest.raises(CheckpointError, match=rf"{missing}: missing; expected .*{expected}"):
        checkpoint_from_dir(ckpt)


def test_wrong_tensor_shape_fails_with_a_clear_error(tiny_dir, tmp_path):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    state = load_file(ckpt / LM_NAME)
    state["text_linear.weight"] = torch.zeros(7, state["text_linear.weight"].shape[1])
    save_file(state, ckpt / LM_NAME)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*text_linear\.weight.*shape"):
        load_checkpoint(checkpoint_from_dir(ckpt))


def test_malformed_files_name_the_file(tiny_dir, tmp_path):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    (ckpt / LM_NAME).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: expected a safetensors"):
        load_checkpoint(checkpoint_from_dir(ckpt))
    ckpt2 = copy_checkpoint(tiny_dir, tmp_path / "ckpt2")
    (ckpt2 / TOKENIZER_NAME).write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"tokenizer_spm_32k_3\.model: expected a SentencePiece"):
        load_checkpoint(checkpoint_from_dir(ckpt2))
    ckpt3 = copy_checkpoint(tiny_dir, tmp_path / "ckpt3")
    (ckpt3 / LM_CONFIG_NAME).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"lm_config\.json: expected"):
        checkpoint_from_dir(ckpt3)


def _to_16_steps(state: dict[str, torch.Tensor], fused: bool) -> dict[str, torch.Tensor]:
    """A PersonaPlex-style 16-step depformer: steps 8..15 are fresh random weights."""
    gen = torch.Generator().manual_seed(5)
    out = dict(state)
    for key, value in state.items():
        parts = key.split(".")
        for name, count, _offset in (("linears", 8, 0), ("depformer_in", 8, 0), ("depformer_emb", 7, 0)):
            if parts[0] == name and int(parts[1]) == count - 1:
                for extra in range(8):
                    new = ".".join([name, str(count + extra), *parts[2:]])
                    out[new] = torch.randn(value.shape, generator=gen) * 0.1
        if key.startswith("depformer.layers.") and (
            ".gating.7." in key or ".in_projs.7." in key or ".out_projs.7." in key
        ):
            for extra in range(8):
                new = key.replace(".7.", f".{8 + extra}.")
                out[new] = torch.randn(value.shape, generator=gen) * 0.1
    if fused:  # PersonaPlex's old names: one fused [16 * rows, cols] tensor per layer
        for layer in {k.split(".")[2] for k in out if k.startswith("depformer.layers.")}:
            prefix = f"depformer.layers.{layer}.self_attn."
            for new, old in (("in_proj_weight", "in_projs"), ("out_proj.weight", "out_projs")):
                chunks = [out.pop(f"{prefix}{old}.{i}.weight") for i in range(16)]
                out[prefix + new] = torch.cat(chunks, 0)
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["per-step-keys", "fused-personaplex-keys"])
def test_16_step_depformer_is_cut_to_8_with_identical_output(tiny_dir, tmp_path, fused):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt16")
    state = load_file(ckpt / LM_NAME)
    state16 = _to_16_steps(state, fused)
    assert sum(k.startswith("linears.") for k in state16) == 16
    save_file(state16, ckpt / LM_NAME)
    session = Session(SessionPrompt("NATF2.pt", "hi"), session_audio(7, 6))
    ref = run_alone(engine(tiny_dir, 1), session)
    got = run_alone(engine(ckpt, 1), session)
    assert first_divergence(ref, got) is None


def test_depformer_with_other_step_count_is_refused(tiny_dir, tmp_path):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    state = load_file(ckpt / LM_NAME)
    del state["linears.7.weight"]
    save_file(state, ckpt / LM_NAME)
    with pytest.raises(CheckpointError, match="depformer has 7 steps"):
        load_checkpoint(checkpoint_from_dir(ckpt))


def _hf_cache_layout(src: Path, cache: Path, repo: str, commit: str = "a" * 40) -> None:
    """Lay a checkpoint out exactly as huggingface_hub caches a downloaded repo."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / path.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * len(link.relative_to(repo_dir).parts[1:]) + f"blobs/{blob.name}"))


def test_hugging_face_repo_from_the_offline_cache(tiny_dir, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    _hf_cache_layout(tiny_dir, cache, "local-org/tiny-personaplex")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    files = resolve_checkpoint("local-org/tiny-personaplex")
    assert files.model_id == "local-org/tiny-personaplex"
    assert files.lm.read_bytes() == (tiny_dir / LM_NAME).read_bytes()
    assert sorted(files.voices) == ["NATF0.pt", "NATF2.pt", "NATM1.pt"]
    assert files.lm_sha256() == hashlib.sha256((tiny_dir / LM_NAME).read_bytes()).hexdigest()
    session = Session(SessionPrompt("NATM1.pt", "hi"), session_audio(8, 5))
    hub_engine = engine(files.root, 1)
    assert first_divergence(run_alone(engine(tiny_dir, 1), session), run_alone(hub_engine, session)) is None
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache"):
        resolve_checkpoint("local-org/absent")


def test_voices_from_a_tgz(tiny_dir, tmp_path):
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    with tarfile.open(ckpt / "voices.tgz", "w:gz") as tar:
        tar.add(ckpt / "voices", arcname="voices")
    shutil.rmtree(ckpt / "voices")
    files = checkpoint_from_dir(ckpt)
    assert sorted(files.voices) == ["NATF0.pt", "NATF2.pt", "NATM1.pt"]
    assert files.voices["NATF2.pt"].read_bytes() == (tiny_dir / "voices" / "NATF2.pt").read_bytes()


def test_unknown_spec_is_explained():
    with pytest.raises(CheckpointError, match="not a built-in model"):
        resolve_checkpoint("no such thing here")


@pytest.mark.parametrize(
    "voice", ["../NATF2.pt", "voices/NATF2.pt", "NATF2.wav", "NOPE.pt", ".pt", "/etc/passwd"]
)
def test_bad_voice_names_are_refused(tiny_dir, voice):
    family = detect_family(["NATF2.pt", "NATM1.pt"])
    with pytest.raises(InvalidVoice) as info:
        family.session_prompt(voice=voice)
    assert info.value.code == "invalid_voice"
    eng = engine(tiny_dir, 1)
    with pytest.raises(InvalidVoice):
        eng.reset(0, SessionPrompt(voice=voice, persona="x"))


def test_malformed_voice_prompt_is_a_checkpoint_error_at_start_up(tiny_dir, tmp_path):
    """Every bundled voice is loaded with the engine: a bad one is named before serving starts."""
    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    torch.save(
        {"embeddings": torch.zeros(3, 1, 1, 5), "cache": torch.zeros(1, 17, 4, dtype=torch.long)},
        ckpt / "voices" / "NATM1.pt",
    )
    with pytest.raises(CheckpointError, match=r"NATM1\.pt: 'embeddings' must be float \[N>=2,1,1,128\]"):
        engine(ckpt, 1)
    good = torch.load(tiny_dir / "voices" / "NATF2.pt", weights_only=True)
    good["cache"][0, 3, 1] = 5000  # beyond the audio card
    torch.save(good, ckpt / "voices" / "NATM1.pt")
    with pytest.raises(CheckpointError, match=r"NATM1\.pt: 'cache' holds token ids outside"):
        engine(ckpt, 1)
    (ckpt / "voices" / "NATM1.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"NATM1\.pt: not a readable PersonaPlex voice prompt"):
        engine(ckpt, 1)


def test_a_persona_too_long_for_the_context_is_refused(tiny_dir):
    from duplex_actors.model.errors import InvalidRuntimeConfig

    eng = engine(tiny_dir, 1)
    with pytest.raises(InvalidRuntimeConfig, match="persona is too long"):
        eng.reset(0, SessionPrompt(voice="NATF2.pt", persona="words and more words " * 60))
    eng.reset(0, SessionPrompt(voice="NATF2.pt", persona="short"))


def test_the_engines_family_refuses_a_persona_past_the_context_budget(tiny_dir):
    from duplex_actors.model.errors import InvalidRuntimeConfig

    eng = engine(tiny_dir, 1)
    family = eng.family
    long = family.session_prompt(persona="words and more words " * 60)
    with pytest.raises(InvalidRuntimeConfig, match="persona is too long"):
        family.check_context(long)
    short = family.session_prompt(persona="short")
    family.check_context(short)
    # The family counts exactly the positions the engine's prefill plan takes.
    assert family.prompt_positions is not None
    assert family.prompt_positions(short) == len(eng.prefill_plan(short))
    # The family a logic replay builds has no tokenizer and no budget.
    detect_family(list(family.voices)).check_context(long)


def test_a_persona_with_a_lone_surrogate_is_refused_at_validation():
    from duplex_actors.model.errors import InvalidRuntimeConfig

    family = detect_family(["NATF2.pt"])
    with pytest.raises(InvalidRuntimeConfig, match="lone surrogate"):
        family.session_prompt(persona="\ud800 hi")
    assert family.session_prompt(persona="caf\u00e9 \U0001f600").persona == "caf\u00e9 \U0001f600"


def test_family_detection_and_defaults():
    pp = detect_family(["NATM1.pt", "NATF2.pt", "VARF0.pt"])
    assert isinstance(pp, PersonaPlexFamily) and pp.default_voice == "NATF2.pt"
    assert detect_family(["VARM0.pt", "NATM1.pt"]).default_voice == "NATM1.pt"
    prompt = pp.session_prompt()
    assert prompt.voice == "NATF2.pt" and prompt.persona.startswith("You are a wise and friendly teacher")
    assert prompt.sampling.greedy
    sampled = pp.session_prompt(sampling={"temperature": 0.5, "seed": 9})
    assert (
        sampled.sampling.temperature == 0.5 and sampled.sampling.seed == 9 and sampled.sampling.top_k == 250
    )
    moshi = detect_family([])
    assert moshi.name == "moshi" and moshi.session_prompt().voice is None
    assert detect_family(["NATF2.pt"], "moshi").name == "moshi"
    with pytest.raises(ValueError, match="unknown model family"):
        detect_family([], "gpt")


def test_server_owned_runtime_keys_are_refused():
    pp = detect_family(["NATF2.pt"])
    for key in (
        "personaplex_model_path",
        "personaplex_voice_prompt",
        "personaplex_persona",
        "personaplex_prefill_slots",
    ):
        with pytest.raises(Exception) as info:
            pp.session_prompt(extra={key: "x"})
        assert getattr(info.value, "code", None) == "invalid_duplex_runtime_config"
    pp.session_prompt(extra={"personaplex_something_else": 1, "foo": 2})
    for bad in (
        {"temperature": -1},
        {"temperature": float("nan")},
        {"seed": 2**40},
        {"top_k": 1.5},
        {"temperature": "hot"},
    ):
        with pytest.raises(Exception) as info:
            pp.session_prompt(sampling=bad)
        assert getattr(info.value, "code", None) == "invalid_duplex_runtime_config"
