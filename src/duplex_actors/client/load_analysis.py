"""A load trial's figures per session and overall, and whether it held real time."""

from __future__ import annotations

import numpy as np

from .load_trial import Options, Trial
from .stats import aggregate, frame_latencies_ms, frame_send_times, round_trips_ms, session_stats


def analyse(trial: Trial, opts: Options) -> None:
    all_rtt: list[float] = []
    all_latency: list[float] = []
    with_latency = False
    all_intervals: list[float] = []
    for run in trial.runs:
        client_pad = sum(p for _, p in run.pads) * 24  # 24 kHz samples
        stats = session_stats(
            run.send_times,
            run.deltas,
            jitter_buffer=opts.jitter_buffer_s,
            ready_frames=opts.ready_frames,
            sends=run.sends if opts.dialect != "api-chat" else None,
            rate=opts.rate,
            pads=client_pad,
        )
        frame_sent = frame_send_times(run.send_times, opts.ready_frames)
        rtt = [ms for _, ms in round_trips_ms(frame_sent, run.deltas)]
        all_rtt += rtt
        lat = frame_latencies_ms(run.sends, run.deltas, opts.rate * 80 // 1000)
        with_latency = with_latency or lat is not None
        all_latency += rtt if lat is None else lat
        all_intervals += list(np.diff([d.received_at for d in run.deltas]) * 1000)
        trial.sessions.append(
            {
                "index": run.index,
                "session_id": run.session_id,
                "open_ms": run.open_ms,
                "start_offset_ms": round(run.offset * 1000, 3),
                "failure": run.failure,
                "errors": run.errors,
                "close_reason": run.close_reason,
                "alignment_hints": [[round((t - trial.t0) * 1000, 1), p, why] for t, p, why in run.hints],
                "pads_applied_ms": [p for _, p in run.pads],
                "hints_ignored": run.hints_ignored,
                # Every output frame's latency in arrival order (ms), to see when a run broke.
                **({"latency_series_ms": [round(x, 1) for x in lat]} if lat is not None else {}),
                **({"audible_frames": list(run.audible)} if run.audible is not None else {}),
                **stats,
            }
        )
    agg = aggregate(trial.sessions, all_rtt, all_intervals, all_latency if with_latency else None)
    agg["latency_source"] = "input_samples_end" if with_latency else "round_trip"
    agg["alignment_hints"] = sum(len(r.hints) for r in trial.runs)
    agg["client_pads_applied"] = sum(len(r.pads) for r in trial.runs)
    agg["client_pad_ms_mean"] = (
        round(sum(p for r in trial.runs for _, p in r.pads) / max(1, agg["client_pads_applied"]), 2)
        if agg["client_pads_applied"]
        else None
    )
    for key in (
        "steps_per_tick", "wait_ms_mean", "wait_ms_p50_le", "wait_ms_p99_le", "catchup_steps",
        "align_pad_s", "drained_frames",
    ):  # fmt: skip
        agg[f"server_{key}"] = trial.server.get(key)
    agg["failed_sessions"] = sum(1 for r in trial.runs if r.failure)
    agg["error_events"] = sum(len(r.errors) for r in trial.runs)
    agg["server_deadline_misses"] = trial.server["deadline_misses"]
    agg["server_step_ms_mean"] = trial.server["step_ms_mean"]
    agg["client_cpu_pct"] = trial.client_cpu_pct
    agg["client_cpu_pct_per_session"] = round(trial.client_cpu_pct / trial.n, 3) if trial.n else None
    decoded = [r.audible for r in trial.runs if r.audible is not None]
    if decoded:
        loud, total = sum(a for a, _ in decoded), sum(b for _, b in decoded)
        agg["audible_fraction"] = round(loud / total, 4) if total else 0.0
        agg["decoded_sessions"] = len(decoded)
    trial.aggregate = agg
    reasons: list[str] = []
    if agg["failed_sessions"]:
        kinds = sorted({(r.failure or "").split(":")[0] for r in trial.runs if r.failure})
        reasons.append(f"{agg['failed_sessions']} session(s) failed ({', '.join(kinds)})")
    if agg["coverage"] < opts.min_coverage:
        reasons.append(f"coverage {agg['coverage']:.4f} < {opts.min_coverage}")
    p99 = agg["latency_ms"]["p99"]
    if p99 is None or p99 > opts.max_p99_ms:
        what = "latency" if with_latency else "round trip"
        reasons.append(f"{what} p99 {p99} ms > {opts.max_p99_ms:g} ms")
    # With injected jitter a frame the server drained (a backlog no catch-up could clear) is
    # the policy at work, counted apart; on loopback it counts as lost.
    drained = int(trial.server.get("drained_frames") or 0) if opts.jitter.active else 0
    agg["lost_frames_not_drained"] = max(0, agg["lost_frames"] - drained)
    if agg["lost_frames_not_drained"]:
        reasons.append(f"{agg['lost_frames_not_drained']} lost frame(s)")
    trial.reasons = reasons
    trial.held = not reasons
