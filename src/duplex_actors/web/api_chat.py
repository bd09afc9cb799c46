"""``WS /api/chat``, the moshi / PersonaPlex dialect (docs/protocol.md §9), as a shell over the session.

The sans-io part (kinds, query, projection) is :mod:`duplex_actors.protocol.api_chat`; this
module adds what needs I/O: the Opus codec (a stream of the server's worker-process pool, never
on the event loop), the handshake once the slot's prompt is prefilled, the keep-alive ping, and
the refusals.

Life of a connection: the query is parsed and validated against the model family before the
session opens (a bad value: ``0x05`` + 1008, no session, no log); admission (busy: ``0x05
"server busy"`` + 1013); the session opens; once its slot's reset (prompt prefill) is applied the
handshake ``0x00`` goes out. Audio read before that is dropped (moshi.client streams at once;
replaying that backlog as a burst is what upstream moshi does wrong). Each inbound ``0x01`` is
decoded as it arrives and its samples appended to the session; every output frame is encoded and
sent as one ``0x01``, followed by the frame's ``0x02`` text piece. Client kinds other than audio
are ignored. Undecodable audio: ``0x05`` + 1007. A crashed codec worker: ``0x05`` + 1011.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import trio

from .. import close_reasons as reasons
from .. import error_codes
from ..audio import float_to_pcm16
from ..model.engine import EngineFamily
from ..opus.pool import OpusStream
from ..protocol import api_chat as wire
from ..protocol.errors import ProtocolError
from ..server import DuplexServer
from ..session import events as ev
from .connection import Connection, Transport
from .dialects import Command, Opening, OutboundMessage, WireMessage

log = logging.getLogger(__name__)

# Inbound audio goes to the codec in slices of at most this many bytes (see handle_message).
DECODE_SLICE_BYTES = 2048
# How long the handshake may wait for the slot's prompt prefill before the session ends (1011),
# unless the server sets its own (``prepare_timeout_s``: ``--prepare-timeout``, or derived from the
# prefill time measured at start-up, app.py).
PREPARE_TIMEOUT_S = 30.0


def _codec_errors() -> tuple[type[BaseException], type[BaseException]]:
    from ..opus.codec import OpusUndecodable
    from ..opus.pool import CodecWorkerLost

    return OpusUndecodable, CodecWorkerLost


class ApiChatDialect:
    """The dialect as the connection handler sees it (``web.dialects.Dialect``)."""

    name = "api_chat"
    opens_on_first_message = False
    first_message_timeout_message = ""

    def __init__(self, args: Mapping[str, str]) -> None:
        self.args = args
        self.query: wire.ChatQuery | None = None
        self.output: dict[str, Any] = {"audio": "ogg_opus"}

    def opening(self, family: EngineFamily, *, client_sampling: bool) -> Opening:
        """Parse and validate the query (raises ProtocolError: the caller refuses with 1008)."""
        query = wire.parse_query(self.args)
        self.query = query
        self.output = {"audio": "ogg_opus", "handshake": query.handshake}
        config = wire.session_config(query, prompts=family.name != "moshi", client_sampling=client_sampling)
        sampling = {k: v for k, v in config.items() if k not in ("voice", "instructions")}
        try:
            prompt = family.session_prompt(
                voice=config.get("voice"), persona=config.get("instructions"), sampling=sampling
            )
            family.check_context(prompt)
        except Exception as exc:
            code = getattr(exc, "code", error_codes.INVALID_VALUE)
            message = str(exc)
            if code == error_codes.INVALID_VOICE and family.voices and "bundled voices" not in message:
                message = f"{message}; bundled voices: {', '.join(family.voices)}"
            param = "voice_prompt" if code == error_codes.INVALID_VOICE else None
            raise ProtocolError(code, message, param=param) from None
        return Opening(config)

    def projection(self, session_id: str) -> wire.ApiChatProjection:
        return wire.ApiChatProjection(session_id)

    def refusal(self, code: str, message: str, client_event_id: str | None = None) -> OutboundMessage:
        if code == error_codes.RESOURCE_EXHAUSTED:
            message = f"server busy: {message}"
        return wire.error_message(message)

    def parse(self, data: WireMessage, config: Mapping[str, Any]) -> Command:
        raise ProtocolError(error_codes.BAD_EVENT, "/api/chat messages are handled by its connection")

    def first_message(self, data: WireMessage) -> Opening:
        return Opening()


class ApiChatConnection(Connection):
    def __init__(
        self,
        server: DuplexServer[Any],
        transport: Transport,
        *,
        dialect: ApiChatDialect,
        prepare_timeout_s: float = PREPARE_TIMEOUT_S,
        prepare_timeout_source: str = "the default",
        **settings: Any,  # Connection's: idle_timeout_s, counters, faults, reservation, rate_limits
    ) -> None:
        # its projection yields EncodeAudio too
        super().__init__(server, transport, dialect=dialect, **settings)  # type: ignore[arg-type]

        self.chat = dialect
        self.prepare_timeout_s = prepare_timeout_s
        self.prepare_timeout_source = prepare_timeout_source  # said in the error when it is hit
        self.stream: OpusStream | None = None
        self.ready = False  # the handshake is sent: audio from now on reaches the session
        self._send_lock = trio.Lock()
        self._codec_lost_seen = False
        self._last_sent = trio.current_time()

    async def send_message(self, message: OutboundMessage) -> None:
        async with self._send_lock:
            await super().send_message(message)
            self._last_sent = trio.current_time()

    async def run(self, opening: Opening | None = None) -> None:
        # The stream first: the reader feeds it from the first message (header pages).
        try:
            pool = await self.server.get_opus_pool()  # started on first use
            self.stream = await pool.open_stream()
        except Exception as exc:
            log.error("no Opus stream for an /api/chat connection: %s", exc)
            await self.refuse(error_codes.INTERNAL_ERROR, "the audio codec is unavailable", 1011)
            return
        try:
            await super().run(opening)
        finally:
            if self.stream is not None:
                with trio.CancelScope(shield=True):
                    try:
                        await self.stream.aclose()
                    except Exception:
                        log.exception("closing an Opus stream failed")

    # -- writing ----------------------------------------------------------------------------------
    async def write_events(self, projection: Any) -> None:
        # A drain sends no message of its own: audio, then 1012.
        session = self.session
        assert session is not None
        closed: ev.SessionClosed | None = None
        async for event in session.events():
            if not self.ready and isinstance(event, ev.SessionUpdated):
                # The session's Open is applied, so its slot's reset has been requested.
                await self._handshake()
            for message in projection.project(event):
                if isinstance(message, wire.EncodeAudio):
                    await self._send_audio(message)
                else:
                    await self.send_message(message)
            if isinstance(event, ev.SessionClosed):
                closed = event
                break
        await self.end_writing(closed)

    async def _handshake(self) -> None:
        session = self.session
        assert session is not None
        with trio.move_on_after(self.prepare_timeout_s) as waited:
            await self.server.scheduler.wait_reset(session.slot)
        if waited.cancelled_caught:
            await session.reject(
                "session.open",
                error_codes.INTERNAL_ERROR,
                f"the session's prompt was not prefilled within the prepare timeout of "
                f"{self.prepare_timeout_s:g} s ({self.prepare_timeout_source})",
            )
            await session.close(reasons.ERROR)
            return
        if session.closed or session.close_reason is not None:
            return
        query = self.chat.query
        await self.send_message(wire.handshake(query.handshake if query is not None else "python"))
        self.ready = True
        self.start_soon(self._keepalive)

    async def _send_audio(self, message: wire.EncodeAudio) -> None:
        stream = self.stream
        if stream is None:
            return
        pcm = np.frombuffer(message.pcm16, dtype="<i2").astype(np.float32) / 32768.0
        try:
            ogg = await stream.encode(pcm)
        except _codec_errors()[1]:
            await self._codec_lost()
            return
        await self.send_message(wire.audio_message(ogg))

    async def _keepalive(self) -> None:
        """A ping after ``KEEPALIVE_S`` without a message: the model is lockstep, so a client
        that stops sending gets no audio, and the stock UIs close after 10 s of silence."""
        while not self.socket_closed:
            due = self._last_sent + wire.KEEPALIVE_S
            if trio.current_time() >= due:
                await self.send_message(wire.PING)
                continue
            await trio.sleep_until(due)

    # -- reading ----------------------------------------------------------------------------------
    async def handle_message(self, data: WireMessage) -> None:
        session = self.session
        assert session is not None
        if self.faults is not None:
            self.faults.before_message()
        kind, payload = wire.split_message(data)
        if kind != wire.KIND_AUDIO:
            self.counters.ignored_messages["api_chat_kind"] += 1
            return
        stream = self.stream
        assert stream is not None
        undecodable, lost = _codec_errors()
        try:
            if not self.ready:
                # Dropped, but through the decoder: its header pages set the stream up.
                self.counters.ignored_messages["api_chat_pre_handshake"] += 1
                await stream.discard(payload)
                return
        except undecodable as exc:
            await self._undecodable(exc)
            return
        except lost:
            await self._codec_lost()
            return
        # Decoded a slice at a time: real clients send well under one slice per message, and a
        # large message (a few bytes of Ogg can hold seconds of Opus) never becomes one huge
        # buffer; each append waits while the session's input is over its budget.
        for start in range(0, len(payload), DECODE_SLICE_BYTES):
            try:
                pcm = await stream.decode(payload[start : start + DECODE_SLICE_BYTES])
            except undecodable as exc:
                await self._undecodable(exc)
                return
            except lost:
                await self._codec_lost()
                return
            if len(pcm) == 0:
                continue
            try:
                # Logged as PCM16 (what the decoder resolves; half the bytes of float32).
                await session.append_bytes(float_to_pcm16(pcm), "pcm16")
            except trio.ClosedResourceError:
                return  # the session ended meanwhile: the writer closes

    async def _undecodable(self, exc: BaseException) -> None:
        session = self.session
        assert session is not None
        try:
            await session.reject("audio", error_codes.BAD_AUDIO, f"undecodable Ogg/Opus audio: {exc}")
        except trio.ClosedResourceError:
            return
        await session.close(reasons.INVALID_AUDIO)

    async def _codec_lost(self) -> None:
        session = self.session
        assert session is not None
        if session.closed or self._codec_lost_seen:
            return
        self._codec_lost_seen = True  # the reader and the writer can both find it out
        try:
            await session.reject("audio", error_codes.INTERNAL_ERROR, "the audio codec worker failed")
        except trio.ClosedResourceError:
            return
        self.start_soon(session.close, reasons.CODEC_LOST)


__all__ = ["ApiChatConnection", "ApiChatDialect"]
