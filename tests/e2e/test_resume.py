"""Resuming a session after its connection dropped (docs/protocol.md §10), on a real server,
through a TCP proxy that cuts (RST, FIN) or blackholes the connection."""

from __future__ import annotations

import base64
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import ConnectionRejected

from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic

from .conftest import ServerProcess, start_server
from .fault_proxy import FaultProxy, proxy_to
from .helpers import (
    Client,
    connect,
    get_text,
    metric,
    pcm16,
    read_records,
    tone_and_noise,
    wait_idle,
    wait_ready_status,
)

FRAME_BYTES = 3840  # 80 ms of pcm16 at 24 kHz
FRAMES = 24
OFF = {"duplex": {"alignment": "off"}}
RESUME_TYPES = ("session.created", "session.resumed")


@pytest.fixture(scope="module")
def resume_server(tmp_path_factory, parrot_dir) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("resume"), "--max-sessions", "3", "--resume-grace-s", "4")
    yield server
    server.stop()


def track(frames: int = FRAMES, seed: int = 1) -> bytes:
    return pcm16(tone_and_noise(frames * 0.08 + 0.1, seed=seed))[: frames * FRAME_BYTES]


@attrs.frozen
class Kind:
    path: str
    opening: dict[str, Any]
    binary: bool = False
    out_frame_bytes: int = FRAME_BYTES  # an output frame on the wire (G.711: 640 bytes)

    @property
    def dialect(self) -> str:
        return "native" if self.path.startswith("/v1/duplex") else "realtime"

    def resume_url(self, base: str, session_id: str) -> str:
        if self.dialect == "native":
            return f"{base}/v1/duplex?session_id={session_id}"
        return f"{base}/v1/realtime?duplex=1&session_id={session_id}"


KINDS = {
    "native": Kind("/v1/duplex", {"type": "session.create", "resume": True, "session": OFF}),
    "native-binary": Kind(
        "/v1/duplex", {"type": "session.create", "resume": True, "binary_output": True, "session": OFF}, True
    ),
    "realtime": Kind(
        "/v1/realtime?duplex=1&autostart=0&resume=1", {"type": "session.update", "session": OFF}
    ),
    "realtime-g711": Kind(
        "/v1/realtime?duplex=1&autostart=0&resume=1",
        {"type": "session.update", "session": {**OFF, "output_audio_format": "g711_ulaw"}},
        out_frame_bytes=640,
    ),
}


class Resumer:
    """One resumable session over as many connections as it takes, through ``proxy``."""

    def __init__(
        self, server: ServerProcess, proxy: FaultProxy, kind: Kind, audio: bytes, chunk: int
    ) -> None:
        self.server, self.proxy, self.kind, self.audio, self.chunk = server, proxy, kind, audio, chunk
        self.clients: list[Client] = []
        self.token = ""
        self.session_id = ""
        self.sent = 0  # bytes of audio the server may hold (sent on some connection)
        self.resumed: list[dict[str, Any]] = []

    @property
    def client(self) -> Client:
        return self.clients[-1]

    def journaled(self) -> list[Any]:
        """Every message after session.created / session.resumed, all connections in order."""
        return [
            m
            for c in self.clients
            for m in c.messages
            if not (isinstance(m, dict) and m.get("type") in RESUME_TYPES)
        ]

    def output(self) -> bytes:
        return b"".join(c.output_audio() for c in self.clients)

    def frames_out(self) -> int:
        return len(self.output()) // self.kind.out_frame_bytes

    async def send_until(self, end: int, *, first_start: int | None = None) -> None:
        while self.sent < end:
            piece = self.audio[self.sent : min(end, self.sent + self.chunk)]
            if first_start is not None:
                event: dict[str, Any] = {
                    "type": "input_audio_buffer.append",
                    "audio": base64.b64encode(piece).decode(),
                }
                event["input_samples_start"] = first_start
                await self.client.send(event)
                first_start = None
            elif self.kind.binary:
                await self.client.append_binary(piece)
            else:
                await self.client.append(piece)
            self.sent += len(piece)


@asynccontextmanager
async def attach(r_: Resumer, url: str) -> AsyncIterator[Client]:
    async with connect(url, dialect=r_.kind.dialect, graceful=False) as client:
        r_.clients.append(client)
        yield client


