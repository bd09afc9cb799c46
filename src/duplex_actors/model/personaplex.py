"""PersonaPlex's prompt prefill on moshi 0.2.13: voice prompts and the forced-token schedule.

A PersonaPlex session starts with a fully forced prompt (docs/design.md, decision 3):
voice positions -> 6 silence frames -> the tokens of ``"<system> persona <system>"`` -> 6
silence frames. During the prompt the agent stream is forced to Mimi's silence codes and the
user stream to a 440 Hz sine's codes. :func:`build_prefill_plan` turns a voice prompt and
persona tokens into one :class:`PrefillCall` per ``LMGen.step`` call.

Positions use moshi's delayed layout: position ``p`` holds text ``p``, agent/user codebook 0
of frame ``p`` and codebooks 1..7 of frame ``p - 1``.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import torch

from .engine import NUM_CODEBOOKS, TEXT_PAD_ID
from .errors import CheckpointError
from .family import DEFAULT_PERSONA, wrap_with_system_tags  # noqa: F401  (re-exported)

# PersonaPlex's hard-coded Mimi codes (personaplex/moshi/models/lm.py).
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
SILENCE_FRAMES = 6  # int(0.5 s * 12.5 Hz), before and after the text prompt
VOICE_RING = 4  # PersonaPlex's LMGen token ring has 4 columns
NUM_STREAMS = 1 + 2 * NUM_CODEBOOKS  # text, 8 agent codebooks, 8 user codebooks


@attrs.frozen(slots=True, eq=False)
class VoicePrompt:
    """A PersonaPlex ``.pt`` voice: summed input embeddings and the token ring after them.

    ``embeddings``: ``[N, 1, 1, dim]``, one per voice position (row 0 is the start-token
    column). ``cache``: int64 ``[1, 17, 4]``, PersonaPlex's token ring after the voice.
    """

    name: str
    embeddings: torch.Tensor
    cache: torch.Tensor

    @property
    def positions(self) -> int:
        return int(self.embeddings.shape[0])


def load_voice_prompt(
    path: Path, *, dim: int, text_card: int | None = None, card: int | None = None
) -> VoicePrompt:
    """Load and validate a ``.pt`` voice prompt for an LM of width ``dim``."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable PersonaPlex voice prompt ({exc})") from exc
    if not isinstance(data, dict) or "embeddings" not in data or "cache" not in data:
        raise CheckpointError(f"{path}: expected a dict with 'embeddings' [N,1,1,{dim}] and 'cache' [1,17,4]")
    emb, cache = data["embeddings"], data["cache"]
    if (
        not isinstance(emb, torch.Tensor)
        or emb.dim() != 4
        or tuple(emb.shape[1:]) != (1, 1, dim)
        or emb.shape[0] < 2
        or not emb.dtype.is_floating_point
    ):
        shape = tuple(emb.shape) if isinstance(emb, torch.Tensor) else type(emb).__name__
        raise CheckpointError(f"{path}: 'embeddings' must be float [N>=2,1,1,{dim}], got {shape}")
    if (
        not isinstance(cache, torch.Tensor)
        or tuple(cache.shape) != (1, NUM_STREAMS, VOICE_RING)
        or cache.dtype != torch.int64
    ):
        shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise CheckpointError(f"{path}: 'cache' must be int64 [1,17,4], got {shape}")
    if not bool(torch.isfinite(emb.float()).all()):
        raise CheckpointError(f"{path}: 'embeddings' contains NaN or infinite values")
    if text_card is not None and card is not None:
        # Ids the LM can embed: text 0..text_card (text_card = start token), audio 0..card.
        text_ok = bool(((cache[0, 0] >= 0) & (cache[0, 0] <= text_card)).all())
        audio_ok = bool(((cache[0, 1:] >= 0) & (cache[0, 1:] <= card)).all())
        if not (text_ok and audio_ok):
            raise CheckpointError(
                f"{path}: 'cache' holds token ids outside the model's vocabularies "
                f"(text 0..{text_card}, audio 0..{card})"
            )
    return VoicePrompt(name=path.name, embeddings=emb, cache=cache)


