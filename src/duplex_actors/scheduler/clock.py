"""Where time comes from, and where blocking calls run: two seams, chosen separately.

- :class:`Clock` is the time source: trio's clock, ``virtual`` when it is a
  ``trio.testing.MockClock`` (tests, replay), whose time jumps whenever every task is blocked.
- An :class:`Executor` runs one synchronous call: :data:`INLINE` on the event loop (after a
  checkpoint), or :class:`Threads` in a worker thread.

docs/design.md, decision 7: virtual time runs the engine inline (:func:`engine_executor`): with an
autojumping clock a thread would let the clock jump and fire timeouts while the step computes.
Everything else about the scheduler's control flow (the ``_prepare`` task included) is the same
under either clock; a test may give it a thread executor under virtual time too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.frozen(slots=True)
class Clock:
    """The time source; ``virtual``: a MockClock, which jumps while every task waits."""

    virtual: bool = False

    def now(self) -> float:
        return trio.current_time()


REAL_TIME = Clock(virtual=False)
VIRTUAL_TIME = Clock(virtual=True)


class Executor(Protocol):
    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` to completion and return its result (its exception propagates)."""
        ...


@attrs.frozen(slots=True)
class Inline:
    """Run on the event loop. The checkpoint first lets other tasks run, as they would while a
    thread computes: a session may change epoch between a step's capture and its result."""

    async def run(self, fn: Callable[[], T]) -> T:
        await trio.lowlevel.checkpoint()
        return fn()


@attrs.frozen(slots=True, eq=False)
class Threads:
    """Run in a worker thread, under ``limiter`` (None: trio's default limiter)."""

    limiter: trio.CapacityLimiter | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, limiter=self.limiter)


INLINE = Inline()
# The engine's own worker thread: never competes with other to_thread users for a token.
ENGINE_THREAD = Threads(trio.CapacityLimiter(1))


def engine_executor(clock: Clock) -> Executor:
    """Where engine calls run under ``clock`` (docs/design.md, decision 7: inline under virtual time)."""
    return INLINE if clock.virtual else ENGINE_THREAD


def io_executor(clock: Clock) -> Executor:
    """Where file I/O (log recovery, retention) runs: inline under virtual time, else in trio's
    default worker threads, so it never holds the engine's thread."""
    return INLINE if clock.virtual else Threads()
