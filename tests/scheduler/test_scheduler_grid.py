"""The scheduler actor driven by the grid and deadline policies (virtual time).

The policies themselves are table-tested in test_policy.py; here: the actor asks them and
steps what they answer, so sessions at spread phases share one step per tick and the grid's
phase never drifts with step time.
"""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from duplex_actors.scheduler.actor import Scheduler
from duplex_actors.scheduler.clock import VIRTUAL_TIME
from duplex_actors.scheduler.policy import make_policy

from .test_scheduler import RecordingEngine, Sink, frame

TICK = 0.080


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class SlowEngine(RecordingEngine):
    """Each step takes ``cost`` seconds of (virtual) time, as a real batch would."""

    def __init__(self, slots: int, cost: float) -> None:
        super().__init__(slots)
        self.cost = cost

    def step(self, frames):
        out = super().step(frames)
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        clock.jump(self.cost)
        return out


async def stream(sched: Scheduler, slot: int, phase: float, frames: int, t0: float) -> None:
    """Submit ``frames`` frames of one session, each completing at t0 + phase + k * 80 ms."""
    for k in range(frames):
        await trio.sleep_until(t0 + phase + k * TICK)
        sched.submit_nowait(slot, k, frame(k))


def steps(engine: RecordingEngine) -> list[tuple]:
    return [c for c in engine.calls if c[0] == "step"]


async def run_spread(policy: str, phases: list[float], frames: int = 25, cost: float = 0.0):
    engine = SlowEngine(len(phases), cost)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy(policy))
    sinks = [Sink() for _ in phases]
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        slots = [sched.admit(s) for s in sinks]
        t0 = trio.current_time()
        async with trio.open_nursery() as senders:
            for slot, phase in zip(slots, phases, strict=True):
                senders.start_soon(stream, sched, slot, phase, frames, t0)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    return engine, sched, sinks, t0


async def test_grid_steps_spread_sessions_once_per_tick(autojump_clock):
    phases = [0.0, 0.013, 0.031, 0.047, 0.066]
    engine, sched, sinks, _ = await run_spread("grid", phases)
    frames = 25 * len(phases)
    assert all([r.frame_index for r in s.results] == list(range(25)) for s in sinks)
    st = sched.statistics()
    assert st.frames_stepped == frames and st.tick_policy == "grid"
    # Steps per tick = steps / (frames stepped / sessions): the window policy needs ~2-5 here.
    steps_per_tick = st.ticks / (frames / len(phases))
    assert steps_per_tick <= 1.25, (steps_per_tick, [c[1] for c in steps(engine)])
    assert st.frame_wait_seconds_buckets[-1][1] == frames
    assert st.frame_wait_seconds_sum / frames < TICK


async def test_window_policy_splits_the_same_spread_into_several_steps(autojump_clock):
    # The control for the test above, measured in the same way: today's policy.
    phases = [0.0, 0.013, 0.031, 0.047, 0.066]
    _, sched, sinks, _ = await run_spread("window", phases)
    assert all(len(s.results) == 25 for s in sinks)
    st = sched.statistics()
    assert st.tick_policy == "window"
    assert st.ticks / 25 >= 2.0


async def test_grid_phase_does_not_drift_with_step_time(autojump_clock):
    # Full batches at every tick with 30 ms steps: the steps stay on one 80 ms cadence (a grid
    # booked from "now" after each step would slide by the step time).
    engine, sched, _, _ = await run_spread("grid", [0.0, 0.003, 0.006], frames=40, cost=0.030)
    full = [c[2] for c in steps(engine) if len(c[1]) == 3]
    assert len(full) >= 38
    offsets = [((t - full[0]) / TICK) % 1.0 for t in full]
    assert all(min(o, 1 - o) < 1e-6 for o in offsets), offsets
    assert sched.statistics().frames_stepped == 120


async def test_grid_serves_a_client_ahead_of_real_time_one_frame_per_tick(autojump_clock):
    engine = SlowEngine(2, 0.0)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("grid"))
    fast, paced = Sink(), Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        sf, sp = sched.admit(fast), sched.admit(paced)
        t0 = trio.current_time()
        for k in range(50):  # 4 s of audio at once
            sched.submit_nowait(sf, k, frame(k))
        await stream(sched, sp, 0.020, 25, t0)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    # 25 ticks of the paced session, plus its first frame's catch-up at most, plus the
    # fast one's first-frame catch-up and at most 2 catch-ups a second: never one per tick.
    assert len(paced.results) == 25
    assert len(fast.results) <= 25 + 2 + 2 * 3, len(fast.results)
    assert sched.statistics().catchup_steps <= 2 + 2 * 3
    assert sched.statistics().ahead_steps == 0  # the paced session is never a tick behind


async def test_grid_serves_an_upload_alone_at_the_engines_pace(autojump_clock):
    engine = SlowEngine(1, 0.010)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("grid"))
    upload = Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        slot = sched.admit(upload)
        for k in range(50):  # 4 s of audio at once
            sched.submit_nowait(slot, k, frame(k))
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    # All of it within 1 s (one frame per tick would have served 13), mostly ahead of the grid.
    assert len(upload.results) == 50
    st = sched.statistics()
    assert st.ahead_steps >= 30 and st.catchup_steps <= 2


