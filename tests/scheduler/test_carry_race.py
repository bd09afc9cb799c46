"""Frames queued when a session's epoch changes are stepped in the new epoch, even when the
reset lands while another slot's reset is being applied (found in review)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.model.engine import EngineDescription, SessionPrompt, StepOutput
from duplex_actors.model.family import MoshiFamily
from duplex_actors.scheduler.actor import Scheduler
from duplex_actors.scheduler.clock import VIRTUAL_TIME

P, Q = SessionPrompt(persona="p"), SessionPrompt(persona="q")


class Engine:
    def __init__(self) -> None:
        self.slots = 2
        self.family = MoshiFamily()
        self.calls: list[tuple] = []
        self.on_reset: Callable[[int], Any] | None = None
        self.on_prepare: Callable[[Any], Any] | None = None

    def describe(self) -> EngineDescription:
        return EngineDescription(model_id="carry-race")

    def prepare(self, prompt) -> None:
        if self.on_prepare:
            self.on_prepare(prompt)

    def reset(self, slot, prompt):
        self.calls.append(("reset", slot, prompt))
        if self.on_reset:
            self.on_reset(slot)

    def step(self, frames):
        self.calls.append(("step", tuple(sorted(frames))))
        return {
            s: StepOutput(True, 0, "", (0,) * 8, (0,) * 8, np.zeros(FRAME_SAMPLES, np.float32))
            for s in frames
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


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_frame_queued_at_epoch_change_is_carried_even_if_another_slot_resets(autojump_clock):
    engine = Engine()
    sched = Scheduler(engine, clock=VIRTUAL_TIME)
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        a, b = Sink(), Sink()
        sa, sb = sched.admit(a), sched.admit(b)
        sched.request_reset(sa, 0, P)
        sched.request_reset(sb, 0, P)
        await trio.sleep(0.1)
        frame = np.zeros(FRAME_SAMPLES, np.float32)
        sched.submit_nowait(sa, 0, frame)
        await trio.sleep(0.1)

        # Session a: frame 1 drained, then a cancel (epoch 1) that lands while slot b's reset runs.
        def hook(slot):
            if slot == sb:
                engine.on_reset = None
                sched.request_reset(sa, 1, P)

        def drain_frame_1(prompt):
            # b's prompt is prepared (its reset is next): a's frame 1 is drained meanwhile.
            if prompt == Q:
                engine.on_prepare = None
                sched.submit_nowait(sa, 1, frame)

        engine.on_reset, engine.on_prepare = hook, drain_frame_1
        sched.request_reset(sb, 1, Q)
        await trio.sleep(0.1)
        assert [(r.epoch, r.frame_index) for r in a.results] == [(0, 0), (1, 1)]
        nursery.cancel_scope.cancel()
