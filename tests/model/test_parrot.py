"""The parrot model: every session gets back exactly its own codes, one frame late."""

from __future__ import annotations

import pytest

from duplex_actors.model.engine import SessionPrompt
from duplex_actors.model.parrot import PARROT_DELAY_FRAMES
from duplex_actors.model.personaplex import SINE_TOKENS

from .helpers import engine, session_audio


@pytest.mark.parametrize("family", ["personaplex", "moshi"])
def test_each_session_gets_its_own_codes_back_delayed(parrot_dir, family):
    eng = engine(parrot_dir, 4, family=family)
    sessions = {0: 21, 1: 22, 3: 23}
    prompts = {
        "personaplex": {
            0: SessionPrompt("NATF2.pt", "x"),
            1: SessionPrompt("NATM1.pt", "y"),
            3: SessionPrompt("NATF2.pt", "z"),
        },
        "moshi": {s: SessionPrompt() for s in sessions},
    }[family]
    audio = {s: session_audio(seed, 14) for s, seed in sessions.items()}
    for s in sessions:
        eng.reset(s, prompts[s])
    user: dict[int, list] = {s: [] for s in sessions}
    agent: dict[int, list] = {s: [] for s in sessions}
    for i in range(14):
        # Slot 1 pauses on every third tick: its stream simply waits.
        frames = {s: audio[s][len(user[s])] for s in sessions if not (s == 1 and i % 3 == 2)}
        for s, out in eng.step(frames).items():
            user[s].append(out.user_codes)
            agent[s].append(out.agent_codes)
    d = PARROT_DELAY_FRAMES
    # Plain Moshi never sees the first frame after a reset (it lands on start tokens).
    start = 0 if family == "personaplex" else 1
    for s in sessions:
        n = len(user[s])
        assert n >= 9
        for k in range(start, n - d):
            assert agent[s][k + d] == user[s][k], f"slot {s} frame {k + d}"
        others = [c for t in sessions if t != s for c in user[t]]
        distinct = sum(1 for c in user[s][2:] if c not in others)
        assert distinct >= n - 3, "test audio should give each session its own codes"
    if family == "personaplex":
        # The first output answers the prompt's last (sine) user frame.
        assert all(agent[s][0] == SINE_TOKENS for s in sessions)
    else:
        assert all(agent[s][0] == (-2,) * 8 for s in sessions)
