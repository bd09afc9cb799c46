"""Parsing client messages at the edge: refusal codes, echoed event ids, audio formats, config."""

from __future__ import annotations

import base64
import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_actors.error_codes import CODES, error_type
from duplex_actors.protocol import parsing
from duplex_actors.protocol import wire_events as wire
from duplex_actors.protocol.audio_formats import decode_append, decode_audio_b64, resolve_input_format
from duplex_actors.protocol.converter import dumps, encode_client_event
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.protocol.parsing import parse_client_binary, parse_client_text
from duplex_actors.protocol.session_config import normalize_session_config

DIALECTS = ("realtime", "native")


def refused(text: str, dialect: str = "realtime", **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_text(text, dialect=dialect, **kw)  # type: ignore[arg-type]
    return info.value


def msg(**fields: Any) -> str:
    return json.dumps(fields)


# -- what parses ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_client_event_of_the_dialect_parses(dialect: str) -> None:
    samples = {
        "session.update": {"session": {"voice": "NATF2.pt"}},
        "input_audio_buffer.append": {"audio": "AAAA", "format": "pcm16", "sample_rate_hz": 24000},
        "response.create": {"response": {"modalities": ["audio"]}},
        "response.cancel": {"response_id": "resp_1"},
        "playback.ack": {"played_ms": 80},
        "session.event_ack": {"server_event_seq": 3},
        "session.resume": {"session_id": "sess_1", "resume_token": "t", "last_received_server_event_seq": 4},
        "session.create": {"session": {"voice": "NATF2.pt"}},
        "conversation.item.truncate": {"item_id": "item_x_0", "content_index": 0, "audio_end_ms": 320},
        "conversation.item.retrieve": {"item_id": "item_x_0"},
        "conversation.item.create": {
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        },
    }
    classes = wire.REALTIME_CLIENT_EVENTS if dialect == "realtime" else wire.NATIVE_CLIENT_EVENTS
    for cls in classes:
        fields = samples.get(cls.TYPE, {})
        event = parse_client_text(msg(type=cls.TYPE, event_id="e1", **fields), dialect=dialect)  # type: ignore[arg-type]
        assert type(event) is cls and event.event_id == "e1"


def test_extra_fields_are_ignored_and_playback_ack_keeps_them_as_payload() -> None:
    event = parse_client_text(msg(type="session.heartbeat", extra=1), dialect="realtime")
    assert event == wire.SessionHeartbeat()
    ack = parse_client_text(msg(type="playback.ack", event_id="a", played_ms=80, x=[1]), dialect="realtime")
    assert ack == wire.PlaybackAck({"played_ms": 80, "x": [1]}, "a")


@pytest.mark.parametrize(
    ("message", "session", "binary"),
    [
        ({"session": {"voice": "NATF2.pt"}}, {"voice": "NATF2.pt"}, False),
        ({"voice": "NATF2.pt", "binary_output": True}, {"voice": "NATF2.pt"}, True),
        ({"session": {"voice": "NATF2.pt", "binary_output": True}}, {"voice": "NATF2.pt"}, True),
        ({}, {}, False),
    ],
)
def test_session_create_takes_config_under_session_or_at_top_level(
    message: dict[str, Any], session: dict[str, Any], binary: bool
) -> None:
    event = parse_client_text(msg(type="session.create", **message), dialect="native")
    assert event == wire.SessionCreate(session=session, binary_output=binary)


def test_session_create_is_unknown_to_the_realtime_dialect() -> None:
    err = refused(msg(type="session.create", event_id="c1"))
    assert (err.code, err.client_event_id) == ("unknown_event", "c1")


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["", "{", "not json", '{"type": "session.update"', "\x00", '{"a": 1} {"b": 2}']
)
def test_not_json_is_invalid_json(text: str) -> None:
    assert refused(text).code == "invalid_json"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_invalid_json(literal: str) -> None:
    err = refused('{"type": "input_audio_buffer.append", "audio": "AAAA", "x": ' + literal + "}")
    assert err.code == "invalid_json"
    assert refused(literal).code == "invalid_json"


OUT_OF_RANGE = ["1e400", "-1e400", "1" + "0" * 400]


