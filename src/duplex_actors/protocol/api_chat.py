"""The moshi / PersonaPlex dialect, ``WS /api/chat`` (docs/protocol.md §9), sans-io: message kinds, the
query, and the projection of session events onto binary messages.

Every message is one binary WebSocket frame whose first byte is its kind:

=====  ===========  =========  ===================================================================
kind   name         direction  payload
=====  ===========  =========  ===================================================================
0x00   handshake    S->C       empty (moshi/PersonaPlex Python servers), or with
                               ``?handshake=rust`` u32 LE version 0 + u32 LE model 0 (9 bytes)
0x01   audio        both       Ogg/Opus, 24 kHz mono; any page split or packet size from clients
0x02   text         S->C       one UTF-8 text piece (the engine already drops ids 0 and 3 and maps
                               ``▁`` to a space: an empty piece is not sent)
0x03   control      C->S       ignored (every upstream server ignores it)
0x04   metadata     S->C       never sent
0x05   error        S->C       UTF-8 text, before a refusal or an error close
0x06   ping         either     keep-alive sent by the server after ``KEEPALIVE_S`` without a
                               message (the stock UIs close after 10 s of silence); ignored
                               from clients
=====  ===========  =========  ===================================================================

Session event -> messages (:class:`ApiChatProjection`): ``AudioFrame`` -> :class:`EncodeAudio`
(the shell Opus-encodes it and sends ``0x01``) then ``0x02`` with the frame's text piece when it
has one; ``Error`` -> ``0x05``; everything else -> nothing. The close code comes from the
session's close reason (the connection's table).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .. import error_codes
from ..session import events as ev
from .errors import ProtocolError, clip

__all__ = [
    "HANDSHAKE_FORMS",
    "KEY_PARAMS",
    "ApiChatProjection",
    "ChatQuery",
    "EncodeAudio",
    "audio_message",
    "error_message",
    "handshake",
    "parse_query",
    "split_message",
    "text_message",
]

KIND_HANDSHAKE: Final = 0x00
KIND_AUDIO: Final = 0x01
KIND_TEXT: Final = 0x02
KIND_CONTROL: Final = 0x03
KIND_METADATA: Final = 0x04
KIND_ERROR: Final = 0x05
KIND_PING: Final = 0x06

PING: Final = bytes([KIND_PING])
# Seconds without a server message after which a ping goes out (the UIs give up at 10 s).
KEEPALIVE_S: Final = 4.0

HANDSHAKE_FORMS: Final = ("python", "rust")
_RUST_VERSIONS: Final = struct.Struct("<II")

# Query parameters that carry the API key on this route (browsers cannot set headers).
KEY_PARAMS: Final = ("auth_id", "worker_auth_id")
# Stock-UI sampling parameters -> the session config's sampling keys (model.family).
_SAMPLING_PARAMS: Final[Mapping[str, tuple[str, type]]] = {
    "text_temperature": ("temperature_text", float),
    "audio_temperature": ("temperature", float),
    "text_topk": ("top_k_text", int),
    "audio_topk": ("top_k", int),
}
# One seeded sampler per slot: the first of these that is given is its seed.
_SEED_PARAMS: Final = ("audio_seed", "text_seed", "seed")
MAX_SEED: Final = 2**32 - 1


def handshake(form: str = "python") -> bytes:
    """``0x00`` (1 byte), or the Rust servers' 9-byte form (version 0, model 0)."""
    if form == "rust":
        return bytes([KIND_HANDSHAKE]) + _RUST_VERSIONS.pack(0, 0)
    return bytes([KIND_HANDSHAKE])


def audio_message(ogg: bytes) -> bytes:
    return bytes([KIND_AUDIO]) + ogg


def text_message(piece: str) -> bytes:
    return bytes([KIND_TEXT]) + piece.encode("utf-8")


def error_message(text: str) -> bytes:
    """``0x05`` + UTF-8 text (clipped: a client-supplied value may be in it)."""
    return bytes([KIND_ERROR]) + clip(text).encode("utf-8", "replace")


