"""Micro-benchmark: CPU cost of input resampling and G.711 output per session-frame (80 ms).

64 sessions of 48 kHz pcm16 input (InputStream: decode + soxr 48k -> 24k) plus 64 sessions of
G.711 mu-law output (OutputStream: soxr 24k -> 8k + encode), one frame each per tick, as the
session cores and projections do them. Budget: under 5 ms of CPU per tick in all.

    python bench/formats.py [--sessions 64] [--ticks 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from duplex_actors.audio import FRAME_MS, InputStream, OutputStream, encode_g711, float_to_pcm16


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--ticks", type=int, default=200)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    in48 = float_to_pcm16(rng.standard_normal(48000 * FRAME_MS // 1000).astype(np.float32) * 0.1)
    in8 = encode_g711(float_to_pcm16(rng.standard_normal(640).astype(np.float32) * 0.1), "g711_ulaw")
    out24 = float_to_pcm16(rng.standard_normal(1920).astype(np.float32) * 0.1)
    inputs = [InputStream() for _ in range(a.sessions)]
    phone_in = [InputStream() for _ in range(a.sessions)]
    outputs = [OutputStream("g711_ulaw") for _ in range(a.sessions)]
    costs: dict[str, list[float]] = {"pcm16@48000 in": [], "g711_ulaw@8000 in": [], "g711_ulaw@8000 out": []}
    for _ in range(a.ticks):
        t0 = time.process_time()
        for s in inputs:
            s.feed(in48, "pcm16", 48000)
        t1 = time.process_time()
        for s in phone_in:
            s.feed(in8, "g711_ulaw", 8000)
        t2 = time.process_time()
        for o in outputs:
            o.encode(out24)
        t3 = time.process_time()
        costs["pcm16@48000 in"].append(t1 - t0)
        costs["g711_ulaw@8000 in"].append(t2 - t1)
        costs["g711_ulaw@8000 out"].append(t3 - t2)
    print(
        f"{a.sessions} sessions each, {a.ticks} ticks; CPU ms per tick (median, p99) and us per session-frame"
    )
    for name, xs in costs.items():
        ms = np.array(xs) * 1e3
        print(
            f"  {name:20s} {np.median(ms):6.2f} {np.percentile(ms, 99):6.2f}  {np.median(ms) * 1e3 / a.sessions:6.1f} us"
        )
    total = np.array(costs["pcm16@48000 in"]) + np.array(costs["g711_ulaw@8000 out"])
    print(
        f"  48k in + G.711 out: mean {np.mean(total) * 1e3:.2f} ms, median {np.median(total) * 1e3:.2f} ms,"
        f" p99 {np.percentile(total, 99) * 1e3:.2f} ms per tick (budget 5 ms)"
    )


if __name__ == "__main__":
    main()
