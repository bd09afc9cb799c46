"""The session actor between its core and a log whose commits the test decides: control
acknowledgements wait for their record's commit, audio does not, and a commit that fails turns
the acknowledgement into ``log_unavailable``."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.log import records as r
from duplex_actors.log.writer import LogFailed
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.actor import SessionActor
from duplex_actors.session.alignment import Grid
from duplex_actors.session.core import SessionCore

SID = "sess_0123456789abcdef01234567"


class GatedLog:
    """A session log that commits only when the test says so (``commit``), or fails (``fail``)."""

    path = Path("gated.dlog")

    def __init__(self) -> None:
        self.records: list[r.Record] = []
        self.durable_seq = -1
        self.failed: OSError | None = None
        self._moved = trio.Event()

    def append_nowait(self, record: r.Record) -> int:
        if self.failed is not None:
            raise LogFailed("failed") from self.failed
        self.records.append(record)
        return len(self.records) - 1

    async def wait_durable(self, seq: int) -> None:
        while self.durable_seq < seq:
            if self.failed is not None:
                raise LogFailed("failed") from self.failed
            await self._moved.wait()

    def _move(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    def commit(self) -> None:
        self.durable_seq = len(self.records) - 1
        self._move()

    def fail(self, error: OSError) -> None:
        self.failed = error
        self._move()

    async def wait_for_room(self) -> None:
        await trio.lowlevel.checkpoint()

    def close_nowait(self) -> None:
        pass

    async def wait_closed(self) -> None:
        await trio.lowlevel.checkpoint()


class Scheduler:
    def __init__(self) -> None:
        self.frames: list[int] = []
        self.tick_grid: Grid | None = None

    def submit_nowait(self, slot: int, frame_index: int, samples: Any, padded: bool = False) -> None:
        self.frames.append(frame_index)

    def request_reset(self, slot: int, epoch: int, prompt: Any) -> None:
        pass

    async def release(self, slot: int) -> None:
        await trio.lowlevel.checkpoint()

    def grid(self) -> Grid | None:
        return self.tick_grid


class Harness:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.log = GatedLog()
        self.scheduler = Scheduler()
        send, self.events = trio.open_memory_channel[ev.SessionEvent](100)
        core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
        self.actor = SessionActor(core, slot=0, scheduler=self.scheduler, session_log=self.log, outbox=send)
        nursery.start_soon(self.actor.run)

    async def received(self) -> list[ev.SessionEvent]:
        await trio.testing.wait_all_tasks_blocked()
        out = []
        while True:
            try:
                out.append(self.events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return out


COMMANDS = [
    (r.Heartbeat("c1"), ev.HeartbeatAck),
    (r.PlaybackAck({"played_ms": 80}, "c1"), ev.PlaybackAcknowledged),
    (r.Update({"temperature": 0.5}, "c1"), ev.SessionUpdated),
]


@pytest.mark.parametrize(("command", "ack"), COMMANDS, ids=["heartbeat", "playback_ack", "update"])
async def test_an_acknowledgement_waits_for_its_records_commit(command: r.Record, ack: type) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.actor.send(r.Open({}))
        assert [type(e) for e in await h.received()] == [ev.SessionCreated, ev.SessionUpdated]
        await h.actor.send(command)
        assert await h.received() == []  # logged, not yet committed: no acknowledgement
        assert h.log.records[-1] == command
        h.log.commit()
        got = await h.received()
        assert [type(e) for e in got] == [ack]
        assert isinstance(got[0], ev.HeartbeatAck | ev.PlaybackAcknowledged | ev.SessionUpdated)
        assert got[0].client_event_id == "c1"
        nursery.cancel_scope.cancel()


async def test_audio_goes_out_ahead_of_its_commit_and_in_log_order_behind_an_ack() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.actor.send(r.Open({}))
        await h.received()
        h.log.commit()
        await h.actor.send(r.Append(encode_f32(np.zeros(FRAME_SAMPLES, np.float32)), "pcm_f32le"))
        await trio.testing.wait_all_tasks_blocked()
        assert h.scheduler.frames == [0]
        step = r.Step(0, 0, True, 5, "hi", (1,) * 8, (2,) * 8, bytes(2 * FRAME_SAMPLES))
        h.actor.inbox.put_result_nowait(step)
        assert ev.AudioFrame in [type(e) for e in await h.received()]  # nothing committed
        # A heartbeat waits for its commit, and the step delivered meanwhile waits behind it:
        # the events keep the log's order, so a replay of the log re-emits them byte for byte.
        await h.actor.send(r.Heartbeat("hb"))
        h.actor.inbox.put_result_nowait(step)  # (frame 0 again: refused by the core, in order)
        assert await h.received() == []
        h.log.commit()
        got = await h.received()
        assert type(got[0]) is ev.HeartbeatAck and len(got) > 1
        assert h.log.records[-2:] == [r.Heartbeat("hb"), step]
        nursery.cancel_scope.cancel()


async def test_a_failed_commit_turns_the_acknowledgement_into_log_unavailable() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.actor.send(r.Open({}))
        await h.received()
        h.log.commit()
        await h.actor.send(r.Heartbeat("hb"))
        assert await h.received() == []
        h.log.fail(OSError(errno.EIO, "Input/output error"))
        got = await h.received()
        with trio.fail_after(5):
            await h.actor.done.wait()
    assert [type(e) for e in got] == [ev.Error, ev.SessionClosed]
    assert isinstance(got[0], ev.Error) and got[0].code == "log_unavailable"
    assert isinstance(got[1], ev.SessionClosed) and got[1].reason == "log_unavailable"
    assert not any(isinstance(e, ev.HeartbeatAck) for e in got)
