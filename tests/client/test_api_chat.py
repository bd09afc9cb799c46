"""The ``/api/chat`` client pieces without the real server: the Ogg/Opus sample counter against
sphn's own streams, and ``open_api_chat_client`` / ``duplex-load --dialect api-chat`` against a
small in-process server that speaks spec section 9 (handshake, one ``0x01`` per 80 ms input
frame, ``0x02`` text after it, ``0x05`` + 1013 when busy). The real server and the real clients
are tested in tests/e2e/test_api_chat_clients.py and tests/browser/test_personaplex_ui.py;
the last test here runs duplex-client and duplex-load against the real server."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sphn
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.client import load
from duplex_actors.client.apichat import api_chat_url, is_api_chat_url, open_api_chat_client
from duplex_actors.client.audio import read_wav, rms, speech_like
from duplex_actors.client.errors import ResourceExhausted, SessionRefused
from duplex_actors.client.opus import OggOpusCounter, encode_opus_messages, opus_packet_samples


def _sphn_stream(x: np.ndarray, chunk: int) -> bytes:
    writer = sphn.OpusStreamWriter(24_000)
    return b"".join(bytes(writer.append_pcm(x[i : i + chunk])) for i in range(0, x.size, chunk))


@pytest.mark.parametrize("chunk", [480, 960, 1920])  # 20, 40, 80 ms appends
def test_counter_counts_every_sample_of_a_sphn_stream(chunk: int) -> None:
    x = speech_like(2.0)
    data = _sphn_stream(x, chunk)
    whole = OggOpusCounter()
    assert whole.feed(data) == x.size
    pieces = OggOpusCounter()  # fragments split pages and headers anywhere
    assert sum(pieces.feed(data[i : i + 7]) for i in range(0, len(data), 7)) == x.size


def test_counter_ignores_garbage_and_headers() -> None:
    counter = OggOpusCounter()
    assert counter.feed(b"not an ogg stream at all" * 10) == 0
    messages = encode_opus_messages(np.zeros(FRAME_SAMPLES, np.float32))
    assert counter.feed(messages[0][1:]) == FRAME_SAMPLES  # OpusHead/OpusTags count 0


def test_packet_durations_from_the_toc() -> None:
    assert opus_packet_samples(bytes([(13 << 3) | 2])) == 960  # hybrid 20 ms, 2 frames: 40 ms
    assert opus_packet_samples(bytes([10 << 3])) == 960  # SILK 40 ms, 1 frame
    assert opus_packet_samples(bytes([(31 << 3) | 3, 4])) == 4 * 480  # CELT 20 ms x 4
    assert opus_packet_samples(bytes([16 << 3])) == 60  # CELT 2.5 ms
    assert opus_packet_samples(b"") == 0


def test_messages_are_one_80ms_frame_each_with_the_headers_first() -> None:
    messages = encode_opus_messages(speech_like(1.0))
    assert len(messages) == 13  # 12.5 frames, the last zero-padded
    assert all(m[0] == 0x01 for m in messages)
    assert b"OpusHead" in messages[0] and b"OpusTags" in messages[0]
    assert not any(b"OpusHead" in m for m in messages[1:])
    counts = [OggOpusCounter().feed(messages[0][1:])]
    counter = OggOpusCounter()
    counts = [counter.feed(m[1:]) for m in messages]
    assert counts == [FRAME_SAMPLES] * 13


def test_url_helpers() -> None:
    assert is_api_chat_url("ws://h:1/api/chat?x=1") and not is_api_chat_url("ws://h:1/v1/realtime")
    url = api_chat_url("ws://h:1/api/chat?voice_prompt=a", voice_prompt="NATF0.pt", text_prompt=None)
    assert url == "ws://h:1/api/chat?voice_prompt=NATF0.pt"


# -- a spec-following echo server -----------------------------------------------------------------
class EchoServer:
    """Section 9 in miniature: 1-byte handshake, pre-handshake audio dropped (none is possible
    here: the handshake goes first), each input frame's samples answered by one ``0x01``
    message of the same audio re-encoded, then a ``0x02`` piece; at most ``slots`` sessions."""

    def __init__(self, slots: int = 4) -> None:
        self.slots = slots
        self.active = 0
        self.queries: list[str] = []
        self.port = 0

    async def handler(self, request: WebSocketRequest) -> None:
        ws = await request.accept()
        self.queries.append(request.path)
        if self.active >= self.slots:
            await ws.send_message(b"\x05server busy")
            await ws.aclose(1013, "server busy")
            return
        self.active += 1
        reader, writer = sphn.OpusStreamReader(24_000), sphn.OpusStreamWriter(24_000)
        pending: np.ndarray = np.zeros(0, np.float32)
        try:
            await ws.send_message(b"\x00")
            while True:
                message = await ws.get_message()
                if not isinstance(message, bytes) or message[:1] != b"\x01":
                    continue
                pending = np.concatenate([pending, reader.append_bytes(message[1:])])
                while pending.size >= FRAME_SAMPLES:
                    frame, pending = pending[:FRAME_SAMPLES], pending[FRAME_SAMPLES:]
                    await ws.send_message(b"\x01" + bytes(writer.append_pcm(frame)))
                    await ws.send_message(b"\x02 hi")
        except ConnectionClosed:
            pass
        finally:
            self.active -= 1

    async def serve(self, nursery: trio.Nursery) -> None:
        server = await nursery.start(serve_websocket, self.handler, "127.0.0.1", 0, None)
        self.port = server.port

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/chat"


async def test_client_streams_and_counts_the_reply() -> None:
    messages = encode_opus_messages(speech_like(1.2))
    server = EchoServer()
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        arrivals: list[tuple[float, int, int]] = []
        async with open_api_chat_client(
            server.url,
            voice_prompt="NATF0.pt",
            decode=True,
            on_audio=lambda t, k, n: arrivals.append((t, k, n)),
        ) as client:
            assert client.handshake == b"\x00"
            await client.stream(messages, paced=False, max_ahead_frames=4)
            await client.wait_frames(len(messages))
            await client.wait_until(lambda: len(client.text) == len(messages), timeout=5)
        assert [k for _, k, _ in arrivals] == list(range(len(messages)))
        assert client.decoded().size == len(messages) * FRAME_SAMPLES
        assert rms(client.decoded()) > 0.01
        assert "voice_prompt=NATF0.pt" in server.queries[-1]
        nursery.cancel_scope.cancel()


async def test_busy_is_resource_exhausted() -> None:
    server = EchoServer(slots=0)
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        with pytest.raises(ResourceExhausted) as info:
            async with open_api_chat_client(server.url):
                pass
        assert info.value.close_code == 1013 and "busy" in info.value.message
        nursery.cancel_scope.cancel()


async def test_refusal_names_the_problem() -> None:
    async def refuse(request: WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.send_message(b"\x05unknown voice_prompt 'x.pt'")
        await ws.aclose(1008, "bad query")

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, refuse, "127.0.0.1", 0, None)
        with pytest.raises(SessionRefused) as info:
            async with open_api_chat_client(f"ws://127.0.0.1:{server.port}/api/chat", voice_prompt="x.pt"):
                pass
        assert info.value.close_code == 1008 and "voice_prompt" in info.value.message
        assert not isinstance(info.value, ResourceExhausted)
        nursery.cancel_scope.cancel()


async def test_duplex_load_api_chat_report(tmp_path: Path) -> None:
    """The same report as the Realtime dialect's, the Opus encoded once, replies timed per frame."""
    server = EchoServer()
    out = tmp_path / "load"
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        args: argparse.Namespace = load.build_parser().parse_args(
            [
                "--url",
                server.url,
                "--sessions",
                "3",
                "--seconds",
                "1.2",
                "--decode-every",
                "2",
                "--out",
                str(out),
            ]
        )
        assert await load._main(args) == load.EXIT_OK
        nursery.cancel_scope.cancel()
    report: dict[str, Any] = json.loads((out / "load.json").read_text())
    assert report["dialect"] == "api-chat" and report["frames_per_session"] == 15
    agg = report["aggregate"]
    assert agg["frames_sent"] == 3 * 15 and agg["frames_received"] == 3 * 15
    assert agg["coverage"] == 1.0 and agg["lost_frames"] == 0 and agg["failed_sessions"] == 0
    assert agg["round_trip_ms"]["p99"] is not None and agg["round_trip_ms"]["p99"] < 1000
    assert agg["decoded_sessions"] == 2 and agg["audible_fraction"] > 0.5  # sessions 0 and 2
    assert agg["client_cpu_pct_per_session"] is not None
    assert [s["audible_frames"][1] for s in report["sessions"] if "audible_frames" in s] == [15, 15]


