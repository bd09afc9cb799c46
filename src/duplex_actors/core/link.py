"""A front end's link to the engine core: the scheduler as the front end's sessions see it.

:class:`CoreLink` implements what :class:`~duplex_actors.server.DuplexServer` and the session
actors use of a scheduler (``admit_slot``, ``submit_nowait``, ``request_reset``, ``release``,
``grid``, ``wait_reset``) by messages to the core (:mod:`.wire`), with input frames written to
shared memory (:mod:`.rings`). Nothing here blocks a session: ``submit_nowait`` and
``request_reset`` queue items that one writer task sends in order, as one message per round of
the event loop; one reader task routes the core's results to the sessions
(``deliver_record_nowait``) with no trip through the scheduler of this process.

If the core goes away (its process died), :attr:`failed` is set: every session is told its step
failed (it ends 1011 ``internal_error``), admission raises ``SchedulerFailed``, ``/ready`` and
``/health`` answer 503.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import numpy.typing as npt
import trio

from .. import error_codes
from ..admission import ResourceExhausted, SchedulerFailed
from ..error_codes import CodedError
from ..log import records as r
from ..model.engine import EngineDescription, SessionPrompt
from ..model.family import ModelFamily
from ..model.startup import PhaseReport
from ..session.alignment import Grid
from . import wire
from .rings import INPUT_DTYPE, OUTPUT_DTYPE, FrameRing

log = logging.getLogger(__name__)

RECEIVE_BYTES = 1 << 20
# Scheduler rounds the writer lets pass before it sends what is queued (an append is read,
# logged and stepped into a frame within two).
COALESCE_ROUNDS = 2
ADMIT_TIMEOUT_S = 10.0
METRICS_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0
_CREDENTIALS = struct.Struct("3i")


class CoreUnavailable(CodedError):
    """The engine core could not be reached, or its process is gone."""

    code = error_codes.INTERNAL_ERROR


class CoreStartFailed(CoreUnavailable):
    """The engine core could not start (its model cannot be served): ``line`` says which
    phase failed and why."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class LinkOccupant(Protocol):
    """A session as the link delivers to it (``duplex_actors.session.actor.SessionActor``)."""

    def deliver_record_nowait(self, record: r.Step) -> None: ...
    def reset_failed(self, exc: BaseException) -> None: ...
    def step_failed(self, exc: BaseException) -> None: ...
    def drained_nowait(self, frame_index: int) -> bool: ...
    def drainable(self) -> bool: ...


