"""The HTTP app: ``hypercorn -k trio duplex_actors.app:app`` or ``duplex-actors serve``.

At start-up it loads the model in a worker thread, starts the in-process duplex server
(scheduler actor, log writer, log retention) and warms it up with one silent session through
the real path before ``/ready`` turns 200. Routes: ``/health``, ``/ready``, ``/v1/models``.
(The WebSocket dialects are built on the same in-process server.)
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import trio
from quart import jsonify
from quart_trio import QuartTrio

from .config import ServerConfig
from .model.engine import FRAME_SAMPLES

log = logging.getLogger("duplex_actors")


class ModelHolder:
    """The engine and the in-process server once started, plus what /ready reports."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine: Any = None
        self.server: Any = None
        self.error: str | None = None
        self.loaded_at: float | None = None
        self.warmup_ms: float | None = None

    def load(self) -> Any:
        from .model.factory import open_engine

        cfg = self.config
        return open_engine(
            cfg.model,
            slots=cfg.max_sessions,
            device=cfg.device,
            family=cfg.family,
            revision=cfg.revision,
            torch_threads=cfg.torch_threads,
        )

    async def run(self) -> None:
        """Load, serve the in-process server until cancelled; /ready is 200 in between."""
        from .server import open_duplex_server
        from .session.events import AudioFrame

        cfg = self.config
        engine = await trio.to_thread.run_sync(self.load)
        async with open_duplex_server(
            engine, log_dir=cfg.log_dir, log_max_age_s=cfg.log_max_age_s, log_max_bytes=cfg.log_max_bytes
        ) as server:
            started = time.perf_counter()
            warmup = await server.open_session({})
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
            self.loaded_at = time.time()
            await trio.sleep_forever()


def create_app(config: ServerConfig | None = None) -> QuartTrio:
    config = config or ServerConfig.from_env()
    app = QuartTrio("duplex_actors")
    holder = ModelHolder(config)
    app.extensions["duplex_model"] = holder

    @app.before_serving
    async def _start_loading() -> None:
        async def run() -> None:
            try:
                await holder.run()
            except Exception as exc:  # reported by /health and /ready
                log.exception("serving model %s failed", config.model)
                holder.error = f"{type(exc).__name__}: {exc}"
            finally:
                holder.engine = holder.server = None

        app.nursery.start_soon(run)

    @app.get("/health")
    async def health() -> Any:
        if holder.error is not None:
            return jsonify({"status": "unhealthy", "error": holder.error}), 503
        return jsonify({"status": "healthy"})

    @app.get("/ready")
    async def ready() -> Any:
        engine = holder.engine
        if engine is None or holder.server is None:
            body = {"ready": False, "model": config.model}
            if holder.error:
                body["error"] = holder.error
            return jsonify(body), 503
        return jsonify(
            {
                "ready": True,
                "model": engine.model_id,
                "family": engine.family.name,
                "slots_total": engine.slots,
                "slots_free": holder.server.scheduler.table.free,
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

    return app


app = create_app()
