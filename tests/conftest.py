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


# -- under CI, a skipped test is a failed one ------------------------------------------------------
def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Every skip here is for a missing prerequisite (a system package, a built artefact in
    ../shared): outside CI it prints its reason; under ``CI=true`` it fails the run, so a machine
    that lacks what the suite drives cannot pass it green (scripts/setup-test-deps.sh installs
    the system packages before pytest starts). A failed test's report also shows what its
    running servers printed."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (a missing prerequisite is a failure): {reason}"
    if report.failed:
        _add_server_output(report)


# -- a failing test shows what its servers printed ---------------------------------------------------
SERVER_OUTPUT_TAIL_CHARS = 6000


def _add_server_output(report: pytest.TestReport) -> None:
    """A section per server that ``start_server`` started and that is still running (module
    fixtures included): the tail of its output, where its log lines and tracebacks are."""
    from .e2e.conftest import LIVE_SERVERS

    for server in LIVE_SERVERS:
        tail = server.output_so_far()[-SERVER_OUTPUT_TAIL_CHARS:]
        report.sections.append((f"server on port {server.port} ({report.when})", tail))
