"""The tick policy (no trio, no torch): when the scheduler steps, and which slots.

``policy.decide(now, view)`` answers ``StepNow(slots)`` or ``WaitUntil(t)`` from an immutable
``SchedulerView`` of the slot table; after a step the shell stores
``policy.after_step(view.state, view, step, started)`` and passes it back in the next view.
Times are seconds on the scheduler's monotonic clock. Every policy steps at most one frame per
slot per step (the oldest), and never steps or waits for a slot that is not active or has a
reset pending. Why the default is a grid: docs/design.md, decision 10.

- ``window``: step once every steppable slot has a frame, else ``max_batch_wait_ms`` after the
  oldest waiting frame completed.
- ``deadline``: the same, with a window of one tick minus the p90 of recent steps minus a guard.
- ``grid`` (the default): ticks ``origin + n * tick``, each booked from the previous due time,
  never from "now", so the phase never drifts; the first frame books the grid, its first tick
  ``first_tick_lead_ms`` later. It steps at the due tick, or earlier within that tick's interval
  once every steppable slot has a frame, and skips whole the ticks with nothing to step.

The grid's rules:

- Catch-ups. A slot is owed a step of its own when it was on cadence and missed a tick, for its
  first frame (and for falling a frame behind within its first two steps: an alignment pad's
  double), for the double of a re-alignment (a frame holding pad samples, ``SlotView.padded``,
  second for one tick, or after its tick was stepped early without it), and when it stays the
  same number of frames behind for ``stable_backlog_ticks``. It gets it when the estimated step
  (p90 of recent steps) fits before the next tick, or else when the catch-up and the tick it
  delays both end before the tick after (an *overrun*, estimated by the median of the last
  ``OVERRUN_STEPS`` steps; at most one per ``overrun_interval_ms`` except for a session's
  start); at most ``max_catchups_per_s`` per slot in any second that the slot calls for. Every
  slot owed one *rides along* a catch-up another called for, spending none of its budget.
- Start backlog. Frames that a client on real time sent while its slot waited for its first
  step (the prompt being prepared) are owed catch-ups outside that budget, and never drained.
- Falling further behind earns nothing: a client faster than real time gets one frame per
  tick. When every steppable slot is a whole tick behind (an upload, uploads started together,
  everyone after a stall), a step serves them all *ahead* of the grid, which it does not move,
  whenever it ends before the due tick's step must start.
- Late ticks. A tick that no frame made is kept open ``late_tick_grace_ms``: frames that all
  came a little late are stepped as that tick's, not owed as debts. So is a tick most of whose
  slots on cadence have no frame yet, while its step still ends before the next tick
  (``_hold_until``), and, for ``straggler_grace_ms``, one that a few of them are missing.
- Drains. A slot the catch-ups cannot bring back is owed a *drain* (``PolicyState.drain``, set
  by ``after_step``) when, over its last ``drain_window_ticks`` regular ticks (no miss, catch-up
  or drain among them), every stepped frame was ``drain_min_behind`` to ``drain_max_behind``
  frames behind by the smallest lag (a jitter backlog, not an upload), that lag grew by at most
  ``drain_growth_ms`` between the window's two halves (a client even a few per cent faster than
  real time grows more), a frame is queued behind the one stepped, and no catch-up is coming;
  at most ``max_drains_per_s`` per slot in any second. The shell asks the slot's occupant which
  queued frame to drop (``Occupant.drain_nowait``) and removes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol

import attrs

from ..config import TICK_POLICIES

TICK_MS: Final = 80.0

# Times closer than this (seconds) are the same instant: ticks are computed as origin + n * tick
# and frame times come from another clock reading, so float noise must not skip a tick.
EPS: Final = 1e-9

# Frames this close (seconds) to a tick apart are a regular cadence (a straggler is waited for).
REGULAR_S: Final = 0.004
# How many recent step durations a shell should keep for the estimates (p90).
RECENT_STEPS: Final = 32
# How many of them an overrun's estimate looks at (their median).
OVERRUN_STEPS: Final = 8


# -- the view the shell builds -------------------------------------------------------------------
@attrs.frozen(slots=True)
class SlotView:
    """One slot as the policy sees it."""

    index: int
    active: bool = False
    reset_pending: bool = False
    # Completion times of the frames waiting in this slot's queue, oldest first.
    frames: tuple[float, ...] = ()
    # For as many of those frames (or fewer: the rest are not): the frame holds alignment pad
    # samples. It completes early by design, so when it is the second frame for one tick (a
    # re-alignment that moves the session's phase later makes that double), the grid owes it
    # a catch-up, as it does the double of a session's first alignment.
    padded: tuple[bool, ...] = ()
    # How many frames wait in the queue, when ``frames`` holds only the oldest (None: all).
    queued: int | None = None

    @property
    def steppable(self) -> bool:
        return self.active and not self.reset_pending

    @property
    def depth(self) -> int:
        """The frames waiting in this slot's queue (every one complete)."""
        return len(self.frames) if self.queued is None else self.queued


