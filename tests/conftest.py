"""Shared fixtures: tiny checkpoints built once per test run into a private cache."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Built-in models go to a private cache so tests never depend on (or touch) ~/.cache.
_CACHE = Path(tempfile.mkdtemp(prefix="duplex-test-cache-"))
os.environ["DUPLEX_CACHE_DIR"] = str(_CACHE)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from duplex_actors.model.tiny import ensure_builtin

    return ensure_builtin("tiny")


@pytest.fixture(scope="session")
def parrot_dir() -> Path:
    from duplex_actors.model.tiny import ensure_builtin

    return ensure_builtin("tiny-parrot")
