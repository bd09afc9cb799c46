"""bench/tick_sim.py: its sessions mark the frames that hold alignment pad, as the session core does."""

from __future__ import annotations

from .loader import load_bench

tick_sim = load_bench("tick_sim.py", "bench_tick_sim")


def test_a_hinted_client_frame_holds_the_pad() -> None:
    # 80 ms chunks from 30 ms after a tick: the first append gets a hint, the client pads its
    # next chunk, so frame 1 (and no other) holds pad samples.
    trace = tick_sim.session_trace(80, 30.0, [0.1] * 10, "client", 24_000)
    assert trace.decisions[:1] == ("hint:start",)
    assert trace.padded[:3] == (False, True, False)
    assert sum(trace.padded) == 1
    assert len(trace.padded) == len(trace.completions)


def test_a_server_pad_marks_the_frame_it_goes_into() -> None:
    trace = tick_sim.session_trace(20, 7.0, [0.1] * 40, "server", 24_000)
    assert trace.decisions[:1] == ("pad:start",)
    assert trace.padded[0] is True
    assert not any(trace.padded[1:])


def test_unaligned_sessions_have_no_padded_frames() -> None:
    trace = tick_sim.session_trace(80, 30.0, [0.1] * 10, "off", 24_000)
    assert trace.pad_samples == 0
    assert not any(trace.padded)


def test_the_simulated_scheduler_sees_the_padded_double() -> None:
    # Two hinted sessions, 45 ms steps: session 1's padded frame 1 lands in the tick of its frame
    # 0 after that tick was stepped early; with the padded flag in the view the grid owes it a
    # catch-up at once (82 ms), without it the frame waited for the next tick (117 ms).
    traces = [tick_sim.session_trace(80, p, [0.1] * 25, "client", 24_000) for p in (60.0, 75.0)]
    result = tick_sim.simulate(tick_sim.make_policy("grid"), traces, lambda: 0.045)
    assert result.frames == sum(len(t.completions) for t in traces)
    assert max(result.latencies) < 0.090
