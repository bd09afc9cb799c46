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
        self.room = True  # whether appends are taken without a wait (the writer's queue)
        self._moved = trio.Event()

    def append_nowait(self, record: r.Record) -> int:
        if self.failed is not None:
            raise LogFailed("failed") from self.failed
        self.records.append(record)
        return len(self.records) - 1

    def room_for(self, records: int) -> bool:
        return self.failed is None and self.room

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


AUDIO = encode_f32(np.zeros(FRAME_SAMPLES, np.float32))


def step(frame: int) -> r.Step:
    return r.Step(0, frame, True, 5, "hi", (1,) * 8, (2,) * 8, bytes(2 * FRAME_SAMPLES))


def queued(events: trio.MemoryReceiveChannel[ev.SessionEvent]) -> list[ev.SessionEvent]:
    out = []
    while True:
        try:
            out.append(events.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


async def opened(nursery: trio.Nursery) -> Harness:
    h = Harness(nursery)
    await h.actor.send(r.Open({}))
    await h.received()
    h.log.commit()
    await trio.testing.wait_all_tasks_blocked()
    return h


async def test_a_record_for_an_idle_actor_is_handled_in_the_task_that_brings_it() -> None:
    """With the actor waiting on an empty inbox, an append and a step are logged, applied and
    their effects carried out before the caller's next checkpoint: no task wakes for them."""
    async with trio.open_nursery() as nursery:
        h = await opened(nursery)
        assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le", "a0"))
        assert h.scheduler.frames == [0]
        logged = len(h.log.records)
        assert h.log.records[-1:] == [r.Append(AUDIO, "pcm_f32le", "a0")]
        assert h.actor.last_client_event_id == "a0"
        await h.actor.wait_handled()  # counted as handled: nothing to wait for
        h.actor.deliver_record_nowait(step(0))
        assert h.log.records[logged:] == [step(0)]
        assert ev.AudioFrame in [type(e) for e in queued(h.events)]
        nursery.cancel_scope.cancel()


async def test_events_go_to_the_connection_at_once_in_one_batch_or_else_to_the_outbox() -> None:
    async with trio.open_nursery() as nursery:
        h = await opened(nursery)
        batches: list[list[ev.SessionEvent]] = []

        def take(events: list[ev.SessionEvent]) -> bool:
            batches.append(list(events))
            return True

        h.actor.emit_directly = take
        assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le"))
        h.actor.deliver_record_nowait(step(0))
        assert len(batches) == 1 and ev.AudioFrame in [type(e) for e in batches[0]]
        assert queued(h.events) == []
        h.actor.emit_directly = lambda events: False
        assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le"))
        h.actor.deliver_record_nowait(step(1))
        assert len(batches) == 1
        assert ev.AudioFrame in [type(e) for e in queued(h.events)]
        nursery.cancel_scope.cancel()


async def test_a_record_queues_behind_what_the_actor_is_busy_with() -> None:
    """A heartbeat waits for its commit: a step delivered meanwhile is queued, handled after it."""
    async with trio.open_nursery() as nursery:
        h = await opened(nursery)
        assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le"))
        await h.actor.send(r.Heartbeat("hb"))
        await trio.testing.wait_all_tasks_blocked()
        h.actor.deliver_record_nowait(step(0))
        assert h.log.records[-1] == r.Heartbeat("hb")
        h.log.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert h.log.records[-2:] == [r.Heartbeat("hb"), step(0)]
        kinds = [type(e) for e in queued(h.events)]
        assert kinds.index(ev.HeartbeatAck) < kinds.index(ev.AudioFrame)
        nursery.cancel_scope.cancel()


async def test_a_log_without_room_sends_the_record_through_the_inbox() -> None:
    async with trio.open_nursery() as nursery:
        h = await opened(nursery)
        h.log.room = False
        records = len(h.log.records)
        assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le"))
        assert len(h.log.records) == records and h.scheduler.frames == []
        await trio.testing.wait_all_tasks_blocked()  # the actor's own task logs it
        assert len(h.log.records) == records + 1 and h.scheduler.frames == [0]
        nursery.cancel_scope.cancel()


async def test_an_error_in_the_bringers_task_ends_the_session_in_the_actors() -> None:
    """A record handled at once that raises: the caller goes on, the actor's task raises it
    and the session closes ``error``, its log finished."""

    def broken_submit(slot: int, frame_index: int, samples: Any, padded: bool = False) -> None:
        raise RuntimeError("scheduler bug")

    with pytest.raises(ExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            h = await opened(nursery)
            h.scheduler.submit_nowait = broken_submit  # type: ignore[method-assign]
            assert h.actor.send_append_nowait(r.Append(AUDIO, "pcm_f32le"))
            with trio.fail_after(5):
                await h.actor.done.wait()
    assert caught.group_contains(RuntimeError, match="scheduler bug")
    assert h.actor.close_reason == "error"
    assert isinstance(h.log.records[-2], r.Close) and h.log.records[-2].reason == "error"


@pytest.mark.parametrize("seed", range(12))
async def test_handled_at_once_or_queued_the_log_and_the_events_are_the_same(
    seed: int, autojump_clock: Any
) -> None:
    """The same appends (of several sizes) and step results, brought in the same order and at
    the same times: an actor that handles them at once and one that queues every one of them
    (its log never has room for the direct path) log the same records and emit the same events."""
    import random

    async def run(direct: bool) -> tuple[list[r.Record], list[ev.SessionEvent]]:
        rng = random.Random(seed)
        events: list[ev.SessionEvent] = []
        async with trio.open_nursery() as nursery:
            h = Harness(nursery)
            await h.actor.send(r.Open({}))
            await trio.testing.wait_all_tasks_blocked()
            h.log.commit()
            delivered = appended = 0
            for _ in range(40):
                # Some records queue in the direct run too (no room in the log for a moment):
                # the next ones must not overtake them.
                h.log.room = rng.random() < 0.7 and direct
                if rng.random() < 0.6:
                    samples = FRAME_SAMPLES * rng.choice((1, 1, 2)) // rng.choice((1, 4))
                    assert h.actor.send_append_nowait(
                        r.Append(encode_f32(np.full(samples, 0.01, np.float32)), "pcm_f32le")
                    )
                    appended += samples
                else:  # the frames those appends make (queued ones are stepped after them)
                    for frame in range(delivered, appended // FRAME_SAMPLES):
                        h.actor.deliver_record_nowait(step(frame))
                    delivered = appended // FRAME_SAMPLES
                if rng.random() < 0.5:
                    await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(rng.choice((0.0, 0.02, 0.08)))
            await trio.testing.wait_all_tasks_blocked()
            assert h.scheduler.frames == list(range(appended // FRAME_SAMPLES))
            events = queued(h.events)
            nursery.cancel_scope.cancel()
        return h.log.records, events

    direct_records, direct_events = await run(True)
    queued_records, queued_events = await run(False)
    assert any(isinstance(record, r.Step) for record in direct_records)
    assert direct_records == queued_records
    assert direct_events == queued_events
