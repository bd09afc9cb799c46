"""Hardening pieces that are checked best from inside: socket options, slow consumers, crashes."""

from __future__ import annotations

import json
import math
import socket
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypercorn.trio import serve
from hypothesis import given
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, open_websocket_url

from duplex_actors.config import ServerConfig
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev
from duplex_actors.web import dialects
from duplex_actors.web.hardening import TCP_USER_TIMEOUT_MS, HardenedConfig, _write_now


def test_listening_sockets_carry_tcp_user_timeout():
    config = HardenedConfig()
    config.bind = ["127.0.0.1:0"]
    sockets = config.create_sockets()
    try:
        (sock,) = sockets.insecure_sockets
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == TCP_USER_TIMEOUT_MS
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()


@pytest.fixture(scope="module")
def parrot_engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=2)


async def test_a_consumer_that_stops_reading_is_closed_without_blocking_anyone(parrot_engine, tmp_path):
    """The outbox is bounded: a session whose events nobody reads closes itself (slow_consumer)
    while another session keeps going."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    async with open_duplex_server(
        parrot_engine, log_dir=tmp_path, virtual_time=True, outbox_size=8
    ) as server:
        stuck = await server.open_session()
        fine = await server.open_session()
        got: list = []

        async def read_fine():
            async for e in fine.events():
                got.append(e)

        server._nursery.start_soon(read_fine)
        frame = np.full(1920, 0.1, dtype=np.float32)
        for k in range(12):
            if not stuck.closed:
                await stuck.append(frame)
            await fine.append(frame)
            with trio.fail_after(5):  # the frame is stepped and its output read
                while sum(isinstance(e, ev.AudioFrame) for e in got) <= k:
                    await trio.sleep(0.01)
        assert stuck.closed and stuck.core.closed
        assert server.counters.sessions_closed["slow_consumer"] == 1
        assert sum(isinstance(e, ev.AudioFrame) for e in got) == 12
        await fine.close()
    del clock


async def test_an_unhandled_error_becomes_an_error_event_and_close_1011(parrot_dir, tmp_path, monkeypatch):
    from duplex_actors.app import create_app
    from duplex_actors.web.hardening import HardenedConfig

    def broken(event, config):
        raise RuntimeError("boom")

    monkeypatch.setattr(dialects, "_command", broken)
    app: Any = create_app(ServerConfig(model="tiny-parrot", max_sessions=1, log_dir=str(tmp_path)))
    hyper = HardenedConfig()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hyper.bind = [f"127.0.0.1:{port}"]
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        nursery.start_soon(lambda: serve(app, hyper, shutdown_trigger=stop.wait))
        with trio.fail_after(60):
            while app.holder.server is None:
                await trio.sleep(0.1)
        messages = []
        async with open_websocket_url(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await ws.send_message(json.dumps({"type": "session.heartbeat"}))
            with trio.fail_after(20):
                try:
                    while True:
                        messages.append(json.loads(await ws.get_message()))
                except ConnectionClosed as closed:
                    assert closed.reason is not None
                    code = closed.reason.code
        stop.set()
    errors = [m["error"]["code"] for m in messages if m["type"] == "error"]
    assert errors == ["internal_error"] and code == 1011


# -- the transport bounds (docs/design.md §2 "Budgets and hardening") -------------------------------------------------------
async def _read_body_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that reads the whole request body before it answers (no route of ours does)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serve_guarded(
    limits: Any, dropped: list[str], app: Any = _read_body_app, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    from duplex_actors.web.hardening import guard_connections, open_connections

    guard_connections(limits=limits, on_dropped=dropped.append)
    hyper = HardenedConfig()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hyper.bind = [f"127.0.0.1:{port}"]
    hyper.accesslog = None
    hyper.keep_alive_timeout = 1.0  # hypercorn frees a connection its client closed after this
    hyper.graceful_timeout = 0.1
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve(app, hyper, shutdown_trigger=stop.wait))
        with trio.fail_after(10):
            while True:
                try:
                    (await trio.open_tcp_stream("127.0.0.1", port)).socket.close()
                    break
                except OSError:
                    await trio.sleep(0.02)
            while open_connections() > 0:  # the probe's, freed after the keep-alive timeout
                await trio.sleep(0.02)
        task_status.started((port, stop))


async def _until_eof(stream: trio.SocketStream, timeout: float) -> bytes:
    got = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            got += chunk
    return got


async def test_a_request_body_that_does_not_come_in_time_closes_its_connection():
    from duplex_actors.web.hardening import TransportLimits, guard_connections

    dropped: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            port, stop = await nursery.start(_serve_guarded, TransportLimits(body_timeout_s=0.5), dropped)
            slow = await trio.open_tcp_stream("127.0.0.1", port)
            await slow.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
            fine = await trio.open_tcp_stream("127.0.0.1", port)
            await fine.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
            await fine.send_all(b"67890")
            answered = b""
            with trio.fail_after(5):
                while not answered.endswith(b"ok"):
                    answered += await fine.receive_some(65536)
            t0 = trio.current_time()
            got = await _until_eof(slow, timeout=5)  # the server closes it: EOF
            waited = trio.current_time() - t0
            stop.set()
    finally:
        guard_connections()  # the process-wide defaults again
    assert answered.startswith(b"HTTP/1.1 200") and got == b""
    assert dropped == ["body_timeout"] and waited < 2.0


async def test_connections_beyond_the_bound_are_closed_at_once():
    from duplex_actors.web.hardening import TransportLimits, guard_connections, open_connections

    dropped: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            port, stop = await nursery.start(_serve_guarded, TransportLimits(max_connections=3), dropped)
            held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]  # idle (< 1 s)
            with trio.fail_after(5):
                while open_connections() < 3:
                    await trio.sleep(0.01)
            extra = await trio.open_tcp_stream("127.0.0.1", port)
            refused = await _until_eof(extra, timeout=5)
            await held[0].aclose()
            with trio.fail_after(5):
                while open_connections() > 2:
                    await trio.sleep(0.01)
            again = await trio.open_tcp_stream("127.0.0.1", port)
            await again.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
            answer = b""
            with trio.fail_after(5):
                while not answer.endswith(b"ok"):
                    answer += await again.receive_some(65536)
            stop.set()
    finally:
        guard_connections()
    assert refused == b"" and dropped == ["max_connections"] and answer.startswith(b"HTTP/1.1 200")


def test_the_default_connection_bound_leaves_room_for_the_logs():
    import resource

    from duplex_actors.web.hardening import (
        RESERVED_DESCRIPTORS,
        default_max_connections,
        raise_descriptor_limit,
    )

    soft = raise_descriptor_limit()
    assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert default_max_connections(256, 4) == 256 - RESERVED_DESCRIPTORS - 8
    assert default_max_connections(40, 8) == 16  # never below a usable floor


def test_the_transport_settings_come_from_the_environment_too():
    from duplex_actors.config import ConfigError

    config = ServerConfig.from_env(
        {"DUPLEX_BODY_TIMEOUT": "3", "DUPLEX_KEEP_ALIVE_TIMEOUT": "7", "DUPLEX_MAX_CONNECTIONS": "100"}
    )
    assert (config.body_timeout_s, config.keep_alive_timeout_s, config.max_connections) == (3.0, 7.0, 100)
    default = ServerConfig.from_env({})
    assert (default.body_timeout_s, default.keep_alive_timeout_s, default.max_connections) == (
        10.0,
        None,
        None,
    )
    with pytest.raises(ConfigError, match="DUPLEX_MAX_CONNECTIONS"):
        ServerConfig.from_env({"DUPLEX_MAX_CONNECTIONS": "many"})


async def _close_1012_cancelled_at_once(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A WebSocket app that closes with 1012 and ends its stream in a task cancelled 50 ms later.
    hypercorn closes the connection in whichever task ends the stream (its ``send(None)`` after
    the app returns: the app's task), and that task can be cancelled (a disconnect, the server's
    shutdown); ``send(None)`` here is that end, called where the cancellation is ours to time."""
    if scope["type"] == "lifespan":
        await _read_body_app(scope, receive, send)
        return
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": 1012})
    with trio.move_on_after(0.05):
        await send(None)


