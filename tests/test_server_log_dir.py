"""The in-process server when its log dir fails (real engine, real files, virtual time): a log
that cannot be created is ``LogUnavailable`` and stops admissions until a probe of the dir works;
after a failed commit an idle session's next heartbeat is answered ``log_unavailable``, not acked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from duplex_actors.admission import LogUnavailable
from duplex_actors.log import records as r
from duplex_actors.log import writer as writer_module
from duplex_actors.log.segment import read_log
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev


@pytest.fixture(scope="module")
def parrot_engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=2)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def collect(session, into: list) -> None:
    async for event in session.events():
        into.append(event)


async def test_a_log_that_cannot_be_created_is_log_unavailable_until_the_dir_works_again(
    parrot_engine, tmp_path: Path, autojump_clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = [True]
    real = writer_module._create_file

    def create(path: Path) -> int:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path)

    async with open_duplex_server(
        parrot_engine, log_dir=tmp_path, virtual_time=True, log_probe_interval_s=5.0
    ) as server:
        monkeypatch.setattr(writer_module, "_create_file", create)
        with pytest.raises(LogUnavailable) as info:
            await server.open_session()
        assert isinstance(info.value.__cause__, OSError) and "No space" in str(info.value)
        assert server.scheduler.table.in_use == 0  # the slot went back
        assert not server.writer.healthy and server.writer.failed_logs == 1
        with pytest.raises(LogUnavailable):
            await server.reserve()
        await trio.sleep(11)
        assert not server.writer.healthy and server.writer.statistics().dir_probe_failures == 2
        full[0] = False
        await trio.sleep(5)
        assert server.writer.healthy
        s = await server.open_session()
        await s.close()
    assert isinstance(read_log(tmp_path / f"{s.session_id}.dlog").records[-1][1], r.End)


async def test_after_a_failed_commit_an_idle_sessions_heartbeat_is_not_acknowledged(
    parrot_engine, tmp_path: Path, autojump_clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        s = await server.open_session()
        server._nursery.start_soon(collect, s, events)
        await s.heartbeat(client_event_id="before")
        await trio.sleep(0.5)
        assert [e.client_event_id for e in events if isinstance(e, ev.HeartbeatAck)] == ["before"]

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        await s.heartbeat(client_event_id="after")
        with trio.fail_after(5):
            await s.wait_closed()
    acks = [e.client_event_id for e in events if isinstance(e, ev.HeartbeatAck)]
    errors = [e.code for e in events if isinstance(e, ev.Error)]
    assert acks == ["before"]
    assert errors == ["log_unavailable"]
    assert isinstance(events[-1], ev.SessionClosed) and events[-1].reason == "log_unavailable"
