"""A client of the ``/api/chat`` dialect (moshi / PersonaPlex wire protocol, docs/protocol.md §9).

::

    messages = encode_opus_messages(samples)          # once; reusable by any number of sessions
    async with open_api_chat_client("ws://127.0.0.1:8000/api/chat", voice_prompt="NATF0.pt") as c:
        await c.stream(messages)                       # paced on absolute 80 ms deadlines
        await c.wait_frames(len(messages))

Every message is one binary frame whose first byte is its kind: ``0x00`` handshake, ``0x01``
Ogg/Opus audio, ``0x02`` text, ``0x05`` error. Opening waits for the handshake (the server
discards audio sent before it); a close before it raises typed refusals: ``Unauthorized``
(HTTP 401/403), ``ResourceExhausted`` (``0x05`` + close 1013), ``SessionRefused`` (any other
``0x05`` + close, e.g. 1008 for a bad query). Received audio is counted per output frame
without decoding (:class:`~duplex_actors.client.opus.OggOpusCounter`): output frame k answers
input frame k (lockstep: one 80 ms step per 80 ms of input). ``decode=True`` also decodes it
(sphn), for a reply WAV or an RMS check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, WebSocketConnection

from .. import error_codes
from ..audio import FRAME_S, FRAME_SAMPLES
from .connection import _connect, _only, _raise, _rejection
from .errors import ConnectFailed, ResourceExhausted, ServerClosed, SessionRefused
from .opus import KIND_AUDIO, KIND_ERROR, KIND_HANDSHAKE, KIND_TEXT, OggOpusCounter, OpusDecoder

API_CHAT_PATH: Final = "/api/chat"
CLOSE_BUSY: Final = 1013
CLOSE_CODES: Final = {1007: "invalid_audio", 1008: "invalid_request", 1011: "server_error", 1012: "draining"}

AudioCallback = Callable[[float, int, int], None]  # (arrival time, first new frame, new frames)


def is_api_chat_url(url: str) -> bool:
    """True when ``url``'s path is ``/api/chat`` (the moshi / PersonaPlex dialect)."""
    return urlsplit(url).path.rstrip("/").endswith(API_CHAT_PATH)


