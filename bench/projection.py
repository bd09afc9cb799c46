"""Projection cost per audio delta: session AudioFrames -> the bytes the server sends.

Each measurement projects ``--frames`` AudioFrames (3840-byte PCM16, text on every fourth) of one
response with a fresh projection and turns every message into wire bytes as the server does
(``converter.dumps(...).encode()``; native binary frames are bytes already). It reports µs per audio
delta (one 80 ms frame per delta), the minimum over ``--reps`` runs in one process.

    .venv/bin/python bench/projection.py                               # this tree
    .venv/bin/python bench/projection.py --baseline-src /tmp/base/src  # against another tree

With ``--baseline-src`` both trees run in child processes, interleaved for ``--rounds`` rounds
(the cores are shared, so conditions drift); it prints the minimum and the median over the
rounds of each tree and their ratios (this tree / baseline).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
VARIANTS = ("ga", "beta", "native", "native-binary")
SID = "sess_00112233445566778899aabb"


def machine_line() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"machine: {platform.machine()}, {cpu}, os.cpu_count()={os.cpu_count()}, "
        f"python {platform.python_version()}, "
        f"date {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"
    )


def measure(frames: int, reps: int) -> dict[str, float]:
    """µs per audio delta for each variant (min over ``reps``), with the tree on ``sys.path``."""
    from duplex_actors.protocol.converter import dumps
    from duplex_actors.protocol.native import NativeProjection
    from duplex_actors.protocol.realtime import RealtimeProjection
    from duplex_actors.session import events as ev

    pcm = bytes(range(256)) * 15
    started = ev.ResponseStarted("resp_x_0", "item_x_0", 0)
    audio = [
        ev.AudioFrame("resp_x_0", "item_x_0", 0, i, pcm, "hi" if i % 4 == 0 else "") for i in range(frames)
    ]
    caps = {"chunk_period_ms": 80}

    def projection(variant: str) -> Any:
        if variant == "ga":
            return RealtimeProjection(SID, "tiny", caps)
        if variant == "beta":
            return RealtimeProjection(SID, "tiny", caps, beta=True)
        return NativeProjection(SID, binary_output=variant == "native-binary", capabilities=caps)

    out: dict[str, float] = {}
    for variant in VARIANTS:
        best = float("inf")
        for _ in range(reps):
            p = projection(variant)
            p.project(started)
            wire: list[bytes] = []
            t0 = time.perf_counter()
            for frame in audio:
                for message in p.project(frame):
                    wire.append(message if isinstance(message, bytes) else dumps(message).encode())
            best = min(best, time.perf_counter() - t0)
            assert len(wire) >= frames
        out[variant] = best / frames * 1e6
    return out


def _child(src: str, frames: int, reps: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--src", src, "--frames", str(frames), "--reps", str(reps)]
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=2000, help="audio frames per measurement")
    parser.add_argument("--reps", type=int, default=7, help="measurements per process (min taken)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds with --baseline-src")
    parser.add_argument("--baseline-src", help="the src/ of another tree to compare against")
    parser.add_argument("--src", default=str(SRC), help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.src)
        print(json.dumps(measure(args.frames, args.reps)))
        return 0
    print(machine_line())
    if args.baseline_src is None:
        sys.path.insert(0, str(SRC))
        for variant, us in measure(args.frames, args.reps).items():
            print(f"{variant:14s} {us:8.2f} µs/delta")
        return 0
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    for _ in range(args.rounds):
        runs["baseline"].append(_child(args.baseline_src, args.frames, args.reps))
        runs["this"].append(_child(str(SRC), args.frames, args.reps))
    print(
        f"{args.rounds} interleaved rounds, {args.frames} frames, min of {args.reps} per round; µs per delta:"
    )
    print(
        f"{'variant':14s} {'base min':>9s} {'this min':>9s} {'ratio':>6s} {'base med':>9s} {'this med':>9s} {'ratio':>6s}"
    )
    for variant in VARIANTS:
        base = [r[variant] for r in runs["baseline"]]
        this = [r[variant] for r in runs["this"]]
        lo_b, lo_t = min(base), min(this)
        med_b, med_t = statistics.median(base), statistics.median(this)
        print(
            f"{variant:14s} {lo_b:9.2f} {lo_t:9.2f} {lo_t / lo_b:6.2f} {med_b:9.2f} {med_t:9.2f} {med_t / med_b:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
