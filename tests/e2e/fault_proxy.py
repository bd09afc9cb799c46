"""A TCP proxy between a test's client and a server that can break the connections it carries.

``cut("rst")`` resets both sides (SO_LINGER 0), ``cut("fin")`` closes both sides in order
(FIN, no WebSocket close frame), ``blackhole()`` stops forwarding in both directions and keeps
the sockets open (a half-open connection, as after a network change). New connections are
carried normally after any of them.
"""

from __future__ import annotations

import socket
import struct

import attrs
import trio


@attrs.define
class _Pair:
    client: trio.SocketStream
    upstream: trio.SocketStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    frozen: bool = False


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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._carry, listeners)

    async def _carry(self, client: trio.SocketStream) -> None:
        self.connections += 1
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        pair = _Pair(client, upstream)
        self.pairs.append(pair)
        with pair.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, pair, client, upstream)
                nursery.start_soon(self._pump, pair, upstream, client)
        if pair.frozen:
            await trio.sleep_forever()  # half-open: nobody closes these sockets

    async def _pump(self, pair: _Pair, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    await sink.send_eof()
                    return
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pair.scope.cancel()

    async def cut(self, how: str = "rst") -> None:
        """Break every connection carried now: ``rst`` or ``fin``."""
        for pair in self.pairs:
            pair.scope.cancel()
            for stream in (pair.client, pair.upstream):
                if how == "rst":
                    _reset(stream)
                await stream.aclose()
        self.pairs.clear()

    def blackhole(self) -> None:
        """Stop forwarding every connection carried now, keeping its sockets open."""
        for pair in self.pairs:
            pair.frozen = True
            pair.scope.cancel()
        self.pairs.clear()

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"
