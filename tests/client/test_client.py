"""``duplex_actors.client`` against a real ``duplex-actors serve --model tiny-parrot`` process:
open, paced and unpaced streaming, cancel, update, close, events, and typed refusals."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.client import (
    AudioDelta,
    ConfigRefused,
    ConnectFailed,
    DuplexClient,
    RequestRefused,
    ResourceExhausted,
    ResponseCreated,
    ResponseDone,
    ServerClosed,
    ServerEvent,
    SessionClosed,
    SessionCreated,
    SessionUpdated,
    Unauthorized,
    create_duplex_session_config,
    open_duplex_client,
)
from duplex_actors.client.audio import pcm16_to_float, rms, speech_like
from tests.e2e.conftest import ServerProcess
from tests.e2e.helpers import wait_idle

from .conftest import API_KEY

SPEECH = speech_like(1.2, seed=5)  # 15 frames


def _deltas(events: list[ServerEvent]) -> list[AudioDelta]:
    return [e for e in events if isinstance(e, AudioDelta)]


async def test_open_stream_cancel_update_close(realtime_url: str) -> None:
    config = create_duplex_session_config(voice="NATM1.pt", persona="Answer in one word.")
    seen: list[ServerEvent] = []
    with trio.fail_after(30):
        async with open_duplex_client(realtime_url, config=config, on_event=seen.append) as client:
            assert client.session_id is not None and client.session_id.startswith("sess_")
            assert client.session["voice"] == "NATM1.pt"
            assert client.session["instructions"] == "Answer in one word."
            assert client.capabilities["chunk_period_ms"] == 80
            assert [type(e) for e in seen[:2]] == [SessionCreated, SessionUpdated]

            times = await client.stream(SPEECH)  # paced on absolute 80 ms deadlines
            frames = SPEECH.size // FRAME_SAMPLES
            # The grid server may ask this (opted-in) client to align: a hinted chunk goes out
            # pad_ms early with 80 - pad_ms ms of audio, so the stream's chunks move by the pads.
            padded = -(-sum(ms for _, ms in client.pads) // 80)
            assert frames == client.frames_sent and len(times) == frames + padded
            # Every chunk goes out at start + (its first sample) / 24 kHz, the last one too; a
            # hinted chunk goes out its pad_ms early (the last one too, if the hint came then).
            last_pad_s = sum(ms for at, ms in client.pads if at == times[-1]) / 1000
            span, budget = times[-1] - times[0], client.sends[-2][1] / 24_000 - last_pad_s
            assert budget - 0.001 <= span < budget + 0.06, ("pacing drifted", client.pads)
            assert abs(float(np.median(np.diff(times))) - 0.08) < 0.01, "frames were not paced at 80 ms"
            await client.wait_frames(frames, timeout=10)

            deltas = _deltas(seen)
            assert [d.frame_index for d in deltas] == list(range(frames))
            assert {d.epoch for d in deltas} == {0} and len({d.response_id for d in deltas}) == 1
            assert all(len(d.pcm16) == 2 * FRAME_SAMPLES for d in deltas)
            reply = pcm16_to_float(b"".join(d.pcm16 for d in deltas))
            assert rms(reply) > 1e-3, "the parrot echoes its input: the reply must not be silent"
            first_response = client.response_id
            assert first_response == deltas[0].response_id

            mark = client.events_received
            await client.cancel()
            done = await client.wait_for(ResponseDone, after=mark)
            assert isinstance(done, ResponseDone)
            assert (done.response_id, done.status, done.reason) == (
                first_response,
                "cancelled",
                "client_cancelled",
            )
            assert client.response_id is None

            await client.send_audio(SPEECH[: 2 * FRAME_SAMPLES])  # float samples, converted to pcm16
            created = await client.wait_for(ResponseCreated, after=mark)
            assert isinstance(created, ResponseCreated) and created.response_id != first_response
            delta = await client.wait_for(AudioDelta, after=created.seq)
            assert isinstance(delta, AudioDelta) and delta.epoch == 1 and delta.frame_index == frames

            updated = await client.update(persona="Answer in one word.")  # the same value: accepted
            assert updated.session["instructions"] == "Answer in one word."
            with pytest.raises(RequestRefused) as refused:
                await client.update(voice="NATF2.pt")  # audio reached the model: no voice change
            assert refused.value.code == "voice_update_unsupported"

            closed = await client.close()
            assert isinstance(closed, SessionClosed) and closed.reason == "client_close"
            assert client.close_code == 1000 and client.is_closed
            assert await client.close() is closed  # idempotent
            with pytest.raises(ServerClosed):
                await client.send_audio(SPEECH[:FRAME_SAMPLES])
    assert isinstance(seen[-1], SessionClosed)


async def test_events_iterator_with_unpaced_stream(realtime_url: str) -> None:
    types: list[str] = []
    frames = 0
    with trio.fail_after(30):
        # beta names, same classes. Unaligned ("off"): a session sending ahead of real time may
        # have a queued frame drained when the host is busy (docs/protocol.md §7), and this test
        # counts every frame back.
        async with open_duplex_client(realtime_url, beta=True, alignment="off") as client:
            async with trio.open_nursery() as nursery:

                async def send_then_close() -> None:
                    start = trio.current_time()
                    await client.stream(SPEECH, paced=False, max_ahead_frames=4)
                    assert trio.current_time() - start < 0.08 * 15, "unpaced must beat real time"
                    await client.wait_frames(15)
                    await client.close()

                nursery.start_soon(send_then_close)
                async for event in client.events():
                    types.append(event.type)
                    if isinstance(event, AudioDelta):
                        frames += event.frames
    assert frames == 15
    assert "response.audio.delta" in types and types[-1] == "session.closed"


async def test_native_dialect(server: ServerProcess) -> None:
    config = create_duplex_session_config(voice="NATF2.pt", input_format="pcm_f32le")
    seen: list[ServerEvent] = []
    with trio.fail_after(30):
        async with open_duplex_client(
            f"{server.ws}/v1/duplex", config=config, on_event=seen.append
        ) as client:
            assert client.dialect == "native" and client.input_format == "pcm_f32le"
            await client.stream(SPEECH[: 5 * FRAME_SAMPLES], paced=False)
            await client.wait_frames(5)
            created = [e for e in seen if isinstance(e, ResponseCreated)]
            assert created and created[0].epoch == 0
    assert [d.frame_index for d in _deltas(seen)] == [0, 1, 2, 3, 4]


async def test_resource_exhausted_is_typed(server: ServerProcess, realtime_url: str) -> None:
    await wait_idle(server)
    with trio.fail_after(30):
        async with open_duplex_client(realtime_url), open_duplex_client(realtime_url):
            with pytest.raises(ResourceExhausted) as exc:
                async with open_duplex_client(realtime_url):
                    pytest.fail("a third session was admitted with max_sessions=2")
            assert exc.value.code == "resource_exhausted" and exc.value.close_code == 1013
        # both slots are released before session.closed: a new session is admitted at once
        async with open_duplex_client(realtime_url) as client:
            assert client.session_id


async def test_config_refused(realtime_url: str) -> None:
    with trio.fail_after(20), pytest.raises(ConfigRefused) as exc:
        async with open_duplex_client(realtime_url, config=create_duplex_session_config(voice="NOPE.pt")):
            pass
    assert exc.value.code == "invalid_voice"


async def test_exceptions_in_the_body_propagate_unwrapped(server: ServerProcess, realtime_url: str) -> None:
    with trio.fail_after(20), pytest.raises(KeyError, match="mine"):
        async with open_duplex_client(realtime_url) as client:
            await client.send_audio(SPEECH[:FRAME_SAMPLES])
            raise KeyError("mine")
    await wait_idle(server)  # the session was closed on the way out

    def boom(event: ServerEvent) -> None:
        if isinstance(event, AudioDelta):
            raise RuntimeError("callback failed")

    with trio.fail_after(20), pytest.raises(RuntimeError, match="callback failed"):
        async with open_duplex_client(realtime_url, on_event=boom) as client:
            await client.send_audio(SPEECH[:FRAME_SAMPLES])
            with pytest.raises(ServerClosed):
                await client.wait_frames(5)


async def test_connect_failures(server: ServerProcess) -> None:
    with trio.fail_after(20), pytest.raises(ConnectFailed):
        async with open_duplex_client("ws://127.0.0.1:9/v1/realtime"):
            pass


async def test_unauthorized(locked_server: ServerProcess) -> None:
    url = f"{locked_server.ws}/v1/realtime?duplex=1"
    with trio.fail_after(30):
        for key in (None, "wrong"):
            with pytest.raises(Unauthorized) as exc:
                async with open_duplex_client(url, api_key=key):
                    pass
            assert exc.value.status == 401 and exc.value.code == "unauthorized"
        async with open_duplex_client(url, api_key=API_KEY) as client:
            assert isinstance(client, DuplexClient) and client.session_id
