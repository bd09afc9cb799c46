"""Hostile bytes at the HTTP/WebSocket layer: hypercorn #225 trailing bytes, a permessage-deflate
offer with a compression bomb, huge and oversize messages.

One server for the module with the production limits (``--max-message-bytes`` 16 MiB).
(tests/e2e/test_hardening.py pins the #225 survival and the refused deflate offer; these add the
crash counter, the bomb, and the memory measurements.)
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import pytest
import trio

from duplex_actors.log import records as r

from ..e2e.conftest import http_get, start_server
from ..e2e.test_hardening import UPGRADE, raw_exchange
from .conftest import (
    OP_CONT,
    OP_TEXT,
    RawWS,
    ametrics,
    append_text,
    frame_bytes,
    metric_sum,
    output_deltas,
    rss_kib,
    tone_pcm16,
    wait_slots_free,
)
from .test_disconnects import assert_replays, finished_log

LIMIT = 16 * 1024 * 1024  # the default --max-message-bytes
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def wire_server(tmp_path_factory, parrot_dir):
    server = start_server(tmp_path_factory.mktemp("wire"), "--max-sessions", "2")
    yield server
    server.stop()


def reset_peak(pid: int) -> None:
    """Reset VmHWM (the peak RSS) to the current RSS: ``5`` > /proc/PID/clear_refs."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def usable(server) -> None:
    """A fresh session streams: 3 frames in, 3 frames out, then a clean close."""
    ws = await RawWS.connect(server.port, "/v1/realtime")
    await ws.recv_event("session.updated")
    pcm = tone_pcm16(3)
    await ws.send_text(append_text(pcm))
    with trio.fail_after(10):
        while sum(e["metadata"]["audio_duration_ms"] for e in output_deltas(ws.events())) < 240:
            await ws.recv()
    await ws.send_text(json.dumps({"type": "session.close"}))
    await ws.recv_event("session.closed")
    await ws.aclose()


# -- hypercorn #225 -------------------------------------------------------------------------------
async def test_upgrade_with_trailing_bytes_drops_only_that_connection_and_counts_it(wire_server, record):
    before = metric_sum(await ametrics(wire_server), "duplex_connection_errors_total")
    trailing = [b"\x00\x01garbage", b"\x88\x80\x00\x00\x00\x00" * 3, b"GET / HTTP/1.1\r\n\r\n"]
    for extra in trailing:
        request = UPGRADE.format(extra="").encode() + extra
        await trio.to_thread.run_sync(lambda r=request: raw_exchange(wire_server.port, r, read_for=0.5))  # type: ignore[misc]
    with trio.fail_after(10):  # counted once the failed connection's task has ended
        while True:
            after_text = await ametrics(wire_server)
            after = metric_sum(after_text, "duplex_connection_errors_total")
            if after > before:
                break
            await trio.sleep(0.02)
    by_type = [line for line in after_text.splitlines() if line.startswith("duplex_connection_errors_total")]
    record(requests=len(trailing), connection_errors_before=before, after=after, by_type=by_type)
    assert wire_server.proc.poll() is None
    assert http_get(wire_server.base + "/health")[0] == 200
    assert after - before >= 1
    await usable(wire_server)


# -- permessage-deflate and a compression bomb ---------------------------------------------------
def deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


async def test_deflate_offer_is_ignored_and_a_compression_bomb_is_a_protocol_error(wire_server, record):
    pid = wire_server.frontend_pid
    ws = await RawWS.connect(
        wire_server.port,
        "/v1/realtime",
        {"Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits"},
    )
    assert ws.status == 101
    assert "sec-websocket-extensions" not in ws.head.lower()
    created = await ws.recv_event("session.created")
    await ws.recv_event("session.updated")
    # What the frame would inflate to were the extension negotiated; its ~47 KB fit in one read
    # of the server, so the server has read it all when it closes (no RST hides the close frame).
    inflated = 48 * MIB
    body = b'{"type":"session.heartbeat","pad":"' + b"a" * (inflated - 64) + b'"}'
    bomb = deflate_raw(body)
    del body
    rss_before = rss_kib(pid)
    reset_peak(pid)
    t0 = time.monotonic()
    try:
        await ws.send(frame_bytes(OP_TEXT, bomb, rsv1=True))
    except trio.BrokenResourceError:
        pass  # closed on the frame header, before the rest of the payload was sent
    await ws.read_to_eof(timeout=10)
    closed_s = time.monotonic() - t0
    recs = await finished_log(wire_server.log_dir, created["session"]["id"])  # the server is done with it
    peak, rss_after = peak_kib(pid), rss_kib(pid)
    record(
        bomb_frame_bytes=len(bomb),
        would_inflate_to_bytes=inflated,
        close_code=ws.close_code,
        closed_after_ms=round(closed_s * 1000, 1),
        rss_before_mib=round(rss_before / 1024, 1),
        rss_peak_mib=round(peak / 1024, 1),
        rss_after_mib=round(rss_after / 1024, 1),
    )
    # RSV1 without a negotiated extension is a protocol error: wsproto fails the connection
    # (1002) and hypercorn drops the TCP connection; it sends no close frame (RFC 6455 §7.1.7
    # says it SHOULD send 1002 first), so the client sees the socket close.
    assert ws.close_code in (None, 1002)
    assert closed_s < 2.0
    assert peak - rss_before < 32 * 1024  # nothing was inflated
    assert wire_server.proc.poll() is None
    assert isinstance(recs[-2], r.Close) and recs[-2].reason == "disconnect"
    await wait_slots_free(wire_server)
    await usable(wire_server)


