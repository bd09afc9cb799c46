"""The in-process API end to end: real engine (tiny/parrot), real session logs, virtual time."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs
import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.admission import LogUnavailable, ResourceExhausted
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.replay.replayer import replay_logic, replay_model
from duplex_actors.scheduler.clock import Executor
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev

from .model.helpers import session_audio

T = TypeVar("T")


@pytest.fixture(scope="module")
def parrot_engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=3)


@pytest.fixture(scope="module")
def replay_engine(parrot_dir):
    # The served width (parrot_engine's): kernels, and so a replay's last bits, depend on it.
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=3)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def collect(session, into: list) -> None:
    async for event in session.events():
        into.append(event)


def steps_of(path: Path) -> list[r.Step]:
    return [rec for _, rec in read_log(path).records if isinstance(rec, r.Step)]


def assert_parrot(steps: list[r.Step]) -> None:
    """Within an epoch, output frame k+1 carries exactly the codes of input frame k."""
    by_epoch: dict[int, list[r.Step]] = {}
    for s in steps:
        by_epoch.setdefault(s.epoch, []).append(s)
    for epoch, group in by_epoch.items():
        for prev, cur in itertools.pairwise(group):
            assert cur.agent_codes == prev.user_codes, f"epoch {epoch} frame {cur.frame_index}"


async def test_sessions_get_their_own_codes_and_every_log_replays(
    parrot_engine, replay_engine, tmp_path, autojump_clock
):
    chunks = {0: 480, 1: 1920, 2: 2500}
    audio = {i: np.concatenate(session_audio(30 + i, 12)) for i in chunks}
    got: dict[int, list] = {i: [] for i in chunks}
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        sessions = {i: await server.open_session({"voice": "NATM1.pt" if i else "NATF2.pt"}) for i in chunks}
        async with trio.open_nursery() as nursery:
            for i, s in sessions.items():
                nursery.start_soon(collect, s, got[i])

            async def feed(i):
                s, n = sessions[i], chunks[i]
                for start in range(0, len(audio[i]), n):
                    await s.append(audio[i][start : start + n])
                    await trio.sleep(n / 24_000)
                await trio.sleep(0.5)
                await s.close()

            for i in chunks:
                nursery.start_soon(feed, i)
    for i, s in sessions.items():
        events = got[i]
        assert isinstance(events[0], ev.SessionCreated) and isinstance(events[-1], ev.SessionClosed)
        frames = [e for e in events if isinstance(e, ev.AudioFrame)]
        assert [f.frame_index for f in frames] == list(range(12))  # lockstep: one out per frame in
        assert all(len(f.pcm16) == 3840 for f in frames)
        path = tmp_path / f"{s.session_id}.dlog"
        steps = steps_of(path)
        assert_parrot(steps)
        assert [st.pcm16 for st in steps] == [f.pcm16 for f in frames]
        report = replay_logic(path)
        assert report.complete and report.identical, report.summary()
        assert report.events == events
        replay_model(report, replay_engine)
        assert report.identical and report.steps_compared == 12, report.summary()
    others = {
        i: {st.user_codes for st in steps_of(tmp_path / f"{s.session_id}.dlog")} for i, s in sessions.items()
    }
    assert not (others[0] & others[1]) and not (others[1] & others[2])


async def test_admission_is_a_free_slot_and_a_refusal_writes_no_log(parrot_engine, tmp_path, autojump_clock):
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        held = [await server.open_session() for _ in range(3)]
        with pytest.raises(ResourceExhausted):
            await server.open_session()
        assert len(list(tmp_path.iterdir())) == 3
        await held[0].close()
        replacement = await server.open_session()  # admitted at once after session.closed
        assert replacement.slot == held[0].slot
        for s in [*held[1:], replacement]:
            await s.disconnect()
        assert server.scheduler.table.in_use == 0
    for path in tmp_path.iterdir():
        recs = [rec for _, rec in read_log(path).records]
        assert isinstance(recs[-1], r.End) and isinstance(recs[-2], r.Close)
        assert replay_logic(path).identical


async def test_cancel_starts_a_new_epoch_and_carries_waiting_frames(parrot_engine, tmp_path, autojump_clock):
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        s = await server.open_session()
        # A second, silent session makes the scheduler hold s's frames for max_batch_wait_ms
        # (a partial batch), so the cancel below lands before they are stepped, although
        # every command is a checkpoint that lets the session and the scheduler run.
        await server.open_session()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, s, events)
            frames = session_audio(40, 8)
            for f in frames[:3]:
                await s.append(f)
                await trio.sleep(0.08)
            # Two frames drained, then a cancel before the scheduler steps them.
            await s.append(np.concatenate(frames[3:5]))
            await s.cancel(client_event_id="c1")
            await trio.sleep(0.5)
            for f in frames[5:]:
                await s.append(f)
                await trio.sleep(0.08)
            await trio.sleep(0.3)
            await s.close()
    ended = [e for e in events if isinstance(e, ev.ResponseEnded)]
    assert [(e.epoch, e.reason) for e in ended] == [(0, "client_cancelled"), (1, "session_closed")]
    started = [e for e in events if isinstance(e, ev.ResponseStarted)]
    assert [e.epoch for e in started] == [0, 1] and started[0].response_id != started[1].response_id
    audio = [e for e in events if isinstance(e, ev.AudioFrame)]
    assert [(e.epoch, e.frame_index) for e in audio] == [
        (0, 0),
        (0, 1),
        (0, 2),
        *((1, k) for k in range(3, 8)),
    ]
    # Nothing of epoch 0 after its terminal event.
    end0 = events.index(ended[0])
    assert all(getattr(e, "epoch", 1) != 0 for e in events[end0 + 1 :])
    steps = steps_of(tmp_path / f"{s.session_id}.dlog")
    assert_parrot(steps)
    # The new epoch starts from the prompt again: its first output answers the prompt's last frame.
    first_of_epoch1 = next(st for st in steps if st.epoch == 1)
    from duplex_actors.model.personaplex import SINE_TOKENS

    assert first_of_epoch1.agent_codes == SINE_TOKENS


async def test_shutdown_closes_open_sessions_with_their_logs(parrot_engine, tmp_path, autojump_clock):
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        s = await server.open_session()
        server._nursery.start_soon(collect, s, events)
        await s.append(session_audio(1, 2)[0])
        await trio.sleep(0.2)
    assert isinstance(events[-1], ev.SessionClosed) and events[-1].reason == "server_shutdown"
    recs = [rec for _, rec in read_log(tmp_path / f"{s.session_id}.dlog").records]
    assert recs[-2] == r.Close("server_shutdown") and isinstance(recs[-1], r.End)


async def test_a_failed_fsync_ends_the_session_and_stops_admissions(
    parrot_engine, tmp_path, autojump_clock, monkeypatch
):
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        s = await server.open_session()
        server._nursery.start_soon(collect, s, events)
        await trio.sleep(0.1)

        def broken(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        await s.append(session_audio(2, 1)[0])
        with trio.fail_after(5):
            await s.wait_closed()  # the next record after the failed batch ends the session
        with pytest.raises(trio.ClosedResourceError):
            await s.append(session_audio(2, 1)[0])
        with pytest.raises(LogUnavailable):
            await server.open_session()
    codes = [e.code for e in events if isinstance(e, ev.Error)]
    assert "log_unavailable" in codes
    assert isinstance(events[-1], ev.SessionClosed) and events[-1].reason == "log_unavailable"
    assert server.scheduler.table.in_use == 0


class GatedStep:
    """An executor that holds its first call until ``release`` is set (then runs as ``inner``)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.entered, self.release = trio.Event(), trio.Event()

    async def run(self, fn: Callable[[], T]) -> T:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await self.inner.run(fn)


