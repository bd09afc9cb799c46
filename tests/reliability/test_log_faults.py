"""The session log under failure: an fdatasync that fails (``DUPLEX_FAULTS=fsync_error``), and
a server killed with SIGKILL while sessions stream, then restarted on the same ``--log-dir``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.log.segment import encode_record, read_log
from duplex_actors.replay.replayer import replay_logic

from ..e2e.conftest import EXE, http_get, start_server
from ..e2e.helpers import connect, error_code, pcm16, tone_and_noise
from .conftest import OP_TEXT, RawWS, ametrics, append_text, aready, frame_bytes, metric_sum, tone_pcm16
from .test_model_faults import opened, received_frames, stream

REPLAY = str(Path(EXE).with_name("duplex-replay"))


# -- fsync error ----------------------------------------------------------------------------------
@pytest.mark.parametrize("errno_name", ["EIO", "ENOSPC"])
async def test_fsync_error_fails_that_log_tells_the_session_and_stops_admissions(
    tmp_path, parrot_dir, record, errno_name
):
    """A live session's log stops taking writes mid-stream: an I/O error, or the disk filling
    up (ENOSPC), both visible to that session, to new ones and to /ready, and replayable."""
    trigger = tmp_path / "fsync_error"
    server = start_server(
        tmp_path / "srv",
        "--max-sessions",
        "3",
        env={"DUPLEX_FAULTS": f"fsync_error={trigger}:{errno_name}"},
    )
    try:
        async with connect(server.ws + "/v1/realtime") as a, connect(server.ws + "/v1/realtime") as b:
            await opened(a)
            await opened(b)  # open and idle: nothing of it to write while the fault is armed
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream, a, 200)
                await a.wait_until(lambda: received_frames(a) >= 5)
                t0 = time.monotonic()
                trigger.touch()
                err = await a.wait_error("log_unavailable", timeout=5)
                told_s = time.monotonic() - t0
                await a.wait_closed(timeout=5)
                closed_s = time.monotonic() - t0
                nursery.cancel_scope.cancel()
            trigger.unlink()
            # New sessions are refused, with a clear error.
            t1 = time.monotonic()
            async with connect(server.ws + "/v1/realtime", graceful=False) as c:
                await c.wait_closed(timeout=5)
            refused_s = time.monotonic() - t1
            ready_status, ready = await aready(server)
            health_status, _ = await trio.to_thread.run_sync(http_get, server.base + "/health")
            text = await ametrics(server)
            # The session opened before the fault goes on (its own log never failed).
            await b.send({"type": "session.heartbeat", "event_id": "still-there"})
            await b.wait_for("session.heartbeat_ack", timeout=5)
            await stream(b, 3)
            await b.wait_until(lambda: received_frames(b) >= 3, timeout=5)
            b_errors = b.error_codes()
        a_log = read_log(server.log_dir / f"{a.session_id}.dlog")
        a_replay = replay_logic(server.log_dir / f"{a.session_id}.dlog")
        t2 = time.monotonic()
        rc = await trio.to_thread.run_sync(server.stop)
        exit_s = time.monotonic() - t2
    finally:
        server.stop()
    record(
        errno=errno_name,
        told_after_ms=round(told_s * 1000, 1),
        closed_after_ms=round(closed_s * 1000, 1),
        a_close_code=a.close_code,
        new_session_refusal=[error_code(e) for e in c.errors()],
        new_session_close_code=c.close_code,
        refused_after_ms=round(refused_s * 1000, 1),
        ready_status=ready_status,
        ready_error=ready.get("error"),
        health_status=health_status,
        log_failed_gauge=metric_sum(text, "duplex_log_failed"),
        b_went_on=not b_errors,
        a_log_records=len(a_log.records),
        a_log_has_end=isinstance(a_log.records[-1][1], r.End),
        a_replay=a_replay.summary(),
        sigterm_exit_code=rc,
        sigterm_exit_s=round(exit_s, 2),
    )
    assert error_code(err) == "log_unavailable" and a.close_code == 1011
    assert [error_code(e) for e in c.errors()] == ["log_unavailable"] and c.close_code == 1011
    assert c.of_type("session.created") == []
    assert ready_status == 503 and "log" in ready["error"]
    assert metric_sum(text, "duplex_log_failed") >= 1
    assert b_errors == []
    assert a_replay.identical  # what reached the disk replays (no end record: "consistent")
    assert rc == 0 and exit_s < 10


# -- SIGKILL during writes ------------------------------------------------------------------------
async def streaming(log_dir: Path, ids: list[str], sessions: int = 3, steps: int = 15) -> None:
    """Return once ``sessions`` sessions are open and each log holds ``steps`` step records."""

    def stepped(session_id: str) -> int:
        path = log_dir / f"{session_id}.dlog"
        return sum(isinstance(rec, r.Step) for _, rec in read_log(path).records) if path.exists() else 0

    with trio.fail_after(30):
        while len(ids) < sessions or min(stepped(i) for i in ids) < steps:
            await trio.sleep(0.05)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, parrot_dir):
    """Three sessions stream as fast as the server takes them; SIGKILL mid-stream; then one
    half-written record is appended to one log (what a kill in the middle of a write leaves, in
    case the kill itself tore none); then a new server starts on the same --log-dir."""
    root = tmp_path_factory.mktemp("killed")
    first = start_server(root, "--max-sessions", "4")
    ids: list[str] = []

    async def load() -> None:
        async def one(i: int) -> None:
            ws = await RawWS.connect(first.port, "/v1/realtime")
            created = await ws.recv_event("session.created")
            ids.append(created["session"]["id"])
            msg = frame_bytes(OP_TEXT, append_text(tone_pcm16(1, seed=i)).encode())
            try:
                while True:
                    await ws.send(msg)
                    await trio.sleep(0.01)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
            await streaming(first.log_dir, ids)
            # The whole server at once (its engine core and its front ends), as a crash does.
            for pid in first.pids:
                os.kill(pid, signal.SIGKILL)
            await trio.to_thread.run_sync(first.proc.wait)
            nursery.cancel_scope.cancel()

    trio.run(load)
    first.stop()
    logs = sorted(first.log_dir.glob("*.dlog"))
    before = {p.name: read_log(p) for p in logs}
    torn_by_kill = [name for name, res in before.items() if res.torn_tail is not None]
    # One more torn tail, the kind a kill inside os.write leaves: the first half of the next
    # record (so recovery has one to do even if the kill tore none).
    synthetic = None
    for session_id in ids:
        name = f"{session_id}.dlog"
        if before[name].torn_tail is None and before[name].records:
            res = before[name]
            whole = encode_record(res.next_seq, res.records[-1][1])
            with open(first.log_dir / name, "ab") as f:
                f.write(whole[: len(whole) // 2])
            synthetic = name
            break
    torn_now = [p.name for p in logs if read_log(p).torn_tail is not None]
    t0 = time.monotonic()
    second = start_server(root, "--max-sessions", "4")
    restart_s = time.monotonic() - t0
    metrics = http_get(second.base + "/metrics")[1]
    after = {p.name: read_log(p) for p in logs}
    replay = subprocess.run([REPLAY, str(second.log_dir)], capture_output=True, text=True, timeout=120)
    yield {
        "server": second,
        "ids": ids,
        "logs": logs,
        "before": before,
        "after": after,
        "torn_by_kill": torn_by_kill,
        "torn_before_restart": torn_now,
        "synthetic": synthetic,
        "restart_s": restart_s,
        "metrics": metrics,
        "replay": replay,
    }
    second.stop()


async def test_sigkill_torn_tails_are_truncated_and_every_log_replays(killed, record):
    server = killed["server"]
    before, after = killed["before"], killed["after"]
    # Start-up recovery truncated every torn tail and kept every whole record before it.
    for name in before:
        assert after[name].torn_tail is None, name
        assert len(after[name].records) == len(before[name].records), name
    without_end = [
        n for n, res in after.items() if not res.records or not isinstance(res.records[-1][1], r.End)
    ]
    replay = killed["replay"]
    summary = replay.stdout.strip().splitlines()[-1]
    consistent = sum("consistent" in line for line in replay.stdout.splitlines())
    # The restarted server works.
    async with connect(server.ws + "/v1/realtime") as c:
        await opened(c)
        await c.append(pcm16(tone_and_noise(0.16)))
        await c.wait_until(lambda: received_frames(c) >= 2)
    status, ready = await aready(server)
    record(
        logs=len(before),
        torn_tails_left_by_the_kill=len(killed["torn_by_kill"]),
        torn_tails_at_restart=len(killed["torn_before_restart"]),
        synthetic_torn_tail=killed["synthetic"] is not None,
        logs_without_end_record=len(without_end),
        records_kept=sum(len(res.records) for res in after.values()),
        restart_to_ready_s=round(killed["restart_s"], 2),
        replay_exit=replay.returncode,
        replay_summary=summary,
        replay_consistent_without_end=consistent,
    )
    assert killed["torn_before_restart"]  # recovery had something to do
    assert len(without_end) >= 3  # the three killed sessions
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert consistent >= 3
    assert status == 200 and ready["slots_free"] == ready["slots_total"]


async def test_recovered_logs_are_counted_in_metrics(killed, record):
    """``/metrics`` reports how many logs start-up recovery repaired: the engine core recovers
    them before any front end starts and reports the count with its statistics
    (``duplex_log_recovered_total``)."""
    text = killed["metrics"]
    value = re.search(r"^duplex_log_recovered_total(?:\{\})? (\S+)$", text, re.MULTILINE)
    record(
        torn_tails_at_restart=len(killed["torn_before_restart"]),
        duplex_log_recovered_total=value.group(1) if value else "absent",
    )
    assert value is not None, "duplex_log_recovered_total is not in /metrics"
    assert float(value.group(1)) == len(killed["torn_before_restart"])
