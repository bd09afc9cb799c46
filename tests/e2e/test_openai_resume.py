"""The stock ``openai`` SDK resumes a session through its own reconnect hook (``on_reconnecting``
gives the next connection the session id, the cursor and the token: the handshake form of
``session.resume``, docs/protocol.md §10), through a proxy that resets the connection."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import trio

from duplex_actors.replay.replayer import replay_logic

from .fault_proxy import FaultProxy
from .helpers import FRAME_PCM16_BYTES, connect, pcm16, tone_and_noise

FRAMES = 16


async def sdk_resuming_session(port: int, audio: bytes, cut: Any) -> dict[str, Any]:
    from openai import AsyncOpenAI
    from openai.types.websocket_reconnection import ReconnectingEvent, ReconnectingOverrides

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    state: dict[str, Any] = {"seqs": [], "audio": b"", "resumed": [], "types": []}

    def on_reconnecting(event: ReconnectingEvent) -> ReconnectingOverrides:
        # The few lines a client adds: where to resume, from which event, with which token.
        return {
            "extra_query": {
                "duplex": "1",
                "session_id": state["session_id"],
                "last_seq": str(state["last_seq"]),
            },
            "extra_headers": {"X-Duplex-Resume-Token": state["token"]},
        }

    async with client.realtime.connect(
        model="tiny-parrot",
        extra_query={"duplex": "1", "resume": "1", "autostart": "0"},
        on_reconnecting=on_reconnecting,
    ) as conn:
        await conn.send_raw(
            json.dumps(
                {"type": "session.update", "session": {"type": "realtime", "duplex": {"alignment": "off"}}}
            )
        )

        async def send_from(start: int, first: bool, end: int = len(audio)) -> None:
            for offset in range(start, end, FRAME_PCM16_BYTES):
                event: dict[str, Any] = {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(audio[offset : offset + FRAME_PCM16_BYTES]).decode(),
                }
                if first:
                    event["input_samples_start"] = offset // 2
                    first = False
                await conn.send_raw(json.dumps(event))

        async for event in conn:
            raw = (
                event
                if isinstance(event, dict)
                else event.model_dump()
                if hasattr(event, "model_dump")
                else dict(event)
            )
            kind = raw.get("type")
            state["types"].append(kind)
            if kind == "session.created":
                state["session_id"] = raw["session"]["id"]
                state["token"] = raw["resume_token"]
                state["last_seq"] = 0
                await send_from(0, False, len(audio) // 2)  # half the track; the cut comes once it is back
                continue
            if kind == "session.resumed":
                state["resumed"].append(raw)
                state["token"] = raw["resume_token"]
                await send_from(raw["input_samples_received"] * 2, True)
                continue
            seq = raw.get("server_event_seq")
            if seq is not None:
                state["seqs"].append(seq)
                state["last_seq"] = seq
            if kind == "response.output_audio.delta":
                state["audio"] += base64.b64decode(raw["delta"])
                frames = len(state["audio"]) // FRAME_PCM16_BYTES
                if frames == FRAMES // 2 - 2 and not state["resumed"] and not state.get("cut"):
                    state["cut"] = True
                    await cut()
                if frames >= FRAMES:
                    await conn.send_raw(json.dumps({"type": "session.close"}))
            if kind == "session.closed":
                break
    return state


async def test_the_openai_sdk_resumes_through_its_reconnect_hook(fresh_server):
    server = fresh_server("--resume-grace-s", "5")
    audio = pcm16(tone_and_noise(FRAMES * 0.08 + 0.1, seed=4))[: FRAMES * FRAME_PCM16_BYTES]
    proxy = FaultProxy(server.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        token = trio.lowlevel.current_trio_token()

        async def cut() -> None:
            await asyncio.to_thread(lambda: trio.from_thread.run(proxy.cut, "rst", trio_token=token))

        state = await trio.to_thread.run_sync(
            lambda: asyncio.run(sdk_resuming_session(proxy.port, audio, cut))
        )
        nursery.cancel_scope.cancel()
    assert len(state["resumed"]) == 1, state["types"]
    assert state["seqs"] == list(range(1, len(state["seqs"]) + 1))  # no gap, nothing twice
    assert len(state["audio"]) == len(audio)
    async with connect(server.ws + "/v1/duplex") as reference:  # the same track, uninterrupted
        await reference.send({"type": "session.create", "session": {"duplex": {"alignment": "off"}}})
        await reference.wait_for("session.created")
        for offset in range(0, len(audio), FRAME_PCM16_BYTES):
            await reference.append(audio[offset : offset + FRAME_PCM16_BYTES])
        await reference.wait_until(lambda: reference.output_frames() >= FRAMES)
    assert state["audio"] == reference.output_audio()
    assert replay_logic(server.log_dir / f"{state['session_id']}.dlog").identical
