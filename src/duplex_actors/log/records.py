"""Session log records (docs/design.md §5) and their payload encoding.

A record's payload is a JSON object (UTF-8, sorted keys, no NaN) followed by at most one raw
binary blob (audio: input samples as received, or the output frame as PCM16), never base64:
``u32 json_length | json | blob``. Framing (length, CRC32C, sequence number, kind) is
:mod:`duplex_actors.log.segment`'s job.
"""

from __future__ import annotations

import json
import struct
from typing import Any, ClassVar, Final

import attrs

# 2: ``append`` records carry ``sample_rate_hz`` and any input format (G.711 too); a version 1
# log has neither, and its appends read as 24 kHz pcm16.
# 3: ``rejected`` records may carry ``audio_bytes``: an append refused with
# ``input_backpressure`` is logged as that small record, without its audio (docs/design.md, decision 11).
# Older logs hold such refused appends as ``append`` records; the core refuses them again on
# replay, with the same error.
# 4: alignment (docs/protocol.md §7): ``pad``, ``align_hint`` and ``drain`` records; the core fills
# ``input_samples_end`` on output frames only for logs of this version or later, so the event
# digests of older logs do not move.
# 5: ``cancel`` and ``clear_output`` carry ``reset`` (False: the response ends and the model keeps
# its context; older records read as True, as they were applied); ``truncate``, ``text_item``
# and ``retrieve_item`` records; an opening config with a refused field opens with the rest of
# it (older logs opened with the defaults, and still replay so).
# 6: the fields one update or opening config refuses get one error naming them all (older logs
# got one error per field, and still replay so).
# 7: ``detach`` and ``resume`` records (docs/protocol.md §10): a resumable session's connection
# dropped and came back; neither changes what the session emits.
FORMAT_VERSION: Final = 7
_JSON_LEN = struct.Struct("<I")


@attrs.frozen(slots=True)
class Header:
    KIND: ClassVar[int] = 1
    format_version: int
    session_id: str
    model_id: str
    checkpoint_sha256: str
    dtype: str
    engine: dict[str, Any]
    sampling: dict[str, Any]
    dialect: str
    output: dict[str, Any]
    package_version: str
    created_at: float


@attrs.frozen(slots=True)
class Open:
    KIND: ClassVar[int] = 2
    config: dict[str, Any]
    client_event_id: str | None = None  # the message that opened the session, if any


@attrs.frozen(slots=True)
class Update:
    KIND: ClassVar[int] = 3
    config: dict[str, Any]
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class Append:
    """Input audio exactly as received: ``format`` is a canonical format name of
    :data:`duplex_actors.audio.FORMATS` (mono) at ``sample_rate_hz`` (absent before version 2)."""

    KIND: ClassVar[int] = 4
    BLOB: ClassVar[str] = "audio"
    audio: bytes
    format: str = "pcm16"
    client_event_id: str | None = None
    sample_rate_hz: int = 24_000


@attrs.frozen(slots=True)
class ClearInput:
    KIND: ClassVar[int] = 5
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class ClearOutput:
    """``reset``: an active response's end also resets the model's context (a new epoch);
    False: the response ends and the model keeps its context."""

    KIND: ClassVar[int] = 6
    client_event_id: str | None = None
    reset: bool = True


@attrs.frozen(slots=True)
class Cancel:
    """``reset`` as for :class:`ClearOutput`."""

    KIND: ClassVar[int] = 7
    client_event_id: str | None = None
    reset: bool = True


@attrs.frozen(slots=True)
class Heartbeat:
    KIND: ClassVar[int] = 8
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class PlaybackAck:
    KIND: ClassVar[int] = 9
    payload: dict[str, Any] = attrs.field(factory=dict)
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class Close:
    """``reason``: client_close, timeout, server_shutdown, disconnect, error, log_unavailable."""

    KIND: ClassVar[int] = 10
    reason: str


@attrs.frozen(slots=True)
class Step:
    """One model step result for this session, as the scheduler routed it."""

    KIND: ClassVar[int] = 11
    BLOB: ClassVar[str] = "pcm16"
    epoch: int
    frame_index: int
    ready: bool
    text_token: int
    text_piece: str
    agent_codes: tuple[int, ...]
    user_codes: tuple[int, ...]
    pcm16: bytes


