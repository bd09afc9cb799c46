"""The log writer actor on real files: ordering, group commit, failure and backpressure policies."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from duplex_actors.log import records as r
from duplex_actors.log import writer as writer_module
from duplex_actors.log.segment import MAGIC, read_log
from duplex_actors.log.writer import (
    FSYNC_HISTORY,
    LogBackpressure,
    LogClosed,
    LogFailed,
    LogWriterStatistics,
    SessionLog,
    open_log_writer,
)


def step(i: int) -> r.Step:
    return r.Step(
        epoch=0,
        frame_index=i,
        ready=True,
        text_token=i,
        text_piece="x",
        agent_codes=(i,) * 8,
        user_codes=(0,) * 8,
        pcm16=i.to_bytes(2, "little") * 1920,
    )


async def test_records_of_several_sessions_come_back_in_order(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path) as writer:
        logs = [writer.create(f"s{n}") for n in range(3)]
        expected: dict[str, list[r.Record]] = {log.session_id: [] for log in logs}
        for i in range(20):
            for log in logs:
                rec: r.Record = step(i) if i % 2 else r.Append(audio=bytes([i]) * 100)
                assert log.append_nowait(rec) == len(expected[log.session_id])
                expected[log.session_id].append(rec)
            if i % 3 == 0:
                await trio.sleep(0)  # let batches of different sizes form
        for log in logs:
            log.close_nowait()
        for log in logs:
            await log.wait_closed()
            assert log.closed and log.failed is None and log.durable_seq == 19
    for log in logs:
        result = read_log(tmp_path / f"{log.session_id}.dlog")
        assert result.torn_tail is None
        assert result.records == list(enumerate(expected[log.session_id]))


async def test_a_frames_records_are_encoded_by_the_commit_and_any_other_at_once(tmp_path: Path) -> None:
    """A frame's records (records.frame_record) wait as themselves and come out as they were
    appended; audio the log could see change (a bytearray) is encoded when it is appended."""
    async with open_log_writer(tmp_path, inline_io=True) as writer:
        log = writer.create("a")
        mutable = bytearray(b"\x01\x02" * 10)
        records: list[r.Record] = [step(0), r.Append(bytes(mutable), "pcm16", "evt_1", 24000), r.Cancel()]
        for rec in records:
            log.append_nowait(rec)
        log.append_nowait(r.Append(mutable, "pcm16", None, 24000))  # type: ignore[arg-type]
        mutable[:] = bytes(len(mutable))  # after its append: the log holds what was appended
        records.append(r.Append(b"\x01\x02" * 10, "pcm16", None, 24000))
        assert [type(item) for item in log._pending] == [r.Step, r.Append, bytes, bytes]
        await writer.flush()
    assert read_log(log.path).records == list(enumerate(records))


async def test_records_appended_while_a_commit_encodes_come_after_it_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit checkpoints every ENCODE_SLICE records it encodes; appends made meanwhile, to
    logs it has taken and to logs it has not, land in order (this commit's or the next)."""
    monkeypatch.setattr(writer_module, "ENCODE_SLICE", 2)
    async with open_log_writer(tmp_path, inline_io=True) as writer:
        logs = [writer.create(f"s{n}") for n in range(4)]
        expected: dict[str, list[r.Record]] = {log.session_id: [] for log in logs}

        def append_all(i: int) -> None:
            for log in logs:
                rec: r.Record = step(i) if i % 2 else r.Append(bytes([i]) * 100, "pcm16", None, 24000)
                log.append_nowait(rec)
                expected[log.session_id].append(rec)

        for i in range(3):
            append_all(i)

        async def keep_appending() -> None:
            for i in range(3, 40):
                append_all(i)
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.flush)
            nursery.start_soon(keep_appending)
        await writer.flush()
        assert writer.statistics().batches > 1
    for log in logs:
        assert read_log(log.path).records == list(enumerate(expected[log.session_id]))


async def test_one_fdatasync_per_file_per_batch(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path) as writer:
        a, b = writer.create("a"), writer.create("b")
        for i in range(10):
            a.append_nowait(step(i))
        await writer.flush()
        stats = writer.statistics()
        assert (stats.batches, stats.fsyncs, stats.records_written) == (1, 1, 10)
        assert stats.dir_fsyncs == 1  # the two new directory entries, once
        for i in range(5):
            a.append_nowait(step(i))
            b.append_nowait(step(i))
        await writer.flush()
        stats = writer.statistics()
        assert (stats.batches, stats.fsyncs, stats.records_written) == (2, 3, 20)
        assert len(stats.fsync_durations_s) == 3 and all(d >= 0 for d in stats.fsync_durations_s)
        assert stats.bytes_written == sum(p.stat().st_size - len(MAGIC) for p in tmp_path.iterdir())
        assert stats.queue_depth == 0 and stats.open_logs == 2
        await writer.flush()  # nothing queued: no batch, no fsync
        assert writer.statistics().fsyncs == 3