async def run_with_drops(
    server: ServerProcess,
    kind: Kind,
    *,
    drops: list[tuple[int, str]],
    chunk: int = FRAME_BYTES,
    before_drop: Any = None,
) -> Resumer:
    """Send the track; at each (bytes sent, how) of ``drops`` break the connection (``rst``,
    ``fin`` or ``blackhole``), resume, re-send what the server lacks, go on; end with every
    frame received and the session closed."""
    audio = track()
    async with proxy_to(server.port) as proxy:
        res = Resumer(server, proxy, kind, audio, chunk)
        for at, how in [*drops, (len(audio), "")]:
            async with attach(res, _current_url(res)) as client:
                if len(res.clients) == 1:
                    await client.send(kind.opening)
                    created = await client.wait_for("session.created")
                    res.token = created["resume_token"]
                    res.session_id = (
                        created["session_id"] if kind.dialect == "native" else created["session"]["id"]
                    )
                    if kind.dialect == "realtime":
                        await client.wait_for("session.updated")
                else:
                    await _resume(res, client)
                await res.send_until(at)
                if not how:
                    await client.wait_until(
                        lambda: res.frames_out() >= len(audio) // FRAME_BYTES, what="every frame"
                    )
                    await client.send({"type": "session.close"})
                    await client.wait_closed()
                    break
                due = at // FRAME_BYTES - 2
                await client.wait_until(partial(_at_least, res, due), what="output before the drop")
                if before_drop is not None:
                    await before_drop(res)
                if how == "blackhole":
                    proxy.blackhole()
                    await (
                        client.ws._stream.aclose()
                    )  # the client gives up on it; the server's side stays open
                else:
                    await proxy.cut(how)
                await client.wait_closed()
    return res


def _at_least(res: Resumer, frames: int) -> bool:
    return res.frames_out() >= frames


def _current_url(res: Resumer) -> str:
    if not res.clients:
        return res.proxy.ws + res.kind.path
    return res.kind.resume_url(res.proxy.ws, res.session_id)


async def _resume(res: Resumer, client: Client) -> None:
    cursor = len(res.journaled())
    await client.send(
        {
            "type": "session.resume",
            "session_id": res.session_id,
            "resume_token": res.token,
            "last_received_server_event_seq": cursor,
        }
    )
    resumed = await client.wait_for("session.resumed")
    res.resumed.append(resumed)
    assert resumed["replay_from_server_event_seq"] == cursor + 1
    assert resumed["resume_token"] != res.token
    res.token = resumed["resume_token"]
    start = resumed["input_samples_received"]
    assert 0 <= start * 2 <= res.sent
    # Re-send what the server does not hold, the first chunk saying where it starts.
    res.sent = start * 2
    if res.sent < len(res.audio):
        await res.send_until(min(len(res.audio), res.sent + res.chunk), first_start=start)


_REFERENCE: dict[int, bytes] = {}


async def reference(server: ServerProcess) -> bytes:
    """The output of the same track on one uninterrupted connection."""
    if FRAMES not in _REFERENCE:
        audio = track()
        async with connect(server.ws + "/v1/duplex") as c:
            await c.send({"type": "session.create", "session": OFF})
            await c.wait_for("session.created")
            for i in range(0, len(audio), FRAME_BYTES):
                await c.append(audio[i : i + FRAME_BYTES])
            await c.wait_until(lambda: c.output_frames() >= FRAMES, what="every frame")
        _REFERENCE[FRAMES] = c.output_audio()
    return _REFERENCE[FRAMES]


def check_continuity(server: ServerProcess, res: Resumer, ref: bytes) -> None:
    assert res.output() == ref
    journaled = res.journaled()
    if res.kind.dialect == "realtime":
        seqs = [m["server_event_seq"] for m in journaled]
        assert seqs == list(range(1, len(seqs) + 1))
    texts = [m for m in journaled if isinstance(m, dict)]
    assert texts[-1]["type"] == "session.closed"
    path = server.log_dir / f"{res.session_id}.dlog"
    report = replay_logic(path)
    assert report.identical, report


