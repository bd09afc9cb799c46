"""A load run's summary tables and plots."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .load_trial import Trial
from .stats import frame_send_times


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


_COLUMNS: Final = (
    "sent",
    "recv",
    "cover",
    "ttfa ms",
    "rtt p50",
    "rtt p99",
    "lat p50",
    "lat p99",
    "lat max",
    "pkt p99",
    "underrun",
    "lost",
)


def _cells(s: dict[str, Any], ttfa: Any) -> list[str]:
    return [
        _num(s["frames_sent"]),
        _num(s["frames_received"]),
        _num(s["coverage"], 3),
        _num(ttfa),
        _num(s["round_trip_ms"]["p50"]),
        _num(s["round_trip_ms"]["p99"]),
        _num(s["latency_ms"]["p50"]),
        _num(s["latency_ms"]["p99"]),
        _num(s["latency_ms"]["max"]),
        _num(s["packet_interval_ms"]["p99"]),
        _num(s["underruns"]),
        _num(s["lost_frames"]),
    ]


def trial_table(trial: Trial) -> str:
    """One row per session (up to 32) and an ``all`` row."""
    rows = []
    if trial.n <= 32:
        for s in trial.sessions:
            rows.append([f"s{s['index']}", *_cells(s, s["time_to_first_audio_ms"]), _num(s["rtf"], 3)])
    agg = trial.aggregate
    rows.append(["all", *_cells(agg, agg["time_to_first_audio_ms"]["p50"]), _num(agg["rtf_min"], 3)])
    table = _table(["session", *_COLUMNS, "rtf"], rows)
    verdict = "held real time" if trial.held else "broke real time: " + "; ".join(trial.reasons)
    return (
        f"{table}\n"
        f"N={trial.n}: {verdict}. server deadline misses {_num(agg['server_deadline_misses'], 0)}, "
        f"server step mean {_num(agg['server_step_ms_mean'], 2)} ms, "
        f"steps per tick {_num(agg.get('server_steps_per_tick'), 3)}, "
        f"added wait mean {_num(agg.get('server_wait_ms_mean'), 2)} ms, "
        f"catch-ups {_num(agg.get('server_catchup_steps'), 0)}, "
        f"align pad {_num(agg.get('server_align_pad_s'), 3)} s, "
        f"drained {_num(agg.get('server_drained_frames'), 0)}, "
        f"hints {agg.get('alignment_hints', 0)} ({agg.get('client_pads_applied', 0)} applied), "
        f"load generator CPU {_num(agg['client_cpu_pct'])}% of one core "
        f"({_num(agg['client_cpu_pct_per_session'], 2)}% per session)"
        + (
            f", audible frames {_num(agg['audible_fraction'], 3)} of {agg['decoded_sessions']} decoded session(s)"
            if "audible_fraction" in agg
            else ""
        )
    )


def ramp_table(trials: Sequence[Trial]) -> str:
    rows = []
    for t in sorted(trials, key=lambda t: t.n):
        a = t.aggregate
        rows.append(
            [
                str(t.n) if t.attempt == 1 else f"{t.n} (#{t.attempt})",
                *_cells(a, a["time_to_first_audio_ms"]["p50"]),
                _num(a["server_deadline_misses"], 0),
                _num(a["server_step_ms_mean"], 2),
                _num(a.get("server_steps_per_tick"), 3),
                _num(a.get("server_wait_ms_mean"), 1),
                _num(a["rtf_min"], 3),
                _num(a["client_cpu_pct"]),
                "yes" if t.held else "NO",
            ]
        )
    return _table(
        ["N", *_COLUMNS, "misses", "step ms", "steps/tick", "wait ms", "rtf min", "cpu %", "held"], rows
    )


def draw_trial(path: Path, trial: Trial, title: str) -> str | None:
    from .plot import plot_trial

    try:
        sessions = [(frame_send_times(r.send_times, trial.ready_frames), r.deltas) for r in trial.runs]
        plot_trial(path, sessions, t0=trial.t0, title=title)
    except Exception as exc:  # a missing/broken matplotlib must not lose the numbers
        print(f"duplex-load: could not draw {path}: {exc}", file=sys.stderr)
        return None
    return str(path)
