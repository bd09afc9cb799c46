"""vLLM-Omni's own duplex client, unmodified, against ``duplex-actors serve`` (docs/protocol.md §8).

The set-up downloads the ``vllm-omni`` wheel from PyPI (``pip download --no-deps``, once per
test run), unpacks only ``vllm_omni/clients/`` and registers a bare ``vllm_omni`` package whose
``__path__`` is that folder, so ``vllm_omni/__init__.py`` (which needs vllm and CUDA torch)
never runs. ``DuplexClient`` with PersonaPlex's ``create_duplex_session_config`` then drives two
paced sessions and a third that is refused, on ``/v1/realtime?duplex=1``. Besides what the
client itself needs (``session.created``, ``session.closed``, acks of ``server_event_seq``), the
test makes the checks upstream's driver (``tests/e2e/online_serving/personaplex_realtime_duplex.py``)
makes on audio deltas. The client is asyncio-based: it runs in a worker thread."""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio

from .helpers import FRAME_PCM16_BYTES, FRAME_SAMPLES, f32, tone_and_noise

WHEEL = "vllm-omni==0.30.0"
FIRST_FRAMES = 25  # 2 s of paced input per session, one response
AFTER_CANCEL_FRAMES = 8
VOICED_RMS = 1e-3  # upstream's per-frame floor for audible output
VLLM_OMNI = {
    "runtime_impl": "scheduler_data_plane",
    "uses_model_runner_scheduler": True,
    "runner_kv_backed": True,
}
AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")