@attrs.frozen(slots=True)
class SlotState:
    """What the grid remembers about one slot between steps."""

    # Consecutive regular ticks at which this slot had a frame (catch-ups do not count).
    streak: int = 0
    # Ticks this slot missed while on cadence and has not been caught up for.
    debt: int = 0
    # When this slot's recent catch-up steps started (the budget is per second).
    catchups: tuple[float, ...] = ()
    # Caught up since the last regular tick: missing the next tick then means the slot's
    # frames complete just after the ticks (its phase), not that it is late again.
    caught_up: bool = False
    # How many frames behind the slot was at its last tick (its stepped frame was that many
    # ticks late), and for how many ticks in a row it was that many.
    backlog: int = 0
    stable: int = 0
    # Stepped at least once since it became steppable. A slot's first frame is owed a
    # catch-up: it completes at any phase, and once the session is aligned its next frame
    # wants the same tick.
    seen: bool = False
    # Frames that were queued behind the slot's first when it was first stepped, as many as a
    # client on real time sent while it waited (its prompt was prepared, or the engine was busy
    # admitting it): the server's delay, not the client's jitter, so they are owed catch-ups
    # outside the per-second budget and never drained. Paid one per catch-up; forgotten once
    # the slot is current at a tick.
    start_backlog: int = 0
    # How late (seconds after its frame completed) the slot's stepped frame was at each of its
    # last regular ticks (at most drain_window_ticks) since it last missed a tick, had a
    # catch-up or a drain, and when the slot's recent drains were decided.
    lags: tuple[float, ...] = ()
    drains: tuple[float, ...] = ()
    # When the slot's last stepped frame completed, and how long after the one before it (its
    # next is due that interval later, or a tick when shorter: an alignment pad's frame).
    last_completed: float | None = None
    interval: float | None = None

    def stepped_frame(self, completed: float, **changes: Any) -> SlotState:
        """This state having stepped a frame that completed at ``completed``, with ``changes``
        (one ``attrs.evolve``: the grid makes one per stepped slot per tick)."""
        last = self.last_completed
        return attrs.evolve(
            self, last_completed=completed, interval=None if last is None else completed - last, **changes
        )


FRESH_SLOT: Final = SlotState()


@attrs.frozen(slots=True)
class PolicyState:
    """The policy's memory between steps; ``PolicyState()`` before the first step."""

    # The grid: tick n is at origin + n * tick; ``next_tick`` is the index of the next due one.
    origin: float | None = None
    next_tick: int = 0
    slots: tuple[SlotState, ...] = ()
    # Ticks stepped, and catch-up steps, over the policy's life (for statistics and tests).
    ticks: int = 0
    catchup_steps: int = 0
    # Steps taken ahead of the grid because every steppable slot was behind (``ahead``).
    ahead_steps: int = 0
    # Slots owed a drain by the step ``after_step`` just recorded (the shell drains them once).
    drain: tuple[int, ...] = ()
    drains: int = 0
    # When the last catch-up that could not finish before the next tick started (it delays
    # that tick; at most one per ``overrun_interval_ms``, but for a session's start), and how
    # many there were.
    last_overrun: float = -math.inf
    overruns: int = 0

    def slot(self, index: int) -> SlotState:
        return self.slots[index] if index < len(self.slots) else FRESH_SLOT

    def fresh(self, index: int) -> PolicyState:
        """This state with slot ``index`` forgotten (a new occupant inherits nothing)."""
        if index >= len(self.slots):
            return self
        return attrs.evolve(self, slots=(*self.slots[:index], FRESH_SLOT, *self.slots[index + 1 :]))


