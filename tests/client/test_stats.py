"""duplex-load's numbers on hand-made traces: round trip, coverage, underruns, lost frames."""

from __future__ import annotations

from duplex_actors.client.stats import (
    Delta,
    continuity,
    frame_send_times,
    prometheus_value,
    session_stats,
    underruns,
)


def _trace(n: int, rtt: float = 0.03) -> tuple[list[float], list[Delta]]:
    sends = [10.0 + 0.08 * k for k in range(n)]
    return sends, [Delta(s + rtt, 0, k, 1) for k, s in enumerate(sends)]


def test_steady_stream() -> None:
    sends, deltas = _trace(50)
    s = session_stats(sends, deltas)
    assert s["frames_sent"] == s["frames_received"] == 50 and s["coverage"] == 1.0
    assert abs(s["round_trip_ms"]["p50"] - 30) < 1e-6 and abs(s["round_trip_ms"]["max"] - 30) < 1e-6
    assert abs(s["packet_interval_ms"]["p99"] - 80) < 1e-6
    assert abs(s["time_to_first_audio_ms"] - 30) < 1e-6
    assert s["underruns"] == 0 and s["lost_frames"] == 0 and s["out_of_order"] == 0
    assert abs(s["rtf"] - 1.0) < 1e-9


def test_late_frames_underrun_behind_the_jitter_buffer() -> None:
    _, deltas = _trace(20)
    # frame 10 comes 150 ms late: more than the 120 ms buffer
    deltas[10] = Delta(deltas[10].received_at + 0.15, 0, 10, 1)
    deltas.sort(key=lambda d: d.received_at)
    assert underruns(deltas) == 1
    # 100 ms late is absorbed by the buffer
    _, deltas = _trace(20)
    deltas[10] = Delta(deltas[10].received_at + 0.10, 0, 10, 1)
    assert underruns(deltas) == 0


def test_gaps_are_lost_frames_per_epoch() -> None:
    deltas = [Delta(1.0, 0, 0, 1), Delta(1.1, 0, 1, 1), Delta(1.2, 0, 4, 2), Delta(1.3, 0, 3, 1)]
    assert continuity(deltas) == (1, 1)  # frame 2 never came; frame 3 came late
    # a new epoch may start anywhere; within it, indices must be contiguous
    deltas = [Delta(1.0, 0, 0, 1), Delta(1.1, 0, 1, 1), Delta(1.2, 1, 5, 1), Delta(1.3, 1, 6, 1)]
    assert continuity(deltas) == (0, 0)
    sends = [0.0] * 8
    s = session_stats(sends, [Delta(1.0, 0, 0, 1), Delta(1.1, 0, 2, 1)])
    assert s["lost_frames"] == 1 and s["coverage"] == 0.25


def test_empty_session() -> None:
    s = session_stats([0.0, 0.08], [])
    assert s["coverage"] == 0.0 and s["round_trip_ms"]["p99"] is None and s["rtf"] is None


def test_prometheus_value() -> None:
    text = (
        "# HELP duplex_deadline_misses_total x\n# TYPE duplex_deadline_misses_total counter\n"
        "duplex_deadline_misses_total 7\n"
        'duplex_frames_dropped_total{reason="a"} 2\nduplex_frames_dropped_total{reason="b"} 3\n'
        "duplex_deadline_misses_total_other 1\n"
    )
    assert prometheus_value(text, "duplex_deadline_misses_total") == 7
    assert prometheus_value(text, "duplex_frames_dropped_total") == 5
    assert prometheus_value(text, "nope") is None


def test_resampled_input_measures_from_the_message_that_completed_the_frame() -> None:
    """At a non-24 kHz rate frame k completes with message k + 1 and the last message's frame
    never does: round trips start at the completing message, coverage counts what can come back."""
    sends = [10.0 + 0.08 * k for k in range(10)]
    ready = [0, *range(1, 10)]  # after message i: i whole frames (i >= 1)
    deltas = [Delta(sends[k + 1] + 0.01, 0, k, 1) for k in range(9)]
    s = session_stats(sends, deltas, ready_frames=ready)
    assert s["frames_sent"] == 10 and s["frames_expected"] == 9 and s["frames_received"] == 9
    assert s["coverage"] == 1.0 and s["lost_frames"] == 0
    assert abs(s["round_trip_ms"]["max"] - 10) < 1e-6
    assert frame_send_times(sends, ready) == sends[1:]
    assert frame_send_times(sends[:3], ready) == sends[1:3]  # an interrupted stream
    assert frame_send_times(sends) == sends
    # without ready_frames the same trace reads as a frame late and one short
    plain = session_stats(sends, deltas)
    assert plain["coverage"] == 0.9 and plain["round_trip_ms"]["p50"] > 80
