"""The native dialect ``/v1/duplex`` (docs/protocol.md §5): ``session.create`` first, binary audio both ways,
``session.close``; and its refusals (bad first message, ``config_timeout``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import trio

from .helpers import (
    FRAME_PCM16_BYTES,
    FRAME_SAMPLES,
    connect,
    f32,
    feed,
    pcm16,
    tone_and_noise,
)

N_FRAMES = 10


def audio(seed: int = 21):
    return tone_and_noise(N_FRAMES * FRAME_SAMPLES / 24_000, seed=seed)


async def realtime_reference(server, samples) -> bytes:
    async with connect(server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.append(pcm16(samples))
        await c.wait_until(lambda: c.output_frames() == N_FRAMES)
        return c.output_audio()


@pytest.mark.parametrize(
    "create",
    [
        {"type": "session.create", "event_id": "c0", "session": {"voice": "NATM1.pt", "instructions": "Hi."}},
        {"type": "session.create", "voice": "NATM1.pt", "instructions": "Hi."},  # config at top level
    ],
)
async def test_session_create_then_json_audio(parrot_server, create):
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await trio.sleep(0.2)
        assert c.messages == []  # the native dialect waits for session.create
        await c.send(create)
        created = await c.wait_for("session.created")
        updated = await c.wait_for("session.updated")
        assert created["session"] == updated["session"]
        assert created["session"]["voice"] == "NATM1.pt" and created["session"]["instructions"] == "Hi."
        assert created["session_id"].startswith("sess_")
        await c.append(pcm16(audio()), event_id="a1")
        await c.wait_until(lambda: c.output_frames() == N_FRAMES)
        deltas = c.of_type("response.output_audio.delta")
        response = c.of_type("response.created")[0]
        assert response["epoch"] == 0
        for k, d in enumerate(deltas):
            assert d["frame_index"] == k and d["epoch"] == 0 and d["response_id"] == response["response_id"]
            assert len(base64.b64decode(d["audio"])) == FRAME_PCM16_BYTES
            assert isinstance(d["text"], str)
        await c.send({"type": "session.close", "event_id": "bye"})
        closed = await c.wait_for("session.closed")
        assert closed == {
            "type": "session.closed",
            "session_id": created["session_id"],
            "reason": "client_close",
        }
        await c.wait_closed()
        assert c.close_code == 1000
        assert c.types()[-1] == "session.closed"
        done = c.of_type("response.done")[-1]
        assert done["status"] == "cancelled" and done["frames"] == N_FRAMES


async def test_binary_input_gives_the_same_output_as_base64_appends(parrot_server):
    samples = audio(22)
    reference = await realtime_reference(parrot_server, samples)
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "session": {}})
        await c.wait_for("session.created")
        await feed(c, pcm16(samples), 2400 * 2, pace=0, binary=True)  # 100 ms binary messages
        await c.wait_until(lambda: c.output_frames() == N_FRAMES)
        assert c.binary_frames() == []  # JSON deltas unless binary_output
        assert c.output_audio() == reference
    # pcm_f32le as the session's input format: binary messages carry float32.
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "session": {"input_audio_format": "pcm_f32le"}})
        await c.wait_for("session.created")
        await feed(c, f32(samples), 1000 * 4, pace=0, binary=True, sample_width=4)
        await c.wait_until(lambda: c.output_frames() == N_FRAMES)
        assert c.errors() == []
        assert c.output_audio() == reference


@pytest.mark.parametrize("where", ["top", "session"])
async def test_binary_output_frames(parrot_server, where):
    samples = audio(23)
    reference = await realtime_reference(parrot_server, samples)
    create: dict[str, Any] = {"type": "session.create", "session": {}}
    if where == "top":
        create["binary_output"] = True
    else:
        create["session"]["binary_output"] = True
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send(create)
        created = await c.wait_for("session.created")
        assert "binary_output" not in created["session"]
        await feed(c, pcm16(samples), 1920 * 2, pace=0, binary=True)
        await c.wait_until(lambda: len(c.binary_frames()) == N_FRAMES)
        frames = c.binary_frames()
        assert [i for i, _ in frames] == list(range(N_FRAMES))
        assert all(len(a) == FRAME_PCM16_BYTES for _, a in frames)
        assert c.of_type("response.output_audio.delta") == []
        assert b"".join(a for _, a in frames) == reference
        assert [m[:4] for m in c.messages if isinstance(m, bytes)][:2] == [b"\0\0\0\0", b"\1\0\0\0"]
        await c.send({"type": "response.cancel", "event_id": "k"})
        done = await c.wait_for("response.done")
        assert done["reason"] == "client_cancelled" and done["epoch"] == 0
        await feed(c, pcm16(samples[: 2 * FRAME_SAMPLES]), 1920 * 2, pace=0, binary=True)
        created = await c.wait_for("response.created", count=2)
        assert created["epoch"] == 1
        await c.wait_until(lambda: len(c.binary_frames()) == N_FRAMES + 2)
        assert [i for i, _ in c.binary_frames()][-2:] == [N_FRAMES, N_FRAMES + 1]


@pytest.mark.parametrize(
    "first",
    [
        '{"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e1"}',
        '{"type": "session.update", "session": {}}',
        "not json",
        b"\x00\x01" * 100,
    ],
)
async def test_other_first_message_is_refused(parrot_server, first):
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send_raw(first)
        await c.wait_closed()
        assert c.types() == ["error"]
        err = c.events()[0]
        assert err["code"] in ("bad_event", "invalid_json")
        if isinstance(first, bytes) or "type" in first:
            assert err["code"] == "bad_event"
        if "e1" in str(first):
            assert err["client_event_id"] == "e1"
        assert c.close_code is not None and c.close_code not in (1000, 1011)


async def test_native_errors_and_commands(parrot_server):
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create"})
        await c.wait_for("session.created")
        await c.send({"type": "response.cancel", "event_id": "r1"})
        err = await c.wait_for("error")
        assert err["code"] == "response_cancel_not_active" and err["client_event_id"] == "r1"
        assert isinstance(err["error"], str)
        await c.send({"type": "session.create", "event_id": "again"})
        err = await c.wait_for("error", count=2)
        assert err["code"] == "bad_event" and err["client_event_id"] == "again"
        await c.send_raw(b"\x01\x02\x03")  # odd pcm16 byte count
        err = await c.wait_for("error", count=3)
        assert err["code"] == "bad_audio"
        await c.send({"type": "session.heartbeat", "event_id": "h"})
        assert (await c.wait_for("session.heartbeat_ack"))["client_event_id"] == "h"
        await c.send({"type": "session.update", "event_id": "u", "session": {"voice": "NATM1.pt"}})
        upd = await c.wait_for("session.updated", count=2)
        assert upd["session"]["voice"] == "NATM1.pt"
        await c.append_binary(pcm16(audio()[:FRAME_SAMPLES]))
        await c.wait_until(lambda: c.output_frames() == 1)


async def test_nothing_within_10_s_is_config_timeout(parrot_server):
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        with trio.fail_after(14):
            await c.closed.wait()
        assert c.types() == ["error"]
        assert c.events()[0]["code"] == "config_timeout"
        assert c.close_code is not None and c.close_code not in (1000, 1011)


async def test_session_create_with_a_bad_voice_echoes_its_event_id(parrot_server):
    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "event_id": "bad-create", "session": {"voice": "../x.pt"}})
        err = await c.wait_for("error")
        assert err["code"] == "invalid_voice"
        assert err["client_event_id"] == "bad-create", err


async def test_native_session_object_carries_the_capabilities(parrot_server):
    """Spec §2: the session object carries ``capabilities`` (identical for every session)."""
    from .test_realtime import CAPABILITIES

    async with connect(parrot_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "session": {}})
        created = await c.wait_for("session.created")
        assert created["session"].get("capabilities") == CAPABILITIES, created["session"]
