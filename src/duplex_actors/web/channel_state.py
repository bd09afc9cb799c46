"""Whether the receiver of a trio memory channel waits with nothing queued.

The direct paths (web/asgi_ws.py, web/connection.py) ask this for every message. trio's
``statistics()`` answers it by building a record of seven counts on each call; this reads the
two it needs from the channel's state, and falls back to ``statistics()`` for a channel whose
state is not laid out as trio 0.2x-0.3x lays it out (tests/web/test_channel_state.py holds the
two answers side by side).
"""

from __future__ import annotations

from typing import Any

import trio


def _reads_state() -> bool:
    send, receive = trio.open_memory_channel[int](1)
    state = getattr(receive, "_state", None)
    ok = (
        state is not None
        and getattr(send, "_state", None) is state
        and hasattr(state, "data")
        and hasattr(state, "receive_tasks")
    )
    send.close()
    receive.close()
    return ok


_READS_STATE = _reads_state()


def receiver_waits_idle(channel: trio.MemoryReceiveChannel[Any] | trio.MemorySendChannel[Any]) -> bool:
    """True when a task waits to receive from ``channel``'s state and nothing is buffered."""
    if _READS_STATE:
        state = channel._state
        return bool(state.receive_tasks) and not state.data
    stats = channel.statistics()
    return bool(stats.tasks_waiting_receive) and not stats.current_buffer_used


__all__ = ["receiver_waits_idle"]
