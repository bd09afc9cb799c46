"""The project's own client (``open_duplex_client(..., resume=True)``, ``duplex-client --resume``)
resumes a session by itself when its connection is cut (docs/protocol.md §10), on a real server
through a TCP proxy that resets or closes the connection, keeps the server away for a while, or
stops carrying the server's bytes (a stall): the caller sees every event once, in order, and the
same audio as an uninterrupted run of the same input."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.client import cli
from duplex_actors.client.audio import write_wav
from duplex_actors.client.connection import DuplexClient, open_duplex_client
from duplex_actors.client.events import AudioDelta, Resumed, ServerEvent, SessionClosed
from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic

from .conftest import ServerProcess, start_server
from .fault_proxy import FaultProxy, proxy_to
from .helpers import pcm16, read_records, tone_and_noise

FRAMES = 20
OFF = {"duplex": {"alignment": "off"}}
AUDIO = tone_and_noise(FRAMES * 0.08, seed=7)[: FRAMES * FRAME_SAMPLES]
ROUTES = {"native": "/v1/duplex", "realtime": "/v1/realtime?duplex=1"}


@pytest.fixture(scope="module")
def resume_server(tmp_path_factory, parrot_dir) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("client-resume"), "--resume-grace-s", "5")
    yield server
    server.stop()


# -- sessions ---------------------------------------------------------------------------------------
Cut = Callable[[DuplexClient], Awaitable[None]]


async def session(
    url: str, *, resume: bool, cut: Cut | None = None, stall_timeout_s: float | None = None
) -> tuple[list[ServerEvent], DuplexClient]:
    """The track, paced, on one session; every event the caller sees, to session.closed."""
    seen: list[ServerEvent] = []
    with trio.fail_after(20):
        async with open_duplex_client(url, config=OFF, resume=resume, on_event=seen.append) as client:
            if stall_timeout_s is not None:
                client.keepalive_s, client.stall_timeout_s = stall_timeout_s / 3, stall_timeout_s
            async with trio.open_nursery() as nursery:
                if cut is not None:
                    nursery.start_soon(cut, client)
                await client.stream(AUDIO)
                await client.wait_frames(FRAMES)
    return seen, client


_REFERENCE: dict[str, list[ServerEvent]] = {}


async def reference(server: ServerProcess, dialect: str) -> list[ServerEvent]:
    """The same track on an uninterrupted, non-resumable session."""
    if dialect not in _REFERENCE:
        _REFERENCE[dialect], _ = await session(server.ws + ROUTES[dialect], resume=False)
    return _REFERENCE[dialect]


def audio_of(events: list[ServerEvent]) -> bytes:
    return b"".join(e.pcm16 for e in events if isinstance(e, AudioDelta))


def check_same_as_uninterrupted(events: list[ServerEvent], ref: list[ServerEvent], dialect: str) -> None:
    server_events = [e for e in events if not isinstance(e, Resumed)]
    assert [e.type for e in server_events] == [e.type for e in ref]  # none missing, none twice
    assert [e.seq for e in server_events] == list(range(1, len(server_events) + 1))
    frames = [e.frame_index for e in server_events if isinstance(e, AudioDelta)]
    assert frames == list(range(FRAMES))
    assert audio_of(events) == audio_of(ref) and len(audio_of(ref)) == FRAMES * FRAME_SAMPLES * 2
    assert isinstance(server_events[-1], SessionClosed)
    if dialect == "realtime":  # the journal's own numbering, as received
        seqs = [e.raw["server_event_seq"] for e in server_events[1:]]
        assert seqs == list(range(1, len(seqs) + 1))


def cut_after(proxy: FaultProxy, how: str, *at_frames: int, outage_s: float = 0.0) -> Cut:
    async def cut(client: DuplexClient) -> None:
        for frames in at_frames:
            await client.wait_frames(frames)
            await proxy.cut(how, outage_s=outage_s)

    return cut


async def resumed_session(
    server: ServerProcess, dialect: str, cut: Callable[[FaultProxy], Cut], count: int, **kwargs: Any
) -> tuple[DuplexClient, list[Resumed]]:
    """The track on a resumable session through a proxy that ``cut`` breaks, checked against
    the uninterrupted run: the client and its resume notes."""
    ref = await reference(server, dialect)
    async with proxy_to(server.port) as proxy:
        events, client = await session(proxy.ws + ROUTES[dialect], resume=True, cut=cut(proxy), **kwargs)
    check_same_as_uninterrupted(events, ref, dialect)
    notes = [e for e in events if isinstance(e, Resumed)]
    assert client.resumes == count == len(notes) and client.lost is None
    assert [n.generation for n in notes] == list(range(2, 2 + count))
    assert all(n.gap_s < 2 for n in notes)
    assert all("resume_token" not in n.raw and "resume_token" not in repr(n) for n in notes)
    assert client.frames_received == FRAMES and client.samples_sent == AUDIO.size
    assert client.session_id is not None
    records = await read_records(server, client.session_id)
    assert len([x for x in records if isinstance(x, r.Resume)]) == count
    assert replay_logic(server.log_dir / f"{client.session_id}.dlog").identical
    return client, notes


# -- the tests --------------------------------------------------------------------------------------
async def test_two_resets_mid_stream_are_resumed_and_hidden(resume_server):
    _, notes = await resumed_session(resume_server, "native", lambda proxy: cut_after(proxy, "rst", 5, 12), 2)
    assert all(n.cause == "dropped" and n.attempts == 1 for n in notes)


async def test_an_outage_resends_the_input_sent_meanwhile(resume_server):
    # The paced stream keeps its deadlines while the server is away: those chunks are re-sent.
    _, notes = await resumed_session(
        resume_server, "realtime", lambda proxy: cut_after(proxy, "fin", 6, outage_s=0.4), 1
    )
    assert notes[0].cause == "dropped" and notes[0].gap_s >= 0.35
    assert notes[0].input_samples_resent >= 3 * FRAME_SAMPLES  # ~5 frames went out into the gap


async def test_a_stalled_connection_is_given_up_and_the_missed_output_replayed(resume_server):
    def stall(proxy: FaultProxy) -> Cut:
        async def cut(client: DuplexClient) -> None:
            await client.wait_frames(4)
            proxy.mute()  # the server goes on answering the input in flight, into the void

        return cut

    _, notes = await resumed_session(resume_server, "native", stall, 1, stall_timeout_s=0.6)
    assert notes[0].cause == "stalled"
    assert notes[0].last_server_event_seq >= notes[0].replay_from_server_event_seq  # missed events came again


async def test_duplex_client_resume_prints_each_resume(resume_server, tmp_path: Path):
    wav, out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav, pcm16(np.concatenate([AUDIO, np.zeros(FRAME_SAMPLES * 3, np.float32)])))
    err = io.StringIO()
    async with proxy_to(resume_server.port) as proxy:

        async def cut() -> None:
            with trio.fail_after(10):
                while " open " not in err.getvalue():
                    await trio.sleep(0.02)
            await trio.sleep(0.6)  # mid-stream
            await proxy.cut("rst", outage_s=0.2)

        args: Any = cli.build_parser().parse_args(
            ["--url", proxy.ws + "/v1/duplex", "-i", str(wav), "-o", str(out), "--resume", "--align", "off"]
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut)
            code = await cli.run(args, err)
    text = err.getvalue()
    assert code == cli.EXIT_OK, text
    assert "duplex-client: resumed after" in text and "1 resume" in text, text
    assert "token" not in text
