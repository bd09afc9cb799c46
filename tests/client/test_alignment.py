"""Alignment on the client side (wire-protocol section 7), without a server: the hint applied to
a paced stream (on trio's mock clock, against an in-memory socket), the latency per output frame
from ``input_samples_end``, duplex-load's start phases and jitter, and the /metrics figures."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
import trio
import trio.testing

from duplex_actors.client.audio import encode_audio, speech_like
from duplex_actors.client.connection import DuplexClient, with_alignment
from duplex_actors.client.events import AlignmentHint, AudioDelta, OtherEvent, parse_server_event
from duplex_actors.client.jitter import JITTER_PROFILES, Jitter, jitter_delays
from duplex_actors.client.phases import start_offsets
from duplex_actors.client.server_metrics import server_figures
from duplex_actors.client.stats import (
    Delta,
    bucket_quantile,
    frame_latencies_ms,
    pads_observed,
    prometheus_buckets,
    prometheus_value,
    session_stats,
    steps_per_tick,
)

T0 = 10.0


class FakeSocket:
    """What DuplexClient.stream needs of a WebSocket: ``send_message``, timed."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, dict[str, Any]]] = []
        self.closed = None

    async def send_message(self, message: str) -> None:
        self.sent.append((trio.current_time(), json.loads(message)))


def _samples(msg: dict[str, Any]) -> int:
    return len(base64.b64decode(msg["audio"])) // 2


def _hint(pad_ms: int, at: float = 0.0) -> AlignmentHint:
    obj = {"type": "input_audio_buffer.alignment", "event_id": "e1", "pad_ms": pad_ms, "reason": "start"}
    event = parse_server_event(obj, received_at=at)
    assert isinstance(event, AlignmentHint)
    return event


def _stream(
    chunk: int, hint_at: float | None, pad_ms: int, alignment: str | None = "client"
) -> tuple[FakeSocket, DuplexClient]:
    audio = encode_audio(speech_like(12 * 0.08), "pcm16", chunk)  # 12 frames at 24 kHz
    sock = FakeSocket()

    async def main() -> DuplexClient:
        client = DuplexClient(sock, dialect="realtime", alignment=alignment)  # type: ignore[arg-type]

        async def inject() -> None:
            assert hint_at is not None
            await trio.sleep_until(hint_at)
            client._track(_hint(pad_ms, hint_at))

        async with trio.open_nursery() as nursery:
            if hint_at is not None:
                nursery.start_soon(inject)
            await trio.sleep_until(T0 - 1)
            await client.stream(audio, start=T0)
        return client

    client = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return sock, client


def test_hint_moves_the_next_chunk_earlier_with_less_audio() -> None:
    sock, client = _stream(1920, T0 + 0.17, 30)  # during the wait for chunk 3 (due T0 + 0.24)
    times = [round(t - T0, 6) for t, _ in sock.sent]
    sizes = [_samples(m) for _, m in sock.sent]
    pads = [m.get("pad_ms") for _, m in sock.sent]
    assert times[:3] == [0.0, 0.08, 0.16]
    assert times[3] == pytest.approx(0.21) and sizes[3] == 1920 - 720 and pads[3] == 30
    # from then on the whole grid is 30 ms earlier and every chunk is 80 ms again
    assert times[4:] == pytest.approx([0.32 - 0.03 + 0.08 * i for i in range(len(times) - 4)])
    assert sizes[4:-1] == [1920] * (len(sizes) - 5) and sizes[-1] == 720
    assert pads.count(None) == len(pads) - 1
    assert sum(sizes) == 12 * 1920 == client.samples_sent
    assert len(client.pads) == 1 and client.pads[0][1] == 30
    assert client.pads[0][0] == pytest.approx(T0 + 0.21)
    # the send record maps every sample to the chunk that held it
    assert [end for _, end in client.sends] == list(itertools_accumulate(sizes))


