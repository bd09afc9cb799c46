"""The log dir's availability: the pure decision (``log.health``), and the writer around it on a
real directory: a log that cannot be created, the re-probe loop under a MockClock, durability
waits, and the shared lock every live log holds."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from duplex_actors.log import records as r
from duplex_actors.log import writer as writer_module
from duplex_actors.log.health import LogDirHealth, Transition
from duplex_actors.log.writer import PROBE_PREFIX, LogClosed, LogFailed, open_log_writer, probe_dir

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


# -- the decision ---------------------------------------------------------------------------------
def test_the_first_failure_makes_the_dir_unavailable_and_later_ones_are_no_news() -> None:
    health = LogDirHealth()
    assert health.failed(ENOSPC) is Transition.UNAVAILABLE
    assert health.failed(ENOSPC) is None
    assert not health.available and health.failures == 2 and "No space" in (health.last_error or "")


def test_a_failed_probe_keeps_it_unavailable_and_a_working_one_reopens() -> None:
    health = LogDirHealth()
    health.failed(ENOSPC)
    assert health.probed(health.probe_started(), ENOSPC) is None
    assert not health.available and health.probe_failures == 1
    assert health.probed(health.probe_started(), None) is Transition.AVAILABLE
    assert health.available and health.recoveries == 1
    assert health.probed(health.probe_started(), None) is None  # nothing to reopen


def test_a_probe_that_raced_a_failure_does_not_reopen() -> None:
    health = LogDirHealth()
    health.failed(ENOSPC)
    token = health.probe_started()
    health.failed(OSError(errno.EIO, "a session's fsync failed while the probe ran"))
    assert health.probed(token, None) is None and not health.available
    assert health.probed(health.probe_started(), None) is Transition.AVAILABLE


# -- the writer -----------------------------------------------------------------------------------
def test_probe_dir_writes_syncs_and_removes_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    assert probe_dir(tmp_path) is None
    assert len(synced) == 1 and list(tmp_path.iterdir()) == []

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", broken)
    error = probe_dir(tmp_path)
    assert isinstance(error, OSError) and error.errno == errno.EIO
    assert not any(p.name.startswith(PROBE_PREFIX) for p in tmp_path.iterdir())


@pytest.fixture
def create_fails(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """While ``armed[0]`` is True, creating any file in a log dir fails with ENOSPC."""
    armed = [True]
    real = writer_module._create_file

    def create(path: Path) -> int:
        if armed[0]:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))
        return real(path)

    monkeypatch.setattr(writer_module, "_create_file", create)
    return armed


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_log_that_cannot_be_created_stops_admissions_until_a_probe_works(
    tmp_path: Path, create_fails: list[bool], caplog: pytest.LogCaptureFixture, autojump_clock: object
) -> None:
    async with open_log_writer(tmp_path, inline_io=True, probe_interval_s=5.0) as writer:
        assert writer.healthy
        with pytest.raises(OSError) as info:
            writer.create("a")
        assert info.value.errno == errno.ENOSPC
        assert not writer.healthy and writer.failed_logs == 1
        assert not (tmp_path / "a.dlog").exists()
        await trio.sleep(12)  # two probes, both refused
        stats = writer.statistics()
        assert (stats.dir_available, stats.dir_probe_failures, stats.dir_recoveries) == (False, 2, 0)
        create_fails[0] = False
        await trio.sleep(5)
        assert writer.healthy and writer.statistics().dir_recoveries == 1
        assert writer.statistics().dir_probe_failures == 2
        log = writer.create("b")  # admissions again
        log.append_nowait(r.Heartbeat())
        log.close_nowait()
        await log.wait_closed()
        await trio.sleep(60)  # healthy: no more probes
        assert writer.statistics().dir_probe_failures == 2
    lines = [rec.getMessage() for rec in caplog.records if rec.name == writer_module.__name__]
    assert [("unavailable" in m, "writable again" in m) for m in lines] == [(True, False), (False, True)]


async def test_a_failed_fsync_makes_the_dir_unavailable_until_a_probe_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: object
) -> None:
    broken = [True]
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if broken[0]:
            raise OSError(errno.EIO, "injected")
        real(fd)

    async with open_log_writer(tmp_path, inline_io=True, probe_interval_s=2.0) as writer:
        bad = writer.create("bad")
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        bad.append_nowait(r.Heartbeat())
        await writer.flush()
        assert bad.failed is not None and not writer.healthy
        await trio.sleep(4.5)
        assert not writer.healthy and writer.statistics().dir_probe_failures == 2
        broken[0] = False
        await trio.sleep(2)
        assert writer.healthy
        assert bad.failed is not None  # a log that failed stays failed
        with pytest.raises(LogFailed):
            bad.append_nowait(r.Heartbeat())


async def test_wait_durable_returns_after_the_commit_and_raises_if_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fdatasync
    async with open_log_writer(tmp_path) as writer:
        log = writer.create("a")

        def counted(fd: int) -> None:
            synced.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", counted)
        seq = log.append_nowait(r.Heartbeat())
        assert log.durable_seq < seq
        with trio.fail_after(5):
            await log.wait_durable(seq)
        assert log.durable_seq == seq and synced == [log._fd]
        await log.wait_durable(seq)  # already durable: returns at once

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(os, "fdatasync", broken)
        seq = log.append_nowait(r.Heartbeat())
        with trio.fail_after(5), pytest.raises(LogFailed):
            await log.wait_durable(seq)
        other = writer.create("b")
        other.close_nowait()
        await trio.sleep(0)
    with pytest.raises(LogClosed):
        await other.wait_durable(0)  # closed without that record


async def test_a_live_log_holds_a_shared_lock_until_it_is_closed(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, fsync=False) as writer:
        log = writer.create("a")
        fd = os.open(log.path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # readers may share it
            fcntl.flock(fd, fcntl.LOCK_UN)
            log.close_nowait()
            await log.wait_closed()
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
