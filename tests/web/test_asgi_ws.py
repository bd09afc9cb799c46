"""The WebSocket routes' raw ASGI path (web/asgi_ws.py) against quart's behaviour, from inside."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from quart import jsonify

from duplex_actors.app import create_quart_app
from duplex_actors.config import ServerConfig
from duplex_actors.web.asgi_ws import (
    DISCONNECT_HOOK_SCOPE,
    MAX_NOWAIT_RECEIVES,
    AsgiWebSocket,
    HttpReply,
    RenderedReply,
    serve_websocket,
)

SCOPE: dict[str, Any] = {
    "type": "websocket",
    "scheme": "ws",
    "path": "/v1/realtime",
    "query_string": b"duplex=1&model=m&model=n&x=%zz",
    "headers": [(b"Authorization", b"Bearer k"), (b"x-twice", b"1"), (b"x-twice", b"2")],
    "client": ("10.0.0.1", 5000),
    "subprotocols": ["realtime", "openai-beta.realtime-v1"],
}


def channel(*messages: dict[str, Any]) -> tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]:
    send, receive = trio.open_memory_channel[Any](64)
    for message in messages:
        send.send_nowait(message)
    return send, receive


async def no_render(reply: HttpReply) -> RenderedReply:
    raise AssertionError("no refusal expected")


def text(i: int) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": f"m{i}", "bytes": None}


def test_the_request_reads_as_the_quart_route_read_it() -> None:
    _, receive = channel()

    async def send(message: dict[str, Any]) -> None:
        pass

    ws = AsgiWebSocket(dict(SCOPE), receive.receive, send)
    assert ws.headers == {"remote-addr": "10.0.0.1", "authorization": "Bearer k", "x-twice": "2"}
    assert ws.subprotocols == ["realtime", "openai-beta.realtime-v1"]
    assert ws.args.get("duplex") == "1" and ws.args.get("model") == "m" and ws.args["x"] == "%zz"


async def test_queued_messages_are_taken_without_a_checkpoint_up_to_the_bound() -> None:
    sender, receive = channel(
        {"type": "websocket.connect"}, *(text(i) for i in range(MAX_NOWAIT_RECEIVES + 5))
    )
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    ws = AsgiWebSocket(dict(SCOPE), receive.receive, send)
    await ws.accept("realtime")
    got = [await ws.receive() for _ in range(MAX_NOWAIT_RECEIVES + 5)]
    assert got == [f"m{i}" for i in range(MAX_NOWAIT_RECEIVES + 5)]
    assert sent == [{"type": "websocket.accept", "subprotocol": "realtime", "headers": []}]
    # a binary message, read as quart read it (``bytes or text``)
    sender.send_nowait({"type": "websocket.receive", "bytes": b"\x01", "text": None})
    assert await ws.receive() == b"\x01"


async def test_a_disconnect_cancels_the_handler_and_an_accepted_handler_is_closed_1000() -> None:
    _sender, receive = channel({"type": "websocket.connect"}, text(0))
    sent: list[dict[str, Any]] = []
    got: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def reader(ws: AsgiWebSocket) -> HttpReply | None:
        await ws.accept()
        while True:
            got.append(await ws.receive())

    scope = dict(SCOPE)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_websocket, scope, receive.receive, send, reader, no_render)
            await trio.testing.wait_all_tasks_blocked()
            assert got == ["m0"] and DISCONNECT_HOOK_SCOPE in scope
            scope[DISCONNECT_HOOK_SCOPE]()  # as hardening._spawn_app calls it
    assert DISCONNECT_HOOK_SCOPE not in scope
    assert [m["type"] for m in sent] == ["websocket.accept"]  # cancelled: no close of its own

    _, receive = channel({"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1005})
    sent.clear()
    with trio.fail_after(5):
        await serve_websocket(dict(SCOPE), receive.receive, send, reader, no_render)  # read: cancelled too
    assert [m["type"] for m in sent] == ["websocket.accept"]

    async def quiet(ws: AsgiWebSocket) -> HttpReply | None:
        await ws.send("hi")
        return None

    sent.clear()
    await serve_websocket(dict(SCOPE), receive.receive, send, quiet, no_render)
    assert sent[1:] == [
        {"type": "websocket.send", "bytes": None, "text": "hi"},
        {"type": "websocket.close", "code": 1000, "reason": ""},
    ]


@pytest.mark.parametrize("headers", [{}, {"Retry-After": "1"}])
async def test_a_refusal_is_the_response_quart_builds(tmp_path: Any, headers: dict[str, str]) -> None:
    from duplex_actors.app import DuplexApp

    quart_app = create_quart_app(ServerConfig(model="tiny-parrot", log_dir=str(tmp_path)))
    app = DuplexApp(quart_app, quart_app.extensions["duplex_model"])
    reply = HttpReply(503, {"error": {"type": "server_error", "code": "not_ready", "message": "é"}}, headers)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def refuse(ws: AsgiWebSocket) -> HttpReply | None:
        return reply

    _, receive = channel()
    await serve_websocket(dict(SCOPE), receive.receive, send, refuse, app._render)
    async with quart_app.app_context():
        expected = jsonify(reply.body)
        expected.status_code = 503
        expected.headers.update(headers)
        body = await expected.get_data()
    assert sent[0] == {
        "type": "websocket.http.response.start",
        "status": 503,
        "headers": [(k.lower().encode(), v.encode()) for k, v in expected.headers.items()],
    }
    assert b"".join(m["body"] for m in sent[1:]) == body and sent[-1]["more_body"] is False