def itertools_accumulate(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out


def test_late_hint_goes_out_at_once_and_audio_is_never_reordered() -> None:
    sock, _ = _stream(1920, T0 + 0.23, 30)  # chunk 3's early time (0.21) has passed
    times = [round(t - T0, 6) for t, _ in sock.sent]
    assert times[3] == pytest.approx(0.23) and sock.sent[3][1]["pad_ms"] == 30
    assert times == sorted(times)
    audio = b"".join(base64.b64decode(m["audio"]) for _, m in sock.sent)
    assert audio == encode_audio(speech_like(12 * 0.08), "pcm16").data


def test_hint_ignored_for_short_chunks_and_when_not_opted_in() -> None:
    for chunk, alignment in ((480, "client"), (1920, "off"), (1920, None)):
        sock, client = _stream(chunk, T0 + 0.17, 30, alignment)
        assert all("pad_ms" not in m for _, m in sock.sent)
        times = [round(t - T0, 6) for t, _ in sock.sent]
        step = chunk / 24000
        assert times == pytest.approx([i * step for i in range(len(times))])
        assert client.hints_ignored == 1 and client.pads == []


def test_with_alignment_config() -> None:
    assert with_alignment(None, "client") == ({"duplex": {"alignment": "client"}}, "client")
    assert with_alignment({"voice": "v"}, None) == ({"voice": "v"}, None)
    cfg, mode = with_alignment({"duplex": {"alignment": "off"}}, "client")
    assert cfg == {"duplex": {"alignment": "off"}} and mode == "off"


def test_events_alignment_and_input_samples_end() -> None:
    assert _hint(25).pad_ms == 25 and _hint(25).reason == "start"
    bad = {"type": "input_audio_buffer.alignment", "pad_ms": 80, "reason": "start"}
    assert isinstance(parse_server_event(bad), OtherEvent)
    delta = {
        "type": "response.output_audio.delta", "event_id": "e", "response_id": "r", "item_id": "i",
        "output_index": 0, "content_index": 0, "delta": base64.b64encode(b"\0" * 3840).decode(),
        "sample_rate_hz": 24000,
        "metadata": {"epoch": 0, "frame_index": 3, "audio_duration_ms": 80, "input_samples_end": 6960},
    }  # fmt: skip
    event = parse_server_event(delta)
    assert isinstance(event, AudioDelta) and event.input_samples_end == 6960 and event.frame_index == 3
    del delta["metadata"]["input_samples_end"]  # type: ignore[attr-defined]
    event = parse_server_event(delta)
    assert isinstance(event, AudioDelta) and event.input_samples_end is None


def test_latency_follows_input_samples_end_not_frame_index() -> None:
    # chunks of 1920 sent every 80 ms; chunk 3 is 30 ms early with 1200 samples and a 30 ms pad
    sizes = [1920, 1920, 1920, 1200, 1920, 1920]
    times = [0.0, 0.08, 0.16, 0.21, 0.29, 0.37]
    sends = list(zip(times, itertools_accumulate(sizes), strict=True))
    # server frame 3 = client [5760, 6960) after 720 pad samples: it ends at client sample 6960
    deltas = [
        Delta(0.02, 0, 0, 1, 1920),
        Delta(0.10, 0, 1, 1, 3840),
        Delta(0.18, 0, 2, 1, 5760),
        Delta(0.23, 0, 3, 1, 6960),
        Delta(0.31, 0, 4, 1, 8880),
        Delta(0.39, 0, 5, 1, 10800),
    ]
    lat = frame_latencies_ms(sends, deltas)
    assert lat == pytest.approx([20.0, 20.0, 20.0, 20.0, 20.0, 20.0])
    # a frame ending inside a pad maps to the chunk before the pad
    inside = [Delta(0.5, 0, 2, 1, 5760)]
    assert frame_latencies_ms(sends, inside) == pytest.approx([(0.5 - 0.16) * 1000])
    assert frame_latencies_ms(sends, [Delta(0.1, 0, 0, 1, None)]) is None
    assert frame_latencies_ms(sends, [Delta(0.1, 0, 0, 1, 0)]) == []  # pad only: no client sample
    # a delta of two frames: the second ends one frame (1920 client samples) later
    assert frame_latencies_ms(sends, [Delta(0.3, 0, 0, 2, 1920)]) == pytest.approx([300.0, 220.0])
    assert pads_observed(deltas) == 720
    stats = session_stats(times, deltas, sends=sends, pads=720)
    assert stats["latency_source"] == "input_samples_end"
    assert stats["latency_ms"]["p99"] == pytest.approx(20.0)
    # 10800 client samples + 720 pad = 6 whole frames (and 6 sent messages' worth)
    assert stats["frames_expected"] == 6 and stats["coverage"] == 1.0


def test_start_offsets() -> None:
    assert start_offsets(4, "spread") == pytest.approx([0.0, 0.02, 0.04, 0.06])
    assert start_offsets(3, "sync") == [0.0, 0.0, 0.0]
    a, b, c = start_offsets(16, "random", 1), start_offsets(16, "random", 1), start_offsets(16, "random", 2)
    assert a == b and a != c and all(0.0 <= x < 0.08 for x in a)
    with pytest.raises(ValueError):
        start_offsets(2, "phased")


def test_jitter_delays_deterministic_with_bursts() -> None:
    wan = JITTER_PROFILES["wan"]
    a = jitter_delays(wan, 2000, 0.08, seed=3, index=1)
    assert a == jitter_delays(wan, 2000, 0.08, seed=3, index=1)
    assert a != jitter_delays(wan, 2000, 0.08, seed=3, index=2)
    assert all(x >= 0 for x in a)
    bursts = sum(x > 0.06 for x in a)  # 2000 chunks of 80 ms = 160 s, a burst every ~4 s
    assert 20 <= bursts <= 70
    assert 0.004 < sorted(a)[1000] < 0.008  # median ~ mean * ln 2 of the exponential part
    assert jitter_delays(Jitter(), 5, 0.08) == [0.0] * 5 and not JITTER_PROFILES["loopback"].active


METRICS_BEFORE = """# HELP x
duplex_step_duration_seconds_count 100
duplex_step_duration_seconds_sum 3.0
duplex_batch_size_sum 350
duplex_frame_wait_seconds_bucket{le="0.005"} 10
duplex_frame_wait_seconds_bucket{le="0.02"} 20
duplex_frame_wait_seconds_bucket{le="0.08"} 30
duplex_frame_wait_seconds_bucket{le="+Inf"} 30
duplex_frame_wait_seconds_sum 0.5
duplex_frame_wait_seconds_count 30
duplex_catchup_steps_total 1
duplex_frames_dropped_total{reason="drained"} 2
duplex_frames_dropped_total{reason="stale_epoch"} 5
"""
METRICS_AFTER = """duplex_step_duration_seconds_count 200
duplex_step_duration_seconds_sum 7.0
duplex_batch_size_sum 750
duplex_frame_wait_seconds_bucket{le="0.005"} 100
duplex_frame_wait_seconds_bucket{le="0.02"} 118
duplex_frame_wait_seconds_bucket{le="0.08"} 130
duplex_frame_wait_seconds_bucket{le="+Inf"} 130
duplex_frame_wait_seconds_sum 0.9
duplex_frame_wait_seconds_count 130
duplex_catchup_steps_total 4
duplex_align_pad_seconds_total 0.25
duplex_frames_dropped_total{reason="drained"} 3
duplex_frames_dropped_total{reason="stale_epoch"} 5
"""


def _scrape(text: str) -> dict[str, float | None]:
    keys = {
        "steps": "duplex_step_duration_seconds_count", "step_seconds_sum": "duplex_step_duration_seconds_sum",
        "batch_size_sum": "duplex_batch_size_sum", "wait_sum": "duplex_frame_wait_seconds_sum",
        "wait_count": "duplex_frame_wait_seconds_count", "catchups": "duplex_catchup_steps_total",
        "align_pad_s": "duplex_align_pad_seconds_total",
    }  # fmt: skip
    out: dict[str, float | None] = {k: prometheus_value(text, m) for k, m in keys.items()}
    out["drained"] = prometheus_value(text, "duplex_frames_dropped_total", reason="drained")
    for le, count in prometheus_buckets(text, "duplex_frame_wait_seconds").items():
        out[f"wait_bucket_{le}"] = count
    return out


def test_server_figures_from_two_scrapes() -> None:
    assert prometheus_value(METRICS_AFTER, "duplex_frames_dropped_total") == 8
    assert prometheus_value(METRICS_AFTER, "duplex_frames_dropped_total", reason="drained") == 3
    assert prometheus_buckets(METRICS_AFTER, "duplex_frame_wait_seconds")[math.inf] == 130
    assert bucket_quantile({0.005: 90.0, 0.02: 99.0, math.inf: 100.0}, 0.5) == 0.005
    assert bucket_quantile({0.005: 0.0, math.inf: 0.0}, 0.5) is None
    # 100 steps, 400 session-frames, 4 sessions: one step per tick
    assert steps_per_tick(100, 400, 4) == 1.0 and steps_per_tick(None, 400, 4) is None
    fig = server_figures(_scrape(METRICS_BEFORE), _scrape(METRICS_AFTER), 4)
    assert fig["steps_per_tick"] == 1.0 and fig["step_ms_mean"] == 40.0
    assert fig["wait_ms_mean"] == 4.0  # 0.4 s over 100 frames
    assert fig["wait_ms_p50_le"] == 5.0 and fig["wait_ms_p99_le"] == 80.0
    assert fig["catchup_steps"] == 3 and fig["drained_frames"] == 1
    assert fig["align_pad_s"] is None  # absent before: no delta
