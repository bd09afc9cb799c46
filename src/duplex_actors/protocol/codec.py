"""The wire edge: text messages in, typed client events out, and the input-format rules.

Sans-io and strict (wire-protocol.md §3-§5): a message must be one JSON object (no
NaN/Infinity literals) with a string ``type`` of the dialect; fields are type-checked without
coercion (``"5"`` is not an int, ``1`` is not a bool); the client's ``event_id`` is echoed in
every refusal. Everything refused raises :class:`~.errors.ProtocolError` and nothing else.

One cattrs converter structures and unstructures every wire event: the client events as tagged
unions on ``type`` (``CONVERTER.structure(obj, RealtimeClientEvent)``), the server events as the
messages the projections send (``CONVERTER.unstructure(event)``: ``type`` first, then the fields
in class order) and back (the client's parser).
"""

from __future__ import annotations

import base64
import json
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import cattrs
import pybase64
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from .. import error_codes as codes
from ..audio import ALIASES, AudioError, canonical_format, canonical_output_format, check_rate, default_rate
from . import events as wire
from .errors import ProtocolError, clip
from .events import (
    CLIENT_EVENTS,
    NATIVE_CLIENT_EVENTS,
    REALTIME_CLIENT_EVENTS,
    ClientEvent,
    ConversationItemCreate,
    DialectName,
    InputAudioBufferAppend,
    NativeClientEvent,
    PlaybackAck,
    RealtimeClientEvent,
    SessionCreate,
    SessionEventAck,
)

MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
MAX_EVENT_ID_CHARS: Final = 512
# Echoed back to the client: kept small so no server frame comes near 1 MiB.
MAX_PLAYBACK_PAYLOAD_BYTES: Final = 64 * 1024
MAX_SESSION_CONFIG_BYTES: Final = 256 * 1024
DEFAULT_INPUT_FORMAT: Final = "pcm16"
# Keys of the session object the server owns; a client's values for them are dropped.
SERVER_OWNED_SESSION_KEYS: Final = frozenset({"id", "object", "model", "capabilities"})
_ENVELOPE: Final = frozenset({"type", "event_id"})


# -- the converter -----------------------------------------------------------------------------
def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _structure_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_json_type(value)}")
    return value


def _structure_int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {_json_type(value)}")
    return value


def _structure_float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {_json_type(value)}")
    return float(value)


def _structure_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {_json_type(value)}")
    return value


