"""``DuplexClient``: one duplex session over a WebSocket (trio + trio-websocket).

::

    config = create_duplex_session_config(voice="NATF2.pt", persona="You are ...")
    async with open_duplex_client("ws://127.0.0.1:8000/v1/realtime?duplex=1", config=config) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.stream, samples)      # paced on absolute 80 ms deadlines
            async for event in client.events():
                if isinstance(event, AudioDelta):
                    play(event.pcm16)
                ...

A background task reads every server message as soon as it arrives, so the server's bounded
outbox is always drained whatever the caller does; the typed events (:mod:`.events`) go to an
unbounded queue read by :meth:`DuplexClient.events` (pass ``queue_events=False`` and an
``on_event`` callback when you consume them as they come, as ``duplex-load`` does).

Opening waits for ``session.created`` and the ``session.updated`` that follows it. A ``config``
is sent as the first message (``session.update`` with ``?autostart=0`` on the Realtime route,
``session.create`` on the native ``/v1/duplex`` route), so the session opens with it; then one
``session.heartbeat`` (its ``session.heartbeat_ack`` is in the event stream) makes sure any part
of the config the server refused is known before the block starts. Refusals
raise typed exceptions (:mod:`.errors`): ``Unauthorized`` (HTTP 401/403 before the upgrade),
``ResourceExhausted`` (every slot taken: ``error resource_exhausted`` then close 1013),
``SessionRefused``, ``ConfigRefused``, ``ServerClosed``. Leaving the ``async with`` block closes
the session cleanly (``session.close``, then waits for ``session.closed``).

``resume=True`` opens a resumable session (docs/protocol.md §10): when the socket drops (no
close frame) or stalls, the client connects again by itself (``session.resume`` with the
latest token and the last sequence number received; backoff 0.05 s doubling to 1 s, within the
server's ``resume_grace_s``), re-sends the input the server lacks from the audio it keeps (the
last ``resume_input_s`` seconds) and the commands it had not received, and acknowledges the
server's events every 0.5 s so that the server trims its journal. The gap is hidden:
:meth:`DuplexClient.events` yields every server event once and in order, a paced
:meth:`DuplexClient.stream` keeps its deadlines (what falls in the gap goes out on the new
connection), the counters stay right. Each resume puts a :class:`~.events.Resumed` note in the
event stream (and counts in ``DuplexClient.resumes``); a session that cannot be resumed ends
with :class:`SessionLost` (a :class:`ServerClosed`). The token is never logged or exposed.

The client never imports torch or the model: only the sans-io protocol classes and numpy.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    connect_websocket_url,
)

from .. import error_codes
from ..audio import FORMATS, FRAME_MS, canonical_format, check_rate, default_rate
from ..protocol.converter import dumps, encode_client_event
from ..protocol.native import split_binary_frame_position
from ..protocol.wire_events import (
    ClientEvent,
    DialectName,
    InputAudioBufferClear,
    NativeOutputAudioDelta,
    OutputAudioBufferClear,
    RealtimeHeartbeatAck,
    ResponseCancel,
    SessionClose,
    SessionCreate,
    SessionEventAck,
    SessionHeartbeat,
    SessionResume,
    SessionUpdate,
)
from .audio import (
    AudioInput,
    EncodedAudio,
    append_message,
    encode_audio,
    parse_input_format,
    parse_output_format,
    to_wire_bytes,
)
from .errors import (
    ConfigRefused,
    ConnectFailed,
    HandshakeRejected,
    ResourceExhausted,
    ServerClosed,
    SessionLost,
    SessionRefused,
    Unauthorized,
)
from .events import (
    RESUMED_TYPE,
    AlignmentHint,
    AudioDelta,
    Error,
    ResponseCreated,
    ResponseDone,
    Resumed,
    ServerEvent,
    SessionClosed,
    SessionCreated,
    SessionUpdated,
    parse_server_event,
)

DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
HISTORY: Final = 1024  # recent events kept for wait_for(after=...)
_HEARTBEAT_ACK: Final = RealtimeHeartbeatAck.TYPE
_RECEIVE_BUFFER: Final = 64 * 1024

# Resuming (docs/protocol.md §10).
RESUME_BACKOFF_S: Final = (0.05, 1.0)  # the first retry's delay, doubling up to the second
ACK_INTERVAL_S: Final = 0.5  # session.event_ack at most this often
# Messages outside the journal's numbering: the resume handshake's and the takeover's.
_UNSEQUENCED: Final = frozenset({RESUMED_TYPE, "session.replaced", "session.resync_required"})
# A resume refused with one of these codes will never succeed; any other is tried again.
_RESUME_FATAL: Final = frozenset(
    {
        error_codes.SESSION_RESUME_EXPIRED,
        error_codes.SESSION_NOT_FOUND,
        error_codes.INVALID_RESUME_TOKEN,
        error_codes.INVALID_SESSION_RESUME,
        error_codes.UNSUPPORTED_SESSION_RESUME,
        error_codes.UNAUTHORIZED,
    }
)
_KEEPALIVE: Final = "keepalive"
_ABNORMAL: Final = 1006  # trio-websocket's close code for a connection that ended without a close frame

EventMatch = type[ServerEvent] | tuple[type[ServerEvent], ...] | Callable[[ServerEvent], bool]


# -- session config ---------------------------------------------------------------------------
def create_duplex_session_config(
    *,
    voice: str | None = None,
    persona: str | None = None,
    input_format: str = "pcm16",
    output_format: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A session object for ``session.update`` / ``session.create``.

    ``voice``: a bundled voice prompt (``NATF2.pt``); ``persona``: the system text (sent as
    ``instructions``); ``input_format``: ``pcm16`` (24 kHz), ``pcm16@48000``, ``pcm_f32le@16000``,
    ``pcmu``/``pcma`` (8 kHz G.711), ... (see :func:`~duplex_actors.client.audio.parse_input_format`;
    mono); ``output_format``: ``pcm16`` (24 kHz) or ``pcmu``/``pcma`` (8 kHz), the server's
    default (pcm16) when omitted. ``extra`` keys are passed through (``temperature``,
    ``extra_body``, ...). Omitted values take the server's defaults.
    """
    fmt = parse_input_format(input_format)
    config: dict[str, Any] = {"input_audio_format": fmt.name, "sample_rate_hz": fmt.rate}
    if output_format is not None:
        config["output_audio_format"] = parse_output_format(output_format).name
    if voice is not None:
        config["voice"] = voice
    if persona is not None:
        config["instructions"] = persona
    config.update(extra)
    return config


