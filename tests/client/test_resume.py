"""``open_duplex_client(..., resume=True)`` against a scripted native ``/v1/duplex`` server (no
model, no server process): what a resume sends (the route, the token, the cursor, the input
from the position the server holds, the commands it lacks, the ack), the token rotation, events
replayed twice dropped, retries, and every way a session ends up lost (docs/protocol.md §10)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from duplex_actors.client.audio import encode_audio, speech_like
from duplex_actors.client.connection import DuplexClient, open_duplex_client
from duplex_actors.client.errors import ServerClosed, SessionLost
from duplex_actors.client.events import AudioDelta, Resumed, ServerEvent

SID = "sess_fake"
FRAME = 1920
AUDIO = encode_audio(speech_like(6 * 0.08, seed=3), "pcm16").data  # 6 frames, pcm16 bytes


def frame(i: int) -> bytes:
    return AUDIO[i * 2 * FRAME : (i + 1) * 2 * FRAME]


def delta(i: int) -> dict[str, Any]:
    audio = base64.b64encode(bytes(2 * FRAME)).decode()
    return {
        "type": "response.output_audio.delta",
        "response_id": "resp_1",
        "epoch": 0,
        "frame_index": i,
        "audio": audio,
        "text": "",
    }


@attrs.define
class Conn:
    """One connection to the fake server, seen from the server."""

    ws: WebSocketConnection
    path: str
    received: list[dict[str, Any]] = attrs.Factory(list)

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.path).query)

    async def recv(self, *types: str) -> dict[str, Any]:
        """The next client message of one of ``types`` (the others are kept in ``received``)."""
        while True:
            obj = json.loads(await self.ws.get_message())
            self.received.append(obj)
            if not types or obj["type"] in types:
                return obj

    async def send(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            await self.ws.send_message(json.dumps(obj))

    async def drop(self) -> None:
        """The TCP connection ends without a close frame."""
        await self.ws._stream.aclose()

    async def refuse(self, code: str, close: int) -> None:
        await self.send(
            {"type": "error", "error": "refused", "code": code, "client_event_id": None, "param": None}
        )
        await self.ws.aclose(close)

    async def serve_to_the_end(self) -> None:
        """Answer heartbeats and session.close (then session.closed and the close) until the end."""
        try:
            while True:
                obj = await self.recv()
                if obj["type"] == "session.heartbeat":
                    await self.send({"type": "session.heartbeat_ack", "client_event_id": obj.get("event_id")})
                elif obj["type"] == "session.close":
                    await self.send({"type": "session.closed", "session_id": SID, "reason": "client_closed"})
                    await self.ws.aclose()
                    return
        except ConnectionClosed:
            pass


Script = Callable[[Conn], Awaitable[None]]


@attrs.frozen
class Reject:
    """A script that refuses the WebSocket upgrade with an HTTP status."""

    status: int


async def opening(conn: Conn, grace: float = 5.0) -> dict[str, Any]:
    """session.create -> session.created (token T1), session.updated, the open heartbeat's ack
    (sequence numbers 1 and 2)."""
    create = await conn.recv("session.create")
    await conn.send(
        {
            "type": "session.created",
            "session_id": SID,
            "session": {},
            "resume_token": "T1",
            "attachment_generation": 1,
            "resume_grace_s": grace,
        },
        {"type": "session.updated", "session_id": SID, "session": {}},
    )
    beat = await conn.recv("session.heartbeat")
    await conn.send({"type": "session.heartbeat_ack", "client_event_id": beat["event_id"]})
    return create


def resumed(token: str, replay_from: int, last: int, received: int, last_id: str | None) -> dict[str, Any]:
    return {
        "type": "session.resumed",
        "session_id": SID,
        "attachment_generation": 2,
        "resume_token": token,
        "last_server_event_seq": last,
        "replay_from_server_event_seq": replay_from,
        "input_samples_received": received,
        "last_client_event_id": last_id,
        "resume_grace_s": 5.0,
    }


class FakeServer:
    """Connection i runs ``scripts[i]``."""

    def __init__(self, *scripts: Script | Reject) -> None:
        self.scripts = list(scripts)
        self.conns: list[Conn] = []
        self.port = 0
        self.attempts = 0
        self.failures: list[BaseException] = []

    async def _handle(self, request: WebSocketRequest) -> None:
        script = self.scripts[self.attempts] if self.attempts < len(self.scripts) else None
        self.attempts += 1
        if isinstance(script, Reject):
            await request.reject(script.status, body=b'{"error": {"message": "no", "code": "x"}}')
            return
        ws = await request.accept()
        conn = Conn(ws, request.path)
        self.conns.append(conn)
        try:
            if script is None:
                await ws.aclose()
            else:
                await script(conn)
        except ConnectionClosed:
            pass
        except BaseException as exc:  # an assertion in a script: reported by the test
            self.failures.append(exc)
            raise

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/duplex"


@asynccontextmanager
async def fake_server(*scripts: Script | Reject) -> AsyncIterator[FakeServer]:
    fake = FakeServer(*scripts)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, fake._handle, "127.0.0.1", 0, None)
        fake.port = server.port
        yield fake
        nursery.cancel_scope.cancel()
    assert not fake.failures, fake.failures


@asynccontextmanager
async def resumable(fake: FakeServer, seen: list[ServerEvent], **kwargs: Any) -> AsyncIterator[DuplexClient]:
    async with open_duplex_client(
        fake.url, config={}, alignment=None, resume=True, on_event=seen.append, **kwargs
    ) as client:
        yield client


# -- a resume, in detail ------------------------------------------------------------------------------
async def test_a_resume_sends_the_cursor_the_token_the_missing_input_and_commands() -> None:
    cancel_id: list[str] = []

    async def first(conn: Conn) -> None:
        create = await opening(conn)
        assert create["resume"] is True
        for _ in range(3):
            await conn.recv("input_audio_buffer.append")
        await conn.send({"type": "response.created", "response_id": "resp_1", "epoch": 0}, delta(0), delta(1))
        cancel = await conn.recv("response.cancel")  # seq 3, 4, 5 sent
        cancel_id.append(cancel["event_id"])
        await conn.drop()  # as if the cancel and the third frame had been lost in flight

    async def second(conn: Conn) -> None:
        assert conn.query["session_id"] == [SID] and "resume" not in conn.query
        resume = await conn.recv()
        assert resume == {
            "type": "session.resume",
            "session_id": SID,
            "resume_token": "T1",
            "last_received_server_event_seq": 5,
            "accept_gap": False,
        }
        # The server holds two frames; its replay starts early (4): the client drops 4 and 5.
        await conn.send(resumed("T2", 4, 6, 2 * FRAME, "heartbeat_1"), delta(0), delta(1), delta(2))
        ack = await conn.recv()
        assert ack == {"type": "session.event_ack", "server_event_seq": 5}  # proves T2 arrived
        append = await conn.recv()
        assert append["type"] == "input_audio_buffer.append" and append["input_samples_start"] == 2 * FRAME
        assert base64.b64decode(append["audio"]) == frame(2)
        assert (await conn.recv())["event_id"] == cancel_id[0]  # re-sent after the input it followed
        await conn.drop()

    async def busy(conn: Conn) -> None:
        assert (await conn.recv())["resume_token"] == "T2"
        await conn.refuse("session_not_here", 1013)  # another front end: connect again

    async def fourth(conn: Conn) -> None:
        resume = await conn.recv()
        assert resume["resume_token"] == "T2" and resume["last_received_server_event_seq"] == 6
        await conn.send(resumed("T3", 7, 6, 3 * FRAME, cancel_id[0]))
        assert await conn.recv() == {"type": "session.event_ack", "server_event_seq": 6}
        await conn.serve_to_the_end()

    seen: list[ServerEvent] = []
    with trio.fail_after(15):
        async with fake_server(first, second, busy, fourth) as fake, resumable(fake, seen) as client:
            for i in range(3):
                await client.send_audio(frame(i))
            await client.wait_frames(2)
            await client.cancel()
            await client.wait_frames(3)
            await client.wait_until(lambda: client.resumes == 2)
            assert client.samples_sent == 3 * FRAME and client.frames_received == 3
        assert len(fake.conns) == 4
        assert fake.conns[3].received[-1]["type"] == "session.close"  # nothing else was re-sent
    deltas = [e for e in seen if isinstance(e, AudioDelta)]
    assert [d.frame_index for d in deltas] == [0, 1, 2]  # the early replay dropped
    notes = [e for e in seen if isinstance(e, Resumed)]
    assert [n.input_samples_resent for n in notes] == [FRAME, 0] and all(n.cause == "dropped" for n in notes)
    assert notes[1].attempts == 2
    server_events = [e for e in seen if not isinstance(e, Resumed)]
    assert [e.seq for e in server_events] == list(range(1, len(server_events) + 1))
    assert server_events[-1].type == "session.closed" and client.lost is None
    assert all("T1" not in repr(e.raw) and "T2" not in repr(e.raw) for e in seen)  # tokens never shown


# -- lost sessions ------------------------------------------------------------------------------------
async def dropped_after_open(conn: Conn, grace: float = 5.0) -> None:
    await opening(conn, grace)
    await conn.drop()


async def lost(*scripts: Script | Reject, **kwargs: Any) -> tuple[SessionLost, FakeServer, DuplexClient]:
    """The SessionLost a session ends with, its server and client."""
    seen: list[ServerEvent] = []
    with trio.fail_after(10):
        async with fake_server(*scripts) as fake, resumable(fake, seen, **kwargs) as client:
            with pytest.raises(SessionLost) as exc:
                await client.wait_frames(1)
            with pytest.raises(SessionLost):  # and every later call
                await client.send_audio(frame(0))
    assert client.lost is exc.value and isinstance(exc.value, ServerClosed)
    return exc.value, fake, client


async def test_an_expired_session_is_lost_at_once() -> None:
    async def expired(conn: Conn) -> None:
        await conn.recv("session.resume")
        await conn.refuse("session_resume_expired", 1000)

    exc, fake, _ = await lost(dropped_after_open, expired)
    assert exc.cause == "session_resume_expired" and len(fake.conns) == 2
    assert "session_resume_expired" in str(exc) and "T1" not in str(exc)


async def test_a_refused_upgrade_is_retried_and_an_unauthorized_one_lost() -> None:
    exc, fake, _ = await lost(dropped_after_open, Reject(503), Reject(401))
    assert exc.cause == "unauthorized" and fake.attempts == 3


async def test_no_resume_within_the_grace_is_lost_after_retries() -> None:
    async def mute(conn: Conn) -> None:
        await conn.recv("session.resume")
        await conn.ws.aclose()  # no answer

    start = trio.current_time()
    exc, fake, _ = await lost(lambda c: dropped_after_open(c, grace=0.5), mute, mute, mute, mute, mute, mute)
    assert exc.cause == "grace_expired"
    assert 0.5 <= trio.current_time() - start < 3 and 3 <= len(fake.conns) <= 7  # backoff 0.05, 0.1, 0.2, ...


async def test_a_journal_gap_is_lost_unless_accepted() -> None:
    async def resync(conn: Conn) -> None:
        await conn.recv("session.resume")
        await conn.send(
            {
                "type": "session.resync_required",
                "session_id": SID,
                "reason": "journal_gap",
                "oldest_server_event_seq": 9,
            }
        )
        await conn.ws.aclose()

    exc, _, _ = await lost(dropped_after_open, resync)
    assert exc.cause == "journal_gap"

    async def accepted(conn: Conn) -> None:
        assert (await conn.recv())["accept_gap"] is True
        await conn.send(resumed("T2", 9, 9, 0, None), delta(0))
        await conn.serve_to_the_end()

    seen: list[ServerEvent] = []
    with trio.fail_after(10):
        async with (
            fake_server(dropped_after_open, resync, accepted) as fake,
            resumable(fake, seen, accept_gap=True) as client,
        ):
            await client.wait_frames(1)
    assert client.resumes == 1 and client.lost is None


async def test_input_the_client_no_longer_holds_is_lost_and_the_session_closed() -> None:
    async def from_zero(conn: Conn) -> None:
        await conn.recv("session.resume")
        await conn.send(resumed("T2", 3, 2, 0, None))
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
        assert (
            closed.value.reason is not None and closed.value.reason.code == 1000
        )  # a close frame: the session ends on the server

    async def first(conn: Conn) -> None:
        await opening(conn)
        for _ in range(6):
            await conn.recv("input_audio_buffer.append")
        await conn.drop()

    seen: list[ServerEvent] = []
    with trio.fail_after(10):
        async with fake_server(first, from_zero) as fake, resumable(fake, seen, resume_input_s=0.1) as client:
            for i in range(6):
                await client.send_audio(frame(i))
            with pytest.raises(SessionLost) as exc:
                await client.wait_frames(1)
    assert exc.value.cause == "input_gap"


async def test_without_resume_a_drop_ends_the_session_as_before() -> None:
    async def first(conn: Conn) -> None:
        create = await opening(conn)
        assert not create.get("resume")
        await conn.drop()

    with trio.fail_after(10):
        async with (
            fake_server(first) as fake,
            open_duplex_client(fake.url, config={}, alignment=None) as client,
        ):
            with pytest.raises(ServerClosed) as exc:
                await client.wait_frames(1)
            assert not isinstance(exc.value, SessionLost) and exc.value.code == 1006
    assert len(fake.conns) == 1 and client.resumes == 0
