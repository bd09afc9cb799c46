"""Fixtures for the client tests: real ``duplex-actors serve`` processes (tiny-parrot, started
with the e2e suite's ``start_server``) shared by the package, and a speech WAV."""

from __future__ import annotations

import shutil
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from duplex_actors.audio import float_to_pcm16
from duplex_actors.client.audio import speech_like
from tests.e2e.conftest import ServerProcess, start_server

API_KEY = "sk-client-test"


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Path) -> Iterator[ServerProcess]:
    """``--model tiny-parrot --max-sessions 2`` for the whole package."""
    srv = start_server(tmp_path_factory.mktemp("client-server"), "--max-sessions", "2")
    yield srv
    srv.stop()


@pytest.fixture(scope="package")
def locked_server(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Path) -> Iterator[ServerProcess]:
    """``--api-key sk-client-test --max-sessions 1``: for the auth and server-full refusals."""
    srv = start_server(tmp_path_factory.mktemp("locked-server"), "--api-key", API_KEY, "--max-sessions", "1")
    yield srv
    srv.stop()


@pytest.fixture
def realtime_url(server: ServerProcess) -> str:
    return f"{server.ws}/v1/realtime?duplex=1"


def _have_speech_tools() -> bool:
    if shutil.which("espeak-ng") and shutil.which("sox"):
        return True
    if shutil.which("apt-get") is None:
        return False
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "espeak-ng", "sox"]):
        try:
            subprocess.run(cmd, check=False, capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return bool(shutil.which("espeak-ng") and shutil.which("sox"))


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """``(path, real_speech)``: a spoken sentence made with espeak-ng (22.05 kHz mono), converted
    by sox to 16 kHz *stereo* so the client has to downmix and resample. espeak-ng and sox are
    installed with apt-get when missing; where that is impossible the WAV is synthetic
    speech-like audio (16 kHz stereo as well) and ``real_speech`` is False."""
    out = tmp_path_factory.mktemp("speech")
    wav = out / "speech.wav"
    if _have_speech_tools():
        raw = out / "espeak.wav"
        subprocess.run(
            ["espeak-ng", "-w", str(raw), "Hello there. Could you tell me what the weather is like today?"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        subprocess.run(
            ["sox", str(raw), "-r", "16000", "-c", "2", "-b", "16", str(wav)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return wav, True
    mono = speech_like(3.0, rate=16_000, seed=3)
    stereo = np.stack([mono, mono * 0.5], axis=1)
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(float_to_pcm16(stereo.reshape(-1)))
    return wav, False
