"""Fixtures for the browser test: Debian's Chromium + chromedriver, a speech WAV, a server.

Chromium, chromedriver, espeak-ng and sox come from Debian's packages and are installed here
on first use (``apt-get update`` then ``apt-get install``), so CI on a fresh machine runs the
test. Where that is impossible (not root, no apt-get), the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, start_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
APT_PACKAGES = ["chromium", "chromium-driver", "fonts-liberation", "espeak-ng", "sox"]
INSTALL_TIMEOUT_S = 1200

SPEECH = (
    "Hello there. I would like to ask you something about the weather today. "
    "Do you think it will rain this afternoon, or should I go for a long walk in the park? "
    "Tell me what you think, and please keep it short."
)


def _missing() -> list[str]:
    tools = {CHROMIUM: "chromium", CHROMEDRIVER: "chromium-driver", "espeak-ng": "espeak-ng", "sox": "sox"}
    missing = [pkg for exe, pkg in tools.items() if shutil.which(exe) is None]
    if missing and "chromium" in missing:
        missing.append("fonts-liberation")
    return missing


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", *args], capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S
    )


def install_browser_tools() -> float:
    """Install what is missing of :data:`APT_PACKAGES`; return the seconds it took (0 if none)."""
    missing = _missing()
    if not missing:
        return 0.0
    if shutil.which("apt-get") is None:
        pytest.skip(f"cannot install {', '.join(missing)}: no apt-get on this machine")
    if os.geteuid() != 0:
        pytest.skip(f"cannot install {', '.join(missing)} with apt-get: not running as root")
    started = time.monotonic()
    update = _apt("update", "-q")
    if update.returncode != 0:
        pytest.skip(f"apt-get update failed ({update.returncode}): {update.stderr.strip()[-2000:]}")
    install = _apt("install", "-y", "-q", "--no-install-recommends", *missing)
    if install.returncode != 0:
        pytest.skip(
            f"apt-get install {' '.join(missing)} failed ({install.returncode}): "
            f"{install.stderr.strip()[-2000:]}"
        )
    still = _missing()
    if still:
        pytest.skip(f"apt-get install succeeded but {', '.join(still)} is still missing")
    return time.monotonic() - started


@pytest.fixture(scope="session")
def browser_tools() -> float:
    """Chromium, chromedriver, espeak-ng and sox, installed if missing (seconds spent)."""
    seconds = install_browser_tools()
    if seconds:
        print(f"\ninstalled {' '.join(APT_PACKAGES)} in {seconds:.1f} s")
    return seconds


@pytest.fixture(scope="session")
def speech_wav(browser_tools: float, tmp_path_factory: pytest.TempPathFactory) -> Path:
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
