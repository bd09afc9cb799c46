"""Replay one session log at the logic level, optionally at the model level too.

*Logic*: re-run the session core over the logged records, with model outputs taken from the
``step`` records, and check the outbound event digest and the output-audio digest against the
``end`` record. CPU only, no model, thousands of times faster than real time.

*Model*: re-run the real engine on the logged input frames, with the logged resets
(alignment pads are zeros in those frames; drained frames are skipped), and compare every
step's text token and audio codes exactly (output PCM within a tolerance) with the ``step``
records; the first divergent frame is reported (epoch, frame, expected, got).

The engine must have the batch width the session was served at (``logged_batch_width``): a
slot's results do not depend on its slot index or on what the other slots hold, but the CPU
kernels are chosen by batch width, and their last bits differ (Mimi latents at B=1 and B=2
differ by ~1e-7 in every frame, enough to flip a residual code at a near-tie now and then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ..log import records as r
from ..log.segment import LogCorruption, ReadResult, TornTail, read_records
from ..model.engine import CONTEXT_POLICIES, DEFAULT_CONTEXT_POLICY, ModelEngine
from ..model.family import detect_family
from ..model.voices import AliasedVoices
from ..session import events as ev
from ..session.core import Emit, ResetSlot, SessionCore, SessionLimits, SubmitFrame

PCM16_TOLERANCE = 64  # LSBs: output PCM may differ slightly across devices; codes may not


class UnreadableLog(Exception):
    """Not a session log, or a corrupt one (a bad record followed by valid ones)."""


@attrs.frozen(slots=True)
class Divergence:
    epoch: int
    frame_index: int
    what: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        return f"epoch {self.epoch} frame {self.frame_index}: {self.what} expected {self.expected}, got {self.got}"


@attrs.define(slots=True)
class ReplayReport:
    path: Path | str  # a file, or an s3:// URL
    level: str = "logic"
    session_id: str = ""
    records: int = 0
    frames_in: int = 0
    frames_out: int = 0
    steps_compared: int = 0
    complete: bool = False  # the log has its end record
    torn_tail: TornTail | None = None
    digest_mismatch: str | None = None
    divergence: Divergence | None = None
    batch_width: int | None = None  # the model replay's engine width
    events: list[ev.SessionEvent] = attrs.field(factory=list, repr=False)
    records_list: list[tuple[int, r.Record]] = attrs.field(factory=list, repr=False)

    @property
    def identical(self) -> bool:
        return self.digest_mismatch is None and self.divergence is None

    def output_pcm16(self) -> bytes:
        return b"".join(e.pcm16 for e in self.events if isinstance(e, ev.AudioFrame))

    def summary(self) -> str:
        if self.divergence is not None:
            hint = ""
            served = logged_batch_width(header_of(self))
            if self.batch_width is not None and self.batch_width != served:
                hint = (
                    f" (replayed at batch width {self.batch_width}, served at {served}:"
                    " only a replay at the served width is exact)"
                )
            return f"DIVERGED at {self.divergence}{hint}"
        if self.digest_mismatch is not None:
            return f"DIVERGED: {self.digest_mismatch}"
        notes = []
        if self.torn_tail is not None:
            notes.append(
                f"torn tail at byte {self.torn_tail.offset} ({self.torn_tail.dropped_bytes} bytes dropped)"
            )
        if not self.complete:
            notes.append("no end record (the session did not finish): replayed what was logged")
        status = "identical" if self.complete else "consistent"
        return status + (f" ({'; '.join(notes)})" if notes else "")


def read_log_file(path: Path | str, data: bytes | None = None) -> ReadResult:
    """Read ``path``, or parse ``data`` (a log fetched elsewhere, e.g. from S3) named ``path``."""
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UnreadableLog(f"{path}: {exc}") from exc
    try:
        return read_records(data)
    except LogCorruption as exc:
        raise UnreadableLog(f"{path}: corrupt log: {exc}") from exc


def logged_batch_width(header: r.Header) -> int:
    """The engine's batch width (slots) when the session was served; 1 for a log that does not say."""
    slots = (header.engine or {}).get("slots", 1)
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1 else 1


def logged_context_policy(header: r.Header) -> tuple[str, int | None]:
    """The context policy the session was served with and its pin cap: ``("ring", None)`` for
    a log that does not say (every log before pinned prompts existed)."""
    engine = header.engine or {}
    policy = engine.get("context_policy", DEFAULT_CONTEXT_POLICY)
    if policy not in CONTEXT_POLICIES:
        raise UnreadableLog(f"the log names an unknown context policy {policy!r}")
    if policy == DEFAULT_CONTEXT_POLICY:
        return policy, None
    pin_max = engine.get("pin_max")
    if not isinstance(pin_max, int) or isinstance(pin_max, bool):
        raise UnreadableLog(f"the log's context policy {policy!r} comes without its pin_max")
    return policy, pin_max


