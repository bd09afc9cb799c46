"""The HTTP app: ``hypercorn -k trio duplex_actors.app:app`` or ``duplex-actors serve``.

Loads the model in a worker thread at start-up and warms it up with one silent session
through the real engine before ``/ready`` turns 200. Routes: ``/health``, ``/ready``,
``/v1/models``. (The WebSocket session routes are built on the session actors.)
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
    """The engine once loaded, plus what /ready and /v1/models report."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine: Any = None
        self.error: str | None = None
        self.loaded_at: float | None = None
        self.warmup_ms: float | None = None

    def load_and_warm_up(self) -> None:
        from .model.engine import SessionPrompt
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
        started = time.perf_counter()
        prompt = engine.family.session_prompt()
        engine.reset(0, SessionPrompt(voice=prompt.voice, persona=prompt.persona))
        silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        for _ in range(3):
            engine.step({0: silence})
        engine.reset(0, prompt)
        self.warmup_ms = (time.perf_counter() - started) * 1000
        self.engine = engine
        self.loaded_at = time.time()


def create_app(config: ServerConfig | None = None) -> QuartTrio:
    config = config or ServerConfig.from_env()
    app = QuartTrio("duplex_actors")
    holder = ModelHolder(config)
    app.extensions["duplex_model"] = holder

    @app.before_serving
    async def _start_loading() -> None:
        async def load() -> None:
            try:
                await trio.to_thread.run_sync(holder.load_and_warm_up)
                log.info("model %s ready (warm-up %.0f ms)", config.model, holder.warmup_ms or 0)
            except Exception as exc:  # reported by /health and /ready
                log.exception("loading model %s failed", config.model)
                holder.error = f"{type(exc).__name__}: {exc}"

        app.nursery.start_soon(load)

    @app.get("/health")
    async def health() -> Any:
        if holder.error is not None:
            return jsonify({"status": "unhealthy", "error": holder.error}), 503
        return jsonify({"status": "healthy"})

    @app.get("/ready")
    async def ready() -> Any:
        engine = holder.engine
        if engine is None:
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
