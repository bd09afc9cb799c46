"""Retention of session logs: delete the oldest closed log files past an age or a total size.

Synchronous and small (a directory listing, ``stat`` and ``unlink``); a server runs it in a worker
thread from time to time. Open sessions' files are passed in ``keep`` and are never deleted, but
their size still counts toward ``max_bytes``. Nor is a file whose ``flock`` is held: every live
session log holds a shared lock (``log.writer``), in this process or another one (a second server
on the same dir, a tool); the prune takes an exclusive lock without waiting and deletes only
while holding it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Set
from pathlib import Path

from duplex_actors.log.segment import SUFFIX


def prune(
    log_dir: str | os.PathLike[str],
    *,
    max_age_s: float | None,
    max_bytes: int | None,
    now: float,
    keep: Set[str] = frozenset(),
) -> list[Path]:
    """Delete ``*.dlog`` files older than ``max_age_s`` (by mtime, against ``now``), then the oldest
    others until all logs together take at most ``max_bytes``; return the deleted paths, oldest first.

    ``keep`` holds session ids (or file names) of open sessions. If the kept files alone exceed
    ``max_bytes`` every other file goes and the total stays over the limit. A file that vanishes
    meanwhile is skipped, and so is one whose lock another open file holds (it is kept, like
    ``keep``).
    """
    logs: list[tuple[float, str, int, Path]] = []
    for entry in os.scandir(log_dir):
        if not entry.name.endswith(SUFFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            logs.append((st.st_mtime, entry.name, st.st_size, Path(entry.path)))
    logs.sort()
    total = sum(size for _, _, size, _ in logs)
    deleted: list[Path] = []
    for mtime, name, size, path in logs:
        if name in keep or name.removesuffix(SUFFIX) in keep:
            continue
        too_old = max_age_s is not None and now - mtime > max_age_s
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            continue
        gone = _unlink_unless_held(path)
        if gone is None:
            continue  # held open: kept, and it still counts toward max_bytes
        if gone:
            deleted.append(path)
        total -= size
    return deleted


def _unlink_unless_held(path: Path) -> bool | None:
    """Delete ``path`` while holding its exclusive lock: True if deleted, False if it was already
    gone, None if another open file holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
