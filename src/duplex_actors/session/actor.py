"""The session actor: one Trio task per session, a thin shell around the session core.

For each item of its inbox (a client command or a step result) it builds the log record,
appends it to the session log *first*, applies it to the core, then carries out the effects
(a control command that the client gets an acknowledgement of, see ``ACKNOWLEDGED``, is applied
only once its record is committed, so no acknowledgement goes out ahead of its record):
submit frames and resets to the scheduler (never blocking), emit events to a bounded outbox
(never blocking: a consumer that falls behind by ``outbox_size`` events is closed with
``slow_consumer``), and release the slot on close. It never awaits a socket or the model.

While the actor waits on an empty inbox, a record that needs no wait (a step result, a plain
append, with room in the log) is handled at once in the task that brings it (the link's, the
connection's), exactly as the actor would handle it: nothing is queued ahead of it, so the order
is the same, and no task wakes for a session-frame. What needs the actor's own task (the slot's
release, a close, an error to raise) is handed over through the inbox (``Handover``). Events go
to the connection's writer at once when it takes them (``emit_directly``), else to the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from .. import close_reasons as reasons
from .. import error_codes
from ..audio import FORMATS, float_to_pcm16
from ..counters import Counters
from ..error_codes import code_of
from ..log import records as r
from ..log.writer import LogBackpressure
from . import events as ev
from .alignment import Aligner, ClientHint, Grid, ServerPad
from .core import Effect, Emit, ReleaseSlot, ResetSlot, SessionCore, State, SubmitFrame, input_samples
from .inbox import Inbox

log = logging.getLogger(__name__)

# How long a record may wait for room in the log writer's queue before the session ends.
LOG_ROOM_TIMEOUT_S = 2.0

# Records whose events acknowledge a client's control command (``session.updated``,
# ``session.heartbeat_ack``, ``playback.acknowledged``): applied, so acknowledged, only once the
# record is durable. Waiting here keeps the events in log order (replay stays byte-identical);
# audio deltas (step records) do not wait for their own commit.
# A ``resume`` is durable before the resumed client is answered.
ACKNOWLEDGED: tuple[type[r.Record], ...] = (r.Update, r.Heartbeat, r.PlaybackAck, r.Resume)


class SessionLogHandle(Protocol):
    """One session's log as the actor sees it (``duplex_actors.log.writer.SessionLog``)."""

    @property
    def path(self) -> Path:
        """The log file, for whoever ships or reads it once it is closed."""
        ...

    @property
    def failed(self) -> BaseException | None:
        """The write or fsync error that ended the log, if any: nothing more can be written."""
        ...

    def append_nowait(self, record: r.Record) -> int:
        """Queue a record and return its sequence number; raises ``LogBackpressure`` when the
        writer's queue is full."""
        ...

    def room_for(self, records: int) -> bool:
        """Whether ``append_nowait`` takes that many more records now."""
        ...

    async def wait_durable(self, seq: int) -> None:
        """Return once record ``seq`` is committed; raises if the log failed or closed first."""
        ...

    async def wait_for_room(self) -> None:
        """Return once the writer's queue has room (or cannot take records any more)."""
        ...

    def close_nowait(self) -> None: ...

    async def wait_closed(self) -> None: ...


class SchedulerHandle(Protocol):
    """The scheduler as a session sees it (``duplex_actors.scheduler.actor.Scheduler``)."""

    def submit_nowait(self, slot: int, frame_index: int, samples: Any, padded: bool = False) -> None: ...
    def request_reset(self, slot: int, epoch: int, prompt: Any) -> None: ...
    async def release(self, slot: int) -> None: ...
    def grid(self) -> Grid | None:
        """The tick grid the aligner aligns to (None: no grid policy, or no tick yet)."""
        ...


@attrs.frozen(slots=True)
class Arrived:
    """An append in the inbox, with the time it arrived (for the aligner)."""

    append: r.Append
    at: float


@attrs.frozen(slots=True)
class Handover:
    """What a record handled in another task leaves to the actor's own task: the effects from
    the slot's release on (a release awaits the scheduler), or the error that ends the session."""

    effects: Sequence[Effect] = ()
    error: BaseException | None = None


# Records the sync path logs for one append at most: a pad or hint, then the append.
RECORDS_PER_APPEND = 2


