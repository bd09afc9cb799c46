"""Fixtures for the client tests: real ``duplex-actors serve`` processes (tiny-parrot, started
with the e2e suite's ``start_server``) shared by the package, and a speech WAV."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, start_server
from tests.system_tools import require

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


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spoken sentence made with espeak-ng (22.05 kHz mono), converted by sox to 16 kHz
    *stereo* so the client has to downmix and resample."""
    require("espeak-ng", "sox")
    out = tmp_path_factory.mktemp("speech")
    raw, wav = out / "espeak.wav", out / "speech.wav"
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
    return wav
