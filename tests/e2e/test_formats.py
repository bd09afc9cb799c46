"""Phone-line and browser audio through ``duplex-actors serve --model tiny-parrot`` with the stock
openai SDK (docs/protocol.md §3): G.711 mu-law at 8 kHz in 20 ms packets in and out, and 48 kHz pcm16 in 10 ms
chunks; the logs show the parrot answering the input's codes one frame late and replay exactly."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from duplex_actors.audio import decode
from duplex_actors.protocol.schemas import validate_server_event
from duplex_actors.replay.replayer import replay_logic
from tests.system_tools import require

from .helpers import log_path, read_records, steps

SENTENCE = "Hello, you have reached the front desk. How can I help you today?"


def _run(*cmd: str) -> None:
    subprocess.run(list(cmd), check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A phone-line WAV (8 kHz mono mu-law, made by sox from espeak-ng speech) as its raw mu-law
    bytes, and the same speech as 48 kHz pcm16."""
    require("espeak-ng", "sox")
    out = tmp_path_factory.mktemp("phone")
    raw, phone, ulaw, hi = (out / n for n in ("espeak.wav", "phone.wav", "phone.ul", "browser.raw"))
    _run("espeak-ng", "-w", str(raw), SENTENCE)
    _run("sox", str(raw), "-r", "8000", "-c", "1", "-e", "mu-law", str(phone))
    _run("sox", str(phone), "-t", "ul", str(ulaw))
    _run("sox", str(raw), "-r", "48000", "-c", "1", "-b", "16", "-e", "signed-integer", "-t", "raw", str(hi))
    return {"ulaw": Path(ulaw).read_bytes(), "pcm48": Path(hi).read_bytes()}


async def sdk_session(
    port: int, session: dict[str, Any], audio: bytes, chunk: int, frames: int
) -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    report: dict[str, Any] = {"received": [], "deltas": []}
    async with client.realtime.connect(model="tiny-parrot") as conn:

        async def next_event() -> Any:
            raw = await asyncio.wait_for(conn.recv_bytes(), 10)
            msg = json.loads(raw)
            report["received"].append(msg)
            return conn.parse_event(raw)

        first = await next_event()
        report["session_id"] = first.session.id
        await conn.session.update(session=session)
        for offset in range(0, len(audio), chunk):
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(audio[offset : offset + chunk]).decode()
            )
        while len(report["deltas"]) < frames:
            event = await next_event()
            assert event.type != "error", event
            if event.type == "response.output_audio.delta":
                report["deltas"].append(report["received"][-1])
        await conn.send({"type": "session.close"})
        while (await next_event()).type != "session.closed":
            pass
    return report


async def run_sdk(
    port: int, session: dict[str, Any], audio: bytes, chunk: int, frames: int
) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        return asyncio.run(asyncio.wait_for(sdk_session(port, session, audio, chunk, frames), 60))

    with trio.fail_after(70):
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)


async def check_log(server: Any, session_id: str, frames: int) -> None:
    records = await read_records(server, session_id)
    st = steps(records)
    assert [s.frame_index for s in st][:frames] == list(range(frames))
    for prev, cur in itertools.pairwise(st):
        assert cur.agent_codes == prev.user_codes  # the parrot, one frame late
    assert len({s.user_codes for s in st}) > 1  # the input's codes moved: speech, not silence
    report = replay_logic(log_path(server, session_id))
    assert report.complete and report.digest_mismatch is None
    # Every input frame was stepped, but those an alignment pad added (spec section 7: server
    # input = client samples + pads) after the client had its own frames back and closed.
    pad = sum(rec.samples for rec in records if type(rec).__name__ == "Pad")
    assert len(st) <= report.frames_in <= len(st) + -(-pad // 1920)


async def test_phone_line_mulaw_in_and_out_with_the_stock_sdk(parrot_server, speech) -> None:
    ulaw = speech["ulaw"]
    sent = len(ulaw) // 640  # whole 80 ms frames sent (as 20 ms Twilio-sized packets)
    ulaw = ulaw[: sent * 640]
    session = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcmu"}, "voice": "NATM1.pt"},
        },
    }
    # soxr's filter delay holds back the tail of the last frame: one frame fewer than sent.
    report = await run_sdk(parrot_server.port, session, ulaw, 160, sent - 1)
    for msg in report["received"]:
        validate_server_event(msg, "realtime")
    deltas = report["deltas"]
    assert len(deltas) == sent - 1
    assert [d["metadata"]["frame_index"] for d in deltas] == list(range(sent - 1))
    out = b""
    for d in deltas:
        assert d["format"] == "g711_ulaw" and d["sample_rate_hz"] == 8000
        data = base64.b64decode(d["delta"])
        assert len(data) == 640
        out += data
    pcm = decode(out, "g711_ulaw")
    assert float(np.sqrt(np.mean(pcm**2))) > 1e-3  # above a silence floor
    await check_log(parrot_server, report["session_id"], sent - 1)
    records = await read_records(parrot_server, report["session_id"])
    appends = [rec for rec in records if type(rec).__name__ == "Append"]
    assert appends and all(a.format == "g711_ulaw" and a.sample_rate_hz == 8000 for a in appends)
    assert b"".join(a.audio for a in appends) == ulaw  # the input as received


async def test_browser_48k_pcm16_in_10ms_chunks_with_the_stock_sdk(parrot_server, speech) -> None:
    pcm48 = speech["pcm48"]
    sent = len(pcm48) // 7680  # whole 80 ms frames at 48 kHz
    pcm48 = pcm48[: sent * 7680]
    session = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 48000}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATM1.pt"},
        },
    }
    report = await run_sdk(parrot_server.port, session, pcm48, 960, sent - 1)
    deltas = report["deltas"]
    assert len(deltas) == sent - 1
    assert all(d["sample_rate_hz"] == 24000 and d["format"] == "pcm16" for d in deltas)
    assert all(len(base64.b64decode(d["delta"])) == 3840 for d in deltas)
    await check_log(parrot_server, report["session_id"], sent - 1)
    records = await read_records(parrot_server, report["session_id"])
    appends = [rec for rec in records if type(rec).__name__ == "Append"]
    assert all(a.format == "pcm16" and a.sample_rate_hz == 48000 and len(a.audio) == 960 for a in appends)
