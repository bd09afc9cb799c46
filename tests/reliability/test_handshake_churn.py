"""Clients that go away at any point of the handshake or of their first message.

A session is created when the server answers 101 and before its first read; a client that
closes (or resets) in that window used to leave a session registered that nothing ran or
closed, holding its slot until the process exited. Here one real server with a single slot
takes 200 connect/close cycles cut at random points, on every WebSocket route: after each close
the slot is free again within a second, and at the end nothing is active, a new session
streams, the log holds no traceback for what the peers did, and SIGTERM exits with no stuck
connection. The numbers go to RELIABILITY.md (``-s`` prints them).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections import Counter

import trio

from ..e2e.conftest import ServerProcess, start_server
from ..e2e.helpers import connect
from .conftest import OP_TEXT, ametrics, frame_bytes, metric_sum, upgrade_request, wait_slots_free
from .test_model_faults import opened, received_frames, stream

CYCLES = 200
SEED = 28
RELEASE_WITHIN_S = 1.0
ROUTES = ("/v1/realtime?duplex=1", "/v1/realtime", "/v1/duplex", "/api/chat")
CUTS = (
    "after_request",  # the request sent, nothing read
    "after_101",  # the response head read
    "trailing_bytes",  # bytes after the request's blank line (hypercorn answers 400 or upgrades)
    "deflate_offer",  # a permessage-deflate offer, refused by ignoring it
    "mid_first_message",  # half of a first frame
    "after_first_message",  # a whole first message, then gone
    "half_close",  # our FIN after the 101, then read until the server closes
)


def _request(route: str, cut: str) -> bytes:
    headers = {}
    if cut == "deflate_offer":
        headers["Sec-WebSocket-Extensions"] = "permessage-deflate; client_max_window_bits"
    request = upgrade_request(route, headers)
    if cut == "trailing_bytes":
        request += b"\x81\x85garbage"
    return request


def _first_message(route: str) -> bytes:
    if route == "/v1/duplex":
        text = '{"type":"session.create","session":{}}'
    elif route == "/api/chat":
        return frame_bytes(0x2, b"\x01OggS")
    else:
        text = '{"type":"session.update","session":{"instructions":"Be brief."}}'
    return frame_bytes(OP_TEXT, text.encode())


async def _cycle(server: ServerProcess, route: str, cut: str, rst: bool) -> str:
    """One connection cut at ``cut``; returns the status line the client saw (or "")."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.connect(("127.0.0.1", server.port))
    stream_ = trio.SocketStream(sock)
    head = b""
    try:
        await stream_.send_all(_request(route, cut))
        if cut != "after_request":
            with trio.fail_after(10):
                while b"\r\n\r\n" not in head:
                    chunk = await stream_.receive_some(65536)
                    if not chunk:
                        break
                    head += chunk
        if cut == "mid_first_message":
            message = _first_message(route)
            await stream_.send_all(message[: max(3, len(message) // 2)])
        elif cut == "after_first_message":
            await stream_.send_all(_first_message(route))
        elif cut == "half_close" and not rst:
            await stream_.send_eof()
            with trio.fail_after(10):
                while await stream_.receive_some(65536):
                    pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the server closed first (a 400, a refusal): the cut still happens below
    if rst:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    return head.split(b"\r\n", 1)[0].decode("latin-1")


async def test_connections_cut_anywhere_in_the_handshake_release_their_slot(tmp_path, parrot_dir, record):
    server = start_server(tmp_path, "--max-sessions", "1")
    rng = random.Random(SEED)
    seen: Counter[str] = Counter()
    slowest = 0.0
    try:
        t0 = time.monotonic()
        for i in range(CYCLES):
            route, cut, rst = rng.choice(ROUTES), rng.choice(CUTS), rng.random() < 0.4
            status = await _cycle(server, route, cut, rst)
            seen[f"{cut}{'+rst' if rst else ''} -> {status[9:12] or 'none'}"] += 1
            try:
                slowest = max(slowest, await wait_slots_free(server, timeout=RELEASE_WITHIN_S))
            except AssertionError as exc:
                raise AssertionError(f"cycle {i} ({route}, {cut}, rst={rst}, {status!r}): {exc}") from None
        churn_s = time.monotonic() - t0
        text = await ametrics(server)
        active = metric_sum(text, "duplex_sessions_active")
        async with connect(server.ws + "/v1/realtime") as client:
            await opened(client)
            await stream(client, 3)
            await client.wait_until(lambda: received_frames(client) >= 3)
    finally:
        rc = server.stop()
    record(cycles=CYCLES, churn_s=round(churn_s, 1), slowest_release_s=round(slowest, 3), outcomes=dict(seen))
    assert active == 0, text
    assert rc == 0, server.output[-3000:]
    assert "stuck connection" not in server.output, server.output[-3000:]
    assert "Traceback" not in server.output, server.output[-6000:]
    assert " ERROR " not in server.output, server.output[-6000:]
    # Every cut kind was drawn, and the 101 was reached (the window where the slot leaked).
    assert {key.split(" ")[0].removesuffix("+rst") for key in seen} == set(CUTS), seen
    assert any(key.endswith("-> 101") for key in seen), seen
