"""The engine core: the one process that owns the model, the slot table, admission, the tick
policy and the batching; front-end processes reach it over a Unix socket (``core/link.py``).

It runs the :class:`~duplex_actors.scheduler.actor.Scheduler` unchanged, with one proxy
occupant per admitted slot standing for the front end's session: a step's results for all of a
front end's sessions go back to it in one message, their PCM16 in the output ring it shares
with that front end. A front end whose link closes (it exited or crashed) has every slot it
held reset and freed; the other front ends go on.

``duplex-actors serve`` runs the core in its own process and starts the front ends beside it
(``supervisor.py``). ``python -m duplex_actors.engine_core`` runs one for front ends that
hypercorn's workers start (``hypercorn -k trio -w K duplex_actors.app:app``): the first
worker starts it, the others connect, and it exits once no front end has been connected for
``idle_exit_s``.
"""

from __future__ import annotations

import array
import itertools
import logging
import os
import pickle
import socket
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio

from . import error_codes
from .admission import ResourceExhausted, SchedulerFailed
from .audio import FRAME_SAMPLES, float_to_pcm16_array
from .config import ServerConfig
from .core import wire
from .core.link import peer_uid
from .core.rings import INPUT_DTYPE, OUTPUT_DTYPE, FrameRing
from .error_codes import code_of
from .heap import freeze_heap
from .model.engine import DEFAULT_CONTEXT_POLICY, ModelEngine
from .model.startup import FAILED, PhaseReport, PhaseSink, Startup, StartupState, import_engine
from .procname import set_process_name
from .scheduler.actor import Scheduler, StepResult
from .scheduler.policy import make_policy

log = logging.getLogger("duplex_actors.engine_core")

RECEIVE_BYTES = 1 << 20
# Frames a ring holds per engine slot: a tick's results (or frames) and a few more in flight.
RING_FRAMES_PER_SLOT = 4
GATHER_TIMEOUT_S = 2.0


@attrs.frozen(slots=True)
class CoreSettings:
    """What the engine core is built from (the serve settings that concern the model)."""

    model: str = "tiny"
    revision: str | None = None
    family: str | None = None
    max_sessions: int = 8
    device: str = "cpu"
    dtype: str = "auto"
    memory_limit: int | None = None
    torch_threads: int | None = 1
    tick_policy: str = "grid"
    context_policy: str = DEFAULT_CONTEXT_POLICY
    pin_max: int | None = None
    recovered_logs: int = 0  # torn logs truncated before the core started (/metrics)


WARMUP_FRAMES = 3


def warm_up(engine: ModelEngine, on_phase: PhaseSink | None = None) -> float:
    """The ``warmup`` phase: the default prompt into slot 0 and three silent frames stepped,
    then the slot freed (the first of each costs the most; on CUDA the first steps capture the
    graphs); the milliseconds it took."""
    started = time.perf_counter()
    with Startup(on_phase).phase("warmup", total=WARMUP_FRAMES, unit="frames") as phase:
        prompt = engine.family.session_prompt()
        engine.prepare(prompt)
        engine.reset(0, prompt)
        silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        for done in range(1, WARMUP_FRAMES + 1):
            engine.step({0: silence})
            phase.progress(done)
        engine.reset(0, None)
    return (time.perf_counter() - started) * 1000


def build_engine(settings: CoreSettings, on_phase: PhaseSink | None = None) -> ModelEngine:
    """The engine for ``settings`` (the stand-in for ``standin:STEP_MS``), each step of its
    start-up reported to ``on_phase``, with the faults of ``DUPLEX_FAULTS`` armed on its steps
    when set. A hub that cannot be reached is retried in the resolve phase."""
    from .faults import Faults, FaultyEngine

    import_engine(Startup(on_phase))  # before the factory, which imports torch at its top
    from .model.factory import open_served_engine

    engine: ModelEngine = open_served_engine(
        settings.model,
        slots=settings.max_sessions,
        device=settings.device,
        dtype=settings.dtype,
        memory_limit=settings.memory_limit,
        family=settings.family,
        revision=settings.revision,
        torch_threads=settings.torch_threads,
        context_policy=settings.context_policy,
        pin_max=settings.pin_max,
        retry_unavailable=True,
        prepare_default=True,
        on_phase=on_phase,
    )
    faults = Faults.from_env()
    if faults.active:
        log.warning("DUPLEX_FAULTS is set: faults will be injected (%s)", faults)
        return FaultyEngine(engine, faults)
    return engine


