"""Benchmark: resume latency and what a detached session costs, on a real server.

Starts ``duplex-actors serve --model tiny-parrot --resume-grace-s 60`` on a free port. Then:

- latency: ``--rounds`` times, a resumable native session sends 12 frames, reads half of its
  output, and its TCP connection is reset (no close frame); 0.3 s later (the rest is stepped
  meanwhile) a new connection resumes: time from the new connection's start to
  ``session.resumed``, and to the first replayed message;
- cost: ``--detached`` sessions are left detached after 2 s of audio each; the journal bytes
  (``/metrics``) and the front end's resident memory before and after are read.

    python bench/resume.py [--rounds 20] [--detached 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

FRAME_BYTES = 3840


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def audio(frames: int) -> bytes:
    rng = np.random.default_rng(0)
    return (rng.standard_normal(frames * 1920) * 3000).astype("<i2").tobytes()


def reset(ws: Any) -> None:
    sock = ws._stream.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def dropped_session(base: str, frames: int) -> tuple[str, str, int]:
    """Open a resumable session, send ``frames``, read what comes, reset: (id, token, cursor)."""
    track = audio(frames)
    async with open_websocket_url(base + "/v1/duplex") as ws:
        await ws.send_message(
            json.dumps(
                {"type": "session.create", "resume": True, "session": {"duplex": {"alignment": "off"}}}
            )
        )
        created = json.loads(await ws.get_message())
        for i in range(frames):
            chunk = base64.b64encode(track[i * FRAME_BYTES : (i + 1) * FRAME_BYTES]).decode()
            await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        cursor = 0
        with trio.move_on_after(frames * 0.08 + 1):
            while cursor < frames // 2:
                await ws.get_message()
                cursor += 1
        reset(ws)
    return created["session_id"], created["resume_token"], cursor


async def resume_latency(base: str) -> tuple[float, float | None]:
    sid, token, cursor = await dropped_session(base, 12)
    await trio.sleep(0.3)  # the queued frames are stepped meanwhile: output the client missed
    started = time.perf_counter()
    async with open_websocket_url(f"{base}/v1/duplex?session_id={sid}") as ws:
        await ws.send_message(
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": sid,
                    "resume_token": token,
                    "last_received_server_event_seq": cursor,
                }
            )
        )
        resumed = json.loads(await ws.get_message())
        at_resumed = time.perf_counter() - started
        assert resumed["type"] == "session.resumed", resumed
        first: float | None = None
        if resumed["last_server_event_seq"] > cursor:
            await ws.get_message()
            first = time.perf_counter() - started
        await ws.send_message(json.dumps({"type": "session.close"}))
        with trio.move_on_after(2):
            try:
                while True:
                    await ws.get_message()
            except ConnectionClosed:
                pass
    return at_resumed, first


async def bench(base: str, pid: int, rounds: int, detached: int) -> dict[str, Any]:
    latencies, firsts = [], []
    for _ in range(rounds):
        at, first = await resume_latency(base)
        latencies.append(at * 1000)
        if first is not None:
            firsts.append(first * 1000)
    frontend = (children(pid) or [pid])[0]
    before = rss_kib(frontend)
    for _ in range(detached):
        await dropped_session(base, 25)
    await trio.sleep(1.0)
    text = urllib.request.urlopen(base.replace("ws:", "http:") + "/metrics").read().decode()
    after = rss_kib(frontend)
    return {
        "rounds": rounds,
        "resume_ms": {
            "median": float(np.median(latencies)),
            "p90": float(np.percentile(latencies, 90)),
            "max": max(latencies),
        },
        "first_replayed_ms": {"median": float(np.median(firsts)), "max": max(firsts)} if firsts else None,
        "detached": int(metric(text, "duplex_sessions_detached")),
        "journal_bytes": metric(text, "duplex_journal_bytes"),
        "journal_bytes_per_session": metric(text, "duplex_journal_bytes") / max(1, detached),
        "frontend_rss_kib_delta": after - before,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--detached", type=int, default=8)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    port = free_port()
    exe = str(Path(sys.executable).with_name("duplex-actors"))
    logs = tempfile.mkdtemp()
    proc = subprocess.Popen(
        [
            exe,
            "serve",
            "--model",
            "tiny-parrot",
            "--port",
            str(port),
            "--log-dir",
            logs,
            "--max-sessions",
            str(a.detached + 2),
            "--resume-grace-s",
            "60",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        result = trio.run(bench, f"ws://127.0.0.1:{port}", proc.pid, a.rounds, a.detached)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    result["machine"] = f"{os.cpu_count()} cores"
    print(json.dumps(result, indent=2))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
