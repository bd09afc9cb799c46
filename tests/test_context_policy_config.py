"""``--context-policy`` / ``DUPLEX_CONTEXT_POLICY`` and ``--max-pinned-prompt`` /
``DUPLEX_MAX_PINNED_PROMPT``: moshi's ring by default, the pin cap unset (a quarter of the
context), bad values refused naming their setting."""

from __future__ import annotations

import argparse

import pytest

from duplex_actors.cli import build_parser
from duplex_actors.config import ConfigError, ServerConfig


def test_env_sets_the_context_policy_and_the_pin_cap():
    assert (ServerConfig().context_policy, ServerConfig().max_pinned_prompt) == ("ring", None)
    assert ServerConfig.from_env({}).context_policy == "ring"
    config = ServerConfig.from_env({"DUPLEX_CONTEXT_POLICY": "pin-prompt", "DUPLEX_MAX_PINNED_PROMPT": "500"})
    assert (config.context_policy, config.max_pinned_prompt) == ("pin-prompt", 500)
    with pytest.raises(ConfigError, match="DUPLEX_CONTEXT_POLICY='pin-all'"):
        ServerConfig.from_env({"DUPLEX_CONTEXT_POLICY": "pin-all"})
    with pytest.raises(ConfigError, match="DUPLEX_MAX_PINNED_PROMPT='many'"):
        ServerConfig.from_env({"DUPLEX_MAX_PINNED_PROMPT": "many"})
    with pytest.raises(ConfigError, match="max_pinned_prompt=-1"):
        ServerConfig(max_pinned_prompt=-1)


def test_serve_flags():
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.context_policy, args.max_pinned_prompt) == (None, None)  # then the env, then ring
    args = parser.parse_args(["serve", "--context-policy", "pin-prompt", "--max-pinned-prompt", "750"])
    assert (args.context_policy, args.max_pinned_prompt) == ("pin-prompt", 750)
    with pytest.raises(argparse.ArgumentError, match="--context-policy 'sinks': expected one of ring"):
        parser.parse_args(["serve", "--context-policy", "sinks"])
