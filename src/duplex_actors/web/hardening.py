"""Guards around hypercorn and quart-trio (each patch process-wide and idempotent).

- permessage-deflate is never negotiated: a small compressed message can inflate to hundreds
  of MB before the size limit applies.
- The listening sockets carry ``TCP_USER_TIMEOUT``: it is what releases a send stuck on a peer
  that stopped reading.
- Under hypercorn's default asyncio worker a quart-trio app answers HTTP 500 to everything, so
  the ASGI entry point refuses to start there and says to add ``-k trio``.
- One connection's exception never takes the server down: the ASGI entry point guards each
  connection and counts what it caught.
- A close is cancel-safe (hypercorn closes from whichever task asks, and quart-trio cancels the
  task that sent an HTTP response), request bodies have a deadline, and open connections are
  bounded below the descriptor limit, so that neither a head with ``Content-Length`` and no body
  nor ``accept`` failing with ``EMFILE`` can leave a session log without a descriptor.
- A connection is closed without RST (RFC 6455 section 7.1.1): half-close, read and drop until
  the peer's EOF (or a short linger), then close. Closing with client input unread makes the
  kernel send RST, and a client that gives up on a failed send then reports 1006 whether or not
  our close frame reached it. The read loop does the reading and the close, whichever task asks
  for it, and the FIN is sent under the send lock, never beside a concurrent ``send_all``.
- No inbound message waits on an app that cannot take it: a message for a finished app is
  dropped, a disconnect for an app whose queue is full cancels it. A message is queued without
  a scheduler round when the queue has room, and a disconnect ends the raw WebSocket path's
  handler at once (its hook in the scope, ``web/asgi_ws.py``).
- A streaming client costs little per message: a read waits for the socket then reads once,
  the whole data frames it starts with go to the app without hypercorn's and wsproto's layers
  (``web/ws_frames.py``; anything else, from the first byte that is not such a frame, takes
  their path). While the app takes messages at once, the connection's task does not read: one
  task reads every such socket (``web/shared_reader.py``) and wakes a connection's task only
  for what the app leaves. The app's messages of a tick are framed and written in one write,
  without the send lock and its scheduler round while no other send holds it. A message the app takes
  without a task hop is offered to it as it is read (``DIRECT_RECEIVE_SCOPE``), and the app can
  write without an await (``send_now``): what the socket does not take then waits in the
  connection, and the next write under the send lock, or the FIN, sends it first.
"""

from __future__ import annotations

import array
import contextvars
import fcntl
import logging
import math
import os
import resource
import socket
import sys
import termios
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import attrs
import h11
import trio
import wsproto.connection
import wsproto.utilities
from hypercorn.config import Config, Sockets
from hypercorn.events import Closed, RawData
from hypercorn.protocol import ws_stream
from hypercorn.protocol.events import Data, StreamClosed
from hypercorn.protocol.h11 import H11Protocol, H11WSConnection
from hypercorn.trio import task_group, tcp_server
from wsproto import frame_protocol
from wsproto.events import CloseConnection

from .asgi_ws import (
    CLIENT_CLOSE_CODE_SCOPE,
    DIRECT_RECEIVE_SCOPE,
    DISCONNECT_HOOK_SCOPE,
    FLUSH_SCOPE,
    NOT_SENT,
    PENDING,
    SEND_MANY,
    SEND_NOW_SCOPE,
    SENT,
)
from .shared_reader import READ_FAILED, release_if_parked, shared_reader
from .ws_frames import leading_messages, server_frame, unmask

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
    # hypercorn reports every disconnect the app did not close first as 1006; the code of a
    # client's close frame goes into the scope, for the app to tell a close from a drop.
    connection = self.connection
    events = connection.events

    def noting_close_codes() -> Any:
        for event in events():
            if isinstance(event, CloseConnection):
                self.scope[CLIENT_CLOSE_CODE_SCOPE] = event.code
            yield event

    connection.events = noting_close_codes
    try:
        await _original_handle_events(self)
    finally:
        del connection.events
    if self.buffer.length > self.buffer.max_length:
        # hypercorn sends the 1009 close but never tells the app: without this the handler (and
        # its session's slot) waits for the idle timeout. End the stream like a normal close.
        self.buffer.clear()
        await self.send(StreamClosed(stream_id=self.stream_id))


