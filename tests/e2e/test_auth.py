"""API key and Origin allowlist on every WebSocket route, refused before the upgrade (docs/protocol.md §6):
HTTP 401 without a (right) key, 403 for an Origin not on the list."""

from __future__ import annotations

import pytest
import trio
from trio_websocket import ConnectionRejected, HandshakeError, open_websocket_url

from .conftest import start_server
from .helpers import connect

KEY = "sk-test-K3y"
OK_ORIGIN = "https://ok.example"
ROUTES = ["/v1/realtime", "/v1/realtime?duplex=1", "/v1/duplex"]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, parrot_dir):
    server = start_server(
        tmp_path_factory.mktemp("auth"),
        "--max-sessions",
        "2",
        "--api-key",
        KEY,
        "--allowed-origin",
        OK_ORIGIN,
        "--allowed-origin",
        "http://localhost:3000",
    )
    yield server
    server.stop()


async def rejected(url: str, headers=(), subprotocols=None) -> ConnectionRejected:
    extra = [(k.encode(), v.encode()) for k, v in headers]
    with trio.fail_after(15), pytest.raises(HandshakeError) as info:
        async with open_websocket_url(
            url, extra_headers=extra, subprotocols=subprotocols, connect_timeout=10, disconnect_timeout=2
        ):
            pass
    assert isinstance(info.value, ConnectionRejected), repr(info.value)
    return info.value


async def opens(url: str, headers=(), subprotocols=None) -> str | None:
    """Open a session on ``url``; returns the subprotocol the server chose."""
    async with connect(url, headers=headers, subprotocols=subprotocols) as c:
        if c.dialect == "native":
            await c.send({"type": "session.create", "session": {}})
        await c.wait_for("session.created")
        return c.ws.subprotocol


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [
        ([], None),
        ([], ["realtime"]),
        ([("Authorization", "Bearer wrong")], None),
        ([("Authorization", f"Bearer {KEY}x")], None),
        ([("Authorization", f"Basic {KEY}")], None),
        ([], ["realtime", "openai-insecure-api-key.wrong"]),
        ([], ["realtime", f"openai-insecure-api-key.{KEY[:-1]}"]),
    ],
    ids=["none", "subprotocol-no-key", "wrong-bearer", "longer-bearer", "basic", "wrong-sub", "prefix-sub"],
)
async def test_no_or_wrong_key_is_401_before_the_upgrade(auth_server, route, headers, subprotocols):
    err = await rejected(auth_server.ws + route, headers, subprotocols)
    assert err.status_code == 401
    assert b"unauthorized" in (err.body or b"")


@pytest.mark.parametrize("route", ROUTES)
async def test_bearer_key_opens(auth_server, route):
    assert await opens(auth_server.ws + route, [("Authorization", f"Bearer {KEY}")]) is None


@pytest.mark.parametrize("route", ROUTES)
async def test_subprotocol_key_opens_and_realtime_is_echoed(auth_server, route):
    chosen = await opens(auth_server.ws + route, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])
    assert chosen == "realtime"


@pytest.mark.parametrize("route", ROUTES)
async def test_origin_not_allowed_is_403(auth_server, route):
    auth = ("Authorization", f"Bearer {KEY}")
    err = await rejected(auth_server.ws + route, [auth, ("Origin", "https://evil.example")])
    assert err.status_code == 403
    err = await rejected(auth_server.ws + route, [auth, ("Origin", "https://ok.example.evil.example")])
    assert err.status_code == 403
    assert await opens(auth_server.ws + route, [auth, ("Origin", OK_ORIGIN)]) is None
    assert await opens(auth_server.ws + route, [auth, ("Origin", "http://localhost:3000")]) is None


async def test_refusals_open_no_session(auth_server):
    for _ in range(4):
        await rejected(auth_server.ws + "/v1/realtime")
    status, ready = auth_server.json("/ready")
    assert status == 200 and ready["slots_free"] == 2


async def test_origin_allowlist_alone(fresh_server):
    """Without an API key, the Origin check still applies; no key is needed."""
    server = fresh_server("--max-sessions", "1", "--allowed-origin", OK_ORIGIN)
    err = await rejected(server.ws + "/v1/duplex", [("Origin", "https://evil.example")])
    assert err.status_code == 403
    assert await opens(server.ws + "/v1/realtime", [("Origin", OK_ORIGIN)]) is None
    assert await opens(server.ws + "/v1/duplex") is None  # no Origin: not a browser


async def test_stock_openai_client_with_the_key(auth_server):
    import asyncio

    from .helpers import FRAME_PCM16_BYTES, FRAME_SAMPLES, pcm16, tone_and_noise
    from .test_openai_client import N_FRAMES, sdk_session

    audio = pcm16(tone_and_noise(N_FRAMES * FRAME_SAMPLES / 24_000, seed=3))

    def run(key: str):
        return asyncio.run(asyncio.wait_for(sdk_session(auth_server.port, audio, api_key=key), 60))

    with trio.fail_after(70):
        report = await trio.to_thread.run_sync(run, KEY, abandon_on_cancel=True)
    assert len(report["audio"]) == N_FRAMES * FRAME_PCM16_BYTES

    def wrong() -> str:
        try:
            run("wrong")
        except Exception as exc:  # websockets' InvalidStatus
            return repr(exc)
        return "connected"

    with trio.fail_after(70):
        outcome = await trio.to_thread.run_sync(wrong, abandon_on_cancel=True)
    assert "401" in outcome, outcome
