"""Audio on the wire (docs/protocol.md §3): chunking independence with the parrot model, every refusal of
the audio rules (the session stays usable), input backpressure, and refusals of events the
lockstep model has no use for; the client's ``event_id`` is echoed in every refusal."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import numpy as np
import pytest
import trio

from .helpers import (
    FRAME_PCM16_BYTES,
    FRAME_SAMPLES,
    Client,
    b64,
    client_event_id,
    connect,
    error_code,
    f32,
    feed,
    pcm16,
    read_records,
    steps,
    tone_and_noise,
    wait_idle,
)

AUDIO_S = 2.0
N_FRAMES = int(AUDIO_S * 24_000) // FRAME_SAMPLES  # 25
CHUNKS_MS = (20, 40, 80, 100, 160)


async def run_chunked(server, audio: bytes, chunk_ms: int, out: dict[int, tuple[bytes, str]]) -> None:
    async with connect(server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        # Unpadded: on the grid, 20 and 40 ms chunks are otherwise aligned with a pad, which the
        # model hears (spec section 7; tests/e2e/test_alignment.py covers that path).
        before = len(c.messages)
        await c.send({"type": "session.update", "session": {"duplex": {"alignment": "off"}}})
        await c.wait_for("session.updated", since=before)
        await feed(c, audio, chunk_ms * 24 * 2, pace=2.0)
        await c.wait_until(lambda: c.output_frames() >= N_FRAMES, timeout=30, what=f"{N_FRAMES} frames")
        assert [d["metadata"]["frame_index"] for d in c.deltas()] == list(range(N_FRAMES))
        out[chunk_ms] = (c.output_audio(), c.session_id)


async def test_chunk_size_does_not_change_the_output(parrot_server):
    await wait_idle(parrot_server)
    audio = pcm16(tone_and_noise(AUDIO_S, freq=523.0, seed=11))
    out: dict[int, tuple[bytes, str]] = {}

    async def lane(sizes: tuple[int, ...]) -> None:
        for ms in sizes:
            await run_chunked(parrot_server, audio, ms, out)

    async with trio.open_nursery() as nursery:  # two sessions at a time (two slots)
        nursery.start_soon(lane, CHUNKS_MS[0::2])
        nursery.start_soon(lane, CHUNKS_MS[1::2])
    assert sorted(out) == sorted(CHUNKS_MS)
    reference, _ = out[80]
    assert len(reference) == N_FRAMES * FRAME_PCM16_BYTES
    assert np.abs(np.frombuffer(reference, "<i2")).max() > 0
    for ms, (got, _) in out.items():
        assert got == reference, f"{ms} ms chunks gave different output"
    # The model saw the same codes in every session, and answered each one frame late.
    codes = {}
    for ms, (_, session_id) in out.items():
        st = steps(await read_records(parrot_server, session_id))
        assert [s.frame_index for s in st] == list(range(N_FRAMES))
        for prev, cur in itertools.pairwise(st):
            assert cur.agent_codes == prev.user_codes
        codes[ms] = [s.user_codes for s in st]
    assert all(c == codes[80] for c in codes.values())


# -- refusals ------------------------------------------------------------------------------------
NAN_F32 = f32(np.array([0.1, np.nan, 0.2, 0.3], dtype=np.float32))
INF_F32 = f32(np.array([0.1, np.inf, 0.2, -0.3], dtype=np.float32))
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("invalid base64", {"type": "input_audio_buffer.append", "audio": "not base64!!"}, "bad_audio"),
    ("base64 padding", {"type": "input_audio_buffer.append", "audio": "AAA"}, "bad_audio"),
    ("odd pcm16 length", {"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03")}, "bad_audio"),
    (
        "f32 length",
        {"type": "input_audio_buffer.append", "audio": b64(b"\x00" * 6), "format": "pcm_f32le"},
        "bad_audio",
    ),
    (
        "NaN in pcm_f32le",
        {"type": "input_audio_buffer.append", "audio": b64(NAN_F32), "format": "pcm_f32le"},
        "bad_audio",
    ),
    (
        "inf in pcm_f32le",
        {"type": "input_audio_buffer.append", "audio": b64(INF_F32), "input_audio_format": "pcm_f32le"},
        "bad_audio",
    ),
    (
        "11.025 kHz (not a supported rate)",
        {"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00" * 320), "sample_rate_hz": 11025},
        "unsupported_audio_format",
    ),
    (
        "unknown format",
        {"type": "input_audio_buffer.append", "audio": b64(b"\x00\x00" * 320), "format": "mp3"},
        "unsupported_audio_format",
    ),
    (
        "g711 at 16 kHz (G.711 is 8 kHz only)",
        {
            "type": "input_audio_buffer.append",
            "audio": b64(b"\x00" * 320),
            "format": "g711_ulaw",
            "sample_rate_hz": 16000,
        },
        "unsupported_audio_format",
    ),
    ("empty audio", {"type": "input_audio_buffer.append", "audio": ""}, "bad_event"),
    ("missing audio", {"type": "input_audio_buffer.append"}, "bad_event"),
    ("audio not a string", {"type": "input_audio_buffer.append", "audio": 5}, "bad_event"),
    ("unknown event", {"type": "conversation.item.delete", "item_id": "x"}, "unknown_event"),
    ("commit", {"type": "input_audio_buffer.commit"}, "commit_unsupported"),
    (
        "response.create",
        {"type": "response.create"},
        "conversation_already_has_active_response",
    ),  # stock route
    (
        "session 12 kHz",
        {"type": "session.update", "session": {"input_audio_format": "pcm16", "sample_rate_hz": 12000}},
        "unsupported_audio_format",
    ),
    (
        "session GA format",
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}}},
        },
        "unsupported_audio_format",
    ),
    ("session not an object", {"type": "session.update", "session": []}, "bad_event"),
]
RAW_REFUSALS = [
    ("invalid JSON", '{"type": "input_audio_buffer.append", "audio": ', "invalid_json"),
    ("a JSON array", '[{"type": "session.close"}]', "invalid_json"),
    ("a JSON number", "42", "invalid_json"),
    ("a JSON string", '"session.close"', "invalid_json"),
    ("NaN literal", '{"type": "session.update", "session": {"temperature": NaN}}', "invalid_json"),
    ("no type", '{"event_id": "x", "audio": "AAAA"}', "bad_event"),
]


async def assert_still_usable(c: Client) -> None:
    n = c.output_frames()
    await c.append(pcm16(tone_and_noise(FRAME_SAMPLES / 24_000, seed=n)))
    await c.wait_until(lambda: c.output_frames() == n + 1, what="one more frame")


async def test_every_refusal_leaves_the_session_usable(parrot_server):
    async with connect(parrot_server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        # Half a frame of good audio stays buffered across all the refusals below.
        half = pcm16(tone_and_noise(FRAME_SAMPLES / 24_000 / 2, seed=99))
        await c.append(half)
        for i, (what, event, code) in enumerate(REFUSALS):
            before = len(c.messages)
            eid = f"ev-{i}"
            await c.send_raw(json.dumps({**event, "event_id": eid}))
            err = await c.wait_for("error", since=before)
            assert error_code(err) == code, (what, err)
            assert client_event_id(err) == eid, what
            assert err["error"]["type"] == "invalid_request_error"
            assert err["error"]["message"]
            await assert_still_usable(c)
        for what, text, code in RAW_REFUSALS:
            before = len(c.messages)
            await c.send_raw(text)
            err = await c.wait_for("error", since=before)
            assert error_code(err) == code, (what, err)
            if what == "no type":
                assert client_event_id(err) == "x"
            await assert_still_usable(c)
        # The refused audio never reached the model: every output frame answers a good one, and
        # the half frame sent first was completed by the first good append after it.
        assert [d["metadata"]["frame_index"] for d in c.deltas()] == list(
            range(len(REFUSALS) + len(RAW_REFUSALS))
        )
        assert len(c.errors()) == len(REFUSALS) + len(RAW_REFUSALS)
        await c.send({"type": "session.close"})
        await c.wait_closed()
        assert c.close_code == 1000


async def test_accepted_formats_and_aliases(parrot_server):
    """pcm16 under its aliases, pcm_f32le per append and per session (flat and GA), 24 kHz."""
    x = tone_and_noise(FRAME_SAMPLES / 24_000, seed=4)
    async with connect(parrot_server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        for fields in (
            {},
            {"format": "pcm16"},
            {"format": "audio/pcm"},
            {"format": "pcm_s16le", "sample_rate_hz": 24000},
            {"input_audio_format": "pcm16"},
        ):
            await c.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(x)), **fields})
        await c.send({"type": "input_audio_buffer.append", "audio": b64(f32(x)), "format": "pcm_f32le"})
        await c.wait_until(lambda: c.output_frames() == 6)
        session = {"audio": {"input": {"format": {"type": "pcm_f32le", "rate": 24000}}}}
        await c.send({"type": "session.update", "session": session})
        await c.wait_for("session.updated", count=2)
        await c.send({"type": "input_audio_buffer.append", "audio": b64(f32(x))})
        await c.wait_until(lambda: c.output_frames() == 7)
        await c.send({"type": "session.update", "session": {"input_audio_format": "pcm16"}})
        await c.wait_for("session.updated", count=3)
        await c.send({"type": "input_audio_buffer.append", "audio": b64(pcm16(x))})
        await c.wait_until(lambda: c.output_frames() == 8)
        assert c.errors() == []


async def test_input_backpressure_refuses_an_append_over_the_limit(parrot_server):
    """Default limit: 16 MiB of float32 = 4 Mi samples (~175 s). There is no server flag to
    lower it, so: one append of 180 s is refused whole and the session goes on; then 170 s
    + 100 s sent back to back: the second goes over the limit (received but not yet stepped).

    The second is refused only while more than 75 s of the first wait for their steps when it
    is read: the parrot steps a lone session greedily, so with 100 s + 100 s (a margin of 25 s,
    312 frames) it sometimes had stepped past that first, and "b" waited for room under the soft
    budget instead (a CI run and 3 of 6 runs alone timed out waiting for its error)."""
    big = pcm16(tone_and_noise(180.0, seed=5, level=0.1))
    async with connect(parrot_server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send_raw('{"type":"input_audio_buffer.append","event_id":"big","audio":"' + b64(big) + '"}')
        err = await c.wait_for("error", timeout=30)
        assert error_code(err) == "input_backpressure" and client_event_id(err) == "big"
        assert c.output_frames() == 0
        await assert_still_usable(c)
    # Nothing of the refused append was stepped: the finished log holds one step, and the
    # client got one frame before session.closed.
    assert len(steps(await read_records(parrot_server, c.session_id))) == 1
    assert c.output_frames() == 1
    first = b64(pcm16(tone_and_noise(170.0, seed=6, level=0.1)))
    hundred = b64(pcm16(tone_and_noise(100.0, seed=7, level=0.1)))
    async with connect(parrot_server.ws + "/v1/realtime") as c:
        await c.wait_for("session.updated")
        await c.send_raw('{"type":"input_audio_buffer.append","event_id":"a","audio":"' + first + '"}')
        await c.send_raw('{"type":"input_audio_buffer.append","event_id":"b","audio":"' + hundred + '"}')
        err = await c.wait_for("error", timeout=30)
        assert error_code(err) == "input_backpressure" and client_event_id(err) == "b"
        assert len(c.errors()) == 1
        # The session is still alive and answering; closing it does not wait for the backlog.
        await c.send({"type": "session.heartbeat", "event_id": "hb"})
        await c.wait_for("session.heartbeat_ack", timeout=15)
        with trio.fail_after(15):
            await c.close_session()
        assert c.close_code == 1000
    await wait_idle(parrot_server, timeout=15)


@pytest.mark.parametrize("frames_per_append", [1, 3])
async def test_output_delta_decodes_to_whole_frames(parrot_server, frames_per_append):
    async with connect(parrot_server.ws + "/v1/realtime") as c:
        audio = pcm16(tone_and_noise(6 * FRAME_SAMPLES / 24_000, seed=8))
        await feed(c, audio, frames_per_append * FRAME_PCM16_BYTES, pace=0)
        await c.wait_until(lambda: c.output_frames() == 6)
        for d in c.deltas():
            assert len(base64.b64decode(d["delta"])) == FRAME_PCM16_BYTES
            assert d["metadata"]["audio_duration_ms"] == 80