WSPROTO_UNMASK = frame_protocol.XorMaskerSimple.process  # wsproto's own, before any patch


def _unmask(self: Any, data: bytearray) -> bytearray:
    """wsproto's ``XorMaskerSimple.process`` (same result, same key rotation) by
    :func:`~.ws_frames.unmask` (websockets' compiled ``apply_mask`` where it is built): every
    client frame is masked, and an 80 ms audio append is several KB."""
    n = len(data)
    if not n:
        return bytearray()
    out = bytearray(unmask(bytes(data), bytes(self._masking_key)))
    rotation = n % 4
    self._masking_key = self._masking_key[rotation:] + self._masking_key[:rotation]
    return out


def install_unmask() -> None:
    """Install :func:`_unmask` in wsproto (process-wide, idempotent)."""
    frame_protocol.XorMaskerSimple.process = _unmask  # type: ignore[method-assign]


_original_app_send = ws_stream.WSStream.app_send


async def _app_send_many(self: Any, message: Any) -> None:
    """hypercorn's ``app_send``, and :data:`~.asgi_ws.SEND_MANY`: each message framed as
    wsproto frames it for hypercorn (web/ws_frames.py), then one write for all, at once when
    the socket takes it (:func:`_write_now`), else through hypercorn's send lock."""
    if message is None or message.get("type") != SEND_MANY:
        await _original_app_send(self, message)
        return
    if self.closed or self.state != ws_stream.ASGIWebsocketState.CONNECTED:
        return  # hypercorn drops a send after the close too
    if self.connection.state is not wsproto.connection.ConnectionState.OPEN:
        return  # closing: wsproto refuses a message, and hypercorn's _send_wsproto_event drops it
    # Whole frames, as wsproto frames a message for hypercorn (which never fragments one).
    data = b"".join([server_frame(item) for item in message["messages"]])
    written = _write_now(_tcp_server_of(self), data)
    if written < len(data):
        await self.send(Data(stream_id=self.stream_id, data=data[written:] if written else data))


def _tcp_server_of(stream: Any) -> Any:
    """The hypercorn ``TCPServer`` under a WebSocket stream (its ``send`` is the HTTP/1.1
    protocol's ``stream_send``, whose ``send`` is the server's ``protocol_send``), or None."""
    tcp = getattr(stream, "_duplex_tcp", False)
    if tcp is False:
        tcp = getattr(getattr(getattr(stream.send, "__self__", None), "send", None), "__self__", None)
        if not isinstance(tcp, tcp_server.TCPServer):
            tcp = None
        stream._duplex_tcp = tcp
    return tcp


def _plain_socket(tcp: Any) -> Any:
    """The trio socket of a connection without TLS, or None."""
    stream = getattr(tcp, "stream", None)
    return stream.socket if type(stream) is trio.SocketStream else None


def _free_fd(tcp: Any) -> int:
    """The descriptor a write may go to at once, without a checkpoint: no send holds the
    connection's send lock and no bytes of an earlier write wait (``_duplex_unsent``); -1 when
    the caller must take hypercorn's locked path (TLS, a send in progress, bytes waiting, our FIN
    sent, a closed socket)."""
    if tcp is None or tcp.send_lock.locked() or tcp.__dict__.get("_duplex_unsent"):
        return -1
    sock = _plain_socket(tcp)
    if sock is None or sock.did_shutdown_SHUT_WR:
        return -1
    return int(sock.fileno())


def _write_now(tcp: Any, data: bytes) -> int:
    """The bytes of ``data`` that the kernel took at once, written without a checkpoint when
    :func:`_free_fd` allows (hypercorn's path takes the lock, a cancel scope and a scheduler
    round per write: a tick's message costs none of them); 0 when the caller must take that
    path (what :func:`_free_fd` refuses, a full socket buffer, an error: the locked path meets
    the error again and handles it as hypercorn does)."""
    return _write_fd(_free_fd(tcp), data)


