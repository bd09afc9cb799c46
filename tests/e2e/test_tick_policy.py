"""``--tick-policy`` on a real server: sessions at spread phases share one step per tick on
the grid, the default; the policy in use and its figures are on /metrics; a bad value is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import metric_sum, metrics_text

from .conftest import EXE, start_server

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

LOAD = str(Path(sys.executable).with_name("duplex-load"))


def test_the_default_grid_steps_spread_sessions_once_per_tick(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--max-sessions", "4")  # no --tick-policy: the default
    try:
        before = metrics_text(server)  # the warm-up session's steps, taken away below
        proc = subprocess.run(
            [
                LOAD,
                "--url",
                f"{server.ws}/v1/realtime?duplex=1",
                "--sessions",
                "4",
                "--seconds",
                "4",
                "--out",
                str(tmp_path / "load"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert proc.returncode == 0, proc.stderr
        agg = json.loads((tmp_path / "load" / "load.json").read_text())["aggregate"]
        assert agg["coverage"] == 1.0 and agg["lost_frames"] == 0
        after = metrics_text(server)
    finally:
        server.stop()
    assert metric_sum(after, "duplex_tick_policy", policy="grid") == 1
    assert "\nduplex_ahead_steps_total " in after  # exported (paced clients seldom need one)
    steps = metric_sum(after, "duplex_step_duration_seconds_count") - metric_sum(
        before, "duplex_step_duration_seconds_count"
    )
    frames = metric_sum(after, "duplex_batch_size_sum") - metric_sum(before, "duplex_batch_size_sum")
    ratio = steps * 4 / frames
    # duplex-load spreads the 4 starts over one frame (0, 20, 40, 60 ms): the window policy
    # steps such a load ~2 times per tick (2.06 measured), the grid once (1.02) plus its
    # catch-ups, at most 2 per session per second.
    assert ratio <= 1.5, (ratio, steps, frames)
    waits = metric_sum(after, "duplex_frame_wait_seconds_count")
    assert waits >= frames
    # Frames wait for their step: duplex-load's first frames unaligned (0-80 ms), then its
    # margin once the hint is applied; a stalled machine queues more.
    assert metric_sum(after, "duplex_frame_wait_seconds_sum") > 0


def test_a_bad_tick_policy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [EXE, "serve", "--model", "tiny-parrot", "--log-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DUPLEX_TICK_POLICY": "fastest"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "duplex-actors: DUPLEX_TICK_POLICY='fastest': expected one of grid, deadline, window"
    ]
