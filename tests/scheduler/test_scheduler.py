"""The scheduler actor's tick policy, admission and routing, with a recording engine.

A unit test of one layer: the engine here only records calls (the real engine is exercised by
tests/test_server.py and tests/property).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.admission import ResourceExhausted
from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.model.engine import EngineDescription, SessionPrompt, StepOutput
from duplex_actors.model.family import MoshiFamily
from duplex_actors.scheduler.actor import RELEASE_DEFER_S, Scheduler
from duplex_actors.scheduler.clock import VIRTUAL_TIME, Threads


class RecordingEngine:
    """A ModelEngine that records its calls (prepare calls apart: they run in other tasks)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.family = MoshiFamily()
        self.calls: list[tuple] = []
        self.prepared: list[tuple] = []
        self.now = lambda: trio.current_time()

    def describe(self) -> EngineDescription:
        return EngineDescription(model_id="recording")

    def prepare(self, prompt):
        self.prepared.append((prompt, self.now()))

    def reset(self, slot, prompt):
        self.calls.append(("reset", slot, prompt, self.now()))

    def step(self, frames):
        self.calls.append(("step", tuple(sorted(frames)), self.now()))
        return {
            s: StepOutput(True, int(f[0]), "", (0,) * 8, (0,) * 8, np.zeros(FRAME_SAMPLES, np.float32))
            for s, f in frames.items()
        }


class Sink:
    def __init__(self) -> None:
        self.results: list[Any] = []

    def deliver_nowait(self, result) -> None:
        self.results.append(result)

    def reset_failed(self, exc: BaseException) -> None:
        raise AssertionError(f"unexpected reset failure: {exc!r}")

    def step_failed(self, exc: BaseException) -> None:
        raise AssertionError(f"unexpected step failure: {exc!r}")

    def drain_nowait(self, queued) -> int | None:
        return None  # never drains (a session with alignment "off")


def frame(value: int) -> np.ndarray:
    return np.full(FRAME_SAMPLES, value, dtype=np.float32)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def start(nursery, slots=3, wait_ms=20.0):
    engine = RecordingEngine(slots)
    scheduler = Scheduler(engine, clock=VIRTUAL_TIME, max_batch_wait_ms=wait_ms)
    await nursery.start(scheduler.run)
    return engine, scheduler


async def test_steps_at_once_when_every_active_slot_has_a_frame(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery)
        a, b = Sink(), Sink()
        sa, sb = sched.admit(a), sched.admit(b)
        t0 = trio.current_time()
        sched.submit_nowait(sa, 0, frame(1))
        await trio.testing.wait_all_tasks_blocked()
        assert not [c for c in engine.calls if c[0] == "step"]  # waits for b
        sched.submit_nowait(sb, 0, frame(2))
        await trio.testing.wait_all_tasks_blocked()
        (call,) = [c for c in engine.calls if c[0] == "step"]
        assert call[1] == (sa, sb) and call[2] == t0  # no waiting once the batch is full
        assert [r.output.text_token for r in a.results] == [1] and [
            r.output.text_token for r in b.results
        ] == [2]
        nursery.cancel_scope.cancel()


async def test_steps_a_partial_batch_after_max_batch_wait(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, wait_ms=20)
        a = Sink()
        sa = sched.admit(a)
        sched.admit(Sink())  # active but silent
        t0 = trio.current_time()
        sched.submit_nowait(sa, 0, frame(1))
        await trio.sleep(1)
        (call,) = [c for c in engine.calls if c[0] == "step"]
        assert call[1] == (sa,) and call[2] == pytest.approx(t0 + 0.020)
        nursery.cancel_scope.cancel()


async def test_one_frame_per_slot_per_step_in_order(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=1)
        a = Sink()
        s = sched.admit(a)
        for i in range(4):
            sched.submit_nowait(s, i, frame(10 + i))
        await trio.sleep(1)
        assert [r.frame_index for r in a.results] == [0, 1, 2, 3]
        assert len([c for c in engine.calls if c[0] == "step"]) == 4
        stats = sched.statistics()
        assert stats.frames_stepped == 4 and stats.batch_sizes == ((1, 4),)
        nursery.cancel_scope.cancel()