@pytest.mark.parametrize("literal", OUT_OF_RANGE)
@pytest.mark.parametrize(
    ("dialect", "template"),
    [
        ("realtime", '{"type":"session.update","event_id":"u1","session":{"temperature":%s}}'),
        ("realtime", '{"type":"session.update","event_id":"u1","session":{"deep":{"x":[1,%s]}}}'),
        ("native", '{"type":"playback.ack","event_id":"u1","played_ms":%s}'),
        ("native", '{"type":"session.create","event_id":"u1","session":{"seed":%s}}'),
        ("realtime", '{"type":"input_audio_buffer.append","event_id":"u1","audio":"AAAA","x":%s}'),
    ],
)
def test_a_number_out_of_float_range_is_bad_event_with_the_event_id(
    literal: str, dialect: str, template: str
) -> None:
    err = refused(template % literal, dialect)
    assert err.code == "bad_event"
    assert err.client_event_id == "u1"
    assert "out of range" in err.message


def test_large_but_finite_numbers_still_parse() -> None:
    event = parse_client_text(
        '{"type":"session.update","session":{"a":1e308,"b":1e-400,"c":' + "9" * 300 + "}}",
        dialect="realtime",
    )
    assert isinstance(event, wire.SessionUpdate)
    assert event.session == {"a": 1e308, "b": 0.0, "c": int("9" * 300)}


@pytest.mark.parametrize("text", ["[]", "[1, 2]", '"session.update"', "1", "null", "true"])
def test_a_json_value_that_is_not_an_object_is_invalid_json(text: str) -> None:
    assert refused(text).code == "invalid_json"


def test_deep_nesting_is_invalid_json_not_a_crash() -> None:
    assert refused("[" * 100_000 + "]" * 100_000).code == "invalid_json"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_unknown_type_is_unknown_event_and_echoes_the_event_id(dialect: str) -> None:
    err = refused(msg(type="conversation.item.delete", event_id="evt_42"), dialect)
    assert (err.code, err.client_event_id, err.event_type, err.param) == (
        "unknown_event",
        "evt_42",
        "conversation.item.delete",
        "type",
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"event_id": "x"}, "type"),
        ({"type": 5, "event_id": "x"}, "type"),
        ({"type": "input_audio_buffer.append", "event_id": "x"}, "audio"),
        ({"type": "input_audio_buffer.append", "audio": 5, "event_id": "x"}, "audio"),
        (
            {
                "type": "input_audio_buffer.append",
                "audio": "AAAA",
                "sample_rate_hz": "24000",
                "event_id": "x",
            },
            "sample_rate_hz",
        ),
        (
            {"type": "input_audio_buffer.append", "audio": "AAAA", "sample_rate_hz": True, "event_id": "x"},
            "sample_rate_hz",
        ),
        (
            {
                "type": "input_audio_buffer.append",
                "audio": "AAAA",
                "sample_rate_hz": 24000.0,
                "event_id": "x",
            },
            "sample_rate_hz",
        ),
        ({"type": "input_audio_buffer.append", "audio": "AAAA", "format": 16, "event_id": "x"}, "format"),
        ({"type": "session.update", "event_id": "x"}, "session"),
        ({"type": "session.update", "session": [], "event_id": "x"}, "session"),
        ({"type": "session.update", "session": "voice", "event_id": "x"}, "session"),
        ({"type": "response.cancel", "response_id": 3, "event_id": "x"}, "response_id"),
    ],
)
def test_missing_or_ill_typed_fields_are_bad_event_with_the_event_id(
    fields: dict[str, Any], param: str
) -> None:
    err = refused(json.dumps(fields))
    assert (err.code, err.client_event_id, err.param) == ("bad_event", "x", param)
    assert err.error_type == "invalid_request_error"


@pytest.mark.parametrize("binary_output", ["yes", 1, None])
def test_session_create_refuses_a_non_boolean_binary_output(binary_output: Any) -> None:
    err = refused(msg(type="session.create", binary_output=binary_output, event_id="c"), "native")
    assert (err.code, err.client_event_id) == ("bad_event", "c")
    err = refused(msg(type="session.create", session=[1], event_id="c"), "native")
    assert err.code == "bad_event"


def test_an_ill_typed_event_id_is_bad_event_and_not_echoed() -> None:
    err = refused(msg(type="session.heartbeat", event_id=7))
    assert (err.code, err.client_event_id, err.param) == ("bad_event", None, "event_id")
    err = refused(msg(type="session.heartbeat", event_id="x" * 10_000))
    assert (err.code, err.client_event_id) == ("bad_event", None)


