"""Client messages in, typed client events out: the strict JSON parsing at the wire edge.

A text message must be one JSON object (no NaN/Infinity literals) with a string ``type`` of the
dialect (docs/protocol.md §3-§5); the client's ``event_id`` is echoed in every refusal.
Everything refused raises :class:`~.errors.ProtocolError` and nothing else.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Final

import cattrs

from .. import error_codes as codes
from .converter import CLIENT_TYPES, CLIENT_UNIONS, CONVERTER, dumps, json_type
from .errors import ProtocolError, clip
from .wire_events import ClientEvent, DialectName, InputAudioBufferAppend, PlaybackAck, SessionEventAck

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
MAX_EVENT_ID_CHARS: Final = 512
# Echoed back to the client: kept small so no server frame comes near 1 MiB.
MAX_PLAYBACK_PAYLOAD_BYTES: Final = 64 * 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _StrictDecoder:
    """A JSON decoder that refuses NaN/Infinity literals and notes number literals Python
    cannot hold as a finite float (``1e400``, a 400-digit integer): they would reach the core
    as inf or overflow later, so they are refused once the envelope is known. Made once per
    thread (building a decoder per message cost more than parsing a small one)."""

    def __init__(self) -> None:
        self.non_finite: list[str] = []
        self.decoder = json.JSONDecoder(
            parse_constant=_refuse_constant, parse_float=self._float, parse_int=self._int
        )

    def _float(self, literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            self.non_finite.append(literal)
        return value

    def _int(self, literal: str) -> int:
        value = int(literal)
        if len(literal) > 300:
            try:
                float(value)
            except OverflowError:
                self.non_finite.append(literal)
        return value


_DECODERS = threading.local()


def _strict_decoder() -> _StrictDecoder:
    decoder: _StrictDecoder | None = getattr(_DECODERS, "decoder", None)
    if decoder is None:
        decoder = _DECODERS.decoder = _StrictDecoder()
    return decoder


def _too_large(text: str, limit: int) -> bool:
    # Every character is 1 to 4 UTF-8 bytes: encode only when the length cannot decide.
    if len(text) > limit:
        return True
    if 4 * len(text) <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


def _describe(exc: BaseException, _: Any) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    return str(exc)


def parse_client_text(
    text: str, *, dialect: DialectName, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> ClientEvent:
    """Parse one text message of ``dialect``; raises ProtocolError (``invalid_json``,
    ``bad_event``, ``unknown_event``) and nothing else."""
    if _too_large(text, max_message_bytes):
        raise ProtocolError(codes.BAD_EVENT, f"message larger than {max_message_bytes} bytes")
    decoder = _strict_decoder()
    non_finite = decoder.non_finite
    non_finite.clear()
    try:
        if text.startswith("\ufeff"):  # json.loads' own refusal (decode() does not check)
            json.loads(text)
        obj = decoder.decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(codes.INVALID_JSON, f"message is not valid JSON: {exc}") from None
    if not non_finite:
        append = _fast_append(obj)
        if append is not None:
            return append
        return parse_client_object(obj, dialect=dialect)
    return parse_client_object(obj, dialect=dialect, non_finite=non_finite[0])


# The fields an append may have to take the fast path, with their one JSON type each (both
# dialects' appends share them); each is an attribute of InputAudioBufferAppend, so a new
# optional field is one more entry here. A message with any other key, or a value of another
# type (null included), goes the general way (the converter), which gives every documented
# answer to bad input.
_FAST_APPEND_FIELDS: Final[dict[str, type]] = {"type": str, "audio": str, "event_id": str}


def _fast_append(obj: Any) -> InputAudioBufferAppend | None:
    """The append a well-formed ``input_audio_buffer.append`` object is, without the converter
    (an append is most of what a client sends: one dict lookup for ``type``, one type check per
    field); None for anything that needs the general path's checks."""
    if type(obj) is not dict or obj.get("type") != InputAudioBufferAppend.TYPE:
        return None
    for key, value in obj.items():
        if type(value) is not _FAST_APPEND_FIELDS.get(key):
            return None
    event_id = obj.get("event_id")
    if "audio" not in obj or (event_id is not None and len(event_id) > MAX_EVENT_ID_CHARS):
        return None
    return InputAudioBufferAppend(**{k: v for k, v in obj.items() if k != "type"})


