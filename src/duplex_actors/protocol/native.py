"""Projection of session events onto the native dialect (``/v1/duplex``, docs/protocol.md §5): flat events.

=================================  ================================================================
session event                      native server event(s)
=================================  ================================================================
SessionCreated / SessionUpdated    ``session.created`` / ``session.updated {session_id, session}``
ResponseStarted                    ``response.created {response_id, epoch}``
AudioFrame                         ``response.output_audio.delta {response_id, epoch, frame_index,
                                   audio, text}``; with ``binary_output`` a binary message
                                   (``u32 LE frame_index | PCM16``) followed, when the frame has
                                   text, by ``response.output_audio_transcript.delta
                                   {response_id, epoch, frame_index, text}``
ResponseEnded                      [``output_audio_buffer.cleared {response_id, client_event_id}``]
                                   ``response.done {response_id, epoch, status: "cancelled",
                                   reason, transcript, frames}``
SpeechStarted                      ``input_audio_buffer.speech_started {epoch, frame_index, item_id}``
InputCleared                       ``input_audio_buffer.cleared {client_event_id}``
OutputCleared                      ``output_audio_buffer.cleared {response_id: null, client_event_id}``
HeartbeatAck                       ``session.heartbeat_ack {client_event_id}``
PlaybackAcknowledged               ``playback.acknowledged {client_event_id, payload}``
AlignmentHint                      ``input_audio_buffer.alignment {pad_ms, reason}`` (sessions with
                                   ``duplex.alignment: client`` only; their binary frames also
                                   carry ``input_samples_end``: ``u32 index | u32 end | PCM16``)
Error                              ``error {error: message, code, client_event_id, param}``
SessionClosed                      ``session.closed {session_id, reason}``
(drain, :meth:`closing_event`)     ``session.closing {session_id, reason}``
=================================  ================================================================

Native events carry no ``event_id``; they are the session's own vocabulary, one per neutral
event, and the client's event id comes back as ``client_event_id`` where there is one. Each is
an instance of its :mod:`.wire_events` class (``Native*``), sent as ``converter.encode_server_event``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final, Literal, cast

import pybase64

from ..session import events as ev
from ..session.events import MAX_TRANSCRIPT_CHARS, alignment_mode
from . import wire_events as wire
from .converter import encode_server_event
from .errors import ProtocolError, clip
from .parsing import parse_client_binary
from .session_config import SERVER_OWNED_SESSION_KEYS

__all__ = ["NativeProjection", "binary_frame", "parse_client_binary", "refusal_error", "split_binary_frame"]

_FRAME_INDEX: Final = struct.Struct("<I")
_FRAME_POSITION: Final = struct.Struct("<II")
_FRAME_BYTES: Final = 3840  # one 80 ms frame of PCM16 at 24 kHz: every binary message holds one
NativeMessage = dict[str, Any] | bytes


def binary_frame(frame_index: int, pcm16: bytes, input_samples_end: int | None = None) -> bytes:
    """A binary output message: 4-byte little-endian frame index, then PCM16 LE mono 24 kHz.
    With ``input_samples_end`` (sessions with ``duplex.alignment: client`` only, so stock
    clients keep the 4-byte header) a second u32 LE, the frame's ``input_samples_end``."""
    if input_samples_end is None:
        return _FRAME_INDEX.pack(frame_index & 0xFFFFFFFF) + pcm16
    return _FRAME_POSITION.pack(frame_index & 0xFFFFFFFF, input_samples_end & 0xFFFFFFFF) + pcm16


def split_binary_frame_position(data: bytes) -> tuple[int, int | None, bytes]:
    """``(frame_index, input_samples_end or None, pcm16)`` of a binary output message: the
    header is 8 bytes when the PCM16 after 4 would not be whole 80 ms frames."""
    if (len(data) - _FRAME_INDEX.size) % _FRAME_BYTES and not (
        len(data) - _FRAME_POSITION.size
    ) % _FRAME_BYTES:
        index, position = _FRAME_POSITION.unpack_from(data)
        return index, position, data[_FRAME_POSITION.size :]
    (index,) = _FRAME_INDEX.unpack_from(data)
    return index, None, data[_FRAME_INDEX.size :]


def split_binary_frame(data: bytes) -> tuple[int, bytes]:
    """``(frame_index, pcm16)`` of a binary output message (for clients and tests)."""
    index, _, pcm16 = split_binary_frame_position(data)
    return index, pcm16


