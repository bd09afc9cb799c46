"""Session log write cost: framing per record, and group commit at 16 and 64 concurrent sessions.

Per frame: encode a Step record with a 3840-byte PCM16 frame (``encode_record``), then the same plus
an ``os.write`` to a real file (no fsync). Group commit: one ``LogWriter`` (fsync=True) on real files
in a temp directory; every simulated 80 ms tick each session appends one Step (3840-byte PCM16) and one
Append (7680-byte float32 audio), then the tick awaits ``writer.flush()``, so one batch and one
fdatasync per file per tick. Ticks run back to back, as fast as the disk allows.

``--loop-periods-ms 5,80``: instead, the event loop's CPU per frame as a front end spends it on its
logs: ``--sessions`` logs (the first figure of the list), each given its own append (3840-byte
PCM16) and step every tick, the ticks that many ms apart (80: each session's records are a frame
old at each frame, as served), fdatasync and the default commit linger; ``--loop-rounds`` runs
of each period, alternating. Two figures per run: the appends alone (encoding and queueing) and
everything the loop spent (the commits' work on the loop included).

    .venv/bin/python bench/log_write.py [--sessions 16,64] [--seconds 10] [--io-threads 1,4] [--dir DIR]
    .venv/bin/python bench/log_write.py --sessions 64 --loop-periods-ms 5,80 [--loop-rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from duplex_actors.log import records as r
from duplex_actors.log.segment import encode_record
from duplex_actors.log.writer import open_log_writer
from machine import machine_line

TICK_S = 0.080


def step(i: int) -> r.Step:
    return r.Step(
        epoch=0,
        frame_index=i,
        ready=True,
        text_token=i % 32000,
        text_piece="▁word",
        agent_codes=tuple((i * 7 + k) % 2048 for k in range(8)),
        user_codes=tuple((i * 13 + k) % 2048 for k in range(8)),
        pcm16=os.urandom(3840),
    )


def per_frame(directory: Path, n: int = 20_000) -> tuple[float, float]:
    """µs per frame: encode only, and encode + os.write."""
    frames = [step(i) for i in range(256)]
    t0 = time.perf_counter()
    for i in range(n):
        encode_record(i, frames[i % 256])
    encode_us = (time.perf_counter() - t0) / n * 1e6
    fd = os.open(directory / "frames.dlog", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            os.write(fd, encode_record(i, frames[i % 256]))
        write_us = (time.perf_counter() - t0) / n * 1e6
    finally:
        os.close(fd)
    return encode_us, write_us


async def group_commit(directory: Path, sessions: int, ticks: int, io_threads: int) -> dict[str, float]:
    steps = [step(i) for i in range(64)]
    audio = [r.Append(audio=os.urandom(7680), format="pcm_f32le") for _ in range(64)]
    commit_ms: list[float] = []
    async with open_log_writer(directory, io_threads=io_threads, max_queued=4 * sessions) as writer:
        logs = [writer.create(f"bench-{io_threads}-{sessions}-{n}") for n in range(sessions)]
        await writer.flush()  # the directory entries, outside the timed ticks
        t0 = time.perf_counter()
        for tick in range(ticks):
            t_tick = time.perf_counter()
            for log in logs:
                log.append_nowait(steps[tick % 64])
                log.append_nowait(audio[tick % 64])
            await writer.flush()
            commit_ms.append((time.perf_counter() - t_tick) * 1e3)
        elapsed = time.perf_counter() - t0
        stats = writer.statistics()
        for log in logs:
            log.close_nowait()
    assert stats.records_written == 2 * sessions * ticks and stats.failed_logs == 0
    assert stats.batches == ticks and stats.fsyncs == sessions * ticks
    fsyncs = sorted(stats.fsync_durations_s)
    q = statistics.quantiles(commit_ms, n=100)
    return {
        "records_s": stats.records_written / elapsed,
        "us_record": elapsed / stats.records_written * 1e6,
        "fsync_p50": (stats.fsync_percentile(50) or 0) * 1e3,
        "fsync_p99": (stats.fsync_percentile(99) or 0) * 1e3,
        "fsyncs": len(fsyncs),
        "tick_p50": q[49],
        "tick_p99": q[98],
        "mb_s": stats.bytes_written / elapsed / 1e6,
    }


async def loop_cpu(
    directory: Path, name: str, sessions: int, ticks: int, period_s: float
) -> tuple[float, float]:
    """µs of the event loop's CPU per frame: the appends alone, and all of it (see the docstring)."""
    steps = [[step(i) for i in range(8)] for _ in range(sessions)]
    appends = [[r.Append(os.urandom(3840), "pcm16") for _ in range(8)] for _ in range(sessions)]
    async with open_log_writer(directory) as writer:
        logs = [writer.create(f"{name}-{n}") for n in range(sessions)]
        await writer.flush()
        appending = 0.0
        start = time.thread_time()
        for tick in range(ticks):
            before = time.thread_time()
            for n, log in enumerate(logs):
                log.append_nowait(appends[n][tick % 8])
                log.append_nowait(steps[n][tick % 8])
            appending += time.thread_time() - before
            await trio.sleep(period_s)
        spent = time.thread_time() - start
        for log in logs:
            log.close_nowait()
    frames = sessions * ticks
    return 1e6 * appending / frames, 1e6 * spent / frames


