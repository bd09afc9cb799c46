"""``--frontends`` / ``DUPLEX_FRONTENDS``, and the engine core's address for front ends."""

from __future__ import annotations

from duplex_actors.cli import build_parser
from duplex_actors.config import ServerConfig
from duplex_actors.supervisor import default_frontends


def test_the_default_leaves_a_core_to_the_engine_and_takes_at_most_four():
    assert [default_frontends(cores) for cores in (1, 2, 3, 5, 16)] == [1, 1, 2, 4, 4]


def test_serve_flag():
    parser = build_parser()
    assert parser.parse_args(["serve"]).frontends is None
    assert parser.parse_args(["serve", "--frontends", "3"]).frontends == 3


def test_a_front_end_finds_its_core_in_the_environment():
    assert ServerConfig().engine_core is None
    assert ServerConfig.from_env({"DUPLEX_ENGINE_CORE": "\0x"}).engine_core == "\0x"
