"""``duplex-load --lean`` (client/lean.py): its latency and coverage arithmetic, its options,
and runs against a real ``duplex-actors serve --model standin:25`` whose session logs are the
reference for the frames counted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from duplex_actors.client.lean import (
    WINDOW_END,
    WINDOW_START,
    LeanLoad,
    LeanOptions,
    LeanSession,
    dialect_of,
    frame_latencies,
    lean_problems,
    opening_message,
    wire_target,
)
from duplex_actors.client.lean_wire import NO_END
from duplex_actors.client.load import build_parser
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from tests.e2e.conftest import ServerProcess, start_server

STEP_MS = 25


# -- arithmetic (pure) ------------------------------------------------------------------------
def session_with_sends(chunk: int, count: int, t0: float = 10.0, period: float = 0.02) -> LeanSession:
    s = LeanSession(0, 0.0)
    for k in range(count):
        s.send_at.append(t0 + k * period)
        s.send_due.append(t0 + k * period)
        s.samples_sent += chunk
        s.send_end.append(s.samples_sent)
    return s


def test_at_20_ms_chunks_a_frame_is_timed_from_the_chunk_that_completed_it() -> None:
    s = session_with_sends(480, 12)  # 20 ms chunks from t=10.00 s: frame k completes with chunk 4k+3
    s.on_frame(10.10, 0, 1920)
    s.on_frame(10.19, 1, 3840)
    lat, from_end = frame_latencies(s, since=0.0)
    assert from_end
    assert lat == pytest.approx([10.10 - 10.06, 10.19 - 10.14])
    # A frame the server padded (its input ends 240 samples in, 1680 of pad first): the chunk
    # holding client sample 239 is chunk 0.
    s.on_frame(10.30, 2, 240)
    assert frame_latencies(s, since=0.0)[0][-1] == pytest.approx(0.30)
    s.on_frame(10.31, 3, 0)  # only pad: depends on no client sample
    assert len(frame_latencies(s, since=0.0)[0]) == 3
    assert frame_latencies(s, since=10.07)[0] == pytest.approx([10.19 - 10.14])  # the window


def test_without_input_samples_end_a_frame_is_timed_by_its_index() -> None:
    s = session_with_sends(1920, 3, period=0.08)
    s.on_frame(10.2, 1, NO_END)
    lat, from_end = frame_latencies(s, since=0.0)
    assert not from_end and lat == pytest.approx([10.2 - 10.08])


def test_frames_expected_count_the_pads_the_deltas_show_or_the_client_applied() -> None:
    s = session_with_sends(480, 8)  # 3840 client samples: 2 frames
    assert s.frames_expected() == 2
    s.on_frame(10.1, 0, 480)  # the server padded 1440 samples before the first chunk
    assert s.pad_seen == 1440 and s.frames_expected() == 2  # (3840 + 1440) // 1920
    s.pads.append((10.0, 60))  # a client pad of 60 ms = 1440 samples: the larger counts
    s.samples_sent += 480
    assert s.frames_expected() == 3


def test_dialect_target_and_opening() -> None:
    assert dialect_of("ws://h:1/v1/realtime?duplex=1") == "realtime"
    assert dialect_of("ws://h:1/v1/duplex") == "native"
    with pytest.raises(ValueError):
        dialect_of("ws://h:1/api/chat")
    assert wire_target("ws://h:81/v1/realtime?duplex=1&autostart=1", "realtime") == (
        "h",
        81,
        "/v1/realtime?duplex=1&autostart=0",
        "h:81",
    )
    assert wire_target("ws://h/v1/duplex", "native")[1:3] == (80, "/v1/duplex")
    with pytest.raises(ValueError):
        wire_target("wss://h/v1/duplex", "native")
    opts = LeanOptions(url="ws://h/v1/duplex", sessions=1, seconds=1, voice="NATM1.pt")
    native = json.loads(opening_message(opts, "native"))
    assert native["type"] == "session.create" and native["binary_output"] is True
    assert native["session"]["duplex"] == {"alignment": "client"} and native["session"]["voice"] == "NATM1.pt"
    stock = json.loads(opening_message(LeanOptions(url="", sessions=1, seconds=1, align="none"), "realtime"))
    assert stock["type"] == "session.update" and "duplex" not in stock["session"]


def test_a_latency_it_could_not_measure_is_refused() -> None:
    for align in ("server", "none"):
        with pytest.raises(ValueError, match="--align client"):
            LeanLoad(LeanOptions(url="ws://h/v1/duplex", sessions=1, seconds=1, chunk_ms=20, align=align))
    LeanLoad(LeanOptions(url="ws://h/v1/duplex", sessions=1, seconds=1, chunk_ms=20, align="off"))  # no pads


def test_options_the_lean_mode_does_not_take_are_refused() -> None:
    parse = build_parser().parse_args
    assert lean_problems(parse(["--lean"])) == []
    assert lean_problems(parse(["--lean", "--ramp", "--jitter", "wan", "--input", "x.wav"])) == [
        "--ramp",
        "--jitter",
        "--input (the lean client sends a tone)",
    ]
    assert lean_problems(parse(["--lean", "--input-format", "pcmu"])) == [
        "--input-format/--output-format (pcm16@24000 only)"
    ]


# -- against a real server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(
        tmp_path_factory.mktemp("standin"), "--max-sessions", "4", model=f"standin:{STEP_MS}"
    )
    yield server
    server.stop()


def logged_frames(server: ServerProcess, session_id: str) -> int:
    """``frames_out`` of the session's finished log (its End record)."""
    records = [rec for _, rec in read_log(server.log_dir / f"{session_id}.dlog").records]
    assert isinstance(records[-1], r.End)
    return int(records[-1].frames_out)


