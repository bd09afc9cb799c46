"""The wire events of both dialects as frozen attrs classes (docs/protocol.md §4 and §5).

Each event is one class, used everywhere it exists: :mod:`.parsing` parses client events into
them (:mod:`.converter` tags them on ``type``); :mod:`.realtime` and :mod:`.native` build the
server events and send them as ``converter.CONVERTER.unstructure(event)``; the client
(:mod:`duplex_actors.client.events`) parses server messages back into them with the same
converter; and :mod:`.schemas` turns them into the JSON Schemas. Adding an event is adding a
class here (and to its dialect's tuple) and emitting it.

Every class has ``TYPE`` (its ``type`` on the wire); a Realtime server event that OpenAI's
beta vocabulary (``OpenAI-Beta: realtime=v1``) names differently also has ``BETA_TYPE``
(``None``: the event has no beta counterpart and beta clients do not get it; absent: the same
name in both). ``EXTRA_PROPERTIES`` marks objects that carry free-form keys besides their
fields, and ``FLATTEN`` names a dict field whose keys sit at the object's top level. Field
metadata: ``OMIT_IF_NONE`` leaves the key out of the message while the value is ``None``;
``SCHEMA`` names the class a free-form ``dict`` field is documented by (the server sends that
object as configured, see :class:`SessionObject`).

Field order is wire order: a server event's message is ``type`` first, then its fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

import attrs

DialectName = Literal["realtime", "native"]  # the JSON dialects (/api/chat is binary)
OMIT_IF_NONE: Final = "omit_if_none"
SCHEMA: Final = "schema"


# -- client events (both dialects) -----------------------------------------------------------
@attrs.frozen(slots=True)
class SessionUpdate:
    TYPE: ClassVar[str] = "session.update"
    session: dict[str, Any]
    event_id: str | None = None


@attrs.frozen(slots=True)
class InputAudioBufferAppend:
    """``audio`` is base64; ``format``/``input_audio_format``/``sample_rate_hz`` override the
    session's input format for this chunk only. ``pad_ms`` (an integer in [0, 80)): milliseconds
    of silence the server inserts before this chunk's audio (docs/protocol.md §7)."""

    TYPE: ClassVar[str] = "input_audio_buffer.append"
    audio: str
    format: str | None = None
    input_audio_format: str | None = None
    sample_rate_hz: int | None = None
    event_id: str | None = None
    # Any JSON value is taken here so that a wrong one is refused as invalid_value (the
    # contract's code), not as a malformed event; ``codec.append_pad_ms`` checks it.
    pad_ms: Any = attrs.field(default=None, metadata={SCHEMA: int | None})
    # After a resume: where this chunk starts in the client's input (its samples at its rate,
    # the unit of ``input_samples_end``); audio the session already holds is dropped.
    input_samples_start: Any = attrs.field(default=None, metadata={SCHEMA: int | None})


@attrs.frozen(slots=True)
class InputAudioBufferClear:
    TYPE: ClassVar[str] = "input_audio_buffer.clear"
    event_id: str | None = None


@attrs.frozen(slots=True)
class InputAudioBufferCommit:
    """Meaningless for a lockstep model: refused with ``commit_unsupported``."""

    TYPE: ClassVar[str] = "input_audio_buffer.commit"
    event_id: str | None = None


@attrs.frozen(slots=True)
class ResponseCreate:
    """Meaningless for a lockstep model: refused with ``response_create_unsupported``."""

    TYPE: ClassVar[str] = "response.create"
    response: dict[str, Any] | None = None
    event_id: str | None = None


@attrs.frozen(slots=True)
class ResponseCancel:
    """Cancels the active response; ``response_id`` is accepted and not checked (one response
    at a time)."""

    TYPE: ClassVar[str] = "response.cancel"
    response_id: str | None = None
    event_id: str | None = None


@attrs.frozen(slots=True)
class OutputAudioBufferClear:
    TYPE: ClassVar[str] = "output_audio_buffer.clear"
    event_id: str | None = None


@attrs.frozen(slots=True)
class SessionClose:
    TYPE: ClassVar[str] = "session.close"
    event_id: str | None = None


