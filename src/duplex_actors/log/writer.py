"""The log writer actor: one task per process that writes every session's log with group commit.

Sessions never wait for the disk. :meth:`SessionLog.append_nowait` numbers a record and queues it
with its log's other pending records (the log itself waits in the writer's queue, once), encoded,
except every frame's two records, which wait as themselves for the commit to encode; the writer
task takes everything queued, joins each file's records, writes them with plain
``os.write`` and then calls ``os.fdatasync`` once per file for the whole batch, in worker threads,
never on the event loop. Policies:

* **Bounded queue.** At most ``max_queued`` records wait; one more raises :class:`LogBackpressure` and
  the record is not logged (its sequence number is not used); :meth:`SessionLog.wait_for_room` waits
  until the writer has taken queued records. ``writer.statistics().queue_depth`` is the metric.
  Closes and flushes are never refused.
* **A failed write or fsync is fatal for that log.** The error is kept in ``log.failed``, later appends
  raise :class:`LogFailed`, nothing is retried (after a failed fsync the kernel may already have
  dropped the dirty pages, so a retry that succeeds would lie), and ``writer.healthy`` turns False
  so the server stops admitting sessions. So does a log file that cannot be created.
* **The dir is re-probed.** While unhealthy, every ``probe_interval_s`` the writer writes, fsyncs
  and removes a small file in the log dir (:func:`probe_dir`); once one works with no failure
  reported meanwhile, ``healthy`` is True again (``log.health`` decides). Logs that failed stay failed.
* **Durability is observable.** :meth:`SessionLog.wait_durable` returns once a record is committed,
  so a caller can hold an acknowledgement back until then.
* **Commits linger.** A batch whose records nobody waits for is committed ``linger_s`` (0.2 s,
  ``serve --log-commit-linger``) after its first record, so a trickle of small records (a storm
  of tiny appends, many sessions' frames) costs one commit, one hop into a worker thread and back
  and one fdatasync per file, per ``linger_s``, not one per record. Anything that waits
  (``wait_durable``, a close, a flush, a queue half full, ``wait_for_room``) commits at once.
* **Live logs are locked.** Each open log file holds a shared ``flock`` for as long as the writer
  has it open; retention (``log.retention``) skips a file whose lock it cannot take.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import attrs
import trio

from duplex_actors.log.health import LogDirHealth, Transition
from duplex_actors.log.records import Record, frame_record
from duplex_actors.log.segment import MAGIC, SUFFIX, encode_record

FSYNC_HISTORY: Final = 4096
_SESSION_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PROBE_PREFIX: Final = ".probe-"

log = logging.getLogger(__name__)


def _create_file(path: Path) -> int:
    """Create ``path`` (it must not exist) for appending; the one place log files are made, so
    fault injection (``DUPLEX_FAULTS=log_create_error``) can replace it."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)


def probe_dir(log_dir: Path) -> OSError | None:
    """Write, fdatasync and remove a small file in ``log_dir``; the error, or None if it worked."""
    path = log_dir / f"{PROBE_PREFIX}{os.getpid()}"
    path.unlink(missing_ok=True)  # left by a probe that failed half-way
    try:
        fd = _create_file(path)
        try:
            data = memoryview(b"duplex-actors log dir probe\n")
            while data:
                data = data[os.write(fd, data) :]
            os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    return None


class LogBackpressure(Exception):
    """The writer's queue is full: the record was not logged."""


class LogFailed(Exception):
    """The log had a write or fsync error; its ``__cause__`` is the OSError."""


class LogClosed(Exception):
    """The log was closed (or its writer shut down): it takes no more records."""


