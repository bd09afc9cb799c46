"""Prometheus text exposition of the server's counters (served by ``GET /metrics``).

Written by hand rather than with prometheus_client, whose ASGI app breaks under hypercorn's
dispatcher. Counters live where they happen: the scheduler's in the engine core, the log
writer's, the session actors' and the connections' in each front end. A front end's
:class:`FrontEndSnapshot` holds its own; :func:`merge_snapshots` adds up those of every front
end, so that ``/metrics`` on any of them reports the whole server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .audio import SAMPLE_RATE
from .counters import Counters

if TYPE_CHECKING:
    from .scheduler.actor import SchedulerStatistics

__all__ = ["Counters", "FrontEndSnapshot", "merge_snapshots", "render"]


@attrs.frozen(slots=True)
class FrontEndSnapshot:
    """What one front end counts: its sessions' and connections' counters, its log writer's,
    uploader's and Opus pool's statistics, and its gauges."""

    counters: Counters = attrs.field(factory=Counters)
    writer: Any | None = None  # log.writer.LogWriterStatistics
    sessions_active: int = 0
    dialects_active: Mapping[str, int] = attrs.field(factory=dict)
    recovered_logs: int = 0
    uploader: Any | None = None  # scaleout.upload.UploadStatistics
    opus: Any | None = None  # opus.pool.OpusPoolStats
    tcp_connections: int | None = None


def merge_snapshots(snapshots: Sequence[FrontEndSnapshot]) -> FrontEndSnapshot:
    """The whole server's: counters and gauges added up; a log dir is available when every
    front end finds it so."""
    if len(snapshots) == 1:
        return snapshots[0]
    counters = Counters()
    for snap in snapshots:
        for name, value in vars(snap.counters).items():
            setattr(counters, name, getattr(counters, name) + value)
    writers = [s.writer for s in snapshots if s.writer is not None]
    uploads = [s.uploader for s in snapshots if s.uploader is not None]
    pools = [s.opus for s in snapshots if s.opus is not None]
    dialects: Counter[str] = Counter()
    for snap in snapshots:
        dialects.update(snap.dialects_active)
    tcp = [s.tcp_connections for s in snapshots if s.tcp_connections is not None]
    return FrontEndSnapshot(
        counters=counters,
        writer=_merge_writers(writers) if writers else None,
        sessions_active=sum(s.sessions_active for s in snapshots),
        dialects_active=dict(dialects),
        recovered_logs=sum(s.recovered_logs for s in snapshots),
        uploader=_merge_uploads(uploads) if uploads else None,
        opus=_merge_pools(pools) if pools else None,
        tcp_connections=sum(tcp) if tcp else None,
    )


def _merge_writers(stats: Sequence[Any]) -> Any:
    first = stats[0]
    summed = {
        f.name: sum(getattr(s, f.name) for s in stats)
        for f in attrs.fields(type(first))
        if f.name not in ("fsync_durations_s", "dir_available", "max_queued")
    }
    return attrs.evolve(
        first,
        **summed,
        fsync_durations_s=tuple(d for s in stats for d in s.fsync_durations_s),
        dir_available=all(s.dir_available for s in stats),
        max_queued=max(s.max_queued for s in stats),
    )


def _merge_uploads(stats: Sequence[Any]) -> Any:
    abandoned: Counter[str] = Counter()
    for s in stats:
        abandoned.update(dict(s.abandoned))
    summed = {
        f.name: sum(getattr(s, f.name) for s in stats)
        for f in attrs.fields(type(stats[0]))
        if f.name != "abandoned"
    }
    return attrs.evolve(stats[0], **summed, abandoned=tuple(sorted(abandoned.items())))


def _merge_pools(stats: Sequence[Any]) -> Any:
    ops: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for s in stats:
        ops.update(dict(s.ops))
        seconds.update(dict(s.codec_seconds))
    workers = [w for s in stats for w in s.workers]
    return attrs.evolve(
        stats[0],
        workers=tuple(attrs.evolve(w, index=i) for i, w in enumerate(workers)),
        restarts=sum(s.restarts for s in stats),
        queue_depth=sum(s.queue_depth for s in stats),
        ops=tuple(sorted(ops.items())),
        codec_seconds=tuple(sorted(seconds.items())),
        streams_lost=sum(s.streams_lost for s in stats),
    )


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def _labels(**labels: Any) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels.items()
    )
    return "{" + inner + "}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[str, Mapping[str, Any], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            self.lines.append(f"{name}{suffix}{_labels(**labels)} {_fmt(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _fmt(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(
    snapshot: FrontEndSnapshot,
    statistics: SchedulerStatistics | None = None,
    step_failures: int = 0,
) -> str:
    """The text of ``/metrics``: the front ends' ``snapshot`` (merged) and the engine core's
    scheduler ``statistics`` (None while there is no core)."""
    out = _Writer()
    dropped = snapshot.counters.dropped
    if statistics is not None:
        _render_scheduler(out, statistics, step_failures)
        dropped = Counter(dict(statistics.dropped_frames)) + dropped
    _render_sessions(out, snapshot, dropped)
    if snapshot.writer is not None:
        _render_log_writer(out, snapshot.writer, snapshot.recovered_logs)
    if snapshot.uploader is not None:
        _render_uploads(out, snapshot.uploader)
    if snapshot.opus is not None:
        _render_opus(out, snapshot.opus)
    return out.text()


def _render_scheduler(out: _Writer, st: SchedulerStatistics, step_failures: int) -> None:
    """The engine core's scheduler: steps, batches, deadlines, slots."""
    out.metric(
        "duplex_step_duration_seconds",
        "histogram",
        "Wall time of one batched model step (the frame budget is 0.08 s).",
        [
            *(("_bucket", {"le": _fmt(b)}, c) for b, c in st.step_seconds_buckets),
            ("_sum", {}, st.step_seconds_sum),
            ("_count", {}, st.ticks),
        ],
    )
    batch = dict(st.batch_sizes)
    cumulative: list[tuple[str, Mapping[str, Any], float]] = []
    for bound in BATCH_BUCKETS:
        running = sum(n for size, n in batch.items() if size <= bound)
        cumulative.append(("_bucket", {"le": str(bound)}, running))
    cumulative.append(("_bucket", {"le": "+Inf"}, st.ticks))
    cumulative.append(("_sum", {}, sum(size * n for size, n in batch.items())))
    cumulative.append(("_count", {}, st.ticks))
    out.metric("duplex_batch_size", "histogram", "Sessions stepped per tick.", cumulative)
    out.metric(
        "duplex_deadline_misses_total",
        "counter",
        "Frames the engine was late for: stepped over 80 ms after they were due (submitted, or "
        "one frame after their session's previous one).",
        [("", {}, st.late_frames)],
    )
    out.metric(
        "duplex_frame_wait_seconds",
        "histogram",
        "From an input frame complete on the server to the start of its step.",
        [
            *(("_bucket", {"le": _fmt(b)}, c) for b, c in st.frame_wait_seconds_buckets),
            ("_sum", {}, st.frame_wait_seconds_sum),
            ("_count", {}, st.frame_wait_seconds_buckets[-1][1]),
        ],
    )
    out.metric(
        "duplex_catchup_steps_total",
        "counter",
        "Grid steps outside the tick for slots that missed theirs (tick policy grid).",
        [("", {}, st.catchup_steps)],
    )
    out.metric(
        "duplex_ahead_steps_total",
        "counter",
        "Grid steps ahead of the tick: every session was a whole tick behind (uploads; tick policy grid).",
        [("", {}, st.ahead_steps)],
    )
    out.metric(
        "duplex_tick_policy",
        "gauge",
        "The scheduler's tick policy (1 for the one in use).",
        [("", {"policy": st.tick_policy}, 1)],
    )
    out.metric(
        "duplex_session_backlog_frames_total",
        "counter",
        "Frames that waited over 80 ms only behind their own session's earlier frames "
        "(the client sent faster than real time).",
        [("", {}, st.backlog_frames)],
    )
    out.metric(
        "duplex_slots_total",
        "gauge",
        "Engine slots (max concurrent sessions).",
        [("", {}, st.slots_total)],
    )
    out.metric("duplex_slots_in_use", "gauge", "Slots held by sessions.", [("", {}, st.slots_in_use)])
    out.metric(
        "duplex_step_failures_total",
        "counter",
        "Model steps that raised (their sessions ended with internal_error).",
        [("", {}, step_failures)],
    )


