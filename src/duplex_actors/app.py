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

At start-up it loads the model in a worker thread, starts the in-process duplex server
(scheduler actor, log writer, log retention) and warms it up with one silent session through
the real path before ``/ready`` turns 200.

Routes (the :data:`routes` blueprint): ``WS /v1/realtime`` (OpenAI Realtime projection;
``?duplex=1`` accepted, ``?model=`` checked, ``?autostart=0`` waits for the first message),
``WS /v1/duplex`` (native dialect), ``WS /api/chat`` (moshi / PersonaPlex binary Opus,
``web/api_chat.py``), ``GET /health``, ``GET /ready``, ``GET /v1/models``,
``GET /metrics`` and ``POST /v1/chat/completions`` (a clear 400: a lockstep model has no chat
completions); the browser page's routes come from ``web/page.py``. :class:`DuplexApp` serves
the three WebSocket routes straight from ASGI (``web/asgi_ws.py``: no quart task and queue hop
per message), with what quart did kept; the bare quart app serves them through quart.

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
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import trio
from quart import Blueprint, Response, current_app, jsonify, websocket
from quart_trio import QuartTrio

from .audio import FRAME_SAMPLES, SAMPLE_RATE
from .config import ConfigError, ServerConfig
from .faults import Faults, FaultyEngine
from .metrics import Counters, render
from .model.engine import ModelEngine
from .protocol.api_chat import KEY_PARAMS
from .protocol.errors import ProtocolError
from .scaleout.agent import agent_status, serve_agent
from .scheduler.actor import SchedulerFailed
from .server import DuplexServer, LogUnavailable, ResourceExhausted, SlotReservation
from .web import auth
from .web.api_chat import ApiChatConnection, ApiChatDialect
from .web.asgi_ws import HttpReply, RenderedReply, serve_websocket
from .web.budget import RateLimits
from .web.connection import Connection, Transport, capabilities
from .web.dialects import Dialect, NativeDialect, RealtimeDialect, WireMessage, read_opening
from .web.hardening import (
    GuardedApp,
    TransportLimits,
    default_max_connections,
    end_oversize_streams,
    guard_connections,
    open_connections,
    raise_descriptor_limit,
    refuse_permessage_deflate,
)
from .web.page import install_page_routes

API_CHAT_PATH = "/api/chat"

if TYPE_CHECKING:
    from .model.process import EngineProcess
    from .scaleout.upload import LogUploader

log = logging.getLogger("duplex_actors")

# After every session has closed, how long connections get to flush their last frames.
CONNECTION_GRACE_S = 0.5
CLOSE_LINGER_S = TransportLimits().close_linger_s
RETRY_AFTER_S = 1


