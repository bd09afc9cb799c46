"""Where time comes from and where the engine runs.

Real time runs engine calls in a worker thread so the event loop stays responsive. Virtual
time (tests with ``trio.testing.MockClock``, replay) runs them inline: with an autojumping
clock a thread would let the clock jump and fire timeouts while the step computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs
import trio

T = TypeVar("T")
# The engine's own worker thread: never competes with other to_thread users for a token.
_ENGINE_THREAD = trio.CapacityLimiter(1)


@attrs.frozen(slots=True)
class Clock:
    virtual: bool = False

    def now(self) -> float:
        return trio.current_time()

    async def run(self, fn: Callable[[], T]) -> T:
        if self.virtual:
            # Let other tasks run first, as they would while a thread computes: a session may
            # change epoch between a step's capture and its result, in tests too.
            await trio.lowlevel.checkpoint()
            return fn()
        return await trio.to_thread.run_sync(fn, limiter=_ENGINE_THREAD)


REAL_TIME = Clock(virtual=False)
VIRTUAL_TIME = Clock(virtual=True)