@attrs.frozen(slots=True)
class Rejected:
    """An inbound event that failed validation, with the error the client was sent.
    ``audio_bytes``: for a refused append, the size of the audio it carried (never logged)."""

    KIND: ClassVar[int] = 12
    event_type: str
    code: str
    message: str
    client_event_id: str | None = None
    audio_bytes: int | None = None


@attrs.frozen(slots=True)
class End:
    """Final digests of the outbound (dialect-neutral) event stream and of the output audio."""

    KIND: ClassVar[int] = 13
    events_sha256: str
    audio_sha256: str
    events: int
    frames_out: int


@attrs.frozen(slots=True)
class Pad:
    """``samples`` zeros (24 kHz, the model's domain) inserted into the input at the current
    position, after any partial tail; written before the append it precedes. ``reason``: start,
    clear, drift, margin (the server's aligner) or client (the append's ``pad_ms``)."""

    KIND: ClassVar[int] = 14
    samples: int
    reason: str


@attrs.frozen(slots=True)
class AlignHint:
    """The server asks an opted-in client to send its next chunk ``pad_ms`` early
    (``input_audio_buffer.alignment``); ``reason``: start, clear, drift or margin."""

    KIND: ClassVar[int] = 15
    pad_ms: int
    reason: str


@attrs.frozen(slots=True)
class Drain:
    """Frame ``frame_index`` was taken off the scheduler's queue before being stepped (a jitter
    backlog): it is done without output."""

    KIND: ClassVar[int] = 16
    frame_index: int
    reason: str = "drained"


@attrs.frozen(slots=True)
class Truncate:
    """``conversation.item.truncate``: the client says it played ``audio_end_ms`` of the item's
    audio (content part ``content_index``). Recorded and acknowledged; the model's context is
    not changed (it heard its own output as it was produced)."""

    KIND: ClassVar[int] = 17
    item_id: str
    content_index: int
    audio_end_ms: int
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class TextItem:
    """``conversation.item.create`` of a text message: ``role`` (user, system, developer or
    assistant) and its text; ``item_id`` as the client named it (None: the server names it)."""

    KIND: ClassVar[int] = 18
    role: str
    text: str
    item_id: str | None = None
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class RetrieveItem:
    """``conversation.item.retrieve``: the client asks for an item as the server holds it."""

    KIND: ClassVar[int] = 19
    item_id: str
    client_event_id: str | None = None


@attrs.frozen(slots=True)
class Detach:
    """The connection of attachment ``attachment`` ended without closing the session (a
    resumable session): ``reason`` is ``dropped``, ``read_timeout`` or ``replaced``. Nothing
    is emitted; the session waits for a resume within its grace."""

    KIND: ClassVar[int] = 20
    attachment: int
    reason: str


@attrs.frozen(slots=True)
class Resume:
    """Attachment ``attachment`` took the session over: the client had seen output up to
    ``cursor`` and gets ``replay_from`` to ``last_server_event_seq`` again; the session held
    ``input_samples_received`` of its input (the client's samples, pads excluded). Nothing is
    emitted: a resumed session's events and audio equal an uninterrupted run's."""

    KIND: ClassVar[int] = 21
    attachment: int
    cursor: int
    replay_from: int
    last_server_event_seq: int
    input_samples_received: int
    last_client_event_id: str | None = None
    outcome: str = "resumed"


