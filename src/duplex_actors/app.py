"""The app: ``hypercorn -k trio duplex_actors.app:app`` or ``duplex-actors serve``.

At start-up it loads the model in a worker thread, starts the in-process duplex server
(scheduler actor, log writer, log retention) and warms it up with one silent session through
the real path before ``/ready`` turns 200.

Routes: ``WS /v1/realtime`` (OpenAI Realtime projection; ``?duplex=1`` accepted, ``?model=``
checked, ``?autostart=0`` waits for the first message), ``WS /v1/duplex`` (native dialect),
``GET /health``, ``GET /ready``, ``GET /v1/models``, ``GET /metrics`` and
``POST /v1/chat/completions`` (a clear 400: a lockstep model has no chat completions).

Scale-out (docs/scaling.md): ``agent_port`` answers HAProxy's agent checks; ``admission_refusal
= "http"`` reserves a slot at the handshake and refuses a full server's upgrade with HTTP 503 +
``Retry-After`` (a proxy can redispatch it), where the default refuses in-band (``error`` + 1013);
``log_upload`` ships every finished session log to S3. :meth:`ModelHolder.pause` (SIGUSR1 with
``duplex-actors serve``) stops admitting while the live sessions go on; :meth:`ModelHolder.resume`
(SIGUSR2) undoes it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import trio
from quart import Response, jsonify, websocket
from quart_trio import QuartTrio

from .config import ServerConfig
from .faults import Faults, FaultyEngine
from .metrics import Counters, render
from .model.engine import FRAME_SAMPLES, ModelEngine
from .scaleout.agent import agent_status, serve_agent
from .scheduler.actor import SchedulerFailed
from .server import DuplexServer, LogUnavailable, ResourceExhausted, SlotReservation
from .web import auth
from .web.connection import CONFIG_TIMEOUT_S, Connection, Transport, capabilities
from .web.dialects import Dialect, NativeDialect, RealtimeDialect
from .web.hardening import GuardedApp, end_oversize_streams, guard_connections, refuse_permessage_deflate
from .web.page import install_page_routes

if TYPE_CHECKING:
    from .scaleout.upload import LogUploader

log = logging.getLogger("duplex_actors")


# After every session has closed, how long connections get to flush their last frames.
CONNECTION_GRACE_S = 0.5


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
        self.idle = trio.Event()
        self.counters = Counters()
        self.faults = Faults.from_env()

    @property
    def model_id(self) -> str:
        return self.config.model

    def load(self) -> ModelEngine:
        from .model.factory import open_engine

        cfg = self.config
        engine = open_engine(
            cfg.model,
            slots=cfg.max_sessions,
            device=cfg.device,
            family=cfg.family,
            revision=cfg.revision,
            torch_threads=cfg.torch_threads,
        )
        if self.faults.active:
            log.warning("DUPLEX_FAULTS is set: faults will be injected (%s)", self.faults)
            self.faults.install_fsync_fault()
            return FaultyEngine(engine, self.faults)
        return engine

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
                limits=SessionLimits(max_buffered_samples=cfg.input_buffer_bytes // 4),
                outbox_size=cfg.outbox_events,
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
            while self.server is not None and self.server.sessions:
                await trio.sleep(0.01)
            with trio.move_on_after(CONNECTION_GRACE_S):
                while self.connections:
                    await trio.sleep(0.01)
            if self.uploader is not None:
                await self.uploader.wait_idle()


RETRY_AFTER_S = 1


class _ReservedServer:
    """The server as one connection sees it: its ``open_session`` takes the slot reserved at the
    handshake (``admission_refusal="http"``)."""

    def __init__(self, server: Any, reservation: Any) -> None:
        self._server = server
        self._reservation = reservation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    async def open_session(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("reservation", self._reservation)
        return await self._server.open_session(*args, **kwargs)


def _headers() -> dict[str, str]:
    return {k.lower(): v for k, v in websocket.headers.items()}


def create_app(config: ServerConfig | None = None) -> QuartTrio:
    config = config or ServerConfig.from_env()
    refuse_permessage_deflate()
    end_oversize_streams()
    app = QuartTrio("duplex_actors")
    app.config["MAX_CONTENT_LENGTH"] = 1 << 20
    holder = ModelHolder(config)
    app.extensions["duplex_model"] = holder

    @app.before_serving
    async def _start() -> None:
        async def run() -> None:
            try:
                await holder.run()
            except Exception as exc:  # reported by /health and /ready
                log.exception("serving model %s failed", config.model)
                holder.error = f"{type(exc).__name__}: {exc}"
            finally:
                holder.engine = holder.server = None

        app.nursery.start_soon(run)
        if config.agent_port is not None:
            await app.nursery.start(
                serve_agent, lambda: agent_status(holder), config.agent_port, config.agent_host
            )
            log.info("HAProxy agent-check responder on %s:%d", config.agent_host, config.agent_port)

    @app.get("/health")
    async def health() -> Any:
        failed = holder.error or (holder.server is not None and holder.server.scheduler.failed is not None)
        if failed:
            return jsonify(
                {"status": "unhealthy", "error": holder.error or "the model scheduler failed"}
            ), 503
        return jsonify({"status": "healthy"})

    @app.get("/ready")
    async def ready() -> Any:
        engine, server = holder.engine, holder.server
        draining = holder.draining or holder.paused
        if engine is None or server is None or draining or not server.writer.healthy:
            body: dict[str, Any] = {"ready": False, "model": config.model, "draining": draining}
            if holder.error:
                body["error"] = holder.error
            if server is not None and not server.writer.healthy:
                body["error"] = "a session log could not be written"
            return jsonify(body), 503
        return jsonify(
            {
                "ready": True,
                "model": config.model,
                "family": engine.family.name,
                "slots_total": engine.slots,
                "slots_free": server.scheduler.table.free,
                "warmup_ms": round(holder.warmup_ms or 0, 1),
            }
        )

    @app.get("/v1/models")
    async def models() -> Any:
        created = int(holder.loaded_at or time.time())
        return jsonify(
            {
                "object": "list",
                "data": [
                    {"id": config.model, "object": "model", "created": created, "owned_by": "duplex-actors"}
                ],
            }
        )

    @app.get("/metrics")
    async def metrics() -> Any:
        server = holder.server
        text = render(
            counters=holder.counters,
            scheduler=server.scheduler if server is not None else None,
            writer=server.writer if server is not None else None,
            sessions_active=len(server.sessions) if server is not None else 0,
            recovered_logs=len(server.recovered_logs) if server is not None else 0,
            uploader=holder.uploader,
        )
        return Response(text, content_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Any:
        return jsonify(
            {
                "error": {
                    "type": "invalid_request_error",
                    "code": "unsupported_endpoint",
                    "message": (
                        f"{config.model} is a full-duplex speech model that listens and speaks in "
                        "lockstep (80 ms in, 80 ms out); it has no chat completions. Open a "
                        "WebSocket to /v1/realtime?duplex=1 (OpenAI Realtime) or /v1/duplex."
                    ),
                    "param": None,
                }
            }
        ), 400

    async def _websocket(dialect_name: str) -> Any:
        headers = _headers()
        subprotocols = list(websocket.requested_subprotocols)
        refusal = auth.check(
            api_key=config.api_key,
            allowed_origins=config.allowed_origins,
            headers=headers,
            subprotocols=subprotocols,
        )
        if refusal is not None:
            holder.counters.refused[refusal.code] += 1
            body = {
                "error": {"type": "invalid_request_error", "code": refusal.code, "message": refusal.message}
            }
            return jsonify(body), refusal.status
        server = holder.server
        http_refusal = config.admission_refusal == "http"
        if server is None or holder.draining:
            return _refuse_http("not_ready", "the server is not ready", retry=http_refusal)
        reservation = None
        if http_refusal:
            # Reserve the slot before the upgrade: refused here, a proxy can try another server.
            if holder.paused:
                return _refuse_http("draining", "the server is draining: it takes no new sessions")
            try:
                reservation = server.reserve()
            except (ResourceExhausted, LogUnavailable, SchedulerFailed) as exc:
                return _refuse_http(getattr(exc, "code", "resource_exhausted"), str(exc))
        try:
            return await _accept_and_run(server, reservation, dialect_name, headers, subprotocols)
        finally:
            if reservation is not None:
                reservation.release()  # no-op once the session took it

    def _refuse_http(code: str, message: str, *, retry: bool = True) -> Any:
        holder.counters.refused[code] += 1
        kind = "rate_limit_error" if code == "resource_exhausted" else "server_error"
        body = jsonify({"error": {"type": kind, "code": code, "message": message}})
        if retry:
            return body, 503, {"Retry-After": str(RETRY_AFTER_S)}
        return body, 503

    async def _accept_and_run(
        server: DuplexServer,
        reservation: SlotReservation | None,
        dialect_name: str,
        headers: dict[str, str],
        subprotocols: list[str],
    ) -> Any:
        if dialect_name == "realtime":
            beta = "realtime=v1" in headers.get("openai-beta", "") or auth.BETA_SUBPROTOCOL in subprotocols
            dialect: Dialect = RealtimeDialect(
                model=config.model,
                capabilities=capabilities(server.engine.slots),
                beta=beta,
                max_message_bytes=config.max_message_bytes,
            )
        else:
            dialect = NativeDialect(
                capabilities=capabilities(server.engine.slots), max_message_bytes=config.max_message_bytes
            )
        await websocket.accept(subprotocol=auth.chosen_subprotocol(subprotocols))
        transport = Transport(
            websocket.receive, websocket.send, lambda code, reason: websocket.close(code, reason)
        )
        conn = Connection(
            server if reservation is None else cast(Any, _ReservedServer(server, reservation)),
            transport,
            dialect=dialect,
            idle_timeout_s=config.idle_timeout_s,
            counters=holder.counters,
            faults=holder.faults,
        )
        holder.connections.add(conn)
        try:
            await _open_and_run(conn, dialect, dialect_name)
        except Exception:
            log.exception("connection failed")
            holder.counters.connection_errors["handler"] += 1
            with trio.CancelScope(shield=True):
                try:
                    await conn.refuse("internal_error", "the server failed on this connection", 1011)
                except Exception:
                    pass
        finally:
            holder.connections.discard(conn)
        return None

    async def _open_and_run(conn: Connection, dialect: Dialect, dialect_name: str) -> None:
        from .protocol.errors import ProtocolError

        args = request_args()
        if dialect_name == "realtime":
            wanted = args.get("model")
            if wanted and wanted != config.model:
                await conn.refuse(
                    "model_not_found", f"this server serves {config.model!r}, not {wanted!r}", 1008
                )
                return
            if args.get("autostart", "1") == "0":
                with trio.move_on_after(CONFIG_TIMEOUT_S) as cs:
                    data = await websocket.receive()
                if cs.cancelled_caught:
                    await conn.refuse("config_timeout", f"no message within {CONFIG_TIMEOUT_S:.0f} s", 1008)
                    return
                cfg, rest, event_id = dialect.first_message(data)
                await conn.run(first_message=rest, config=cfg, client_event_id=event_id)
                return
            await conn.run()
            return
        with trio.move_on_after(CONFIG_TIMEOUT_S) as cs:
            data = await websocket.receive()
        if cs.cancelled_caught:
            await conn.refuse("config_timeout", f"send session.create within {CONFIG_TIMEOUT_S:.0f} s", 1008)
            return
        try:
            cfg, _, event_id = dialect.first_message(data)
        except ProtocolError as err:
            await conn.refuse(err.code, err.message, 1008, err.client_event_id)
            return
        await conn.run(config=cfg, client_event_id=event_id)

    def request_args() -> dict[str, str]:
        return {k: v for k, v in websocket.args.items()}

    @app.websocket("/v1/realtime")
    async def realtime_ws() -> Any:
        return await _websocket("realtime")

    @app.websocket("/v1/duplex")
    async def native_ws() -> Any:
        return await _websocket("native")

    install_page_routes(app, holder, config)
    return app


def create_asgi_app(config: ServerConfig | None = None) -> GuardedApp:
    quart_app = create_app(config)
    holder: ModelHolder = quart_app.extensions["duplex_model"]

    def on_error(kind: str) -> None:
        holder.counters.connection_errors[kind] += 1

    guard_connections(on_error)
    guarded = GuardedApp(quart_app, on_error)
    guarded.holder = holder  # type: ignore[attr-defined]
    guarded.quart_app = quart_app  # type: ignore[attr-defined]
    return guarded


app = create_asgi_app()