class _RemoteError(CodedError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen(slots=True)
class CoreEngine:
    """The engine as a front end sees it: its slots, its family and what log headers record.
    It runs in the core: a front end never steps, resets or prepares it itself."""

    slots: int
    family: ModelFamily
    description: EngineDescription

    def describe(self) -> EngineDescription:
        return self.description


def engine_core_address(log_dir: str | os.PathLike[str]) -> str:
    """The engine core's Unix socket for a log dir (one server per log dir): in the abstract
    namespace, so nothing on disk is left to clean up."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(log_dir))).hexdigest()[:24]
    return "\0duplex-actors-core-" + key


def peer_uid(sock: socket.socket | trio.socket.SocketType) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    _pid, uid, _gid = _CREDENTIALS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    return int(uid)


class CoreLink:
    """One front end's connection to the engine core (made by :func:`connect_core`)."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        hello: wire.EngineHello,
        input_ring: FrameRing,
        output_ring: FrameRing,
        decoder: wire.Decoder | None = None,
        early: Sequence[list[tuple[Any, ...]]] = (),
    ) -> None:
        self._stream = trio.SocketStream(sock)
        self._decoder = decoder or wire.Decoder()
        self._early = list(early)
        self.hello = hello
        self.frontend_id = hello.frontend_id
        self.engine = CoreEngine(hello.slots, _family(hello), hello.description)
        self._input = input_ring
        self._output = output_ring
        self._outgoing: list[tuple[Any, ...]] = []
        self._wake = trio.Event()
        self._occupants: dict[int, LinkOccupant] = {}
        self._requests = itertools.count(1)
        self._replies: dict[int, tuple[trio.Event, list[Any]]] = {}
        self._released: dict[int, trio.Event] = {}
        self._resets: dict[int, int] = {}  # slot -> epoch of its reset not yet applied
        self._resets_changed = trio.Event()
        self.status = wire.CoreStatus(hello.slots, hello.slots, 0, None)
        self._grid: Grid | None = None
        self._grid_key: tuple[float | None, frozenset[int]] = (None, frozenset())
        self.failed: BaseException | None = None
        self.on_gather: Callable[[], Any] | None = None  # this front end's counters snapshot
        self.closed = trio.Event()

    # -- what the server and the sessions use -----------------------------------------------------
    @property
    def slots_total(self) -> int:
        return self.status.slots_total

    @property
    def slots_free(self) -> int:
        return self.status.slots_free

    @property
    def slots_releasing(self) -> int:
        return self.status.slots_releasing

    async def admit_slot(self) -> int:
        """A free slot of the core's table (``ResourceExhausted`` when there is none). The round
        trip is shielded: a slot the core granted is always either returned or freed again."""
        self._check_alive()
        with trio.CancelScope(shield=True):
            reply = await self._request(wire.ADMIT, timeout_s=ADMIT_TIMEOUT_S)
        if reply[0] == wire.ADMITTED:
            return int(reply[2])
        code, message = reply[2], reply[3]
        if code == error_codes.RESOURCE_EXHAUSTED:
            raise ResourceExhausted(message)
        raise SchedulerFailed(message)

    def occupy(self, slot: int, occupant: LinkOccupant) -> None:
        self._occupants[slot] = occupant

    def free_unused(self, slot: int) -> None:
        """A slot admitted for a session that never opened: back to the core's table."""
        self._occupants.pop(slot, None)
        self._queue((wire.UNADMIT, slot))

    def submit_nowait(
        self, slot: int, frame_index: int, samples: npt.NDArray[np.float32], padded: bool = False
    ) -> None:
        if self.failed is not None:
            return
        seq = self._input.put(samples)
        payload: int | bytes = seq if seq is not None else np.asarray(samples, dtype=INPUT_DTYPE).tobytes()
        occupant = self._occupants.get(slot)
        drainable = occupant.drainable() if occupant is not None else False
        self._queue((wire.FRAME, slot, frame_index, padded, drainable, time.monotonic(), payload))

    def request_reset(self, slot: int, epoch: int, prompt: SessionPrompt | None) -> None:
        self._resets[slot] = epoch
        self._queue((wire.RESET, slot, epoch, prompt))

    async def release(self, slot: int) -> None:
        """Reset the slot's model state and free it (in the core); returns once it is free."""
        self._occupants.pop(slot, None)
        self._resets.pop(slot, None)
        if self.failed is not None:
            return
        done = self._released.setdefault(slot, trio.Event())
        self._queue((wire.RELEASE, slot))
        await done.wait()

    async def wait_reset(self, slot: int) -> None:
        """Return once ``slot`` has no reset pending (applied, failed, or the core is gone)."""
        while slot in self._resets and self.failed is None:
            await self._resets_changed.wait()

    def grid(self) -> Grid | None:
        status = self.status
        if status.grid_origin is None:
            return None
        key = (status.grid_origin, status.grid_held)
        if self._grid is None or key != self._grid_key:
            # The core's origin is time.monotonic(); the sessions' clock is trio's.
            origin = status.grid_origin + (trio.current_time() - time.monotonic())
            self._grid = Grid(origin=origin, period=status.grid_period, held=status.grid_held)
            self._grid_key = key
        return self._grid

    async def metrics(self) -> wire.CoreMetrics:
        """The core's scheduler statistics and every front end's counters."""
        self._check_alive()
        reply = await self._request(wire.METRICS, timeout_s=METRICS_TIMEOUT_S)
        metrics: wire.CoreMetrics = reply[2]
        return metrics

    # -- the link --------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and write until the core goes away (then fail every session) or cancelled."""
        lost = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                task_status.started()
                await self._reader()
                lost = True  # the core closed the link (its process ended)
                nursery.cancel_scope.cancel()
        finally:
            if self.failed is None:
                self.failed = CoreUnavailable("the engine core is gone")
            if lost:
                log.error("the engine core is gone: this front end's sessions end")
            self._fail_everything()
            self.closed.set()
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            self._input.close()
            self._output.close()

    async def aclose(self) -> None:
        """Close a link that never ran (:meth:`run` closes its own)."""
        await self._stream.aclose()
        self._input.close()
        self._output.close()

    def _check_alive(self) -> None:
        if self.failed is not None:
            raise SchedulerFailed(f"the model scheduler failed: {self.failed}")

    def _queue(self, item: tuple[Any, ...]) -> None:
        self._outgoing.append(item)
        self._wake.set()

    async def _request(self, kind: str, *, timeout_s: float) -> list[Any]:
        request_id = next(self._requests)
        event = trio.Event()
        reply: list[Any] = []
        self._replies[request_id] = (event, reply)
        self._queue((kind, request_id))
        try:
            with trio.move_on_after(timeout_s):
                while not event.is_set() and self.failed is None:
                    await _wait_either(event, self.closed)
        finally:
            self._replies.pop(request_id, None)
        if not event.is_set():
            self._check_alive()
            raise CoreUnavailable(f"the engine core did not answer {kind} within {timeout_s:g} s")
        return reply

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            # The sessions that have a frame in the same burst run before this task does
            # again: their frames go in this message, not one message (and send) each.
            for _ in range(COALESCE_ROUNDS):
                await trio.lowlevel.cancel_shielded_checkpoint()
            self._wake = trio.Event()
            ack = self._output.ack_to_send()  # rides with these frames
            if ack is not None:
                self._outgoing.append((wire.ACK, ack))
            if not self._outgoing:
                continue
            items, self._outgoing = self._outgoing, []
            try:
                await self._stream.send_all(wire.encode(items))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def _reader(self) -> None:
        decoder = self._decoder
        early, self._early = self._early, []
        for items in early:
            self._handle(items)
        while True:
            try:
                data = await self._stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            for items in decoder.feed(data):
                self._handle(items)

    def _handle(self, items: Sequence[tuple[Any, ...]]) -> None:
        output = self._output
        occupants = self._occupants
        copied = -1
        for item in items:
            kind = item[0]
            if kind == wire.RESULT:
                _, slot, epoch, frame_index, ready, token, piece, agent, user, payload = item
                if isinstance(payload, int):
                    pcm16 = output.get_bytes(payload)
                    copied = max(copied, payload)
                else:
                    pcm16 = payload
                occupant = occupants.get(slot)
                if occupant is not None:
                    occupant.deliver_record_nowait(
                        r.Step(
                            epoch=epoch,
                            frame_index=frame_index,
                            ready=ready,
                            text_token=token,
                            text_piece=piece,
                            agent_codes=agent,
                            user_codes=user,
                            pcm16=pcm16,
                        )
                    )
            elif kind == wire.ACK:
                self._input.ack(item[1])
            elif kind == wire.STATUS:
                self.status = item[1]
            elif kind == wire.ADMITTED or kind == wire.REFUSED or kind == wire.METRICS:
                waiting = self._replies.get(item[1])
                if waiting is not None:
                    waiting[1].extend(item)
                    waiting[0].set()
                elif kind == wire.ADMITTED:  # its requester gave up: give the slot back
                    self._queue((wire.UNADMIT, item[2]))
            elif kind == wire.RESET_DONE:
                _, slot, epoch = item
                if self._resets.get(slot) == epoch:
                    del self._resets[slot]
                    self._resets_changed.set()
                    self._resets_changed = trio.Event()
            elif kind == wire.RELEASED:
                done = self._released.pop(item[1], None)
                if done is not None:
                    done.set()
            elif kind == wire.DRAINED:
                occupant = occupants.get(item[1])
                if occupant is not None:
                    occupant.drained_nowait(item[2])
            elif kind == wire.RESET_FAILED:
                _, slot, code, message = item
                self._resets.pop(slot, None)
                self._resets_changed.set()
                self._resets_changed = trio.Event()
                occupant = occupants.get(slot)
                if occupant is not None:
                    occupant.reset_failed(_RemoteError(code, message))
            elif kind == wire.STEP_FAILED:
                occupant = occupants.get(item[1])
                if occupant is not None:
                    occupant.step_failed(_RemoteError(error_codes.INTERNAL_ERROR, item[2]))
            elif kind == wire.GATHER:
                snapshot = self.on_gather() if self.on_gather is not None else None
                self._queue((wire.GATHERED, item[1], snapshot))
            else:
                log.warning("engine core link: unknown item %r", kind)
        if copied >= 0 and output.copied(copied):
            self._wake.set()

    def _fail_everything(self) -> None:
        exc = self.failed or CoreUnavailable("the engine core is gone")
        occupants, self._occupants = self._occupants, {}
        for occupant in occupants.values():
            occupant.step_failed(exc)
        for done in self._released.values():
            done.set()
        self._released.clear()
        for event, _ in self._replies.values():
            event.set()
        self._resets.clear()
        self._resets_changed.set()
        self.status = attrs.evolve(self.status, failed=str(exc), slots_free=0)


