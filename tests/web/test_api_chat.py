"""/api/chat without a server: query parsing, message kinds, projection, key redaction."""

from __future__ import annotations

import pytest

from duplex_actors.model.family import DEFAULT_PERSONA, MoshiFamily, detect_family
from duplex_actors.protocol import api_chat as wire
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.session import events as ev
from duplex_actors.web import auth
from duplex_actors.web.api_chat import ApiChatDialect

VOICES = ["NATF0.pt", "NATF2.pt", "NATM1.pt"]
# What the PersonaPlex web UI sends (buildURL in its bundle), without worker_auth_id/email.
UI_QUERY = {
    "text_temperature": "0.7",
    "text_topk": "25",
    "audio_temperature": "0.8",
    "audio_topk": "250",
    "pad_mult": "0",
    "text_seed": "123456",
    "audio_seed": "654321",
    "repetition_penalty_context": "64",
    "repetition_penalty": "1",
    "text_prompt": "You enjoy having a good conversation.",
    "voice_prompt": "NATF0.pt",
}


def test_handshake_forms() -> None:
    assert wire.handshake() == b"\x00"
    assert wire.handshake("rust") == b"\x00" + bytes(8)
    assert len(wire.handshake("rust")) == 9


def test_message_kinds() -> None:
    assert wire.audio_message(b"OggS") == b"\x01OggS"
    assert wire.text_message(" héllo") == b"\x02" + " héllo".encode()
    assert wire.error_message("server busy") == b"\x05server busy"
    assert wire.PING == b"\x06"
    assert wire.split_message(b"\x01abc") == (1, b"abc")
    assert wire.split_message(b"\x03\x00") == (3, b"\x00")
    assert wire.split_message(b"") == (None, b"")
    assert wire.split_message("text frame") == (None, b"")
    assert wire.split_message(bytearray(b"\x09")) == (9, b"")


def test_error_message_is_clipped() -> None:
    assert len(wire.error_message("x" * 10_000)) <= 1 + 1024


def test_ui_query_parses_and_maps_onto_sampling() -> None:
    q = wire.parse_query(UI_QUERY)
    assert q.persona == UI_QUERY["text_prompt"] and q.voice == "NATF0.pt" and q.handshake == "python"
    assert q.sampling == {
        "temperature_text": 0.7,
        "top_k_text": 25,
        "temperature": 0.8,
        "top_k": 250,
        "seed": 654321,  # audio_seed first: the slot has one seeded sampler
    }
    sampled = wire.session_config(q, prompts=True, client_sampling=True)
    assert sampled["voice"] == "NATF0.pt" and sampled["temperature"] == 0.8 and sampled["seed"] == 654321
    greedy = wire.session_config(q, prompts=True, client_sampling=False)
    assert greedy == {"voice": "NATF0.pt", "instructions": UI_QUERY["text_prompt"]}
    assert wire.session_config(q, prompts=False, client_sampling=False) == {}


def test_empty_query_is_all_defaults() -> None:
    q = wire.parse_query({})
    assert q == wire.ChatQuery()
    assert wire.session_config(q, prompts=True, client_sampling=True) == {}


def test_seed_alone_and_text_seed_fallback() -> None:
    assert wire.parse_query({"seed": "42"}).sampling == {"seed": 42}
    assert wire.parse_query({"text_seed": "7", "seed": "9"}).sampling == {"seed": 7}


