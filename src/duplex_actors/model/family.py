"""Model families: what differs between PersonaPlex and plain Moshi, behind one small seam.

A family declares its capabilities, its silence unit, its prompt/prefill policy, its default
sampling, how it validates a session's config (voice, persona) and which runtime-config keys
are server-owned. The family is detected from the checkpoint (bundled voices -> PersonaPlex)
or chosen with ``--family``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from ..audio import FRAME_SAMPLES, SAMPLE_RATE
from .engine import GREEDY, SamplingConfig, SessionPrompt
from .errors import InvalidRuntimeConfig, InvalidVoice

DEFAULT_PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."
)
# Keys that configure the server's model and may never come from a client.
SERVER_OWNED_KEYS = frozenset(
    {
        "personaplex_model_path",
        "personaplex_voice_prompt",
        "personaplex_persona",
        "personaplex_prefill_slots",
    }
)


def wrap_with_system_tags(text: str) -> str:
    """A persona as PersonaPlex's prompt holds it (here, not in personaplex.py, so that the
    server process can count a prompt's tokens without importing torch)."""
    text = text.strip()
    if text.startswith("<system>") and text.endswith("<system>"):
        return text
    return f"<system> {text} <system>"


@attrs.frozen(slots=True)
class FamilyCapabilities:
    voice_prompts: bool
    persona_prompt: bool
    prefill: bool
    sampling: bool = True


MAX_TOP_K = 2**31


def validate_sampling(values: Mapping[str, Any], default: SamplingConfig) -> SamplingConfig:
    """Build a SamplingConfig from client values (``temperature``, ``seed``, ...)."""
    fields: dict[str, Any] = {}
    for name, kind in (
        ("temperature", float),
        ("temperature_text", float),
        ("top_k", int),
        ("top_k_text", int),
        ("seed", int),
    ):
        if name not in values or values[name] is None:
            continue
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRuntimeConfig(f"{name} must be a number")
        # JSON integers have no bound: compare ints as ints (float() of a huge one overflows).
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRuntimeConfig(f"{name} must be a finite number >= 0")
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise InvalidRuntimeConfig(f"{name} must be an integer")
        if value < 0:
            raise InvalidRuntimeConfig(f"{name} must be a finite number >= 0")
        if name.startswith("temperature") and value > 5:
            raise InvalidRuntimeConfig(f"{name} must be <= 5")
        if name == "seed" and value >= 2**32:
            raise InvalidRuntimeConfig("seed must be < 2**32")
        # The engine holds top_k in an int64 tensor; any k past the vocabulary means all of it.
        if name.startswith("top_k") and value >= MAX_TOP_K:
            raise InvalidRuntimeConfig(f"{name} must be < 2**31")
        fields[name] = kind(value)
    return attrs.evolve(default, **fields)