def _core_for(header: r.Header) -> SessionCore:
    engine = header.engine or {}
    family = detect_family(list(engine.get("voices", [])), engine.get("family"))
    aliases = engine.get("voice_aliases")
    policy: Any = AliasedVoices(family, dict(aliases)) if aliases else family
    limits = engine.get("limits", {})
    return SessionCore(
        header.session_id,
        policy,
        SessionLimits(**limits) if limits else SessionLimits(),
    )


def replay_logic(
    path: Path | str,
    *,
    progress: Callable[[int, int], None] | None = None,
    keep_events: bool = True,
    data: bytes | None = None,
) -> ReplayReport:
    """Replay the log at ``path``; with ``data``, the log's bytes (``path`` only names it)."""
    result = read_log_file(path, data)
    report = ReplayReport(path=path, torn_tail=result.torn_tail, records_list=result.records)
    records = result.records
    if not records or not isinstance(records[0][1], r.Header):
        raise UnreadableLog(f"{path}: does not start with a header record")
    header = records[0][1]
    report.session_id = header.session_id
    core = _core_for(header)
    end: r.End | None = None
    for i, (_, record) in enumerate(records):
        if isinstance(record, r.End):
            end = record
            continue
        for effect in core.apply(record):
            if keep_events and isinstance(effect, Emit):
                report.events.append(effect.event)
        if progress is not None and i % 256 == 0:
            progress(i, len(records))
    report.records = len(records)
    report.frames_in = core.frames_in
    report.frames_out = core.frames_out
    if end is not None:
        report.complete = True
        got = core.digests()
        for name in ("events", "frames_out", "events_sha256", "audio_sha256"):
            if getattr(got, name) != getattr(end, name):
                report.digest_mismatch = (
                    f"{name}: log says {getattr(end, name)}, replay gives {getattr(got, name)}"
                )
                break
    return report


def logged_inputs(records: list[tuple[int, r.Record]]) -> Iterator[tuple[str, Any]]:
    """The model's view of a session, in log order: ('reset', epoch, prompt) as the core asked
    for them, and ('step', Step record, input frame)."""
    header = records[0][1]
    assert isinstance(header, r.Header)
    core = _core_for(header)
    frames: dict[int, npt.NDArray[np.float32]] = {}
    for _, record in records:
        if isinstance(record, r.End):
            continue
        if isinstance(record, r.Step):
            yield ("step", (record, frames.pop(record.frame_index)))
        elif isinstance(record, r.Drain):
            # Taken off the scheduler's queue unstepped: the model never saw it.
            frames.pop(record.frame_index, None)
        for effect in core.apply(record):
            if isinstance(effect, SubmitFrame):
                frames[effect.frame_index] = effect.samples
            elif isinstance(effect, ResetSlot):
                yield ("reset", (effect.epoch, effect.prompt))


def replay_model(
    report: ReplayReport,
    engine: ModelEngine,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Re-run ``engine`` (slot 0) on the logged inputs; fills ``report.divergence``.

    Exact only when ``engine.slots`` is the log's :func:`logged_batch_width`."""
    from ..audio import float_to_pcm16

    report.level = "model"
    report.batch_width = engine.slots
    requested: dict[int, Any] = {}
    engine_epoch: int | None = None
    total = sum(1 for _, rec in report.records_list if isinstance(rec, r.Step))
    done = 0
    for kind, payload in logged_inputs(report.records_list):
        if kind == "reset":
            epoch, prompt = payload
            requested[epoch] = prompt
            continue
        step, frame = payload
        if step.epoch != engine_epoch:
            engine.reset(0, requested[step.epoch])
            engine_epoch = step.epoch
        out = engine.step({0: frame})[0]
        done += 1
        report.steps_compared = done
        for what, expected, got in (
            ("ready", step.ready, out.ready),
            ("text token", step.text_token, out.text_token),
            ("agent codes", tuple(step.agent_codes), tuple(out.agent_codes)),
            ("user codes", tuple(step.user_codes), tuple(out.user_codes)),
        ):
            if expected != got:
                report.divergence = Divergence(step.epoch, step.frame_index, what, expected, got)
                return report
        pcm = np.frombuffer(float_to_pcm16(out.pcm), dtype="<i2").astype(np.int32)
        logged = np.frombuffer(step.pcm16, dtype="<i2").astype(np.int32)
        err = int(np.abs(pcm - logged).max()) if len(pcm) else 0
        if err > PCM16_TOLERANCE:
            report.divergence = Divergence(
                step.epoch, step.frame_index, "output PCM (max |diff| in LSB)", f"<= {PCM16_TOLERANCE}", err
            )
            return report
        if progress is not None and done % 16 == 0:
            progress(done, total)
    return report


def header_of(report: ReplayReport) -> r.Header:
    header = report.records_list[0][1]
    assert isinstance(header, r.Header)
    return header
