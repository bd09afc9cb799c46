"""Admission with ``--max-sessions 2`` (docs/protocol.md §2, §6): the third session is refused with
``resource_exhausted`` and close 1013 and writes no log; a replacement opened right after
``session.closed`` is admitted; open/close cycles, abrupt disconnects included, hold no slot."""

from __future__ import annotations

import base64
import os

import trio

from duplex_actors.log import records as r

from .helpers import (
    FRAME_SAMPLES,
    Client,
    connect,
    drop_tcp,
    get_text,
    metric,
    pcm16,
    read_records,
    tone_and_noise,
    wait_idle,
)


def log_names(server) -> set[str]:
    return set(os.listdir(server.log_dir)) if server.log_dir.exists() else set()


def one_frame(seed: int = 0) -> bytes:
    return pcm16(tone_and_noise(FRAME_SAMPLES / 24_000, seed=seed))


async def hold(server, path: str, opened: list[Client], release: trio.Event) -> None:
    async with connect(server.ws + path) as c:
        if c.dialect == "native":
            await c.send({"type": "session.create", "session": {}})
        await c.wait_for("session.created")
        opened.append(c)
        await release.wait()


async def test_third_session_is_refused_with_1013_and_writes_no_log(parrot_server):
    await wait_idle(parrot_server)
    release = trio.Event()
    opened: list[Client] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, parrot_server, "/v1/realtime", opened, release)
        nursery.start_soon(hold, parrot_server, "/v1/duplex", opened, release)
        with trio.fail_after(10):
            while len(opened) < 2:
                await trio.sleep(0.01)
        logs_before = log_names(parrot_server)
        held = {f"{c.session_id}.dlog" for c in opened}
        assert held <= logs_before

        async with connect(parrot_server.ws + "/v1/realtime?duplex=1") as third:
            await third.wait_closed()
            assert third.types() == ["error"]
            err = third.events()[0]["error"]
            assert err["type"] == "rate_limit_error" and err["code"] == "resource_exhausted"
            assert third.close_code == 1013

        async with connect(parrot_server.ws + "/v1/duplex") as native:
            await native.send({"type": "session.create", "session": {}})
            await native.wait_closed()
            assert native.types() == ["error"]
            assert native.events()[0]["code"] == "resource_exhausted"
            assert native.close_code == 1013

        assert log_names(parrot_server) == logs_before  # a refused open writes no session log
        _, text = await get_text(parrot_server, "/metrics")
        assert metric(text, "duplex_slots_in_use") == 2
        # The held sessions are unaffected.
        c = opened[0]
        await c.append(one_frame())
        await c.wait_until(lambda: c.output_frames() == 1)
        release.set()
    await wait_idle(parrot_server)


async def test_a_replacement_right_after_session_closed_is_admitted(parrot_server):
    await wait_idle(parrot_server)
    release = trio.Event()
    opened: list[Client] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, parrot_server, "/v1/realtime", opened, release)
        with trio.fail_after(10):
            while not opened:
                await trio.sleep(0.01)
        # Five times: close the second session, reopen at once after session.closed.
        for i in range(5):
            async with connect(parrot_server.ws + "/v1/realtime") as c:
                await c.wait_for("session.created")
                await c.append(one_frame(i))
                await c.wait_until(lambda c=c: c.output_frames() == 1)  # type: ignore[misc]
                await c.send({"type": "session.close"})
                closed = await c.wait_for("session.closed")
                assert closed["reason"] == "client_close"
            # (the socket close may still be in flight: session.closed is what counts)
            async with connect(parrot_server.ws + "/v1/realtime") as again:
                await again.wait_for("session.updated")
                assert again.error_codes() == []
        release.set()
    await wait_idle(parrot_server)