class _Proxy:
    """The occupant of a slot in the core: the session of a front end, reached over its link."""

    def __init__(self, link: _FrontEnd, slot: int) -> None:
        self.link = link
        self.slot = slot
        self.drainable = False  # as its front end last said, with the slot's last frame

    def deliver_nowait(self, result: StepResult) -> None:
        self.link.result(self.slot, result)

    def reset_failed(self, exc: BaseException) -> None:
        self.link.queue((wire.RESET_FAILED, self.slot, code_of(exc, error_codes.INTERNAL_ERROR), str(exc)))

    def step_failed(self, exc: BaseException) -> None:
        self.link.queue((wire.STEP_FAILED, self.slot, f"{type(exc).__name__}: {exc}"))

    def drain_nowait(self, queued: Sequence[tuple[int, float]]) -> int | None:
        if not queued or not self.drainable:
            return None
        index = min(queued, key=lambda item: item[1])[0]
        self.link.queue((wire.DRAINED, self.slot, index))
        return index


class _FrontEnd:
    """The core's side of one front end's link."""

    def __init__(
        self,
        core: EngineCore,
        frontend_id: int,
        stream: trio.SocketStream,
        inputs: FrameRing,
        outputs: FrameRing,
    ) -> None:
        self.core = core
        self.id = frontend_id
        self.stream = stream
        self.inputs = inputs
        self.outputs = outputs
        self.outgoing: list[tuple[Any, ...]] = []
        self.wake = trio.Event()
        self.proxies: dict[int, _Proxy] = {}
        self.status: wire.CoreStatus | None = None
        self.gathered: dict[int, tuple[trio.Event, list[Any]]] = {}

    def queue(self, item: tuple[Any, ...]) -> None:
        self.outgoing.append(item)
        self.wake.set()

    def status_changed(self) -> bool:
        """The core's status differs from the one this front end was sent last."""
        return not self.core.status().same_as(self.status)

    def result(self, slot: int, result: StepResult) -> None:
        out = result.output
        pcm = float_to_pcm16_array(out.pcm)
        seq = self.outputs.put(pcm)
        self.outgoing.append(
            (
                wire.RESULT,
                slot,
                result.epoch,
                result.frame_index,
                out.ready,
                out.text_token,
                out.text_piece,
                tuple(out.agent_codes),
                tuple(out.user_codes),
                seq if seq is not None else pcm.tobytes(),
            )
        )
        self.wake.set()

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            status = self.core.status()
            if not status.same_as(self.status):
                self.status = status
                self.outgoing.append((wire.STATUS, status))
            ack = self.inputs.ack_to_send()  # rides with this tick's results
            if ack is not None:
                self.outgoing.append((wire.ACK, ack))
            if not self.outgoing:
                continue
            items, self.outgoing = self.outgoing, []
            try:
                await self.stream.send_all(wire.encode(items))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


