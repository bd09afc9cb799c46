"""The wire error codes (docs/protocol.md §8) and the exception the parsers raise.

Each code maps to the OpenAI ``error.type`` it is reported under: ``rate_limit_error`` when the
server is full, ``server_error`` when the server failed, ``invalid_request_error`` for every
client mistake (including codes this module does not list, such as those of a model family).
"""

from __future__ import annotations

from typing import Final

from ..error_codes import CodedError, ErrorType, error_type

# Client-supplied text ends up in messages; a hostile client must not make error frames huge.
MAX_MESSAGE_CHARS: Final = 1024


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProtocolError(CodedError):
    """An inbound message the server refuses; the session (if any) stays usable.

    ``event_type`` and ``client_event_id`` are those of the refused event when they could be
    read, so the error can echo them; ``param`` names the offending field, when known.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        event_type: str | None = None,
        client_event_id: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = clip(message)
        self.event_type = event_type
        self.client_event_id = client_event_id
        self.param = param

    @property
    def error_type(self) -> ErrorType:
        return error_type(self.code)

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, event_type={self.event_type!r})"
