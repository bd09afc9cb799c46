"""Alignment to the tick on a real server (spec section 7), one short session per path.

The module's server runs ``--tick-policy grid``; a first session sending 80 ms chunks books the
grid (its first tick 10 ms after that session's first frame), so every later session's phase
relative to the ticks is known from the client's own clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from duplex_actors.log import records as r
from duplex_actors.replay.replayer import replay_logic

from .conftest import ServerProcess, start_server
from .helpers import FRAME_SAMPLES, Client, append_event, connect, pcm16, read_records, tone_and_noise

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

TICK = 0.080
# The warm-up's frames complete 10 ms before a tick; 20 ms after them is 10 ms after a tick, where
# a pad of 10 ms + the margin (3-40 ms) is owed: never none, whatever the margin.
SHIFT = 0.020


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Any) -> Iterator[tuple[ServerProcess, float]]:
    """The server and the client-clock time of the warm-up session's first frame."""
    server = start_server(
        tmp_path_factory.mktemp("align"),
        "--max-sessions",
        "2",
        "--tick-policy",
        "grid",
        "--max-align-pad-ms",
        "900",
    )
    started: list[float] = []

    async def warm_up() -> None:
        async with connect(f"{server.ws}/v1/realtime") as client:
            await client.wait_for("session.created")
            audio = pcm16(tone_and_noise(0.48))
            t0 = time.monotonic()
            started.append(t0)
            for k in range(6):
                await trio.sleep(max(0.0, t0 + k * TICK - time.monotonic()))
                await client.append(audio[k * 3840 : (k + 1) * 3840])

    try:
        trio.run(warm_up)
        yield server, started[0]
    finally:
        server.stop()


