"""PyPI ``moshi==0.2.13``'s own client, unmodified, against ``duplex-actors serve`` on ``/api/chat``.

``moshi.client.run`` is awaited as is (docs/protocol.md §9): a bare ``moshi``
package is registered in ``sys.modules`` with ``__path__`` = the installed ``moshi/`` folder, so
the heavy ``moshi/__init__.py`` never runs; ``sounddevice`` (which needs PortAudio) is replaced
by a module whose ``InputStream``/``OutputStream`` are threads calling the client's own
callbacks with ``(1920, 1)`` float32 blocks at real-time pace: the input from an espeak-ng speech
WAV, the output recorded as the client plays it. The client connects without any query (so the
server's default prompts apply) and streams at once, before the handshake.

Checks: the handshake arrives (the client logs it as "unknown message kind 0"); at least 80 % of
the frames sent after it are played back above an RMS floor; the same run against a server whose
step output is silenced (``DUPLEX_FAULTS=step_silence``) fails that check; the session log
replays, and in it the parrot's agent codes equal the input's codes one frame late.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import itertools
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from duplex_actors.client.audio import read_wav, resample, to_mono
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.replay.replayer import replay_logic
from tests.system_tools import require

from .conftest import ServerProcess, start_server

FRAME = 1920
FRAME_S = 0.08
AUDIBLE_RMS = 1e-3  # per-frame floor (as the vLLM-Omni test's)
MIN_BACK = 0.8
TAIL_S = 1.0  # keep playing after the last input frame, for the reply's last frames
SENTENCE = "Hello, can you hear me? Please repeat what I say, one word at a time."


# -- the fake sound device ------------------------------------------------------------------------
class Device:
    """What the fake streams share: the WAV to "record", and what was sent and played."""

    def __init__(self, speech: np.ndarray) -> None:
        self.speech = speech
        self.sent_at: list[float] = []
        self.played: list[tuple[float, np.ndarray]] = []
        self.input_done = threading.Event()
        self.t0 = 0.0


def _paced(stop: threading.Event, t0: float, frames: int | None, body: Callable[[int], None]) -> None:
    for k in itertools.count() if frames is None else range(frames):
        wait = t0 + k * FRAME_S - time.monotonic()
        if stop.wait(max(0.0, wait)):
            return
        body(k)


class _FakeStream:
    device: Device

    def __init__(
        self, *, samplerate: float, channels: int, blocksize: int, callback: Callable[..., None]
    ) -> None:
        assert (samplerate, channels, blocksize) == (24000, 1, FRAME), (samplerate, channels, blocksize)
        self.callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _FakeStream:
        if not self.device.t0:
            self.device.t0 = time.monotonic() + 0.05
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        raise NotImplementedError


class FakeInputStream(_FakeStream):
    def _run(self) -> None:
        dev = self.device
        frames = dev.speech.size // FRAME

        def record(k: int) -> None:
            dev.sent_at.append(time.monotonic())
            block = np.ascontiguousarray(dev.speech[k * FRAME : (k + 1) * FRAME].reshape(FRAME, 1))
            self.callback(block, FRAME, None, None)

        _paced(self._stop, dev.t0, frames, record)
        dev.input_done.set()


class FakeOutputStream(_FakeStream):
    def _run(self) -> None:
        dev = self.device
        out = np.zeros((FRAME, 1), np.float32)

        def play(_k: int) -> None:
            self.callback(out, FRAME, None, None)
            dev.played.append((time.monotonic(), out[:, 0].copy()))

        _paced(self._stop, dev.t0 + FRAME_S / 2, None, play)


class RecordingPrinter:
    """A ``moshi.client_utils.RawPrinter`` look-alike that keeps the log lines with their time."""

    def __init__(self) -> None:
        self.logs: list[tuple[float, str, str]] = []
        self.tokens: list[str] = []

    def log(self, level: str, msg: str) -> None:
        self.logs.append((time.monotonic(), level, msg))

    def print_token(self, token: str) -> None:
        self.tokens.append(token)

    def print_header(self) -> None: ...
    def print_lag(self) -> None: ...
    def print_pending(self) -> None: ...

    def handshake_at(self) -> float | None:
        return next((t for t, _, msg in self.logs if msg == "unknown message kind 0"), None)


@pytest.fixture(scope="module")
def moshi_client() -> Iterator[types.ModuleType]:
    """PyPI moshi 0.2.13's ``moshi.client``, imported without ``moshi/__init__.py`` (torch) and
    with a fake ``sounddevice``."""
    spec = importlib.util.find_spec("moshi")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("moshi==0.2.13 is not installed (scripts/setup-venv.sh installs it)")
    pytest.importorskip("aiohttp")
    names = ("moshi", "moshi.client", "moshi.client_utils", "sounddevice")
    saved = {k: sys.modules[k] for k in names if k in sys.modules}
    package = types.ModuleType("moshi")
    package.__path__ = list(spec.submodule_search_locations)
    sd = types.ModuleType("sounddevice")
    sd.InputStream, sd.OutputStream = FakeInputStream, FakeOutputStream  # type: ignore[attr-defined]
    for name in names:
        sys.modules.pop(name, None)
    sys.modules["moshi"], sys.modules["sounddevice"] = package, sd
    try:
        yield importlib.import_module("moshi.client")
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About 4 s of espeak-ng speech at 24 kHz mono float32."""
    require("espeak-ng")
    wav = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run(["espeak-ng", "-s", "170", "-w", str(wav), SENTENCE], check=True, timeout=60)
    samples, rate = read_wav(wav)
    return resample(to_mono(samples), rate, 24000)


