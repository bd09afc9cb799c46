"""Shared pieces of the reliability tests (RELIABILITY.md): a raw WebSocket client that can
misbehave at the byte level, server metrics and /proc readings, and ``record`` for the numbers.

Every test here runs against a real ``duplex-actors serve`` process (``tiny-parrot``) on a
loopback port, started with :func:`tests.e2e.conftest.start_server`; every wait is bounded.
The measured numbers are printed (``-s`` shows them), attached to the JUnit report
(``record_property``) and, when ``DUPLEX_RELIABILITY_RESULTS`` names a file, appended to it as
JSON lines.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from duplex_actors.client.frames import client_frame

from ..e2e.conftest import ServerProcess, http_get

FRAME_SAMPLES = 1920
FRAME_PCM16_BYTES = 2 * FRAME_SAMPLES


# -- recording the numbers ----------------------------------------------------------------------
@pytest.fixture
def record(request: pytest.FixtureRequest, record_property: Callable[[str, Any], None]):
    """``record(name=value, ...)``: print, attach to the JUnit report, append to the results file."""

    def _record(**numbers: Any) -> None:
        for key, value in numbers.items():
            # As JSON gives it back: a report crosses to pytest-xdist's controller, which
            # serializes plain values only (an enum there crashed the worker).
            record_property(key, json.loads(json.dumps(value, default=str)))
        line = {"test": request.node.nodeid, **numbers}
        print(f"\n[reliability] {json.dumps(line, default=str)}", flush=True)
        out = os.environ.get("DUPLEX_RELIABILITY_RESULTS")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")

    return _record


# -- the server's state -------------------------------------------------------------------------
def metrics_text(server: ServerProcess) -> str:
    status, text = http_get(server.base + "/metrics")
    assert status == 200, text
    return text


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def metric_present(text: str, name: str) -> bool:
    return re.search(rf"^# TYPE {re.escape(name)} ", text, re.MULTILINE) is not None


async def ametrics(server: ServerProcess) -> str:
    return await trio.to_thread.run_sync(metrics_text, server)


async def aready(server: ServerProcess) -> tuple[int, dict[str, Any]]:
    status, body = await trio.to_thread.run_sync(http_get, server.base + "/ready")
    return status, json.loads(body)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def slots_in_use(server: ServerProcess) -> float:
    return metric_sum(await ametrics(server), "duplex_slots_in_use")


async def wait_slots_free(server: ServerProcess, timeout: float = 10.0, interval: float = 0.01) -> float:
    """Poll ``/metrics`` until ``duplex_slots_in_use`` is 0 and ``/ready`` agrees; returns the
    seconds it took (bounded by ``timeout``)."""
    t0 = time.monotonic()
    in_use: float = -1
    ready: Any = None
    try:
        with trio.fail_after(timeout):
            while True:
                in_use = await slots_in_use(server)
                if in_use == 0:
                    elapsed = time.monotonic() - t0
                    status, ready = await aready(server)
                    if status != 200 or ready["slots_free"] == ready["slots_total"]:
                        return elapsed
                await trio.sleep(interval)
    except trio.TooSlowError:
        raise AssertionError(f"slots still in use after {timeout} s: {in_use}, /ready {ready}") from None


async def poll_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = ""
) -> Any:
    """Call ``predicate`` (sync, run in a thread) until truthy; bounded."""
    try:
        with trio.fail_after(timeout):
            while True:
                result = await trio.to_thread.run_sync(predicate)
                if result:
                    return result
                await trio.sleep(interval)
    except trio.TooSlowError:
        raise AssertionError(f"not within {timeout} s: {what or predicate}") from None


# -- audio --------------------------------------------------------------------------------------
def tone_pcm16(frames: int, seed: int = 0) -> bytes:
    import numpy as np

    n = frames * FRAME_SAMPLES
    t = np.arange(n) / 24_000
    rng = np.random.default_rng(seed)
    x = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(n)
    return (np.clip(x, -1, 0.999) * 32767).astype("<i2").tobytes()


def append_text(pcm: bytes, event_id: str | None = None) -> str:
    event: dict[str, Any] = {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    if event_id is not None:
        event["event_id"] = event_id
    return json.dumps(event)


# -- a raw WebSocket client ---------------------------------------------------------------------
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def upgrade_request(path: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


frame_bytes = client_frame  # one client frame, masked (duplex_actors.client.frames)


class RawWS:
    """A WebSocket client at the byte level: it sends what it is told, frames or garbage, and
    parses the server's (unmasked) frames. ``messages`` holds every complete server message."""

    def __init__(self, stream: trio.SocketStream, head: str) -> None:
        self.stream = stream
        self.head = head
        self.buf = b""
        self.messages: list[tuple[int, bytes]] = []
        self.close_code: int | None = None
        self.eof = False

    @property
    def status(self) -> int:
        return int(self.head.split(" ", 2)[1])

    @classmethod
    async def connect(
        cls,
        port: int,
        path: str = "/v1/realtime",
        headers: dict[str, str] | None = None,
        *,
        rcvbuf: int | None = None,
        timeout: float = 10.0,
    ) -> RawWS:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect, so the window is small from the start
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        with trio.fail_after(timeout):
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
            await stream.send_all(upgrade_request(path, headers))
            ws = cls(stream, "")
            while b"\r\n\r\n" not in ws.buf:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                ws.buf += chunk
        head, _, ws.buf = ws.buf.partition(b"\r\n\r\n")
        ws.head = head.decode("latin-1")
        return ws

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send_text(self, text: str) -> None:
        await self.send(frame_bytes(OP_TEXT, text.encode()))

    def _parse_one(self) -> tuple[int, bytes] | None:
        b = self.buf
        if len(b) < 2:
            return None
        opcode, n = b[0] & 0x0F, b[1] & 0x7F
        at = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack(">H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack(">Q", b[2:10])[0], 10
        if len(b) < at + n:
            return None
        payload, self.buf = b[at : at + n], b[at + n :]
        return opcode, payload

    async def recv(self, timeout: float = 10.0) -> tuple[int, bytes] | None:
        """The next server frame, or None at EOF (bounded)."""
        with trio.fail_after(timeout):
            while True:
                frame = self._parse_one()
                if frame is not None:
                    if frame[0] == OP_CLOSE:
                        self.close_code = struct.unpack(">H", frame[1][:2])[0] if len(frame[1]) >= 2 else 1005
                    self.messages.append(frame)
                    return frame
                if self.eof:
                    return None
                try:
                    chunk = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                if not chunk:
                    self.eof = True
                    continue
                self.buf += chunk

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(p) for op, p in self.messages if op == OP_TEXT]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events()]

    async def recv_until(
        self, predicate: Callable[[tuple[int, bytes]], bool], timeout: float = 10.0
    ) -> tuple[int, bytes]:
        with trio.fail_after(timeout):
            while True:
                frame = await self.recv(timeout)
                if frame is None:
                    raise AssertionError(
                        f"EOF while waiting; got {self.types()[-8:]} close {self.close_code}"
                    )
                if predicate(frame):
                    return frame

    async def recv_event(self, type_: str, timeout: float = 10.0) -> dict[str, Any]:
        def match(frame: tuple[int, bytes]) -> bool:
            return frame[0] == OP_TEXT and json.loads(frame[1]).get("type") == type_

        return json.loads((await self.recv_until(match, timeout))[1])

    async def read_to_eof(self, timeout: float = 10.0) -> None:
        with trio.fail_after(timeout):
            while await self.recv(timeout) is not None:
                pass

    def abort(self) -> None:
        """Close the TCP connection with an RST (SO_LINGER 0): no FIN, no close frame."""
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.stream.socket.close()

    async def aclose(self) -> None:
        await self.stream.aclose()


def output_deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] in ("response.output_audio.delta", "response.audio.delta")]
