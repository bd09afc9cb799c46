"""The JSON WebSocket dialects, Realtime and native, as the connection handler sees them.

A dialect parses a client message into a session command (an async callable on the
``SessionHandle``) and projects session events onto its wire vocabulary. Parsing and projection
are the sans-io ``duplex_actors.protocol`` package; this module only maps client events onto the
in-process session API, and reads what opens a session (:func:`read_opening`). The third
dialect, ``/api/chat`` (binary Opus), has a connection of its own in ``web/api_chat.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio

from .. import close_reasons as reasons
from .. import error_codes
from ..protocol import audio_formats, conversation_items, parsing, session_config
from ..protocol import wire_events as pe
from ..protocol.errors import ProtocolError
from ..server import SessionHandle
from ..session import events as ev
from ..session.core import cancel_resets

Command = Callable[[SessionHandle], Awaitable[None]]
# A WebSocket message as the upgrade (``web/asgi_ws.py``, or quart's) gives and takes it: text
# (JSON) or binary.
WireMessage = str | bytes
# What a projection or a refusal sends: a JSON object (the connection serialises it) or bytes.
OutboundMessage = Mapping[str, Any] | bytes
# How long a dialect that opens on a first message waits for it.
CONFIG_TIMEOUT_S = 10.0


@attrs.frozen(slots=True)
class Opening:
    """What opens a session: its config, a client message still to process once it is open
    (Realtime with ``autostart=0``, when the first message is not a ``session.update``), and
    the client event id the session's first events echo."""

    config: dict[str, Any] = attrs.field(factory=dict)
    pending: WireMessage | None = None
    client_event_id: str | None = None
    resume: bool = False  # the session is resumable (docs/protocol.md §10)


class Projection(Protocol):
    """One session's events in a dialect's vocabulary (``protocol.realtime``/``protocol.native``)."""

    def project(self, event: ev.SessionEvent) -> Sequence[OutboundMessage]: ...

    def closing_event(self, reason: str) -> OutboundMessage | None:
        """What the client is told before a server drain closes its session (None: nothing)."""
        ...


class Dialect(Protocol):
    """A WebSocket dialect as the connection handler sees it (:class:`RealtimeDialect`,
    :class:`NativeDialect`)."""

    @property
    def name(self) -> str:
        """Recorded in the session log's header."""
        ...

    @property
    def output(self) -> Mapping[str, Any]:
        """The output options recorded in the header (names, binary output)."""
        ...

    def projection(self, session_id: str) -> Projection: ...

    def refusal(self, code: str, message: str, client_event_id: str | None = None) -> OutboundMessage:
        """The error sent before the connection is closed without a session."""
        ...

    def parse(self, data: WireMessage, config: Mapping[str, Any]) -> Command:
        """The session command for one client message; raises ProtocolError."""
        ...

    @property
    def opens_on_first_message(self) -> bool:
        """True: the session opens only once the first client message is read."""
        ...

    @property
    def first_message_timeout_message(self) -> str:
        """The ``config_timeout`` error's message when no first message arrives in time."""
        ...

    def first_message(self, data: WireMessage) -> Opening:
        """The opening a first message asks for; raises ProtocolError to refuse it."""
        ...


async def read_opening(dialect: Dialect, receive: Callable[[], Awaitable[WireMessage]]) -> Opening:
    """Read the first message if the dialect opens on one (at most ``CONFIG_TIMEOUT_S``) and
    return what it opens; raises ProtocolError (``config_timeout``, or the dialect's refusal of
    the message), which the caller sends before closing with 1008."""
    if not dialect.opens_on_first_message:
        return Opening()
    with trio.move_on_after(CONFIG_TIMEOUT_S):
        return dialect.first_message(await receive())
    raise ProtocolError(error_codes.CONFIG_TIMEOUT, dialect.first_message_timeout_message)


# The header that carries a resume token in the handshake form of a resume (never the URL).
RESUME_TOKEN_HEADER = "x-duplex-resume-token"


async def read_resume(dialect: Dialect, receive: Callable[[], Awaitable[WireMessage]]) -> pe.SessionResume:
    """The first message of a resuming connection, which must be ``session.resume`` (at most
    ``CONFIG_TIMEOUT_S``); raises ProtocolError, which the caller sends before closing 1008."""
    with trio.move_on_after(CONFIG_TIMEOUT_S):
        data = await receive()
        if not isinstance(data, str):
            raise ProtocolError(
                error_codes.INVALID_SESSION_RESUME, "the first message must be session.resume"
            )
        event = parsing.parse_client_text(data, dialect="native" if dialect.name == "native" else "realtime")
        if not isinstance(event, pe.SessionResume):
            raise ProtocolError(
                error_codes.INVALID_SESSION_RESUME,
                f"the first message of a resuming connection must be session.resume, got {event.TYPE}",
                client_event_id=event.event_id,
            )
        return event
    raise ProtocolError(error_codes.CONFIG_TIMEOUT, f"send session.resume within {CONFIG_TIMEOUT_S:.0f} s")


