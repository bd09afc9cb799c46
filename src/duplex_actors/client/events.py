"""Typed server events as a client sees them, parsed from either dialect's JSON.

One small frozen attrs class per event a client acts on; every other event arrives as
:class:`OtherEvent` with its raw dict. Every event carries ``type`` (the wire name), ``raw`` (the
decoded JSON object; for a native binary audio frame, ``{}``), ``received_at`` (``trio.current_time()``
when the client's receive task read it) and ``seq`` (1, 2, ... in arrival order on this connection).

The Realtime GA and beta names (``OpenAI-Beta: realtime=v1``) and the native dialect's flat
events (``/v1/duplex``) all map onto the same classes, so code written against them does not care
which dialect it talks. The names come from :mod:`duplex_actors.protocol.events`, the classes the
server's own projections are checked against.
"""

from __future__ import annotations

import base64
from typing import Any, Final

import attrs

from ..audio import FRAME_PCM16_BYTES
from ..protocol import events as wire
from ..protocol.events import Dialect


@attrs.frozen(kw_only=True)
class ServerEvent:
    type: str
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)
    received_at: float = attrs.field(repr=False, eq=False)
    seq: int = attrs.field(repr=False, eq=False)


@attrs.frozen(kw_only=True)
class SessionCreated(ServerEvent):
    session_id: str
    session: dict[str, Any] = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class SessionUpdated(ServerEvent):
    session_id: str
    session: dict[str, Any] = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class ResponseCreated(ServerEvent):
    """``epoch`` is given by the native dialect only (Realtime: ``None``; the first
    :class:`AudioDelta` of the response has it)."""

    response_id: str
    epoch: int | None


@attrs.frozen(kw_only=True)
class AudioDelta(ServerEvent):
    """Whole 80 ms frames of PCM16 LE mono 24 kHz; ``frame_index`` is the index of the input frame
    whose step produced the first of them (output frame k answers input frame k). ``text``: the
    frame's text where the dialect puts it on the delta (native), else ``""``."""

    response_id: str | None
    epoch: int
    frame_index: int
    pcm16: bytes = attrs.field(repr=False)
    text: str = ""

    @property
    def frames(self) -> int:
        return len(self.pcm16) // FRAME_PCM16_BYTES


@attrs.frozen(kw_only=True)
class TranscriptDelta(ServerEvent):
    response_id: str | None
    text: str


@attrs.frozen(kw_only=True)
class ResponseDone(ServerEvent):
    """``status`` is ``cancelled`` for a lockstep model; ``reason`` says why (``client_cancelled``,
    ``output_audio_buffer_clear``, ``session_closed``)."""

    response_id: str
    status: str
    reason: str | None
    transcript: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class Error(ServerEvent):
    """``event_id`` is the *client* event the error answers (when the server echoed it);
    ``error_type`` is the OpenAI ``error.type`` (native: ``None``)."""

    code: str
    message: str
    event_id: str | None
    error_type: str | None = None
    param: str | None = None


ErrorEvent = Error


@attrs.frozen(kw_only=True)
class SessionClosing(ServerEvent):
    session_id: str
    reason: str


@attrs.frozen(kw_only=True)
class SessionClosed(ServerEvent):
    """Always the last event of a session."""

    session_id: str
    reason: str


@attrs.frozen(kw_only=True)
class OtherEvent(ServerEvent):
    """Any event without a class of its own (``response.output_item.added``, ``rate_limits.updated``,
    ``input_audio_buffer.speech_started``, ...): look at ``raw``."""


def _names(*classes: type[Any]) -> frozenset[str]:
    names: set[str] = set()
    for cls in classes:
        for beta in (False, True):
            name = wire.wire_type(cls, beta=beta)
            if name is not None:
                names.add(name)
    return frozenset(names)


_AUDIO_DELTA: Final = _names(wire.RealtimeOutputAudioDelta) | {wire.NativeOutputAudioDelta.TYPE}
_TRANSCRIPT_DELTA: Final = _names(wire.RealtimeOutputAudioTranscriptDelta) | {
    wire.NativeOutputTranscriptDelta.TYPE
}


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _response_done_realtime(obj: dict[str, Any]) -> tuple[str, str, str | None, str]:
    resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    assert isinstance(resp, dict)
    details = resp.get("status_details")
    reason = _opt_str(details.get("reason")) if isinstance(details, dict) else None
    transcript = ""
    for item in resp.get("output") or []:
        for part in item.get("content") or [] if isinstance(item, dict) else []:
            if isinstance(part, dict):
                transcript += _str(part.get("transcript"))
    return _str(resp.get("id")), _str(resp.get("status")), reason, transcript


