"""The drain: a slot's jitter backlog that catch-ups cannot clear loses one queued frame.

The grid policy decides (pure: ``PolicyState.drain`` after a tick's ``after_step``); the
scheduler actor asks the occupant which frame (``drain_nowait``) and removes it. Table tests
over hand-built ticks, the shell with a fake occupant, and hypothesis over arrival traces: a
client sending faster than real time is never drained; after a late burst of k frames the slot
is back to at most one frame behind within a bounded number of ticks.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.scheduler.actor import Scheduler
from duplex_actors.scheduler.clock import VIRTUAL_TIME
from duplex_actors.scheduler.policy import (
    GridPolicy,
    PolicyState,
    SchedulerView,
    SlotState,
    SlotView,
    StepNow,
)

from .test_scheduler import Sink
from .test_scheduler_grid import SlowEngine

TICK = 0.080
MS = 1e-3
SLOW = (0.055,)  # two 55 ms steps do not fit in a tick, three not in two: no catch-up is available
FAST = (0.010,)


def ticks(
    policy: GridPolicy,
    lags_ms: Sequence[float],
    *,
    steps: tuple[float, ...] = SLOW,
    start: SlotState | None = None,
    first_tick: int = 20,
) -> list[PolicyState]:
    """Regular ticks of one slot (and a silent one) whose stepped frame completed ``lag`` ms
    before each tick; the states after each."""
    state = PolicyState(origin=0.0, next_tick=first_tick, slots=(start or SlotState(streak=10, seen=True),))
    out = []
    for k, lag in enumerate(lags_ms):
        at = (first_tick + k) * TICK
        frames = (at - lag * MS, at - lag * MS + TICK)
        view = SchedulerView(
            (SlotView(0, active=True, frames=frames), SlotView(1, active=True)), steps, state
        )
        step = policy.decide(at, view)
        assert isinstance(step, StepNow) and step.kind == "tick" and step.slots == (0,), step
        state = policy.after_step(state, view, step, at)
        out.append(state)
    return out


def drained_at(states: list[PolicyState]) -> list[int]:
    return [k for k, s in enumerate(states) if s.drain]


# -- table tests --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("label", "lags_ms", "steps", "want"),
    [
        ("3 behind, stable, no catch-up fits: drained at the 8th tick", [245.0] * 12, SLOW, [7]),
        ("2 behind is enough", [165.0] * 8, SLOW, [7]),
        ("1 behind is left to the catch-ups", [85.0] * 20, SLOW, []),
        ("current is never drained", [5.0] * 20, SLOW, []),
        ("current with jitter is never drained", [5, 70, 30, 79, 2, 55, 41, 66] * 3, SLOW, []),
        ("100 ms chunks: frames complete in pairs, never drained", [20, 40, 60, 80, 100] * 4, SLOW, []),
        ("5 behind is drained", [405.0] * 8, SLOW, [7]),
        ("6 behind (7 queued) is an upload, never drained", [485.0] * 20, SLOW, []),
        (
            "jitter on the lag does not hide a stable backlog",
            [245, 250, 247, 260, 246, 251, 249, 245],
            SLOW,
            [7],
        ),
        ("a lag growing 4 ms a tick (5 % fast) is not drained", [245 + 4 * k for k in range(16)], SLOW, []),
        ("a backlog shrinking by itself is drained at its depth", [245.0] * 5 + [165.0] * 8, SLOW, [7]),
        (
            "a fresh frame in the window: no standing backlog",
            [85, 78, 90, 79, 86, 81, 88, 80] * 2,
            SLOW,
            [],
        ),
    ],
)
def test_when_a_slot_is_owed_a_drain(
    label: str, lags_ms: list[float], steps: tuple[float, ...], want: list[int]
) -> None:
    assert drained_at(ticks(GridPolicy(), lags_ms, steps=steps)) == want, label


def test_catch_ups_that_fit_but_are_not_owed_leave_the_backlog_to_the_drain() -> None:
    # A standing backlog is owed a catch-up after stable_backlog_ticks; until then the drain,
    # once its window is full, comes first.
    policy = GridPolicy(stable_backlog_ticks=16)
    assert drained_at(ticks(policy, [245.0] * 12, steps=FAST)) == [7]


def test_a_standing_backlog_is_owed_a_catch_up_by_the_time_the_drain_window_fills() -> None:
    policy = GridPolicy()
    assert policy.stable_backlog_ticks <= policy.drain_window_ticks
    states = ticks(policy, [245.0] * policy.drain_window_ticks, steps=FAST)
    assert states[-1].slots[0].debt == 1 and not any(s.drain for s in states)


def test_a_catch_up_owed_that_fits_comes_first_unless_the_budget_is_spent() -> None:
    at = 20 * TICK
    owed = SlotState(streak=10, seen=True, debt=1)
    assert drained_at(ticks(GridPolicy(), [245.0] * 12, steps=FAST, start=owed)) == []
    spent = attrs.evolve(owed, catchups=(at + 0.3, at + 0.4))  # both within a second of tick 8
    assert drained_at(ticks(GridPolicy(), [245.0] * 8, steps=FAST, start=spent)) == [7]
    assert drained_at(ticks(GridPolicy(), [245.0] * 8, steps=SLOW, start=owed)) == [7]  # no fit


def test_drains_are_bounded_per_slot_per_second() -> None:
    # The occupant declines every drain (alignment "off"): the depth never changes, so the
    # policy asks again every 8 ticks, but at most twice in any second.
    states = ticks(GridPolicy(), [245.0] * 60, steps=SLOW)
    when = [k * TICK for k in drained_at(states)]
    assert len(when) >= 4
    for a, b in zip(when, when[2:], strict=False):
        assert b - a >= 1.0 - 1e-9
    assert states[-1].drains == len(when)


def test_catch_up_steps_owe_no_drain() -> None:
    policy = GridPolicy()
    state = ticks(policy, [245.0] * 7, steps=SLOW)[-1]
    view = SchedulerView(
        (SlotView(0, active=True, frames=(1.0, 1.08)), SlotView(1, active=True)), SLOW, state
    )
    after = policy.after_step(state, view, StepNow((0,), "catchup"), 27.5 * TICK)
    assert after.drain == ()


# -- the shell: the scheduler asks the occupant and removes its frame ----------------------------
class Drainable(Sink):
    def __init__(self, accept: bool = True) -> None:
        super().__init__()
        self.accept = accept
        self.asked: list[list[tuple[int, float]]] = []

    def drain_nowait(self, queued) -> int | None:
        self.asked.append(list(queued))
        if not self.accept:
            return None
        return min(queued, key=lambda q: q[1])[0]  # the lowest-energy frame, as SessionActor


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def run_burst(occupant: Drainable) -> tuple[Scheduler, Sink]:
    """Slot 0 streams in real time with a 410 ms stall at frame 10 (5 frames arrive together);
    slot 1 streams on the same phase. Steps take 55 ms: no catch-up fits, not even one that
    delays the next tick."""
    engine = SlowEngine(2, 0.055)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=GridPolicy())
    other = Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        mine, theirs = sched.admit(occupant), sched.admit(other)
        t0 = trio.current_time()

        async def stream(slot: int, stall: bool) -> None:
            for k in range(60):
                at = t0 + 0.030 + k * TICK
                if stall and 10 <= k < 15:
                    at = t0 + 0.030 + 10 * TICK + 0.410
                await trio.sleep_until(at)
                # frame k's energy: quiet (0.01) for frame 20, loud otherwise
                level = 0.01 if k == 20 else 0.5
                sched.submit_nowait(slot, k, np.full(FRAME_SAMPLES, level, np.float32))

        async with trio.open_nursery() as senders:
            senders.start_soon(stream, mine, True)
            senders.start_soon(stream, theirs, False)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    return sched, other


def test_a_burst_no_catch_up_can_serve_is_drained() -> None:
    # 70 ms steps: a catch-up fits only right after a tick, never after a tick's step.
    traces = [frames_of(1.0, 5.0, 0.0, 1, 8.0, (20, 5 * 80 - 1)), frames_of(1.0, 5.0, 0.0, 2, 8.0)]
    sim = simulate(GridPolicy(), traces, 0.070)
    assert sim.drained.count(0) >= 2 and 1 not in sim.drained
    assert max(b for _, b in sim.behind[0][-20:]) <= 1


async def test_the_scheduler_removes_the_frame_the_occupant_picks(autojump_clock):
    occupant = Drainable()
    sched, other = await run_burst(occupant)
    assert occupant.asked, "never asked to drain"
    (queued, *_) = occupant.asked
    assert 2 <= len(queued) <= 6
    assert [i for i, _ in queued] == sorted(i for i, _ in queued)  # oldest first
    assert all(rms == pytest.approx(0.01 if i == 20 else 0.5) for i, rms in queued)
    got = [r.frame_index for r in occupant.results]
    drained = set(range(60)) - set(got)
    assert len(drained) == sched.statistics().drained_frames == len(occupant.asked)
    assert got == sorted(got) and len(got) + len(drained) == 60
    assert [r.frame_index for r in other.results] == list(range(60))  # the other slot untouched
    assert dict(sched.statistics().dropped_frames).get("drained", 0) == 0  # the occupant counts


async def test_a_declined_drain_removes_nothing(autojump_clock):
    occupant = Drainable(accept=False)
    sched, _ = await run_burst(occupant)
    assert occupant.asked
    assert [r.frame_index for r in occupant.results] == list(range(60))
    assert sched.statistics().drained_frames == 0


# -- hypothesis over arrival traces ---------------------------------------------------------------
def frames_of(
    speed: float,
    phase_ms: float,
    jitter_ms: float,
    seed: int,
    seconds: float,
    stall: tuple[int, float] | None = None,
    chunk_ms: float = 80.0,
) -> list[float]:
    """Completion times (s) of the 80 ms frames of a client sending ``chunk_ms`` chunks at
    ``speed`` x real time over an in-order link (``stall``: chunk j delayed by that many ms)."""
    rng = random.Random(seed)
    arrivals, last = [], 0.0
    for j in range(int(seconds * 1000 * speed / chunk_ms)):
        at = phase_ms + (j + 1) * chunk_ms / speed + rng.uniform(0, jitter_ms)
        if stall is not None and j == stall[0]:
            at += stall[1]
        last = max(last, at)
        arrivals.append(last / 1000)
    # frame k completes with the chunk holding its last sample
    frames = int(len(arrivals) * chunk_ms // 80)
    return [arrivals[math.ceil((k + 1) * 80 / chunk_ms - 1e-9) - 1] for k in range(frames)]


@attrs.define
class Sim:
    drained: list[int] = attrs.field(factory=list)  # slots, one per drain
    catchups: list[int] = attrs.field(factory=list)  # slots, one per catch-up
    behind: list[list[tuple[float, int]]] = attrs.field(factory=list)  # per slot: (tick, frames behind)


def simulate(policy: GridPolicy, traces: list[list[float]], cost: float) -> Sim:
    """The scheduler with an occupant that always drains (the oldest queued frame)."""
    arrivals = sorted((c, i) for i, frames in enumerate(traces) for c in frames)
    queues: list[deque[float]] = [deque() for _ in traces]
    recent: deque[float] = deque(maxlen=32)
    state = PolicyState()
    sim = Sim(behind=[[] for _ in traces])
    t, a = 0.0, 0
    while a < len(arrivals) or any(queues):
        while a < len(arrivals) and arrivals[a][0] <= t + 1e-9:
            queues[arrivals[a][1]].append(arrivals[a][0])
            a += 1
        view = SchedulerView(
            tuple(SlotView(i, active=True, frames=tuple(q)[:2]) for i, q in enumerate(queues)),
            tuple(recent),
            state,
        )
        decision = policy.decide(t, view)
        if isinstance(decision, StepNow):
            for i in decision.slots:
                c = queues[i].popleft()
                if decision.tick_at is not None:
                    sim.behind[i].append(
                        (decision.tick_at, max(0, math.floor((decision.tick_at - c) / TICK - 1e-9)))
                    )
            if decision.kind == "catchup":
                sim.catchups.extend(decision.slots)
            state = policy.after_step(state, view, decision, t)
            for i in state.drain:
                assert queues[i], "a drain owed to an empty queue"
                queues[i].popleft()
                sim.drained.append(i)
            recent.append(cost)
            t += cost
        else:
            assert decision.at < math.inf or a < len(arrivals)
            t = min(decision.at, arrivals[a][0] if a < len(arrivals) else math.inf)
    return sim


PROPERTIES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(
    st.floats(1.05, 3.0),
    st.floats(0, 80),
    st.sampled_from([0.0, 0.5, 2.0]),
    st.lists(st.tuples(st.floats(0, 80), st.integers(0, 40), st.floats(0, 300)), max_size=3),
    st.sampled_from([0.010, 0.030, 0.045, 0.070]),
    st.integers(0, 2**16),
)
def test_a_client_faster_than_real_time_is_never_drained(
    speed: float, phase: float, jitter: float, others: list[tuple[float, int, float]], cost: float, seed: int
) -> None:
    traces = [frames_of(speed, phase, jitter, seed, 6.0)]
    traces += [frames_of(1.0, p, 2.0, seed + k, 6.0, (j, d)) for k, (p, j, d) in enumerate(others)]
    sim = simulate(GridPolicy(), traces, cost)
    assert 0 not in sim.drained


@PROPERTIES
@given(
    st.lists(
        st.tuples(st.sampled_from([10.0, 20.0, 30.0, 40.0, 80.0, 100.0, 120.0]), st.floats(0, 80)),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([0.0, 0.5, 2.0]),
    st.sampled_from([0.010, 0.030, 0.045, 0.070]),
    st.integers(0, 2**16),
)
def test_a_real_time_client_of_any_chunk_size_is_never_drained(
    sessions: list[tuple[float, float]], jitter: float, cost: float, seed: int
) -> None:
    traces = [frames_of(1.0, p, jitter, seed + i, 6.0, chunk_ms=c) for i, (c, p) in enumerate(sessions)]
    assert simulate(GridPolicy(), traces, cost).drained == []


@PROPERTIES
@given(
    st.integers(1, 5),
    st.floats(0, 80),
    st.integers(5, 30),
    st.sampled_from([0.0, 0.5, 2.0]),
    st.sampled_from([0.010, 0.030, 0.045, 0.070]),
    st.integers(1, 3),
    st.integers(0, 2**16),
)
def test_after_a_late_burst_the_slot_is_back_within_bounded_ticks(
    k: int, phase: float, at: int, jitter: float, cost: float, others: int, seed: int
) -> None:
    """A stall that makes k frames arrive together (k * 80 ms): by ``bound`` ticks after the
    burst arrived the slot is at most one frame behind, and stays so."""
    stall_ms = k * 80.0 - 1.0
    traces = [frames_of(1.0, phase, jitter, seed, 12.0, (at, stall_ms))]
    traces += [frames_of(1.0, (phase + 20 * i) % 80, jitter, seed + i, 12.0) for i in range(1, others + 1)]
    policy = GridPolicy()
    sim = simulate(policy, traces, cost)
    burst = traces[0][at]
    # The backlog shows within k + 2 ticks. Then per frame of it: a catch-up if one fits and
    # the budget allows (at once for a slot that was steady, else once its depth has been stable
    # for stable_backlog_ticks), or a drain after a window of drain_window_ticks at its depth;
    # 2 ticks of slack each.
    per_frame = max(policy.stable_backlog_ticks, policy.drain_window_ticks) + 2
    bound = (k + 2) + (k - 1) * per_frame
    after = [b for tick_at, b in sim.behind[0] if tick_at >= burst + bound * TICK - 1e-9]
    assert after and max(after) <= 1, (sim.behind[0], sim.drained)
    assert sim.drained.count(0) <= k
    # Only a catch-up or a drain takes the slot back from k - 1 frames behind to 1.
    assert sim.catchups.count(0) + sim.drained.count(0) >= k - 2
    assert all(i == 0 for i in sim.drained)  # the others had no burst
