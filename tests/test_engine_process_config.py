"""``--engine-process`` / ``DUPLEX_ENGINE_PROCESS``: off by default, a boolean like the other flags."""

from __future__ import annotations

import pytest

from duplex_actors.cli import build_parser
from duplex_actors.config import ConfigError, ServerConfig


def test_env_sets_the_engine_process():
    assert ServerConfig().engine_process is False
    assert ServerConfig.from_env({}).engine_process is False
    assert ServerConfig.from_env({"DUPLEX_ENGINE_PROCESS": "1"}).engine_process is True
    assert ServerConfig.from_env({"DUPLEX_ENGINE_PROCESS": "off"}).engine_process is False
    with pytest.raises(ConfigError, match="DUPLEX_ENGINE_PROCESS='maybe'"):
        ServerConfig.from_env({"DUPLEX_ENGINE_PROCESS": "maybe"})


def test_serve_flag():
    parser = build_parser()
    assert parser.parse_args(["serve"]).engine_process is False
    assert parser.parse_args(["serve", "--engine-process"]).engine_process is True
