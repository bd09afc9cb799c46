"""The voice-agent frameworks, unmodified from PyPI (the ``frameworks`` extra of pyproject.toml),
against a real ``duplex-actors serve --model tiny`` on the stock ``/v1/realtime``, in real time.

Each framework is set up as its documentation says, with only the URL, the model id and a dummy
key given (their default voices, turn detection and interruption handling stay on), and streams
0.8 s of silence then 3.2 s of a voiced sound, one 80 ms frame at a time. The checks: it
connected and its ``session.update`` was applied (its instructions; its default OpenAI voice
resolved through the alias table); every audio frame it delivered equals the server's logged
output, all of it; the model's text reached it; it surfaced no error and the log refused
nothing; the model's context was never reset (one epoch: a framework's barge-in cancels end the
response only); it closed cleanly (the log is finished and replays identically). The
frameworks are asyncio-based, so each runs in a worker thread with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic
from duplex_actors.session import events as ev

from .conftest import ServerProcess, start_server
from .helpers import FRAME_PCM16_BYTES, read_records, wait_idle

INSTRUCTIONS = "You sell bicycles."
SILENCE_S, SPEECH_S = 0.8, 3.2
FRAMES = round((SILENCE_S + SPEECH_S) / 0.08)  # 50
RUN_TIMEOUT_S = 60.0


def stream_pcm16() -> bytes:
    """0.8 s of silence, then 3.2 s of a voiced vowel (loud enough for speech_started)."""
    n = round(SPEECH_S * 24_000)
    t = np.arange(n) / 24_000
    voiced = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    voiced += 0.02 * np.random.default_rng(7).standard_normal(n)
    pcm = (np.clip(voiced, -1, 1) * 32767).astype("<i2").tobytes()
    return b"\0\0" * round(SILENCE_S * 24_000) + pcm


async def paced(pcm: bytes, send: Callable[[bytes], Any]) -> None:
    """``send`` one 80 ms frame at a time, in real time (``send`` may be async)."""
    start = time.monotonic()
    for i in range(0, len(pcm), FRAME_PCM16_BYTES):
        result = send(pcm[i : i + FRAME_PCM16_BYTES])
        if asyncio.iscoroutine(result):
            await result
        await asyncio.sleep(max(0.0, start + (i + FRAME_PCM16_BYTES) / 48_000 - time.monotonic()))


async def until(predicate: Callable[[], bool], what: Callable[[], str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what()}")
        await asyncio.sleep(0.02)


class ErrorLogs(logging.Handler):
    """ERROR records a framework logs (e.g. the Agents SDK's "Failed to validate server event")."""

    def __init__(self, *names: str) -> None:
        super().__init__(logging.ERROR)
        self.names = names
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> ErrorLogs:
        for name in self.names:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            logging.getLogger(name).removeHandler(self)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("frameworks"), "--max-sessions", "2", model="tiny")
    yield server
    server.stop()


async def run_framework(server: ServerProcess, drive: Callable[[], Any]) -> tuple[dict[str, Any], Path]:
    """Run ``drive`` (an async function of the framework) in a worker thread; returns its report
    and the session's log (the one log it added)."""
    before = set(server.log_dir.glob("*.dlog"))

    def run() -> dict[str, Any]:
        report: dict[str, Any] = asyncio.run(asyncio.wait_for(drive(), RUN_TIMEOUT_S))
        return report

    with trio.fail_after(RUN_TIMEOUT_S + 10):
        report = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    (log,) = set(server.log_dir.glob("*.dlog")) - before
    await wait_idle(server)
    return report, log


