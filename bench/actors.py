"""Actor overhead per frame: the bare batched engine against the full in-process server path.

For each B, one fresh ``open_engine(model, slots=B)`` (CPU, one torch thread) used twice:

(a) bare: every slot reset with the default session prompt, then timed ``engine.step`` calls
    with a 1920-sample frame for all B slots back to back (median ms per step);
(b) actors, in real time (engine steps in a worker thread, as in production):
    ``open_duplex_server(engine, log_dir=..., fsync=True)``, B sessions, and lockstep ticks:
    every session appends one frame, then the tick ends when every session has received the
    ``AudioFrame`` answering that frame from ``session.events()``. Tick wall time runs from
    the first append of the tick to the last of its AudioFrames. The scheduler's own step time
    (``step_seconds_sum / ticks`` over the timed ticks, the engine call in its worker thread)
    is reported beside it.

Overhead per frame = (median tick - median bare step) / B: session actors, scheduler wake-up
and routing, log records (written and fsynced by the log writer in worker threads), event
delivery, and the hop of each step into a worker thread and back.

    .venv/bin/python bench/actors.py [--batches 1,8,16] [--ticks 60] [--warmup 5] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.model.memory import DTYPES
from machine import machine_line

FRAME_SAMPLES = 1920
TICK_MS = 80.0


def filesystem_of(path: Path) -> str:
    try:
        out = subprocess.run(
            ["df", "-T", str(path)], capture_output=True, text=True, check=True, timeout=10
        ).stdout.splitlines()
        fields = out[-1].split()
        return f"{fields[1]} ({fields[0]}, mounted on {fields[-1]})"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def make_frames(count: int, slots: int, rng: np.random.Generator) -> list[dict[int, np.ndarray]]:
    return [
        {s: (0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32) for s in range(slots)}
        for _ in range(count)
    ]


def default_prompt(engine: Any) -> Any:
    """What a session opened with an empty config resets its slot with (see SessionCore._validated)."""
    return engine.family.session_prompt(voice=None, persona=None, sampling={}, extra=None)


def bench_bare(engine: Any, steps: int, warmup: int, rng: np.random.Generator) -> list[float]:
    prompt = default_prompt(engine)
    for slot in range(engine.slots):
        engine.reset(slot, prompt)
    frames = make_frames(steps + warmup, engine.slots, rng)
    times = []
    for i, batch in enumerate(frames):
        started = time.perf_counter()
        engine.step(batch)
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1000.0)
    return times


async def bench_actors(
    engine: Any, ticks: int, warmup: int, log_dir: Path, rng: np.random.Generator
) -> dict[str, Any]:
    import trio

    from duplex_actors.server import open_duplex_server
    from duplex_actors.session.events import AudioFrame

    slots = engine.slots
    total = warmup + ticks
    frames = make_frames(total, slots, rng)
    # frame index -> how many sessions have received its AudioFrame, the last arrival, and an
    # event set when all B have.
    received = [0] * total
    last_arrival = [0.0] * total
    complete = [trio.Event() for _ in range(total)]
    other_events: dict[str, int] = {}

    async def consume(handle: Any) -> None:
        async for event in handle.events():
            if isinstance(event, AudioFrame):
                k = event.frame_index
                received[k] += 1
                if received[k] == slots:
                    last_arrival[k] = time.perf_counter()
                    complete[k].set()
            else:
                name = type(event).__name__
                other_events[name] = other_events.get(name, 0) + 1

    tick_ms: list[float] = []
    engine_ms: list[float] = []  # engine.step of that tick, timed inside the engine
    async with open_duplex_server(engine, log_dir=log_dir, fsync=True) as server:
        scheduler = server.scheduler
        async with trio.open_nursery() as nursery:
            handles = [await server.open_session({}) for _ in range(slots)]
            for handle in handles:
                nursery.start_soon(consume, handle)
            # Wait until every slot has been reset for its session (prompt prepared and pasted).
            with trio.fail_after(60):
                while scheduler.statistics().resets < slots:
                    await trio.sleep(0.005)
            before = scheduler.statistics()
            engine_before = (engine.stats.steps, engine.stats.step_seconds_total)
            for k in range(total):
                if k == warmup:
                    before = scheduler.statistics()
                    engine_before = (engine.stats.steps, engine.stats.step_seconds_total)
                started = time.perf_counter()
                for slot, handle in enumerate(handles):
                    await handle.append(frames[k][slot])
                with trio.fail_after(30):
                    await complete[k].wait()
                if k >= warmup:
                    tick_ms.append((last_arrival[k] - started) * 1000.0)
                    engine_ms.append(engine.stats.last_step_seconds * 1000.0)
            after = scheduler.statistics()
            engine_after = (engine.stats.steps, engine.stats.step_seconds_total)
            for handle in handles:
                await handle.close()
    writer = server.writer.statistics()
    d_ticks = after.ticks - before.ticks
    batch_sizes = dict(after.batch_sizes)
    for size, count in before.batch_sizes:
        batch_sizes[size] -= count
    return {
        "tick": tick_ms,
        "engine_ms": engine_ms,
        "residual": [t - e for t, e in zip(tick_ms, engine_ms, strict=True)],
        "sched_step": (after.step_seconds_sum - before.step_seconds_sum) / d_ticks * 1000.0,
        "engine_step": (engine_after[1] - engine_before[1]) / (engine_after[0] - engine_before[0]) * 1000.0,
        "ticks": d_ticks,
        "batch_sizes": {k: v for k, v in sorted(batch_sizes.items()) if v},
        "late": after.late_frames - before.late_frames,
        "dropped": dict(after.dropped_frames),
        "writer": writer,
        "other_events": other_events,
    }


def bench_batch(
    model: str,
    slots: int,
    ticks: int,
    warmup: int,
    log_root: Path,
    rng: np.random.Generator,
    dtype: str = "auto",
) -> dict[str, Any]:
    import trio

    from duplex_actors.model.factory import open_engine

    engine = open_engine(model, slots=slots, dtype=dtype)
    bare = bench_bare(engine, ticks, warmup, rng)
    log_dir = log_root / f"B{slots}"
    actors = trio.run(bench_actors, engine, ticks, warmup, log_dir, rng)
    logs = sorted(log_dir.glob("*.dlog"))
    del engine
    gc.collect()
    tick = actors["tick"]
    bare_med = float(np.median(bare))
    tick_med = float(np.median(tick))
    residual = actors["residual"]
    return {
        "B": slots,
        "bare": bare_med,
        "bare_p90": float(np.percentile(bare, 90)),
        "tick": tick_med,
        "tick_p90": float(np.percentile(tick, 90)),
        "overhead": tick_med - bare_med,
        "per_frame_us": (tick_med - bare_med) / slots * 1000.0,
        "ratio": tick_med / bare_med,
        "engine_in_run": float(np.median(actors["engine_ms"])),
        "residual": float(np.median(residual)),
        "residual_p90": float(np.percentile(residual, 90)),
        "logs": len(logs),
        "log_bytes": sum(p.stat().st_size for p in logs),
        **{k: v for k, v in actors.items() if k not in ("tick", "engine_ms", "residual")},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,16", help="comma-separated batch sizes")
    parser.add_argument("--ticks", type=int, default=60, help="timed ticks (and bare steps) per B")
    parser.add_argument("--warmup", type=int, default=5, help="untimed ticks (and bare steps) per B")
    parser.add_argument("--model", default="tiny", help="--model spec for open_engine (CPU)")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="the model's dtype (as serve --dtype)"
    )
    parser.add_argument("--log-dir", type=Path, help="where the session logs go (default: a temp dir)")
    args = parser.parse_args(argv)
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    rng = np.random.default_rng(0)
    started = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="bench-actors-", dir=args.log_dir) as tmp:
        log_root = Path(tmp)
        print(machine_line())
        print(
            f"model: {args.model}, frame {FRAME_SAMPLES} samples (80 ms), {args.ticks} timed ticks/steps "
            f"after {args.warmup} warm-up; real time, engine in a worker thread; logs fsynced in "
            f"{log_root} on {filesystem_of(log_root)}"
        )
        print()
        rows = [
            bench_batch(args.model, b, args.ticks, args.warmup, log_root, rng, args.dtype) for b in batches
        ]

    print(
        "| B | bare step ms (median) | actor tick ms (median) | actor tick ms (p90) "
        "| scheduler step ms | overhead ms/tick | overhead µs/frame | tick/bare |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['B']} | {r['bare']:.1f} | {r['tick']:.1f} | {r['tick_p90']:.1f} | {r['sched_step']:.1f} "
            f"| {r['overhead']:.2f} | {r['per_frame_us']:.0f} | {r['ratio']:.2f} |"
        )
    print()
    print(
        "Where the tick goes: the engine's own step time inside the actor run (engine.stats, per "
        "tick), and the rest of the tick (actors, thread hop, logging, event delivery):"
    )
    print()
    print(
        "| B | bare step p90 ms | in-run engine step ms (median) | tick - in-run step ms (median) "
        "| (p90) | rest µs/frame | scheduler ticks | batch sizes | late frames |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        sizes = ", ".join(f"{b}x{n}" for b, n in r["batch_sizes"].items())
        print(
            f"| {r['B']} | {r['bare_p90']:.1f} | {r['engine_in_run']:.1f} | {r['residual']:.2f} "
            f"| {r['residual_p90']:.2f} | {r['residual'] / r['B'] * 1000:.0f} | {r['ticks']} | {sizes} "
            f"| {r['late']} |"
        )
    print()
    for r in rows:
        if r["batch_sizes"] != {r["B"]: r["ticks"]} or r["dropped"]:
            print(f"note B={r['B']}: not one full batch per tick; dropped {r['dropped']}")
        print(f"B={r['B']}: other events received: {r['other_events']}")
    print()
    print(
        "| B | logs | log bytes | records written | batches | fsyncs | dir fsyncs | fsync p50 ms | fsync p99 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        w = r["writer"]
        p50 = w.fsync_percentile(50)
        p99 = w.fsync_percentile(99)
        print(
            f"| {r['B']} | {r['logs']} | {r['log_bytes']} | {w.records_written} | {w.batches} | {w.fsyncs} "
            f"| {w.dir_fsyncs} | {p50 * 1000 if p50 is not None else float('nan'):.2f} "
            f"| {p99 * 1000 if p99 is not None else float('nan'):.2f} |"
        )
    print()
    print(f"total run time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