def split_message(data: bytes | bytearray | str | None) -> tuple[int | None, bytes]:
    """``(kind, payload)`` of a client message; kind None for an empty or text frame (the
    protocol is binary: such a frame is ignored like an unknown kind)."""
    if not isinstance(data, bytes | bytearray) or not data:
        return None, b""
    return data[0], bytes(data[1:])


@attrs.frozen(slots=True)
class ChatQuery:
    """What the query asks of the session. ``persona``/``voice`` None: the server's defaults.
    ``sampling`` holds session-config sampling keys; it is only used when the server lets
    clients choose sampling. ``key``: the API key offered as ``auth_id``/``worker_auth_id``."""

    persona: str | None = None
    voice: str | None = None
    sampling: Mapping[str, Any] = attrs.field(factory=dict)
    handshake: str = "python"
    key: str | None = attrs.field(default=None, repr=False)


def _refuse(param: str, message: str) -> ProtocolError:
    return ProtocolError(error_codes.INVALID_VALUE, f"{param}: {message}", param=param)


def _number(param: str, raw: str, kind: type) -> float | int:
    text = raw.strip()
    try:
        value: float | int = int(text, 10) if kind is int else float(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise _refuse(param, f"expected {what}, got {clip(raw, 64)!r}") from None
    if not math.isfinite(value) or value < 0:
        raise _refuse(param, f"expected a finite number >= 0, got {clip(raw, 64)!r}")
    return value


def parse_query(args: Mapping[str, str]) -> ChatQuery:
    """The query of an ``/api/chat`` upgrade. Unknown parameters (``pad_mult``,
    ``repetition_penalty*``, ``email``, ...) are ignored; a malformed value of a known one
    raises ProtocolError (``invalid_value``, naming it), which the shell sends as ``0x05`` and
    closes with 1008. Whether the voice is bundled is the model family's check, not this."""
    persona = args.get("text_prompt")
    voice = args.get("voice_prompt")
    if voice is not None:
        voice = voice.strip() or None
    form = args.get("handshake", "python").strip().lower() or "python"
    if form not in HANDSHAKE_FORMS:
        raise _refuse("handshake", f"expected one of {', '.join(HANDSHAKE_FORMS)}, got {clip(form, 64)!r}")
    sampling: dict[str, Any] = {}
    for param, (key, kind) in _SAMPLING_PARAMS.items():
        if param in args:
            sampling[key] = _number(param, args[param], kind)
    for param in _SEED_PARAMS:
        if param in args:
            seed = _number(param, args[param], int)
            if seed > MAX_SEED:
                raise _refuse(param, f"expected an integer < 2**32, got {clip(args[param], 64)!r}")
            sampling.setdefault("seed", seed)
    offered = next((args[k] for k in KEY_PARAMS if args.get(k)), None)
    return ChatQuery(persona=persona, voice=voice, sampling=sampling, handshake=form, key=offered)


def session_config(query: ChatQuery, *, prompts: bool, client_sampling: bool) -> dict[str, Any]:
    """The session config a query opens with. ``prompts``: the model takes a voice and a
    persona (PersonaPlex); a plain Moshi model ignores both, as moshi's own server does.
    ``client_sampling``: the server lets clients choose sampling, else the session is greedy
    and the query's sampling values are ignored."""
    config: dict[str, Any] = {}
    if prompts:
        if query.voice is not None:
            config["voice"] = query.voice
        if query.persona is not None:
            config["instructions"] = query.persona
    if client_sampling:
        config.update(query.sampling)
    return config


@attrs.frozen(slots=True)
class EncodeAudio:
    """An output frame (PCM16 LE, 1920 samples) for the shell to Opus-encode and send as 0x01."""

    frame_index: int
    pcm16: bytes


ApiChatMessage = bytes | EncodeAudio


class ApiChatProjection:
    """Session events in, ``/api/chat`` messages (bytes, or audio to encode) out."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.closed = False

    def project(self, event: ev.SessionEvent) -> list[ApiChatMessage]:
        if self.closed:
            return []
        match event:
            case ev.AudioFrame():
                out: list[ApiChatMessage] = [EncodeAudio(event.frame_index, event.pcm16)]
                if event.text:
                    out.append(text_message(event.text))
                return out
            case ev.Error():
                return [error_message(event.message)]
            case ev.SessionClosed():
                self.closed = True
        return []