def run_moshi_client(
    client: types.ModuleType, server: ServerProcess, speech: np.ndarray
) -> tuple[Device, RecordingPrinter]:
    """``moshi.client.run`` until the WAV has been sent and ``TAIL_S`` more played, then cancelled
    (the client has no other way to end: it streams until its user hits Ctrl-C)."""
    device = Device(speech)
    _FakeStream.device = device
    printer = RecordingPrinter()
    args = argparse.Namespace(host="unused", port=0, https=False, url=f"ws://127.0.0.1:{server.port}")

    async def main() -> None:
        task = asyncio.create_task(client.run(printer, args))
        deadline = time.monotonic() + speech.size / 24000 + 30
        while not device.input_done.is_set() and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(TAIL_S)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    return device, printer


def audible_back(device: Device, printer: RecordingPrinter) -> tuple[int, int]:
    """(frames played above the floor, input frames sent after the handshake)."""
    handshake = printer.handshake_at()
    assert handshake is not None, printer.logs
    after = sum(1 for t in device.sent_at if t > handshake)
    loud = sum(
        1 for _, pcm in device.played if float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > AUDIBLE_RMS
    )
    return loud, after


def api_chat_log(server: ServerProcess, timeout: float = 10.0) -> Path:
    """The one finished ``/api/chat`` session log (the server also logs its warm-up session)."""
    deadline = time.monotonic() + timeout
    found: list[Path] = []
    while time.monotonic() < deadline:
        found = []
        for path in sorted(server.log_dir.glob("*.dlog")):
            try:
                recs = [rec for _, rec in read_log(path).records]
            except Exception:
                continue
            if (
                recs
                and isinstance(recs[0], r.Header)
                and recs[0].dialect == "api_chat"
                and isinstance(recs[-1], r.End)
            ):
                found.append(path)
        if len(found) == 1:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"not one finished /api/chat log in {server.log_dir}: {found}")


def test_moshi_client_unmodified(
    moshi_client: types.ModuleType, speech: np.ndarray, tmp_path: Path, parrot_dir: Path
) -> None:
    server = start_server(tmp_path / "ok")
    try:
        device, printer = run_moshi_client(moshi_client, server, speech)
        loud, after = audible_back(device, printer)
        print(
            f"\nAUDIBLE {loud} of {after} sent after the handshake ({len(device.sent_at)} sent, {len(device.played)} played)"
        )
        assert after >= 0.7 * len(device.sent_at) and after > 20, (after, len(device.sent_at))
        assert loud >= MIN_BACK * after, (loud, after)
        assert not [m for _, level, m in printer.logs if level == "error"], printer.logs
        log = api_chat_log(server)
    finally:
        server.stop()
    steps = [rec for _, rec in read_log(log).records if isinstance(rec, r.Step)]
    assert len(steps) >= after - 1
    for prev, cur in itertools.pairwise(steps):
        assert cur.agent_codes == prev.user_codes, f"frame {cur.frame_index}"  # the parrot, one late
    assert len({s.user_codes for s in steps}) > 10  # speech went in, not silence
    report = replay_logic(log)
    # The client is cancelled TAIL_S after its input ends: frames still queued on a busy host
    # then were never stepped (5 of 56 in one fresh-clone run).
    assert report.complete and report.identical and len(steps) <= report.frames_in


def test_moshi_client_negative_control(
    moshi_client: types.ModuleType, speech: np.ndarray, tmp_path: Path, parrot_dir: Path
) -> None:
    """The same check fails when the server's step output is silence: it measures the reply."""
    trigger = tmp_path / "silence"
    trigger.touch()
    server = start_server(tmp_path / "silenced", env={"DUPLEX_FAULTS": f"step_silence={trigger}"})
    try:
        device, printer = run_moshi_client(moshi_client, server, speech[: 24000 * 2])
        loud, after = audible_back(device, printer)
        print(
            f"\nAUDIBLE {loud} of {after} sent after the handshake ({len(device.sent_at)} sent, {len(device.played)} played)"
        )
    finally:
        server.stop()
    assert after > 10
    assert loud < MIN_BACK * after, (loud, after)
