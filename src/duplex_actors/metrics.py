"""Prometheus text exposition of the server's counters (served by ``GET /metrics``).

Written by hand rather than with prometheus_client, whose ASGI app breaks under hypercorn's
dispatcher (notes/serving-hardening.md §12). Counters live where they happen (scheduler, log
writer, session actors, connections); this module only formats a snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .counters import Counters

if TYPE_CHECKING:
    from .scheduler.actor import Scheduler

__all__ = ["Counters", "render"]

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
    *,
    counters: Counters,
    scheduler: Scheduler | None,
    writer: Any | None,
    sessions_active: int,
    recovered_logs: int = 0,
    uploader: Any | None = None,
) -> str:
    out = _Writer()
    if scheduler is not None:
        st = scheduler.statistics()
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
            [("", {}, scheduler.step_failures)],
        )
        dropped = Counter(dict(st.dropped_frames)) + counters.dropped
    else:
        dropped = counters.dropped
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
    if writer is not None:
        ws = writer.statistics()
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
    if uploader is not None:
        _render_uploads(out, uploader.statistics())
    return out.text()


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