async def test_huge_messages_under_the_limit_keep_memory_bounded(wire_server, record):
    """Three text messages of 16 MiB - 1 KiB (a playback.ack with a huge payload: refused,
    bad_event) on one session: each is answered with one error, and memory returns."""
    pid = wire_server.frontend_pid
    ws = await RawWS.connect(wire_server.port, "/v1/realtime")
    updated = await ws.recv_event("session.updated")
    size = LIMIT - 1024
    head = b'{"type":"playback.ack","event_id":"huge","pad":"'
    message = head + b"a" * (size - len(head) - 2) + b'"}'
    frame = frame_bytes(OP_TEXT, message)
    del message
    rss_before = rss_kib(pid)
    reset_peak(pid)
    rss_each = []
    for i in range(3):
        await ws.send(frame)
        await ws.send_text(json.dumps({"type": "session.heartbeat", "event_id": f"fence{i}"}))
        await ws.recv_event("session.heartbeat_ack", timeout=20)
        rss_each.append(rss_kib(pid))
    errors = [e for e in ws.events() if e["type"] == "error"]
    peak = peak_kib(pid)
    await ws.send_text(json.dumps({"type": "session.close"}))
    await ws.recv_event("session.closed")
    await ws.aclose()
    await finished_log(wire_server.log_dir, updated["session"]["id"])  # the session is gone
    rss_after = rss_kib(pid)
    record(
        message_bytes=size,
        rss_before_mib=round(rss_before / 1024, 1),
        rss_after_each_mib=[round(x / 1024, 1) for x in rss_each],
        rss_peak_mib=round(peak / 1024, 1),
        rss_after_mib=round(rss_after / 1024, 1),
        peak_over_message=round((peak - rss_before) * 1024 / size, 2),
    )
    assert [e["error"]["code"] for e in errors] == ["bad_event"] * 3
    assert all(e["error"]["event_id"] == "huge" for e in errors)
    assert peak - rss_before < 12 * size / 1024  # a bounded number of copies of one message
    assert rss_each[2] - rss_each[0] < 2 * size / 1024  # no growth per message
    assert wire_server.proc.poll() is None


# -- oversize messages ----------------------------------------------------------------------------
@pytest.mark.parametrize("fragments", [1, 5], ids=["one-frame", "fragmented"])
async def test_oversize_message_closes_1009_and_the_server_is_fine(wire_server, fragments, record):
    pid = wire_server.frontend_pid
    ws = await RawWS.connect(wire_server.port, "/v1/realtime")
    created = await ws.recv_event("session.created")
    await ws.recv_event("session.updated")
    rss_before = rss_kib(pid)
    payload = b"a" * (LIMIT + 1)
    t0 = time.monotonic()
    step = -(-len(payload) // fragments)
    parts = [payload[i : i + step] for i in range(0, len(payload), step)]
    try:
        for i, part in enumerate(parts):
            opcode = OP_TEXT if i == 0 else OP_CONT
            await ws.send(frame_bytes(opcode, part, fin=i == len(parts) - 1))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the server may close while the rest is still being sent
    await ws.read_to_eof(timeout=15)
    closed_s = time.monotonic() - t0
    session_id = created["session"]["id"]
    recs = await finished_log(wire_server.log_dir, session_id)
    await wait_slots_free(wire_server)
    rss_after = rss_kib(pid)
    record(
        fragments=fragments,
        message_bytes=len(payload),
        close_code=ws.close_code,
        closed_after_ms=round(closed_s * 1000, 1),
        events_after_created=ws.types()[2:],
        rss_before_mib=round(rss_before / 1024, 1),
        rss_after_mib=round(rss_after / 1024, 1),
    )
    assert ws.close_code == 1009
    assert "error" not in ws.types()
    assert isinstance(recs[-2], r.Close) and recs[-2].reason in ("disconnect", "client_close", "error")
    assert_replays(wire_server.log_dir, session_id)
    assert http_get(wire_server.base + "/health")[0] == 200
    await usable(wire_server)