@attrs.frozen(slots=True)
class SessionHeartbeat:
    TYPE: ClassVar[str] = "session.heartbeat"
    event_id: str | None = None


@attrs.frozen(slots=True)
class PlaybackAck:
    """Any keys besides ``type`` and ``event_id`` are the payload, echoed in
    ``playback.acknowledged``."""

    TYPE: ClassVar[str] = "playback.ack"
    FLATTEN: ClassVar[str] = "payload"
    payload: dict[str, Any] = attrs.field(factory=dict)
    event_id: str | None = None


@attrs.frozen(slots=True)
class SessionEventAck:
    """vLLM-Omni's clients acknowledge every sequenced server event (docs/protocol.md §8). Nothing is
    resumable here, so an ack changes nothing and is not logged; ``server_event_seq`` must be a
    non-negative integer (else ``invalid_event_ack``)."""

    TYPE: ClassVar[str] = "session.event_ack"
    server_event_seq: int
    event_id: str | None = None


@attrs.frozen(slots=True)
class SessionCreate:
    """Native only, and only as the first message: the config under ``session`` or at the
    top level; ``binary_output`` (either place) asks for output audio as binary messages."""

    TYPE: ClassVar[str] = "session.create"
    EXTRA_PROPERTIES: ClassVar[bool] = True
    session: dict[str, Any] = attrs.field(factory=dict)
    binary_output: bool = False
    event_id: str | None = None
    resume: bool = False  # a resumable session (docs/protocol.md §10)


@attrs.frozen(slots=True)
class SessionResume:
    """The first message of a connection that takes a resumable session over (both JSON
    dialects, docs/protocol.md §10): the session, its current token, and the last
    ``server_event_seq`` the client received (0: none). ``accept_gap``: resume from the oldest
    message kept when the cursor was evicted."""

    TYPE: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str
    last_received_server_event_seq: int = 0
    accept_gap: bool = False
    event_id: str | None = None


@attrs.frozen(slots=True)
class ConversationItemTruncate:
    """The client played ``audio_end_ms`` of an assistant item's audio (Realtime only): recorded
    in the session log and answered with ``conversation.item.truncated``; the model's context
    is not changed (it heard its own output as it was produced)."""

    TYPE: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    content_index: int
    audio_end_ms: int
    event_id: str | None = None


@attrs.frozen(slots=True)
class ConversationItemCreate:
    """A conversation item (Realtime only). A text ``message`` (``role`` user, system,
    developer or assistant; ``content`` parts of type ``input_text``, ``output_text`` or
    ``text``) is taken; any other item is refused (``invalid_value``). ``previous_item_id`` is
    accepted and not used: items go at the end of the conversation."""

    TYPE: ClassVar[str] = "conversation.item.create"
    item: dict[str, Any]
    previous_item_id: str | None = None
    event_id: str | None = None


@attrs.frozen(slots=True)
class ConversationItemRetrieve:
    """Ask for an item as the server holds it (Realtime only): ``conversation.item.retrieved``,
    or ``item_retrieve_invalid_item_id`` for an item the session does not know."""

    TYPE: ClassVar[str] = "conversation.item.retrieve"
    item_id: str
    event_id: str | None = None


_COMMON_CLIENT_EVENTS = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferClear
    | InputAudioBufferCommit
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear
    | SessionClose
    | SessionHeartbeat
    | PlaybackAck
    | SessionEventAck
    | SessionResume
)
RealtimeClientEvent = (
    _COMMON_CLIENT_EVENTS | ConversationItemTruncate | ConversationItemCreate | ConversationItemRetrieve
)
NativeClientEvent = _COMMON_CLIENT_EVENTS | SessionCreate
ClientEvent = RealtimeClientEvent | SessionCreate

_COMMON_CLIENT_CLASSES: tuple[type[Any], ...] = (
    SessionUpdate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ResponseCreate,
    ResponseCancel,
    OutputAudioBufferClear,
    SessionClose,
    SessionHeartbeat,
    PlaybackAck,
    SessionEventAck,
    SessionResume,
)
REALTIME_CLIENT_EVENTS: tuple[type[Any], ...] = (
    *_COMMON_CLIENT_CLASSES,
    ConversationItemTruncate,
    ConversationItemCreate,
    ConversationItemRetrieve,
)
NATIVE_CLIENT_EVENTS: tuple[type[Any], ...] = (*_COMMON_CLIENT_CLASSES, SessionCreate)
CLIENT_EVENTS: tuple[type[Any], ...] = (*REALTIME_CLIENT_EVENTS, SessionCreate)