# -- the tools against the real server ------------------------------------------------------------
def test_duplex_client_and_load_on_the_real_server(server: Any, speech_wav: Path, tmp_path: Path) -> None:
    """``duplex-client`` on /api/chat: every frame back, audible (the parrot echoes the codes);
    an unknown voice is exit 5 naming it; ``duplex-load`` on the same server: coverage 1.0."""
    bin_dir = Path(sys.executable).parent
    wav = speech_wav
    url = f"{server.ws}/api/chat"
    out = tmp_path / "reply.wav"
    proc = subprocess.run(
        [
            str(bin_dir / "duplex-client"),
            "--url",
            url,
            "--input",
            str(wav),
            "--output",
            str(out),
            "--voice",
            "NATF0.pt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "handshake b'\\x00'" in proc.stderr
    reply, rate = read_wav(out)
    sent = int(proc.stderr.split(" for ")[1].split()[0])
    assert rate == 24_000 and reply.shape[0] == sent * FRAME_SAMPLES
    assert rms(reply[:, 0]) > 1e-3
    proc = subprocess.run(
        [
            str(bin_dir / "duplex-client"),
            "--url",
            url,
            "--input",
            str(wav),
            "--output",
            str(out),
            "--voice",
            "x.pt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 5 and "x.pt" in proc.stderr and "1008" in proc.stderr, proc.stderr
    proc = subprocess.run(
        [str(bin_dir / "duplex-load"), "--url", url, "-n", "2", "-s", "2", "--out", str(tmp_path / "load")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    agg = json.loads((tmp_path / "load" / "load.json").read_text())["aggregate"]
    assert agg["coverage"] == 1.0 and agg["lost_frames"] == 0 and agg["failed_sessions"] == 0
    assert agg["decoded_sessions"] == 1 and agg["audible_fraction"] > 0.8