class EngineCore:
    """The engine, its scheduler, and the links of the front ends (:meth:`serve_link`)."""

    def __init__(
        self,
        engine: ModelEngine,
        scheduler: Scheduler,
        settings: CoreSettings,
        *,
        warmup_ms: float = 0.0,
        phases: tuple[PhaseReport, ...] = (),
    ) -> None:
        from .model.process import prompt_length_table

        self.warmup_ms = warmup_ms
        self.phases = phases
        self.engine = engine
        self.scheduler = scheduler
        self.settings = settings
        self.frontends: dict[int, _FrontEnd] = {}
        self._ids = itertools.count()
        self._requests = itertools.count(1)
        self.description = engine.describe()
        self.prompt_base, self.tokenizer = prompt_length_table(engine)
        self.connected = trio.Event()  # set at the first front end's link
        self.links_changed = trio.Event()
        scheduler.after_step.append(self._flush)
        scheduler.after_reset.append(self._reset_applied)

    def status(self) -> wire.CoreStatus:
        scheduler = self.scheduler
        grid = scheduler.grid()
        origin = None if grid is None else grid.origin - trio.current_time() + time.monotonic()
        return wire.CoreStatus(
            slots_total=scheduler.slots_total,
            slots_free=scheduler.slots_free,
            slots_releasing=scheduler.slots_releasing,
            failed=None
            if scheduler.failed is None
            else f"{type(scheduler.failed).__name__}: {scheduler.failed}",
            grid_origin=None if origin is None else round(origin, 6),
            grid_period=0.080 if grid is None else grid.period,
            grid_held=frozenset() if grid is None else grid.held,
        )

    def _flush(self) -> None:
        for frontend in self.frontends.values():
            frontend.wake.set()

    def _reset_applied(self, slot: int, epoch: int) -> None:
        occupant = self.scheduler.table.slots[slot].occupant
        if isinstance(occupant, _Proxy):
            occupant.link.queue((wire.RESET_DONE, slot, epoch))

    # -- a front end's link ------------------------------------------------------------------------
    async def serve_link(self, sock: trio.socket.SocketType) -> None:
        if peer_uid(sock) != os.getuid():
            log.warning("refused an engine-core link from another user")
            sock.close()
            return
        frontend_id = next(self._ids)
        capacity = RING_FRAMES_PER_SLOT * self.engine.slots
        inputs = FrameRing.create(f"duplex-in-{frontend_id}", capacity, INPUT_DTYPE)
        outputs = FrameRing.create(f"duplex-out-{frontend_id}", capacity, OUTPUT_DTYPE)
        family: Any = self.engine.family
        hello = wire.EngineHello(
            pid=os.getpid(),
            slots=self.engine.slots,
            description=self.description,
            family=attrs.evolve(family, prompt_positions=None),
            prompt_base=self.prompt_base,
            tokenizer=self.tokenizer,
            tick_policy=self.scheduler.policy.name,
            input_capacity=capacity,
            output_capacity=capacity,
            frontend_id=frontend_id,
            warmup_ms=self.warmup_ms,
            phases=self.phases,
        )
        try:
            fds = array.array("i", [inputs.fd, outputs.fd])
            await sock.sendmsg(
                [wire.encode([(wire.HELLO, hello)])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())]
            )
        except OSError as exc:
            log.warning("front end %d: the hello failed: %s", frontend_id, exc)
            sock.close()
            inputs.close()
            outputs.close()
            return
        stream = trio.SocketStream(sock)
        frontend = _FrontEnd(self, frontend_id, stream, inputs, outputs)
        self.frontends[frontend_id] = frontend
        self.connected.set()
        self._links_changed()
        log.info("front end %d linked (%d linked)", frontend_id, len(self.frontends))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(frontend.writer)
                frontend.wake.set()  # its first status
                await self._read(frontend, nursery)
                nursery.cancel_scope.cancel()
        finally:
            del self.frontends[frontend_id]
            with trio.CancelScope(shield=True):
                await self._forget(frontend)
                await stream.aclose()
            inputs.close()
            outputs.close()
            self._links_changed()
            log.info("front end %d unlinked (%d linked)", frontend_id, len(self.frontends))

    def _links_changed(self) -> None:
        self.links_changed.set()
        self.links_changed = trio.Event()

    async def _forget(self, frontend: _FrontEnd) -> None:
        """A front end is gone: reset and free every slot it held."""
        slots = list(frontend.proxies)
        frontend.proxies.clear()
        for slot in slots:
            if self.scheduler.table.slots[slot].occupant is not None:
                await self.scheduler.release(slot)
        if slots:
            log.warning("front end %d left %d slots: reset and freed", frontend.id, len(slots))

    async def _read(self, frontend: _FrontEnd, nursery: trio.Nursery) -> None:
        decoder = wire.Decoder()
        while True:
            try:
                data = await frontend.stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            try:
                messages = decoder.feed(data)
            except (wire.WireError, pickle.UnpicklingError) as exc:
                log.error("front end %d sent an unreadable message: %s", frontend.id, exc)
                return
            for items in messages:
                self._handle(frontend, items, nursery)
            if frontend.status_changed():  # replies wake the writer themselves; acks ride along
                frontend.wake.set()

    def _handle(self, frontend: _FrontEnd, items: Sequence[tuple[Any, ...]], nursery: trio.Nursery) -> None:
        scheduler = self.scheduler
        inputs = frontend.inputs
        copied = -1
        offset = trio.current_time() - time.monotonic()  # front ends stamp time.monotonic()
        for item in items:
            kind = item[0]
            if kind == wire.FRAME:
                _, slot, frame_index, padded, drainable, at, payload = item
                proxy = frontend.proxies.get(slot)
                if isinstance(payload, int):
                    samples = inputs.get(payload)
                    copied = max(copied, payload)
                else:
                    samples = np.frombuffer(payload, dtype=INPUT_DTYPE).copy()
                if proxy is None:
                    continue  # a slot this front end no longer holds
                proxy.drainable = drainable
                scheduler.submit_nowait(slot, frame_index, samples, padded, at + offset)  # type: ignore[arg-type]
            elif kind == wire.ACK:
                frontend.outputs.ack(item[1])
            elif kind == wire.RESET:
                _, slot, epoch, prompt = item
                if slot in frontend.proxies:
                    scheduler.request_reset(slot, epoch, prompt)
            elif kind == wire.ADMIT:
                self._admit(frontend, item[1])
            elif kind == wire.UNADMIT:
                if frontend.proxies.pop(item[1], None) is not None:
                    scheduler.free_unused(item[1])
            elif kind == wire.RELEASE:
                slot = item[1]
                if frontend.proxies.pop(slot, None) is not None:
                    nursery.start_soon(self._release, frontend, slot)
                else:
                    frontend.queue((wire.RELEASED, slot))
            elif kind == wire.METRICS:
                nursery.start_soon(self._metrics, frontend, item[1])
            elif kind == wire.GATHERED:
                waiting = frontend.gathered.get(item[1])
                if waiting is not None:
                    waiting[1].append(item[2])
                    waiting[0].set()
            else:
                log.warning("front end %d: unknown item %r", frontend.id, kind)
        if copied >= 0 and inputs.copied(copied):
            frontend.wake.set()

    def _admit(self, frontend: _FrontEnd, request_id: int) -> None:
        try:
            slot = self.scheduler.admit(_Proxy(frontend, -1))
        except (ResourceExhausted, SchedulerFailed) as exc:
            frontend.queue((wire.REFUSED, request_id, exc.code, str(exc)))
            return
        proxy = _Proxy(frontend, slot)
        self.scheduler.occupy(slot, proxy)
        frontend.proxies[slot] = proxy
        frontend.queue((wire.ADMITTED, request_id, slot))

    async def _release(self, frontend: _FrontEnd, slot: int) -> None:
        await self.scheduler.release(slot)
        frontend.queue((wire.RELEASED, slot))

    async def _metrics(self, asker: _FrontEnd, request_id: int) -> None:
        """Every front end's counters (each asked, at most GATHER_TIMEOUT_S) and the core's."""
        snapshots: list[Any] = []

        async def gather(frontend: _FrontEnd) -> None:
            gather_id = next(self._requests)
            event = trio.Event()
            reply: list[Any] = []
            frontend.gathered[gather_id] = (event, reply)
            frontend.queue((wire.GATHER, gather_id))
            try:
                with trio.move_on_after(GATHER_TIMEOUT_S):
                    await event.wait()
            finally:
                frontend.gathered.pop(gather_id, None)
            if reply and reply[0] is not None:
                snapshots.append(reply[0])

        async with trio.open_nursery() as nursery:
            for frontend in list(self.frontends.values()):
                nursery.start_soon(gather, frontend)
        scheduler = self.scheduler
        metrics = wire.CoreMetrics(
            statistics=scheduler.statistics(),
            step_failures=scheduler.step_failures,
            snapshots=snapshots,
            frontends=len(self.frontends),
            recovered_logs=self.settings.recovered_logs,
        )
        asker.queue((wire.METRICS, request_id, metrics))