def test_a_message_over_the_size_limit_is_bad_event() -> None:
    text = msg(type="input_audio_buffer.append", audio="A" * 2000)
    assert refused(text, max_message_bytes=1000).code == "bad_event"
    # Multi-byte characters count as bytes, not characters.
    text = json.dumps({"type": "session.update", "session": {"instructions": "é" * 600}}, ensure_ascii=False)
    assert len(text) < 1000 < len(text.encode())
    assert refused(text, max_message_bytes=1000).code == "bad_event"
    parse_client_text(text, dialect="realtime", max_message_bytes=1000 + 600)


def test_a_huge_playback_ack_payload_is_refused() -> None:
    err = refused(msg(type="playback.ack", event_id="p", blob="x" * 100_000))
    assert (err.code, err.client_event_id) == ("bad_event", "p")


def test_every_code_has_an_error_type() -> None:
    assert error_type("resource_exhausted") == error_type("rate_limited") == "rate_limit_error"
    assert error_type("internal_error") == error_type("log_unavailable") == "server_error"
    others = set(CODES) - {"resource_exhausted", "rate_limited", "internal_error", "log_unavailable"}
    assert {error_type(c) for c in others} == {"invalid_request_error"}
    assert error_type("some_family_code") == "invalid_request_error"


# -- audio ---------------------------------------------------------------------------------------
def test_base64_decodes_strictly() -> None:
    assert decode_audio_b64(base64.b64encode(b"\x01\x02").decode()) == b"\x01\x02"
    for junk in ["AAA", "AA=A", "A\nAAA", "AAAA!", "ééé=", "AA==AA==", "=AAA"]:
        with pytest.raises(ProtocolError) as info:
            decode_audio_b64(junk, client_event_id="a1")
        assert (info.value.code, info.value.client_event_id, info.value.param) == ("bad_audio", "a1", "audio")


def test_empty_audio_is_bad_event() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_audio_b64("", client_event_id="a2")
    assert (info.value.code, info.value.client_event_id) == ("bad_event", "a2")


def test_native_binary_messages_are_raw_audio_and_empty_is_bad_event() -> None:
    assert parse_client_binary(b"\x00\x01") == b"\x00\x01"
    with pytest.raises(ProtocolError) as info:
        parse_client_binary(b"")
    assert info.value.code == "bad_event"
    with pytest.raises(ProtocolError):
        parse_client_binary(b"\x00" * 11, max_message_bytes=10)


def append(**fields: Any) -> wire.InputAudioBufferAppend:
    return wire.InputAudioBufferAppend(audio="AAAA", event_id="ap", **fields)


@pytest.mark.parametrize(
    ("fields", "session", "expected"),
    [
        ({}, {}, "pcm16"),
        ({"format": "pcm_f32le"}, {"input_audio_format": "pcm16"}, "pcm_f32le"),
        ({"input_audio_format": "pcm_f32le"}, {}, "pcm_f32le"),
        ({"format": "audio/pcm", "input_audio_format": "pcm_f32le"}, {}, "pcm16"),
        ({}, {"input_audio_format": "pcm_f32le"}, "pcm_f32le"),
        ({}, {"audio": {"input": {"format": {"type": "pcm_f32le", "rate": 24000}}}}, "pcm_f32le"),
        ({}, {"audio": {"input": {"format": {"type": "audio/pcm"}}}}, "pcm16"),
        ({}, {"input_audio_format": "pcm16", "audio": {"input": {"format": {"type": "pcm_f32le"}}}}, "pcm16"),
        ({"format": "pcm_s16le", "sample_rate_hz": 24000}, {"input_audio_format": "pcm_f32le"}, "pcm16"),
        ({"sample_rate_hz": 24000}, {"input_audio_format": "pcm_f32le"}, "pcm_f32le"),
    ],
)
def test_input_format_precedence_append_then_session_then_pcm16(
    fields: dict[str, Any], session: dict[str, Any], expected: str
) -> None:
    assert resolve_input_format(append(**fields), session)[0] == expected


@pytest.mark.parametrize(
    ("fields", "session"),
    [
        ({"format": "g711_ulaw", "sample_rate_hz": 16000}, {}),
        ({"format": "pcm24"}, {}),
        ({"sample_rate_hz": 11025}, {}),
        ({}, {"sample_rate_hz": 96000}),
        ({}, {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}}}),
        ({}, {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 12000}}}}),
        ({"sample_rate_hz": 44000}, {"sample_rate_hz": 24000}),
    ],
)
def test_unknown_formats_and_other_rates_are_unsupported(
    fields: dict[str, Any], session: dict[str, Any]
) -> None:
    with pytest.raises(ProtocolError) as info:
        resolve_input_format(append(**fields), session)
    assert (info.value.code, info.value.client_event_id) == ("unsupported_audio_format", "ap")