async def replays_at_model_level(log: Path) -> None:
    """``duplex-replay LOG --model``: the real engine re-run on the logged input gives every
    logged step (a cancel that kept the context restarted nothing)."""
    exe = str(Path(sys.executable).with_name("duplex-replay"))
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run([exe, str(log), "--model"], capture_output=True, text=True, timeout=120)
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def check_session(
    server: ServerProcess,
    log: Path,
    report: dict[str, Any],
    *,
    voice: str | None,
    refusals: tuple[str, ...] = (),
    errors: tuple[str, ...] = (),
    text_exact: bool = True,
) -> list[Any]:
    """The checks every framework run passes; ``refusals``/``errors``: the codes expected."""
    records = await read_records(server, log.stem)
    replay = replay_logic(log)
    assert replay.identical, replay.summary()  # finished (close + end) and replays exactly
    # Its session.update was applied: instructions, and its OpenAI voice through the alias table.
    updated = [e.config for e in replay.events if isinstance(e, ev.SessionUpdated)]
    assert any(c.get("instructions") == INSTRUCTIONS for c in updated), updated
    if voice is not None:  # (Pipecat names no voice: the default one)
        assert any(c.get("voice") == voice and c.get("voice_prompt", "").endswith(".pt") for c in updated)
    # Every frame the framework delivered is the server's logged output, all of it, in order.
    steps = [rec for rec in records if isinstance(rec, r.Step)]
    assert len(steps) == FRAMES
    assert report["audio"] == b"".join(s.pcm16 for s in steps)
    # The model's text reached the framework.
    text = "".join(s.text_piece for s in steps)
    assert text and report["text"]
    if text_exact:  # every piece, but the last frame's may follow the run's end (its last audio)
        assert text.startswith(report["text"])
        assert len(report["text"]) >= len(text) - len(steps[-1].text_piece)
    else:
        assert report["text"] in text
    # Nothing refused, no error but those expected, no error surfaced by the framework.
    assert [rec.code for rec in records if isinstance(rec, r.Rejected)] == list(refusals)
    assert {e.code for e in replay.events if isinstance(e, ev.Error)} <= set(errors) | set(refusals)
    assert report["errors"] == [], report["errors"]
    # One epoch: the model's context was never reset (a barge-in cancel ended the response only).
    assert {s.epoch for s in steps} == {0}
    assert not [rec for rec in records if isinstance(rec, r.Cancel | r.ClearOutput) and rec.reset]
    return records


# -- OpenAI Agents SDK ---------------------------------------------------------------------------
async def agents_sdk(port: int) -> dict[str, Any]:
    from agents.realtime import RealtimeAgent, RealtimeRunner

    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    runner = RealtimeRunner(starting_agent=agent)
    report: dict[str, Any] = {"audio": b"", "text": "", "errors": [], "events": []}
    with ErrorLogs("openai.agents") as logged:
        session = await runner.run(
            model_config={"url": f"ws://127.0.0.1:{port}/v1/realtime?model=tiny", "api_key": "unused"}
        )
        async with session:
            sender = asyncio.create_task(paced(stream_pcm16(), session.send_audio))
            async for event in session:
                report["events"].append(event.type)
                if event.type == "audio":
                    report["audio"] += event.audio.data
                elif event.type == "raw_model_event" and event.data.type == "transcript_delta":
                    report["text"] += event.data.delta
                elif event.type == "error":
                    report["errors"].append(repr(event.error))
                if len(report["audio"]) >= FRAMES * FRAME_PCM16_BYTES:
                    break
            await sender
    report["errors"] += logged.messages
    return report


async def test_openai_agents_sdk_realtime_runner(tiny_server):
    report, log = await run_framework(tiny_server, lambda: agents_sdk(tiny_server.port))
    records = await check_session(tiny_server, log, report, voice="ash")
    # Its barge-in: the item truncated where playback was, then retrieved; a cancel that kept
    # the context.
    # Whether its barge-in truncates depends on where its playback clock is at speech_started;
    # when it does, it then retrieves the item it truncated.
    truncated = {rec.item_id for rec in records if isinstance(rec, r.Truncate)}
    assert truncated <= {rec.item_id for rec in records if isinstance(rec, r.RetrieveItem)}
    await replays_at_model_level(log)


