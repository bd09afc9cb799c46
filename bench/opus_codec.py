"""Opus codec cost per session-frame (80 ms), in-process and through the codec worker pool.

The signal is speech: an espeak-ng WAV (resampled to 24 kHz) when espeak-ng is installed, else a
synthetic voiced signal (harmonics of a gliding 90-220 Hz pitch with syllable envelopes). sphn's
encoder costs much less on a steady tone than on speech, so the
signal matters.

1. In-process: one session's encode (1920 samples -> Ogg pages) and decode (those pages -> pcm),
   ``time.process_time`` per op, over ``--frames`` frames.
2. Pool, paced: ``--sessions`` sessions at real-time pace (one encode + one decode per 80 ms each,
   random phases) through ``--workers`` workers: round-trip latency p50/p99 per op, the workers'
   CPU (their ``/proc`` utime + stime: codec and pipe protocol together) and the server
   process's CPU per session-frame (the event loop's share of the pool shell).
3. Pool, flat out: the same sessions with no pacing: session-frames per second per worker.
4. The pool shell alone: the server process's CPU per op with no codec work.

The ceiling per worker = 80 ms / (worker CPU per session-frame): the sessions one worker process
(one core) holds at 100 % of its core.

    .venv/bin/python bench/opus_codec.py [--workers 1] [--sessions 16] [--frames 250] [--seconds 10]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
import trio

from duplex_actors.opus.codec import FRAME_SAMPLES, SAMPLE_RATE, OggOpusDecoder, OggOpusEncoder
from duplex_actors.opus.pool import open_opus_pool

TEXT = (
    "Hello, and thank you for calling. I can help you with your order, your account, or a question "
    "about our services. Please tell me in a few words what you would like to do today, and I will "
    "do my best to help you as quickly as possible. If you would rather speak with a person, say so."
)


def speech(frames: int) -> tuple[np.ndarray, str]:
    """At least ``frames`` frames of speech-like float32 24 kHz audio, and what it is."""
    espeak = shutil.which("espeak-ng")
    if espeak:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "speech.wav"
            subprocess.run([espeak, "-w", str(path), TEXT], check=True, capture_output=True)
            with wave.open(str(path)) as w:
                rate = w.getframerate()
                raw = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        import soxr

        x = soxr.resample(raw.astype(np.float32) / 32768.0, rate, SAMPLE_RATE).astype(np.float32)
        what = f"espeak-ng speech ({x.size / SAMPLE_RATE:.1f} s, looped)"
    else:
        t = np.arange(SAMPLE_RATE * 12) / SAMPLE_RATE
        pitch = 155 + 65 * np.sin(2 * np.pi * 0.4 * t)
        phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
        envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 0.5
        rng = np.random.default_rng(0)
        x = (0.25 * voiced * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
        what = "synthetic voiced signal (espeak-ng not installed)"
    reps = -(-frames * FRAME_SAMPLES // x.size)
    return np.tile(x, reps)[: frames * FRAME_SAMPLES], what


def machine_line() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    load = os.getloadavg()[0]
    return (
        f"{platform.machine()}, {cpu}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"load average {load:.1f}, {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"
    )


def in_process(x: np.ndarray, frames: int) -> dict[str, float]:
    enc, dec = OggOpusEncoder(), OggOpusDecoder()
    e_ms: list[float] = []
    d_ms: list[float] = []
    for i in range(frames):
        pcm = x[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]
        t0 = time.process_time()
        pages = enc.encode(pcm)
        t1 = time.process_time()
        out = dec.feed(pages)
        t2 = time.process_time()
        assert out.size == FRAME_SAMPLES or i == 0
        e_ms.append((t1 - t0) * 1e3)
        d_ms.append((t2 - t1) * 1e3)
    return {
        "encode_mean": statistics.fmean(e_ms),
        "decode_mean": statistics.fmean(d_ms),
        "total_mean": statistics.fmean(e_ms) + statistics.fmean(d_ms),
    }


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def through_pool(x: np.ndarray, workers: int, sessions: int, seconds: float, paced: bool) -> dict:
    frames = int(seconds * 1000 / 80)
    latency: dict[str, list[float]] = {"encode": [], "decode": []}
    async with open_opus_pool(workers) as pool:
        pids = pool.worker_pids()
        streams = [await pool.open_stream() for _ in range(sessions)]
        # one warm-up frame each (the header pages, first-call allocations)
        for s in streams:
            await s.decode(await s.encode(x[:FRAME_SAMPLES]))
        worker_cpu0 = sum(_cpu_of(p) for p in pids)
        main_cpu0 = time.process_time()
        wall0 = time.perf_counter()
        rng = random.Random(0)

        async def session(stream, offset: float) -> None:
            await trio.sleep(offset)
            start = trio.current_time()
            for i in range(frames):
                if paced:
                    await trio.sleep_until(start + i * 0.08)
                pcm = x[(i + 1) * FRAME_SAMPLES : (i + 2) * FRAME_SAMPLES]
                t0 = time.perf_counter()
                pages = await stream.encode(pcm)
                t1 = time.perf_counter()
                await stream.decode(pages)
                t2 = time.perf_counter()
                latency["encode"].append((t1 - t0) * 1e3)
                latency["decode"].append((t2 - t1) * 1e3)

        async with trio.open_nursery() as nursery:
            for s in streams:
                nursery.start_soon(session, s, rng.uniform(0, 0.08) if paced else 0.0)
        wall = time.perf_counter() - wall0
        main_cpu = time.process_time() - main_cpu0
        worker_cpu = sum(_cpu_of(p) for p in pids) - worker_cpu0
        codec = dict(pool.stats().codec_seconds)
    n = sessions * frames
    return {
        "session_frames": n,
        "wall_s": wall,
        "enc_p50": _pct(latency["encode"], 50),
        "enc_p99": _pct(latency["encode"], 99),
        "dec_p50": _pct(latency["decode"], 50),
        "dec_p99": _pct(latency["decode"], 99),
        "worker_ms_per_sf": worker_cpu / n * 1e3,
        "codec_ms_per_sf": (codec["encode"] + codec["decode"]) / (n + sessions) * 1e3,
        "main_ms_per_sf": main_cpu / n * 1e3,
        "sf_per_s_per_worker": n / wall / workers,
    }


async def shell_only(sessions: int, ops: int) -> float:
    """The server process's CPU per op of the pool shell alone: ``discard(b"")`` does no codec
    work, so what is measured is the pipe round trip (request, response, trio wake-ups)."""
    async with open_opus_pool(1) as pool:
        streams = [await pool.open_stream() for _ in range(sessions)]
        for s in streams:
            await s.discard(b"")

        async def run(stream) -> None:
            for _ in range(ops):
                await stream.discard(b"")

        cpu0 = time.process_time()
        async with trio.open_nursery() as nursery:
            for s in streams:
                nursery.start_soon(run, s)
        return (time.process_time() - cpu0) / (sessions * ops) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--frames", type=int, default=250, help="in-process frames")
    p.add_argument("--seconds", type=float, default=10.0, help="audio per session through the pool")
    a = p.parse_args()
    frames_needed = max(a.frames, int(a.seconds * 1000 / 80) + 2)
    x, what = speech(frames_needed)
    print(f"machine: {machine_line()}")
    print(f"signal: {what}; sphn {_sphn_version()}")
    local = in_process(x, a.frames)
    print(
        f"in-process, 1 session x {a.frames} frames (process_time): encode {local['encode_mean']:.3f} ms, "
        f"decode {local['decode_mean']:.3f} ms, encode+decode {local['total_mean']:.3f} ms per session-frame"
    )
    results = {
        paced: trio.run(through_pool, x, a.workers, a.sessions, a.seconds, paced) for paced in (True, False)
    }
    for paced, r in results.items():
        label = "paced (real time)" if paced else "flat out"
        print(
            f"pool {label}, {a.workers} worker(s), {a.sessions} sessions x {r['session_frames'] // a.sessions} "
            f"frames: latency encode p50 {r['enc_p50']:.2f} / p99 {r['enc_p99']:.2f} ms, decode p50 "
            f"{r['dec_p50']:.2f} / p99 {r['dec_p99']:.2f} ms; worker CPU {r['worker_ms_per_sf']:.3f} ms "
            f"per session-frame (codec {r['codec_ms_per_sf']:.3f}), server process "
            f"{r['main_ms_per_sf']:.3f} ms; {r['sf_per_s_per_worker']:.0f} session-frames/s per worker"
        )
    batched, single = trio.run(shell_only, a.sessions, 300), trio.run(shell_only, 1, 1000)
    print(
        f"pool shell alone (server process CPU per op, no codec work): {batched:.0f} us with "
        f"{a.sessions} sessions asking at once (writes coalesced), {single:.0f} us one at a time"
    )
    paced_r, flat_r = results[True], results[False]
    print(
        f"ceiling per codec worker (one core at 100 %): {80.0 / paced_r['worker_ms_per_sf']:.0f} sessions "
        f"at 80 ms per frame from the paced CPU; flat out it served "
        f"{flat_r['sf_per_s_per_worker'] * 0.08:.0f} session-frames per 80 ms"
    )


def _sphn_version() -> str:
    from importlib.metadata import version

    return version("sphn")


if __name__ == "__main__":
    main()