def _input_format_of(config: Mapping[str, Any]) -> tuple[str, int | None]:
    """(canonical format, rate or None for the format's default) a session config names: the
    flat keys, else GA ``audio.input.format`` (as the server reads them)."""
    fmt, rate = config.get("input_audio_format"), config.get("sample_rate_hz")
    audio = config.get("audio")
    audio_in = audio.get("input") if isinstance(audio, dict) else None
    ga = audio_in.get("format") if isinstance(audio_in, dict) else None
    if isinstance(ga, dict):
        fmt = fmt if fmt is not None else ga.get("type")
        rate = rate if rate is not None else ga.get("rate")
    elif isinstance(ga, str) and fmt is None:
        fmt = ga
    return canonical_format(str(fmt or "pcm16")), int(rate) if isinstance(rate, int) else None


def with_alignment(
    config: Mapping[str, Any] | None, alignment: str | None
) -> tuple[Mapping[str, Any] | None, str | None]:
    """``config`` with ``duplex: {"alignment": alignment}`` added (``None``: left as is), and the
    alignment mode the session will have: a ``duplex`` key already in ``config`` wins."""
    if alignment is not None and not (config is not None and "duplex" in config):
        config = {**(config or {}), "duplex": {"alignment": alignment}}
    if config is not None and "duplex" in config:
        duplex = config["duplex"]
        mode = duplex.get("alignment") if isinstance(duplex, Mapping) else None
        alignment = mode if isinstance(mode, str) else None
    return config, alignment


def _wire(event: ClientEvent) -> str:
    """JSON text of a client event, through the protocol's own encoder (``None`` fields dropped)."""
    obj = {k: v for k, v in encode_client_event(event).items() if v is not None}
    return dumps(obj)


def _decode(message: str | bytes) -> dict[str, Any] | None:
    """A JSON object message decoded; None for anything else."""
    try:
        obj = json.loads(message)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _dialect_of(url: str) -> DialectName:
    return "native" if urlsplit(url).path.rstrip("/").endswith("/v1/duplex") else "realtime"


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def _autostart_off(url: str) -> bool:
    return dict(parse_qsl(urlsplit(url).query)).get("autostart") == "0"


