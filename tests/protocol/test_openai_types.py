"""Every event the stock ``/v1/realtime`` route can send validates against openai-python's
server-event types (``openai.types.realtime.RealtimeServerEvent``, as the OpenAI Agents SDK
validates them), but the answers to the server's own extensions, which an OpenAI client never
asks for: ``session.closed`` (to ``session.close``), ``session.heartbeat_ack``,
``playback.acknowledged`` and ``input_audio_buffer.alignment`` (``duplex.alignment: "client"``).

The table lists every session event with the stock route's messages for it; the projection is
fed each, in a session's order, and every message it sends is checked. GA names only: openai-python
ships no types for the beta names.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from duplex_actors.protocol.realtime import RealtimeProjection, refusal_error
from duplex_actors.protocol.schemas import validate_server_event
from duplex_actors.session import events as ev
from duplex_actors.web.connection import capabilities

SID = "sess_00112233445566778899aabb"
PCM = bytes(3840)
OPENAI = TypeAdapter(RealtimeServerEvent)
EXTENSIONS = {
    "session.closed",
    "session.heartbeat_ack",
    "playback.acknowledged",
    "input_audio_buffer.alignment",
}
CONFIG = {"voice": "ash", "voice_prompt": "NATM1.pt", "instructions": "Be brief.", "type": "realtime"}

# (session event, the types the stock route sends for it), in a session's order: every kind
# of session event, every reason and refusal the stock route words its own way.
TABLE: list[tuple[ev.SessionEvent, list[str]]] = [
    (ev.SessionCreated(SID, CONFIG), ["session.created"]),
    (ev.SessionUpdated(SID, CONFIG, "u1"), ["session.updated"]),
    (ev.OutputCleared("c0"), []),  # no response yet: nothing names one
    (ev.TextItemAdded("item_text_x_0", "system", "Speak French.", True, "t1"), ["conversation.item.added", "conversation.item.done"]),
    (ev.TextItemAdded("msg_1", "user", "Say hello!", False), ["conversation.item.added", "conversation.item.done"]),
    (ev.TextItemAdded("msg_2", "developer", "Be terse.", False), ["conversation.item.added", "conversation.item.done"]),
    (ev.TextItemAdded("msg_3", "assistant", "Hi.", False), ["conversation.item.added", "conversation.item.done"]),
    (ev.ResponseStarted("resp_x_0", "item_x_0", 0), ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]),
    (ev.AudioFrame("resp_x_0", "item_x_0", 0, 0, PCM, "", 1920), ["response.output_audio.delta"]),
    (ev.SpeechStarted(0, 1, "item_in_x_0"), ["input_audio_buffer.speech_started"]),
    (ev.AudioFrame("resp_x_0", "item_x_0", 0, 1, PCM, " Hi", 3840), ["response.output_audio.delta", "response.output_audio_transcript.delta"]),
    (ev.ItemTruncated("item_x_0", 0, 80, "t2"), ["conversation.item.truncated"]),
    (ev.ItemRetrieved("item_x_0", "assistant", " Hi", True, False, "r1"), ["conversation.item.retrieved"]),
    (ev.ItemRetrieved("msg_1", "user", "Say hello!", False, True, "r2"), ["conversation.item.retrieved"]),
    (ev.ItemRetrieved("msg_2", "developer", "Be terse.", False, True), ["conversation.item.retrieved"]),
    (ev.ResponseEnded("resp_x_0", "item_x_0", 0, "client_cancelled", " Hi", 2, False), [
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done", "rate_limits.updated",
    ]),
    (ev.Error("response_cancel_not_active", "no response is active", "c2"), ["error"]),
    (ev.OutputCleared("c3"), ["output_audio_buffer.cleared"]),
    (ev.ItemRetrieved("item_x_0", "assistant", " Hi", True, True), ["conversation.item.retrieved"]),
    (ev.ResponseStarted("resp_x_1", "item_x_1", 0), ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]),
    (ev.AudioFrame("resp_x_1", "item_x_1", 0, 2, PCM, "", 5760), ["response.output_audio.delta"]),
    (ev.ResponseEnded("resp_x_1", "item_x_1", 0, "output_audio_buffer_clear", "", 1, True), [
        "output_audio_buffer.cleared", "response.output_audio.done", "response.output_audio_transcript.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done",
        "rate_limits.updated",
    ]),
    (ev.InputCleared("c4"), ["input_audio_buffer.cleared"]),
    (ev.Error("conversation_already_has_active_response", "always responding", "c5"), ["error"]),
    (ev.Error("invalid_voice", "unknown voice 'nope'", "c6", "session.voice"), ["error"]),
    (ev.HeartbeatAck("h1"), ["session.heartbeat_ack"]),
    (ev.PlaybackAcknowledged({"played_ms": 80}, "p1"), ["playback.acknowledged"]),
    (ev.SessionUpdated(SID, {**CONFIG, "duplex": {"alignment": "client"}}), ["session.updated"]),
    (ev.AlignmentHint(20, "start"), ["input_audio_buffer.alignment"]),
    (ev.ResponseStarted("resp_x_2", "item_x_2", 0), ["response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"]),
    (ev.AudioFrame("resp_x_2", "item_x_2", 0, 3, PCM, "!", 7680), ["response.output_audio.delta", "response.output_audio_transcript.delta"]),
    # the close ends the response (no reason OpenAI defines); session.closed answers session.close only
    (ev.SessionClosed(SID, "client_close"), [
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done", "rate_limits.updated",
        "session.closed",
    ]),
]  # fmt: skip


def stock_messages() -> list[tuple[ev.SessionEvent, list[dict[str, Any]]]]:
    projection = RealtimeProjection(SID, "tiny", capabilities(8))
    out = []
    for event, _ in TABLE:
        if isinstance(event, ev.SessionClosed):  # the close ends the open response first
            sent = projection.project(
                ev.ResponseEnded("resp_x_2", "item_x_2", 0, "session_closed", "!", 1, False)
            )
            sent += projection.project(event)
        else:
            sent = projection.project(event)
        out.append((event, sent))
    return out


@pytest.mark.parametrize("row", range(len(TABLE)), ids=[type(e).__name__ for e, _ in TABLE])
def test_every_stock_event_validates_against_openai_pythons_types(row: int) -> None:
    _, sent = stock_messages()[row]
    assert [m["type"] for m in sent] == TABLE[row][1]
    for message in sent:
        validate_server_event(message, "realtime")  # and against the server's own schemas
        if message["type"] in EXTENSIONS:
            continue
        parsed = OPENAI.validate_python(message)
        assert parsed.type == message["type"]


def test_the_stock_route_words_and_names_things_as_openai_does() -> None:
    sent = {type(e).__name__ + str(i): s for i, (e, s) in enumerate(stock_messages())}
    messages = [m for s in sent.values() for m in s]
    reasons = [m["response"]["status_details"]["reason"] for m in messages if m["type"] == "response.done"]
    assert reasons == ["client_cancelled", "client_cancelled", None]
    errors = {m["error"]["code"]: m["error"]["message"] for m in messages if m["type"] == "error"}
    assert errors["response_cancel_not_active"] == "Cancellation failed: no active response found"
    cleared = [m["response_id"] for m in messages if m["type"] == "output_audio_buffer.cleared"]
    assert cleared == ["resp_x_0", "resp_x_1"]  # always a response: the last one
    roles = [m["item"]["role"] for m in messages if m["type"] == "conversation.item.added"]
    assert roles == ["system", "user", "system", "assistant", "assistant", "assistant", "assistant"]
    assert not [m for m in messages if m["type"] in ("session.closing", "response.speak")]


def test_a_refusal_without_a_session_validates_too() -> None:
    for code in ("resource_exhausted", "model_not_found", "config_timeout", "internal_error"):
        OPENAI.validate_python(refusal_error(code, "refused", "c1"))


@pytest.mark.parametrize("reason", ["timeout", "server_shutdown", "error", "log_unavailable", "disconnect"])
def test_only_the_clients_own_close_is_answered_with_session_closed(reason: str) -> None:
    projection = RealtimeProjection(SID, "tiny", {})
    projection.project(ev.SessionCreated(SID, CONFIG))
    assert projection.closing_event("server_shutdown") is None
    assert projection.project(ev.SessionClosed(SID, reason)) == []
