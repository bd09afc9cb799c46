"""Measured traps of hypercorn + quart-trio, and what we do about them (notes/serving-hardening.md).

- permessage-deflate is always accepted by hypercorn; a small compressed message can inflate
  to hundreds of MB before the size limit applies. We never negotiate it.
- ``TCP_USER_TIMEOUT`` on the listening sockets is the only thing that releases a send stuck
  on a peer that stopped reading.
- A quart-trio app under hypercorn's default asyncio worker answers HTTP 500 to everything;
  the ASGI entry point refuses to start there and says to add ``-k trio``.
- One connection's exception must never take the server down: the ASGI entry point guards
  each connection and counts what it caught.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.config import Config, Sockets
from hypercorn.protocol import ws_stream
from hypercorn.protocol.events import StreamClosed
from hypercorn.trio import tcp_server

log = logging.getLogger(__name__)

TCP_USER_TIMEOUT_MS = 15_000
ASYNCIO_WORKER_MESSAGE = (
    "duplex-actors is a Trio app: run it with hypercorn's trio worker, "
    "`hypercorn -k trio duplex_actors.app:app`, or with `duplex-actors serve`"
)

_original_handshake_init = ws_stream.Handshake.__init__


def _handshake_without_extensions(self: Any, headers: Any, http_version: str) -> None:
    _original_handshake_init(self, headers, http_version)
    self.extensions = None  # offered extensions are ignored: no permessage-deflate


def refuse_permessage_deflate() -> None:
    """Make hypercorn ignore ``Sec-WebSocket-Extensions`` offers (idempotent, process-wide)."""
    ws_stream.Handshake.__init__ = _handshake_without_extensions  # type: ignore[method-assign]


_original_handle_events = ws_stream.WSStream._handle_events


async def _handle_events_ending_oversize(self: Any) -> None:
    await _original_handle_events(self)
    if self.buffer.length > self.buffer.max_length:
        # hypercorn sent the 1009 close but never tells the app: without this the handler (and
        # its session's slot) waits for the idle timeout. End the stream like a normal close.
        self.buffer.clear()
        await self.send(StreamClosed(stream_id=self.stream_id))


def end_oversize_streams() -> None:
    """After a 1009 (message too big) close, disconnect the app as a normal close does."""
    ws_stream.WSStream._handle_events = _handle_events_ending_oversize  # type: ignore[method-assign]


_original_tcp_run = tcp_server.TCPServer.run
_on_connection_error: list[Callable[[str], None]] = []


async def _guarded_tcp_run(self: Any) -> None:
    try:
        await _original_tcp_run(self)
    except Exception as exc:  # e.g. h11 LocalProtocolError after a bad upgrade (hypercorn #225)
        log.warning("dropped a connection after a protocol error: %r", exc)
        for hook in _on_connection_error:
            hook(type(exc).__name__)


def guard_connections(on_error: Callable[[str], None] | None = None) -> None:
    """Contain hypercorn's per-connection exceptions: without this, an Upgrade request followed
    by trailing bytes raises inside hypercorn's TCP handler and takes the whole process down
    (hypercorn issue #225, reproduced on 0.18.0). Process-wide and idempotent."""
    tcp_server.TCPServer.run = _guarded_tcp_run  # type: ignore[method-assign]
    _on_connection_error.clear()
    if on_error is not None:
        _on_connection_error.append(on_error)


class HardenedConfig(Config):
    """hypercorn Config whose listening sockets carry ``TCP_USER_TIMEOUT``."""

    tcp_user_timeout_ms: int = TCP_USER_TIMEOUT_MS

    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_USER_TIMEOUT"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.tcp_user_timeout_ms)
        return sockets


ASGIApp = Callable[..., Awaitable[None]]


class GuardedApp:
    """The ASGI entry point: refuses the asyncio worker, and contains each connection's errors."""

    def __init__(self, app: ASGIApp, on_error: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.on_error = on_error
        self.wrapped = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            import sniffio

            try:
                library = sniffio.current_async_library()
            except sniffio.AsyncLibraryNotFoundError:
                library = "unknown"
            if library != "trio":
                message = await receive()
                if message["type"] == "lifespan.startup":
                    print(f"duplex-actors: {ASYNCIO_WORKER_MESSAGE}", file=sys.stderr, flush=True)
                    await send({"type": "lifespan.startup.failed", "message": ASYNCIO_WORKER_MESSAGE})
                return
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # one connection's failure stays with that connection
            log.exception("connection failed: %s %s", scope.get("type"), scope.get("path"))
            if self.on_error is not None:
                self.on_error(type(exc).__name__)