async def test_replacement_opened_before_the_socket_closes(parrot_server):
    """Open the replacement the moment ``session.closed`` arrives, before the close frame."""
    await wait_idle(parrot_server)
    release = trio.Event()
    opened: list[Client] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, parrot_server, "/v1/realtime", opened, release)
        nursery.start_soon(hold, parrot_server, "/v1/realtime", opened, release)
        with trio.fail_after(10):
            while len(opened) < 2:
                await trio.sleep(0.01)
        victim = opened[1]
        admitted = trio.Event()
        results: list[list[str]] = []

        def on_message(client: Client, msg) -> None:
            if isinstance(msg, dict) and msg["type"] == "session.closed":
                nursery.start_soon(open_replacement)

        async def open_replacement() -> None:
            async with connect(parrot_server.ws + "/v1/realtime") as c:
                await c.wait_until(lambda: c.of_type("session.updated", "error"))
                results.append(c.types())
            admitted.set()

        victim.on_message = on_message
        await victim.send({"type": "session.close"})
        with trio.fail_after(10):
            await admitted.wait()
        assert results == [["session.created", "session.updated"]]
        release.set()
    await wait_idle(parrot_server)


async def raw_ws_open_and_drop(server, send_audio: bool) -> None:
    """A hand-made WebSocket upgrade over a raw socket, dropped without a close frame."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /v1/realtime HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{server.port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await stream.send_all(request.encode())
    buf = b""
    with trio.fail_after(10):
        while b"session.updated" not in buf:
            data = await stream.receive_some(65536)
            assert data, f"server closed: {buf!r}"
            buf += data
    assert buf.startswith(b"HTTP/1.1 101")
    if send_audio:
        payload = (
            '{"type":"input_audio_buffer.append","audio":"'
            + base64.b64encode(one_frame() * 2).decode()
            + '"}'
        ).encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        header = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask
        await stream.send_all(header + masked)
        with trio.fail_after(10):
            while b"output_audio.delta" not in buf:
                data = await stream.receive_some(65536)
                assert data
                buf += data
    await stream.aclose()  # FIN, no close frame


async def test_open_close_cycles_with_abrupt_disconnects_hold_no_slot(parrot_server):
    await wait_idle(parrot_server)
    _, text = await get_text(parrot_server, "/metrics")
    opened_before = metric(text, "duplex_sessions_opened_total")
    reasons: dict[str, str] = {}  # session id -> the close reason its log must record

    async def session(kind: int, i: int) -> None:
        if kind in (4, 5):
            await raw_ws_open_and_drop(parrot_server, send_audio=kind == 5)
            return
        async with connect(parrot_server.ws + "/v1/realtime", graceful=False) as c:
            await c.wait_for("session.updated")
            reasons[c.session_id] = "client_close" if kind == 0 else "disconnect"
            if kind != 3:  # 3: dropped straight after open, no audio
                await c.append(one_frame(i) * 3)
                await c.wait_until(lambda: c.output_frames() >= 1)
            if kind == 0:
                await c.send({"type": "session.close"})
                await c.wait_closed()
                assert c.close_code == 1000
            elif kind == 1:
                pass  # a normal WebSocket close frame without session.close
            else:  # 2, 3: the TCP connection drops, no close frame
                await drop_tcp(c)

    for cycle in range(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session, cycle % 6, cycle)
            nursery.start_soon(session, (cycle + 3) % 6, cycle + 100)
        # Each cycle needs both slots back: wait for them (bounded), as a retrying client would.
        await wait_idle(parrot_server)
    await wait_idle(parrot_server)
    status, ready = await get_text(parrot_server, "/ready")
    assert status == 200 and '"slots_free":2' in ready.replace(" ", "")
    _, text = await get_text(parrot_server, "/metrics")
    assert metric(text, "duplex_slots_in_use") == 0
    assert metric(text, "duplex_sessions_active") == 0
    assert metric(text, "duplex_sessions_opened_total") - opened_before == 40
    for session_id, reason in reasons.items():
        recs = await read_records(parrot_server, session_id)
        assert recs[-2] == r.Close(reason), (session_id, recs[-2])
