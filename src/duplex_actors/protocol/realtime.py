"""Projection of dialect-neutral session events onto the OpenAI Realtime dialect (docs/protocol.md §4).

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
    AlignmentHint   -> input_audio_buffer.alignment (sessions whose duplex.alignment is
                       "client" only: stock clients never get it)

``response.done`` always has ``status: "cancelled"``: a lockstep response only ends because
the client cancelled it, cleared the output buffer or closed the session, and
``status_details.reason`` says which (``client_cancelled``, ``output_audio_buffer_clear``,
``session_closed``). OpenAI's ``incomplete`` means the model stopped on a token or content
limit, which never happens here.

``duplex=True`` (the client connected with ``?duplex=1``, as vLLM-Omni's clients do; docs/protocol.md §8):
every event but ``session.created`` carries ``server_event_seq`` (1, 2, ... counted over what
this projection sends, so a replay of the log reproduces it), each response's first audio delta
is preceded by ``response.speak``, and each delta's ``metadata`` adds ``session_id``,
``model_speak``, ``end_of_turn`` and the ``vllm_omni`` runtime flags.

Without it (the stock ``/v1/realtime``) every event the server sends on its own or in answer to
OpenAI's client events is one that openai-python's server-event types validate: no
``session.closing``, ``session.closed`` only in answer to the client's own ``session.close``,
``response.done`` reasons mapped onto OpenAI's (``output_audio_buffer_clear`` is the client's
cancel, ``client_cancelled``; a response ended by the close has no reason),
``output_audio_buffer.cleared`` always naming a response (the last one; nothing before the
first), and the failed cancel worded as OpenAI words it. ``session.heartbeat_ack``,
``playback.acknowledged`` and ``input_audio_buffer.alignment`` answer the server's own
extensions (``session.heartbeat``, ``playback.ack``, ``duplex.alignment: "client"``), which an
OpenAI client never uses.

The projection builds the :mod:`.wire_events` classes and sends what the one converter makes of
them (``converter.server_event_encoder``: ``type`` first, the beta name for beta clients). Every
event gets ``event_id = evt_<session id without sess_>_<n>`` from a counter the projection
keeps, so a replay of the session log reproduces the ids. Transcripts in the done events are
capped at ``MAX_TRANSCRIPT_CHARS`` and error messages at 1024 characters, which keeps every
frame far below 1 MiB.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final, Literal, cast

import attrs
import pybase64

from .. import close_reasons as reasons
from .. import error_codes
from ..audio import FRAME_MS, OutputStream, canonical_output_format
from ..error_codes import error_type
from ..session import events as ev
from ..session.events import MAX_TRANSCRIPT_CHARS, alignment_mode
from . import wire_events as wire
from .converter import encode_server_event, server_event_encoder
from .errors import ProtocolError, clip
from .session_config import SERVER_OWNED_SESSION_KEYS

MAX_CHUNK_FRAMES: Final = 50  # 50 frames = 4 s = ~256 KB of base64 per delta
# The stock route's response.done reasons: OpenAI's types know client_cancelled (and
# turn_detected, max_output_tokens, content_filter); a close is no reason they define.
_STOCK_REASONS: Final[dict[str, str | None]] = {
    "client_cancelled": "client_cancelled",
    "output_audio_buffer_clear": "client_cancelled",
    "session_closed": None,
}
# OpenAI's words for a cancel with no response (LiveKit's plugin drops errors that start so).
STOCK_CANCEL_NOT_ACTIVE: Final = "Cancellation failed: no active response found"
_VLLM_OMNI_RUNTIME: Final = wire.VllmOmniRuntime("scheduler_data_plane", True, True)
# The events whose ``server_event_seq`` is their last field (nothing flattened after it).
_SEQ_LAST: Final = frozenset(
    cls
    for cls in wire.REALTIME_SERVER_EVENTS
    if attrs.fields(cls)[-1].name == "server_event_seq" and getattr(cls, "FLATTEN", None) is None
)


def error_object(
    code: str, message: str, client_event_id: str | None = None, param: str | None = None
) -> wire.ErrorDetail:
    """The ``error`` member of an ``error`` event (docs/protocol.md §4 error shape)."""
    return wire.ErrorDetail(
        type=error_type(code),
        code=code,
        message=clip(message),
        param=None if param is None else clip(param, 256),
        event_id=client_event_id,
    )


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
    event = wire.RealtimeError(
        event_id=event_id or "evt_" + secrets.token_hex(12),
        error=error_object(code, message, client_event_id, param),
    )
    return encode_server_event(event)


def output_stream(config: Mapping[str, Any], current: OutputStream) -> OutputStream:
    """The session's output converter: ``current`` while the format stays, else a fresh one
    (the config was validated by the codec)."""
    fmt = canonical_output_format(str(config.get("output_audio_format") or "pcm16"))
    return current if fmt == current.format else OutputStream(fmt)


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
        duplex: bool = False,
    ) -> None:
        if not 1 <= output_chunk_frames <= MAX_CHUNK_FRAMES:
            raise ValueError(f"output_chunk_frames must be in 1..{MAX_CHUNK_FRAMES}")
        self.session_id = session_id
        self.model = model
        self.capabilities = dict(capabilities)
        self.beta = beta
        self.output_chunk_frames = output_chunk_frames
        self.duplex = duplex
        self.closed = False
        self._suffix = session_id.removeprefix("sess_")
        self._seq = 0
        self._encoders = {
            cls: server_event_encoder(cls, name)
            for cls in wire.REALTIME_SERVER_EVENTS
            if (name := wire.wire_type(cls, beta=beta)) is not None
        }
        self._content_type: Literal["audio", "output_audio"] = "audio" if beta else "output_audio"
        self._last_item_id: str | None = None  # the conversation's last item (previous_item_id)
        self._previous_item_id: str | None = None  # the item before the current response's
        self._last_response_id: str | None = None
        self._pending: list[ev.AudioFrame] = []
        self._server_event_seq = 0  # duplex: the last server_event_seq sent
        self._spoken: str | None = None  # duplex: the response whose response.speak was sent
        self._output = OutputStream()  # the session's output_audio_format (G.711: resampled, stateful)
        self._alignment = "server"  # the session's duplex.alignment: hints go to "client" only

    @property
    def events_sent(self) -> int:
        return self._seq

    # -- building blocks -----------------------------------------------------------------------
    def _sends(self, cls: type[Any]) -> bool:
        """Whether this vocabulary has the event (beta has no ``conversation.item.done``)."""
        return cls in self._encoders

    def _id(self) -> str:
        self._seq += 1
        return f"evt_{self._suffix}_{self._seq}"

    def _encode(self, event: Any) -> dict[str, Any]:
        # KeyError: an event this vocabulary lacks, built without asking _sends() first.
        cls = type(event)
        encode = self._encoders[cls]
        if self.duplex and cls is not wire.RealtimeSessionCreated:
            self._server_event_seq += 1
            if cls in _SEQ_LAST and event.server_event_seq is None:
                # The seq is the message's last key: set on the message, not by a copy of the event.
                message = encode(event)
                message["server_event_seq"] = self._server_event_seq
                return message
            event = attrs.evolve(event, server_event_seq=self._server_event_seq)
        return encode(event)

    def _emit(self, out: list[dict[str, Any]], event: Any) -> None:
        out.append(self._encode(event))

    def session_object(self, config: Mapping[str, Any]) -> wire.SessionObject:
        extra: dict[str, Any] = {} if self.beta else {"type": "realtime"}
        extra.update((k, v) for k, v in config.items() if k not in SERVER_OWNED_SESSION_KEYS)
        return wire.SessionObject(
            id=self.session_id,
            object="realtime.session",
            model=self.model,
            capabilities=self.capabilities,
            config=extra,
        )

    def _item(
        self, item_id: str, status: Literal["in_progress", "incomplete"], transcript: str | None
    ) -> wire.Item:
        content: list[wire.ItemContent | wire.TextContent] = (
            [] if transcript is None else [wire.ItemContent(self._content_type, transcript)]
        )
        return wire.Item(item_id, "realtime.item", "message", "assistant", status, content)

    def _text_item(self, event: ev.TextItemAdded) -> wire.Item:
        # OpenAI's Realtime items have no developer role: a developer text is a system message.
        role: Literal["assistant", "user", "system"] = (
            "assistant" if event.role == "assistant" else "user" if event.role == "user" else "system"
        )
        part = wire.TextContent("output_text" if role == "assistant" else "input_text", event.text)
        return wire.Item(event.item_id, "realtime.item", "message", role, "completed", [part])

    def _response(
        self,
        response_id: str,
        status: Literal["in_progress", "cancelled"],
        details: wire.StatusDetails | None,
        output: list[wire.Item],
    ) -> wire.Response:
        if self.beta:
            return wire.Response(
                response_id, "realtime.response", status, details, output, modalities=["audio", "text"]
            )
        return wire.Response(
            response_id, "realtime.response", status, details, output, output_modalities=["audio"]
        )

    def error_event(
        self, code: str, message: str, client_event_id: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        return self._encode(
            wire.RealtimeError(self._id(), error_object(code, message, client_event_id, param))
        )

    def protocol_error(self, exc: ProtocolError) -> dict[str, Any]:
        """An ``error`` event for a refusal the app answers itself (no session record)."""
        return self.error_event(exc.code, exc.message, exc.client_event_id, exc.param)

    def closing_event(self, reason: str) -> dict[str, Any] | None:
        """``session.closing``: the server is draining; ``session.closed`` follows. None on the
        stock route (no such OpenAI event: the close code says it)."""
        if not self.duplex:
            return None
        return self._encode(wire.RealtimeSessionClosing(self._id(), self.session_id, reason))

    # -- the projection ------------------------------------------------------------------------
    def project(self, event: ev.SessionEvent) -> list[dict[str, Any]]:
        if self.closed:
            return []
        out: list[dict[str, Any]] = []
        match event:
            case ev.AudioFrame():  # first: the per-frame path
                if self._pending and self._pending[0].response_id != event.response_id:
                    self._flush(out)
                self._pending.append(event)
                if len(self._pending) >= self.output_chunk_frames:
                    self._flush(out)
            case ev.SessionCreated():
                self._output = output_stream(event.config, self._output)
                self._alignment = alignment_mode(event.config)
                self._emit(out, wire.RealtimeSessionCreated(self._id(), self.session_object(event.config)))
            case ev.SessionUpdated():
                self._output = output_stream(event.config, self._output)
                self._alignment = alignment_mode(event.config)
                self._emit(out, wire.RealtimeSessionUpdated(self._id(), self.session_object(event.config)))
            case ev.AlignmentHint():
                if self._alignment == "client":  # stock clients never get an event they did not ask for
                    reason = cast(Literal["start", "clear", "drift", "margin"], event.reason)
                    self._emit(out, wire.RealtimeInputAudioBufferAlignment(self._id(), event.pad_ms, reason))
            case ev.ResponseStarted():
                self._started(event, out)
            case ev.ResponseEnded():
                self._flush(out)
                self._ended(event, out)
            case ev.SpeechStarted():
                self._emit(
                    out, wire.RealtimeSpeechStarted(self._id(), event.frame_index * FRAME_MS, event.item_id)
                )
            case ev.InputCleared():
                self._emit(out, wire.RealtimeInputAudioBufferCleared(self._id()))
            case ev.OutputCleared():
                if self.duplex:
                    self._emit(out, wire.RealtimeOutputAudioBufferCleared(self._id(), response_id=None))
                elif self._last_response_id is not None:  # OpenAI's names a response
                    self._emit(out, wire.RealtimeOutputAudioBufferCleared(self._id(), self._last_response_id))
            case ev.ItemTruncated():
                self._emit(
                    out,
                    wire.RealtimeConversationItemTruncated(
                        self._id(), event.item_id, event.content_index, event.audio_end_ms
                    ),
                )
            case ev.ItemRetrieved():
                if event.audio:
                    status: Literal["in_progress", "incomplete"] = (
                        "incomplete" if event.done else "in_progress"
                    )
                    item = self._item(event.item_id, status, event.text[:MAX_TRANSCRIPT_CHARS])
                else:
                    item = self._text_item(ev.TextItemAdded(event.item_id, event.role, event.text, False))
                self._emit(out, wire.RealtimeConversationItemRetrieved(self._id(), item))
            case ev.TextItemAdded():
                item = self._text_item(event)
                previous, self._last_item_id = self._last_item_id, event.item_id
                self._emit(out, wire.RealtimeConversationItemAdded(self._id(), previous, item))
                if self._sends(wire.RealtimeConversationItemDone):
                    self._emit(out, wire.RealtimeConversationItemDone(self._id(), previous, item))
            case ev.HeartbeatAck():
                self._emit(out, wire.RealtimeHeartbeatAck(self._id(), event.client_event_id))
            case ev.PlaybackAcknowledged():
                self._emit(
                    out,
                    wire.RealtimePlaybackAcknowledged(self._id(), event.client_event_id, dict(event.payload)),
                )
            case ev.Error():
                message = event.message
                if not self.duplex and event.code == error_codes.RESPONSE_CANCEL_NOT_ACTIVE:
                    message = STOCK_CANCEL_NOT_ACTIVE
                out.append(self.error_event(event.code, message, event.client_event_id, event.param))
            case ev.SessionClosed():
                self._flush(out)
                if self.duplex or event.reason == reasons.CLIENT_CLOSE:
                    self._emit(out, wire.RealtimeSessionClosed(self._id(), event.session_id, event.reason))
                self.closed = True
        return out

    def _started(self, event: ev.ResponseStarted, out: list[dict[str, Any]]) -> None:
        rid, item_id = event.response_id, event.item_id
        self._previous_item_id, self._last_item_id = self._last_item_id, item_id
        self._last_response_id = rid
        self._emit(
            out, wire.RealtimeResponseCreated(self._id(), self._response(rid, "in_progress", None, []))
        )
        item = self._item(item_id, "in_progress", None)
        self._emit(out, wire.RealtimeOutputItemAdded(self._id(), rid, 0, item))
        self._emit(out, wire.RealtimeConversationItemAdded(self._id(), self._previous_item_id, item))
        part = wire.ContentPart("audio", "")
        self._emit(out, wire.RealtimeContentPartAdded(self._id(), rid, item_id, 0, 0, part))

    def _flush(self, out: list[dict[str, Any]]) -> None:
        if not self._pending:
            return
        frames, self._pending = self._pending, []
        first = frames[0]
        rid, item_id = first.response_id, first.item_id
        pcm = first.pcm16 if len(frames) == 1 else b"".join(f.pcm16 for f in frames)
        if self.duplex:
            metadata = wire.AudioMetadata(
                first.epoch,
                first.frame_index,
                FRAME_MS * len(frames),
                session_id=self.session_id,
                model_speak=True,
                end_of_turn=False,
                vllm_omni=_VLLM_OMNI_RUNTIME,
                input_samples_end=frames[-1].input_samples_end,
            )
            if self._spoken != rid:
                self._spoken = rid
                speak = wire.SpeakMetadata(self.session_id, first.epoch, True)
                self._emit(out, wire.RealtimeResponseSpeak(self._id(), rid, item_id, 0, 0, speak))
        else:
            metadata = wire.AudioMetadata(
                first.epoch,
                first.frame_index,
                FRAME_MS * len(frames),
                input_samples_end=frames[-1].input_samples_end,
            )
        self._emit(
            out,
            wire.RealtimeOutputAudioDelta(
                self._id(),
                rid,
                item_id,
                0,
                0,
                delta=pybase64.b64encode(self._output.encode(pcm)).decode("ascii"),
                sample_rate_hz=self._output.rate,
                metadata=metadata,
                format=self._output.format,
            ),
        )
        text = "".join(f.text for f in frames)
        if text:
            self._emit(out, wire.RealtimeOutputAudioTranscriptDelta(self._id(), rid, item_id, 0, 0, text))

    def _ended(self, event: ev.ResponseEnded, out: list[dict[str, Any]]) -> None:
        rid, item_id = event.response_id, event.item_id
        transcript = event.transcript[:MAX_TRANSCRIPT_CHARS]
        if event.audio_cleared:
            self._emit(out, wire.RealtimeOutputAudioBufferCleared(self._id(), rid))
        self._emit(out, wire.RealtimeOutputAudioDone(self._id(), rid, item_id, 0, 0))
        self._emit(out, wire.RealtimeOutputAudioTranscriptDone(self._id(), rid, item_id, 0, 0, transcript))
        part = wire.ContentPart("audio", transcript)
        self._emit(out, wire.RealtimeContentPartDone(self._id(), rid, item_id, 0, 0, part))
        item = self._item(item_id, "incomplete", transcript)
        self._emit(out, wire.RealtimeOutputItemDone(self._id(), rid, 0, item))
        if self._sends(wire.RealtimeConversationItemDone):
            self._emit(out, wire.RealtimeConversationItemDone(self._id(), self._previous_item_id, item))
        reason = event.reason if self.duplex else _STOCK_REASONS.get(event.reason, "client_cancelled")
        response = self._response(rid, "cancelled", wire.StatusDetails("cancelled", reason), [item])
        self._emit(out, wire.RealtimeResponseDone(self._id(), response))
        self._emit(out, wire.RealtimeRateLimitsUpdated(self._id(), rate_limits=[]))
