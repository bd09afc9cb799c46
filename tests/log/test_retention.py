"""Retention of session log files on a real directory: age limit, size limit, open sessions kept."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from duplex_actors.log.retention import prune

NOW = 1_700_000_000.0


def make(log_dir: Path, name: str, *, age_s: float, size: int) -> Path:
    path = log_dir / name
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def test_age_limit_deletes_only_files_older_than_it(tmp_path: Path) -> None:
    old = make(tmp_path, "a.dlog", age_s=7200, size=10)
    make(tmp_path, "b.dlog", age_s=60, size=10)
    assert prune(tmp_path, max_age_s=3600, max_bytes=None, now=NOW) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.dlog"]


def test_size_limit_deletes_oldest_first_until_the_total_fits(tmp_path: Path) -> None:
    a = make(tmp_path, "a.dlog", age_s=300, size=100)
    b = make(tmp_path, "b.dlog", age_s=200, size=100)
    make(tmp_path, "c.dlog", age_s=100, size=100)
    make(tmp_path, "d.dlog", age_s=0, size=100)
    assert prune(tmp_path, max_age_s=None, max_bytes=250, now=NOW) == [a, b]
    assert prune(tmp_path, max_age_s=None, max_bytes=250, now=NOW) == []


def test_open_sessions_are_never_deleted_but_count_toward_the_size(tmp_path: Path) -> None:
    make(tmp_path, "open1.dlog", age_s=10_000, size=100)
    make(tmp_path, "open2.dlog", age_s=9_000, size=100)
    closed = make(tmp_path, "closed.dlog", age_s=10, size=100)
    deleted = prune(tmp_path, max_age_s=3600, max_bytes=150, now=NOW, keep={"open1", "open2.dlog"})
    assert deleted == [closed]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["open1.dlog", "open2.dlog"]


def test_other_files_are_ignored(tmp_path: Path) -> None:
    make(tmp_path, "notes.txt", age_s=10_000, size=1000)
    (tmp_path / "dir.dlog").mkdir()
    os.utime(tmp_path / "dir.dlog", (0, 0))
    keep = make(tmp_path, "a.dlog", age_s=0, size=10)
    assert prune(tmp_path, max_age_s=1, max_bytes=0, now=NOW, keep={"a"}) == []
    assert keep.exists() and (tmp_path / "notes.txt").exists() and (tmp_path / "dir.dlog").is_dir()


def test_no_limits_delete_nothing(tmp_path: Path) -> None:
    make(tmp_path, "a.dlog", age_s=1e9, size=10**6)
    assert prune(tmp_path, max_age_s=None, max_bytes=None, now=NOW) == []


HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_log_another_process_holds_is_never_deleted(tmp_path: Path) -> None:
    held = make(tmp_path, "held.dlog", age_s=10_000, size=100)
    free = make(tmp_path, "free.dlog", age_s=10_000, size=100)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert prune(tmp_path, max_age_s=1, max_bytes=0, now=NOW) == [free]
        assert held.exists()
    finally:
        holder.communicate("", timeout=10)  # EOF on stdin: it exits, the kernel drops its lock
    assert prune(tmp_path, max_age_s=1, max_bytes=0, now=NOW) == [held]


def test_a_log_this_process_holds_open_is_never_deleted(tmp_path: Path) -> None:
    held = make(tmp_path, "held.dlog", age_s=10_000, size=100)
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as the log writer does on every live log
        assert prune(tmp_path, max_age_s=1, max_bytes=None, now=NOW) == []
    finally:
        os.close(fd)
    assert prune(tmp_path, max_age_s=1, max_bytes=None, now=NOW) == [held]
