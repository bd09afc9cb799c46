"""The session lifecycle, as the reference PersonaPlex lifecycle driver runs it, on a real server.

``max_sessions=2``: primary and secondary open (distinct server-allocated ids, identical
capabilities); a third is refused with ``resource_exhausted``; the same speech streams into both,
paced; the primary closes and a replacement with another persona is admitted with a fresh id;
secondary and replacement stream: the survivor keeps its response id, the replacement gets a
new one; a ``response.cancel`` mid-stream gives the cancelled terminal group and, on the next
frames, a new response under epoch 1. No other ``error`` anywhere. Every session's log then
replays identically with ``duplex-replay`` (logic and model level).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import numpy as np
import pytest
import trio

from duplex_actors.client import (
    AudioDelta,
    DuplexClient,
    Error,
    ResourceExhausted,
    ResponseCreated,
    ResponseDone,
    create_duplex_session_config,
    open_duplex_client,
)
from duplex_actors.client.audio import (
    pad_to_frames,
    pcm16_to_float,
    read_wav,
    rms,
    to_model_input,
)
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from tests.system_tools import require

from ..reliability.conftest import metric_sum
from .conftest import ServerProcess, start_server
from .helpers import get_text

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

FRAME = 1920


def _speech(tmp: Path) -> np.ndarray:
    """About 2.5 s of espeak-ng speech at 24 kHz."""
    require("espeak-ng")
    wav = tmp / "speech.wav"
    subprocess.run(
        ["espeak-ng", "-w", str(wav), "Hello, how are you today?"], check=True, capture_output=True
    )
    samples, rate = read_wav(wav)
    audio = to_model_input(samples, rate)
    return pad_to_frames(audio[: 24_000 * 3])


class Watch:
    """Everything one client saw; ``lags``: input minus output frames of each stream when it
    ended, the frames drained in earlier streams apart; ``backlogs``: for each stream, the most
    frames any client of that stream had sent in it before its first output of the stream (a
    prompt never seen before is prefilled first, so a new persona's first frames queue, and on a
    small CPU the prefill slows every other session's steps meanwhile)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client: DuplexClient | None = None
        self.events: list = []
        self.lags: list[int] = []
        self.backlogs: list[int] = []
        self.min_ahead = 0
        self.stream_start_sent = 0  # input frames sent before the current stream
        self.sent_before_output: int | None = None  # in the current stream, when its first output came

    def __call__(self, event) -> None:
        self.events.append(event)
        c = self.client
        if c is not None and isinstance(event, AudioDelta):
            if self.sent_before_output is None:
                self.sent_before_output = c.frames_sent - self.stream_start_sent
            # Input counted on the server: the client's samples plus the alignment pads it was
            # asked for (spec section 7), which can complete a frame before the client's own
            # samples do.
            padded = -(-sum(ms for _, ms in c.pads) // 80)
            self.min_ahead = min(self.min_ahead, c.frames_sent + padded - c.frames_received)

    def of(self, cls):
        return [e for e in self.events if isinstance(e, cls)]


async def _open(stack: AsyncExitStack, url: str, persona: str, watch: Watch) -> DuplexClient:
    client = await stack.enter_async_context(
        open_duplex_client(url, config=create_duplex_session_config(persona=persona), on_event=watch)
    )
    watch.client = client
    return client


async def _drained(server: ServerProcess) -> int:
    """Frames the server dropped so far to catch up (docs/protocol.md §7: a frame held back by a
    jitter burst may be drained; it has no output)."""
    status, text = await get_text(server, "/metrics")
    assert status == 200, text
    return int(metric_sum(text, "duplex_frames_dropped_total", reason="drained"))


async def _stream_all(server: ServerProcess, pairs: list[tuple[DuplexClient, np.ndarray, Watch]]) -> None:
    """Stream every pair's audio from one start, then wait until every input frame has its
    output or was drained (a busy machine makes a new persona's queued frames a backlog the
    scheduler may drain one of)."""
    drained_before = await _drained(server)
    # A client's frames without output from its earlier streams were drained then (counted there).
    owed_before = {id(client): client.frames_sent - client.frames_received for client, _, _ in pairs}
    for client, _, watch in pairs:
        watch.stream_start_sent, watch.sent_before_output = client.frames_sent, None
    start = trio.current_time() + 0.05

    async def one(client: DuplexClient, audio: np.ndarray, watch: Watch) -> None:
        await client.stream(audio, start=start)
        watch.lags.append(client.frames_sent - client.frames_received - owed_before[id(client)])

    async with trio.open_nursery() as nursery:
        for client, audio, watch in pairs:
            nursery.start_soon(one, client, audio, watch)
    with trio.fail_after(15):
        while True:
            missing = sum(
                client.frames_sent - client.frames_received - owed_before[id(client)]
                for client, _, _ in pairs
            )
            if missing <= 0 or missing <= await _drained(server) - drained_before:
                break
            await trio.sleep(0.1)
    backlog = max(watch.sent_before_output or 0 for _, _, watch in pairs)
    for _, _, watch in pairs:
        watch.backlogs.append(backlog)


def _check_stream(watch: Watch, *, tiny: bool) -> None:
    deltas = watch.of(AudioDelta)
    assert deltas, watch.name
    for d in deltas:
        assert len(d.pcm16) % (FRAME * 2) == 0  # whole 80 ms frames
    # Never more output than input. At most 4 frames (320 ms) behind when the input ends is the
    # server's own pacing, checked with the parrot model, whose step costs ~1 ms: the tiny
    # model's step is near the 80 ms frame on a small CPU, so its lag measures the machine
    # (_stream_all still waits for every frame to come back). A new persona's prompt is
    # prefilled before the session's first step, and its input queues meanwhile (a slow or
    # busy machine takes a second or more); the prefill's CPU also slows the other session's
    # steps on this host's cores: the pacing's 4 frames count from the stream's largest backlog.
    assert watch.min_ahead >= 0 and all(lag >= 0 for lag in watch.lags), (watch.name, watch.lags)
    if not tiny:
        bounds = [4 + backlog for backlog in watch.backlogs]
        within = all(lag <= b for lag, b in zip(watch.lags, bounds, strict=True))
        assert within, (watch.name, watch.lags, bounds)
    if tiny:
        audio = pcm16_to_float(b"".join(d.pcm16 for d in deltas))
        assert rms(audio) > 1e-4, f"{watch.name}: silent output"


def _assert_parrot(path: Path) -> None:
    steps = [rec for _, rec in read_log(path).records if isinstance(rec, r.Step)]
    by_epoch: dict[int, list[r.Step]] = {}
    for s in steps:
        by_epoch.setdefault(s.epoch, []).append(s)
    for group in by_epoch.values():
        for prev, cur in itertools.pairwise(group):
            assert cur.agent_codes == prev.user_codes, f"{path.name} frame {cur.frame_index}"


@pytest.mark.parametrize("model", ["tiny", "tiny-parrot"])
async def test_lifecycle(model, tmp_path, tiny_dir, parrot_dir):
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path, "--max-sessions", "2", model=model))
    url = f"{server.ws}/v1/realtime?duplex=1"
    speech = _speech(tmp_path)
    tiny = model == "tiny"
    watches = {name: Watch(name) for name in ("primary", "secondary", "replacement")}
    try:
        async with AsyncExitStack() as outer:
            secondary = await _open(outer, url, "You are the secondary.", watches["secondary"])
            async with AsyncExitStack() as inner:
                primary = await _open(inner, url, "You are the primary.", watches["primary"])
                assert primary.session_id != secondary.session_id
                assert primary.capabilities == secondary.capabilities
                assert primary.capabilities["supports_multi_session"] is True
                with pytest.raises(ResourceExhausted):
                    async with open_duplex_client(url):
                        pass
                await _stream_all(
                    server, [(primary, speech, watches["primary"]), (secondary, speech, watches["secondary"])]
                )
                for name in ("primary", "secondary"):
                    assert len({e.response_id for e in watches[name].of(ResponseCreated)}) == 1
            # primary closed: a replacement with another persona is admitted with a fresh id
            survivor_response = secondary.response_id
            replacement = await _open(outer, url, "You are the replacement.", watches["replacement"])
            assert replacement.session_id not in (primary.session_id, secondary.session_id)
            half = len(speech) // 2 // FRAME * FRAME
            await _stream_all(
                server,
                [
                    (secondary, speech, watches["secondary"]),
                    (replacement, speech[:half], watches["replacement"]),
                ],
            )
            assert secondary.response_id == survivor_response
            first_response = replacement.response_id
            assert first_response is not None and first_response != survivor_response
            await replacement.cancel()
            with trio.fail_after(10):
                await replacement.wait_for(lambda e: isinstance(e, ResponseDone))
            await _stream_all(server, [(replacement, speech[half:], watches["replacement"])])
            deltas = watches["replacement"].of(AudioDelta)
            assert {d.epoch for d in deltas} == {0, 1}
            assert replacement.response_id not in (None, first_response)
            done = watches["replacement"].of(ResponseDone)
            assert [(d.status, d.reason) for d in done] == [("cancelled", "client_cancelled")]
        for watch in watches.values():
            _check_stream(watch, tiny=tiny)  # every stream's lags
            assert watch.of(Error) == [], (watch.name, watch.of(Error))
    finally:
        await trio.to_thread.run_sync(server.stop)
    logs = sorted(server.log_dir.glob("*.dlog"))
    assert len(logs) == 3  # the three sessions (the refused one has none; the warm-up is the core's, logless)
    if not tiny:
        for path in logs:
            _assert_parrot(path)
    exe = str(Path(sys.executable).with_name("duplex-replay"))
    out = subprocess.run([exe, str(server.log_dir), "--model"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(logs)} logs, {len(logs)} reproduced, 0 not" in out.stdout
