"""Auth refusals before the upgrade on every WebSocket route, and SIGTERM with live sessions.

(tests/e2e/test_auth.py covers the key forms and subprotocols in depth, tests/e2e/test_drain.py
the drain's events and logs; these measure the refusal and the exit time.)
"""

from __future__ import annotations

import json
import re
import signal
import time
from typing import cast

import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.replay.replayer import replay_logic

from ..e2e.conftest import start_server
from ..e2e.helpers import connect
from .conftest import (
    OP_TEXT,
    RawWS,
    append_text,
    frame_bytes,
    metric_sum,
    metrics_text,
    tone_pcm16,
    upgrade_request,
)
from .test_disconnects import tcp_queues
from .test_model_faults import opened, received_frames, stream

KEY = "sk-reliability"
ORIGIN = "https://app.example"
ROUTES = ["/v1/realtime", "/v1/realtime?duplex=1", "/v1/duplex"]
CASES = {
    "missing-key": ({}, 401, "unauthorized"),
    "wrong-key": ({"Authorization": "Bearer nope"}, 401, "unauthorized"),
    "wrong-origin": ({"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}, 403, "forbidden"),
}


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory, parrot_dir):
    server = start_server(
        tmp_path_factory.mktemp("locked"), "--max-sessions", "2", "--api-key", KEY, "--allowed-origin", ORIGIN
    )
    yield server
    server.stop()


@pytest.mark.parametrize("route", ROUTES)
async def test_auth_is_refused_before_the_upgrade_on_every_route(locked_server, route, record):
    opened_before = metric_sum(metrics_text(locked_server), "duplex_sessions_opened_total")
    seen = {}
    for case, (headers, status, code) in CASES.items():
        t0 = time.monotonic()
        head, body = await upgrade_refusal(locked_server.port, route, headers)
        ms = round((time.monotonic() - t0) * 1000, 1)
        seen[case] = (int(head.split()[1]), json.loads(body)["error"]["code"], ms)
        assert seen[case][:2] == (status, code), (case, head)
        assert "upgrade: websocket" not in head.lower()
    # The right key and an allowed origin open a session on the same route.
    ok = await RawWS.connect(locked_server.port, route, {"Authorization": f"Bearer {KEY}", "Origin": ORIGIN})
    assert ok.status == 101
    await ok.aclose()
    text = metrics_text(locked_server)
    record(route=route, refusals={k: {"status": v[0], "code": v[1], "ms": v[2]} for k, v in seen.items()})
    assert metric_sum(text, "duplex_sessions_opened_total") <= opened_before + (route != "/v1/duplex")


async def upgrade_refusal(port: int, path: str, headers: dict[str, str]) -> tuple[str, bytes]:
    """Send an upgrade request; return the response head and its body (Content-Length)."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(upgrade_request(path, headers))
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            found = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
            assert found is not None, head
            length = int(found.group(1))
            while len(body) < length:
                body += await stream.receive_some(65536)
    return head.decode("latin-1"), body


# -- SIGTERM with live sessions -------------------------------------------------------------------
DRAIN_S = 5.0


@pytest.mark.parametrize(
    "stuck", [False, True], ids=["reading-clients", "plus-a-client-that-stopped-reading"]
)
async def test_sigterm_with_live_sessions_exits_0_within_the_drain_time(tmp_path, parrot_dir, stuck, record):
    """Three clients streaming (Realtime stock and ``?duplex=1``, native); with ``stuck``, a fourth
    session whose client stopped reading (its socket full, the server's send blocked)."""
    server = start_server(tmp_path, "--max-sessions", "4", "--drain-timeout", str(DRAIN_S))
    clients = []
    try:
        async with trio.open_nursery() as nursery:
            for path in ("/v1/realtime", "/v1/realtime?duplex=1", "/v1/duplex"):
                c = await nursery.start(streaming_client, server.ws + path)
                clients.append(c)
            stuck_ws = None
            if stuck:
                stuck_ws = await RawWS.connect(server.port, "/v1/realtime", rcvbuf=4096)
                updated = await stuck_ws.recv_event("session.updated")
                msg = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)).encode())
                for _ in range(20):  # 1.6 s of audio: its output fills the small socket buffers
                    await stuck_ws.send(msg)
                await output_stuck(server, stuck_ws, updated["session"]["id"], steps=12)
            for c in clients:
                await c.wait_until(lambda c=c: received_frames(c) >= 3)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(DRAIN_S + 20):
                rc = await trio.to_thread.run_sync(server.proc.wait)
            exit_s = time.monotonic() - t0
            for c in clients:
                await c.wait_closed(timeout=5)
            nursery.cancel_scope.cancel()
        if stuck_ws is not None:
            stuck_ws.abort()
    finally:
        server.stop()
    ends = {}
    for log_path in server.log_dir.glob("*.dlog"):
        recs = [rec for _, rec in read_log(log_path).records]
        ends[log_path.stem] = (
            cast(r.Close, recs[-2]).reason if isinstance(recs[-1], r.End) else "no end record"
        )
        assert replay_logic(log_path).identical, log_path
    record(
        stuck_client=stuck,
        drain_timeout_s=DRAIN_S,
        exit_code=rc,
        exit_after_s=round(exit_s, 2),
        close_codes=[c.close_code for c in clients],
        closing_sent=[bool(c.of_type("session.closing")) for c in clients],
        log_close_reasons=sorted(ends.values()),
    )
    assert rc == 0
    assert all(c.close_code == 1012 for c in clients)
    # session.closing is no OpenAI event: the stock route's client is told by the close code only.
    assert [bool(c.of_type("session.closing")) for c in clients] == [False, True, True]
    assert all(ends[c.session_id] == "server_shutdown" for c in clients)
    assert exit_s <= DRAIN_S + 0.5


async def output_stuck(server, ws: RawWS, session_id: str, steps: int, timeout: float = 10.0) -> None:
    """Return once ``steps`` of the session's frames are stepped and its output waits in the
    server's send queue (the client, which does not read, has a full receive buffer)."""
    log_path = server.log_dir / f"{session_id}.dlog"
    client_port = ws.stream.socket.getsockname()[1]

    def stuck() -> bool:
        if not log_path.exists():
            return False
        stepped = sum(isinstance(rec, r.Step) for _, rec in read_log(log_path).records)
        return stepped >= steps and tcp_queues(server.port, client_port).get("server_tx", 0) > 0

    with trio.fail_after(timeout):
        while not stuck():
            await trio.sleep(0.02)


async def streaming_client(url: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with connect(url, graceful=False) as c:
        await opened(c)
        task_status.started(c)
        await stream(c, 400)
        await c.wait_closed(timeout=30)
