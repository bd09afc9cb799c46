"""The codec pool: real worker processes on real pipes. Crashes are real (SIGKILL); a worker is
held still with SIGSTOP where a test needs requests to stay in flight, so nothing here depends
on timing."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.metrics import FrontEndSnapshot, render
from duplex_actors.opus.codec import FRAME_SAMPLES, OggOpusDecoder, OggOpusEncoder, OpusUndecodable
from duplex_actors.opus.pool import CodecWorkerLost, default_opus_workers, open_opus_pool

from .test_codec import rms, sphn_stream, tone


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _gone(pid: int) -> bool:
    """Exited and reaped (no zombie left)."""
    return not Path(f"/proc/{pid}").exists()


async def _wait_in_flight(pool, worker: int, n: int) -> None:
    while pool.stats().workers[worker].in_flight < n:
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.01)


async def test_streams_spread_over_workers_and_round_trip():
    x = tone(0.8)
    async with open_opus_pool(2) as pool:
        streams = [await pool.open_stream() for _ in range(4)]
        assert sorted(s.worker_index for s in streams) == [0, 0, 1, 1]
        assert [w.sessions for w in pool.stats().workers] == [2, 2]
        results: dict[int, np.ndarray] = {}

        async def talk(i, stream):
            pages = [await stream.encode(x[j : j + FRAME_SAMPLES]) for j in range(0, x.size, FRAME_SAMPLES)]
            pcm = [await stream.decode(p) for p in pages]
            results[i] = np.concatenate(pcm)

        async with trio.open_nursery() as nursery:
            for i, s in enumerate(streams):
                nursery.start_soon(talk, i, s)
        for pcm in results.values():
            assert pcm.dtype == np.float32 and pcm.size == x.size
            assert rms(pcm[FRAME_SAMPLES:]) > 0.5 * rms(x)
        # the worker's result equals the in-process codec's (same library, same state)
        encoder, decoder = OggOpusEncoder(), OggOpusDecoder()
        local = np.concatenate(
            [decoder.feed(encoder.encode(x[j : j + FRAME_SAMPLES])) for j in range(0, x.size, FRAME_SAMPLES)]
        )
        assert np.array_equal(results[0], local)
        st = pool.stats()
        assert dict(st.ops)["encode"] == dict(st.ops)["decode"] == 4 * 10
        assert dict(st.codec_seconds)["encode"] > 0
        await streams[0].aclose()
        await streams[0].aclose()  # idempotent
        assert [w.sessions for w in pool.stats().workers] == [1, 2]
        with pytest.raises(trio.ClosedResourceError):
            await streams[0].encode(x[:FRAME_SAMPLES])
        text = render(FrontEndSnapshot(opus=pool.stats()))
        assert 'duplex_opus_worker_sessions{worker="1"} 2' in text
        assert "duplex_opus_worker_restarts_total 0" in text
        assert 'duplex_opus_codec_seconds_total{op="encode"}' in text


async def test_bad_audio_fails_only_that_stream():
    async with open_opus_pool(1) as pool:
        bad, good = await pool.open_stream(), await pool.open_stream()
        with pytest.raises(OpusUndecodable, match="capture pattern") as info:
            await bad.decode(b"RIFF....WAVEfmt ")
        assert info.value.code == "bad_audio"
        with pytest.raises(OpusUndecodable):
            await bad.decode(b"".join(sphn_stream(2)))  # stays failed
        pcm = await good.decode(b"".join(sphn_stream(2)))
        assert pcm.size == 2 * FRAME_SAMPLES
        await good.discard(b"".join(sphn_stream(1)))  # validated, no audio back
        assert pool.stats().restarts == 0


async def test_killed_worker_fails_only_its_streams_and_is_restarted():
    x = tone(0.08)
    async with open_opus_pool(2) as pool:
        streams = [await pool.open_stream() for _ in range(4)]
        mine = [s for s in streams if s.worker_index == 0]
        others = [s for s in streams if s.worker_index == 1]
        victim = mine[0].worker_pid
        for s in streams:
            await s.encode(x)
        # a call in flight when the worker dies fails too: hold the worker still, queue a call
        os.kill(victim, signal.SIGSTOP)
        failures: list[BaseException] = []

        async def pending():
            try:
                await mine[0].encode(x)
            except CodecWorkerLost as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending)
            await _wait_in_flight(pool, 0, 1)
            os.kill(victim, signal.SIGKILL)
        assert len(failures) == 1 and failures[0].code == "internal_error"  # type: ignore[attr-defined]
        for s in mine:
            with pytest.raises(CodecWorkerLost):
                await s.encode(x)
            with pytest.raises(CodecWorkerLost):
                await s.decode(b"OggS")
            await s.aclose()
        for s in others:  # the other worker's streams go on, their state intact
            assert (await s.encode(x)) and s.lost is None
        await pool.wait_workers()
        st = pool.stats()
        assert st.restarts == 1 and st.streams_lost == 2
        assert _gone(victim)
        fresh = await pool.open_stream()  # least loaded: the restarted worker
        assert fresh.worker_index == 0 and fresh.worker_pid != victim
        pcm = await fresh.decode(await fresh.encode(x))
        assert pcm.size == FRAME_SAMPLES
        text = render(FrontEndSnapshot(opus=pool.stats()))
        assert "duplex_opus_worker_restarts_total 1" in text


async def test_bounded_queue_and_one_op_in_flight_per_stream():
    x = tone(0.08)
    async with open_opus_pool(1, queue_depth=2) as pool:
        streams = [await pool.open_stream() for _ in range(5)]
        pid = streams[0].worker_pid
        os.kill(pid, signal.SIGSTOP)
        done: list[int] = []

        async def call(i, stream):
            await stream.encode(x)
            done.append(i)

        try:
            async with trio.open_nursery() as nursery:
                for i, s in enumerate(streams):
                    nursery.start_soon(call, i, s)
                    nursery.start_soon(call, 10 + i, s)  # a second call on the same stream
                await _wait_in_flight(pool, 0, 2)
                await trio.testing.wait_all_tasks_blocked()
                assert pool.stats().workers[0].in_flight == 2  # the rest wait, nothing piles up
                assert done == []
                os.kill(pid, signal.SIGCONT)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert sorted(done) == [*range(5), *range(10, 15)]
        assert pool.stats().workers[0].peak_in_flight == 2


async def test_a_cancelled_call_does_not_desynchronise_the_worker():
    x = tone(0.24)
    async with open_opus_pool(1) as pool:
        a, b = await pool.open_stream(), await pool.open_stream()
        pid = a.worker_pid
        os.kill(pid, signal.SIGSTOP)
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a.encode, x[:FRAME_SAMPLES])
                    await _wait_in_flight(pool, 0, 1)
                    scope.cancel()
        finally:
            os.kill(pid, signal.SIGCONT)
        # b's answers are b's, and a still works (its cancelled encode did run in the worker)
        pages = await b.encode(x[:FRAME_SAMPLES])
        assert pages.startswith(b"OggS") and b"OpusHead" in pages
        assert (await b.decode(pages)).size == FRAME_SAMPLES
        later = await a.encode(x[FRAME_SAMPLES : 2 * FRAME_SAMPLES])
        assert b"OpusHead" not in later  # the header went with the cancelled call


async def test_no_process_or_fd_leak_after_exit():
    before = _fds()
    async with open_opus_pool(2) as pool:
        pids = pool.worker_pids()
        stream = await pool.open_stream()
        await stream.encode(tone(0.08))
    assert all(_gone(pid) for pid in pids)
    assert _fds() == before
    with pytest.raises(CodecWorkerLost):  # streams left open fail after the pool's exit
        await stream.encode(tone(0.08))
    with pytest.raises(trio.ClosedResourceError):
        await pool.open_stream()


def test_default_worker_count_is_sane():
    n = default_opus_workers()
    assert 1 <= n <= 4
    assert n <= max(1, len(os.sched_getaffinity(0)) // 2)


async def test_a_pool_that_cannot_start_says_so(monkeypatch):
    from duplex_actors.opus import pool as pool_module

    monkeypatch.setattr(pool_module, "WORKER_COMMAND", (sys.executable, "-c", "import sys; sys.exit(3)"))
    before = _fds()
    with pytest.raises(pool_module.OpusPoolUnavailable, match="exited before it was ready") as info:
        async with open_opus_pool(2):
            pass
    assert info.value.code == "internal_error"
    assert _fds() == before