async def test_fsync_false_writes_without_syncing(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, fsync=False) as writer:
        log = writer.create("a")
        log.append_nowait(r.Cancel())
        log.close_nowait()
        await log.wait_closed()
        stats = writer.statistics()
        assert (stats.fsyncs, stats.dir_fsyncs, stats.records_written) == (0, 0, 1)
    assert read_log(log.path).records == [(0, r.Cancel())]


async def test_failed_fdatasync_fails_the_log_and_the_writer_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[tuple[SessionLog, OSError]] = []
    async with open_log_writer(tmp_path, on_failure=lambda log, exc: failures.append((log, exc))) as writer:
        good, bad = writer.create("good"), writer.create("bad")
        good.append_nowait(r.Cancel())
        await writer.flush()
        real_fdatasync = os.fdatasync
        calls = []

        def fdatasync(fd: int) -> None:
            calls.append(fd)
            if fd == bad._fd:
                raise OSError(errno.EIO, "injected")
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        bad.append_nowait(r.Cancel())
        good.append_nowait(r.Heartbeat())
        await writer.flush()
        assert len(calls) == 2  # tried once, never retried

        assert isinstance(bad.failed, OSError) and bad.failed.errno == errno.EIO
        assert not writer.healthy and writer.failed_logs == 1
        assert failures == [(bad, bad.failed)]
        with pytest.raises(LogFailed) as info:
            bad.append_nowait(r.Cancel())
        assert info.value.__cause__ is bad.failed
        assert bad.next_seq == 1 and bad.durable_seq == -1
        bad.close_nowait()
        with pytest.raises(LogFailed):
            await bad.wait_closed()

        assert good.failed is None and good.durable_seq == 1
        good.append_nowait(r.Cancel())
        good.close_nowait()
        await good.wait_closed()
        stats = writer.statistics()
        assert stats.failed_logs == 1 and stats.open_logs == 0
    assert len(calls) == 3
    assert read_log(good.path).next_seq == 3


async def test_failed_write_fails_only_that_log_and_drops_its_queued_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_writer(tmp_path, inline_io=True) as writer:
        bad, good = writer.create("bad"), writer.create("good")
        real_write = os.write

        def write(fd: int, data: bytes) -> int:
            if fd == bad._fd:
                raise OSError(errno.ENOSPC, "injected")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
        bad.append_nowait(r.Cancel())
        await writer.flush()
        assert bad.failed is not None and bad.failed.errno == errno.ENOSPC
        assert not writer.healthy
        good.append_nowait(r.Cancel())
        await writer.flush()
        assert good.durable_seq == 0
    assert read_log(bad.path).records == []


async def test_records_queued_behind_a_failure_are_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def fdatasync(fd: int) -> None:
        entered.set()
        release.wait(10)
        raise OSError(errno.EIO, "injected")

    async with open_log_writer(tmp_path) as writer:
        log = writer.create("a")
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        log.append_nowait(r.Cancel())
        await trio.to_thread.run_sync(entered.wait, 10)  # the first batch is in its fdatasync
        log.append_nowait(r.Heartbeat())  # queued behind it
        release.set()
        await writer.flush()
        assert log.failed is not None
        stats = writer.statistics()
        assert (stats.records_written, stats.records_dropped, stats.queue_depth) == (0, 1, 0)
        assert stats.fsyncs == 0 and stats.failed_logs == 1


async def test_wait_for_room_returns_once_the_writer_takes_the_queued_records(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, max_queued=2, fsync=False) as writer:
        log = writer.create("a")
        log.append_nowait(r.Heartbeat())
        log.append_nowait(r.Heartbeat())
        with pytest.raises(LogBackpressure):
            log.append_nowait(r.Heartbeat())
        with trio.fail_after(5):
            await log.wait_for_room()  # woken by the writer, not by polling
        assert writer.statistics().queue_depth == 0
        log.append_nowait(r.Heartbeat())
        log.close_nowait()
        await log.wait_closed()
    assert read_log(log.path).next_seq == 3


async def test_full_queue_raises_backpressure_without_using_a_sequence_number(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, max_queued=4) as writer:
        log = writer.create("a")
        for _ in range(4):
            log.append_nowait(r.Heartbeat())
        assert writer.statistics().queue_depth == 4
        with pytest.raises(LogBackpressure):
            log.append_nowait(r.Heartbeat())
        assert log.next_seq == 4
        log.close_nowait()  # closes are never refused
        await log.wait_closed()
        assert writer.healthy
    assert read_log(log.path).next_seq == 4


async def test_create_refuses_an_existing_file_and_unsafe_names(tmp_path: Path) -> None:
    (tmp_path / "taken.dlog").write_bytes(b"old")
    async with open_log_writer(tmp_path) as writer:
        with pytest.raises(FileExistsError):
            writer.create("taken")
        for bad in ["", "../x", "a/b", ".hidden", "x" * 200]:
            with pytest.raises(ValueError, match="safe file name"):
                writer.create(bad)
    assert (tmp_path / "taken.dlog").read_bytes() == b"old"