def _structure_object(value: Any, _: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {_json_type(value)}")
    return dict(value)


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {_json_type(value)}")
    return value


def _structure_playback_ack(value: dict[str, Any], _: Any) -> PlaybackAck:
    payload = {k: v for k, v in value.items() if k not in _ENVELOPE}
    return PlaybackAck(payload=payload, event_id=_optional_str(value.get("event_id"), "event_id"))


def _unstructure_playback_ack(event: PlaybackAck) -> dict[str, Any]:
    return {**event.payload, "event_id": event.event_id}


def _structure_session_create(value: dict[str, Any], _: Any) -> SessionCreate:
    # binary_output is an output option of the connection, not session config: never echoed.
    if "session" in value:
        session = value["session"]
        if not isinstance(session, dict):
            raise TypeError(f"session: expected an object, got {_json_type(session)}")
        binary = value.get("binary_output", session.get("binary_output", False))
        session = {k: v for k, v in session.items() if k != "binary_output"}
    else:
        binary = value.get("binary_output", False)
        session = {k: v for k, v in value.items() if k not in _ENVELOPE and k != "binary_output"}
    if not isinstance(binary, bool):
        raise TypeError(f"binary_output: expected a boolean, got {_json_type(binary)}")
    return SessionCreate(
        session=session, binary_output=binary, event_id=_optional_str(value.get("event_id"), "event_id")
    )


def _unstructure_session_create(event: SessionCreate) -> dict[str, Any]:
    return {"session": event.session, "binary_output": event.binary_output, "event_id": event.event_id}


def _tag(cls: type) -> str:
    return str(getattr(cls, "TYPE"))  # noqa: B009 - TYPE is a ClassVar mypy cannot see on `type`


# Server events and the objects nested in them: every attrs class of .events but the client
# events, which keep their own rules (tagged unions, ``type`` added last on unstructure).
_CLIENT_CLASSES: Final = frozenset(CLIENT_EVENTS)


def _is_server_class(cls: Any) -> bool:
    return attrs.has(cls) and getattr(cls, "__module__", None) == wire.__name__ and cls not in _CLIENT_CLASSES


def _server_unstructure_hook(cls: type[Any], conv: cattrs.Converter) -> Callable[[Any], dict[str, Any]]:
    """The message of one instance: ``{"type": TYPE}`` for an event, then the fields in order
    (``OMIT_IF_NONE`` ones left out while ``None``), then the keys of the ``FLATTEN`` dict."""
    flatten: str | None = getattr(cls, "FLATTEN", None)
    overrides: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if field.name == flatten:
            overrides[field.name] = override(omit=True)
        elif field.metadata.get(wire.OMIT_IF_NONE):
            overrides[field.name] = override(omit_if_default=True)
    fields_of = make_dict_unstructure_fn(cls, conv, **overrides)
    tag: str | None = getattr(cls, "TYPE", None)
    if flatten is not None:

        def flattened(obj: Any) -> dict[str, Any]:
            out = {} if tag is None else {"type": tag}
            out.update(fields_of(obj))
            out.update(getattr(obj, flatten))
            return out

        return flattened
    if tag is not None:
        return lambda obj: {"type": tag, **fields_of(obj)}
    return fields_of


def _server_structure_hook(cls: type[Any], conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """Structure a class with a ``FLATTEN`` dict: the keys that are not fields go into it."""
    flatten: str = getattr(cls, "FLATTEN")  # noqa: B009 - a ClassVar mypy cannot see on `type`
    names = frozenset(f.name for f in attrs.fields(cls)) - {flatten}
    fields_from = make_dict_structure_fn(cls, conv)

    def hook(value: Any, _: Any) -> Any:
        obj = _structure_object(value, None)
        known = {k: v for k, v in obj.items() if k in names}
        known[flatten] = {k: v for k, v in obj.items() if k not in names}
        return fields_from(known, cls)

    return hook


def make_converter() -> cattrs.Converter:
    """The strict converter with the client-event unions of both dialects configured."""
    conv = cattrs.Converter(forbid_extra_keys=False)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(float, _structure_float)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook_func(lambda t: t == dict[str, Any], _structure_object)
    conv.register_structure_hook(PlaybackAck, _structure_playback_ack)
    conv.register_unstructure_hook(PlaybackAck, _unstructure_playback_ack)
    conv.register_structure_hook(SessionCreate, _structure_session_create)
    conv.register_unstructure_hook(SessionCreate, _unstructure_session_create)
    configure_tagged_union(RealtimeClientEvent, conv, tag_generator=_tag, tag_name="type")
    configure_tagged_union(NativeClientEvent, conv, tag_generator=_tag, tag_name="type")
    configure_tagged_union(ClientEvent, conv, tag_generator=_tag, tag_name="type")
    # Free-form objects (session config, payloads) go out as they are, one level copied.
    conv.register_unstructure_hook_func(lambda t: t == dict[str, Any], dict)
    conv.register_unstructure_hook_factory(_is_server_class, lambda cls: _server_unstructure_hook(cls, conv))
    conv.register_structure_hook_factory(
        lambda t: _is_server_class(t) and hasattr(t, "FLATTEN"), lambda cls: _server_structure_hook(cls, conv)
    )
    return conv


CONVERTER: Final = make_converter()
_UNIONS: Final[dict[str, Any]] = {"realtime": RealtimeClientEvent, "native": NativeClientEvent}
_TYPES: Final[dict[str, frozenset[str]]] = {
    "realtime": frozenset(_tag(c) for c in REALTIME_CLIENT_EVENTS),
    "native": frozenset(_tag(c) for c in NATIVE_CLIENT_EVENTS),
}


def encode_client_event(event: ClientEvent) -> dict[str, Any]:
    """A client event as the JSON object a client sends (tests and in-repo clients use it)."""
    out: dict[str, Any] = CONVERTER.unstructure(event, unstructure_as=ClientEvent)
    return out


_SERVER_HOOKS: Final[dict[type[Any], Callable[[Any], dict[str, Any]]]] = {}


def encode_server_event(event: Any) -> dict[str, Any]:
    """A server event (an instance of a :mod:`.events` class) as its JSON object, with the
    canonical (GA) ``type``: ``CONVERTER.unstructure(event)``, the hook looked up once per class
    since the audio path runs per frame."""
    cls = type(event)
    hook = _SERVER_HOOKS.get(cls)
    if hook is None:
        hook = _SERVER_HOOKS[cls] = CONVERTER.get_unstructure_hook(cls)
    return hook(event)


def server_event_encoder(cls: type[Any], type_name: str) -> Callable[[Any], dict[str, Any]]:
    """:func:`encode_server_event` for instances of ``cls``, writing ``type_name`` as the
    ``type`` (a Realtime beta name; renamed in place, so ``type`` stays the first key)."""
    hook: Callable[[Any], dict[str, Any]] = CONVERTER.get_unstructure_hook(cls)
    if type_name == getattr(cls, "TYPE", None):
        return hook

    def renamed(event: Any) -> dict[str, Any]:
        message = hook(event)
        message["type"] = type_name
        return message

    return renamed


_DUMPS = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode  # built once, not per call


def dumps(obj: Mapping[str, Any]) -> str:
    """Compact JSON text of a server event. ASCII-only, so a lone surrogate a client sent and
    that is echoed back still encodes as UTF-8; NaN is refused, as the spec's JSON has none."""
    return _DUMPS(obj)


# -- parsing -----------------------------------------------------------------------------------
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
        raise ProtocolError(codes.INVALID_JSON, f"a message must be a JSON object, not {_json_type(obj)}")
    raw_id = obj.get("event_id")
    event_id = raw_id if isinstance(raw_id, str) and len(raw_id) <= MAX_EVENT_ID_CHARS else None
    raw_type = obj.get("type")
    event_type = clip(raw_type, 128) if isinstance(raw_type, str) else None

    def refuse(code: str, message: str, param: str | None = None) -> ProtocolError:
        return ProtocolError(code, message, event_type=event_type, client_event_id=event_id, param=param)

    if raw_type is None:
        raise refuse(codes.BAD_EVENT, "the message has no `type`", "type")
    if not isinstance(raw_type, str):
        raise refuse(codes.BAD_EVENT, f"`type` must be a string, not {_json_type(raw_type)}", "type")
    if raw_id is not None and not isinstance(raw_id, str):
        raise refuse(codes.BAD_EVENT, f"`event_id` must be a string, not {_json_type(raw_id)}", "event_id")
    if isinstance(raw_id, str) and event_id is None:
        raise refuse(codes.BAD_EVENT, f"`event_id` longer than {MAX_EVENT_ID_CHARS} characters", "event_id")
    if dialect not in _TYPES:
        raise ValueError(f"unknown dialect {dialect!r}")
    if raw_type not in _TYPES[dialect]:
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
        event: ClientEvent = CONVERTER.structure(obj, _UNIONS[dialect])
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


def decode_audio_b64(
    s: str, *, client_event_id: str | None = None, event_type: str | None = InputAudioBufferAppend.TYPE
) -> bytes:
    """Strict base64 (``validate=True``): junk -> ``bad_audio``; empty -> ``bad_event``."""

    def refuse(code: str, message: str) -> ProtocolError:
        return ProtocolError(
            code, message, event_type=event_type, client_event_id=client_event_id, param="audio"
        )

    if not s:
        raise refuse(codes.BAD_EVENT, "input_audio_buffer.append carries no audio")
    try:
        data = pybase64.b64decode(s, validate=True)
    except ValueError:
        try:  # the standard library's words for what is wrong (pybase64 decodes only faster)
            data = base64.b64decode(s, validate=True)
        except ValueError as exc:  # binascii.Error, or non-ASCII characters
            raise refuse(codes.BAD_AUDIO, f"audio is not valid base64: {exc}") from None
    if not data:
        raise refuse(codes.BAD_EVENT, "input_audio_buffer.append carries no audio")
    return data


# -- audio formats -----------------------------------------------------------------------------
def _format_name(name: Any, *, param: str, ctx: dict[str, Any]) -> str:
    if not isinstance(name, str):
        raise ProtocolError(
            codes.UNSUPPORTED_AUDIO_FORMAT, f"{param} must be a format name", param=param, **ctx
        )
    try:
        return canonical_format(name)
    except AudioError as exc:
        raise ProtocolError(codes.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=param, **ctx) from None


def _check_rate(rate: Any, *, param: str, ctx: dict[str, Any], fmt: str | None = None) -> int:
    """An integer rate that ``fmt`` takes (without ``fmt``: one any input format takes)."""
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an integer", param=param, **ctx)
    try:
        if fmt is not None:
            return check_rate(fmt, rate)
        try:
            return check_rate("pcm16", rate)
        except AudioError:
            return check_rate("g711_ulaw", rate)
    except AudioError as exc:
        raise ProtocolError(codes.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=param, **ctx) from None


def _output_format(name: Any, *, param: str, ctx: dict[str, Any]) -> str:
    if not isinstance(name, str):
        raise ProtocolError(
            codes.UNSUPPORTED_AUDIO_FORMAT, f"{param} must be a format name", param=param, **ctx
        )
    try:
        return canonical_output_format(name)
    except AudioError as exc:
        raise ProtocolError(codes.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=param, **ctx) from None


def _ga_format(value: Any, *, param: str, ctx: dict[str, Any]) -> tuple[str, int | None]:
    """GA ``audio.{input,output}.format``: ``{type, rate}`` (both optional) or a bare name."""
    if isinstance(value, str):
        return _format_name(value, param=param, ctx=ctx), None
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    name = _format_name(value.get("type", "audio/pcm"), param=f"{param}.type", ctx=ctx)
    rate = value.get("rate")
    if rate is not None:
        rate = _check_rate(rate, param=f"{param}.rate", ctx=ctx)
    return name, rate


def _sub_object(parent: Mapping[str, Any], key: str, *, param: str, ctx: dict[str, Any]) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    return value


def _session_input_format(config: Mapping[str, Any]) -> tuple[Any, Any]:
    """(format, rate) the session config names, flat keys first, then GA ``audio.input.format``."""
    fmt = config.get("input_audio_format")
    rate = config.get("sample_rate_hz")
    audio = config.get("audio")
    if isinstance(audio, dict) and isinstance(audio.get("input"), dict):
        ga = audio["input"].get("format")
        if isinstance(ga, dict):
            fmt = fmt if fmt is not None else ga.get("type")
            rate = rate if rate is not None else ga.get("rate")
        elif isinstance(ga, str) and fmt is None:
            fmt = ga
    return fmt, rate


def _same_format(a: Any, b: Any) -> bool:
    return isinstance(a, str) and isinstance(b, str) and ALIASES.get(a, a) == ALIASES.get(b, b)


def resolve_input_format(
    append: InputAudioBufferAppend, session_config: Mapping[str, Any]
) -> tuple[str, int]:
    """(canonical format, rate) of one append: the append's own
    ``format``/``input_audio_format``/``sample_rate_hz`` first, then the session's, then
    ``pcm16`` @ 24000 (G.711: 8000). A format or rate outside spec §3 ->
    ``unsupported_audio_format``."""
    ctx: dict[str, Any] = {"event_type": append.TYPE, "client_event_id": append.event_id}
    fmt: Any = append.format if append.format is not None else append.input_audio_format
    rate: Any = append.sample_rate_hz
    fmt_param, rate_param = "format", "sample_rate_hz"
    if fmt is None or rate is None:
        session_fmt, session_rate = _session_input_format(session_config)
        if fmt is None:
            fmt, fmt_param = session_fmt, "session.input_audio_format"
        # The session's rate goes with the session's format: an append naming another format
        # alone gets that format's default rate.
        if rate is None and (fmt_param != "format" or _same_format(fmt, session_fmt)):
            rate, rate_param = session_rate, "session.sample_rate_hz"
    name = _format_name(fmt if fmt is not None else DEFAULT_INPUT_FORMAT, param=fmt_param, ctx=ctx)
    if rate is None:
        return name, default_rate(name)
    return name, _check_rate(rate, param=rate_param, ctx=ctx, fmt=name)


def decode_append(
    append: InputAudioBufferAppend, session_config: Mapping[str, Any]
) -> tuple[bytes, str, int]:
    """``(audio bytes, canonical format, rate)`` of an append, ready for
    ``SessionHandle.append_bytes`` (the core checks the byte length and the samples' finiteness)."""
    fmt, rate = resolve_input_format(append, session_config)
    audio = decode_audio_b64(append.audio, client_event_id=append.event_id, event_type=append.TYPE)
    return audio, fmt, rate


MAX_PAD_MS: Final = 80  # an append's pad_ms is in [0, 80)


def append_pad_ms(append: InputAudioBufferAppend) -> int:
    """The append's ``pad_ms`` (0 when absent); anything but an integer in [0, 80) refuses the
    whole append with ``invalid_value`` (spec section 7)."""
    pad = append.pad_ms
    if pad is None:
        return 0
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < MAX_PAD_MS:
        raise ProtocolError(
            codes.INVALID_VALUE,
            f"pad_ms must be an integer in [0, {MAX_PAD_MS}), not {clip(repr(pad), 64)}",
            param="pad_ms",
            event_type=append.TYPE,
            client_event_id=append.event_id,
        )
    return pad


# -- session config ----------------------------------------------------------------------------
def normalize_session_config(
    session: Any, *, client_event_id: str | None = None, event_type: str | None = "session.update"
) -> dict[str, Any]:
    """The flat config the session core reads, from a client's session object.

    GA fields map onto the flat keys (``audio.output.voice`` -> ``voice``,
    ``audio.input.format`` -> ``input_audio_format``/``sample_rate_hz``) unless the message also
    gives the flat key; the server-owned ``id``/``object``/``model``/``capabilities`` are
    dropped; audio formats are validated (input pcm16 or pcm_f32le, output pcm16, 24 kHz);
    every other key is kept and echoed.
    """
    ctx: dict[str, Any] = {"event_type": event_type, "client_event_id": client_event_id}
    if not isinstance(session, dict):
        raise ProtocolError(
            codes.BAD_EVENT, f"session must be an object, not {_json_type(session)}", param="session", **ctx
        )
    if len(json.dumps(session, default=str)) > MAX_SESSION_CONFIG_BYTES:
        raise ProtocolError(
            codes.BAD_EVENT,
            f"session config larger than {MAX_SESSION_CONFIG_BYTES} bytes",
            param="session",
            **ctx,
        )
    out = {k: v for k, v in session.items() if k not in SERVER_OWNED_SESSION_KEYS}
    audio = _sub_object(out, "audio", param="session.audio", ctx=ctx)
    audio_in = _sub_object(audio, "input", param="session.audio.input", ctx=ctx)
    audio_out = _sub_object(audio, "output", param="session.audio.output", ctx=ctx)
    if audio_in.get("format") is not None:
        name, rate = _ga_format(audio_in["format"], param="session.audio.input.format", ctx=ctx)
        out.setdefault("input_audio_format", name)
        if rate is not None:
            out.setdefault("sample_rate_hz", rate)
    if audio_out.get("format") is not None:
        out.setdefault("output_audio_format", _ga_output_format(audio_out["format"], ctx=ctx))
    ga_voice = audio_out.get("voice")
    if ga_voice is not None:
        if "voice" in out and out["voice"] != ga_voice:
            raise ProtocolError(
                codes.INVALID_VALUE,
                "session.voice and session.audio.output.voice disagree",
                param="session.audio.output.voice",
                **ctx,
            )
        out["voice"] = ga_voice
    if out.get("input_audio_format") is not None:
        out["input_audio_format"] = _format_name(
            out["input_audio_format"], param="session.input_audio_format", ctx=ctx
        )
    if out.get("sample_rate_hz") is not None:
        _check_rate(out["sample_rate_hz"], param="session.sample_rate_hz", ctx=ctx)
    if out.get("output_audio_format") is not None:
        out["output_audio_format"] = _output_format(
            out["output_audio_format"], param="session.output_audio_format", ctx=ctx
        )
    if out.get("input_audio_format") is not None and out.get("sample_rate_hz") is not None:
        _check_rate(
            out["sample_rate_hz"], param="session.sample_rate_hz", ctx=ctx, fmt=out["input_audio_format"]
        )
    return out


def _ga_output_format(value: Any, *, ctx: dict[str, Any]) -> str:
    """GA ``audio.output.format``: ``{type, rate}`` or a bare name; the rate must be the format's."""
    param = "session.audio.output.format"
    if isinstance(value, str):
        return _output_format(value, param=param, ctx=ctx)
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    name = _output_format(value.get("type", "audio/pcm"), param=f"{param}.type", ctx=ctx)
    rate = value.get("rate")
    if rate is not None and rate != default_rate(name):
        raise ProtocolError(
            codes.UNSUPPORTED_AUDIO_FORMAT,
            f"output {name} is sent at {default_rate(name)} Hz, not {rate!r}",
            param=f"{param}.rate",
            **ctx,
        )
    return name


# -- conversation items ------------------------------------------------------------------------
TEXT_PART_TYPES: Final = frozenset({"input_text", "output_text", "text"})
MAX_TEXT_ITEM_CHARS: Final = 64 * 1024


def text_item(event: ConversationItemCreate) -> tuple[str, str, str | None]:
    """``(role, text, item id or None)`` of a ``conversation.item.create`` that adds a text
    message; anything else (another item type, audio or image parts, no text) refuses it with
    ``invalid_value`` naming what is not taken."""

    def refuse(message: str, param: str) -> ProtocolError:
        return ProtocolError(
            codes.INVALID_VALUE, message, param=param, event_type=event.TYPE, client_event_id=event.event_id
        )

    item = event.item
    kind = item.get("type", "message")
    if kind != "message":
        raise refuse(
            f"only text message items are taken (a lockstep model reads no {clip(repr(kind), 64)} item)",
            "item.type",
        )
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise refuse(
            f"item.role must be user, system, developer or assistant, not {clip(repr(role), 64)}", "item.role"
        )
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= MAX_EVENT_ID_CHARS):
        raise refuse(f"item.id must be a string of 1 to {MAX_EVENT_ID_CHARS} characters", "item.id")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise refuse("item.content must be a non-empty list of text parts", "item.content")
    texts = []
    for part in content:
        if (
            not isinstance(part, dict)
            or part.get("type") not in TEXT_PART_TYPES
            or not isinstance(part.get("text"), str)
        ):
            kind = part.get("type") if isinstance(part, dict) else _json_type(part)
            raise refuse(
                f"only text parts are taken (input_text, output_text, text), not {clip(repr(kind), 64)}",
                "item.content",
            )
        texts.append(part["text"])
    text = "".join(texts)
    if len(text) > MAX_TEXT_ITEM_CHARS:
        raise refuse(f"an item's text is at most {MAX_TEXT_ITEM_CHARS} characters", "item.content")
    return role, text, item_id