def api_chat_url(url: str, **params: str | None) -> str:
    """``url`` with the query parameters given (``None`` values left out; existing keys replaced)."""
    given = {k: v for k, v in params.items() if v is not None}
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in given]
    query += list(given.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


class ApiChatClient:
    """One ``/api/chat`` session. Create it with :func:`open_api_chat_client`.

    Kept current by the receive task: ``handshake`` (its bytes) and ``handshake_at``,
    ``frames_received`` (whole 80 ms output frames), ``text`` (pieces), ``errors`` (``0x05``
    texts), ``close_code``/``close_reason``, and with ``decode=True`` ``pcm`` (the decoded
    float32 chunks, in order).
    """

    def __init__(
        self,
        ws: WebSocketConnection,
        *,
        decode: bool = False,
        on_audio: AudioCallback | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.ws = ws
        self.handshake: bytes | None = None
        self.handshake_at: float | None = None
        self.text: list[str] = []
        self.errors: list[str] = []
        self.pcm: list[npt.NDArray[np.float32]] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.messages_received = 0
        self.frames_sent = 0
        self.failure: BaseException | None = None
        self._counter = OggOpusCounter()
        self._decoder = OpusDecoder() if decode else None
        self._on_audio = on_audio
        self._on_text = on_text
        self._changed = trio.Event()
        self._done = trio.Event()

    @property
    def frames_received(self) -> int:
        return self._counter.samples // FRAME_SAMPLES

    @property
    def is_closed(self) -> bool:
        return self._done.is_set()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _handle(self, message: bytes, now: float) -> None:
        self.messages_received += 1
        kind = message[0] if message else -1
        if kind == KIND_AUDIO:
            before = self.frames_received
            payload = memoryview(message)[1:]
            self._counter.feed(payload)
            if self._decoder is not None:
                self.pcm.append(self._decoder.decode(bytes(payload)))
            after = self.frames_received
            if after > before and self._on_audio is not None:
                self._on_audio(now, before, after - before)
        elif kind == KIND_TEXT:
            piece = message[1:].decode("utf-8", "replace")
            self.text.append(piece)
            if self._on_text is not None:
                self._on_text(piece)
        elif kind == KIND_HANDSHAKE and self.handshake is None:
            self.handshake, self.handshake_at = bytes(message), now
        elif kind == KIND_ERROR:
            self.errors.append(message[1:].decode("utf-8", "replace"))
        # 0x04 metadata, 0x06 ping and unknown kinds: ignored, as the stock clients do

    async def _receive_loop(self) -> None:
        try:
            while True:
                message = await self.ws.get_message()
                if isinstance(message, bytes):
                    self._handle(message, trio.current_time())
                    self._poke()
        except ConnectionClosed as exc:
            if exc.reason is not None:
                self.close_code, self.close_reason = exc.reason.code, exc.reason.reason
        except Exception as exc:
            self.failure = exc
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.ws.aclose(1011, "client failure")
        finally:
            if self.close_code is None and self.ws.closed is not None:
                self.close_code, self.close_reason = self.ws.closed.code, self.ws.closed.reason
            self._done.set()
            self._poke()

    async def wait_until(self, predicate: Callable[[], object], *, timeout: float) -> None:
        """Until ``predicate()`` (re-checked after each message); ``trio.TooSlowError`` after
        ``timeout``, :class:`ServerClosed` if the connection ends first."""
        with trio.fail_after(timeout):
            while not predicate():
                if self._done.is_set():
                    raise ServerClosed(self.close_code, self.close_reason) from self.failure
                await self._changed.wait()

    async def wait_frames(self, count: int, *, timeout: float = 10.0) -> None:
        await self.wait_until(lambda: self.frames_received >= count, timeout=timeout)

    async def send_raw(self, message: bytes) -> None:
        if self._done.is_set():
            raise ServerClosed(self.close_code, self.close_reason)
        try:
            await self.ws.send_message(message)
        except ConnectionClosed as exc:
            code = exc.reason.code if exc.reason is not None else self.close_code
            raise ServerClosed(code, exc.reason.reason if exc.reason else self.close_reason) from None

    async def stream(
        self,
        messages: Sequence[bytes],
        *,
        paced: bool = True,
        start: float | None = None,
        max_ahead_frames: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        times: list[float] | None = None,
    ) -> list[float]:
        """Send ``messages`` (one 80 ms frame each, from
        :func:`~duplex_actors.client.opus.encode_opus_messages`) and return the time each was
        handed to the socket; pacing as :meth:`DuplexClient.stream`'s."""
        t0 = trio.current_time() if start is None else start
        times = [] if times is None else times
        for k, message in enumerate(messages):
            if paced:
                await trio.sleep_until(t0 + k * FRAME_S)
            elif max_ahead_frames is not None and self.frames_sent - self.frames_received >= max_ahead_frames:
                await self.wait_until(self._room_ahead(max_ahead_frames), timeout=30.0)
            times.append(trio.current_time())
            self.frames_sent += 1
            await self.send_raw(message)
            if progress is not None:
                progress(k + 1, len(messages))
        return times

    def _room_ahead(self, limit: int) -> Callable[[], bool]:
        return lambda: self.frames_sent - self.frames_received < limit

    def decoded(self) -> npt.NDArray[np.float32]:
        """Every decoded sample so far (``decode=True``), one array."""
        return np.concatenate(self.pcm) if self.pcm else np.zeros(0, np.float32)

    async def close(self, *, timeout: float = 5.0) -> None:
        """Close the socket (1000: the normal end on this dialect is the client closing)."""
        if not self._done.is_set():
            with trio.move_on_after(timeout):
                await self.ws.aclose(1000)
            with trio.move_on_after(1):
                await self._done.wait()

    def refusal(self) -> SessionRefused | ServerClosed:
        """The exception for a connection that closed before the handshake."""
        message = self.errors[0] if self.errors else (self.close_reason or "")
        if self.close_code == CLOSE_BUSY:
            return ResourceExhausted(
                error_codes.RESOURCE_EXHAUSTED, message or "server busy", self.close_code
            )
        if self.errors:
            code = CLOSE_CODES.get(self.close_code or 0, "refused")
            return SessionRefused(code, message, self.close_code)
        return ServerClosed(self.close_code, self.close_reason)


@asynccontextmanager
async def open_api_chat_client(
    url: str,
    *,
    api_key: str | None = None,
    text_prompt: str | None = None,
    voice_prompt: str | None = None,
    params: dict[str, str] | None = None,
    decode: bool = False,
    on_audio: AudioCallback | None = None,
    on_text: Callable[[str], None] | None = None,
    connect_timeout: float = 10.0,
    handshake_timeout: float = 30.0,
) -> AsyncIterator[ApiChatClient]:
    """Connect to ``url`` (``ws://host:port/api/chat``) with ``text_prompt`` / ``voice_prompt``
    (server defaults when omitted) and any other query ``params``, wait for the handshake,
    yield the client; close on exit. ``api_key`` goes in ``Authorization: Bearer``."""
    wire_url = api_chat_url(url, text_prompt=text_prompt, voice_prompt=voice_prompt, **(params or {}))
    headers = [(b"Authorization", f"Bearer {api_key}".encode())] if api_key else []
    client: ApiChatClient | None = None
    try:
        async with trio.open_nursery() as nursery:
            ws = await _connect(
                nursery, wire_url, headers, None, connect_timeout, 16 * 1024 * 1024, label=url
            )
            client = ApiChatClient(ws, decode=decode, on_audio=on_audio, on_text=on_text)
            nursery.start_soon(client._receive_loop)
            try:
                try:
                    await client.wait_until(lambda: client.handshake is not None, timeout=handshake_timeout)
                except trio.TooSlowError:
                    raise ConnectFailed(f"no handshake within {handshake_timeout:g} s") from None
                except ServerClosed:
                    raise client.refusal() from None
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await client.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaf = _only(group)
        if leaf is None:
            raise
        if isinstance(leaf, ConnectionRejected):
            raise _rejection(leaf) from None
        _raise(leaf)
    if client is not None and client.failure is not None:
        raise client.failure
