"""The measured traps of hypercorn + quart-trio (docs/design.md §2 "Budgets and hardening"), each pinned down."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import trio
from trio_websocket import open_websocket_url

from .conftest import free_port, http_get

UPGRADE = (
    "GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
)


def raw_exchange(port: int, request: bytes, read_for: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        sock.settimeout(read_for)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass  # the server may drop a bad connection: that is the point
        return data


def test_permessage_deflate_is_never_negotiated(parrot_server):
    request = UPGRADE.format(extra="Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n")
    response = raw_exchange(parrot_server.port, request.encode())
    head = response.split(b"\r\n\r\n")[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 101")
    assert "sec-websocket-extensions" not in head


def test_an_upgrade_with_trailing_bytes_does_not_kill_the_server(parrot_server):
    """hypercorn issue #225: an Upgrade request followed by trailing bytes made the process exit."""
    for trailing in (b"\x00\x01garbage", b"\x88\x80\x00\x00\x00\x00" * 3, b"GET / HTTP/1.1\r\n\r\n"):
        raw_exchange(parrot_server.port, UPGRADE.format(extra="").encode() + trailing, read_for=0.5)
    assert parrot_server.proc.poll() is None
    assert http_get(parrot_server.base + "/health")[0] == 200
    assert parrot_server.json("/ready")[0] == 200


def test_chat_completions_is_a_clear_400(parrot_server):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(parrot_server.base + "/v1/chat/completions", data=b"{}", method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("expected HTTP 400")
    except urllib.error.HTTPError as err:
        assert err.code == 400
        body = json.loads(err.read())
        assert "full-duplex" in body["error"]["message"] and "/v1/realtime" in body["error"]["message"]


def _hypercorn(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    exe = str(Path(sys.executable).with_name("hypercorn"))
    return subprocess.Popen(
        [exe, *args, "duplex_actors.app:app"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **env},
    )


def test_hypercorn_asyncio_worker_is_refused_with_a_message(tmp_path):
    port = free_port()
    proc = _hypercorn(["--bind", f"127.0.0.1:{port}"], {"DUPLEX_MODEL": "tiny-parrot"}, tmp_path)
    out, _ = proc.communicate(timeout=60)  # it exits instead of answering HTTP 500 forever
    # The worker fails its start-up; hypercorn 0.18's supervisor then exits with 0 whatever the
    # worker's exit code (its _join_exited is called twice), so the message is what we can check.
    assert "hypercorn -k trio duplex_actors.app:app" in out
    assert "Lifespan failure in startup" in out


def test_hypercorn_trio_worker_serves_with_env_settings(tmp_path, parrot_dir):
    port = free_port()
    env = {
        "DUPLEX_MODEL": "tiny-parrot",
        "DUPLEX_MAX_SESSIONS": "3",
        "DUPLEX_LOG_DIR": str(tmp_path / "logs"),
        "DUPLEX_API_KEY": "sekrit",
    }
    proc = _hypercorn(["-k", "trio", "--bind", f"127.0.0.1:{port}"], env, tmp_path)
    try:
        deadline = time.monotonic() + 90
        status, body = 0, ""
        while time.monotonic() < deadline and status != 200:
            time.sleep(0.3)
            try:
                status, body = http_get(f"http://127.0.0.1:{port}/ready")
            except OSError:
                status = 0
        assert status == 200, body
        assert json.loads(body)["slots_total"] == 3

        async def talk() -> list[str]:
            headers = [(b"Authorization", b"Bearer sekrit")]
            async with open_websocket_url(f"ws://127.0.0.1:{port}/v1/realtime", extra_headers=headers) as ws:
                types = []
                pcm = base64.b64encode(b"\x10\x00" * 1920).decode()
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": pcm}))
                with trio.fail_after(20):
                    while "response.output_audio.delta" not in types:
                        types.append(json.loads(await ws.get_message())["type"])
                return types

        types = trio.run(talk)
        assert types[:2] == ["session.created", "session.updated"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert list((tmp_path / "logs").glob("*.dlog"))


async def test_an_oversize_message_closes_1009_and_frees_the_slot_at_once(fresh_server):
    """hypercorn sends the 1009 close but never tells the app; without the fix the session held
    its slot until the idle timeout (300 s by default). The message is 20x the limit, so the
    client is still sending when the server closes: a server that closed TCP with that input
    unread reset the connection, the client's send failed, and whether the client reported 1009
    or 1006 depended on whether its reader had seen the close frame first. The server now reads
    and drops the rest (RFC 6455 section 7.1.1): the send completes, every time."""
    from trio_websocket import ConnectionClosed

    server = fresh_server("--max-sessions", "1", "--max-message-bytes", "100000")
    for _ in range(3):
        code = None
        sent = False
        try:
            async with open_websocket_url(f"{server.ws}/v1/realtime") as ws:
                await ws.get_message()
                await ws.send_message("x" * 2_000_000)
                sent = True
                with trio.fail_after(10):
                    while True:
                        await ws.get_message()
        except ConnectionClosed as closed:
            assert closed.reason is not None
            code = closed.reason.code
        assert code == 1009
        assert sent, "the server reset the connection while the client was still sending"
        with trio.fail_after(5):
            while (await trio.to_thread.run_sync(server.json, "/ready"))[1].get("slots_free") != 1:
                await trio.sleep(0.05)
