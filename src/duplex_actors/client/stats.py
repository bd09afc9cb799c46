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
- latency per output frame (``latency_ms``): the frame's arrival minus the send time of the
  chunk that held the newest client sample its input depends on: the sample just before the
  delta's ``input_samples_end`` (docs/protocol.md §3), looked up in the ``(send time,
  samples sent after it)`` record of every append (:func:`frame_latencies_ms`). This stays
  honest when the server pads a session to align it (server frame k then no longer answers
  message k) and whatever the chunk size. From a server that does not send
  ``input_samples_end`` it is the round trip above.
- rtf (real-time factor of the output): output audio seconds per wall-clock second between the
  first and the last audio arrival. 1.0: the server keeps pace with the paced input; below 1.0 it
  falls behind (each second of wall time produced less than a second of audio).
"""

from __future__ import annotations

import bisect
import math
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
    input_samples_end: int | None = None


def frame_latencies_ms(
    sends: Sequence[tuple[float, int]], deltas: Sequence[Delta], frame_samples: int = 1920
) -> list[float] | None:
    """Latency (ms) of every output frame: its arrival minus the send time of the chunk holding
    client sample ``input_samples_end - 1`` (``sends``: ``(send time, client samples sent
    after that append)``, in order). A delta of several frames carries the end of its first
    frame; frame j of it ends ``j * frame_samples`` (client samples per 80 ms) later. A frame
    whose input is only pad (``input_samples_end <= 0``) depends on no client sample and is left
    out. ``None`` when no delta carries ``input_samples_end`` (a server without it)."""
    ends = [end for _, end in sends]
    out: list[float] = []
    seen = False
    for d in deltas:
        if d.input_samples_end is None:
            continue
        seen = True
        for j in range(d.frames):
            sample = d.input_samples_end + j * frame_samples
            if sample <= 0:
                continue
            i = bisect.bisect_left(ends, sample)  # the first append whose end reaches the sample
            if i < len(sends):
                out.append((d.received_at - sends[i][0]) * 1000)
    return out if seen else None


def pads_observed(deltas: Sequence[Delta], frame_samples: int = 1920, rate: int = 24_000) -> int:
    """24 kHz samples the server inserted before the last frame (its index counts server frames,
    ``input_samples_end`` client samples): the most ``(k + 1) * 1920 - end`` over the deltas."""
    best = 0
    for d in deltas:
        if d.input_samples_end is not None:
            client = d.input_samples_end * 24_000 // rate
            best = max(best, (d.frame_index + 1) * 1920 - client)
    return best


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
    sends: Sequence[tuple[float, int]] | None = None,
    rate: int = 24_000,
    pads: int = 0,
) -> dict[str, Any]:
    """Per-session numbers (times in ms). ``send_times``: one per input message;
    ``ready_frames``: see :func:`frame_send_times`; ``sends``: see :func:`frame_latencies_ms`;
    ``pads``: 24 kHz samples of silence the server inserted (client and server pads); the
    larger of it and what the deltas show counts in the frames expected."""
    # The client's own 80 ms input frames (a partial last one counts): an alignment hint splits
    # one chunk in two, so messages are not frames. Without ``sends`` (api-chat): messages.
    frame = rate * 80 // 1000
    sent = -(-sends[-1][1] // frame) if sends else len(send_times)
    frame_sent = frame_send_times(send_times, ready_frames)
    pad = max(pads, pads_observed(deltas, frame, rate))
    # Frames the sent input plus the pads can produce (at 24 kHz the partial tail counts too).
    tail = 0
    if rate == 24_000 and sends:
        tail = sends[-1][1] - len(frame_sent) * 1920
    expected = len(frame_sent) + (max(0, tail) + pad) // 1920
    received = sum(d.frames for d in deltas)
    rtt = [ms for _, ms in round_trips_ms(frame_sent, deltas)]
    latency = frame_latencies_ms(sends, deltas, frame) if sends is not None else None
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
        "latency_ms": percentiles(rtt if latency is None else latency),
        "latency_source": "round_trip" if latency is None else "input_samples_end",
        "pad_ms": round(pad / 24, 3),
        "packet_interval_ms": percentiles(intervals),
        "underruns": underruns(deltas, jitter_buffer),
        "lost_frames": lost,
        "out_of_order": out_of_order,
        "rtf": round(produced / span, 4) if span > 0 else None,
    }


def aggregate(
    per_session: Sequence[dict[str, Any]],
    all_rtt_ms: Sequence[float],
    all_intervals_ms: Sequence[float],
    all_latency_ms: Sequence[float] | None = None,
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
        "latency_ms": percentiles(all_rtt_ms if all_latency_ms is None else all_latency_ms),
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


def _labels(head: str) -> dict[str, str]:
    _, _, inner = head.partition("{")
    out: dict[str, str] = {}
    for part in inner.rstrip("}").split(","):
        key, eq, value = part.partition("=")
        if eq:
            out[key.strip()] = value.strip().strip('"')
    return out


def prometheus_value(text: str, name: str, **labels: str) -> float | None:
    """The sum of every sample of metric ``name`` (labelled or not) in Prometheus text; with
    ``labels``, of the samples that carry those label values."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric != name:
            continue
        if labels:
            have = _labels(head)
            if any(have.get(k) != v for k, v in labels.items()):
                continue
        try:
            total += float(value)
            found = True
        except ValueError:
            continue
    return total if found else None


def prometheus_buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative buckets ``{le: count}`` (``+Inf`` as ``math.inf``)."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket"):
            continue
        head, _, value = line.rpartition(" ")
        le = _labels(head).get("le")
        if le is None:
            continue
        try:
            out[math.inf if le == "+Inf" else float(le)] = out.get(
                math.inf if le == "+Inf" else float(le), 0.0
            ) + float(value)
        except ValueError:
            continue
    return out


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (0-1) of a cumulative histogram
    (e.g. the delta of two scrapes); ``None`` when empty; the last finite bound when it falls in
    ``+Inf``."""
    items = sorted(buckets.items())
    total = items[-1][1] if items else 0.0
    if total <= 0:
        return None
    finite = [le for le, _ in items if le != math.inf]
    for le, count in items:
        if count >= q * total:
            return le if le != math.inf else (finite[-1] if finite else None)
    return None


def steps_per_tick(steps: float | None, batch_size_sum: float | None, sessions: int) -> float | None:
    """Steps per tick as docs/operations.md defines it: steps / (frames stepped / active
    sessions) = ``duplex_step_duration_seconds_count`` x sessions / ``duplex_batch_size_sum``
    (deltas over a window in which the number of sessions did not change)."""
    if steps is None or not batch_size_sum or sessions <= 0:
        return None
    return steps * sessions / batch_size_sum
