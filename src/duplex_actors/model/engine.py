"""The engine interface (DESIGN §5): B slots, per-slot reset, one batched lockstep step.

One input frame in, one output frame out, per slot and per step. A slot without a frame in
a step is exec-masked: its state does not advance, as if that step never happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

NUM_CODEBOOKS = 8
# Text ids the model uses for "no text": PAD and end-of-padding. Never shown to users.
TEXT_PAD_ID = 3
TEXT_EPAD_ID = 0
# Token value reported for a slot whose output frame is not generated yet (the first step
# after a plain Moshi reset): moshi's ``ungenerated_token_id``.
UNGENERATED = -2


@attrs.frozen(slots=True)
class SamplingConfig:
    """Per-session decoding. ``temperature <= 0`` for a stream means greedy for that stream.

    ``seed`` feeds the counter-based per-slot sampler, so a session's draws depend only on
    (seed, frame, stream, token) and never on the batch it shares.
    """

    temperature: float = 0.0
    temperature_text: float = 0.0
    top_k: int = 250
    top_k_text: int = 25
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 and self.temperature_text <= 0


GREEDY = SamplingConfig()


@attrs.frozen(slots=True)
class SessionPrompt:
    """What a slot is reset with: the voice prompt, the persona text and the decoding config.

    ``voice`` is a bundled voice-prompt basename (``NATF2.pt``) or None for a family without
    voice prompts. ``persona`` is the text prompt, already defaulted by the model family.
    """

    voice: str | None = None
    persona: str = ""
    sampling: SamplingConfig = GREEDY


@attrs.frozen(slots=True, eq=False)
class StepOutput:
    """One slot's result of one step.

    ``ready`` is False only for a frame the model has not generated yet (the first step after
    a plain Moshi reset); its tokens are ``UNGENERATED`` and its PCM is silence.
    ``user_codes`` are the Mimi codes of the input frame, as the model saw them.
    """

    ready: bool
    text_token: int
    text_piece: str
    agent_codes: tuple[int, ...]
    user_codes: tuple[int, ...]
    pcm: npt.NDArray[np.float32]  # [FRAME_SAMPLES]


class ModelEngine(Protocol):
    """A synchronous lockstep engine with a fixed number of slots."""

    @property
    def slots(self) -> int: ...

    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        """Start a fresh context in ``slot`` (new session or new epoch), prefilled for
        ``prompt``; ``None``: no prompt (the slot is being freed)."""
        ...

    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> Mapping[int, StepOutput]:
        """Advance every slot in ``frames`` by one 1920-sample frame; the others do not advance."""
        ...
