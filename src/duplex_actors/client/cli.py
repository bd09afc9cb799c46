"""``duplex-client``: talk to a duplex-actors server with a WAV file and record the reply.

::

    duplex-client --url ws://127.0.0.1:8000/v1/realtime?duplex=1 --input speech.wav --output reply.wav \\
        [--voice NATF2.pt] [--persona "..."] [--transcript reply.txt] [--fast] [--api-key K] \\
        [--input-format pcm16@48000|pcmu|...] [--output-format pcm16|pcmu|pcma] [--resume]

Reads any WAV (8/16/24/32-bit PCM or float, any rate, mono or multi-channel: downmixed and
resampled to the ``--input-format``'s rate, 24 kHz by default), appends ``--tail-ms`` of silence
(240 ms by default) so the model answers the last words, pads to whole 80 ms frames, encodes
them in the input format (pcm16, pcm_f32le or G.711) and streams them in real time on absolute
80 ms deadlines (``--fast``: as fast as the server takes it, at most ``--window`` frames ahead of
the reply). Lockstep means one 80 ms reply frame per input frame: at 24 kHz input the reply WAV
is exactly as long as the padded input; at any other input rate the server's resampler holds
back a few ms, so the last frame does not come back (one frame fewer). The reply WAV is mono
PCM16 at the rate the server sent (24 kHz; 8 kHz for G.711 output, decoded). Progress goes to
stderr; the transcript (the model's text stream) to ``--transcript``. ``--resume`` opens a
resumable session (docs/protocol.md §10): when the connection drops the client connects again
by itself, within the server's grace period, and goes on where it stopped (each resume is
printed; the reply is the same as without the drop).

``--url ws://HOST:PORT/api/chat`` speaks the moshi / PersonaPlex dialect instead (detected from
the path): the WAV goes out as Ogg/Opus (24 kHz, as ``moshi.client`` sends it) after the
server's handshake, ``--voice``/``--persona`` become the ``voice_prompt``/``text_prompt`` query,
the Opus reply is decoded into the reply WAV (24 kHz) and the text pieces into the transcript.

Exit codes: 0 done; 2 bad arguments or unreadable input; 3 unauthorized (HTTP 401/403);
4 server full (``resource_exhausted``: try again later); 5 refused, connection failed or lost;
6 the reply was incomplete (not every frame came back in time; what came back is written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Final, Protocol, TextIO

import attrs
import numpy as np
import trio

from ..audio import FRAME_S, SAMPLE_RATE, AudioError, float_to_pcm16
from .apichat import is_api_chat_url, open_api_chat_client
from .audio import (
    INPUT_FORMAT_HELP,
    OUTPUT_FORMAT_HELP,
    Float32Array,
    WavError,
    WireFormat,
    encode_audio,
    pad_to_frames,
    parse_input_format,
    parse_output_format,
    read_wav,
    resample,
    to_mono,
    write_wav,
)
from .connection import create_duplex_session_config, open_duplex_client
from .errors import (
    ConfigRefused,
    ConnectFailed,
    ResourceExhausted,
    ServerClosed,
    SessionLost,
    SessionRefused,
    Unauthorized,
)
from .events import AudioDelta, Error, Resumed, ServerEvent, TranscriptDelta
from .opus import encode_opus_messages

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
EXIT_AUTH: Final = 3
EXIT_FULL: Final = 4
EXIT_FAILED: Final = 5
EXIT_INCOMPLETE: Final = 6

FORMATS_EPILOG: Final = f"input formats: {INPUT_FORMAT_HELP}; output formats: {OUTPUT_FORMAT_HELP}"


def input_format_arg(value: str) -> WireFormat:
    """argparse ``type=`` for ``--input-format``."""
    try:
        return parse_input_format(value)
    except AudioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_format_arg(value: str) -> WireFormat:
    """argparse ``type=`` for ``--output-format``."""
    try:
        return parse_output_format(value)
    except AudioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@attrs.define
class Reply:
    """What came back, collected in the client's receive task."""

    audio: list[bytes] = attrs.Factory(list)
    text: list[str] = attrs.Factory(list)
    frames: int = 0
    rate: int = SAMPLE_RATE
    first_audio_at: float | None = None
    errors: list[Error] = attrs.Factory(list)
    warn: TextIO | None = None
    quiet: bool = False
    input_rate: int = SAMPLE_RATE

    def on_event(self, event: ServerEvent) -> None:
        if isinstance(event, AudioDelta):
            self.audio.append(event.pcm16)
            self.rate = event.sample_rate_hz
            self.frames += event.frames
            if event.text:
                self.text.append(event.text)
            if self.first_audio_at is None:
                self.first_audio_at = event.received_at
        elif isinstance(event, TranscriptDelta):
            self.text.append(event.text)
        elif isinstance(event, Error):
            self.errors.append(event)
            if self.warn is not None:
                print(f"\nduplex-client: server error {event.code}: {event.message}", file=self.warn)
        elif isinstance(event, Resumed):
            if self.warn is not None and not self.quiet:
                print(
                    f"\nduplex-client: resumed after {event.gap_s * 1000:.0f} ms "
                    f"(connection {event.generation}, {event.attempts} attempt"
                    f"{'s' if event.attempts != 1 else ''}; "
                    f"{event.last_server_event_seq - event.replay_from_server_event_seq + 1} events replayed, "
                    f"{event.input_samples_resent / self.input_rate:.2f} s of input re-sent)",
                    file=self.warn,
                    flush=True,
                )