@attrs.frozen(slots=True)
class AppendCommand:
    """The command of an append: the connection queues it without a wait when it can
    (``SessionHandle.append_bytes_nowait``), else awaits it like any command."""

    audio: bytes
    format: str
    sample_rate_hz: int
    client_event_id: str | None = None
    pad_ms: int = 0  # docs/protocol.md §7: silence before this audio, a pad record before the append
    samples_start: int | None = None  # docs/protocol.md §10: a resumed client's re-sent input

    async def __call__(self, session: SessionHandle) -> None:
        audio = self.audio
        if self.samples_start is not None:
            trimmed = await session.trim_resent(
                self.audio, self.format, self.samples_start, self.client_event_id
            )
            if trimmed is None:
                return  # the session holds all of it already
            audio = trimmed
        await session.append_bytes(
            audio,
            self.format,
            client_event_id=self.client_event_id,
            sample_rate_hz=self.sample_rate_hz,
            pad_ms=self.pad_ms,
        )

    def nowait(self, session: SessionHandle, now: float | None = None) -> bool:
        """``now``: the trio clock at the message's arrival, when the caller read it."""
        if self.pad_ms or self.samples_start is not None:
            return False  # two records in order, or a trim against the applied input: awaited
        return session.append_bytes_nowait(
            self.audio,
            self.format,
            client_event_id=self.client_event_id,
            sample_rate_hz=self.sample_rate_hz,
            now=now,
        )


def _command(event: Any, config: Mapping[str, Any], *, stock: bool = False) -> Command:
    """The session call for one parsed client event (Realtime and native share the commands).
    ``stock``: the stock ``/v1/realtime`` route, whose cancel and output clear keep the model's
    context unless the session asks otherwise (``duplex.cancel``), and whose ``response.create``
    is answered as OpenAI answers one during a response."""
    eid = event.event_id
    if isinstance(event, pe.InputAudioBufferAppend):
        audio, fmt, rate = audio_formats.decode_append(event, config)
        return AppendCommand(
            audio,
            fmt,
            rate,
            eid,
            audio_formats.append_pad_ms(event),
            audio_formats.append_samples_start(event),
        )
    if isinstance(event, pe.SessionUpdate):
        cfg = session_config.normalize_session_config(event.session, client_event_id=eid)
        return lambda s: s.update(cfg, client_event_id=eid)
    if isinstance(event, pe.InputAudioBufferClear):
        return lambda s: s.clear_input(client_event_id=eid)
    if isinstance(event, pe.ResponseCancel):
        reset = cancel_resets(config, not stock)
        return lambda s: s.cancel(client_event_id=eid, reset=reset)
    if isinstance(event, pe.OutputAudioBufferClear):
        reset = cancel_resets(config, not stock)
        return lambda s: s.clear_output(client_event_id=eid, reset=reset)
    if isinstance(event, pe.ConversationItemTruncate):
        truncated, index, end_ms = event.item_id, event.content_index, event.audio_end_ms
        if index < 0 or end_ms < 0:
            raise ProtocolError(
                error_codes.INVALID_VALUE,
                "content_index and audio_end_ms must not be negative",
                event_type=event.TYPE,
                client_event_id=eid,
            )
        return lambda s: s.truncate(truncated, index, end_ms, client_event_id=eid)
    if isinstance(event, pe.ConversationItemCreate):
        role, text, item_id = conversation_items.text_item(event)
        return lambda s: s.add_text_item(role, text, item_id=item_id, client_event_id=eid)
    if isinstance(event, pe.ConversationItemRetrieve):
        retrieved = event.item_id
        return lambda s: s.retrieve_item(retrieved, client_event_id=eid)
    if isinstance(event, pe.SessionHeartbeat):
        return HeartbeatCommand(eid)
    if isinstance(event, pe.PlaybackAck):
        payload = dict(event.payload)
        return lambda s: s.playback_ack(payload, client_event_id=eid)
    if isinstance(event, pe.SessionClose):
        return lambda s: s.close(reasons.CLIENT_CLOSE)
    if isinstance(event, pe.SessionEventAck):
        return EventAckCommand(event.server_event_seq, eid)
    if isinstance(event, pe.SessionResume):
        raise ProtocolError(
            error_codes.UNSUPPORTED_SESSION_RESUME,
            "session.resume is only valid as the first message of a connection whose URL names "
            "the session (?session_id=...)",
            event_type=event.TYPE,
            client_event_id=eid,
        )
    if isinstance(event, pe.InputAudioBufferCommit):
        return lambda s: _refuse_commit(s, eid)
    if isinstance(event, pe.ResponseCreate) and stock:
        raise ProtocolError(
            error_codes.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
            "the model is always responding (a lockstep duplex model): there is an active response "
            "already, and its audio goes on frame by frame",
            event_type=event.TYPE,
            client_event_id=eid,
        )
    if isinstance(event, pe.ResponseCreate):
        raise ProtocolError(
            error_codes.RESPONSE_CREATE_UNSUPPORTED,
            "response.create is meaningless for a lockstep duplex model: it always responds",
            event_type=event.TYPE,
            client_event_id=eid,
        )
    if isinstance(event, pe.SessionCreate):
        raise ProtocolError(
            error_codes.BAD_EVENT,
            "session.create is only valid as the first message",
            event_type=event.TYPE,
            client_event_id=eid,
        )
    raise ProtocolError(
        error_codes.UNKNOWN_EVENT, f"unhandled event {type(event).__name__}", client_event_id=eid
    )


