"""Fixtures of the engine tests: the tiny checkpoint with a short context."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import with_context

SHORT_CONTEXT = 96


@pytest.fixture(scope="session")
def tiny_short_dir(tiny_dir, tmp_path_factory) -> Path:
    """The built-in tiny checkpoint with a context of 96 positions (7.7 s) instead of 250:
    sessions pass it in a few hundred steps."""
    return with_context(tiny_dir, tmp_path_factory.mktemp("tiny-short") / "model", SHORT_CONTEXT)