# -- Pipecat -------------------------------------------------------------------------------------
async def pipecat(port: int, *, text_start: bool) -> dict[str, Any]:
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        InputAudioRawFrame,
        LLMRunFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    report: dict[str, Any] = {"audio": b"", "text": "", "errors": []}

    class Sink(FrameProcessor):  # type: ignore[misc]  # a framework class (not followed by mypy)
        """Takes what the service pushes: its audio and text, and every error frame."""

        async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                report["audio"] += frame.audio
            elif isinstance(frame, TTSTextFrame):
                report["text"] += frame.text
            elif isinstance(frame, ErrorFrame):
                report["errors"].append(frame.error)
            await self.push_frame(frame, direction)

    llm = OpenAIRealtimeLLMService(
        api_key="unused",
        base_url=f"ws://127.0.0.1:{port}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model="tiny", system_instruction=INSTRUCTIONS),
    )
    errors_up, sink = Sink(), Sink()
    processors: list[Any] = [errors_up]
    if text_start:  # the example's start: a user text message and a run of the LLM
        context = LLMContext(messages=[{"role": "user", "content": "Say hello!"}], tools=[])
        aggregators = LLMContextAggregatorPair(context)
        processors += [aggregators.user(), llm, sink, aggregators.assistant()]
    else:
        processors += [llm, sink]
    task = PipelineTask(
        Pipeline(processors), params=PipelineParams(audio_in_sample_rate=24_000, audio_out_sample_rate=24_000)
    )

    async def feed() -> None:
        # A transport's audio starts once the call is up; here, once the service has configured
        # its session (its session.update answered): audio before it would lock the default
        # persona in before the instructions arrive (they are refused after the first frame).
        await until(lambda: bool(llm._api_session_ready), lambda: "the service's session.updated")
        if text_start:
            await task.queue_frames([LLMRunFrame()])

        async def send(chunk: bytes) -> None:
            await task.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24_000, num_channels=1))

        await paced(stream_pcm16(), send)
        await until(
            lambda: len(report["audio"]) >= FRAMES * FRAME_PCM16_BYTES,
            lambda: f"every output frame: {len(report['audio']) / FRAME_PCM16_BYTES} of {FRAMES}",
        )
        await task.queue_frame(EndFrame())

    await asyncio.gather(PipelineRunner(handle_sigint=False).run(task), feed())
    return report


@pytest.mark.parametrize("text_start", [False, True], ids=["audio", "text-message-start"])
async def test_pipecat_openai_realtime_service(tiny_server, text_start: bool):
    report, log = await run_framework(tiny_server, lambda: pipecat(tiny_server.port, text_start=text_start))
    # The example's response.create is answered as OpenAI answers one during a response.
    refusals = ("conversation_already_has_active_response",) if text_start else ()
    records = await check_session(tiny_server, log, report, voice=None, refusals=refusals)
    items = [rec for rec in records if isinstance(rec, r.TextItem)]
    assert [(i.role, i.text) for i in items] == ([("user", "Say hello!")] if text_start else [])


# -- LiveKit Agents --------------------------------------------------------------------------------
async def livekit_bare(port: int) -> dict[str, Any]:
    import aiohttp
    from livekit import rtc
    from livekit.plugins import openai

    report: dict[str, Any] = {"audio": b"", "text": "", "errors": []}
    async with aiohttp.ClientSession() as http:
        model = openai.realtime.RealtimeModel(
            model="tiny", api_key="unused", base_url=f"http://127.0.0.1:{port}/v1", http_session=http
        )
        session = model.session()
        tasks: set[asyncio.Task[None]] = set()

        async def consume(generation: Any) -> None:
            async for message in generation.message_stream:

                async def audio(stream: Any) -> None:
                    async for frame in stream:
                        report["audio"] += bytes(frame.data)

                async def text(stream: Any) -> None:
                    async for piece in stream:
                        report["text"] += piece

                await asyncio.gather(audio(message.audio_stream), text(message.text_stream))

        def created(generation: Any) -> None:
            task = asyncio.ensure_future(consume(generation))
            tasks.add(task)

        session.on("generation_created", created)
        session.on("error", lambda e: report["errors"].append(repr(e)))
        await session.update_instructions(INSTRUCTIONS)
        await paced(stream_pcm16(), lambda chunk: session.push_audio(rtc.AudioFrame(chunk, 24_000, 1, 1920)))
        await until(
            lambda: len(report["audio"]) >= FRAMES * FRAME_PCM16_BYTES,
            lambda: f"every output frame: {len(report['audio']) / FRAME_PCM16_BYTES} of {FRAMES}",
        )
        await session.aclose()
        await model.aclose()
        for task in tasks:
            task.cancel()
    return report


