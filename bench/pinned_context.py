"""CPU cost of ``--context-policy pin-prompt`` against moshi's ring: time per step and memory.

1. One temporal attention layer at PersonaPlex-7B's shape (dim 4096, 32 heads of 128, context
   3000; float32 on CPU) over a batch of B rows, its KV cache full of random keys and values:
   moshi's own forward (ring) against the pinned forward, with every row past its wrap and a
   pin of 250 positions (a typical PersonaPlex prompt) under the default cap of C/4 = 750, and
   with the rows before their wrap; on CPU the pinned part reads up to the largest pin (off
   CPU, the cap: a static shape for CUDA graphs, also timed here as "static width"). Median ms per step of
   the layer (projections, cache write, attention) and of its attention alone (the layer less
   its two projections, timed on their own). The arms are timed in turn, round after round, in
   CPU time of the one torch thread (waits for a shared core are not counted).
2. The tiny engine (``MoshiEngine``, B slots, every slot past its wrap): median ms per whole
   step (Mimi, LM, depformer), ring against pin-prompt.
3. Memory: the LM's streaming state per slot (KV cache and offsets), both policies, and what a
   pinned layer call allocates on top.

    .venv/bin/python bench/pinned_context.py [--batch 4] [--rounds 40] [--steps 1] [--engine-batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from machine import machine_line

DIM, HEADS, CONTEXT = 4096, 32, 3000
PIN, PIN_CAP = 250, CONTEXT // 4
ARMS = (  # (arm, position of every row, pin)
    ("ring", CONTEXT + 100, 0),
    ("pinned, before the wrap", 0, PIN),  # the position is set by the number of steps
    ("pinned, past the wrap", CONTEXT + 100, PIN),
    ("pinned, past the wrap, static width (as off CPU)", CONTEXT + 100, PIN),
)


def interleaved(arms: dict[str, Callable[[], Any]], rounds: int, steps: int) -> dict[str, float]:
    """Median ms per step of each arm, the arms timed in turn ``rounds`` times ``steps`` steps
    each, so that a slow spell of the shared host falls on every arm alike. The time is this
    thread's CPU time (torch runs one thread here): time spent waiting for a core shared with
    other processes is not counted."""
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for step in arms.values():  # warm-up
        for _ in range(3):
            step()
    for _ in range(rounds):
        for arm, step in arms.items():
            for _ in range(steps):
                started = time.thread_time()
                step()
                times[arm].append((time.thread_time() - started) * 1000.0)
    return {arm: statistics.median(t) for arm, t in times.items()}


def _projections(attn: Any, x: Any, y: Any) -> Any:
    return attn.in_projs[0](x), attn.out_projs[0](y)


def _step(engine: Any, frames: Callable[[], dict[int, np.ndarray]]) -> Any:
    return engine.step(frames())


def layer_bench(batch: int, rounds: int, steps: int) -> dict[str, float]:
    import torch
    from moshi.modules.rope import RotaryEmbedding
    from moshi.modules.transformer import StreamingMultiheadAttention

    from duplex_actors.model.pinned_context import PinnedPrefix, pin_attention

    torch.manual_seed(0)
    x = torch.randn(batch, 1, DIM) * 0.1
    y = torch.randn(batch, 1, DIM)
    arms: dict[str, Callable[[], Any]] = {}
    out: dict[str, float] = {}
    with torch.no_grad():
        for arm, position, pin in ARMS:
            if arm == ARMS[1][0]:
                position = CONTEXT - rounds * steps - 10
            attn = StreamingMultiheadAttention(
                DIM, HEADS, causal=True, context=CONTEXT, rope=RotaryEmbedding(True), dtype=torch.float32
            )
            for param in attn.parameters():
                torch.nn.init.normal_(param, std=DIM**-0.5)
            if arm != "ring":
                pins = PinnedPrefix(batch, CONTEXT, PIN_CAP, torch.device("cpu"), static="static" in arm)
                pin_attention(attn, pins)
                for row in range(batch):
                    pins.set(row, pin)
            attn.streaming_forever(batch)
            state: Any = attn._streaming_state
            state.kv_cache.cache.normal_()
            state.offset[:] = position
            state.kv_cache.end_offset[:] = position
            arms[arm] = partial(attn, x, x, x)
            if arm == "ring":
                arms["projections"] = partial(_projections, attn, x, y)
                out["kv_bytes_per_row"] = state.kv_cache.cache[:, 0].numel() * 4
        out.update(interleaved(arms, rounds, steps))
    return out


def engine_bench(batch: int, rounds: int, steps: int) -> dict[str, float]:
    from duplex_actors.model.engine import SessionPrompt
    from duplex_actors.model.factory import open_engine
    from duplex_actors.model.family import DEFAULT_PERSONA

    rng = np.random.default_rng(0)
    prompt = SessionPrompt(voice="NATF2.pt", persona=DEFAULT_PERSONA)  # 81 positions in tiny

    def frames() -> dict[int, np.ndarray]:
        return {s: (0.1 * rng.standard_normal(1920)).astype(np.float32) for s in range(batch)}

    arms: dict[str, Callable[[], Any]] = {}
    out: dict[str, float] = {}
    for policy in ("ring", "pin-prompt"):
        engine = open_engine(
            "tiny", slots=batch, context_policy=policy, pin_max=90 if policy != "ring" else None
        )
        for slot in range(batch):
            engine.reset(slot, prompt)
        context = engine.context
        for _ in range(context - 81 + 5):  # every slot past its wrap
            engine.step(frames())
        arms[policy] = partial(_step, engine, frames)
        state_bytes = sum(
            part.numel() * part.element_size() for part in engine._runner.snapshot(0, context).tensors
        )
        out[f"{policy} state bytes per slot"] = state_bytes
        out["context"] = context
    out.update(interleaved(arms, rounds, steps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="rows of the 7B-shaped layer (default 4)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the arms in turn (default 40)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per arm and round (default 1)")
    parser.add_argument("--engine-batch", type=int, default=8, help="slots of the tiny engine (default 8)")
    args = parser.parse_args()
    import torch

    import duplex_actors  # noqa: F401  (sets NO_TORCH_COMPILE before moshi is imported)

    torch.set_num_threads(1)
    print(machine_line())
    layer = layer_bench(args.batch, args.rounds, args.steps)
    ring = layer["ring"]
    attention = ring - layer["projections"]
    print(
        f"\none attention layer, dim {DIM}, {HEADS} heads, context {CONTEXT}, float32, B={args.batch}, "
        f"pin {PIN} of a {PIN_CAP}-column pinned part; median of {args.rounds} x {args.steps} steps, "
        "arms in turn"
    )
    print(f"KV cache per row: {layer['kv_bytes_per_row'] / 2**20:.1f} MiB (the same tensor in every arm)")
    print("| arm | CPU ms per layer step | vs ring | attention alone, CPU ms | vs ring |")
    print("|---|---:|---:|---:|---:|")
    for arm, _, _ in ARMS:
        alone = layer[arm] - layer["projections"]
        print(
            f"| {arm} | {layer[arm]:.1f} | {layer[arm] / ring - 1:+.1%} | {alone:.1f} | {alone / attention - 1:+.1%} |"
        )
    print(f"(projections alone: {layer['projections']:.1f} ms)")
    eng = engine_bench(args.engine_batch, args.rounds, args.steps)
    print(
        f"\ntiny engine, B={args.engine_batch}, context {eng['context']:.0f}, every slot past its wrap "
        f"(prompt 81 positions, pinned); median of {args.rounds} x {args.steps} steps, arms in turn"
    )
    print("| policy | CPU ms per step | vs ring | LM state per slot (KiB) |")
    print("|---|---:|---:|---:|")
    for policy in ("ring", "pin-prompt"):
        print(
            f"| {policy} | {eng[policy]:.1f} | {eng[policy] / eng['ring'] - 1:+.1%} | "
            f"{eng[f'{policy} state bytes per slot'] / 1024:.1f} |"
        )
    extra = args.batch * HEADS * (2 * PIN_CAP * 4 + 2 * 128 * 4) + args.batch * CONTEXT * 4
    print(
        f"\na pinned layer call allocates on top (B={args.batch}): pinned scores and weights, "
        f"their output, the ring's mask: ~{extra / 2**20:.2f} MiB, freed after the call; "
        f"persistent: the pins, {args.batch * 8} bytes"
    )


if __name__ == "__main__":
    main()
