"""The stand-in engine (``--model standin:STEP_MS``): a benchmark tool with the engine's interface."""

from __future__ import annotations

import time

import numpy as np
import pytest

from duplex_actors.model.errors import CheckpointError
from duplex_actors.model.factory import open_served_engine
from duplex_actors.model.standin import StandInEngine, parse_standin


def test_its_step_waits_its_time_and_returns_silence_for_every_slot_given() -> None:
    engine = open_served_engine("standin:30", slots=4)
    assert isinstance(engine, StandInEngine) and engine.slots == 4
    prompt = engine.family.session_prompt(voice="NATF2.pt", persona="x")
    engine.prepare(prompt)
    engine.reset(2, prompt)
    frames = {0: np.ones(1920, np.float32), 2: np.ones(1920, np.float32)}
    started = time.perf_counter()
    out = engine.step(frames)
    assert time.perf_counter() - started >= 0.03
    assert sorted(out) == [0, 2]
    assert all(o.ready and not o.pcm.any() and o.text_piece == "" for o in out.values())
    assert engine.describe().engine["standin_step_ms"] == 30


@pytest.mark.parametrize("bad", ["standin:", "standin:abc", "standin:-1", "standin:1e9"])
def test_a_malformed_spec_names_the_form(bad: str) -> None:
    with pytest.raises(CheckpointError, match="standin:STEP_MS"):
        parse_standin(bad)
