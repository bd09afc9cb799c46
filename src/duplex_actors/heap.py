"""The serving processes' heap, frozen once they serve: full collections scan only what sessions made.

A full (generation 2) collection stops the process's event loop for as long as it scans every
object the collector tracks: 35 ms over a front end's heap at start-up, 50 ms over the engine
core's (torch and moshi imported) on the 2-core VM. In the engine core that delays the tick of
every session; in a front end, every session's frame of that tick. Everything alive once the
process serves (modules, the model's Python objects, the app, its link and server) lives until
the process ends, so it is collected once and frozen out of the collector's sight (``gc.freeze``);
what sessions create is collected as before. BENCHMARKS.md ("Front-end ceiling") has the pauses.
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect, then freeze every object alive (``gc.freeze``); once per process, when it
    serves. Returns how many objects the collector no longer scans."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["freeze_heap"]
