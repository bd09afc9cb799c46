"""Typed server events as a client sees them, parsed from either dialect's JSON.

A message is parsed into its class in :mod:`duplex_actors.protocol.wire_events` (the one the server's
projection built it from) with the protocol's converter; the events a client acts on then get a
small dialect-neutral view here, every other event arrives as :class:`OtherEvent`. Every event
carries ``type`` (the wire name), ``wire`` (the ``protocol.wire_events`` instance; ``None`` for a
native binary audio frame and for a message that is not a valid event of the dialect), ``raw``
(the decoded JSON object; for a binary frame, ``{}``), ``received_at`` (``trio.current_time()``
when the client's receive task read it) and ``seq`` (1, 2, ... in arrival order on this
connection).

The Realtime GA and beta names (``OpenAI-Beta: realtime=v1``) and the native dialect's flat
events (``/v1/duplex``) all map onto the same view classes, so code written against them does
not care which dialect it talks. A new server event needs nothing here: it arrives as an
:class:`OtherEvent` whose ``wire`` is its class.
"""

from __future__ import annotations

import base64
from typing import Any, Final

import attrs

from ..audio import FRAME_MS, SAMPLE_RATE, decode, float_to_pcm16
from ..protocol import wire_events as wire
from ..protocol.converter import CONVERTER
from ..protocol.wire_events import DialectName


@attrs.frozen(kw_only=True)
class ServerEvent:
    type: str
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)
    received_at: float = attrs.field(repr=False, eq=False)
    seq: int = attrs.field(repr=False, eq=False)
    wire: Any = attrs.field(default=None, repr=False, eq=False)


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
    """Whole 80 ms frames of PCM16 LE mono at ``sample_rate_hz`` (24 kHz unless the session's
    output is G.711: then ``pcm16`` is the 8 kHz audio decoded and ``audio`` the bytes as sent);
    ``frame_index`` is the index of the input frame whose step produced the first of them
    (output frame k answers input frame k). ``text``: the frame's text where the dialect puts it
    on the delta (native), else ``""``. ``input_samples_end``: where (in samples of the client's
    own input stream, at its rate, alignment pads excluded) the input of the delta's frame ended
    (``metadata.input_samples_end``; ``None`` from a server that does not send it, and for a
    native binary frame)."""

    response_id: str | None
    epoch: int
    frame_index: int
    pcm16: bytes = attrs.field(repr=False)
    text: str = ""
    format: str = "pcm16"
    sample_rate_hz: int = SAMPLE_RATE
    audio: bytes = attrs.field(default=b"", repr=False)
    input_samples_end: int | None = None

    @property
    def frames(self) -> int:
        return len(self.pcm16) // (2 * self.sample_rate_hz * FRAME_MS // 1000)


@attrs.frozen(kw_only=True)
class AlignmentHint(ServerEvent):
    """``input_audio_buffer.alignment`` (docs/protocol.md §7; only to a session that opted in
    with ``duplex: {"alignment": "client"}``): send the next chunk ``pad_ms`` early, holding only
    ``80 - pad_ms`` ms of new audio, with ``pad_ms`` on that append. ``reason``: ``start``,
    ``clear``, ``drift`` or ``margin``."""

    pad_ms: int
    reason: str


ALIGNMENT_TYPE: Final = "input_audio_buffer.alignment"


def _samples_end(obj: Any) -> int | None:
    value = obj.get("input_samples_end") if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
class Resumed(ServerEvent):
    """Not a server event: the note a :class:`~duplex_actors.client.connection.DuplexClient`
    opened with ``resume=True`` puts in its event stream when it has taken its session over on a
    new connection after the old one dropped (docs/protocol.md §10). ``type`` is
    ``session.resumed``; ``raw`` the server's answer without its token; ``seq`` that of the last
    server event before it (a note takes no number of its own). ``gap_s``: from the moment the
    client saw the drop to ``session.resumed``; ``attempts``: connections it took;
    ``generation``: the attachment's (2 after the first resume); ``input_samples_resent``:
    client input samples re-sent (those the server had not received); ``cause``: how the old
    connection ended (``dropped``, ``stalled``)."""

    session_id: str
    generation: int
    gap_s: float
    attempts: int
    cause: str
    last_server_event_seq: int
    replay_from_server_event_seq: int
    input_samples_received: int
    input_samples_resent: int
    last_client_event_id: str | None


RESUMED_TYPE: Final = "session.resumed"


@attrs.frozen(kw_only=True)
class OtherEvent(ServerEvent):
    """Any event without a view of its own (``response.output_item.added``, ``rate_limits.updated``,
    ``input_audio_buffer.speech_started``, ...): look at ``wire`` (or ``raw``)."""


def _classes(classes: tuple[type[Any], ...], *, beta_names: bool) -> dict[str, type[Any]]:
    out: dict[str, type[Any]] = {}
    for cls in classes:
        for beta in (False, True) if beta_names else (False,):
            name = wire.wire_type(cls, beta=beta)
            if name is not None:
                out[name] = cls
    return out


_CLASSES: Final[dict[str, dict[str, type[Any]]]] = {
    "realtime": _classes(wire.REALTIME_SERVER_EVENTS, beta_names=True),
    "native": _classes(wire.NATIVE_SERVER_EVENTS, beta_names=False),
}


