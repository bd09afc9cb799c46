"""Clients that go wrong at the transport: killed mid-frame, silent, or no longer reading.

One server for the module: ``--max-sessions 4 --idle-timeout 2 --outbox-events 64``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import cast

import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.replay.replayer import replay_logic

from ..e2e.conftest import EXE, start_server
from .conftest import (
    OP_TEXT,
    RawWS,
    ametrics,
    append_text,
    frame_bytes,
    metric_sum,
    output_deltas,
    tone_pcm16,
    wait_slots_free,
)

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

IDLE_TIMEOUT_S = 2.0
OUTBOX_EVENTS = 64
TCP_USER_TIMEOUT_S = 15.0


# The module's limits, on both of its servers.
EDGE_ARGS = (
    "--max-sessions",
    "4",
    "--idle-timeout",
    str(IDLE_TIMEOUT_S),
    "--outbox-events",
    str(OUTBOX_EVENTS),
    "--drain-timeout",
    "2",  # the teardown is quicker when a connection is stuck (see the last test)
)


@pytest.fixture(scope="module")
def edge_server(tmp_path_factory, parrot_dir):
    server = start_server(tmp_path_factory.mktemp("edge"), *EDGE_ARGS)
    yield server
    server.stop()


# The slow-consumer test's engine: the stand-in (``--model standin:MS``), whose step waits this
# long with the GIL released on any host, as a GPU's does. On the tiny model each step's CPU
# grows with the batch on this host's two cores, so the slow client's own slot, and the host's
# speed between the baseline and the loaded run (p99 171 -> 895 ms in one fresh-clone CI run,
# 733-2433 ms baselines in one slow hour), set the others' round trip; what is measured is what
# a client that does not read costs the serving path.
STANDIN_STEP_MS = 20


@pytest.fixture(scope="module")
def standin_edge_server(tmp_path_factory):
    """``edge_server``'s limits on the stand-in engine (see :data:`STANDIN_STEP_MS`)."""
    server = start_server(
        tmp_path_factory.mktemp("edge-standin"), *EDGE_ARGS, model=f"standin:{STANDIN_STEP_MS}"
    )
    yield server
    server.stop()


async def finished_log(log_dir: Path, session_id: str, timeout: float = 10.0) -> list[r.Record]:
    path = log_dir / f"{session_id}.dlog"
    with trio.fail_after(timeout):
        while True:
            if path.exists():
                recs = [rec for _, rec in read_log(path).records]
                if recs and isinstance(recs[-1], r.End):
                    return recs
            await trio.sleep(0.02)


def assert_replays(log_dir: Path, session_id: str) -> None:
    report = replay_logic(log_dir / f"{session_id}.dlog")
    assert report.complete and report.identical and report.torn_tail is None, report.summary()


