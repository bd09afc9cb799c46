"""KV-cache writes on CPU: moshi's ``scatter_`` against ``index_put_`` (model/kv_write.py).

1. One write at the 7B's cache shape (32 heads x 3000 positions x 128 per layer, keys and
   values), B = 1 and 2, float32 and bfloat16: ``RingKVCache.complete`` as moshi has it, and
   as ``kv_write.complete`` does it. Every output and the cache are checked bit for bit.
2. ``--layers N`` (0: skip): an ``LMGen`` step of an LM at the 7B's width with N transformer
   layers (and a 1-layer depformer, to keep the memory small; random weights) in bfloat16,
   with moshi's writes and with ``kv_write``'s, at B = 1 and 2. A full 7B has 32 layers: its
   saving per step is 32/N times the one measured here.

    .venv/bin/python bench/kv_write.py [--layers 2] [--steps 5] [--calls 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.model import kv_write
from machine import machine_line


def per_call(dtype: torch.dtype, batch: int, calls: int) -> tuple[float, float, bool]:
    """ms per complete() call with moshi's write and with kv_write's, and whether they agree."""
    from moshi.modules.transformer import RingKVCache

    cpu = torch.device("cpu")
    caches = [RingKVCache(batch, 32, 128, 3000, device=cpu, dtype=dtype) for _ in range(2)]
    gen = torch.Generator().manual_seed(0)
    inputs = [
        (
            torch.randn(batch, 32, 1, 128, generator=gen).to(dtype),
            torch.randn(batch, 32, 1, 128, generator=gen).to(dtype),
        )
        for _ in range(calls)
    ]
    mask = torch.ones(batch, dtype=torch.bool)
    times = []
    outputs = []
    for cache, write in ((caches[0], None), (caches[1], kv_write.complete)):
        started = time.perf_counter()
        out = []
        for k, v in inputs:
            out.append(cache.complete(k, v, mask) if write is None else write(cache, k, v, mask))
        times.append((time.perf_counter() - started) / calls * 1000)
        outputs.append(out)
    same = torch.equal(caches[0].cache, caches[1].cache) and all(
        torch.equal(a, b) for x, y in zip(*outputs, strict=True) for a, b in zip(x, y, strict=True)
    )
    return times[0], times[1], same


def lm_steps(layers: int, batch: int, steps: int) -> tuple[float, float]:
    """ms per LMGen step with moshi's writes, then kv_write's (same LM, fresh streaming state)."""
    from moshi.models import loaders
    from moshi.models.lm import LMGen, LMModel

    kwargs: dict[str, Any] = dict(loaders._lm_kwargs, num_layers=layers, depformer_num_layers=1)
    torch.manual_seed(0)
    lm = LMModel(device=torch.device("cpu"), dtype=torch.bfloat16, **kwargs)
    lm.eval()
    gen = LMGen(lm, use_sampling=False, support_out_of_sync=True)
    gen.streaming_forever(batch)
    codes = torch.zeros(batch, 8, 1, dtype=torch.long)
    mask = torch.ones(batch, dtype=torch.bool)
    out = []
    for patched in (False, True):
        if patched:
            assert kv_write.install(lm) == layers
        gen.reset_streaming()
        with torch.no_grad():
            gen.set_exec_mask(mask)
            gen.step(codes)  # warm-up
            started = time.perf_counter()
            for _ in range(steps):
                gen.step(codes)
        out.append((time.perf_counter() - started) / steps * 1000)
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="timed writes per case")
    parser.add_argument("--layers", type=int, default=2, help="LM layers at the 7B's width (0: skip)")
    parser.add_argument("--steps", type=int, default=5, help="timed LMGen steps per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())
    print("one write (keys and values) of a 7B layer's ring cache [B, 32, 3000, 128]:")
    print(f"{'dtype':>9} {'B':>2} {'scatter_ ms':>12} {'index_put_ ms':>14}  identical")
    for dtype in (torch.float32, torch.bfloat16):
        for batch in (1, 2):
            moshi_ms, ours_ms, same = per_call(dtype, batch, args.calls)
            name = str(dtype).removeprefix("torch.")
            print(f"{name:>9} {batch:>2} {moshi_ms:>12.2f} {ours_ms:>14.2f}  {same}")
    if args.layers:
        print(f"LMGen step, 7B width, {args.layers} layers (32 in the 7B), 1 depformer layer, bfloat16:")
        print(f"{'B':>2} {'scatter_ ms':>12} {'index_put_ ms':>14} {'saved per layer ms':>19}")
        for batch in (1, 2):
            moshi_ms, ours_ms = lm_steps(args.layers, batch, args.steps)
            print(
                f"{batch:>2} {moshi_ms:>12.1f} {ours_ms:>14.1f} {(moshi_ms - ours_ms) / args.layers:>19.1f}"
            )


if __name__ == "__main__":
    main()
