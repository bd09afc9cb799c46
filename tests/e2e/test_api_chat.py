"""``WS /api/chat`` against a real ``duplex-actors serve --model tiny-parrot``: one test per row
of docs/protocol.md §9 (handshake timing and length, every client framing, pre-handshake audio, ignored
kinds, the refusals and close codes, auth by query key, drain, metrics, replay).

The client framings are made as each real client makes them: sphn 0.2's writer (moshi.client:
40 ms packets, header pages and two audio pages in the first message), and the system libopus
through ``tests/opus/libopus.py`` for the web UI's 20 ms packets two per page and PersonaPlex's
80 ms packets (header pages as separate messages).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import sphn
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.replay.replayer import replay_logic

from ..opus.libopus import needs_libopus, ogg_stream, opus_packets
from .conftest import ServerProcess, descendants, http_get, start_server

SR = 24_000
FRAME = 1920
KEY = "sk-chat-K3y"
UI_QUERY = {
    "text_temperature": "0.7",
    "text_topk": "25",
    "audio_temperature": "0.8",
    "audio_topk": "250",
    "pad_mult": "0",
    "text_seed": "123",
    "audio_seed": "456",
    "repetition_penalty_context": "64",
    "repetition_penalty": "1",
    "text_prompt": "You enjoy having a good conversation.",
    "voice_prompt": "NATF0.pt",
}
RMS_FLOOR = 0.01


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory, parrot_dir) -> Iterable[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("chat"), "--max-sessions", "2")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def slots_free(request) -> None:
    """Each test starts with every slot of the shared server free: a slot is freed only after
    its model state is reset, a moment after the client of the last test went away."""
    if "chat_server" not in request.fixturenames:
        return
    server: ServerProcess = request.getfixturevalue("chat_server")
    deadline = time.monotonic() + 10
    while server.json("/ready")[1].get("slots_free") != 2:
        assert time.monotonic() < deadline, "the shared server's slots were not freed"
        time.sleep(0.05)


def url(server: ServerProcess, query: dict[str, str] | None = None) -> str:
    q = urllib.parse.urlencode(query or {})
    return f"{server.ws}/api/chat" + (f"?{q}" if q else "")


def tone(seconds: float, hz: float = 330.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amp * np.sin(2 * np.pi * hz * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def as_bytes(message: str | bytes) -> bytes:
    assert isinstance(message, bytes), f"a text frame from the server: {message!r}"
    return message


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def sphn_messages(pcm: np.ndarray) -> list[bytes]:
    """moshi.client's framing: ``append_pcm(1920)`` per message (headers in the first)."""
    writer = sphn.OpusStreamWriter(SR)
    return [writer.append_pcm(pcm[i : i + FRAME]) for i in range(0, pcm.size - FRAME + 1, FRAME)]


def libopus_messages(pcm: np.ndarray, frame_ms: int, per_page: int, headers: str) -> list[bytes]:
    frame = SR * frame_ms // 1000
    head, audio = ogg_stream(opus_packets(pcm, frame), frame, per_page)
    first = [b"".join(head)] if headers == "together" else head
    return first + audio


def fragments(messages: list[bytes], size: int) -> list[bytes]:
    blob = b"".join(messages)
    return [blob[i : i + size] for i in range(0, len(blob), size)]


@asynccontextmanager
async def chat(target: str, headers: Iterable[tuple[str, str]] = ()) -> AsyncIterator[WebSocketConnection]:
    extra = [(k.encode(), v.encode()) for k, v in headers]
    async with open_websocket_url(
        target, extra_headers=extra, connect_timeout=10, disconnect_timeout=3
    ) as ws:
        yield ws