@attrs.frozen(slots=True)
class LogWriterStatistics:
    """A snapshot of the writer's counters (``fsync_durations_s``: the last 4096, oldest first)."""

    records_written: int
    bytes_written: int
    batches: int
    fsyncs: int
    dir_fsyncs: int
    fsync_durations_s: tuple[float, ...]
    queue_depth: int
    max_queued: int
    open_logs: int
    failed_logs: int
    records_dropped: int
    dir_available: bool = True
    dir_probe_failures: int = 0
    dir_recoveries: int = 0

    def fsync_percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100, nearest rank) of the recorded fsync durations, in seconds."""
        if not self.fsync_durations_s:
            return None
        ordered = sorted(self.fsync_durations_s)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[min(rank, len(ordered)) - 1]


class SessionLog:
    """The handle of one session's log file; made by :meth:`LogWriter.create`."""

    def __init__(self, writer: LogWriter, session_id: str, path: Path, fd: int) -> None:
        self.session_id: Final = session_id
        self.path: Final = path
        self._writer = writer
        self._fd = fd
        self._next_seq = 0
        self._durable_seq = -1
        # Set (and replaced) when durable_seq moves or the log ends, while somebody waits on it.
        self._durable = trio.Event()
        # Records queued and not yet taken by a commit, each encoded or (a frame's) as itself;
        # the log is in the writer's queue while there are any (once: a commit takes a log's
        # records together, with one join).
        self._pending: list[bytes | Record] = []
        self._pending_last_seq = -1
        self._closing = False
        self._closed = trio.Event()
        self.failed: OSError | None = None
        """The write or fsync error that ended this log, if any."""

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record gets."""
        return self._next_seq

    @property
    def durable_seq(self) -> int:
        """The last sequence number written (and fsynced, with ``fsync=True``); -1 before any."""
        return self._durable_seq

    @property
    def closed(self) -> bool:
        """True once the file is closed (after :meth:`close_nowait`, or at writer shutdown)."""
        return self._closed.is_set()

    def append_nowait(self, record: Record) -> int:
        """Queue ``record`` under the next sequence number and return that number.

        Raises :class:`LogFailed`, :class:`LogClosed` or :class:`LogBackpressure`; in each case
        nothing was queued and the sequence number stays unused.
        """
        self._check_open()
        seq = self._next_seq
        # Every frame's two records wait as themselves and the commit encodes them, every
        # session's in a row (_frames): a frame's own path, which runs during the clients'
        # burst, stays short. Any other record is encoded now, so that what cannot be encoded
        # raises here.
        self._writer._enqueue_record(
            self, seq, record if frame_record(record) else encode_record(seq, record)
        )
        self._next_seq = seq + 1
        return seq

    def room_for(self, records: int) -> bool:
        """Whether :meth:`append_nowait` takes ``records`` more records now: the log open, and
        room for them in the writer's queue."""
        writer = self._writer
        return (
            self.failed is None
            and not self._closing
            and not writer._shut_down
            and writer._queued + records <= writer._max_queued
        )

    def close_nowait(self) -> None:
        """Queue the close of this log after its appended records; idempotent, never refused."""
        if self._closing:
            return
        self._closing = True
        self._writer._enqueue(_Close(self))
        self._writer._urgent.set()

    async def wait_for_room(self) -> None:
        """Return once the writer's queue has room for a record, or the writer is shut down
        (the next :meth:`append_nowait` then says why it cannot take one)."""
        await self._writer._wait_for_room()

    async def wait_durable(self, seq: int) -> None:
        """Return once record ``seq`` is written (and fsynced, with ``fsync=True``).

        Raises :class:`LogFailed` if the log failed first, :class:`LogClosed` if it ended without
        that record (the writer shut down).
        """
        while self._durable_seq < seq:
            self._raise_if_failed()
            if self.closed:
                raise LogClosed(f"session log {self.session_id} closed before record {seq}")
            self._writer._urgent.set()
            await self._durable.wait()
        await trio.lowlevel.checkpoint()

    def _durable_moved(self) -> None:
        # Nobody parks on the event without checking durable_seq first: unwaited, it stays.
        if self._durable.statistics().tasks_waiting:
            self._durable.set()
            self._durable = trio.Event()

    def _take_pending(self) -> tuple[list[bytes | Record], int]:
        """The records queued so far and the last one's sequence number; none are left."""
        pending, self._pending = self._pending, []
        return pending, self._pending_last_seq

    async def wait_closed(self) -> None:
        """Return once every appended record is written (and fsynced) and the file is closed.

        Raises :class:`LogFailed` if the log failed, since its records are then not all on disk.
        """
        await self._closed.wait()
        self._raise_if_failed()

    def _check_open(self) -> None:
        self._raise_if_failed()
        if self._closing or self._writer._shut_down:
            raise LogClosed(f"session log {self.session_id} is closed")

    def _raise_if_failed(self) -> None:
        if self.failed is not None:
            raise LogFailed(f"session log {self.session_id} failed: {self.failed}") from self.failed

    def __repr__(self) -> str:
        state = "failed" if self.failed else "closed" if self.closed else "open"
        return f"<SessionLog {self.session_id} {state} next_seq={self._next_seq}>"


