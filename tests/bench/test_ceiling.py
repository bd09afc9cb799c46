"""bench/ceiling.py: its search, its reading of the server's processes, and one tiny trial end to
end (a real ``serve --model standin:25`` and the lean client) whose JSON has every field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .loader import BENCH, load_bench

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

ceiling = load_bench("ceiling.py", "bench_ceiling")


@given(
    threshold=st.integers(0, 300),
    ns=st.lists(st.integers(1, 300), min_size=1, max_size=10, unique=True),
    resolution=st.integers(1, 16),
)
def test_the_search_brackets_the_largest_n_that_holds(threshold: int, ns: list[int], resolution: int) -> None:
    ramp = ceiling.Ramp(sorted(ns), resolution)
    while (n := ramp.next_n()) is not None:
        assert n not in ramp.tried
        ramp.record(n, n <= threshold)
    assert ramp.good <= threshold
    if ramp.bad is None:  # the list never broke: its largest N held
        assert ramp.good == max(ns)
    else:
        assert ramp.good <= threshold < ramp.bad and ramp.bad - ramp.good <= resolution


def test_processes_are_labelled_by_name_and_command_line() -> None:
    def proc(comm: str, cmdline: str) -> dict:
        return {"comm": comm, "cmdline": cmdline, "cpu_s": 0.0, "threads": {}}

    serve = proc("python", "python -m duplex_actors.cli serve --model standin:25")
    spawned = proc("python", "python -c from multiprocessing.spawn import spawn_main; spawn_main()")
    tracker = proc("python", "python -c from multiprocessing.resource_tracker import main;main(5)")
    assert ceiling.role(1, serve, 1, "engine", False) == "frontend"
    assert ceiling.role(2, proc("duplex-engine", "python"), 1, "engine", False) == "engine"
    assert ceiling.role(3, proc("duplex-fe-1", "python"), 1, "engine", False) == "frontend"
    assert ceiling.role(4, tracker, 1, "engine", True) == "helper"
    assert ceiling.role(5, spawned, 1, "engine", True) == "engine"  # today's --engine-process
    assert ceiling.role(5, spawned, 1, "engine", False) == "frontend"
    assert ceiling.role(1, proc("duplex-supervisor", "python"), 1, "engine", False) == "helper"


def test_k_values_may_name_the_server_default() -> None:
    assert ceiling.frontend_values("default,1,2") == [None, 1, 2]
    assert ceiling.build_parser().parse_args(
        ["--serve-args=--engine-process --tick-policy grid"]
    ).serve_args == [
        "--engine-process",
        "--tick-policy",
        "grid",
    ]


def test_front_end_cpu_per_frame_sums_the_front_ends_over_the_frames() -> None:
    def proc(comm: str, cpu: float, threads: dict) -> dict:
        return {"comm": comm, "cmdline": comm, "cpu_s": cpu, "threads": threads}

    before = {
        1: proc("fe-0", 1.0, {1: ("fe-0", 1.0, 0.1)}),
        2: proc("engine", 5.0, {2: ("engine", 5.0, 1.0)}),
    }
    after = {
        1: proc("fe-0", 3.0, {1: ("fe-0", 2.5, 0.3), 11: ("fe-0", 0.5, 2.0)}),
        2: proc("engine", 5.5, {2: ("engine", 5.5, 1.25)}),
        3: proc("fe-1", 1.0, {3: ("fe-1", 1.0, 0.05)}),  # born in the window: all of its CPU counts
    }
    cpu = ceiling.cpu_window(
        before, after, 1, 10.0, frames=10_000, ticks=125, engine_pattern="engine", engine_process=False
    )
    assert cpu["frontends"] == 2
    assert cpu["frontend_us_per_frame"] == 300.0  # (2 + 1) s / 10 000 frames
    assert cpu["frontend_main_thread_us_per_frame"] == 250.0  # (1.5 + 1) s: tid == pid
    assert cpu["frontend_busiest_pct"] == 20.0
    assert cpu["engine_cpu_ms_per_tick"] == 4.0  # 0.5 s / 125 steps
    # run-queue waits of the main threads only: (0.2 + 0.05) s and 0.25 s over 125 ticks
    assert cpu["frontend_runqueue_ms_per_tick"] == 2.0
    assert cpu["engine_runqueue_ms_per_tick"] == 2.0
    assert ceiling.runqueue_wait_s(before, after) == pytest.approx(0.2 + 2.0 + 0.25 + 0.05)
    fe0 = next(p for p in cpu["processes"] if p["pid"] == 1)
    assert [t["tid"] for t in fe0["threads"]] == [1, 11]


def test_one_trial_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    proc = subprocess.run(
        [
            sys.executable, str(BENCH / "ceiling.py"), "--arms", "realtime-80", "--ns", "4", "--seconds", "2",
            "--warmup", "1", "--no-bisect", "--wait-quiet", "0", "--out", str(out), "--workdir", str(tmp_path), "--client-nice", "2",
        ],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["bench"] == "ceiling" and result["machine"].startswith("machine:")
    assert result["config"]["step_ms"] == 25.0 and result["config"]["client_nice"] == 2
    (row,) = result["trials"]
    assert (row["arm"], row["k"], row["n"], row["chunk_ms"]) == ("realtime-80", None, 4, 80)
    for key in (
        "held", "reasons", "coverage", "lost", "lat_p50", "lat_p99", "step_ms", "frames", "window_s",
        "frontends", "frontend_us_per_frame", "frontend_main_thread_us_per_frame", "frontend_busiest_pct",
        "engine_cpu_ms_per_tick", "frontend_runqueue_ms_per_tick", "engine_runqueue_ms_per_tick",
        "client_runqueue_ms_per_tick",
        "client_us_per_frame", "client_send_lag_p99_ms", "other_cpu_pct", "python_call_ns", "touch_warm_us", "touch_stale_us", "server", "cpu",
    ):  # fmt: skip
        assert key in row, key
    assert row["coverage"] > 0 and row["frames"] > 0 and row["python_call_ns"] > 0
    assert 0 < row["touch_warm_us"] and 0 < row["touch_stale_us"]
    assert row["client_nice"] == os.nice(0) + 2  # --client-nice 2, relative to this process
    assert row["step_ms"] >= 25.0  # the stand-in's step sleeps 25 ms: its wall time is no less
    assert row["lat_p50"] >= 25.0  # an output frame needs one step after its input arrived
    assert row["frontends"] == 1 and row["frontend_us_per_frame"] > 0
    # serve's own process is the engine core (named duplex-engine); its front end is a child
    assert row["engine_cpu_ms_per_tick"] is not None and row["engine_cpu_ms_per_tick"] > 0
    for key in (
        "frontend_runqueue_ms_per_tick",
        "engine_runqueue_ms_per_tick",
        "client_runqueue_ms_per_tick",
    ):
        assert row[key] is not None and row[key] >= 0, key
    (root,) = [p for p in row["cpu"]["processes"] if p["root"]]
    assert root["role"] == "engine" and "serve" in root["cmdline"]
    assert [p["role"] for p in row["cpu"]["processes"] if "duplex_actors.frontend" in p["cmdline"]] == [
        "frontend"
    ]
    (search,) = result["searches"]
    assert search["tried"] == [4] and search["largest_n_held"] in (0, 4)
    assert "results: " in proc.stdout and "fe us/fr" in proc.stdout
