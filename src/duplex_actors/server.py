"""The in-process API: a duplex server without a network, used by the app, tests and replay.

::

    async with open_duplex_server(engine, log_dir="sessions") as server:
        session = await server.open_session({"voice": "NATF2.pt"})
        await session.append(samples)            # float32 mono 24 kHz, any length
        async for event in session.events():     # dialect-neutral session events
            ...
        await session.close()

One scheduler actor owns the engine; one session actor per session; one log writer. Every
session is logged to ``<log_dir>/<session_id>.dlog`` and finishes with ``close`` and ``end``
records, whatever ended it.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import trio

from . import __version__, error_codes
from . import close_reasons as reasons
from .admission import LogUnavailable, ResourceExhausted
from .audio import FORMATS, SAMPLE_RATE, encode_f32
from .config import DEFAULT_TICK_POLICY
from .counters import Counters
from .log import records as r
from .log.retention import prune
from .log.writer import COMMIT_LINGER_S, LogWriter, open_log_writer
from .model.engine import EngineDescription, ModelEngine
from .model.errors import InvalidRuntimeConfig
from .model.voices import AliasedVoices
from .opus.pool import OpusPool, open_opus_pool
from .scheduler.actor import Scheduler
from .scheduler.clock import REAL_TIME, VIRTUAL_TIME, Executor, io_executor
from .scheduler.policy import make_policy
from .session import events as ev
from .session.actor import SessionActor
from .session.alignment import Grid
from .session.tombstones import Tombstones

if TYPE_CHECKING:
    from .core.link import CoreLink
from .session.core import PROMPT_ROLES, PromptPolicy, SessionCore, SessionLimits

__all__ = [
    "DuplexServer",
    "SessionHandle",
    "SlotReservation",
    "open_duplex_server",
    "open_linked_server",
]


def new_session_id() -> str:
    """Random and unique across restarts: ``sess_`` + 24 hex digits."""
    return "sess_" + secrets.token_hex(12)


def owner_index(session_id: str, count: int) -> int | None:
    """Which of ``count`` front ends made ``session_id`` (:func:`front_end_session_ids`), or
    None for an id no front end made."""
    digits = session_id.removeprefix("sess_")[:2]
    try:
        return int(digits, 16) % count
    except ValueError:
        return None


def front_end_session_ids(index: int, count: int) -> Callable[[], str]:
    """Session ids of front end ``index`` of ``count``: random, with the first byte naming the
    front end (``byte % count``), so that any front end tells whose a resumed session is."""

    def make() -> str:
        byte = secrets.randbelow(256 // count) * count + index
        return f"sess_{byte:02x}{secrets.token_hex(11)}"

    return make


class SessionHandle:
    """A client's view of one session: commands in, events out."""

    def __init__(self, actor: SessionActor, events: trio.MemoryReceiveChannel[ev.SessionEvent]) -> None:
        self._actor = actor
        self._events = events
        # Since when every append has had to wait for the backlog to drain (None: the last one
        # found room at once); a connection closes a client that stays there (rate_limited).
        self.input_held_since: float | None = None

    @property
    def session_id(self) -> str:
        return self._actor.session_id

    @property
    def slot(self) -> int:
        return self._actor.slot

    @property
    def core(self) -> SessionCore:
        return self._actor.core

    @property
    def closed(self) -> bool:
        return self._actor.done.is_set()

    @property
    def close_reason(self) -> str | None:
        """Why the session ended (``client_close``, ``timeout``, ``slow_consumer``, ...), once it has."""
        return self._actor.close_reason

    async def _send(self, record: r.Record, *, applied: bool = False) -> None:
        try:
            await self._actor.send(record, applied=applied)
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError(f"session {self.session_id} has ended") from None

    async def append(self, samples: npt.NDArray[np.float32], *, client_event_id: str | None = None) -> None:
        """Float32 samples in [-1, 1], mono 24 kHz, any length (empty is refused by the core)."""
        await self._send_input(
            r.Append(encode_f32(np.asarray(samples, dtype=np.float32)), "pcm_f32le", client_event_id)
        )

    async def append_bytes(
        self,
        audio: bytes,
        format: str = "pcm16",
        *,
        client_event_id: str | None = None,
        sample_rate_hz: int = SAMPLE_RATE,
        pad_ms: int = 0,
    ) -> None:
        """Audio as received, in any input format and rate of docs/protocol.md §3 (the core resamples).
        Waits while the session's backlog is over its soft budget (docs/design.md, decision 11). ``pad_ms``:
        silence the client asks for before this audio (docs/protocol.md §7), logged as a ``pad``
        record just before the append."""
        record = r.Append(audio, format, client_event_id, sample_rate_hz)
        if pad_ms:
            await self._send(r.Pad(pad_ms * SAMPLE_RATE // 1000, "client"))
        await self._send_input(record)

    def append_bytes_nowait(
        self,
        audio: bytes,
        format: str = "pcm16",
        *,
        client_event_id: str | None = None,
        sample_rate_hz: int = SAMPLE_RATE,
        now: float | None = None,
    ) -> bool:
        """:meth:`append_bytes` when it would not wait (the connection's fast path for small
        appends); False, nothing queued, when it would. ``now``: the trio clock at its arrival,
        when the caller read it."""
        try:
            queued = self._actor.send_append_nowait(
                r.Append(audio, format, client_event_id, sample_rate_hz), now
            )
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError(f"session {self.session_id} has ended") from None
        if queued:
            self.input_held_since = None
        return queued

    @property
    def last_client_event_id(self) -> str | None:
        """The client event id of the last client command the session handled."""
        return self._actor.last_client_event_id

    async def log_record(self, record: r.Detach | r.Resume) -> None:
        """Log and apply a record of the session's connection (``detach``, ``resume``: they
        emit nothing); returns once it is applied (a ``resume`` once it is durable too)."""
        await self._send(record, applied=True)

    def protect_backlog(self, frames: int) -> None:
        """The next ``frames`` frames are a resumed client's re-sent input: never drained."""
        self._actor.undrainable_until = self.core.frames_in + frames

    async def trim_resent(
        self, audio: bytes, format: str, start: int, client_event_id: str | None = None
    ) -> bytes | None:
        """Of an append that starts at client sample ``start``, what the session does not hold
        yet (None: nothing). A start past what the session holds is refused (``input_gap``,
        naming the append's ``client_event_id``)."""
        await self.wait_handled()
        received = self.core.client_samples
        if start > received:
            await self.reject(
                "input_audio_buffer.append",
                error_codes.INPUT_GAP,
                f"input_samples_start {start} is past the {received} samples the session holds: "
                "re-send from input_samples_received",
                client_event_id,
            )
            return None
        skip = (received - start) * FORMATS.get(format, 2)
        return audio[skip:] or None

    async def wait_handled(self) -> None:
        """Until the session has applied every command sent so far (appends queued without a
        wait too): a command decided on the core's state reads it after them."""
        await self._actor.wait_handled()

    async def _send_input(self, record: r.Append) -> None:
        started = trio.current_time()
        if await self._actor.wait_for_input_room(record):
            if self.input_held_since is None:
                self.input_held_since = started
        else:
            self.input_held_since = None
        await self._send(record)

    async def update(self, config: Mapping[str, Any], *, client_event_id: str | None = None) -> None:
        """Raises ValueError for a config that is not plain JSON (NaN, infinities, objects)."""
        json.dumps(config, allow_nan=False)
        config, refusal = fitting_config(self.core, config, self.core.config)
        # Applied before returning: an update waits for its commit before the core takes it
        # (no session.updated ahead of its record), and the client's next append must be
        # parsed with the config it sets (its input format and rate).
        if config or refusal is None:
            await self._send(r.Update(dict(config), client_event_id), applied=True)
        if refusal is not None:
            await self.reject(
                "session.update", error_codes.INVALID_DUPLEX_RUNTIME_CONFIG, refusal, client_event_id
            )

    async def cancel(self, *, client_event_id: str | None = None, reset: bool = True) -> None:
        """End the active response; ``reset``: the model's context too (a new epoch)."""
        await self._send(r.Cancel(client_event_id, reset))

    async def clear_input(self, *, client_event_id: str | None = None) -> None:
        await self._send(r.ClearInput(client_event_id))

    async def clear_output(self, *, client_event_id: str | None = None, reset: bool = True) -> None:
        """Clear the output buffer: as :meth:`cancel` while a response is active."""
        await self._send(r.ClearOutput(client_event_id, reset))

    async def truncate(
        self, item_id: str, content_index: int, audio_end_ms: int, *, client_event_id: str | None = None
    ) -> None:
        """The client played ``audio_end_ms`` of the item's audio: recorded and acknowledged."""
        await self._send(r.Truncate(item_id, content_index, audio_end_ms, client_event_id))

    async def retrieve_item(self, item_id: str, *, client_event_id: str | None = None) -> None:
        """``conversation.item.retrieve``: the item as the session holds it, or an error."""
        await self._send(r.RetrieveItem(item_id, client_event_id))

    async def add_text_item(
        self, role: str, text: str, *, item_id: str | None = None, client_event_id: str | None = None
    ) -> None:
        """A text message (``conversation.item.create``); a system or developer one before the
        first frame joins the persona, so it is refused here if that would not fit the context."""
        prompt = self.core.folded_prompt(text) if role in PROMPT_ROLES else None
        if prompt is not None:
            try:
                self.core.policy.check_context(prompt)
            except InvalidRuntimeConfig as exc:
                await self.reject(
                    "conversation.item.create",
                    error_codes.INVALID_DUPLEX_RUNTIME_CONFIG,
                    str(exc),
                    client_event_id,
                )
                return
        await self._send(r.TextItem(role, text, item_id, client_event_id), applied=True)

    async def heartbeat(self, *, client_event_id: str | None = None) -> None:
        await self._send(r.Heartbeat(client_event_id))

    async def playback_ack(
        self, payload: Mapping[str, Any] | None = None, *, client_event_id: str | None = None
    ) -> None:
        await self._send(r.PlaybackAck(dict(payload or {}), client_event_id))

    async def reject(
        self, event_type: str, code: str, message: str, client_event_id: str | None = None
    ) -> None:
        """Record an inbound event that failed validation; the client gets the error event."""
        await self._send(r.Rejected(event_type, code, message, client_event_id))

    async def close(self, reason: str = reasons.CLIENT_CLOSE) -> None:
        """Ask the session to close and wait until its log is finished and its slot freed."""
        if not self.closed:
            try:
                await self._actor.send(r.Close(reason))
            except trio.ClosedResourceError:
                pass
        await self._actor.done.wait()

    async def disconnect(self) -> None:
        """The client went away without closing (its socket dropped)."""
        await self.close(reasons.DISCONNECT)

    def events(self) -> trio.MemoryReceiveChannel[ev.SessionEvent]:
        """The session's events, ending after ``SessionClosed``."""
        return self._events

    def emit_directly(self, writer: Callable[[list[ev.SessionEvent]], bool] | None) -> None:
        """Offer the session's events to ``writer`` first (True: it sent them at once; False:
        they go to :meth:`events`); None stops."""
        self._actor.emit_directly = writer

    async def wait_closed(self) -> None:
        await self._actor.done.wait()


class SlotScheduler(Protocol):
    """What the server uses of a scheduler: the in-process :class:`Scheduler`, or a front end's
    link to the engine core (``core/link.py``)."""

    failed: BaseException | None

    @property
    def slots_total(self) -> int: ...
    @property
    def slots_free(self) -> int: ...
    @property
    def slots_releasing(self) -> int: ...

    async def admit_slot(self) -> int:
        """A free slot (``ResourceExhausted``, ``SchedulerFailed``); a slot granted is returned,
        even to a caller cancelled meanwhile (it frees it with :meth:`free_unused`)."""
        ...

    def occupy(self, slot: int, occupant: Any) -> None: ...
    def free_unused(self, slot: int) -> None: ...
    def submit_nowait(
        self, slot: int, frame_index: int, samples: npt.NDArray[np.float32], padded: bool = False
    ) -> None: ...
    def request_reset(self, slot: int, epoch: int, prompt: Any) -> None: ...
    async def release(self, slot: int) -> None: ...
    async def wait_reset(self, slot: int) -> None: ...
    def grid(self) -> Grid | None: ...


class ServedEngine(Protocol):
    """What the server uses of the engine: slots, family, what log headers record."""

    @property
    def slots(self) -> int: ...
    @property
    def family(self) -> Any: ...
    def describe(self) -> EngineDescription: ...


class SlotReservation:
    """A slot held for a session that is not open yet (made by :meth:`DuplexServer.reserve`,
    e.g. while a WebSocket handshake is answered), so that two concurrent opens cannot both pass
    the capacity check. ``open_session(reservation=...)`` takes it; :meth:`release` (idempotent,
    also on ``with`` exit) frees a slot nobody took."""

    def __init__(self, scheduler: SlotScheduler, slot: int) -> None:
        self.slot = slot
        self._scheduler = scheduler
        self.state = "held"  # held -> taken | released

    def take(self) -> int:
        if self.state != "held":
            raise RuntimeError(f"the reservation of slot {self.slot} is {self.state}")
        self.state = "taken"
        return self.slot

    def release(self) -> None:
        if self.state != "held":
            return
        self.state = "released"
        self._scheduler.free_unused(self.slot)

    def __enter__(self) -> SlotReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


SchedulerT = TypeVar("SchedulerT", bound=SlotScheduler)


class DuplexServer(Generic[SchedulerT]):
    """The sessions of one process over a scheduler: the in-process :class:`Scheduler`
    (:func:`open_duplex_server`) or a front end's link to the engine core
    (:func:`open_linked_server`)."""

    def __init__(
        self,
        engine: ServedEngine,
        scheduler: SchedulerT,
        writer: LogWriter,
        nursery: trio.Nursery,
        *,
        policy: PromptPolicy,
        limits: SessionLimits,
        outbox_size: int,
        description: EngineDescription,
        session_ids: Callable[[], str] = new_session_id,
    ) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.writer = writer
        self.policy = policy
        self.limits = limits
        self.outbox_size = outbox_size
        self.description = description  # what every log header records about the engine
        self._nursery = nursery
        self._session_ids = session_ids
        self.sessions: dict[str, SessionActor] = {}
        self.session_dialects: dict[str, str] = {}  # of the open sessions, for /metrics
        self._session_ended = trio.Event()  # set (and replaced) whenever a session ends
        self.accepting = True
        self.not_accepting_reason = "the server is shutting down"
        self.logs_pruned = 0
        self.recovered_logs: list[tuple[str, str]] = []  # (file, what was done) at start-up
        self.counters = Counters()
        self.frame_cpu_s = 0.0  # measured by measure_frame_cpu (0: unknown, no burst floor)
        self.opening: set[str] = set()  # ids between log creation and registration
        # Called with (session_id, log path) once a session's log is closed (finished or failed).
        self.on_log_finished: list[Callable[[str, Path], None]] = []
        # The Opus codec processes of /api/chat sessions: started by get_opus_pool() on first use.
        self.opus_workers: int | None = None  # None: opus.pool.default_opus_workers()
        self.opus_pool: OpusPool | None = None
        self._opus_lock = trio.Lock()
        # The voice aliases sessions resolve (model/voices.py), recorded in every log's header.
        self.voice_aliases: dict[str, str] = {}
        # Resumable sessions by id (``web/resumable.py``), from open until they end.
        self.resumable: dict[str, Any] = {}
        self.resume_tombstones = Tombstones()  # resumable sessions that ended lately

    def new_session_id(self) -> str:
        """An id for a session about to open (``open_session(session_id=...)``)."""
        return self._session_ids()

    def start_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a task for as long as the server runs (beyond the connection that started it)."""
        self._nursery.start_soon(fn, *args)

    async def get_opus_pool(self) -> OpusPool:
        """The Opus codec pool (``opus_workers`` processes), started on the first call; it runs
        until the server exits. Raises what starting a worker raised (OSError, TooSlowError)."""
        if self.opus_pool is None:
            async with self._opus_lock:
                if self.opus_pool is None:
                    self.opus_pool = await self._nursery.start(self._run_opus_pool)
        return self.opus_pool

    async def _run_opus_pool(self, *, task_status: trio.TaskStatus[OpusPool]) -> None:
        started = False
        try:
            async with open_opus_pool(self.opus_workers) as pool:
                task_status.started(pool)
                started = True
                await trio.sleep_forever()
        except Exception:
            if not started:
                raise
            # A bug in the pool must not take the sessions of every other dialect down with it.
            logging.getLogger(__name__).exception("the Opus codec pool failed; the next use starts one")
        finally:
            if started:
                self.opus_pool = None

    def burst_floor_ms(self) -> float:
        """How long this process takes to read one append from each of its sessions: the pre-tick
        burst of aligned clients, which their alignment margin leaves room for (capped by it)."""
        return len(self.sessions) * self.frame_cpu_s * 1000

    async def measure_frame_cpu(self, interval_s: float = 1.0) -> None:
        """Keep :attr:`frame_cpu_s` (this process's CPU per input frame, smoothed) up to date."""
        cpu, frames = time.process_time(), self.counters.frames_in
        while True:
            await trio.sleep(interval_s)
            now_cpu, now_frames = time.process_time(), self.counters.frames_in
            if now_frames > frames:
                sample = (now_cpu - cpu) / (now_frames - frames)
                self.frame_cpu_s = sample if not self.frame_cpu_s else 0.7 * self.frame_cpu_s + 0.3 * sample
            cpu, frames = now_cpu, now_frames

    def _check_admitting(self) -> None:
        if not self.accepting:
            raise ResourceExhausted(self.not_accepting_reason)
        if not self.writer.healthy:
            raise LogUnavailable("a session log could not be written; not admitting sessions")

    async def reserve(self) -> SlotReservation:
        """Hold a free slot for a session about to open (``ResourceExhausted`` if none, or while
        not accepting; ``LogUnavailable``; ``SchedulerFailed``). Pass it to :meth:`open_session`,
        or release it."""
        self._check_admitting()
        return SlotReservation(self.scheduler, await self.scheduler.admit_slot())

    async def open_session(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        dialect: str = "inprocess",
        output: Mapping[str, Any] | None = None,
        client_event_id: str | None = None,
        reservation: SlotReservation | None = None,
        session_id: str | None = None,
    ) -> SessionHandle:
        """Admit a session (a free slot, else ``ResourceExhausted``: no log is written) and open it.

        With ``reservation`` (from :meth:`reserve`) the session takes that slot; a reservation
        that does not become a session (refused while not accepting, a bad config) is released."""
        try:
            # A cancelled caller gets no session; once one exists, the caller gets it (the
            # opening has no checkpoint after this one) and closes it when it ends.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check_admitting()
            json.dumps(config or {}, allow_nan=False)  # ValueError before admission: no log
            slot = reservation.take() if reservation is not None else await self.scheduler.admit_slot()
            session_id = session_id or self._session_ids()
            if session_id in self.sessions or session_id in self.opening:
                raise ValueError(f"session {session_id} exists")
            self.opening.add(session_id)
            try:
                handle = self._open(session_id, dict(config or {}), dialect, output, client_event_id, slot)
            finally:
                self.opening.discard(session_id)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return handle
        finally:
            if reservation is not None:
                reservation.release()  # no-op once taken

    def _open(
        self,
        session_id: str,
        config: dict[str, Any],
        dialect: str,
        output: Mapping[str, Any] | None,
        client_event_id: str | None,
        slot: int,
    ) -> SessionHandle:
        """Create the session in ``slot`` (admitted for it; freed again if this raises)."""
        core = SessionCore(session_id, self.policy, self.limits)
        # A persona too long for the context in the opening config is refused as any invalid
        # opening config is: the session opens with the defaults, then an error.
        config, refusal = fitting_config(core, config)
        send, receive = trio.open_memory_channel[ev.SessionEvent](self.outbox_size)
        try:
            session_log = self.writer.create(session_id)
        except Exception as exc:
            self.scheduler.free_unused(slot)
            if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
                # A full or unwritable log dir: the writer stops admissions until a probe works.
                raise LogUnavailable(f"the session log cannot be created: {exc}") from exc
            raise
        actor = SessionActor(
            core,
            slot=slot,
            scheduler=self.scheduler,
            session_log=session_log,
            outbox=send,
            counters=self.counters,
            burst_floor_ms=self.burst_floor_ms,
        )
        self.counters.sessions_opened += 1
        self.counters.sessions_by_dialect[dialect] += 1
        self.session_dialects[session_id] = dialect
        self.scheduler.occupy(slot, actor)
        self.sessions[session_id] = actor
        described = self.description
        header = r.Header(
            format_version=r.FORMAT_VERSION,
            session_id=session_id,
            model_id=described.model_id,
            checkpoint_sha256=described.checkpoint_sha256,
            dtype=described.dtype,
            engine={
                **described.engine,
                "limits": {
                    "max_buffered_samples": self.limits.max_buffered_samples,
                    "max_pad_samples": self.limits.max_pad_samples,
                },
                **({"voice_aliases": dict(self.voice_aliases)} if self.voice_aliases else {}),
            },
            sampling={
                k: config[k]
                for k in ("temperature", "temperature_text", "top_k", "top_k_text", "seed")
                if k in config
            },
            dialect=dialect,
            output=dict(output or {}),
            package_version=__version__,
            created_at=time.time(),
        )
        # From the slot's occupancy to the actor's task there is no checkpoint: a caller
        # cancelled here (its client gone right after the upgrade) would leave a registered
        # session that nothing runs or closes, holding its slot.
        actor.send_nowait(header)
        actor.send_nowait(r.Open(config, client_event_id))
        if refusal is not None:
            opening = "session.create" if dialect == "native" else "session.update"
            actor.send_nowait(
                r.Rejected(opening, error_codes.INVALID_DUPLEX_RUNTIME_CONFIG, refusal, client_event_id)
            )
        self._nursery.start_soon(self._run_session, actor)
        return SessionHandle(actor, receive)

    async def _run_session(self, actor: SessionActor) -> None:
        try:
            await actor.run()
        except Exception:
            # A bug of one session (its actor has closed its log with "error" and freed its
            # slot) must not end the server's other sessions: counted and logged, not raised.
            self.counters.connection_errors["session"] += 1
            logging.getLogger(__name__).exception("session %s failed", actor.session_id)
        finally:
            self.sessions.pop(actor.session_id, None)
            self.session_dialects.pop(actor.session_id, None)
            self._session_ended.set()
            self._session_ended = trio.Event()
            for listener in self.on_log_finished:
                try:
                    listener(actor.session_id, actor.log.path)
                except Exception:
                    logging.getLogger(__name__).exception("a log-finished listener failed")

    async def wait_no_sessions(self) -> None:
        """Return once no session is open (every open one has finished its log)."""
        while self.sessions:
            await self._session_ended.wait()

    async def aclose(self, reason: str = reasons.SERVER_SHUTDOWN) -> None:
        """Stop admitting, close every session with ``reason``, wait for their logs."""
        self.accepting = False
        actors = list(self.sessions.values())
        for actor in actors:
            if not actor.done.is_set():
                actor.inbox.put_result_nowait(r.Close(reason))  # dropped by a closed inbox
        for actor in actors:
            await actor.done.wait()


def context_refusal(core: SessionCore, taken: Mapping[str, Any], base: Mapping[str, Any]) -> str | None:
    """Why the prompt of ``base`` updated with ``taken`` (fields the core takes) cannot fit the
    model's context, or None (also when they touch neither voice nor persona). Asked before
    logging: the budget needs the engine's tokenizer, which a logic replay lacks, so the verdict
    goes into the log as a ``rejected`` record rather than being the core's."""
    if "instructions" not in taken and "voice" not in taken:
        return None
    try:
        prompt = core.validated({**base, **taken})
    except Exception:
        return None  # the core refuses it itself, with its own code
    try:
        core.policy.check_context(prompt)
    except InvalidRuntimeConfig as exc:
        return str(exc)
    return None


def fitting_config(
    core: SessionCore, changes: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str | None]:
    """``changes`` less the fields whose prompt would not fit the model's context (the persona,
    then the voice), and why they were taken out (None: nothing was). The check is on the
    fields the core would take; when it refuses, the fields the core would refuse are taken
    out too and named in the same refusal: one error per config."""
    base = base or {}
    taken, others = core.split_update(changes, base)
    refusal = context_refusal(core, taken, base)
    if refusal is None:
        return dict(changes), None
    for field in ("instructions", "voice"):
        taken.pop(field, None)
        if context_refusal(core, taken, base) is None:
            break
    return taken, "; ".join([refusal, *(message for _, message in others)])


def recover_logs(log_dir: Path) -> list[tuple[str, str]]:
    """At start-up, truncate the torn tails of logs a crash left behind (every whole record
    before the tail stays); report corrupt logs and leave them untouched."""
    from .log.segment import LogCorruption, read_log, recover

    done: list[tuple[str, str]] = []
    for path in sorted(log_dir.glob("*.dlog")):
        try:
            if read_log(path).torn_tail is None:
                continue
            result = recover(path)
            assert result.torn_tail is not None
            done.append((path.name, f"torn tail truncated at byte {result.torn_tail.offset}"))
        except LogCorruption as exc:
            done.append((path.name, f"corrupt, left as is: {exc}"))
        except OSError as exc:
            done.append((path.name, f"unreadable: {exc}"))
    for name, what in done:
        logging.getLogger(__name__).warning("session log %s: %s", name, what)
    return done


class _OpenSessions(AbstractSet[str]):
    """The ids of open sessions, read live: a session opened while a prune runs is kept too."""

    def __init__(self, server: DuplexServer[Any]) -> None:
        self._server = server

    def __contains__(self, name: object) -> bool:
        return name in self._server.sessions or name in self._server.opening

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._server.sessions) + list(self._server.opening))

    def __len__(self) -> int:
        return len(self._server.sessions) + len(self._server.opening)


async def _retention(
    server: DuplexServer[Any],
    io: Executor,
    log_dir: Path,
    max_age_s: float | None,
    max_bytes: int | None,
    interval_s: float,
) -> None:
    keep = _OpenSessions(server)
    while True:
        deleted = await io.run(
            partial(prune, log_dir, max_age_s=max_age_s, max_bytes=max_bytes, now=time.time(), keep=keep)
        )
        server.logs_pruned += len(deleted)
        await trio.sleep(interval_s)


@asynccontextmanager
async def open_duplex_server(
    engine: ModelEngine,
    *,
    log_dir: str | Path = "sessions",
    virtual_time: bool = False,
    max_batch_wait_ms: float = 20.0,
    tick_policy: str = DEFAULT_TICK_POLICY,
    limits: SessionLimits | None = None,
    outbox_size: int = 4096,
    fsync: bool = True,
    policy: PromptPolicy | None = None,
    session_ids: Callable[[], str] = new_session_id,
    log_max_age_s: float | None = None,
    log_max_bytes: int | None = None,
    retention_interval_s: float = 60.0,
    opus_workers: int | None = None,
    log_probe_interval_s: float = 5.0,
    log_commit_linger_s: float = COMMIT_LINGER_S,
    voice_aliases: Mapping[str, str] | None = None,
) -> AsyncIterator[DuplexServer[Scheduler]]:
    """Run the scheduler, the log writer and the sessions for ``engine`` until the block exits.

    - ``virtual_time=True`` (tests under ``trio.testing.MockClock``, replay) runs engine calls
      and log I/O inline instead of in worker threads.
    - ``tick_policy`` names the scheduler's policy (``grid``, ``deadline`` or ``window``:
      ``scheduler/policy.py``); ``max_batch_wait_ms`` is the window policy's wait.
    - ``limits`` bounds each session's buffered input and config; ``outbox_size`` is each
      session's bound of events not yet taken by its connection.
    - ``fsync``: whether the log writer's commits call ``fdatasync``; ``policy`` validates
      voices and personas (default: ``engine.family``).
    - ``session_ids`` makes ids (random by default; recordings of the golden corpus use fixed
      ones).
    - ``log_max_age_s`` and ``log_max_bytes`` prune finished logs (oldest first) every
      ``retention_interval_s``; while the log dir cannot be written, it is probed every
      ``log_probe_interval_s``; records nobody waits for are committed ``log_commit_linger_s``
      after the first of them.
    - ``opus_workers`` sizes the Opus codec pool of ``/api/chat``
      (:meth:`DuplexServer.get_opus_pool`).
    - ``voice_aliases`` (``model.voices.voice_alias_table``): voice names sessions may ask for
      besides the bundled ones, recorded in every log's header.
    """
    clock = VIRTUAL_TIME if virtual_time else REAL_TIME
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    io = io_executor(clock)
    recovered = await io.run(partial(recover_logs, log_dir))
    description = await io.run(engine.describe)
    async with trio.open_nursery() as scheduler_nursery:
        tick = make_policy(tick_policy, max_batch_wait_ms=max_batch_wait_ms)
        scheduler = Scheduler(engine, clock=clock, policy=tick)
        await scheduler_nursery.start(scheduler.run)
        async with _serve(
            engine,
            scheduler,
            description,
            log_dir=log_dir,
            io=io,
            inline_io=clock.virtual,
            limits=limits,
            outbox_size=outbox_size,
            fsync=fsync,
            policy=policy,
            session_ids=session_ids,
            log_max_age_s=log_max_age_s,
            log_max_bytes=log_max_bytes,
            retention_interval_s=retention_interval_s,
            opus_workers=opus_workers,
            log_probe_interval_s=log_probe_interval_s,
            log_commit_linger_s=log_commit_linger_s,
            voice_aliases=voice_aliases,
        ) as server:
            server.recovered_logs = recovered
            yield server
        scheduler_nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_linked_server(
    link: CoreLink,
    *,
    log_dir: str | Path = "sessions",
    limits: SessionLimits | None = None,
    outbox_size: int = 4096,
    log_max_age_s: float | None = None,
    log_max_bytes: int | None = None,
    retention_interval_s: float = 60.0,
    opus_workers: int | None = None,
    log_probe_interval_s: float = 5.0,
    log_commit_linger_s: float = COMMIT_LINGER_S,
    voice_aliases: Mapping[str, str] | None = None,
    session_ids: Callable[[], str] = new_session_id,
) -> AsyncIterator[DuplexServer[CoreLink]]:
    """The sessions of one front end over its ``link`` to the engine core (which must be
    running). The core recovered the logs a crash left before any front end started."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    async with _serve(
        link.engine,
        link,
        link.engine.describe(),
        log_dir=log_dir,
        io=io_executor(REAL_TIME),
        inline_io=False,
        limits=limits,
        outbox_size=outbox_size,
        fsync=True,
        policy=None,
        session_ids=session_ids,
        log_max_age_s=log_max_age_s,
        log_max_bytes=log_max_bytes,
        retention_interval_s=retention_interval_s,
        opus_workers=opus_workers,
        log_probe_interval_s=log_probe_interval_s,
        log_commit_linger_s=log_commit_linger_s,
        voice_aliases=voice_aliases,
        # A front end's CPU is its sessions' own (the model runs in the core): per frame, it
        # is what reading the pre-tick burst costs.
        measure_frame_cpu=True,
    ) as server:
        yield server


@asynccontextmanager
async def _serve(
    engine: ServedEngine,
    scheduler: SchedulerT,
    description: EngineDescription,
    *,
    log_dir: Path,
    io: Executor,
    inline_io: bool,
    limits: SessionLimits | None,
    outbox_size: int,
    fsync: bool,
    policy: PromptPolicy | None,
    session_ids: Callable[[], str],
    log_max_age_s: float | None,
    log_max_bytes: int | None,
    retention_interval_s: float,
    opus_workers: int | None,
    log_probe_interval_s: float,
    log_commit_linger_s: float,
    voice_aliases: Mapping[str, str] | None,
    measure_frame_cpu: bool = False,
) -> AsyncIterator[DuplexServer[SchedulerT]]:
    async with open_log_writer(
        log_dir,
        fsync=fsync,
        inline_io=inline_io,
        probe_interval_s=log_probe_interval_s,
        linger_s=log_commit_linger_s,
    ) as writer:
        async with trio.open_nursery() as nursery:
            server = DuplexServer(
                engine,
                scheduler,
                writer,
                nursery,
                policy=AliasedVoices(policy or engine.family, dict(voice_aliases))
                if voice_aliases
                else policy or engine.family,
                limits=limits or SessionLimits(),
                outbox_size=outbox_size,
                description=description,
                session_ids=session_ids,
            )
            server.voice_aliases = dict(voice_aliases or {})
            server.opus_workers = opus_workers
            if measure_frame_cpu:
                nursery.start_soon(server.measure_frame_cpu)
            if log_max_age_s is not None or log_max_bytes is not None:
                nursery.start_soon(
                    _retention, server, io, log_dir, log_max_age_s, log_max_bytes, retention_interval_s
                )
            try:
                yield server
            finally:
                with trio.CancelScope(shield=True):
                    await server.aclose()
                nursery.cancel_scope.cancel()