def _transcript(response: wire.Response) -> str:
    return "".join(
        part.transcript
        for item in response.output
        for part in item.content
        if isinstance(part, wire.ItemContent)
    )


def _view(event: Any, common: dict[str, Any]) -> ServerEvent:
    """The dialect-neutral view of one parsed ``protocol.wire_events`` instance."""
    match event:
        case wire.RealtimeOutputAudioDelta():
            meta = event.metadata
            data = base64.b64decode(event.delta)
            fmt = event.format or "pcm16"
            pcm = data if fmt == "pcm16" else float_to_pcm16(decode(data, fmt))
            return AudioDelta(
                **common,
                response_id=event.response_id,
                epoch=meta.epoch,
                frame_index=meta.frame_index,
                pcm16=pcm,
                format=fmt,
                sample_rate_hz=event.sample_rate_hz,
                audio=data,
                input_samples_end=_samples_end(common["raw"].get("metadata")),
            )
        case wire.NativeOutputAudioDelta():
            return AudioDelta(
                **common,
                response_id=event.response_id,
                epoch=event.epoch,
                frame_index=event.frame_index,
                pcm16=base64.b64decode(event.audio),
                text=event.text,
                input_samples_end=_samples_end(common["raw"]) or _samples_end(common["raw"].get("metadata")),
            )
        case wire.RealtimeOutputAudioTranscriptDelta():
            return TranscriptDelta(**common, response_id=event.response_id, text=event.delta)
        case wire.NativeOutputTranscriptDelta():
            return TranscriptDelta(**common, response_id=event.response_id, text=event.text)
        case wire.RealtimeSessionCreated() | wire.RealtimeSessionUpdated():
            cls = SessionCreated if isinstance(event, wire.RealtimeSessionCreated) else SessionUpdated
            return cls(**common, session_id=event.session.id, session=common["raw"]["session"])
        case wire.NativeSessionCreated() | wire.NativeSessionUpdated():
            cls = SessionCreated if isinstance(event, wire.NativeSessionCreated) else SessionUpdated
            return cls(**common, session_id=event.session_id, session=event.session)
        case wire.RealtimeResponseCreated():
            return ResponseCreated(**common, response_id=event.response.id, epoch=None)
        case wire.NativeResponseCreated():
            return ResponseCreated(**common, response_id=event.response_id, epoch=event.epoch)
        case wire.RealtimeResponseDone():
            resp = event.response
            reason = None if resp.status_details is None else resp.status_details.reason
            return ResponseDone(
                **common, response_id=resp.id, status=resp.status, reason=reason, transcript=_transcript(resp)
            )
        case wire.NativeResponseDone():
            return ResponseDone(
                **common,
                response_id=event.response_id,
                status=event.status,
                reason=event.reason,
                transcript=event.transcript,
            )
        case wire.RealtimeError():
            err = event.error
            return Error(
                **common,
                code=err.code,
                message=err.message,
                event_id=err.event_id,
                error_type=err.type,
                param=err.param,
            )
        case wire.NativeError():
            return Error(
                **common,
                code=event.code,
                message=event.error,
                event_id=event.client_event_id,
                param=event.param,
            )
        case wire.RealtimeSessionClosing() | wire.NativeSessionClosing():
            return SessionClosing(**common, session_id=event.session_id, reason=event.reason)
        case wire.RealtimeSessionClosed() | wire.NativeSessionClosed():
            return SessionClosed(**common, session_id=event.session_id, reason=event.reason)
    return OtherEvent(**common)


def _alignment(obj: dict[str, Any], cls: type[Any] | None, common: dict[str, Any]) -> ServerEvent:
    """The hint, read from the JSON itself (so that it does not depend on the protocol package
    having the class); a hint without an int ``pad_ms`` in [0, 80) is an :class:`OtherEvent`."""
    pad, reason = obj.get("pad_ms"), obj.get("reason")
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad < FRAME_MS:
        return OtherEvent(**common)
    if cls is not None:
        try:
            common["wire"] = CONVERTER.structure(obj, cls)
        except Exception:
            pass
    return AlignmentHint(**common, pad_ms=pad, reason=reason if isinstance(reason, str) else "")


def parse_server_event(
    obj: dict[str, Any], *, dialect: DialectName = "realtime", received_at: float = 0.0, seq: int = 0
) -> ServerEvent:
    """The typed event of one decoded server message. Never raises: a message of an unknown
    ``type``, or one that is not a valid event of its class, is an :class:`OtherEvent` with
    ``wire=None``; a malformed ``error`` is still an :class:`Error` (code ``unknown``), so that
    a client never misses that something went wrong."""
    kind = obj.get("type")
    kind = kind if isinstance(kind, str) else ""
    common: dict[str, Any] = {"type": kind, "raw": obj, "received_at": received_at, "seq": seq}
    cls = _CLASSES["native" if dialect == "native" else "realtime"].get(kind)
    if kind == ALIGNMENT_TYPE:
        return _alignment(obj, cls, common)
    if cls is None:
        return OtherEvent(**common)
    try:
        event = CONVERTER.structure(obj, cls)
    except Exception:  # any malformed shape: the contract is to never raise
        if kind == "error":
            return Error(**common, code="unknown", message="", event_id=None)
        return OtherEvent(**common)
    common["wire"] = event
    return _view(event, common)
