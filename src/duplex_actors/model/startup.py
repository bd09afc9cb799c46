"""Start-up phases: what the engine side is doing before it can serve, how far along, and how long it took.

The side that does the work (the model factory, in the server's process or in an engine
process) runs each phase in :meth:`Startup.phase` and reports :class:`PhaseReport` records to a
sink; the serving side keeps the latest (``/ready``'s body, ``/health``). A record is a plain
frozen value, so an engine process sends the same records through its pipe.

Phases, in order: ``import`` (torch and moshi), ``resolve`` (find or download the checkpoint), ``load`` (the dtype and memory
check, then LM, Mimi and tokenizer), ``engine`` (the batched engine and the voice prompts),
``digest`` (the checkpoint's SHA-256, cached by :mod:`.digest`), ``prefill`` (the default
prompt, once), then the server's ``warmup`` (one silent session through the real path; on
CUDA its first steps capture the CUDA graphs). Each is logged with its duration; the long
ones with their progress and an estimate of the time left.

No trio here: the engine side runs in threads or another process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

log = logging.getLogger("duplex_actors.startup")

PHASES = ("import", "resolve", "load", "engine", "digest", "prefill", "warmup")
RUNNING, DONE, FAILED, RETRYING = "running", "done", "failed", "retrying"
REPORT_INTERVAL_S = 0.5  # at most one progress record per phase this often
LOG_INTERVAL_S = 10.0  # at most one progress log line per phase this often


@attrs.frozen(slots=True)
class PhaseReport:
    """One phase's state. ``done``/``total`` in ``unit`` (bytes, positions, frames) when the
    phase measures its progress; ``eta_s`` once it can be estimated; ``detail``: the error of
    a failed phase, or the last failure and the next attempt of one that retries."""

    name: str
    state: str
    elapsed_s: float
    reported_at: float  # wall-clock time of this record (time.time(), the same in every process)
    done: float | None = None
    total: float | None = None
    unit: str = ""
    eta_s: float | None = None
    detail: str = ""

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        """The record for ``/ready``; a running phase's elapsed time and estimate are brought
        up to ``now`` (wall clock)."""
        since = max(0.0, (time.time() if now is None else now) - self.reported_at)
        running = self.state in (RUNNING, RETRYING)
        elapsed = self.elapsed_s + since if running else self.elapsed_s
        body: dict[str, Any] = {"name": self.name, "state": self.state, "elapsed_s": round(elapsed, 1)}
        if self.total:
            body.update(done=self.done, total=self.total, unit=self.unit)
            body["progress"] = round(min(1.0, (self.done or 0) / self.total), 3)
        if self.eta_s is not None and running:
            body["eta_s"] = round(max(0.0, self.eta_s - since), 1)
        if self.detail:
            body["detail"] = self.detail
        return body


PhaseSink = Callable[[PhaseReport], None]


def _amounts(done: float, total: float, unit: str) -> str:
    """``0.75 GB of 1.00 GB``, ``110 of 243 positions``."""
    if unit == "bytes":
        return f"{done / 1e9:.2f} GB of {total / 1e9:.2f} GB"
    return f"{done:g} of {total:g} {unit}".strip()


class Phase:
    """A running phase: :meth:`progress` reports how far it is."""

    def __init__(self, owner: Startup, name: str, total: float | None, unit: str) -> None:
        self._owner = owner
        self.name = name
        self.total = total
        self.unit = unit
        self.done: float = 0
        self.started = owner.clock()
        self._reported = -1e18
        self._logged = self.started

    def elapsed(self) -> float:
        return self._owner.clock() - self.started

    def eta(self) -> float | None:
        elapsed = self.elapsed()
        if not self.total or self.done <= 0 or elapsed < 1.0:
            return None
        return max(0.0, elapsed * (self.total - self.done) / self.done)

    def progress(self, done: float, total: float | None = None) -> None:
        """``done`` of ``total`` units so far (``total``: the phase's, unless given)."""
        self.done = done
        if total is not None:
            self.total = total
        now = self._owner.clock()
        if now - self._reported >= REPORT_INTERVAL_S:
            self._reported = now
            self._owner.emit(self.report(RUNNING))
        if now - self._logged >= LOG_INTERVAL_S and self.total:
            self._logged = now
            eta = self.eta()
            log.info(
                "start-up: %s %.0f%% (%s)%s",
                self.name,
                100 * done / self.total,
                _amounts(done, self.total, self.unit),
                f", about {eta:.0f} s left" if eta is not None else "",
            )

    def retrying(self, error: str, delay_s: float, attempt: int) -> None:
        """Attempt ``attempt`` failed with ``error``; the next one in ``delay_s``."""
        detail = f"attempt {attempt} failed: {error}; next attempt in {delay_s:.0f} s"
        log.warning("start-up: %s: %s", self.name, detail)
        self._owner.emit(self.report(RETRYING, detail=detail))

    def report(self, state: str, *, detail: str = "") -> PhaseReport:
        return PhaseReport(
            name=self.name,
            state=state,
            elapsed_s=self.elapsed(),
            reported_at=time.time(),
            done=self.done if self.total else None,
            total=self.total,
            unit=self.unit,
            eta_s=self.eta() if state == RUNNING else None,
            detail=detail,
        )


class Startup:
    """Runs start-up phases: logs each one's start, progress and duration, and sends every
    :class:`PhaseReport` to ``sink`` (thread-safe: phases may report from worker threads)."""

    def __init__(self, sink: PhaseSink | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._sink = sink
        self.clock = clock
        self._lock = threading.Lock()

    def emit(self, report: PhaseReport) -> None:
        if self._sink is not None:
            with self._lock:
                self._sink(report)

    @contextmanager
    def phase(self, name: str, *, total: float | None = None, unit: str = "") -> Iterator[Phase]:
        """Run one phase: a ``failed`` record (with the error) if the block raises an
        exception, which propagates; ``done`` with the duration otherwise."""
        phase = Phase(self, name, total, unit)
        log.info("start-up: %s ...", name)
        self.emit(phase.report(RUNNING))
        try:
            yield phase
        except Exception as exc:
            log.info("start-up: %s failed after %.1f s", name, phase.elapsed())
            self.emit(phase.report(FAILED, detail=f"{type(exc).__name__}: {exc}"))
            raise
        if phase.total:
            phase.done = phase.total
        log.info("start-up: %s done in %.1f s", name, phase.elapsed())
        self.emit(phase.report(DONE))


class StartupState:
    """The serving side's view: the latest record of each phase, in the order they started."""

    def __init__(self) -> None:
        self.phases: dict[str, PhaseReport] = {}

    def record(self, report: PhaseReport) -> None:
        self.phases[report.name] = report

    @property
    def current(self) -> PhaseReport | None:
        """The phase under way (or the last one, failed or done)."""
        reports = list(self.phases.values())  # one step under the GIL: a worker may add one
        return reports[-1] if reports else None

    def duration(self, name: str) -> float | None:
        """How long phase ``name`` took, once done."""
        report = self.phases.get(name)
        return report.elapsed_s if report is not None and report.state == DONE else None

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        current = self.current
        done = [report for report in list(self.phases.values()) if report.state == DONE]
        return {
            "phase": current.as_json(now) if current is not None else None,
            "phases_done_s": {report.name: round(report.elapsed_s, 1) for report in done},
        }


def import_engine(startup: Startup) -> None:
    """The ``import`` phase: torch and moshi (seconds on a cold machine)."""
    with startup.phase("import"):
        import moshi.models  # noqa: F401
        import torch  # noqa: F401