class CoreStart:
    """The core while it starts: its phases so far, then ready (the :class:`EngineCore`) or
    failed (one line). A front end that links meanwhile is sent each phase as it changes."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.state = StartupState()
        self.core: EngineCore | None = None
        self.failure: str | None = None
        self.settled = trio.Event()  # ready or failed

    def failed(self, exc: BaseException) -> str:
        current = self.state.current
        phase = current.name if current is not None and current.state == FAILED else "start-up"
        self.failure = " ".join(f"cannot serve {self.model}: the {phase} phase failed: {exc}".split())
        self.settled.set()
        return self.failure

    async def serve_link(self, sock: trio.socket.SocketType) -> None:
        sent: dict[str, PhaseReport] = {}
        while not self.settled.is_set():
            fresh = [r for r in list(self.state.phases.values()) if sent.get(r.name) is not r]
            if fresh:
                try:
                    await sock.send(wire.encode([(wire.PHASE, report) for report in fresh]))
                except OSError:
                    sock.close()
                    return
                sent.update((r.name, r) for r in fresh)
            with trio.move_on_after(PHASE_REPORT_S):
                await self.settled.wait()
        if self.core is None:
            fresh = [r for r in list(self.state.phases.values()) if sent.get(r.name) is not r]
            items: list[tuple[Any, ...]] = [(wire.PHASE, report) for report in fresh]
            with trio.move_on_after(1.0):
                try:
                    if items:  # the phase that failed, then why
                        await sock.send(wire.encode(items))
                    await sock.send(wire.encode([(wire.FAILED, self.failure or "the engine core failed")]))
                except OSError:
                    pass
            sock.close()
            return
        await self.core.serve_link(sock)


def start_failures(group: BaseExceptionGroup[CoreStartFailed]) -> list[CoreStartFailed]:
    """The start failures in ``group``, however deep its nurseries nested them."""
    found: list[CoreStartFailed] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(start_failures(exc))
        elif isinstance(exc, CoreStartFailed):
            found.append(exc)
    return found


# How often a front end linked during the start-up is sent the phases that changed.
PHASE_REPORT_S = 0.25


class CoreStartFailed(Exception):
    """The engine core could not start; ``line`` names the phase and the problem."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


