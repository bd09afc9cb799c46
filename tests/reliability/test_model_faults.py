"""Failures inside the server, injected with ``DUPLEX_FAULTS`` trigger files
(``duplex_actors.faults``): a model step that raises, a model step that stalls, a connection
handler that raises. Clients are the schema-validating ``tests.e2e.helpers.Client``.

One server for the module, ``--max-sessions 4``, every trigger armed (none exists yet); the
stall's recovery is measured on a second one whose engine is the stand-in (:data:`STANDIN_STEP_MS`).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from duplex_actors.log import records as r

from ..e2e.conftest import start_server
from ..e2e.helpers import FRAME_PCM16_BYTES, Client, connect, error_code, pcm16, tone_and_noise
from .conftest import ametrics, aready, metric_sum, wait_slots_free
from .test_disconnects import assert_replays, finished_log

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

SLOTS = 4
STALL_MS = 200
FRAME_S = 0.08
# The stall test's engine: the stand-in (``--model standin:MS``), whose step takes this long on
# any host. The tiny model's step is 15-50 ms by the host's speed, and how fast the scheduler
# catches up after a stall (extra steps while they fit within a tick) moves with it.
STANDIN_STEP_MS = 20


@pytest.fixture(scope="module")
def triggers(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("faults")
    return {name: d / name for name in ("step_raise", "step_stall", "handler_raise")}


@pytest.fixture(scope="module")
def stall_server(tmp_path_factory, triggers):
    """The stand-in engine with the stall armed (see :data:`STANDIN_STEP_MS`)."""
    server = start_server(
        tmp_path_factory.mktemp("stalling"),
        "--max-sessions",
        str(SLOTS),
        model=f"standin:{STANDIN_STEP_MS}",
        env={"DUPLEX_FAULTS": f"step_stall={triggers['step_stall']}:{STALL_MS}"},
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory, parrot_dir, triggers):
    spec = (
        f"step_raise={triggers['step_raise']},step_stall={triggers['step_stall']}:{STALL_MS},"
        f"handler_raise={triggers['handler_raise']}"
    )
    server = start_server(
        tmp_path_factory.mktemp("faulty"), "--max-sessions", str(SLOTS), env={"DUPLEX_FAULTS": spec}
    )
    yield server
    server.stop()


def frame(k: int) -> bytes:
    return pcm16(tone_and_noise(0.08, seed=k))


async def opened(client: Client) -> Client:
    if client.dialect == "native":
        await client.send({"type": "session.create", "session": {}})
    await client.wait_for("session.updated")
    return client


def received_frames(client: Client) -> int:
    return len(client.output_audio()) // FRAME_PCM16_BYTES


async def stream(client: Client, frames: int, first: int = 0) -> None:
    """``frames`` frames paced in real time; stops quietly if the server closes the socket."""
    start = time.monotonic()
    for k in range(frames):
        await trio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        try:
            await client.append(frame(first + k))
        except ConnectionClosed:
            return


# -- the model step raises for one tick -----------------------------------------------------------
async def test_step_raise_ends_only_the_sessions_in_that_step(fault_server, triggers, record):
    await wait_slots_free(fault_server)
    failures_before = metric_sum(await ametrics(fault_server), "duplex_step_failures_total")
    async with (
        connect(fault_server.ws + "/v1/realtime?duplex=1") as a,
        connect(fault_server.ws + "/v1/duplex") as b,
    ):
        await opened(a)
        await opened(b)  # open, not sending: in no step
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, a, 100)
            await a.wait_until(lambda: received_frames(a) >= 5)
            t0 = time.monotonic()
            triggers["step_raise"].touch()
            err = await a.wait_error("internal_error", timeout=5)
            t_error = time.monotonic() - t0
            await a.wait_closed(timeout=5)
            t_closed = time.monotonic() - t0
            nursery.cancel_scope.cancel()
        assert not triggers["step_raise"].exists()  # taken by exactly one step
        # b goes on: heartbeat answered, audio in -> audio out, no error.
        await b.send({"type": "session.heartbeat", "event_id": "hb-after"})
        await b.wait_for("session.heartbeat_ack")
        await stream(b, 4)
        await b.wait_until(lambda: received_frames(b) >= 4)
        assert b.errors() == [] and not b.closed.is_set()
    freed = await wait_slots_free(fault_server)
    # Every slot works again, the one reset after the failure included.
    async with trio.open_nursery() as nursery:
        for i in range(SLOTS):
            nursery.start_soon(one_short_session, fault_server, i)
    status, ready = await aready(fault_server)
    text = await ametrics(fault_server)
    failures = metric_sum(text, "duplex_step_failures_total") - failures_before
    record(
        error_after_ms=round(t_error * 1000, 1),
        closed_after_ms=round(t_closed * 1000, 1),
        close_code=a.close_code,
        step_failures_delta=failures,
        frames_dropped_step_failed=metric_sum(text, "duplex_frames_dropped_total", reason="step_failed"),
        slots_free_after=ready["slots_free"],
        slots_total=ready["slots_total"],
        slots_freed_after_close_ms=round(freed * 1000, 1),
    )
    assert error_code(err) == "internal_error" and a.close_code == 1011
    assert a.of_type("session.closed")[-1]["reason"] == "error"
    assert failures == 1
    assert status == 200 and ready["slots_free"] == ready["slots_total"] == SLOTS
    recs = await finished_log(fault_server.log_dir, a.session_id)
    assert recs[-2] == r.Close("error")
    assert_replays(fault_server.log_dir, a.session_id)


async def one_short_session(server, i: int) -> None:
    async with connect(server.ws + "/v1/realtime") as c:
        await opened(c)
        await stream(c, 2, first=10 * i)
        await c.wait_until(lambda: received_frames(c) >= 2)
        assert c.errors() == []


# -- the model step stalls past the frame budget --------------------------------------------------
async def test_step_stall_counts_deadline_misses_stays_bounded_and_recovers(stall_server, triggers, record):
    await wait_slots_free(stall_server)
    misses_before = metric_sum(await ametrics(stall_server), "duplex_deadline_misses_total")
    sent_at: dict[int, float] = {}
    arrived: dict[int, float] = {}
    in_flight: list[tuple[float, int]] = []

    def on_message(_: Client, msg) -> None:
        if isinstance(msg, dict) and msg["type"] == "response.output_audio.delta":
            md = msg["metadata"]
            for k in range(md["frame_index"], md["frame_index"] + md["audio_duration_ms"] // 80):
                arrived[k] = time.monotonic()

    normal_s, stall_s, after_s = 1.0, 1.0, 3.0
    total = round((normal_s + stall_s + after_s) / FRAME_S)
    async with connect(stall_server.ws + "/v1/realtime") as c:
        c.on_message = on_message
        await opened(c)
        start = time.monotonic()
        t_stall = t_unstall = 0.0
        for k in range(total):
            await trio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
            now = time.monotonic()
            if not t_stall and now - start >= normal_s:
                triggers["step_stall"].touch()
                t_stall = now
            if t_stall and not t_unstall and now - t_stall >= stall_s:
                triggers["step_stall"].unlink()
                t_unstall = now
            sent_at[k] = now
            await c.append(frame(k))
            in_flight.append((now - start, k + 1 - len(arrived)))
        await c.wait_until(lambda: len(arrived) == total, timeout=10)
        assert c.errors() == []
    misses = metric_sum(await ametrics(stall_server), "duplex_deadline_misses_total") - misses_before
    rtt = {k: (arrived[k] - sent_at[k]) * 1000 for k in sent_at}
    before = [rtt[k] for k in sent_at if sent_at[k] < t_stall]
    stalled_max_in_flight = max(n for t, n in in_flight if t_stall - start <= t <= t_unstall - start + 0.5)
    after = sorted(k for k in sent_at if sent_at[k] >= t_unstall)
    # Recovered: from the first frame after which every round trip is under 80 ms.
    recovered_k = next((k for k in after if all(rtt[j] < 80 for j in after if j >= k)), None)
    trace = [(k, round(sent_at[k] - start, 2), round(rtt[k])) for k in sorted(rtt)]
    assert recovered_k is not None, trace
    recovery_s = sent_at[recovered_k] - t_unstall
    tail = [rtt[k] for k in after if sent_at[k] >= t_unstall + 1.5]
    record(
        stall_ms_per_step=STALL_MS,
        stall_s=round(t_unstall - t_stall, 2),
        deadline_misses_delta=misses,
        rtt_before_max_ms=round(max(before), 1),
        rtt_during_max_ms=round(max(rtt.values()), 1),
        max_frames_in_flight=stalled_max_in_flight,
        recovered_after_s=round(recovery_s, 2),
        rtt_last_1_5s_max_ms=round(max(tail), 1),
        frames=total,
        frames_received=len(arrived),
    )
    assert misses > 0
    # Bounded: at most the frames sent during the stall (+ the step in progress) are pending.
    assert stalled_max_in_flight <= (t_unstall - t_stall) / FRAME_S + 3
    assert in_flight[-1][1] <= 2
    assert recovery_s < 1.5
    assert max(tail) < 80


# -- an unhandled exception in the connection handler ---------------------------------------------
@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/duplex"])
async def test_handler_exception_is_error_and_1011_never_1000(fault_server, triggers, path, record):
    await wait_slots_free(fault_server)
    errors_before = metric_sum(await ametrics(fault_server), "duplex_connection_errors_total")
    async with connect(fault_server.ws + path) as c:
        await opened(c)
        await c.append(frame(0))
        await c.wait_until(lambda: received_frames(c) >= 1)
        before = len(c.messages)
        triggers["handler_raise"].touch()
        t0 = time.monotonic()
        await c.send({"type": "session.heartbeat", "event_id": "boom"})
        await c.wait_closed(timeout=5)
        closed_s = time.monotonic() - t0
    freed = await wait_slots_free(fault_server)
    errors = metric_sum(await ametrics(fault_server), "duplex_connection_errors_total") - errors_before
    record(
        path=path,
        events_after_fault=c.types(before),
        close_code=c.close_code,
        closed_after_ms=round(closed_s * 1000, 1),
        slot_freed_ms=round(freed * 1000, 1),
        connection_errors_delta=errors,
    )
    assert not triggers["handler_raise"].exists()
    assert c.close_code == 1011
    assert [error_code(e) for e in c.errors(before)] == ["internal_error"]
    assert errors == 1
    recs = await finished_log(fault_server.log_dir, c.session_id)
    assert recs[-2] == r.Close("error")
    assert_replays(fault_server.log_dir, c.session_id)


# -- a slow model and the bundled client ----------------------------------------------------------
async def test_the_bundled_client_waits_for_a_slow_model_and_names_a_stall(fault_server, triggers, tmp_path):
    """``duplex-client --timeout`` bounds the wait between frames, not the whole reply: with every
    step stalled 200 ms, 7 frames take at least 1.4 s and a 1 s limit gets them all; a 0.05 s
    limit ends the reply with that limit named."""
    import io

    from duplex_actors.audio import float_to_pcm16
    from duplex_actors.client.audio import write_wav
    from duplex_actors.client.cli import EXIT_INCOMPLETE, EXIT_OK, build_parser, run

    await wait_slots_free(fault_server)
    wav = tmp_path / "in.wav"
    write_wav(str(wav), float_to_pcm16(tone_and_noise(0.32)), 24_000)  # 4 frames + 3 of tail
    base = ["--url", f"{fault_server.ws}/v1/realtime?duplex=1", "--input", str(wav), "--fast", "--quiet"]
    triggers["step_stall"].touch()
    try:
        err = io.StringIO()
        started = time.monotonic()
        code = await run(
            build_parser().parse_args([*base, "--output", str(tmp_path / "a.wav"), "--timeout", "1"]), err
        )
        assert code == EXIT_OK, err.getvalue()
        assert time.monotonic() - started > 1.4  # longer than the limit: it bounds the gaps only
        err = io.StringIO()
        code = await run(
            build_parser().parse_args([*base, "--output", str(tmp_path / "b.wav"), "--timeout", "0.05"]), err
        )
        assert code == EXIT_INCOMPLETE, err.getvalue()
        assert "no further frame came back within 0.05 s (--timeout)" in err.getvalue()
    finally:
        triggers["step_stall"].unlink()
