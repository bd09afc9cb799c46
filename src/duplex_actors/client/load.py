"""``duplex-load``: N concurrent sessions paced in real time, and whether the server kept up.

::

    duplex-load --url ws://127.0.0.1:8000/v1/realtime?duplex=1 --sessions 8 --seconds 10 --out load/
    duplex-load --url ... --seconds 10 --ramp --out ramp/

Every session opens first (concurrently); then all stream the same pre-encoded audio
(synthetic speech-like audio, or ``--input WAV``) on absolute deadlines, ``--chunk-ms`` (80) per
append, with start phases within one 80 ms tick given by ``--phases``: ``spread`` (session i of N
at i*80/N ms, the default), ``random`` (uniform, from ``--seed``) or ``sync`` (all on the same
instant; ``--sync-start``), and wait up to ``--drain`` seconds for their last frames before
closing. Sessions opt in to alignment (``--align client``, the default: 80 ms streams follow the
server's ``input_audio_buffer.alignment`` hints; ``server``, ``off``, or ``none`` to send no
``duplex`` key at all, a stock client), and ``--jitter {loopback,lan,wan}`` (or the
``--jitter-*`` knobs) holds chunks back on the way out, with late bursts, deterministically with
``--seed``. The numbers (see :mod:`duplex_actors.client.stats`): frames sent/received, coverage,
time to first audio, latency per output frame p50/p99/max (arrival minus the send time of the
chunk holding the sample at the delta's ``input_samples_end``), frame round trip by frame index,
output packet interval, underruns behind a 120 ms jitter buffer, lost frames, real-time factor,
and from ``/metrics`` deltas: deadline misses, mean step, steps per tick
(``duplex_step_duration_seconds_count`` x sessions / ``duplex_batch_size_sum``, as
docs/operations.md defines it), the added wait (``duplex_frame_wait_seconds``), catch-up steps,
alignment pad seconds, drained frames; per session the hints received and the pads applied. A run
*held* real time when every session opened and streamed, coverage >= 0.99, latency p99 <= 80 ms
and no frame was lost.

``--ramp`` runs N = 1, 2, 4, ... (``--ramp-step K``: 1, 1+K, ...) until a run breaks or N
reaches the server's slot count, then bisects between the last N that held and the first that
broke, and reports the largest N that held. A p99 measured on a shared machine is noisy, so a
run that breaks is repeated ``--retries`` times (default 1; not when sessions were refused)
and N holds if any attempt held; every attempt is in the report. Writes ``load.json`` and ``load.png`` (round-trip
histogram + per-session timeline; for a ramp, of the largest N that held, plus ``ramp.png``)
into ``--out``, and prints a summary table.

``--input-format`` / ``--output-format`` (as ``duplex-client``'s: pcm16[@RATE], pcm_f32le[@RATE],
pcmu, pcma) choose what the sessions send and get back; a frame is 80 ms whatever its byte size,
and at a resampled input rate the round trips and coverage account for the server's resampler
delay (see :mod:`duplex_actors.client.stats`).

The generator shares the machine with the server, so its per-frame work is kept tiny: the audio
is base64-encoded once for all sessions and each arrival is only time-stamped and appended.

``--dialect api-chat`` (the default when the URL path is ``/api/chat``) loads the moshi /
PersonaPlex dialect: binary Ogg/Opus both ways, ``--voice``/``--persona`` as the ``voice_prompt``
/ ``text_prompt`` query. The audio is Opus-encoded once (sphn 0.2, as ``moshi.client`` frames it)
and the same messages go to every session; a session streams after the server's handshake (audio
before it is discarded). Received pages are timed per 80 ms output frame by reading the Opus
packets' durations, not by decoding (output frame k answers input frame k, as on the other
dialects); every ``--decode-every``-th session also decodes its reply and reports the fraction
of frames above an RMS floor. The report and the "held" criteria are the same; the summary adds
the generator's CPU per session.

Exit codes: 0 the run completed (held or not: see the output), 2 bad arguments or input,
3 unauthorized, 4 no session could be opened, 5 connection failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import attrs
import numpy as np
import trio

from .. import error_codes
from ..audio import FRAME_S
from .apichat import is_api_chat_url, open_api_chat_client
from .audio import (
    EncodedAudio,
    Float32Array,
    WavError,
    WireFormat,
    encode_audio,
    read_wav,
    resample,
    speech_like,
    to_mono,
)
from .cli import FORMATS_EPILOG, input_format_arg, output_format_arg
from .connection import create_duplex_session_config, open_duplex_client
from .errors import ConnectFailed, DuplexError, ResourceExhausted, ServerClosed, SessionRefused, Unauthorized
from .events import AlignmentHint, AudioDelta, Error, ServerEvent
from .lean import main_lean
from .opus import encode_opus_messages
from .phases import PHASES, start_offsets
from .server_metrics import http_base, http_get, metrics_of, server_figures
from .stats import (
    Delta,
    aggregate,
    frame_latencies_ms,
    frame_send_times,
    round_trips_ms,
    session_stats,
)

MIN_COVERAGE: Final = 0.99
MAX_P99_MS: Final = 80.0
EXIT_OK, EXIT_USAGE, EXIT_AUTH, EXIT_REFUSED, EXIT_CONNECT = 0, 2, 3, 4, 5


# -- one session -------------------------------------------------------------------------------
@attrs.define(eq=False)
class SessionRun:
    """What one session sent and received; filled by its task, analysed after the run."""

    index: int
    offset: float
    session_id: str | None = None
    open_ms: float | None = None
    failure: str | None = None
    send_times: list[float] = attrs.Factory(list)
    deltas: list[Delta] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    close_reason: str | None = None
    audible: tuple[int, int] | None = None  # /api/chat decoded sessions: (frames over the floor, frames)
    sends: list[tuple[float, int]] = attrs.Factory(list)  # (send time, client samples after it)
    pads: list[tuple[float, int]] = attrs.Factory(list)  # alignment hints applied: (time, pad_ms)
    hints: list[tuple[float, int, str]] = attrs.Factory(list)  # (arrival, pad_ms, reason)
    hints_ignored: int = 0
    last_end: int | None = None  # the latest delta's input_samples_end

    def on_opus(self, received_at: float, first: int, frames: int) -> None:
        # /api/chat: output frame k answers input frame k (one 80 ms step per 80 ms of input).
        self.deltas.append(Delta(received_at, 0, first, frames))

    def on_event(self, event: ServerEvent) -> None:
        # Runs in the client's receive task for every event: keep it to an append.
        if type(event) is AudioDelta:
            end = event.input_samples_end
            self.deltas.append(Delta(event.received_at, event.epoch, event.frame_index, event.frames, end))
            if end is not None:
                self.last_end = end
        elif type(event) is Error:
            self.errors.append(event.code)
        elif type(event) is AlignmentHint:
            self.hints.append((event.received_at, event.pad_ms, event.reason))


@attrs.define
class Trial:
    n: int
    runs: list[SessionRun]
    t0: float
    wall_s: float
    client_cpu_pct: float
    server: dict[str, Any]
    sessions: list[dict[str, Any]] = attrs.Factory(list)
    aggregate: dict[str, Any] = attrs.Factory(dict)
    held: bool = False
    reasons: list[str] = attrs.Factory(list)
    attempt: int = 1
    ready_frames: tuple[int, ...] | None = None  # the audio's (see stats.frame_send_times)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "attempt": self.attempt,
            "held": self.held,
            "reasons": self.reasons,
            "aggregate": self.aggregate,
            "server": self.server,
            "client_cpu_pct": self.client_cpu_pct,
            "wall_s": round(self.wall_s, 3),
            "sessions": self.sessions,
        }


# -- the server's HTTP side --------------------------------------------------------------------
async def scrape(base: str, api_key: str | None = None) -> dict[str, float | None]:
    """The server counters ``duplex-load`` reports (:func:`~.server_metrics.metrics_of`)."""
    return metrics_of(*await trio.to_thread.run_sync(http_get, base + "/metrics", api_key))


async def ready(base: str, api_key: str | None = None) -> dict[str, Any]:
    status, text = await trio.to_thread.run_sync(http_get, base + "/ready", api_key)
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {}
    return {"status": status, **(body if isinstance(body, dict) else {})}


async def wait_idle(base: str, api_key: str | None = None, timeout: float = 15.0) -> None:
    """Until every slot is free again (sessions of the last run released), at most ``timeout``."""
    with trio.move_on_after(timeout):
        while True:
            body = await ready(base, api_key)
            if body.get("status") != 200 or body.get("slots_free") == body.get("slots_total"):
                return
            await trio.sleep(0.1)


# -- injected jitter (pure, deterministic with a seed) -----------------------------------------
CHUNK_MS: Final = (10, 20, 40, 80, 100)
ALIGN: Final = ("client", "server", "off", "none")


@attrs.frozen
class Jitter:
    """Network jitter the load client injects on the way out: every chunk is held back an
    exponential delay of mean ``mean_ms``; a chunk starts a late burst with probability
    chunk / ``burst_every_s`` (0: never) and is then held back ``burst_ms`` (x U[0.5, 1]) more,
    the chunks behind it queueing and leaving together when it goes."""

    mean_ms: float = 0.0
    burst_every_s: float = 0.0
    burst_ms: float = 0.0

    @property
    def active(self) -> bool:
        return self.mean_ms > 0 or (self.burst_every_s > 0 and self.burst_ms > 0)


JITTER_PROFILES: Final = {
    "loopback": Jitter(),
    "lan": Jitter(mean_ms=1.0, burst_every_s=20.0, burst_ms=20.0),
    "wan": Jitter(mean_ms=6.0, burst_every_s=4.0, burst_ms=150.0),
}


def jitter_delays(jitter: Jitter, chunks: int, chunk_s: float, seed: int = 0, index: int = 0) -> list[float]:
    """The hold-back (s) of each of ``chunks`` chunks of session ``index``: deterministic in
    (``seed``, ``index``)."""
    rng = np.random.default_rng([seed, index])
    d = rng.exponential(jitter.mean_ms, chunks) if jitter.mean_ms > 0 else np.zeros(chunks)
    if jitter.burst_every_s > 0 and jitter.burst_ms > 0:
        starts = rng.random(chunks) < min(1.0, chunk_s / jitter.burst_every_s)
        d = d + starts * jitter.burst_ms * rng.uniform(0.5, 1.0, chunks)
    return [float(x) / 1000 for x in d]


# -- a run of N sessions -----------------------------------------------------------------------
@attrs.frozen
class Options:
    url: str
    seconds: float
    api_key: str | None
    config: dict[str, Any]
    sync_start: bool = False
    drain_s: float = 2.0
    jitter_buffer_s: float = 0.12
    min_coverage: float = MIN_COVERAGE
    max_p99_ms: float = MAX_P99_MS
    ready_frames: tuple[int, ...] | None = None
    dialect: str = "realtime"  # or "api-chat"
    query: dict[str, str] = attrs.Factory(dict)  # /api/chat: text_prompt, voice_prompt
    decode_every: int = 8  # /api/chat: decode the replies of every K-th session (RMS check)
    phases: str = "spread"  # or "random" (with seed), "sync" (as sync_start)
    seed: int = 0
    align: str = "client"  # duplex.alignment sent; "none": no opt-in (a stock client)
    jitter: Jitter = Jitter()
    rate: int = 24_000  # the input rate


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


def analyse(trial: Trial, opts: Options) -> None:
    all_rtt: list[float] = []
    all_latency: list[float] = []
    with_latency = False
    all_intervals: list[float] = []
    for run in trial.runs:
        client_pad = sum(p for _, p in run.pads) * 24  # 24 kHz samples
        stats = session_stats(
            run.send_times,
            run.deltas,
            jitter_buffer=opts.jitter_buffer_s,
            ready_frames=opts.ready_frames,
            sends=run.sends if opts.dialect != "api-chat" else None,
            rate=opts.rate,
            pads=client_pad,
        )
        frame_sent = frame_send_times(run.send_times, opts.ready_frames)
        rtt = [ms for _, ms in round_trips_ms(frame_sent, run.deltas)]
        all_rtt += rtt
        lat = frame_latencies_ms(run.sends, run.deltas, opts.rate * 80 // 1000)
        with_latency = with_latency or lat is not None
        all_latency += rtt if lat is None else lat
        all_intervals += list(np.diff([d.received_at for d in run.deltas]) * 1000)
        trial.sessions.append(
            {
                "index": run.index,
                "session_id": run.session_id,
                "open_ms": run.open_ms,
                "start_offset_ms": round(run.offset * 1000, 3),
                "failure": run.failure,
                "errors": run.errors,
                "close_reason": run.close_reason,
                "alignment_hints": [[round((t - trial.t0) * 1000, 1), p, why] for t, p, why in run.hints],
                "pads_applied_ms": [p for _, p in run.pads],
                "hints_ignored": run.hints_ignored,
                # Every output frame's latency in arrival order (ms), to see when a run broke.
                **({"latency_series_ms": [round(x, 1) for x in lat]} if lat is not None else {}),
                **({"audible_frames": list(run.audible)} if run.audible is not None else {}),
                **stats,
            }
        )
    agg = aggregate(trial.sessions, all_rtt, all_intervals, all_latency if with_latency else None)
    agg["latency_source"] = "input_samples_end" if with_latency else "round_trip"
    agg["alignment_hints"] = sum(len(r.hints) for r in trial.runs)
    agg["client_pads_applied"] = sum(len(r.pads) for r in trial.runs)
    agg["client_pad_ms_mean"] = (
        round(sum(p for r in trial.runs for _, p in r.pads) / max(1, agg["client_pads_applied"]), 2)
        if agg["client_pads_applied"]
        else None
    )
    for key in (
        "steps_per_tick", "wait_ms_mean", "wait_ms_p50_le", "wait_ms_p99_le", "catchup_steps",
        "align_pad_s", "drained_frames",
    ):  # fmt: skip
        agg[f"server_{key}"] = trial.server.get(key)
    agg["failed_sessions"] = sum(1 for r in trial.runs if r.failure)
    agg["error_events"] = sum(len(r.errors) for r in trial.runs)
    agg["server_deadline_misses"] = trial.server["deadline_misses"]
    agg["server_step_ms_mean"] = trial.server["step_ms_mean"]
    agg["client_cpu_pct"] = trial.client_cpu_pct
    agg["client_cpu_pct_per_session"] = round(trial.client_cpu_pct / trial.n, 3) if trial.n else None
    decoded = [r.audible for r in trial.runs if r.audible is not None]
    if decoded:
        loud, total = sum(a for a, _ in decoded), sum(b for _, b in decoded)
        agg["audible_fraction"] = round(loud / total, 4) if total else 0.0
        agg["decoded_sessions"] = len(decoded)
    trial.aggregate = agg
    reasons: list[str] = []
    if agg["failed_sessions"]:
        kinds = sorted({(r.failure or "").split(":")[0] for r in trial.runs if r.failure})
        reasons.append(f"{agg['failed_sessions']} session(s) failed ({', '.join(kinds)})")
    if agg["coverage"] < opts.min_coverage:
        reasons.append(f"coverage {agg['coverage']:.4f} < {opts.min_coverage}")
    p99 = agg["latency_ms"]["p99"]
    if p99 is None or p99 > opts.max_p99_ms:
        what = "latency" if with_latency else "round trip"
        reasons.append(f"{what} p99 {p99} ms > {opts.max_p99_ms:g} ms")
    # With injected jitter a frame the server drained (a backlog no catch-up could clear) is
    # the policy at work, counted apart; on loopback it counts as lost.
    drained = int(trial.server.get("drained_frames") or 0) if opts.jitter.active else 0
    agg["lost_frames_not_drained"] = max(0, agg["lost_frames"] - drained)
    if agg["lost_frames_not_drained"]:
        reasons.append(f"{agg['lost_frames_not_drained']} lost frame(s)")
    trial.reasons = reasons
    trial.held = not reasons


# -- output ------------------------------------------------------------------------------------
def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


_COLUMNS: Final = (
    "sent",
    "recv",
    "cover",
    "ttfa ms",
    "rtt p50",
    "rtt p99",
    "lat p50",
    "lat p99",
    "lat max",
    "pkt p99",
    "underrun",
    "lost",
)


def _cells(s: dict[str, Any], ttfa: Any) -> list[str]:
    return [
        _num(s["frames_sent"]),
        _num(s["frames_received"]),
        _num(s["coverage"], 3),
        _num(ttfa),
        _num(s["round_trip_ms"]["p50"]),
        _num(s["round_trip_ms"]["p99"]),
        _num(s["latency_ms"]["p50"]),
        _num(s["latency_ms"]["p99"]),
        _num(s["latency_ms"]["max"]),
        _num(s["packet_interval_ms"]["p99"]),
        _num(s["underruns"]),
        _num(s["lost_frames"]),
    ]


def trial_table(trial: Trial) -> str:
    """One row per session (up to 32) and an ``all`` row."""
    rows = []
    if trial.n <= 32:
        for s in trial.sessions:
            rows.append([f"s{s['index']}", *_cells(s, s["time_to_first_audio_ms"]), _num(s["rtf"], 3)])
    agg = trial.aggregate
    rows.append(["all", *_cells(agg, agg["time_to_first_audio_ms"]["p50"]), _num(agg["rtf_min"], 3)])
    table = _table(["session", *_COLUMNS, "rtf"], rows)
    verdict = "held real time" if trial.held else "broke real time: " + "; ".join(trial.reasons)
    return (
        f"{table}\n"
        f"N={trial.n}: {verdict}. server deadline misses {_num(agg['server_deadline_misses'], 0)}, "
        f"server step mean {_num(agg['server_step_ms_mean'], 2)} ms, "
        f"steps per tick {_num(agg.get('server_steps_per_tick'), 3)}, "
        f"added wait mean {_num(agg.get('server_wait_ms_mean'), 2)} ms, "
        f"catch-ups {_num(agg.get('server_catchup_steps'), 0)}, "
        f"align pad {_num(agg.get('server_align_pad_s'), 3)} s, "
        f"drained {_num(agg.get('server_drained_frames'), 0)}, "
        f"hints {agg.get('alignment_hints', 0)} ({agg.get('client_pads_applied', 0)} applied), "
        f"load generator CPU {_num(agg['client_cpu_pct'])}% of one core "
        f"({_num(agg['client_cpu_pct_per_session'], 2)}% per session)"
        + (
            f", audible frames {_num(agg['audible_fraction'], 3)} of {agg['decoded_sessions']} decoded session(s)"
            if "audible_fraction" in agg
            else ""
        )
    )


def ramp_table(trials: Sequence[Trial]) -> str:
    rows = []
    for t in sorted(trials, key=lambda t: t.n):
        a = t.aggregate
        rows.append(
            [
                str(t.n) if t.attempt == 1 else f"{t.n} (#{t.attempt})",
                *_cells(a, a["time_to_first_audio_ms"]["p50"]),
                _num(a["server_deadline_misses"], 0),
                _num(a["server_step_ms_mean"], 2),
                _num(a.get("server_steps_per_tick"), 3),
                _num(a.get("server_wait_ms_mean"), 1),
                _num(a["rtf_min"], 3),
                _num(a["client_cpu_pct"]),
                "yes" if t.held else "NO",
            ]
        )
    return _table(
        ["N", *_COLUMNS, "misses", "step ms", "steps/tick", "wait ms", "rtf min", "cpu %", "held"], rows
    )


def _plot(path: Path, trial: Trial, title: str) -> str | None:
    from .plot import plot_trial

    try:
        sessions = [(frame_send_times(r.send_times, trial.ready_frames), r.deltas) for r in trial.runs]
        plot_trial(path, sessions, t0=trial.t0, title=title)
    except Exception as exc:  # a missing/broken matplotlib must not lose the numbers
        print(f"duplex-load: could not draw {path}: {exc}", file=sys.stderr)
        return None
    return str(path)


# -- the command -------------------------------------------------------------------------------
def load_audio(path: str | None, seconds: float, rate: int = 24_000) -> Float32Array:
    """``seconds`` (rounded to whole 80 ms frames) of mono float32 at ``rate``: the WAV
    (resampled) looped and trimmed, or synthetic speech."""
    n = max(1, round(seconds / FRAME_S)) * (rate * 80 // 1000)
    if path is None:
        return speech_like(n / rate, rate=rate)
    samples, wav_rate = read_wav(path)
    x = resample(to_mono(samples), wav_rate, rate)
    if x.size == 0:
        raise WavError(f"{path}: no audio")
    return np.tile(x, -(-n // x.size))[:n]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex-load",
        description="Load a duplex-actors server with N concurrent real-time sessions and measure it.",
        epilog="exit codes: 0 completed (held or not), 2 bad arguments/input, 3 unauthorized, "
        "4 no session opened, 5 connection failure. " + FORMATS_EPILOG,
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime?duplex=1")
    parser.add_argument("--sessions", "-n", type=int, default=1, help="concurrent sessions (default 1)")
    parser.add_argument("--seconds", "-s", type=float, default=10.0, help="audio per session (default 10)")
    parser.add_argument("--input", help="WAV to stream (looped/trimmed); default: synthetic speech")
    parser.add_argument("--out", default="load-out", help="directory for load.json and the PNGs")
    parser.add_argument("--ramp", action="store_true", help="find the largest N that holds real time")
    parser.add_argument(
        "--ramp-step", type=int, default=0, help="ramp by +K sessions instead of doubling (0: double)"
    )
    parser.add_argument("--max-n", type=int, default=None, help="ramp cap (default: the server's slots)")
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="ramp: re-run a broken N this many times before calling it broken (default 1; every "
        "attempt is reported)",
    )
    parser.add_argument(
        "--sync-start", action="store_true", help="start every stream on the same instant (= --phases sync)"
    )
    parser.add_argument(
        "--phases",
        choices=PHASES,
        default="spread",
        help="start phases within one 80 ms tick: spread (session i of N at i*80/N ms, the default), "
        "random (uniform, from --seed), sync (all on the same instant)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --phases random and of --jitter")
    parser.add_argument(
        "--chunk-ms",
        type=int,
        choices=CHUNK_MS,
        default=80,
        help="audio per append (default 80 = one model frame); the server pads 10/20/40 ms chunks "
        "to align them by itself",
    )
    parser.add_argument(
        "--align",
        choices=ALIGN,
        default="client",
        help="the sessions' duplex.alignment: client (default: opt in and follow the server's "
        "alignment hints with 80 ms chunks), server, off (never pad), none (send nothing: a stock "
        "client, served unaligned with 80 ms chunks)",
    )
    parser.add_argument(
        "--jitter",
        choices=tuple(JITTER_PROFILES),
        default="loopback",
        help="network jitter injected on the way out: loopback (none, the default), lan (mean 1 ms, "
        "a 20 ms late burst every ~20 s), wan (mean 6 ms, a 75-150 ms late burst every ~4 s); "
        "deterministic with --seed; the --jitter-*-ms knobs override the profile's values",
    )
    parser.add_argument("--jitter-mean-ms", type=float, default=None, help="mean per-chunk hold-back")
    parser.add_argument("--jitter-burst-ms", type=float, default=None, help="a late burst's hold-back")
    parser.add_argument(
        "--jitter-burst-every", type=float, default=None, help="mean seconds between late bursts (0: none)"
    )
    parser.add_argument("--drain", type=float, default=2.0, help="seconds to wait for the last frames")
    parser.add_argument("--jitter-buffer-ms", type=float, default=120.0)
    parser.add_argument("--voice", default=None)
    parser.add_argument("--persona", default=None)
    parser.add_argument(
        "--input-format",
        type=input_format_arg,
        default=input_format_arg("pcm16"),
        help="what the sessions send: pcm16 (@24000), pcm16@48000, pcm_f32le@16000, pcmu, pcma, ...",
    )
    parser.add_argument(
        "--output-format",
        type=output_format_arg,
        default=None,
        help="what the server sends back: pcm16 (24 kHz, the default) or pcmu/pcma (8 kHz)",
    )
    parser.add_argument(
        "--dialect",
        choices=("realtime", "api-chat"),
        default=None,
        help="realtime (JSON, base64 PCM) or api-chat (binary Ogg/Opus both ways, the moshi / "
        "PersonaPlex protocol); default: api-chat when the URL path is /api/chat, else realtime",
    )
    parser.add_argument(
        "--decode-every",
        type=int,
        default=8,
        help="api-chat: decode the replies of every K-th session for the audible-frames check "
        "(default 8; every session's frames are timed without decoding)",
    )
    parser.add_argument(
        "--max-p99-ms",
        type=float,
        default=MAX_P99_MS,
        help=f"held: latency p99 at most this (default {MAX_P99_MS:g})",
    )
    parser.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY") or None)
    lean = parser.add_argument_group(
        "lean mode (duplex_actors/client/lean.py)",
        "one thread over raw sockets, a pre-encoded tone, replies only counted and timed: ~0.1 ms "
        "of client CPU per session-frame, to measure a server's own cost per frame. Takes --url "
        "(/v1/realtime: JSON; /v1/duplex: binary both ways), --sessions, --seconds, --chunk-ms, "
        "--phases, --seed, --align, --drain, --voice, --persona, --max-p99-ms, --out, --api-key",
    )
    lean.add_argument("--lean", action="store_true", help="run the lean client")
    lean.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="lean: stream this long before the measured --seconds (latency and client CPU count "
        "the window after it; it prints 'lean: window start'/'end' as it passes them)",
    )
    return parser


def _api_chat_url(url: str) -> str:
    """The Realtime default URL, or any URL given with ``--dialect api-chat``, on ``/api/chat``."""
    parts = urlsplit(url)
    if is_api_chat_url(url):
        return url
    return urlunsplit(parts._replace(path="/api/chat", query=""))


async def _ramp(opts: Options, audio: Audio, args: argparse.Namespace) -> tuple[list[Trial], int]:
    base = http_base(opts.url)
    cap = args.max_n
    if cap is None:
        info = await ready(base, opts.api_key)
        cap = int(info.get("slots_total") or 64)
    trials: list[Trial] = []

    async def trial(n: int) -> Trial:
        for attempt in range(1, max(0, args.retries) + 2):
            await wait_idle(base, opts.api_key)
            t = await run_trial(opts, n, audio)
            t.attempt = attempt
            trials.append(t)
            print(
                f"duplex-load: N={n:<3} attempt {attempt}: "
                f"{'held' if t.held else 'broke: ' + '; '.join(t.reasons)}",
                file=sys.stderr,
                flush=True,
            )
            if all(r.failure and r.failure.startswith("unauthorized") for r in t.runs):
                raise Unauthorized(401, t.runs[0].failure or "unauthorized")
            if t.held or t.aggregate["failed_sessions"]:  # a refusal is not noise: no retry
                break
        return t

    good, bad, n = 0, None, 1
    while True:
        t = await trial(n)
        if not t.held:
            bad = n
            break
        good = n
        if n >= cap:
            break
        n = min(cap, n + args.ramp_step if args.ramp_step > 0 else n * 2)
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if (await trial(mid)).held:
            good = mid
        else:
            bad = mid
    return sorted(trials, key=lambda t: (t.n, t.attempt)), good


async def _main(args: argparse.Namespace) -> int:
    api_chat = args.dialect == "api-chat" or (args.dialect is None and is_api_chat_url(args.url))
    fmt: WireFormat = args.input_format
    out_fmt: WireFormat | None = args.output_format
    if api_chat and (str(fmt) != "pcm16@24000" or out_fmt is not None):
        print("duplex-load: --input-format/--output-format do not apply to api-chat (Opus)", file=sys.stderr)
        return EXIT_USAGE
    try:
        samples = load_audio(args.input, args.seconds, fmt.rate)
    except (OSError, WavError) as exc:
        print(f"duplex-load: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if api_chat:
        return await _main_api_chat(args, samples)
    audio = encode_audio(samples, fmt.name, fmt.rate * args.chunk_ms // 1000, sample_rate_hz=fmt.rate)
    config = create_duplex_session_config(
        voice=args.voice,
        persona=args.persona,
        input_format=str(fmt),
        output_format=None if out_fmt is None else out_fmt.name,
    )
    opts = Options(
        url=args.url,
        seconds=args.seconds,
        api_key=args.api_key,
        config=config,
        sync_start=args.sync_start,
        drain_s=args.drain,
        jitter_buffer_s=args.jitter_buffer_ms / 1000,
        ready_frames=audio.ready_frames,
        phases=args.phases,
        seed=args.seed,
        align=args.align,
        jitter=jitter_of(args),
        rate=fmt.rate,
        max_p99_ms=args.max_p99_ms,
    )
    meta = {
        "url": args.url,
        "dialect": "realtime",
        "seconds": args.seconds,
        "frames_per_session": audio.frames,
        "frames_expected_per_session": audio.expected_frames,
        "input_format": str(fmt),
        "output_format": str(out_fmt or "pcm16@24000"),
        "chunk_ms": args.chunk_ms,
        "align": args.align,
        "jitter": {"profile": args.jitter, **attrs.asdict(opts.jitter)},
    }
    return await _run(args, opts, audio, meta)


def jitter_of(args: argparse.Namespace) -> Jitter:
    """``--jitter``'s profile with the explicit ``--jitter-*`` knobs applied."""
    j = JITTER_PROFILES[args.jitter]
    return Jitter(
        mean_ms=j.mean_ms if args.jitter_mean_ms is None else args.jitter_mean_ms,
        burst_every_s=j.burst_every_s if args.jitter_burst_every is None else args.jitter_burst_every,
        burst_ms=j.burst_ms if args.jitter_burst_ms is None else args.jitter_burst_ms,
    )


