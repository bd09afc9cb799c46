"""The WebSocket routes served straight from ASGI, without quart: one hop per message.

The handler runs in hypercorn's app task and reads hypercorn's channel itself: what is already
queued there is taken without a checkpoint (at most :data:`MAX_NOWAIT_RECEIVES` in a row, then
a real one), with no per-message task, memory channel, signal or context-local lookup between.

A client sees quart's behaviour: the same accept (the subprotocol, no headers), the same HTTP
refusals before the upgrade (the response quart would build, as ``websocket.http.response.*``),
a close 1000 when the handler returns after accepting without closing, and the handler
cancelled when the client disconnects (by the disconnect hook of ``hardening._spawn_app``, or
by ``receive`` when it reads the disconnect first).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio
from werkzeug.datastructures import Headers
from werkzeug.sansio.request import Request as SansIORequest

from .channel_state import receiver_waits_idle
from .dialects import WireMessage

# An ASGI message of ours: several WebSocket messages (str or bytes) in one write.
SEND_MANY = "duplex_actors.websocket.send_many"
# Where the raw path leaves the callable that ends its handler at the client's disconnect
# (``hardening._spawn_app`` calls it when it delivers ``websocket.disconnect``).
DISCONNECT_HOOK_SCOPE = "duplex_actors.on_disconnect"
# Where the TCP server leaves the code of the client's close frame (hypercorn's disconnect
# message says 1006 for any close the app did not start).
CLIENT_CLOSE_CODE_SCOPE = "duplex_actors.client_close_code"
# Where the TCP server leaves the app's sends that need no await (``hardening.send_now``: a
# callable that makes the messages -> NOT_SENT, SENT or PENDING) and the flush of what such a
# send left unsent.
SEND_NOW_SCOPE = "duplex_actors.send_now"
FLUSH_SCOPE = "duplex_actors.flush"
NOT_SENT, SENT, PENDING = 0, 1, 2
# Where the raw path leaves the callable that takes a client message without a task hop (True:
# handled), which the TCP server offers each message it reads before queueing it.
DIRECT_RECEIVE_SCOPE = "duplex_actors.receive_directly"
# Messages taken from hypercorn's queue without a checkpoint before the next receive is a real
# one (hypercorn's queue holds 10, so this only bounds a server that queues more).
MAX_NOWAIT_RECEIVES = 32

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


@attrs.frozen(slots=True)
class HttpReply:
    """A refusal before the upgrade: HTTP ``status`` with the JSON ``body`` and ``headers``."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(slots=True)
class RenderedReply:
    """An :class:`HttpReply` as the bytes quart would send: headers (lower-case) and body chunks."""

    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: list[bytes]