@attrs.frozen(slots=True)
class EventAckCommand:
    """``session.event_ack``: a resumable session's connection trims its journal with it
    (``web/resumable.py``); for any other session it changes nothing and is not logged."""

    server_event_seq: int
    client_event_id: str | None = None

    async def __call__(self, session: SessionHandle) -> None:
        pass


@attrs.frozen(slots=True)
class HeartbeatCommand:
    """``session.heartbeat`` (a resumable session's connection also takes it as proof that the
    client holds its latest resume token)."""

    client_event_id: str | None = None

    async def __call__(self, session: SessionHandle) -> None:
        await session.heartbeat(client_event_id=self.client_event_id)


async def _refuse_commit(session: SessionHandle, client_event_id: str | None) -> None:
    """Upstream's ``input_audio_buffer_empty`` when no input is waiting (partial frame or frames
    not yet stepped), else ``commit_unsupported``; the code is in the log's rejected record, so
    a replay reproduces it. Decided once the appends before it are applied (the fast path
    queues them without waiting for the session)."""
    await session.wait_handled()
    if session.core.buffered_samples == 0:
        code = error_codes.INPUT_AUDIO_BUFFER_EMPTY
        message = "input_audio_buffer.commit: the input audio buffer is empty"
    else:
        code = error_codes.COMMIT_UNSUPPORTED
        message = (
            "input_audio_buffer.commit is meaningless for a lockstep duplex model: audio is "
            "consumed frame by frame as it arrives"
        )
    await session.reject(pe.InputAudioBufferCommit.TYPE, code, message, client_event_id)


class RealtimeDialect:
    """OpenAI Realtime projection (GA names, or beta names for ``OpenAI-Beta: realtime=v1``)."""

    name = "realtime"

    def __init__(
        self,
        *,
        model: str,
        capabilities: dict[str, Any],
        beta: bool,
        autostart: bool = True,
        duplex: bool = False,
        max_message_bytes: int = parsing.MAX_MESSAGE_BYTES,
    ) -> None:
        from ..protocol.realtime import RealtimeProjection, refusal_error

        # ``?autostart=0``: the session opens on the first message (a session.update configures it).
        self.opens_on_first_message = not autostart
        self.first_message_timeout_message = f"no message within {CONFIG_TIMEOUT_S:.0f} s"
        self.max_message_bytes = max_message_bytes
        self.model = model
        self.capabilities = capabilities
        self.beta = beta
        # ``?duplex=1``: vLLM-Omni's additions (docs/protocol.md §8); recorded in the header only when asked.
        self.duplex = duplex
        self.output: dict[str, Any] = {"names": "beta" if beta else "ga"}
        if duplex:
            self.output["duplex"] = True
        self._projection = RealtimeProjection
        self._refusal = refusal_error

    def projection(self, session_id: str) -> Projection:
        return self._projection(session_id, self.model, self.capabilities, beta=self.beta, duplex=self.duplex)

    def refusal(self, code: str, message: str, client_event_id: str | None = None) -> OutboundMessage:
        return self._refusal(code, message, client_event_id)

    def parse(self, data: WireMessage, config: Mapping[str, Any]) -> Command:
        if not isinstance(data, str):
            raise ProtocolError(
                error_codes.BAD_EVENT, "binary messages are not part of the Realtime dialect; send JSON text"
            )
        return _command(
            parsing.parse_client_text(data, dialect="realtime", max_message_bytes=self.max_message_bytes),
            config,
            stock=not self.duplex,
        )

    def first_message(self, data: WireMessage) -> Opening:
        """With ``autostart=0``: a ``session.update`` opens the session with its config; any
        other first message opens a default session and is then processed normally."""
        if isinstance(data, str):
            try:
                event = parsing.parse_client_text(
                    data, dialect="realtime", max_message_bytes=self.max_message_bytes
                )
            except ProtocolError:
                return Opening(pending=data)
            if isinstance(event, pe.SessionUpdate):
                try:
                    cfg = session_config.normalize_session_config(
                        event.session, client_event_id=event.event_id
                    )
                except ProtocolError:
                    return Opening(pending=data)
                return Opening(cfg, None, event.event_id, resume=self.duplex and _asks_resume(cfg))
        return Opening(pending=data)


