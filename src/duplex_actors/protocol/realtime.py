"""Projection of dialect-neutral session events onto the OpenAI Realtime dialect (spec §4).

``RealtimeProjection.project(event)`` returns the JSON objects to send, in order. One response
per epoch::

    ResponseStarted -> response.created, response.output_item.added,
                       conversation.item.added (beta: conversation.item.created),
                       response.content_part.added
    AudioFrame      -> response.output_audio.delta (beta: response.audio.delta)
                       [+ response.output_audio_transcript.delta when the frame has text]
    ResponseEnded   -> [output_audio_buffer.cleared] response.output_audio.done,
                       response.output_audio_transcript.done, response.content_part.done,
                       response.output_item.done, conversation.item.done (GA only: the beta
                       vocabulary has no such event), response.done, rate_limits.updated

``response.done`` always has ``status: "cancelled"``: a lockstep response only ends because
the client cancelled it, cleared the output buffer or closed the session, and
``status_details.reason`` says which (``client_cancelled``, ``output_audio_buffer_clear``,
``session_closed``). OpenAI's ``incomplete`` means the model stopped on a token or content
limit, which never happens here.

Every event gets ``event_id = evt_<session id without sess_>_<n>`` from a counter the
projection keeps, so a replay of the session log reproduces the ids. Transcripts in the done
events are capped at ``MAX_TRANSCRIPT_CHARS`` and error messages at 1024 characters, which keeps
every frame far below 1 MiB.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import Any, Final

from ..audio import FRAME_MS, SAMPLE_RATE
from ..session import events as ev
from ..session.events import MAX_TRANSCRIPT_CHARS
from . import events as wire
from .codec import SERVER_OWNED_SESSION_KEYS
from .errors import ProtocolError, clip, error_type

MAX_CHUNK_FRAMES: Final = 50  # 50 frames = 4 s = ~256 KB of base64 per delta


def error_object(
    code: str, message: str, client_event_id: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The ``error`` member of an ``error`` event (spec §4 error shape)."""
    return {
        "type": error_type(code),
        "code": code,
        "message": clip(message),
        "param": None if param is None else clip(param, 256),
        "event_id": client_event_id,
    }


