"""A hypothesis state machine over the in-process API, in virtual time, with the parrot model.

Several sessions open, append random chunk sizes (partial frames and empty appends included),
cancel, clear, update, close and disconnect. After every step: no session has more output
frames than input frames; each epoch's events come in the wire spec's order and nothing of an
epoch follows its terminal event; slots in use equal open sessions; every input frame is
answered (an output frame), counted as dropped with a reason, or still queued for its step,
and no frame is answered twice. Liveness: once time passes, no frame stays queued (``drain``
and teardown). At teardown every log replays identically at logic and model level, and each
session's output codes are its own input codes one frame late (parrot).

All audio comes from hypothesis (a drawn seed and level), so a failing case shrinks and
replays exactly. The session logs go to a temporary directory removed at teardown.

The Trio loop runs in a thread with a manual ``MockClock``; each rule runs inside it through
``trio.from_thread.run`` and then lets virtual time pass until every task is blocked.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from duplex_actors.admission import ResourceExhausted
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.model.tiny import ensure_builtin
from duplex_actors.replay.replayer import replay_logic, replay_model
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev

SLOTS = 3
_engines: dict[int, MoshiEngine] = {}
# Audio from hypothesis: a seed (shrinks to 0) and a level (silence never starts speech).
audio_seeds = st.integers(0, 2**32 - 1)
levels = st.sampled_from([0.3, 0.0])


def noise(n: int, seed: int, level: float) -> np.ndarray:
    return (level * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def parrot(slots: int) -> MoshiEngine:
    if slots not in _engines:
        _engines[slots] = MoshiEngine(
            load_checkpoint(checkpoint_from_dir(ensure_builtin("tiny-parrot"))), slots=slots
        )
    return _engines[slots]


class LoopThread:
    """A Trio loop in a thread; ``call(afn)`` runs ``afn`` in it and returns the result."""

    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: trio.run(self._main, clock=self.clock), daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, afn, *args):
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def stop(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self._thread.join(timeout=30)


class EventOrder:
    """Checks one session's event stream against the wire spec's order, event by event."""

    def __init__(self) -> None:
        self.seen = 0
        self.active_epoch: int | None = None
        self.ended: set[int] = set()
        self.closed = False
        self.frames = 0

    def feed(self, events: list) -> None:
        for e in events[self.seen :]:
            assert not self.closed, f"{e} after session.closed"
            epoch = getattr(e, "epoch", None)
            if epoch is not None:
                assert epoch not in self.ended, f"{e} after epoch {epoch} ended"
            if isinstance(e, ev.ResponseStarted):
                assert self.active_epoch is None
                self.active_epoch = e.epoch
            elif isinstance(e, ev.AudioFrame):
                assert self.active_epoch == e.epoch, f"frame of epoch {e.epoch} outside its response"
                self.frames += 1
            elif isinstance(e, ev.ResponseEnded):
                assert self.active_epoch == e.epoch
                self.ended.add(e.epoch)
                self.active_epoch = None
            elif isinstance(e, ev.SessionClosed):
                self.closed = True
        self.seen = len(events)


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = parrot(SLOTS)
        self._tmp = tempfile.TemporaryDirectory(prefix="duplex-prop-")
        self.log_dir = Path(self._tmp.name)
        self.sessions: dict[str, dict] = {}
        self._server_done: trio.Event | None = None
        try:
            self.loop = LoopThread()
        except BaseException:
            self._tmp.cleanup()
            raise
        self.loop.call(self._start)

    async def _start(self) -> None:
        started = trio.Event()
        self._stop_server = trio.Event()
        self._server_done = done = trio.Event()

        async def serve() -> None:
            try:
                async with open_duplex_server(self.engine, log_dir=self.log_dir, virtual_time=True) as server:
                    self.server = server
                    started.set()
                    await self._stop_server.wait()
            finally:
                done.set()

        self.loop.nursery.start_soon(serve)
        await started.wait()

    async def _settle(self, seconds: float = 0.2) -> None:
        for _ in range(int(seconds / 0.02)):
            await trio.testing.wait_all_tasks_blocked()
            self.loop.clock.jump(0.02)
        await trio.testing.wait_all_tasks_blocked()

    def _do(self, afn, *args, settle: float = 0.2):
        async def run():
            result = await afn(*args)
            await self._settle(settle)
            return result

        return self.loop.call(run)

    def _open(self):
        return [s for s in self.sessions.values() if not s["handle"].closed]

    # -- rules ------------------------------------------------------------------------------------
    @rule(voice=st.sampled_from([None, "NATF2.pt", "NATM1.pt"]))
    def open_session(self, voice):
        async def go():
            try:
                handle = await self.server.open_session({"voice": voice} if voice else {})
            except ResourceExhausted:
                return None
            events: list = []

            async def collect():
                async for e in handle.events():
                    events.append(e)

            self.loop.nursery.start_soon(collect)
            return handle, events

        full = len(self._open()) >= SLOTS
        got = self._do(go)
        if full:
            assert got is None, "admitted beyond max_sessions"
            return
        assert got is not None
        handle, events = got
        self.sessions[handle.session_id] = {"handle": handle, "events": events, "order": EventOrder()}

    @precondition(lambda self: self._open())
    @rule(
        data=st.data(),
        n=st.sampled_from([0, 1, 480, 1919, 1920, 2000, 3840, 7000]),
        seed=audio_seeds,
        level=levels,
    )
    def append(self, data, n, seed, level):
        s = data.draw(st.sampled_from(self._open()))
        self._do(s["handle"].append, noise(n, seed, level), settle=n / 24_000 + 0.02)

    @precondition(lambda self: self._open())
    @rule(data=st.data(), command=st.sampled_from(["cancel", "clear_input", "clear_output", "heartbeat"]))
    def command(self, data, command):
        s = data.draw(st.sampled_from(self._open()))
        self._do(getattr(s["handle"], command))

    @precondition(lambda self: self._open())
    @rule(
        data=st.data(),
        command=st.sampled_from(["cancel", "clear_output"]),
        yields=st.sampled_from([1, 2, 3]),
        seed=audio_seeds,
    )
    def append_then_interrupt(self, data, command, yields, seed):
        """A frame and an interruption back to back: the frame may be stepped in the old epoch
        (its result is then dropped) or carried into the new one."""
        s = data.draw(st.sampled_from(self._open()))

        async def go():
            await s["handle"].append(noise(1920, seed, 0.3))
            for _ in range(yields):
                await trio.lowlevel.checkpoint()
            await getattr(s["handle"], command)()

        self._do(go)

    @precondition(lambda self: self._open())
    @rule(
        data=st.data(),
        how=st.sampled_from(["close", "disconnect"]),
        frames=st.sampled_from([1, 2, 3]),
        yields=st.sampled_from([0, 1, 2, 3]),
        seed=audio_seeds,
    )
    def append_then_end(self, data, how, frames, yields, seed):
        """Frames and the end of the session back to back: a frame may be mid-step when the
        session ends; it must still be answered or counted as dropped."""
        s = data.draw(st.sampled_from(self._open()))

        async def go():
            await s["handle"].append(noise(1920 * frames, seed, 0.3))
            for _ in range(yields):
                await trio.lowlevel.checkpoint()
            await getattr(s["handle"], how)()

        self._do(go)

    @precondition(lambda self: self._open())
    @rule(
        data=st.data(),
        voice=st.sampled_from(["NATF2.pt", "NATM1.pt", "bad.wav"]),
        persona=st.sampled_from(["", "Be brief."]),
    )
    def update(self, data, voice, persona):
        s = data.draw(st.sampled_from(self._open()))
        self._do(s["handle"].update, {"voice": voice, "instructions": persona})

    @precondition(lambda self: self._open())
    @rule(data=st.data(), how=st.sampled_from(["close", "disconnect"]))
    def end_session(self, data, how):
        s = data.draw(st.sampled_from(self._open()))
        self._do(getattr(s["handle"], how))

    @rule(seconds=st.sampled_from([0.1, 0.5]))
    def let_time_pass(self, seconds):
        self._do(trio.sleep, 0, settle=seconds)

    @rule()
    def drain(self):
        """Liveness: with time, every queued frame gets its step (at most one batch wait each)."""
        self._drain()

    def _drain(self) -> None:
        self._do(trio.sleep, 0, settle=0.05 * (self._queued() + 1))
        assert self._queued() == 0, "frames still queued after their steps were due"
        for s in self._open():
            assert s["handle"].core.frames_pending == 0, f"{s['handle'].session_id}: frames never stepped"

    # -- frame accounting -------------------------------------------------------------------------
    def _queued(self) -> int:
        return sum(len(entry.frames) for entry in self.server.scheduler.table.slots)

    def _dropped(self) -> Counter[str]:
        """Frames dropped, by reason: what ``/metrics`` reports as ``duplex_frames_dropped_total``."""
        stats = self.server.scheduler.statistics()
        return Counter(dict(stats.dropped_frames)) + self.server.counters.dropped

    def _check_every_frame_accounted(self) -> None:
        counters = self.server.counters
        dropped = self._dropped()
        assert counters.frames_in == sum(s["handle"].core.frames_in for s in self.sessions.values())
        assert counters.frames_in == counters.frames_out + sum(dropped.values()) + self._queued(), (
            f"{counters.frames_in} frames in, {counters.frames_out} answered, dropped {dict(dropped)}, "
            f"{self._queued()} queued: some frames are neither answered nor counted as dropped"
        )

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def lockstep_and_order(self):
        for s in self.sessions.values():
            s["order"].feed(s["events"])
            core = s["handle"].core
            assert s["order"].frames == core.frames_out <= core.frames_in

    @invariant()
    def slots_match_open_sessions(self):
        if hasattr(self, "server"):
            assert self.server.scheduler.table.in_use == len(self._open())

    @invariant()
    def every_input_frame_answered_or_dropped(self):
        """Rules run to rest (every task blocked), so no step is in flight here."""
        self._check_every_frame_accounted()
        for s in self.sessions.values():
            answered = [e.frame_index for e in s["events"] if isinstance(e, ev.AudioFrame)]
            assert len(set(answered)) == len(answered), f"a frame answered twice: {answered}"
            assert all(0 <= i < s["handle"].core.frames_in for i in answered), answered

    def teardown(self):
        try:
            self._teardown()
        finally:
            self._tmp.cleanup()

    def _teardown(self) -> None:
        try:
            done = self._server_done
            if done is not None:
                self._drain()
                self._check_every_frame_accounted()

                async def stop():
                    self._stop_server.set()
                    await done.wait()

                self.loop.call(stop)
                # Shutting down closes the sessions still open: their frames are all answered.
                self._check_every_frame_accounted()
        finally:
            self.loop.stop()
        replayer = parrot(SLOTS)  # the served width: kernels, and so the last bits, depend on it
        for s in self.sessions.values():
            s["order"].feed(s["events"])
            assert s["order"].closed
            path = self.log_dir / f"{s['handle'].session_id}.dlog"
            report = replay_logic(path)
            assert report.complete and report.identical, report.summary()
            replay_model(report, replayer)
            assert report.identical, report.summary()
            steps = [rec for _, rec in read_log(path).records if isinstance(rec, r.Step)]
            by_epoch: dict[int, list] = {}
            for step in steps:
                by_epoch.setdefault(step.epoch, []).append(step)
            for group in by_epoch.values():
                for prev, cur in itertools.pairwise(group):
                    assert cur.agent_codes == prev.user_codes


SessionMachine.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=25,
    deadline=None,
    # The first example loads the parrot engine (and may build the tiny checkpoint): seconds,
    # not a slow strategy.
    suppress_health_check=[HealthCheck.too_slow],
)
TestSessionMachine = SessionMachine.TestCase
