"""The log-dir lock: one holder at a time, released when its descriptor closes."""

from __future__ import annotations

import os

import pytest

from duplex_actors.log.lock import LOCK_NAME, LogDirLocked, lock_log_dir


def test_the_log_dir_lock_is_exclusive_and_names_its_holder(tmp_path):
    log_dir = tmp_path / "sessions"
    fd = lock_log_dir(log_dir)  # creates the dir
    try:
        assert (log_dir / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(
            LogDirLocked, match=f"in use by another duplex-actors server \\(pid {os.getpid()}\\)"
        ):
            lock_log_dir(log_dir)
    finally:
        os.close(fd)
    os.close(lock_log_dir(log_dir))  # free again once the holder's descriptor is closed
