"""vLLM-Omni compatibility on ``?duplex=1`` (docs/protocol.md §8): server_event_seq, response.speak, the
audio-delta metadata, session.event_ack; and that connections without it see none of it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from duplex_actors.protocol import wire_events as wire
from duplex_actors.protocol.errors import ProtocolError
from duplex_actors.protocol.parsing import parse_client_text
from duplex_actors.protocol.realtime import RealtimeProjection
from duplex_actors.protocol.schemas import validate_client_event, validate_server_event

from .conftest import SID, core_events

VLLM_OMNI = {
    "runtime_impl": "scheduler_data_plane",
    "uses_model_runner_scheduler": True,
    "runner_kv_backed": True,
}


def project(caps: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    projection = RealtimeProjection(SID, "m", caps, **kw)
    out = [o for e in core_events() for o in projection.project(e)]
    closing = projection.closing_event("server_shutdown")
    return [*out, *([closing] if closing is not None else [])]


@pytest.mark.parametrize("beta", [False, True])
def test_every_event_but_session_created_is_sequenced_from_one(
    capabilities: dict[str, Any], beta: bool
) -> None:
    out = project(capabilities, duplex=True, beta=beta)
    assert out[0]["type"] == "session.created" and "server_event_seq" not in out[0]
    assert [o["server_event_seq"] for o in out[1:]] == list(range(1, len(out)))
    for o in out:
        validate_server_event(o, "realtime")
    assert out[:-1] == project(capabilities, duplex=True, beta=beta)[:-1]  # deterministic


def test_one_speak_per_response_before_its_first_delta(capabilities: dict[str, Any]) -> None:
    out = project(capabilities, duplex=True)
    deltas = [o for o in out if o["type"] == "response.output_audio.delta"]
    speaks = [o for o in out if o["type"] == "response.speak"]
    assert deltas and len(speaks) == len({d["response_id"] for d in deltas}) == 3
    for speak in speaks:
        rid = speak["response_id"]
        first = next(
            i
            for i, o in enumerate(out)
            if o["type"] == "response.output_audio.delta" and o["response_id"] == rid
        )
        assert out.index(speak) == first - 1
        assert speak["item_id"] == out[first]["item_id"]
        assert (speak["output_index"], speak["content_index"]) == (0, 0)
        assert speak["metadata"] == {
            "session_id": SID,
            "epoch": out[first]["metadata"]["epoch"],
            "model_speak": True,
        }
    for d in deltas:
        meta = d["metadata"]
        assert meta["session_id"] == SID and meta["model_speak"] is True and meta["end_of_turn"] is False
        assert meta["vllm_omni"] == VLLM_OMNI
        assert list(meta)[:3] == ["epoch", "frame_index", "audio_duration_ms"]


def test_without_duplex_the_messages_are_openais(capabilities: dict[str, Any]) -> None:
    for beta in (False, True):
        out = project(capabilities, beta=beta)
        assert not [o for o in out if "server_event_seq" in o or o["type"] == "response.speak"]
        for o in out:
            if o["type"].endswith("audio.delta"):
                assert set(o["metadata"]) == {"epoch", "frame_index", "audio_duration_ms"}
    # The duplex stream is the plain one plus the additions: same events otherwise, but for what
    # the stock route leaves out or words as OpenAI does (protocol/realtime.py).
    plain, duplex = project(capabilities), project(capabilities, duplex=True)
    stripped = []
    for o in duplex:
        if o["type"] in ("response.speak", "session.closing"):
            continue
        if o["type"] == "output_audio_buffer.cleared" and o["response_id"] is None:
            o = {**o, "response_id": "resp_00112233445566778899aabb_1"}  # the last response
        if o["type"] == "response.done":
            reason = o["response"]["status_details"]["reason"]
            stock = {"output_audio_buffer_clear": "client_cancelled", "session_closed": None}.get(
                reason, reason
            )
            o = {**o, "response": {**o["response"], "status_details": {"type": "cancelled", "reason": stock}}}
        if o["type"] == "error" and o["error"]["code"] == "response_cancel_not_active":
            o = {**o, "error": {**o["error"], "message": "Cancellation failed: no active response found"}}
        o = {k: v for k, v in o.items() if k != "server_event_seq"}
        if "metadata" in o:
            o["metadata"] = {k: o["metadata"][k] for k in ("epoch", "frame_index", "audio_duration_ms")}
        stripped.append(o)
    assert [o["type"] for o in stripped] == [o["type"] for o in plain]
    assert [{k: v for k, v in o.items() if k != "event_id"} for o in stripped] == [
        {k: v for k, v in o.items() if k != "event_id"} for o in plain
    ]


@pytest.mark.parametrize("dialect", ["realtime", "native"])
def test_event_ack_parses(dialect: str) -> None:
    for seq in (0, 1, 2**40):
        text = json.dumps({"type": "session.event_ack", "server_event_seq": seq})
        assert parse_client_text(text, dialect=dialect) == wire.SessionEventAck(seq)  # type: ignore[arg-type]
        validate_client_event(json.loads(text), dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("seq", [-1, 1.5, "3", None, True, [1]])
def test_event_ack_without_a_non_negative_integer_is_invalid_event_ack(seq: Any) -> None:
    body: dict[str, Any] = {"type": "session.event_ack", "event_id": "a1"}
    if seq is not None:
        body["server_event_seq"] = seq
    with pytest.raises(ProtocolError) as info:
        parse_client_text(json.dumps(body), dialect="realtime")
    assert info.value.code == "invalid_event_ack"
    assert info.value.client_event_id == "a1" and info.value.param == "server_event_seq"