def filesystem(directory: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(directory)], capture_output=True, text=True, check=True).stdout
        return out.splitlines()[1].split()[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default="16,64")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of ticks")
    parser.add_argument("--io-threads", default="1,4")
    parser.add_argument("--dir", type=Path, default=None, help="where the temp directory goes")
    parser.add_argument("--loop-periods-ms", default="", help="e.g. 5,80: the loop's CPU per frame instead")
    parser.add_argument("--loop-rounds", type=int, default=3)
    args = parser.parse_args()
    ticks = round(args.seconds / TICK_S)
    with tempfile.TemporaryDirectory(prefix="duplex-log-bench-", dir=args.dir) as tmp:
        directory = Path(tmp)
        print(f"{machine_line(libraries=())}; log dir on {filesystem(directory)} ({directory.parent}).")
        if args.loop_periods_ms:
            sessions = int(args.sessions.split(",")[0])
            periods = [float(p) for p in args.loop_periods_ms.split(",")]
            print(f"\n{sessions} logs, {ticks} ticks per run; event loop CPU per frame, µs")
            print("\n| round | ms between ticks | appends | all of the loop |\n|---:|---:|---:|---:|")
            for round_ in range(1, args.loop_rounds + 1):
                for period in periods:
                    name = f"loop-{round_}-{period:g}"
                    appends_us, loop_us = trio.run(loop_cpu, directory, name, sessions, ticks, period / 1000)
                    print(f"| {round_} | {period:g} | {appends_us:.1f} | {loop_us:.1f} |", flush=True)
            return
        encode_us, write_us = per_frame(directory)
        print()
        print("| per frame (Step, 3840-byte pcm16) | µs |")
        print("|---|---:|")
        print(f"| encode_record | {encode_us:.2f} |")
        print(f"| encode_record + os.write (no fsync) | {write_us:.2f} |")
        print()
        print(
            f"Group commit: {ticks} ticks of 80 ms ({args.seconds:g} s simulated), per session per tick one "
            "Step (3840 B) + one Append (7680 B), one fdatasync per file per tick, ticks back to back."
        )
        print()
        print(
            "| sessions | io threads | records/s | µs/record | MB/s | fsync p50 ms | fsync p99 ms "
            "| tick commit p50 ms | tick commit p99 ms |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for sessions in (int(s) for s in args.sessions.split(",")):
            for threads in (int(t) for t in args.io_threads.split(",")):
                res = trio.run(group_commit, directory, sessions, ticks, threads)
                print(
                    f"| {sessions} | {threads} | {res['records_s']:,.0f} | {res['us_record']:.1f} "
                    f"| {res['mb_s']:.1f} | {res['fsync_p50']:.2f} | {res['fsync_p99']:.2f} "
                    f"| {res['tick_p50']:.1f} | {res['tick_p99']:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
