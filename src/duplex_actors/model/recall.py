"""The recall LM: a tiny Moshi-architecture LM, weights set by hand, that says which persona its
prompt held while the prompt's keyword is still in its KV cache.

It tells what a context policy keeps: served with moshi's ring it reports its persona until the
keyword's position is overwritten (C positions after it) and then never again; with the prompt
pinned it reports it for the session's life. ``make_recall_model(DIR)`` writes a complete
checkpoint (PersonaPlex layout, :mod:`.layout`): this LM, the tiny Mimi of :mod:`.tiny`, a
tokenizer in which each of its personas is one token, and two short voices made from its own
embeddings.

Every parameter is zero except (residual dims: 0 a constant, 1 "a prompt position", 8+k
"persona k"; RoPE pair r = 7 of head 0, whose rotation, 3.2e-4 rad per position, barely moves
over the context):

- every text token embeds 1 in dim 0, and persona k's keyword (a token only its prompt holds)
  also 0.3 in dim 8+k; user codebook 0 = the prompt's sine code (430, which every prompt
  position feeds) embeds 1 in dim 1;
- head 0's query reads dim 0 and its key dim 1 (gain 2), so a prompt position scores about
  22 and any other 0: the head attends to the prompt positions alone; its value reads dims
  8+k and the output writes them back into dim 8+k with gain 200 (the keyword is about one
  prompt position in 20);
- the depformer's first step carries dims 0 and 8+k to agent codebook 0's logits: code 1 for
  the constant, code 100+k for persona k, each with gain 10. So agent codebook 0 is 100+k while
  keyword k is attended to, else 1. Text logits, the other codebooks and every other embedding
  are zero: the model's own output feeds nothing back, only the prompt can say 100+k.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from .engine import TEXT_PAD_ID
from .family import DEFAULT_PERSONA, wrap_with_system_tags
from .layout import LM_CONFIG_NAME, LM_NAME, MIMI_CONFIG_NAME, MIMI_NAME, TOKENIZER_NAME, VOICES_DIR
from .personaplex import SILENCE_FRAMES, SINE_TOKENS
from .tiny import (
    CARD,
    calibrate_codebooks,
    deterministic,
    make_voice_prompt,
    save_tensors,
    tiny_mimi_config,
    voice_audio,
    write_json,
)

if TYPE_CHECKING:
    from moshi.models.lm import LMModel

RECALL_PERSONAS = ("You sell bicycles.", "You teach piano.")
# 2.6 s. The default persona's prompt (the server warms up with it; a session that sets no persona
# gets it) takes 21 positions: within 3/4 of it, and within a pin cap of 24.
RECALL_CONTEXT = 32
NO_RECALL = 1  # agent codebook 0 when no keyword is attended to


def recall_code(persona: int) -> int:
    """Agent codebook 0 while persona ``persona``'s keyword is attended to."""
    return 100 + persona


# (pitch Hz, frames): a voice of F frames takes F - 1 prompt positions.
VOICES = {"NATF2.pt": (210.0, 3), "NATM1.pt": (115.0, 4)}
DIM = 64
HEAD_DIM = 16
ROPE_PAIR = 7
PERSONA_DIMS = 8
RECALL_LM: dict[str, Any] = {
    "dim": DIM,
    "text_card": 256,
    "num_heads": DIM // HEAD_DIM,
    "num_layers": 1,
    "hidden_scale": 2.0,
    "card": CARD,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 64,
    "depformer_num_heads": 2,
    "depformer_num_layers": 1,
}


@attrs.frozen(slots=True)
class RecallModel:
    """A recall checkpoint: where, its context, its personas and each one's keyword token."""

    root: Path
    context: int
    personas: tuple[str, ...]
    keywords: tuple[int, ...]

    def keyword_position(self, persona: int, voice: str) -> int:
        """The prompt position of persona ``persona``'s keyword with ``voice`` (its last one)."""
        tokens = self._tokens(persona)
        last = len(tokens) - 1 - tokens[::-1].index(self.keywords[persona])
        return VOICES[voice][1] - 1 + 1 + SILENCE_FRAMES + last

    def prompt_positions(self, persona: int, voice: str) -> int:
        """The positions of persona ``persona``'s prompt with ``voice`` (the pin when pinned)."""
        return VOICES[voice][1] - 1 + 1 + 2 * SILENCE_FRAMES + len(self._tokens(persona))

    def _tokens(self, persona: int) -> list[int]:
        import sentencepiece

        tokenizer = sentencepiece.SentencePieceProcessor()
        tokenizer.Load(str(self.root / TOKENIZER_NAME))
        return list(tokenizer.encode(wrap_with_system_tags(self.personas[persona])))


