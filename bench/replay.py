"""Replay speed: logic replay and model replay of a recorded session, in multiples of real time.

Records one session with the tiny model under virtual time (``open_duplex_server(...,
virtual_time=True)`` in ``trio.run`` with an autojumping ``MockClock``: the engine runs inline,
fast and deterministic): N seconds of speech-like audio (a tone with vibrato plus noise) appended
in 80 ms chunks, a ``cancel`` in the middle, then ``close``. Then times

* ``replay_logic(path)`` (the session core over the logged records; median of a few runs),
* ``replay_model(report, open_engine(model, slots=S))`` (the engine re-run on the logged inputs
  at the recording width S, every step compared; the engine is opened outside the timing and
  reported separately),
* the ``duplex-replay PATH`` CLI end to end in a subprocess (interpreter start-up and imports
  included), logic only and with ``--model``.

Every replay must be identical (asserted).

    .venv/bin/python bench/replay.py [--seconds 30] [--slots 1] [--model tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from machine import machine_line

SAMPLE_RATE = 24_000
CHUNK_S = 0.08
CHUNK_SAMPLES = 1920


def speech_like(seconds: float, seed: int = 7) -> np.ndarray:
    """A tone with vibrato plus noise (like tests/model/helpers.py session_audio)."""
    rs = np.random.RandomState(seed)
    n = round(seconds * SAMPLE_RATE / CHUNK_SAMPLES) * CHUNK_SAMPLES
    t = np.arange(n) / SAMPLE_RATE
    pitch = rs.uniform(90, 400)
    audio = rs.uniform(0.1, 0.5) * np.sin(2 * np.pi * pitch * t + 3 * np.sin(2 * np.pi * 3 * t))
    audio += rs.uniform(0.01, 0.2) * rs.randn(n)
    return audio.astype(np.float32)


async def record(engine: Any, log_dir: Path, audio: np.ndarray) -> dict[str, Any]:
    import trio

    from duplex_actors.server import open_duplex_server
    from duplex_actors.session import events as ev

    events: list[Any] = []

    async def collect(handle: Any) -> None:
        async for event in handle.events():
            events.append(event)

    chunks = [audio[i : i + CHUNK_SAMPLES] for i in range(0, len(audio), CHUNK_SAMPLES)]
    cancel_at = len(chunks) // 2
    async with open_duplex_server(engine, log_dir=log_dir, virtual_time=True) as server:
        handle = await server.open_session({})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, handle)
            for i, chunk in enumerate(chunks):
                if i == cancel_at:
                    await handle.cancel(client_event_id="bench-cancel")
                await handle.append(chunk)
                await trio.sleep(CHUNK_S)
            await trio.sleep(0.5)
            await handle.close()
    ended = [(e.epoch, e.reason) for e in events if isinstance(e, ev.ResponseEnded)]
    assert ended == [(0, "client_cancelled"), (1, "session_closed")], ended
    frames = sum(1 for e in events if isinstance(e, ev.AudioFrame))
    return {
        "path": log_dir / f"{handle.session_id}.dlog",
        "events": events,
        "frames_out": frames,
        "cancel_at_s": cancel_at * CHUNK_S,
    }


def log_breakdown(report: Any) -> dict[str, int]:
    from duplex_actors.log import records as r

    sizes = {"append audio": 0, "step pcm16": 0}
    for _, rec in report.records_list:
        if isinstance(rec, r.Append):
            sizes["append audio"] += len(rec.audio)
        elif isinstance(rec, r.Step):
            sizes["step pcm16"] += len(rec.pcm16)
    return sizes


def time_cli(args: list[str]) -> tuple[float, str]:
    exe = Path(sys.executable).parent / "duplex-replay"
    cmd = [str(exe) if exe.exists() else (shutil.which("duplex-replay") or "duplex-replay"), *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return elapsed, proc.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of audio in the session")
    parser.add_argument("--slots", type=int, default=1, help="batch size of the recording engine")
    parser.add_argument("--model", default="tiny", help="--model spec for open_engine (CPU)")
    parser.add_argument("--repeats", type=int, default=3, help="logic replays timed (median)")
    args = parser.parse_args(argv)

    import trio
    import trio.testing

    from duplex_actors.model.factory import open_engine
    from duplex_actors.replay.replayer import replay_logic, replay_model

    started = time.perf_counter()
    print(machine_line())
    audio = speech_like(args.seconds)
    audio_s = len(audio) / SAMPLE_RATE

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        log_dir = Path(tmp)
        engine = open_engine(args.model, slots=args.slots)
        t0 = time.perf_counter()
        rec = trio.run(record, engine, log_dir, audio, clock=trio.testing.MockClock(autojump_threshold=0))
        record_s = time.perf_counter() - t0
        del engine
        path: Path = rec["path"]
        log_bytes = path.stat().st_size
        print(
            f"model: {args.model}, recording engine slots={args.slots}; one session: {audio_s:.2f} s of "
            f"speech-like audio in {CHUNK_S * 1000:.0f} ms chunks (pcm_f32le), cancel at "
            f"{rec['cancel_at_s']:.2f} s, then close; recorded under virtual time in {record_s:.2f} s wall"
        )
        print()

        logic_times = []
        report = None
        for _ in range(max(1, args.repeats)):
            t0 = time.perf_counter()
            report = replay_logic(path)
            logic_times.append(time.perf_counter() - t0)
        assert report is not None
        assert report.identical and report.complete, report.summary()
        assert report.events == rec["events"], "logic replay events differ from the live session's"
        logic_s = float(np.median(logic_times))

        t0 = time.perf_counter()
        replay_engine = open_engine(args.model, slots=args.slots)  # the served width: exact
        open_s = time.perf_counter() - t0
        model_report = replay_logic(path)
        t0 = time.perf_counter()
        replay_model(model_report, replay_engine)
        model_s = time.perf_counter() - t0
        prefill_s = replay_engine.stats.prefill_compute_seconds_total
        prefill_note = (
            f"{replay_engine.stats.resets} resets, {replay_engine.stats.prefill_snapshot_misses} prompt "
            f"prefills computed ({prefill_s:.2f} s), {replay_engine.stats.prefill_snapshot_hits} snapshot hits"
        )
        assert model_report.identical, model_report.summary()
        assert model_report.steps_compared == model_report.frames_in, (
            model_report.steps_compared,
            model_report.frames_in,
        )

        cli_logic_s, cli_logic_out = time_cli([str(path)])
        cli_model_s, cli_model_out = time_cli([str(path), "--model", args.model])

        sizes = log_breakdown(report)

    print(
        f"log: {report.records} records, frames in/out {report.frames_in}/{report.frames_out}, "
        f"{log_bytes} bytes = {log_bytes / audio_s:.0f} bytes per second of audio "
        f"(input pcm_f32le {sizes['append audio']} B, output pcm16 in step records "
        f"{sizes['step pcm16']} B, the rest {log_bytes - sum(sizes.values())} B)"
    )
    print()
    print("| replay | seconds | x real time | result |")
    print("|---|---:|---:|---|")
    print(
        f"| logic, replay_logic (median of {len(logic_times)}) | {logic_s:.4f} | {audio_s / logic_s:.0f} "
        f"| {report.summary()} |"
    )
    print(
        f"| model, replay_model (engine slots={args.slots}, {model_report.steps_compared} steps compared) "
        f"| {model_s:.2f} | {audio_s / model_s:.1f} | {model_report.summary()} |"
    )
    print(
        f"| CLI `duplex-replay PATH` (subprocess, end to end) | {cli_logic_s:.2f} | {audio_s / cli_logic_s:.1f} | {cli_logic_out.split(': ', 1)[-1]} |"
    )
    print(
        f"| CLI `duplex-replay PATH --model {args.model}` (subprocess, end to end) | {cli_model_s:.2f} "
        f"| {audio_s / cli_model_s:.1f} | {cli_model_out.split(': ', 1)[-1]} |"
    )
    print()
    print(
        f"audio: {audio_s:.2f} s; opening the replay engine (not in the model replay time): {open_s:.2f} s; "
        f"recording (virtual time, engine inline): {record_s:.2f} s = {audio_s / record_s:.1f}x real time"
    )
    print(
        f"model replay includes the resets of its epochs: {prefill_note}; without the prefills "
        f"{model_s - prefill_s:.2f} s = {audio_s / (model_s - prefill_s):.1f}x real time"
    )
    print(f"CLI output: {cli_logic_out!r}")
    print(f"total run time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
