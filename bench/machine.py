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