def build_recall_tokenizer(personas: tuple[str, ...]) -> bytes:
    """A SentencePiece model in which each persona, and the default one, is a single token, so a
    prompt takes few positions (``"<system> persona <system>"``: 6 tokens); any other text reads
    as ``<unk>``."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([DEFAULT_PERSONA, *personas]),
        model_writer=out,
        vocab_size=64,
        hard_vocab_limit=False,
        model_type="unigram",
        split_by_whitespace=False,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=TEXT_PAD_ID,
        user_defined_symbols=["<system>", *(p.replace(" ", "\u2581") for p in (DEFAULT_PERSONA, *personas))],
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def pick_keywords(tokenizer: Any, personas: tuple[str, ...]) -> tuple[int, ...]:
    """Per persona, the first token of its prompt that no other prompt (nor the default
    persona's, which a session that sets none gets) holds."""
    prompts = [list(tokenizer.encode(wrap_with_system_tags(p))) for p in (*personas, DEFAULT_PERSONA)]
    keywords = []
    for k, tokens in enumerate(prompts[: len(personas)]):
        others = {t for j, other in enumerate(prompts) if j != k for t in other}
        unique = [t for t in tokens if t > TEXT_PAD_ID and t not in others]
        if not unique:
            raise ValueError(f"persona {personas[k]!r} has no token of its own")
        keywords.append(unique[0])
    return tuple(keywords)


@torch.no_grad()
def build_recall_lm(context: int, keywords: tuple[int, ...]) -> LMModel:
    from moshi.models import loaders

    if len(keywords) > PERSONA_DIMS:
        raise ValueError(f"at most {PERSONA_DIMS} personas")
    kwargs = dict(loaders._lm_kwargs)
    kwargs.update(RECALL_LM, context=context, dep_q=8, depformer_context=8)
    lm: Any = loaders.get_moshi_lm(None, lm_kwargs=kwargs, dtype=torch.float32)
    for name, param in lm.named_parameters():
        param.fill_(1.0 if name.endswith("alpha") else 0.0)  # RMSNorm gains 1, the rest 0
    lm.text_emb.weight[:, 0] = 1.0
    lm.emb[8].weight[SINE_TOKENS[0], 1] = 1.0  # user codebook 0 is audio stream 8
    attn = lm.transformer.layers[0].self_attn
    in_proj = attn.in_projs[0].weight  # rows: q | k | v, each head after head
    j = 2 * ROPE_PAIR  # the real part of RoPE pair r of head 0
    in_proj[j, 0] = 1.0
    in_proj[DIM + j, 1] = 2.0
    lm.depformer_in[0].weight[0, 0] = 1.0
    lm.linears[0].weight[NO_RECALL, 0] = 10.0
    for k, keyword in enumerate(keywords):
        lm.text_emb.weight[keyword, PERSONA_DIMS + k] = 0.3
        in_proj[2 * DIM + k, PERSONA_DIMS + k] = 1.0
        attn.out_projs[0].weight[PERSONA_DIMS + k, k] = 200.0
        lm.depformer_in[0].weight[1 + k, PERSONA_DIMS + k] = 1.0
        lm.linears[0].weight[recall_code(k), 1 + k] = 10.0
    built: LMModel = lm
    return built


def make_recall_model(
    out_dir: Path,
    *,
    context: int = RECALL_CONTEXT,
    personas: tuple[str, ...] = RECALL_PERSONAS,
    seed: int = 0,
) -> RecallModel:
    """Write a recall checkpoint into ``out_dir`` (created; must be empty or absent)."""
    import sentencepiece
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
        (out_dir / TOKENIZER_NAME).write_bytes(build_recall_tokenizer(personas))
        tokenizer = sentencepiece.SentencePieceProcessor()
        tokenizer.Load(str(out_dir / TOKENIZER_NAME))
        keywords = pick_keywords(tokenizer, personas)
        lm = build_recall_lm(context, keywords)
        save_tensors(lm.state_dict(), out_dir / LM_NAME)
        lm_config = {**RECALL_LM, "context": context}
        write_json(lm_config, out_dir / LM_CONFIG_NAME)
        write_json(mimi_config, out_dir / MIMI_CONFIG_NAME)
        (out_dir / VOICES_DIR).mkdir()
        for name, (pitch, frames) in VOICES.items():
            torch.save(make_voice_prompt(lm, mimi, voice_audio(pitch, frames)), out_dir / VOICES_DIR / name)
    return RecallModel(root=out_dir, context=context, personas=personas, keywords=keywords)