class SessionActor:
    def __init__(
        self,
        core: SessionCore,
        *,
        slot: int,
        scheduler: SchedulerHandle,
        session_log: SessionLogHandle,
        outbox: trio.MemorySendChannel[ev.SessionEvent],
        max_commands: int = 256,
        counters: Counters | None = None,
        aligner: Aligner | None = None,
        burst_floor_ms: Callable[[], float] | None = None,
    ) -> None:
        self.core = core
        self.slot = slot
        self.scheduler = scheduler
        self.log = session_log
        self.outbox = outbox
        self.inbox: Inbox[r.Record | Arrived | Handover] = Inbox(max_commands)
        self.done = trio.Event()
        self.close_reason: str | None = None
        self.log_error: BaseException | None = None
        self._consumer_gone = False
        self._released = False
        self.counters = counters
        self._stop_submitting = False  # after a failed step: nothing more goes to the model
        self._queued_input = 0  # 24 kHz samples of appends in the inbox, not yet applied
        self._progress = trio.Event()  # set (and replaced) after a record is handled, if awaited
        self._progress_waiters = 0
        self._commands_done = 0  # client commands handled (inbox ordinals up to this one)
        # Alignment (docs/protocol.md §7): the aligner sees every append before it is logged, with
        # the time it arrived (an append waits in the inbox as :class:`Arrived`).
        self.aligner = (
            aligner if aligner is not None else Aligner(max_total_pad_samples=core.limits.max_pad_samples)
        )
        self._tail_before_pad: int | None = None  # the tail before a client pad, for its append
        self._burst_floor_ms = burst_floor_ms  # the server's pre-tick burst, for the aligner
        self.last_client_event_id: str | None = None  # of the last client command handled
        # After a resume, the frames up to this index are the client's re-sent backlog: never
        # drained (the client sent them once already; they are the conversation).
        self.undrainable_until = 0
        # Waiting for its inbox (while the inbox is empty too, a record is handled at once in
        # the task that brings it: the link's for a step, the connection's for an append).
        self._parked = False
        # The connection's writer, when it can take events at once (True: sent; False: they go
        # to the outbox): no task wakes to send a step's audio.
        self.emit_directly: Callable[[list[ev.SessionEvent]], bool] | None = None

    @property
    def session_id(self) -> str:
        return self.core.session_id

    # -- the Occupant interface of the scheduler -------------------------------------------------
    def deliver_nowait(self, result: Any) -> None:
        out = result.output
        self.deliver_record_nowait(
            r.Step(
                epoch=result.epoch,
                frame_index=result.frame_index,
                ready=out.ready,
                text_token=out.text_token,
                text_piece=out.text_piece,
                agent_codes=tuple(out.agent_codes),
                user_codes=tuple(out.user_codes),
                pcm16=float_to_pcm16(out.pcm),
            )
        )

    def deliver_record_nowait(self, record: r.Step) -> None:
        """A step result as its log record (the engine core's link sends them so)."""
        if self.inbox.closed:  # stepped while the session ended: count it as dropped
            self._count_dropped_at_close(1)
            return
        if self._can_handle_now(1):
            try:
                self._handle_now(record)
            except Exception as exc:
                self._crashed(exc)
            self._progressed()
            return
        self.inbox.put_result_nowait(record)

    def _can_handle_now(self, records: int) -> bool:
        """Whether a record can be handled at once in the caller's task, exactly as the actor
        would handle it now: the actor waits for its inbox, which is empty (nothing to keep
        order with), and the log takes ``records`` records without a wait."""
        return (
            self._parked
            and not self.inbox
            and self.log_error is None
            and not self.core.closed
            and self.log.room_for(records)
        )

    def _crashed(self, exc: BaseException) -> None:
        """A record handled in another task raised: the actor's task raises it (and ends the
        session as it does for its own errors), never the task that brought the record."""
        log.error("session %s: handling a record failed", self.session_id, exc_info=exc)
        self.inbox.put_result_nowait(Handover(error=exc))

    def _progressed(self) -> None:
        # Nobody waits for most records: their event is neither set nor replaced.
        if self._progress_waiters:
            self._progress.set()
            self._progress = trio.Event()

    async def _wait_progress(self) -> None:
        """Until the next record is handled (or the actor ends)."""
        self._progress_waiters += 1
        try:
            await self._progress.wait()
        finally:
            self._progress_waiters -= 1

    def reset_failed(self, exc: BaseException) -> None:
        """The scheduler could not give this session a fresh context: end it, say why."""
        code = code_of(exc, error_codes.INTERNAL_ERROR)
        if code in (error_codes.CHECKPOINT_ERROR, error_codes.INTERNAL_ERROR):
            code, message = error_codes.INTERNAL_ERROR, "the model could not start this session's context"
        else:
            message = str(exc)
        self._stop_submitting = True
        self.inbox.put_result_nowait(r.Rejected("session.reset", code, message))
        self.inbox.put_result_nowait(r.Close(reasons.ERROR))

    def step_failed(self, exc: BaseException) -> None:
        """The model step carrying this session's frame failed: end the session (1011)."""
        self._stop_submitting = True
        self.inbox.put_result_nowait(
            r.Rejected("model.step", error_codes.INTERNAL_ERROR, "the model failed on this session's audio")
        )
        self.inbox.put_result_nowait(r.Close(reasons.ERROR))

    async def send(self, record: r.Record, *, applied: bool = False) -> None:
        """A client command, in order; waits while too many commands are queued. ``applied``:
        also wait until the actor has handled it (its record committed and applied to the
        core), so that what the caller reads of the core next (the config a client's next
        append is parsed with) includes it."""
        item: r.Record | Arrived = record
        samples = 0
        if isinstance(record, r.Append):
            samples = input_samples(record)
            item = Arrived(record, trio.current_time())
        self._queued_input += samples
        try:
            ordinal = await self.inbox.put_command(item)
        except BaseException:
            self._queued_input -= samples  # not queued
            raise
        while applied and self._commands_done < ordinal and not self.done.is_set():
            await self._wait_progress()

    async def wait_handled(self) -> None:
        """Until every command queued so far has been handled (appends queued without a wait
        included): what the caller reads of the core next reflects them."""
        ordinal = self.inbox.commands_put
        while self._commands_done < ordinal and not self.done.is_set():
            await self._wait_progress()

    def send_nowait(self, record: r.Record) -> None:
        """Queue a command that is not an append without waiting (the opening's records, into
        an inbox that has room for them); ``RuntimeError`` when the inbox is full."""
        if isinstance(record, r.Append):
            raise TypeError("appends go through send() or send_append_nowait()")
        if self.inbox.put_command_nowait(record) is None:
            raise RuntimeError(f"session {self.session_id}: the inbox is full")

    def send_append_nowait(self, record: r.Append, now: float | None = None) -> bool:
        """Queue an append when that needs no wait (room in the inbox, the backlog within its
        soft budget or the append past the hard limit, see :meth:`wait_for_input_room`);
        False, nothing queued, otherwise. ``now``: the trio clock at its arrival (read here
        when None)."""
        samples = input_samples(record)
        limits = self.core.limits
        backlog = self.core.buffered_samples + self._queued_input
        if backlog > limits.input_budget_samples and backlog + samples <= limits.max_buffered_samples:
            return False
        if self.inbox.closed:
            raise trio.ClosedResourceError("the session has ended")
        if now is None:
            now = trio.current_time()
        if self._can_handle_now(RECORDS_PER_APPEND):
            self.inbox.count_handled_command()
            try:
                self._append_now(record, now)
            except Exception as exc:
                self._crashed(exc)
            self._commands_done = self.inbox.commands_taken
            self._progressed()
            return True
        if self.inbox.put_command_nowait(Arrived(record, now)) is None:
            return False
        self._queued_input += samples
        return True

    @property
    def input_backlog(self) -> int:
        """Input received and not yet stepped (24 kHz samples), the appends still queued too."""
        return self.core.buffered_samples + self._queued_input

    async def wait_for_input_room(self, record: r.Append) -> bool:
        """Wait while the backlog is over the soft budget (``input_budget_samples``), so that the
        caller stops reading its client and TCP pushes back. An append the core would refuse
        anyway (over the hard limit) returns at once: it is refused cheaply, without waiting.
        Returns whether it waited."""
        limits = self.core.limits
        if self.input_backlog + input_samples(record) > limits.max_buffered_samples:
            return False
        waited = False
        while self.input_backlog > limits.input_budget_samples and not self.done.is_set():
            waited = True
            await self._wait_progress()
        return waited

    # -- the actor ---------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while not self.core.closed:
                if self.inbox:
                    item = await self.inbox.get()
                else:
                    self._parked = True
                    try:
                        item = await self.inbox.get()
                    finally:
                        self._parked = False
                if isinstance(item, Handover):
                    if item.error is not None:
                        raise item.error
                    await self._carry_out_all(item.effects)
                elif isinstance(item, Arrived):
                    self._queued_input -= input_samples(item.append)
                    checked = await self._align(item.append, item.at)
                    if self.core.closed:  # its pad or hint could not be logged: the session ended
                        break
                    if checked is None:
                        await self._handle(item.append)
                    else:
                        await self._handle(checked, checked=True)
                else:
                    await self._handle(item)
                self._commands_done = self.inbox.commands_taken
                self._progressed()
        except BaseException:
            # Cancelled (server teardown) or a bug: still finish the log and free the slot.
            with trio.CancelScope(shield=True):
                if not self.core.closed:
                    await self._handle(r.Close(reasons.ERROR))
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self._finish()

    async def _append(self, record: r.Record) -> int:
        """Queue a record for the log; when the writer's shared queue is full, wait (at most
        ``LOG_ROOM_TIMEOUT_S``) for the writer to make room rather than failing the session."""
        try:
            return self.log.append_nowait(record)
        except LogBackpressure:
            pass
        with trio.move_on_after(LOG_ROOM_TIMEOUT_S):
            while True:
                try:
                    return self.log.append_nowait(record)
                except LogBackpressure:
                    await self.log.wait_for_room()
        return self.log.append_nowait(record)  # still full: LogBackpressure ends the session

    def drain_nowait(self, queued: Sequence[tuple[int, float]]) -> int | None:
        """The scheduler's drain (a jitter backlog catch-ups cannot clear): of ``queued``
        ((frame_index, rms), oldest first) the lowest-energy frame (the oldest of equals) is
        dropped; its ``drain`` record goes through the inbox, so it is logged and applied in
        order with everything else. None: not drained (alignment off, or the session ending)."""
        if not queued or not self.drainable():
            return None
        index = min(queued, key=lambda item: item[1])[0]
        self.drained_nowait(index)
        return index

    def drainable(self) -> bool:
        """Whether a queued frame of this session may be drained now."""
        return not (
            self.core.alignment == "off"
            or self.core.frames_stepped < self.undrainable_until
            or self.inbox.closed
            or self.log_error is not None
            or self.core.state not in (State.OPEN, State.RESPONDING)
        )

    def drained_nowait(self, frame_index: int) -> bool:
        """The scheduler dropped queued frame ``frame_index``: log and apply its ``drain``
        record in order with everything else. False when the session has ended meanwhile."""
        if self.inbox.closed:
            return False
        self.inbox.put_result_nowait(r.Drain(frame_index))
        if self.counters is not None:
            self.counters.dropped["drained"] += 1
        return True

    async def _align(self, record: r.Append, arrival: float) -> r.Record | None:
        """Ask the aligner about an append about to be logged; log its pad or hint first.
        Returns what to log for it as the core's ``refusal_for`` answered (the append, or its
        ``rejected`` record), or None when it did not ask, or logged a pad or hint since (a pad
        moves the buffered count): then :meth:`_handle` asks."""
        first, checked = self._alignment(record, arrival)
        if first is not None:
            await self._handle(first)
        return checked

    def _append_now(self, record: r.Append, arrival: float) -> None:
        """:meth:`run`'s handling of an append, in the caller's task (:meth:`_can_handle_now`)."""
        first, checked = self._alignment(record, arrival)
        if first is not None:
            self._handle_now(first)
            if self.core.closed:  # its pad or hint could not be logged: the session ended
                return
        if checked is None:
            self._handle_now(record)
        else:
            self._handle_now(checked, checked=True)

    def _alignment(self, record: r.Append, arrival: float) -> tuple[r.Record | None, r.Record | None]:
        """The aligner's answer for an append about to be logged: ``(pad or hint, None)``, to
        handle before the append; ``(None, checked)``, what to log for the append as
        ``refusal_for`` answered; ``(None, None)``, it did not ask."""
        tail, self._tail_before_pad = self._tail_before_pad, None
        width = FORMATS.get(record.format)
        if not record.audio or width is None or len(record.audio) % width:
            return None, None  # the core refuses it (bad_event, bad_audio): it is no audio to align
        if self.core.state not in (State.OPEN, State.RESPONDING):
            return None, None
        refusal = self.core.refusal_for(record)
        if refusal is not None:
            return None, refusal
        if self._burst_floor_ms is not None:
            self.aligner.burst_floor_ms = self._burst_floor_ms()
        decision = self.aligner.before_append(
            arrival,
            self.scheduler.grid(),
            input_samples(record),
            self.core.tail_samples if tail is None else tail,
        )
        if isinstance(decision, ServerPad):
            return r.Pad(decision.samples, decision.reason), None
        if isinstance(decision, ClientHint):
            return r.AlignHint(decision.pad_ms, decision.reason), None
        return None, record

    async def _handle(self, record: r.Record, *, checked: bool = False) -> None:
        """Log ``record``, then apply it (``checked``: an append's ``refusal_for`` was asked)."""
        record = self._to_log(record, checked)
        if self.log_error is None:
            try:
                seq = await self._append(record)
                if isinstance(record, ACKNOWLEDGED):
                    await self.log.wait_durable(seq)
            except Exception as exc:  # the log cannot be written: end the session, say why
                record = self._log_failed(record, exc)
        await self._carry_out_all(self._apply(record))
        if self.log_error is not None and not self.core.closed:
            await self._handle(r.Close(reasons.LOG_UNAVAILABLE))

    def _handle_now(self, record: r.Record, *, checked: bool = False) -> None:
        """:meth:`_handle` in the caller's task, for a record that needs no wait: not an
        acknowledged one, and room in the log (:meth:`_can_handle_now`). What needs the actor's
        task (the slot's release, a close after a log failure) is handed over to it."""
        record = self._to_log(record, checked)
        assert not isinstance(record, ACKNOWLEDGED)
        if self.log_error is None:
            try:
                self.log.append_nowait(record)
            except Exception as exc:
                record = self._log_failed(record, exc)
        effects = self._apply(record)
        rest = self._carry_out(effects, 0)
        if rest is not None:
            self.inbox.put_result_nowait(Handover(effects[rest:]))
        elif self.log_error is not None and not self.core.closed:
            self.inbox.put_result_nowait(r.Close(reasons.LOG_UNAVAILABLE))
        elif self.core.closed:
            self.inbox.put_result_nowait(Handover())  # the actor's task finishes the session

    def _to_log(self, record: r.Record, checked: bool) -> r.Record:
        """The record to log for ``record`` (``checked``: an append's ``refusal_for`` was asked)."""
        kind = type(record)
        if kind is r.Step or (checked and kind is r.Append):  # every frame's two: as they are
            return record
        if isinstance(record, r.Append) and not checked:
            # Refused audio is logged as a small ``rejected`` record, never with its audio.
            return self.core.refusal_for(record) or record
        if isinstance(record, r.Update):
            # So is a refused update, never with its config (it may be hundreds of KB).
            return self.core.refusal_for_update(record) or record
        return record

    def _log_failed(self, record: r.Record, exc: Exception) -> r.Record:
        """The log could not take ``record``: the session ends, and says why; returns the
        record to apply instead (a close)."""
        self.log_error = exc
        log.error("session %s: log unavailable: %s", self.session_id, exc)
        self._send(ev.Error(error_codes.LOG_UNAVAILABLE, f"the session log cannot be written: {exc}"))
        return record if isinstance(record, r.Close) else r.Close(reasons.LOG_UNAVAILABLE)

    def _apply(self, record: r.Record) -> list[Effect]:
        """Apply a logged record to the core and the aligner; returns the core's effects."""
        counters = self.counters
        if isinstance(record, r.Step):  # every frame's: none of what follows but the epoch's count
            if counters is not None and record.epoch != self.core.epoch:
                counters.dropped["stale_epoch"] += 1
            return self.core.apply(record)
        if type(record) is r.Append:  # every frame's other record: none of the cases below
            if record.client_event_id is not None:
                self.last_client_event_id = record.client_event_id
            return self.core.apply(record)
        event_id = getattr(record, "client_event_id", None)
        if event_id is not None:
            self.last_client_event_id = event_id
        pads_before, tail_before = self.core.pad_samples, self.core.tail_samples
        effects = self.core.apply(record)
        if isinstance(record, r.Pad):
            inserted = self.core.pad_samples - pads_before
            if counters is not None:
                counters.align_pad_samples += inserted
            if record.reason == "client" and inserted:
                self.aligner.client_padded(inserted)
                self._tail_before_pad = tail_before
        elif isinstance(record, r.Open | r.Update):
            self.aligner.set_mode(self.core.alignment)
        elif isinstance(record, r.ClearInput):
            self.aligner.cleared()
        if self.core.closed and self.close_reason is None and isinstance(record, r.Close):
            self.close_reason = record.reason
        return effects

    async def _carry_out_all(self, effects: Sequence[Effect]) -> None:
        """Carry out ``effects`` in order, the slot's release awaited where it comes."""
        rest = self._carry_out(effects, 0)
        while rest is not None:
            await self._release()
            rest = self._carry_out(effects, rest + 1)

    def _carry_out(self, effects: Sequence[Effect], start: int) -> int | None:
        """Carry out ``effects[start:]`` up to a slot release; returns the release's index
        (None: all done). The events emitted go out together (one write for a step's audio
        and its transcript)."""
        counters = self.counters
        emitted: list[ev.SessionEvent] = []
        stop: int | None = None
        for index in range(start, len(effects)):
            effect = effects[index]
            if isinstance(effect, Emit):
                if counters is not None:
                    if isinstance(effect.event, ev.AudioFrame):
                        counters.frames_out += 1
                    elif isinstance(effect.event, ev.Error):
                        counters.errors[effect.event.code] += 1
                    elif isinstance(effect.event, ev.SessionClosed):
                        counters.sessions_closed[effect.event.reason] += 1
                emitted.append(effect.event)
            elif isinstance(effect, SubmitFrame):
                if counters is not None:
                    counters.frames_in += 1
                if not self._stop_submitting:
                    self.scheduler.submit_nowait(self.slot, effect.frame_index, effect.samples, effect.padded)
            elif isinstance(effect, ResetSlot):
                self.scheduler.request_reset(self.slot, effect.epoch, effect.prompt)
            elif isinstance(effect, ReleaseSlot):
                stop = index
                break
        if emitted:
            self._emit(emitted)
        return stop

    def _emit(self, events: list[ev.SessionEvent]) -> None:
        """Hand events to the connection: at once when its writer takes them, else through
        the outbox."""
        direct = self.emit_directly
        if direct is not None and not self._consumer_gone and direct(events):
            return
        for event in events:
            self._send(event)

    def _send(self, event: ev.SessionEvent) -> None:
        if self._consumer_gone:
            return
        try:
            self.outbox.send_nowait(event)
        except trio.WouldBlock:
            self._consumer_gone = True
            log.warning("session %s: consumer too slow, closing", self.session_id)
            self.inbox.put_result_nowait(r.Close(reasons.SLOW_CONSUMER))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._consumer_gone = True

    async def _release(self) -> None:
        if not self._released:
            self._released = True
            await self.scheduler.release(self.slot)

    async def _finish(self) -> None:
        try:
            await self._release()
            try:
                if self.log.failed is None:
                    if self.log_error is not None and self.core.closed:
                        # The log itself is fine (e.g. its queue stayed full): finish it anyway.
                        self.log_error = None
                        await self._append(r.Close(self.close_reason or reasons.LOG_UNAVAILABLE))
                    if self.log_error is None:
                        await self._append(self.core.digests())
            except Exception as exc:
                self.log_error = exc
                log.error("session %s: finishing the log failed: %s", self.session_id, exc)
            finally:
                self.log.close_nowait()
            try:
                await self.log.wait_closed()
            except Exception as exc:
                log.error("session %s: closing the log failed: %s", self.session_id, exc)
        finally:
            # Step results queued behind the close are never applied: those frames are dropped.
            self._count_dropped_at_close(sum(isinstance(item, r.Step) for item in self.inbox.close()))
            self.outbox.close()
            self.done.set()
            self._progress.set()

    def _count_dropped_at_close(self, frames: int) -> None:
        if frames and self.counters is not None:
            self.counters.dropped["session_closed"] += frames
