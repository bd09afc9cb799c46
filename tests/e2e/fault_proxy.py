"""A TCP proxy between a test's client and a server that can break the connections it carries.

``cut("rst")`` resets both sides (SO_LINGER 0), ``cut("fin")`` closes both sides in order
(FIN, no WebSocket close frame), either optionally followed by an outage during which new
connections wait; ``blackhole()`` stops forwarding in both directions and keeps the sockets
open (a half-open connection, as after a network change); ``mute()`` drops the server's bytes
and still carries the client's (a one-way stall). New connections are carried normally after
any of them.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio


@attrs.define
class _Pair:
    client: trio.SocketStream
    upstream: trio.SocketStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    frozen: bool = False  # blackholed: its sockets stay open
    muted: bool = False  # the server's bytes are dropped, the client's still carried


def _reset(stream: trio.SocketStream) -> None:
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.pairs: list[_Pair] = []
        self.connections = 0
        self.gate = trio.Event()  # cleared during an outage: new connections wait
        self.gate.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._carry, listeners)

    async def _carry(self, client: trio.SocketStream) -> None:
        await self.gate.wait()
        self.connections += 1
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        pair = _Pair(client, upstream)
        self.pairs.append(pair)
        with pair.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, pair, client, upstream, False)
                nursery.start_soon(self._pump, pair, upstream, client, True)
        if pair.frozen:
            await trio.sleep_forever()  # half-open: nobody closes these sockets
        for stream in (client, upstream):
            await stream.aclose()

    async def _pump(
        self, pair: _Pair, source: trio.SocketStream, sink: trio.SocketStream, downstream: bool
    ) -> None:
        try:
            while data := await source.receive_some(65536):
                if not (downstream and pair.muted):
                    await sink.send_all(data)
            await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pair.scope.cancel()

    async def cut(self, how: str = "rst", *, outage_s: float = 0.0) -> None:
        """Break every connection carried now (``rst`` or ``fin``); with ``outage_s``, new
        connections wait that long."""
        if outage_s:
            self.gate = trio.Event()
        for pair in self.pairs:
            pair.scope.cancel()
            for stream in (pair.client, pair.upstream):
                if how == "rst":
                    _reset(stream)
                await stream.aclose()
        self.pairs.clear()
        if outage_s:
            await trio.sleep(outage_s)
            self.gate.set()

    def blackhole(self) -> None:
        """Stop forwarding every connection carried now, keeping its sockets open."""
        for pair in self.pairs:
            pair.frozen = True
            pair.scope.cancel()
        self.pairs.clear()

    def mute(self) -> None:
        """Drop what the server sends on every connection carried now."""
        for pair in self.pairs:
            pair.muted = True

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@asynccontextmanager
async def proxy_to(upstream_port: int) -> AsyncIterator[FaultProxy]:
    """A :class:`FaultProxy` to ``upstream_port`` for the block."""
    proxy = FaultProxy(upstream_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        yield proxy
        nursery.cancel_scope.cancel()