async def test_deadline_policy_steps_partial_batches_late_in_the_tick(autojump_clock):
    engine = SlowEngine(2, 0.0)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("deadline"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        sa = sched.admit(Sink())
        sched.admit(Sink())  # active, silent
        t0 = trio.current_time()
        sched.submit_nowait(sa, 0, frame(1))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    (call,) = steps(engine)
    # No recent steps yet: the window is the tick minus the guard (78 ms).
    assert call[2] == pytest.approx(t0 + 0.078)


async def test_the_view_holds_the_two_oldest_frames_of_a_backlog(autojump_clock):
    sched = Scheduler(RecordingEngine(1), clock=VIRTUAL_TIME)
    slot = sched.admit(Sink())
    assert sched._view().slots[slot].frames == ()
    t0 = trio.current_time()
    for k in range(5):
        sched.submit_nowait(slot, k, frame(k))
        await trio.sleep(0.01)
    assert sched._view().slots[slot].frames == pytest.approx((t0, t0 + 0.01))


@pytest.mark.parametrize("policy", ["window", "deadline"])
async def test_no_grid_without_the_grid_policy(autojump_clock, policy):
    _, sched, _, _ = await run_spread(policy, [0.0, 0.013], frames=5)
    assert sched.statistics().ticks > 0 and sched.grid() is None


async def test_grid_is_the_grid_policys_origin_and_period(autojump_clock):
    engine = SlowEngine(2, 0.004)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("grid"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        slot = sched.admit(Sink())
        sched.admit(Sink())  # active, silent: no early steps, every regular step at a tick
        assert sched.grid() is None  # before the first tick
        t0 = trio.current_time()
        for k in range(6):
            await trio.sleep_until(t0 + 0.031 + k * TICK)
            sched.submit_nowait(slot, k, frame(k))
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    grid = sched.grid()
    assert grid is not None and grid.period == pytest.approx(TICK)
    # The first frame booked the grid 10 ms after itself; every later tick step sits on it.
    assert grid.origin == pytest.approx(t0 + 0.031 + 0.010)
    on_grid = [c for c in steps(engine) if abs((c[2] - grid.origin) / TICK % 1.0 - 0.5) > 0.5 - 1e-6]
    assert len(on_grid) == len(steps(engine)) - sched.statistics().catchup_steps >= 5


async def test_a_tick_held_for_frames_late_together_is_in_the_grid_the_aligners_see(autojump_clock):
    # Three sessions on cadence; frame 10 of two of them comes 20 ms late (a shared stall): the
    # tick waits for them, and the grid names it, so their aligners do not raise their margins.
    engine = SlowEngine(3, 0.020)
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("grid"))

    async def late_stream(slot: int, phase: float, t0: float, late_at: int | None) -> None:
        for k in range(16):
            await trio.sleep_until(t0 + phase + k * TICK + (0.020 if k == late_at else 0.0))
            sched.submit_nowait(slot, k, frame(k))

    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        slots = [sched.admit(Sink()) for _ in range(3)]
        t0 = trio.current_time()
        async with trio.open_nursery() as senders:
            for slot, phase, late_at in zip(slots, (0.0, 0.002, 0.004), (None, 10, 10), strict=True):
                senders.start_soon(late_stream, slot, phase, t0, late_at)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    grid = sched.grid()
    assert grid is not None
    # Frame 10 of the late sessions was due (jitter-free) at t0 + 0.8 s + 2-4 ms: its tick.
    tick = grid.tick_at_or_after(t0 + 10 * TICK + 0.004)
    assert grid.held == {tick}
    # It was stepped with its tick's frames, not left for a catch-up or the next tick.
    assert sched.statistics().catchup_steps == 1  # the first frame's only


async def test_released_slots_are_freed_one_between_two_steps_once_overdue(autojump_clock):
    # A backlog keeps a step due at every moment (90 ms steps): the three released slots' resets
    # wait RELEASE_DEFER_S, then go one between two steps, never all before the next step.
    from duplex_actors.scheduler.actor import RELEASE_DEFER_S

    engine = SlowEngine(4, 0.090)
    # A 5 ms batch window: its wait (the other slots have no frame) is under RELEASE_SLACK_S.
    sched = Scheduler(engine, clock=VIRTUAL_TIME, policy=make_policy("window", max_batch_wait_ms=5))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        slots = [sched.admit(Sink()) for _ in range(4)]
        for k in range(12):
            sched.submit_nowait(slots[3], k, frame(k))
        t0 = trio.current_time()
        async with trio.open_nursery() as ending:
            for slot in slots[:3]:
                ending.start_soon(sched.release, slot)
        nursery.cancel_scope.cancel()
    kinds = [c[0] for c in engine.calls]
    resets = [c[-1] - t0 for c in engine.calls if c[0] == "reset"]
    # None before it is overdue, never two without a step between (the releases register as
    # their tasks start, beside the inline steps: within the first steps), all three soon.
    assert len(resets) == 3 and resets[0] >= RELEASE_DEFER_S, resets
    assert all(a != "reset" or b != "reset" for a, b in itertools.pairwise(kinds)), kinds
    assert resets[-1] <= RELEASE_DEFER_S + 6 * 0.090 + 1e-6 and sched.table.free == 3, resets
