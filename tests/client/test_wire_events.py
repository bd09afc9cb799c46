"""One representation per server event: what the projections send parses back, on the client, into
the very ``protocol.wire_events`` instance it was built from, in every dialect."""

from __future__ import annotations

from typing import Any

import pytest

from duplex_actors.client import Error, OtherEvent, parse_server_event
from duplex_actors.protocol import wire_events as wire
from duplex_actors.protocol.converter import encode_server_event
from duplex_actors.protocol.native import NativeProjection
from duplex_actors.protocol.realtime import RealtimeProjection

from ..replay.test_wire import CAPS, SID, synthetic, synthetic_aligned, synthetic_conversation

# Per variant, the classes it never sends.
# response.speak goes only to ?duplex=1 connections (tests/protocol/test_duplex_compat.py); the
# resume events come from the connection of a resumable session, not from a projection
# (test_the_resume_events_parse_into_their_class below, tests/e2e/test_resume.py).
RESUME = set(wire.RESUME_SERVER_EVENTS)
NOT_SENT: dict[str, set[type[Any]]] = {
    "ga": {wire.RealtimeResponseSpeak} | RESUME,
    "beta": {wire.RealtimeConversationItemDone, wire.RealtimeResponseSpeak} | RESUME,
    "native": {wire.NativeOutputTranscriptDelta} | RESUME,
    "native-binary": {wire.NativeOutputAudioDelta} | RESUME,
}


def _messages(dialect: str) -> list[dict[str, Any]]:
    def projection(**options: Any) -> Any:
        if dialect.startswith("native"):
            return NativeProjection(SID, capabilities=CAPS, binary_output=dialect == "native-binary")
        return RealtimeProjection(SID, "tiny", CAPS, beta=dialect == "beta", **options)

    # The stock route sends no session.closing: the ?duplex=1 projection's (the same class).
    out = [projection().closing_event("server_shutdown") or projection(duplex=True).closing_event("x")]
    for stream in (synthetic(), synthetic_aligned(), synthetic_conversation()):
        each = projection()
        for event in stream:
            out += [m for m in each.project(event) if isinstance(m, dict)]
    return out


@pytest.mark.parametrize("variant", sorted(NOT_SENT))
def test_every_message_parses_into_its_class_and_encodes_back_to_itself(variant: str) -> None:
    native = variant.startswith("native")
    classes = wire.NATIVE_SERVER_EVENTS if native else wire.REALTIME_SERVER_EVENTS
    seen = set()
    for message in _messages(variant):
        parsed = parse_server_event(message, dialect="native" if native else "realtime")
        assert type(parsed.wire) in classes, message["type"]
        seen.add(type(parsed.wire))
        again = encode_server_event(parsed.wire)
        again["type"] = message["type"]  # the converter writes the GA name; beta renames in place
        assert list(again.items()) == list(message.items())
    assert set(classes) - seen == NOT_SENT[variant]  # the synthetic stream has every event


@pytest.mark.parametrize("dialect", ["realtime", "native"])
def test_the_resume_events_parse_into_their_class(dialect: str) -> None:
    event_id = "evt_x_r2" if dialect == "realtime" else None
    for event in (
        wire.SessionResumed(SID, 2, "token", 9, 8, 1920, None, 30.0, event_id),
        wire.SessionReplaced(SID, 1, event_id),
        wire.SessionResyncRequired(SID, "journal_gap", 5, event_id),
    ):
        message = encode_server_event(event)
        parsed = parse_server_event(message, dialect=dialect)  # type: ignore[arg-type]
        assert parsed.wire == event and encode_server_event(parsed.wire) == message


@pytest.mark.parametrize(
    "message",
    [
        {"type": "response.output_audio.delta", "delta": 5},
        {"type": "session.created", "event_id": "e", "session": {"id": "s"}},
    ],
)
def test_a_message_that_is_not_a_valid_event_is_other_with_no_wire(message: dict[str, Any]) -> None:
    parsed = parse_server_event(message)
    assert isinstance(parsed, OtherEvent) and parsed.wire is None and parsed.type == message["type"]


def test_a_malformed_error_is_still_an_error() -> None:
    parsed = parse_server_event({"type": "error"})
    assert isinstance(parsed, Error) and parsed.wire is None and parsed.code == "unknown"