def _write_fd(fd: int, data: bytes) -> int:
    """What ``os.write`` took of ``data`` (0: ``fd`` is -1, the socket is full, or an error)."""
    if fd < 0:
        return 0
    try:
        return os.write(fd, data)
    except OSError:
        return 0


def send_now(stream: Any, make: Callable[[], list[str | bytes]]) -> int:
    """The app's messages (``make()``: built only once they can go) framed and written without
    a checkpoint, for a caller that cannot await (the session actor emitting a step's events
    in whichever task delivered the step).
    :data:`~.asgi_ws.NOT_SENT`: nothing done, ``make`` not called (the stream is not open both
    ways, TLS, a send holds the lock or bytes of an earlier write wait): the caller sends them
    the awaited way.
    :data:`~.asgi_ws.SENT`: all written. :data:`~.asgi_ws.PENDING`: the socket took part or
    none of them (full, or an error): the rest waits in the connection's unsent bytes, which
    the next write under the send lock sends first (:func:`_protocol_send`); the caller runs
    :func:`flush_unsent` so that one does."""
    if (
        stream.closed
        or stream.state != ws_stream.ASGIWebsocketState.CONNECTED
        or stream.connection.state is not wsproto.connection.ConnectionState.OPEN
    ):
        return NOT_SENT
    tcp = _tcp_server_of(stream)
    fd = _free_fd(tcp)
    if fd < 0:
        return NOT_SENT
    data = b"".join([server_frame(item) for item in make()])
    written = _write_fd(fd, data)  # 0 when full, or an error the locked write meets again
    if written == len(data):
        return SENT
    tcp._duplex_unsent = data[written:]
    return PENDING


async def flush_unsent(stream: Any) -> None:
    """Write what :func:`send_now` left unsent (nothing when another send wrote it first)."""
    tcp = _tcp_server_of(stream)
    if tcp is not None and tcp.__dict__.get("_duplex_unsent"):
        await tcp.protocol_send(RawData(b""))


_original_protocol_send = tcp_server.TCPServer.protocol_send


async def _protocol_send(self: Any, event: Any) -> None:
    """hypercorn's ``protocol_send``; a write under the send lock first sends the bytes that
    :func:`send_now` left unsent, so that nothing overtakes the rest of a frame."""
    if type(event) is not RawData:
        await _original_protocol_send(self, event)
        return
    async with self.send_lock:
        data = event.data
        unsent = self.__dict__.get("_duplex_unsent")
        if unsent:
            self._duplex_unsent = b""
            data = unsent + data
        if not data:
            return
        try:
            with trio.CancelScope(shield=True):
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())


def send_many_in_one_write() -> None:
    """Teach hypercorn's WebSocket stream :data:`~.asgi_ws.SEND_MANY` (process-wide, idempotent)."""
    ws_stream.WSStream.app_send = _app_send_many  # type: ignore[method-assign]
    tcp_server.TCPServer.protocol_send = _protocol_send  # type: ignore[method-assign]


def end_oversize_streams() -> None:
    """After a 1009 (message too big) close, disconnect the app as a normal close does."""
    ws_stream.WSStream._handle_events = _handle_events_ending_oversize  # type: ignore[method-assign]


@attrs.frozen(slots=True)
class TransportLimits:
    """Process-wide bounds of the patched TCP server (``serve`` flags / ``DUPLEX_*``)."""

    body_timeout_s: float = 10.0  # from the end of a request head to the end of its body
    keep_alive_timeout_s: float | None = None  # None: hypercorn's own (its --keep-alive)
    max_connections: int | None = None  # open TCP connections; beyond, a new one is closed at once
    close_linger_s: float = 2.0  # after our FIN, how long the peer's input is read and dropped


_limits = TransportLimits()
_open_connections = 0
_original_tcp_run = tcp_server.TCPServer.run
_on_connection_error: list[Callable[[str], None]] = []
_on_connection_dropped: list[Callable[[str], None]] = []


