"""``serve --frontends 2``: one engine core, two front-end processes on one port.

Admission is the core's (one slot table for both front ends), ``/metrics`` reports the whole
server from either, a front end that is killed ends only its own sessions and is started again
(its slots reset and freed by the core), SIGTERM drains both, and the engine core's death ends
every session with 1011 and takes the front ends down with it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import trio
from trio_websocket import ConnectionClosed

from .conftest import ServerProcess, http_get, start_server
from .helpers import FRAME_PCM16_BYTES, connect, feed, pcm16, tone_and_noise

PORT_STATES_ESTABLISHED = "01"


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


def frontends(server: ServerProcess) -> list[int]:
    return sorted(pid for pid in _children(server.proc.pid) if b"duplex_actors.frontend" in _cmdline(pid))


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def connections_by_frontend(server: ServerProcess) -> dict[int, int]:
    """Established TCP connections on the server's port, per front-end pid."""
    established: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == server.port and fields[3] == PORT_STATES_ESTABLISHED:
                established.add(int(fields[9]))
    return {pid: len(_socket_inodes(pid) & established) for pid in frontends(server)}


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def _frames(client, frames: int, seed: int) -> None:
    await feed(client, pcm16(tone_and_noise(frames * 0.08, seed=seed)), FRAME_PCM16_BYTES, pace=0)


async def test_two_front_ends_share_one_slot_table_and_one_metrics_view(tmp_path, parrot_dir):
    server = start_server(tmp_path, "--frontends", "2", "--max-sessions", "2")
    try:
        pids = frontends(server)
        assert len(pids) == 2, [_cmdline(p) for p in _children(server.proc.pid)]
        async with connect(f"{server.ws}/v1/realtime?duplex=1") as a, connect(f"{server.ws}/v1/duplex") as b:
            await a.wait_for("session.created")
            await b.send({"type": "session.create", "session": {}})
            await b.wait_for("session.created")
            # The third is refused whichever front end takes it: the slots are the core's.
            async with connect(f"{server.ws}/v1/realtime?duplex=1") as third:
                refusal = await third.wait_for("error")
                assert refusal["error"]["code"] == "resource_exhausted"
            for _ in range(6):  # any front end answers for the whole server
                text = (await trio.to_thread.run_sync(http_get, server.base + "/metrics"))[1]
                assert metric(text, "duplex_sessions_active") == 2, text
                assert metric(text, "duplex_slots_in_use") == 2
            await _frames(a, 4, seed=1)
            await _frames(b, 4, seed=2)
            await a.wait_for("response.output_audio.delta", count=3, timeout=30)
            text = (await trio.to_thread.run_sync(http_get, server.base + "/metrics"))[1]
            assert metric(text, "duplex_frames_in_total") >= 8
    finally:
        rc = await trio.to_thread.run_sync(server.stop, signal.SIGTERM)
    assert rc == 0, server.output
    assert not any(_alive(pid) for pid in pids), "a front end outlived the drain"
    # heap.py: the core and each front end froze their serving heap once they served.
    assert "serving heap frozen:" in server.output, server.output[-3000:]
    assert server.output.count(": serving heap frozen (") == 2, server.output[-3000:]


async def _session_on(server: ServerProcess, pid: int, stack, tries: int = 40):
    """A session whose connection landed on front end ``pid`` (SO_REUSEPORT hashes by port)."""
    for _ in range(tries):
        before = connections_by_frontend(server)
        client = await stack.enter_async_context(connect(f"{server.ws}/v1/realtime?duplex=1"))
        await client.wait_for("session.created")
        after = connections_by_frontend(server)
        if after.get(pid, 0) > before.get(pid, 0):
            return client
        await client.ws.aclose()
    raise AssertionError(f"no connection landed on front end {pid} in {tries} tries")


async def test_a_killed_front_end_ends_only_its_sessions_and_is_started_again(tmp_path, parrot_dir):
    from contextlib import AsyncExitStack

    server = start_server(tmp_path, "--frontends", "2", "--max-sessions", "4")
    try:
        first, second = frontends(server)
        async with AsyncExitStack() as stack:
            doomed = await _session_on(server, first, stack)
            survivor = await _session_on(server, second, stack)
            await _frames(survivor, 3, seed=4)
            await survivor.wait_for("response.output_audio.delta", count=3, timeout=30)
            os.kill(first, signal.SIGKILL)
            with trio.fail_after(10):
                try:
                    while True:
                        await doomed.ws.get_message()
                except ConnectionClosed:
                    pass
            # The survivor streams on; the dead front end's slot is reset and freed.
            await _frames(survivor, 3, seed=5)
            await survivor.wait_for("response.output_audio.delta", count=6, timeout=30)
            with trio.fail_after(10):
                while True:
                    status, body = await trio.to_thread.run_sync(http_get, server.base + "/ready")
                    if status == 200 and json.loads(body)["slots_free"] == 3:
                        break
                    await trio.sleep(0.05)
            with trio.fail_after(20):  # started again
                while len(frontends(server)) < 2 or first in frontends(server):
                    await trio.sleep(0.1)
    finally:
        rc = await trio.to_thread.run_sync(server.stop, signal.SIGTERM)
    assert rc == 0, server.output
    assert "exited with code -9: starting it again" in server.output, server.output[-3000:]


async def test_the_engine_cores_death_ends_every_session_with_1011(tmp_path, parrot_dir):
    server = start_server(tmp_path, "--frontends", "2", "--max-sessions", "2")
    pids = frontends(server)
    try:
        async with connect(f"{server.ws}/v1/realtime?duplex=1") as client:
            await client.wait_for("session.created")
            await _frames(client, 2, seed=6)
            await client.wait_for("response.output_audio.delta", count=2, timeout=30)
            os.kill(server.proc.pid, signal.SIGKILL)  # the core runs in the serve process
            error = await client.wait_for("error", timeout=10)
            assert error["error"]["code"] == "internal_error"
            with trio.fail_after(10):
                try:
                    while True:
                        await client.ws.get_message()
                except ConnectionClosed as closed:
                    assert closed.reason is not None and closed.reason.code == 1011
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            await trio.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), "front ends outlived their engine core"
    finally:
        server.stop(signal.SIGKILL)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