def _asks_resume(cfg: Mapping[str, Any]) -> bool:
    """Whether an opening config has ``duplex.resume: true``."""
    duplex = cfg.get("duplex")
    return isinstance(duplex, Mapping) and duplex.get("resume") is True


def _pcm16_output_only(cfg: Mapping[str, Any], *, client_event_id: str | None = None) -> None:
    """The native dialect sends raw pcm16 at 24 kHz (binary or base64); G.711 output is a
    Realtime option, so asking for it here is refused rather than silently ignored."""
    fmt = cfg.get("output_audio_format")
    if fmt is not None and fmt != "pcm16":
        raise ProtocolError(
            error_codes.UNSUPPORTED_AUDIO_FORMAT,
            f"/v1/duplex sends pcm16 at 24000 Hz only; {fmt} output is offered on /v1/realtime",
            param="session.output_audio_format",
            client_event_id=client_event_id,
        )


class NativeDialect:
    """``/v1/duplex``: flat events, binary audio both ways (``binary_output``)."""

    name = "native"
    opens_on_first_message = True
    first_message_timeout_message = f"send session.create within {CONFIG_TIMEOUT_S:.0f} s"

    def __init__(
        self, *, capabilities: dict[str, Any], max_message_bytes: int = parsing.MAX_MESSAGE_BYTES
    ) -> None:
        self.capabilities = capabilities
        self.max_message_bytes = max_message_bytes
        self.binary_output = False
        self.output: dict[str, Any] = {"binary_output": False}
        self._format_of: tuple[Mapping[str, Any] | None, tuple[str, int]] = (None, ("", 0))

    def projection(self, session_id: str) -> Projection:
        from ..protocol.native import NativeProjection

        return NativeProjection(session_id, binary_output=self.binary_output, capabilities=self.capabilities)

    def refusal(self, code: str, message: str, client_event_id: str | None = None) -> OutboundMessage:
        from ..protocol.native import refusal_error

        return refusal_error(code, message, client_event_id)

    def parse(self, data: WireMessage, config: Mapping[str, Any]) -> Command:
        if isinstance(data, bytes | bytearray | None):
            audio = parsing.parse_client_binary(bytes(data or b""), max_message_bytes=self.max_message_bytes)
            # A binary append takes the session's format: resolved once per session config (the
            # core replaces its config object on every change, never edits it).
            if config is not self._format_of[0]:
                fmt_rate = audio_formats.resolve_input_format(pe.InputAudioBufferAppend(audio=""), config)
                self._format_of = (config, fmt_rate)
            fmt, rate = self._format_of[1]
            return AppendCommand(audio, fmt, rate)
        event = parsing.parse_client_text(data, dialect="native", max_message_bytes=self.max_message_bytes)
        if isinstance(event, pe.SessionUpdate):
            _pcm16_output_only(
                session_config.normalize_session_config(event.session, client_event_id=event.event_id)
            )
        return _command(event, config)

    def first_message(self, data: WireMessage) -> Opening:
        """The first message must be ``session.create``; raises ProtocolError otherwise."""
        if not isinstance(data, str):
            raise ProtocolError(error_codes.BAD_EVENT, "the first message must be session.create (JSON text)")
        event = parsing.parse_client_text(data, dialect="native", max_message_bytes=self.max_message_bytes)
        if not isinstance(event, pe.SessionCreate):
            raise ProtocolError(
                error_codes.BAD_EVENT,
                f"the first message must be session.create, got {event.TYPE}",
                client_event_id=event.event_id,
            )
        self.binary_output = bool(event.binary_output)
        self.output = {"binary_output": self.binary_output}
        cfg = session_config.normalize_session_config(
            event.session, client_event_id=event.event_id, event_type=event.TYPE
        )
        _pcm16_output_only(cfg, client_event_id=event.event_id)
        return Opening(cfg, None, event.event_id, resume=event.resume or _asks_resume(cfg))
