"""The log dir against a real server process: a dir where no log can be created (injected
ENOSPC, or a small tmpfs that really fills: ``slow``), the re-probe that resumes admissions, live
logs that another process's retention cannot delete, and control acknowledgements that wait for
their record's commit (docs/design.md §2 "Budgets and hardening")."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import trio

from duplex_actors.log.retention import prune
from duplex_actors.log.segment import read_log

from ..e2e.conftest import ServerProcess, http_get, start_server
from ..e2e.helpers import connect, error_code
from .conftest import ametrics, aready, metric_sum, poll_until
from .test_model_faults import opened, received_frames, stream

PROBE_S = 1.0


async def refused_session(server: ServerProcess) -> tuple[list[str], int | None, list[str], float]:
    """A new session while the dir fails: (error codes, close code, event types, seconds)."""
    t0 = time.monotonic()
    async with connect(server.ws + "/v1/realtime", graceful=False) as c:
        await c.wait_closed(timeout=10)
    return c.error_codes(), c.close_code, c.types(), time.monotonic() - t0


async def wait_ready(server: ServerProcess, timeout: float) -> float:
    t0 = time.monotonic()

    def ready() -> bool:
        return http_get(server.base + "/ready")[0] == 200

    await poll_until(ready, timeout, interval=0.05, what="/ready 200")
    return time.monotonic() - t0


def transitions(server: ServerProcess) -> list[str]:
    """The server's log lines of the log dir's transitions, so far."""
    return [
        line
        for line in server.output.splitlines()
        if "log dir" in line and ("unavailable (" in line or "writable again" in line)
    ]


# -- item 4: a log that cannot be created ------------------------------------------------------------
async def test_a_log_dir_that_takes_no_new_file_refuses_visibly_and_recovers(tmp_path, parrot_dir, record):
    trigger = tmp_path / "create_error"
    server = start_server(
        tmp_path / "srv",
        "--max-sessions",
        "3",
        "--log-probe-interval",
        str(PROBE_S),
        env={"DUPLEX_FAULTS": f"log_create_error={trigger}:ENOSPC"},
    )
    try:
        async with connect(server.ws + "/v1/realtime") as b:
            await opened(b)  # created before the fault: its log works throughout
            trigger.touch()
            codes, close_code, types, refused_s = await refused_session(server)
            ready_status, ready = await aready(server)
            during = await ametrics(server)
            await trio.sleep(2.5 * PROBE_S)  # probes fail while the dir takes no file
            still_status, _ = await aready(server)
            probing = await ametrics(server)
            second = await refused_session(server)
            await b.send({"type": "session.heartbeat", "event_id": "b-during"})
            await b.wait_for("session.heartbeat_ack", timeout=5)
            await stream(b, 3)
            await b.wait_until(lambda: received_frames(b) >= 3, timeout=5)
            trigger.unlink()
            t0 = time.monotonic()
            recovered_s = await wait_ready(server, 5 * PROBE_S)
            after = await ametrics(server)
            async with connect(server.ws + "/v1/realtime") as d:
                await opened(d)
                await stream(d, 3)
                await d.wait_until(lambda: received_frames(d) >= 3, timeout=5)
            admitted_s = time.monotonic() - t0
            b_errors = b.error_codes()
    finally:
        rc = server.stop()
    lines = transitions(server)
    record(
        refusal=codes,
        close_code=close_code,
        refused_after_ms=round(refused_s * 1000, 1),
        ready_status=ready_status,
        ready_error=ready.get("error"),
        ready_status_while_probing=still_status,
        log_failed=metric_sum(during, "duplex_log_failed"),
        dir_available_during=metric_sum(during, "duplex_log_dir_available"),
        handler_errors=metric_sum(probing, "duplex_connection_errors_total", type="handler"),
        probe_failures=metric_sum(probing, "duplex_log_dir_probe_failures_total"),
        second_refusal=second[0],
        recovered_after_s=round(recovered_s, 2),
        admitted_after_s=round(admitted_s, 2),
        recoveries=metric_sum(after, "duplex_log_dir_recoveries_total"),
        dir_available_after=metric_sum(after, "duplex_log_dir_available"),
        b_went_on=not b_errors,
        transition_lines=len(lines),
        exit_code=rc,
    )
    assert codes == ["log_unavailable"] and close_code == 1011 and "session.created" not in types
    assert second[0] == ["log_unavailable"] and second[1] == 1011
    assert ready_status == 503 and still_status == 503 and "log" in ready["error"]
    assert metric_sum(during, "duplex_log_failed") >= 1
    assert metric_sum(during, "duplex_log_dir_available") == 0
    assert metric_sum(probing, "duplex_connection_errors_total", type="handler") == 0
    assert metric_sum(probing, "duplex_log_dir_probe_failures_total") >= 2
    assert recovered_s < 3 * PROBE_S
    assert metric_sum(after, "duplex_log_dir_recoveries_total") == 1
    assert metric_sum(after, "duplex_log_dir_available") == 1
    assert b_errors == []
    assert len(lines) == 2 and "unavailable" in lines[0] and "writable again" in lines[1], lines
    assert rc == 0


# -- item 4: a log dir that really fills (a small tmpfs; needs root and mount) ------------------------
@pytest.mark.slow
async def test_a_log_dir_that_really_fills_refuses_visibly_and_recovers(tmp_path, parrot_dir, record):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        server = start_server(mnt, "--max-sessions", "2", "--log-probe-interval", str(PROBE_S))
        try:
            filler = mnt / "filler"
            with open(filler, "wb") as f:  # fill every free block
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            codes, close_code, types, refused_s = await refused_session(server)
            ready_status, _ = await aready(server)
            during = await ametrics(server)
            filler.unlink()
            recovered_s = await wait_ready(server, 5 * PROBE_S)
            async with connect(server.ws + "/v1/realtime") as d:
                await opened(d)
                await stream(d, 3)
                await d.wait_until(lambda: received_frames(d) >= 3, timeout=5)
        finally:
            rc = server.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    record(
        refusal=codes,
        close_code=close_code,
        refused_after_ms=round(refused_s * 1000, 1),
        ready_status=ready_status,
        log_failed=metric_sum(during, "duplex_log_failed"),
        handler_errors=metric_sum(during, "duplex_connection_errors_total", type="handler"),
        recovered_after_s=round(recovered_s, 2),
        exit_code=rc,
    )
    assert codes == ["log_unavailable"] and close_code == 1011 and "session.created" not in types
    assert ready_status == 503 and metric_sum(during, "duplex_log_failed") >= 1
    assert metric_sum(during, "duplex_connection_errors_total", type="handler") == 0
    assert recovered_s < 3 * PROBE_S and rc == 0


# -- item 12: retention never deletes a log another process holds open -------------------------------
HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


async def test_retention_never_deletes_a_log_another_process_holds_open(tmp_path, parrot_dir, record):
    import sys

    log_dir = tmp_path / "srv" / "sessions"
    log_dir.mkdir(parents=True)
    old = time.time() - 3600
    held, free = log_dir / "sess_heldbyanother.dlog", log_dir / "sess_nobodyholds.dlog"
    for path in (held, free):
        path.write_bytes(b"x" * 100)
        os.utime(path, (old, old))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    server = start_server(tmp_path / "srv", "--max-sessions", "2", "--log-max-age", "60")
    try:
        # The server prunes at start: the file nobody holds goes, the held one stays.
        await poll_until(lambda: not free.exists(), 10, what="the unheld old log pruned")
        held_kept = held.exists()
        # And this process, a second pruner on the server's dir, cannot delete a live session's log.
        async with connect(server.ws + "/v1/realtime") as a:
            await opened(a)
            await stream(a, 2)
            await a.wait_until(lambda: received_frames(a) >= 2, timeout=5)
            live = server.log_dir / f"{a.session_id}.dlog"
            os.utime(live, (old, old))
            deleted_live = await trio.to_thread.run_sync(
                lambda: prune(log_dir, max_age_s=600, max_bytes=None, now=time.time())
            )
            fd = os.open(live, os.O_RDONLY)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    live_locked = False
                except BlockingIOError:
                    live_locked = True
            finally:
                os.close(fd)
            live_kept = live.exists()
        # Closed: the server released its lock (after the end record), so a prune may take it.
        deleted_closed: list[Path] = []

        def pruned_once_closed() -> bool:
            deleted_closed.extend(prune(log_dir, max_age_s=1, max_bytes=None, now=time.time() + 3600))
            return not live.exists()

        await poll_until(pruned_once_closed, 10, interval=0.05, what="the closed log pruned")
        held_after = held.exists()
        ended = True
    finally:
        server.stop()
        holder.communicate("", timeout=10)
    record(
        held_kept=held_kept,
        live_locked=live_locked,
        live_kept_from_a_second_pruner=live_kept,
        deleted_while_live=[p.name for p in deleted_live],
        deleted_once_closed=sorted(p.name for p in deleted_closed),
    )
    assert held_kept
    assert live_locked and live_kept and deleted_live == []
    assert live.name in {p.name for p in deleted_closed} and held_after and ended  # still held


# -- item 13: acknowledged only once durable -----------------------------------------------------------
async def test_control_acknowledgements_wait_for_their_commit(tmp_path, parrot_dir, record):
    stall, error = tmp_path / "fsync_stall", tmp_path / "fsync_error"
    stall_ms = 1500
    server = start_server(
        tmp_path / "srv",
        "--max-sessions",
        "2",
        "--log-probe-interval",
        str(PROBE_S),
        env={"DUPLEX_FAULTS": f"fsync_stall={stall}:{stall_ms},fsync_error={error}"},
    )
    try:
        async with connect(server.ws + "/v1/realtime") as a:
            await opened(a)

            async def heartbeat(eid: str) -> float:
                t0 = time.monotonic()
                await a.send({"type": "session.heartbeat", "event_id": eid})
                await a.wait_until(
                    lambda: any(e.get("client_event_id") == eid for e in a.of_type("session.heartbeat_ack")),
                    timeout=10,
                )
                return time.monotonic() - t0

            plain = [await heartbeat(f"plain-{i}") for i in range(5)]
            stall.touch()  # every fdatasync from now on (the heartbeat's commit) takes 1.5 s first
            stalled = await heartbeat("stalled")
            update_t0 = time.monotonic()
            await a.send({"type": "session.update", "session": {"temperature": 0.5}, "event_id": "upd"})
            await a.wait_for("session.updated", count=2, timeout=10)
            update_s = time.monotonic() - update_t0
            stall.unlink()
            await heartbeat("after-stall")
        async with connect(server.ws + "/v1/realtime") as idle:
            await opened(idle)
            await idle.send({"type": "session.heartbeat", "event_id": "before-error"})
            await idle.wait_for("session.heartbeat_ack", timeout=5)
            error.touch()  # the next commit fails with EIO
            await idle.send({"type": "session.heartbeat", "event_id": "after-error"})
            await idle.wait_error("log_unavailable", timeout=10)
            await idle.wait_closed(timeout=10)
            acks = [json.dumps(e) for e in idle.of_type("session.heartbeat_ack")]
        error.unlink()
        recovered_s = await wait_ready(server, 5 * PROBE_S)
        idle_log = read_log(server.log_dir / f"{idle.session_id}.dlog")
    finally:
        rc = server.stop()
    plain_ms = sorted(round(s * 1000, 1) for s in plain)
    record(
        heartbeat_rtt_ms=plain_ms,
        stall_ms=stall_ms,
        stalled_heartbeat_ms=round(stalled * 1000, 1),
        stalled_update_ms=round(update_s * 1000, 1),
        idle_acks=len(acks),
        idle_close_code=idle.close_code,
        idle_log_records=len(idle_log.records),
        recovered_after_s=round(recovered_s, 2),
        exit_code=rc,
    )
    # Neither ack can come before the 1.5 s fdatasync of its record has returned.
    assert stalled >= stall_ms / 1000 and update_s >= stall_ms / 1000
    assert len(acks) == 1 and "before-error" in acks[0]  # the one after the error is never acked
    assert idle.close_code == 1011 and idle.error_codes() == ["log_unavailable"]
    assert error_code(idle.errors()[0]) == "log_unavailable"
    assert rc == 0