async def _wait_either(first: trio.Event, second: trio.Event) -> None:
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


def _family(hello: wire.EngineHello) -> ModelFamily:
    family = hello.family
    if hello.prompt_base is not None and hello.tokenizer is not None:
        import sentencepiece

        from ..model.process import PromptPositions

        tokenizer = sentencepiece.SentencePieceProcessor()
        tokenizer.Load(hello.tokenizer)
        family = attrs.evolve(
            family, prompt_positions=PromptPositions(hello.prompt_base, family.default_voice, tokenizer)
        )
    return family


async def connect_core(
    address: str,
    *,
    timeout_s: float = CONNECT_TIMEOUT_S,
    on_phase: Callable[[PhaseReport], None] | None = None,
) -> CoreLink:
    """Connect to the engine core at ``address`` (a Unix socket; abstract when it starts with
    NUL), take its hello and the shared-memory rings it passes along, and return the link (its
    :meth:`CoreLink.run` must then run). While the core starts, each of its start-up phases goes
    to ``on_phase``. ``CoreUnavailable`` when nothing answers in time, ``CoreStartFailed`` when
    the core cannot serve."""
    deadline = trio.current_time() + timeout_s
    last: BaseException | None = None
    while True:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(address)
            break
        except OSError as exc:
            sock.close()
            last = exc
            if trio.current_time() >= deadline:
                raise CoreUnavailable(f"no engine core at {address!r}: {last}") from None
            await trio.sleep(0.05)
    try:
        if peer_uid(sock) != os.getuid():
            raise CoreUnavailable("the engine core socket belongs to another user")
        with trio.fail_after(max(0.1, deadline - trio.current_time())):
            hello, fds, decoder, early = await _receive_hello(sock, on_phase)
    except trio.TooSlowError:
        sock.close()
        raise CoreUnavailable(f"the engine core at {address!r} sent no hello") from None
    except BaseException:
        sock.close()
        raise
    input_ring = FrameRing(fds[0], hello.input_capacity, INPUT_DTYPE)
    output_ring = FrameRing(fds[1], hello.output_capacity, OUTPUT_DTYPE)
    return CoreLink(sock, hello, input_ring, output_ring, decoder, early)


