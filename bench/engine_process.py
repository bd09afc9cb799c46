"""The engine in a child process (``--engine-process``) against in-thread: bare step cost.

For each B: an in-thread ``open_engine(model, slots=B)`` and an ``EngineProcess`` with the same
arguments, every slot reset with the same prompt, then interleaved blocks of timed steps (the
same random frames for both, so the machine's load hits both alike). Reports the median step
in-thread and through the proxy, their difference (the proxy's per-step overhead: pickling,
two pipe hops, the child's wake-up; on shared cores it drowns in the noise), the pickling of
one step's frames and outputs alone, an empty step's round trip (the pipes and wake-ups
alone), and the proxy's start-up.

    .venv/bin/python bench/engine_process.py [--batches 1,8,16] [--steps 60] [--model tiny]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.model.memory import DTYPES
from engine import PERSONA, VOICE, frames_for
from machine import machine_line


def timed(engine: Any, frames: list[dict[int, np.ndarray]]) -> list[float]:
    out = []
    for f in frames:
        started = time.perf_counter()
        engine.step(f)
        out.append((time.perf_counter() - started) * 1000.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per engine and B")
    parser.add_argument("--blocks", type=int, default=6, help="interleaved blocks the steps are split into")
    parser.add_argument("--model", default="tiny")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="the model's dtype (as serve --dtype)"
    )
    args = parser.parse_args()

    from duplex_actors.model.engine import SessionPrompt
    from duplex_actors.model.factory import open_engine
    from duplex_actors.model.process import EngineProcess

    print(machine_line(), f"load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    prompt = SessionPrompt(voice=VOICE, persona=PERSONA)
    print(
        "    B | in-thread ms | process ms | overhead ms | pickle in+out ms | empty round trip ms | proxy start s"
    )
    for slots in [int(b) for b in args.batches.split(",")]:
        local = open_engine(args.model, slots=slots, dtype=args.dtype)
        started = time.perf_counter()
        proxy = EngineProcess(args.model, slots=slots, dtype=args.dtype)
        start_s = time.perf_counter() - started
        try:
            for engine in (local, proxy):
                for slot in range(slots):
                    engine.reset(slot, prompt)
                for _ in range(5):
                    engine.step(frames_for(slots, rng))
            per_block = max(1, args.steps // args.blocks)
            a: list[float] = []
            b: list[float] = []
            for block in range(args.blocks):
                frames = [frames_for(slots, rng) for _ in range(per_block)]
                first, second = (local, proxy) if block % 2 == 0 else (proxy, local)
                ta, tb = timed(first, frames), timed(second, frames)
                (a, b)[first is proxy].extend(ta)
                (a, b)[second is proxy].extend(tb)
            outputs = local.step(frames_for(slots, rng))
            frames = frames_for(slots, rng)
            started = time.perf_counter()
            for _ in range(50):
                pickle.loads(pickle.dumps(("step", frames), protocol=5))
                pickle.loads(pickle.dumps(("ok", outputs), protocol=5))
            pickle_ms = (time.perf_counter() - started) * 1000.0 / 50
            started = time.perf_counter()
            for _ in range(200):
                proxy.step({})  # the child returns at once: the bare round trip
            trip_ms = (time.perf_counter() - started) * 1000.0 / 200
            ma, mb = float(np.median(a)), float(np.median(b))
            print(
                f"{slots:5d} | {ma:12.2f} | {mb:10.2f} | {mb - ma:11.2f} | {pickle_ms:16.3f} | "
                f"{trip_ms:19.3f} | {start_s:13.2f}"
            )
        finally:
            proxy.close()
            del local
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
