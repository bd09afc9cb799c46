"""Running one load trial: N sessions opened together, streamed on absolute deadlines, then
analysed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import numpy as np
import trio

from .. import error_codes
from .apichat import open_api_chat_client
from .audio import EncodedAudio, Float32Array
from .connection import open_duplex_client
from .errors import ConnectFailed, DuplexError, ResourceExhausted, ServerClosed, SessionRefused, Unauthorized
from .jitter import jitter_delays
from .load_analysis import analyse
from .load_trial import Options, SessionRun, Trial
from .phases import start_offsets
from .scrape import scrape
from .server_metrics import http_base, server_figures
from .stats import frame_send_times

AUDIBLE_RMS: Final = 1e-3  # per-frame RMS floor of audible output (as the vLLM-Omni driver's)


def audible_frames(pcm: Float32Array) -> tuple[int, int]:
    """(80 ms frames of ``pcm`` whose RMS is over :data:`AUDIBLE_RMS`, whole frames)."""
    frames = pcm.size // 1920
    if frames == 0:
        return 0, 0
    x = pcm[: frames * 1920].reshape(frames, 1920).astype(np.float64)
    return int((np.sqrt((x * x).mean(axis=1)) > AUDIBLE_RMS).sum()), frames


Audio = EncodedAudio | tuple[bytes, ...]  # realtime append messages, or /api/chat Opus messages


async def run_trial(opts: Options, n: int, audio: Audio) -> Trial:
    """Open ``n`` sessions, stream ``audio`` into each on absolute deadlines, analyse."""
    base = http_base(opts.url)
    before = await scrape(base, opts.api_key)
    phases = "sync" if opts.sync_start else opts.phases
    runs = [SessionRun(i, off) for i, off in enumerate(start_offsets(n, phases, opts.seed))]
    pending = n
    go = trio.Event()
    start = [0.0]

    def opened_or_failed() -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            start[0] = trio.current_time() + 0.1
            go.set()

    async def realtime(run: SessionRun, mark_open: Callable[[], None]) -> None:
        assert isinstance(audio, EncodedAudio)
        async with open_duplex_client(
            opts.url,
            api_key=opts.api_key,
            config=opts.config,
            queue_events=False,
            on_event=run.on_event,
            alignment=None if opts.align == "none" else opts.align,
        ) as client:
            run.session_id = client.session_id
            mark_open()
            await go.wait()
            delays = None
            if opts.jitter.active:
                delays = jitter_delays(
                    opts.jitter, audio.frames + 1, audio.chunk / audio.sample_rate_hz, opts.seed, run.index
                )
            client.sends = run.sends
            client.pads = run.pads
            try:
                await client.stream(audio, start=start[0] + run.offset, times=run.send_times, delays=delays)
                expected = len(frame_send_times(run.send_times, opts.ready_frames))
                # Pads (the client's and the server's) add frames: wait for the one that ends
                # within the last frame's worth of what was sent, too.
                last = audio.total_samples - audio.frame_samples * (
                    1 if audio.sample_rate_hz == 24_000 else 2
                )
                with trio.move_on_after(opts.drain_s):
                    await client.wait_until(
                        lambda: (
                            client.frames_received >= expected
                            and (run.last_end is None or run.last_end > last)
                        ),
                        timeout=opts.drain_s + 1,
                    )
            finally:
                run.hints_ignored = client.hints_ignored
        run.close_reason = client.closed_event.reason if client.closed_event else None

    async def api_chat(run: SessionRun, mark_open: Callable[[], None]) -> None:
        assert isinstance(audio, tuple)
        async with open_api_chat_client(
            opts.url,
            api_key=opts.api_key,
            params=opts.query,
            decode=run.index % max(1, opts.decode_every) == 0,
            on_audio=run.on_opus,
        ) as chat:
            mark_open()
            await go.wait()
            await chat.stream(audio, start=start[0] + run.offset, times=run.send_times)
            with trio.move_on_after(opts.drain_s):
                await chat.wait_frames(len(run.send_times), timeout=opts.drain_s + 1)
            if chat.pcm:
                run.audible = audible_frames(chat.decoded())
            run.errors += chat.errors
        run.close_reason = f"{chat.close_code} {chat.close_reason or ''}".strip()

    async def session(run: SessionRun) -> None:
        signalled = False
        t_connect = trio.current_time()

        def mark_open() -> None:
            nonlocal signalled
            run.open_ms = round((trio.current_time() - t_connect) * 1000, 3)
            signalled = True
            opened_or_failed()

        try:
            await (api_chat if isinstance(audio, tuple) else realtime)(run, mark_open)
        except Unauthorized as exc:
            run.failure = f"unauthorized: {exc}"
        except ResourceExhausted:
            run.failure = error_codes.RESOURCE_EXHAUSTED
        except SessionRefused as exc:
            run.failure = exc.code
        except ConnectFailed as exc:
            run.failure = f"connect_failed: {exc}"
        except ServerClosed as exc:
            run.failure = f"server_closed {exc.code} {exc.reason}"
        except (trio.TooSlowError, DuplexError) as exc:
            run.failure = f"{type(exc).__name__}: {exc}"
        finally:
            if not signalled:
                opened_or_failed()

    cpu0, wall0 = time.process_time(), trio.current_time()
    async with trio.open_nursery() as nursery:
        for run in runs:
            nursery.start_soon(session, run)
    wall = trio.current_time() - wall0
    cpu_pct = round(100 * (time.process_time() - cpu0) / wall, 1) if wall > 0 else 0.0
    await trio.sleep(0.2)  # let the server's counters settle after the closes
    after = await scrape(base, opts.api_key)
    server = server_figures(before, after, sum(1 for r in runs if not r.failure))
    trial = Trial(n, runs, start[0], wall, cpu_pct, server, ready_frames=opts.ready_frames)
    analyse(trial, opts)
    return trial
