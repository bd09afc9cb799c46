"""Network jitter the load client injects on the way out (pure, deterministic with a seed)."""

from __future__ import annotations

from typing import Final

import attrs
import numpy as np


@attrs.frozen
class Jitter:
    """Network jitter the load client injects on the way out: every chunk is held back an
    exponential delay of mean ``mean_ms``; a chunk starts a late burst with probability
    chunk / ``burst_every_s`` (0: never) and is then held back ``burst_ms`` (x U[0.5, 1]) more,
    the chunks behind it queueing and leaving together when it goes."""

    mean_ms: float = 0.0
    burst_every_s: float = 0.0
    burst_ms: float = 0.0

    @property
    def active(self) -> bool:
        return self.mean_ms > 0 or (self.burst_every_s > 0 and self.burst_ms > 0)


JITTER_PROFILES: Final = {
    "loopback": Jitter(),
    "lan": Jitter(mean_ms=1.0, burst_every_s=20.0, burst_ms=20.0),
    "wan": Jitter(mean_ms=6.0, burst_every_s=4.0, burst_ms=150.0),
}


def jitter_delays(jitter: Jitter, chunks: int, chunk_s: float, seed: int = 0, index: int = 0) -> list[float]:
    """The hold-back (s) of each of ``chunks`` chunks of session ``index``: deterministic in
    (``seed``, ``index``)."""
    rng = np.random.default_rng([seed, index])
    d = rng.exponential(jitter.mean_ms, chunks) if jitter.mean_ms > 0 else np.zeros(chunks)
    if jitter.burst_every_s > 0 and jitter.burst_ms > 0:
        starts = rng.random(chunks) < min(1.0, chunk_s / jitter.burst_every_s)
        d = d + starts * jitter.burst_ms * rng.uniform(0.5, 1.0, chunks)
    return [float(x) / 1000 for x in d]