@pytest.fixture
def livekit_plugins() -> None:
    """LiveKit registers its plugins on import, which it allows on the main thread only."""
    import livekit.agents
    import livekit.plugins.openai  # noqa: F401


async def test_livekit_realtime_session(tiny_server, livekit_plugins):
    report, log = await run_framework(tiny_server, lambda: livekit_bare(tiny_server.port))
    await check_session(tiny_server, log, report, voice="marin")


async def livekit_agent_session(port: int) -> dict[str, Any]:
    import aiohttp
    from livekit import rtc
    from livekit.agents import Agent, AgentSession
    from livekit.agents.voice import io
    from livekit.plugins import openai

    report: dict[str, Any] = {"audio": b"", "text": "", "errors": []}

    class QueueInput(io.AudioInput):  # type: ignore[misc]  # a framework class (not followed by mypy)
        def __init__(self) -> None:
            super().__init__(label="test-input")
            self.queue: asyncio.Queue[rtc.AudioFrame] = asyncio.Queue()

        async def __anext__(self) -> rtc.AudioFrame:
            return await self.queue.get()

    class CaptureOutput(io.AudioOutput):  # type: ignore[misc]  # a framework class (not followed by mypy)
        """A sink that plays everything at once: what the agent hands its speaker."""

        def __init__(self) -> None:
            super().__init__(label="test-output", capabilities=io.AudioOutputCapabilities(pause=False))
            self.pushed = 0.0
            self.open = False

        async def capture_frame(self, frame: rtc.AudioFrame) -> None:
            await super().capture_frame(frame)
            report["audio"] += bytes(frame.data)
            self.pushed += frame.duration
            self.open = True

        def _finish(self, interrupted: bool) -> None:
            if self.open:
                self.open = False
                self.on_playback_finished(playback_position=self.pushed, interrupted=interrupted)
                self.pushed = 0.0

        def flush(self) -> None:
            super().flush()
            self._finish(False)

        def clear_buffer(self) -> None:
            self._finish(True)

    class CaptureText(io.TextOutput):  # type: ignore[misc]  # a framework class (not followed by mypy)
        def __init__(self) -> None:
            super().__init__(label="test-text", next_in_chain=None)

        async def capture_text(self, text: str) -> None:
            report["text"] += text

        def flush(self) -> None:
            pass

    async with aiohttp.ClientSession() as http:
        model = openai.realtime.RealtimeModel(
            model="tiny", api_key="unused", base_url=f"http://127.0.0.1:{port}/v1", http_session=http
        )
        session: AgentSession[None] = AgentSession(llm=model)
        source = QueueInput()
        session.input.audio = source
        session.output.audio = CaptureOutput()
        session.output.transcription = CaptureText()
        session.on("error", lambda e: report["errors"].append(repr(e)))
        await session.start(agent=Agent(instructions=INSTRUCTIONS), record=False)
        await paced(
            stream_pcm16(), lambda chunk: source.queue.put_nowait(rtc.AudioFrame(chunk, 24_000, 1, 1920))
        )
        await until(
            lambda: len(report["audio"]) >= FRAMES * FRAME_PCM16_BYTES,
            lambda: f"every output frame: {len(report['audio']) / FRAME_PCM16_BYTES} of {FRAMES}",
        )
        await session.aclose()
    return report


async def test_livekit_agent_session(tiny_server, livekit_plugins):
    report, log = await run_framework(tiny_server, lambda: livekit_agent_session(tiny_server.port))
    # Its barge-in sends response.cancel twice at speech_started: the first ends the response
    # (the context stays), the second gets OpenAI's "Cancellation failed" error, which LiveKit
    # drops by its text.
    records = await check_session(
        tiny_server, log, report, voice="marin", errors=("response_cancel_not_active",), text_exact=False
    )
    cancels = [rec for rec in records if isinstance(rec, r.Cancel)]
    assert len(cancels) >= 2 and not any(c.reset for c in cancels)
    await replays_at_model_level(log)
