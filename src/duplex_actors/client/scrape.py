"""The server's HTTP side as a load run reads it, from trio: ``/metrics`` counters, ``/ready``,
and waiting until every slot is free."""

from __future__ import annotations

import json
from typing import Any

import trio

from .server_metrics import http_get, metrics_of


async def scrape(base: str, api_key: str | None = None) -> dict[str, float | None]:
    """The server counters ``duplex-load`` reports (:func:`~.server_metrics.metrics_of`)."""
    return metrics_of(*await trio.to_thread.run_sync(http_get, base + "/metrics", api_key))


async def ready(base: str, api_key: str | None = None) -> dict[str, Any]:
    status, text = await trio.to_thread.run_sync(http_get, base + "/ready", api_key)
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {}
    return {"status": status, **(body if isinstance(body, dict) else {})}


async def wait_idle(base: str, api_key: str | None = None, timeout: float = 15.0) -> None:
    """Until every slot is free again (sessions of the last run released), at most ``timeout``."""
    with trio.move_on_after(timeout):
        while True:
            body = await ready(base, api_key)
            if body.get("status") != 200 or body.get("slots_free") == body.get("slots_total"):
                return
            await trio.sleep(0.1)
