"""Fixtures for the browser test: Debian's Chromium + chromedriver, a speech WAV, a server.

Chromium, chromedriver, espeak-ng and sox are Debian packages that scripts/setup-test-deps.sh
installs before pytest starts (``make test`` runs it).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, start_server
from tests.system_tools import require

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[2] / "docs"
# The screenshots in docs/ are rewritten only on request; a test run leaves the checkout clean.
UPDATE_SCREENSHOTS_ENV = "DUPLEX_UPDATE_SCREENSHOTS"


def screenshot_path(name: str, tmp_path: Path) -> Path:
    """Where a browser test saves its screenshot: docs/``name`` with
    ``DUPLEX_UPDATE_SCREENSHOTS=1``, else the test's own temporary directory."""
    return DOCS / name if os.environ.get(UPDATE_SCREENSHOTS_ENV) == "1" else tmp_path / name


SPEECH = (
    "Hello there. I would like to ask you something about the weather today. "
    "Do you think it will rain this afternoon, or should I go for a long walk in the park? "
    "Tell me what you think, and please keep it short."
)


@pytest.fixture(scope="session")
def browser_tools() -> dict[str, str]:
    """Chromium, chromedriver, espeak-ng and sox (their paths)."""
    return require(CHROMIUM, CHROMEDRIVER, "espeak-ng", "sox")


@pytest.fixture(scope="session")
def speech_wav(browser_tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 10 s of synthetic speech, 48 kHz mono 16-bit PCM WAV (Chromium's fake microphone)."""
    folder = tmp_path_factory.mktemp("speech")
    raw, wav = folder / "espeak.wav", folder / "speech.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw), SPEECH], check=True, timeout=60)
    subprocess.run(
        ["sox", str(raw), "-r", "48000", "-c", "1", "-b", "16", "-e", "signed-integer", str(wav)],
        check=True,
        timeout=60,
    )
    return wav


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Path) -> Iterator[ServerProcess]:
    """``duplex-actors serve --model tiny-parrot`` on a loopback port, shared by a test module."""
    server = start_server(tmp_path_factory.mktemp("page-server"))
    yield server
    server.stop()


API_KEY = "page-test-key"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory, parrot_dir: Path) -> Iterator[ServerProcess]:
    """One slot and an API key: for the refusals the page must explain."""
    server = start_server(
        tmp_path_factory.mktemp("keyed-server"), "--max-sessions", "1", "--api-key", API_KEY
    )
    yield server
    server.stop()