async def test_a_result_of_an_ended_epoch_is_dropped_and_replays(
    parrot_engine, replay_engine, tmp_path, autojump_clock
):
    """A cancel that lands while a frame is being stepped: that frame's output belongs to the
    ended epoch and is dropped (logged, never emitted after the terminal events)."""
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        s = await server.open_session()
        server._nursery.start_soon(collect, s, events)
        await s.append(session_audio(5, 1)[0])
        await trio.sleep(0.3)
        # Hold the next step between its capture (epoch 0) and its run, and cancel meanwhile:
        # deterministic, whatever order trio runs the ready tasks in.
        gate = GatedStep(server.scheduler.executor)
        server.scheduler.executor = gate
        await s.append(session_audio(6, 1)[0])
        await gate.entered.wait()
        await s.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.release.set()
        await trio.sleep(0.3)
        await s.close()
    path = tmp_path / f"{s.session_id}.dlog"
    recs = [rec for _, rec in read_log(path).records]
    cancel_at = next(i for i, rec in enumerate(recs) if isinstance(rec, r.Cancel))
    stale = [rec for rec in recs[cancel_at:] if isinstance(rec, r.Step) and rec.epoch == 0]
    assert len(stale) == 1 and stale[0].frame_index == 1
    assert [e.frame_index for e in events if isinstance(e, ev.AudioFrame)] == [0]
    assert s.core.frames_in == 2 and s.core.frames_out == 1 and s.core.frames_pending == 0
    report = replay_logic(path)
    assert report.identical and report.complete
    replay_model(report, replay_engine)
    assert report.identical and report.steps_compared == 2, report.summary()