# -- Realtime server events: nested objects ---------------------------------------------------
@attrs.frozen(slots=True)
class Capabilities:
    EXTRA_PROPERTIES: ClassVar[bool] = True
    implementation_level: str
    chunk_period_ms: int
    supports_client_commit: bool
    supports_external_turn_signal: bool
    supports_barge_in: bool
    supports_session_resume: bool
    supports_audio_truncate: bool
    supports_playback_ack: bool
    supports_input_append: bool
    supports_multi_session: bool
    supports_multi_session_same_replica: bool
    input_modes: list[str]


@attrs.frozen(slots=True)
class SessionObject:
    """Server-owned keys; every other key is the effective session config, echoed."""

    EXTRA_PROPERTIES: ClassVar[bool] = True
    FLATTEN: ClassVar[str] = "config"
    id: str
    object: Literal["realtime.session"]
    model: str
    # The server's capabilities object as configured (web.connection.capabilities).
    capabilities: dict[str, Any] = attrs.field(metadata={SCHEMA: Capabilities})
    config: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(slots=True)
class ItemContent:
    type: Literal["output_audio", "audio"]
    transcript: str


@attrs.frozen(slots=True)
class TextContent:
    """A text part of a message item: ``input_text`` (user, system) or ``output_text`` (assistant)."""

    type: Literal["input_text", "output_text"]
    text: str


@attrs.frozen(slots=True)
class Item:
    """A message of the conversation: the assistant's audio (its responses), or a text message
    a client added (``conversation.item.create``)."""

    id: str
    object: Literal["realtime.item"]
    type: Literal["message"]
    role: Literal["assistant", "user", "system"]
    status: Literal["in_progress", "incomplete", "completed"]
    content: list[ItemContent | TextContent]


@attrs.frozen(slots=True)
class StatusDetails:
    """``reason``: on ``/v1/realtime`` one of OpenAI's (``client_cancelled``, or null for a
    response ended by the session's close); with ``?duplex=1`` the session's own
    (``client_cancelled``, ``output_audio_buffer_clear``, ``session_closed``)."""

    type: Literal["cancelled"]
    reason: str | None


@attrs.frozen(slots=True)
class Response:
    """GA sends ``output_modalities``, beta ``modalities``."""

    id: str
    object: Literal["realtime.response"]
    status: Literal["in_progress", "cancelled"]
    status_details: StatusDetails | None
    output: list[Item]
    output_modalities: list[str] | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    modalities: list[str] | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class ContentPart:
    type: Literal["audio"]
    transcript: str


@attrs.frozen(slots=True)
class VllmOmniRuntime:
    """What vLLM-Omni's drivers check to prove batched serving (docs/protocol.md §8); true by construction
    here: one scheduler steps every session in one batched KV."""

    runtime_impl: Literal["scheduler_data_plane"]
    uses_model_runner_scheduler: Literal[True]
    runner_kv_backed: Literal[True]


_DUPLEX_ONLY: Final = {OMIT_IF_NONE: True}  # sent on ``?duplex=1`` connections only (docs/protocol.md §8)


@attrs.frozen(slots=True)
class AudioMetadata:
    epoch: int
    frame_index: int
    audio_duration_ms: int
    session_id: str | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)
    model_speak: Literal[True] | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)
    end_of_turn: Literal[False] | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)
    vllm_omni: VllmOmniRuntime | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)
    # Where the delta's last input frame ended in the client's own stream (samples at the
    # client's rate, pads excluded); absent in sessions logged before format version 4.
    input_samples_end: int | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class SpeakMetadata:
    session_id: str
    epoch: int
    model_speak: Literal[True]


@attrs.frozen(slots=True)
class ErrorDetail:
    type: Literal["invalid_request_error", "rate_limit_error", "server_error"]
    code: str
    message: str
    param: str | None
    event_id: str | None


