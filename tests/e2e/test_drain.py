"""SIGTERM drains: /ready 503, every session gets session.closing and close 1012, logs finish."""

from __future__ import annotations

import base64
import json
import signal

import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.replay.replayer import replay_logic


async def test_sigterm_closes_every_session_with_1012_and_exits_0(fresh_server):
    server = fresh_server("--max-sessions", "3")
    seen: dict[int, list[str]] = {0: [], 1: []}
    codes: dict[int, int | None] = {}

    async def client(i: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_websocket_url(f"{server.ws}/v1/realtime?duplex=1") as ws:
            pcm = base64.b64encode(b"\x00\x08" * 1920).decode()
            await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": pcm}))
            started = False
            try:
                with trio.fail_after(30):
                    while True:
                        msg = json.loads(await ws.get_message())
                        seen[i].append(msg["type"])
                        if msg["type"] == "response.output_audio.delta" and not started:
                            started = True
                            task_status.started()
            except ConnectionClosed as closed:
                assert closed.reason is not None
                codes[i] = closed.reason.code

    async with trio.open_nursery() as nursery:
        await nursery.start(client, 0)
        await nursery.start(client, 1)
        await trio.to_thread.run_sync(server.proc.send_signal, signal.SIGTERM)
    rc = await trio.to_thread.run_sync(server.wait)
    assert rc == 0, server.output
    for i in (0, 1):
        assert codes[i] == 1012, (codes, seen[i][-6:])
        tail = seen[i]
        assert "session.closing" in tail and tail[-1] == "session.closed"
        assert tail.index("session.closing") < tail.index("response.done") < tail.index("session.closed")
    logs = sorted(server.log_dir.glob("*.dlog"))
    closes = []
    for path in logs:
        recs = [rec for _, rec in read_log(path).records]
        assert isinstance(recs[-1], r.End) and isinstance(recs[-2], r.Close), path
        closes.append(recs[-2].reason)
        assert replay_logic(path).identical
    assert closes.count("server_shutdown") == 2