class ModelHolder:
    """The engine and the in-process server once started, the open connections, drain state."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine: ModelEngine | None = None
        self.server: DuplexServer | None = None
        self.error: str | None = None
        self.loaded_at: float | None = None
        self.warmup_ms: float | None = None
        self.draining = False
        self.paused = False  # SIGUSR1: no new sessions, the live ones go on
        self.uploader: LogUploader | None = None
        self.connections: set[Connection] = set()
        self._connections_changed = trio.Event()
        self.counters = Counters()
        self.faults = Faults.from_env()
        self.engine_process: EngineProcess | None = None  # --engine-process: closed at exit

    def load(self) -> ModelEngine:
        cfg = self.config
        kwargs: dict[str, Any] = dict(
            slots=cfg.max_sessions,
            device=cfg.device,
            family=cfg.family,
            revision=cfg.revision,
            torch_threads=cfg.torch_threads,
            context_policy=cfg.context_policy,
            pin_max=cfg.max_pinned_prompt,
        )
        engine: ModelEngine
        if cfg.engine_process:
            from .model.process import EngineProcess

            engine = self.engine_process = EngineProcess(cfg.model, **kwargs)
        else:
            from .model.factory import open_engine

            engine = open_engine(cfg.model, **kwargs)
        if self.faults.active:
            log.warning("DUPLEX_FAULTS is set: faults will be injected (%s)", self.faults)
            self.faults.install_log_faults()
            return FaultyEngine(engine, self.faults)
        return engine

    async def start(self, nursery: trio.Nursery) -> None:
        """At the app's start-up: serve the model in ``nursery``; the agent responder too."""
        nursery.start_soon(self._serve)
        cfg = self.config
        if cfg.agent_port is not None:
            await nursery.start(serve_agent, lambda: agent_status(self), cfg.agent_port, cfg.agent_host)
            log.info("HAProxy agent-check responder on %s:%d", cfg.agent_host, cfg.agent_port)

    async def _serve(self) -> None:
        try:
            await self.run()
        except Exception as exc:  # reported by /health and /ready
            log.exception("serving model %s failed", self.config.model)
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.engine = self.server = None
            await self.close_engine()

    async def close_engine(self) -> None:
        """End the engine's child process (``--engine-process``) once the server is done."""
        process, self.engine_process = self.engine_process, None
        if process is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(process.close)

    async def run(self) -> None:
        """Load, serve the in-process server until cancelled; /ready is 200 in between."""
        from .server import open_duplex_server
        from .session.core import SessionLimits
        from .session.events import AudioFrame

        cfg = self.config
        engine = await trio.to_thread.run_sync(self.load)
        async with (
            open_duplex_server(
                engine,
                log_dir=cfg.log_dir,
                log_max_age_s=cfg.log_max_age_s,
                log_max_bytes=cfg.log_max_bytes,
                log_probe_interval_s=cfg.log_probe_interval_s,
                limits=SessionLimits(
                    max_buffered_samples=cfg.input_buffer_bytes // 4,
                    input_budget_samples=min(
                        max(1, round(cfg.input_budget_s * SAMPLE_RATE)), cfg.input_buffer_bytes // 4
                    ),
                    max_pad_samples=cfg.max_align_pad_ms * SAMPLE_RATE // 1000,
                ),
                outbox_size=cfg.outbox_events,
                tick_policy=cfg.tick_policy,
                opus_workers=cfg.opus_workers,
            ) as server,
            trio.open_nursery() as nursery,
        ):
            server.counters = self.counters
            if cfg.log_upload:
                await nursery.start(self._upload_logs, server)
            started = time.perf_counter()
            warmup = await server.open_session({}, dialect="warmup")
            for _ in range(3):
                await warmup.append(np.zeros(FRAME_SAMPLES, dtype=np.float32))
            frames = 0
            async for event in warmup.events():
                frames += isinstance(event, AudioFrame)
                if frames == 3:
                    break
            await warmup.close()
            self.warmup_ms = (time.perf_counter() - started) * 1000
            self.engine, self.server = engine, server
            self._apply_admission()
            self.loaded_at = time.time()
            await trio.sleep_forever()

    async def _upload_logs(
        self, server: DuplexServer, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
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
    holder = _holder()
    failed = holder.error or (holder.server is not None and holder.server.scheduler.failed is not None)
    if failed:
        return jsonify({"status": "unhealthy", "error": holder.error or "the model scheduler failed"}), 503
    return jsonify({"status": "healthy"})


@routes.get("/ready")
async def ready() -> Any:
    holder = _holder()
    model = holder.config.model
    engine, server = holder.engine, holder.server
    draining = holder.draining or holder.paused
    if engine is None or server is None or draining or not server.writer.healthy:
        body: dict[str, Any] = {"ready": False, "model": model, "draining": draining}
        if holder.error:
            body["error"] = holder.error
        if server is not None and not server.writer.healthy:
            body["error"] = "a session log could not be written"
        return jsonify(body), 503
    return jsonify(
        {
            "ready": True,
            "model": model,
            "family": engine.family.name,
            "slots_total": engine.slots,
            "slots_free": server.scheduler.table.free,
            "warmup_ms": round(holder.warmup_ms or 0, 1),
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
    server = holder.server
    text = render(
        counters=holder.counters,
        scheduler=server.scheduler if server is not None else None,
        writer=server.writer if server is not None else None,
        sessions_active=len(server.sessions) if server is not None else 0,
        dialects_active=Counter(server.session_dialects.values()) if server is not None else None,
        recovered_logs=len(server.recovered_logs) if server is not None else 0,
        uploader=holder.uploader,
        opus=server.opus_pool.stats() if server is not None and server.opus_pool is not None else None,
        tcp_connections=open_connections(),
    )
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

    async def accept(self, subprotocol: str | None = None) -> None:
        await websocket.accept(subprotocol=subprotocol)

    async def close(self, code: int, reason: str = "") -> None:
        await websocket.close(code, reason)


class Upgrade(Protocol):
    """A WebSocket upgrade as the routes use it (:class:`AsgiWebSocket` or quart's)."""

    headers: dict[str, str]
    subprotocols: list[str]
    args: Mapping[str, str]
    scope: Mapping[str, Any]

    async def accept(self, subprotocol: str | None = None) -> None: ...
    async def receive(self) -> WireMessage: ...
    async def send(self, data: str | bytes) -> None: ...
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
    kind = "rate_limit_error" if code == "resource_exhausted" else "server_error"
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
    reservation: SlotReservation | None = None
    if http_refusal:
        # Reserve the slot before the upgrade: refused here, a proxy can try another server.
        if holder.paused:
            return _refuse_http(holder, "draining", "the server is draining: it takes no new sessions")
        try:
            reservation = server.reserve()
        except (ResourceExhausted, LogUnavailable, SchedulerFailed) as exc:
            return _refuse_http(holder, exc.code, str(exc))
    try:
        dialect = _dialect(dialect_name, config, server.engine.slots, headers, subprotocols, ws.args)
        await _run_connection(holder, server, dialect, reservation, ws)
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
    if name == "realtime":
        return RealtimeDialect(
            model=config.model,
            capabilities=capabilities(slots),
            beta="realtime=v1" in headers.get("openai-beta", "") or auth.BETA_SUBPROTOCOL in subprotocols,
            autostart=args.get("autostart", "1") != "0",
            duplex=args.get("duplex", "0") not in ("0", "", "false"),
            max_message_bytes=config.max_message_bytes,
        )
    if name == "api_chat":
        return ApiChatDialect(args)  # type: ignore[return-value]  # a binary shell
    return NativeDialect(capabilities=capabilities(slots), max_message_bytes=config.max_message_bytes)


async def _run_connection(
    holder: ModelHolder,
    server: DuplexServer,
    dialect: Dialect,
    reservation: SlotReservation | None,
    ws: Upgrade,
) -> None:
    await ws.accept(auth.chosen_subprotocol(ws.subprotocols))
    transport = Transport(ws.receive, ws.send, ws.close)
    rate_limits = RateLimits(
        messages_per_s=holder.config.max_messages_per_s,
        message_burst=holder.config.message_burst,
        bytes_per_s=holder.config.max_bytes_per_s,
        byte_burst=holder.config.byte_burst,
        persist_s=holder.config.rate_limit_after_s,
    )
    kind = ApiChatConnection if isinstance(dialect, ApiChatDialect) else Connection
    conn: Connection = kind(
        server,
        transport,
        dialect=dialect,
        idle_timeout_s=holder.config.idle_timeout_s,
        counters=holder.counters,
        faults=holder.faults,
        reservation=reservation,
        rate_limits=rate_limits,
    )
    holder.add_connection(conn)
    try:
        await _open_and_run(conn, dialect, holder.config.model, server, holder.config, ws)
    except Exception:
        log.exception("connection failed")
        holder.counters.connection_errors["handler"] += 1
        with trio.CancelScope(shield=True):
            try:
                await conn.refuse("internal_error", "the server failed on this connection", 1011)
            except Exception:
                pass
    finally:
        holder.discard_connection(conn)


async def _open_and_run(
    conn: Connection, dialect: Dialect, model: str, server: DuplexServer, config: ServerConfig, ws: Upgrade
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
            await conn.refuse("model_not_found", f"this server serves {model!r}, not {wanted!r}", 1008)
            return
    try:
        opening = await read_opening(dialect, ws.receive)
    except ProtocolError as err:
        await conn.refuse(err.code, err.message, 1008, err.client_event_id)
        return
    await conn.run(opening)


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
            return _guarded(ServerConfig.from_env())
        except ConfigError as exc:
            raise SystemExit(f"duplex-actors: {exc}") from None
    return _guarded(config)


def _guarded(config: ServerConfig) -> DuplexApp:
    quart_app = create_quart_app(config)
    holder: ModelHolder = quart_app.extensions["duplex_model"]
    refuse_permessage_deflate()
    end_oversize_streams()
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