async def _main_api_chat(args: argparse.Namespace, samples: Float32Array) -> int:
    url = _api_chat_url(args.url)
    t0 = time.process_time()
    messages = encode_opus_messages(samples)  # once, for every session of every trial
    encode_ms = (time.process_time() - t0) * 1000
    query = {k: v for k, v in (("voice_prompt", args.voice), ("text_prompt", args.persona)) if v is not None}
    opts = Options(
        url=url,
        seconds=args.seconds,
        api_key=args.api_key,
        config={},
        sync_start=args.sync_start,
        drain_s=args.drain,
        jitter_buffer_s=args.jitter_buffer_ms / 1000,
        dialect="api-chat",
        query=query,
        decode_every=args.decode_every,
        max_p99_ms=args.max_p99_ms,
    )
    meta = {
        "url": url,
        "dialect": "api-chat",
        "seconds": args.seconds,
        "frames_per_session": len(messages),
        "frames_expected_per_session": len(messages),
        "input_format": "ogg/opus@24000 (sphn 0.2, 2 x 40 ms packets per 80 ms message)",
        "output_format": "ogg/opus@24000",
        "opus_pre_encode_ms": round(encode_ms, 1),
        "decode_every": args.decode_every,
    }
    return await _run(args, opts, messages, meta)


