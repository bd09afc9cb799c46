"""Voice aliases: OpenAI's voice names (and any an operator adds) mapped onto bundled voices.

Voice-agent frameworks send OpenAI's default voices (``ash``, ``marin``, ...). A session asking
for an alias gets the bundled voice prompt it maps to; the session config echoes the name the
client asked for and names the voice prompt under ``voice_prompt``. The table is the default
one below, less the aliases whose voice the checkpoint does not bundle, plus the operator's
(``--voice-alias NAME=FILE.pt``, which replace a default of the same name). A checkpoint with no
voice prompts (plain Moshi) takes every alias as "the model's own voice".

The table of a session is recorded in its log's header (``engine.voice_aliases``), so a replay
resolves the same names. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

# OpenAI's Realtime voices, each given a bundled PersonaPlex voice of a like register. Every
# target is bundled by the built-in tiny checkpoints and by nvidia/personaplex-7b-v1.
DEFAULT_VOICE_ALIASES: Final[Mapping[str, str]] = {
    "alloy": "NATF2.pt",
    "ash": "NATM1.pt",
    "ballad": "NATM1.pt",
    "coral": "NATF0.pt",
    "echo": "NATM1.pt",
    "sage": "NATF2.pt",
    "shimmer": "NATF0.pt",
    "verse": "NATM1.pt",
    "marin": "NATF2.pt",
    "cedar": "NATM1.pt",
}


class VoiceAliasError(ValueError):
    """An alias an operator gave that cannot be used; the message names it."""


def parse_voice_alias(text: str) -> tuple[str, str]:
    """``NAME=FILE.pt`` as (name, voice); raises :class:`VoiceAliasError`."""
    name, sep, voice = text.partition("=")
    name, voice = name.strip(), voice.strip()
    if not sep or not name or not voice:
        raise VoiceAliasError(f"voice alias {text!r}: expected NAME=FILE.pt")
    if voice.endswith(".pt") is False or "/" in voice or "\\" in voice or voice.startswith("."):
        raise VoiceAliasError(f"voice alias {text!r}: the voice must be a bundled .pt basename")
    if name.endswith(".pt"):
        raise VoiceAliasError(f"voice alias {text!r}: an alias must not itself end in .pt")
    return name, voice


def voice_alias_table(voices: Iterable[str], overrides: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The aliases of a checkpoint bundling ``voices``: the defaults it can serve, then the
    operator's ``overrides`` (each must name a bundled voice, else :class:`VoiceAliasError`).
    With no voices at all every alias maps to ``""`` (the model's own voice)."""
    bundled = set(voices)
    if not bundled:
        return {name: "" for name in [*DEFAULT_VOICE_ALIASES, *(n for n, _ in overrides)]}
    table = {name: voice for name, voice in DEFAULT_VOICE_ALIASES.items() if voice in bundled}
    for name, voice in overrides:
        if voice not in bundled:
            raise VoiceAliasError(
                f"voice alias {name}={voice}: {voice} is not bundled (bundled: {', '.join(sorted(bundled))})"
            )
        table[name] = voice
    return table


@attrs.frozen(slots=True)
class AliasedVoices:
    """A prompt policy (the session core's) that resolves voice aliases, then asks ``family``."""

    family: Any  # the model family (model.family.ModelFamily) or another prompt policy
    aliases: Mapping[str, str]

    def session_prompt(
        self,
        *,
        voice: str | None = None,
        persona: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Any:
        if isinstance(voice, str) and voice in self.aliases:
            voice = self.aliases[voice]
        return self.family.session_prompt(voice=voice, persona=persona, sampling=sampling, extra=extra)

    def check_context(self, prompt: Any) -> None:
        self.family.check_context(prompt)