async def test_retention_prunes_finished_logs_but_never_open_ones(parrot_engine, tmp_path, autojump_clock):
    async with open_duplex_server(
        parrot_engine, log_dir=tmp_path, virtual_time=True, log_max_bytes=1, retention_interval_s=1.0
    ) as server:
        done = await server.open_session()
        await done.close()
        held = await server.open_session()
        with trio.fail_after(30):
            while server.logs_pruned == 0:
                await trio.sleep(0.5)
        await trio.sleep(3)  # more prunes: the open session's log stays
        names = {p.name for p in tmp_path.iterdir()}
        assert names == {f"{held.session_id}.dlog"}
        assert server.logs_pruned == 1


async def test_a_too_long_persona_in_the_opening_config_opens_with_the_defaults(
    parrot_engine, tmp_path, autojump_clock
):
    """Refused before the log takes it (the budget needs the engine's tokenizer): the session
    opens with the defaults, says why, and streams; the log replays as served."""
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        session = await server.open_session(
            {"instructions": "far too many words " * 80}, client_event_id="o1"
        )
        server._nursery.start_soon(collect, session, events)
        for f in session_audio(9, 3):
            await session.append(f)
            await trio.sleep(0.1)
        await session.close()
    errors = [e for e in events if isinstance(e, ev.Error)]
    assert [(e.code, e.client_event_id) for e in errors] == [("invalid_duplex_runtime_config", "o1")]
    assert "persona is too long" in errors[0].message
    assert sum(isinstance(e, ev.AudioFrame) for e in events) == 3
    records = read_log(tmp_path / f"{session.session_id}.dlog").records
    assert [type(rec).__name__ for _, rec in records[1:3]] == ["Open", "Rejected"]
    assert replay_logic(tmp_path / f"{session.session_id}.dlog").identical


async def test_a_failed_reset_ends_only_that_session(parrot_engine, tmp_path, autojump_clock):
    """A prompt the engine refuses at reset (too long for its context; the family's own budget
    check is turned off here, so the engine is the one to refuse, as it would for any prompt the
    check lets through): that session gets the error and closes; its neighbour keeps streaming."""
    events: list = []
    other_events: list = []
    unchecked = attrs.evolve(parrot_engine.family, prompt_positions=None)
    async with open_duplex_server(
        parrot_engine, log_dir=tmp_path, virtual_time=True, policy=unchecked
    ) as server:
        other = await server.open_session()
        server._nursery.start_soon(collect, other, other_events)
        bad = await server.open_session({"instructions": "far too many words " * 80})
        server._nursery.start_soon(collect, bad, events)
        for f in session_audio(9, 4):
            await other.append(f)
            if not bad.closed:
                await bad.append(f)
            await trio.sleep(0.1)
        with trio.fail_after(5):
            await bad.wait_closed()
        await other.close()
    codes = [e.code for e in events if isinstance(e, ev.Error)]
    assert codes == ["invalid_duplex_runtime_config"] and events[-1].reason == "error"
    assert sum(isinstance(e, ev.AudioFrame) for e in other_events) == 4
    assert server.scheduler.table.in_use == 0
    assert replay_logic(tmp_path / f"{bad.session_id}.dlog").identical