# -- Realtime server events --------------------------------------------------------------------
@attrs.frozen(slots=True)
class RealtimeSessionCreated:
    TYPE: ClassVar[str] = "session.created"
    event_id: str
    session: SessionObject
    # A resumable session's first message only (docs/protocol.md §10): its token, never journaled.
    resume_token: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    attachment_generation: int | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    resume_grace_s: float | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class RealtimeSessionUpdated:
    TYPE: ClassVar[str] = "session.updated"
    event_id: str
    session: SessionObject
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeResponseCreated:
    TYPE: ClassVar[str] = "response.created"
    event_id: str
    response: Response
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputItemAdded:
    TYPE: ClassVar[str] = "response.output_item.added"
    event_id: str
    response_id: str
    output_index: int
    item: Item
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeConversationItemAdded:
    TYPE: ClassVar[str] = "conversation.item.added"
    BETA_TYPE: ClassVar[str | None] = "conversation.item.created"
    event_id: str
    previous_item_id: str | None
    item: Item
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeContentPartAdded:
    TYPE: ClassVar[str] = "response.content_part.added"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeResponseSpeak:
    """vLLM-Omni's speak decision (docs/protocol.md §8): once per response, before its first audio delta,
    on ``?duplex=1`` connections only."""

    TYPE: ClassVar[str] = "response.speak"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    metadata: SpeakMetadata
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputAudioDelta:
    """``delta``: base64 mono audio in the session's output format, whole 80 ms frames:
    ``pcm16`` (LE) at 24000 Hz, or ``g711_ulaw``/``g711_alaw`` at 8000 Hz; ``format`` is sent
    for G.711 only (absent: pcm16), so a pcm16 delta has only the stock Realtime fields."""

    TYPE: ClassVar[str] = "response.output_audio.delta"
    BETA_TYPE: ClassVar[str | None] = "response.audio.delta"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str
    sample_rate_hz: int
    metadata: AudioMetadata
    format: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputAudioTranscriptDelta:
    TYPE: ClassVar[str] = "response.output_audio_transcript.delta"
    BETA_TYPE: ClassVar[str | None] = "response.audio_transcript.delta"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputAudioBufferCleared:
    TYPE: ClassVar[str] = "output_audio_buffer.cleared"
    event_id: str
    response_id: str | None
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputAudioDone:
    TYPE: ClassVar[str] = "response.output_audio.done"
    BETA_TYPE: ClassVar[str | None] = "response.audio.done"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputAudioTranscriptDone:
    TYPE: ClassVar[str] = "response.output_audio_transcript.done"
    BETA_TYPE: ClassVar[str | None] = "response.audio_transcript.done"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeContentPartDone:
    TYPE: ClassVar[str] = "response.content_part.done"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeOutputItemDone:
    TYPE: ClassVar[str] = "response.output_item.done"
    event_id: str
    response_id: str
    output_index: int
    item: Item
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeConversationItemDone:
    """GA only: the beta vocabulary has no counterpart."""

    TYPE: ClassVar[str] = "conversation.item.done"
    BETA_TYPE: ClassVar[str | None] = None
    event_id: str
    previous_item_id: str | None
    item: Item
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeConversationItemTruncated:
    """The answer to ``conversation.item.truncate``."""

    TYPE: ClassVar[str] = "conversation.item.truncated"
    event_id: str
    item_id: str
    content_index: int
    audio_end_ms: int
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeConversationItemRetrieved:
    """The answer to ``conversation.item.retrieve``."""

    TYPE: ClassVar[str] = "conversation.item.retrieved"
    event_id: str
    item: Item
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeResponseDone:
    TYPE: ClassVar[str] = "response.done"
    event_id: str
    response: Response
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeRateLimitsUpdated:
    TYPE: ClassVar[str] = "rate_limits.updated"
    event_id: str
    rate_limits: list[dict[str, Any]]
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeSpeechStarted:
    TYPE: ClassVar[str] = "input_audio_buffer.speech_started"
    event_id: str
    audio_start_ms: int
    item_id: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeInputAudioBufferCleared:
    TYPE: ClassVar[str] = "input_audio_buffer.cleared"
    event_id: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeHeartbeatAck:
    TYPE: ClassVar[str] = "session.heartbeat_ack"
    event_id: str
    client_event_id: str | None
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimePlaybackAcknowledged:
    TYPE: ClassVar[str] = "playback.acknowledged"
    event_id: str
    client_event_id: str | None
    payload: dict[str, Any]
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeInputAudioBufferAlignment:
    """Send the next chunk ``pad_ms`` early, holding only (80 - ``pad_ms``) ms of new audio and
    ``pad_ms`` on its append (docs/protocol.md §7). Sent only to sessions whose
    ``duplex.alignment`` is ``client``; ``reason``: start, clear, drift or margin."""

    TYPE: ClassVar[str] = "input_audio_buffer.alignment"
    event_id: str
    pad_ms: int
    reason: Literal["start", "clear", "drift", "margin"]
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeError:
    TYPE: ClassVar[str] = "error"
    event_id: str
    error: ErrorDetail
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeSessionClosing:
    TYPE: ClassVar[str] = "session.closing"
    event_id: str
    session_id: str
    reason: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class RealtimeSessionClosed:
    TYPE: ClassVar[str] = "session.closed"
    event_id: str
    session_id: str
    reason: str
    server_event_seq: int | None = attrs.field(default=None, metadata=_DUPLEX_ONLY)


