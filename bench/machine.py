"""The one line every bench script records about the machine it ran on (``machine_line``).

The scripts run as ``python bench/<name>.py``, so this module is imported by its name (the
script's folder is on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except ImportError:
        return "-"


def python_call_ns(calls: int = 300_000, rounds: int = 3) -> float:
    """The machine's speed at this moment, as the interpreter sees it: nanoseconds per call of a
    function that returns at once, the fastest of ``rounds`` loops of ``calls`` (about 0.1 s in
    all). A shared VM's host moves this by 3x from hour to hour; CPU figures per message move
    with it, so a run records it next to them."""

    def nothing() -> None:
        return None

    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            nothing()
        best = min(best, time.perf_counter() - start)
    return 1e9 * best / calls


class _SessionPart:
    """One of the small objects a front end keeps per session (a socket's, an actor's, a log's)."""

    def __init__(self, i: int) -> None:
        self.a = i
        self.b = i + 1
        self.c = str(i)


def stale_touch_us(
    pause_s: float = 0.08, sessions: int = 64, parts: int = 48, buffer_bytes: int = 8192, rounds: int = 5
) -> tuple[float, float]:
    """``(warm, stale)``: CPU µs of one pass over a working set shaped like a front end's
    per-session state (``sessions`` x ``parts`` small objects and a copy of a ``buffer_bytes``
    buffer each), passes back to back (the fastest of ``rounds``), and each after ``pause_s`` of
    sleep (the median of ``rounds``), as a front end touches each session once per 80 ms frame.

    On a shared VM, memory untouched for tens of milliseconds is evicted from the caches by the
    host's other tenants, and the stale pass costs several times the warm one; how many times
    moves from hour to hour, and the front end's CPU per frame moves with it
    (:func:`python_call_ns`, whose loop stays in the cache, does not see it). About 1 s."""
    groups = [([_SessionPart(i) for i in range(parts)], bytearray(buffer_bytes)) for _ in range(sessions)]

    def one_pass() -> float:
        start = time.thread_time()
        total = 0
        for objects, buffer in groups:
            for part in objects:
                total += part.a + part.b
            total += len(bytes(buffer))
        return (time.thread_time() - start) * 1e6

    warm = min(one_pass() for _ in range(rounds))
    stale = []
    for _ in range(rounds):
        time.sleep(pause_s)
        stale.append(one_pass())
    return warm, statistics.median(stale)


def machine_line(*, libraries: Sequence[str] = ("torch", "moshi"), torch_threads: int | None = 1) -> str:
    """``machine: <platform> (<arch>, <cpu>), os.cpu_count()=N, python V, torch V (threads per
    engine: 1), moshi V, date <now>``; ``libraries`` are the versions worth recording (imported
    here: leave torch out of a script that does not use it)."""
    parts = [
        f"machine: {platform.platform()} ({platform.machine()}, {cpu_model()})",
        f"os.cpu_count()={os.cpu_count()}",
        f"python {platform.python_version()}",
    ]
    for name in libraries:
        part = f"{name} {_version(name)}"
        if name == "torch" and torch_threads is not None:
            part += f" (threads per engine: {torch_threads})"
        parts.append(part)
    parts.append(f"date {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    return ", ".join(parts)
