"""``DUPLEX_MAX_ALIGN_PAD_MS`` / ``--max-align-pad-ms``: the bound on a session's alignment pads
(the CLI flag is exercised end to end in tests/e2e/test_alignment.py)."""

from __future__ import annotations

import pytest

from duplex_actors.config import ConfigError, ServerConfig
from duplex_actors.session.core import SessionLimits


def test_the_env_sets_the_pad_bound_and_refuses_bad_values() -> None:
    assert ServerConfig().max_align_pad_ms == 1000
    assert ServerConfig.from_env({}).max_align_pad_ms == 1000
    assert ServerConfig.from_env({"DUPLEX_MAX_ALIGN_PAD_MS": "250"}).max_align_pad_ms == 250
    assert ServerConfig.from_env({"DUPLEX_MAX_ALIGN_PAD_MS": "0"}).max_align_pad_ms == 0
    with pytest.raises(ConfigError, match="DUPLEX_MAX_ALIGN_PAD_MS"):
        ServerConfig.from_env({"DUPLEX_MAX_ALIGN_PAD_MS": "lots"})
    with pytest.raises(ConfigError):
        ServerConfig.from_env({"DUPLEX_MAX_ALIGN_PAD_MS": "-5"})
    assert SessionLimits().max_pad_samples == 24_000
    with pytest.raises(ValueError):
        SessionLimits(max_pad_samples=-1)