async def test_wait_no_sessions_returns_when_the_last_session_has_finished_its_log(
    parrot_engine, tmp_path, autojump_clock
):
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        await server.wait_no_sessions()  # none open: at once
        a, b = await server.open_session(), await server.open_session()
        done = trio.Event()

        async def wait() -> None:
            await server.wait_no_sessions()
            done.set()

        server._nursery.start_soon(wait)
        await a.close()
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()  # b is still open
        await b.close()
        with trio.fail_after(1):
            await done.wait()
        assert not server.sessions
        assert read_log(tmp_path / f"{b.session_id}.dlog").records[-1][1].__class__ is r.End


async def test_a_session_actor_bug_ends_only_that_session(
    parrot_engine, tmp_path, autojump_clock, monkeypatch
):
    """An exception escaping one session's actor (a bug) closes that session's log with
    ``error`` and is counted; the server and its other sessions go on."""
    from duplex_actors.session.actor import SessionActor

    real = SessionActor._align
    doomed: set[str] = set()

    async def buggy(self, record, arrival):
        if self.session_id in doomed:
            raise RuntimeError("a bug in one session")
        await real(self, record, arrival)

    monkeypatch.setattr(SessionActor, "_align", buggy)
    other_events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        other = await server.open_session()
        server._nursery.start_soon(collect, other, other_events)
        bad = await server.open_session()
        doomed.add(bad.session_id)
        for f in session_audio(9, 4):
            await other.append(f)
            if not bad.closed:
                await bad.append(f)
            await trio.sleep(0.1)
        with trio.fail_after(5):
            await bad.wait_closed()
        late = await server.open_session()  # still admitting
        await late.close()
        await other.close()
    assert server.counters.connection_errors["session"] == 1
    assert sum(isinstance(e, ev.AudioFrame) for e in other_events) == 4
    assert server.scheduler.table.in_use == 0
    closes = [
        rec for _, rec in read_log(tmp_path / f"{bad.session_id}.dlog").records if isinstance(rec, r.Close)
    ]
    assert [c.reason for c in closes] == ["error"]


async def test_with_pinned_prompts_a_persona_over_the_pin_cap_is_refused_at_open_and_update(
    parrot_dir, tmp_path, autojump_clock
):
    """``--context-policy pin-prompt``: a prompt over the pin cap (that moshi's ring would take,
    under 3/4 of the context) is refused as a too long persona is, at open and at update."""
    engine = MoshiEngine(
        load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=1, context_policy="pin-prompt", pin_max=90
    )
    persona = "You are a patient tutor. You sell bicycles on Monday. " * 2  # 99 positions of 250
    events: list = []
    async with open_duplex_server(engine, log_dir=tmp_path, virtual_time=True) as server:
        session = await server.open_session({"instructions": persona}, client_event_id="o1")
        server._nursery.start_soon(collect, session, events)
        await session.update({"instructions": persona}, client_event_id="u1")
        for f in session_audio(9, 2):
            await session.append(f)
            await trio.sleep(0.1)
        await session.close()
    errors = [e for e in events if isinstance(e, ev.Error)]
    assert [(e.code, e.client_event_id) for e in errors] == [
        ("invalid_duplex_runtime_config", "o1"),
        ("invalid_duplex_runtime_config", "u1"),
    ]
    assert all("at most 90, the cap of a pinned prompt" in e.message for e in errors)
    assert sum(isinstance(e, ev.AudioFrame) for e in events) == 2
    header = read_log(tmp_path / f"{session.session_id}.dlog").records[0][1]
    assert isinstance(header, r.Header)
    assert header.engine["context_policy"] == "pin-prompt" and header.engine["pin_max"] == 90
