"""Projection of session events onto the native dialect (``/v1/duplex``, spec §5): flat events.

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
Error                              ``error {error: message, code, client_event_id, param}``
SessionClosed                      ``session.closed {session_id, reason}``
(drain, :meth:`closing_event`)     ``session.closing {session_id, reason}``
=================================  ================================================================

Native events carry no ``event_id``; they are the session's own vocabulary, one per neutral
event, and the client's event id comes back as ``client_event_id`` where there is one. Each is
an instance of its :mod:`.events` class (``Native*``), sent as ``codec.encode_server_event``.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any, Final

from ..session import events as ev
from ..session.events import MAX_TRANSCRIPT_CHARS
from . import events as wire
from .codec import SERVER_OWNED_SESSION_KEYS, encode_server_event, parse_client_binary
from .errors import ProtocolError, clip

__all__ = ["NativeProjection", "binary_frame", "parse_client_binary", "refusal_error", "split_binary_frame"]

_FRAME_INDEX: Final = struct.Struct("<I")
NativeMessage = dict[str, Any] | bytes


def binary_frame(frame_index: int, pcm16: bytes) -> bytes:
    """A binary output message: 4-byte little-endian frame index, then PCM16 LE mono 24 kHz."""
    return _FRAME_INDEX.pack(frame_index & 0xFFFFFFFF) + pcm16


def split_binary_frame(data: bytes) -> tuple[int, bytes]:
    """``(frame_index, pcm16)`` of a binary output message (for clients and tests)."""
    (index,) = _FRAME_INDEX.unpack_from(data)
    return index, data[_FRAME_INDEX.size :]


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
                created = wire.NativeSessionCreated(event.session_id, self.session_object(event.config))
                return [encode_server_event(created)]
            case ev.SessionUpdated():
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
                audio=base64.b64encode(frame.pcm16).decode("ascii"),
                text=frame.text,
            )
            return [encode_server_event(delta)]
        out: list[NativeMessage] = [binary_frame(frame.frame_index, frame.pcm16)]
        if frame.text:
            text = wire.NativeOutputTranscriptDelta(
                frame.response_id, frame.epoch, frame.frame_index, frame.text
            )
            out.append(encode_server_event(text))
        return out
