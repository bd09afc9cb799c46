"""Voice aliases (model/voices.py): the default table, the operator's, and how they are set
(``--voice-alias`` / ``DUPLEX_VOICE_ALIASES``; the flag end to end in tests/e2e/test_voice_frameworks.py
through the defaults)."""

from __future__ import annotations

import pytest

from duplex_actors.cli import build_parser
from duplex_actors.config import ConfigError, ServerConfig, parse_voice_aliases
from duplex_actors.model.family import detect_family
from duplex_actors.model.voices import (
    DEFAULT_VOICE_ALIASES,
    AliasedVoices,
    VoiceAliasError,
    parse_voice_alias,
    voice_alias_table,
)

OPENAI_VOICES = {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"}
TINY = ["NATF0.pt", "NATF2.pt", "NATM1.pt"]


def test_the_default_table_names_every_openai_voice_and_the_tiny_checkpoint_serves_all() -> None:
    assert set(DEFAULT_VOICE_ALIASES) == OPENAI_VOICES
    assert voice_alias_table(TINY) == dict(DEFAULT_VOICE_ALIASES)


def test_the_operators_aliases_replace_and_add_and_must_be_bundled() -> None:
    table = voice_alias_table(TINY, [("ash", "NATF0.pt"), ("butler", "NATM1.pt")])
    assert table["ash"] == "NATF0.pt" and table["butler"] == "NATM1.pt" and table["cedar"] == "NATM1.pt"
    with pytest.raises(VoiceAliasError, match=r"NOPE\.pt is not bundled"):
        voice_alias_table(TINY, [("ash", "NOPE.pt")])
    # Defaults whose voice the checkpoint lacks are left out; no voices at all: the model's own.
    assert set(voice_alias_table(["NATF2.pt"])) == {"alloy", "sage", "marin"}
    assert voice_alias_table([])["ash"] == ""


def test_an_alias_resolves_through_the_family_and_a_moshi_model_takes_it_as_its_own_voice() -> None:
    policy = AliasedVoices(detect_family(TINY), voice_alias_table(TINY))
    assert policy.session_prompt(voice="marin").voice == "NATF2.pt"
    assert policy.session_prompt(voice="NATM1.pt").voice == "NATM1.pt"
    moshi = AliasedVoices(detect_family([]), voice_alias_table([]))
    assert moshi.session_prompt(voice="ash").voice is None


@pytest.mark.parametrize("text", ["ash", "ash=", "=NATM1.pt", "ash=../x.pt", "ash=x.wav", "a.pt=NATM1.pt"])
def test_a_malformed_alias_is_refused(text: str) -> None:
    with pytest.raises(VoiceAliasError):
        parse_voice_alias(text)


def test_the_flag_and_the_env_set_the_aliases() -> None:
    assert parse_voice_alias(" butler = NATM1.pt ") == ("butler", "NATM1.pt")
    assert ServerConfig().voice_aliases == () and ServerConfig.from_env({}).voice_aliases == ()
    env = {"DUPLEX_VOICE_ALIASES": "butler=NATM1.pt, ash=NATF0.pt"}
    assert ServerConfig.from_env(env).voice_aliases == (("butler", "NATM1.pt"), ("ash", "NATF0.pt"))
    with pytest.raises(ConfigError, match="DUPLEX_VOICE_ALIASES"):
        ServerConfig.from_env({"DUPLEX_VOICE_ALIASES": "butler"})
    args = build_parser().parse_args(["serve", "--voice-alias", "a=NATM1.pt", "--voice-alias", "b=NATF2.pt"])
    assert parse_voice_aliases(args.voice_alias, "--voice-alias") == (("a", "NATM1.pt"), ("b", "NATF2.pt"))
