"""A stock OpenAI client: the ``openai`` package's Realtime client connects (``/v1/realtime?model=``,
``Authorization: Bearer``), sends a GA ``session.update`` and pcm16 appends with its own helper
methods, and hears the model (``response.output_audio.delta``) without ever sending
``response.create``. It is asyncio-based, so it runs in a worker thread with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import trio

from duplex_actors.protocol.schemas import validate_client_event, validate_server_event

from .helpers import FRAME_PCM16_BYTES, FRAME_SAMPLES, pcm16, tone_and_noise

N_FRAMES = 12


async def sdk_session(port: int, audio: bytes, api_key: str = "k") -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0)
    report: dict[str, Any] = {"sent": [], "received": [], "parsed": []}
    async with client.realtime.connect(model="tiny-parrot") as conn:
        ws = conn._connection  # the websockets connection the SDK opened
        assert ws.request is not None
        report["path"] = ws.request.path
        report["headers"] = {k.lower(): v for k, v in ws.request.headers.raw_items()}
        report["subprotocol"] = ws.subprotocol
        send = ws.send

        async def recording_send(data: Any, *args: Any, **kwargs: Any) -> None:
            report["sent"].append(json.loads(data))
            await send(data, *args, **kwargs)

        ws.send = recording_send

        async def next_event() -> Any:
            raw = await asyncio.wait_for(conn.recv_bytes(), 10)
            report["received"].append(json.loads(raw))
            event = conn.parse_event(raw)
            report["parsed"].append(type(event).__name__)
            return event

        first = await next_event()
        assert first.type == "session.created", first
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "",
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATM1.pt"},
                },
            }
        )
        chunk = 2400 * 2  # 100 ms
        for offset in range(0, len(audio), chunk):
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(audio[offset : offset + chunk]).decode()
            )
        out = b""
        while len(out) < N_FRAMES * FRAME_PCM16_BYTES:
            event = await next_event()
            if event.type == "response.output_audio.delta":
                out += base64.b64decode(event.delta)
            assert event.type != "error", event
        report["audio"] = out
        await conn.send({"type": "session.close"})
        while True:
            event = await next_event()
            if event.type == "session.closed":
                break
    return report


async def test_stock_openai_realtime_client_hears_the_model(parrot_server):
    audio = pcm16(tone_and_noise(N_FRAMES * FRAME_SAMPLES / 24_000, seed=31))

    def run() -> dict[str, Any]:
        return asyncio.run(asyncio.wait_for(sdk_session(parrot_server.port, audio), 60))

    with trio.fail_after(70):
        report = await trio.to_thread.run_sync(run, abandon_on_cancel=True)

    # What the SDK sends at connect: the model as a query parameter and the key as a Bearer.
    assert report["path"].startswith("/v1/realtime?") and "model=tiny-parrot" in report["path"]
    assert report["headers"]["authorization"] == "Bearer k"
    assert report["subprotocol"] is None
    # Everything on the wire matches the schemas, both ways.
    for msg in report["sent"]:
        validate_client_event(msg, "realtime")
    for msg in report["received"]:
        validate_server_event(msg, "realtime")
    sent_types = [m["type"] for m in report["sent"]]
    assert sent_types[0] == "session.update"
    assert set(sent_types[1:-1]) == {"input_audio_buffer.append"} and sent_types[-1] == "session.close"
    assert "response.create" not in sent_types
    received = [m["type"] for m in report["received"]]
    assert received[:3] == ["session.created", "session.updated", "session.updated"]
    assert report["received"][2]["session"]["voice"] == "NATM1.pt"
    assert "error" not in received
    assert received.count("response.output_audio.delta") >= N_FRAMES
    # The SDK parsed our events into its own classes (not the unknown-event fallback).
    parsed = dict(zip(received, report["parsed"], strict=True))
    assert parsed["response.output_audio.delta"] == "ResponseAudioDeltaEvent"
    assert parsed["session.created"] == "SessionCreatedEvent"
    assert parsed["response.created"] == "ResponseCreatedEvent"
    # Real output: N_FRAMES whole frames of non-silent audio.
    out = report["audio"]
    assert len(out) == N_FRAMES * FRAME_PCM16_BYTES
    assert any(out[i] for i in range(len(out)))