async def test_admission_refusal_and_release_after_reset(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=2)
        s0 = sched.admit(Sink())
        sched.request_reset(s0, 0, "prompt-a")
        sched.admit(Sink())
        with pytest.raises(ResourceExhausted):
            sched.admit(Sink())
        sched.submit_nowait(s0, 0, frame(0))
        await trio.sleep(1)
        await sched.release(s0)
        resets = [c for c in engine.calls if c[0] == "reset" and c[1] == s0]
        assert len(resets) == 2  # the session's own reset, and the reset before freeing
        assert sched.table.free == 1
        sched.admit(Sink())
        nursery.cancel_scope.cancel()


async def test_a_released_slots_reset_waits_for_the_step_the_others_are_due(autojump_clock):
    # Three sessions end as the fourth's frame is due: its step comes first, then the three
    # resets (one engine call each); a slot is freed at most RELEASE_DEFER_S later.
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=4)
        slots = [sched.admit(Sink()) for _ in range(4)]
        async with trio.open_nursery() as ending:
            for slot in slots[:3]:
                ending.start_soon(sched.release, slot)
            await trio.sleep(0)  # they are releasing before the frame comes
            t0 = trio.current_time()
            sched.submit_nowait(slots[3], 0, frame(0))
        calls = [(c[0], c[1]) for c in engine.calls]
        assert calls == [("step", (slots[3],)), *(("reset", s) for s in slots[:3])], calls
        assert trio.current_time() - t0 <= RELEASE_DEFER_S
        assert sched.table.free == 3
        nursery.cancel_scope.cancel()


async def test_results_carry_the_epoch_captured_before_the_step_and_frames_carry_over(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=1)
        a = Sink()
        s = sched.admit(a)
        sched.request_reset(s, 0, "p")
        sched.submit_nowait(s, 0, frame(0))
        await trio.sleep(1)
        sched.submit_nowait(s, 1, frame(1))
        sched.request_reset(s, 1, "p")  # new epoch before frame 1 was stepped: it is carried
        await trio.sleep(1)
        assert [(r.epoch, r.frame_index) for r in a.results] == [(0, 0), (1, 1)]
        kinds = [(c[0], c[1]) for c in engine.calls]
        assert kinds == [("reset", 0), ("step", (0,)), ("reset", 0), ("step", (0,))]
        nursery.cancel_scope.cancel()


async def test_late_frames_are_counted(autojump_clock):
    async with trio.open_nursery() as nursery:
        _engine, sched = await start(nursery, slots=1)
        s = sched.admit(Sink())
        for i in range(3):
            sched.submit_nowait(s, i, frame(i))
        await trio.sleep(1)
        # All three were submitted at once; virtual steps take no time, so none waited 80 ms.
        assert sched.statistics().late_frames == 0
        nursery.cancel_scope.cancel()


