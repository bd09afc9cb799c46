"""A front end's link to a real engine core (``run_engine_core`` with the stand-in engine, in
this process): how many messages a tick costs each way, and that the frames go through the
shared-memory rings."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import trio

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.core.link import CoreLink, connect_core
from duplex_actors.engine_core import CoreSettings, EngineCore, run_engine_core
from duplex_actors.log import records as r

TICKS = 24
SLOTS = 3


class _Occupant:
    """What the link delivers to a session, kept (the session actor's place in the link)."""

    def __init__(self) -> None:
        self.steps: list[r.Step] = []
        self.arrived = trio.Event()
        self.failures: list[BaseException] = []

    def deliver_record_nowait(self, record: r.Step) -> None:
        self.steps.append(record)
        self.arrived.set()

    def reset_failed(self, exc: BaseException) -> None:
        self.failures.append(exc)

    def step_failed(self, exc: BaseException) -> None:
        self.failures.append(exc)  # also when the test ends the link

    def drained_nowait(self, frame_index: int) -> bool:
        return False

    def drainable(self) -> bool:
        return False


def _count_calls(owner: Any, name: str, counter: list[int]) -> None:
    handle = getattr(owner, name)

    def counted(*args: Any) -> None:
        counter[0] += 1
        handle(*args)

    setattr(owner, name, counted)


async def test_a_tick_costs_one_message_each_way_and_its_frames_stay_in_the_rings():
    address = f"\0duplex-actors-test-link-{os.getpid()}"
    settings = CoreSettings(model="standin:5", max_sessions=SLOTS)
    async with trio.open_nursery() as nursery:
        start = await nursery.start(run_engine_core, settings, address)
        link: CoreLink = await connect_core(address, timeout_s=60)
        await nursery.start(link.run)
        assert start.core is not None
        core: EngineCore = start.core
        occupants = {}
        for _ in range(SLOTS):
            slot = await link.admit_slot()
            occupants[slot] = _Occupant()
            link.occupy(slot, occupants[slot])
            link.request_reset(slot, 0, None)
            await link.wait_reset(slot)

        to_frontend, to_core = [0], [0]
        _count_calls(link, "_handle", to_frontend)
        _count_calls(core, "_handle", to_core)
        frame = np.full(FRAME_SAMPLES, 0.25, dtype=np.float32)
        for tick in range(TICKS):
            for slot, occupant in occupants.items():
                occupant.arrived = trio.Event()
                link.submit_nowait(slot, tick, frame)
            with trio.fail_after(10):
                for occupant in occupants.values():
                    while len(occupant.steps) <= tick:
                        await occupant.arrived.wait()
                        occupant.arrived = trio.Event()
        assert not any(o.failures for o in occupants.values())
        [frontend] = core.frontends.values()
        outputs_written = frontend.outputs.written
        nursery.cancel_scope.cancel()

    assert all(len(o.steps) == TICKS for o in occupants.values())
    assert all(o.steps[-1].frame_index == TICKS - 1 for o in occupants.values())
    # One message per tick each way: the tick's results with the core's ack of its input
    # frames; the frames with the front end's ack of the results before them (a status only
    # when admission or the grid changed, not at each reading of the clocks).
    assert to_frontend[0] <= TICKS + 2, to_frontend[0]
    assert to_core[0] <= TICKS + 2, to_core[0]
    # Every frame went through shared memory: the acks came back before a ring filled.
    assert link._input.written == SLOTS * TICKS
    assert outputs_written == SLOTS * TICKS