async def _run(args: argparse.Namespace, opts: Options, audio: Audio, meta: dict[str, Any]) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        **meta,
        "input": args.input or "synthetic speech-like audio",
        "sync_start": args.sync_start,
        "phases": "sync" if args.sync_start else args.phases,
        "seed": args.seed,
        "jitter_buffer_ms": args.jitter_buffer_ms,
        "criteria": {
            "min_coverage": opts.min_coverage,
            "max_p99_latency_ms": opts.max_p99_ms,
            "max_p99_round_trip_ms": opts.max_p99_ms,  # the same bound, under its former name
            "lost": 0,
        },
    }
    if args.ramp:
        trials, largest = await _ramp(opts, audio, args)
        best = next((t for t in trials if t.n == largest and t.held), trials[-1])
        png = _plot(out / "load.png", best, f"N={best.n} sessions ({'held' if best.held else 'broke'})")
        ramp_png: str | None = str(out / "ramp.png")
        try:
            from .plot import plot_ramp

            plot_ramp(out / "ramp.png", [t.to_json() for t in trials])
        except Exception as exc:
            print(f"duplex-load: could not draw ramp.png: {exc}", file=sys.stderr)
            ramp_png = None
        report = {
            **meta,
            "mode": "ramp",
            "largest_n_held": largest,
            "png": png,
            "ramp_png": ramp_png,
            "trials": [t.to_json() for t in trials],
        }
        (out / "load.json").write_text(json.dumps(report, indent=1))
        print(ramp_table(trials))
        print(f"largest N that held real time: {largest}")
        return EXIT_OK
    trial = await run_trial(opts, args.sessions, audio)
    failures = [r.failure or "" for r in trial.runs]
    if all(f.startswith("unauthorized") for f in failures):
        print(f"duplex-load: {failures[0]}", file=sys.stderr)
        return EXIT_AUTH
    if all(f.startswith("connect_failed") for f in failures):
        print(f"duplex-load: {failures[0]}", file=sys.stderr)
        return EXIT_CONNECT
    if all(failures):
        print(f"duplex-load: no session could be opened: {sorted(set(failures))}", file=sys.stderr)
        return EXIT_REFUSED
    png = _plot(out / "load.png", trial, f"N={trial.n} sessions, {args.seconds:g} s each")
    report = {**meta, "mode": "single", "png": png, **trial.to_json()}
    (out / "load.json").write_text(json.dumps(report, indent=1))
    print(trial_table(trial))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sessions < 1 or args.seconds <= 0 or args.warmup < 0:
        print("duplex-load: --sessions must be >= 1, --seconds > 0 and --warmup >= 0", file=sys.stderr)
        return EXIT_USAGE
    if args.lean:
        return main_lean(args)
    try:
        return trio.run(_main, args)
    except Unauthorized as exc:
        print(f"duplex-load: unauthorized: {exc}", file=sys.stderr)
        return EXIT_AUTH
    except ConnectFailed as exc:
        print(f"duplex-load: {exc}", file=sys.stderr)
        return EXIT_CONNECT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