# -- client killed mid-frame --------------------------------------------------------------------
@pytest.mark.parametrize("how", ["fin", "rst"])
async def test_client_killed_mid_frame_frees_its_slot_within_1s(edge_server, how, record):
    await wait_slots_free(edge_server)
    ws = await RawWS.connect(edge_server.port, "/v1/realtime")
    assert ws.status == 101, ws.head
    created = await ws.recv_event("session.created")
    session_id = created["session"]["id"]
    pcm = tone_pcm16(5)
    for k in range(5):
        await ws.send_text(append_text(pcm[k * 3840 : (k + 1) * 3840]))
    with trio.fail_after(10):
        while len(output_deltas(ws.events())) < 5:
            await ws.recv()
    assert await ws_slots(edge_server) == 1
    # Half of one frame: the header announces the whole append, only half the payload follows.
    whole = frame_bytes(OP_TEXT, append_text(tone_pcm16(1, seed=1)).encode())
    await ws.send(whole[: len(whole) // 2])
    await server_has_read(edge_server.port, ws.stream.socket.getsockname()[1])
    if how == "rst":
        ws.abort()
    else:
        await ws.aclose()  # FIN without a close frame
    freed_s = await wait_slots_free(edge_server, timeout=5, interval=0.005)
    recs = await finished_log(edge_server.log_dir, session_id)
    record(how=how, slot_freed_ms=round(freed_s * 1000, 1), log_records=len(recs))
    assert freed_s < 1.0
    assert recs[-2] == r.Close("disconnect") and isinstance(recs[-1], r.End)
    assert sum(isinstance(x, r.Step) for x in recs) == 5
    assert_replays(edge_server.log_dir, session_id)
    assert edge_server.proc.poll() is None


async def ws_slots(server) -> float:
    return metric_sum(await ametrics(server), "duplex_slots_in_use")


# -- silent peers -------------------------------------------------------------------------------
async def test_silent_peer_after_upgrade_is_closed_by_the_idle_timeout(edge_server, record):
    """Connected and upgraded (a session is open), then not one byte and never a close: the idle
    timeout (--idle-timeout 2) closes the session; the peer does not answer the close frame."""
    await wait_slots_free(edge_server)
    ws = await RawWS.connect(edge_server.port, "/v1/realtime?duplex=1")
    t_open = time.monotonic()
    created = await ws.recv_event("session.created")
    closed = await ws.recv_event("session.closed", timeout=IDLE_TIMEOUT_S + 5)
    t_closed = time.monotonic() - t_open
    await ws.recv_until(lambda f: f[0] == 0x8, timeout=5)
    t_close_frame = time.monotonic() - t_open
    freed = await wait_slots_free(edge_server, timeout=5)
    await ws.read_to_eof(timeout=15)  # the server drops the TCP connection by itself
    t_eof = time.monotonic() - t_open
    record(
        idle_timeout_s=IDLE_TIMEOUT_S,
        session_closed_s=round(t_closed, 3),
        close_frame_s=round(t_close_frame, 3),
        tcp_closed_by_server_s=round(t_eof, 3),
        slot_free_after_s=round(t_closed + freed, 3),
    )
    assert closed["reason"] == "timeout" and ws.close_code == 1000
    assert IDLE_TIMEOUT_S - 0.05 <= t_closed <= IDLE_TIMEOUT_S + 1.0
    recs = await finished_log(edge_server.log_dir, created["session"]["id"])
    assert recs[-2] == r.Close("timeout")
    await ws.aclose()


@pytest.mark.parametrize(
    "sent", [b"", b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["nothing", "half-request"]
)
async def test_silent_tcp_peer_is_dropped_by_the_keep_alive_timeout(edge_server, sent, record):
    """A TCP connection that never completes an HTTP request (no bytes, or half a request head):
    hypercorn's keep-alive timeout (5 s) drops it; no session, no slot."""
    opened_before = metric_sum(await ametrics(edge_server), "duplex_sessions_opened_total")
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", edge_server.port)
    t0 = time.monotonic()
    if sent:
        await stream.send_all(sent)
    with trio.fail_after(15):
        data = b""
        while True:
            try:
                chunk = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
    dropped_s = time.monotonic() - t0
    await stream.aclose()
    text = await ametrics(edge_server)
    record(sent_bytes=len(sent), dropped_after_s=round(dropped_s, 3), response_bytes=len(data))
    assert dropped_s <= 5.0 + 1.0
    assert metric_sum(text, "duplex_sessions_opened_total") == opened_before
    assert metric_sum(text, "duplex_slots_in_use") == 0


# -- slow consumer ------------------------------------------------------------------------------
def tcp_queues(port_a: int, port_b: int) -> dict[str, int]:
    """tx/rx queue bytes of both ends of the loopback connection between two ports."""
    out: dict[str, int] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        tx, rx = (int(x, 16) for x in f[4].split(":"))
        if (local, remote) == (port_a, port_b):
            out.update(server_tx=tx, server_rx=rx, server_state=int(f[3], 16))
        elif (local, remote) == (port_b, port_a):
            out.update(client_tx=tx, client_rx=rx)
    return out


async def server_has_read(server_port: int, client_port: int, timeout: float = 5.0) -> None:
    """Return once every byte the client sent is read by the server process: nothing left in
    the client's send queue (unacknowledged) nor in the server's receive queue."""

    def read() -> bool:
        q = tcp_queues(server_port, client_port)
        return q.get("client_tx", 1) == 0 and q.get("server_rx", 1) == 0

    with trio.fail_after(timeout):
        while not read():
            await trio.sleep(0.002)


async def run_load(server, out: Path, sessions: int, seconds: float) -> dict:
    load_exe = str(Path(EXE).with_name("duplex-load"))
    cmd = [load_exe, "--url", f"{server.ws}/v1/realtime", "--sessions", str(sessions)]
    cmd += ["--seconds", str(seconds), "--out", str(out)]
    with trio.fail_after(seconds + 30):
        proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads((out / "load.json").read_text())["aggregate"]


async def slow_client(server, result: dict, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Open a session with a 4 KiB receive buffer and read nothing after session.updated; send
    100 frames (8 s) of audio as fast as the socket takes them, then one frame per 80 ms (so the
    idle timeout never applies) until the server stops taking them."""
    ws = await RawWS.connect(server.port, "/v1/realtime", rcvbuf=4096)
    created = await ws.recv_event("session.created")
    await ws.recv_event("session.updated")
    result["ws"] = ws
    result["session_id"] = created["session"]["id"]
    result["client_port"] = ws.stream.socket.getsockname()[1]
    msg = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)).encode())
    result["t0"] = time.monotonic()
    task_status.started()
    try:
        for k in range(500):
            await ws.send(msg)
            if k >= 100:
                await trio.sleep(0.08)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the server dropped us: that is the policy at work


async def test_slow_consumer_is_closed_within_its_bound_and_others_keep_real_time(
    standin_edge_server, tmp_path, record
):
    server = standin_edge_server
    await wait_slots_free(server)
    await run_load(server, tmp_path / "warmup", 2, 2)  # the first run's numbers are not typical
    await wait_slots_free(server)
    baseline = await run_load(server, tmp_path / "baseline", 2, 8)
    await wait_slots_free(server)
    slow: dict = {"load_done": trio.Event()}
    fired_s: float | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(slow_client, server, slow)
        nursery.start_soon(run_load_into, slow, server, tmp_path / "with_slow")
        with trio.move_on_after(TCP_USER_TIMEOUT_S):
            while True:
                text = await ametrics(server)
                if metric_sum(text, "duplex_sessions_closed_total", reason="slow_consumer") >= 1:
                    fired_s = time.monotonic() - slow["t0"]
                    break
                await trio.sleep(0.02)
        if fired_s is None:
            closed = [line for line in text.splitlines() if line.startswith("duplex_sessions_closed")]
            raise AssertionError(f"the slow-consumer policy did not fire; {closed}")
        freed_s = await wait_slots_free_of(server, slow["session_id"])
        await trio.sleep(0.2)
        queues = tcp_queues(server.port, slow["client_port"])
        with trio.fail_after(30):
            await slow["load_done"].wait()
        slow["ws"].abort()  # the slow client goes away (RST)
    loaded = slow["load"]
    recs = await finished_log(server.log_dir, slow["session_id"])
    steps = sum(isinstance(x, r.Step) for x in recs)
    kernel_bytes = queues.get("server_tx", 0) + queues.get("client_rx", 0)
    in_kernel = kernel_bytes / DELTA_EVENT_BYTES
    await wait_slots_free(server)
    ratio = loaded["round_trip_ms"]["p99"] / baseline["round_trip_ms"]["p99"]
    record(
        outbox_events=OUTBOX_EVENTS,
        policy_fired_after_s=round(fired_s or -1, 3),
        slot_freed_after_s=round(freed_s - slow["t0"], 3),
        slow_session_frames_stepped=steps,
        kernel_buffered_bytes=kernel_bytes,
        kernel_buffered_frames=round(in_kernel, 1),
        baseline_rtt_p99_ms=baseline["round_trip_ms"]["p99"],
        with_slow_rtt_p99_ms=loaded["round_trip_ms"]["p99"],
        p99_ratio=round(ratio, 3),
        baseline_lost=baseline["lost_frames"],
        with_slow_lost=loaded["lost_frames"],
    )
    assert recs[-2] == r.Close("slow_consumer")
    # The bound: at most OUTBOX_EVENTS events held for it beyond what the kernel buffers hold.
    assert steps <= OUTBOX_EVENTS + in_kernel + 4, (steps, in_kernel)
    assert fired_s is not None and fired_s < TCP_USER_TIMEOUT_S
    assert loaded["failed_sessions"] == 0 and loaded["lost_frames"] == 0 and loaded["coverage"] >= 0.99
    # The project's bar for what one client may cost the others (docs/design.md §4, decision 11):
    # their p99 below 2x the no-attack baseline. A tighter 1.5x failed a fresh-clone CI run at
    # 1.56x (p99 61 -> 95 ms over 2 x 100 frames, i.e. the 2nd-highest sample) with p50 53 -> 59 ms.
    assert ratio < 2.0, (baseline["round_trip_ms"], loaded["round_trip_ms"])
    assert_replays(server.log_dir, slow["session_id"])


# One realtime output_audio.delta of one 80 ms frame on the wire: ~5.1 KB of base64 + fields.
DELTA_EVENT_BYTES = 5400


async def test_a_slow_consumer_that_goes_away_leaves_no_connection_behind(tmp_path, parrot_dir, record):
    """A client streams audio and never reads: the slow-consumer policy closes its session; the
    client keeps sending until the server stops reading (its send blocks), then its socket is
    reset. The server must then hold nothing for it: the connection is gone from
    ``duplex_tcp_connections_open`` at once, and SIGTERM exits without waiting for it.

    Before the fix the handler never ended (until the process exited): hypercorn's inbound
    queues were full, and the disconnect it had to deliver, in the writer's own task (its send
    had just failed with the reset), waited on them forever."""
    server = start_server(
        tmp_path, "--max-sessions", "2", "--outbox-events", str(OUTBOX_EVENTS), "--drain-timeout", "1"
    )
    try:
        ws = await RawWS.connect(server.port, "/v1/realtime", rcvbuf=4096)
        created = await ws.recv_event("session.created")
        session_id = created["session"]["id"]
        msg = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)).encode())
        t0 = time.monotonic()
        sent = 0
        log_path = server.log_dir / f"{session_id}.dlog"
        while not _has_end(log_path):  # about the model's pace until the policy closes the session
            with trio.fail_after(10):
                await ws.send(msg)
            sent += 1
            # At the model's pace: faster, the soft input budget (2 s ahead) stops the server
            # reading this socket, and the send above can block past its 10 s before the
            # slow-consumer policy fires (seen once in a fresh-clone run).
            await trio.sleep(0.08)
            assert time.monotonic() - t0 < 30, "the slow-consumer policy did not fire"
        while True:  # then as fast as the socket takes it, until the server stops reading
            with trio.move_on_after(1) as blocked:
                await ws.send(msg)
            if blocked.cancelled_caught:
                break
            sent += 1
            assert time.monotonic() - t0 < 60, "the server kept reading"
        blocked_s = time.monotonic() - t0
        recs = await finished_log(server.log_dir, session_id)
        open_before = metric_sum(await ametrics(server), "duplex_tcp_connections_open")
        ws.abort()  # the client goes away (RST)
        t_rst = time.monotonic()
        open_after = open_before
        with trio.move_on_after(5):
            while open_after > 1:  # the /metrics request itself
                open_after = metric_sum(await ametrics(server), "duplex_tcp_connections_open")
                await trio.sleep(0.02)
        gone_s = time.monotonic() - t_rst
        t1 = time.monotonic()
        rc = await trio.to_thread.run_sync(server.stop)
        exit_s = time.monotonic() - t1
    finally:
        server.stop()
    record(
        frames_sent_until_blocked=sent,
        client_blocked_after_s=round(blocked_s, 2),
        session_close=cast(r.Close, recs[-2]).reason,
        tcp_connections_open_before_reset=open_before,
        tcp_connections_open_after=open_after,
        connection_gone_after_reset_s=round(gone_s, 3),
        drain_timeout_s=1,
        sigterm_exit_s=round(exit_s, 2),
        exit_code=rc,
        cancelled_in_output="did not read its input" in server.output,
    )
    assert recs[-2] == r.Close("slow_consumer")
    assert open_before == 2 and open_after == 1, (open_before, open_after)  # + the /metrics one
    assert rc == 0
    # Before: ~8 s = drain timeout (1 s) + hypercorn's graceful timeout (drain + 5 s), the
    # handler never finishing. What is left is the exit of an idle server (~1-3 s on 2 loaded cores).
    assert exit_s < 6.0


def _has_end(path: Path) -> bool:
    if not path.exists():
        return False
    recs = [rec for _, rec in read_log(path).records]
    return bool(recs) and isinstance(recs[-1], r.End)


async def run_load_into(slow: dict, server, out: Path) -> None:
    slow["load"] = await run_load(server, out, 2, 8)
    slow["load_done"].set()


async def wait_slots_free_of(server, session_id: str) -> float:
    """When the session's log is finished (its slot is released before that)."""
    await finished_log(server.log_dir, session_id, timeout=10)
    return time.monotonic()
