"""What the engine core and a front end say to each other, and its framing (no trio).

A message is a list of items written as one frame: a 4-byte little-endian length, then the
list pickled. Items are tuples whose first element names them; a front end's items go to the
core in the order it queued them (a reset before the frames of its new epoch), and a tick's
results for all of a front end's sessions go back in one message. Audio does not travel in the
items but in shared memory (:mod:`.rings`): an item names the frame's ring seq, or carries the
frame inline when the ring was full.

Front end -> core:

===================================================  ===============================================
``(ADMIT, request_id)``                              a free slot, answered ``ADMITTED`` or ``REFUSED``
``(UNADMIT, slot)``                                  a slot admitted but never used: free it
``(FRAME, slot, frame_index, padded, drainable,      a complete input frame (``at``: time.monotonic()
at, seq_or_bytes)``                                  when the session submitted it)
``(RESET, slot, epoch, prompt)``                     a fresh context for ``epoch`` (prompt or None)
``(RELEASE, slot)``                                  the session ended: reset and free, ``RELEASED``
``(ACK, seq)``                                       output frames up to ``seq`` are copied out (see
                                                     below)
``(GATHERED, request_id, snapshot)``                 this front end's counters, for a ``GATHER``
``(METRICS, request_id)``                            every front end's counters and the core's
===================================================  ===============================================

Core -> front end:

===================================================  ===============================================
``(PHASE, PhaseReport)``                             while the core starts: a start-up phase
``(FAILED, line)``                                   the core cannot serve (then it closes)
``(HELLO, EngineHello)``                             once ready (the ring descriptors ride along)
``(ADMITTED, request_id, slot)``                     admission granted
``(REFUSED, request_id, code, message)``             admission refused (``resource_exhausted`` ...)
``(RESULT, slot, epoch, frame_index, ready,          one slot's step output (its PCM16 in the
text_token, text_piece, agent_codes, user_codes,     output ring, or inline)
seq_or_bytes)``
``(DRAINED, slot, frame_index)``                     the policy dropped a queued frame (a jitter
                                                     backlog): the session logs it
``(RESET_DONE, slot, epoch)``                        the slot's context for ``epoch`` is ready
``(RESET_FAILED, slot, code, message)``              the engine could not reset it
``(STEP_FAILED, slot, message)``                     a step with this slot's frame raised
``(RELEASED, slot)``                                 the slot is reset and free
``(ACK, seq)``                                       input frames up to ``seq`` are copied out (see
                                                     below)
``(STATUS, CoreStatus)``                             admission state and the grid, when they change
                                                     (:meth:`CoreStatus.same_as`)
``(GATHER, request_id)``                             send your counters (``GATHERED``)
``(METRICS, request_id, CoreMetrics)``               the answer to ``METRICS``
===================================================  ===============================================

An ``ACK`` is not a message of its own: it rides with the next message the other way (the
front end's frames of the next tick, the core's results of this one), unless half of its ring
waits for it; then it goes at once. In a steady stream of ticks, the core sends each front end
one message per tick and the front end sends the core its frames.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..model.engine import EngineDescription
from ..model.family import ModelFamily
from ..model.startup import PhaseReport

ADMIT, UNADMIT, FRAME, RESET, RELEASE, ACK, GATHERED, METRICS = (
    "admit",
    "unadmit",
    "frame",
    "reset",
    "release",
    "ack",
    "gathered",
    "metrics",
)
HELLO, ADMITTED, REFUSED, RESULT, DRAINED, RESET_DONE, RESET_FAILED, STEP_FAILED, RELEASED = (
    "hello",
    "admitted",
    "refused",
    "result",
    "drained",
    "reset_done",
    "reset_failed",
    "step_failed",
    "released",
)
STATUS, GATHER, PHASE, FAILED = "status", "gather", "phase", "failed"

_LENGTH = struct.Struct("<I")
MAX_MESSAGE_BYTES = 64 << 20


class WireError(Exception):
    """A frame that cannot be a message of this link (too long, not a list)."""


@attrs.frozen(slots=True)
class EngineHello:
    """What a front end learns of the engine when it connects: enough to validate configs
    (the family, with the prompt-length check built from ``prompt_base`` and the tokenizer),
    write log headers (``description``) and size its rings."""

    pid: int
    slots: int
    description: EngineDescription
    family: ModelFamily  # without prompt_positions (a bound method of the core's engine)
    prompt_base: Mapping[str, int] | None  # per voice: prefill positions of an empty persona
    tokenizer: str | None  # the SentencePiece model the front end loads for prompt lengths
    tick_policy: str
    input_capacity: int
    output_capacity: int
    frontend_id: int
    warmup_ms: float  # the engine's warm-up at start-up (a prompt prefilled, three steps)
    phases: tuple[PhaseReport, ...] = ()  # the core's start-up, phase by phase


@attrs.frozen(slots=True)
class CoreStatus:
    """Admission and the tick grid as the core has them now (sent when they change).

    ``grid_origin`` is in ``time.monotonic()`` seconds (the same clock in every process of the
    machine); None before the grid's first tick or for a policy without a grid.
    """

    slots_total: int
    slots_free: int
    slots_releasing: int
    failed: str | None
    grid_origin: float | None = None
    grid_period: float = 0.080
    grid_held: frozenset[int] = frozenset()

    def same_as(self, other: CoreStatus | None) -> bool:
        """The same status for a front end: every field equal, the grid's origin within
        :data:`ORIGIN_TOLERANCE_S`."""
        if other is None:
            return False
        mine, theirs = self.grid_origin, other.grid_origin
        if mine is None or theirs is None:
            return self == other
        return abs(mine - theirs) <= ORIGIN_TOLERANCE_S and attrs.evolve(other, grid_origin=mine) == self


# The core reads its trio clock and time.monotonic() one after the other to give the grid's
# origin on the machine's clock, so the same origin comes out a microsecond or two apart from
# one reading to the next: a status whose origin moved less than this is not sent again.
ORIGIN_TOLERANCE_S = 1e-4


@attrs.frozen(slots=True)
class CoreMetrics:
    """The answer to ``METRICS``: the scheduler's statistics and every front end's counters
    (``snapshots``: one per front end that answered in time)."""

    statistics: Any  # scheduler.actor.SchedulerStatistics
    step_failures: int
    snapshots: Sequence[Any]
    frontends: int
    recovered_logs: int = 0  # logs with a torn tail the core truncated at start-up


def encode(items: Sequence[tuple[Any, ...]]) -> bytes:
    body = pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > MAX_MESSAGE_BYTES:
        raise WireError(f"a link message of {len(body)} bytes (at most {MAX_MESSAGE_BYTES})")
    return _LENGTH.pack(len(body)) + body


class Decoder:
    """Bytes in, messages (lists of items) out; bounded by ``MAX_MESSAGE_BYTES`` per message."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[list[tuple[Any, ...]]]:
        self._buffer += data
        out: list[list[tuple[Any, ...]]] = []
        buffer = self._buffer
        at = 0
        while len(buffer) - at >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, at)
            if size > MAX_MESSAGE_BYTES:
                raise WireError(f"a link message of {size} bytes (at most {MAX_MESSAGE_BYTES})")
            end = at + _LENGTH.size + size
            if len(buffer) < end:
                break
            items = pickle.loads(buffer[at + _LENGTH.size : end])
            if not isinstance(items, list):
                raise WireError(f"a link message is a list of items, not {type(items).__name__}")
            out.append(items)
            at = end
        if at:
            del buffer[:at]
        return out