def _render_sessions(out: _Writer, snapshot: FrontEndSnapshot, dropped: Mapping[str, int]) -> None:
    """The front ends' sessions, frames, errors and connections."""
    counters = snapshot.counters
    sessions_active = snapshot.sessions_active
    dialects_active = snapshot.dialects_active
    tcp_connections = snapshot.tcp_connections
    out.metric("duplex_sessions_active", "gauge", "Open sessions.", [("", {}, sessions_active)])
    out.metric(
        "duplex_sessions_opened_total", "counter", "Sessions admitted.", [("", {}, counters.sessions_opened)]
    )
    out.metric(
        "duplex_sessions_closed_total",
        "counter",
        "Sessions closed, by reason.",
        [("", {"reason": k}, v) for k, v in sorted(counters.sessions_closed.items())],
    )
    out.metric(
        "duplex_dialect_sessions_active",
        "gauge",
        "Open sessions, by dialect (realtime, native, api_chat).",
        [("", {"dialect": k}, v) for k, v in sorted((dialects_active or {}).items())],
    )
    out.metric(
        "duplex_dialect_sessions_opened_total",
        "counter",
        "Sessions admitted, by dialect (realtime, native, api_chat; warmup is the start-up one).",
        [("", {"dialect": k}, v) for k, v in sorted(counters.sessions_by_dialect.items())],
    )
    out.metric(
        "duplex_ignored_messages_total",
        "counter",
        "Client messages read and not applied, by reason (api_chat_pre_handshake, api_chat_kind).",
        [("", {"reason": k}, v) for k, v in sorted(counters.ignored_messages.items())],
    )
    out.metric(
        "duplex_sessions_detached",
        "gauge",
        "Resumable sessions whose connection dropped, waiting for a resume (they keep their slot).",
        [("", {}, counters.sessions_detached)],
    )
    out.metric(
        "duplex_session_detaches_total",
        "counter",
        "Resumable sessions detached from their connection, by reason (dropped, read_timeout, replaced).",
        [("", {"reason": k}, v) for k, v in sorted(counters.detaches.items())],
    )
    out.metric(
        "duplex_session_resumes_total",
        "counter",
        "Resume attempts, by result (resumed, expired: the grace ran out, or the refusal's code).",
        [("", {"result": k}, v) for k, v in sorted(counters.resumes.items())],
    )
    out.metric(
        "duplex_session_takeovers_total",
        "counter",
        "Resumes that took a session over from a connection still attached (half-open).",
        [("", {}, counters.takeovers)],
    )
    out.metric(
        "duplex_detached_slot_seconds_total",
        "counter",
        "Slot-seconds held by detached sessions (ended by a resume or the grace).",
        [("", {}, counters.detached_slot_s)],
    )
    out.metric(
        "duplex_journal_bytes",
        "gauge",
        "Bytes the output journals of resumable sessions keep for a resume.",
        [("", {}, counters.journal_bytes)],
    )
    out.metric(
        "duplex_frames_in_total",
        "counter",
        "Input frames (80 ms) drained to the model.",
        [("", {}, counters.frames_in)],
    )
    out.metric(
        "duplex_frames_out_total",
        "counter",
        "Output frames (80 ms) sent to clients.",
        [("", {}, counters.frames_out)],
    )
    out.metric(
        "duplex_frames_dropped_total",
        "counter",
        "Frames dropped, by reason.",
        [("", {"reason": k}, v) for k, v in sorted(dropped.items())],
    )
    out.metric(
        "duplex_align_pad_seconds_total",
        "counter",
        "Silence inserted into sessions' input to align their frames to the tick (server pads and client pad_ms).",
        [("", {}, counters.align_pad_samples / SAMPLE_RATE)],
    )
    out.metric(
        "duplex_errors_total",
        "counter",
        "Error events sent, by code.",
        [("", {"code": k}, v) for k, v in sorted(counters.errors.items())],
    )
    out.metric(
        "duplex_refusals_total",
        "counter",
        "Connections refused before a session, by code.",
        [("", {"code": k}, v) for k, v in sorted(counters.refused.items())],
    )
    out.metric(
        "duplex_websocket_close_total",
        "counter",
        "WebSocket closes sent, by close code.",
        [("", {"code": k}, v) for k, v in sorted(counters.close_codes.items())],
    )
    out.metric(
        "duplex_connection_errors_total",
        "counter",
        "Connections that failed with an unexpected exception.",
        [("", {"type": k}, v) for k, v in sorted(counters.connection_errors.items())],
    )
    out.metric(
        "duplex_connections_dropped_total",
        "counter",
        "TCP connections closed by a transport bound: body_timeout, max_connections.",
        [("", {"reason": k}, v) for k, v in sorted(counters.connections_dropped.items())],
    )
    if tcp_connections is not None:
        out.metric(
            "duplex_tcp_connections_open",
            "gauge",
            "Open TCP connections (HTTP and WebSocket), bounded by --max-connections.",
            [("", {}, tcp_connections)],
        )


