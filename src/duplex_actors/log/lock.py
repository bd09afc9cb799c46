"""One server per log dir: an exclusive ``flock`` on ``<log dir>/.lock``, held for the process's life.

Two servers on one dir would share retention, and one's pruning could delete the other's live
session log. The lock is advisory and released by the kernel when the process exits, however it
exits, so a crashed server never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class LogDirLocked(Exception):
    """Another process holds the log dir."""


def lock_log_dir(log_dir: str | os.PathLike[str]) -> int:
    """Create ``log_dir`` if needed and lock it; return the lock's descriptor (keep it open).

    Raises :class:`LogDirLocked` naming the holder's pid when another process has it.
    """
    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise LogDirLocked(
            f"--log-dir {path} is in use by another duplex-actors server (pid {holder}); "
            "give each server its own log dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
