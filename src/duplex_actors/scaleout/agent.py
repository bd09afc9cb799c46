"""HAProxy's agent-check protocol, answered by the serving process itself (``--agent-port``).

On each TCP connection the responder writes one line and closes:

- ``up ready maxconn:<N>``: serving; ``N`` = free + active slots (slots a session holds or could
  take; a slot whose model state is being reset after its session ended is neither for a moment).
  ``ready`` also cancels a DRAIN that an earlier answer set.
- ``drain``: draining (SIGTERM) or paused (SIGUSR1): no new sessions, the live ones go on.
- ``down #<reason>``: the model or the log is unusable (the model failed to load or serve, the
  scheduler failed, a session log could not be written) or the model is still loading.

HAProxy reads up to the first ``\\r`` or ``\\n`` and splits words on spaces, tabs and commas; a
word that starts with ``#`` starts the description. So the reason is written ``down #reason``:
HAProxy 2.6 ignores ``down#reason`` written as one word ("No status change"; tests/scaleout
checks it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 2.0


def _reason(text: str) -> str:
    """One line, no separators HAProxy would split on, short."""
    clean = " ".join(str(text).replace("#", " ").split())
    return clean[:120] or "unavailable"


def down(reason: str) -> str:
    return f"down #{_reason(reason)}"


def agent_status(holder: Any) -> str:
    """The agent line for a :class:`duplex_actors.app.ModelHolder` (without the newline)."""
    if holder.error:
        return down(f"model failed: {holder.error}")
    server = holder.server
    if server is None:
        startup = getattr(holder, "startup", None)
        phase = startup.current if startup is not None else None
        return down("the model is loading" + (f" ({phase.name})" if phase is not None else ""))
    scheduler = server.scheduler
    if scheduler.failed is not None or getattr(getattr(scheduler, "status", None), "failed", None):
        return down("the model scheduler failed")
    if not server.writer.healthy:
        return down("a session log could not be written")
    if holder.draining or holder.paused:
        return "drain"
    # Slots a session holds or could take: all but those being reset after their session ended.
    free_plus_active = scheduler.slots_total - scheduler.slots_releasing
    # maxconn:0 would mean "unlimited" to HAProxy: never send it.
    return f"up ready maxconn:{max(1, free_plus_active)}"


async def serve_agent(
    status: Callable[[], str],
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer agent checks on ``host:port`` until cancelled (``task_status`` gets the listeners)."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            line = status()
        except Exception as exc:  # never leave HAProxy without an answer
            log.exception("agent status failed")
            line = down(f"agent error: {exc}")
        try:
            with trio.move_on_after(SEND_TIMEOUT_S):
                await stream.send_all((line + "\n").encode("ascii", "replace"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            with trio.move_on_after(SEND_TIMEOUT_S):
                await stream.aclose()

    await trio.serve_tcp(handle, port, host=host, task_status=task_status)