async def _receive_hello(
    sock: trio.socket.SocketType, on_phase: Callable[[PhaseReport], None] | None
) -> tuple[wire.EngineHello, list[int], wire.Decoder, list[list[tuple[Any, ...]]]]:
    """The start-up phases (to ``on_phase``), then the hello, the two ring descriptors that ride
    along with it, and the decoder with any messages that came in the same read."""
    fds = array.array("i")
    decoder = wire.Decoder()
    while True:
        data, ancdata, _flags, _addr = await sock.recvmsg(RECEIVE_BYTES, socket.CMSG_SPACE(2 * fds.itemsize))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if not data:
            raise CoreUnavailable("the engine core closed the link before its hello")
        messages = decoder.feed(data)
        while messages:
            items = messages.pop(0)
            if items and items[0][0] == wire.PHASE:
                if on_phase is not None:
                    for item in items:
                        on_phase(item[1])
                continue
            if items and items[0][0] == wire.FAILED:
                raise CoreStartFailed(items[0][1])
            if not items or items[0][0] != wire.HELLO or len(fds) != 2:
                raise CoreUnavailable("the engine core's first message is not its hello")
            return items[0][1], list(fds), decoder, messages


__all__ = [
    "CoreEngine",
    "CoreLink",
    "CoreStartFailed",
    "CoreUnavailable",
    "connect_core",
    "engine_core_address",
]