class SlowSteps:
    """Steps that take ``seconds`` of (virtual) time, as a real engine's do."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def run(self, fn):
        await trio.sleep(self.seconds)
        return fn()


async def test_a_session_backlog_is_not_counted_as_engine_lateness(autojump_clock):
    # 20 frames at once (a client far ahead of real time), 30 ms steps: the engine is never
    # late, yet frames 3.. wait over 80 ms since their submission, behind their own session's.
    async with trio.open_nursery() as nursery:
        sched = Scheduler(RecordingEngine(1), clock=VIRTUAL_TIME, executor=SlowSteps(0.03))
        await nursery.start(sched.run)
        s = sched.admit(Sink())
        for i in range(20):
            sched.submit_nowait(s, i, frame(i))
        await trio.sleep(2)
        stats = sched.statistics()
        assert stats.frames_stepped == 20
        assert stats.late_frames == 0 and stats.backlog_frames == 17
        nursery.cancel_scope.cancel()


async def test_a_backlog_the_engine_steps_slower_than_real_time_is_engine_lateness(autojump_clock):
    # 20 frames at once, 110 ms steps: behind the real-time pace by 30 ms more each frame, so
    # frames 3.. are late for the engine (over 80 ms after they were due); 1 and 2 are backlog.
    async with trio.open_nursery() as nursery:
        sched = Scheduler(RecordingEngine(1), clock=VIRTUAL_TIME, executor=SlowSteps(0.11))
        await nursery.start(sched.run)
        s = sched.admit(Sink())
        for i in range(20):
            sched.submit_nowait(s, i, frame(i))
        await trio.sleep(3)
        stats = sched.statistics()
        assert stats.frames_stepped == 20
        assert (stats.late_frames, stats.backlog_frames) == (17, 2)
        nursery.cancel_scope.cancel()


async def test_steps_slower_than_real_time_are_engine_lateness(autojump_clock):
    # One frame every 80 ms, 100 ms steps: the engine falls behind real time.
    async with trio.open_nursery() as nursery:
        sched = Scheduler(RecordingEngine(1), clock=VIRTUAL_TIME, executor=SlowSteps(0.1))
        await nursery.start(sched.run)
        s = sched.admit(Sink())
        for i in range(20):
            sched.submit_nowait(s, i, frame(i))
            await trio.sleep(0.08)
        await trio.sleep(1)
        stats = sched.statistics()
        assert stats.frames_stepped == 20 and stats.late_frames > 10
        nursery.cancel_scope.cancel()


class FailingSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.failed: list[BaseException] = []

    def step_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)


async def test_a_failed_step_ends_its_sessions_and_the_scheduler_goes_on(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=2)
        a, b = FailingSink(), FailingSink()
        sa, sb = sched.admit(a), sched.admit(b)
        real_step = engine.step
        calls = {"n": 0}

        def flaky(frames):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("kernel fault")
            return real_step(frames)

        engine.step = flaky
        sched.submit_nowait(sa, 0, frame(1))
        sched.submit_nowait(sb, 0, frame(2))
        await trio.sleep(1)
        sched.submit_nowait(sa, 1, frame(3))  # this step fails: only a is in it
        sched.submit_nowait(sa, 2, frame(4))  # queued behind it: dropped with it
        await trio.sleep(1)
        sched.submit_nowait(sb, 1, frame(5))
        await trio.sleep(1)
        assert len(a.failed) == 1 and not b.failed
        assert [r.frame_index for r in a.results] == [0]
        assert [r.frame_index for r in b.results] == [0, 1]
        assert sched.failed is None and sched.step_failures == 1
        assert dict(sched.statistics().dropped_frames)["step_failed"] == 2
        nursery.cancel_scope.cancel()


async def test_a_reset_is_prepared_first_and_a_superseded_prompt_is_skipped_under_virtual_time(
    autojump_clock,
):
    """The ``_prepare`` task runs under virtual time too (only its engine call is inline)."""
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=1)
        s = sched.admit(Sink())
        sched.request_reset(s, 0, "old")
        sched.request_reset(s, 1, "new")  # before the first prepare had its turn
        await trio.testing.wait_all_tasks_blocked()
        assert [p for p, _ in engine.prepared] == ["new"]
        assert [c[:3] for c in engine.calls] == [("reset", s, "new")]
        sched.submit_nowait(s, 0, frame(7))
        await trio.sleep(1)
        assert [c[0] for c in engine.calls] == ["reset", "step"]
        nursery.cancel_scope.cancel()


async def test_a_failed_prepare_still_leaves_the_reset_to_report(autojump_clock):
    async with trio.open_nursery() as nursery:
        engine, sched = await start(nursery, slots=1)

        def failing_prepare(prompt):
            engine.prepared.append((prompt, engine.now()))
            raise RuntimeError("no such voice")

        engine.prepare = failing_prepare
        s = sched.admit(Sink())
        sched.request_reset(s, 0, "p")
        await trio.testing.wait_all_tasks_blocked()
        assert [p for p, _ in engine.prepared] == ["p"]
        assert [c[:3] for c in engine.calls] == [("reset", s, "p")]  # the reset ran after all
        nursery.cancel_scope.cancel()


async def test_prepare_runs_in_a_worker_thread_under_virtual_time_when_asked(autojump_clock):
    """A thread executor for prepare under a MockClock: the step stays inline (decision 7),
    prepare runs in another thread and the reset waits for it."""
    engine = RecordingEngine(1)
    threads: dict[str, int] = {}
    release = threading.Event()

    started = threading.Event()

    def slow_prepare(prompt):
        threads["prepare"] = threading.get_ident()
        started.set()
        release.wait(5)
        engine.prepared.append((prompt, None))

    def reset(slot, prompt):
        threads["reset"] = threading.get_ident()
        engine.calls.append(("reset", slot, prompt))

    engine.prepare, engine.reset = slow_prepare, reset  # type: ignore[method-assign]
    sched = Scheduler(engine, clock=VIRTUAL_TIME, prepare_executor=Threads())
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        s = sched.admit(Sink())
        sched.request_reset(s, 0, SessionPrompt(persona="p"))
        sched.submit_nowait(s, 0, frame(3))
        # Wait in real time: under the autojumping MockClock a virtual fail_after would expire
        # while the worker thread has not even started.
        assert await trio.to_thread.run_sync(started.wait, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert not engine.calls  # neither the reset nor the frame's step before prepare returns
        release.set()
        give_up = time.monotonic() + 10
        while len(engine.calls) < 2:
            assert time.monotonic() < give_up, engine.calls
            await trio.sleep(0.001)
        assert [c[0] for c in engine.calls] == ["reset", "step"]
        assert threads["prepare"] != threading.get_ident() == threads["reset"]
        nursery.cancel_scope.cancel()


def _fresh_view(scheduler: Scheduler) -> tuple:
    """The policy's view of every slot, built from the table (what ``_view`` caches)."""
    from duplex_actors.scheduler.policy import SlotView

    views = []
    for e in scheduler.table.slots:
        head = list(e.frames)[:2]
        views.append(
            SlotView(
                e.index,
                active=e.active,
                reset_pending=e.pending_reset is not None,
                frames=tuple(f.submitted_at for f in head),
                padded=tuple(f.padded for f in head),
                queued=len(e.frames),
            )
        )
    return tuple(views)


