"""Hardening pieces that are checked best from inside: socket options, slow consumers, crashes."""

from __future__ import annotations

import json
import socket
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypercorn.trio import serve
from trio_websocket import ConnectionClosed, open_websocket_url

from duplex_actors.config import ServerConfig
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev
from duplex_actors.web import dialects
from duplex_actors.web.hardening import TCP_USER_TIMEOUT_MS, HardenedConfig


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
        for _ in range(12):
            if not stuck.closed:
                await stuck.append(frame)
            await fine.append(frame)
            await trio.sleep(0.1)
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
