"""An outbound message as the text (or bytes) that goes on the WebSocket."""

from __future__ import annotations

import json

from .dialects import OutboundMessage, WireMessage

_DUMPS = json.JSONEncoder(separators=(",", ":")).encode  # built once: json.dumps builds one per call


def wire_message(message: OutboundMessage) -> WireMessage:
    """An outbound message as it goes on the wire (JSON text, or bytes as they are)."""
    if isinstance(message, bytes):
        return message
    for field in _AUDIO_FIELDS:
        audio = message.get(field)
        if (
            type(audio) is str
            and len(audio) >= _SPLICE_FROM
            and audio.isascii()
            and not audio.encode("ascii").translate(None, _BASE64_ALPHABET)
        ):
            # Base64 is its own JSON: splice it into the text of the rest rather than have the
            # encoder escape it character by character (the same bytes, a third of the time).
            head, _, tail = _DUMPS({**message, field: _SPLICED}).partition(f'"{field}":"{_SPLICED}"')
            return f'{head}"{field}":"{audio}"{tail}'
    return _DUMPS(message)


# The fields that hold an outbound event's base64 audio (Realtime's delta, the native JSON
# frame's audio); a transcript's delta is text, and is encoded as usual unless it is as plain.
_AUDIO_FIELDS = ("delta", "audio")
_SPLICE_FROM = 256
_SPLICED = "duplex-actors-spliced-audio"
_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


__all__ = ["wire_message"]
