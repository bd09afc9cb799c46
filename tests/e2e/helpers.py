"""Client helpers for the end-to-end tests: a schema-validating WebSocket client, audio, polling.

Every server message a :class:`Client` receives and every client message it sends is checked
against the generated JSON Schemas (``duplex_actors.protocol.schemas``); a message that does not
match fails the test at once. Deliberately malformed client messages go through
:meth:`Client.send_raw`, which skips the check. Every wait is bounded (``trio.fail_after``).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.protocol.native import split_binary_frame
from duplex_actors.protocol.schemas import validate_client_event, validate_server_event

from .conftest import ServerProcess, http_get

SAMPLE_RATE = 24_000
FRAME_SAMPLES = 1920
FRAME_PCM16_BYTES = 2 * FRAME_SAMPLES
WAIT_S = 10.0  # default bound for one wait

TERMINAL_GA = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]


# -- audio ---------------------------------------------------------------------------------------
def tone_and_noise(seconds: float, *, freq: float = 440.0, seed: int = 0, level: float = 0.3) -> np.ndarray:
    """Float32 mono 24 kHz: a tone plus a little white noise (deterministic)."""
    n = round(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    rng = np.random.default_rng(seed)
    x = level * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(n)
    return np.clip(x, -1.0, 1.0).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).round().astype("<i2").tobytes()


def f32(samples: np.ndarray) -> bytes:
    return np.ascontiguousarray(samples, dtype="<f4").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def append_event(data: bytes, event_id: str | None = None, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "input_audio_buffer.append", "audio": b64(data), **extra}
    if event_id is not None:
        event["event_id"] = event_id
    return event


# -- the client ----------------------------------------------------------------------------------
class Client:
    """One WebSocket connection: sends validated events, collects and validates every message."""

    def __init__(self, ws: WebSocketConnection, dialect: str) -> None:
        self.ws = ws
        self.dialect = dialect
        self.messages: list[dict[str, Any] | bytes] = []  # every server message, in order
        self.sent: list[Any] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.closed = trio.Event()
        self._changed = trio.Event()
        self.samples_sent = 0  # audio samples handed to the socket (counted before the send)
        self.on_message: Callable[[Client, Any], None] | None = None

    # sending
    async def send(self, event: dict[str, Any]) -> None:
        validate_client_event(event, self.dialect)  # type: ignore[arg-type]
        await self.send_raw(json.dumps(event))

    async def send_raw(self, data: str | bytes) -> None:
        self.sent.append(data)
        await self.ws.send_message(data)

    async def append(self, data: bytes, *, sample_width: int = 2, event_id: str | None = None) -> None:
        """Send audio (base64 append); counts the samples before the send, so a check made while
        the send is in flight never under-counts what the server may already have."""
        self.samples_sent += len(data) // sample_width
        await self.send(append_event(data, event_id))

    async def append_binary(self, data: bytes, *, sample_width: int = 2) -> None:
        self.samples_sent += len(data) // sample_width
        await self.send_raw(data)

    async def close_session(self, timeout: float = WAIT_S) -> None:
        """``session.close`` and wait for the server to close the socket (if a session is open)."""
        if self.closed.is_set() or not self.of_type("session.created"):
            return
        if self.of_type("session.closed"):
            await self.wait_closed(timeout)
            return
        try:
            await self.send({"type": "session.close"})
        except ConnectionClosed:
            return
        await self.wait_closed(timeout)

    # receiving
    async def _reader(self) -> None:
        try:
            while True:
                raw = await self.ws.get_message()
                if isinstance(raw, str):
                    msg = json.loads(raw)
                    validate_server_event(msg, self.dialect)  # type: ignore[arg-type]
                else:
                    assert self.dialect == "native", "binary message on the Realtime dialect"
                    msg = bytes(raw)
                    index, audio = split_binary_frame(msg)
                    assert len(audio) % FRAME_PCM16_BYTES == 0 and index >= 0
                if self.on_message is not None:
                    self.on_message(self, msg)
                self.messages.append(msg)
                self._poke()
        except ConnectionClosed as exc:
            assert exc.reason is not None
            self.close_code = exc.reason.code
            self.close_reason = exc.reason.reason
        finally:
            self.closed.set()
            self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[], Any], timeout: float = WAIT_S, what: str = "") -> Any:
        with trio.fail_after(timeout):
            while True:
                result = predicate()
                if result:
                    return result
                if self.closed.is_set():
                    result = predicate()
                    if result:
                        return result
                    raise AssertionError(
                        f"connection closed ({self.close_code} {self.close_reason!r}) while waiting for "
                        f"{what or predicate}; got types {self.types()}"
                    )
                await self._changed.wait()

    async def wait_for(
        self, type_: str, *, count: int = 1, timeout: float = WAIT_S, since: int = 0
    ) -> dict[str, Any]:
        """The ``count``-th message of ``type_`` (from index ``since``)."""

        def found() -> Any:
            hits = [m for m in self.events(since=since) if m.get("type") == type_]
            return hits[count - 1] if len(hits) >= count else None

        return await self.wait_until(found, timeout, what=f"{count} x {type_}")

    async def wait_error(self, code: str, *, timeout: float = WAIT_S, since: int = 0) -> dict[str, Any]:
        def found() -> Any:
            for m in self.events(since=since):
                if m.get("type") == "error" and error_code(m) == code:
                    return m
            return None

        return await self.wait_until(found, timeout, what=f"error {code}")

    async def wait_closed(self, timeout: float = WAIT_S) -> None:
        with trio.fail_after(timeout):
            await self.closed.wait()

    # views
    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return [m for m in self.messages[since:] if isinstance(m, dict)]

    def types(self, since: int = 0) -> list[str]:
        return [m["type"] for m in self.events(since)]

    def of_type(self, *types: str, since: int = 0) -> list[dict[str, Any]]:
        return [m for m in self.events(since) if m["type"] in types]

    def errors(self, since: int = 0) -> list[dict[str, Any]]:
        return self.of_type("error", since=since)

    def error_codes(self, since: int = 0) -> list[str]:
        return [error_code(m) for m in self.errors(since)]

    def deltas(self, since: int = 0) -> list[dict[str, Any]]:
        return self.of_type("response.output_audio.delta", "response.audio.delta", since=since)

    def binary_frames(self) -> list[tuple[int, bytes]]:
        return [split_binary_frame(m) for m in self.messages if isinstance(m, bytes)]

    def output_audio(self) -> bytes:
        if self.dialect == "native":
            out = [base64.b64decode(m["audio"]) for m in self.of_type("response.output_audio.delta")]
            out += [audio for _, audio in self.binary_frames()]
            return b"".join(out)
        return b"".join(base64.b64decode(m["delta"]) for m in self.deltas())

    def output_frames(self) -> int:
        return len(self.output_audio()) // FRAME_PCM16_BYTES

    @property
    def session_id(self) -> str:
        created = self.of_type("session.created")
        assert created, f"no session.created; got {self.types()}"
        if self.dialect == "native":
            return str(created[0]["session_id"])
        return str(created[0]["session"]["id"])


def error_code(msg: dict[str, Any]) -> str:
    """The error code of an ``error`` event of either dialect."""
    err = msg["error"]
    return str(err["code"] if isinstance(err, dict) else msg["code"])


def client_event_id(msg: dict[str, Any]) -> str | None:
    err = msg["error"]
    return err["event_id"] if isinstance(err, dict) else msg.get("client_event_id")


@asynccontextmanager
async def connect(
    url: str,
    *,
    dialect: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    subprotocols: Iterable[str] | None = None,
    max_message_size: int = 4 << 20,
    graceful: bool = True,
) -> AsyncIterator[Client]:
    """Open a WebSocket and collect its messages until the block ends. Then, with ``graceful``,
    a session still open is closed with ``session.close`` and its ``session.closed`` awaited,
    so the slot is free when the block exits; finally the socket is closed (bounded)."""
    dialect = dialect or ("native" if "/v1/duplex" in url else "realtime")
    extra = [(k.encode(), v.encode()) for k, v in headers]
    async with open_websocket_url(
        url,
        extra_headers=extra,
        subprotocols=list(subprotocols) if subprotocols is not None else None,
        connect_timeout=10,
        disconnect_timeout=5,
        max_message_size=max_message_size,
    ) as ws:
        client = Client(ws, dialect)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._reader)
            try:
                yield client
                if graceful:
                    await client.close_session()
            finally:
                nursery.cancel_scope.cancel()


async def drop_tcp(client: Client) -> None:
    """Close the TCP connection without a WebSocket close frame (an abrupt client disconnect)."""
    await client.ws._stream.aclose()


# -- feeding audio -------------------------------------------------------------------------------
async def feed(
    client: Client,
    data: bytes,
    chunk_bytes: int,
    *,
    pace: float = 1.0,
    sample_width: int = 2,
    binary: bool = False,
) -> None:
    """Send ``data`` in chunks of ``chunk_bytes``, ``pace`` x real time (0: as fast as possible)."""
    start = time.monotonic()
    sent = 0
    for offset in range(0, len(data), chunk_bytes):
        chunk = data[offset : offset + chunk_bytes]
        if binary:
            await client.append_binary(chunk, sample_width=sample_width)
        else:
            await client.append(chunk, sample_width=sample_width)
        sent += len(chunk) // sample_width
        if pace:
            due = start + sent / SAMPLE_RATE / pace
            await trio.sleep(max(0.0, due - time.monotonic()))


# -- the server ----------------------------------------------------------------------------------
async def get_json(server: ServerProcess, path: str) -> tuple[int, Any]:
    status, body = await trio.to_thread.run_sync(http_get, server.base + path)
    return status, json.loads(body)


async def get_text(server: ServerProcess, path: str) -> tuple[int, str]:
    return await trio.to_thread.run_sync(http_get, server.base + path)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` in Prometheus text."""
    m = re.search(rf"^{re.escape(name)}(?:\{{\}})? (\S+)$", text, re.MULTILINE)
    assert m, f"metric {name} not found"
    return float(m.group(1))


