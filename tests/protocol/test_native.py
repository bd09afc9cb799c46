"""Projection onto the native dialect: flat events, binary audio frames, errors."""

from __future__ import annotations

import base64
import struct
from typing import Any

from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.protocol.native import NativeProjection, binary_frame, refusal_error, split_binary_frame
from duplex_actors.protocol.schemas import validate_server_event
from duplex_actors.session import events as ev

from .conftest import SID, core_events

PCM = bytes(range(256)) * 15


def test_flat_events_of_a_whole_session() -> None:
    projection = NativeProjection(SID)
    out = [o for e in core_events() for o in projection.project(e)]
    assert all(isinstance(o, dict) for o in out)
    kinds = [o["type"] for o in out if isinstance(o, dict)]
    assert kinds[:4] == [
        "session.created",
        "session.updated",
        "input_audio_buffer.speech_started",
        "response.created",
    ]
    assert kinds[-1] == "session.closed"
    created = out[0]
    assert (
        isinstance(created, dict)
        and created["session_id"] == SID
        and created["session"]["voice"] == "NATM1.pt"
    )
    delta = out[4]
    assert isinstance(delta, dict)
    assert delta["type"] == "response.output_audio.delta"
    assert (delta["epoch"], delta["frame_index"], delta["text"]) == (0, 0, "Hel")
    assert delta["response_id"] == "resp_00112233445566778899aabb_0"
    dones = [o for o in out if isinstance(o, dict) and o["type"] == "response.done"]
    assert [(d["epoch"], d["status"], d["reason"]) for d in dones] == [
        (0, "cancelled", "client_cancelled"),
        (1, "cancelled", "output_audio_buffer_clear"),
        (2, "cancelled", "session_closed"),
    ]
    errors = [o for o in out if isinstance(o, dict) and o["type"] == "error"]
    assert errors[0] == {
        "type": "error",
        "error": "no response is active",
        "code": "response_cancel_not_active",
        "client_event_id": "ev_cancel2",
        "param": None,
    }
    for o in out:
        validate_server_event(o, "native")
    assert "event_id" not in out[0]


def test_binary_output_layout_is_u32_le_frame_index_then_pcm16() -> None:
    projection = NativeProjection(SID, binary_output=True)
    rid = "resp_x_0"
    (audio,) = projection.project(ev.AudioFrame(rid, "item", 0, 7, PCM, ""))
    assert isinstance(audio, bytes)
    assert audio[:4] == struct.pack("<I", 7) and audio[4:] == PCM
    assert split_binary_frame(audio) == (7, PCM)
    audio, text = projection.project(ev.AudioFrame(rid, "item", 0, 70_000, PCM, "hi"))
    assert audio == binary_frame(70_000, PCM)
    assert text == {
        "type": "response.output_audio_transcript.delta",
        "response_id": rid,
        "epoch": 0,
        "frame_index": 70_000,
        "text": "hi",
    }
    validate_server_event(text, "native")


def test_json_audio_is_base64_pcm16() -> None:
    (delta,) = NativeProjection(SID).project(ev.AudioFrame("r", "i", 1, 3, PCM, ""))
    assert isinstance(delta, dict) and base64.b64decode(delta["audio"]) == PCM


def test_capabilities_closing_and_protocol_errors() -> None:
    projection = NativeProjection(SID, capabilities={"chunk_period_ms": 80})
    (created,) = projection.project(ev.SessionCreated(SID, {"voice": "v", "id": "client"}))
    assert isinstance(created, dict) and created["session"] == {
        "capabilities": {"chunk_period_ms": 80},
        "voice": "v",
    }
    closing = projection.closing_event("server_shutdown")
    assert closing == {"type": "session.closing", "session_id": SID, "reason": "server_shutdown"}
    err = projection.protocol_error(ProtocolError("bad_event", "no", client_event_id="c", param="audio"))
    assert err == refusal_error("bad_event", "no", "c", param="audio")
    for o in (closing, err, refusal_error("config_timeout", "no session.create within 10 s")):
        validate_server_event(o, "native")


def test_nothing_follows_session_closed() -> None:
    projection = NativeProjection(SID)
    projection.project(ev.SessionClosed(SID, "client_close"))
    out: list[Any] = projection.project(ev.HeartbeatAck("h"))
    assert out == []