# -- continuity -------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["rst", "fin"])
@pytest.mark.parametrize("kind", ["native", "native-binary", "realtime"])
async def test_a_cut_connection_resumes_and_the_output_is_the_uninterrupted_runs(resume_server, kind, how):
    ref = await reference(resume_server)
    res = await run_with_drops(resume_server, KINDS[kind], drops=[(10 * FRAME_BYTES, how)])
    check_continuity(resume_server, res, ref)
    records = await read_records(resume_server, res.session_id)
    detach = [x for x in records if isinstance(x, r.Detach)]
    resume = [x for x in records if isinstance(x, r.Resume)]
    assert [d.reason for d in detach] == ["dropped"] and len(resume) == 1
    assert resume[0].attachment == 2 and resume[0].input_samples_received * 2 <= 10 * FRAME_BYTES


async def test_g711_output_resumes_byte_for_byte(resume_server):
    """The G.711 output stream is resampled with state: it lives with the session, not the
    connection, so the resumed stream is the uninterrupted one."""
    audio, kind = track(), KINDS["realtime-g711"]
    async with connect(resume_server.ws + "/v1/realtime?duplex=1&autostart=0") as c:
        await c.send(kind.opening)
        await c.wait_for("session.updated")
        for i in range(0, len(audio), FRAME_BYTES):
            await c.append(audio[i : i + FRAME_BYTES])
        await c.wait_until(lambda: len(c.output_audio()) >= FRAMES * 640, what="every frame")
    res = await run_with_drops(resume_server, kind, drops=[(9 * FRAME_BYTES, "rst")])
    check_continuity(resume_server, res, c.output_audio())


async def all_received(res: Resumer) -> None:
    """Until the server has every append sent so far (its heartbeat ack comes after them)."""
    since = len(res.client.messages)
    await res.client.send({"type": "session.heartbeat"})
    await res.client.wait_for("session.heartbeat_ack", since=since)


