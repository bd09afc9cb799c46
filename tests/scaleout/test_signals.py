"""SIGUSR1/SIGUSR2 with the default in-band refusal: no HTTP 503 for a paused direct client,
but the spec's ``error resource_exhausted`` and close 1013; live sessions go on."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import trio

from duplex_actors.client import ResourceExhausted, open_duplex_client

from .conftest import Node, free_port, http_get, wait_until


@pytest.fixture
def node(tmp_path, parrot_dir):
    n = Node(
        "solo",
        free_port(),
        free_port(),
        tmp_path / "sessions",
        tmp_path / "serve.out",
        ["--max-sessions", "2"],
        {},
    )
    n.start()
    try:
        wait_until(n.ready, 90, "server ready", 0.2)
        yield n
    finally:
        n.stop()


async def test_sigusr1_pauses_admission_in_band_and_sigusr2_resumes(node):
    url = node.ws + "/v1/realtime?duplex=1"
    assert node.agent().strip() == "up ready maxconn:2"
    async with open_duplex_client(url) as live:
        node.send_signal(signal.SIGUSR1)
        wait_until(lambda: http_get(node.base + "/ready")[0] == 503, 5, "/ready 503")
        assert node.agent().strip() == "drain"
        with pytest.raises(ResourceExhausted) as refused:
            async with open_duplex_client(url):
                pass
        assert refused.value.close_code == 1013 and "draining" in refused.value.message
        # The live session goes on.
        await live.send_audio(np.zeros(1920 * 3, dtype=np.float32))
        with trio.fail_after(5):
            await live.wait_frames(3)
        node.send_signal(signal.SIGUSR2)
        wait_until(lambda: http_get(node.base + "/ready")[0] == 200, 5, "/ready 200")
        assert node.agent().strip() == "up ready maxconn:2"
        async with open_duplex_client(url) as again:
            assert again.session_id
    closed = live.closed_event
    assert closed is not None and closed.reason == "client_close"
    # SIGTERM still drains and exits 0.
    assert node.stop() == 0