Record = (
    Header
    | Open
    | Update
    | Append
    | ClearInput
    | ClearOutput
    | Cancel
    | Heartbeat
    | PlaybackAck
    | Close
    | Step
    | Rejected
    | End
    | Pad
    | AlignHint
    | Drain
    | Truncate
    | TextItem
    | RetrieveItem
    | Detach
    | Resume
)
RECORD_TYPES: Final[tuple[type[Any], ...]] = (
    Header,
    Open,
    Update,
    Append,
    ClearInput,
    ClearOutput,
    Cancel,
    Heartbeat,
    PlaybackAck,
    Close,
    Step,
    Rejected,
    End,
    Pad,
    AlignHint,
    Drain,
    Truncate,
    TextItem,
    RetrieveItem,
    Detach,
    Resume,
)
BY_KIND: Final[dict[int, type[Any]]] = {cls.KIND: cls for cls in RECORD_TYPES}
KIND_NAMES: Final[dict[type[Any], str]] = {
    Header: "header",
    Open: "open",
    Update: "update",
    Append: "append",
    ClearInput: "clear_input",
    ClearOutput: "clear_output",
    Cancel: "cancel",
    Heartbeat: "heartbeat",
    PlaybackAck: "playback_ack",
    Close: "close",
    Step: "step",
    Rejected: "rejected",
    End: "end",
    Pad: "pad",
    AlignHint: "align_hint",
    Drain: "drain",
    Truncate: "truncate",
    TextItem: "text_item",
    RetrieveItem: "retrieve_item",
    Detach: "detach",
    Resume: "resume",
}


class PayloadError(ValueError):
    """A payload that does not decode to its record kind."""


_PAYLOAD_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False).encode
_FIELD_NAMES: dict[type, tuple[tuple[str, ...], str | None]] = {}


def _field_names(cls: type) -> tuple[tuple[str, ...], str | None]:
    """A record class's JSON fields and its blob field (looked up once per class)."""
    found = _FIELD_NAMES.get(cls)
    if found is None:
        blob_field: str | None = getattr(cls, "BLOB", None)
        names = tuple(a.name for a in attrs.fields(cls) if a.name != blob_field)
        found = _FIELD_NAMES[cls] = (names, blob_field)
    return found


_INT_ONLY: Final = frozenset({int})  # the types of a step's codes that the template writes


def _plain_step(record: Step) -> bool:
    """Whether a step's values are the plain types :func:`_step_json` writes."""
    agent, user = record.agent_codes, record.user_codes
    return (
        type(record.epoch) is int
        and type(record.frame_index) is int
        and type(record.text_token) is int
        and type(record.ready) is bool
        and type(record.text_piece) is str
        and type(agent) is tuple
        and type(user) is tuple
        and {*map(type, agent), *map(type, user)} <= _INT_ONLY
    )


def _step_json(record: Step) -> str | None:
    """A step record's JSON as :data:`_PAYLOAD_JSON` writes it, or None where its values are not
    the plain types this template writes (then the encoder does, and decides)."""
    if not _plain_step(record):
        return None
    agent, user, piece = record.agent_codes, record.user_codes, record.text_piece
    return (
        f'{{"agent_codes":[{_codes_json(agent)}],"epoch":{record.epoch},'
        f'"frame_index":{record.frame_index},"ready":{"true" if record.ready else "false"},'
        f'"text_piece":{_json_string(piece)},"text_token":{record.text_token},'
        f'"user_codes":[{_codes_json(user)}]}}'
    )


# The decimal text of the audio codes (a codebook's 2048 entries and its special ones), looked
# up instead of formatted: a step's 16-odd codes were the larger part of its record's encoding.
_CODE_TEXT: Final = {code: str(code) for code in range(4096)}
_code_text = _CODE_TEXT.__getitem__


def _codes_json(codes: tuple[int, ...]) -> str:
    """``codes`` (ints, as :func:`_step_json` checked) comma-separated, as ``str`` writes each."""
    try:
        return ",".join(map(_code_text, codes))
    except KeyError:  # a code outside the table
        return ",".join(map(str, codes))


def _plain_append(record: Append) -> bool:
    """Whether an append's values are the plain types :func:`_append_json` writes."""
    event_id = record.client_event_id
    return (
        type(record.format) is str
        and type(record.sample_rate_hz) is int
        and (event_id is None or type(event_id) is str)
    )


def _append_json(record: Append) -> str | None:
    """An append record's JSON as :data:`_PAYLOAD_JSON` writes it, or None (see :func:`_step_json`)."""
    if not _plain_append(record):
        return None
    event_id, fmt, rate = record.client_event_id, record.format, record.sample_rate_hz
    event_json = "null" if event_id is None else _json_string(event_id)
    return f'{{"client_event_id":{event_json},"format":{_json_string(fmt)},"sample_rate_hz":{rate}}}'


