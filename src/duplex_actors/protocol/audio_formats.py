"""The audio of an append: its input format and rate, its base64 samples, its ``pad_ms``.

An append's own ``format``/``input_audio_format``/``sample_rate_hz`` come first, then the
session's, then ``pcm16`` at its default rate (docs/protocol.md §3).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any, Final

import pybase64

from .. import error_codes as codes
from ..audio import ALIASES, AudioError, canonical_format, canonical_output_format, check_rate, default_rate
from .errors import ProtocolError, clip
from .wire_events import InputAudioBufferAppend

DEFAULT_INPUT_FORMAT: Final = "pcm16"


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


def _named_format(name: Any, canonical: Callable[[str], str], *, param: str, ctx: dict[str, Any]) -> str:
    if not isinstance(name, str):
        raise ProtocolError(
            codes.UNSUPPORTED_AUDIO_FORMAT, f"{param} must be a format name", param=param, **ctx
        )
    try:
        return canonical(name)
    except AudioError as exc:
        raise ProtocolError(codes.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=param, **ctx) from None


def format_name(name: Any, *, param: str, ctx: dict[str, Any]) -> str:
    return _named_format(name, canonical_format, param=param, ctx=ctx)


def checked_rate(rate: Any, *, param: str, ctx: dict[str, Any], fmt: str | None = None) -> int:
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


def output_format(name: Any, *, param: str, ctx: dict[str, Any]) -> str:
    return _named_format(name, canonical_output_format, param=param, ctx=ctx)


def ga_format(value: Any, *, param: str, ctx: dict[str, Any]) -> tuple[str, int | None]:
    """GA ``audio.{input,output}.format``: ``{type, rate}`` (both optional) or a bare name."""
    if isinstance(value, str):
        return format_name(value, param=param, ctx=ctx), None
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    name = format_name(value.get("type", "audio/pcm"), param=f"{param}.type", ctx=ctx)
    rate = value.get("rate")
    if rate is not None:
        rate = checked_rate(rate, param=f"{param}.rate", ctx=ctx)
    return name, rate


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
    ``pcm16`` @ 24000 (G.711: 8000). A format or rate outside docs/protocol.md §3 ->
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
    name = format_name(fmt if fmt is not None else DEFAULT_INPUT_FORMAT, param=fmt_param, ctx=ctx)
    if rate is None:
        return name, default_rate(name)
    return name, checked_rate(rate, param=rate_param, ctx=ctx, fmt=name)


def decode_append(
    append: InputAudioBufferAppend, session_config: Mapping[str, Any]
) -> tuple[bytes, str, int]:
    """``(audio bytes, canonical format, rate)`` of an append, ready for
    ``SessionHandle.append_bytes`` (the core checks the byte length and the samples' finiteness)."""
    fmt, rate = resolve_input_format(append, session_config)
    audio = decode_audio_b64(append.audio, client_event_id=append.event_id, event_type=append.TYPE)
    return audio, fmt, rate


MAX_PAD_MS: Final = 80  # an append's pad_ms is in [0, 80)


def _append_integer(
    append: InputAudioBufferAppend, name: str, value: Any, stop: int | None, expected: str
) -> int | None:
    """An optional integer field of an append, in [0, ``stop``) (no bound: None); anything else
    refuses the whole append with ``invalid_value``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or (stop is not None and value >= stop)
    ):
        raise ProtocolError(
            codes.INVALID_VALUE,
            f"{name} must be {expected}, not {clip(repr(value), 64)}",
            param=name,
            event_type=append.TYPE,
            client_event_id=append.event_id,
        )
    return value


def append_pad_ms(append: InputAudioBufferAppend) -> int:
    """The append's ``pad_ms`` (0 when absent), an integer in [0, 80) (docs/protocol.md §7)."""
    pad = _append_integer(append, "pad_ms", append.pad_ms, MAX_PAD_MS, f"an integer in [0, {MAX_PAD_MS})")
    return pad or 0


def append_samples_start(append: InputAudioBufferAppend) -> int | None:
    """The append's ``input_samples_start`` (None when absent), a non-negative integer
    (docs/protocol.md §10)."""
    return _append_integer(
        append, "input_samples_start", append.input_samples_start, None, "a non-negative integer"
    )


def ga_output_format(value: Any, *, ctx: dict[str, Any]) -> str:
    """GA ``audio.output.format``: ``{type, rate}`` or a bare name; the rate must be the format's."""
    param = "session.audio.output.format"
    if isinstance(value, str):
        return output_format(value, param=param, ctx=ctx)
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    name = output_format(value.get("type", "audio/pcm"), param=f"{param}.type", ctx=ctx)
    rate = value.get("rate")
    if rate is not None and rate != default_rate(name):
        raise ProtocolError(
            codes.UNSUPPORTED_AUDIO_FORMAT,
            f"output {name} is sent at {default_rate(name)} Hz, not {rate!r}",
            param=f"{param}.rate",
            **ctx,
        )
    return name
