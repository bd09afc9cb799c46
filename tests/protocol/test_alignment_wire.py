"""Alignment on the wire (spec section 7): ``pad_ms`` on appends, ``input_audio_buffer.alignment``
only for sessions that opted in, ``input_samples_end`` on every output delta (Realtime GA and
beta, native JSON and binary)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from duplex_actors.protocol import audio_formats, parsing
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.protocol.native import (
    NativeProjection,
    binary_frame,
    split_binary_frame,
    split_binary_frame_position,
)
from duplex_actors.protocol.realtime import RealtimeProjection
from duplex_actors.protocol.schemas import validate_client_event, validate_server_event
from duplex_actors.session import events as ev

SID = "sess_00112233445566778899aabb"
PCM = bytes(range(256)) * 15
CLIENT = {"voice": "NATF2.pt", "duplex": {"alignment": "client"}}


def parse_append(extra: dict[str, Any], dialect: str = "realtime") -> int:
    message = {"type": "input_audio_buffer.append", "audio": "AAAA", **extra}
    event = parsing.parse_client_text(json.dumps(message), dialect=dialect)  # type: ignore[arg-type]
    return audio_formats.append_pad_ms(event)  # type: ignore[arg-type]


@pytest.mark.parametrize("dialect", ["realtime", "native"])
def test_pad_ms_is_an_integer_in_0_to_79(dialect: str) -> None:
    assert parse_append({}, dialect) == 0
    assert parse_append({"pad_ms": None}, dialect) == 0
    assert parse_append({"pad_ms": 0}, dialect) == 0
    assert parse_append({"pad_ms": 79}, dialect) == 79
    for bad in (80, -1, 1.5, "5", True, [3], {"a": 1}):
        with pytest.raises(ProtocolError) as info:
            parse_append({"pad_ms": bad, "event_id": "e1"}, dialect)
        assert (info.value.code, info.value.param, info.value.client_event_id) == (
            "invalid_value",
            "pad_ms",
            "e1",
        )
    validate_client_event({"type": "input_audio_buffer.append", "audio": "AAAA", "pad_ms": 20}, dialect)  # type: ignore[arg-type]


def stream(config: dict[str, Any]) -> list[ev.SessionEvent]:
    return [
        ev.SessionCreated(SID, config),
        ev.AlignmentHint(37, "start"),
        ev.ResponseStarted("resp_a", "item_a", 0),
        ev.AudioFrame("resp_a", "item_a", 0, 0, PCM, "Hi", 1440),
        ev.AudioFrame("resp_a", "item_a", 0, 1, PCM, "", None),
        ev.SessionUpdated(SID, {**config, "duplex": {"alignment": "off"}}),
        ev.AlignmentHint(12, "drift"),
    ]


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("duplex", [False, True])
def test_realtime_sends_the_hint_only_to_opted_in_sessions(
    beta: bool, duplex: bool, capabilities: dict[str, Any]
) -> None:
    for config, hints in ((CLIENT, 1), ({"voice": "NATF2.pt"}, 0), ({"duplex": {"alignment": "server"}}, 0)):
        projection = RealtimeProjection(SID, "m", capabilities, beta=beta, duplex=duplex)
        out = [m for e in stream(config) for m in projection.project(e)]
        for m in out:
            validate_server_event(m, "realtime")
        got = [m for m in out if m["type"] == "input_audio_buffer.alignment"]
        assert len(got) == hints
        if hints:
            assert (got[0]["pad_ms"], got[0]["reason"]) == (37, "start") and got[0]["event_id"].startswith(
                "evt_"
            )
        deltas = [m for m in out if m["type"].endswith("audio.delta")]
        assert deltas[0]["metadata"]["input_samples_end"] == 1440
        assert "input_samples_end" not in deltas[1]["metadata"]  # older logs: exactly as before


def test_a_grouped_delta_states_its_last_frames_position(capabilities: dict[str, Any]) -> None:
    projection = RealtimeProjection(SID, "m", capabilities, output_chunk_frames=2)
    events: list[ev.SessionEvent] = [
        ev.SessionCreated(SID, {}),
        ev.ResponseStarted("r", "i", 0),
        ev.AudioFrame("r", "i", 0, 0, PCM, "", 1920),
        ev.AudioFrame("r", "i", 0, 1, PCM, "", 3840),
    ]
    (delta,) = [
        m for e in events for m in projection.project(e) if m["type"] == "response.output_audio.delta"
    ]
    assert (delta["metadata"]["frame_index"], delta["metadata"]["input_samples_end"]) == (0, 3840)


def test_native_json_hint_and_positions(capabilities: dict[str, Any]) -> None:
    for config, hints in ((CLIENT, 1), ({}, 0)):
        projection = NativeProjection(SID, capabilities=capabilities)
        out = [m for e in stream(config) for m in projection.project(e)]
        assert all(isinstance(m, dict) for m in out)
        for m in out:
            validate_server_event(m, "native")
        got = [m for m in out if isinstance(m, dict) and m["type"] == "input_audio_buffer.alignment"]
        assert got == (
            [{"type": "input_audio_buffer.alignment", "pad_ms": 37, "reason": "start"}] if hints else []
        )
        deltas = [m for m in out if isinstance(m, dict) and m["type"] == "response.output_audio.delta"]
        assert deltas[0]["input_samples_end"] == 1440 and "input_samples_end" not in deltas[1]


def test_native_binary_frames_carry_the_position_for_opted_in_sessions_only() -> None:
    for config, header in ((CLIENT, 8), ({}, 4)):
        projection = NativeProjection(SID, binary_output=True)
        out = [m for e in stream(config) for m in projection.project(e)]
        frames = [m for m in out if isinstance(m, bytes)]
        assert len(frames[0]) == header + len(PCM)
        index, position, pcm = split_binary_frame_position(frames[0])
        assert (index, position, pcm) == (0, 1440 if header == 8 else None, PCM)
        assert split_binary_frame(frames[0]) == (0, PCM)
        assert split_binary_frame(frames[1]) == (1, PCM)  # no position: the 4-byte header
    assert binary_frame(3, PCM) == (3).to_bytes(4, "little") + PCM
