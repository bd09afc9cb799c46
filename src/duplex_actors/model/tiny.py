"""Tiny checkpoints built through moshi's real loaders, for CPU tests and demos.

``duplex-actors make-tiny-model DIR [--parrot] [--seed N]`` writes a complete checkpoint in
the PersonaPlex layout (see :mod:`.checkpoint`): a tiny Moshi-architecture LM (card 2048,
8 codebooks, context 250), a tiny Mimi whose frame is still 1920 samples at 24 kHz (its
quantizer codebooks calibrated on synthetic audio: a fresh Mimi's codebooks are all zeros and
every frame would encode to code 0), a SentencePiece tokenizer trained in memory, and three
PersonaPlex voice prompts made by running a synthetic voice through the tiny Mimi and LM
(``NATF0.pt`` is the PersonaPlex web UI's default voice, so the stock UI works against them).

Deterministic: the same seed gives the same bytes in any directory (no paths, timestamps or
archives are written into any file; everything is computed with one torch thread).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from ..audio import FRAME_SAMPLES, SAMPLE_RATE
from .engine import TEXT_PAD_ID
from .layout import (
    LM_CONFIG_NAME,
    LM_NAME,
    MIMI_CONFIG_NAME,
    MIMI_NAME,
    TOKENIZER_NAME,
    VOICES_DIR,
    cache_root,
)
from .personaplex import SINE_TOKENS, VOICE_RING

if TYPE_CHECKING:
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

# Bump when the built bytes change on purpose: built-in caches are keyed by it.
# 2: NATF0.pt added (the LM, Mimi, tokenizer and the other voices are unchanged, so logs of
# format 1 still replay: the header's checkpoint SHA-256 is the LM's).
TINY_FORMAT = 2
CARD = 2048
TEXT_CARD = 256
# (pitch Hz, frames). Built in this order, each from its own synthetic audio: adding one
# changes no other's bytes.
VOICES = {"NATF2.pt": (210.0, 13), "NATM1.pt": (115.0, 11), "NATF0.pt": (185.0, 12)}

TINY_LM = {
    "dim": 128,
    "text_card": TEXT_CARD,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 4.125,
    "context": 250,
    "card": CARD,
    "depformer_dim": 64,
    "depformer_dim_feedforward": 264,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
}

_CORPUS = """\
You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way.
You enjoy having a good conversation. Listen carefully, then speak when it is your turn.
Hello, how are you today? I am fine, thank you. What would you like to talk about?
The weather is nice this morning, and the sun is shining over the hills.
Tell me about your day. I went to the market and bought some bread, cheese and apples.
Can you help me with my homework? Of course, let us start with the first question.
A good teacher explains things simply and asks questions to check understanding.
Speech is made of sounds, and every sound is a wave of air pressure in time.
The model listens and speaks at the same time, one frame of audio every eighty milliseconds.
Please wait a moment while I think about that. That is a very interesting idea.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.
Customer service agent: thank you for calling, how may I help you with your order today?
Your package will arrive on Monday. I am sorry for the delay, and I appreciate your patience.
Goodbye, and have a wonderful evening. See you soon, take care of yourself.
<system> You are a helpful assistant. <system>
"""


def tiny_mimi_config() -> dict[str, Any]:
    from moshi.models import loaders

    seanet = dict(loaders._seanet_kwargs)
    seanet.update(dimension=32, n_filters=4)  # ratios [8, 6, 5, 4] keep the 1920-sample frame
    quantizer = dict(loaders._quantizer_kwargs)
    quantizer.update(dimension=16, n_q=16, bins=CARD, input_dimension=32, output_dimension=32)
    transformer = dict(loaders._transformer_kwargs)
    transformer.update(
        d_model=32,
        num_heads=2,
        num_layers=1,
        dim_feedforward=64,
        input_dimension=32,
        output_dimensions=[32],
    )
    return {
        "sample_rate": SAMPLE_RATE,
        "channels": 1,
        "frame_rate": 12.5,
        "seanet": seanet,
        "quantizer": quantizer,
        "transformer": transformer,
    }


@contextmanager
def deterministic(seed: int) -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


def _synthetic_calibration_audio(seed: int, count: int = 8, seconds: float = 2.0) -> npt.NDArray[np.float32]:
    rs = np.random.RandomState(seed)
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    sigs = []
    for _ in range(count):
        f, a = rs.uniform(80, 800), rs.uniform(0.02, 0.5)
        env = 0.5 + 0.5 * np.sin(2 * np.pi * rs.uniform(0.5, 4) * t)
        sig = a * np.sin(2 * np.pi * f * t) * env + rs.uniform(0, 0.2) * rs.randn(len(t))
        sigs.append(sig.astype(np.float32))
    return np.stack(sigs)


@torch.no_grad()
def calibrate_codebooks(mimi: Any, seed: int) -> None:
    """Fill each RVQ level with codewords spread like that level's residuals on real input."""
    audio = torch.from_numpy(_synthetic_calibration_audio(seed))[:, None]
    latent = mimi.encoder(audio)
    latent = mimi.encoder_transformer(latent)[0]
    latent = mimi._to_framerate(latent)
    gen = torch.Generator().manual_seed(seed + 1)
    for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
        proj = rvq.input_proj(latent) if rvq.input_proj is not None else latent
        residual = proj.permute(0, 2, 1).reshape(-1, proj.shape[1])
        for layer in rvq.vq.layers:
            book = layer._codebook
            words = residual.mean(0) + torch.randn(book.embedding_sum.shape, generator=gen) * (
                residual.std(0)
            )
            book.embedding_sum.copy_(words)
            book.cluster_usage.fill_(1.0)
            book._initialized.fill_(1.0)
            residual = residual - words[torch.cdist(residual, words).argmin(1)]