@attrs.frozen(slots=True)
class SchedulerView:
    slots: tuple[SlotView, ...]
    # Durations (seconds) of the most recent steps, oldest first.
    recent_steps: tuple[float, ...] = ()
    state: PolicyState = PolicyState()


# -- decisions -----------------------------------------------------------------------------------
StepKind = Literal["tick", "early", "catchup", "ahead", "window"]


@attrs.frozen(slots=True)
class StepNow:
    """Step now: one frame (the oldest) of each slot in ``slots``."""

    slots: tuple[int, ...]
    kind: StepKind = "window"
    # The grid tick this step serves (``tick`` and ``early`` steps); None otherwise.
    tick_at: float | None = None
    # Of ``slots``, in a catch-up: those owed one whose budget is spent. They did not call
    # for the step (it spends none of their budget); it costs the whole batch anyway.
    riders: tuple[int, ...] = ()


@attrs.frozen(slots=True)
class WaitUntil:
    """Nothing to step before ``at`` (``math.inf``: until a frame arrives or a reset is ready).
    ``held_tick``: the grid tick held open for frames late together (``GridPolicy._hold_until``):
    a stall shared by most sessions, which the shell tells the aligners about (``Grid.held``)."""

    at: float
    held_tick: int | None = None


Decision = StepNow | WaitUntil


class TickPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, now: float, view: SchedulerView) -> Decision: ...

    def after_step(
        self, state: PolicyState, view: SchedulerView, step: StepNow, started: float
    ) -> PolicyState: ...


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _waiting(view: SchedulerView) -> tuple[int, list[SlotView]]:
    """How many slots are steppable, and those of them with a frame waiting."""
    steppable, waiting = 0, []
    for s in view.slots:
        if s.active and not s.reset_pending:
            steppable += 1
            if s.frames:
                waiting.append(s)
    return steppable, waiting


# -- window and deadline -------------------------------------------------------------------------
def _window_decide(now: float, view: SchedulerView, window: float) -> Decision:
    steppable, waiting = _waiting(view)
    if not waiting:
        return WaitUntil(math.inf)
    slots = tuple(s.index for s in waiting)
    if len(waiting) == steppable:
        return StepNow(slots, "window")
    deadline = min(s.frames[0] for s in waiting) + window
    if now >= deadline:
        return StepNow(slots, "window")
    return WaitUntil(deadline)


@attrs.frozen(slots=True)
class WindowPolicy:
    """Step when every steppable slot has a frame, else ``max_batch_wait_ms`` after the oldest."""

    max_batch_wait_ms: float = 20.0
    name: str = "window"

    def decide(self, now: float, view: SchedulerView) -> Decision:
        return _window_decide(now, view, self.max_batch_wait_ms / 1000)

    def after_step(
        self, state: PolicyState, view: SchedulerView, step: StepNow, started: float
    ) -> PolicyState:
        return attrs.evolve(state, ticks=state.ticks + 1)


@attrs.frozen(slots=True)
class DeadlinePolicy:
    """The window policy with a window of one tick minus the p90 of recent steps minus a guard."""

    tick_ms: float = TICK_MS
    guard_ms: float = 2.0
    name: str = "deadline"

    def window(self, recent_steps: Sequence[float]) -> float:
        p90 = percentile(recent_steps, 90) if recent_steps else 0.0
        return min(self.tick_ms / 1000, max(0.0, (self.tick_ms - self.guard_ms) / 1000 - p90))

    def decide(self, now: float, view: SchedulerView) -> Decision:
        return _window_decide(now, view, self.window(view.recent_steps))

    def after_step(
        self, state: PolicyState, view: SchedulerView, step: StepNow, started: float
    ) -> PolicyState:
        return attrs.evolve(state, ticks=state.ticks + 1)