async def test_a_cut_in_the_middle_of_a_frame_resumes_from_the_partial_frame(resume_server):
    ref = await reference(resume_server)
    res = await run_with_drops(
        resume_server,
        KINDS["native"],
        drops=[(7 * FRAME_BYTES + FRAME_BYTES // 2, "rst")],
        chunk=FRAME_BYTES // 4,
        before_drop=all_received,
    )
    check_continuity(resume_server, res, ref)
    assert res.resumed[0]["input_samples_received"] == 7 * 1920 + 960  # half a frame in the tail


async def test_a_blackholed_connection_is_taken_over_by_the_resume(resume_server):
    ref = await reference(resume_server)
    res = await run_with_drops(resume_server, KINDS["realtime"], drops=[(8 * FRAME_BYTES, "blackhole")])
    check_continuity(resume_server, res, ref)
    records = await read_records(resume_server, res.session_id)
    assert [d.reason for d in records if isinstance(d, r.Detach)] == ["replaced"]


async def test_ten_drops_in_one_session_lose_nothing_and_repeat_nothing(resume_server):
    ref = await reference(resume_server)
    drops = [(FRAME_BYTES * (2 + 2 * i), "rst" if i % 2 else "fin") for i in range(10)]
    res = await run_with_drops(resume_server, KINDS["native-binary"], drops=drops)
    check_continuity(resume_server, res, ref)
    assert len(res.resumed) == 10
    assert [x["attachment_generation"] for x in res.resumed] == list(range(2, 12))


async def cancelled(res: Resumer) -> None:
    """A response.cancel once every frame sent has come back (so that the uninterrupted run
    can do the same at the same point), then the drop."""
    await all_received(res)
    await res.client.wait_until(lambda: res.frames_out() >= res.sent // FRAME_BYTES, what="every frame")
    await res.client.send({"type": "response.cancel"})
    await res.client.wait_until(lambda: res.client.of_type("response.done"), what="response.done")


async def test_a_drop_right_after_a_cancel_resumes_the_new_response(resume_server):
    # The uninterrupted run with the same cancel at the same point.
    audio, at = track(), 8 * FRAME_BYTES
    async with connect(resume_server.ws + "/v1/duplex") as c:
        await c.send({"type": "session.create", "session": OFF})
        await c.wait_for("session.created")
        for i in range(0, len(audio), FRAME_BYTES):
            if i == at:
                await c.wait_until(lambda: c.output_frames() >= at // FRAME_BYTES)
                await c.send({"type": "response.cancel"})
                await c.wait_for("response.done")
            await c.append(audio[i : i + FRAME_BYTES])
        await c.wait_until(lambda: c.output_frames() >= FRAMES, what="every frame")
    res = await run_with_drops(resume_server, KINDS["native"], drops=[(at, "rst")], before_drop=cancelled)
    check_continuity(resume_server, res, c.output_audio())
    done = [m for m in res.journaled() if isinstance(m, dict) and m["type"] == "response.done"]
    assert done[0]["reason"] == "client_cancelled"


# -- tokens ----------------------------------------------------------------------------------------
@asynccontextmanager
async def dropped_session(server: ServerProcess, frames: int = 4) -> AsyncIterator[dict[str, Any]]:
    """A resumable native session with ``frames`` frames sent, their ``frames`` output frames
    received (alignment off: one each), and its connection dropped: nothing reaches the session's
    journal after the drop, so two resumes see the same journal. ``{"session_id", "token",
    "cursor", "proxy"}``."""
    async with proxy_to(server.port) as proxy:
        async with connect(proxy.ws + "/v1/duplex", graceful=False) as c:
            await c.send(KINDS["native"].opening)
            created = await c.wait_for("session.created")
            audio = track(frames)
            for i in range(frames):
                await c.append(audio[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
            await c.wait_until(lambda: c.output_frames() >= frames)
            await proxy.cut("rst")
            await c.wait_closed()
        yield {
            "session_id": created["session_id"],
            "token": created["resume_token"],
            "cursor": len(c.messages) - 1,
            "proxy": proxy,
        }


async def try_resume(
    server: ServerProcess, session: dict[str, Any], token: str | None = None, **extra: Any
) -> Client:
    """One resume attempt; the client of it, once answered (resumed) or closed."""
    sid = session["session_id"]
    c_: Client | None = None
    async with connect(f"{server.ws}/v1/duplex?session_id={sid}", graceful=False) as c:
        c_ = c
        await c.send(
            {
                "type": "session.resume",
                "session_id": sid,
                "resume_token": token or session["token"],
                "last_received_server_event_seq": session["cursor"],
                **extra,
            }
        )
        await c.wait_until(lambda: c.closed.is_set() or c.of_type("session.resumed"), what="an answer")
        if c.of_type("session.resumed"):
            await c.send({"type": "session.close"})
            await c.wait_closed()
    assert c_ is not None
    return c_


async def test_a_token_works_once_and_a_wrong_one_never(resume_server):
    async with dropped_session(resume_server) as session:
        wrong = await try_resume(resume_server, session, token="x" * 43)
        assert wrong.error_codes() == ["invalid_resume_token"] and wrong.close_code == 1008
        async with connect(
            f"{resume_server.ws}/v1/duplex?session_id={session['session_id']}", graceful=False
        ) as c:
            await c.send(
                {
                    "type": "session.resume",
                    "session_id": session["session_id"],
                    "resume_token": session["token"],
                    "last_received_server_event_seq": session["cursor"],
                }
            )
            resumed = await c.wait_for("session.resumed")
            await c.send({"type": "session.heartbeat"})  # proves the new token arrived
            await c.wait_for("session.heartbeat_ack")
            await c.ws._stream.aclose()
        await trio.sleep(0.2)
        reused = await try_resume(resume_server, session)
        assert reused.error_codes() == ["invalid_resume_token"]
        again = await try_resume(resume_server, {**session, "cursor": 0}, token=resumed["resume_token"])
        assert again.of_type("session.resumed")


async def test_a_lost_session_resumed_lets_the_previous_token_retry_once(resume_server):
    async with dropped_session(resume_server) as session:
        sid = session["session_id"]
        async with connect(f"{resume_server.ws}/v1/duplex?session_id={sid}", graceful=False) as c:
            await c.send(
                {
                    "type": "session.resume",
                    "session_id": sid,
                    "resume_token": session["token"],
                    "last_received_server_event_seq": session["cursor"],
                }
            )
            await c.wait_for("session.resumed")
            await c.ws._stream.aclose()  # as if session.resumed never arrived: no ack, no heartbeat
        await trio.sleep(0.2)
        retry = await try_resume(resume_server, {**session, "cursor": 0})
        assert retry.of_type("session.resumed")
        third = await try_resume(resume_server, session)
        assert third.error_codes() in (["invalid_resume_token"], ["session_resume_expired"])


async def test_a_resume_past_the_grace_is_expired_and_the_session_closed_disconnect(fresh_server):
    server = fresh_server("--resume-grace-s", "1")
    async with dropped_session(server) as session:
        inside = await try_resume(server, session)
        assert inside.of_type("session.resumed"), inside.types()
    async with dropped_session(server) as session:
        await trio.sleep(1.6)
        late = await try_resume(server, session)
        assert late.error_codes() == ["session_resume_expired"] and late.close_code == 1000
        records = await read_records(server, session["session_id"])
        assert r.Close("disconnect") in records


async def test_a_cursor_past_what_was_sent_and_another_dialect_are_refused(resume_server):
    async with dropped_session(resume_server) as session:
        ahead = await try_resume(resume_server, {**session, "cursor": 10_000})
        assert ahead.error_codes() == ["invalid_session_resume"]
        sid = session["session_id"]
        async with connect(f"{resume_server.ws}/v1/realtime?duplex=1&session_id={sid}", graceful=False) as c:
            await c.send({"type": "session.resume", "session_id": sid, "resume_token": session["token"]})
            await c.wait_closed()
        assert c.error_codes() == ["invalid_session_resume"]
        ok = await try_resume(resume_server, session)
        assert ok.of_type("session.resumed")


async def test_two_concurrent_resumes_have_one_winner(resume_server):
    async with dropped_session(resume_server) as session:
        answers: list[Client] = []

        async def attempt() -> None:
            sid = session["session_id"]
            async with connect(f"{resume_server.ws}/v1/duplex?session_id={sid}", graceful=False) as c:
                answers.append(c)
                await c.send(
                    {
                        "type": "session.resume",
                        "session_id": sid,
                        "resume_token": session["token"],
                        "last_received_server_event_seq": session["cursor"],
                    }
                )
                await c.wait_until(lambda: c.closed.is_set() or c.of_type("session.resumed"))
                await trio.sleep(0.5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt)
            nursery.start_soon(attempt)
        attached = [c for c in answers if c.of_type("session.resumed") and not c.of_type("session.replaced")]
        assert len(attached) == 1
        loser = next(c for c in answers if c is not attached[0])
        assert loser.of_type("session.replaced") or loser.error_codes() in (
            ["session_resume_conflict"],
            ["invalid_resume_token"],
        )


async def test_a_journal_gap_asks_for_a_resync_and_accept_gap_resumes(fresh_server):
    server = fresh_server("--resume-grace-s", "5", "--resume-journal-bytes", "65536")
    async with dropped_session(server, frames=30) as session:
        gap = await try_resume(server, {**session, "cursor": 0})
        resync = gap.of_type("session.resync_required")
        assert resync and resync[0]["oldest_server_event_seq"] > 1 and gap.close_code == 1000
        ok = await try_resume(server, {**session, "cursor": 0}, accept_gap=True)
        resumed = ok.of_type("session.resumed")[0]
        assert resumed["replay_from_server_event_seq"] == resync[0]["oldest_server_event_seq"]


# -- the server around it ------------------------------------------------------------------------------
async def test_an_append_past_the_input_the_session_holds_is_refused_by_its_event_id(resume_server):
    kind = KINDS["realtime"]
    audio = base64.b64encode(track(2)).decode()
    async with connect(resume_server.ws + kind.path) as c:
        await c.send(kind.opening)
        await c.wait_for("session.updated")
        await c.send(
            {
                "type": "input_audio_buffer.append",
                "event_id": "ev-gap",
                "audio": audio,
                "input_samples_start": 3281,
            }
        )
        await c.send({"type": "session.heartbeat", "event_id": "fence"})
        await c.wait_for("session.heartbeat_ack")
        (refused,) = c.errors()
        assert refused["error"]["code"] == "input_gap" and refused["error"]["event_id"] == "ev-gap"
        # From the samples it holds (none yet), the same audio is taken.
        await c.send(
            {
                "type": "input_audio_buffer.append",
                "event_id": "ev-ok",
                "audio": audio,
                "input_samples_start": 0,
            }
        )
        await c.wait_until(lambda: c.output_frames() >= 2, what="the frames of the append that was taken")
        assert len(c.errors()) == 1


async def test_a_paused_server_still_resumes_its_sessions_and_a_draining_one_closes_them(fresh_server):
    # One front end, so that its /ready says when the signals have taken effect.
    server = fresh_server("--resume-grace-s", "10", "--max-sessions", "1", "--frontends", "1")
    async with dropped_session(server) as session:
        server.proc.send_signal(signal.SIGUSR1)  # takes no new sessions
        await wait_ready_status(server, 503)
        async with connect(server.ws + "/v1/duplex", graceful=False) as refused:
            await refused.send({"type": "session.create", "session": OFF})
            await refused.wait_closed()
        assert refused.close_code in (1013, 1012) or refused.errors()
        resumed = await try_resume(server, session)
        assert resumed.of_type("session.resumed")
    server.proc.send_signal(signal.SIGUSR2)
    await wait_idle(server)  # /ready 200 again, and the resumed session's slot free
    async with dropped_session(server) as session:
        server.proc.send_signal(signal.SIGTERM)  # a drain closes a detached session at once
        assert await trio.to_thread.run_sync(lambda: server.proc.wait(timeout=15)) == 0
        records = await read_records(server, session["session_id"])
        assert r.Close("server_shutdown") in records


async def test_a_resume_after_a_restart_finds_no_session(fresh_server, tmp_path):
    server = fresh_server("--resume-grace-s", "10")
    async with dropped_session(server) as session:
        server.stop(signal.SIGKILL)
        again = start_server(tmp_path / "again", "--resume-grace-s", "10")
        try:
            late = await try_resume(again, session)
            assert late.error_codes() == ["session_not_found"] and late.close_code == 1000
        finally:
            again.stop()


async def test_a_detached_session_keeps_its_slot_and_its_token_stays_secret(fresh_server):
    server = fresh_server("--resume-grace-s", "10", "--max-sessions", "2", "--api-key", "sk-test")
    auth = [("Authorization", "Bearer sk-test")]
    async with proxy_to(server.port) as proxy:
        async with connect(proxy.ws + "/v1/duplex", graceful=False, headers=auth) as c:
            await c.send(KINDS["native"].opening)
            created = await c.wait_for("session.created")
            for i in range(3):
                await c.append(track()[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
            await c.wait_until(lambda: c.output_frames() >= 2)
            await proxy.cut("rst")
            await c.wait_closed()
        token, sid = created["resume_token"], created["session_id"]
        _, text = await get_text(server, "/metrics")
        assert metric(text, "duplex_sessions_detached") == 1 and metric(text, "duplex_slots_in_use") == 1
        # The other slot serves a new session; a third finds none (the detached one holds its own).
        async with connect(server.ws + "/v1/duplex", headers=auth) as other:
            await other.send({"type": "session.create", "session": OFF})
            await other.wait_for("session.created")
            async with connect(server.ws + "/v1/duplex", graceful=False, headers=auth) as third:
                await third.send({"type": "session.create", "session": OFF})
                await third.wait_closed()
            assert third.error_codes() == ["resource_exhausted"]
        with pytest.raises(ConnectionRejected) as rejected:  # another key (none): refused at the handshake
            async with connect(f"{server.ws}/v1/duplex?session_id={sid}", graceful=False):
                pass
        assert rejected.value.status_code == 401
        async with connect(f"{server.ws}/v1/duplex?session_id={sid}", headers=auth) as c2:
            await c2.send(
                {
                    "type": "session.resume",
                    "session_id": sid,
                    "resume_token": token,
                    "last_received_server_event_seq": len(c.messages) - 1,
                }
            )
            await c2.wait_for("session.resumed")
        _, text = await get_text(server, "/metrics")
        assert metric(text, 'duplex_session_resumes_total{result="resumed"}') == 1
        assert metric(text, "duplex_sessions_detached") == 0
        # A close frame (1000) ends a resumable session as any other: it is not a drop.
        assert metric(text, 'duplex_session_detaches_total{reason="dropped"}') == 1
    await wait_idle(server)
    server.stop()
    blobs = [p.read_bytes() for p in server.log_dir.glob("*.dlog")] + [server.output.encode(), text.encode()]
    assert all(token.encode() not in blob for blob in blobs)
