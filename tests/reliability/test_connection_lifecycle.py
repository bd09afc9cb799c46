"""The connection's life at the transport (issue 13 items 5, 8, 9, 11): request bodies that never
come, close frames lost to a reset, refusal churn, a process paused past the idle timeout.

Each test runs real ``duplex-actors serve`` processes (``tiny-parrot``) on loopback; every wait is
bounded. The numbers go to RELIABILITY.md (``-s`` prints them).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import time
from functools import partial
from typing import Any

import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from ..e2e.conftest import start_server
from ..e2e.helpers import connect
from .conftest import ametrics, append_text, metric_sum, tone_pcm16
from .test_model_faults import opened, received_frames, stream

FRAME_S = 0.08


# -- item 9: refusal churn ------------------------------------------------------------------------
async def test_a_storm_of_refused_reconnects_raises_no_handler_error(tmp_path, parrot_dir, record):
    """One session holds the only slot; 8 clients reconnect as fast as they can, each closing its
    side as soon as it reads the refusal (so its close frame races the server's 1013). hypercorn
    used to send its FIN beside the app's send: ~10 % of refusals raised BusyResourceError."""
    server = start_server(tmp_path, "--max-sessions", "1")
    refusals = 0
    codes: dict[Any, int] = {}
    try:
        async with connect(server.ws + "/v1/realtime") as holder:
            await opened(holder)

            async def churn() -> None:
                nonlocal refusals
                while refusals < STORM_REFUSALS:
                    code: Any = None
                    try:
                        async with open_websocket_url(
                            server.ws + "/v1/realtime", connect_timeout=10, disconnect_timeout=5
                        ) as ws:
                            event = json.loads(await ws.get_message())
                            assert event["type"] == "error", event
                            code = event["error"]["code"]
                    except ConnectionClosed as exc:
                        code = exc.reason.code if exc.reason is not None else None
                    codes[code] = codes.get(code, 0) + 1
                    refusals += 1

            t0 = time.monotonic()
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for _ in range(8):
                        nursery.start_soon(churn)
            storm_s = time.monotonic() - t0
            text = await ametrics(server)
            holder_frames_before = received_frames(holder)
            await stream(holder, 3)
            await holder.wait_until(lambda: received_frames(holder) >= holder_frames_before + 3)
    finally:
        server.stop()
    refused = metric_sum(text, "duplex_refusals_total", code="resource_exhausted")
    errors = metric_sum(text, "duplex_connection_errors_total")
    record(
        clients=8,
        refusals=refusals,
        storm_s=round(storm_s, 2),
        client_saw=codes,
        refused_metric=refused,
        handler_errors=errors,
        busy_in_output=server.output.count("BusyResourceError"),
    )
    assert refused >= STORM_REFUSALS
    assert errors == 0, text
    assert "BusyResourceError" not in server.output and "Traceback" not in server.output


STORM_REFUSALS = 300


# -- item 8: the drain's close frames survive clients that are still streaming --------------------
async def test_clients_streaming_at_sigterm_see_1012_every_time(tmp_path, parrot_dir, record):
    """SIGTERM while 3 clients stream 4x faster than real time (so their input is still arriving
    when the server closes): each gets ``session.closing``, ``session.closed`` and 1012, in every
    run. Closing with unread input made the kernel reset the socket: 1006 in 3 of 4 runs."""
    runs = []
    servers: list[Any] = [None] * DRAIN_RUNS

    async def start(run: int) -> None:  # started together: the model load dominates the cost
        servers[run] = await trio.to_thread.run_sync(
            lambda: start_server(tmp_path / f"run{run}", "--max-sessions", "3", "--drain-timeout", "5")
        )

    try:
        async with trio.open_nursery() as nursery:
            for run in range(DRAIN_RUNS):
                nursery.start_soon(start, run)
        for server in servers:
            clients: list[Any] = []
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    clients.append(await nursery.start(fast_streamer, server.ws + "/v1/realtime"))
                for c in clients:
                    await c.wait_until(lambda c=c: received_frames(c) >= 3)
                t0 = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    rc = await trio.to_thread.run_sync(server.proc.wait)
                exit_s = time.monotonic() - t0
                for c in clients:
                    await c.wait_closed(timeout=5)
                nursery.cancel_scope.cancel()
            runs.append(
                {
                    "rc": rc,
                    "exit_s": round(exit_s, 2),
                    "codes": [c.close_code for c in clients],
                    "closing": [bool(c.of_type("session.closing")) for c in clients],
                    "closed": [bool(c.of_type("session.closed")) for c in clients],
                }
            )
    finally:
        for server in servers:
            if server is not None:
                server.stop()
    record(runs=len(runs), clients_per_run=3, results=runs)
    for result in runs:
        assert result["rc"] == 0, runs
        assert result["codes"] == [1012] * 3, runs
        assert all(result["closing"]) and all(result["closed"]), runs


DRAIN_RUNS = int(os.environ.get("DRAIN_RUNS", "3"))
PACE = float(os.environ.get("PACE", "10"))


async def fast_streamer(url: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with connect(url, graceful=False) as c:
        await opened(c)
        task_status.started(c)
        text = append_text(tone_pcm16(1))
        try:
            while not c.closed.is_set():
                await c.ws.send_message(text)
                await trio.sleep(FRAME_S / PACE)
        except ConnectionClosed:
            pass
        await c.wait_closed(timeout=30)


# -- item 11: a paused process is not an idle client ----------------------------------------------
async def test_a_pause_longer_than_the_idle_timeout_closes_only_the_silent_session(
    tmp_path, parrot_dir, record
):
    """``--idle-timeout 2``; 3 sessions stream in real time and one is silent; the server is
    stopped (SIGSTOP) for 3 s while the clients go on sending, then continued. The streaming
    sessions were closed ``timeout`` with their appends waiting in the socket; only the silent
    one may be."""
    server = start_server(tmp_path, "--max-sessions", "4", "--idle-timeout", "2")
    try:
        async with (
            connect(server.ws + "/v1/realtime") as a,
            connect(server.ws + "/v1/realtime") as b,
            connect(server.ws + "/v1/duplex") as c,
            connect(server.ws + "/v1/realtime", graceful=False) as silent,
        ):
            streaming = [a, b, c]
            for client in [*streaming, silent]:
                await opened(client)
            async with trio.open_nursery() as nursery:
                for client in streaming:
                    nursery.start_soon(stream, client, 100)  # 8 s
                await a.wait_until(lambda: received_frames(a) >= 5)
                await trio.sleep(1.0)  # the silent session has been idle for >= 1 s
                os.kill(server.proc.pid, signal.SIGSTOP)
                try:
                    await trio.sleep(3.0)
                finally:
                    os.kill(server.proc.pid, signal.SIGCONT)
                t_cont = time.monotonic()
                before = [received_frames(x) for x in streaming]
                for x, n in zip(streaming, before, strict=True):
                    await x.wait_until(partial(more_frames, x, n + 5), timeout=10)
                resumed_s = time.monotonic() - t_cont
                closed_silent = await silent.wait_for("session.closed", timeout=5)
                silent_closed_s = time.monotonic() - t_cont
                nursery.cancel_scope.cancel()
            reasons = [[e["reason"] for e in x.of_type("session.closed")] for x in streaming]
            errors = [x.error_codes() for x in streaming]
    finally:
        server.stop()
    record(
        idle_timeout_s=2,
        paused_s=3,
        streaming_closed_reasons=reasons,
        streaming_errors=errors,
        streaming_resumed_after_s=round(resumed_s, 3),
        silent_closed_reason=closed_silent["reason"],
        silent_closed_after_continue_s=round(silent_closed_s, 3),
    )
    assert reasons == [[], [], []], reasons
    assert errors == [[], [], []], errors
    assert closed_silent["reason"] == "timeout" and silent.close_code == 1000


def more_frames(client: Any, n: int) -> bool:
    return received_frames(client) >= n


# -- item 5: request bodies that never come -------------------------------------------------------
def _descriptors_256() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


async def test_request_heads_without_their_body_are_dropped_and_cannot_lock_out_the_server(
    tmp_path, parrot_dir, record
):
    """At a 256-descriptor limit (soft and hard), 300 connections each send a POST head with
    ``Content-Length`` and no body, beside a session streaming in real time. They are closed at
    ``--body-timeout``; connections beyond the bound are closed at once and ``accept`` never
    fails (the streaming session's log keeps its descriptors); then ``/health`` and a new
    session work. Before: held forever, ``/health`` and every WebSocket locked out."""
    body_timeout = 2.0
    server = start_server(
        tmp_path, "--max-sessions", "2", "--body-timeout", str(body_timeout), preexec_fn=_descriptors_256
    )
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    socks: list[socket.socket] = []
    try:
        async with connect(server.ws + "/v1/realtime") as ref:
            await opened(ref)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream, ref, 100)  # 8 s in real time beside the attack
                await ref.wait_until(lambda: received_frames(ref) >= 3)
                t0 = time.monotonic()
                for _ in range(300):
                    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                    s.sendall(head)
                    socks.append(s)
                sent_s = time.monotonic() - t0
                text = await ametrics_retry(server, timeout=body_timeout + 5)
                health_s = time.monotonic() - t0
                closed_at = await trio.to_thread.run_sync(_eof_times, socks, t0, body_timeout + 5)
                async with connect(server.ws + "/v1/realtime") as fresh:
                    await opened(fresh)
                    await stream(fresh, 3)
                    await fresh.wait_until(lambda: received_frames(fresh) >= 3)
                frames_ref = received_frames(ref)
                nursery.cancel_scope.cancel()
            ref_errors = ref.error_codes()
    finally:
        for s in socks:
            s.close()
        server.stop()
    dropped_body = metric_sum(text, "duplex_connections_dropped_total", reason="body_timeout")
    dropped_bound = metric_sum(text, "duplex_connections_dropped_total", reason="max_connections")
    held = sorted(t for t in closed_at if t > 0.5)
    record(
        descriptor_limit=256,
        body_timeout_s=body_timeout,
        heads_sent=300,
        heads_sent_in_s=round(sent_s, 2),
        metrics_answered_after_s=round(health_s, 2),
        dropped_body_timeout=dropped_body,
        dropped_max_connections=dropped_bound,
        held_then_closed=len(held),
        held_closed_after_s=[round(held[0], 2), round(held[-1], 2)] if held else None,
        reference_frames=frames_ref,
        reference_errors=ref_errors,
        emfile_in_output="EMFILE" in server.output,
    )
    assert "EMFILE" not in server.output and "Too many open files" not in server.output
    assert all(t >= 0 for t in closed_at), "a connection was still open after the body timeout"
    assert held and body_timeout - 0.1 <= held[0] and held[-1] <= body_timeout + 2.5, held
    assert dropped_body >= len(held) - 5 and dropped_body + dropped_bound >= 300 - 5
    assert ref_errors == [] and frames_ref >= 20


async def ametrics_retry(server, timeout: float) -> str:
    """``/metrics`` once the server answers again (connections over the bound are closed)."""
    with trio.fail_after(timeout):
        while True:
            try:
                return await ametrics(server)
            except OSError:
                await trio.sleep(0.1)


def _eof_times(socks: list[socket.socket], t0: float, timeout: float) -> list[float]:
    """When each socket saw the server close it (seconds after ``t0``; -1 if still open)."""
    import selectors

    out = [-1.0] * len(socks)
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    deadline = time.monotonic() + timeout
    pending = len(socks)
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            i = key.data
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except (ConnectionResetError, BlockingIOError):
                data = b""
            if not data:
                out[i] = time.monotonic() - t0
                sel.unregister(key.fileobj)
                pending -= 1
    sel.close()
    return out
