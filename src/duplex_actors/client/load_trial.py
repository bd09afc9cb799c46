"""One load run of N sessions as data: its options, what each session sent and received, and
the trial's figures and verdict."""

from __future__ import annotations

from typing import Any, Final

import attrs

from .events import AlignmentHint, AudioDelta, Error, ServerEvent
from .jitter import Jitter
from .stats import Delta

MIN_COVERAGE: Final = 0.99
MAX_P99_MS: Final = 80.0


@attrs.define(eq=False)
class SessionRun:
    """What one session sent and received; filled by its task, analysed after the run."""

    index: int
    offset: float
    session_id: str | None = None
    open_ms: float | None = None
    failure: str | None = None
    send_times: list[float] = attrs.Factory(list)
    deltas: list[Delta] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    close_reason: str | None = None
    audible: tuple[int, int] | None = None  # /api/chat decoded sessions: (frames over the floor, frames)
    sends: list[tuple[float, int]] = attrs.Factory(list)  # (send time, client samples after it)
    pads: list[tuple[float, int]] = attrs.Factory(list)  # alignment hints applied: (time, pad_ms)
    hints: list[tuple[float, int, str]] = attrs.Factory(list)  # (arrival, pad_ms, reason)
    hints_ignored: int = 0
    last_end: int | None = None  # the latest delta's input_samples_end

    def on_opus(self, received_at: float, first: int, frames: int) -> None:
        # /api/chat: output frame k answers input frame k (one 80 ms step per 80 ms of input).
        self.deltas.append(Delta(received_at, 0, first, frames))

    def on_event(self, event: ServerEvent) -> None:
        # Runs in the client's receive task for every event: keep it to an append.
        if type(event) is AudioDelta:
            end = event.input_samples_end
            self.deltas.append(Delta(event.received_at, event.epoch, event.frame_index, event.frames, end))
            if end is not None:
                self.last_end = end
        elif type(event) is Error:
            self.errors.append(event.code)
        elif type(event) is AlignmentHint:
            self.hints.append((event.received_at, event.pad_ms, event.reason))


@attrs.define
class Trial:
    n: int
    runs: list[SessionRun]
    t0: float
    wall_s: float
    client_cpu_pct: float
    server: dict[str, Any]
    sessions: list[dict[str, Any]] = attrs.Factory(list)
    aggregate: dict[str, Any] = attrs.Factory(dict)
    held: bool = False
    reasons: list[str] = attrs.Factory(list)
    attempt: int = 1
    ready_frames: tuple[int, ...] | None = None  # the audio's (see stats.frame_send_times)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "attempt": self.attempt,
            "held": self.held,
            "reasons": self.reasons,
            "aggregate": self.aggregate,
            "server": self.server,
            "client_cpu_pct": self.client_cpu_pct,
            "wall_s": round(self.wall_s, 3),
            "sessions": self.sessions,
        }


@attrs.frozen
class Options:
    url: str
    seconds: float
    api_key: str | None
    config: dict[str, Any]
    sync_start: bool = False
    drain_s: float = 2.0
    jitter_buffer_s: float = 0.12
    min_coverage: float = MIN_COVERAGE
    max_p99_ms: float = MAX_P99_MS
    ready_frames: tuple[int, ...] | None = None
    dialect: str = "realtime"  # or "api-chat"
    query: dict[str, str] = attrs.Factory(dict)  # /api/chat: text_prompt, voice_prompt
    decode_every: int = 8  # /api/chat: decode the replies of every K-th session (RMS check)
    phases: str = "spread"  # or "random" (with seed), "sync" (as sync_start)
    seed: int = 0
    align: str = "client"  # duplex.alignment sent; "none": no opt-in (a stock client)
    jitter: Jitter = attrs.Factory(Jitter)
    rate: int = 24_000  # the input rate