async def wait_ready_status(server: ServerProcess, status: int, timeout: float = 10.0) -> None:
    """Poll ``/ready`` until it answers ``status`` (a signal's effect is asynchronous: SIGUSR1
    makes it 503, SIGUSR2 200 again, once the front end has handled it). With one front end
    (``--frontends 1``) that answer is the whole server's."""
    seen = 0
    try:
        with trio.fail_after(timeout):
            while (seen := (await get_text(server, "/ready"))[0]) != status:
                await trio.sleep(0.05)
    except trio.TooSlowError:
        raise AssertionError(f"/ready still {seen} after {timeout} s, not {status}") from None


async def wait_idle(server: ServerProcess, timeout: float = 10.0) -> None:
    """Poll until every slot is free (``/ready`` and ``/metrics`` agree)."""
    status: int = 0
    ready: Any = None
    in_use = -1.0
    try:
        with trio.fail_after(timeout):
            while True:
                status, ready = await get_json(server, "/ready")
                _, text = await get_text(server, "/metrics")
                in_use = metric(text, "duplex_slots_in_use")
                if status == 200 and ready["slots_free"] == ready["slots_total"] and in_use == 0:
                    return
                await trio.sleep(0.05)
    except trio.TooSlowError:
        raise AssertionError(f"slots still held: /ready {status} {ready}, slots_in_use {in_use}") from None


def log_path(server: ServerProcess, session_id: str) -> Path:
    return server.log_dir / f"{session_id}.dlog"


async def read_records(server: ServerProcess, session_id: str, timeout: float = 10.0) -> list[Any]:
    """The records of a finished session log (waits, bounded, for its ``End`` record)."""
    path = log_path(server, session_id)
    with trio.fail_after(timeout):
        while True:
            if path.exists():
                try:
                    recs = [rec for _, rec in read_log(path).records]
                except Exception:
                    recs = []
                if recs and isinstance(recs[-1], r.End):
                    return recs
            await trio.sleep(0.05)


def steps(records: list[Any]) -> list[r.Step]:
    return [rec for rec in records if isinstance(rec, r.Step)]
