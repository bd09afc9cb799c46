"""The Opus codec of every ``/api/chat`` session, run in worker processes (the trio shell).

sphn holds the GIL for the whole of an encode (~1 ms of CPU per session per 80 ms frame), so the
codec runs neither on the event loop nor in a thread of the server process: each worker is a
``python -m duplex_actors.opus.worker`` process that owns the codec state of the streams assigned
to it and talks to the server over its pipes (:mod:`.wire`).

::

    async with open_opus_pool(workers=2) as pool:
        stream = await pool.open_stream()          # on the least-loaded worker
        pcm = await stream.decode(ogg_bytes)       # float32 mono 24 kHz, maybe empty
        await stream.discard(ogg_bytes)            # validated and consumed, audio dropped
        pages = await stream.encode(pcm_1920)      # whole Ogg pages (headers first)
        await stream.aclose()
        pool.stats()                               # per-worker sessions, restarts, CPU (/metrics)

In the server, ``await server.get_opus_pool()`` (:class:`~duplex_actors.server.DuplexServer`)
starts the pool on first use, sized by ``--opus-workers`` / ``DUPLEX_OPUS_WORKERS`` (default
:func:`default_opus_workers`), and stops it with the server; ``server.opus_pool`` is None until
then (``/metrics`` shows ``duplex_opus_*`` once it runs).

- One op in flight per stream: concurrent calls on one stream (the dialect's receive task
  decoding, its send task encoding) are served one after the other, in arrival order.
- Bounded queues: a worker has at most ``queue_depth`` requests outstanding (written to its pipe
  and not yet answered); further calls wait (backpressure on the calling session's task).
- ``decode``/``discard`` raise :class:`~.codec.OpusUndecodable` (``bad_audio``) on malformed Ogg;
  the stream's decoder then stays failed.
- A worker that dies (EOF on its stdout) fails every stream it owned: their pending and later
  calls raise :class:`CodecWorkerLost` (``internal_error``). The pool starts a new worker in its
  place for new streams; the streams of other workers are untouched.
- Cancelling a call is safe: the request stays queued in the worker and its answer is dropped.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import trio

from ..error_codes import INTERNAL_ERROR, CodedError
from . import wire
from .codec import OpusUndecodable

__all__ = [
    "CodecWorkerLost",
    "OpusCodecFailed",
    "OpusPool",
    "OpusPoolStats",
    "OpusPoolUnavailable",
    "OpusStream",
    "OpusUndecodable",
    "OpusWorkerStats",
    "default_opus_workers",
    "open_opus_pool",
]

log = logging.getLogger(__name__)

WORKER_COMMAND = (sys.executable, "-m", "duplex_actors.opus.worker")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 2.0
RESTART_BACKOFF_S = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)


def default_opus_workers() -> int:
    """Half the CPUs this process may use, 1 to 4 (the model and the event loop need the rest)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 2
    return max(1, min(4, cpus // 2))


class OpusPoolUnavailable(CodedError):
    """The codec worker processes could not be started (the dialect: 1011)."""

    code = INTERNAL_ERROR


class CodecWorkerLost(CodedError):
    """The worker process that held this stream died; the stream is unusable (dialect: 1011)."""

    code = INTERNAL_ERROR


class OpusCodecFailed(CodedError):
    """The worker could not run an op for a reason other than bad input audio (a bug)."""

    code = INTERNAL_ERROR


@attrs.frozen(slots=True)
class OpusWorkerStats:
    index: int
    pid: int | None
    alive: bool
    sessions: int
    in_flight: int
    peak_in_flight: int


@attrs.frozen(slots=True)
class OpusPoolStats:
    workers: tuple[OpusWorkerStats, ...]
    restarts: int
    queue_depth: int
    ops: tuple[tuple[str, int], ...]  # (op, count) answered
    codec_seconds: tuple[tuple[str, float], ...]  # (op, worker CPU seconds)
    streams_lost: int


class _Call:
    __slots__ = ("done", "error", "op", "payload", "status")

    def __init__(self, op: str) -> None:
        self.op = op
        self.done = trio.Event()
        self.status = wire.OK
        self.payload = bytearray()
        self.error: BaseException | None = None


class _ByteReader:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._pos = 0  # consumed prefix, dropped only before the next read (no memmove per frame)

    async def read_exact(self, n: int) -> bytearray | None:
        """``n`` bytes, or None at EOF."""
        while len(self._buffer) - self._pos < n:
            if self._pos:
                del self._buffer[: self._pos]
                self._pos = 0
            chunk = await self._stream.receive_some(max(65536, n - len(self._buffer)))
            if not chunk:
                return None
            self._buffer += chunk
        out = self._buffer[self._pos : self._pos + n]
        self._pos += n
        return out


class _Worker:
    def __init__(self, index: int, process: trio.Process, queue_depth: int) -> None:
        self.index = index
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.reader = _ByteReader(process.stdout)
        self.slots = trio.Semaphore(queue_depth)
        self.pending: dict[int, _Call] = {}
        self.streams: set[OpusStream] = set()
        self.alive = True
        self.peak_in_flight = 0
        self.requests_in, self.requests_out = trio.open_memory_channel[bytes](math.inf)

    @property
    def pid(self) -> int:
        return self.process.pid


class OpusStream:
    """One session's codec state, in one worker: an Ogg/Opus decoder in, an encoder out."""

    def __init__(self, pool: OpusPool, worker: _Worker, stream_id: int) -> None:
        self._pool = pool
        self._worker = worker
        self.stream_id = stream_id
        self._lock = trio.Lock()
        self.lost: CodecWorkerLost | None = None
        self.closed = False

    @property
    def worker_index(self) -> int:
        return self._worker.index

    @property
    def worker_pid(self) -> int:
        return self._worker.pid

    async def decode(self, data: bytes) -> npt.NDArray[np.float32]:
        """The float32 mono 24 kHz samples of the Ogg pages ``data`` completes (maybe empty)."""
        payload = await self._call(wire.DECODE, bytes(data))
        return np.frombuffer(payload, dtype=np.float32)

    async def discard(self, data: bytes) -> None:
        """Validate and consume ``data`` (its headers count), decoding no audio: pre-handshake input."""
        await self._call(wire.DISCARD, bytes(data))

    async def encode(self, pcm: npt.ArrayLike) -> bytes:
        """Float32 mono 24 kHz samples (1920 = 80 ms) -> whole Ogg pages (headers first)."""
        samples = np.ascontiguousarray(pcm, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono samples (1-D), got shape {samples.shape}")
        return bytes(await self._call(wire.ENCODE, samples.tobytes()))

    async def aclose(self) -> None:
        """Free the stream's state in its worker (idempotent; never blocks on the worker)."""
        if self.closed:
            return
        self.closed = True
        self._pool._release(self)

    async def __aenter__(self) -> OpusStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, op: int, payload: bytes) -> bytearray:
        async with self._lock:
            if self.closed:
                raise trio.ClosedResourceError("the Opus stream is closed")
            if self.lost is not None:
                raise self.lost
            return await self._pool._request(self._worker, self, op, payload)


class OpusPool:
    """Made by :func:`open_opus_pool`; see the module docstring."""

    def __init__(self, workers: int, queue_depth: int) -> None:
        if workers < 1:
            raise ValueError("an Opus pool needs at least one worker")
        if queue_depth < 1:
            raise ValueError("queue_depth must be at least 1")
        self.size = workers
        self.queue_depth = queue_depth
        self._workers: list[_Worker | None] = [None] * workers
        self._changed = trio.Event()
        self._last_id = 0
        self._stream_ids = itertools.count(1)
        self.restarts = 0
        self.streams_lost = 0
        self._ops: dict[str, int] = dict.fromkeys(("decode", "discard", "encode"), 0)
        self._cpu: dict[str, float] = dict.fromkeys(("decode", "discard", "encode"), 0.0)
        self.closing = False

    # -- public ----------------------------------------------------------------------------------
    async def open_stream(self) -> OpusStream:
        """A new stream on the live worker with the fewest streams (waits while all restart)."""
        while True:
            if self.closing:
                raise trio.ClosedResourceError("the Opus pool is closed")
            live = [w for w in self._workers if w is not None and w.alive]
            if live:
                worker = min(live, key=lambda w: (len(w.streams), w.index))
                stream = OpusStream(self, worker, next(self._stream_ids))
                worker.streams.add(stream)
                return stream
            await self._changed.wait()

    def stats(self) -> OpusPoolStats:
        rows = []
        for index, worker in enumerate(self._workers):
            if worker is None:
                rows.append(OpusWorkerStats(index, None, False, 0, 0, 0))
            else:
                rows.append(
                    OpusWorkerStats(
                        index,
                        worker.pid,
                        worker.alive,
                        len(worker.streams),
                        len(worker.pending),
                        worker.peak_in_flight,
                    )
                )
        return OpusPoolStats(
            workers=tuple(rows),
            restarts=self.restarts,
            queue_depth=self.queue_depth,
            ops=tuple(sorted(self._ops.items())),
            codec_seconds=tuple(sorted(self._cpu.items())),
            streams_lost=self.streams_lost,
        )

    async def wait_workers(self) -> None:
        """Return once every worker is running (e.g. after a restart)."""
        while not all(w is not None and w.alive for w in self._workers):
            if self.closing:
                raise trio.ClosedResourceError("the Opus pool is closed")
            await self._changed.wait()

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w is not None and w.alive]

    # -- workers ---------------------------------------------------------------------------------
    async def _launch(self, index: int) -> _Worker:
        process = await trio.lowlevel.open_process(
            list(WORKER_COMMAND), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env()
        )
        return _Worker(index, process, self.queue_depth)

    async def _ready(self, worker: _Worker) -> None:
        """Wait for the worker's ready frame (its imports done); kill it on failure."""
        try:
            with trio.fail_after(START_TIMEOUT_S):
                header = await worker.reader.read_exact(wire.RESPONSE.size)
                if header is None:
                    raise RuntimeError(f"Opus worker {worker.index} exited before it was ready")
                request_id, _, _, length = wire.RESPONSE.unpack(header)
                if request_id != wire.READY_ID or await worker.reader.read_exact(length) is None:
                    raise RuntimeError(f"Opus worker {worker.index} sent no ready frame")
        except BaseException:
            with trio.CancelScope(shield=True):
                await _stop_process(worker.process, kill=True)
            raise

    async def _spawn(self, index: int) -> _Worker:
        worker = await self._launch(index)
        await self._ready(worker)
        return worker

    async def _run_worker(self, worker: _Worker) -> None:
        """Serve ``worker``; when it dies, fail its streams and start another in its place."""
        index = worker.index
        failures = 0
        first = True
        while not self.closing:
            if not first:
                try:
                    worker = await self._spawn(index)
                except (OSError, RuntimeError, trio.TooSlowError) as exc:
                    failures += 1
                    log.error("Opus worker %d failed to start (%s); retrying", index, exc)
                    await trio.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
                    continue
                if self.closing:  # the pool closed while this one started
                    with trio.CancelScope(shield=True):
                        await _stop_process(worker.process, kill=True)
                    return
                log.warning("Opus worker %d restarted (pid %d)", index, worker.pid)
            first = False
            self._workers[index] = worker
            self._wake()
            failures = 0
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write, worker)
                    await self._read(worker)
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    self._lose(worker)
                    await _stop_process(worker.process, kill=not self.closing)
            if self.closing:
                return
            self.restarts += 1
            log.error(
                "Opus worker %d (pid %d) died (exit %s); its sessions end, a new one starts",
                index,
                worker.pid,
                worker.process.returncode,
            )

    async def _write(self, worker: _Worker) -> None:
        ended = False
        async with worker.requests_out:
            async for frame in worker.requests_out:
                # Coalesce what is queued into one write: one syscall (and one trio wait) for
                # the requests of every session that asked in the same tick.
                batch = [frame]
                while True:
                    try:
                        batch.append(worker.requests_out.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        ended = True
                        break
                try:
                    await worker.stdin.send_all(batch[0] if len(batch) == 1 else b"".join(batch))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the reader sees the EOF and fails the worker
                if ended:
                    break
        # The pool is closing (or the worker was lost): EOF on stdin ends the worker.
        with trio.CancelScope(shield=True):
            await worker.stdin.aclose()

    async def _read(self, worker: _Worker) -> None:
        while True:
            header = await worker.reader.read_exact(wire.RESPONSE.size)
            if header is None:
                return
            request_id, status, cpu_s, length = wire.RESPONSE.unpack(header)
            payload = await worker.reader.read_exact(length) if length else bytearray()
            if payload is None:
                return
            call = worker.pending.pop(request_id, None)
            if call is None:  # cancelled calls stay pending, so this is a broken protocol
                log.error(
                    "Opus worker %d answered unknown request %d; replacing it", worker.index, request_id
                )
                return
            worker.slots.release()
            call.status, call.payload = status, payload
            call.done.set()
            self._account(call, cpu_s)

    def _account(self, call: _Call, cpu_s: float) -> None:
        self._ops[call.op] = self._ops.get(call.op, 0) + 1
        self._cpu[call.op] = self._cpu.get(call.op, 0.0) + cpu_s

    def _lose(self, worker: _Worker) -> None:
        """The worker is gone: fail its pending calls and its streams, wake those waiting."""
        if not worker.alive:
            return
        worker.alive = False
        worker.requests_in.close()
        reason = "shut down" if self.closing else "died"
        error = CodecWorkerLost(f"the Opus codec worker {worker.index} (pid {worker.pid}) {reason}")
        for call in worker.pending.values():
            call.error = error
            call.done.set()
            worker.slots.release()
        worker.pending.clear()
        for stream in worker.streams:
            stream.lost = error
        if not self.closing:
            self.streams_lost += len(worker.streams)
        worker.streams.clear()
        if self._workers[worker.index] is worker:
            self._workers[worker.index] = None
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- requests --------------------------------------------------------------------------------
    async def _request(self, worker: _Worker, stream: OpusStream, op: int, payload: bytes) -> bytearray:
        await worker.slots.acquire()
        if not worker.alive:
            worker.slots.release()
            raise stream.lost or CodecWorkerLost(f"the Opus codec worker {worker.index} is gone")
        self._last_id = self._last_id % 0xFFFFFFFF + 1  # never 0, the ready frame's id
        request_id = self._last_id
        call = _Call(wire.OP_NAMES[op])
        worker.pending[request_id] = call
        worker.peak_in_flight = max(worker.peak_in_flight, len(worker.pending))
        worker.requests_in.send_nowait(wire.request(request_id, stream.stream_id, op, payload))
        await call.done.wait()
        if call.error is not None:
            raise call.error
        if call.status == wire.UNDECODABLE:
            raise OpusUndecodable(call.payload.decode(errors="replace"))
        if call.status != wire.OK:
            raise OpusCodecFailed(f"Opus worker {worker.index}: {call.payload.decode(errors='replace')}")
        return call.payload

    def _release(self, stream: OpusStream) -> None:
        worker = stream._worker
        if stream in worker.streams:
            worker.streams.discard(stream)
            if worker.alive:
                worker.requests_in.send_nowait(wire.request(0, stream.stream_id, wire.CLOSE, b""))
            self._wake()

    async def aclose(self) -> None:
        self.closing = True
        for worker in self._workers:
            if worker is not None:
                worker.requests_in.close()  # the writer ends, closes stdin: the worker sees EOF
        self._wake()


def _worker_env() -> dict[str, str]:
    """The server's environment, with this package importable however the server found it."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


async def _stop_process(process: trio.Process, *, kill: bool) -> None:
    """Close the pipes, give the worker a moment to exit on EOF (or kill it), reap it."""
    if kill and process.returncode is None:
        process.kill()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            await pipe.aclose()
    with trio.move_on_after(STOP_TIMEOUT_S):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


@asynccontextmanager
async def open_opus_pool(workers: int | None = None, *, queue_depth: int = 64) -> AsyncIterator[OpusPool]:
    """Start ``workers`` codec processes (:func:`default_opus_workers` when None), yield the pool;
    on exit stop them all (every stream still open then fails with :class:`CodecWorkerLost`)."""
    count = default_opus_workers() if workers is None else workers
    pool = OpusPool(count, queue_depth)
    # Started before the nursery, so that a failure is raised as itself, not in an exception group.
    # All launched first, then awaited: their imports (~0.6 s each) run in parallel.
    spawned: list[_Worker] = []
    try:
        for index in range(count):
            spawned.append(await pool._launch(index))
        for worker in spawned:
            await pool._ready(worker)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            for worker in spawned:
                await _stop_process(worker.process, kill=True)
        if isinstance(exc, (OSError, RuntimeError, trio.TooSlowError)):
            raise OpusPoolUnavailable(f"could not start the Opus codec workers: {exc}") from exc
        raise
    async with trio.open_nursery() as nursery:
        for worker in spawned:
            pool._workers[worker.index] = worker
            nursery.start_soon(pool._run_worker, worker)
        try:
            yield pool
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()
                with trio.move_on_after(STOP_TIMEOUT_S + 1.0):
                    while any(w is not None for w in pool._workers):
                        await pool._changed.wait()
            nursery.cancel_scope.cancel()
