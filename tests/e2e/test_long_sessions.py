"""Sessions longer than the model's context, served: ``serve --context-policy ring|pin-prompt``.

The recall LM (model/recall.py, weights set by hand) says which persona its prompt held, in
agent codebook 0, while the prompt's keyword is in its KV cache. Two sessions (two personas,
two voices) stream at once through a real server on the hand-built checkpoint with a context
of C = 32 positions. With ``ring`` each reports its persona until its keyword's position is
overwritten and never after: the first wrong frame is exactly C + (keyword position) + 1 -
(prompt positions), the +1 because moshi's LM returns agent codes one call late. With
``pin-prompt`` each reports it on every frame up to 6C. Every log replays at model level
(``duplex-replay --model``), with the policy its header names.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from duplex_actors.model.recall import NO_RECALL, RecallModel, make_recall_model, recall_code

from .conftest import ServerProcess, start_server
from .helpers import FRAME_PCM16_BYTES, connect, feed, pcm16, read_records, steps, tone_and_noise

CONTEXT = 32
PIN_MAX = 24  # the default persona's prompt (the server warms up with it) takes 21 positions
VOICES = ("NATF2.pt", "NATM1.pt")  # persona k speaks with VOICES[k]
STEP_WAIT_S = 300.0


@pytest.fixture(scope="module")
def recall(tmp_path_factory) -> RecallModel:
    return make_recall_model(tmp_path_factory.mktemp("recall") / "model", context=CONTEXT)


async def _session(server: ServerProcess, recall: RecallModel, persona: int, frames: int, out: dict) -> None:
    async with connect(server.ws + "/v1/duplex") as c:
        config = {"voice": VOICES[persona], "instructions": recall.personas[persona]}
        await c.send({"type": "session.create", "session": config})
        created = await c.wait_for("session.created")
        audio = pcm16(tone_and_noise(frames * 0.08, freq=180.0 + 90 * persona, seed=persona))
        await feed(c, audio, 10 * FRAME_PCM16_BYTES, pace=0, binary=True)  # an upload: engine pace
        await c.wait_until(lambda: c.output_frames() >= frames, timeout=STEP_WAIT_S, what=f"{frames} frames")
        assert c.errors() == [] and c.output_frames() == frames
    records = await read_records(server, created["session_id"])
    stepped = sorted(steps(records), key=lambda s: s.frame_index)
    assert [s.frame_index for s in stepped] == list(range(frames))
    out[persona] = (records[0], [s.agent_codes[0] for s in stepped])


async def _serve(tmp_path: Path, recall: RecallModel, frames: int, *args: str) -> tuple[ServerProcess, dict]:
    # The window policy never drains a frame. The grid's drain took one frame of an upload here
    # once, on a slow host (the upload's backlog hovered where a jitter backlog does), and every
    # frame after it moved by one.
    server = await trio.to_thread.run_sync(
        partial(
            start_server,
            tmp_path,
            "--max-sessions",
            "2",
            "--tick-policy",
            "window",
            *args,
            model=str(recall.root),
        )
    )
    out: dict = {}
    try:
        async with trio.open_nursery() as nursery:
            for persona in range(2):
                nursery.start_soon(_session, server, recall, persona, frames, out)
    finally:
        rc = await trio.to_thread.run_sync(server.stop)
    assert rc == 0, server.output
    return server, out


async def _replay(server: ServerProcess) -> None:
    exe = str(Path(sys.executable).with_name("duplex-replay"))
    done = await trio.to_thread.run_sync(
        partial(
            subprocess.run, [exe, str(server.log_dir), "--model"], capture_output=True, text=True, timeout=600
        )
    )
    assert done.returncode == 0, done.stdout + done.stderr
    logs = len(list(server.log_dir.glob("*.dlog")))
    assert logs >= 2 and f"{logs} logs, {logs} reproduced, 0 not" in done.stdout, done.stdout


async def test_ring_forgets_the_persona_and_pin_prompt_keeps_it(tmp_path, recall):
    # Both servers at once (each engine runs one thread), then both replays.
    runs: dict[str, tuple[ServerProcess, dict]] = {}

    async def serve(policy: str, frames: int, *args: str) -> None:
        runs[policy] = await _serve(tmp_path / policy, recall, frames, "--context-policy", policy, *args)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, "ring", 2 * CONTEXT)
        nursery.start_soon(serve, "pin-prompt", 6 * CONTEXT, "--max-pinned-prompt", str(PIN_MAX))

    for persona, (header, codes) in runs["ring"][1].items():
        assert header.engine["context_policy"] == "ring" and header.engine["context"] == CONTEXT
        voice = VOICES[persona]
        keyword = recall.keyword_position(persona, voice)
        forgets = CONTEXT + keyword + 1 - recall.prompt_positions(persona, voice)
        assert forgets == 24  # 32 + 12 + 1 - 21 (NATF2) and 32 + 13 + 1 - 22 (NATM1)
        assert codes == [recall_code(persona)] * forgets + [NO_RECALL] * (2 * CONTEXT - forgets), persona

    for persona, (header, codes) in runs["pin-prompt"][1].items():
        engine = header.engine
        assert (engine["context_policy"], engine["context"], engine["pin"], engine["pin_max"]) == (
            "pin-prompt",
            CONTEXT,
            "prompt",
            PIN_MAX,
        )
        assert codes == [recall_code(persona)] * (6 * CONTEXT), persona

    async with trio.open_nursery() as nursery:
        for server, _ in runs.values():
            nursery.start_soon(_replay, server)
