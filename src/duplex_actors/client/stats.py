"""The numbers ``duplex-load`` reports, computed from what one session sent and received (pure).

Input: the time each input frame was handed to the socket, and every audio delta's arrival
``(received_at, epoch, frame_index, frames)``. Output frame k answers input frame k
(``metadata.frame_index``), so a frame's round trip is ``arrival(k) - sent(k)``, where sent(k) is
when the input message that completed model frame k was sent: message k at 24 kHz; at any other
input rate the server's resampler holds back a few ms of each frame, so frame k completes with
message k + 1 (``ready_frames``, from :class:`~duplex_actors.client.audio.EncodedAudio`), and the
last message's frame never does. The format and byte size of the frames do not matter: a frame
is 80 ms (3840 bytes of pcm16@24000, 1280 of pcm16@8000, 640 of G.711).

- coverage: output frames received / output frames the sent input can produce (the input frames
  sent at 24 kHz; one fewer at any other rate).
- time to first audio: first delta's arrival - first frame's send.
- output packet interval: time between consecutive deltas.
- underruns: a playout clock starts ``jitter_buffer`` (120 ms) after the first audio and plays one
  80 ms frame per 80 ms; a frame that arrives after its playout time (or never, before a later one
  arrived) is an underrun. The clock does not re-buffer: this counts every late frame.
- lost frames: within an epoch ``frame_index`` must be contiguous (epoch 0 starts at 0); a gap
  counts the frames it skips. Frames sent at the end and never answered are not "lost" (coverage
  shows them).
- rtf (real-time factor of the output): output audio seconds per wall-clock second between the
  first and the last audio arrival. 1.0: the server keeps pace with the paced input; below 1.0 it
  falls behind (each second of wall time produced less than a second of audio).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from ..audio import FRAME_S

JITTER_BUFFER_S: Final = 0.12


@attrs.frozen
class Delta:
    received_at: float
    epoch: int
    frame_index: int
    frames: int


def percentiles(
    values: Sequence[float] | npt.NDArray[np.float64], qs: Sequence[float] = (50, 99)
) -> dict[str, float | None]:
    """``{"p50": ..., "p99": ..., "max": ...}`` (``None`` when there are no values)."""
    arr = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {}
    for q in qs:
        out[f"p{q:g}"] = round(float(np.percentile(arr, q)), 3) if arr.size else None
    out["max"] = round(float(arr.max()), 3) if arr.size else None
    return out


def arrivals_by_frame(deltas: Sequence[Delta]) -> dict[int, float]:
    """Arrival time of every output frame, by frame index (first arrival wins)."""
    out: dict[int, float] = {}
    for d in deltas:
        for k in range(d.frame_index, d.frame_index + d.frames):
            out.setdefault(k, d.received_at)
    return out


def continuity(deltas: Sequence[Delta]) -> tuple[int, int]:
    """``(lost, out_of_order)``: frame indices never received inside each epoch's range (epoch 0
    starts at 0, a later epoch at its first frame), and deltas that went backwards or repeated."""
    seen: dict[int, set[int]] = {}
    next_index: dict[int, int] = {}
    out_of_order = 0
    for d in deltas:
        if d.epoch in next_index and d.frame_index < next_index[d.epoch]:
            out_of_order += 1
        seen.setdefault(d.epoch, set()).update(range(d.frame_index, d.frame_index + d.frames))
        next_index[d.epoch] = max(next_index.get(d.epoch, 0), d.frame_index + d.frames)
    lost = sum(max(got) - (0 if e == 0 else min(got)) + 1 - len(got) for e, got in seen.items())
    return lost, out_of_order


def underruns(deltas: Sequence[Delta], jitter_buffer: float = JITTER_BUFFER_S) -> int:
    """Frames that missed their playout time on a clock started ``jitter_buffer`` after the
    first audio (frames missing before the last received one count too)."""
    if not deltas:
        return 0
    arrived = arrivals_by_frame(deltas)
    first = deltas[0]
    k0, t0 = first.frame_index, first.received_at + jitter_buffer
    late = 0
    for k in range(k0, max(arrived) + 1):
        at = arrived.get(k)
        if at is None or at > t0 + (k - k0) * FRAME_S:
            late += 1
    return late


def frame_send_times(send_times: Sequence[float], ready_frames: Sequence[int] | None = None) -> list[float]:
    """For each model frame the sent input completes, the send time of the message that
    completed it (``ready_frames[i]``: whole frames after message i; None: one per message)."""
    if ready_frames is None:
        return list(send_times)
    out: list[float] = []
    for t, ready in zip(send_times, ready_frames, strict=False):
        out += [t] * (ready - len(out))
    return out


def session_stats(
    send_times: Sequence[float],
    deltas: Sequence[Delta],
    *,
    jitter_buffer: float = JITTER_BUFFER_S,
    ready_frames: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Per-session numbers (times in ms). ``send_times``: one per input message;
    ``ready_frames``: see :func:`frame_send_times`."""
    sent = len(send_times)
    frame_sent = frame_send_times(send_times, ready_frames)
    expected = len(frame_sent)
    received = sum(d.frames for d in deltas)
    rtt = [ms for _, ms in round_trips_ms(frame_sent, deltas)]
    intervals = np.diff([d.received_at for d in deltas]) * 1000 if len(deltas) > 1 else np.zeros(0)
    lost, out_of_order = continuity(deltas)
    ttfa = (deltas[0].received_at - send_times[0]) * 1000 if deltas and sent else None
    span = deltas[-1].received_at - deltas[0].received_at if deltas else 0.0
    produced = (received - deltas[0].frames) * FRAME_S if deltas else 0.0
    return {
        "frames_sent": sent,
        "frames_expected": expected,
        "frames_received": received,
        "coverage": round(received / expected, 4) if expected else 0.0,
        "time_to_first_audio_ms": round(ttfa, 3) if ttfa is not None else None,
        "round_trip_ms": percentiles(rtt),
        "packet_interval_ms": percentiles(intervals),
        "underruns": underruns(deltas, jitter_buffer),
        "lost_frames": lost,
        "out_of_order": out_of_order,
        "rtf": round(produced / span, 4) if span > 0 else None,
    }


