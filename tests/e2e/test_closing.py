"""Close codes of docs/protocol.md §6 that need server flags: idle timeout (``--idle-timeout 1``) closes with
``session.closed {reason: timeout}`` and 1000; a message over ``--max-message-bytes`` closes
with 1009. (Client ``session.close`` -> 1000 and admission -> 1013 are in the other modules.)"""

from __future__ import annotations

import pytest
import trio

from duplex_actors.log import records as r

from .conftest import start_server
from .helpers import FRAME_SAMPLES, b64, connect, pcm16, read_records, tone_and_noise, wait_idle

LIMIT = 100_000


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory, parrot_dir):
    server = start_server(
        tmp_path_factory.mktemp("strict"),
        "--max-sessions",
        "2",
        "--idle-timeout",
        "1",
        "--max-message-bytes",
        str(LIMIT),
    )
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/v1/realtime?duplex=1", "/v1/realtime", "/v1/duplex"])
async def test_idle_timeout_closes_with_reason_timeout_and_1000(strict_server, path):
    async with connect(strict_server.ws + path) as c:
        if c.dialect == "native":
            await c.send({"type": "session.create", "session": {}})
        await c.wait_for("session.created")
        with trio.fail_after(5):
            await c.closed.wait()
        if path == "/v1/realtime":  # the stock route: no session.closed (not OpenAI's); the close says it
            assert c.of_type("session.closed") == [] and c.close_reason == "timeout"
        else:
            closed = c.events()[-1]
            assert closed["type"] == "session.closed" and closed["reason"] == "timeout"
        assert c.close_code == 1000
        recs = await read_records(strict_server, c.session_id)
        assert recs[-2] == r.Close("timeout")


async def test_client_messages_keep_the_session_alive(strict_server):
    async with connect(strict_server.ws + "/v1/realtime?duplex=1") as c:
        await c.wait_for("session.created")
        frame = pcm16(tone_and_noise(FRAME_SAMPLES / 24_000))
        for i in range(8):  # 2.4 s of activity, every 0.3 s
            if i % 2:
                await c.send({"type": "session.heartbeat"})
            else:
                await c.append(frame)
            await trio.sleep(0.3)
        assert not c.closed.is_set()
        assert c.of_type("session.closed") == []
        await c.wait_until(lambda: c.of_type("session.closed"), timeout=5)
        assert c.of_type("session.closed")[0]["reason"] == "timeout"
        await c.wait_closed()
        assert c.close_code == 1000


async def test_a_message_just_under_the_limit_is_accepted(strict_server):
    async with connect(strict_server.ws + "/v1/realtime") as c:
        await c.wait_for("session.created")
        n = 8 * FRAME_SAMPLES  # 30 720 bytes of pcm16, ~41 KB of JSON
        await c.append(pcm16(tone_and_noise(n / 24_000)))
        await c.wait_until(lambda: c.output_frames() == 8)


@pytest.mark.parametrize("binary", [False, True])
async def test_a_message_over_the_limit_closes_with_1009(strict_server, binary):
    async with connect(strict_server.ws + ("/v1/duplex" if binary else "/v1/realtime")) as c:
        if binary:
            await c.send({"type": "session.create", "session": {}})
        await c.wait_for("session.updated")
        before = len(c.messages)
        data = pcm16(tone_and_noise(1.6))  # 76 800 bytes: ~102 KB as base64 JSON
        if binary:
            await c.send_raw(data + data)
        else:
            await c.send_raw('{"type":"input_audio_buffer.append","audio":"' + b64(data) + '"}')
        await c.wait_closed()
        assert c.close_code == 1009
        assert c.types(before) == [], c.types(before)  # docs/protocol.md §6: no events, just the close
        session_id = c.session_id
    await wait_idle(strict_server)
    recs = await read_records(strict_server, session_id)
    assert isinstance(recs[-2], r.Close) and isinstance(recs[-1], r.End)