def open_connections() -> int:
    return _open_connections


# What a peer that breaks HTTP or WebSocket causes in our sends (data after the upgrade request
# makes hypercorn answer 400 itself, and the app's 101 then fails; a reset fails a send).
_PEER_ERRORS: tuple[type[BaseException], ...] = (
    h11.LocalProtocolError,
    h11.RemoteProtocolError,
    wsproto.utilities.LocalProtocolError,
    wsproto.utilities.RemoteProtocolError,
    trio.BrokenResourceError,
)


def peer_error(exc: BaseException) -> BaseException | None:
    """The first error when every error in ``exc`` (a group included) is one a peer's
    misbehaviour causes; None when any of them is the server's own."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [peer_error(inner) for inner in exc.exceptions]
        return leaves[0] if leaves and all(leaf is not None for leaf in leaves) else None
    return exc if isinstance(exc, _PEER_ERRORS) else None


@attrs.define
class _PeerErrorReport:
    reported: bool = False


# One per TCP connection, set by its ``run``; the app's tasks inherit it with their context.
_peer_error_report: contextvars.ContextVar[_PeerErrorReport | None] = contextvars.ContextVar(
    "duplex_peer_error_report", default=None
)


def report_peer_error(where: str, error: BaseException) -> bool:
    """One WARNING line per connection for a peer's protocol error (the app's handler and
    hypercorn's connection task both see it), never a traceback; False when this connection's
    was already reported (so it is counted once)."""
    report = _peer_error_report.get()
    if report is not None and report.reported:
        log.debug("peer protocol error (%s, already reported): %r", where, error)
        return False
    if report is not None:
        report.reported = True
    log.warning(
        "dropped a connection after the peer's protocol error (%s): %s: %s",
        where,
        type(error).__name__,
        error,
    )
    return True


def _dropped(reason: str) -> None:
    for hook in _on_connection_dropped:
        hook(reason)


async def _guarded_tcp_run(self: Any) -> None:
    global _open_connections
    if _limits.max_connections is not None and _open_connections >= _limits.max_connections:
        log.warning("closed a new connection: %d are open (--max-connections)", _open_connections)
        _dropped("max_connections")
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
        return
    if _limits.keep_alive_timeout_s is not None:
        self.config.keep_alive_timeout = _limits.keep_alive_timeout_s  # the hypercorn entry's DUPLEX_*
    _open_connections += 1
    self._duplex_counted = True
    _peer_error_report.set(_PeerErrorReport())
    try:
        await _original_tcp_run(self)
    except Exception as exc:  # e.g. h11 LocalProtocolError after a bad upgrade (hypercorn #225)
        error = peer_error(exc)
        if error is None:
            log.warning("dropped a connection after a protocol error: %r", exc)
        if error is None or report_peer_error("connection", error):
            for hook in _on_connection_error:
                hook(type(error or exc).__name__)
    finally:
        _uncount(self)


def _uncount(self: Any) -> None:
    """Once its socket is closed (hypercorn's task can outlive it: the keep-alive timer)."""
    global _open_connections
    if getattr(self, "_duplex_counted", False):
        self._duplex_counted = False
        _open_connections -= 1


def _awaiting_body(wrapper: Any) -> bool:
    """The peer owes us the body of an HTTP/1.1 request (not a WebSocket: its frames are data)."""
    protocol = getattr(wrapper, "protocol", None)
    if not isinstance(protocol, H11Protocol) or not isinstance(protocol.connection, h11.Connection):
        return False
    return protocol.connection.their_state is h11.SEND_BODY


async def _read_data(self: Any) -> None:
    """hypercorn's read loop, with a deadline on request bodies; it says when it has ended, and
    it is the one that reads and drops the peer's input while a close from another task lingers
    (that close sets the loop's deadline: :func:`_lingering_close`)."""
    self._duplex_reader = trio.lowlevel.current_task()
    self._duplex_reader_done = trio.Event()
    self._duplex_linger = trio.CancelScope()
    body_since: float | None = None
    sock = _plain_socket(self)
    try:
        with self._duplex_linger:
            while True:
                if sock is not None and not self.config.read_timeout and "_duplex_ws_parts" in self.__dict__:
                    deadline = math.inf  # upgraded to a WebSocket: no request body to time
                else:
                    now = trio.current_time()
                    deadline = now + self.config.read_timeout if self.config.read_timeout else math.inf
                    if _awaiting_body(self.protocol):
                        body_since = now if body_since is None else body_since
                        deadline = min(deadline, body_since + _limits.body_timeout_s)
                    else:
                        body_since = None
                timer: trio.CancelScope | None = None
                try:
                    if deadline == math.inf and sock is not None:
                        # A WebSocket's frames: no scope per read, and a wait then one read
                        # (trio's receive_some reads first, fails when the frame has not come,
                        # and takes a scheduler round after a read that succeeds).
                        fd = sock.fileno()
                        if fd < 0:  # closed by another task (trio would say so)
                            break
                        if (ws := _streaming_websocket(self)) is not None:
                            # The app takes its messages at once: the front end's one reader
                            # reads this socket until a read leaves something to this task.
                            take = partial(_take_at_once, ws, ws.connection, ws.buffer.max_length)
                            left = await shared_reader().wait(fd, take)
                            if left is READ_FAILED:
                                break
                            if left is _EOF:
                                data = b""
                            else:
                                # What is left goes to hypercorn below, as it is: it starts
                                # with no whole data frame, or the stream is no longer open.
                                messages, data = left
                                await _queue_messages(ws, messages)
                                if not data:
                                    continue
                        else:
                            await trio.lowlevel.wait_readable(sock)
                            try:
                                data = os.read(sock.fileno(), tcp_server.MAX_RECV)
                            except BlockingIOError:
                                continue
                            except OSError:
                                break
                    elif deadline == math.inf:
                        data = await self.stream.receive_some(tcp_server.MAX_RECV)
                    else:
                        with trio.move_on_at(deadline) as timer:
                            data = await self.stream.receive_some(tcp_server.MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                if timer is not None and timer.cancelled_caught:
                    if body_since is not None and trio.current_time() >= body_since + _limits.body_timeout_s:
                        log.info(
                            "closed a connection whose request body did not come in %.1f s",
                            _limits.body_timeout_s,
                        )
                        _dropped("body_timeout")
                    break
                if data and (ws := _open_websocket(self)) is not None:
                    data = await _deliver_leading_messages(ws, bytes(data))
                    if not data:
                        continue
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
        await self.protocol.handle(Closed())
    finally:
        self._duplex_reader_done.set()


def _release_socket(tcp: Any) -> None:
    """Before the connection's socket is closed: the front end's one reader lets it go
    (web/shared_reader.py), and wakes its task if it is parked there."""
    sock = _plain_socket(tcp)
    if sock is not None and (fd := sock.fileno()) >= 0:
        release_if_parked(fd)


_original_initiate_server_close = tcp_server.TCPServer._initiate_server_close


async def _initiate_server_close(self: Any) -> None:
    """hypercorn's close of an idle connection, which closes its socket itself."""
    _release_socket(self)
    await _original_initiate_server_close(self)


def _open_websocket(tcp: Any) -> Any:
    """The connection's WebSocket stream when a read may bypass hypercorn and wsproto for its
    leading data frames (web/ws_frames.py): open both ways, and nothing of an earlier read
    pending anywhere (a partial frame, a fragmented message, queued events); else None."""
    parts = tcp.__dict__.get("_duplex_ws_parts")
    if parts is None:
        parts = _websocket_parts(tcp)
        if parts is None:
            return None
        tcp._duplex_ws_parts = parts  # the objects of an upgraded connection stay its own
    connection, ws, wsp, decoder, messages = parts
    if (
        connection.buffer
        or ws.closed
        or ws.state != ws_stream.ASGIWebsocketState.CONNECTED
        or ws.buffer.value is not None
        or wsp.state is not wsproto.connection.ConnectionState.OPEN
        or wsp._events
        or decoder.header is not None
        or len(decoder.buffer)
        or messages.opcode is not None
    ):
        return None
    return ws


def _websocket_parts(tcp: Any) -> tuple[Any, Any, Any, Any, Any] | None:
    """What :func:`_open_websocket` reads of an upgraded connection: hypercorn's WebSocket
    connection and stream, wsproto's connection, frame decoder and message decoder (None
    before the upgrade, or when one of them is not the kind it knows)."""
    protocol = getattr(getattr(tcp, "protocol", None), "protocol", None)
    if type(protocol) is not H11Protocol:
        return None
    connection = protocol.connection
    if type(connection) is not H11WSConnection:
        return None
    ws = protocol.stream
    if type(ws) is not ws_stream.WSStream:
        return None
    wsp = getattr(ws, "connection", None)  # set by the accept
    frames = getattr(wsp, "_proto", None)
    decoder = getattr(frames, "_frame_decoder", None)
    messages = getattr(frames, "_message_decoder", None)
    if (
        decoder is None
        or messages is None
        or not hasattr(wsp, "_events")
        or not hasattr(decoder, "header")
        or not hasattr(messages, "opcode")
    ):
        return None
    return connection, ws, wsp, decoder, messages


async def _deliver_leading_messages(ws: Any, data: bytes) -> bytes:
    """Hand the app the messages of the whole data frames that ``data`` starts with, as
    hypercorn would; returns the rest, for hypercorn."""
    messages, used = leading_messages(data, ws.buffer.max_length)
    await _queue_messages(ws, messages[_taken_at_once(ws, messages) :])
    return data[used:] if used else data


def _taken_at_once(ws: Any, messages: list[str | bytes]) -> int:
    """How many of ``messages`` the app takes at once, in order. It takes a message when its
    reader waits with nothing queued (web/asgi_ws.py): no task wakes for it. Once one is
    queued, the rest queue behind it."""
    direct = ws.scope.get(DIRECT_RECEIVE_SCOPE)
    if direct is None:
        return 0
    for index, message in enumerate(messages):
        if not direct(message):
            return index
    return len(messages)


async def _queue_messages(ws: Any, messages: list[str | bytes]) -> None:
    """Queue ``messages`` for the app, in order, as hypercorn would deliver them."""
    for message in messages:
        if type(message) is str:
            await ws.app_put({"type": "websocket.receive", "bytes": None, "text": message})
        else:
            await ws.app_put({"type": "websocket.receive", "bytes": message, "text": None})


_EOF: Any = object()  # what :func:`_take_at_once` leaves to the connection's task at the peer's EOF


def _streaming_websocket(tcp: Any) -> Any:
    """The connection's WebSocket stream when the front end's one reader may read its socket:
    :func:`_open_websocket`'s, and an app that takes messages at once (web/asgi_ws.py)."""
    ws = _open_websocket(tcp)
    if ws is None or ws.scope.get(DIRECT_RECEIVE_SCOPE) is None:
        return None
    return ws


def _take_at_once(ws: Any, wsp: Any, max_payload: int, data: bytes) -> Any:
    """A read of a streaming connection's socket, in the front end's one reader
    (web/shared_reader.py): the app takes the messages of the whole data frames it starts with
    at once, and None is returned (nothing for the connection's task); else what is left to
    that task: ``(messages not taken, the rest of the bytes)``, or :data:`_EOF`.

    Of :func:`_open_websocket`'s checks, only those the app can change are made again: every
    read since the socket was parked went to the app whole, so nothing was fed to hypercorn or
    wsproto, and nothing is pending in their buffers."""
    if not data:
        return _EOF
    if ws.closed or ws.state is not _CONNECTED or wsp.state is not _OPEN:
        return [], data
    messages, used = leading_messages(data, max_payload)
    taken = _taken_at_once(ws, messages)
    if taken < len(messages) or used < len(data):
        return messages[taken:], data[used:]
    return None


_CONNECTED = ws_stream.ASGIWebsocketState.CONNECTED
_OPEN = wsproto.connection.ConnectionState.OPEN


async def _send_eof(self: Any) -> None:
    """Our FIN, never beside a ``send_all`` (both hold trio's send conflict detector across a
    checkpoint: the loser raises ``BusyResourceError``, in the app when it is the send)."""
    lock: trio.Lock = self.send_lock
    try:
        if lock.statistics().owner is trio.lowlevel.current_task():
            await self.stream.send_eof()  # closing from inside a failed send
            return
        with trio.move_on_after(_limits.close_linger_s):  # a send blocked on a peer that stopped reading
            async with lock:
                unsent = self.__dict__.get("_duplex_unsent")
                if unsent:  # the rest of a frame goes before the FIN
                    self._duplex_unsent = b""
                    await self.stream.send_all(unsent)
                await self.stream.send_eof()
    except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError, AttributeError):
        pass  # gone already, or a TLS stream (no half-close)


async def _discard_until_eof(stream: Any) -> None:
    try:
        while await stream.receive_some(tcp_server.MAX_RECV):
            pass
    except (trio.ClosedResourceError, trio.BrokenResourceError, trio.BusyResourceError):
        pass


def _peer_may_send(self: Any) -> bool:
    """A WebSocket peer streams until it reads our close frame; an HTTP peer (an answered
    request) only if its input is already waiting in the socket (a body we did not read)."""
    protocol = getattr(getattr(self, "protocol", None), "protocol", None)
    if isinstance(getattr(protocol, "connection", None), H11WSConnection):
        return True
    stream = getattr(self.stream, "transport_stream", self.stream)  # TLS: the socket beneath
    try:
        waiting = array.array("i", [0])
        fcntl.ioctl(stream.socket.fileno(), termios.FIONREAD, waiting)
    except (AttributeError, OSError):
        return True  # cannot tell: linger, as RFC 9112 section 9.6 asks
    return waiting[0] > 0


async def _lingering_close(self: Any) -> None:
    """Half-close, then read and drop the peer's input until its EOF or the linger ends, then
    close (RFC 6455 section 7.1.1; the client closes once it sees our close frame and FIN):
    closing with unread input sends RST, and the client's next send fails.

    Only the read loop closes a socket it is still reading. A close from another task (the
    app's, which quart-trio or our own handler may cancel at any point) sends the FIN, gives the
    read loop the linger's deadline and returns: the loop drops what comes until the peer's EOF
    or that deadline, then hypercorn's ``run`` closes (a cancelled app task would skip the
    linger and reset its client). An HTTP peer with no input waiting owes us nothing, so its
    connection closes at once (a linger would let a head with no body hold a descriptor for the
    whole linger)."""
    done: trio.Event | None = getattr(self, "_duplex_reader_done", None)
    reading = done is not None and not done.is_set()
    in_reader = reading and self._duplex_reader is trio.lowlevel.current_task()
    handed_to_reader = False
    try:
        if not getattr(self, "_duplex_eof_sent", False):
            self._duplex_eof_sent = True
            with trio.CancelScope(shield=True):  # bounded: the send lock waits at most the linger
                await _send_eof(self)
        if reading and not in_reader and _peer_may_send(self):
            linger: trio.CancelScope = self._duplex_linger
            linger.deadline = min(linger.deadline, trio.current_time() + _limits.close_linger_s)
            handed_to_reader = True
            return
        if in_reader:  # closing from inside the read loop (an HTTP error answer, a protocol close)
            with trio.move_on_after(_limits.close_linger_s):
                await _discard_until_eof(self.stream)
    finally:
        if not handed_to_reader:  # the read loop closes what it lingers over
            _release_socket(self)
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
            _uncount(self)


async def _spawn_app(self: Any, app: Any, config: Any, scope: Any, send: Any) -> Any:
    """hypercorn's, but no put waits on an app that cannot take it: a message for an app that
    has finished is dropped, and a disconnect for an app that is not reading (its queue full)
    cancels it (hypercorn's own waits on a full queue forever: a disconnect that an app blocked
    in a send never takes would keep its handler, its tasks and its socket)."""
    app_send, app_receive = trio.open_memory_channel[Any](config.max_app_queue_size)
    cancel_scope = trio.CancelScope()
    stream = getattr(send, "__self__", None)
    if type(stream) is ws_stream.WSStream:  # the app's sends that need no await (web/asgi_ws.py)
        scope[SEND_NOW_SCOPE] = lambda make: send_now(stream, make)
        scope[FLUSH_SCOPE] = lambda: flush_unsent(stream)

    async def run() -> None:
        with cancel_scope:
            try:
                await task_group._handle(
                    app,
                    config,
                    scope,
                    app_receive.receive,
                    send,
                    trio.to_thread.run_sync,
                    trio.from_thread.run,
                )
            finally:
                app_receive.close()

    self._nursery.start_soon(run)

    async def put(message: Any) -> None:
        try:
            if message.get("type") in ("websocket.disconnect", "http.disconnect"):
                try:
                    app_send.send_nowait(message)
                except trio.WouldBlock:
                    log.info("the app did not read its input: cancelled it at the client's disconnect")
                    cancel_scope.cancel()
                hook = scope.get(DISCONNECT_HOOK_SCOPE)
                if hook is not None:  # the raw WebSocket path (web/asgi_ws.py) ends its handler
                    hook(message.get("code"))
                return
            try:
                # No scheduler round per message: the frames of one read are queued together
                # (when the queue is full, the put waits as before).
                app_send.send_nowait(message)
            except trio.WouldBlock:
                await app_send.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the app has finished

    return put


def guard_connections(
    on_error: Callable[[str], None] | None = None,
    *,
    limits: TransportLimits | None = None,
    on_dropped: Callable[[str], None] | None = None,
) -> None:
    """Contain hypercorn's per-connection exceptions: without this, an Upgrade request followed
    by trailing bytes raises inside hypercorn's TCP handler and takes the whole process down
    (https://github.com/pgjones/hypercorn/issues/225). Also bound request bodies and open connections,
    close without RST, and never wait on a finished app (see the module's docstring).
    Process-wide and idempotent; ``on_dropped(reason)`` counts what the bounds closed."""
    global _limits
    tcp_server.TCPServer.run = _guarded_tcp_run  # type: ignore[method-assign]
    tcp_server.TCPServer._read_data = _read_data  # type: ignore[method-assign]
    tcp_server.TCPServer._close = _lingering_close  # type: ignore[method-assign]
    tcp_server.TCPServer._initiate_server_close = _initiate_server_close  # type: ignore[method-assign]
    task_group.TaskGroup.spawn_app = _spawn_app  # type: ignore[method-assign]
    _limits = limits or TransportLimits()
    _on_connection_error.clear()
    if on_error is not None:
        _on_connection_error.append(on_error)
    _on_connection_dropped.clear()
    if on_dropped is not None:
        _on_connection_dropped.append(on_dropped)


# Descriptors kept for what is not a connection: session logs, the model's files, the
# listening sockets, trio's wakeup pipe, worker threads' files.
RESERVED_DESCRIPTORS = 64


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (idempotent); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def default_max_connections(descriptor_limit: int, max_sessions: int) -> int:
    """Open connections that leave room for every session's log and the process's own files."""
    return max(16, descriptor_limit - RESERVED_DESCRIPTORS - 2 * max_sessions)


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

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """One connection (not the lifespan), its errors contained by the caller."""
        await self.app(scope, receive, send)

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
            await self.serve(scope, receive, send)
        except Exception as exc:  # one connection's failure stays with that connection
            error = peer_error(exc)
            if error is None:
                log.exception("connection failed: %s %s", scope.get("type"), scope.get("path"))
            reported = error is None or report_peer_error(f"{scope.get('type')} {scope.get('path')}", error)
            if self.on_error is not None and reported:
                self.on_error(type(error or exc).__name__)
