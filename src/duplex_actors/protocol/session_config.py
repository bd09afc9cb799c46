"""A client's session object -> the flat config the session core reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from .. import error_codes as codes
from .audio_formats import checked_rate, format_name, ga_format, ga_output_format, output_format
from .converter import json_type
from .errors import ProtocolError

MAX_SESSION_CONFIG_BYTES: Final = 256 * 1024
# Keys of the session object the server owns; a client's values for them are dropped.
SERVER_OWNED_SESSION_KEYS: Final = frozenset({"id", "object", "model", "capabilities"})


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
            codes.BAD_EVENT, f"session must be an object, not {json_type(session)}", param="session", **ctx
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
        name, rate = ga_format(audio_in["format"], param="session.audio.input.format", ctx=ctx)
        out.setdefault("input_audio_format", name)
        if rate is not None:
            out.setdefault("sample_rate_hz", rate)
    if audio_out.get("format") is not None:
        out.setdefault("output_audio_format", ga_output_format(audio_out["format"], ctx=ctx))
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
        out["input_audio_format"] = format_name(
            out["input_audio_format"], param="session.input_audio_format", ctx=ctx
        )
    if out.get("sample_rate_hz") is not None:
        checked_rate(out["sample_rate_hz"], param="session.sample_rate_hz", ctx=ctx)
    if out.get("output_audio_format") is not None:
        out["output_audio_format"] = output_format(
            out["output_audio_format"], param="session.output_audio_format", ctx=ctx
        )
    if out.get("input_audio_format") is not None and out.get("sample_rate_hz") is not None:
        checked_rate(
            out["sample_rate_hz"], param="session.sample_rate_hz", ctx=ctx, fmt=out["input_audio_format"]
        )
    return out


def _sub_object(parent: Mapping[str, Any], key: str, *, param: str, ctx: dict[str, Any]) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(codes.BAD_EVENT, f"{param} must be an object", param=param, **ctx)
    return value