def parse_client_object(obj: Any, *, dialect: DialectName, non_finite: str | None = None) -> ClientEvent:
    """Validate an already-decoded JSON value as a client event of ``dialect``; ``non_finite``
    is a number literal of the message that is out of float range (refused with ``bad_event``)."""
    if not isinstance(obj, dict):
        raise ProtocolError(codes.INVALID_JSON, f"a message must be a JSON object, not {json_type(obj)}")
    raw_id = obj.get("event_id")
    event_id = raw_id if isinstance(raw_id, str) and len(raw_id) <= MAX_EVENT_ID_CHARS else None
    raw_type = obj.get("type")
    event_type = clip(raw_type, 128) if isinstance(raw_type, str) else None

    def refuse(code: str, message: str, param: str | None = None) -> ProtocolError:
        return ProtocolError(code, message, event_type=event_type, client_event_id=event_id, param=param)

    if raw_type is None:
        raise refuse(codes.BAD_EVENT, "the message has no `type`", "type")
    if not isinstance(raw_type, str):
        raise refuse(codes.BAD_EVENT, f"`type` must be a string, not {json_type(raw_type)}", "type")
    if raw_id is not None and not isinstance(raw_id, str):
        raise refuse(codes.BAD_EVENT, f"`event_id` must be a string, not {json_type(raw_id)}", "event_id")
    if isinstance(raw_id, str) and event_id is None:
        raise refuse(codes.BAD_EVENT, f"`event_id` longer than {MAX_EVENT_ID_CHARS} characters", "event_id")
    if dialect not in CLIENT_TYPES:
        raise ValueError(f"unknown dialect {dialect!r}")
    if raw_type not in CLIENT_TYPES[dialect]:
        raise refuse(codes.UNKNOWN_EVENT, f"unknown event type {clip(raw_type, 128)!r}", "type")
    if non_finite is not None:
        raise refuse(
            codes.BAD_EVENT, f"number {clip(non_finite, 64)} is out of range (not finite as a float)"
        )
    if raw_type == SessionEventAck.TYPE:
        seq = obj.get("server_event_seq")
        if type(seq) is not int or seq < 0:
            raise refuse(
                codes.INVALID_EVENT_ACK,
                f"`server_event_seq` must be a non-negative integer, not {clip(repr(seq), 64)}",
                "server_event_seq",
            )
    try:
        event: ClientEvent = CONVERTER.structure(obj, CLIENT_UNIONS[dialect])
    except Exception as exc:
        problems = (
            cattrs.transform_error(exc, path="$", format_exception=_describe)
            if isinstance(exc, cattrs.BaseValidationError)
            else []
        )
        detail = "; ".join(problems) or str(exc)
        param = problems[0].rpartition("@ $.")[2] if problems and "@ $." in problems[0] else None
        raise refuse(codes.BAD_EVENT, f"malformed {raw_type}: {detail}", param) from None
    if isinstance(event, PlaybackAck) and len(dumps(event.payload)) > MAX_PLAYBACK_PAYLOAD_BYTES:
        raise refuse(codes.BAD_EVENT, f"playback.ack larger than {MAX_PLAYBACK_PAYLOAD_BYTES} bytes")
    return event


def parse_client_binary(data: bytes, *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """A native binary message: raw audio in the session's input format (no base64)."""
    if not data:
        raise ProtocolError(codes.BAD_EVENT, "an empty binary message carries no audio", param="audio")
    if len(data) > max_message_bytes:
        raise ProtocolError(codes.BAD_EVENT, f"message larger than {max_message_bytes} bytes")
    return bytes(data)