def refusal_error(
    code: str,
    message: str,
    client_event_id: str | None = None,
    *,
    param: str | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """An ``error`` event sent when no session exists (``resource_exhausted``,
    ``model_not_found``, ``config_timeout``, ...). Nothing replays these, so the default
    ``event_id`` is random rather than derived from a session."""
    return {
        "type": "error",
        "event_id": event_id or "evt_" + secrets.token_hex(12),
        "error": error_object(code, message, client_event_id, param),
    }


class RealtimeProjection:
    """Session events in, Realtime server events (dicts) out; pure and deterministic.

    ``beta``: the client sent ``OpenAI-Beta: realtime=v1``. ``output_chunk_frames`` groups that
    many 80 ms frames per audio delta (1: lowest latency); a partial group is flushed before
    the response's terminal group.
    """

    def __init__(
        self,
        session_id: str,
        model: str,
        capabilities: Mapping[str, Any],
        *,
        beta: bool = False,
        output_chunk_frames: int = 1,
    ) -> None:
        if not 1 <= output_chunk_frames <= MAX_CHUNK_FRAMES:
            raise ValueError(f"output_chunk_frames must be in 1..{MAX_CHUNK_FRAMES}")
        self.session_id = session_id
        self.model = model
        self.capabilities = dict(capabilities)
        self.beta = beta
        self.output_chunk_frames = output_chunk_frames
        self.closed = False
        self._suffix = session_id.removeprefix("sess_")
        self._seq = 0
        self._names = {cls: wire.wire_type(cls, beta=beta) for cls in wire.REALTIME_SERVER_EVENTS}
        self._previous_item_id: str | None = None  # the item before the current response's
        self._pending: list[ev.AudioFrame] = []

    @property
    def events_sent(self) -> int:
        return self._seq

    # -- building blocks -----------------------------------------------------------------------
    def _emit(self, out: list[dict[str, Any]], cls: type[Any], **fields: Any) -> None:
        name = self._names[cls]
        if name is None:
            return
        self._seq += 1
        out.append({"type": name, "event_id": f"evt_{self._suffix}_{self._seq}", **fields})

    def session_object(self, config: Mapping[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.session_id,
            "object": "realtime.session",
            "model": self.model,
            "capabilities": self.capabilities,
        }
        if not self.beta:
            obj["type"] = "realtime"
        obj.update((k, v) for k, v in config.items() if k not in SERVER_OWNED_SESSION_KEYS)
        return obj

    def _item(self, item_id: str, status: str, transcript: str | None) -> dict[str, Any]:
        content = (
            []
            if transcript is None
            else [{"type": "audio" if self.beta else "output_audio", "transcript": transcript}]
        )
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _response(
        self, response_id: str, status: str, reason: str | None, output: list[dict[str, Any]]
    ) -> dict[str, Any]:
        resp: dict[str, Any] = {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": None if reason is None else {"type": "cancelled", "reason": reason},
            "output": output,
        }
        if self.beta:
            resp["modalities"] = ["audio", "text"]
        else:
            resp["output_modalities"] = ["audio"]
        return resp

    def error_event(
        self, code: str, message: str, client_event_id: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        self._emit(out, wire.RealtimeError, error=error_object(code, message, client_event_id, param))
        return out[0]

    def protocol_error(self, exc: ProtocolError) -> dict[str, Any]:
        """An ``error`` event for a refusal the app answers itself (no session record)."""
        return self.error_event(exc.code, exc.message, exc.client_event_id, exc.param)

    def closing_event(self, reason: str) -> dict[str, Any]:
        """``session.closing``: the server is draining; ``session.closed`` follows."""
        out: list[dict[str, Any]] = []
        self._emit(out, wire.RealtimeSessionClosing, session_id=self.session_id, reason=reason)
        return out[0]

    # -- the projection ------------------------------------------------------------------------
    def project(self, event: ev.SessionEvent) -> list[dict[str, Any]]:
        if self.closed:
            return []
        out: list[dict[str, Any]] = []
        match event:
            case ev.SessionCreated():
                self._emit(out, wire.RealtimeSessionCreated, session=self.session_object(event.config))
            case ev.SessionUpdated():
                self._emit(out, wire.RealtimeSessionUpdated, session=self.session_object(event.config))
            case ev.ResponseStarted():
                self._started(event, out)
            case ev.AudioFrame():
                if self._pending and self._pending[0].response_id != event.response_id:
                    self._flush(out)
                self._pending.append(event)
                if len(self._pending) >= self.output_chunk_frames:
                    self._flush(out)
            case ev.ResponseEnded():
                self._flush(out)
                self._ended(event, out)
            case ev.SpeechStarted():
                self._emit(
                    out,
                    wire.RealtimeSpeechStarted,
                    audio_start_ms=event.frame_index * FRAME_MS,
                    item_id=event.item_id,
                )
            case ev.InputCleared():
                self._emit(out, wire.RealtimeInputAudioBufferCleared)
            case ev.OutputCleared():
                self._emit(out, wire.RealtimeOutputAudioBufferCleared, response_id=None)
            case ev.HeartbeatAck():
                self._emit(out, wire.RealtimeHeartbeatAck, client_event_id=event.client_event_id)
            case ev.PlaybackAcknowledged():
                self._emit(
                    out,
                    wire.RealtimePlaybackAcknowledged,
                    client_event_id=event.client_event_id,
                    payload=dict(event.payload),
                )
            case ev.Error():
                out.append(self.error_event(event.code, event.message, event.client_event_id, event.param))
            case ev.SessionClosed():
                self._flush(out)
                self._emit(out, wire.RealtimeSessionClosed, session_id=event.session_id, reason=event.reason)
                self.closed = True
        return out

    def _started(self, event: ev.ResponseStarted, out: list[dict[str, Any]]) -> None:
        rid, item_id = event.response_id, event.item_id
        self._emit(out, wire.RealtimeResponseCreated, response=self._response(rid, "in_progress", None, []))
        item = self._item(item_id, "in_progress", None)
        self._emit(out, wire.RealtimeOutputItemAdded, response_id=rid, output_index=0, item=item)
        self._emit(
            out, wire.RealtimeConversationItemAdded, previous_item_id=self._previous_item_id, item=item
        )
        self._emit(
            out,
            wire.RealtimeContentPartAdded,
            response_id=rid,
            item_id=item_id,
            output_index=0,
            content_index=0,
            part={"type": "audio", "transcript": ""},
        )

    def _flush(self, out: list[dict[str, Any]]) -> None:
        if not self._pending:
            return
        frames, self._pending = self._pending, []
        first = frames[0]
        where = {
            "response_id": first.response_id,
            "item_id": first.item_id,
            "output_index": 0,
            "content_index": 0,
        }
        self._emit(
            out,
            wire.RealtimeOutputAudioDelta,
            **where,
            delta=base64.b64encode(b"".join(f.pcm16 for f in frames)).decode("ascii"),
            sample_rate_hz=SAMPLE_RATE,
            metadata={
                "epoch": first.epoch,
                "frame_index": first.frame_index,
                "audio_duration_ms": FRAME_MS * len(frames),
            },
        )
        text = "".join(f.text for f in frames)
        if text:
            self._emit(out, wire.RealtimeOutputAudioTranscriptDelta, **where, delta=text)

    def _ended(self, event: ev.ResponseEnded, out: list[dict[str, Any]]) -> None:
        rid, item_id = event.response_id, event.item_id
        transcript = event.transcript[:MAX_TRANSCRIPT_CHARS]
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        if event.audio_cleared:
            self._emit(out, wire.RealtimeOutputAudioBufferCleared, response_id=rid)
        self._emit(out, wire.RealtimeOutputAudioDone, **where)
        self._emit(out, wire.RealtimeOutputAudioTranscriptDone, **where, transcript=transcript)
        self._emit(
            out, wire.RealtimeContentPartDone, **where, part={"type": "audio", "transcript": transcript}
        )
        item = self._item(item_id, "incomplete", transcript)
        self._emit(out, wire.RealtimeOutputItemDone, response_id=rid, output_index=0, item=item)
        self._emit(out, wire.RealtimeConversationItemDone, previous_item_id=self._previous_item_id, item=item)
        self._emit(
            out, wire.RealtimeResponseDone, response=self._response(rid, "cancelled", event.reason, [item])
        )
        self._emit(out, wire.RealtimeRateLimitsUpdated, rate_limits=[])
        self._previous_item_id = item_id