def build_tokenizer_bytes() -> bytes:
    """A small SentencePiece model trained in memory (a file-based one stores its input path)."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS.splitlines()),
        model_writer=out,
        vocab_size=TEXT_CARD,
        hard_vocab_limit=False,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=TEXT_PAD_ID,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def voice_audio(pitch: float, frames: int) -> npt.NDArray[np.float32]:
    """A synthetic voiced vowel: harmonics of ``pitch`` with a slow vibrato and an envelope."""
    t = np.arange(frames * FRAME_SAMPLES) / SAMPLE_RATE
    phase = 2 * np.pi * pitch * (t + 0.002 * np.sin(2 * np.pi * 5 * t) / (2 * np.pi * 5) * pitch)
    wave = sum(np.sin(k * phase) / k for k in range(1, 6))
    env = np.minimum(1.0, np.minimum(t / 0.05, (t[-1] - t) / 0.05 + 0.2))
    audio: npt.NDArray[np.float32] = (0.3 * wave * env).astype(np.float32)
    return audio


@torch.no_grad()
def make_voice_prompt(
    lm: LMModel, mimi: MimiModel, audio: npt.NDArray[np.float32]
) -> dict[str, torch.Tensor]:
    """Run a voice through Mimi and the LM's input embeddings, in PersonaPlex's ``.pt`` format.

    The voice occupies positions 0..F-1 (F frames): text PAD, agent = the voice's codes,
    user = the sine's codes. ``embeddings`` are the summed input embeddings of positions
    0..F-2 in moshi's delayed layout and order; ``cache`` is the 4-column token ring holding
    positions F-3..F (position F only for the delay-1 channels).
    """
    with mimi.streaming(1):
        codes = mimi.encode(torch.from_numpy(audio)[None, None])[0]  # [8, F]
    frames = codes.shape[1]
    n_voice = frames - 1
    delays = lm.delays
    initial = lm._get_initial_token()[0, :, 0]  # [17]

    def token(p: int, k: int) -> int:
        frame = p - delays[k]
        if frame <= 0:  # moshi feeds start tokens where position <= delay
            return int(initial[k])
        if k == 0:
            return TEXT_PAD_ID
        if k <= 8:
            return int(codes[k - 1, min(frame, frames - 1)])
        return SINE_TOKENS[k - 9]

    rows = []
    for p in range(n_voice):
        seq = torch.tensor([[token(p, k)] for k in range(lm.num_codebooks)])[None]  # [1,17,1]
        emb = None
        for cb in range(lm.num_audio_codebooks):
            e = lm.emb[cb](seq[:, cb + lm.audio_offset])
            emb = e if emb is None else emb + e
        assert emb is not None
        rows.append(emb + lm.text_emb(seq[:, 0]))
    embeddings = torch.stack(rows)  # [N, 1, 1, dim]
    cache = torch.zeros(1, lm.num_codebooks, VOICE_RING, dtype=torch.long)
    for p in range(n_voice - 2, n_voice + 2):
        for k in range(lm.num_codebooks):
            if p == n_voice + 1 and delays[k] == 0:
                continue  # not written yet at that point
            cache[0, k, p % VOICE_RING] = token(p, k)
    return {"embeddings": embeddings.contiguous(), "cache": cache}


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_tiny_model(out_dir: Path, *, seed: int = 0, parrot: bool = False) -> Path:
    """Write a tiny checkpoint into ``out_dir`` (created; must be empty or absent)."""
    from moshi.models import loaders

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir}: not empty")
    mimi_config = tiny_mimi_config()
    with deterministic(seed):
        mimi = loaders.get_mimi(None, mimi_config=mimi_config, num_codebooks=8)
        calibrate_codebooks(mimi, seed)
        save_tensors(mimi.state_dict(), out_dir / MIMI_NAME)
        (out_dir / TOKENIZER_NAME).write_bytes(build_tokenizer_bytes())
        if parrot:
            from .parrot import PARROT_LM, build_parrot_lm

            lm_config: dict[str, Any] = dict(PARROT_LM)
            lm = build_parrot_lm(seed)
        else:
            lm_config = dict(TINY_LM)
            kwargs = dict(loaders._lm_kwargs)
            kwargs.update(lm_config, dep_q=8, depformer_context=8)
            lm = loaders.get_moshi_lm(None, lm_kwargs=kwargs, dtype=torch.float32)
        save_tensors(lm.state_dict(), out_dir / LM_NAME)
        write_json(lm_config, out_dir / LM_CONFIG_NAME)
        write_json(mimi_config, out_dir / MIMI_CONFIG_NAME)
        # Voices come from the checkpoint as loaded back, so they match what the engine sees.
        lm_kwargs = dict(loaders._lm_kwargs)
        lm_kwargs.update(lm_config, dep_q=8, depformer_context=8)
        lm = loaders.get_moshi_lm(out_dir / LM_NAME, lm_kwargs=lm_kwargs, dtype=torch.float32)
        mimi = loaders.get_mimi(out_dir / MIMI_NAME, mimi_config=mimi_config, num_codebooks=8)
        (out_dir / VOICES_DIR).mkdir()
        for name, (pitch, frames) in VOICES.items():
            prompt = make_voice_prompt(lm, mimi, voice_audio(pitch, frames))
            torch.save(prompt, out_dir / VOICES_DIR / name)
    return out_dir


def ensure_builtin(name: str, seed: int = 0) -> Path:
    """Build ``tiny`` or ``tiny-parrot`` into the cache on first use; return its directory."""
    target = cache_root() / "models" / f"{name}-f{TINY_FORMAT}-seed{seed}"
    if (target / LM_NAME).is_file():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    make_tiny_model(tmp, seed=seed, parrot=name == "tiny-parrot")
    try:
        tmp.rename(target)
    except OSError:  # built concurrently by another process
        shutil.rmtree(tmp, ignore_errors=True)
    return target
