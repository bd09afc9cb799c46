"""Shared fixtures: tiny checkpoints built once per test run into a private cache.

The cache is a temporary directory made when pytest configures (before any test module is
imported) and removed when it unconfigures, so a run leaves no model cache behind and never
depends on (or touches) ``~/.cache``. ``DUPLEX_CACHE_DIR`` is set in ``os.environ``, so the
``duplex-actors`` processes the tests start (they inherit the environment) use it too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_CACHE_ENV = "DUPLEX_CACHE_DIR"
_cache: Path | None = None
_previous: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _cache, _previous
    if _cache is not None:
        return
    _previous = os.environ.get(_CACHE_ENV)
    _cache = Path(tempfile.mkdtemp(prefix="duplex-test-cache-"))
    os.environ[_CACHE_ENV] = str(_cache)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _cache
    if _cache is None:
        return
    shutil.rmtree(_cache, ignore_errors=True)
    _cache = None
    if _previous is None:
        os.environ.pop(_CACHE_ENV, None)
    else:
        os.environ[_CACHE_ENV] = _previous


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from duplex_actors.model.tiny import ensure_builtin

    return ensure_builtin("tiny")


@pytest.fixture(scope="session")
def parrot_dir() -> Path:
    from duplex_actors.model.tiny import ensure_builtin

    return ensure_builtin("tiny-parrot")
