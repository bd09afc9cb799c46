"""The app: ``hypercorn -k trio duplex_actors.app:app`` or ``duplex-actors serve``.

Entries, all the same guarded ASGI app (:func:`create_app`):

- ``hypercorn -k trio duplex_actors.app:app``: ``app`` is a :class:`LazyApp`. Importing this
  module reads no ``DUPLEX_*`` variable and patches nothing in hypercorn; the app is built on
  its first ASGI call (hypercorn's lifespan start-up). hypercorn looks ``app`` up with
  ``eval(name, vars(module))``, which a module ``__getattr__`` never sees, so the lazy object
  is what the module holds.
- ``hypercorn -k trio "duplex_actors.app:create_app()"``: hypercorn's factory form.
- ``duplex-actors serve``: ``create_app(config)`` with the config from its flags.

A bad ``DUPLEX_*`` value stops the process with one line naming the variable.

The app is a front end: the model, the slot table, admission and the batching live in the
engine core, another process (``engine_core.py``). ``duplex-actors serve`` starts the core and
its front ends and gives them its address (``engine_core``); under hypercorn the first worker
starts a core for the log dir (:func:`ensure_engine_core`) and every worker links to it. At
start-up the app links to the core, starts its duplex server over the link (session actors, log
writer, log retention) and turns ``/ready`` 200; ``/metrics`` and ``/ready`` report the whole
server (every front end's counters, the core's slots and steps).
The engine core reports each step of its start-up as a phase (``model/startup.py``); every
front end mirrors them (:attr:`ModelHolder.startup`): ``/ready`` shows the one under way,
``/health`` says ``loading``. A phase that fails ends the server with one line naming it
(:attr:`ModelHolder.on_fatal`); a hub that cannot be reached is retried inside the resolve phase.

Routes (the :data:`routes` blueprint): ``WS /v1/realtime`` (OpenAI Realtime projection;
``?duplex=1`` accepted, ``?model=`` checked, ``?autostart=0`` waits for the first message),
``WS /v1/duplex`` (native dialect), ``WS /api/chat`` (moshi / PersonaPlex binary Opus,
``web/api_chat.py``), ``GET /health``, ``GET /ready``, ``GET /v1/models``,
``GET /metrics`` and ``POST /v1/chat/completions`` (a clear 400: a lockstep model has no chat
completions); the browser page's routes come from ``web/page.py``. :class:`DuplexApp` serves
the three WebSocket routes straight from ASGI (``web/asgi_ws.py``: no quart task and queue hop
per message), with quart's behaviour kept; the bare quart app serves them through quart.

Scale-out (docs/scaling.md): ``agent_port`` answers HAProxy's agent checks; ``admission_refusal
= "http"`` reserves a slot at the handshake and refuses a full server's upgrade with HTTP 503 +
``Retry-After`` (a proxy can redispatch it), where the default refuses in-band (``error`` + 1013);
``log_upload`` ships every finished session log to S3. :meth:`ModelHolder.pause` (SIGUSR1 with
``duplex-actors serve``) stops admitting while the live sessions go on; :meth:`ModelHolder.resume`
(SIGUSR2) undoes it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio
from quart import Blueprint, Response, current_app, jsonify, websocket
from quart_trio import QuartTrio

from . import close_reasons, error_codes
from .admission import LogUnavailable, ResourceExhausted, SchedulerFailed
from .audio import SAMPLE_RATE
from .config import ConfigError, ServerConfig
from .core.link import (
    CoreEngine,
    CoreLink,
    CoreStartFailed,
    CoreUnavailable,
    connect_core,
    engine_core_address,
)
from .faults import Faults
from .metrics import Counters, FrontEndSnapshot, merge_snapshots, render
from .model.errors import ModelError
from .model.startup import FAILED, PhaseReport, StartupState
from .protocol import wire_events as pe
from .protocol.api_chat import KEY_PARAMS
from .protocol.errors import ProtocolError
from .scaleout.agent import agent_status, serve_agent
from .server import DuplexServer, SlotReservation, front_end_session_ids, open_linked_server
from .session.resume_token import fingerprint
from .web import auth
from .web.api_chat import PREPARE_TIMEOUT_S, ApiChatConnection, ApiChatDialect
from .web.asgi_ws import AsgiWebSocket, HttpReply, RenderedReply, serve_websocket
from .web.budget import RateLimits
from .web.connection import Connection, Transport, capabilities
from .web.dialects import (
    RESUME_TOKEN_HEADER,
    Dialect,
    NativeDialect,
    RealtimeDialect,
    WireMessage,
    read_opening,
    read_resume,
)
from .web.hardening import (
    GuardedApp,
    TransportLimits,
    default_max_connections,
    end_oversize_streams,
    guard_connections,
    install_unmask,
    open_connections,
    peer_error,
    raise_descriptor_limit,
    refuse_permessage_deflate,
    report_peer_error,
    send_many_in_one_write,
)
from .web.page import install_page_routes
from .web.resumable import ResumeSettings

# The response header of every WebSocket upgrade: the id of the session it opens or resumes.
SESSION_ID_HEADER = "X-Duplex-Session-Id"

API_CHAT_PATH = "/api/chat"

if TYPE_CHECKING:
    from .scaleout.upload import LogUploader

log = logging.getLogger("duplex_actors")

# After every session has closed, how long connections get to flush their last frames.
CONNECTION_GRACE_S = 0.5
WARMUP_FRAMES = 3
# The exit status of a server whose model cannot be served (no such model, a malformed file, not
# enough memory for the dtype): the same as a bad setting's.
FATAL_EXIT_CODE = 2
# /api/chat's derived prepare timeout: this many times the default prompt's prefill at start-up.
PREFILL_TIMEOUT_FACTOR = 4.0
CLOSE_LINGER_S = TransportLimits().close_linger_s
RETRY_AFTER_S = 1
# How long a front end waits for the engine core it started (or found starting) to answer:
# loading a 7B checkpoint and prefilling its default prompt takes minutes on a CPU.
CORE_START_TIMEOUT_S = 3600.0
# How long a front end of ``serve`` (whose core is up) may take to link before hypercorn serves.
CORE_LINK_TIMEOUT_S = 30.0


async def ensure_engine_core(config: ServerConfig) -> str:
    """The address of the engine core for ``config``'s log dir, started if none answers there
    (``python -m duplex_actors.engine_core``, in a session of its own, configured by the same
    ``DUPLEX_*`` variables): the first of hypercorn's workers starts it, the others find it.
    A lock file in the log dir makes the check and the start one step across workers."""
    import fcntl
    import subprocess

    address = engine_core_address(config.log_dir)
    log_dir = Path(config.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)

    def start_unless_running() -> None:
        with open(log_dir / ".engine-core-start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(address)
                return  # one answers (or is starting: it listens before it loads)
            except OSError:
                pass
            finally:
                probe.close()
            process = subprocess.Popen(
                [sys.executable, "-m", "duplex_actors.engine_core"],
                start_new_session=True,  # not ended by the signals hypercorn's group gets
                stdin=subprocess.DEVNULL,
                env={**os.environ, **config.as_env()},  # the core of this front end's settings
            )
            log.info("started the engine core (pid %d) for %s", process.pid, config.log_dir)
            # It binds its socket before it loads the model: hold the lock until then.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and process.poll() is None:
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    probe.connect(address)
                    return
                except OSError:
                    time.sleep(0.05)
                finally:
                    probe.close()
            if process.poll() is not None:
                raise CoreUnavailable(f"the engine core exited with code {process.returncode}")

    await trio.to_thread.run_sync(start_unless_running)
    return address


class ModelHolder:
    """The front end's link to the engine core and its duplex server once started, the open
    connections, drain state."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine: CoreEngine | None = None
        self.server: DuplexServer[CoreLink] | None = None
        self.link: CoreLink | None = None
        self.error: str | None = None
        self.loaded_at: float | None = None
        self.warmup_ms: float | None = None
        self.draining = False
        self.paused = False  # SIGUSR1: no new sessions, the live ones go on
        # (index, count) of this front end among those of one server: a session's id names
        # the front end that holds it, so a resume that lands on another is told so.
        self.frontend = (0, 1)
        self.uploader: LogUploader | None = None
        self.connections: set[Connection] = set()
        self._connections_changed = trio.Event()
        self.counters = Counters()
        self.faults = Faults.from_env()
        self.core_lost = trio.Event()  # the engine core's link closed (its sessions have ended)
        self._started = trio.Event()  # serving, or failed to start
        self.serving = trio.Event()  # linked to the core, and the duplex server is up
        # The engine core's start-up phases (model/startup.py), as it reports them: /ready, /health.
        self.startup = StartupState()
        # Called with one line when the model cannot be served (a phase failed before /ready):
        # the hypercorn entry ends the process with it (create_app()); None: /health reports it.
        self.on_fatal: Callable[[str], None] | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        """At the app's start-up: serve in ``nursery``; the agent responder too. A front end
        of ``serve`` (``engine_core`` is set) returns once linked and serving, or once the core
        says it is still loading: hypercorn accepts no connection a ready core could have had
        served, and answers ``/ready`` (with the phase) while the core loads."""
        nursery.start_soon(self._serve)
        cfg = self.config
        if cfg.engine_core is not None:
            with trio.move_on_after(CORE_LINK_TIMEOUT_S):
                await self._started.wait()
        if cfg.agent_port is not None:
            await nursery.start(serve_agent, lambda: agent_status(self), cfg.agent_port, cfg.agent_host)
            log.info("HAProxy agent-check responder on %s:%d", cfg.agent_host, cfg.agent_port)

    async def _serve(self) -> None:
        try:
            await self.run()
        except Exception as exc:  # reported by /health and /ready
            if self.loaded_at is not None:
                log.exception("serving model %s failed", self.config.model)
                self.error = f"{type(exc).__name__}: {exc}"
            else:
                self._failed_to_start(exc)
        finally:
            self.engine = self.server = None
            self._started.set()

    def _core_phase(self, report: PhaseReport) -> None:
        """A start-up phase of the engine core, while it loads: mirrored for /ready, and
        hypercorn may serve from now on (its /ready says how far the core is)."""
        self.startup.record(report)
        self._started.set()

    def _failed_to_start(self, exc: Exception) -> None:
        """A phase failed before the server was ready: nothing will heal it (a checkpoint that
        cannot be fetched now is retried inside the resolve phase and never gets here)."""
        current = self.startup.current
        phase = current.name if current is not None and current.state == FAILED else "server start-up"
        if not isinstance(exc, ModelError | OSError | CoreStartFailed):
            log.error("the %s phase failed", phase, exc_info=exc)  # a bug: its traceback helps
        self.error = f"{phase}: {type(exc).__name__}: {exc}"
        line = (
            exc.line
            if isinstance(exc, CoreStartFailed)
            else f"cannot serve {self.config.model}: the {phase} phase failed: {exc}"
        )
        if self.on_fatal is not None:
            self.on_fatal(" ".join(line.split()))
        else:
            log.error("%s", line)

    async def run(self) -> None:
        """Link to the engine core, serve until cancelled or the core is gone; /ready is 200
        in between."""
        from .model.voices import voice_alias_table
        from .session.core import SessionLimits

        cfg = self.config
        # Checked before the model loads: a bad limit must not cost a 7B load first.
        limits = SessionLimits(
            max_buffered_samples=cfg.input_buffer_bytes // 4,
            input_budget_samples=min(
                max(1, round(cfg.input_budget_s * SAMPLE_RATE)), cfg.input_buffer_bytes // 4
            ),
            max_pad_samples=cfg.max_align_pad_ms * SAMPLE_RATE // 1000,
        )
        if self.faults.active:
            self.faults.install_log_faults()
        address = cfg.engine_core or await ensure_engine_core(cfg)
        link = await connect_core(address, timeout_s=CORE_START_TIMEOUT_S, on_phase=self._core_phase)
        if link.engine.description.model_id != cfg.model:
            await link.aclose()
            raise CoreUnavailable(
                f"the engine core at this log dir serves {link.engine.description.model_id!r}, "
                f"not {cfg.model!r}: another server uses {cfg.log_dir}"
            )
        link.on_gather = self.snapshot
        self.warmup_ms = link.hello.warmup_ms
        for report in link.hello.phases:
            self.startup.record(report)
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            async with open_linked_server(
                link,
                log_dir=cfg.log_dir,
                log_max_age_s=cfg.log_max_age_s,
                log_max_bytes=cfg.log_max_bytes,
                log_probe_interval_s=cfg.log_probe_interval_s,
                log_commit_linger_s=cfg.log_commit_linger_s,
                limits=limits,
                outbox_size=cfg.outbox_events,
                opus_workers=cfg.opus_workers,
                voice_aliases=voice_alias_table(link.engine.family.voices, cfg.voice_aliases),
                session_ids=front_end_session_ids(*self.frontend),
            ) as server:
                server.counters = self.counters
                if cfg.log_upload:
                    await nursery.start(self._upload_logs, server)
                self.link, self.engine, self.server = link, link.engine, server
                self._apply_admission()
                self.loaded_at = time.time()
                self._started.set()
                self.serving.set()
                await link.closed.wait()
                self.error = str(link.failed)
                log.error("%s: this front end takes no more sessions", self.error)
                await server.wait_no_sessions()
            nursery.cancel_scope.cancel()
        self.core_lost.set()

    def snapshot(self) -> FrontEndSnapshot:
        """This front end's counters and gauges, for the whole server's /metrics."""
        server = self.server
        return FrontEndSnapshot(
            counters=self.counters,
            writer=server.writer.statistics() if server is not None else None,
            sessions_active=len(server.sessions) if server is not None else 0,
            dialects_active=dict(Counter(server.session_dialects.values())) if server is not None else {},
            recovered_logs=len(server.recovered_logs) if server is not None else 0,
            uploader=self.uploader.statistics() if self.uploader is not None else None,
            opus=server.opus_pool.stats() if server is not None and server.opus_pool is not None else None,
            tcp_connections=open_connections(),
        )

    async def _upload_logs(
        self, server: DuplexServer[Any], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        from .scaleout.s3 import parse_s3_url
        from .scaleout.upload import LogUploader

        cfg = self.config
        assert cfg.log_upload is not None
        uploader = LogUploader(
            parse_s3_url(cfg.log_upload),
            cfg.log_dir,
            endpoint_url=cfg.s3_endpoint_url,
            is_open=lambda session_id: session_id in server.sessions or session_id in server.opening,
        )
        server.on_log_finished.append(uploader.submit)
        found = uploader.scan()  # logs an earlier run left (start-up recovery is done)
        if found:
            log.info("uploading %d session logs left by an earlier run to %s", found, cfg.log_upload)
        self.uploader = uploader
        await uploader.run(task_status=task_status)

    def _apply_admission(self) -> None:
        server = self.server
        if server is None:
            return
        if self.draining:
            server.accepting = False
            server.not_accepting_reason = "the server is shutting down"
        elif self.paused:
            server.accepting = False
            server.not_accepting_reason = "the server is draining: it takes no new sessions"
        else:
            server.accepting = True

    def pause(self) -> None:
        """Stop admitting new sessions (``/ready`` 503, agent ``drain``); live sessions go on."""
        self.paused = True
        self._apply_admission()

    def resume(self) -> bool:
        """Undo :meth:`pause` (not a shutdown drain); False if draining."""
        if self.draining:
            return False
        self.paused = False
        self._apply_admission()
        return True

    def prepare_timeout(self) -> tuple[float, str]:
        """How long an /api/chat handshake waits for its prompt's prefill, and where that
        figure comes from (said in the error when it is hit)."""
        setting = self.config.prepare_timeout_s
        if setting is not None:
            return setting, "--prepare-timeout / DUPLEX_PREPARE_TIMEOUT"
        measured = self.startup.duration("prefill")
        if measured is not None and PREFILL_TIMEOUT_FACTOR * measured > PREPARE_TIMEOUT_S:
            return (
                PREFILL_TIMEOUT_FACTOR * measured,
                f"{PREFILL_TIMEOUT_FACTOR:g} times the default prompt's {measured:.1f} s prefill at "
                "start-up; --prepare-timeout sets it",
            )
        return PREPARE_TIMEOUT_S, "the default; --prepare-timeout sets it"

    def add_connection(self, conn: Connection) -> None:
        self.connections.add(conn)

    def discard_connection(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._connections_changed.set()
        self._connections_changed = trio.Event()

    def count_connection_error(self, kind: str) -> None:
        self.counters.connection_errors[kind] += 1

    def count_dropped(self, reason: str) -> None:
        self.counters.connections_dropped[reason] += 1

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Stop admitting (``/ready`` 503), close every session with ``session.closing`` and 1012,
        wait for their logs, and for their uploads with ``--log-upload`` (at most ``timeout_s``)."""
        self.draining = True
        self._apply_admission()
        for conn in list(self.connections):
            conn.drain()
        if self.server is not None:
            # A detached session has no connection to be told: it closes now, not at its grace.
            for detached in [rs for rs in self.server.resumable.values() if not rs.attached]:
                self.server.start_soon(detached.handle.close, close_reasons.SERVER_SHUTDOWN)
        with trio.move_on_after(timeout_s):
            # Sessions (and their logs) first: a connection whose client stopped reading can
            # stay blocked in a send for as long as TCP allows, so it only gets a short grace.
            if self.server is not None:
                await self.server.wait_no_sessions()
            with trio.move_on_after(CONNECTION_GRACE_S):
                while self.connections:
                    await self._connections_changed.wait()
            # Then their TCP closes: each reads and drops its client's input until the client's
            # EOF (a bounded linger); exiting before would reset them over their close frames.
            with trio.move_on_after(CLOSE_LINGER_S):
                while open_connections() > 0:
                    await trio.sleep(0.01)
            if self.uploader is not None:
                await self.uploader.wait_idle()


# -- routes ---------------------------------------------------------------------------------------
routes = Blueprint("duplex", __name__)


def _holder() -> ModelHolder:
    holder: ModelHolder = current_app.extensions["duplex_model"]
    return holder


@routes.get("/health")
async def health() -> Any:
    """200 ``healthy``, 200 ``loading`` (alive, starting: ``/ready`` says how far), or 503
    ``unhealthy`` (the model failed, or its scheduler)."""
    holder = _holder()
    link = holder.link
    failed = holder.error or (link.status.failed if link is not None else None)
    if failed:
        return jsonify({"status": "unhealthy", "error": failed}), 503
    if holder.loaded_at is None:
        current = holder.startup.current
        return jsonify({"status": "loading", "phase": current.name if current is not None else None})
    return jsonify({"status": "healthy"})


@routes.get("/ready")
async def ready() -> Any:
    holder = _holder()
    model = holder.config.model
    engine, server, link = holder.engine, holder.server, holder.link
    draining = holder.draining or holder.paused
    core_failed = link.status.failed if link is not None else None
    if (
        engine is None
        or server is None
        or link is None
        or draining
        or core_failed
        or not server.writer.healthy
    ):
        body: dict[str, Any] = {"ready": False, "model": model, "draining": draining}
        if holder.loaded_at is None:
            body["loading"] = True
            body.update(holder.startup.as_json())
        if holder.error or core_failed:
            body["error"] = holder.error or f"the model scheduler failed: {core_failed}"
        if server is not None and not server.writer.healthy:
            body["error"] = "a session log could not be written"
        return jsonify(body), 503
    return jsonify(
        {
            "ready": True,
            "model": model,
            "family": engine.family.name,
            "slots_total": engine.slots,
            "slots_free": link.slots_free,
            "warmup_ms": round(holder.warmup_ms or 0, 1),
            "phases_done_s": holder.startup.as_json()["phases_done_s"],
        }
    )


@routes.get("/v1/models")
async def models() -> Any:
    holder = _holder()
    created = int(holder.loaded_at or time.time())
    return jsonify(
        {
            "object": "list",
            "data": [
                {
                    "id": holder.config.model,
                    "object": "model",
                    "created": created,
                    "owned_by": "duplex-actors",
                }
            ],
        }
    )


@routes.get("/metrics")
async def metrics() -> Any:
    holder = _holder()
    link = holder.link
    if link is None or link.failed is not None:
        text = render(holder.snapshot())
    else:
        core = await link.metrics()
        snapshots = list(core.snapshots) or [holder.snapshot()]
        merged = merge_snapshots(snapshots)
        merged = attrs.evolve(merged, recovered_logs=merged.recovered_logs + core.recovered_logs)
        text = render(merged, core.statistics, core.step_failures)
    return Response(text, content_type="text/plain; version=0.0.4; charset=utf-8")


@routes.post("/v1/chat/completions")
async def chat_completions() -> Any:
    model = _holder().config.model
    return jsonify(
        {
            "error": {
                "type": "invalid_request_error",
                "code": "unsupported_endpoint",
                "message": (
                    f"{model} is a full-duplex speech model that listens and speaks in "
                    "lockstep (80 ms in, 80 ms out); it has no chat completions. Open a "
                    "WebSocket to /v1/realtime?duplex=1 (OpenAI Realtime) or /v1/duplex."
                ),
                "param": None,
            }
        }
    ), 400


class _QuartUpgrade:
    """What a WebSocket route needs of its upgrade, from quart's ``websocket`` (the bare quart
    app of :func:`create_quart_app`; ``DuplexApp`` serves these routes through
    :class:`~duplex_actors.web.asgi_ws.AsgiWebSocket` instead)."""

    def __init__(self) -> None:
        self.headers = {k.lower(): v for k, v in websocket.headers.items()}
        self.subprotocols = list(websocket.requested_subprotocols)
        self.args: Mapping[str, str] = websocket.args
        self.scope: Mapping[str, Any] = websocket.scope
        self.receive = websocket.receive
        self.send = websocket.send

    async def accept(self, subprotocol: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        await websocket.accept(headers=dict(headers or {}), subprotocol=subprotocol)

    async def close(self, code: int, reason: str = "") -> None:
        await websocket.close(code, reason)

    async def send_many(self, messages: list[str | bytes]) -> None:
        for message in messages:
            await websocket.send(message)


class Upgrade(Protocol):
    """A WebSocket upgrade as the routes use it (:class:`AsgiWebSocket` or quart's)."""

    headers: dict[str, str]
    subprotocols: list[str]
    args: Mapping[str, str]
    scope: Mapping[str, Any]

    async def accept(
        self, subprotocol: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None: ...
    async def receive(self) -> WireMessage: ...
    async def send(self, data: str | bytes) -> None: ...
    async def send_many(self, messages: list[str | bytes]) -> None: ...
    async def close(self, code: int, reason: str = "") -> None: ...


def _quart_reply(reply: HttpReply | None) -> Any:
    if reply is None:
        return None
    return jsonify(reply.body), reply.status, reply.headers


@routes.websocket("/v1/realtime")
async def realtime_ws() -> Any:
    return _quart_reply(await _websocket(_holder(), _QuartUpgrade(), "realtime"))


@routes.websocket("/v1/duplex")
async def native_ws() -> Any:
    return _quart_reply(await _websocket(_holder(), _QuartUpgrade(), "native"))


@routes.websocket(API_CHAT_PATH)
async def api_chat_ws() -> Any:
    return _quart_reply(await _websocket(_holder(), _QuartUpgrade(), "api_chat"))


# The routes DuplexApp serves without quart (path -> dialect).
WEBSOCKET_ROUTES = {"/v1/realtime": "realtime", "/v1/duplex": "native", API_CHAT_PATH: "api_chat"}


def _refuse_http(holder: ModelHolder, code: str, message: str, *, retry: bool = True) -> HttpReply:
    holder.counters.refused[code] += 1
    kind = "rate_limit_error" if code == error_codes.RESOURCE_EXHAUSTED else "server_error"
    body = {"error": {"type": kind, "code": code, "message": message}}
    if retry:
        return HttpReply(503, body, {"Retry-After": str(RETRY_AFTER_S)})
    return HttpReply(503, body)


async def _websocket(holder: ModelHolder, ws: Upgrade, dialect_name: str) -> HttpReply | None:
    """Authenticate and admit before the upgrade (HTTP refusals), then run the connection."""
    config = holder.config
    headers = ws.headers
    subprotocols = ws.subprotocols
    query_key: str | None = None
    if dialect_name == "api_chat":
        # Taken out of the query string by DuplexApp (so no log sees it); the bare quart app
        # (tests) still has it in the query.
        taken = ws.scope.get(auth.QUERY_KEY_SCOPE)
        query_key = str(taken) if taken else next((ws.args[k] for k in KEY_PARAMS if ws.args.get(k)), None)
    refusal = auth.check(
        api_key=config.api_key,
        allowed_origins=config.allowed_origins,
        headers=headers,
        subprotocols=subprotocols,
        query_key=query_key,
    )
    if refusal is not None:
        holder.counters.refused[refusal.code] += 1
        body = {"error": {"type": "invalid_request_error", "code": refusal.code, "message": refusal.message}}
        return HttpReply(refusal.status, body)
    server = holder.server
    http_refusal = config.admission_refusal == "http"
    if server is None or holder.draining:
        return _refuse_http(holder, "not_ready", "the server is not ready", retry=http_refusal)
    resuming = dialect_name != "api_chat" and bool(ws.args.get("session_id"))
    reservation: SlotReservation | None = None
    if http_refusal and not resuming:  # a resume takes no new slot: its session holds one
        # Reserve the slot before the upgrade: refused here, a proxy can try another server.
        if holder.paused:
            return _refuse_http(holder, "draining", "the server is draining: it takes no new sessions")
        try:
            reservation = await server.reserve()
        except (ResourceExhausted, LogUnavailable, SchedulerFailed) as exc:
            return _refuse_http(holder, exc.code, str(exc))
    try:
        dialect = _dialect(dialect_name, config, server.engine.slots, headers, subprotocols, ws.args)
        await _run_connection(holder, server, dialect, reservation, ws, resuming=resuming)
    finally:
        if reservation is not None:
            reservation.release()  # no-op once the session took it
    return None


def _dialect(
    name: str,
    config: ServerConfig,
    slots: int,
    headers: dict[str, str],
    subprotocols: list[str],
    args: Mapping[str, str],
) -> Dialect:
    resume = config.resume_grace_s > 0
    if name == "realtime":
        return RealtimeDialect(
            model=config.model,
            capabilities=capabilities(slots, resume=resume),
            beta="realtime=v1" in headers.get("openai-beta", "") or auth.BETA_SUBPROTOCOL in subprotocols,
            autostart=args.get("autostart", "1") != "0",
            duplex=args.get("duplex", "0") not in ("0", "", "false"),
            max_message_bytes=config.max_message_bytes,
        )
    if name == "api_chat":
        return ApiChatDialect(args)  # type: ignore[return-value]  # a binary shell
    return NativeDialect(
        capabilities=capabilities(slots, resume=resume), max_message_bytes=config.max_message_bytes
    )


async def _run_connection(
    holder: ModelHolder,
    server: DuplexServer[Any],
    dialect: Dialect,
    reservation: SlotReservation | None,
    ws: Upgrade,
    *,
    resuming: bool = False,
) -> None:
    # The session's id is made before the upgrade and sent on it, so that a proxy can learn
    # where the session lives (docs/scaling.md: a resume is routed by it).
    session_id = ws.args.get("session_id", "") if resuming else server.new_session_id()
    await ws.accept(auth.chosen_subprotocol(ws.subprotocols), {SESSION_ID_HEADER: session_id})
    raw = ws if isinstance(ws, AsgiWebSocket) else None  # quart's has no sends without an await
    transport = Transport(
        ws.receive,
        ws.send,
        ws.close,
        ws.send_many,
        lambda: getattr(ws, "disconnect_code", None),
        send_now=raw.send_now if raw is not None else None,
        flush=raw.flush if raw is not None else None,
        receive_directly=raw.receive_directly if raw is not None else None,
    )
    rate_limits = RateLimits(
        messages_per_s=holder.config.max_messages_per_s,
        message_burst=holder.config.message_burst,
        bytes_per_s=holder.config.max_bytes_per_s,
        byte_burst=holder.config.byte_burst,
        persist_s=holder.config.rate_limit_after_s,
    )
    extra: dict[str, Any] = {}
    kind: type[Connection] = Connection
    if isinstance(dialect, ApiChatDialect):
        kind = ApiChatConnection
        extra["prepare_timeout_s"], extra["prepare_timeout_source"] = holder.prepare_timeout()
    conn: Connection = kind(
        server,
        transport,
        dialect=dialect,
        **extra,
        idle_timeout_s=holder.config.idle_timeout_s,
        counters=holder.counters,
        faults=holder.faults,
        reservation=reservation,
        rate_limits=rate_limits,
        resume=ResumeSettings(
            grace_s=holder.config.resume_grace_s,
            journal_bytes=holder.config.resume_journal_bytes,
            max_backlog_s=holder.config.resume_max_backlog_s,
        ),
        key_fingerprint=fingerprint(auth.offered_key(ws.headers, ws.subprotocols)),
        session_id=None if resuming else session_id,
    )
    holder.add_connection(conn)
    try:
        if resuming:
            await _resume(conn, dialect, ws, holder.frontend)
        else:
            await _open_and_run(conn, dialect, holder.config.model, server, holder.config, ws)
    except Exception as exc:
        error = peer_error(exc)
        if error is not None:  # the socket is broken: nothing more can be said on it
            if report_peer_error(ws.scope.get("path", "websocket"), error):
                holder.counters.connection_errors[type(error).__name__] += 1
            return
        log.exception("connection failed")
        holder.counters.connection_errors["handler"] += 1
        with trio.CancelScope(shield=True):
            try:
                await conn.refuse(error_codes.INTERNAL_ERROR, "the server failed on this connection", 1011)
            except Exception:
                pass
    finally:
        holder.discard_connection(conn)


async def _open_and_run(
    conn: Connection,
    dialect: Dialect,
    model: str,
    server: DuplexServer[Any],
    config: ServerConfig,
    ws: Upgrade,
) -> None:
    if isinstance(dialect, ApiChatDialect):
        try:
            opening = dialect.opening(server.engine.family, client_sampling=config.client_sampling)
        except ProtocolError as err:
            await conn.refuse(err.code, err.message, 1008)
            return
        await conn.run(opening)
        return
    if dialect.name == "realtime":
        wanted = ws.args.get("model")
        if wanted and wanted != model:
            await conn.refuse(
                error_codes.MODEL_NOT_FOUND, f"this server serves {model!r}, not {wanted!r}", 1008
            )
            return
    try:
        opening = await read_opening(dialect, ws.receive)
    except ProtocolError as err:
        await conn.refuse(err.code, err.message, 1008, err.client_event_id)
        return
    if dialect.name == "realtime" and ws.args.get("resume", "0") not in ("0", "", "false"):
        if not getattr(dialect, "duplex", False):
            await conn.refuse(
                error_codes.UNSUPPORTED_SESSION_RESUME,
                "resume needs the duplex extensions: add ?duplex=1",
                1008,
            )
            return
        opening = attrs.evolve(opening, resume=True)
    if opening.resume and conn.resume_settings.grace_s <= 0:
        await conn.refuse(
            error_codes.UNSUPPORTED_SESSION_RESUME,
            "this server does not resume sessions (--resume-grace-s 0)",
            1008,
        )
        return
    await conn.run(opening)


async def _resume(conn: Connection, dialect: Dialect, ws: Upgrade, frontend: tuple[int, int]) -> None:
    """A connection whose URL names a session (``?session_id=``): it resumes that session with
    the token of the ``X-Duplex-Resume-Token`` header (cursor ``?last_seq=``) or of its first
    message, ``session.resume``; it never opens one."""
    session_id = ws.args.get("session_id", "")
    if conn.resume_settings.grace_s <= 0:
        await conn.refuse(
            error_codes.UNSUPPORTED_SESSION_RESUME,
            "this server does not resume sessions (--resume-grace-s 0)",
            1008,
        )
        return
    token = ws.headers.get(RESUME_TOKEN_HEADER)
    try:
        if token:
            last_seq = ws.args.get("last_seq", "0")
            if not last_seq.isdigit():
                raise ProtocolError(
                    error_codes.INVALID_SESSION_RESUME, "last_seq must be a non-negative integer"
                )
            request = pe.SessionResume(session_id, token, int(last_seq))
        else:
            request = await read_resume(dialect, ws.receive)
    except ProtocolError as err:
        await conn.refuse(err.code, err.message, 1008, err.client_event_id)
        return
    if request.session_id != session_id:
        await conn.refuse(
            error_codes.INVALID_SESSION_RESUME,
            "session.resume names another session than the URL's session_id",
            1008,
            request.event_id,
        )
        return
    await conn.resume(request)


# -- the app ----------------------------------------------------------------------------------------
def create_quart_app(config: ServerConfig) -> QuartTrio:
    """The bare QuartTrio app, without the per-connection guard of :func:`create_app` (for
    quart's test client); patches nothing."""
    app = QuartTrio("duplex_actors")
    app.config["MAX_CONTENT_LENGTH"] = 1 << 20
    holder = ModelHolder(config)
    app.extensions["duplex_model"] = holder
    app.register_blueprint(routes)
    install_page_routes(app, holder, config)

    @app.before_serving
    async def start() -> None:
        await holder.start(app.nursery)

    return app


class DuplexApp(GuardedApp):
    """The guarded ASGI app, with its :class:`ModelHolder` (drain, pause) and Quart app."""

    def __init__(self, quart_app: QuartTrio, holder: ModelHolder) -> None:
        super().__init__(quart_app, holder.count_connection_error)
        self.quart_app = quart_app
        self.holder = holder

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # The /api/chat key may come in the query (browsers set no headers): out of the URL
        # before anything, hypercorn's access log included, can see it.
        auth.take_query_key(scope, API_CHAT_PATH, KEY_PARAMS)
        await super().__call__(scope, receive, send)

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # The WebSocket routes without quart (web/asgi_ws.py: a task and a queue hop less per
        # message); everything else, and any root_path, through quart.
        name = WEBSOCKET_ROUTES.get(scope.get("path", "")) if scope["type"] == "websocket" else None
        if name is None or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        holder = self.holder

        async def handler(ws: Any) -> HttpReply | None:
            return await _websocket(holder, ws, name)

        await serve_websocket(scope, receive, send, handler, self._render)

    async def _render(self, reply: HttpReply) -> RenderedReply:
        """The refusal as quart builds it (``jsonify(body), status, headers``)."""
        response: Response = self.quart_app.json.response(reply.body)  # type: ignore[assignment]
        response.status_code = reply.status
        response.headers.update(reply.headers)
        headers = [(key.lower().encode(), value.encode()) for key, value in response.headers.items()]
        chunks: list[bytes] = []
        async with response.response as body:
            async for data in body:
                chunks.append(data)
        return RenderedReply(reply.status, headers, chunks)


def create_app(config: ServerConfig | None = None) -> DuplexApp:
    """The app hypercorn serves (``duplex_actors.app:create_app()``), guarded per connection,
    with hypercorn's hardening applied (process-wide, idempotent).

    Without ``config`` it reads the ``DUPLEX_*`` variables, and a bad one exits (SystemExit)
    with one line naming it: this is the process's entry. With ``config`` a bad setting raises
    :class:`~duplex_actors.config.ConfigError`.
    """
    if config is None:
        try:
            app = _guarded(ServerConfig.from_env())
        except ConfigError as exc:
            raise SystemExit(f"duplex-actors: {exc}") from None
        app.holder.on_fatal = exit_process
        return app
    return _guarded(config)


def exit_process(line: str) -> None:
    """The hypercorn entry's end when the model cannot be served: hypercorn has no way to be
    told to exit non-zero, so the process ends here (nothing is being served yet; an engine
    process sees its parent go and ends too)."""
    print(f"duplex-actors: {line}", file=sys.stderr, flush=True)
    os._exit(FATAL_EXIT_CODE)


def _guarded(config: ServerConfig) -> DuplexApp:
    quart_app = create_quart_app(config)
    holder: ModelHolder = quart_app.extensions["duplex_model"]
    refuse_permessage_deflate()
    end_oversize_streams()
    install_unmask()
    send_many_in_one_write()
    max_connections = config.max_connections
    if max_connections is None:
        max_connections = default_max_connections(raise_descriptor_limit(), config.max_sessions)
    limits = TransportLimits(
        body_timeout_s=config.body_timeout_s,
        keep_alive_timeout_s=config.keep_alive_timeout_s,
        max_connections=max_connections,
    )
    guard_connections(holder.count_connection_error, limits=limits, on_dropped=holder.count_dropped)
    log.info(
        "transport: at most %d connections, request bodies within %.1f s, keep-alive %s s",
        max_connections,
        config.body_timeout_s,
        config.keep_alive_timeout_s or "hypercorn's",
    )
    return DuplexApp(quart_app, holder)


class LazyApp:
    """``duplex_actors.app:app``: builds ``factory()`` on its first ASGI call."""

    def __init__(self, factory: Callable[[], DuplexApp]) -> None:
        self._factory = factory
        self._app: DuplexApp | None = None

    @property
    def loaded(self) -> bool:
        return self._app is not None

    def load(self) -> DuplexApp:
        if self._app is None:
            self._app = self._factory()
        return self._app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            app = self.load()
        except SystemExit as exc:
            # A bad DUPLEX_* value. Raised here, inside hypercorn's trio worker, it would end in
            # an exception-group traceback and exit status 0: say it in one line and stop.
            print(exc.code, file=sys.stderr, flush=True)
            os._exit(2)
        await app(scope, receive, send)


app = LazyApp(create_app)