async def start_at(t0: float, shift_s: float) -> None:
    """Sleep until the next instant that is ``shift_s`` after a warm-up frame (mod 80 ms)."""
    now = time.monotonic()
    k = int((now - t0 - shift_s) // TICK) + 2
    await trio.sleep(t0 + shift_s + k * TICK - now)


async def stream(
    client: Client, audio: bytes, chunk_bytes: int, *, hint_pads: list[int] | None = None
) -> None:
    """Send ``audio`` in chunks at real time; with ``hint_pads``, apply each hint that arrived
    (the next chunk goes pad_ms early, short by pad_ms, with ``pad_ms`` on it)."""
    t = time.monotonic()
    at = 0
    while at < len(audio):
        pad_ms = hint_pads.pop(0) if hint_pads else 0
        n = chunk_bytes - pad_ms * 48
        t -= pad_ms / 1000
        await trio.sleep(max(0.0, t - time.monotonic()))
        extra: dict[str, Any] = {"pad_ms": pad_ms} if pad_ms else {}
        client.samples_sent += len(audio[at : at + n]) // 2
        await client.send(append_event(audio[at : at + n], **extra))
        at += n
        t += chunk_bytes / 48_000


async def answered(client: Client) -> None:
    """Return once the output answers the client's last whole input frame (a delta whose input
    ends less than a frame before the end of what the client sent)."""
    await client.wait_until(
        lambda: any(
            d["metadata"]["input_samples_end"] > client.samples_sent - FRAME_SAMPLES for d in client.deltas()
        ),
        what="the output of the last whole input frame",
    )


def hints(client: Client) -> list[dict[str, Any]]:
    return client.of_type("input_audio_buffer.alignment")


def marks(records: list[Any]) -> list[str]:
    return [r.KIND_NAMES[type(rec)] for rec in records if isinstance(rec, r.Pad | r.AlignHint | r.Drain)]


def positions(records: list[Any]) -> list[int]:
    """The client position of every 24 kHz sample of the session's input, pads included."""
    out: list[int] = []
    client = 0
    for rec in records:
        if isinstance(rec, r.Append):
            n = len(rec.audio) // 2
            out += range(client + 1, client + n + 1)
            client += n
        elif isinstance(rec, r.Pad):
            out += [client] * rec.samples
    return out


def test_server_pad_for_20_ms_chunks(grid: tuple[ServerProcess, float]) -> None:
    server, t0 = grid
    audio = pcm16(tone_and_noise(2.0, seed=1))

    async def main(shift: float) -> tuple[Client, list[Any]]:
        async with connect(f"{server.ws}/v1/realtime") as client:
            await client.wait_for("session.created")
            await start_at(t0, shift - 0.060)  # frames (every 4th chunk) complete SHIFT after the warm-up's
            await stream(client, audio, 960)
            await answered(client)
        return client, await read_records(server, client.session_id)

    # The server's own start-up session may have booked the grid: no pad is owed when frames
    # already complete 6-26 ms before a tick, never at both of two phases 40 ms apart.
    for shift in (SHIFT, SHIFT + 0.040):
        client, records = trio.run(main, shift)
        if any(isinstance(rec, r.Pad) for rec in records):
            break
    pads = [rec for rec in records if isinstance(rec, r.Pad)]
    assert [p.reason for p in pads][:1] == ["start"] and all(p.samples % 480 == 0 for p in pads), marks(
        records
    )
    first = records.index(pads[0])
    assert isinstance(records[first + 1], r.Append)  # written before the append it precedes
    assert not hints(client)  # a stock client never gets the event
    report = replay_logic(log := server.log_dir / f"{client.session_id}.dlog")
    assert report.identical, (log, report.summary())
    total_pad = sum(p.samples for p in pads)
    assert report.frames_in == (len(audio) // 2 + total_pad) // FRAME_SAMPLES
    where = positions(records)
    deltas = client.deltas()
    assert deltas
    for delta in deltas:
        meta = delta["metadata"]
        assert meta["input_samples_end"] == where[(meta["frame_index"] + 1) * FRAME_SAMPLES - 1]


def test_client_hint_for_an_opted_in_80_ms_client(grid: tuple[ServerProcess, float]) -> None:
    server, t0 = grid
    audio = pcm16(tone_and_noise(2.4, seed=2))

    async def run(opted_in: bool, shift: float = SHIFT) -> tuple[Client, list[Any]]:
        async with connect(f"{server.ws}/v1/realtime") as client:
            await client.wait_for("session.created")
            if opted_in:
                await client.send({"type": "session.update", "session": {"duplex": {"alignment": "client"}}})
                await client.wait_for("session.updated", since=2)
            pads: list[int] = []
            client.on_message = lambda c, m: (
                pads.append(m["pad_ms"])
                if isinstance(m, dict) and m.get("type") == "input_audio_buffer.alignment"
                else None
            )
            await start_at(t0, shift)
            await stream(client, audio, 3840, hint_pads=pads)
            await answered(client)
        return client, await read_records(server, client.session_id)

    # As for the 20 ms pad: frames that already complete just before a tick owe no hint (the
    # server's start-up session may have booked the grid elsewhere), never at both of two
    # phases 40 ms apart.
    for shift in (SHIFT, SHIFT + 0.040):
        client, records = trio.run(run, True, shift)
        if hints(client):
            break
    hint, *later = hints(client)  # later: re-alignments as the margin adapts (a loaded box)
    assert 1 <= hint["pad_ms"] < 80 and hint["reason"] == "start"
    assert all(h["reason"] in ("drift", "margin") for h in later), later
    kinds = marks(records)
    assert kinds[:2] == ["align_hint", "pad"], kinds
    pad = next(rec for rec in records if isinstance(rec, r.Pad))
    assert (pad.samples, pad.reason) == (hint["pad_ms"] * 24, "client")
    assert isinstance(records[records.index(pad) + 1], r.Append)
    assert replay_logic(server.log_dir / f"{client.session_id}.dlog").identical

    stock, records = trio.run(run, False)
    assert not hints(stock) and "align_hint" not in marks(records) and "pad" not in marks(records)


def test_100_ms_chunks_are_served_unaligned(grid: tuple[ServerProcess, float]) -> None:
    server, t0 = grid
    audio = pcm16(tone_and_noise(1.5, seed=3))

    async def main() -> tuple[Client, list[Any]]:
        async with connect(f"{server.ws}/v1/realtime") as client:
            await client.wait_for("session.created")
            await client.send({"type": "session.update", "session": {"duplex": {"alignment": "client"}}})
            await client.wait_for("session.updated", since=2)
            await start_at(t0, SHIFT)
            await stream(client, audio, 4800)
            await answered(client)
        return client, await read_records(server, client.session_id)

    client, records = trio.run(main)
    assert marks(records) == [] and not hints(client)
    assert len(client.deltas()) > 0
    assert all(
        d["metadata"]["input_samples_end"] % 1920 == 0 for d in client.deltas()
    )  # no pads: whole frames


def test_the_max_align_pad_flag_bounds_the_sessions_pads(grid: tuple[ServerProcess, float]) -> None:
    server, _ = grid
    headers = [read_log_header(p) for p in sorted(server.log_dir.glob("*.dlog"))]
    assert headers and all(h.engine["limits"]["max_pad_samples"] == 900 * 24 for h in headers)
    assert all(h.format_version == r.FORMAT_VERSION for h in headers)


def read_log_header(path: Path) -> r.Header:
    from duplex_actors.log.segment import read_log

    rec = read_log(path).records[0][1]
    assert isinstance(rec, r.Header)
    return rec
