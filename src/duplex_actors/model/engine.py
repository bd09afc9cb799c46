"""The engine interface (docs/design.md §5): B slots, per-slot reset, one batched lockstep step.

One input frame in, one output frame out, per slot and per step. A slot without a frame in
a step is exec-masked: its state does not advance, as if that step never happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

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
# What a session's KV cache keeps once it is longer than the model's context: ``ring``, moshi's
# ring (the oldest positions go first, the prompt among them); ``pin-prompt``, the prompt stays
# and the rest is a ring (model/pinned_context.py).
CONTEXT_POLICIES = ("ring", "pin-prompt")
DEFAULT_CONTEXT_POLICY = "ring"


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


@attrs.frozen(slots=True)
class EngineDescription:
    """What a session log's ``header`` records about the engine (docs/design.md §5).

    ``engine`` holds the engine's configuration (slots, family, voices, prefill mode, device,
    machine); the server adds its own session limits to it. An engine without a checkpoint
    (a test double) leaves ``checkpoint_sha256``, ``dtype`` and ``engine`` empty.
    """

    model_id: str
    checkpoint_sha256: str = ""
    dtype: str = ""
    engine: Mapping[str, Any] = attrs.field(factory=dict)


class EngineFamily(Protocol):
    """The model family as the server sees it (``duplex_actors.model.family.ModelFamily``)."""

    @property
    def name(self) -> str: ...

    @property
    def voices(self) -> Sequence[str]: ...

    @property
    def default_voice(self) -> str | None: ...

    def session_prompt(
        self,
        *,
        voice: str | None = None,
        persona: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SessionPrompt:
        """Validate a session's config and return what a slot is reset with."""
        ...

    def check_context(self, prompt: SessionPrompt) -> None:
        """Raise InvalidRuntimeConfig if ``prompt`` cannot fit the model's context."""
        ...


class ModelEngine(Protocol):
    """A synchronous lockstep engine with a fixed number of slots."""

    @property
    def slots(self) -> int: ...

    @property
    def family(self) -> EngineFamily:
        """Prompt policy and voices; the session core validates configs with it."""
        ...

    def describe(self) -> EngineDescription:
        """What the log header records; may read the checkpoint (call it off the event loop)."""
        ...

    def prepare(self, prompt: SessionPrompt) -> object:
        """Compute whatever ``reset(slot, prompt)`` will need (a prefill snapshot) ahead of it.

        Thread-safe against ``step``: the scheduler runs it in another worker thread so that one
        new persona never stalls the batch. Returns nothing the caller uses; an engine with
        nothing to prepare returns None at once.
        """
        ...

    def reset(self, slot: int, prompt: SessionPrompt | None) -> None:
        """Start a fresh context in ``slot`` (new session or new epoch), prefilled for
        ``prompt``; ``None``: no prompt (the slot is being freed)."""
        ...

    def step(self, frames: Mapping[int, npt.NDArray[np.float32]]) -> Mapping[int, StepOutput]:
        """Advance every slot in ``frames`` by one 1920-sample frame; the others do not advance."""
        ...
