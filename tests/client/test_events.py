"""The client's typed events parse what the server's own projections emit, in every dialect
(Realtime GA, Realtime beta, native), and the client's messages parse as the server expects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from duplex_actors.client import (
    AudioDelta,
    Error,
    OtherEvent,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionClosing,
    SessionCreated,
    SessionUpdated,
    TranscriptDelta,
    append_message,
    create_duplex_session_config,
    encode_audio,
    parse_server_event,
    to_wire_bytes,
)
from duplex_actors.protocol import audio_formats, parsing, session_config
from duplex_actors.protocol.native import NativeProjection
from duplex_actors.protocol.realtime import RealtimeProjection, refusal_error
from duplex_actors.protocol.wire_events import DialectName, InputAudioBufferAppend
from duplex_actors.session import events as ev

SID = "sess_0123456789abcdef01234567"
PCM = bytes(range(256)) * 15  # 3840 bytes: one frame


def _session_events() -> list[Any]:
    return [
        ev.SessionCreated(SID, {"voice": "NATF2.pt"}),
        ev.SessionUpdated(SID, {"voice": "NATF2.pt"}),
        ev.ResponseStarted("resp_x_0", "item_x_0", 0),
        ev.AudioFrame("resp_x_0", "item_x_0", 0, 7, PCM, "hi"),
        ev.Error("bad_audio", "nope", client_event_id="c9", param="audio"),
        ev.ResponseEnded("resp_x_0", "item_x_0", 0, "client_cancelled", "hi there", 1, False),
        ev.SpeechStarted(0, 3, "item_in_x_0"),
        ev.SessionClosed(SID, "client_close"),
    ]


def _project(dialect: str) -> list[dict[str, Any]]:
    if dialect == "native":
        native = NativeProjection(SID)
        return [m for e in _session_events() for m in native.project(e) if isinstance(m, dict)]
    realtime = RealtimeProjection(SID, "tiny", {"chunk_period_ms": 80}, beta=dialect == "beta")
    return [m for e in _session_events() for m in realtime.project(e)]


@pytest.mark.parametrize("dialect", ["ga", "beta", "native"])
def test_parses_every_projection(dialect: str) -> None:
    wire: DialectName = "native" if dialect == "native" else "realtime"
    events = [parse_server_event(m, dialect=wire, seq=i + 1) for i, m in enumerate(_project(dialect))]
    by_class: dict[type, list[Any]] = {}
    for e in events:
        by_class.setdefault(type(e), []).append(e)
    created, updated = by_class[SessionCreated][0], by_class[SessionUpdated][0]
    assert created.session_id == updated.session_id == SID
    assert created.session["voice"] == "NATF2.pt"
    assert by_class[ResponseCreated][0].response_id == "resp_x_0"
    assert by_class[ResponseCreated][0].epoch == (0 if dialect == "native" else None)
    (audio,) = by_class[AudioDelta]
    assert (audio.response_id, audio.epoch, audio.frame_index, audio.pcm16, audio.frames) == (
        "resp_x_0",
        0,
        7,
        PCM,
        1,
    )
    text = audio.text if dialect == "native" else by_class[TranscriptDelta][0].text
    assert text == "hi"
    (err,) = by_class[Error]
    assert (err.code, err.message, err.event_id, err.param) == ("bad_audio", "nope", "c9", "audio")
    done = by_class[ResponseDone][0]
    assert (done.response_id, done.status, done.reason, done.transcript) == (
        "resp_x_0",
        "cancelled",
        "client_cancelled",
        "hi there",
    )
    assert by_class[SessionClosed][0].reason == "client_close"
    assert all(isinstance(e, OtherEvent) for e in by_class.get(OtherEvent, []))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_refusals_and_closing_parse() -> None:
    rt = parse_server_event(refusal_error("resource_exhausted", "full"))
    assert isinstance(rt, Error) and rt.code == "resource_exhausted" and rt.error_type == "rate_limit_error"
    closing = RealtimeProjection(SID, "tiny", {}, duplex=True).closing_event("server_shutdown")
    assert closing is not None
    parsed = parse_server_event(closing)
    assert isinstance(parsed, SessionClosing) and parsed.reason == "server_shutdown"


@pytest.mark.parametrize(
    ("obj", "dialect", "expected"),
    [
        ({}, "realtime", OtherEvent(type="", raw={}, received_at=0.0, seq=0)),
        ({"type": 5}, "realtime", OtherEvent(type="", raw={}, received_at=0.0, seq=0)),
        ({"type": "x.y"}, "native", OtherEvent(type="x.y", raw={}, received_at=0.0, seq=0)),
        (
            {"type": "error"},
            "realtime",
            Error(type="error", raw={}, received_at=0.0, seq=0, code="unknown", message="", event_id=None),
        ),
        (
            {"type": "error", "error": {"code": 7, "event_id": ["x"]}},
            "realtime",
            Error(type="error", raw={}, received_at=0.0, seq=0, code="unknown", message="", event_id=None),
        ),
        (
            {"type": "response.done", "response": []},
            "realtime",
            OtherEvent(type="response.done", raw={}, received_at=0.0, seq=0),
        ),
        (
            {"type": "response.output_audio.delta", "metadata": [], "response_id": 3},
            "realtime",
            OtherEvent(type="response.output_audio.delta", raw={}, received_at=0.0, seq=0),
        ),
        (
            {"type": "session.created", "session": "nope"},
            "realtime",
            OtherEvent(type="session.created", raw={}, received_at=0.0, seq=0),
        ),
        (
            {"type": "session.closed", "reason": None},
            "native",
            OtherEvent(type="session.closed", raw={}, received_at=0.0, seq=0),
        ),
    ],
)
def test_malformed_shapes_never_raise_and_read_as_untyped(
    obj: dict[str, Any], dialect: DialectName, expected: Any
) -> None:
    """A message that is not a valid event of its class, or of an unknown or missing type, reads
    as OtherEvent without a wire event (a malformed error still as an Error); the raw object is
    kept as received."""
    got = parse_server_event(obj, dialect=dialect, received_at=1.5, seq=4)
    assert type(got) is type(expected)
    assert got == expected
    assert got.wire is None  # raw, received_at and seq are not compared (eq=False) ...
    assert got.raw is obj and got.received_at == 1.5 and got.seq == 4  # ... so check them here


def test_client_messages_parse_on_the_server() -> None:
    data = to_wire_bytes(np.linspace(-1, 1, 100, dtype=np.float32))
    event = parsing.parse_client_text(append_message(data), dialect="realtime")
    assert isinstance(event, InputAudioBufferAppend)
    assert audio_formats.decode_audio_b64(event.audio) == data
    enc = encode_audio(np.zeros(1920 * 2 + 5, np.float32), "pcm_f32le")
    assert enc.frames == 3 and enc.total_samples == 1920 * 2 + 5
    for message in enc.messages:
        parsing.parse_client_text(message, dialect="native")
    config = create_duplex_session_config(voice="NATM1.pt", persona="Be brief.", input_format="audio/pcm")
    assert session_config.normalize_session_config(config) == {
        "input_audio_format": "pcm16",
        "sample_rate_hz": 24000,
        "voice": "NATM1.pt",
        "instructions": "Be brief.",
    }
    # the formats the server reads for each append (audio_formats.resolve_input_format)
    for spec, output, fmt, rate, out in (
        ("pcm16@48000", None, "pcm16", 48000, None),
        ("pcmu", "pcmu", "g711_ulaw", 8000, "g711_ulaw"),
        ("pcm_f32le@16000", "pcma", "pcm_f32le", 16000, "g711_alaw"),
    ):
        config = session_config.normalize_session_config(
            create_duplex_session_config(input_format=spec, output_format=output)
        )
        assert config.get("output_audio_format") == out
        append = parsing.parse_client_text(append_message(b"\x00\x00\x00\x00"), dialect="realtime")
        assert isinstance(append, InputAudioBufferAppend)
        assert audio_formats.resolve_input_format(append, config) == (fmt, rate)


def test_to_wire_bytes_formats() -> None:
    ints = np.array([0, 16384, -32768], np.int16)
    assert to_wire_bytes(ints, "pcm16") == ints.astype("<i2").tobytes()
    assert np.frombuffer(to_wire_bytes(ints, "pcm_f32le"), "<f4").tolist() == [0.0, 0.5, -1.0]
    assert np.frombuffer(to_wire_bytes(np.array([0.5], np.float64), "pcm16"), "<i2").tolist() == [16384]
    assert to_wire_bytes(b"\x01\x02") == b"\x01\x02"
    with pytest.raises(ValueError):
        to_wire_bytes(np.zeros((2, 2), np.float32))