# The records of every frame (an append in, a step out) skip the generic encoder's dict and
# key sort: a template of the same bytes (tests/log/test_records.py compares them).
_json_string = json.encoder.encode_basestring_ascii


# The most text (a step's piece, an append's event id) and audio of a record that
# :func:`frame_record` takes: a frame's records are far below both.
FRAME_TEXT_MAX: Final = 1024
FRAME_AUDIO_MAX: Final = 1024 * 1024


def frame_record(record: Record) -> bool:
    """Whether ``record`` is one of every frame's two records (an exact :class:`Step` or
    :class:`Append`) whose payload the templates write from values that cannot change: plain
    types, its audio ``bytes``, its text and audio small. Encoding such a record later gives
    the bytes encoding it now does, and cannot fail on it."""
    if type(record) is Step:
        return (
            _plain_step(record)
            and type(record.pcm16) is bytes
            and len(record.text_piece) <= FRAME_TEXT_MAX
            and len(record.pcm16) <= FRAME_AUDIO_MAX
        )
    if type(record) is Append:
        return (
            _plain_append(record)
            and type(record.audio) is bytes
            and len(record.client_event_id or "") <= FRAME_TEXT_MAX
            and len(record.audio) <= FRAME_AUDIO_MAX
        )
    return False


def encode_payload(record: Record) -> tuple[int, bytes]:
    """``(kind, payload bytes)`` of a record."""
    kind, head, blob = encode_payload_parts(record)
    return kind, head + blob


def encode_payload_parts(record: Record) -> tuple[int, bytes, bytes]:
    """``(kind, head, blob)``: the payload of :func:`encode_payload` is ``head + blob`` (the
    JSON with its length, then the record's bytes), kept apart so that the framing copies a
    frame's audio once."""
    if type(record) is Step:
        step = _step_json(record)
        if step is not None:
            text = step.encode()
            return Step.KIND, _JSON_LEN.pack(len(text)) + text, bytes(record.pcm16)
    elif type(record) is Append:
        append = _append_json(record)
        if append is not None:
            text = append.encode()
            return Append.KIND, _JSON_LEN.pack(len(text)) + text, bytes(record.audio)
    kind, payload = generic_payload(record)
    return kind, payload, b""


def generic_payload(record: Record) -> tuple[int, bytes]:
    """:func:`encode_payload` without the templates: every record through the JSON encoder."""
    cls = type(record)
    names, blob_field = _field_names(cls)
    fields = {}
    for name in names:
        value = getattr(record, name)
        fields[name] = list(value) if isinstance(value, tuple) else value
    blob = bytes(getattr(record, blob_field)) if blob_field is not None else b""
    text = _PAYLOAD_JSON(fields).encode()
    return cls.KIND, _JSON_LEN.pack(len(text)) + text + blob


def decode_payload(kind: int, payload: bytes) -> Record:
    cls = BY_KIND.get(kind)
    if cls is None:
        raise PayloadError(f"unknown record kind {kind}")
    if len(payload) < _JSON_LEN.size:
        raise PayloadError("payload shorter than its JSON length prefix")
    (n,) = _JSON_LEN.unpack_from(payload)
    if _JSON_LEN.size + n > len(payload):
        raise PayloadError("JSON length runs past the payload")
    try:
        fields = json.loads(payload[_JSON_LEN.size : _JSON_LEN.size + n])
    except ValueError as exc:
        raise PayloadError(f"payload JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise PayloadError("payload JSON is not an object")
    blob = payload[_JSON_LEN.size + n :]
    blob_field: str | None = getattr(cls, "BLOB", None)
    if blob_field is not None:
        fields[blob_field] = blob
    elif blob:
        raise PayloadError(f"{KIND_NAMES[cls]} record carries unexpected binary data")
    for a in attrs.fields(cls):
        if a.name in fields and isinstance(fields[a.name], list) and a.name.endswith("codes"):
            fields[a.name] = tuple(fields[a.name])
    try:
        record: Record = cls(**fields)
    except TypeError as exc:
        raise PayloadError(f"{KIND_NAMES[cls]} record: {exc}") from exc
    return record