def refusal_error(
    code: str, message: str, client_event_id: str | None = None, *, param: str | None = None
) -> dict[str, Any]:
    """A native ``error`` event (also used when no session exists)."""
    event = wire.NativeError(
        error=clip(message),
        code=code,
        client_event_id=client_event_id,
        param=None if param is None else clip(param, 256),
    )
    return encode_server_event(event)


class NativeProjection:
    """Session events in, native messages (dicts, or bytes for binary audio) out."""

    def __init__(
        self,
        session_id: str,
        *,
        binary_output: bool = False,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.binary_output = binary_output
        self.capabilities = None if capabilities is None else dict(capabilities)
        self.closed = False
        self._alignment = "server"  # the session's duplex.alignment: hints go to "client" only

    def session_object(self, config: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = {} if self.capabilities is None else {"capabilities": self.capabilities}
        obj.update((k, v) for k, v in config.items() if k not in SERVER_OWNED_SESSION_KEYS)
        return obj

    def protocol_error(self, exc: ProtocolError) -> dict[str, Any]:
        return refusal_error(exc.code, exc.message, exc.client_event_id, param=exc.param)

    def closing_event(self, reason: str) -> dict[str, Any]:
        return encode_server_event(wire.NativeSessionClosing(self.session_id, reason))

    def project(self, event: ev.SessionEvent) -> list[NativeMessage]:
        if self.closed:
            return []
        match event:
            case ev.AudioFrame():  # first: the per-frame path
                return self._audio(event)
            case ev.SessionCreated():
                self._alignment = alignment_mode(event.config)
                created = wire.NativeSessionCreated(event.session_id, self.session_object(event.config))
                return [encode_server_event(created)]
            case ev.SessionUpdated():
                self._alignment = alignment_mode(event.config)
                updated = wire.NativeSessionUpdated(event.session_id, self.session_object(event.config))
                return [encode_server_event(updated)]
            case ev.ResponseStarted():
                return [encode_server_event(wire.NativeResponseCreated(event.response_id, event.epoch))]
            case ev.ResponseEnded():
                out: list[NativeMessage] = []
                if event.audio_cleared:
                    out.append(encode_server_event(wire.NativeOutputCleared(event.response_id, None)))
                done = wire.NativeResponseDone(
                    response_id=event.response_id,
                    epoch=event.epoch,
                    status="cancelled",
                    reason=event.reason,
                    transcript=event.transcript[:MAX_TRANSCRIPT_CHARS],
                    frames=event.frames,
                )
                out.append(encode_server_event(done))
                return out
            case ev.SpeechStarted():
                started = wire.NativeSpeechStarted(event.epoch, event.frame_index, event.item_id)
                return [encode_server_event(started)]
            case ev.InputCleared():
                return [encode_server_event(wire.NativeInputCleared(event.client_event_id))]
            case ev.OutputCleared():
                return [encode_server_event(wire.NativeOutputCleared(None, event.client_event_id))]
            case ev.HeartbeatAck():
                return [encode_server_event(wire.NativeHeartbeatAck(event.client_event_id))]
            case ev.PlaybackAcknowledged():
                ack = wire.NativePlaybackAcknowledged(event.client_event_id, dict(event.payload))
                return [encode_server_event(ack)]
            case ev.Error():
                return [refusal_error(event.code, event.message, event.client_event_id, param=event.param)]
            case ev.AlignmentHint():
                if self._alignment != "client":  # stock clients never get an event they did not ask for
                    return []
                reason = cast(Literal["start", "clear", "drift", "margin"], event.reason)
                return [encode_server_event(wire.NativeInputAudioBufferAlignment(event.pad_ms, reason))]
            case ev.SessionClosed():
                self.closed = True
                return [encode_server_event(wire.NativeSessionClosed(event.session_id, event.reason))]
        return []

    def _audio(self, frame: ev.AudioFrame) -> list[NativeMessage]:
        if not self.binary_output:
            delta = wire.NativeOutputAudioDelta(
                response_id=frame.response_id,
                epoch=frame.epoch,
                frame_index=frame.frame_index,
                audio=pybase64.b64encode(frame.pcm16).decode("ascii"),
                text=frame.text,
                input_samples_end=frame.input_samples_end,
            )
            return [encode_server_event(delta)]
        position = frame.input_samples_end if self._alignment == "client" else None
        out: list[NativeMessage] = [binary_frame(frame.frame_index, frame.pcm16, position)]
        if frame.text:
            text = wire.NativeOutputTranscriptDelta(
                frame.response_id, frame.epoch, frame.frame_index, frame.text
            )
            out.append(encode_server_event(text))
        return out