def _render_log_writer(out: _Writer, ws: Any, recovered_logs: int) -> None:
    """The session log writer: fsyncs, records, a failed or recovered log dir."""
    samples = [("", {"quantile": q}, (ws.fsync_percentile(q * 100) or 0.0)) for q in (0.5, 0.9, 0.99)]
    # Quantiles, sum and count all over the same recent window (the writer keeps the last
    # 4096 durations), so sum/count is a true mean; the all-time count is its own counter.
    samples += [("_sum", {}, sum(ws.fsync_durations_s)), ("_count", {}, len(ws.fsync_durations_s))]
    out.metric(
        "duplex_log_fsync_seconds",
        "summary",
        "fdatasync duration of the session logs (recent window).",
        samples,
    )
    out.metric(
        "duplex_log_fsyncs_total", "counter", "fdatasync calls on session logs.", [("", {}, ws.fsyncs)]
    )
    out.metric(
        "duplex_log_records_total",
        "counter",
        "Session log records written.",
        [("", {}, ws.records_written)],
    )
    out.metric(
        "duplex_log_recovered_total",
        "counter",
        "Logs with a torn tail (a crash) truncated at start-up.",
        [("", {}, recovered_logs)],
    )
    out.metric(
        "duplex_log_failed",
        "gauge",
        "Session logs that failed to write (admissions stop).",
        [("", {}, ws.failed_logs)],
    )
    out.metric(
        "duplex_log_dir_available",
        "gauge",
        "1 while the log dir takes writes; 0 from a failed log write or create until a probe works "
        "(admissions stop meanwhile).",
        [("", {}, int(ws.dir_available))],
    )
    out.metric(
        "duplex_log_dir_probe_failures_total",
        "counter",
        "Probes of an unavailable log dir (write + fdatasync + remove a small file) that failed.",
        [("", {}, ws.dir_probe_failures)],
    )
    out.metric(
        "duplex_log_dir_recoveries_total",
        "counter",
        "Times a probe found the log dir writable again and admissions resumed.",
        [("", {}, ws.dir_recoveries)],
    )