@pytest.fixture(scope="module")
def vllm_omni(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.SimpleNamespace]:
    """The wheel's ``duplex`` and ``personaplex`` client modules; a failed download fails."""
    root = tmp_path_factory.mktemp("vllm-omni")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            WHEEL,
            "-d",
            str(root),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = root.glob("vllm_omni-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root, [n for n in zf.namelist() if n.startswith("vllm_omni/clients/")])
    assert (root / "vllm_omni/clients/duplex.py").is_file()
    saved = {k: v for k, v in sys.modules.items() if k == "vllm_omni" or k.startswith("vllm_omni.")}
    package = types.ModuleType("vllm_omni")
    package.__path__ = [str(root / "vllm_omni")]
    sys.modules["vllm_omni"] = package
    try:
        yield types.SimpleNamespace(
            duplex=importlib.import_module("vllm_omni.clients.duplex"),
            personaplex=importlib.import_module("vllm_omni.clients.personaplex"),
        )
    finally:
        for name in [k for k in sys.modules if k == "vllm_omni" or k.startswith("vllm_omni.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class Recorder:
    """What the client's transport sent and received, as JSON (the client sees the same)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []

    def connect(self, max_size: int) -> Any:
        import websockets

        recorder = self

        class Transport:
            def __init__(self, ws: Any) -> None:
                self.ws = ws

            async def send(self, message: str) -> None:
                recorder.sent.append(json.loads(message))
                await self.ws.send(message)

            async def recv(self) -> str | bytes:
                message = await self.ws.recv()
                if isinstance(message, str):
                    recorder.received.append(json.loads(message))
                return message

            async def close(self) -> None:
                await self.ws.close()

        async def connect(url: str) -> Any:
            assert "duplex=1" in url and "autostart=0" in url, url
            return Transport(await websockets.connect(url, max_size=max_size))

        return connect

    def of(self, *types_: str) -> list[dict[str, Any]]:
        return [e for e in self.received if e["type"] in types_]

    def deltas(self, response_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.of(*AUDIO_DELTAS) if response_id is None or e["response_id"] == response_id]


def paced_audio(frames: int, seed: int) -> bytes:
    return f32(tone_and_noise(frames * FRAME_SAMPLES / 24_000, seed=seed))


def sequenced(recorder: Any) -> int:
    """The sequenced server events the client has received."""
    return sum("server_event_seq" in e for e in recorder.received)


def acks(recorder: Any) -> int:
    """The ``session.event_ack`` messages the client has sent."""
    return sum(m["type"] == "session.event_ack" for m in recorder.sent)


async def wait_until(predicate: Any, what: str, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def scenario(url: str, vo: types.SimpleNamespace) -> dict[str, Any]:
    duplex = vo.duplex
    config = vo.personaplex.create_duplex_session_config(voice="NATF2.pt")
    recorders = [Recorder(), Recorder(), Recorder()]

    def client(i: int) -> Any:
        return duplex.DuplexClient(
            url, model="tiny-parrot", config=config, connect=recorders[i].connect(64 << 20), reconnect=None
        )

    out: dict[str, Any] = {"recorders": recorders}
    async with client(0) as a, client(1) as b:
        out["session_ids"] = [a.session_id, b.session_id]
        out["capabilities"] = a.session_info.get("capabilities")
        with pytest.raises(duplex.DuplexProtocolError) as refused:
            async with client(2):
                pass
        out["refused"] = refused.value
        await asyncio.gather(
            a.stream_pcm(paced_audio(FIRST_FRAMES, 1), chunk_ms=80),
            b.stream_pcm(paced_audio(FIRST_FRAMES, 2), chunk_ms=80),
        )
        for r in recorders[:2]:
            await wait_until(lambda r=r: len(r.deltas()) == FIRST_FRAMES, "every output frame")
        first = recorders[0].deltas()[0]["response_id"]
        await a.cancel_response()
        await wait_until(lambda: bool(recorders[0].of("response.done")), "response.done")
        await a.stream_pcm(paced_audio(AFTER_CANCEL_FRAMES, 3), chunk_ms=80)
        await wait_until(
            lambda: (
                len([d for d in recorders[0].deltas() if d["response_id"] != first]) == AFTER_CANCEL_FRAMES
            ),
            "the new response's frames",
        )
        for r in recorders[:2]:  # every event acknowledged before the close, on the same socket
            await wait_until(lambda r=r: acks(r) == sequenced(r), "every event acknowledged")
    out["closed"] = [a._closed.is_set(), b._closed.is_set()]
    return out


def check_upstream_audio_checks(deltas: list[dict[str, Any]], input_frames: int) -> None:
    """What upstream's driver asserts on a continuous stream's audio deltas."""
    chunks = [base64.b64decode(d["delta"], validate=True) for d in deltas]
    assert all(len(c) % 2 == 0 and c for c in chunks)
    assert {d["sample_rate_hz"] for d in deltas} == {24_000}
    assert all(isinstance(d["response_id"], str) and d["response_id"] for d in deltas)
    assert len({d["response_id"] for d in deltas}) == 1, "a continuous stream is one response"
    assert all(d["metadata"]["vllm_omni"] == VLLM_OMNI for d in deltas)
    pcm = np.frombuffer(b"".join(chunks), dtype="<i2").astype(np.float32) / 32768.0
    assert pcm.size % FRAME_SAMPLES == 0, "whole 80 ms frames"
    frames = pcm.reshape(-1, FRAME_SAMPLES)
    assert 0 <= input_frames - len(frames) <= 1  # upstream's frame deficit (here: none)
    rms = np.sqrt(np.mean(np.square(frames), axis=1))
    assert np.isfinite(pcm).all() and float(np.sqrt(np.mean(np.square(pcm)))) > VOICED_RMS
    assert int(np.count_nonzero(rms >= VOICED_RMS)) >= len(frames) // 2, rms


async def test_vllm_omni_duplex_client_unmodified(parrot_server, vllm_omni):
    url = parrot_server.ws  # DuplexClient adds /v1/realtime?duplex=1&model=...&autostart=0

    def run() -> dict[str, Any]:
        return asyncio.run(asyncio.wait_for(scenario(url, vllm_omni), 60))

    with trio.fail_after(90):
        out = await trio.to_thread.run_sync(run, abandon_on_cancel=True)

    a, b, third = out["recorders"]
    # The third session is refused (the server has 2 slots) and gets no session.
    assert out["refused"].code == "resource_exhausted"
    assert [e["type"] for e in third.received] == ["error"]
    assert third.received[0]["error"]["type"] == "rate_limit_error"
    assert out["capabilities"]["supports_multi_session"] is True
    assert all(out["closed"]) and len(set(out["session_ids"])) == 2

    for rec, sid in zip((a, b), out["session_ids"], strict=True):
        assert rec.received[0]["type"] == "session.created" and "server_event_seq" not in rec.received[0]
        assert rec.received[0]["session"]["id"] == sid
        assert rec.received[-1]["type"] == "session.closed" and rec.received[-1]["reason"] == "client_close"
        assert not rec.of("error"), rec.of("error")
        seqs = [e["server_event_seq"] for e in rec.received[1:]]
        assert seqs == list(range(1, len(seqs) + 1))
        # The client acknowledged what it was sent, and no ack was refused (no error above).
        acked = [m["server_event_seq"] for m in rec.sent if m["type"] == "session.event_ack"]
        assert acked == seqs[: len(acked)] and len(acked) >= len(seqs) - 1
        assert not [m for m in rec.sent if m["type"] == "input_audio_buffer.commit"]
        for d in rec.deltas():
            assert d["metadata"]["session_id"] == sid
            assert d["metadata"]["model_speak"] is True and d["metadata"]["end_of_turn"] is False
        # One response.speak per response, right before its first audio delta.
        responses = [e["response"]["id"] for e in rec.of("response.created")]
        speaks = rec.of("response.speak")
        assert [s["response_id"] for s in speaks] == responses
        for s in speaks:
            first = rec.deltas(s["response_id"])[0]
            assert rec.received.index(first) == rec.received.index(s) + 1
            assert s["metadata"] == {
                "session_id": sid,
                "epoch": first["metadata"]["epoch"],
                "model_speak": True,
            }

    # Session b: one continuous response through the whole paced stream.
    assert len(b.of("response.created")) == 1
    check_upstream_audio_checks(b.deltas(), FIRST_FRAMES)
    assert [d["metadata"]["frame_index"] for d in b.deltas()] == list(range(FIRST_FRAMES))

    # Session a: cancel ends the first response; the next input opens a new one under epoch 1.
    first_id, second_id = (e["response"]["id"] for e in a.of("response.created"))
    assert first_id != second_id
    done = a.of("response.done")
    assert done[0]["response"]["id"] == first_id and done[0]["response"]["status"] == "cancelled"
    assert done[0]["response"]["status_details"]["reason"] == "client_cancelled"
    check_upstream_audio_checks(a.deltas(first_id), FIRST_FRAMES)
    check_upstream_audio_checks(a.deltas(second_id), AFTER_CANCEL_FRAMES)
    assert {d["metadata"]["epoch"] for d in a.deltas(first_id)} == {0}
    assert {d["metadata"]["epoch"] for d in a.deltas(second_id)} == {1}
    assert all(len(base64.b64decode(d["delta"])) == FRAME_PCM16_BYTES for d in a.deltas() + b.deltas())


async def test_event_ack_and_commit_codes_on_the_wire(parrot_server):
    """Acks are accepted and not logged, a bad ack is ``invalid_event_ack``, and a commit says
    ``input_audio_buffer_empty`` with nothing buffered, ``commit_unsupported`` otherwise; the
    session goes on and its log replays (tests/replay covers the replayer itself)."""
    from duplex_actors.log import records as r

    from .helpers import connect, pcm16, read_records

    async with connect(parrot_server.ws + "/v1/realtime?duplex=1") as c:
        await c.wait_for("session.updated")
        sid = c.session_id
        for seq in (0, 1, 2):
            await c.send({"type": "session.event_ack", "server_event_seq": seq})
        await c.send({"type": "input_audio_buffer.commit", "event_id": "c1"})
        err = await c.wait_error("input_audio_buffer_empty")
        assert err["error"]["event_id"] == "c1" and isinstance(err["server_event_seq"], int)
        await c.send({"type": "session.event_ack", "server_event_seq": -1, "event_id": "a1"})
        err = await c.wait_error("invalid_event_ack")
        assert err["error"]["event_id"] == "a1"
        await c.append(pcm16(tone_and_noise(FRAME_SAMPLES / 24_000 / 2, seed=5)))  # half a frame
        await c.send({"type": "input_audio_buffer.commit", "event_id": "c2"})
        await c.wait_error("commit_unsupported")
        await c.append(pcm16(tone_and_noise(FRAME_SAMPLES / 24_000 / 2, seed=6)))
        await c.wait_until(lambda: c.output_frames() == 1, what="the completed frame's output")
        assert c.error_codes() == ["input_audio_buffer_empty", "invalid_event_ack", "commit_unsupported"]
    records = await read_records(parrot_server, sid)
    assert records[0].output == {"names": "ga", "duplex": True}
    rejected = [rec.code for rec in records if isinstance(rec, r.Rejected)]
    assert rejected == ["input_audio_buffer_empty", "invalid_event_ack", "commit_unsupported"]
