"""The connection's life at the transport (docs/design.md §2 "Budgets and hardening"): request bodies that never
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

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from ..e2e.conftest import http_get, start_server
from ..e2e.helpers import connect, pcm16, tone_and_noise
from .conftest import (
    OP_CLOSE,
    OP_TEXT,
    RawWS,
    ametrics,
    append_text,
    frame_bytes,
    metric_sum,
    tone_pcm16,
    wait_slots_free,
)
from .test_model_faults import opened, received_frames, stream

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

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


async def test_200_concurrent_upgrades_against_4_slots(tmp_path, parrot_dir, record):
    """200 clients upgrade at once against 4 slots (a restart's reconnects): exactly 4 sessions
    open, the other 196 each get one ``error resource_exhausted`` and close 1013, nothing counts
    as a handler error, ``/health`` answers throughout, and the slots serve new sessions after."""
    server = start_server(tmp_path, "--max-sessions", "4")
    outcomes: dict[str, int] = {}
    release = trio.Event()
    health: list[int] = []

    async def client() -> None:
        async with open_websocket_url(
            server.ws + "/v1/realtime", connect_timeout=30, disconnect_timeout=10
        ) as ws:
            event = json.loads(await ws.get_message())
            if event["type"] == "session.created":
                outcome = "opened"
                await release.wait()
            else:
                assert event["type"] == "error", event
                try:
                    extra = await ws.get_message()
                    outcome = f"{event['error']['code']} then {extra!r:.40}"
                except ConnectionClosed as exc:
                    code = exc.reason.code if exc.reason is not None else None
                    outcome = f"{event['error']['code']} {code}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    async def probe_health() -> None:
        while not release.is_set():
            status, _ = await trio.to_thread.run_sync(http_get, server.base + "/health")
            health.append(status)
            await trio.sleep(0.05)

    try:
        t0 = time.monotonic()
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe_health)
                async with trio.open_nursery() as clients:
                    for _ in range(200):
                        clients.start_soon(client)
                    while sum(outcomes.values()) < 196:
                        await trio.sleep(0.02)
                    answered_s = time.monotonic() - t0
                    text = await ametrics(server)
                    release.set()
            await wait_slots_free(server)
            async with connect(server.ws + "/v1/realtime") as after:
                await opened(after)
                await stream(after, 3)
                await after.wait_until(lambda: received_frames(after) >= 3)
    finally:
        server.stop()
    record(
        clients=200,
        slots=4,
        outcomes=outcomes,
        all_answered_s=round(answered_s, 2),
        health_statuses=sorted(set(health)),
        health_probes=len(health),
        handler_errors=metric_sum(text, "duplex_connection_errors_total"),
    )
    assert outcomes == {"opened": 4, "resource_exhausted 1013": 196}
    assert metric_sum(text, "duplex_refusals_total", code="resource_exhausted") == 196
    assert metric_sum(text, "duplex_connection_errors_total") == 0, text
    assert health and set(health) == {200}
    assert "Traceback" not in server.output


# -- item 8: the drain's close frames survive clients that are still streaming --------------------
async def test_clients_streaming_at_sigterm_see_1012_every_time(tmp_path, parrot_dir, record):
    """SIGTERM while 3 clients send as fast as their sockets take it (so their input is still
    arriving when the server closes): in every run each reads ``session.closing``,
    ``session.closed`` and a 1012 close frame, and none of its sends fails before that. A server
    that closed TCP with that input unread reset the connection: the client's next send failed
    (EPIPE/ECONNRESET), and a client library that gives up on a failed send (trio-websocket
    does, whether or not the close frame is already in its receive buffer) reports 1006."""
    servers: list[Any] = [None] * DRAIN_RUNS

    async def start(run: int) -> None:  # started together: the model load dominates the cost
        servers[run] = await trio.to_thread.run_sync(
            lambda: start_server(tmp_path / f"run{run}", "--max-sessions", "3", "--drain-timeout", "5")
        )

    runs = []
    try:
        async with trio.open_nursery() as nursery:
            for run in range(DRAIN_RUNS):
                nursery.start_soon(start, run)
        for server in servers:
            clients = [await RawWS.connect(server.port, "/v1/realtime?duplex=1") for _ in range(3)]
            for ws in clients:
                await ws.recv_event("session.updated")
            results: list[dict[str, Any]] = [{} for _ in clients]
            async with trio.open_nursery() as nursery:
                for ws, result in zip(clients, results, strict=True):
                    nursery.start_soon(blast_until_closed, ws, result)
                with trio.fail_after(10):  # every client is streaming, ahead of what the server takes
                    while min(result.get("sent", 0) for result in results) < 40:
                        await trio.sleep(0.01)
                t0 = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    rc = await trio.to_thread.run_sync(server.proc.wait)
                exit_s = time.monotonic() - t0
            runs.append({"rc": rc, "exit_s": round(exit_s, 2), "clients": results})
    finally:
        for server in servers:
            if server is not None:
                server.stop()
    record(runs=len(runs), clients_per_run=3, results=runs)
    for result in runs:
        assert result["rc"] == 0, runs
        for c in result["clients"]:
            assert c["close_code"] == 1012 and c["send_error"] is None, runs
            assert c["closing"] and c["closed"] and c["sent"] > 0, runs


DRAIN_RUNS = 2  # 3 measured for RELIABILITY.md: 9 of 9 clients, twice


async def blast_until_closed(ws: Any, result: dict[str, Any]) -> None:
    """Send appends as fast as the socket takes them while reading every server frame; stop
    sending at the close frame, then close the TCP connection (what a WebSocket client does)."""
    msg = frame_bytes(OP_TEXT, append_text(tone_pcm16(1)).encode())
    result.update(sent=0, send_error=None, close_code=None)
    got_close = trio.Event()

    async def send() -> None:
        while not got_close.is_set():
            try:
                await ws.send(msg)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                if not got_close.is_set():
                    result["send_error"] = repr(exc.__cause__ or exc)
                return
            result["sent"] += 1
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        with trio.move_on_after(20):
            while True:
                frame = await ws.recv(timeout=20)
                if frame is None or frame[0] == OP_CLOSE:
                    break
        got_close.set()
    result["close_code"] = ws.close_code
    result["closing"] = "session.closing" in ws.types()
    result["closed"] = "session.closed" in ws.types()
    await ws.aclose()


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
            connect(server.ws + "/v1/realtime?duplex=1") as a,
            connect(server.ws + "/v1/realtime?duplex=1") as b,
            connect(server.ws + "/v1/duplex") as c,
            connect(server.ws + "/v1/realtime?duplex=1", graceful=False) as silent,
        ):
            streaming = [a, b, c]
            for client in [*streaming, silent]:
                await opened(client)
            async with trio.open_nursery() as nursery:
                for client in streaming:
                    nursery.start_soon(stream, client, 100)  # 8 s
                await a.wait_until(lambda: received_frames(a) >= 5)
                await trio.sleep(1.0)  # the silent session has been idle for >= 1 s
                paused = server.pids  # the engine core and its front end alike
                for pid in paused:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    await trio.sleep(3.0)
                finally:
                    for pid in paused:
                        os.kill(pid, signal.SIGCONT)
                t_cont = time.monotonic()
                before = [received_frames(x) for x in streaming]
                for x, n in zip(streaming, before, strict=True):
                    await x.wait_until(partial(more_frames, x, n + 5), timeout=10)
                resumed_s = time.monotonic() - t_cont
                closed_silent = await silent.wait_for("session.closed", timeout=5)
                silent_closed_s = time.monotonic() - t_cont
                # The close frame follows session.closed: wait for it, do not race it.
                await silent.wait_until(lambda: silent.close_code is not None, timeout=5)
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


async def test_appends_sparser_than_the_grace_keep_a_session_past_the_idle_timeout(
    tmp_path, parrot_dir, record
):
    """``--idle-timeout 2``; a client sends an 800 ms append every 0.8 s for 9 s, then nothing.
    Each append is handled in the TCP server's task as it is read, while the reader's receive
    stays waiting: they are input all the same, so the session stays open while they come (the
    idle deadline runs from the last of them, not from the receive, whose expiry plus the 0.25 s
    grace would catch the next append only about one time in three), and it is closed
    ``timeout`` about 2 s after the last one."""
    server = start_server(tmp_path, "--max-sessions", "1", "--idle-timeout", "2")
    chunk = pcm16(tone_and_noise(0.8))
    try:
        async with connect(server.ws + "/v1/realtime?duplex=1", graceful=False) as client:
            await opened(client)
            start = time.monotonic()
            for k in range(12):  # 9.6 s
                await trio.sleep(max(0.0, start + 0.8 * k - time.monotonic()))
                await client.append(chunk)
            last = time.monotonic()
            closed_while_sending = client.of_type("session.closed")
            closed = await client.wait_for("session.closed", timeout=10)
            closed_after_s = time.monotonic() - last
            frames = received_frames(client)
    finally:
        server.stop()
    record(
        idle_timeout_s=2,
        append_every_s=0.8,
        closed_while_sending=closed_while_sending,
        closed_after_last_append_s=round(closed_after_s, 3),
        frames=frames,
    )
    assert closed_while_sending == [], closed_while_sending
    assert frames >= 100  # 120 frames of input: the session was served throughout
    assert closed["reason"] == "timeout"
    assert 1.5 <= closed_after_s <= 4.0, closed_after_s


def more_frames(client: Any, n: int) -> bool:
    return received_frames(client) >= n


# -- item 5: request bodies that never come -------------------------------------------------------
def _descriptors_256() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


async def test_request_heads_without_their_body_cannot_lock_out_the_server(tmp_path, parrot_dir, record):
    """At a 256-descriptor limit (soft and hard), 300 connections each send a POST head with
    ``Content-Length`` and no body and never read, beside a session streaming in real time.
    The server answers each at once (no route reads a body) and used to keep the connection
    forever: hypercorn closed it from the app's task while quart-trio cancelled that task, so
    the FIN and the close were skipped, and the read loop waited for the body with no deadline.
    300 of them took every descriptor: ``/health`` and every WebSocket locked out, and
    ``accept`` failing with EMFILE. Now each is closed at once, whatever the body deadline."""
    body_timeout = 10.0  # the default: not what frees them
    server = start_server(tmp_path, "--max-sessions", "2", preexec_fn=_descriptors_256)
    socks: list[socket.socket] = []
    try:
        async with connect(server.ws + "/v1/realtime") as ref:
            await opened(ref)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream, ref, 100)  # 8 s in real time beside the attack
                await ref.wait_until(lambda: received_frames(ref) >= 3)
                t0 = time.monotonic()
                closed_at = await trio.to_thread.run_sync(_heads_without_body, server.port, 300, socks)
                sent_s = time.monotonic() - t0
                text = await ametrics(server)
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
    still_open = sum(1 for t in closed_at if t < 0)
    record(
        descriptor_limit=256,
        heads_sent=300,
        heads_sent_in_s=round(sent_s, 2),
        still_open_after_5s=still_open,
        closed_after_s_median_max=[
            round(sorted(closed_at)[len(closed_at) // 2], 3),
            round(max(closed_at), 3),
        ],
        tcp_connections_open_after=metric_sum(text, "duplex_tcp_connections_open"),
        reference_frames=frames_ref,
        reference_errors=ref_errors,
        emfile_in_output="EMFILE" in server.output,
    )
    assert still_open == 0 and max(closed_at) < body_timeout / 2, closed_at
    assert "EMFILE" not in server.output and "Too many open files" not in server.output
    assert metric_sum(text, "duplex_tcp_connections_open") <= 3, text  # /metrics, ref, + 1
    assert ref_errors == [] and frames_ref >= 20


def _heads_without_body(port: int, n: int, socks: list[socket.socket], linger_s: float = 5.0) -> list[float]:
    """Open ``n`` connections, each sending a head whose body never comes and reading nothing;
    returns when the server closed each (seconds after its head was sent; -1: still open
    ``linger_s`` after the last head). Polled while connecting, so no close is timed late."""
    import selectors

    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    out = [-1.0] * n
    sent_at = [0.0] * n
    sel = selectors.DefaultSelector()
    pending = 0

    def poll(timeout: float) -> None:
        nonlocal pending
        for key, _ in sel.select(timeout=timeout):
            i = key.data
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            except BlockingIOError:
                continue
            if not data:
                out[i] = time.monotonic() - sent_at[i]
                sel.unregister(key.fileobj)
                pending -= 1

    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
        s.sendall(head)
        sent_at[i] = time.monotonic()
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        pending += 1
        poll(0)
    deadline = time.monotonic() + linger_s
    while pending and time.monotonic() < deadline:
        poll(0.05)
    sel.close()
    return out
