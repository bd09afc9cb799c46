"""The scale-out parts one by one: the agent's answers, slot reservations, the uploader against
a real S3 store (SeaweedFS), ``s3://`` URLs, pause/resume of a holder."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from duplex_actors.admission import ResourceExhausted
from duplex_actors.app import ModelHolder
from duplex_actors.config import ServerConfig
from duplex_actors.log.segment import read_log, read_records
from duplex_actors.metrics import FrontEndSnapshot, render
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.replay.replayer import replay_logic
from duplex_actors.scaleout.agent import agent_status, serve_agent
from duplex_actors.scaleout.s3 import BadS3Url, S3Location, list_log_keys, parse_s3_url
from duplex_actors.scaleout.upload import LogUploader
from duplex_actors.scheduler.slots import SlotTable
from duplex_actors.server import open_duplex_server

from .conftest import S3Store


# -- the agent -----------------------------------------------------------------------------------
def fake_holder(*, error=None, server=True, failed=None, healthy=True, slots=4, in_use=0, releasing=0):
    """A holder whose scheduler is an in-process Scheduler's slot table (the link's status
    gives the same three figures)."""
    table = SlotTable(slots)
    for i in range(in_use):
        table.acquire(object())  # type: ignore[arg-type]
        table.slots[i].releasing = i < releasing
    scheduler = types.SimpleNamespace(
        failed=failed,
        slots_total=slots,
        slots_free=table.free,
        slots_releasing=sum(entry.releasing for entry in table.slots),
    )
    srv = types.SimpleNamespace(scheduler=scheduler, writer=types.SimpleNamespace(healthy=healthy))
    return types.SimpleNamespace(error=error, server=srv if server else None, draining=False, paused=False)


def test_agent_lines():
    assert agent_status(fake_holder()) == "up ready maxconn:4"
    assert agent_status(fake_holder(in_use=3)) == "up ready maxconn:4"  # free + active
    assert agent_status(fake_holder(in_use=3, releasing=1)) == "up ready maxconn:3"
    assert agent_status(fake_holder(slots=1, in_use=1, releasing=1)) == "up ready maxconn:1"  # never 0
    assert agent_status(fake_holder(server=False)) == "down #the model is loading"
    assert (
        agent_status(fake_holder(error="OSError: no\nsuch # file"))
        == "down #model failed: OSError: no such file"
    )
    assert agent_status(fake_holder(failed=RuntimeError("x"))) == "down #the model scheduler failed"
    assert agent_status(fake_holder(healthy=False)) == "down #a session log could not be written"
    holder = fake_holder()
    holder.paused = True
    assert agent_status(holder) == "drain"
    holder.paused, holder.draining = False, True
    assert agent_status(holder) == "drain"
    holder.server.writer.healthy = False
    assert agent_status(holder).startswith("down #")  # down wins over drain


async def test_the_agent_answers_one_line_per_connection_and_closes():
    answers = iter(["up ready maxconn:2", "drain"])
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_agent, lambda: next(answers), 0, "127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        for want in ("up ready maxconn:2\n", "drain\n"):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            data = b""
            with trio.fail_after(5):
                while chunk := await stream.receive_some(1024):
                    data += chunk
            assert data.decode() == want
            await stream.aclose()
        # A failing status still answers (down), never hangs HAProxy's check.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            data = await stream.receive_some(1024)
        assert data.startswith(b"down #agent error")
        nursery.cancel_scope.cancel()


# -- reservations --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parrot_engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=2)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_reserved_slot_is_taken_by_open_session_or_released(parrot_engine, tmp_path, autojump_clock):
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        first, second = await server.reserve(), await server.reserve()
        assert server.scheduler.table.free == 0
        with pytest.raises(ResourceExhausted):
            await server.reserve()
        with pytest.raises(ResourceExhausted):
            await server.open_session()  # the reserved slots are not up for grabs
        assert list(tmp_path.iterdir()) == []
        session = await server.open_session(reservation=first)
        assert session.slot == first.slot and first.state == "taken"
        second.release()
        second.release()  # idempotent
        assert server.scheduler.table.free == 1
        with await server.reserve() as third:  # released on exit when not taken
            assert server.scheduler.table.free == 0
        assert third.state == "released" and server.scheduler.table.free == 1
        # Not accepting (drain, SIGUSR1): a held reservation is refused too, and freed.
        fourth = await server.reserve()
        server.accepting = False
        server.not_accepting_reason = "draining"
        with pytest.raises(ResourceExhausted, match="draining"):
            await server.open_session(reservation=fourth)
        assert fourth.state == "released" and server.scheduler.table.free == 1
        with pytest.raises(ResourceExhausted, match="draining"):
            await server.reserve()
        server.accepting = True
        # A bad config frees the reservation and writes no log.
        fifth = await server.reserve()
        with pytest.raises(ValueError):
            await server.open_session({"x": float("nan")}, reservation=fifth)
        assert fifth.state == "released"
        await session.append(np.zeros(1920, dtype=np.float32))
        await session.close()
        assert server.scheduler.table.free == 2
    (log,) = tmp_path.iterdir()
    assert replay_logic(log).identical


async def test_finished_logs_are_announced(parrot_engine, tmp_path, autojump_clock):
    finished: list[tuple[str, Path]] = []
    async with open_duplex_server(parrot_engine, log_dir=tmp_path, virtual_time=True) as server:
        server.on_log_finished.append(lambda sid, path: finished.append((sid, path)))
        session = await server.open_session()
        assert finished == []
        await session.close()
        assert finished == [(session.session_id, tmp_path / f"{session.session_id}.dlog")]
        assert read_log(finished[0][1]).records[-1][1].__class__.__name__ == "End"


def test_pause_and_resume_of_a_holder():
    holder = ModelHolder(ServerConfig())
    server: Any = types.SimpleNamespace(accepting=True, not_accepting_reason="")
    holder.server = server
    holder.pause()
    assert server.accepting is False and "draining" in server.not_accepting_reason
    assert holder.resume() and server.accepting is True
    holder.draining = True
    assert holder.resume() is False


def test_config_refuses_an_unknown_refusal_mode():
    with pytest.raises(ValueError):
        ServerConfig(admission_refusal="teapot")
    assert (
        ServerConfig.from_env({"DUPLEX_ADMISSION_REFUSAL": "http", "DUPLEX_AGENT_PORT": "9"}).agent_port == 9
    )


# -- s3:// -----------------------------------------------------------------------------------------
def test_s3_urls():
    assert parse_s3_url("s3://b") == S3Location("b", "")
    assert parse_s3_url("s3://b/a/p/") == S3Location("b", "a/p")
    assert parse_s3_url("s3://b/a/p/", keep_trailing_slash=True).prefix == "a/p/"
    assert S3Location("b", "a/p").key_for("x.dlog") == "a/p/x.dlog"
    assert S3Location("b").key_for("x.dlog") == "x.dlog"
    for bad in ("b/p", "s3://", "s3:///p", "http://b/p"):
        with pytest.raises(BadS3Url):
            parse_s3_url(bad)


# -- the uploader against SeaweedFS ----------------------------------------------------------------
class Flaky:
    """A client whose first ``fail`` put_object calls fail like a dropped connection."""

    def __init__(self, client, fail: int) -> None:
        self.client = client
        self.fail = fail

    def put_object(self, **kwargs):
        if self.fail:
            self.fail -= 1
            raise ConnectionResetError("connection reset by peer")
        return self.client.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def make_log(path, payload: bytes = b"") -> bytes:
    from duplex_actors.log import records as r
    from duplex_actors.log.segment import MAGIC, encode_record

    data = MAGIC + encode_record(0, r.Heartbeat(payload.hex() or None))
    path.write_bytes(data)
    return data


async def test_the_uploader_stores_each_log_once_confirms_then_deletes(s3: S3Store, tmp_path):
    location = S3Location(s3.bucket, f"unit-{tmp_path.name}")
    client = s3.client()
    a = tmp_path / "sess_a.dlog"
    b = tmp_path / "sess_b.dlog"
    open_one = tmp_path / "sess_open.dlog"
    data_a = make_log(a)
    make_log(b, b"bb")
    make_log(open_one)
    (tmp_path / "notes.txt").write_text("not a log")
    uploader = LogUploader(
        location,
        tmp_path,
        client_factory=lambda: Flaky(client, fail=2),
        backoff_initial_s=0.01,
        is_open=lambda sid: sid == "sess_open",
    )
    assert uploader.scan() == 2  # the open log and the other file are left alone
    async with trio.open_nursery() as nursery:
        await nursery.start(uploader.run)
        with trio.fail_after(20):
            await uploader.wait_idle()
        st = uploader.statistics()
        assert (st.uploaded, st.already_present, st.failures, st.pending) == (2, 0, 2, 0)
        assert not a.exists() and not b.exists() and open_one.exists()
        stored = client.get_object(Bucket=s3.bucket, Key=location.key_for(a.name))["Body"].read()
        assert stored == data_a and read_records(stored).records

        # The same log again (a crash between the upload and the delete): 412, nothing overwritten.
        make_log(a)
        uploader.submit("sess_a", a)
        # Another log of the same name but other bytes: a conflict, the local file is kept.
        make_log(b, b"other bytes")
        uploader.submit("sess_b", b)
        uploader.submit("sess_gone", tmp_path / "sess_gone.dlog")  # pruned meanwhile
        with trio.fail_after(20):
            await uploader.wait_idle()
        st = uploader.statistics()
        assert st.already_present == 1 and not a.exists()
        assert b.exists() and dict(st.abandoned) == {"conflict": 1, "missing": 1}
        nursery.cancel_scope.cancel()
    assert list_log_keys(client, location) == [
        location.key_for("sess_a.dlog"),
        location.key_for("sess_b.dlog"),
    ]
    text = render(FrontEndSnapshot(uploader=uploader.statistics()))
    assert 'duplex_log_uploads_total{result="uploaded"} 2' in text
    assert 'duplex_log_uploads_total{result="already_present"} 1' in text
    assert "duplex_log_upload_failures_total 2" in text and "duplex_log_uploads_pending 0" in text
    assert 'duplex_log_uploads_abandoned_total{reason="conflict"} 1' in text