def test_unknown_params_are_ignored() -> None:
    q = wire.parse_query({"email": "a@b", "image_url": "x", "max_steps": "zzz", "pad_mult": "NaN?"})
    assert q == wire.ChatQuery()


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("text_temperature", "hot"),
        ("audio_temperature", "nan"),
        ("audio_temperature", "inf"),
        ("text_topk", "2.5"),
        ("audio_topk", "-1"),
        ("text_seed", "x"),
        ("audio_seed", str(2**32)),
        ("seed", "-3"),
        ("handshake", "java"),
    ],
)
def test_malformed_known_params_are_refused_naming_them(param: str, value: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        wire.parse_query({param: value})
    assert exc.value.code == "invalid_value" and exc.value.param == param
    assert exc.value.message.startswith(f"{param}: ")


def test_handshake_param() -> None:
    assert wire.parse_query({"handshake": "rust"}).handshake == "rust"
    assert wire.parse_query({"handshake": "RUST"}).handshake == "rust"
    assert wire.parse_query({"handshake": ""}).handshake == "python"


def test_key_params_and_redaction_from_the_scope() -> None:
    assert wire.parse_query({"auth_id": "k1"}).key == "k1"
    assert wire.parse_query({"worker_auth_id": "k2"}).key == "k2"
    assert "k1" not in repr(wire.parse_query({"auth_id": "k1"}))
    scope = {
        "type": "websocket",
        "path": "/api/chat",
        "query_string": b"text_prompt=a%20b&worker_auth_id=s%2Bcret&voice_prompt=NATF0.pt&auth_id=",
    }
    auth.take_query_key(scope, "/api/chat", wire.KEY_PARAMS)
    assert scope[auth.QUERY_KEY_SCOPE] == "s+cret"
    assert scope["query_string"] == b"text_prompt=a%20b&voice_prompt=NATF0.pt"
    other = {"type": "websocket", "path": "/v1/realtime", "query_string": b"auth_id=k"}
    auth.take_query_key(other, "/api/chat", wire.KEY_PARAMS)
    assert other["query_string"] == b"auth_id=k" and auth.QUERY_KEY_SCOPE not in other


def test_query_key_is_checked_like_a_header_key() -> None:
    def check(**kw: object) -> object:
        return auth.check(api_key="k", allowed_origins=(), headers={}, subprotocols=[], **kw)  # type: ignore[arg-type]

    assert check(query_key="k") is None
    refused = check(query_key="wrong")
    assert refused is not None and refused.status == 401  # type: ignore[attr-defined]
    assert check() is not None


def test_dialect_opening_validates_against_the_family() -> None:
    family = detect_family(VOICES)
    opening = ApiChatDialect(UI_QUERY).opening(family, client_sampling=False)
    assert opening.config == {"voice": "NATF0.pt", "instructions": UI_QUERY["text_prompt"]}
    dialect = ApiChatDialect({"handshake": "rust"})
    assert dialect.opening(family, client_sampling=True).config == {}
    assert dialect.output == {"audio": "ogg_opus", "handshake": "rust"}
    # Defaults the family fills in: its default voice and persona.
    prompt = family.session_prompt()
    assert prompt.voice == "NATF2.pt" and prompt.persona == DEFAULT_PERSONA


@pytest.mark.parametrize(
    "voice", ["NOPE.pt", "../voices/NATF0.pt", "/etc/passwd", "..\\NATF0.pt", ".hidden.pt", "NATF0"]
)
def test_unknown_voice_and_traversal_are_refused_naming_the_bundled_voices(voice: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        ApiChatDialect({"voice_prompt": voice}).opening(detect_family(VOICES), client_sampling=False)
    assert exc.value.code == "invalid_voice" and exc.value.param == "voice_prompt"
    assert "NATF0.pt, NATF2.pt, NATM1.pt" in exc.value.message


def test_sampling_out_of_the_familys_range_is_refused_only_when_used() -> None:
    hot = {"audio_temperature": "9"}
    assert ApiChatDialect(hot).opening(detect_family(VOICES), client_sampling=False).config == {}
    with pytest.raises(ProtocolError) as exc:
        ApiChatDialect(hot).opening(detect_family(VOICES), client_sampling=True)
    assert exc.value.code == "invalid_duplex_runtime_config" and "temperature" in exc.value.message


def test_moshi_family_ignores_the_prompts() -> None:
    opening = ApiChatDialect(UI_QUERY).opening(MoshiFamily(), client_sampling=False)
    assert opening.config == {}


def test_refusals() -> None:
    d = ApiChatDialect({})
    assert d.refusal("resource_exhausted", "all 2 sessions are in use") == (
        b"\x05server busy: all 2 sessions are in use"
    )
    assert (
        d.refusal("invalid_value", "text_topk: expected an integer") == b"\x05text_topk: expected an integer"
    )


def test_projection() -> None:
    p = wire.ApiChatProjection("sess_x")
    pcm = bytes(3840)
    assert p.project(ev.SessionCreated("sess_x", {})) == []
    assert p.project(ev.SessionUpdated("sess_x", {})) == []
    assert p.project(ev.ResponseStarted("r", "i", 0)) == []
    assert p.project(ev.AudioFrame("r", "i", 0, 0, pcm, "")) == [wire.EncodeAudio(0, pcm)]
    assert p.project(ev.AudioFrame("r", "i", 0, 1, pcm, " hello")) == [
        wire.EncodeAudio(1, pcm),
        b"\x02 hello",
    ]
    assert p.project(ev.SpeechStarted(0, 1, "i")) == []
    assert p.project(ev.Error("bad_audio", "undecodable")) == [b"\x05undecodable"]
    assert p.project(ev.SessionClosed("sess_x", "client_close")) == []
    assert p.project(ev.AudioFrame("r", "i", 0, 2, pcm, "late")) == []


async def test_a_prompt_not_prefilled_in_time_names_the_limit_it_hit(autojump_clock):
    """The handshake's wait for the slot's prefill is bounded by the server's prepare timeout,
    and the session's error says which limit that was and where it came from."""
    import types

    import trio

    from duplex_actors.counters import Counters
    from duplex_actors.web.api_chat import ApiChatConnection
    from duplex_actors.web.connection import Transport

    rejected: list[tuple[str, str, str]] = []
    closed: list[str] = []

    async def reject(kind: str, code: str, message: str) -> None:
        rejected.append((kind, code, message))

    async def close(reason: str) -> None:
        closed.append(reason)

    async def nothing(*_: object) -> None:
        return None

    server = types.SimpleNamespace(
        scheduler=types.SimpleNamespace(wait_reset=lambda slot: trio.sleep_forever())
    )
    conn = ApiChatConnection(
        server,  # type: ignore[arg-type]
        Transport(nothing, nothing, nothing),  # type: ignore[arg-type]
        dialect=ApiChatDialect({}),
        idle_timeout_s=300.0,
        counters=Counters(),
        prepare_timeout_s=1060.0,
        prepare_timeout_source="4 times the default prompt's 265.0 s prefill at start-up",
    )
    conn.session = types.SimpleNamespace(slot=0, reject=reject, close=close)  # type: ignore[assignment]
    started = trio.current_time()
    await conn._handshake()
    assert trio.current_time() - started == pytest.approx(1060.0)
    assert rejected == [
        (
            "session.open",
            "internal_error",
            "the session's prompt was not prefilled within the prepare timeout of 1060 s "
            "(4 times the default prompt's 265.0 s prefill at start-up)",
        )
    ]
    assert closed == ["error"] and not conn.ready