class Progress:
    """A one-line bar on a terminal (redrawn in place), else a line every ``every`` seconds."""

    def __init__(self, total_frames: int, reply: Reply, stream: TextIO, *, quiet: bool = False) -> None:
        self.total = total_frames
        self.reply = reply
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self.every = 0.1 if self.tty else 2.0
        self._last = 0.0

    def __call__(self, sent: int, _total: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self._last < self.every and sent < self.total):
            return
        self._last = now
        self.draw(sent)

    def draw(self, sent: int) -> None:
        if self.quiet:
            return
        width = 30
        done = int(width * sent / self.total) if self.total else width
        line = (
            f"[{'#' * done}{'.' * (width - done)}] {sent * FRAME_S:6.2f}/{self.total * FRAME_S:.2f} s sent, "
            f"{self.reply.frames * FRAME_S:6.2f} s back"
        )
        if self.tty:
            print("\r" + line, end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty and not self.quiet:
            print(file=self.stream, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex-client",
        description="Stream a WAV file to a duplex-actors server and record the spoken reply.",
        epilog="exit codes: 0 done, 2 bad arguments/input, 3 unauthorized, 4 server full, "
        "5 refused/connection failed, 6 incomplete reply. " + FORMATS_EPILOG,
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime?duplex=1", help="WebSocket URL")
    parser.add_argument("--input", "-i", required=True, help="WAV to send (any rate/channels/format)")
    parser.add_argument(
        "--output",
        "-o",
        required=True,
        help="reply WAV to write (mono PCM16 at the rate received: 24 kHz, 8 kHz for G.711 output)",
    )
    parser.add_argument("--voice", default=None, help="voice prompt, e.g. NATF2.pt (server default)")
    parser.add_argument("--persona", default=None, help="persona / system text (server default)")
    parser.add_argument("--transcript", default=None, help="write the reply's text here")
    parser.add_argument("--fast", action="store_true", help="send as fast as the server takes it")
    parser.add_argument("--window", type=int, default=50, help="--fast: frames ahead of the reply (50)")
    parser.add_argument("--tail-ms", type=float, default=240.0, help="silence appended (default 240)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="give up when no new frame has come back for this many seconds (default 15); a slow "
        "server that keeps answering is waited for",
    )
    parser.add_argument(
        "--open-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the session to open and its first frame, which wait for the "
        "server to prefill the prompt (minutes for a new persona on a CPU; default 600)",
    )
    parser.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY") or None)
    parser.add_argument("--beta", action="store_true", help="ask for OpenAI's beta event names")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="open a resumable session: when the connection drops, connect again and go on where "
        "it stopped, within the server's grace period (each resume is printed)",
    )
    parser.add_argument(
        "--align",
        choices=("client", "off"),
        default="client",
        help="alignment to the server's tick (docs/protocol.md §7): client (default: opt in and "
        "follow the server's hints, sending a chunk pad_ms early) or off (the session is never padded)",
    )
    parser.add_argument(
        "--input-format",
        type=input_format_arg,
        default=input_format_arg("pcm16"),
        help="what is sent: pcm16 (= pcm16@24000, the default), pcm16@48000, pcm_f32le@16000, "
        "pcmu/g711_ulaw, pcma/g711_alaw (8 kHz); the WAV is resampled to its rate",
    )
    parser.add_argument(
        "--output-format",
        type=output_format_arg,
        default=None,
        help="what the server sends back: pcm16 (24 kHz, the default) or pcmu/pcma (8 kHz G.711, "
        "decoded; the reply WAV is then 8 kHz)",
    )
    return parser


class _Replying(Protocol):
    @property
    def frames_received(self) -> int: ...

    async def wait_frames(self, count: int, *, timeout: float) -> None: ...


async def wait_for_reply(client: _Replying, frames: int, *, stall_s: float, first_s: float) -> str | None:
    """Wait until ``frames`` output frames have come back, for as long as they keep coming: the
    first within ``first_s`` (the server prefills the prompt first), each next one within
    ``stall_s`` of the one before. None once all came, else which limit was hit."""
    while client.frames_received < frames:
        got = client.frames_received
        limit, flag = (first_s, "--open-timeout") if got == 0 else (stall_s, "--timeout")
        try:
            await client.wait_frames(got + 1, timeout=limit)
        except trio.TooSlowError:
            what = "no frame came back" if got == 0 else "no further frame came back"
            return f"{what} within {limit:g} s ({flag})"
    return None


def prepare_input(path: str, tail_ms: float, rate: int = SAMPLE_RATE) -> Float32Array:
    """The WAV as mono float32 at ``rate`` with the silence tail, padded to whole 80 ms frames."""
    samples, wav_rate = read_wav(path)
    x = resample(to_mono(samples), wav_rate, rate)
    tail = np.zeros(round(max(0.0, tail_ms) / 1000 * rate), np.float32)
    return pad_to_frames(np.concatenate([x, tail]), rate * 80 // 1000)


async def run(args: argparse.Namespace, err: TextIO) -> int:
    fmt: WireFormat = args.input_format
    out_fmt: WireFormat | None = args.output_format
    if is_api_chat_url(args.url):
        if str(fmt) != "pcm16@24000" or out_fmt is not None or args.beta:
            print("duplex-client: --input-format/--output-format/--beta do not apply to /api/chat", file=err)
            return EXIT_USAGE
        if args.resume:
            print("duplex-client: /api/chat sessions cannot be resumed (--resume)", file=err)
            return EXIT_USAGE
        return await run_api_chat(args, err)
    try:
        samples = prepare_input(args.input, args.tail_ms, fmt.rate)
    except (OSError, WavError) as exc:
        print(f"duplex-client: cannot read {args.input}: {exc}", file=err)
        return EXIT_USAGE
    sent = samples.size // fmt.frame_samples
    if sent == 0:
        print(f"duplex-client: {args.input} holds no audio", file=err)
        return EXIT_USAGE
    audio = encode_audio(samples, fmt.name, sample_rate_hz=fmt.rate)
    frames = audio.expected_frames  # one fewer than sent when the server resamples
    config = create_duplex_session_config(
        voice=args.voice,
        persona=args.persona,
        input_format=str(fmt),
        output_format=None if out_fmt is None else out_fmt.name,
    )
    reply = Reply(warn=err, quiet=args.quiet, input_rate=fmt.rate)
    progress = Progress(sent, reply, err, quiet=args.quiet)
    try:
        async with open_duplex_client(
            args.url,
            api_key=args.api_key,
            config=config,
            beta=args.beta,
            queue_events=False,
            on_event=reply.on_event,
            alignment=args.align,
            open_timeout=args.open_timeout,
            resume=args.resume,
        ) as client:
            if not args.quiet:
                print(
                    f"duplex-client: session {client.session_id} open "
                    f"(voice {client.session.get('voice')}); sending {sent * FRAME_S:.2f} s of {fmt} "
                    f"{'as fast as accepted' if args.fast else 'in real time'}",
                    file=err,
                )
            times = await client.stream(
                audio,
                paced=not args.fast,
                max_ahead_frames=max(1, args.window) if args.fast else None,
                progress=progress,
            )
            # A pad the client applied adds its length to the server's input (whole frames here).
            frames += sum(pad for _, pad in client.pads) * 24 // 1920
            stalled = await wait_for_reply(client, frames, stall_s=args.timeout, first_s=args.open_timeout)
            progress.draw(sent)
            progress.finish()
    except Unauthorized as exc:
        progress.finish()
        print(f"duplex-client: unauthorized (HTTP {exc.status}): {exc.message}; check --api-key", file=err)
        return EXIT_AUTH
    except ResourceExhausted as exc:
        progress.finish()
        print(f"duplex-client: the server is full ({exc.message}); try again later", file=err)
        return EXIT_FULL
    except ConfigRefused as exc:
        print(f"duplex-client: the session config was refused: {exc.code}: {exc.message}", file=err)
        return EXIT_FAILED
    except SessionLost as exc:
        progress.finish()
        print(
            f"\nduplex-client: the connection dropped and the session could not be resumed: {exc}", file=err
        )
        return EXIT_FAILED
    except (SessionRefused, ConnectFailed, ServerClosed) as exc:
        progress.finish()
        print(f"duplex-client: {exc}", file=err)
        return EXIT_FAILED

    pcm = b"".join(reply.audio)
    write_wav(args.output, pcm, reply.rate)
    transcript = "".join(reply.text)
    if args.transcript:
        Path(args.transcript).write_text(transcript + ("\n" if transcript else ""), encoding="utf-8")
    if not args.quiet:
        ttfa = (
            (reply.first_audio_at - times[0]) * 1000 if reply.first_audio_at is not None and times else None
        )
        print(
            f"duplex-client: wrote {args.output}: {reply.frames} frames ({reply.frames * FRAME_S:.2f} s) for "
            f"{sent} sent; first audio after {ttfa:.0f} ms; transcript {len(transcript)} characters"
            + (f"; {client.resumes} resume{'s' if client.resumes != 1 else ''}" if args.resume else "")
            if ttfa is not None
            else f"duplex-client: wrote {args.output}: no audio came back",
            file=err,
        )
    if stalled is not None or reply.frames < frames:
        print(
            f"duplex-client: incomplete reply: {reply.frames} of {frames} frames came back"
            + (f": {stalled}" if stalled else ""),
            file=err,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK


async def run_api_chat(args: argparse.Namespace, err: TextIO) -> int:
    """The ``/api/chat`` dialect: Opus both ways, ``--voice``/``--persona`` as the
    ``voice_prompt``/``text_prompt`` query; streams after the handshake."""
    try:
        samples = prepare_input(args.input, args.tail_ms)
    except (OSError, WavError) as exc:
        print(f"duplex-client: cannot read {args.input}: {exc}", file=err)
        return EXIT_USAGE
    messages = encode_opus_messages(samples)
    sent = len(messages)
    if sent == 0:
        print(f"duplex-client: {args.input} holds no audio", file=err)
        return EXIT_USAGE
    reply = Reply(warn=err)
    progress = Progress(sent, reply, err, quiet=args.quiet)
    try:
        async with open_api_chat_client(
            args.url,
            api_key=args.api_key,
            text_prompt=args.persona,
            voice_prompt=args.voice,
            decode=True,
            handshake_timeout=args.open_timeout,
        ) as client:
            if not args.quiet:
                print(
                    f"duplex-client: handshake {client.handshake!r}; sending {sent * FRAME_S:.2f} s of "
                    f"Ogg/Opus {'as fast as accepted' if args.fast else 'in real time'}",
                    file=err,
                )

            def track(_sent: int, total: int) -> None:
                reply.frames = client.frames_received
                progress(_sent, total)

            await client.stream(
                messages,
                paced=not args.fast,
                max_ahead_frames=max(1, args.window) if args.fast else None,
                progress=track,
            )
            stalled = await wait_for_reply(client, sent, stall_s=args.timeout, first_s=args.open_timeout)
            reply.frames = client.frames_received
            progress.draw(sent)
            progress.finish()
            for message in client.errors:
                print(f"\nduplex-client: server error: {message}", file=err)
    except Unauthorized as exc:
        progress.finish()
        print(f"duplex-client: unauthorized (HTTP {exc.status}): {exc.message}; check --api-key", file=err)
        return EXIT_AUTH
    except ResourceExhausted as exc:
        progress.finish()
        print(f"duplex-client: the server is full ({exc.message}); try again later", file=err)
        return EXIT_FULL
    except (SessionRefused, ConnectFailed, ServerClosed) as exc:
        progress.finish()
        print(f"duplex-client: {exc}", file=err)
        return EXIT_FAILED
    pcm = client.decoded()
    write_wav(args.output, float_to_pcm16(pcm), SAMPLE_RATE)
    transcript = "".join(client.text)
    if args.transcript:
        Path(args.transcript).write_text(transcript + ("\n" if transcript else ""), encoding="utf-8")
    frames = client.frames_received
    if not args.quiet:
        print(
            f"duplex-client: wrote {args.output}: {frames} frames ({pcm.size / SAMPLE_RATE:.2f} s) for {sent} "
            f"sent; transcript {len(transcript)} characters",
            file=err,
        )
    if stalled is not None or frames < sent:
        print(
            f"duplex-client: incomplete reply: {frames} of {sent} frames came back"
            + (f": {stalled}" if stalled else ""),
            file=err,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return trio.run(run, args, sys.stderr)
    except KeyboardInterrupt:
        print("\nduplex-client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