class AsgiWebSocket:
    """One WebSocket upgrade over ASGI ``receive``/``send``: what a route reads of the request
    (headers lower-cased, the last of a repeated one, as the quart route read them; subprotocols;
    the query as werkzeug parses it) and the ``accept``/``receive``/``send``/``close`` of quart's
    ``websocket``."""

    def __init__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        channel = getattr(receive, "__self__", None)
        self._receive_nowait: Callable[[], dict[str, Any]] | None = (
            channel.receive_nowait if isinstance(channel, trio.MemoryReceiveChannel) else None
        )
        self._nowait_run = 0
        client = scope.get("client") or ["<local>"]
        headers = {"remote-addr": str(client[0])}  # quart adds it first; a client's own one wins
        for name, value in scope.get("headers") or ():
            headers[name.decode("latin1").lower()] = value.decode("latin1")
        self.headers = headers
        self.subprotocols: list[str] = list(scope.get("subprotocols") or ())
        self.args: Mapping[str, str] = SansIORequest(
            "GET",
            scope.get("scheme", "ws"),
            None,
            "",
            scope.get("path", "/"),
            scope.get("query_string") or b"",
            Headers(),
            None,
        ).args
        self.accepted = False
        self.closed = False
        self.disconnect_code: int | None = None  # the client's close code (1006: dropped)
        # Cancelled only by :meth:`disconnected` (it has no deadline), which also sets the flag
        # that the per-message check reads (``cancel_called`` reads the clock on each call).
        self.cancel_scope = trio.CancelScope()
        self._disconnected = False
        self._channel: trio.MemoryReceiveChannel[Any] | None = (
            channel if isinstance(channel, trio.MemoryReceiveChannel) else None
        )
        self._direct: Callable[[WireMessage], bool] | None = None
        self._send_now: Callable[[Callable[[], list[WireMessage]]], int] | None = scope.get(SEND_NOW_SCOPE)
        self._flush: Callable[[], Awaitable[None]] | None = scope.get(FLUSH_SCOPE)

    async def accept(self, subprotocol: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        if not self.accepted:
            self.accepted = True
            extra = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in (headers or {}).items()]
            await self._send({"type": "websocket.accept", "subprotocol": subprotocol, "headers": extra})

    async def receive(self) -> WireMessage:
        if not self.accepted:
            await self.accept()
        while True:
            message: dict[str, Any] | None = None
            nowait = self._receive_nowait
            if nowait is not None and self._nowait_run < MAX_NOWAIT_RECEIVES and not self._disconnected:
                try:
                    message = nowait()
                    self._nowait_run += 1
                except trio.WouldBlock:
                    pass
            if message is None:
                self._nowait_run = 0
                message = await self._receive()
            kind = message["type"]
            if kind == "websocket.receive":
                data: WireMessage = message.get("bytes") or message["text"]
                return data
            if kind == "websocket.disconnect":
                self.disconnected(message.get("code"))
                await trio.sleep_forever()  # cancelled: the handler ends here
            # websocket.connect (hypercorn's first message): nothing to hand on

    async def send(self, data: str | bytes) -> None:
        if not self.accepted:
            await self.accept()
        if isinstance(data, str):
            await self._send({"type": "websocket.send", "bytes": None, "text": data})
        else:
            await self._send({"type": "websocket.send", "bytes": data, "text": None})

    async def send_many(self, messages: list[str | bytes]) -> None:
        """Several messages (or one) in one write to the socket: the ``SEND_MANY`` message,
        which ``hardening.send_many_in_one_write`` teaches hypercorn (the app installs it)."""
        if not self.accepted:
            await self.accept()
        await self._send({"type": SEND_MANY, "messages": messages})

    def send_now(self, make: Callable[[], list[WireMessage]]) -> int:
        """Send the messages ``make()`` returns without an await, when the socket is free to
        take them: ``NOT_SENT`` (nothing done, ``make`` not called: send them with
        :meth:`send_many`), ``SENT``, or ``PENDING`` (the rest waits for :meth:`flush`, which
        the caller runs; no send overtakes it meanwhile)."""
        if self._send_now is None or not self.accepted or self.closed:
            return NOT_SENT
        return self._send_now(make)

    async def flush(self) -> None:
        """Write what :meth:`send_now` left ``PENDING``."""
        if self._flush is not None:
            await self._flush()

    def receive_directly(self, handler: Callable[[WireMessage], bool] | None) -> None:
        """Offer each client message to ``handler`` (in the task that read it, True: handled)
        while the handler's reader waits in :meth:`receive` with nothing queued; None stops."""
        self._direct = handler
        if handler is None:
            self.scope.pop(DIRECT_RECEIVE_SCOPE, None)
        elif self._channel is not None:
            self.scope[DIRECT_RECEIVE_SCOPE] = self._offer

    def _offer(self, message: WireMessage) -> bool:
        handler, channel = self._direct, self._channel
        if handler is None or channel is None or self._disconnected:
            return False
        if not receiver_waits_idle(channel):
            return False  # the reader is busy, or messages wait for it: this one queues too
        return handler(message)

    async def close(self, code: int, reason: str = "") -> None:
        if self.closed:
            raise RuntimeError("Cannot close websocket multiple times")  # as quart's
        await self._send({"type": "websocket.close", "code": code, "reason": reason})
        self.closed = True

    def disconnected(self, code: int | None = None) -> None:
        """The client is gone (``code``: its close code, 1006 when the socket dropped): the
        handler is cancelled (its session closes ``disconnect``, or a resumable one detaches)."""
        if self.disconnect_code is None:
            self.disconnect_code = self.scope.get(CLIENT_CLOSE_CODE_SCOPE, code)
        self._disconnected = True
        self.cancel_scope.cancel()

    async def reply(self, rendered: RenderedReply) -> None:
        """Refuse the upgrade with an HTTP response (ASGI's websocket HTTP response extension)."""
        await self._send(
            {"type": "websocket.http.response.start", "status": rendered.status, "headers": rendered.headers}
        )
        for chunk in rendered.chunks:
            await self._send({"type": "websocket.http.response.body", "body": chunk, "more_body": True})
        await self._send({"type": "websocket.http.response.body", "body": b"", "more_body": False})


async def serve_websocket(
    scope: dict[str, Any],
    receive: ASGIReceive,
    send: ASGISend,
    handler: Callable[[AsgiWebSocket], Awaitable[HttpReply | None]],
    render: Callable[[HttpReply], Awaitable[RenderedReply]],
) -> None:
    """Run ``handler`` on the upgrade; send its refusal, or close 1000 after it if it accepted and
    did not close (quart's ending). Cancelled at the client's disconnect, as under quart-trio."""
    ws = AsgiWebSocket(scope, receive, send)
    scope[DISCONNECT_HOOK_SCOPE] = ws.disconnected
    try:
        with ws.cancel_scope:
            reply = await handler(ws)
            if reply is not None and not ws.accepted:
                await ws.reply(await render(reply))
            elif ws.accepted and not ws.closed:
                await ws.close(1000)
    finally:
        scope.pop(DISCONNECT_HOOK_SCOPE, None)
        scope.pop(DIRECT_RECEIVE_SCOPE, None)


__all__ = ["AsgiWebSocket", "HttpReply", "RenderedReply", "serve_websocket"]