class Received:
    """Every server message of one connection, and its close code."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.code: int | None = None
        self.reason: str | None = None

    def kinds(self) -> list[int]:
        return [m[0] for m in self.messages]

    def audio(self) -> list[bytes]:
        return [m[1:] for m in self.messages if m[0] == 1]

    def text(self) -> str:
        return "".join(m[1:].decode() for m in self.messages if m[0] == 2)

    def errors(self) -> list[str]:
        return [m[1:].decode() for m in self.messages if m[0] == 5]

    def pcm(self) -> np.ndarray:
        reader = sphn.OpusStreamReader(SR)
        parts = [reader.append_bytes(a) for a in self.audio()]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


async def collect(ws: WebSocketConnection, into: Received, *, until_audio: int | None = None) -> None:
    """Read until the socket closes (or ``until_audio`` audio messages arrived)."""
    try:
        while until_audio is None or len(into.audio()) < until_audio:
            into.messages.append(as_bytes(await ws.get_message()))
    except ConnectionClosed as closed:
        assert closed.reason is not None
        into.code, into.reason = closed.reason.code, closed.reason.reason


async def handshake(ws: WebSocketConnection, timeout: float = 15.0) -> bytes:
    with trio.fail_after(timeout):
        return as_bytes(await ws.get_message())


async def refused(target: str) -> Received:
    """A connection the server refuses after the upgrade: its messages and close code."""
    got = Received()
    with trio.fail_after(15):
        async with chat(target) as ws:
            await collect(ws, got)
    return got


def logs(server: ServerProcess) -> set[Path]:
    return set(server.log_dir.glob("*.dlog"))


def records(path: Path) -> list[r.Record]:
    return [rec for _, rec in read_log(path).records]


async def finished(path: Path, timeout: float = 10.0) -> list[r.Record]:
    """The records of a session log once its ``end`` is written (the socket closes first)."""
    with trio.fail_after(timeout):
        while True:
            recs = records(path)
            if recs and isinstance(recs[-1], r.End):
                return recs
            await trio.sleep(0.05)


async def stream_and_collect(
    server: ServerProcess, messages: list[bytes], query: dict[str, str], frames_sent: int
) -> Received:
    """Handshake, send ``messages`` (``frames_sent`` frames of audio) at once, read until about
    every frame has come back, then close (1000 from the client)."""
    got = Received()
    async with chat(url(server, query)) as ws:
        first = await handshake(ws)
        got.messages.append(first)
        for m in messages:
            await ws.send_message(b"\x01" + m)
        with trio.move_on_after(3 + frames_sent * 0.2):
            await collect(ws, got, until_audio=max(frames_sent - 2, 1))
        with trio.move_on_after(0.5):  # anything still in flight
            await collect(ws, got)
    return got


# -- the handshake ---------------------------------------------------------------------------------
async def test_ui_query_handshake_is_one_byte_then_audio_then_text_in_step_order(chat_server):
    before = logs(chat_server)
    pcm = tone(2.0)
    got = await stream_and_collect(chat_server, sphn_messages(pcm), UI_QUERY, pcm.size // FRAME)
    assert got.messages[0] == b"\x00"
    kinds = got.kinds()[1:]
    assert set(kinds) <= {1, 2}, kinds  # no error, no metadata, no ping while audio flows
    # One 0x01 per step, its 0x02 (if any) right after it: never text first, never two texts.
    assert kinds[0] == 1
    assert all(not (a == 2 and b == 2) for a, b in itertools.pairwise(kinds))
    audio = got.audio()
    assert audio[0].startswith(b"OggS") and b"OpusHead" in audio[0]
    assert all(a.startswith(b"OggS") for a in audio)
    assert 23 <= len(audio) <= 25  # lockstep: 25 frames in, never more out
    assert rms(got.pcm()) > RMS_FLOOR
    (path,) = logs(chat_server) - before
    recs = await finished(path)
    header = recs[0]
    assert isinstance(header, r.Header) and header.dialect == "api_chat"
    assert header.output == {"audio": "ogg_opus", "handshake": "python"}
    assert header.sampling == {}  # the server does not let clients choose sampling: greedy
    opened = recs[1]
    assert isinstance(opened, r.Open)
    assert opened.config == {"voice": "NATF0.pt", "instructions": UI_QUERY["text_prompt"]}
    assert isinstance(recs[-2], r.Close)
    assert sum(isinstance(x, r.Step) for x in recs) == len(audio)
    exe = str(Path(sys.executable).with_name("duplex-replay"))
    out = await trio.to_thread.run_sync(
        lambda: subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=120)
    )
    assert out.returncode == 0 and ": identical" in out.stdout, out.stdout + out.stderr


async def test_rust_handshake_is_nine_bytes_and_no_query_gets_the_defaults(chat_server):
    before = logs(chat_server)
    async with chat(url(chat_server, {"handshake": "rust"})) as ws:
        assert await handshake(ws) == b"\x00" + bytes(8)
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
    opened = [(await finished(p))[1] for p in logs(chat_server) - before]
    assert all(isinstance(o, r.Open) and o.config == {} for o in opened) and len(opened) == 2


# -- client framings -------------------------------------------------------------------------------
FRAMINGS = {
    "moshi-client-40ms": lambda pcm: sphn_messages(pcm),
    "web-ui-20ms-2-per-page": lambda pcm: libopus_messages(pcm, 20, 2, "separate"),
    "personaplex-80ms": lambda pcm: libopus_messages(pcm, 80, 1, "separate"),
    "40ms-2-per-page-headers-together": lambda pcm: libopus_messages(pcm, 40, 2, "together"),
    "fragments-of-97-bytes": lambda pcm: fragments(libopus_messages(pcm, 20, 1, "separate"), 97),
    # Over the server's decode slice (web/api_chat.py DECODE_SLICE_BYTES): decoded in pieces.
    "the-whole-stream-in-one-message": lambda pcm: [b"".join(sphn_messages(pcm))],
}


@needs_libopus
@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_every_client_framing_comes_back(chat_server, framing):
    pcm = tone(1.2, hz=250)
    got = await stream_and_collect(chat_server, FRAMINGS[framing](pcm), {}, pcm.size // FRAME)
    assert got.messages[0] == b"\x00" and not got.errors()
    assert 12 <= len(got.audio()) <= 15, len(got.audio())
    assert rms(got.pcm()) > RMS_FLOOR


# -- what is dropped or ignored ----------------------------------------------------------------------
async def test_audio_before_the_handshake_is_dropped(chat_server):
    before = logs(chat_server)
    _, ignored_before = metric(chat_server, 'duplex_ignored_messages_total{reason="api_chat_pre_handshake"}')
    early = sphn_messages(tone(2.0))
    got = Received()
    # A fresh persona: its prefill is computed now, so the burst lands before the handshake.
    async with chat(url(chat_server, {"text_prompt": "You are a careful listener, number 7."})) as ws:
        for m in early:
            await ws.send_message(b"\x01" + m)
        assert await handshake(ws) == b"\x00"
        with trio.move_on_after(1.5):
            await collect(ws, got)
    (path,) = logs(chat_server) - before
    recs = await finished(path)
    appended = sum(len(x.audio) // 2 for x in recs if isinstance(x, r.Append))
    assert all(x.format == "pcm16" for x in recs if isinstance(x, r.Append))
    _, ignored = metric(chat_server, 'duplex_ignored_messages_total{reason="api_chat_pre_handshake"}')
    assert ignored > ignored_before
    assert appended < len(early) * FRAME  # the backlog was not replayed as a burst
    assert len(got.audio()) == sum(isinstance(x, r.Step) for x in recs)


async def test_control_text_metadata_ping_and_unknown_kinds_are_ignored(chat_server):
    got = Received()
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
        for junk in (b"\x03\x00", b"\x03\x07", b"\x02hello", b"\x04{}", b"\x05oops", b"\x06", b"\x09zz", b""):
            await ws.send_message(junk)
        await ws.send_message("a text frame")
        for m in sphn_messages(tone(1.0)):
            await ws.send_message(b"\x01" + m)
        with trio.move_on_after(4):
            await collect(ws, got, until_audio=10)
    assert len(got.audio()) >= 10 and not got.errors() and got.code is None


async def test_keepalive_ping_when_the_client_sends_nothing(chat_server):
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
        with trio.fail_after(7):  # KEEPALIVE_S is 4: well inside the UIs' 10 s
            assert as_bytes(await ws.get_message()) == b"\x06"


# -- refusals -------------------------------------------------------------------------------------
async def test_malformed_ogg_is_0x05_then_1007(chat_server):
    before = logs(chat_server)
    got = Received()
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
        await ws.send_message(b"\x01" + sphn_messages(tone(0.2))[0])
        await ws.send_message(b"\x01" + bytes(range(256)) * 4)
        with trio.fail_after(10):
            await collect(ws, got)
    assert got.code == 1007, (got.code, got.kinds())
    assert got.errors() and "Ogg" in got.errors()[-1]
    (path,) = logs(chat_server) - before
    recs = await finished(path)
    assert recs[-2] == r.Close("invalid_audio") and replay_logic(path).identical


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"text_topk": "lots"}, "text_topk"),
        ({"audio_temperature": "nan"}, "audio_temperature"),
        ({"audio_seed": "-1"}, "audio_seed"),
        ({"handshake": "java"}, "handshake"),
    ],
)
async def test_bad_query_is_0x05_naming_it_then_1008_and_no_log(chat_server, query, says):
    before = logs(chat_server)
    got = await refused(url(chat_server, {**UI_QUERY, **query}))
    assert got.code == 1008 and got.kinds() == [5]
    assert got.errors()[0].startswith(f"{says}: ")
    assert logs(chat_server) == before


@pytest.mark.parametrize("voice", ["NOPE.pt", "../../../etc/passwd", "../voices/NATF0.pt", "/abs/NATF0.pt"])
async def test_unknown_voice_and_traversal_are_refused_with_the_bundled_voices(chat_server, voice):
    got = await refused(url(chat_server, {"voice_prompt": voice}))
    assert got.code == 1008 and got.kinds() == [5]
    assert "NATF0.pt, NATF2.pt, NATM1.pt" in got.errors()[0]


async def test_busy_is_0x05_server_busy_then_1013_at_once(chat_server):
    async with chat(url(chat_server)) as a, chat(url(chat_server)) as b:
        assert await handshake(a) == b"\x00" and await handshake(b) == b"\x00"
        started = trio.current_time()
        got = await refused(url(chat_server))
        assert trio.current_time() - started < 5
    assert got.code == 1013 and got.errors()[0].startswith("server busy")


def opus_workers(server: ServerProcess) -> list[int]:
    # The codec workers are the front end's children, the server's grandchildren.
    return [
        pid
        for pid in descendants(server.proc.pid)
        if b"duplex_actors.opus.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


async def test_a_crashed_codec_worker_ends_its_sessions_with_0x05_then_1011(chat_server):
    got = Received()
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
        (worker,) = opus_workers(chat_server)  # the default on 2 CPUs: one worker
        os.kill(worker, signal.SIGKILL)
        with trio.fail_after(10):
            try:
                for m in sphn_messages(tone(0.5)):
                    await ws.send_message(b"\x01" + m)
            except ConnectionClosed:
                pass  # the server noticed the dead worker before the last send: read what it said
            await collect(ws, got)
    assert got.code == 1011 and got.errors() == ["the audio codec worker failed"]
    async with chat(url(chat_server)) as ws:  # the pool started a new worker
        assert await handshake(ws) == b"\x00"
    assert opus_workers(chat_server) != [worker]


def metric(server: ServerProcess, name: str) -> tuple[str, float]:
    status, body = http_get(server.base + "/metrics")
    assert status == 200
    for line in body.splitlines():
        if line.startswith(name + " "):
            return body, float(line.split()[-1])
    return body, 0.0


async def test_metrics_count_api_chat_sessions_by_dialect(chat_server):
    active_name = 'duplex_dialect_sessions_active{dialect="api_chat"}'
    with trio.fail_after(10):  # the last test's sessions finish their logs after freeing the slot
        while metric(chat_server, active_name)[1] != 0:
            await trio.sleep(0.05)
    async with chat(url(chat_server)) as ws:
        assert await handshake(ws) == b"\x00"
        _, active = metric(chat_server, active_name)
        assert active == 1
    _, opened = metric(chat_server, 'duplex_dialect_sessions_opened_total{dialect="api_chat"}')
    assert opened >= 1


# -- a server of its own: auth by query key, HTTP admission refusal, drain ------------------------------
async def rejected_status(target: str) -> int:
    with trio.fail_after(15), pytest.raises(HandshakeError) as info:
        async with chat(target):
            pass
    assert isinstance(info.value, ConnectionRejected), repr(info.value)
    return int(info.value.status_code)


async def test_query_key_http_busy_and_drain(tmp_path, parrot_dir):
    server = start_server(
        tmp_path, "--max-sessions", "1", "--api-key", KEY, "--admission-refusal", "http", "--client-sampling"
    )
    try:
        assert await rejected_status(url(server)) == 401
        assert await rejected_status(url(server, {"auth_id": "wrong"})) == 401
        assert await rejected_status(url(server, {"worker_auth_id": KEY + "x"})) == 401
        # Query keys are for /api/chat only.
        assert await rejected_status(f"{server.ws}/v1/realtime?auth_id={KEY}") == 401
        async with chat(url(server, {"auth_id": KEY})) as ws:
            assert await handshake(ws) == b"\x00"
            # Full: refused before the upgrade, so a proxy can try another server.
            assert await rejected_status(url(server, {**UI_QUERY, "worker_auth_id": KEY})) == 503
        with trio.fail_after(10):  # the slot is freed once the model state is reset
            while server.json("/ready")[1].get("slots_free") != 1:
                await trio.sleep(0.05)
        got = Received()
        async with chat(url(server, {**UI_QUERY, "worker_auth_id": KEY})) as ws:
            assert await handshake(ws) == b"\x00"
            for m in sphn_messages(tone(1.0)):
                await ws.send_message(b"\x01" + m)
            await collect(ws, got, until_audio=3)
            await trio.to_thread.run_sync(server.proc.send_signal, signal.SIGTERM)
            with trio.fail_after(15):
                await collect(ws, got)
        assert got.code == 1012 and got.audio() and not got.errors()  # the last audio, then 1012
        assert await trio.to_thread.run_sync(server.wait) == 0
    finally:
        server.stop()
    assert KEY not in server.output
    for path in server.log_dir.glob("*.dlog"):
        assert KEY.encode() not in path.read_bytes()
    drained = [p for p in server.log_dir.glob("*.dlog") if records(p)[-2] == r.Close("server_shutdown")]
    assert len(drained) == 1 and len(got.audio()) == sum(isinstance(x, r.Step) for x in records(drained[0]))
    header = records(drained[0])[0]
    assert isinstance(header, r.Header)  # --client-sampling: the UI's values, audio_seed the seed
    assert header.sampling == {
        "temperature_text": 0.7,
        "top_k_text": 25,
        "temperature": 0.8,
        "top_k": 250,
        "seed": 456,
    }