@attrs.frozen(slots=True)
class _Close:
    log: SessionLog


@attrs.frozen(slots=True)
class _Flush:
    done: trio.Event


# A log in the queue stands for its pending records (SessionLog._pending).
_Request = SessionLog | _Close | _Flush


@attrs.define(slots=True)
class _FileJob:
    """One file's share of a batch; filled in by :func:`_run_job` in a worker thread."""

    log: SessionLog
    fd: int
    data: bytes
    last_seq: int
    records: int
    close: bool
    fsync: bool
    error: OSError | None = None
    fsync_s: float | None = None


# A commit fdatasyncs every file in it, and the kernel's time in fdatasync is the front end's CPU
# too: commits linger long enough for a session's frames over several ticks to share one
# (BENCHMARKS.md, "Front-end ceiling"). What a crash can lose is records nobody waited for:
# nothing acknowledged ever lingers.
COMMIT_LINGER_S: Final = 0.2
# A commit encodes a frame's records (SessionLog.append_nowait), up to about a millisecond of
# them between checkpoints: many sessions' records over a long linger never hold a tick's
# burst back for longer.
ENCODE_SLICE: Final = 256


def _frames(pending: list[bytes | Record], first_seq: int) -> bytes:
    """A log's pending records as the bytes of their frames; those queued as records
    (:func:`~duplex_actors.log.records.frame_record`) are encoded here, with sequence numbers
    on from ``first_seq``."""
    return b"".join(
        [
            item if isinstance(item, bytes) else encode_record(seq, item)
            for seq, item in enumerate(pending, first_seq)
        ]
    )


def _run_job(job: _FileJob) -> None:
    if job.data:
        try:
            view = memoryview(job.data)
            while view:
                view = view[os.write(job.fd, view) :]
            if job.fsync:
                t0 = time.perf_counter()
                os.fdatasync(job.fd)
                job.fsync_s = time.perf_counter() - t0
        except OSError as exc:
            job.error = exc
    if job.close or job.error is not None:
        try:
            os.close(job.fd)
        except OSError as exc:
            job.error = job.error or exc


def _run_jobs(jobs: Sequence[_FileJob]) -> None:
    for job in jobs:
        _run_job(job)


def _fsync_dir(fd: int) -> OSError | None:
    try:
        os.fsync(fd)
    except OSError as exc:
        return exc
    return None