def check_against_the_server(report: dict, server: ServerProcess, sessions: int) -> None:
    agg = report["aggregate"]
    assert agg["opened"] == sessions and agg["failed_sessions"] == 0
    # A frame missing from the indices is one the server drained (a backlog it could not catch up
    # with: on a starved machine it may), and every other frame the input makes came back.
    drained = int(report["server"]["drained_frames"] or 0)
    assert agg["lost_frames"] == drained and agg["out_of_order"] == 0
    assert agg["frames_received"] > 0
    assert agg["frames_received"] + drained >= 0.99 * agg["frames_expected"]
    assert agg["latency_source"] == "input_samples_end"
    # Causality, not a timing claim: an output frame needs one step after its input arrived.
    assert agg["latency_ms"]["p50"] >= STEP_MS
    assert agg["client_cpu_us_per_frame"] is not None and agg["client_cpu_us_per_frame"] > 0
    for s in report["per_session"]:
        assert s["frames_received"] == logged_frames(server, s["session_id"])
    assert report["server"]["frames_out"] == agg["frames_received"]


def test_the_cli_loads_the_realtime_dialect(standin: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "lean"
    proc = subprocess.run(
        [
            sys.executable, "-m", "duplex_actors.client.load", "--lean",
            "--url", f"{standin.ws}/v1/realtime?duplex=1", "--sessions", "3", "--seconds", "1.5",
            "--warmup", "0.5", "--phases", "sync", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines.index(WINDOW_START) < lines.index(WINDOW_END)
    assert "lean: N=3 realtime, 80 ms chunks, phases sync" in proc.stdout
    report = json.loads((out / "load.json").read_text())
    assert report["mode"] == "lean" and report["dialect"] == "realtime"
    check_against_the_server(report, standin, 3)
    agg = report["aggregate"]
    # 80 ms chunks: the client applies the hints; the server inserted exactly the pads it sent.
    pads_ms = sum(sum(s["pads_applied_ms"]) for s in report["per_session"])
    assert pads_ms / 1000 == pytest.approx(report["server"]["align_pad_s"], abs=1e-6)
    assert agg["parsed_deltas"] == 0  # every delta was read by its bytes


def test_native_binary_at_20_ms_chunks_and_random_phases(standin: ServerProcess) -> None:
    opts = LeanOptions(
        url=f"{standin.ws}/v1/duplex",
        sessions=2,
        seconds=1.5,
        warmup_s=0.3,
        chunk_ms=20,
        phases="random",
        seed=3,
    )
    said: list[str] = []
    load = LeanLoad(opts, say=said.append)
    report = load.run()
    assert said == [WINDOW_START, WINDOW_END]
    assert report["binary"] and report["aggregate"]["messages_sent"] == 2 * 90
    check_against_the_server(report, standin, 2)
    assert report["aggregate"]["client_pads_applied"] == 0  # the server pads 20 ms chunks itself