# -- grid ----------------------------------------------------------------------------------------
@attrs.frozen(slots=True)
class GridPolicy:
    tick_ms: float = TICK_MS
    guard_ms: float = 2.0
    # Regular ticks with a frame in a row before a missed tick counts as lateness, not a pause
    # or a client whose chunks do not divide the tick.
    steady_ticks: int = 8
    stable_backlog_ticks: int = 8
    max_catchups_per_s: int = 2
    # A run of missed ticks (a late burst) is owed at most this many catch-ups.
    max_debt: int = 3
    first_tick_lead_ms: float = 10.0
    drain_window_ticks: int = 8
    # Frames behind (queued at the tick besides the one stepped): 2-5 is a backlog of 3-6. One
    # frame behind is left to the catch-ups: a real-time client whose chunks do not divide the
    # tick (30 ms) can stand a frame behind for a while.
    drain_min_behind: int = 2
    drain_max_behind: int = 5
    drain_growth_ms: float = 5.0
    max_drains_per_s: int = 2
    # A catch-up that does not fit before the next tick may still run when the tick it delays
    # and the catch-up both end before the tick after (the engine is then never more than one
    # step behind the grid), at most once per this interval over all slots (a catch-up for a
    # session's start, its first frame, may go within it): it delays one tick for every session
    # by (2 x step - tick), where a slot left a frame behind waits a whole tick more for every
    # frame until a catch-up comes. 0 turns overruns off.
    overrun_interval_ms: float = 80.0
    late_tick_grace_ms: float = 40.0
    # A tick some slots on a regular 80 ms cadence (up to half of those on cadence) have no
    # frame for yet, their next one due by it or within this grace after it, is held this long
    # for them (the tail of the burst the aligned sessions' appends make at the tick; a session
    # whose phase slipped just past the tick, aligned or not): a wait of a few ms for the
    # others, where a frame that misses its tick costs a catch-up step or a whole tick. More
    # than half of them missing: ``late_tick_grace_ms``.
    straggler_grace_ms: float = 8.0
    name: str = "grid"

    @property
    def tick(self) -> float:
        return self.tick_ms / 1000

    def tick_time(self, state: PolicyState, n: int) -> float:
        assert state.origin is not None
        return state.origin + n * self.tick

    def settle(self, state: PolicyState, view: SchedulerView, until: float) -> PolicyState:
        """``state`` with the due ticks before ``until`` that had no frame waiting passed over.

        A tick passes empty when no steppable slot had a frame that completed by it; each slot
        on cadence then missed it (``debt``). Pure: ``decide`` and ``after_step`` both call it.
        """
        if state.origin is None:
            return state
        oldest = min((s.frames[0] for s in view.slots if s.frames and s.steppable), default=math.inf)
        n = state.next_tick
        # A tick no frame made passes only once a late grace has gone by empty too: frames
        # that all came a little late (a stall of the loop or the network) are still its
        # frames, stepped late, rather than debts of the next tick.
        horizon = min(until, oldest - self.late_tick_grace_ms / 1000)
        if self.tick_time(state, n) >= horizon - EPS:
            return state
        # Ticks n .. m-1 passed empty, where m is the first tick at or after the horizon.
        m = max(n + 1, math.ceil((horizon - EPS - state.origin) / self.tick))
        slots = list(state.slots) + [FRESH_SLOT] * (len(view.slots) - len(state.slots))
        for s in view.slots:
            if not s.steppable:
                slots[s.index] = FRESH_SLOT
                continue
            st = slots[s.index]
            for _ in range(min(m - n, self.max_debt + 1)):
                st = self._missed(st)
            slots[s.index] = st
        return attrs.evolve(state, next_tick=m, slots=tuple(slots))

    def _missed(self, st: SlotState) -> SlotState:
        if st.caught_up:
            debt = 0
        elif st.streak >= self.steady_ticks:
            debt = max(1, st.debt)
        elif st.debt > 0:
            debt = min(st.debt + 1, self.max_debt)
        else:
            debt = 0
        return attrs.evolve(st, streak=0, debt=debt, caught_up=False, backlog=0, stable=0, lags=())

    def _start_backlog(self, s: SlotView, started: float) -> int:
        """The frames queued behind a slot's first step that a client on real time sent while
        the slot waited (its first frame completed that many ticks before): a client that sent
        seconds at once (an upload) is ahead of real time and owed none for them."""
        waited = math.floor((started - s.frames[0]) / self.tick + EPS)
        if s.depth - 1 > waited + 1:
            return 0  # more frames than ticks waited: sent ahead of real time
        return max(0, min(s.depth - 1, waited))

    def _estimate(self, view: SchedulerView) -> float | None:
        return percentile(view.recent_steps, 90) if view.recent_steps else None

    def _latest_start(self, due: float, estimate: float) -> float:
        """The last moment a step (``estimate`` long) can start and end before the tick ``due``."""
        return due - estimate - self.guard_ms / 1000

    def _overrun_estimate(self, view: SchedulerView) -> float | None:
        # The median of the last few steps: an overrun only delays a tick, so it needs no p90
        # over the long window (slow steps while sessions start would block every overrun for
        # RECENT_STEPS ticks, and leave the sessions that started a frame behind that long).
        recent = view.recent_steps[-OVERRUN_STEPS:]
        return percentile(recent, 50) if recent else None

    def _budget_free_at(self, st: SlotState, now: float) -> float:
        """When this slot may have its next catch-up (``now`` if at once)."""
        recent = [t for t in st.catchups if t > now - 1.0]
        if len(recent) < self.max_catchups_per_s:
            return now
        return sorted(recent)[-self.max_catchups_per_s] + 1.0

    def _catchup_fits(self, view: SchedulerView) -> bool:
        """Do a tick step plus a catch-up step (p90 each) fit in one tick, or (an overrun)
        three steps in two?"""
        estimate, overrun = self._estimate(view), self._overrun_estimate(view)
        fits = estimate is not None and 2 * estimate + self.guard_ms / 1000 <= self.tick
        if not fits and overrun is not None and self.overrun_interval_ms > 0:
            fits = 3 * overrun + self.guard_ms / 1000 <= 2 * self.tick
        return fits

    def _catchup_available(self, st: SlotState, view: SchedulerView, now: float) -> bool:
        """Will a catch-up serve this slot: it is owed one, has budget left, and it fits?"""
        return st.debt > 0 and self._catchup_fits(view) and self._budget_free_at(st, now) <= now

    def _owes_drain(self, st: SlotState, view: SchedulerView, now: float) -> bool:
        lags = st.lags
        if len(lags) < self.drain_window_ticks:
            return False
        # A standing backlog: every frame of the window waited at least ``depth`` ticks more
        # than its own. A client whose chunks complete frames in pairs (100 ms chunks) has
        # fresh frames among them and is never drained. The trend is taken from the largest
        # lags (the frames that came on time; one late by jitter waited less).
        depth = math.floor(min(lags) / self.tick + EPS)
        if not self.drain_min_behind <= depth <= self.drain_max_behind:
            return False
        half = len(lags) // 2
        if max(lags[half:]) - max(lags[:half]) > self.drain_growth_ms / 1000:
            return False  # falling further behind: a client ahead of real time
        if sum(1 for t in st.drains if t > now - 1.0) >= self.max_drains_per_s:
            return False
        if st.start_backlog > 0 and self._catchup_fits(view):
            return False  # the server's delay, paid by catch-ups while they fit
        return not self._catchup_available(st, view, now)

    def _overrun_allowed(
        self, state: PolicyState, view: SchedulerView, now: float, due: float, starting: bool = False
    ) -> bool:
        """May a catch-up starting ``now`` delay the tick ``due``: its step and the delayed
        tick's both end before the tick after, and no other overrun came too recently? One that
        serves a session's start (``starting``: a first frame, a start backlog) need not wait
        for the interval: sessions that start together (a burst of connections, a restart's
        reconnects) arrive over one tick, and the first frames that came after the first
        catch-up would otherwise wait for the tick (latency a tick plus two steps)."""
        estimate = self._overrun_estimate(view)
        if estimate is None or self.overrun_interval_ms <= 0:
            return False
        if not starting and now - state.last_overrun < self.overrun_interval_ms / 1000 - EPS:
            return False
        return now + 2 * estimate + self.guard_ms / 1000 <= due + self.tick + EPS

    def _hold_until(
        self, state: PolicyState, view: SchedulerView, due: float, now: float
    ) -> tuple[float, bool] | None:
        """Until when the tick ``due`` waits for its frames, and whether most of its slots on
        cadence are late (a stall they share); None: step it now.

        A tick most of whose slots on cadence (stepped at their last regular tick) have no frame
        yet, though by their cadence it was due, is held for them, within the late grace and
        while its step still ends before the next tick: their frames are late together (a stall
        of the loop, the host or the path; sessions starting together congest the loop), and
        stepping the few that came alone would leave the rest a catch-up (a full step) to wait
        for, or a tick more. A slot that misses the tick is off cadence until its next tick, so a
        pause holds at most one tick; a client whose frames are 100 ms apart is not expected
        at the ticks it skips. A tick only a few such slots are missing for is held
        ``straggler_grace_ms``: aligned sessions send at nearly the same instant, and the
        server reads that burst of appends one by one (at N=24, the last ~5 ms after the
        first), so its tail would miss the tick by a millisecond and wait a whole tick.
        """
        on_cadence = missing = stragglers = 0
        for s in view.slots:
            st = state.slot(s.index)
            if s.steppable and st.streak >= 1 and st.last_completed is not None:
                on_cadence += 1
                # Missing: its next frame was due to complete by this tick (one caught up ahead
                # of it, or whose phase is just after the ticks, is not).
                cadence = max(self.tick, st.interval or 0.0)
                if s.frames:
                    continue
                expected = st.last_completed + cadence
                missing += expected <= due + EPS
                # A straggler: its frames come a tick apart (an aligned session), its next one
                # due by this tick or within the straggler grace after it (its phase slipped
                # just past the tick: the path or the server got slower, until its aligner
                # re-aligns it). Chunks that do not divide the tick (30 ms) complete frames 60 or
                # 90 ms apart, and would hold a tick whenever a frame of theirs falls just after.
                interval = st.interval
                regular = interval is not None and abs(interval - self.tick) <= REGULAR_S
                stragglers += regular and expected <= due + self.straggler_grace_ms / 1000 + EPS
        shared = on_cadence >= 2 and 2 * missing > on_cadence
        if not shared and not stragglers:
            return None
        until = due + (self.late_tick_grace_ms if shared else self.straggler_grace_ms) / 1000
        estimate = self._estimate(view)
        if estimate is not None:
            until = min(until, self._latest_start(due + self.tick, estimate))
        return (until, shared) if now < until - EPS else None

    def decide(self, now: float, view: SchedulerView) -> Decision:
        steppable, waiting = _waiting(view)
        if not waiting:
            return WaitUntil(math.inf)
        slots = tuple(s.index for s in waiting)
        state = view.state
        if state.origin is None:
            # The first frame books the grid a lead after itself: frames of sessions that
            # started with it join its step, and their later frames complete before the ticks
            # instead of straddling them by their jitter.
            due = min(s.frames[0] for s in waiting) + self.first_tick_lead_ms / 1000
        else:
            state = self.settle(state, view, now)
            due = self.tick_time(state, state.next_tick)
        if now >= due - EPS:
            held = self._hold_until(state, view, due, now)
            if held is None:
                return StepNow(slots, "tick", due)
            until, shared = held
            return WaitUntil(
                until, held_tick=state.next_tick if shared and state.origin is not None else None
            )
        wake = due
        estimate = self._estimate(view)
        if estimate is not None:
            # A catch-up first: it serves a frame on top of the slot's ticks, where an early
            # step would spend the next tick on it and leave the slot a frame ahead.
            latest_start = self._latest_start(due, estimate)
            free_at = {}
            for s in waiting:
                st = state.slot(s.index)
                # A padded frame that completed before this tick's interval opened is the
                # double of a re-alignment whose tick was stepped early, without it: owed now.
                # (A slot already behind is not: a client can pad its own appends.)
                doubled = s.padded[:1] == (True,) and st.backlog == 0 and s.frames[0] < due - self.tick - EPS
                if st.start_backlog > 0:
                    free_at[s.index] = now
                elif st.debt > 0 or not st.seen or doubled:
                    free_at[s.index] = self._budget_free_at(st, now)
            catchup = tuple(i for i, t in free_at.items() if t <= now)
            starting = any(not state.slot(i).seen or state.slot(i).start_backlog > 0 for i in catchup)
            if catchup and (now <= latest_start or self._overrun_allowed(state, view, now, due, starting)):
                # The step costs the whole batch: every slot owed a catch-up rides along, its
                # budget spent or not (the budget bounds the steps a slot calls for).
                riders = tuple(i for i, t in free_at.items() if t > now)
                return StepNow(tuple(sorted(free_at)), "catchup", riders=riders)
            later = min((t for t in free_at.values() if t > now), default=math.inf)
            if later <= latest_start:
                wake = later
            if catchup and not starting:
                # Owed now but for the overrun interval: wake when it lapses, if the overrun
                # still fits then (no frame may arrive before it to wake the shell).
                lapse = state.last_overrun + self.overrun_interval_ms / 1000
                if now < lapse < wake and self._overrun_allowed(state, view, lapse, due):
                    wake = lapse
        if len(waiting) == steppable:
            # Early, within the due tick's own interval: that is the tick's step.
            opens = due - self.tick
            if now >= opens - EPS:
                return StepNow(slots, "early", due)
            # Before it, when every steppable slot is a whole tick behind (its oldest frame was
            # due by the tick before the last: not merely the second frame of a chunk that
            # completes two, which the next tick serves), a step now serves every session, so
            # it spends no one's time; it is taken ahead of the grid, which it does not move,
            # when it ends before the due tick's step must start. A lone upload, or uploads
            # started together, are served as fast as the engine goes (two ticks behind at
            # most); beside a session on real time, a client ahead of it is served one frame
            # per tick.
            behind = all(s.frames[0] < opens - self.tick - EPS for s in waiting)
            if behind and (estimate is None or now <= self._latest_start(due, estimate) + EPS):
                return StepNow(slots, "ahead")
            wake = min(wake, opens)
        return WaitUntil(wake)

    def after_step(
        self, state: PolicyState, view: SchedulerView, step: StepNow, started: float
    ) -> PolicyState:
        stepped = set(step.slots)
        if step.kind in ("catchup", "ahead"):
            state = self.settle(state, view, started)
            estimate = self._estimate(view)
            if state.origin is not None and estimate is not None:
                # It overran when it started past the last start that fits before the tick.
                if started > self._latest_start(self.tick_time(state, state.next_tick), estimate) + EPS:
                    state = attrs.evolve(state, last_overrun=started, overruns=state.overruns + 1)
            slots = list(state.slots) + [FRESH_SLOT] * (len(view.slots) - len(state.slots))
            # A step only takes slots with a frame waiting (the view's oldest is the one stepped).
            completed = {s.index: s.frames[0] for s in view.slots if s.index in stepped}
            catchup = step.kind == "catchup"
            start = {s.index: self._start_backlog(s, started) for s in view.slots if s.index in stepped}
            for i in stepped:
                st = slots[i]
                # An ``ahead`` step spends no catch-up budget: it served every session; nor does
                # a ride along a catch-up another slot called for.
                called = catchup and i not in step.riders
                recent = (*(t for t in st.catchups if t > started - 1.0), started) if called else st.catchups
                if not st.seen:
                    start_backlog, debt = start[i], st.debt
                elif st.start_backlog > 0:
                    start_backlog, debt = st.start_backlog - 1, st.debt
                else:
                    start_backlog, debt = 0, max(0, st.debt - 1)
                slots[i] = st.stepped_frame(
                    completed[i],
                    debt=debt,
                    start_backlog=start_backlog,
                    catchups=recent,
                    caught_up=True,
                    seen=True,
                    lags=(),
                )
            return attrs.evolve(
                state,
                slots=tuple(slots),
                catchup_steps=state.catchup_steps + catchup,
                ahead_steps=state.ahead_steps + (not catchup),
                drain=(),
            )
        assert step.tick_at is not None
        if state.origin is None:
            state = attrs.evolve(state, origin=step.tick_at, next_tick=0)
        else:
            state = self.settle(state, view, step.tick_at)
        tick_at = self.tick_time(state, state.next_tick)
        assert abs(tick_at - step.tick_at) < 1e-6, "after_step needs the view its step came from"
        slots = list(state.slots) + [FRESH_SLOT] * (len(view.slots) - len(state.slots))
        drain: list[int] = []
        for s in view.slots:
            if not s.steppable:
                slots[s.index] = FRESH_SLOT
            elif s.index in stepped:
                st = slots[s.index]
                # How many frames behind the slot is: its stepped frame was that many whole
                # ticks late (it completed before the previous tick). Current again, with no
                # frame left that was complete by this tick (a burst arrives all at once), it
                # owes nothing. Falling behind within its first two steps (after the start or
                # a missed tick) is the double an alignment makes (or a late frame's): one is
                # owed. Behind by the same depth for stable_backlog_ticks ticks: one is owed. A
                # client ahead of real time falls further behind instead (0.2 frames a tick at
                # 1.2x: never the same depth over 8 ticks).
                behind = max(0, math.floor((tick_at - s.frames[0]) / self.tick - EPS))
                left = any(c <= tick_at for c in s.frames[1:])
                stable = (st.stable + 1 if behind == st.backlog else 1) if behind else 0
                debt = st.debt if behind or left else 0
                if st.backlog and behind > st.backlog:
                    debt = 0  # falling further behind (ahead of real time): an old debt lapses
                if not st.seen:
                    start_backlog = self._start_backlog(s, started)
                else:
                    start_backlog = st.start_backlog if behind or left else 0
                if (behind or left) and st.streak <= 1 and not start_backlog:
                    # Its first frame came after the previous tick, and the hinted next one
                    # before this tick: two frames for one tick, although neither is a tick late.
                    # (A start backlog already owes those frames.)
                    debt = max(debt, 1)
                current = not st.backlog  # at its last tick: a client ahead of real time is not
                if current and (
                    (left and not behind and s.padded[1:2] == (True,))
                    or (behind == 1 and s.padded[:1] == (True,))
                ):
                    # The double of a re-alignment: the frame queued behind this one holds the
                    # pad, or held it and missed the tick before (stepped early without it). The
                    # server moved the session's phase, so it pays the extra frame back.
                    debt = max(debt, 1)
                if stable >= self.stable_backlog_ticks:
                    debt, stable = max(debt, 1), 0
                lags = (*st.lags, tick_at - s.frames[0])
                st = st.stepped_frame(
                    s.frames[0],
                    streak=st.streak + 1,
                    debt=debt,
                    caught_up=False,
                    backlog=behind,
                    stable=stable,
                    seen=True,
                    start_backlog=start_backlog,
                    lags=lags[-self.drain_window_ticks :],
                )
                # A drain needs a frame to drop: one queued behind this one, complete by now.
                queued = len(s.frames) > 1 and s.frames[1] <= tick_at + EPS
                if queued and self._owes_drain(st, view, started):
                    drain.append(s.index)
                    recent = (*(t for t in st.drains if t > started - 1.0), started)
                    st = attrs.evolve(st, lags=(), drains=recent)
                slots[s.index] = st
            else:
                slots[s.index] = self._missed(slots[s.index])
        return attrs.evolve(
            state,
            next_tick=state.next_tick + 1,
            slots=tuple(slots),
            ticks=state.ticks + 1,
            drain=tuple(drain),
            drains=state.drains + len(drain),
        )


Policy = WindowPolicy | DeadlinePolicy | GridPolicy


def make_policy(
    name: str,
    *,
    tick_ms: float = TICK_MS,
    max_batch_wait_ms: float = 20.0,
    guard_ms: float = 2.0,
    max_catchups_per_s: int = 2,
) -> Policy:
    """The tick policy called ``name`` (``grid``, ``deadline`` or ``window``)."""
    if name == "grid":
        return GridPolicy(tick_ms=tick_ms, guard_ms=guard_ms, max_catchups_per_s=max_catchups_per_s)
    if name == "deadline":
        return DeadlinePolicy(tick_ms=tick_ms, guard_ms=guard_ms)
    if name == "window":
        return WindowPolicy(max_batch_wait_ms=max_batch_wait_ms)
    raise ValueError(f"unknown tick policy {name!r}; choose one of: {', '.join(TICK_POLICIES)}")
