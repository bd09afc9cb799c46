"""Start phases of N paced streams within one 80 ms tick (pure, deterministic with a seed)."""

from __future__ import annotations

from typing import Final

import numpy as np

from ..audio import FRAME_S

PHASES: Final = ("spread", "random", "sync")


def start_offsets(n: int, phases: str = "spread", seed: int = 0) -> list[float]:
    """Start offset (s) of each of ``n`` streams within one 80 ms tick: ``spread`` i*80/n ms,
    ``random`` uniform in [0, 80) ms drawn from ``seed``, ``sync`` all 0."""
    if phases == "sync":
        return [0.0] * n
    if phases == "spread":
        return [i * FRAME_S / n for i in range(n)]
    if phases == "random":
        return [float(x) for x in np.random.default_rng(seed).uniform(0.0, FRAME_S, n)]
    raise ValueError(f"phases must be one of {', '.join(PHASES)}")