@attrs.frozen(slots=True, eq=False)
class PrefillCall:
    """One forced ``LMGen.step`` call of the prompt.

    ``user``: the 8 user tokens passed to the step (codebook 0 of this position, codebooks
    1..7 of the next). ``text``/``agent``: values forced into the step's sampled tokens, with
    ``agent_mask`` saying which agent codebooks are forced (None text = not forced).
    ``embedding``: the summed input embedding that replaces this position's, if any.
    """

    user: tuple[int, ...]
    text: int | None
    agent: tuple[int, ...]
    agent_mask: tuple[bool, ...]
    embedding: torch.Tensor | None


@attrs.frozen(slots=True, eq=False)
class PrefillPlan:
    calls: tuple[PrefillCall, ...]

    def __len__(self) -> int:
        return len(self.calls)


def prefill_positions(voice: VoicePrompt, n_persona_tokens: int) -> int:
    """``len(build_prefill_plan(voice, tokens))`` for ``n_persona_tokens`` tokens, without building it."""
    return voice.positions + 1 + 2 * SILENCE_FRAMES + n_persona_tokens


def build_prefill_plan(voice: VoicePrompt, persona_tokens: list[int]) -> PrefillPlan:
    """The forced-call schedule for a ``.pt`` voice followed by the persona text prompt."""
    n_voice = voice.positions  # N: positions 0..N-1 are embedding overrides
    frames: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []  # (text, agent, user)
    silence = (TEXT_PAD_ID, SILENCE_TOKENS, SINE_TOKENS)
    frames += [silence] * SILENCE_FRAMES
    frames += [(tok, SILENCE_TOKENS, SINE_TOKENS) for tok in persona_tokens]
    frames += [silence] * SILENCE_FRAMES
    # Frame index f of `frames[i]` is n_voice + 1 + i; the prompt has P = n_voice + 1 + len.
    total = n_voice + 1 + len(frames)
    ring = voice.cache[0].tolist()  # [17][4]

    # Position table for p in 0..P (position P holds the model's first free choice).
    text = np.zeros(total + 1, dtype=np.int64)
    agent = np.zeros((total + 1, NUM_CODEBOOKS), dtype=np.int64)
    user = np.zeros((total + 1, NUM_CODEBOOKS), dtype=np.int64)
    for p in range(total + 1):
        if p < n_voice:
            # Overridden by the embedding; tokens only have to be valid ids.
            text[p], agent[p], user[p] = TEXT_PAD_ID, SILENCE_TOKENS, SINE_TOKENS
            continue
        if p == n_voice:
            column = [ring[k][p % VOICE_RING] for k in range(NUM_STREAMS)]
            text[p] = column[0]
            agent[p] = column[1 : 1 + NUM_CODEBOOKS]
            user[p] = column[1 + NUM_CODEBOOKS :]
            continue
        f = p - n_voice - 1
        if f < len(frames):
            text[p] = frames[f][0]
            agent[p, 0], user[p, 0] = frames[f][1][0], frames[f][2][0]
        if p == n_voice + 1:
            column = [ring[k][p % VOICE_RING] for k in range(NUM_STREAMS)]
            agent[p, 1:] = column[2 : 1 + NUM_CODEBOOKS]
            user[p, 1:] = column[2 + NUM_CODEBOOKS :]
        else:
            prev = frames[f - 1]
            agent[p, 1:], user[p, 1:] = prev[1][1:], prev[2][1:]

    calls = []
    all_forced = (True,) * NUM_CODEBOOKS
    for n in range(total):
        last = n == total - 1
        calls.append(
            PrefillCall(
                user=(int(user[n, 0]), *(int(x) for x in user[n + 1, 1:])),
                text=None if last else int(text[n + 1]),
                agent=tuple(int(x) for x in agent[n + 1]),
                agent_mask=(False, *all_forced[1:]) if last else all_forced,
                embedding=voice.embeddings[n, 0] if n < n_voice else None,
            )
        )
    return PrefillPlan(calls=tuple(calls))
