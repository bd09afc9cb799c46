"""The scheduler actor: exactly one per process; owns the engine and its B slots.

Admission is a free slot (else ``ResourceExhausted``); a session holds its slot for life and
the slot is freed only after the engine has reset it. When to step, and which slots, is the
tick policy's answer (``scheduler/policy.py``, pure): this actor builds a view of the slots,
asks ``policy.decide`` and sleeps or steps, then records ``policy.after_step``. Every policy
steps at most one frame per slot per step; slots without a frame do not advance. Resets (new
session, new epoch) are applied between steps, before the slot's next frame; a prompt the
engine has not seen is prepared in a worker thread first so that one new persona never stalls
the batch. Results are routed by the (occupant, epoch) captured before the step. The scheduler
never awaits a session: results go out with ``deliver_nowait``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping
from functools import partial

import attrs
import numpy as np
import numpy.typing as npt
import trio

from ..admission import ResourceExhausted, SchedulerFailed
from ..audio import FRAME_MS
from ..model.engine import ModelEngine, SessionPrompt, StepOutput
from ..session.alignment import Grid
from .clock import INLINE, REAL_TIME, Clock, Executor, Threads, engine_executor
from .policy import (
    RECENT_STEPS,
    GridPolicy,
    PolicyState,
    SchedulerView,
    SlotView,
    StepNow,
    TickPolicy,
    WaitUntil,
    WindowPolicy,
)
from .slots import Occupant, QueuedFrame, Slot, SlotTable, StepResult

__all__ = ["Scheduler", "SchedulerStatistics", "StepResult"]

log = logging.getLogger(__name__)

# Step-duration histogram buckets (seconds), aligned to the 80 ms frame budget.
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.16, 0.32, float("inf"))
# How many held ticks the aligners are told about: an aligner asks about its frames' ticks at
# its recheck, every 4 s (50 ticks).
HELD_TICKS_KEPT = 80
# How long a released slot's reset may wait for the steps the policy decides (seconds), and
# the least wait before the next step in which one is applied (about one reset's cost).
RELEASE_DEFER_S = 0.2
RELEASE_SLACK_S = 0.01
# Frame-wait histogram buckets (seconds): a frame complete -> its step starts (0-80 ms on a grid).
WAIT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.32, float("inf"))


@attrs.frozen(slots=True)
class SchedulerStatistics:
    slots_total: int
    slots_in_use: int
    ticks: int
    frames_stepped: int
    step_seconds_sum: float
    step_seconds_buckets: tuple[tuple[float, int], ...]  # (upper bound, cumulative count)
    batch_sizes: tuple[tuple[int, int], ...]  # (batch size, ticks)
    late_frames: int  # the engine was late: stepped over 80 ms after the frame was due
    dropped_frames: tuple[tuple[str, int], ...]  # (reason, frames)
    resets: int
    failed: bool
    tick_policy: str = "window"
    catchup_steps: int = 0
    ahead_steps: int = 0
    frame_wait_seconds_sum: float = 0.0
    frame_wait_seconds_buckets: tuple[tuple[float, int], ...] = ()  # (upper bound, cumulative)
    # waited over 80 ms since submission, but only behind the same session's earlier frames
    # (the client sent faster than real time), not for the engine
    backlog_frames: int = 0
    # removed from a slot's queue by a drain (the occupant logs and counts them as dropped
    # with reason "drained"; they are not in dropped_frames, which would count them twice)
    drained_frames: int = 0


class Scheduler:
    """``clock`` is the time source; ``executor`` runs ``engine.reset``/``engine.step`` (default:
    inline under virtual time, else the engine's worker thread); ``prepare_executor`` runs
    ``engine.prepare`` beside the steps (default: inline under virtual time, else a thread of
    its own). ``policy`` decides when to step (default: the window policy with
    ``max_batch_wait_ms``)."""

    def __init__(
        self,
        engine: ModelEngine,
        *,
        clock: Clock = REAL_TIME,
        executor: Executor | None = None,
        prepare_executor: Executor | None = None,
        max_batch_wait_ms: float = 20.0,
        policy: TickPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.executor = executor or engine_executor(clock)
        self.prepare_executor = prepare_executor or (
            INLINE if clock.virtual else Threads(trio.CapacityLimiter(1))
        )
        self.policy: TickPolicy = policy or WindowPolicy(max_batch_wait_ms=max_batch_wait_ms)
        self._policy_state = PolicyState()
        self._recent_steps: deque[float] = deque(maxlen=RECENT_STEPS)
        # The grid ticks most recently held for frames late together (a shared stall), and the
        # grid as the aligners see it (rebuilt when either changes, not per append).
        self._held_ticks: deque[int] = deque(maxlen=HELD_TICKS_KEPT)
        self._grid: Grid | None = None
        self.table = SlotTable(engine.slots)
        # The policy's view of each slot, rebuilt only for the slots that changed since the last
        # wake-up (``_touch``): a wake-up costs what changed, not what the table holds.
        self._views: list[SlotView] = [SlotView(i, queued=0) for i in range(engine.slots)]
        self._changed: set[int] = set()
        self._wake = trio.Event()
        self._released: dict[int, trio.Event] = {}
        self._releasing_since: dict[int, float] = {}  # slot -> when its occupant released it
        self._forced_release_after = -1  # steps taken when an overdue release last went first
        self._ready_resets: set[int] = set()
        self._nursery: trio.Nursery | None = None
        self._prepare_limiter = trio.Lock()
        self._resets_done = trio.Event()  # set (and replaced) after each round of resets
        self.step_failures = 0
        self.failed: BaseException | None = None
        # statistics
        self._ticks = 0
        self._frames = 0
        self._step_sum = 0.0
        self._step_hist = [0] * len(STEP_BUCKETS)
        self._batch_sizes: Counter[int] = Counter()
        self._late = 0
        self._backlog = 0
        self._dropped: Counter[str] = Counter()
        self._resets = 0
        self._drained = 0
        self._wait_sum = 0.0
        self._wait_hist = [0] * len(WAIT_BUCKETS)
        # Called after a step's results (or its failure) were handed to every occupant, and
        # after a slot's reset for an epoch was applied: the engine core flushes its links there.
        self.after_step: list[Callable[[], None]] = []
        self.after_reset: list[Callable[[int, int], None]] = []

    # -- the API sessions use (never blocks) ------------------------------------------------------
    def admit(self, occupant: Occupant) -> int:
        if self.failed is not None:
            raise SchedulerFailed(f"the model scheduler failed: {self.failed}")
        slot = self.table.acquire(occupant)
        if slot is not None:
            self._touch(slot.index)
        if slot is None:
            raise ResourceExhausted(f"all {self.engine.slots} sessions are in use; try again later")
        # The slot may be freed and taken again between two steps: the policy's memory of the
        # last occupant (its cadence, debts, catch-ups) is not the new one's.
        self._policy_state = self._policy_state.fresh(slot.index)
        return slot.index

    async def admit_slot(self) -> int:
        """:meth:`admit` for a session not created yet (:meth:`occupy` names it); no checkpoint."""
        return self.admit(_Unoccupied())

    def occupy(self, slot: int, occupant: Occupant) -> None:
        self.table.slots[slot].occupant = occupant

    def free_unused(self, slot: int) -> None:
        """A slot admitted for a session that never opened (nothing to reset)."""
        self.table.free_slot(self.table.slots[slot])
        self._touch(slot)

    @property
    def slots_total(self) -> int:
        return self.engine.slots

    @property
    def slots_free(self) -> int:
        return self.table.free

    @property
    def slots_releasing(self) -> int:
        return sum(1 for entry in self.table.slots if entry.releasing)

    def submit_nowait(
        self,
        slot: int,
        frame_index: int,
        samples: npt.NDArray[np.float32],
        padded: bool = False,
        at: float | None = None,
    ) -> None:
        """Queue a complete frame (``padded``: it holds alignment pad samples, see SlotView;
        ``at``: when it was complete, if not now)."""
        entry = self.table.slots[slot]
        entry.frames.append(QueuedFrame(frame_index, samples, self.clock.now() if at is None else at, padded))
        self._touch(slot)
        self._wake.set()

    def request_reset(self, slot: int, epoch: int, prompt: SessionPrompt | None) -> None:
        """Fresh, prefilled context for ``epoch``; queued frames are carried into it."""
        entry = self.table.slots[slot]
        request = entry.pending_reset = (epoch, prompt)
        self._touch(slot)
        self._ready_resets.discard(slot)
        if prompt is None or self._nursery is None:
            self._ready_resets.add(slot)
            self._wake.set()
            return
        self._nursery.start_soon(self._prepare, slot, request, prompt)

    async def _prepare(
        self, slot: int, request: tuple[int, SessionPrompt | None], prompt: SessionPrompt
    ) -> None:
        async with self._prepare_limiter:  # one prompt computed at a time, never many threads
            if self.table.slots[slot].pending_reset is not request:
                return  # superseded (another update or epoch) before its turn: skip the work
            try:
                await self.prepare_executor.run(partial(self.engine.prepare, prompt))
            except Exception:  # the reset itself runs it again and reports the error
                log.exception("preparing a prompt failed")
        if self.table.slots[slot].pending_reset is request:
            self._ready_resets.add(slot)
            self._wake.set()

    async def wait_reset(self, slot: int) -> None:
        """Return once ``slot`` has no pending reset (its prompt is prefilled, or the reset
        failed and its occupant was told), or the scheduler has failed."""
        while self.table.slots[slot].pending_reset is not None and self.failed is None:
            await self._resets_done.wait()

    def _resets_applied(self) -> None:
        self._resets_done.set()
        self._resets_done = trio.Event()

    async def release(self, slot: int) -> None:
        """Reset the slot's model state, then free it; returns once it is free."""
        entry = self.table.slots[slot]
        done = self._released.setdefault(slot, trio.Event())
        entry.releasing = True
        self._touch(slot)
        self._releasing_since.setdefault(slot, self.clock.now())
        self._wake.set()
        if self.failed is not None:
            self._free(entry)
        await done.wait()

    def grid(self) -> Grid | None:
        """The grid policy's ticks (origin, period, the ticks recently held for a shared stall)
        once its first tick is booked; None for the window and deadline policies, which have
        no grid, and before the first tick."""
        origin = self._policy_state.origin
        if not isinstance(self.policy, GridPolicy) or origin is None:
            return None
        grid = self._grid
        if grid is None or grid.origin != origin:
            grid = self._grid = Grid(origin=origin, period=self.policy.tick, held=frozenset(self._held_ticks))
        return grid

    def _tick_held(self, tick: int) -> None:
        if not self._held_ticks or self._held_ticks[-1] != tick:  # decide asks again while held
            self._held_ticks.append(tick)
            self._grid = None

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            slots_total=self.engine.slots,
            slots_in_use=self.table.in_use,
            ticks=self._ticks,
            frames_stepped=self._frames,
            step_seconds_sum=self._step_sum,
            step_seconds_buckets=_cumulative(STEP_BUCKETS, self._step_hist),
            batch_sizes=tuple(sorted(self._batch_sizes.items())),
            late_frames=self._late,
            dropped_frames=tuple(sorted(self._dropped.items())),
            resets=self._resets,
            failed=self.failed is not None,
            tick_policy=self.policy.name,
            catchup_steps=self._policy_state.catchup_steps,
            ahead_steps=self._policy_state.ahead_steps,
            frame_wait_seconds_sum=self._wait_sum,
            frame_wait_seconds_buckets=_cumulative(WAIT_BUCKETS, self._wait_hist),
            backlog_frames=self._backlog,
            drained_frames=self._drained,
        )

    # -- the tick loop ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    ready = await self._wait_for_work()
                    if not isinstance(ready, tuple):
                        # Resets first, then ask again: a reset neither steps a stale frame
                        # nor makes an undersized batch.
                        await self._apply_resets(releases=ready)
                        self._resets_applied()
                        continue
                    await self._step_once(*ready)
            except BaseException as exc:
                self.failed = exc
                self._resets_applied()
                for entry in self.table.slots:  # nobody waits forever on a dead scheduler
                    if entry.releasing:
                        self._free(entry)
                raise
            finally:
                nursery.cancel_scope.cancel()

    def _steppable(self, entry: Slot) -> bool:
        # A slot with any pending reset waits: its queued frames belong to the new epoch.
        return entry.active and entry.pending_reset is None

    def _resets_due(self, decision: StepNow | WaitUntil) -> tuple[bool, bool]:
        """Whether a prepared prompt's reset is due, and whether a released slot's is. A
        released slot's waits while the policy has a step due or due within RELEASE_SLACK_S;
        past RELEASE_DEFER_S it goes, one between two steps (``_apply_resets`` applies one per
        round): sessions that end together (the end of a load, a drain) would otherwise put a
        reset each, one engine call apiece, before the tick of the sessions that go on."""
        prompts = any(self._reset_ready(e) for e in self.table.slots)
        if not self._releasing_since:
            return prompts, False
        now = self.clock.now()
        if isinstance(decision, WaitUntil) and decision.at - now >= RELEASE_SLACK_S:
            return prompts, True
        overdue = now - min(self._releasing_since.values()) >= RELEASE_DEFER_S
        return prompts, overdue and self._forced_release_after != self._ticks

    def _reset_ready(self, entry: Slot) -> bool:
        """Whether ``_apply_resets`` applies this slot's reset now: prepared, and the slot not
        releasing (its release resets it). ``_resets_due`` asks the same: the run loop asks
        again at once after a reset round, so a reset due there and skipped here would spin it."""
        return entry.pending_reset is not None and entry.index in self._ready_resets and not entry.releasing

    def _touch(self, slot: int) -> None:
        self._changed.add(slot)

    def _view(self) -> SchedulerView:
        # The policies read a slot's two oldest completion times (the queue is in completion
        # order): a client far ahead of real time must not cost a long tuple per wake-up.
        views = self._views
        for index in self._changed:
            e = self.table.slots[index]
            head = [e.frames[i] for i in range(min(2, len(e.frames)))]
            views[index] = SlotView(
                e.index,
                active=e.active,
                reset_pending=e.pending_reset is not None,
                frames=tuple(f.submitted_at for f in head),
                padded=tuple(f.padded for f in head),
                queued=len(e.frames),
            )
        self._changed.clear()
        return SchedulerView(
            slots=tuple(views),
            recent_steps=tuple(self._recent_steps),
            state=self._policy_state,
        )

    async def _wait_for_work(self) -> tuple[SchedulerView, StepNow] | bool:
        """The next step (with the view it was decided on), or, when resets are due, whether a
        released slot's is among them."""
        while True:
            view = self._view()
            decision = self.policy.decide(self.clock.now(), view)
            if isinstance(decision, WaitUntil) and decision.held_tick is not None:
                self._tick_held(decision.held_tick)
            prompts, releases = self._resets_due(decision)
            if prompts or releases:
                if releases and isinstance(decision, StepNow):
                    self._forced_release_after = self._ticks  # overdue: the next after a step
                return releases
            if isinstance(decision, StepNow):
                return view, decision
            if math.isinf(decision.at):
                await self._wake.wait()
            else:
                with trio.move_on_at(decision.at):
                    await self._wake.wait()
            self._wake = trio.Event()

    async def _apply_resets(self, *, releases: bool) -> None:
        """The prepared prompts' resets, and with ``releases`` one released slot's."""
        for entry in self.table.slots:
            request = entry.pending_reset
            if request is not None and self._reset_ready(entry):
                epoch, prompt = request
                try:
                    await self.executor.run(partial(self.engine.reset, entry.index, prompt))
                except Exception as exc:  # e.g. an unreadable voice: that session ends, no other
                    log.exception("slot %d: reset failed", entry.index)
                    self._reset_failed(entry, exc)
                    continue
                entry.epoch, entry.prompt = epoch, prompt
                if entry.pending_reset is request:
                    entry.pending_reset = None
                    self._touch(entry.index)
                    self._ready_resets.discard(entry.index)
                    for listener in self.after_reset:
                        listener(entry.index, epoch)
                self._resets += 1
        if not releases:
            return
        for entry in self.table.slots:
            if entry.releasing:
                # A plain reset, no prompt: cheap, and clears the occupant's state. One per
                # round: the policy is asked again before the next (a tick may be due).
                await self.executor.run(partial(self.engine.reset, entry.index, None))
                self._resets += 1
                dropped = len(entry.frames)
                if dropped:
                    self._dropped["session_closed"] += dropped
                self._free(entry)
                return

    def _drain(self, entry: Slot) -> None:
        """The policy found this slot's backlog a jitter the catch-ups cannot clear: the
        occupant picks a queued frame to drop (and logs and counts it), or declines."""
        if entry.occupant is None or not entry.frames or not self._steppable(entry):
            return
        queued = [(f.frame_index, _rms(f.samples)) for f in entry.frames]
        chosen = entry.occupant.drain_nowait(queued)
        if chosen is None:
            return
        for i, f in enumerate(entry.frames):
            if f.frame_index == chosen:
                del entry.frames[i]
                self._touch(entry.index)
                self._drained += 1
                return
        raise AssertionError(f"slot {entry.index}: drained frame {chosen} was not queued")

    def _reset_failed(self, entry: Slot, exc: BaseException) -> None:
        self._dropped["reset_failed"] += len(entry.frames)
        entry.frames.clear()
        entry.pending_reset = None
        self._touch(entry.index)
        self._ready_resets.discard(entry.index)
        if entry.occupant is not None:
            entry.occupant.reset_failed(exc)

    def _free(self, entry: Slot) -> None:
        self._ready_resets.discard(entry.index)
        self._releasing_since.pop(entry.index, None)
        self.table.free_slot(entry)
        self._touch(entry.index)
        done = self._released.pop(entry.index, None)
        if done is not None:
            done.set()

    async def _step_once(self, view: SchedulerView, decision: StepNow) -> None:
        batch: dict[int, npt.NDArray[np.float32]] = {}
        routes: list[tuple[int, Occupant, int, int]] = []
        now = self.clock.now()
        for index in decision.slots:
            entry = self.table.slots[index]
            assert self._steppable(entry) and entry.frames, "the policy picked a slot it saw"
            frame = entry.frames.popleft()
            self._touch(index)
            assert entry.occupant is not None
            batch[entry.index] = frame.samples
            routes.append((entry.index, entry.occupant, entry.epoch, frame.frame_index))
            waited = max(0.0, now - frame.submitted_at)
            self._wait_sum += waited
            self._wait_hist[_bucket(WAIT_BUCKETS, waited)] += 1
            # A frame is due when submitted, or, behind its own session's earlier frames (a
            # client ahead of real time), one frame after the one before it: the engine is late
            # only when it falls behind that real-time pace, not for the session's own backlog.
            frame_s = FRAME_MS / 1000
            due = frame.submitted_at
            if entry.last_due is not None:
                due = max(due, entry.last_due + frame_s)
            entry.last_due = due
            if now - due > frame_s:
                self._late += 1
            elif now - frame.submitted_at > frame_s:
                self._backlog += 1
        if not batch:
            return
        started = self.clock.now()
        self._policy_state = self.policy.after_step(self._policy_state, view, decision, started)
        for index in self._policy_state.drain:
            self._drain(self.table.slots[index])
        try:
            outputs: Mapping[int, StepOutput] = await self.executor.run(lambda: self.engine.step(batch))
        except Exception as exc:
            # One failed step ends the sessions that were in it (internal_error, close 1011);
            # their slots are reset when they release them, and the others go on.
            log.exception("model step failed for slots %s", sorted(batch))
            self.step_failures += 1
            self._dropped["step_failed"] += len(batch)
            for index, occupant, _epoch, _frame in routes:
                entry = self.table.slots[index]
                self._dropped["step_failed"] += len(entry.frames)
                entry.frames.clear()
                self._touch(index)
                occupant.step_failed(exc)
            for listener in self.after_step:
                listener()
            return
        elapsed = self.clock.now() - started
        self._recent_steps.append(elapsed)
        self._ticks += 1
        self._frames += len(batch)
        self._step_sum += elapsed
        self._batch_sizes[len(batch)] += 1
        self._step_hist[_bucket(STEP_BUCKETS, elapsed)] += 1
        for index, occupant, epoch, frame_index in routes:
            occupant.deliver_nowait(StepResult(epoch, frame_index, outputs[index]))
        for listener in self.after_step:
            listener()


class _Unoccupied:
    """The occupant of a slot admitted before its session exists (no frame can reach it)."""

    def deliver_nowait(self, result: StepResult) -> None:
        raise AssertionError("a step result for a slot whose session is not open yet")

    def reset_failed(self, exc: BaseException) -> None:
        raise AssertionError("a reset for a slot whose session is not open yet")

    def step_failed(self, exc: BaseException) -> None:
        raise AssertionError("a step for a slot whose session is not open yet")

    def drain_nowait(self, queued: object) -> int | None:
        raise AssertionError("a drain for a slot whose session is not open yet")


def _rms(samples: npt.NDArray[np.float32]) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def _bucket(bounds: tuple[float, ...], value: float) -> int:
    return next(i for i, bound in enumerate(bounds) if value <= bound)


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> tuple[tuple[float, int], ...]:
    running, out = 0, []
    for bound, count in zip(bounds, counts, strict=True):
        running += count
        out.append((bound, running))
    return tuple(out)
