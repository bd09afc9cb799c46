"""A session actor's single ordered input stream: client commands and step results.

Two producers, two bounds: client commands wait for room (``put_command``: at most
``max_commands`` queued), step results never wait (``put_result_nowait``: the scheduler must
not block) and are bounded by construction, since a session has at most one result per frame
it submitted and the session core bounds the frames it buffers.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class Inbox(Generic[T]):
    def __init__(self, max_commands: int = 256) -> None:
        self._items: deque[tuple[bool, T]] = deque()
        self._commands = 0
        self._max_commands = max_commands
        self.commands_put = 0  # over the inbox's life: a command's ordinal is its count
        self.commands_taken = 0
        self._changed = trio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def put_command(self, item: T) -> int:
        """Queue a command, waiting while ``max_commands`` are queued; returns its ordinal (1
        for the first command ever queued). A checkpoint like every trio async call: a
        cancelled caller raises before queueing, and a producer that always finds room still
        lets the session (and every other task) run."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._commands >= self._max_commands and not self.closed:
            await self._changed.wait()
        if self.closed:
            raise trio.ClosedResourceError("the session has ended")
        self._items.append((True, item))
        self._commands += 1
        self.commands_put += 1
        ordinal = self.commands_put
        self._notify()
        await trio.lowlevel.cancel_shielded_checkpoint()  # queued: never cancelled after that
        return ordinal

    def put_command_nowait(self, item: T) -> int | None:
        """:meth:`put_command` without waiting and without a checkpoint: the ordinal, or None
        (nothing queued) when ``max_commands`` are queued. For a caller that checkpoints anyway
        (the connection's reader, at its next receive): a storm of small messages then costs
        no extra trip through the scheduler per message."""
        if self.closed:
            raise trio.ClosedResourceError("the session has ended")
        if self._commands >= self._max_commands:
            return None
        self._items.append((True, item))
        self._commands += 1
        self.commands_put += 1
        self._notify()
        return self.commands_put

    def count_handled_command(self) -> None:
        """A command its consumer handled at once, never queued: counted as put and taken, so
        that the ordinals of the commands after it stay in step."""
        if self.closed:
            raise trio.ClosedResourceError("the session has ended")
        self.commands_put += 1
        self.commands_taken += 1

    def put_result_nowait(self, item: T) -> None:
        if self.closed:
            return
        self._items.append((False, item))
        self._notify()

    async def get(self) -> T:
        while not self._items:
            await self._changed.wait()
        is_command, item = self._items.popleft()
        if is_command:
            self._commands -= 1
            self.commands_taken += 1
            self._notify()
        return item

    def close(self) -> list[T]:
        """Close; returns the items that were still queued (never to be handled)."""
        self.closed = True
        left = [item for _, item in self._items]
        self._items.clear()
        self._commands = 0
        self._notify()
        return left
