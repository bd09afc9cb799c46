"""The server starts the codec pool on first use and stops it with itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.opus.pool import OpusPool
from duplex_actors.server import open_duplex_server

from .test_codec import tone


@pytest.fixture(scope="module")
def engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=1)


async def test_the_pool_starts_lazily_once_and_stops_with_the_server(engine, tmp_path):
    async with open_duplex_server(engine, log_dir=tmp_path, fsync=False, opus_workers=1) as server:
        assert server.opus_pool is None  # no worker until an /api/chat session needs one
        pools: list[OpusPool] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lambda: _get(server, pools))
        assert len({id(p) for p in pools}) == 1 and pools[0] is server.opus_pool
        assert pools[0].size == 1
        pids = pools[0].worker_pids()
        stream = await pools[0].open_stream()
        assert (await stream.encode(tone(0.08))).startswith(b"OggS")
    assert server.opus_pool is None
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


async def _get(server, into):
    into.append(await server.get_opus_pool())
