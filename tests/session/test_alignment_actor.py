"""The session actor's alignment glue, with a scripted fake aligner: what it asks the aligner
before each append, the pad and hint records it logs first, client pads, clears, mode changes,
and the scheduler's drain."""

from __future__ import annotations

from typing import Any

import numpy as np
import trio
import trio.testing

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.counters import Counters
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.actor import SessionActor
from duplex_actors.session.alignment import ClientHint, Decision, Grid, ServerPad
from duplex_actors.session.core import SessionCore

from .test_actor import SID, GatedLog, Scheduler


class FakeAligner:
    """Returns the scripted decisions in turn and records every call."""

    def __init__(self, decisions: list[Decision]) -> None:
        self.decisions = list(decisions)
        self.calls: list[tuple[Any, ...]] = []

    def set_mode(self, mode: str) -> None:
        self.calls.append(("set_mode", mode))

    def before_append(self, now: float, grid: Grid | None, chunk_samples: int, tail_samples: int) -> Decision:
        self.calls.append(("before_append", now, grid, chunk_samples, tail_samples))
        return self.decisions.pop(0) if self.decisions else None

    def client_padded(self, samples: int) -> None:
        self.calls.append(("client_padded", samples))

    def cleared(self) -> None:
        self.calls.append(("cleared",))


class Harness:
    def __init__(self, nursery: trio.Nursery, aligner: FakeAligner) -> None:
        self.log = GatedLog()
        self.scheduler = Scheduler()
        self.scheduler.tick_grid = Grid(origin=0.5)
        self.counters = Counters()
        send, self.events = trio.open_memory_channel[ev.SessionEvent](100)
        core = SessionCore(SID, detect_family(["NATF2.pt"]))
        self.aligner = aligner
        self.actor = SessionActor(
            core,
            slot=0,
            scheduler=self.scheduler,
            session_log=self.log,
            outbox=send,
            counters=self.counters,
            aligner=aligner,  # type: ignore[arg-type]
        )
        nursery.start_soon(self.actor.run)

    async def received(self) -> list[ev.SessionEvent]:
        await trio.testing.wait_all_tasks_blocked()
        out = []
        while True:
            try:
                out.append(self.events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return out


def chunk(n: int) -> r.Append:
    return r.Append(encode_f32(np.full(n, 0.1, dtype=np.float32)), "pcm_f32le")


def kinds(records: list[r.Record]) -> list[str]:
    return [r.KIND_NAMES[type(rec)] for rec in records]


async def test_pads_and_hints_are_logged_before_the_append_they_precede() -> None:
    aligner = FakeAligner([None, ServerPad(480, "start"), ClientHint(30, "margin")])
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, aligner)
        await h.actor.send(r.Open({}))
        await h.received()
        for n in (1000, 480, 480):
            await trio.sleep(0.02)
            await h.actor.send(chunk(n))
        got = await h.received()
        assert kinds(h.log.records) == ["open", "append", "pad", "append", "align_hint", "append"]
        appends = [c for c in aligner.calls if c[0] == "before_append"]
        # (now, grid, chunk at 24 kHz, the core's tail before the append)
        assert [c[2:] for c in appends] == [
            (Grid(0.5), 1000, 0),
            (Grid(0.5), 480, 1000),
            (Grid(0.5), 480, 40),
        ]
        assert appends[0][1] < appends[1][1] < appends[2][1]
        assert ev.AlignmentHint(30, "margin") in got
        assert h.actor.core.pad_samples == 480 and h.counters.align_pad_samples == 480
        assert h.scheduler.frames == [0]  # 1000 + 480 pad + 480 = one whole frame and 40 left
        nursery.cancel_scope.cancel()


async def test_a_client_pad_is_counted_and_its_append_sees_the_tail_before_it() -> None:
    aligner = FakeAligner([])
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, aligner)
        await h.actor.send(r.Open({}))
        await h.actor.send(chunk(100))
        await h.actor.send(r.Pad(240, "client"))
        await h.actor.send(chunk(1580))
        await h.received()
        assert kinds(h.log.records)[-3:] == ["append", "pad", "append"]
        assert ("client_padded", 240) in aligner.calls
        assert aligner.calls[-1] == ("before_append", aligner.calls[-1][1], Grid(0.5), 1580, 100)
        assert h.scheduler.frames == [0] and h.counters.align_pad_samples == 240
        nursery.cancel_scope.cancel()


async def test_a_pad_past_the_bound_is_not_counted_nor_told_to_the_aligner() -> None:
    aligner = FakeAligner([])
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, aligner)
        await h.actor.send(r.Open({}))
        await h.actor.send(r.Pad(24_001, "client"))
        got = await h.received()
        assert [e.code for e in got if isinstance(e, ev.Error)] == ["invalid_value"]
        assert not [c for c in aligner.calls if c[0] == "client_padded"]
        assert h.counters.align_pad_samples == 0
        nursery.cancel_scope.cancel()


async def test_mode_and_clear_reach_the_aligner() -> None:
    aligner = FakeAligner([])
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, aligner)
        await h.actor.send(r.Open({"duplex": {"alignment": "client"}}))
        await h.received()
        async with trio.open_nursery() as inner:
            inner.start_soon(h.actor.send, r.Update({"duplex": {"alignment": "off"}}, "u"))
            await trio.testing.wait_all_tasks_blocked()
            h.log.commit()
        await h.actor.send(r.ClearInput("c"))
        await h.received()
        assert [c for c in aligner.calls if c[0] in ("set_mode", "cleared")] == [
            ("set_mode", "client"),
            ("set_mode", "off"),
            ("cleared",),
        ]
        nursery.cancel_scope.cancel()


async def test_a_drain_takes_the_quietest_frame_and_logs_it_in_order() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, FakeAligner([]))
        await h.actor.send(r.Open({}))
        await h.actor.send(chunk(3 * FRAME_SAMPLES))
        await h.received()
        assert h.actor.drain_nowait([(0, 0.3), (1, 0.01), (2, 0.01)]) == 1
        assert h.actor.drain_nowait([]) is None
        await h.received()
        assert h.log.records[-1] == r.Drain(1)
        assert h.counters.dropped["drained"] == 1
        assert h.actor.core.frames_pending == 2
        nursery.cancel_scope.cancel()


async def test_no_drain_when_alignment_is_off() -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, FakeAligner([]))
        await h.actor.send(r.Open({"duplex": {"alignment": "off"}}))
        await h.actor.send(chunk(2 * FRAME_SAMPLES))
        await h.received()
        assert h.actor.drain_nowait([(0, 0.1), (1, 0.2)]) is None
        assert h.counters.dropped["drained"] == 0
        nursery.cancel_scope.cancel()