def _raise(exc: BaseException) -> NoReturn:
    """Re-raise ``exc`` unwrapped from an exception group, keeping its own context."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


def _resume_url(url: str, session_id: str) -> str:
    """The URL a resume connects to: the session's route and query (``duplex=1`` kept), with
    the session's id and without the opening's ``resume``/``autostart``."""
    parts = urlsplit(url)
    drop = ("resume", "autostart", "session_id", "last_seq")
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in drop]
    query.append(("session_id", session_id))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _with_start(message: str, start: int) -> str:
    """An ``input_audio_buffer.append`` JSON text with ``input_samples_start`` added."""
    return message[:-1] + f',"input_samples_start":{int(start)}}}'


def _append_audio(message: str | bytes) -> bytes:
    """The audio bytes an ``input_audio_buffer.append`` message carries."""
    obj = json.loads(message)
    return base64.b64decode(obj["audio"]) if isinstance(obj, dict) else b""


@attrs.define
class _Command:
    """A command sent on a resumable session that the server is not known to have received."""

    number: int
    event_id: str | None
    message: str | bytes
    position: int  # input samples sent before it
    resend: bool = True  # False: the client's own keepalive, never re-sent


_Connector = Callable[[str, float], Awaitable[WebSocketConnection]]


# -- the client --------------------------------------------------------------------------------
class DuplexClient:
    """One open duplex session. Create it with :func:`open_duplex_client`.

    State the receive task keeps current: ``session_id``, ``session`` (the effective session
    object), ``response_id`` (the open response, if any), ``epoch``, ``frames_received`` (output
    frames), ``samples_sent``/``frames_sent`` (input), ``events_received``, ``closed_event``
    (the ``session.closed``), ``close_code``/``close_reason`` (the WebSocket's).

    Alignment (docs/protocol.md §7): with ``alignment="client"`` (what
    :func:`open_duplex_client` asks for by default) the server may send
    ``input_audio_buffer.alignment {pad_ms}``; a paced :meth:`stream` of 80 ms chunks then sends
    its next chunk ``pad_ms`` early holding only ``80 - pad_ms`` ms of new audio, with ``pad_ms``
    on that append (``pads``: ``(time, pad_ms)`` of each applied). A hint it cannot apply (chunks
    of another size, an unpaced stream, ``alignment`` not ``"client"``) is ignored and counted in
    ``hints_ignored``: the server pads shorter chunks by itself. ``sends`` holds ``(send time,
    input samples sent after it)`` for every append, so that an output frame's
    ``input_samples_end`` maps to the send time of the chunk that held that sample
    (:func:`~duplex_actors.client.stats.frame_latencies_ms`).

    Resuming (``reconnect`` given, as :func:`open_duplex_client` does with ``resume=True``): see
    the module. ``resumes`` counts the resumes, ``resumed`` holds their
    :class:`~.events.Resumed` notes, ``server_seq`` is the last server event sequence number
    received, ``lost`` the :class:`SessionLost` the session ended with, if any. Input goes
    through :meth:`send_audio` or :meth:`stream` (the audio kept for a resume is theirs); any
    other message sent is a command, re-sent after a resume unless the server says
    (``last_client_event_id``) that it had it. While a resume is under way a paced stream keeps
    its deadlines (its chunks go out on the new connection), an unpaced one and
    :meth:`send_audio` wait for it. With ``keepalive_s`` a ``session.heartbeat`` goes out after
    that long without a server message (its ack is not in the event stream), and after
    ``stall_timeout_s`` without one the connection is given up and the session resumed.
    """

    reply_timeout: float = 10.0
    connect_timeout: float = 10.0
    keepalive_s: float | None = 2.0
    stall_timeout_s: float | None = 10.0

    def __init__(
        self,
        ws: WebSocketConnection,
        *,
        dialect: DialectName,
        input_format: str = "pcm16",
        input_rate: int | None = None,
        on_event: Callable[[ServerEvent], None] | None = None,
        queue_events: bool = True,
        alignment: str | None = None,
        reconnect: _Connector | None = None,
        url: str | None = None,
        resume_input_s: float = 10.0,
        accept_gap: bool = False,
    ) -> None:
        self.ws = ws
        self.alignment = alignment
        self.dialect: DialectName = dialect
        self.input_format = canonical_format(input_format)
        self.input_rate = check_rate(
            self.input_format, default_rate(self.input_format) if input_rate is None else input_rate
        )
        self._frame_samples = self.input_rate * FRAME_MS // 1000
        self.session_id: str | None = None
        self.session: dict[str, Any] = {}
        self.created: SessionCreated | None = None
        self.closed_event: SessionClosed | None = None
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.response_id: str | None = None
        self.epoch = 0
        self.samples_sent = 0
        self.frames_received = 0
        self.events_received = 0
        self.errors: list[Error] = []
        self.recent: deque[ServerEvent] = deque(maxlen=HISTORY)
        self.failure: BaseException | None = None
        self._on_event = on_event
        self._queue_events = queue_events
        self._send_ch, self._recv_ch = trio.open_memory_channel[ServerEvent](math.inf)
        self._changed = trio.Event()
        self._done = trio.Event()
        self._opened = False
        self._updated_after_open = False
        self._open_errors: list[Error] = []
        self._ids = itertools.count(1)
        self.sends: list[tuple[float, int]] = []
        self.pads: list[tuple[float, int]] = []
        self.hints: list[AlignmentHint] = []
        self.hints_ignored = 0
        self._pending_pad_ms: int | None = None
        self._hint_arrived = trio.Event()
        # resuming
        self._reconnect = reconnect
        self._url = url
        self.resume_input_s = resume_input_s
        self.accept_gap = accept_gap
        self.resumes = 0
        self.resumed: list[Resumed] = []
        self.lost: SessionLost | None = None
        self.server_seq = 0
        self.resume_grace_s: float | None = None
        self.attachment_generation = 1
        self._token: str | None = None
        self._conn_seq = 0  # native: the sequence number of the last message on this connection
        self._acked = 0
        self._attached = True
        self._attached_event = trio.Event()
        self._attached_event.set()
        self._stalled = False
        self._last_rx = trio.current_time()
        self._keepalive_at = -math.inf
        self._commands: deque[_Command] = deque(maxlen=4096)
        self._command_numbers = itertools.count(1)
        self._kept = bytearray()  # the input kept for a resume, in the session's wire format
        self._kept_start = 0  # its first sample's position in the input stream
        self._kept_pads: dict[int, int] = {}  # position -> pad_ms of the padded appends kept
        self._nursery: trio.Nursery | None = None

    # -- state -----------------------------------------------------------------------------------
    @property
    def frames_sent(self) -> int:
        """Whole 80 ms input frames sent so far (samples at the session's input rate)."""
        return self.samples_sent // self._frame_samples

    @property
    def is_closed(self) -> bool:
        """The connection has closed (the receive task has seen the end)."""
        return self._done.is_set()

    @property
    def resumable(self) -> bool:
        """The client resumes this session when its connection drops."""
        return self._reconnect is not None and self._token is not None

    def _closed_error(self) -> ServerClosed:
        return self.lost if self.lost is not None else ServerClosed(self.close_code, self.close_reason)

    @property
    def capabilities(self) -> dict[str, Any]:
        caps = self.session.get("capabilities")
        return dict(caps) if isinstance(caps, dict) else {}

    # -- receiving -------------------------------------------------------------------------------
    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _parse(self, message: str | bytes, now: float, obj: Any = None) -> ServerEvent:
        seq = self.events_received + 1
        if isinstance(message, bytes):  # native binary output: u32 LE frame index (+ u32 position) + PCM16
            index, position, pcm = split_binary_frame_position(message)
            return AudioDelta(
                type=NativeOutputAudioDelta.TYPE,
                raw={},
                received_at=now,
                seq=seq,
                response_id=self.response_id,
                epoch=self.epoch,
                frame_index=index,
                pcm16=pcm,
                input_samples_end=position,
            )
        if obj is None:
            obj = _decode(message)
        if not isinstance(obj, dict):
            obj = {"type": "invalid_json", "text": message[:1000]}
        return parse_server_event(obj, dialect=self.dialect, received_at=now, seq=seq)

    def _track(self, event: ServerEvent) -> None:
        self.events_received = event.seq
        if isinstance(event, AudioDelta):
            self.frames_received += event.frames
            self.epoch = event.epoch
        elif isinstance(event, SessionCreated):
            self.created = event
            self.session_id = event.session_id
            self.session = event.session
        elif isinstance(event, SessionUpdated):
            self.session = event.session
            if self.created is not None:
                self._updated_after_open = True
        elif isinstance(event, ResponseCreated):
            self.response_id = event.response_id
            if event.epoch is not None:
                self.epoch = event.epoch
        elif isinstance(event, ResponseDone):
            if self.response_id == event.response_id:
                self.response_id = None
        elif isinstance(event, Error):
            self.errors.append(event)
            if not self._opened:
                self._open_errors.append(event)
        elif isinstance(event, SessionClosed):
            self.closed_event = event
        elif isinstance(event, AlignmentHint):
            self.hints.append(event)
            if self.alignment == "client":
                if self._pending_pad_ms is not None:
                    self.hints_ignored += 1  # superseded before a chunk could apply it
                self._pending_pad_ms = event.pad_ms
                self._hint_arrived.set()
                self._hint_arrived = trio.Event()
            else:
                self.hints_ignored += 1

    async def _receive_loop(self) -> None:
        try:
            while True:
                await self._read(self.ws)
                if not self._should_resume():
                    break
                await self._resume()
        except SessionLost as exc:
            self.lost = exc
        except Exception as exc:  # a bug or an on_event callback that raised: end the connection
            self.failure = exc
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.ws.aclose(1011, "client failure")
        finally:
            if self.close_code is None and self.ws.closed is not None:
                self.close_code, self.close_reason = self.ws.closed.code, self.ws.closed.reason
            self._done.set()
            self._attached_event.set()  # wakes whoever waits for a resume: it finds the end
            self._send_ch.close()
            self._poke()

    async def _read(self, ws: WebSocketConnection) -> None:
        """Every message of one connection, until it ends."""
        self.close_code = self.close_reason = None
        try:
            while True:
                message = await ws.get_message()
                self._receive(message, trio.current_time())
        except ConnectionClosed as exc:
            if exc.reason is not None:
                self.close_code, self.close_reason = exc.reason.code, exc.reason.reason
        finally:
            if self._attached:
                self._attached = False
                self._attached_event = trio.Event()

    def _receive(self, message: str | bytes, now: float) -> None:
        self._last_rx = now
        obj: Any = None
        if self._reconnect is not None:
            if isinstance(message, str):
                obj = _decode(message)
            seq = self._sequence(obj)
            if seq is not None and seq > 0:
                if seq <= self.server_seq:
                    return  # already received (a replay that starts early)
                self.server_seq = seq
            if isinstance(obj, dict):
                if obj.get("type") == "session.created" and "resume_token" in obj:
                    token = obj.pop("resume_token")  # never in an event, a log or a repr
                    self._token = token if isinstance(token, str) else None
                    grace = obj.get("resume_grace_s")
                    if isinstance(grace, int | float) and not isinstance(grace, bool):
                        self.resume_grace_s = float(grace)
                if self._acknowledged(obj):
                    return  # the ack of the client's own keepalive
        event = self._parse(message, now, obj)
        self._track(event)
        self.recent.append(event)
        self._deliver(event)

    def _deliver(self, event: ServerEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
        if self._queue_events:
            self._send_ch.send_nowait(event)
        self._poke()

    def _sequence(self, obj: Any) -> int | None:
        """The journal sequence number of a message (0: ``session.created``; None: a message
        outside the numbering). Realtime messages carry it; native ones are counted."""
        kind = obj.get("type") if isinstance(obj, dict) else None
        if self.created is None:
            return 0 if kind == "session.created" else None
        if kind in _UNSEQUENCED:
            return None
        if self.dialect == "realtime":
            seq = obj.get("server_event_seq") if isinstance(obj, dict) else None
            return seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        self._conn_seq += 1
        return self._conn_seq

    def _acknowledged(self, obj: dict[str, Any]) -> bool:
        """Drop the commands the server answered (a heartbeat's ack or an error names the
        command); True for the ack of a keepalive, which is not an event of the caller's."""
        kind = obj.get("type")
        if kind == _HEARTBEAT_ACK:
            eid = obj.get("client_event_id")
        elif kind == "error":
            err = obj.get("error")
            eid = err.get("event_id") if isinstance(err, dict) else obj.get("client_event_id")
        else:
            return False
        if isinstance(eid, str):
            self._drop_commands(eid)
            return kind == _HEARTBEAT_ACK and eid.startswith(_KEEPALIVE + "_")
        return False

    def _drop_commands(self, event_id: str | None) -> None:
        """Forget the commands up to the one with ``event_id`` (the server has them all); none
        when no command of the client has that id."""
        floor = next((c.number for c in reversed(self._commands) if c.event_id == event_id), None)
        if event_id is None or floor is None:
            return
        while self._commands and self._commands[0].number <= floor:
            self._commands.popleft()

    # -- resuming --------------------------------------------------------------------------------
    def _should_resume(self) -> bool:
        return (
            self.resumable
            and self.session_id is not None
            and self.closed_event is None
            and (self._stalled or self.close_code in (None, _ABNORMAL))
        )

    async def _resume(self) -> None:
        """Take the session over on a new connection, or raise :class:`SessionLost`."""
        assert self._reconnect is not None and self.session_id is not None and self._url is not None
        cause = "stalled" if self._stalled else "dropped"
        self._stalled = False
        dropped_at = trio.current_time()
        grace = self.resume_grace_s if self.resume_grace_s is not None else 30.0
        deadline = dropped_at + grace
        delay, attempts, accept_gap = RESUME_BACKOFF_S[0], 0, False
        code, reason = self.close_code, self.close_reason
        while True:
            if trio.current_time() >= deadline:
                raise SessionLost(
                    "grace_expired",
                    f"no resume within the server's {grace:g} s grace ({attempts} attempts)",
                    code,
                    reason,
                )
            attempts += 1
            answer = await self._attempt(deadline, accept_gap, code, reason)
            if isinstance(answer, tuple):
                break
            if answer == "gap":
                if not self.accept_gap:
                    raise SessionLost(
                        "journal_gap",
                        "the server no longer holds every event missed (pass accept_gap=True to go on without them)",
                        code,
                        reason,
                    )
                accept_gap = True
                continue
            await trio.sleep(max(0.0, min(delay, deadline - trio.current_time())))
            delay = min(delay * 2, RESUME_BACKOFF_S[1])
        ws, obj = answer
        await self._attach(ws, obj, cause=cause, gap_s=trio.current_time() - dropped_at, attempts=attempts)

    async def _attempt(
        self, deadline: float, accept_gap: bool, code: int | None, reason: str | None
    ) -> tuple[WebSocketConnection, dict[str, Any]] | str:
        """One resume: the new connection and ``session.resumed``, else ``"retry"`` or
        ``"gap"`` (the cursor was evicted); raises :class:`SessionLost` on a final refusal."""
        assert self._reconnect is not None and self.session_id is not None and self._url is not None
        assert self._token is not None
        left = max(0.01, deadline - trio.current_time())
        try:
            ws = await self._reconnect(
                _resume_url(self._url, self.session_id), min(self.connect_timeout, left)
            )
        except Unauthorized as exc:
            raise SessionLost("unauthorized", exc.message, code, reason) from None
        except ConnectFailed:
            return "retry"
        resumed = False
        try:
            resume = SessionResume(
                session_id=self.session_id,
                resume_token=self._token,
                last_received_server_event_seq=self.server_seq,
                accept_gap=accept_gap,
            )
            await ws.send_message(_wire(resume))
            message: str | bytes | None = None
            with trio.move_on_after(min(self.reply_timeout, max(0.0, deadline - trio.current_time()))):
                message = await ws.get_message()
            obj = _decode(message) if isinstance(message, str) else None
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == RESUMED_TYPE and isinstance(obj, dict):
                resumed = True
                return ws, obj
            if kind == "session.resync_required":
                return "gap"
            if kind == "error" and isinstance(obj, dict):
                err = parse_server_event(obj, dialect=self.dialect)
                if isinstance(err, Error) and err.code in _RESUME_FATAL:
                    raise SessionLost(err.code, err.message, code, reason)
            return "retry"
        except ConnectionClosed:
            return "retry"
        finally:
            if not resumed:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await ws.aclose()

    async def _attach(
        self, ws: WebSocketConnection, obj: dict[str, Any], *, cause: str, gap_s: float, attempts: int
    ) -> None:
        """The session is resumed on ``ws``: take its new token, go on reading there, and re-send
        what the server lacks (in a task: the replay comes meanwhile)."""
        token = obj.pop("resume_token", None)
        self._token = token if isinstance(token, str) else self._token
        received = int(obj.get("input_samples_received", 0))
        if received < self._kept_start:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await ws.aclose()  # a close frame: the session ends on the server too
            raise SessionLost(
                "input_gap",
                f"the server holds {received} input samples and the client keeps them from "
                f"{self._kept_start} on (resume_input_s={self.resume_input_s:g})",
                self.close_code,
                self.close_reason,
            )
        replay_from = int(obj.get("replay_from_server_event_seq", self.server_seq + 1))
        self.ws = ws
        self._conn_seq = replay_from - 1
        self._last_rx = trio.current_time()
        self.attachment_generation = int(obj.get("attachment_generation", self.attachment_generation + 1))
        grace = obj.get("resume_grace_s")
        if isinstance(grace, int | float) and not isinstance(grace, bool):
            self.resume_grace_s = float(grace)
        last_id = obj.get("last_client_event_id")
        self._drop_commands(last_id if isinstance(last_id, str) else None)
        start = min(received, self.samples_sent)
        self.resumes += 1
        note = Resumed(
            type=RESUMED_TYPE,
            raw=obj,
            received_at=trio.current_time(),
            seq=self.events_received,
            session_id=str(obj.get("session_id", self.session_id)),
            generation=self.attachment_generation,
            gap_s=gap_s,
            attempts=attempts,
            cause=cause,
            last_server_event_seq=int(obj.get("last_server_event_seq", 0)),
            replay_from_server_event_seq=replay_from,
            input_samples_received=received,
            input_samples_resent=self.samples_sent - start,
            last_client_event_id=last_id if isinstance(last_id, str) else None,
        )
        self.resumed.append(note)
        self._deliver(note)
        assert self._nursery is not None
        self._nursery.start_soon(self._catch_up, ws, start)

    async def _catch_up(self, ws: WebSocketConnection, start: int) -> None:
        """On a resumed connection: acknowledge (which proves the new token), re-send the input
        from ``start`` and the commands not received, in their order; then live sending goes
        on. A drop meanwhile leaves it to the next resume."""
        width = FORMATS[self.input_format]
        try:
            seq = self.server_seq
            await ws.send_message(_wire(SessionEventAck(server_event_seq=seq)))
            self._acked = max(self._acked, seq)
            pos, first, done_number = start, True, 0
            while True:
                command = next((c for c in self._commands if c.number > done_number and c.resend), None)
                if command is not None and command.position <= pos:
                    await ws.send_message(command.message)
                    done_number = command.number
                    continue
                end = self.samples_sent if command is None else min(self.samples_sent, command.position)
                if pos >= end:
                    break
                # chunks of 80 ms, cut where a command or a padded append goes
                pad = min((p for p in self._kept_pads if pos < p < end), default=end)
                n = min(self._frame_samples, pad - pos)
                offset = (pos - self._kept_start) * width
                message = append_message(
                    bytes(self._kept[offset : offset + n * width]), self._kept_pads.get(pos)
                )
                await ws.send_message(_with_start(message, pos) if first else message)
                pos, first = pos + n, False
        except ConnectionClosed:
            return  # dropped again: the next resume starts over from what the server holds
        if ws is self.ws and not self._done.is_set() and not self._attached:
            self._attached = True
            self._attached_event.set()

    async def _upkeep(self) -> None:
        """A resumable session's acks (so that the server trims its journal), keepalives, and
        the stall check (a connection that says nothing for ``stall_timeout_s`` is given up)."""
        while not self._done.is_set():
            await trio.sleep(ACK_INTERVAL_S)
            if not self._attached or self._done.is_set():
                continue
            ws, now = self.ws, trio.current_time()
            idle = now - self._last_rx
            try:
                if self.server_seq > self._acked:
                    seq = self.server_seq
                    await ws.send_message(_wire(SessionEventAck(server_event_seq=seq)))
                    self._acked = max(self._acked, seq)
                if self.stall_timeout_s is not None and idle >= self.stall_timeout_s:
                    self._stalled = True
                    with trio.move_on_after(1):
                        await ws.aclose(4000, "stalled")  # not 1000/1001: the session stays resumable
                elif self.keepalive_s is not None and idle >= self.keepalive_s:
                    if now - self._keepalive_at >= self.keepalive_s:
                        self._keepalive_at = now
                        eid = self._event_id(_KEEPALIVE)
                        message = _wire(SessionHeartbeat(event_id=eid))
                        self._commands.append(
                            _Command(
                                next(self._command_numbers), eid, message, self.samples_sent, resend=False
                            )
                        )
                        await ws.send_message(message)
            except ConnectionClosed:
                pass

    async def _wait_attached(self) -> None:
        """Until a resume under way has caught up; raises once the session has ended."""
        while not self._attached and not self._done.is_set():
            await self._attached_event.wait()
        if self._done.is_set():
            raise self._closed_error()

    def _keep(self, data: bytes, pad_ms: int | None) -> None:
        """Keep input about to be sent (at position ``samples_sent``) for a resume: the last
        ``resume_input_s`` seconds while connected, everything while a resume is under way."""
        if self._reconnect is None:
            return
        width = FORMATS[self.input_format]
        if pad_ms:
            self._kept_pads[self.samples_sent] = pad_ms
        self._kept += data
        limit = max(1, round(self.resume_input_s * self.input_rate)) * width
        if self._attached and len(self._kept) > limit + limit // 4:
            cut = len(self._kept) - limit
            cut -= cut % width
            del self._kept[:cut]
            self._kept_start += cut // width
            self._kept_pads = {p: ms for p, ms in self._kept_pads.items() if p >= self._kept_start}

    async def _send_input(self, message: str | bytes) -> None:
        """Send an append already counted in ``samples_sent`` (and kept)."""
        if self._reconnect is None:
            await self.send_raw(message)
            return
        if self._done.is_set():
            raise self._closed_error()
        if not self._attached:
            return  # the resume's catch-up sends it
        try:
            await self.ws.send_message(message)
        except ConnectionClosed:
            pass  # the receive task sees the drop: a resume re-sends what the server lacks

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Every server event in order. Ends after ``session.closed`` (and the socket's close);
        raises :class:`ServerClosed` if the socket closed without ``session.closed``
        (:class:`SessionLost` for a resumable session that could not be resumed). A resumed
        session's events come once each, with a :class:`~.events.Resumed` note where the
        connection changed."""
        if not self._queue_events:
            raise RuntimeError("this client was opened with queue_events=False")
        async for event in self._recv_ch:
            yield event
        if self.closed_event is None:
            raise self._closed_error()

    async def wait_until(self, predicate: Callable[[], Any], *, timeout: float | None = None) -> Any:
        """Wait (bounded by ``timeout`` -> ``trio.TooSlowError``) until ``predicate()`` is truthy,
        re-checked after every event; raises :class:`ServerClosed` if the connection ends first."""
        with trio.fail_after(self.reply_timeout if timeout is None else timeout):
            while True:
                result = predicate()
                if result:
                    return result
                if self._done.is_set():
                    raise self._closed_error() from self.failure
                await self._changed.wait()

    async def wait_for(
        self, match: EventMatch, *, after: int | None = None, timeout: float | None = None
    ) -> ServerEvent:
        """The first event with ``seq > after`` (default: the next one to arrive) that is an
        instance of ``match`` (a class or tuple of classes) or satisfies it (a callable). Looks
        back over the last ``HISTORY`` events, so ``after=client.events_received`` taken before
        sending a command never misses its answer."""
        start = self.events_received if after is None else after
        test: Callable[[ServerEvent], bool]
        if isinstance(match, type | tuple):
            classes = match
            test = lambda e: isinstance(e, classes)  # noqa: E731
        else:
            test = match
        checked = start

        def found() -> ServerEvent | None:
            nonlocal checked
            hit = None
            for event in self.recent:
                if event.seq > checked and test(event):
                    hit = event
                    break
            if hit is None and self.recent:
                checked = max(checked, self.recent[-1].seq)
            return hit

        result: ServerEvent = await self.wait_until(found, timeout=timeout)
        return result

    async def wait_frames(self, count: int, *, timeout: float | None = None) -> None:
        """Wait until at least ``count`` output frames have arrived in this session."""
        await self.wait_until(lambda: self.frames_received >= count, timeout=timeout)

    # -- sending ---------------------------------------------------------------------------------
    def _event_id(self, kind: str) -> str:
        return f"{kind}_{next(self._ids)}"

    async def send_raw(self, message: str | bytes) -> None:
        """Send one WebSocket message as is; raises :class:`ServerClosed` once the connection
        has closed. On a resumable session it is a command (see the class): sent once the
        session is attached, re-sent after a resume if the server had not received it."""
        if self.resumable:
            obj = _decode(message) if isinstance(message, str) else None
            eid = obj.get("event_id") if obj is not None else None
            await self._send_command(message, eid if isinstance(eid, str) else None)
            return
        if self._done.is_set():
            raise self._closed_error()
        try:
            await self.ws.send_message(message)
        except ConnectionClosed as exc:
            code = exc.reason.code if exc.reason is not None else self.close_code
            raise ServerClosed(code, exc.reason.reason if exc.reason else self.close_reason) from None

    async def _send_command(self, message: str | bytes, event_id: str | None) -> None:
        if self._done.is_set():
            raise self._closed_error()
        self._commands.append(_Command(next(self._command_numbers), event_id, message, self.samples_sent))
        if not self._attached:
            return  # the resume's catch-up sends it, in its place among the input
        try:
            await self.ws.send_message(message)
        except ConnectionClosed:
            pass  # a resume re-sends it unless the server says it had it

    async def send(self, event: ClientEvent) -> None:
        """Send a client event of :mod:`duplex_actors.protocol.wire_events`."""
        if self.resumable:
            await self._send_command(_wire(event), getattr(event, "event_id", None))
        else:
            await self.send_raw(_wire(event))

    async def send_audio(self, samples: AudioInput) -> int:
        """Append audio (any chunk size; the server keeps the partial tail). Bytes must be in the
        session's input format; int16/float arrays are converted. Returns the samples sent."""
        data = to_wire_bytes(samples, self.input_format)
        width = FORMATS[self.input_format]
        if self._reconnect is not None:
            await self._wait_attached()
            self._keep(data, None)
        self.samples_sent += len(data) // width
        self.sends.append((trio.current_time(), self.samples_sent))
        await self._send_input(append_message(data))
        return len(data) // width

    async def stream(
        self,
        audio: AudioInput | EncodedAudio,
        *,
        paced: bool = True,
        start: float | None = None,
        max_ahead_frames: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        times: list[float] | None = None,
        delays: Sequence[float] | None = None,
    ) -> list[float]:
        """Send ``audio`` as chunks (80 ms frames unless ``audio`` is an :class:`EncodedAudio` of
        another ``chunk_samples``) and return the time (``trio.current_time()``) each chunk was
        handed to the socket.

        ``paced``: the chunk starting at sample s goes out at the absolute deadline
        ``start + s / rate`` (``start``: now by default), so a late wake-up never accumulates
        drift; an alignment hint moves the next 80 ms chunk ``pad_ms`` earlier (see the class).
        Unpaced: as fast as the socket takes them, at most ``max_ahead_frames`` ahead of the
        output already received when given (the server buffers at least 10 s of input; beyond,
        ``input_backpressure``). ``progress(sent, total)`` is called after each chunk.
        ``times``: a list to append the send times to as they happen (kept by the caller if the
        stream is interrupted). ``delays`` (paced only; a network-jitter injector): chunk i is held
        back ``delays[i]`` seconds past its deadline, and the chunks behind it queue (a late
        burst); the times returned are then the deadlines, so that the jitter counts in latency.
        """
        enc = (
            audio
            if isinstance(audio, EncodedAudio)
            else encode_audio(audio, self.input_format, sample_rate_hz=self.input_rate)
        )
        if (enc.input_format, enc.sample_rate_hz) != (self.input_format, self.input_rate):
            raise ValueError(
                f"audio encoded as {enc.input_format}@{enc.sample_rate_hz}, "
                f"session takes {self.input_format}@{self.input_rate}"
            )
        t0 = trio.current_time() if start is None else start
        total = enc.frames
        times = [] if times is None else times
        rate, chunk, width = enc.sample_rate_hz, enc.chunk, FORMATS[enc.input_format]
        # Hints apply to paced 80 ms chunks cut from the stream's bytes; shorter chunks the
        # server pads by itself.
        can_align = paced and chunk == self._frame_samples and bool(enc.data)
        pos = 0  # samples of ``enc`` sent
        k = 0
        while pos < enc.total_samples:
            pad_ms: int | None = None
            due = t0 + pos / rate
            if not can_align and self._pending_pad_ms is not None:
                self._pending_pad_ms = None  # the server pads chunks of other sizes itself
                self.hints_ignored += 1
            if paced:
                while True:
                    arrived = self._hint_arrived
                    pad_ms = self._pending_pad_ms if can_align and self.alignment == "client" else None
                    at = due - (pad_ms or 0) / 1000
                    if trio.current_time() >= at:
                        break
                    with trio.move_on_at(at):
                        await arrived.wait()
                due -= (pad_ms or 0) / 1000
                if delays is not None and k < len(delays) and delays[k] > 0:
                    await trio.sleep_until(due + delays[k])
            elif max_ahead_frames is not None and self.frames_sent - self.frames_received >= max_ahead_frames:
                await self.wait_until(self._room_ahead(max_ahead_frames), timeout=30.0)
            if not paced and self._reconnect is not None:
                await self._wait_attached()  # unpaced: no sending ahead into a resume
            if pad_ms:
                self._pending_pad_ms = None
                n = min(chunk - round(pad_ms * rate / 1000), enc.total_samples - pos)
                message = append_message(enc.data[pos * width : (pos + n) * width], pad_ms=pad_ms)
            else:
                n = min(chunk, enc.total_samples - pos)
                if pos % chunk == 0 and pos // chunk < total:
                    message = enc.messages[pos // chunk]
                else:  # cut anew since a hint moved the chunk boundaries
                    message = append_message(enc.data[pos * width : (pos + n) * width])
            now = trio.current_time()
            if pad_ms:
                self.pads.append((now, pad_ms))
            sent_at = due if (paced and delays is not None) else now
            times.append(sent_at)
            if self._reconnect is not None:
                data = enc.data[pos * width : (pos + n) * width] if enc.data else _append_audio(message)
                self._keep(data, pad_ms)
            pos += n
            k += 1
            self.samples_sent += n
            self.sends.append((sent_at, self.samples_sent))
            await self._send_input(message)
            if progress is not None:
                progress(min(k, total), total)
        return times

    def _room_ahead(self, limit: int) -> Callable[[], bool]:
        return lambda: self.frames_sent - self.frames_received < limit

    async def cancel(self, response_id: str | None = None) -> str:
        """``response.cancel``: ends the open response (terminal group, ``response.done``); the
        next input frame starts a new epoch. Returns the client event id."""
        eid = self._event_id("cancel")
        await self.send(ResponseCancel(response_id=response_id, event_id=eid))
        return eid

    async def clear_input(self) -> str:
        """``input_audio_buffer.clear``: drop the partial input frame (no epoch change)."""
        eid = self._event_id("clear_input")
        await self.send(InputAudioBufferClear(event_id=eid))
        return eid

    async def clear_output(self) -> str:
        """``output_audio_buffer.clear``: end the response as cleared; a new epoch follows."""
        eid = self._event_id("clear_output")
        await self.send(OutputAudioBufferClear(event_id=eid))
        return eid

    async def heartbeat(self) -> str:
        eid = self._event_id("heartbeat")
        await self.send(SessionHeartbeat(event_id=eid))
        return eid

    async def update(self, config: Mapping[str, Any] | None = None, /, **fields: Any) -> SessionUpdated:
        """``session.update`` and wait for its ``session.updated`` (the full effective session);
        ``persona=`` is sent as ``instructions``. Raises :class:`RequestRefused` on ``error``
        (an update refused whole). An update refused in part returns its ``session.updated``
        (the fields taken); an ``error`` per refused field follows it, with this update's id."""
        from .errors import RequestRefused

        session = dict(config or {})
        if "persona" in fields:
            fields["instructions"] = fields.pop("persona")
        session.update(fields)
        eid = self._event_id("update")
        mark = self.events_received
        await self.send(SessionUpdate(session=session, event_id=eid))

        def answer(event: ServerEvent) -> bool:
            return isinstance(event, SessionUpdated) or (isinstance(event, Error) and event.event_id == eid)

        reply = await self.wait_for(answer, after=mark)
        if isinstance(reply, Error):
            raise RequestRefused(reply.code, reply.message, eid)
        assert isinstance(reply, SessionUpdated)
        return reply

    async def close(self, *, timeout: float = 10.0) -> SessionClosed | None:
        """``session.close``; waits for ``session.closed`` and the socket's close (at most
        ``timeout``, then aborts). Idempotent. Returns the ``session.closed`` event (``None`` if
        the connection ended without one)."""
        if not self._done.is_set():
            try:
                await self.send(SessionClose(event_id=self._event_id("close")))
            except ServerClosed:
                pass
            with trio.move_on_after(timeout):
                await self._done.wait()
            if not self._done.is_set():
                with trio.move_on_after(2):
                    await self.ws.aclose()
        return self.closed_event

    # -- opening ---------------------------------------------------------------------------------
    async def _open(self, config: Mapping[str, Any] | None, *, first_message: bool, timeout: float) -> None:
        sent_config = self.dialect == "native" or first_message
        if self.dialect == "native":
            resume = self._reconnect is not None
            await self.send(SessionCreate(session=dict(config or {}), event_id="open", resume=resume))
        elif first_message:
            await self.send(SessionUpdate(session=dict(config or {}), event_id="open"))
        try:
            with trio.fail_after(timeout):
                await self.wait_until(
                    lambda: (self.created is not None and self._updated_after_open) or self._done.is_set(),
                    timeout=math.inf,
                )
                if self.created is not None and sent_config and not self._open_errors:
                    # A refused part of the config is answered after session.updated: a heartbeat
                    # is answered in order, so once its ack is here any such error is too.
                    eid = await self.heartbeat()
                    await self.wait_for(
                        lambda e: e.type == _HEARTBEAT_ACK or (isinstance(e, Error) and e.event_id == eid),
                        after=0,
                        timeout=math.inf,
                    )
        except trio.TooSlowError:
            raise ConnectFailed(f"no session.created within {timeout:g} s") from None
        except ServerClosed:
            pass  # refused, or closed right after opening: told apart below
        self._opened = True
        if self.created is None:
            if self._open_errors:
                err = self._open_errors[0]
                with trio.move_on_after(2):
                    await self._done.wait()  # the close code follows the error
                cls = ResourceExhausted if err.code == error_codes.RESOURCE_EXHAUSTED else SessionRefused
                raise cls(err.code, err.message, self.close_code)
            raise ServerClosed(self.close_code, self.close_reason) from self.failure
        if self._open_errors:
            err = self._open_errors[0]
            raise ConfigRefused(err.code, err.message)
        if self._done.is_set() and self.closed_event is None:
            raise ServerClosed(self.close_code, self.close_reason) from self.failure


def _rejection(exc: ConnectionRejected) -> HandshakeRejected:
    message, code = "", None
    try:
        body = json.loads(exc.body or b"{}")
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            message, code = str(err.get("message", "")), err.get("code")
    except ValueError:
        message = (exc.body or b"").decode("utf-8", "replace")[:500]
    message = message or f"the server refused the WebSocket upgrade (HTTP {exc.status_code})"
    cls = Unauthorized if exc.status_code in (401, 403) else HandshakeRejected
    return cls(exc.status_code, message, code if isinstance(code, str) else None)


async def _connect(
    nursery: trio.Nursery,
    url: str,
    headers: list[tuple[bytes, bytes]],
    subprotocols: Sequence[str] | None,
    timeout: float,
    max_message_size: int,
    *,
    label: str,
) -> WebSocketConnection:
    try:
        with trio.fail_after(timeout):
            return await connect_websocket_url(
                nursery,
                url,
                extra_headers=headers,
                subprotocols=subprotocols,
                max_message_size=max_message_size,
                receive_buffer_size=_RECEIVE_BUFFER,
            )
    except ConnectionRejected as exc:
        raise _rejection(exc) from None
    except trio.TooSlowError:
        raise ConnectFailed(f"could not connect to {label} within {timeout:g} s") from None
    except (HandshakeError, OSError, ValueError) as exc:
        raise ConnectFailed(f"could not connect to {label}: {exc}") from exc


async def _held_connection(
    url: str,
    headers: list[tuple[bytes, bytes]],
    subprotocols: Sequence[str] | None,
    timeout: float,
    max_message_size: int,
    *,
    task_status: trio.TaskStatus[WebSocketConnection] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One more connection (a resume's) in a nursery of its own, so that a refused upgrade
    (raised by trio-websocket's reader task) fails this connection only: the failure is raised
    by ``nursery.start`` before the connection starts, and swallowed after."""
    started = False
    try:
        async with trio.open_nursery() as nursery:
            ws = await _connect(nursery, url, headers, subprotocols, timeout, max_message_size, label=url)
            started = True
            task_status.started(ws)
    except BaseExceptionGroup as group:
        cancelled, rest = group.split(trio.Cancelled)
        if cancelled is not None or not started:
            leaf = _only(group)
            if isinstance(leaf, ConnectionRejected):
                raise _rejection(leaf) from None
            if isinstance(leaf, HandshakeError):
                raise ConnectFailed(f"could not connect to {url}: {leaf!r}") from None
            if isinstance(leaf, ConnectFailed):
                _raise(leaf)
            raise
        del rest  # the reader of a connection already handed over failed: the connection is closed


@asynccontextmanager
async def open_duplex_client(
    url: str,
    *,
    api_key: str | None = None,
    config: Mapping[str, Any] | None = None,
    beta: bool = False,
    subprotocols: Sequence[str] | None = None,
    connect_timeout: float = 10.0,
    open_timeout: float = 30.0,
    close_timeout: float = 10.0,
    on_event: Callable[[ServerEvent], None] | None = None,
    queue_events: bool = True,
    max_message_size: int = DEFAULT_MAX_MESSAGE_BYTES,
    alignment: str | None = "client",
    resume: bool = False,
    resume_input_s: float = 10.0,
    accept_gap: bool = False,
) -> AsyncIterator[DuplexClient]:
    """Connect, open a session (with ``config`` when given) and yield the client; on exit, close
    the session and the socket.

    ``url``: ``ws://host:port/v1/realtime?duplex=1`` (OpenAI Realtime dialect) or
    ``ws://host:port/v1/duplex`` (native). ``api_key``: sent as ``Authorization: Bearer``.
    ``beta``: ask for OpenAI's beta event names (``OpenAI-Beta: realtime=v1``); the typed events
    are the same either way. ``on_event`` is called in the receive task for every event (keep it
    quick; an exception in it ends the connection and is re-raised on exit). ``alignment``: the
    session's ``duplex.alignment`` (docs/protocol.md §7): ``"client"`` (default: the client
    follows the server's alignment hints), ``"server"`` or ``"off"``; ``None`` sends nothing (a
    stock client: the server's default). A ``duplex`` key in ``config`` wins.

    ``resume``: open a resumable session (``session.create {resume: true}``; Realtime:
    ``resume=1`` added to the URL, which must have ``duplex=1``) that the client resumes by
    itself when its connection drops (see the module); ``resume_input_s``: seconds of input kept
    to re-send what the server did not receive; ``accept_gap``: when the server no longer holds
    every event missed, go on without them (else :class:`SessionLost`, cause ``journal_gap``).
    """
    dialect = _dialect_of(url)
    config, alignment = with_alignment(config, alignment)
    first_message = dialect == "realtime" and (config is not None or _autostart_off(url))
    wire_url = _with_query(url, autostart="0") if first_message else url
    if resume and dialect == "realtime":
        wire_url = _with_query(wire_url, resume="1")
    headers: list[tuple[bytes, bytes]] = []
    if api_key:
        headers.append((b"Authorization", f"Bearer {api_key}".encode()))
    if beta:
        headers.append((b"OpenAI-Beta", b"realtime=v1"))
    input_format, input_rate = _input_format_of(config or {})
    client: DuplexClient | None = None
    try:
        async with trio.open_nursery() as nursery:
            ws = await _connect(
                nursery, wire_url, headers, subprotocols, connect_timeout, max_message_size, label=url
            )
            reconnect: _Connector | None = None
            if resume:

                async def reconnect(target: str, timeout: float) -> WebSocketConnection:
                    held = partial(_held_connection, target, headers, subprotocols, timeout, max_message_size)
                    new_ws: WebSocketConnection = await nursery.start(held)
                    return new_ws

            client = DuplexClient(
                ws,
                dialect=dialect,
                input_format=input_format,
                input_rate=input_rate,
                on_event=on_event,
                queue_events=queue_events,
                alignment=alignment,
                reconnect=reconnect,
                url=url,
                resume_input_s=resume_input_s,
                accept_gap=accept_gap,
            )
            client._nursery = nursery
            client.connect_timeout = connect_timeout
            nursery.start_soon(client._receive_loop)
            graceful = False
            try:
                await client._open(config, first_message=first_message, timeout=open_timeout)
                if resume:
                    nursery.start_soon(client._upkeep)
                yield client
                graceful = True
            finally:
                with trio.CancelScope(shield=True):
                    if graceful:
                        with trio.move_on_after(close_timeout + 3):
                            await client.close(timeout=close_timeout)
                    elif not client.is_closed:
                        with trio.move_on_after(1):  # best effort: a clean reason in the log
                            try:
                                await client.send(SessionClose(event_id="abort"))
                            except ServerClosed:
                                pass
                    with trio.move_on_after(3):
                        await client.ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaf = _only(group)
        if leaf is None:
            raise
        # trio-websocket raises a refused upgrade in its reader task, i.e. out of the nursery
        if isinstance(leaf, ConnectionRejected):
            raise _rejection(leaf) from None
        if isinstance(leaf, HandshakeError):
            raise ConnectFailed(f"could not connect to {url}: {leaf!r}") from None
        _raise(leaf)
    if client is not None and client.failure is not None:
        raise client.failure
