"""The scheduler's slot table (no trio): who holds each slot, its epoch and its frame queue."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

from ..model.engine import SessionPrompt, StepOutput


@attrs.frozen(slots=True, eq=False)
class StepResult:
    """One slot's step output, routed by the (epoch, frame index) captured before the step."""

    epoch: int
    frame_index: int
    output: StepOutput


class Occupant(Protocol):
    """A session as the scheduler sees it. Every call is made from the scheduler's task and must
    never block: the occupant only queues what it is told."""

    def deliver_nowait(self, result: StepResult) -> None:
        """A step result for one of the occupant's frames."""
        ...

    def reset_failed(self, exc: BaseException) -> None:
        """The engine could not reset the slot for the occupant's prompt (its queued frames are
        dropped); the occupant should end with an error."""
        ...

    def step_failed(self, exc: BaseException) -> None:
        """A step carrying one of the occupant's frames raised (its queued frames are dropped)."""
        ...

    def drain_nowait(self, queued: Sequence[tuple[int, float]]) -> int | None:
        """The slot's backlog is a jitter the catch-ups cannot clear: ``queued`` holds the
        (frame index, rms) of its waiting frames, oldest first. Return the index of the frame
        to drop (the occupant logs and counts it; the scheduler removes it from the queue in
        this same call), or None to keep them all (e.g. alignment "off")."""
        ...


@attrs.define(slots=True, eq=False)
class QueuedFrame:
    frame_index: int
    samples: npt.NDArray[np.float32]
    submitted_at: float
    padded: bool = False  # holds alignment pad samples (it completes early by design)


@attrs.define(slots=True, eq=False)
class Slot:
    index: int
    occupant: Occupant | None = None
    epoch: int = 0
    prompt: SessionPrompt | None = None
    frames: deque[QueuedFrame] = attrs.field(factory=deque)
    # A reset waiting to be applied before this slot's next step: (epoch, prompt).
    pending_reset: tuple[int, SessionPrompt | None] | None = None
    releasing: bool = False
    # When this slot's previous stepped frame was due: a frame queued behind its own session's
    # earlier frames is due one frame (80 ms) after the one before it, as if sent in real time.
    last_due: float | None = None

    @property
    def active(self) -> bool:
        return self.occupant is not None and not self.releasing


class SlotTable:
    def __init__(self, size: int) -> None:
        self.slots = [Slot(i) for i in range(size)]
        self._free = deque(range(size))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return len(self.slots) - len(self._free)

    def acquire(self, occupant: Occupant) -> Slot | None:
        if not self._free:
            return None
        slot = self.slots[self._free.popleft()]
        slot.occupant = occupant
        slot.epoch = 0
        slot.frames.clear()
        slot.pending_reset = None
        slot.releasing = False
        slot.last_due = None
        return slot

    def free_slot(self, slot: Slot) -> None:
        slot.occupant = None
        slot.frames.clear()
        slot.pending_reset = None
        slot.releasing = False
        self._free.append(slot.index)