async def test_the_view_rebuilt_for_changed_slots_only_is_the_whole_tables(autojump_clock, monkeypatch):
    """Sessions joining, sending at random, resetting, leaving: at every wake-up the cached
    view equals one built from the whole table."""
    import random

    checked = [0]
    original = Scheduler._view

    def checked_view(self: Scheduler):
        view = original(self)
        assert view.slots == _fresh_view(self)
        checked[0] += 1
        return view

    monkeypatch.setattr(Scheduler, "_view", checked_view)
    engine = RecordingEngine(slots=4)
    scheduler = Scheduler(engine, clock=VIRTUAL_TIME)
    rng = random.Random(7)
    frame = np.zeros(FRAME_SAMPLES, np.float32)
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        held: dict[int, int] = {}  # slot -> next frame index
        for _ in range(300):
            action = rng.random()
            if action < 0.15 and scheduler.table.free:
                slot = scheduler.admit(Sink())
                held[slot] = 0
                scheduler.request_reset(slot, 0, None)
            elif action < 0.7 and held:
                slot = rng.choice(list(held))
                scheduler.submit_nowait(slot, held[slot], frame, padded=rng.random() < 0.2)
                held[slot] += 1
            elif action < 0.8 and held:
                slot = rng.choice(list(held))
                scheduler.request_reset(slot, rng.randrange(1, 9), None)
            elif action < 0.9 and held:
                slot = rng.choice(list(held))
                del held[slot]
                nursery.start_soon(scheduler.release, slot)
            await trio.sleep(rng.choice([0, 0.01, 0.03, 0.08]))
        nursery.cancel_scope.cancel()
    assert checked[0] > 100


async def test_a_slot_released_before_its_due_reset_is_applied_stalls_no_one(autojump_clock, monkeypatch):
    """A session that ends while its reset waits (due, not yet applied): that reset is never
    applied (the slot's release resets it instead), and the scheduler goes on stepping the
    others. A reset the run loop counts as due is one it applies: it asks again at once, with
    no checkpoint between, so a due reset it skipped would spin the engine core's loop."""
    rounds: list[bool] = []
    apply_resets = Scheduler._apply_resets

    async def counted(self: Scheduler, *, releases: bool) -> None:
        rounds.append(releases)
        if len(rounds) > 50:
            raise AssertionError("the reset branch ran 50 times in a row: the scheduler spins")
        await apply_resets(self, releases=releases)

    monkeypatch.setattr(Scheduler, "_apply_resets", counted)
    async with trio.open_nursery() as nursery:
        engine = RecordingEngine(2)
        sched = Scheduler(engine, clock=VIRTUAL_TIME)
        a, b = Sink(), Sink()
        sa, sb = sched.admit(a), sched.admit(b)
        # All before the loop looks: a's reset due, b's frame queued, a's client gone.
        sched.request_reset(sa, 0, None)
        sched.submit_nowait(sb, 0, frame(5))
        nursery.start_soon(sched.release, sa)
        await trio.testing.wait_all_tasks_blocked()
        await nursery.start(sched.run)
        for i in range(1, 4):
            await trio.sleep(0.08)
            sched.submit_nowait(sb, i, frame(5 + i))
        await trio.sleep(1)
        assert [r.frame_index for r in b.results] == [0, 1, 2, 3]
        assert [c[:3] for c in engine.calls if c[0] == "reset"] == [("reset", sa, None)]
        assert sched.table.free == 1 and rounds == [True], rounds  # the release, once
        nursery.cancel_scope.cancel()