@attrs.frozen(slots=True)
class SessionResumed:
    """The answer to ``session.resume`` (both dialects; no ``server_event_seq``): the new
    attachment, the next token, the messages replayed next (``replay_from_server_event_seq`` to
    ``last_server_event_seq``), and the client input the session holds, from which the client
    re-sends."""

    TYPE: ClassVar[str] = "session.resumed"
    session_id: str
    attachment_generation: int
    resume_token: str
    last_server_event_seq: int
    replay_from_server_event_seq: int
    input_samples_received: int
    last_client_event_id: str | None
    resume_grace_s: float
    event_id: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class SessionReplaced:
    """To a connection whose session another connection took over (then close 1000)."""

    TYPE: ClassVar[str] = "session.replaced"
    session_id: str
    attachment_generation: int
    event_id: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class SessionResyncRequired:
    """The client's cursor is older than the oldest message kept: resume again with
    ``accept_gap`` (from ``oldest_server_event_seq``) or open a new session."""

    TYPE: ClassVar[str] = "session.resync_required"
    session_id: str
    reason: str
    oldest_server_event_seq: int
    event_id: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


RESUME_SERVER_EVENTS: tuple[type[Any], ...] = (SessionResumed, SessionReplaced, SessionResyncRequired)

REALTIME_SERVER_EVENTS: tuple[type[Any], ...] = (
    RealtimeSessionCreated,
    RealtimeSessionUpdated,
    RealtimeResponseCreated,
    RealtimeOutputItemAdded,
    RealtimeConversationItemAdded,
    RealtimeContentPartAdded,
    RealtimeResponseSpeak,
    RealtimeOutputAudioDelta,
    RealtimeOutputAudioTranscriptDelta,
    RealtimeOutputAudioBufferCleared,
    RealtimeOutputAudioDone,
    RealtimeOutputAudioTranscriptDone,
    RealtimeContentPartDone,
    RealtimeOutputItemDone,
    RealtimeConversationItemDone,
    RealtimeConversationItemTruncated,
    RealtimeConversationItemRetrieved,
    RealtimeResponseDone,
    RealtimeRateLimitsUpdated,
    RealtimeSpeechStarted,
    RealtimeInputAudioBufferCleared,
    RealtimeHeartbeatAck,
    RealtimePlaybackAcknowledged,
    RealtimeInputAudioBufferAlignment,
    RealtimeError,
    RealtimeSessionClosing,
    RealtimeSessionClosed,
    *RESUME_SERVER_EVENTS,
)


def wire_type(cls: type[Any], *, beta: bool) -> str | None:
    """The ``type`` a Realtime server event class has on the wire (``None``: not sent)."""
    if not beta:
        return str(cls.TYPE)
    name: str | None = getattr(cls, "BETA_TYPE", cls.TYPE)
    return name