async def test_a_close_whose_task_is_cancelled_still_lingers_for_a_streaming_client():
    """The client keeps streaming for 0.3 s after the close frame (a busy client reacts late),
    then closes its side. Every one of its sends must succeed: the server drops that input until
    the client's EOF. The close used to wait for the read loop in the app's task, so cancelling
    that task closed the socket with the input unread: a reset, and the client's send failed."""
    from duplex_actors.web.hardening import TransportLimits, guard_connections, open_connections

    from ..reliability.conftest import OP_BINARY, OP_CLOSE, RawWS, frame_bytes

    chunk = frame_bytes(OP_BINARY, bytes(3840))
    sent_after_close = 0
    send_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            port, stop = await nursery.start(
                _serve_guarded, TransportLimits(close_linger_s=5.0), [], _close_1012_cancelled_at_once
            )
            ws = await RawWS.connect(port, "/")
            assert ws.status == 101, ws.head
            close_seen = trio.Event()

            async def stream() -> None:
                nonlocal sent_after_close, send_error
                stop_at = math.inf
                while trio.current_time() < stop_at:
                    try:
                        await ws.send(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        send_error = exc.__cause__ or exc
                        return
                    if close_seen.is_set():
                        sent_after_close += 1
                        if stop_at == math.inf:
                            stop_at = trio.current_time() + 0.3
                    await trio.sleep(0.001)
                await ws.stream.send_eof()

            async with trio.open_nursery() as client:
                client.start_soon(stream)
                await ws.recv_until(lambda frame: frame[0] == OP_CLOSE, timeout=5)
                close_seen.set()
            await ws.read_to_eof(timeout=5)
            await ws.aclose()
            with trio.fail_after(5):
                while open_connections() > 0:
                    await trio.sleep(0.01)
            stop.set()
    finally:
        guard_connections()
    assert ws.close_code == 1012
    assert send_error is None and sent_after_close >= 10, (send_error, sent_after_close)


async def _answer_without_reading(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _read_body_app(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def test_an_answered_http_peer_with_nothing_waiting_is_closed_at_once():
    """A head whose body never comes, answered at once: nothing of the peer's waits in the
    socket, so no linger (5 s here) holds its descriptor; the connection is gone at once."""
    from duplex_actors.web.hardening import TransportLimits, guard_connections, open_connections

    try:
        async with trio.open_nursery() as nursery:
            port, stop = await nursery.start(
                _serve_guarded, TransportLimits(close_linger_s=5.0), [], _answer_without_reading
            )
            peer = await trio.open_tcp_stream("127.0.0.1", port)
            await peer.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            t0 = trio.current_time()
            answer = await _until_eof(peer, timeout=5)
            with trio.fail_after(5):
                while open_connections() > 0:
                    await trio.sleep(0.01)
            freed_after = trio.current_time() - t0
            await peer.aclose()
            stop.set()
    finally:
        guard_connections()
    assert answer.startswith(b"HTTP/1.1 404")
    assert freed_after < 1.0, freed_after


@given(
    key=st.binary(min_size=4, max_size=4),
    # Both of ws_frames.unmask's ways: Python ints below NUMPY_UNMASK_FROM (2048), numpy from it.
    chunks=st.lists(st.one_of(st.binary(max_size=1100), st.binary(min_size=2040, max_size=5300)), max_size=6),
)
def test_the_numpy_unmasking_is_wsprotos(key: bytes, chunks: list[bytes]) -> None:
    from wsproto.frame_protocol import XorMaskerSimple

    from duplex_actors.web.hardening import WSPROTO_UNMASK, _unmask

    assert WSPROTO_UNMASK is not _unmask
    theirs, ours = XorMaskerSimple(key), XorMaskerSimple(key)
    for chunk in chunks:
        assert _unmask(ours, bytearray(chunk)) == WSPROTO_UNMASK(theirs, bytearray(chunk))
        assert ours._masking_key == theirs._masking_key


async def test_a_write_at_once_takes_what_the_socket_takes_and_leaves_the_rest_to_the_lock():
    """``_write_now``: all of it when the socket has room; none while another send holds the
    lock, once the buffer is full, after our FIN, or on a closed socket (the locked path takes
    those, and meets their errors); the part the kernel took when it takes only part."""
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = trio.SocketStream(a)
    tcp = SimpleNamespace(stream=stream, send_lock=trio.Lock())
    try:
        assert _write_now(tcp, b"tick") == 4
        assert await b.recv(16) == b"tick"
        async with tcp.send_lock:
            assert _write_now(tcp, b"held") == 0
        big = b"x" * (4 << 20)
        taken = _write_now(tcp, big)
        assert 0 < taken < len(big)
        assert _write_now(tcp, big) == 0  # full: EAGAIN
        received = 0
        while received < taken:
            received += len(await b.recv(1 << 20))
        assert received == taken
        await stream.send_eof()
        assert _write_now(tcp, b"late") == 0
        await stream.aclose()
        assert _write_now(tcp, b"closed") == 0
    finally:
        await stream.aclose()
        b.close()


def _open_stream(tcp: Any) -> Any:
    """A WebSocket stream as ``send_now`` reads it: open both ways, over ``tcp``."""
    from hypercorn.protocol import ws_stream
    from wsproto.connection import ConnectionState

    return SimpleNamespace(
        closed=False,
        state=ws_stream.ASGIWebsocketState.CONNECTED,
        connection=SimpleNamespace(state=ConnectionState.OPEN),
        _duplex_tcp=tcp,
    )


async def _read_exactly(sock: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await sock.recv(1 << 20)
        assert chunk
        data += chunk
    return data


async def test_a_send_without_an_await_leaves_what_the_socket_did_not_take_first_in_line():
    """``send_now``: framed and written at once when the socket has room; nothing (and the
    messages never made) while another send holds the lock; when the socket takes only part,
    the rest waits and the next locked write (``_protocol_send``, the flush) sends it first;
    the FIN goes after it too."""
    from functools import partial

    from hypercorn.events import RawData

    from duplex_actors.web.asgi_ws import NOT_SENT, PENDING, SENT
    from duplex_actors.web.hardening import _protocol_send, _send_eof, flush_unsent, send_now
    from duplex_actors.web.ws_frames import server_frame

    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = trio.SocketStream(a)
    tcp = SimpleNamespace(stream=stream, send_lock=trio.Lock(), protocol=None)
    tcp.protocol_send = partial(_protocol_send, tcp)
    ws = _open_stream(tcp)
    try:
        assert send_now(ws, lambda: ["tick", b"\x01\x02"]) == SENT
        expected = server_frame("tick") + server_frame(b"\x01\x02")
        assert await _read_exactly(b, len(expected)) == expected

        def never() -> list[str | bytes]:
            raise AssertionError("made while the lock is held")

        async with tcp.send_lock:
            assert send_now(ws, never) == NOT_SENT

        big = b"x" * (4 << 20)
        assert send_now(ws, lambda: [big]) == PENDING
        assert tcp._duplex_unsent
        assert send_now(ws, never) == NOT_SENT  # nothing overtakes the rest of a frame
        assert _write_now(tcp, b"later") == 0
        whole = server_frame(big) + b"after"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp.protocol_send, RawData(b"after"))
            nursery.start_soon(flush_unsent, ws)
            received = await _read_exactly(b, len(whole))
        assert received == whole
        assert not tcp._duplex_unsent

        assert send_now(ws, lambda: [big]) == PENDING
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_send_eof, tcp)
            received = await _read_exactly(b, len(server_frame(big)))
            assert await b.recv(16) == b""  # the FIN, after the whole frame
        assert received == server_frame(big)
    finally:
        await stream.aclose()
        b.close()


async def test_streaming_sockets_are_read_by_one_task_and_anything_else_takes_hypercorns_way():
    """A WebSocket whose app takes messages at once parks its connection's task: the front
    end's one reader reads its socket and offers each whole data frame to the app. What the
    app leaves (a message it does not take), a ping, a fragmented message and the close go to
    the connection's task and through hypercorn and wsproto as before, and streaming then goes
    on through the reader. Every message reaches the app once, in order."""
    from duplex_actors.web.asgi_ws import serve_websocket
    from duplex_actors.web.hardening import guard_connections
    from duplex_actors.web.shared_reader import shared_reader

    from ..reliability.conftest import OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, RawWS, frame_bytes

    got: list[tuple[str, bytes | str]] = []
    taken_in: dict[bytes | str, str] = {}  # the task's name, per message taken at once
    clients = 3

    async def handler(ws: Any) -> None:
        await ws.accept()

        def take(message: bytes | str) -> bool:
            if message in (b"queue me", b"bye"):
                return False
            taken_in[message] = trio.lowlevel.current_task().name
            got.append(("at once", message))
            return True

        ws.receive_directly(take)
        while True:
            message = await ws.receive()
            got.append(("queued", message))
            if message == b"bye":
                await ws.close(1000)
                return

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _read_body_app(scope, receive, send)
            return
        await serve_websocket(scope, receive, send, handler, None)  # type: ignore[arg-type]

    try:
        async with trio.open_nursery() as nursery:
            port, stop = await nursery.start(_serve_guarded, None, [], app)
            sockets = [await RawWS.connect(port, "/") for _ in range(clients)]
            assert all(ws.status == 101 for ws in sockets)
            reader = shared_reader()
            with trio.fail_after(5):
                for i, ws in enumerate(sockets):
                    await ws.send(frame_bytes(OP_BINARY, b"frame %d.0" % i))
                while reader.parked < clients or len(got) < clients:
                    await trio.sleep(0.01)
            ws = sockets[0]
            await ws.send(frame_bytes(OP_BINARY, b"frame 0.1") + frame_bytes(OP_BINARY, b"queue me"))
            await ws.send(frame_bytes(OP_PING, b"still there?"))
            assert await ws.recv_until(lambda frame: frame[0] == OP_PONG, timeout=5) == (
                OP_PONG,
                b"still there?",
            )
            await ws.send(frame_bytes(OP_BINARY, b"frag", fin=False) + frame_bytes(OP_CONT, b"mented"))
            with trio.fail_after(5):
                while reader.parked < clients or got[-1] != ("queued", b"fragmented"):
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked(0.01)  # the app waits for its next message
            await ws.send(frame_bytes(OP_BINARY, b"frame 0.2"))
            await ws.send(frame_bytes(OP_BINARY, b"bye"))
            await ws.recv_until(lambda frame: frame[0] == OP_CLOSE, timeout=5)
            assert ws.close_code == 1000
            for other in sockets:
                await other.aclose()
            with trio.fail_after(5):
                while reader.parked:
                    await trio.sleep(0.01)
            stop.set()
    finally:
        guard_connections()
    assert sorted(got[:clients]) == [("at once", b"frame %d.0" % i) for i in range(clients)]
    assert got[clients:] == [
        ("at once", b"frame 0.1"),
        ("queued", b"queue me"),
        ("queued", b"fragmented"),
        ("at once", b"frame 0.2"),
        ("queued", b"bye"),
    ]
    # The first messages may come before the app takes messages at once: read by their own
    # connection's task then, which parks once it sees that the app does.
    assert taken_in[b"frame 0.1"] == taken_in[b"frame 0.2"] == "duplex_actors.web.shared_reader"
