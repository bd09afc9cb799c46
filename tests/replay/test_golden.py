"""The golden corpus in replay/: every log reproduces at logic and model level, digests match."""

from __future__ import annotations

import json
from pathlib import Path

from duplex_actors.replay.golden import EXPECTED, SCENARIOS, check

CORPUS = Path(__file__).resolve().parents[2] / "replay"


def test_corpus_lists_every_scenario():
    expected = json.loads((CORPUS / EXPECTED).read_text())
    assert sorted(expected) == sorted(f"sess_golden-{s.name}.dlog" for s in SCENARIOS)
    assert all((CORPUS / name).is_file() for name in expected)


def test_golden_logs_replay_identically_at_logic_and_model_level(tiny_dir, parrot_dir):
    assert check(CORPUS) == []
