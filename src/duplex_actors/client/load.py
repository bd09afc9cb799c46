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
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import attrs
import numpy as np
import trio

from ..audio import FRAME_S
from . import load_ramp, load_report
from .apichat import is_api_chat_url
from .audio import Float32Array, WavError, WireFormat, encode_audio, read_wav, resample, speech_like, to_mono
from .cli import FORMATS_EPILOG, input_format_arg, output_format_arg
from .connection import create_duplex_session_config
from .errors import ConnectFailed, Unauthorized
from .jitter import JITTER_PROFILES, Jitter
from .lean import main_lean
from .load_runner import Audio, run_trial
from .load_trial import MAX_P99_MS, Options
from .opus import encode_opus_messages
from .phases import PHASES

EXIT_OK, EXIT_USAGE, EXIT_AUTH, EXIT_REFUSED, EXIT_CONNECT = 0, 2, 3, 4, 5
CHUNK_MS: Final = (10, 20, 40, 80, 100)
ALIGN: Final = ("client", "server", "off", "none")


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
        trials, largest = await load_ramp.ramp(opts, audio, args)
        best = next((t for t in trials if t.n == largest and t.held), trials[-1])
        png = load_report.draw_trial(
            out / "load.png", best, f"N={best.n} sessions ({'held' if best.held else 'broke'})"
        )
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
        print(load_report.ramp_table(trials))
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
    png = load_report.draw_trial(out / "load.png", trial, f"N={trial.n} sessions, {args.seconds:g} s each")
    report = {**meta, "mode": "single", "png": png, **trial.to_json()}
    (out / "load.json").write_text(json.dumps(report, indent=1))
    print(load_report.trial_table(trial))
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
