"""The system programs and libraries the tests drive. scripts/setup-test-deps.sh installs them
before pytest starts (``make test`` runs it); a test that finds one missing skips with the
reason, and under ``CI=true`` that skip fails the run (tests/conftest.py)."""

from __future__ import annotations

import ctypes.util
import shutil

import pytest

SETUP = "scripts/setup-test-deps.sh"


def which(command: str) -> str | None:
    """``command``'s path, /usr/sbin included (haproxy lives there)."""
    return shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin")


def require(*commands: str) -> dict[str, str]:
    """The paths of ``commands``, or skip naming the missing ones and how to install them."""
    found = {command: which(command) for command in commands}
    missing = [command for command, path in found.items() if path is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: run {SETUP} (make test does)")
    return {command: path for command, path in found.items() if path is not None}


def library(name: str) -> str | None:
    """The system library ``lib<name>``'s file name, or None."""
    return ctypes.util.find_library(name)
