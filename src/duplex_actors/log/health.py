"""Whether the log dir takes writes: the pure decision behind admissions and the re-probe.

Sans-io (no trio, no files): the log writer reports each failure (a log that could not be
created, written or fsynced) and each probe's outcome; this says when the dir becomes unavailable
and when it is available again. A probe only counts if no failure was reported while it ran, so a
probe that raced a failing write cannot reopen admissions.
"""

from __future__ import annotations

import enum

import attrs


class Transition(enum.Enum):
    UNAVAILABLE = "unavailable"
    AVAILABLE = "available"


@attrs.define(slots=True)
class LogDirHealth:
    available: bool = True
    last_error: str | None = None
    failures: int = 0
    """Failures reported so far (created, written or fsynced logs, not probes)."""
    probe_failures: int = 0
    recoveries: int = 0

    def failed(self, error: BaseException) -> Transition | None:
        """A log could not be created, written or fsynced; UNAVAILABLE if that is news."""
        self.failures += 1
        self.last_error = str(error)
        if not self.available:
            return None
        self.available = False
        return Transition.UNAVAILABLE

    def probe_started(self) -> int:
        """The token to hand to :meth:`probed` when that probe is done."""
        return self.failures

    def probed(self, token: int, error: BaseException | None) -> Transition | None:
        """A probe (write + fsync + remove a small file) ended with ``error`` (None: it worked);
        AVAILABLE when it reopens the dir."""
        if error is not None:
            self.probe_failures += 1
            self.last_error = str(error)
            return None
        if self.available or token != self.failures:
            return None
        self.available = True
        self.recoveries += 1
        return Transition.AVAILABLE