def test_decode_append_gives_bytes_and_format() -> None:
    event = wire.InputAudioBufferAppend(base64.b64encode(b"\x00\x00\x80?").decode(), format="pcm_f32le")
    assert decode_append(event, {}) == (b"\x00\x00\x80?", "pcm_f32le", 24000)


@pytest.mark.parametrize(
    ("fields", "session", "expected"),
    [
        ({"format": "audio/pcmu"}, {}, ("g711_ulaw", 8000)),
        (
            {"format": "g711_alaw"},
            {"input_audio_format": "pcm16", "sample_rate_hz": 48000},
            ("g711_alaw", 8000),
        ),
        ({}, {"audio": {"input": {"format": {"type": "audio/pcma"}}}}, ("g711_alaw", 8000)),
        ({}, {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 48000}}}}, ("pcm16", 48000)),
        ({"sample_rate_hz": 16000}, {"input_audio_format": "pcm_f32le"}, ("pcm_f32le", 16000)),
        ({"format": "pcm16"}, {"input_audio_format": "pcm16", "sample_rate_hz": 44100}, ("pcm16", 44100)),
        ({}, {"sample_rate_hz": 22050}, ("pcm16", 22050)),
    ],
)
def test_every_spec_rate_and_g711_resolve(
    fields: dict[str, Any], session: dict[str, Any], expected: tuple[str, int]
) -> None:
    assert resolve_input_format(append(**fields), session) == expected


def test_unsupported_format_message_names_the_supported_list() -> None:
    with pytest.raises(ProtocolError) as info:
        resolve_input_format(append(format="opus"), {})
    assert info.value.code == "unsupported_audio_format"
    for name in ("pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw", "48000", "22050"):
        assert name in info.value.message


# -- session config ------------------------------------------------------------------------------
def test_ga_fields_map_to_the_flat_keys_and_server_owned_keys_are_dropped() -> None:
    ga = {
        "type": "realtime",
        "id": "sess_client",
        "object": "realtime.session",
        "model": "gpt-realtime",
        "capabilities": {"supports_barge_in": True},
        "instructions": "Be brief.",
        "output_modalities": ["audio"],
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATM1.pt"},
        },
    }
    out = normalize_session_config(ga)
    assert out["voice"] == "NATM1.pt"
    assert (out["input_audio_format"], out["sample_rate_hz"]) == ("pcm16", 24000)
    assert not {"id", "object", "model", "capabilities"} & set(out)
    assert out["instructions"] == "Be brief." and out["output_modalities"] == ["audio"]
    assert out["audio"] == ga["audio"] and out["type"] == "realtime"


def test_beta_fields_are_validated_and_kept() -> None:
    beta = {
        "voice": "NATF2.pt",
        "input_audio_format": "pcm_s16le",
        "output_audio_format": "pcm16",
        "tools": [],
    }
    out = normalize_session_config(beta)
    assert out == {**beta, "input_audio_format": "pcm16"}


@pytest.mark.parametrize(
    ("session", "code"),
    [
        ([], "bad_event"),
        ("x", "bad_event"),
        ({"audio": []}, "bad_event"),
        ({"audio": {"input": 3}}, "bad_event"),
        ({"audio": {"input": {"format": 3}}}, "bad_event"),
        ({"input_audio_format": "g711_alaw", "sample_rate_hz": 16000}, "unsupported_audio_format"),
        ({"input_audio_format": 7}, "unsupported_audio_format"),
        ({"sample_rate_hz": 16001}, "unsupported_audio_format"),
        ({"sample_rate_hz": "24000"}, "bad_event"),
        ({"output_audio_format": "pcm_f32le"}, "unsupported_audio_format"),
        ({"output_audio_format": "opus"}, "unsupported_audio_format"),
        (
            {"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 24000}}}},
            "unsupported_audio_format",
        ),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8001}}}}, "unsupported_audio_format"),
        ({"voice": "NATF2.pt", "audio": {"output": {"voice": "NATM1.pt"}}}, "invalid_value"),
        ({"instructions": "x" * 300_000}, "bad_event"),
    ],
)
def test_bad_session_configs_are_refused_with_the_event_id(session: Any, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        normalize_session_config(session, client_event_id="u1")
    assert (info.value.code, info.value.client_event_id, info.value.event_type) == (
        code,
        "u1",
        "session.update",
    )


# -- properties ----------------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
client_types = st.sampled_from([c.TYPE for c in wire.NATIVE_CLIENT_EVENTS] + ["bogus", ""])
messages = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.builds(
        lambda t, extra: json.dumps({"type": t, **extra}),
        client_types,
        st.dictionaries(
            st.sampled_from(
                ["event_id", "audio", "session", "format", "sample_rate_hz", "binary_output", "x"]
            ),
            json_values,
            max_size=4,
        ),
    ),
)


