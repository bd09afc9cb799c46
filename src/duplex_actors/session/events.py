"""Dialect-neutral outbound session events: what the session core emits, in order.

The wire layer projects these onto the OpenAI Realtime dialect (a ``ResponseStarted`` becomes
``response.created``, ``response.output_item.added``, ... ) or the native one. Ids derive from
the session id and sequence numbers only, so a replay reproduces them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

# A response's transcript (``ResponseEnded.transcript``) keeps at most this many characters; the
# text pieces of the frames are not cut.
MAX_TRANSCRIPT_CHARS: Final = 64 * 1024


@attrs.frozen(slots=True)
class SessionCreated:
    session_id: str
    config: dict[str, Any]


@attrs.frozen(slots=True)
class SessionUpdated:
    session_id: str
    config: dict[str, Any]
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class ResponseStarted:
    response_id: str
    item_id: str
    epoch: int


# Field metadata: a field left out of the canonical bytes (and dumps) while it is None, so that
# adding it left the digests of older logs unchanged.
OMIT_IF_NONE: Final = "omit_if_none"


@attrs.frozen(slots=True)
class AudioFrame:
    """One 80 ms output frame (PCM16 LE mono 24 kHz) answering input frame ``frame_index``.
    ``input_samples_end``: where that input frame ended in the client's own stream (samples at
    the client's rate, pads excluded); None in sessions logged before format version 4."""

    response_id: str
    item_id: str
    epoch: int
    frame_index: int
    pcm16: bytes
    text: str
    input_samples_end: int | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class SpeechStarted:
    epoch: int
    frame_index: int
    item_id: str


@attrs.frozen(slots=True)
class InputCleared:
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class OutputCleared:
    """``output_audio_buffer.clear`` while no response was active: nothing else happens."""

    client_event_id: str | None = None


@attrs.frozen(slots=True)
class ResponseEnded:
    """The terminal group of a response. ``reason``: client_cancelled,
    output_audio_buffer_clear or session_closed; ``audio_cleared`` puts
    ``output_audio_buffer.cleared`` first."""

    response_id: str
    item_id: str
    epoch: int
    reason: str
    transcript: str
    frames: int
    audio_cleared: bool


@attrs.frozen(slots=True)
class HeartbeatAck:
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class PlaybackAcknowledged:
    payload: dict[str, Any]
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class Error:
    code: str
    message: str
    client_event_id: str | None = None
    param: str | None = None


@attrs.frozen(slots=True)
class AlignmentHint:
    """Send the next chunk ``pad_ms`` early with ``pad_ms`` on it (docs/protocol.md §7); projected
    only for sessions whose ``duplex.alignment`` is ``client``."""

    pad_ms: int
    reason: str


@attrs.frozen(slots=True)
class ItemTruncated:
    """The client's ``conversation.item.truncate``, acknowledged (the model's context is kept)."""

    item_id: str
    content_index: int
    audio_end_ms: int
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class TextItemAdded:
    """A text message added to the conversation (``conversation.item.create``). ``prompted``:
    a system or developer text folded into the model's persona (it arrived before the first
    input frame); otherwise the item is kept in the conversation and the model does not read it."""

    item_id: str
    role: str
    text: str
    prompted: bool
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class ItemRetrieved:
    """An item as the server holds it (``conversation.item.retrieve``): an assistant response's
    (``audio``: its transcript so far; ``done``: the response ended) or a text message."""

    item_id: str
    role: str
    text: str
    audio: bool
    done: bool
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class SessionClosed:
    session_id: str
    reason: str


SessionEvent = (
    SessionCreated
    | SessionUpdated
    | ResponseStarted
    | AudioFrame
    | SpeechStarted
    | InputCleared
    | OutputCleared
    | ResponseEnded
    | HeartbeatAck
    | PlaybackAcknowledged
    | Error
    | SessionClosed
    | AlignmentHint
    | ItemTruncated
    | TextItemAdded
    | ItemRetrieved
)


def alignment_mode(config: Mapping[str, Any]) -> str:
    """A session config's ``duplex.alignment`` (``server`` when absent), which decides whether
    the projections send ``AlignmentHint`` (here so that the wire layer reads it as the core does)."""
    duplex = config.get("duplex")
    mode = duplex.get("alignment") if isinstance(duplex, Mapping) else None
    return mode if isinstance(mode, str) else "server"


def event_name(event: SessionEvent) -> str:
    return type(event).__name__


def event_to_jsonable(event: SessionEvent) -> dict[str, Any]:
    """A JSON-safe dict (audio summarised by length and SHA-256) for dumps and digests."""
    out: dict[str, Any] = {"event": event_name(event)}
    for a in attrs.fields(type(event)):
        value = getattr(event, a.name)
        if value is None and a.metadata.get(OMIT_IF_NONE):
            continue
        if isinstance(value, bytes):
            out[a.name] = {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}
        else:
            out[a.name] = value
    return out


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def _audio_frame_head(event: AudioFrame) -> str | None:
    """An output frame's canonical JSON as :data:`_CANONICAL_JSON` writes it, or None where its
    values are not the plain types this template writes (then the encoder does, and decides)."""
    end = event.input_samples_end
    if (
        type(event.epoch) is not int
        or type(event.frame_index) is not int
        or type(event.response_id) is not str
        or type(event.item_id) is not str
        or type(event.text) is not str
        or type(event.pcm16) is not bytes
        or (end is not None and type(end) is not int)
    ):
        return None
    samples_end = "" if end is None else f'"input_samples_end":{end},'
    return (
        f'{{"epoch":{event.epoch},"event":"AudioFrame","frame_index":{event.frame_index},{samples_end}'
        f'"item_id":{_json_string(event.item_id)},"pcm16":{len(event.pcm16)},'
        f'"response_id":{_json_string(event.response_id)},"text":{_json_string(event.text)}}}'
    )


# Every output frame's digest skips the generic encoder's dict and key sort: a template of the
# same bytes (tests/session/test_events.py compares them).
_json_string = json.encoder.encode_basestring_ascii


def canonical_bytes(event: SessionEvent) -> bytes:
    """Canonical bytes of an event for the outbound-stream digest (audio included raw)."""
    if type(event) is AudioFrame and (head := _audio_frame_head(event)) is not None:
        return head.encode() + b"\0" + event.pcm16
    return generic_canonical_bytes(event)


def generic_canonical_bytes(event: SessionEvent) -> bytes:
    """:func:`canonical_bytes` without the template: every event through the JSON encoder."""
    fields: dict[str, Any] = {"event": event_name(event)}
    blobs = []
    for a in attrs.fields(type(event)):
        value = getattr(event, a.name)
        if value is None and a.metadata.get(OMIT_IF_NONE):
            continue
        if isinstance(value, bytes):
            blobs.append(value)
            fields[a.name] = len(value)
        else:
            fields[a.name] = value
    head = _CANONICAL_JSON(fields).encode()
    return head + b"\0" + b"".join(blobs)