def parse_server_event(
    obj: dict[str, Any], *, dialect: Dialect = "realtime", received_at: float = 0.0, seq: int = 0
) -> ServerEvent:
    """The typed event of one decoded server message (never raises on an unexpected shape:
    missing fields read as empty, unknown types become :class:`OtherEvent`)."""
    kind = _str(obj.get("type"))
    common: dict[str, Any] = {"type": kind, "raw": obj, "received_at": received_at, "seq": seq}
    native = dialect == "native"
    if kind in _AUDIO_DELTA:
        if native:
            return AudioDelta(
                **common,
                response_id=_opt_str(obj.get("response_id")),
                epoch=_int(obj.get("epoch")),
                frame_index=_int(obj.get("frame_index")),
                pcm16=base64.b64decode(_str(obj.get("audio"))),
                text=_str(obj.get("text")),
            )
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        return AudioDelta(
            **common,
            response_id=_opt_str(obj.get("response_id")),
            epoch=_int(meta.get("epoch")),
            frame_index=_int(meta.get("frame_index")),
            pcm16=base64.b64decode(_str(obj.get("delta"))),
        )
    if kind in _TRANSCRIPT_DELTA:
        text = obj.get("text") if native else obj.get("delta")
        return TranscriptDelta(**common, response_id=_opt_str(obj.get("response_id")), text=_str(text))
    if kind == wire.RealtimeSessionCreated.TYPE or kind == wire.RealtimeSessionUpdated.TYPE:
        session = obj.get("session") if isinstance(obj.get("session"), dict) else {}
        assert isinstance(session, dict)
        sid = _str(obj.get("session_id")) if native else _str(session.get("id"))
        cls: type[SessionCreated] | type[SessionUpdated] = (
            SessionCreated if kind == wire.RealtimeSessionCreated.TYPE else SessionUpdated
        )
        return cls(**common, session_id=sid, session=session)
    if kind == wire.RealtimeResponseCreated.TYPE:
        if native:
            return ResponseCreated(
                **common, response_id=_str(obj.get("response_id")), epoch=_opt_int(obj.get("epoch"))
            )
        resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
        assert isinstance(resp, dict)
        return ResponseCreated(**common, response_id=_str(resp.get("id")), epoch=None)
    if kind == wire.RealtimeResponseDone.TYPE:
        if native:
            return ResponseDone(
                **common,
                response_id=_str(obj.get("response_id")),
                status=_str(obj.get("status")),
                reason=_opt_str(obj.get("reason")),
                transcript=_str(obj.get("transcript")),
            )
        rid, status, reason, transcript = _response_done_realtime(obj)
        return ResponseDone(**common, response_id=rid, status=status, reason=reason, transcript=transcript)
    if kind == wire.RealtimeError.TYPE:
        err = obj.get("error")
        if isinstance(err, dict):  # Realtime: {"error": {type, code, message, param, event_id}}
            return Error(
                **common,
                code=_str(err.get("code"), "unknown"),
                message=_str(err.get("message")),
                event_id=_opt_str(err.get("event_id")),
                error_type=_opt_str(err.get("type")),
                param=_opt_str(err.get("param")),
            )
        return Error(  # native: {"error": message, "code", "client_event_id", "param"}
            **common,
            code=_str(obj.get("code"), "unknown"),
            message=_str(err),
            event_id=_opt_str(obj.get("client_event_id")),
            param=_opt_str(obj.get("param")),
        )
    if kind == wire.RealtimeSessionClosed.TYPE:
        return SessionClosed(**common, session_id=_str(obj.get("session_id")), reason=_str(obj.get("reason")))
    if kind == wire.RealtimeSessionClosing.TYPE:
        return SessionClosing(
            **common, session_id=_str(obj.get("session_id")), reason=_str(obj.get("reason"))
        )
    return OtherEvent(**common)