@settings(max_examples=400, deadline=None)
@given(text=messages, dialect=st.sampled_from(DIALECTS))
def test_parse_never_raises_anything_but_protocol_error(text: str, dialect: str) -> None:
    try:
        event = parse_client_text(text, dialect=dialect)  # type: ignore[arg-type]
    except ProtocolError as exc:
        assert exc.code in CODES
        raw = json.loads(text) if exc.code != "invalid_json" else None
        if isinstance(raw, dict) and isinstance(raw.get("event_id"), str):
            assert exc.client_event_id == raw["event_id"]
    else:
        assert attrs.has(type(event))


opt_id = st.none() | st.text(max_size=10)
client_events = st.one_of(
    st.builds(wire.SessionUpdate, st.dictionaries(st.text(max_size=5), json_values, max_size=3), opt_id),
    st.builds(
        wire.InputAudioBufferAppend,
        st.binary(min_size=1, max_size=20).map(lambda b: base64.b64encode(b).decode()),
        st.none() | st.sampled_from(["pcm16", "pcm_f32le"]),
        st.none() | st.text(max_size=5),
        st.none() | st.integers(),
        opt_id,
    ),
    st.builds(wire.InputAudioBufferClear, opt_id),
    st.builds(wire.InputAudioBufferCommit, opt_id),
    st.builds(
        wire.ResponseCreate, st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=2), opt_id
    ),
    st.builds(wire.ResponseCancel, opt_id, opt_id),
    st.builds(wire.OutputAudioBufferClear, opt_id),
    st.builds(wire.SessionClose, opt_id),
    st.builds(wire.SessionHeartbeat, opt_id),
    st.builds(
        wire.PlaybackAck,
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k not in ("type", "event_id")), json_values, max_size=3
        ),
        opt_id,
    ),
    st.builds(
        wire.SessionCreate,
        st.dictionaries(st.text(max_size=5).filter(lambda k: k != "binary_output"), json_values, max_size=3),
        st.booleans(),
        opt_id,
    ),
)


@settings(max_examples=300, deadline=None)
@given(event=client_events)
def test_client_events_round_trip_through_the_converter(event: wire.ClientEvent) -> None:
    obj = encode_client_event(event)
    assert obj["type"] == type(event).TYPE
    assert parse_client_text(dumps(obj), dialect="native") == event
    if not isinstance(event, wire.SessionCreate):
        assert parse_client_text(dumps(obj), dialect="realtime") == event


_APPEND_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=2)
)


@settings(max_examples=400)
@given(
    st.dictionaries(
        st.sampled_from(["audio", "event_id", "format", "sample_rate_hz", "extra"]),
        _APPEND_VALUES,
        max_size=4,
    ),
    st.sampled_from(["realtime", "native"]),
)
def test_the_append_fast_path_answers_exactly_as_the_converter(fields: dict[str, Any], dialect: str) -> None:
    """Whatever an append carries, parse_client_text (fast path or not) gives the event or the
    refusal the converter alone gives."""
    obj = {"type": "input_audio_buffer.append", **fields}
    text = json.dumps(obj)

    def outcome(fn: Any) -> Any:
        try:
            return fn()
        except ProtocolError as err:
            return (err.code, err.message, err.param, err.client_event_id)

    fast = outcome(lambda: parsing.parse_client_text(text, dialect=dialect))  # type: ignore[arg-type]
    slow = outcome(lambda: parsing.parse_client_object(json.loads(text), dialect=dialect))  # type: ignore[arg-type]
    assert fast == slow


def test_the_append_fast_path_leaves_non_finite_numbers_and_long_ids_to_the_general_checks() -> None:
    with pytest.raises(ProtocolError) as err:
        parsing.parse_client_text(
            '{"type":"input_audio_buffer.append","audio":"AAA=","n":1e400}', dialect="realtime"
        )
    assert err.value.code == "bad_event"
    long_id = json.dumps({"type": "input_audio_buffer.append", "audio": "AAA=", "event_id": "e" * 513})
    with pytest.raises(ProtocolError) as err:
        parsing.parse_client_text(long_id, dialect="realtime")
    assert err.value.code == "bad_event" and err.value.param == "event_id"
