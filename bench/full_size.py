"""PersonaPlex at full size on this machine, as a functional check (not a capacity figure).

Builds a checkpoint laid out exactly like ``nvidia/personaplex-7b-v1`` with random weights
(``model/synthetic.py``: the 7B LM, 16.7 GB in bfloat16, written one tensor at a time; a random
Mimi at the real config; 18 random voice prompts), unless ``--dir`` holds one already. Then,
for each B: ``open_engine`` as the server does it (the start-up phases and their durations:
load, engine, digest, prefill of the default prompt), B sessions reset with that prompt, one
untimed step, ``--steps`` timed steps, each frame checked (8 codes within the card, 1920 finite
samples), and the process's peak resident memory.

Needs about 17 GB of free disk and, in bfloat16, 17.3 GiB of memory at B=1 and 18.7 GiB at B=2
(the start-up check refuses what does not fit, with the figures). ``--small``: the same at the
test suite's small dimensions, to check the script itself in seconds.

    .venv/bin/python bench/full_size.py --dir /var/tmp/personaplex-7b-v1 [--batches 1,2] [--steps 5]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.model.memory import DTYPES
from machine import machine_line

SMALL_LM = {
    "dim": 64,
    "text_card": 256,
    "num_heads": 4,
    "num_layers": 2,
    "context": 250,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 132,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB


def build(directory: Path, small: bool) -> float:
    from duplex_actors.model.synthetic import make_personaplex_layout

    started = time.perf_counter()
    make_personaplex_layout(
        directory, lm_config=SMALL_LM if small else None, tiny_codec=small, voice_positions=50
    )
    return time.perf_counter() - started


def run(directory: Path, slots: int, steps: int, dtype: str) -> dict[str, Any]:
    from duplex_actors.model.factory import open_engine
    from duplex_actors.model.startup import DONE, PhaseReport

    phases: list[PhaseReport] = []
    engine = open_engine(
        str(directory), slots=slots, dtype=dtype, prepare_default=True, on_phase=phases.append
    )
    prompt = engine.family.session_prompt()
    for slot in range(slots):
        engine.reset(slot, prompt)  # the default prompt's snapshot: prefilled once, in the phase
    rng = np.random.default_rng(0)
    times = []
    for k in range(steps + 1):
        frames = {s: (0.1 * rng.standard_normal(1920)).astype(np.float32) for s in range(slots)}
        started = time.perf_counter()
        out = engine.step(frames)
        if k:
            times.append(time.perf_counter() - started)
        for result in out.values():
            assert len(result.agent_codes) == 8 and all(0 <= c < 2048 for c in result.agent_codes)
            assert result.pcm.shape == (1920,) and bool(np.isfinite(result.pcm).all())
    done = {r.name: r.elapsed_s for r in phases if r.state == DONE}
    prefill = next((r for r in phases if r.name == "prefill" and r.state == DONE), None)
    return {
        "slots": slots,
        "dtype": engine.describe().dtype,
        "phases": done,
        "prefill_positions": prefill.total if prefill is not None else None,
        "step_s": times,
        "peak_rss_gib": peak_rss_gib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the checkpoint (built there if absent)")
    parser.add_argument("--batches", default="1,2", help="comma-separated B (one fresh engine each)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per B")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    parser.add_argument("--small", action="store_true", help="small dimensions: check the script itself")
    args = parser.parse_args()
    print(machine_line())
    if not (args.dir / "model.safetensors").is_file():
        took = build(args.dir, args.small)
        size = (args.dir / "model.safetensors").stat().st_size
        print(f"built {args.dir}: model.safetensors {size / 1e9:.2f} GB in {took:.0f} s")
    for slots in (int(b) for b in args.batches.split(",")):
        result = run(args.dir, slots, args.steps, args.dtype)
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in result["phases"].items())
        steps = result["step_s"]
        print(
            f"B={slots} {result['dtype']}: {phases} (prefill: {result['prefill_positions']} positions); "
            f"step median {np.median(steps):.2f} s, max {max(steps):.2f} s over {len(steps)}; "
            f"peak RSS {result['peak_rss_gib']:.1f} GiB (the process so far)"
        )
        gc.collect()


if __name__ == "__main__":
    main()
