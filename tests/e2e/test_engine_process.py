"""``serve --engine-process``: the engine in a child process, on a real socket.

A session streams a few frames; its log replays identically with ``duplex-replay --model``
(the in-thread engine reproduces what the child computed); SIGTERM drains, the child is
closed and no process the server started is left.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import trio

from .conftest import start_server
from .helpers import FRAME_PCM16_BYTES, connect, feed, pcm16, read_records, steps, tone_and_noise

FRAMES = 6


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


async def test_engine_process_serves_a_replayable_session_and_drains(tmp_path, tiny_dir):
    server = start_server(tmp_path, "--engine-process", "--max-sessions", "2", model="tiny")
    try:
        children = _children(server.proc.pid)
        engines = [pid for pid in children if b"spawn_main" in _cmdline(pid)]
        assert len(engines) == 1, [_cmdline(pid) for pid in children]
        async with connect(f"{server.ws}/v1/realtime?duplex=1") as client:
            created = await client.wait_for("session.created")
            session_id = created["session"]["id"]
            audio = pcm16(tone_and_noise(FRAMES * 0.08, seed=3))
            await feed(client, audio, FRAME_PCM16_BYTES, pace=0)
            await client.wait_for("response.output_audio.delta", count=FRAMES - 1, timeout=30)
        records = await read_records(server, session_id)
        assert len(steps(records)) >= FRAMES - 1
    finally:
        rc = await trio.to_thread.run_sync(server.stop, signal.SIGTERM)
    assert rc == 0, server.output
    assert f"engine process {engines[0]} closed (exit code 0)" in server.output
    assert [pid for pid in children if _alive(pid)] == []
    logs = sorted(server.log_dir.glob("*.dlog"))
    assert len(logs) == 2  # the warm-up session and ours
    exe = str(Path(sys.executable).with_name("duplex-replay"))
    out = subprocess.run([exe, str(server.log_dir), "--model"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 logs, 2 reproduced, 0 not" in out.stdout