class LogWriter:
    """Owns the queue of log writes and the task that commits them; see :func:`open_log_writer`."""

    def __init__(
        self,
        log_dir: Path,
        *,
        fsync: bool,
        inline_io: bool,
        max_queued: int,
        io_threads: int,
        on_failure: Callable[[SessionLog, OSError], None] | None,
        probe_interval_s: float = 5.0,
        linger_s: float = 0.0,
    ) -> None:
        if max_queued < 1 or io_threads < 1:
            raise ValueError("max_queued and io_threads must be at least 1")
        if not probe_interval_s > 0:
            raise ValueError("probe_interval_s must be positive")
        if not linger_s >= 0:
            raise ValueError("linger_s must not be negative")
        self.log_dir: Final = log_dir
        self._fsync = fsync
        self._inline_io = inline_io
        self._max_queued = max_queued
        self._io_threads = io_threads
        self._on_failure = on_failure
        # The requests for the writer's task: unbounded, but bounded by ``_queued`` records
        # (closes and flushes must never be refused). A deque and a parking lot, not a memory
        # channel: every frame queues two records, and the channel's send costs several times more.
        self._requests: collections.deque[_Request] = collections.deque()
        self._request_came = trio.lowlevel.ParkingLot()
        self._queued = 0
        self._room = trio.Event()  # set (and replaced) whenever queued records are taken
        # With inline I/O (virtual time) there is no thread hop to save: commit at once.
        self._linger_s = 0.0 if inline_io else linger_s
        self._urgent = trio.Event()  # set: somebody waits for the next commit; no lingering
        self._shut_down = False
        self._open: set[SessionLog] = set()
        self._created_since_dir_sync: list[SessionLog] = []
        self._dir_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._records_written = 0
        self._bytes_written = 0
        self._batches = 0
        self._fsyncs = 0
        self._dir_fsyncs = 0
        self._fsync_durations: collections.deque[float] = collections.deque(maxlen=FSYNC_HISTORY)
        self._failed_logs = 0
        self._records_dropped = 0
        self._health = LogDirHealth()
        self._probe_interval_s = probe_interval_s
        self._unavailable = trio.Event()  # set while the dir is unavailable: wakes the probe loop
        self._probe_scope = trio.CancelScope()

    @property
    def healthy(self) -> bool:
        """False from a log's failure (or a file that could not be created) until a probe of the
        log dir works again: stop admitting sessions meanwhile."""
        return self._health.available

    @property
    def last_error(self) -> str | None:
        """The last write, fsync, create or probe error of the log dir, if any."""
        return self._health.last_error

    @property
    def failed_logs(self) -> int:
        return self._failed_logs

    def statistics(self) -> LogWriterStatistics:
        return LogWriterStatistics(
            records_written=self._records_written,
            bytes_written=self._bytes_written,
            batches=self._batches,
            fsyncs=self._fsyncs,
            dir_fsyncs=self._dir_fsyncs,
            fsync_durations_s=tuple(self._fsync_durations),
            queue_depth=self._queued,
            max_queued=self._max_queued,
            open_logs=len(self._open),
            failed_logs=self._failed_logs,
            records_dropped=self._records_dropped,
            dir_available=self._health.available,
            dir_probe_failures=self._health.probe_failures,
            dir_recoveries=self._health.recoveries,
        )

    def path_for(self, session_id: str) -> Path:
        if not _SESSION_ID.fullmatch(session_id):
            raise ValueError(f"session id {session_id!r} is not a safe file name")
        return self.log_dir / f"{session_id}{SUFFIX}"

    def create(self, session_id: str) -> SessionLog:
        """Create ``<session_id>.dlog`` (it must not exist: FileExistsError) and return its handle.

        Any other OSError (a full or unwritable dir) counts as a failed log: ``healthy`` turns
        False until a probe works again; the error is raised.
        """
        if self._shut_down:
            raise LogClosed("the log writer is shut down")
        path = self.path_for(session_id)
        # The open and the 8-byte magic only touch the page cache; durability comes with the first batch.
        try:
            fd = _create_file(path)
        except FileExistsError:
            raise
        except OSError as exc:
            self._failed_logs += 1
            self._note_failure(exc, f"creating {path.name}")
            raise
        try:
            if os.write(fd, MAGIC) != len(MAGIC):
                raise OSError(f"short write of the magic to {path}")
        except BaseException as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                self._failed_logs += 1
                self._note_failure(exc, f"writing {path.name}")
            raise
        # Retention never deletes a file whose lock it cannot take (this process's or another's).
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        log = SessionLog(self, session_id, path, fd)
        self._open.add(log)
        self._created_since_dir_sync.append(log)
        return log

    async def flush(self) -> None:
        """Return once everything queued before this call is written (and fsynced) or has failed.

        Failures are not raised here: see each log's ``failed`` and :attr:`healthy`.
        """
        done = trio.Event()
        self._enqueue(_Flush(done))
        self._urgent.set()
        await done.wait()

    async def _wait_for_room(self) -> None:
        if self._queued < self._max_queued or self._shut_down:
            await trio.lowlevel.checkpoint()
            return
        self._urgent.set()
        while self._queued >= self._max_queued and not self._shut_down:
            await self._room.wait()

    def _room_made(self) -> None:
        self._room.set()
        self._room = trio.Event()

    def _enqueue_record(self, log: SessionLog, seq: int, data: bytes | Record) -> None:
        if self._queued >= self._max_queued:
            raise LogBackpressure(f"log writer queue full ({self._max_queued} records)")
        if not log._pending:
            self._enqueue(log)
        log._pending.append(data)
        log._pending_last_seq = seq
        self._queued += 1
        if 2 * self._queued >= self._max_queued:
            self._urgent.set()

    def _enqueue(self, request: _Request) -> None:
        if self._shut_down:
            raise LogClosed("the log writer is shut down")
        self._requests.append(request)
        if self._request_came:
            self._request_came.unpark()

    async def _next_request(self) -> _Request | None:
        """The next request, waiting for one; None once shut down with none left. A checkpoint
        either way, as a memory channel's ``receive`` is."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._requests:
            await trio.lowlevel.cancel_shielded_checkpoint()
        while not self._requests:
            if self._shut_down:
                return None
            await self._request_came.park()
        return self._requests.popleft()

    async def _run(self) -> None:
        first: _Request | None = None  # taken off the queue, not yet in a batch
        try:
            while (first := await self._next_request()) is not None:
                if self._linger_s > 0 and not self._urgent.is_set():
                    with trio.move_on_after(self._linger_s):
                        await self._urgent.wait()
                batch = [first, *self._take_queued()]
                first = None
                # Whoever set it waits for a record of this batch; later waiters set it again.
                if self._urgent.is_set():
                    self._urgent = trio.Event()
                # A batch taken off the queue is always finished: its records exist nowhere else.
                with trio.CancelScope(shield=True):
                    await self._commit(batch)
        finally:
            # Shutdown, even by cancellation: commit what is queued (bounded by max_queued), then
            # close every file.
            with trio.CancelScope(shield=True):
                self._shutdown()
                rest = self._take_queued()
                if first is not None:  # cancelled while it lingered
                    rest.insert(0, first)
                if rest:
                    await self._commit(rest)
                await self._close_remaining()

    def _take_queued(self) -> list[_Request]:
        taken = list(self._requests)
        self._requests.clear()
        return taken

    async def _commit(self, batch: list[_Request]) -> None:
        jobs: dict[SessionLog, _FileJob] = {}
        flushes: list[trio.Event] = []
        encoded = 0
        for request in batch:
            if isinstance(request, _Flush):
                flushes.append(request.done)
                continue
            if isinstance(request, _Close):
                log, pending, last_seq = request.log, None, -1
            else:
                log = request
                pending, last_seq = log._take_pending()
                self._queued -= len(pending)
            if log.failed is not None or log.closed:
                if pending:
                    self._records_dropped += len(pending)
                continue
            job = jobs.get(log)
            if job is None:
                job = jobs[log] = _FileJob(log, log._fd, b"", -1, 0, close=False, fsync=self._fsync)
            if pending is None:
                job.close = True
            elif pending:  # a log is queued once until a commit takes its records
                job.data = _frames(pending, last_seq - len(pending) + 1)
                job.last_seq = last_seq
                job.records += len(pending)
                encoded += len(pending)
                if encoded >= ENCODE_SLICE:
                    # Records appended meanwhile wait for the next commit (in order).
                    encoded = 0
                    await trio.lowlevel.checkpoint()
        self._room_made()
        if any(job.data for job in jobs.values()):
            self._batches += 1
        await self._execute(list(jobs.values()))
        for done in flushes:
            done.set()

    async def _execute(self, jobs: list[_FileJob]) -> None:
        # New files' directory entries are made durable with the first batch after their creation.
        created, self._created_since_dir_sync = self._created_since_dir_sync, []
        sync_dir = self._fsync and bool(created)
        dir_error = await self._io(jobs, sync_dir=sync_dir)
        for job in jobs:
            self._settle(job)
        if dir_error is not None:
            for log in created:
                self._fail(log, dir_error)
        elif sync_dir:
            self._dir_fsyncs += 1

    async def _io(self, jobs: list[_FileJob], *, sync_dir: bool) -> OSError | None:
        if self._inline_io:
            _run_jobs(jobs)
            return _fsync_dir(self._dir_fd) if sync_dir else None
        dir_error: OSError | None = None
        # Files go to up to ``io_threads`` threads: concurrent fdatasyncs can share a journal commit.
        groups = [jobs[i :: self._io_threads] for i in range(min(self._io_threads, len(jobs)))]
        if len(groups) == 1 and not sync_dir:  # the common batch: one hop, no nursery
            await trio.to_thread.run_sync(_run_jobs, groups[0])
            return None

        async def run_group(group: list[_FileJob]) -> None:
            await trio.to_thread.run_sync(_run_jobs, group)

        async def sync_directory() -> None:
            nonlocal dir_error
            dir_error = await trio.to_thread.run_sync(_fsync_dir, self._dir_fd)

        async with trio.open_nursery() as nursery:
            for group in groups:
                nursery.start_soon(run_group, group)
            if sync_dir:
                nursery.start_soon(sync_directory)
        return dir_error

    def _settle(self, job: _FileJob) -> None:
        log = job.log
        if job.close or job.error is not None:
            log._fd = -1  # _run_job closed it
        if job.error is not None:
            self._fail(log, job.error)
            return
        if job.records:
            self._records_written += job.records
            self._bytes_written += len(job.data)
            log._durable_seq = job.last_seq
            log._durable_moved()
        if job.fsync_s is not None:
            self._fsyncs += 1
            self._fsync_durations.append(job.fsync_s)
        if job.close:
            self._open.discard(log)
            log._closed.set()
            log._durable_moved()

    def _fail(self, log: SessionLog, error: OSError) -> None:
        if log.failed is not None:
            return
        log.failed = error
        self._failed_logs += 1
        if log._fd >= 0:
            fd, log._fd = log._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
        # A failed log holds no file any more: wait_closed() returns (by raising LogFailed).
        self._open.discard(log)
        log._closed.set()
        log._durable_moved()
        self._note_failure(error, f"session log {log.session_id}")
        if self._on_failure is not None:
            self._on_failure(log, error)

    def _note_failure(self, error: OSError, what: str) -> None:
        if self._health.failed(error) is Transition.UNAVAILABLE:
            self._unavailable.set()
            log.error(
                "log dir %s unavailable (%s: %s): not admitting sessions; re-probing every %g s",
                self.log_dir,
                what,
                error,
                self._probe_interval_s,
            )

    async def _probe_loop(self) -> None:
        """While the dir is unavailable, probe it every ``probe_interval_s``; reopen on success."""
        with self._probe_scope:
            while True:
                await self._unavailable.wait()
                await trio.sleep(self._probe_interval_s)
                token = self._health.probe_started()
                if self._inline_io:
                    error = probe_dir(self.log_dir)
                else:
                    error = await trio.to_thread.run_sync(probe_dir, self.log_dir)
                if self._health.probed(token, error) is Transition.AVAILABLE:
                    self._unavailable = trio.Event()
                    log.warning(
                        "log dir %s writable again (probe: write + fdatasync + remove): admitting sessions",
                        self.log_dir,
                    )
                elif error is not None:
                    log.debug("log dir %s: probe failed: %s", self.log_dir, error)

    async def _close_remaining(self) -> None:
        """At shutdown: close the files of logs nobody closed (their records are all written)."""
        await self._execute(
            [_FileJob(log, log._fd, b"", -1, 0, close=True, fsync=False) for log in self._open]
        )
        os.close(self._dir_fd)

    def _shutdown(self) -> None:
        self._shut_down = True
        self._probe_scope.cancel()
        self._request_came.unpark_all()
        self._urgent.set()
        self._room_made()  # nobody waits for room in a queue that takes no more


@asynccontextmanager
async def open_log_writer(
    log_dir: str | os.PathLike[str],
    *,
    fsync: bool = True,
    inline_io: bool = False,
    max_queued: int = 4096,
    io_threads: int = 4,
    on_failure: Callable[[SessionLog, OSError], None] | None = None,
    probe_interval_s: float = 5.0,
    linger_s: float = COMMIT_LINGER_S,
) -> AsyncIterator[LogWriter]:
    """Run a :class:`LogWriter` for the body of the ``async with``; one per process.

    ``fsync=False`` skips fdatasync (tests and benchmarks of the framing only). ``inline_io=True``
    does the I/O on the event loop instead of in worker threads, for tests under an autojumping
    ``MockClock`` (which jumps while a thread works). ``on_failure(log, error)`` is called from the
    writer task when a log fails; it must not raise. On exit everything queued is committed and
    every file still open is closed; appends after that raise :class:`LogClosed`.
    ``probe_interval_s``: how often an unavailable log dir is probed. ``linger_s``: how long a
    batch nobody waits for gathers records before its commit (0 with ``inline_io``).
    """
    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    writer = LogWriter(
        path,
        fsync=fsync,
        inline_io=inline_io,
        max_queued=max_queued,
        io_threads=io_threads,
        on_failure=on_failure,
        probe_interval_s=probe_interval_s,
        linger_s=linger_s,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer._run)
        nursery.start_soon(writer._probe_loop)
        try:
            yield writer
        finally:
            writer._shutdown()