def _render_uploads(out: _Writer, st: Any) -> None:
    """``--log-upload``: the statistics of ``duplex_actors.scaleout.upload.LogUploader``."""
    out.metric(
        "duplex_log_uploads_total",
        "counter",
        "Session logs stored in the bucket and deleted locally, by result (uploaded: a new object; "
        "already_present: If-None-Match found it there).",
        [("", {"result": "uploaded"}, st.uploaded), ("", {"result": "already_present"}, st.already_present)],
    )
    out.metric(
        "duplex_log_upload_bytes_total",
        "counter",
        "Bytes of session logs uploaded.",
        [("", {}, st.bytes_uploaded)],
    )
    out.metric(
        "duplex_log_upload_failures_total",
        "counter",
        "Failed upload attempts (each is retried with backoff).",
        [("", {}, st.failures)],
    )
    out.metric(
        "duplex_log_uploads_pending",
        "gauge",
        "Finished session logs waiting to be uploaded.",
        [("", {}, st.pending)],
    )
    out.metric(
        "duplex_log_uploads_abandoned_total",
        "counter",
        "Logs not uploaded, by reason (missing: deleted before; unreadable; conflict: another object "
        "of that name exists, the local file is kept).",
        [("", {"reason": k}, v) for k, v in st.abandoned],
    )


def _render_opus(out: _Writer, st: Any) -> None:
    """``/api/chat``'s codec pool, once started: ``duplex_actors.opus.pool.OpusPoolStats``."""
    out.metric(
        "duplex_opus_worker_sessions",
        "gauge",
        "Opus streams (/api/chat sessions) held by each codec worker process.",
        [("", {"worker": w.index}, w.sessions) for w in st.workers],
    )
    out.metric(
        "duplex_opus_worker_up",
        "gauge",
        "1 while the codec worker process runs, 0 while it is being restarted.",
        [("", {"worker": w.index}, int(w.alive)) for w in st.workers],
    )
    out.metric(
        "duplex_opus_worker_restarts_total",
        "counter",
        "Codec worker processes that died and were replaced (their sessions ended with internal_error).",
        [("", {}, st.restarts)],
    )
    out.metric(
        "duplex_opus_streams_lost_total",
        "counter",
        "Opus streams ended by the death of their codec worker.",
        [("", {}, st.streams_lost)],
    )
    out.metric(
        "duplex_opus_ops_total",
        "counter",
        "Codec operations answered by the workers, by op.",
        [("", {"op": op}, n) for op, n in st.ops],
    )
    out.metric(
        "duplex_opus_codec_seconds_total",
        "counter",
        "CPU seconds the codec workers spent in each op (encode dominates: ~1 ms per 80 ms frame).",
        [("", {"op": op}, sec) for op, sec in st.codec_seconds],
    )
