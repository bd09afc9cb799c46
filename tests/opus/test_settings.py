"""The codec pool's size: the serve flag, the environment, the default."""

from __future__ import annotations

import pytest

from duplex_actors.cli import build_parser
from duplex_actors.config import ConfigError, ServerConfig


def test_env_and_flag():
    assert ServerConfig.from_env({}).opus_workers is None  # the machine's default, chosen at start
    assert ServerConfig.from_env({"DUPLEX_OPUS_WORKERS": "3"}).opus_workers == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError, match="DUPLEX_OPUS_WORKERS"):
            ServerConfig.from_env({"DUPLEX_OPUS_WORKERS": bad})
    with pytest.raises(ConfigError, match="at least 1"):
        ServerConfig(opus_workers=0)
    args = build_parser().parse_args(["serve", "--opus-workers", "2"])
    assert args.opus_workers == 2
    assert build_parser().parse_args(["serve"]).opus_workers is None
