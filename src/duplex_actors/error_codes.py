"""The wire error codes, the OpenAI ``error.type`` each is reported under, and
:class:`CodedError`, the base of every error that carries one.

``rate_limit_error`` when the server is full, ``server_error`` when the server failed,
``invalid_request_error`` for every client mistake (including codes of a model family that
``CODES`` does not list). Every layer raises ``CodedError`` subclasses, so the session core and
actor report the ``code`` of whatever the model family, the protocol or the scheduler raised
without importing those layers.
"""

from __future__ import annotations

from typing import Final, Literal

ErrorType = Literal["invalid_request_error", "rate_limit_error", "server_error"]

INVALID_JSON: Final = "invalid_json"
BAD_EVENT: Final = "bad_event"
UNKNOWN_EVENT: Final = "unknown_event"
INVALID_VALUE: Final = "invalid_value"
BAD_AUDIO: Final = "bad_audio"
UNSUPPORTED_AUDIO_FORMAT: Final = "unsupported_audio_format"
INPUT_BACKPRESSURE: Final = "input_backpressure"
INVALID_VOICE: Final = "invalid_voice"
VOICE_UPDATE_UNSUPPORTED: Final = "voice_update_unsupported"
PERSONA_UPDATE_UNSUPPORTED: Final = "persona_update_unsupported"
INVALID_DUPLEX_RUNTIME_CONFIG: Final = "invalid_duplex_runtime_config"
MODEL_NOT_FOUND: Final = "model_not_found"
RESPONSE_CANCEL_NOT_ACTIVE: Final = "response_cancel_not_active"
COMMIT_UNSUPPORTED: Final = "commit_unsupported"
RESPONSE_CREATE_UNSUPPORTED: Final = "response_create_unsupported"
# OpenAI's code for a response.create while a response is active: the stock route's answer (the
# lockstep response is always active), which voice-agent frameworks tolerate.
CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE: Final = "conversation_already_has_active_response"
ITEM_RETRIEVE_INVALID_ITEM_ID: Final = "item_retrieve_invalid_item_id"  # OpenAI's code
INPUT_AUDIO_BUFFER_EMPTY: Final = "input_audio_buffer_empty"  # upstream's code (docs/protocol.md §8)
INVALID_EVENT_ACK: Final = "invalid_event_ack"
CONFIG_TIMEOUT: Final = "config_timeout"
RESOURCE_EXHAUSTED: Final = "resource_exhausted"
RATE_LIMITED: Final = "rate_limited"  # held back by the connection's budget too long (docs/protocol.md §6)
SESSION_CLOSED: Final = "session_closed"
LOG_UNAVAILABLE: Final = "log_unavailable"
UNAUTHORIZED: Final = "unauthorized"
INTERNAL_ERROR: Final = "internal_error"
# Resuming a session after a dropped connection (docs/protocol.md §10).
UNSUPPORTED_SESSION_RESUME: Final = "unsupported_session_resume"
INVALID_SESSION_RESUME: Final = "invalid_session_resume"
SESSION_RESUME_EXPIRED: Final = "session_resume_expired"
SESSION_NOT_FOUND: Final = "session_not_found"
INVALID_RESUME_TOKEN: Final = "invalid_resume_token"
SESSION_RESUME_CONFLICT: Final = "session_resume_conflict"
SESSION_NOT_HERE: Final = "session_not_here"
INPUT_GAP: Final = "input_gap"
# A model family's checkpoint codes (``model.errors``), outside the protocol's list.
CHECKPOINT_ERROR: Final = "checkpoint_error"
CHECKPOINT_UNAVAILABLE: Final = "checkpoint_unavailable"

CODES: Final[tuple[str, ...]] = (
    INVALID_JSON,
    BAD_EVENT,
    UNKNOWN_EVENT,
    INVALID_VALUE,
    BAD_AUDIO,
    UNSUPPORTED_AUDIO_FORMAT,
    INPUT_BACKPRESSURE,
    INVALID_VOICE,
    VOICE_UPDATE_UNSUPPORTED,
    PERSONA_UPDATE_UNSUPPORTED,
    INVALID_DUPLEX_RUNTIME_CONFIG,
    MODEL_NOT_FOUND,
    RESPONSE_CANCEL_NOT_ACTIVE,
    COMMIT_UNSUPPORTED,
    RESPONSE_CREATE_UNSUPPORTED,
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
    ITEM_RETRIEVE_INVALID_ITEM_ID,
    INPUT_AUDIO_BUFFER_EMPTY,
    INVALID_EVENT_ACK,
    CONFIG_TIMEOUT,
    RESOURCE_EXHAUSTED,
    RATE_LIMITED,
    SESSION_CLOSED,
    LOG_UNAVAILABLE,
    UNAUTHORIZED,
    INTERNAL_ERROR,
    UNSUPPORTED_SESSION_RESUME,
    INVALID_SESSION_RESUME,
    SESSION_RESUME_EXPIRED,
    SESSION_NOT_FOUND,
    INVALID_RESUME_TOKEN,
    SESSION_RESUME_CONFLICT,
    SESSION_NOT_HERE,
    INPUT_GAP,
)

ERROR_TYPES: Final[dict[str, ErrorType]] = {
    RESOURCE_EXHAUSTED: "rate_limit_error",
    RATE_LIMITED: "rate_limit_error",
    INTERNAL_ERROR: "server_error",
    LOG_UNAVAILABLE: "server_error",
}


def error_type(code: str) -> ErrorType:
    """The ``error.type`` a code is reported under (unknown codes: ``invalid_request_error``)."""
    return ERROR_TYPES.get(code, "invalid_request_error")


class CodedError(Exception):
    """``code`` is stable and user-visible (one of the codes above, or a model family's)."""

    code: str = INTERNAL_ERROR


def code_of(exc: BaseException, default: str) -> str:
    """The wire code of ``exc``, or ``default`` for an error that has none."""
    return exc.code if isinstance(exc, CodedError) else default