@attrs.frozen(slots=True)
class ModelFamily:
    """Base family; subclasses set the policy fields."""

    name: ClassVar[str] = "base"
    capabilities: ClassVar[FamilyCapabilities]
    sample_rate: ClassVar[int] = SAMPLE_RATE
    silence_unit_samples: ClassVar[int] = FRAME_SAMPLES
    server_owned_keys: ClassVar[frozenset[str]] = SERVER_OWNED_KEYS
    # Default for clients that ask for sampling without giving temperatures.
    default_sampling: ClassVar[SamplingConfig] = SamplingConfig(
        temperature=0.8, temperature_text=0.7, top_k=250, top_k_text=25
    )

    voices: tuple[str, ...] = ()
    # Set by the engine that holds the tokenizer: its context and the positions a prompt's
    # prefill takes. Without them (logic replay, tests) no prompt is too long.
    context_positions: int = 0
    prompt_positions: Callable[[SessionPrompt], int] | None = attrs.field(default=None, eq=False, repr=False)
    # The most positions a prompt may take; None: 3/4 of the context. A pinned prompt takes its
    # positions from the recent memory of the whole session, so it is capped lower.
    prompt_budget: int | None = None
    pinned_prompt: bool = False

    @property
    def default_voice(self) -> str | None:
        return None

    @property
    def prompt_budget_positions(self) -> int:
        if self.prompt_budget is not None:
            return self.prompt_budget
        return self.context_positions * 3 // 4

    def check_context(self, prompt: SessionPrompt) -> None:
        """Refuse a prompt whose prefill would take more than its budget of the model's context
        (3/4 of it; a pinned prompt's cap when prompts are pinned)."""
        if self.prompt_positions is None or not self.context_positions:
            return
        self.check_prompt_positions(self.prompt_positions(prompt))

    def check_prompt_positions(self, used: int) -> None:
        budget = self.prompt_budget_positions
        if self.context_positions and used > budget:
            cap = ", the cap of a pinned prompt" if self.pinned_prompt else ""
            raise InvalidRuntimeConfig(
                f"the persona is too long: its prompt takes {used} of the model's "
                f"{self.context_positions} context positions (at most {budget}{cap})"
            )

    def check_runtime_keys(self, extra: Mapping[str, Any]) -> None:
        owned = sorted(k for k in extra if k in self.server_owned_keys)
        if owned:
            raise InvalidRuntimeConfig(
                f"{', '.join(owned)}: server-owned runtime config, set by the server operator"
            )

    def validate_voice(self, voice: str | None) -> str | None:
        return voice

    def validate_persona(self, persona: str | None) -> str:
        return persona or ""

    def session_prompt(
        self,
        *,
        voice: str | None = None,
        persona: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SessionPrompt:
        """Validate a session's config and return what the engine resets a slot with.

        Greedy unless the client gives a temperature. A stream whose temperature is not given
        stays greedy (``temperature`` is audio, ``temperature_text`` text); ``top_k`` and
        ``top_k_text`` default to the family's (250 and 25).
        """
        if extra:
            self.check_runtime_keys(extra)
        config = GREEDY
        if sampling and any(sampling.get(k) is not None for k in ("temperature", "temperature_text")):
            config = attrs.evolve(self.default_sampling, temperature=0.0, temperature_text=0.0)
        config = validate_sampling(sampling or {}, config)
        return SessionPrompt(
            voice=self.validate_voice(voice),
            persona=self.validate_persona(persona),
            sampling=config,
        )


@attrs.frozen(slots=True)
class PersonaPlexFamily(ModelFamily):
    """NVIDIA PersonaPlex: voice prompt + persona text, prefilled on every (re)start."""

    name: ClassVar[str] = "personaplex"
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities(
        voice_prompts=True, persona_prompt=True, prefill=True
    )

    @property
    def default_voice(self) -> str | None:
        if "NATF2.pt" in self.voices:
            return "NATF2.pt"
        return min(self.voices) if self.voices else None

    def validate_voice(self, voice: str | None) -> str | None:
        if voice is None or voice == "":
            if self.default_voice is None:
                raise InvalidVoice("this checkpoint bundles no voice prompts")
            return self.default_voice
        if (
            not isinstance(voice, str)
            or "/" in voice
            or "\\" in voice
            or voice.startswith(".")
            or not voice.endswith(".pt")
        ):
            raise InvalidVoice(f"voice must be a bundled voice-prompt basename ending in .pt, got {voice!r}")
        if voice not in self.voices:
            raise InvalidVoice(f"unknown voice {voice!r}; bundled voices: {', '.join(self.voices)}")
        return voice

    def validate_persona(self, persona: str | None) -> str:
        if persona is not None and not isinstance(persona, str):
            raise InvalidRuntimeConfig("persona (instructions) must be a string")
        if persona is not None:
            try:
                persona.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRuntimeConfig(
                    "persona (instructions) holds a lone surrogate: not text the tokenizer can read"
                ) from None
        return (persona or "").strip() or DEFAULT_PERSONA


@attrs.frozen(slots=True)
class MoshiFamily(ModelFamily):
    """Kyutai Moshi: no prompt. The first user frame after a reset lands on start-token
    positions and is not seen by the model (moshi's own server drops it the same way)."""

    name: ClassVar[str] = "moshi"
    capabilities: ClassVar[FamilyCapabilities] = FamilyCapabilities(
        voice_prompts=False, persona_prompt=False, prefill=False
    )

    def validate_voice(self, voice: str | None) -> str | None:
        if voice:
            raise InvalidVoice("this model (plain Moshi) takes no voice prompt")
        return None

    def validate_persona(self, persona: str | None) -> str:
        if persona:
            raise InvalidRuntimeConfig("this model (plain Moshi) takes no persona prompt")
        return ""


FAMILIES: dict[str, type[ModelFamily]] = {
    PersonaPlexFamily.name: PersonaPlexFamily,
    MoshiFamily.name: MoshiFamily,
}


def detect_family(voices: Sequence[str], requested: str | None = None) -> ModelFamily:
    """``requested`` (``personaplex``/``moshi``) wins; else bundled voices mean PersonaPlex."""
    if requested is not None:
        if requested not in FAMILIES:
            raise ValueError(f"unknown model family {requested!r}; choose from {sorted(FAMILIES)}")
        return FAMILIES[requested](voices=tuple(sorted(voices)))
    if voices:
        return PersonaPlexFamily(voices=tuple(sorted(voices)))
    return MoshiFamily()
