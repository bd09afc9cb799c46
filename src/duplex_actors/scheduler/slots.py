"""The scheduler's slot table (no trio): who holds each slot, its epoch and its frame queue."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import attrs
import numpy as np
import numpy.typing as npt


class Occupant(Protocol):
    """A session as the scheduler sees it: somewhere to put step results, never blocking."""

    def deliver_nowait(self, result: Any) -> None: ...


@attrs.define(slots=True, eq=False)
class QueuedFrame:
    frame_index: int
    samples: npt.NDArray[np.float32]
    submitted_at: float


@attrs.define(slots=True, eq=False)
class Slot:
    index: int
    occupant: Occupant | None = None
    epoch: int = 0
    prompt: Any = None
    frames: deque[QueuedFrame] = attrs.field(factory=deque)
    # A reset waiting to be applied before this slot's next step: (epoch, prompt).
    pending_reset: tuple[int, Any] | None = None
    releasing: bool = False

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
        return slot

    def free_slot(self, slot: Slot) -> None:
        slot.occupant = None
        slot.frames.clear()
        slot.pending_reset = None
        slot.releasing = False
        self._free.append(slot.index)