async def test_closed_log_refuses_appends_and_close_is_idempotent(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path) as writer:
        log = writer.create("a")
        log.close_nowait()
        log.close_nowait()
        with pytest.raises(LogClosed):
            log.append_nowait(r.Cancel())
        await log.wait_closed()
        await log.wait_closed()
    assert read_log(log.path).records == []


async def test_shutdown_commits_queued_records_and_closes_open_logs(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path) as writer:
        log = writer.create("a")
        for i in range(3):
            log.append_nowait(step(i))
    assert log.closed and log.durable_seq == 2
    await log.wait_closed()
    with pytest.raises(LogClosed):
        log.append_nowait(r.Cancel())
    with pytest.raises(LogClosed):
        writer.create("b")
    assert [seq for seq, _ in read_log(log.path).records] == [0, 1, 2]


async def test_cancelled_writer_still_commits_what_was_queued(tmp_path: Path) -> None:
    with trio.CancelScope() as scope:
        async with open_log_writer(tmp_path) as writer:
            log = writer.create("a")
            log.append_nowait(r.Cancel())
            log.append_nowait(r.Heartbeat())
            scope.cancel()
            await trio.sleep_forever()
    assert read_log(log.path).records == [(0, r.Cancel()), (1, r.Heartbeat())]
    assert log.closed


async def test_a_writer_cancelled_while_its_batch_lingers_still_commits_it(tmp_path: Path) -> None:
    with trio.CancelScope() as scope:
        async with open_log_writer(tmp_path, linger_s=30.0) as writer:
            log = writer.create("a")
            for i in range(3):
                log.append_nowait(step(i))
            await trio.testing.wait_all_tasks_blocked()  # the writer took the log and lingers
            assert log.durable_seq == -1 and writer.statistics().batches == 0
            scope.cancel()
            await trio.sleep_forever()
    assert [seq for seq, _ in read_log(log.path).records] == [0, 1, 2]
    assert log.closed


async def test_inline_io_under_an_autojumping_mock_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_log_writer(tmp_path, inline_io=True) as writer:
        log = writer.create("a")
        for i in range(5):
            log.append_nowait(step(i))
            await trio.sleep(0.08)
        assert trio.current_time() >= 0.4
        assert log.durable_seq == 4 and writer.statistics().fsyncs == 5
        log.close_nowait()
        await log.wait_closed()
    assert len(read_log(log.path).records) == 5


async def test_statistics_are_an_immutable_snapshot_with_bounded_fsync_history(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, inline_io=True) as writer:
        log = writer.create("a")
        log.append_nowait(r.Cancel())
        await writer.flush()
        stats = writer.statistics()
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            stats.fsyncs = 0  # type: ignore[misc]
        log.append_nowait(r.Cancel())
        await writer.flush()
        assert stats.fsyncs == 1 and writer.statistics().fsyncs == 2
        assert writer._fsync_durations.maxlen == FSYNC_HISTORY


def test_fsync_percentile() -> None:
    stats = LogWriterStatistics(0, 0, 0, 0, 0, tuple(float(i) for i in range(1, 101)), 0, 1, 0, 0, 0)
    assert stats.fsync_percentile(50) == 50.0
    assert stats.fsync_percentile(99) == 99.0
    assert stats.fsync_percentile(100) == 100.0
    assert attrs.evolve(stats, fsync_durations_s=()).fsync_percentile(99) is None


async def test_failed_directory_fsync_fails_the_logs_created_since_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_log_writer(tmp_path) as writer:
        old = writer.create("old")
        old.append_nowait(r.Cancel())
        await writer.flush()
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "dir")))
        new = writer.create("new")
        new.append_nowait(r.Cancel())
        old.append_nowait(r.Cancel())
        await writer.flush()
        assert new.failed is not None and old.failed is None
        assert writer.failed_logs == 1 and not writer.healthy
        with pytest.raises(LogFailed):
            new.append_nowait(r.Cancel())


async def test_a_batch_nobody_waits_for_lingers_and_a_waiter_commits_it_at_once(tmp_path: Path) -> None:
    async with open_log_writer(tmp_path, linger_s=30.0) as writer:
        log = writer.create("a")
        for i in range(10):  # a trickle: each record alone on the queue for a moment
            seq = log.append_nowait(step(i))
            await trio.sleep(0)
        assert log.durable_seq == -1 and writer.statistics().batches == 0  # lingering
        with trio.fail_after(10):  # far less than the linger: the waiter made it commit
            await log.wait_durable(seq)
        stats = writer.statistics()
        assert (stats.batches, stats.records_written) == (1, 10)
        log.append_nowait(r.Heartbeat())
        log.close_nowait()  # a close does not linger either
        with trio.fail_after(10):
            await log.wait_closed()
    assert len(read_log(log.path).records) == 11
