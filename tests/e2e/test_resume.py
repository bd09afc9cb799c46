"""Resuming a session after its connection dropped (docs/protocol.md §10), on a real server."""

from __future__ import annotations

import pytest

from duplex_actors.replay.replayer import replay_logic

from .conftest import start_server
from .helpers import Client, connect, drop_tcp, pcm16, read_records, tone_and_noise

FRAME_BYTES = 3840
OFF = {"duplex": {"alignment": "off"}}


@pytest.fixture(scope="module")
def resume_server(tmp_path_factory, parrot_dir):
    server = start_server(tmp_path_factory.mktemp("resume"), "--max-sessions", "3", "--resume-grace-s", "5")
    yield server
    server.stop()


def track(frames: int, seed: int = 1) -> bytes:
    return pcm16(tone_and_noise(frames * 0.08, seed=seed))[: frames * FRAME_BYTES]


def after_created(client: Client) -> list:
    """The messages after session.created / session.resumed: the journaled ones."""
    out = []
    for m in client.messages:
        if isinstance(m, dict) and m.get("type") in ("session.created", "session.resumed"):
            continue
        out.append(m)
    return out


async def reference_audio(server, audio: bytes) -> bytes:
    async with connect(server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "session": OFF})
        await c.wait_for("session.created")
        for i in range(0, len(audio), FRAME_BYTES):
            await c.append(audio[i : i + FRAME_BYTES])
        await c.wait_until(lambda: c.output_frames() >= len(audio) // FRAME_BYTES, what="all frames")
    return c.output_audio()


async def test_a_dropped_native_session_resumes_and_its_audio_is_the_uninterrupted_runs(resume_server):
    audio = track(20)
    reference = await reference_audio(resume_server, audio)
    url = resume_server.ws + "/v1/duplex"
    async with connect(url, graceful=False) as first:
        await first.send({"type": "session.create", "resume": True, "session": OFF})
        created = await first.wait_for("session.created")
        token, sid = created["resume_token"], created["session_id"]
        assert created["attachment_generation"] == 1
        for i in range(0, 8 * FRAME_BYTES, FRAME_BYTES):
            await first.append(audio[i : i + FRAME_BYTES])
        await first.wait_until(lambda: first.output_frames() >= 3, what="3 frames")
        await drop_tcp(first)
    got = after_created(first)
    async with connect(url + f"?session_id={sid}") as second:
        await second.send(
            {
                "type": "session.resume",
                "session_id": sid,
                "resume_token": token,
                "last_received_server_event_seq": len(got),
            }
        )
        resumed = await second.wait_for("session.resumed")
        assert resumed["replay_from_server_event_seq"] == len(got) + 1
        assert resumed["attachment_generation"] == 2
        assert resumed["resume_token"] != token
        start = resumed["input_samples_received"]
        assert 0 < start <= 8 * FRAME_BYTES // 2
        rest = audio[start * 2 :]
        await second.send(
            {
                "type": "input_audio_buffer.append",
                "audio": __import__("base64").b64encode(rest[:FRAME_BYTES]).decode(),
                "input_samples_start": start,
            }
        )
        for i in range(FRAME_BYTES, len(rest), FRAME_BYTES):
            await second.append(rest[i : i + FRAME_BYTES])
        await second.wait_until(
            lambda: first.output_frames() + second.output_frames() >= 20, what="all frames"
        )
    assert first.output_audio() + second.output_audio() == reference
    records = await read_records(resume_server, sid)
    kinds = [type(x).__name__ for x in records]
    assert "Detach" in kinds and "Resume" in kinds
    assert replay_logic(resume_server.log_dir / f"{sid}.dlog").identical