async def run_engine_core(
    settings: CoreSettings,
    address: str,
    *,
    idle_exit_s: float | None = None,
    task_status: trio.TaskStatus[CoreStart] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen at ``address`` (``task_status`` gets the :class:`CoreStart` then), build the
    engine, then serve front-end links until cancelled (or, with ``idle_exit_s``, until no
    front end has been linked for that long after the first one). A start-up that fails raises
    :class:`CoreStartFailed` once the front ends linked meanwhile have been told."""
    started = time.perf_counter()
    # Bound before the model loads: a front end that links meanwhile is told the phases, and
    # no second core starts for the same log dir.
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await listener.bind(address)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    start = CoreStart(settings.model)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_accept, listener, start, nursery)
        task_status.started(start)
        try:
            engine = await trio.to_thread.run_sync(build_engine, settings, start.state.record)
            warmup_ms = await trio.to_thread.run_sync(warm_up, engine, start.state.record)
        except Exception as exc:
            line = start.failed(exc)
            with trio.move_on_after(2.0):  # the linked front ends are told
                await trio.sleep(PHASE_REPORT_S * 2)
            raise CoreStartFailed(line) from exc
        scheduler = Scheduler(engine, policy=make_policy(settings.tick_policy))
        await nursery.start(scheduler.run)
        core = EngineCore(
            engine, scheduler, settings, warmup_ms=warmup_ms, phases=tuple(start.state.phases.values())
        )
        start.core = core
        frozen = freeze_heap()  # heap.py: a full collection no longer scans the model and the scheduler
        start.settled.set()
        log.info(
            "engine core %d: %s with %d slots ready in %.1f s (warm-up %.0f ms, serving heap frozen: %d objects)",
            os.getpid(),
            settings.model,
            engine.slots,
            time.perf_counter() - started,
            warmup_ms,
            frozen,
        )
        if idle_exit_s is not None:
            nursery.start_soon(_exit_when_idle, core, idle_exit_s, nursery.cancel_scope)
        await trio.sleep_forever()


async def _accept(listener: trio.socket.SocketType, start: CoreStart, nursery: trio.Nursery) -> None:
    with listener:
        while True:
            sock, _ = await listener.accept()
            nursery.start_soon(start.serve_link, sock)


async def _exit_when_idle(core: EngineCore, idle_s: float, scope: trio.CancelScope) -> None:
    await core.connected.wait()
    while True:
        if core.frontends:
            await core.links_changed.wait()
            continue
        with trio.move_on_after(idle_s):
            await core.links_changed.wait()
            continue
        log.info("engine core: no front end for %.0f s, exiting", idle_s)
        scope.cancel()
        return


def core_settings(config: ServerConfig) -> CoreSettings:
    return CoreSettings(
        model=config.model,
        revision=config.revision,
        family=config.family,
        max_sessions=config.max_sessions,
        device=config.device,
        dtype=config.dtype,
        memory_limit=config.memory_limit,
        torch_threads=config.torch_threads,
        tick_policy=config.tick_policy,
        context_policy=config.context_policy,
        pin_max=config.max_pinned_prompt,
    )


def prepare_log_dir(log_dir: str) -> int:
    """Take the log dir's lock (held until the process exits; ``LogDirLocked`` when another
    server has it) and truncate the torn tails a crash left, before any front end writes;
    the number of logs recovered."""
    from .log.lock import lock_log_dir
    from .server import recover_logs

    Path(log_dir).mkdir(parents=True, exist_ok=True)
    lock_log_dir(log_dir)  # the descriptor stays open: the lock is this process's
    return len(recover_logs(Path(log_dir)))


IDLE_EXIT_S = 10.0


def main() -> None:
    """``python -m duplex_actors.engine_core``: the core the first of hypercorn's workers
    starts (``app.ensure_engine_core``), configured by the same ``DUPLEX_*`` variables."""
    from .config import ConfigError
    from .core.link import engine_core_address
    from .log.lock import LogDirLocked

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_process_name("duplex-engine")
    try:
        config = ServerConfig.from_env()
        recovered = prepare_log_dir(config.log_dir)
    except (ConfigError, LogDirLocked) as exc:
        print(f"duplex-actors engine core: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    address = engine_core_address(config.log_dir)
    failed: list[str] = []
    try:
        settings = attrs.evolve(core_settings(config), recovered_logs=recovered)
        trio.run(partial(run_engine_core, settings, address, idle_exit_s=IDLE_EXIT_S))
    except* CoreStartFailed as group:  # the front ends were told, and say it too
        failed.extend(exc.line for exc in start_failures(group))
    if failed:
        print(f"duplex-actors: {failed[0]}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
