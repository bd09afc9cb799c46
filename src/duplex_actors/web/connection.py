"""One WebSocket connection: a reader task and a writer task around one session.

The reader parses each client message (sans-io, ``duplex_actors.protocol``) and turns it into a
session command; a message that fails validation is recorded in the session log as ``rejected``
and answered with an ``error`` event, and the session goes on. The writer drains the session's
bounded event outbox, projects each event onto the dialect and sends it. Nothing here is awaited
by the scheduler or the session actor: if this client stops reading, the session's outbox fills
and the session closes itself (``slow_consumer``) while the writer stays blocked in the send
until TCP gives up (``TCP_USER_TIMEOUT``).

Close codes: client close and idle timeout 1000, server drain 1012 (after ``session.closing``),
runtime failures 1011, admission refused 1013, policy (bad first message, wrong model, a client
held back by its budget for too long: ``rate_limited``) 1008.

The reader spends a budget (``budget.InputBudget``: messages and bytes per second with a burst)
and waits for it before handling a message, and an append waits while the session's input
backlog is over its soft budget: either way the socket is not read and TCP pushes back on the
sender. A client held back continuously for ``RateLimits.persist_s`` is closed ``rate_limited``.

A session-frame wakes neither task when the transport allows it (``Transport.send_now`` and
``receive_directly``): a plain append that needs no wait is handled in the task that read it
while the reader waits with nothing queued, and the events the session emits while the writer
waits with nothing queued are projected and written in the task that emits them. Anything else
takes the reader's and the writer's way, in order behind what they hold.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from .. import close_reasons as reasons
from .. import error_codes
from ..admission import LogUnavailable, ResourceExhausted
from ..counters import Counters
from ..faults import Faults
from ..protocol import wire_events as pe
from ..protocol.converter import encode_server_event
from ..protocol.errors import ProtocolError
from ..server import DuplexServer, SessionHandle, SlotReservation
from ..session import events as ev
from ..session.journal import CursorAhead
from .asgi_ws import NOT_SENT, PENDING
from .budget import InputBudget, RateLimits
from .channel_state import receiver_waits_idle
from .dialects import (
    AppendCommand,
    Dialect,
    EventAckCommand,
    HeartbeatCommand,
    Opening,
    OutboundMessage,
    Projection,
    WireMessage,
)
from .resumable import (
    DROPPED,
    READ_TIMEOUT,
    REPLACED,
    ResumableSession,
    ResumeRefused,
    ResumeSettings,
    ResyncRequired,
)
from .wire_text import wire_message

log = logging.getLogger(__name__)

CLOSE_CODES = {
    reasons.CLIENT_CLOSE: 1000,
    reasons.TIMEOUT: 1000,
    reasons.SERVER_SHUTDOWN: 1012,
    reasons.ERROR: 1011,
    reasons.LOG_UNAVAILABLE: 1011,
    reasons.SLOW_CONSUMER: 1011,
    reasons.RATE_LIMITED: 1008,
    reasons.INVALID_AUDIO: 1007,
    reasons.CODEC_LOST: 1011,
}


def capabilities(max_sessions: int, *, resume: bool = False) -> dict[str, Any]:
    """The session object's ``capabilities`` for model-native duplex (identical for every
    session); ``resume``: sessions may opt in to resume (docs/protocol.md §10)."""
    multi = max_sessions > 1
    return {
        "implementation_level": "model_native_duplex",
        "chunk_period_ms": 80,
        "supports_client_commit": False,
        "supports_external_turn_signal": False,
        "supports_barge_in": False,
        "supports_session_resume": resume,
        "supports_audio_truncate": False,
        "supports_playback_ack": True,
        "supports_input_append": True,
        "supports_multi_session": multi,
        "supports_multi_session_same_replica": multi,
        "input_modes": ["append_audio_chunk"],
    }


# After the idle deadline, how long what already waits in the socket gets to arrive.
IDLE_GRACE_S = 0.25
# A client held back by its budget is read again no sooner than this: at 200 messages/s one
# wake-up admits ~4 of them instead of one wake-up (and timer) per message. The rate is the same.
HOLD_QUANTUM_S = 0.02
_NOTHING: Any = object()  # no message pending
# Messages the writer sends in one write at most (a client far behind gets them in several).
MAX_BATCH_MESSAGES = 64


class Transport:
    """What a connection needs from the WebSocket (``web.asgi_ws.AsgiWebSocket`` in the app).
    ``send_many`` sends several messages in one write (default: one ``send`` each).

    Optional, for a transport that can do without a task hop (``AsgiWebSocket`` under the
    hardened hypercorn): ``send_now(make)`` writes the messages ``make()`` returns without an
    await when the socket is free to take them (``NOT_SENT``: ``make`` was not called;
    ``SENT``; ``PENDING``: the rest waits for ``flush()``, and no send overtakes it);
    ``receive_directly(handler)`` offers each client message to ``handler`` in the task that
    read it (True: handled) while the reader waits with nothing queued."""

    def __init__(
        self,
        receive: Callable[[], Awaitable[WireMessage]],
        send: Callable[[WireMessage], Awaitable[object]],
        close: Callable[[int, str], Awaitable[object]],
        send_many: Callable[[list[WireMessage]], Awaitable[object]] | None = None,
        disconnect_code: Callable[[], int | None] | None = None,
        *,
        send_now: Callable[[Callable[[], list[WireMessage]]], int] | None = None,
        flush: Callable[[], Awaitable[object]] | None = None,
        receive_directly: Callable[[Callable[[WireMessage], bool] | None], None] | None = None,
    ) -> None:
        self.receive = receive
        self.send = send
        self.close = close
        self.send_many = send_many or self._send_each
        # The close code the client's disconnect came with (None: not known, or not yet).
        self.disconnect_code = disconnect_code or (lambda: None)
        self.send_now = send_now
        self.flush = flush
        self.receive_directly = receive_directly

    async def _send_each(self, messages: list[WireMessage]) -> None:
        for message in messages:
            await self.send(message)


class Connection:
    """One WebSocket connection's reader and writer around its session.

    A dialect that handles its own wire (``web.api_chat.ApiChatConnection``) overrides the hooks
    ``send_message``, ``write_events`` (the writer task, which ends with ``end_writing``) and
    ``handle_message`` (one client message), and may use ``start_soon`` and ``socket_closed``.
    """

    def __init__(
        self,
        server: DuplexServer[Any],
        transport: Transport,
        *,
        dialect: Dialect,
        idle_timeout_s: float,
        counters: Counters,
        faults: Faults | None = None,
        reservation: SlotReservation | None = None,
        rate_limits: RateLimits | None = None,
        resume: ResumeSettings | None = None,
        key_fingerprint: bytes = b"",
        session_id: str | None = None,
    ) -> None:
        self.server = server
        self.session_id = session_id  # made at the handshake (None: the server makes one)
        self.resume_settings = resume or ResumeSettings(grace_s=0)
        self.key_fingerprint = key_fingerprint
        self.resumable: ResumableSession | None = None  # a resumable session's shared state
        self.generation = 1  # the attachment this connection is (resumable sessions)
        self._replaced = False  # another connection took the session over
        self._detach_reason: str | None = None
        self.rate_limits = rate_limits or RateLimits()
        self.reservation = reservation  # the slot held at the handshake, if any
        self.transport = transport
        self.dialect = dialect
        self.idle_timeout_s = idle_timeout_s
        self.counters = counters
        self.faults = faults
        self.session: SessionHandle | None = None
        self.draining = False
        self._closing_sent = False
        self._closed_code: int | None = None
        self._nursery: trio.Nursery | None = None
        self._budget: InputBudget | None = None  # the reader's, once it reads
        self._reading = False  # the reader waits for the next message (its idle scope below)
        self._idle: trio.CancelScope | None = None
        self._direct_input_at = -math.inf  # when _receive_now last handled a message

    # -- hooks ---------------------------------------------------------------------------------
    async def send_message(self, message: OutboundMessage) -> None:
        """Send one message by itself (a refusal; the writer sends its batches in one write)."""
        await self.transport.send(wire_message(message))

    # -- for the hooks ---------------------------------------------------------------------------
    @property
    def socket_closed(self) -> bool:
        """Whether the WebSocket close has been sent."""
        return self._closed_code is not None

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run a task beside the reader and the writer (nothing once the connection has ended)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def end_writing(self, closed: ev.SessionClosed | None) -> None:
        """The writer's end: close the socket with the code of the session's close reason
        (``closed``, or the session's own when its ``SessionClosed`` never reached the writer)
        and stop the reader."""
        assert self.session is not None
        if closed is not None:
            code = CLOSE_CODES.get(closed.reason)
            if code is not None:
                await self._close(code, closed.reason)
        else:
            # The session ended without its events reaching us (the outbox overflowed: a slow
            # consumer): the socket still gets the close code of why it ended.
            reason = self.session.close_reason or reasons.ERROR
            await self._close(CLOSE_CODES.get(reason, 1011), reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- sending ---------------------------------------------------------------------------------
    async def _close(self, code: int, reason: str = "") -> None:
        if self._closed_code is None:
            self._closed_code = code
            self.counters.close_codes[code] += 1
            await self.transport.close(code, reason)

    async def refuse(
        self, code: str, message: str, close_code: int, client_event_id: str | None = None
    ) -> None:
        self.counters.refused[code] += 1
        await self.send_message(self.dialect.refusal(code, message, client_event_id))
        await self._close(close_code, code)

    # -- the connection --------------------------------------------------------------------------
    async def run(self, opening: Opening | None = None) -> None:
        """Open the session (admission, or the slot reserved at the handshake), process the
        opening's pending message, then read and write until the session closes."""
        opening = opening or Opening()
        try:
            self.session = await self.server.open_session(
                opening.config,
                dialect=self.dialect.name,
                output=self.dialect.output,
                client_event_id=opening.client_event_id,
                reservation=self.reservation,
                session_id=self.session_id,
            )
        except ResourceExhausted as exc:
            await self.refuse(error_codes.RESOURCE_EXHAUSTED, str(exc), 1013)
            return
        except LogUnavailable as exc:
            await self.refuse(error_codes.LOG_UNAVAILABLE, str(exc), 1011)
            return
        projection = self.dialect.projection(self.session.session_id)
        writer: Callable[[], Awaitable[None]] = partial(self.write_events, projection)
        if opening.resume and self.resume_settings.enabled:
            rs = self.resumable = ResumableSession(
                self.server,
                self.session,
                projection,
                key_fingerprint=self.key_fingerprint,
                settings=self.resume_settings,
                counters=self.counters,
                dialect=self.dialect.name,
            )
            self.server.resumable[rs.session_id] = rs
            rs.replace_attachment = self._replace
            self.server.start_soon(rs.pump)
            writer = partial(self.write_journal, rs, 0, first=True)
        await self._serve(writer, opening.pending)

    async def resume(self, request: pe.SessionResume) -> None:
        """Take a resumable session over (the first message was ``session.resume``): refused
        with an error and a close, or answered ``session.resumed``, the journal after the
        client's cursor, then live output."""
        rs = self.server.resumable.get(request.session_id)
        try:
            if rs is None and self.server.resume_tombstones.holds(request.session_id, trio.current_time()):
                raise ResumeRefused(
                    error_codes.SESSION_RESUME_EXPIRED, "the session has ended, or its grace expired", 1000
                )
            if rs is None:
                raise ResumeRefused(
                    error_codes.SESSION_NOT_FOUND,
                    "no such session here: the process that held it restarted or is gone, or the id is wrong",
                    1000,
                )
            if rs.dialect != self.dialect.name:
                raise ResumeRefused(
                    error_codes.INVALID_SESSION_RESUME, f"the session was opened on {rs.dialect}", 1008
                )
            claim = rs.claim(request, self.key_fingerprint)
        except ResumeRefused as exc:
            self.counters.resumes[exc.code] += 1
            await self.refuse(exc.code, str(exc), exc.close_code, request.event_id)
            return
        except ResyncRequired as exc:
            self.counters.resumes["resync_required"] += 1
            assert rs is not None
            message = pe.SessionResyncRequired(
                rs.session_id, "journal_gap", exc.oldest, _resume_event_id(rs, "y")
            )
            await self.send_message(encode_server_event(message))
            await self._close(1000, "resync_required")
            return
        try:
            record = await rs.take_over(claim)
        except BaseException:
            rs.abandon()
            raise
        self.session = rs.handle
        self.resumable = rs
        self.generation = claim.generation
        rs.replace_attachment = self._replace
        resumed = pe.SessionResumed(
            session_id=rs.session_id,
            attachment_generation=claim.generation,
            resume_token=claim.token,
            last_server_event_seq=record.last_server_event_seq,
            replay_from_server_event_seq=record.replay_from,
            input_samples_received=record.input_samples_received,
            last_client_event_id=record.last_client_event_id,
            resume_grace_s=rs.settings.grace_s,
            event_id=_resume_event_id(rs, f"r{claim.generation}"),
        )
        preamble = [wire_message(encode_server_event(resumed))]
        await self._serve(partial(self.write_journal, rs, claim.replay_from - 1, preamble=preamble), None)

    async def _serve(self, writer: Callable[[], Awaitable[None]], pending: WireMessage | None) -> None:
        assert self.session is not None
        reason = reasons.DISCONNECT  # the handler is cancelled when the client's socket drops
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(writer)
                if pending is not None:
                    await self.handle_message(pending)
                await self._reader()
        except Exception:
            reason = reasons.ERROR
            raise
        finally:
            self._nursery = None  # closed: a late drain() must not start tasks in it
            with trio.CancelScope(shield=True):
                await self._end(reason)

    async def _end(self, reason: str) -> None:
        """The connection is over: close its session, or, for a resumable one that the client
        did not close, detach it (the session waits for a resume)."""
        session, rs = self.session, self.resumable
        if session is None or session.closed:
            return
        if self.draining:
            # The drain closes the session; a drop that lands at the same moment (and cancels the
            # drain's close along with the handler) does not change why it ended.
            reason = reasons.SERVER_SHUTDOWN
        if rs is None:
            await session.close(reason)
            return
        if self._replaced:
            await rs.detach(self.generation, REPLACED)
            replaced = pe.SessionReplaced(
                rs.session_id, self.generation, _resume_event_id(rs, f"x{self.generation}")
            )
            with trio.move_on_after(1.0):
                try:
                    await self.send_message(encode_server_event(replaced))
                    await self._close(1000, "session_replaced")
                except Exception:
                    pass  # a half-open socket: nobody reads it
            return
        dropped = self._detach_reason is not None or (
            reason == reasons.DISCONNECT and self.transport.disconnect_code() not in (1000, 1001)
        )
        if dropped and not self.draining:  # a drain ends the session, even one its reader let go
            await rs.detach(self.generation, self._detach_reason or DROPPED)
        else:
            await session.close(reason)

    def _replace(self) -> None:
        """Another connection takes this one's session over: stop reading and writing."""
        self._replaced = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def write_journal(
        self,
        rs: ResumableSession,
        cursor: int,
        *,
        first: bool = False,
        preamble: list[WireMessage] | None = None,
    ) -> None:
        """The writer of a resumable session: the journal from ``cursor`` on, after
        ``session.created`` with the token (``first``) or ``preamble`` (``session.resumed``)."""
        batch: list[WireMessage] = list(preamble or [])
        if first:
            await rs.wait_created()
            if rs.created is not None:
                batch.insert(0, wire_message(rs.created_message(rs.credential.issue())))
        while True:
            # What is there now goes with the preamble, which never waits for more.
            messages = (
                rs.journal.after(cursor, MAX_BATCH_MESSAGES)
                if batch
                else await rs.next_messages(cursor, MAX_BATCH_MESSAGES)
            )
            if not messages and not batch:
                break
            batch.extend(messages)
            await self.transport.send_many(batch)
            cursor += len(messages)
            rs.sent = max(rs.sent, cursor)
            batch = []
        session = self.session
        assert session is not None
        await session.wait_closed()
        await self.end_writing(None)

    def drain(self) -> None:
        """Server shutdown: tell the client, close the session, close the socket with 1012."""
        self.draining = True
        rs = self.resumable
        if rs is not None and not self._closing_sent:
            self._closing_sent = True
            closing = rs.projection.closing_event(reasons.SERVER_SHUTDOWN)
            if closing is not None:
                rs.add_closing(wire_message(closing))
        if self.session is not None and self._nursery is not None and not self.session.closed:
            try:
                self._nursery.start_soon(self.session.close, reasons.SERVER_SHUTDOWN)
            except RuntimeError:  # the connection is finishing on its own
                pass

    async def write_events(self, projection: Projection) -> None:
        """The writer task: project the session's events and send them until the session closes,
        then :meth:`end_writing`. What is already queued when the writer wakes (a tick's frame
        and its transcript, a burst after a stall) goes in one write."""
        session = self.session
        assert session is not None
        events = session.events()
        closed: ev.SessionClosed | None = None
        direct = self.transport.send_now is not None
        if direct:
            session.emit_directly(partial(self._emit_now, projection, events))
        try:
            while closed is None:
                try:
                    event = await events.receive()
                except trio.EndOfChannel:
                    break
                batch: list[WireMessage] = []
                while True:
                    if self.draining and not self._closing_sent:
                        self._closing_sent = True
                        closing = projection.closing_event(reasons.SERVER_SHUTDOWN)
                        if closing is not None:
                            batch.append(wire_message(closing))
                    batch.extend(wire_message(message) for message in projection.project(event))
                    if isinstance(event, ev.SessionClosed):
                        closed = event
                        break
                    if len(batch) >= MAX_BATCH_MESSAGES:
                        break
                    try:
                        event = events.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if batch:
                    await self.transport.send_many(batch)
        finally:
            if direct:
                session.emit_directly(None)
        await self.end_writing(closed)

    def _emit_now(
        self,
        projection: Projection,
        events: trio.MemoryReceiveChannel[ev.SessionEvent],
        emitted: list[ev.SessionEvent],
    ) -> bool:
        """The writer's work for events the session emits while the writer waits with nothing
        queued, done in the task that emits them (no task wakes to send a step's audio); False
        (nothing done: they go to the writer) when the writer is busy or has events queued, the
        server drains, the socket is closing or cannot take a write now, or one ends the session."""
        if self.draining or self._closed_code is not None:
            return False
        if not receiver_waits_idle(events):
            return False
        for event in emitted:
            if isinstance(event, ev.SessionClosed):
                return False
        send_now = self.transport.send_now
        assert send_now is not None

        def messages() -> list[WireMessage]:
            return [wire_message(message) for event in emitted for message in projection.project(event)]

        outcome = send_now(messages)
        if outcome == NOT_SENT:
            return False
        if outcome == PENDING and self.transport.flush is not None:
            self.start_soon(self.transport.flush)
        return True

    async def _reader(self) -> None:
        session = self.session
        assert session is not None
        budget = self._budget = InputBudget(self.rate_limits, trio.current_time())
        direct = self.transport.receive_directly
        if (
            direct is not None
            and type(self).handle_message is Connection.handle_message  # not a dialect's own
            and self.resumable is None
            and (self.faults is None or not self.faults.active)
        ):
            direct(partial(self._receive_now, budget))
        else:
            direct = None
        try:
            await self._read(session, budget)
        finally:
            self._reading = False
            if direct is not None:
                direct(None)

    async def _read(self, session: SessionHandle, budget: InputBudget) -> None:
        resumed = False
        while not session.closed:
            # One idle scope for many messages (a scope per message cost more than parsing a
            # small append): its deadline moves on at each receive and is lifted while the
            # message is handled, so it only ever cancels a receive.
            data: Any = _NOTHING
            with trio.CancelScope() as idle:
                self._idle = idle
                while not session.closed:
                    # After messages handled in the task that read them (:meth:`_receive_now`)
                    # kept a receive waiting past its deadline, the next runs from the last.
                    start = self._direct_input_at if resumed else trio.current_time()
                    resumed = False
                    idle.deadline = start + self.idle_timeout_s
                    self._reading = True
                    try:
                        received = await self.transport.receive()
                    finally:
                        self._reading = False
                    idle.deadline = math.inf
                    if idle.cancel_called:  # expired as the message came: handled outside
                        data = received
                        break
                    if not await self._admit_and_handle(budget, received):
                        return
            if idle.cancelled_caught and trio.current_time() < self._direct_input_at + self.idle_timeout_s:
                resumed = True
                continue
            if idle.cancelled_caught:
                # Idle means nothing arrived, not that the loop did not look (a process paused
                # past the deadline finds the client's messages waiting in the socket): what
                # the transport delivers within a short grace still counts.
                with trio.move_on_after(IDLE_GRACE_S) as grace:
                    data = await self.transport.receive()
                if grace.cancelled_caught:
                    if self.resumable is not None:
                        self._detach_reason = READ_TIMEOUT  # a half-open client: it may come back
                        return
                    await session.close(reasons.TIMEOUT)
                    return
            if data is not _NOTHING and not await self._admit_and_handle(budget, data):
                return

    def _receive_now(self, budget: InputBudget, data: WireMessage) -> bool:
        """The reader's work for an append that needs no wait, done in the task that read it
        while the reader waits for its next message (True: handled; it counts as input for the
        idle deadline as a receive does). False, nothing done or charged, for anything else: a
        message that is not a plain append or fails to parse, a client the budget holds back,
        a session backlog to wait for; the reader then takes it in order."""
        session = self.session
        idle = self._idle
        if not self._reading or session is None or session.closed or idle is None:
            return False
        now = trio.current_time()
        if budget.persistent(now, session.input_held_since) or not budget.admits_now(now, len(data)):
            return False
        try:
            command = self.dialect.parse(data, session.core.config)
        except ProtocolError:
            return False
        if type(command) is not AppendCommand:
            return False
        try:
            if not command.nowait(session, now):
                return False
        except trio.ClosedResourceError:
            pass  # the session ended meanwhile: the writer closes, as the reader would leave it
        budget.take_admitted(len(data))
        # The idle deadline is not moved here (a deadline move per message costs more than the
        # rest of this check): the reader asks when it expires (:meth:`_read`).
        self._direct_input_at = now
        return True

    async def _admit_and_handle(self, budget: InputBudget, data: WireMessage) -> bool:
        """Wait for the budget, then handle one message; False once the reader must stop (the
        session closed, or the client stayed held back too long and was closed)."""
        session = self.session
        assert session is not None
        size = len(data) if data is not None else 0
        while (delay := budget.admit(trio.current_time(), size)) > 0:
            if budget.persistent(trio.current_time(), session.input_held_since):
                await self._rate_limited()
                return False
            # The socket is not read meanwhile: TCP pushes back.
            await trio.sleep(max(delay, HOLD_QUANTUM_S))
        await self.handle_message(data)
        if session.closed:
            return False
        if budget.persistent(trio.current_time(), session.input_held_since):
            await self._rate_limited()
            return False
        return True

    async def _control_budget(self, data: WireMessage) -> bool:
        """Wait until a text message that is not an append fits the control bytes of the
        budget (``RateLimits.control_bytes_per_s``): the socket is not read meanwhile. False
        (not to be handled) once the client stayed held back too long and was closed."""
        budget, session = self._budget, self.session
        if budget is None or session is None or not isinstance(data, str):
            return True
        while (delay := budget.admit_control(trio.current_time(), len(data))) > 0:
            if budget.persistent(trio.current_time(), session.input_held_since):
                await self._rate_limited()
                return False
            await trio.sleep(max(delay, HOLD_QUANTUM_S))
        return True

    async def _rate_limited(self) -> None:
        """The client stayed beyond its budget: say so, close the session (1008)."""
        assert self.session is not None
        limits = self.rate_limits
        message = (
            f"held back for over {limits.persist_s:g} s: more than {limits.messages_per_s:g} "
            f"messages/s, {limits.bytes_per_s:g} bytes/s or a couple of seconds of audio ahead "
            "of real time; send in real time"
        )
        log.warning("session %s: rate limited, closing", self.session.session_id)
        try:
            await self.session.reject("connection", error_codes.RATE_LIMITED, message)
        except trio.ClosedResourceError:
            return
        await self.session.close(reasons.RATE_LIMITED)

    async def handle_message(self, data: WireMessage) -> None:
        """Handle one client message that the input budget admitted."""
        session = self.session
        assert session is not None
        if self.faults is not None:
            self.faults.before_message()
        try:
            command = self.dialect.parse(data, session.core.config)
        except ProtocolError as err:
            if await self._control_budget(data):
                await session.reject(err.event_type or "unknown", err.code, err.message, err.client_event_id)
            return
        if type(command) is not AppendCommand and not await self._control_budget(data):
            return
        rs = self.resumable
        if rs is not None and type(command) is EventAckCommand:
            try:
                rs.ack(command.server_event_seq)
            except CursorAhead as exc:
                await session.reject(
                    pe.SessionEventAck.TYPE, error_codes.INVALID_EVENT_ACK, str(exc), command.client_event_id
                )
            return
        if rs is not None and type(command) is HeartbeatCommand:
            rs.prove()
        try:
            # An append that needs no wait is queued without a trip through the scheduler (the
            # next receive is the reader's checkpoint); any other, or one that must wait, is awaited.
            if type(command) is not AppendCommand or not command.nowait(session):
                await command(session)
        except trio.ClosedResourceError:
            pass  # the session ended meanwhile (slow consumer, log failure): the writer closes


def _resume_event_id(rs: ResumableSession, suffix: str) -> str | None:
    """The ``event_id`` of a resume message: Realtime events have one, native ones none."""
    if rs.dialect != "realtime":
        return None
    return f"evt_{rs.session_id.removeprefix('sess_')}_{suffix}"


__all__ = ["Connection", "Transport", "capabilities"]