def aggregate(
    per_session: Sequence[dict[str, Any]], all_rtt_ms: Sequence[float], all_intervals_ms: Sequence[float]
) -> dict[str, Any]:
    """Totals and distributions over every session of a run."""
    sent = sum(s["frames_sent"] for s in per_session)
    expected = sum(s.get("frames_expected", s["frames_sent"]) for s in per_session)
    received = sum(s["frames_received"] for s in per_session)
    ttfa = [s["time_to_first_audio_ms"] for s in per_session if s["time_to_first_audio_ms"] is not None]
    rtfs = [s["rtf"] for s in per_session if s["rtf"] is not None]
    return {
        "sessions": len(per_session),
        "frames_sent": sent,
        "frames_expected": expected,
        "frames_received": received,
        "coverage": round(received / expected, 4) if expected else 0.0,
        "time_to_first_audio_ms": percentiles(ttfa, (50,)),
        "round_trip_ms": percentiles(all_rtt_ms),
        "packet_interval_ms": percentiles(all_intervals_ms),
        "underruns": sum(s["underruns"] for s in per_session),
        "lost_frames": sum(s["lost_frames"] for s in per_session),
        "out_of_order": sum(s["out_of_order"] for s in per_session),
        "rtf_min": round(min(rtfs), 4) if rtfs else None,
        "rtf_mean": round(sum(rtfs) / len(rtfs), 4) if rtfs else None,
    }


def round_trips_ms(send_times: Sequence[float], deltas: Sequence[Delta]) -> list[tuple[float, float]]:
    """``(send time, round trip ms)`` of every answered frame (for the timeline plot)."""
    arrived = arrivals_by_frame(deltas)
    return [
        (send_times[k], (arrived[k] - send_times[k]) * 1000) for k in range(len(send_times)) if k in arrived
    ]


def prometheus_value(text: str, name: str) -> float | None:
    """The sum of every sample of metric ``name`` (labelled or not) in Prometheus text."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric != name:
            continue
        try:
            total += float(value)
            found = True
        except ValueError:
            continue
    return total if found else None