# -- native server events (flat) ---------------------------------------------------------------
@attrs.frozen(slots=True)
class NativeSessionCreated:
    TYPE: ClassVar[str] = "session.created"
    session_id: str
    session: dict[str, Any]
    # A resumable session's first message only (docs/protocol.md §10): its token, never journaled.
    resume_token: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    attachment_generation: int | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    resume_grace_s: float | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class NativeSessionUpdated:
    TYPE: ClassVar[str] = "session.updated"
    session_id: str
    session: dict[str, Any]


@attrs.frozen(slots=True)
class NativeResponseCreated:
    TYPE: ClassVar[str] = "response.created"
    response_id: str
    epoch: int


@attrs.frozen(slots=True)
class NativeOutputAudioDelta:
    """``audio``: base64 PCM16 LE mono 24 kHz; ``text``: the text of that frame."""

    TYPE: ClassVar[str] = "response.output_audio.delta"
    response_id: str
    epoch: int
    frame_index: int
    audio: str
    text: str
    # As the Realtime delta's ``metadata.input_samples_end``; absent before log format 4.
    input_samples_end: int | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen(slots=True)
class NativeOutputTranscriptDelta:
    """With ``binary_output`` the audio goes out as a binary message and a frame's text,
    when there is any, as this event right after it."""

    TYPE: ClassVar[str] = "response.output_audio_transcript.delta"
    response_id: str
    epoch: int
    frame_index: int
    text: str


@attrs.frozen(slots=True)
class NativeResponseDone:
    TYPE: ClassVar[str] = "response.done"
    response_id: str
    epoch: int
    status: Literal["cancelled"]
    reason: str
    transcript: str
    frames: int


@attrs.frozen(slots=True)
class NativeSpeechStarted:
    TYPE: ClassVar[str] = "input_audio_buffer.speech_started"
    epoch: int
    frame_index: int
    item_id: str


@attrs.frozen(slots=True)
class NativeInputCleared:
    TYPE: ClassVar[str] = "input_audio_buffer.cleared"
    client_event_id: str | None


@attrs.frozen(slots=True)
class NativeOutputCleared:
    TYPE: ClassVar[str] = "output_audio_buffer.cleared"
    response_id: str | None
    client_event_id: str | None


@attrs.frozen(slots=True)
class NativeHeartbeatAck:
    TYPE: ClassVar[str] = "session.heartbeat_ack"
    client_event_id: str | None


@attrs.frozen(slots=True)
class NativePlaybackAcknowledged:
    TYPE: ClassVar[str] = "playback.acknowledged"
    client_event_id: str | None
    payload: dict[str, Any]


@attrs.frozen(slots=True)
class NativeInputAudioBufferAlignment:
    """As the Realtime ``input_audio_buffer.alignment`` (sessions with ``duplex.alignment``
    ``client`` only)."""

    TYPE: ClassVar[str] = "input_audio_buffer.alignment"
    pad_ms: int
    reason: Literal["start", "clear", "drift", "margin"]


@attrs.frozen(slots=True)
class NativeError:
    TYPE: ClassVar[str] = "error"
    error: str
    code: str
    client_event_id: str | None
    param: str | None


@attrs.frozen(slots=True)
class NativeSessionClosing:
    TYPE: ClassVar[str] = "session.closing"
    session_id: str
    reason: str


@attrs.frozen(slots=True)
class NativeSessionClosed:
    TYPE: ClassVar[str] = "session.closed"
    session_id: str
    reason: str


NATIVE_SERVER_EVENTS: tuple[type[Any], ...] = (
    NativeSessionCreated,
    NativeSessionUpdated,
    NativeResponseCreated,
    NativeOutputAudioDelta,
    NativeOutputTranscriptDelta,
    NativeResponseDone,
    NativeSpeechStarted,
    NativeInputCleared,
    NativeOutputCleared,
    NativeHeartbeatAck,
    NativePlaybackAcknowledged,
    NativeInputAudioBufferAlignment,
    NativeError,
    NativeSessionClosing,
    NativeSessionClosed,
    *RESUME_SERVER_EVENTS,
)
