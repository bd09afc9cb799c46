"""Projection of neutral session events onto the Realtime dialect: order, names, ids, errors."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from duplex_actors.protocol import dumps
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.protocol.realtime import RealtimeProjection, refusal_error
from duplex_actors.protocol.schemas import validate_server_event
from duplex_actors.session import events as ev
from duplex_actors.session.events import MAX_TRANSCRIPT_CHARS

from .conftest import SID, core_events

RID, ITEM = "resp_x_0", "item_x_0"
PCM = bytes(range(256)) * 15  # one 80 ms frame: 1920 samples


def project_all(events: list[ev.SessionEvent], caps: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    projection = RealtimeProjection(SID, "personaplex-7b", caps, **kw)
    out: list[dict[str, Any]] = []
    for event in events:
        out += projection.project(event)
    return out


def types(out: list[dict[str, Any]]) -> list[str]:
    return [o["type"] for o in out]


def one_response(reason: str = "client_cancelled", audio_cleared: bool = False) -> list[ev.SessionEvent]:
    return [
        ev.ResponseStarted(RID, ITEM, 0),
        ev.AudioFrame(RID, ITEM, 0, 0, PCM, "Hel"),
        ev.AudioFrame(RID, ITEM, 0, 1, PCM, ""),
        ev.AudioFrame(RID, ITEM, 0, 2, PCM, "lo"),
        ev.ResponseEnded(RID, ITEM, 0, reason, "Hello", 3, audio_cleared),
    ]


GA_ORDER = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]
BETA_ORDER = [
    "response.created",
    "response.output_item.added",
    "conversation.item.created",
    "response.content_part.added",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.audio.delta",
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.audio.done",
    "response.audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
    "rate_limits.updated",
]


def test_a_full_response_follows_openais_order(capabilities: dict[str, Any]) -> None:
    out = project_all(one_response(), capabilities)
    assert types(out) == GA_ORDER
    done = out[-2]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hello"}]
    assert out[-1]["rate_limits"] == []
    assert out[10]["transcript"] == "Hello"


def test_beta_clients_get_the_beta_names(capabilities: dict[str, Any]) -> None:
    out = project_all(one_response(), capabilities, beta=True)
    assert types(out) == BETA_ORDER
    assert out[0]["response"]["modalities"] == ["audio", "text"]
    assert "output_modalities" not in out[0]["response"]
    for o in out:
        validate_server_event(o, "realtime")


@pytest.mark.parametrize(
    ("duplex", "reason"), [(True, "output_audio_buffer_clear"), (False, "client_cancelled")]
)
def test_output_buffer_clear_puts_cleared_first_in_the_terminal_group(
    capabilities: dict[str, Any], duplex: bool, reason: str
) -> None:
    out = project_all(
        one_response("output_audio_buffer_clear", audio_cleared=True), capabilities, duplex=duplex
    )
    out = [
        {k: v for k, v in o.items() if k != "server_event_seq"} for o in out if o["type"] != "response.speak"
    ]
    assert types(out) == [*GA_ORDER[:9], "output_audio_buffer.cleared", *GA_ORDER[9:]]
    assert out[9]["response_id"] == RID
    assert out[-2]["response"]["status_details"]["reason"] == reason


def test_audio_delta_carries_pcm_rate_and_metadata(capabilities: dict[str, Any]) -> None:
    out = project_all(one_response(), capabilities)
    delta = out[4]
    assert base64.b64decode(delta["delta"]) == PCM
    assert delta["sample_rate_hz"] == 24000
    assert delta["metadata"] == {"epoch": 0, "frame_index": 0, "audio_duration_ms": 80}
    assert (delta["response_id"], delta["item_id"], delta["output_index"], delta["content_index"]) == (
        RID,
        ITEM,
        0,
        0,
    )
    assert out[5]["delta"] == "Hel"
    assert out[7]["metadata"]["frame_index"] == 2


def test_output_chunk_frames_groups_frames_and_flushes_before_the_end(capabilities: dict[str, Any]) -> None:
    out = project_all(one_response(), capabilities, output_chunk_frames=2)
    deltas = [o for o in out if o["type"] == "response.output_audio.delta"]
    assert [d["metadata"] for d in deltas] == [
        {"epoch": 0, "frame_index": 0, "audio_duration_ms": 160},
        {"epoch": 0, "frame_index": 2, "audio_duration_ms": 80},
    ]
    assert base64.b64decode(deltas[0]["delta"]) == PCM * 2
    transcripts = [o["delta"] for o in out if o["type"] == "response.output_audio_transcript.delta"]
    assert transcripts == ["Hel", "lo"]
    with pytest.raises(ValueError):
        RealtimeProjection(SID, "m", capabilities, output_chunk_frames=0)


def test_a_whole_session_from_the_core(capabilities: dict[str, Any]) -> None:
    out = project_all(core_events(), capabilities, duplex=True)
    out = [
        {k: v for k, v in o.items() if k != "server_event_seq"} for o in out if o["type"] != "response.speak"
    ]
    for o in out:
        if "metadata" in o:
            o["metadata"] = {k: o["metadata"][k] for k in ("epoch", "frame_index", "audio_duration_ms")}
    assert types(out)[:3] == ["session.created", "session.updated", "input_audio_buffer.speech_started"]
    created = out[0]["session"]
    assert created["id"] == SID and created["object"] == "realtime.session"
    assert created["model"] == "personaplex-7b" and created["capabilities"] == capabilities
    assert created["voice"] == "NATM1.pt" and created["turn_detection"] is None
    assert out[1]["session"] == created
    assert out[2]["audio_start_ms"] == 0 and out[2]["item_id"].startswith("item_in_")
    responses = [o["response"]["id"] for o in out if o["type"] == "response.created"]
    assert len(responses) == len(set(responses)) == 3
    dones = [o["response"]["status_details"]["reason"] for o in out if o["type"] == "response.done"]
    assert dones == ["client_cancelled", "output_audio_buffer_clear", "session_closed"]
    added = [o for o in out if o["type"] == "conversation.item.added"]
    assert added[0]["previous_item_id"] is None
    assert added[1]["previous_item_id"] == added[0]["item"]["id"]
    assert out[-1] == {
        "type": "session.closed",
        "event_id": out[-1]["event_id"],
        "session_id": SID,
        "reason": "client_close",
    }
    by_type = {o["type"]: o for o in out}
    assert by_type["session.heartbeat_ack"]["client_event_id"] == "ev_hb"
    assert by_type["playback.acknowledged"]["payload"] == {"played_ms": 160}
    assert by_type["input_audio_buffer.cleared"]
    assert [o.get("response_id") for o in out if o["type"] == "output_audio_buffer.cleared"] == [
        "resp_00112233445566778899aabb_1",
        None,
    ]
    errors = [o["error"] for o in out if o["type"] == "error"]
    assert [(e["code"], e["event_id"], e["type"]) for e in errors] == [
        ("response_cancel_not_active", "ev_cancel2", "invalid_request_error"),
        ("voice_update_unsupported", "ev_update", "invalid_request_error"),
    ]


def test_every_event_validates_against_its_schema_and_stays_small(capabilities: dict[str, Any]) -> None:
    for beta in (False, True):
        projection = RealtimeProjection(SID, "m", capabilities, beta=beta)
        out = [o for e in core_events() for o in projection.project(e)]
        out += [c for c in [projection.closing_event("server_shutdown")] if c is not None]
        out += [refusal_error("resource_exhausted", "all slots are busy")]
        for o in out:
            validate_server_event(o, "realtime")
            assert len(dumps(o)) < 64 * 1024


def test_event_ids_are_unique_and_deterministic(capabilities: dict[str, Any]) -> None:
    first = project_all(core_events(), capabilities)
    again = project_all(core_events(), capabilities)
    ids = [o["event_id"] for o in first]
    assert ids == [o["event_id"] for o in again]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "evt_00112233445566778899aabb_1"
    assert first == again


def test_nothing_follows_session_closed(capabilities: dict[str, Any]) -> None:
    projection = RealtimeProjection(SID, "m", capabilities, duplex=True)
    assert projection.project(ev.SessionClosed(SID, "timeout"))
    assert projection.project(ev.HeartbeatAck()) == []


def test_the_stock_route_says_session_closed_only_to_its_session_close(capabilities: dict[str, Any]) -> None:
    for reason, sent in (("timeout", []), ("server_shutdown", []), ("client_close", ["session.closed"])):
        projection = RealtimeProjection(SID, "m", capabilities)
        assert projection.closing_event(reason) is None
        assert types(projection.project(ev.SessionClosed(SID, reason))) == sent
        assert projection.project(ev.HeartbeatAck()) == []


def test_error_events_have_the_spec_shape(capabilities: dict[str, Any]) -> None:
    projection = RealtimeProjection(SID, "m", capabilities)
    (out,) = projection.project(ev.Error("internal_error", "step failed"))
    assert out["error"] == {
        "type": "server_error",
        "code": "internal_error",
        "message": "step failed",
        "param": None,
        "event_id": None,
    }
    exc = ProtocolError("bad_audio", "x" * 100_000, client_event_id="c9", param="audio")
    err = projection.protocol_error(exc)
    assert err["error"]["event_id"] == "c9" and err["error"]["param"] == "audio"
    assert len(err["error"]["message"]) <= 1024
    validate_server_event(err, "realtime")


def test_refusal_errors_before_a_session(capabilities: dict[str, Any]) -> None:
    full = refusal_error("resource_exhausted", "all 2 slots are busy")
    assert full["error"]["type"] == "rate_limit_error" and full["event_id"].startswith("evt_")
    assert refusal_error("model_not_found", "no", "c1", event_id="evt_fixed") == {
        "type": "error",
        "event_id": "evt_fixed",
        "error": {
            "type": "invalid_request_error",
            "code": "model_not_found",
            "message": "no",
            "param": None,
            "event_id": "c1",
        },
    }


def test_long_transcripts_are_capped(capabilities: dict[str, Any]) -> None:
    long = "a" * (MAX_TRANSCRIPT_CHARS * 3)
    out = project_all(
        [ev.ResponseStarted(RID, ITEM, 0), ev.ResponseEnded(RID, ITEM, 0, "session_closed", long, 1, False)],
        capabilities,
    )
    assert max(len(dumps(o)) for o in out) < 128 * 1024
