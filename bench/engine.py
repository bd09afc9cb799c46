"""CPU benchmark of the batched MoshiEngine: ms per lockstep step against the batch size B.

For each B, one fresh ``open_engine(model, slots=B)`` (its own LM: a MoshiEngine puts its
LM into streaming mode for good), every slot reset with the same PersonaPlex prompt, a few
warm-up steps, then timed ``engine.step`` calls with a random 1920-sample frame per slot.
The one-session-per-step baseline is the same engine at B=1 run once per session within a
tick. Also timed: reset -> first output of a slot, for a prefill snapshot cache miss/hit
and for ``prefill="burst"``.

    .venv/bin/python bench/engine.py [--batches 1,2,4,8,16,32] [--steps 40] [--model tiny]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.model.memory import DTYPES
from machine import machine_line

TICK_MS = 80.0
PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."
)
VOICE = "NATF2.pt"
# Above this many milliseconds of expected stepping per batch size, time fewer steps.
STEP_BUDGET_MS = 6000.0
MIN_STEPS = 15


def frames_for(slots: int, rng: np.random.Generator) -> dict[int, np.ndarray]:
    return {s: (0.1 * rng.standard_normal(1920)).astype(np.float32) for s in range(slots)}


def time_steps(engine: Any, steps: int, warmup: int, rng: np.random.Generator) -> list[float]:
    slots = engine.slots
    for _ in range(warmup):
        engine.step(frames_for(slots, rng))
    times = []
    for _ in range(steps):
        frames = frames_for(slots, rng)
        started = time.perf_counter()
        engine.step(frames)
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def bench_batch(
    model: str, slots: int, steps: int, warmup: int, rng: np.random.Generator, dtype: str = "auto"
) -> dict[str, Any]:
    from duplex_actors.model.engine import SessionPrompt
    from duplex_actors.model.factory import open_engine

    engine = open_engine(model, slots=slots, dtype=dtype)
    prompt = SessionPrompt(voice=VOICE, persona=PERSONA)
    for slot in range(slots):
        engine.reset(slot, prompt)
    # Estimate the step time on the warm-up to keep the run short for large B.
    est = 0.0
    for _ in range(max(1, warmup)):
        started = time.perf_counter()
        engine.step(frames_for(slots, rng))
        est = (time.perf_counter() - started) * 1000.0
    n = steps if est * steps <= STEP_BUDGET_MS else max(MIN_STEPS, int(STEP_BUDGET_MS / est))
    times = time_steps(engine, n, 0, rng)
    del engine
    gc.collect()
    med = float(np.median(times))
    return {
        "B": slots,
        "steps": n,
        "median": med,
        "p90": float(np.percentile(times, 90)),
        "per_session": med / slots,
        "extrapolated": slots * TICK_MS / med,
    }


def bench_reset(
    model: str, prefill: str, repeats: int, rng: np.random.Generator, dtype: str = "auto"
) -> dict[str, Any]:
    """Reset -> first ready output at B=1, for a new persona (miss) and a repeated one (hit)."""
    from duplex_actors.model.engine import SessionPrompt
    from duplex_actors.model.factory import open_engine

    engine = open_engine(model, slots=1, prefill=prefill, dtype=dtype)  # type: ignore[arg-type]
    # Warm the engine (voice load, first prefill) so that "miss" is a new persona on a warm engine.
    engine.reset(0, SessionPrompt(voice=VOICE, persona=PERSONA + " (warm-up)"))
    time_steps(engine, 0, 3, rng)
    out: dict[str, Any] = {"prefill": prefill}
    for kind in ("miss", "hit"):
        resets, firsts, totals, nsteps = [], [], [], []
        for i in range(repeats):
            persona = f"{PERSONA} Session {i}."
            if kind == "miss":
                persona += f" Variant {rng.integers(1 << 30)}."
            else:
                engine.reset(0, SessionPrompt(voice=VOICE, persona=persona))  # make sure it is cached
            prompt = SessionPrompt(voice=VOICE, persona=persona)
            out["plan_calls"] = len(engine.prefill_plan(prompt) or ())
            frame = frames_for(1, rng)
            t0 = time.perf_counter()
            engine.reset(0, prompt)
            t1 = time.perf_counter()
            k = 0
            while True:
                k += 1
                result = engine.step(frame)
                if result[0].ready or k >= 10:
                    break
            t2 = time.perf_counter()
            resets.append((t1 - t0) * 1000)
            firsts.append((t2 - t1) * 1000)
            totals.append((t2 - t0) * 1000)
            nsteps.append(k)
        out[kind] = {
            "reset": float(np.median(resets)),
            "first": float(np.median(firsts)),
            "total": float(np.median(totals)),
            "steps": max(nsteps),
        }
    out["stats"] = (engine.stats.prefill_snapshot_misses, engine.stats.prefill_snapshot_hits)
    del engine
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per batch size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per batch size")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each reset measurement")
    parser.add_argument("--model", default="tiny", help="--model spec for open_engine (CPU)")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="the model's dtype (as serve --dtype)"
    )
    args = parser.parse_args(argv)
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    if 1 not in batches:
        batches.insert(0, 1)  # B=1 is the one-session-per-step baseline
    rng = np.random.default_rng(0)
    started = time.perf_counter()

    print(machine_line())
    print(
        f"model: {args.model} ({args.dtype}), frame 1920 samples (80 ms), {args.steps} timed steps "
        f"(fewer if a B's steps would exceed {STEP_BUDGET_MS / 1000:.0f} s), {args.warmup} warm-up"
    )
    print()
    rows = [bench_batch(args.model, b, args.steps, args.warmup, rng, args.dtype) for b in batches]
    print("| B | steps | median ms/step | p90 ms/step | ms/session | fits one 80 ms tick | B*80/median |")
    print("|---:|---:|---:|---:|---:|:---:|---:|")
    for r in rows:
        fits = "yes" if r["median"] <= TICK_MS else "no"
        print(
            f"| {r['B']} | {r['steps']} | {r['median']:.1f} | {r['p90']:.1f} | {r['per_session']:.2f} "
            f"| {fits} | {r['extrapolated']:.1f} |"
        )
    b1 = next(r for r in rows if r["B"] == 1)
    fitting = [r for r in rows if r["median"] <= TICK_MS]
    batched = max((r["B"] for r in fitting), default=0)
    extrapolated = max((r["extrapolated"] for r in rows), default=0.0)
    one_per_step = TICK_MS / b1["median"]
    print()
    print(f"batched capacity (largest measured B with median step <= {TICK_MS:.0f} ms): {batched} sessions")
    print(f"batched capacity extrapolated (max over B of B*80/median): {extrapolated:.1f} sessions")
    print(
        f"one-session-per-step capacity (80 / median at B=1 = 80 / {b1['median']:.1f}): "
        f"{one_per_step:.1f} sessions"
    )
    print(
        f"ratio batched / one-per-step: {batched / one_per_step:.2f}x measured, "
        f"{extrapolated / one_per_step:.2f}x extrapolated"
    )
    print()

    print(
        "reset -> first output of a slot at B=1 (median of "
        f"{args.repeats}; reset + steps until the slot's output is ready):"
    )
    print()
    print("| prefill | prompt snapshot | reset ms | first step ms | total ms | steps to output |")
    print("|---|---|---:|---:|---:|---:|")
    notes = []
    for mode in ("snapshot", "burst"):
        res = bench_reset(args.model, mode, args.repeats, rng, args.dtype)
        for kind, label in (("miss", "miss (new persona)"), ("hit", "hit (same persona)")):
            if mode == "burst":
                label = "none (new persona)" if kind == "miss" else "none (same persona)"
            r = res[kind]
            print(
                f"| {mode} | {label} | {r['reset']:.1f} | {r['first']:.1f} | {r['total']:.1f} "
                f"| {r['steps']} |"
            )
        misses, hits = res["stats"]
        notes.append(
            f"{mode} engine: {misses} snapshot misses, {hits} hits; "
            f"a timed prompt is {res['plan_calls']} forced LM calls"
        )
    print()
    for note in notes:
        print(note)
    print(f"total run time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
