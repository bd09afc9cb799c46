"""Slot isolation, reset-equals-fresh and snapshot-equals-computed prefill (greedy decoding).

A session's text tokens and audio codes must be identical (output PCM within 1e-5) whether it
runs alone in slot 0 or in any slot of a batch of the same width while other slots join, reset,
pause and leave at random ticks. Across widths they need not be: the CPU kernels are chosen by
batch width and differ in the last bits, which can flip a code at a near-tie (so a model replay
runs at the width the session was served at; ``test_widths_differ_only_in_the_last_bits``).
With pinned prompts (``context_policy="pin-prompt"``) on a short context the sessions run past
it, so wrapped rows, rows before their wrap and rows being reset share the batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex_actors.model.engine import SessionPrompt

from .helpers import Session, engine, first_divergence, run_alone, session_audio

FRAMES = 10
POOL = [
    Session(SessionPrompt(voice="NATF2.pt", persona="You are a patient tutor."), session_audio(1, FRAMES)),
    Session(SessionPrompt(voice="NATM1.pt", persona="You sell bicycles."), session_audio(2, FRAMES)),
    Session(SessionPrompt(voice="NATF2.pt", persona="You sell bicycles."), session_audio(3, FRAMES)),
    Session(SessionPrompt(voice="NATM1.pt", persona="You are a patient tutor."), session_audio(4, FRAMES)),
]


@pytest.fixture(scope="module")
def references(tiny_dir):
    """Each pool session alone in slot 0, per batch width."""
    cache: dict[int, list] = {}

    def at(width: int) -> list:
        if width not in cache:
            alone = engine(tiny_dir, width)
            cache[width] = [run_alone(alone, s) for s in POOL]
        return cache[width]

    return at


@pytest.fixture(scope="module")
def batch8(tiny_dir):
    return engine(tiny_dir, 8)


@st.composite
def schedules(draw, *, width: int = 8, sessions: int = len(POOL), noise_slots: int = 2, span: int = 20):
    """Where and when ``sessions`` pool sessions join and pause, and ``noise_slots`` slots of
    noise join, reset and leave, over about ``span`` ticks."""
    slots = draw(st.permutations(range(width)))
    plan = []
    for i in range(sessions):
        plan.append(
            {
                "slot": slots[i],
                "join": draw(st.integers(0, 5)),
                "pauses": draw(st.sets(st.integers(0, span), max_size=4)),
            }
        )
    noise = []
    for j in range(noise_slots):
        join = draw(st.integers(0, 6))
        noise.append(
            {
                "slot": slots[sessions + j],
                "join": join,
                "resets": draw(st.sets(st.integers(join + 1, span), max_size=2)),
                "leave": draw(st.integers(join, span + 2)),
                "pauses": draw(st.sets(st.integers(0, span), max_size=3)),
            }
        )
    return plan, noise


def _run_schedule(eng, pool: list[Session], frames_each: int, schedule) -> list[list]:
    plan, noise = schedule
    rs = np.random.RandomState(0)
    outputs: list[list] = [[] for _ in plan]
    tick = 0
    while any(len(out) < frames_each for out in outputs):
        assert tick < frames_each + 50, "schedule did not finish"
        frames = {}
        for i, p in enumerate(plan):
            if tick == p["join"]:
                eng.reset(p["slot"], pool[i].prompt)
            if tick >= p["join"] and len(outputs[i]) < frames_each and tick not in p["pauses"]:
                frames[p["slot"]] = pool[i].frames[len(outputs[i])]
        for n in noise:
            if tick == n["join"] or tick in n["resets"]:
                eng.reset(n["slot"], pool[(tick + n["slot"]) % len(pool)].prompt)
            if n["join"] <= tick < n["leave"] and tick not in n["pauses"]:
                frames[n["slot"]] = (rs.randn(1920) * 0.3).astype(np.float32)
        result = eng.step(frames)
        for i, p in enumerate(plan):
            if p["slot"] in frames and len(outputs[i]) < frames_each and tick >= p["join"]:
                outputs[i].append(result[p["slot"]])
        tick += 1
    return outputs


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules())
def test_slot_isolation_in_a_changing_batch(references, batch8, schedule):
    outputs = _run_schedule(batch8, POOL, FRAMES, schedule)
    for i, (ref, got) in enumerate(zip(references(8), outputs, strict=True)):
        where = first_divergence(ref, got)
        assert where is None, f"session {i} in slot {schedule[0][i]['slot']}: {where}"


# Pinned prompts on the 96-position context: prompts of 53 and 48 positions, so these sessions
# run past their first wrap (by 9 and 4 positions) while others join, pause, reset and leave.
PINNED_FRAMES = 52
PINNED_WIDTH = 4
PINNED_POOL = [Session(s.prompt, session_audio(10 + i, PINNED_FRAMES)) for i, s in enumerate(POOL[:2])]


@pytest.fixture(scope="module")
def pinned_batch(tiny_short_dir):
    return engine(tiny_short_dir, PINNED_WIDTH, context_policy="pin-prompt", pin_max=85)


@pytest.fixture(scope="module")
def pinned_references(tiny_short_dir):
    alone = engine(tiny_short_dir, PINNED_WIDTH, context_policy="pin-prompt", pin_max=85)
    return [run_alone(alone, s) for s in PINNED_POOL]


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules(width=PINNED_WIDTH, sessions=len(PINNED_POOL), noise_slots=1, span=PINNED_FRAMES))
def test_slot_isolation_with_pinned_prompts_past_the_context(pinned_references, pinned_batch, schedule):
    outputs = _run_schedule(pinned_batch, PINNED_POOL, PINNED_FRAMES, schedule)
    for i, (ref, got) in enumerate(zip(pinned_references, outputs, strict=True)):
        where = first_divergence(ref, got)
        assert where is None, f"session {i} in slot {schedule[0][i]['slot']}: {where}"


def test_reset_equals_fresh(tiny_dir, references):
    """After reset, a slot reproduces a fresh engine's outputs, while its neighbour keeps running."""
    eng = engine(tiny_dir, 2)
    eng.reset(0, POOL[1].prompt)
    eng.reset(1, POOL[2].prompt)
    for f0, f1 in zip(POOL[1].frames[:6], POOL[2].frames[:6], strict=True):
        eng.step({0: f0, 1: f1})
    # New epoch in slot 0 with another session; slot 1 goes on.
    eng.reset(0, POOL[0].prompt)
    got = []
    for i, frame in enumerate(POOL[0].frames):
        frames = {0: frame}
        if i % 3:
            frames[1] = POOL[2].frames[(6 + i) % FRAMES]
        got.append(eng.step(frames)[0])
    assert first_divergence(references(2)[0], got) is None, first_divergence(references(2)[0], got)


def test_snapshot_paste_equals_computed_prefill(tiny_dir):
    """A prompt pasted from the snapshot cache equals the prompt run step by step in the batch."""
    snap = engine(tiny_dir, 3, prefill="snapshot")
    burst = engine(tiny_dir, 3, prefill="burst")
    session = POOL[3]
    other = POOL[0]
    # The burst engine computes the prefill in slot 2 while slot 0 is mid-conversation.
    burst.reset(0, other.prompt)
    for frame in other.frames[:4]:
        burst.step({0: frame})
    burst.reset(2, session.prompt)
    snap.reset(1, session.prompt)
    got_burst = [burst.step({2: f, 0: other.frames[4]})[2] for f in session.frames]
    got_snap = [snap.step({1: f})[1] for f in session.frames]
    where = first_divergence(got_burst, got_snap)
    assert where is None, where
    assert snap.stats.prefill_snapshot_misses == 1
    snap.reset(0, session.prompt)
    assert snap.stats.prefill_snapshot_hits == 1


def test_snapshot_cache_is_bounded(tiny_dir):
    eng = engine(tiny_dir, 1)
    eng._snapshot_cache_size = 2
    for persona in ("one", "two", "three"):
        eng.reset(0, SessionPrompt(voice="NATF2.pt", persona=persona))
    assert len(eng._snapshots) == 2
    eng.reset(0, SessionPrompt(voice="NATF2.pt", persona="one"))  # evicted: computed again
    assert eng.stats.prefill_snapshot_misses == 4


def test_exec_masked_slot_does_not_advance(tiny_dir, references):
    """A slot that sends nothing for many ticks continues exactly where it stopped."""
    eng = engine(tiny_dir, 2)
    eng.reset(0, POOL[0].prompt)
    eng.reset(1, POOL[1].prompt)
    got = [eng.step({0: POOL[0].frames[0]})[0]]
    for frame in POOL[1].frames:
        eng.step({1: frame})
    got += [eng.step({0: f})[0] for f in POOL[0].frames[1:]]
    assert first_divergence(references(2)[0], got) is None


def _latents_of(eng, session: Session, slot: int, neighbours: np.random.RandomState) -> list:
    """The Mimi latents (the residual quantizer's input) of ``session`` run in ``slot``, while
    the other slots get noise on random ticks."""
    quantizer = eng._mimi.quantizer
    seen = []
    encode = quantizer.encode

    def spy(x):
        seen.append(x[slot].clone())
        return encode(x)

    quantizer.encode = spy
    try:
        eng.reset(slot, session.prompt)
        for frame in session.frames:
            frames = {slot: frame}
            for other in range(eng.slots):
                if other != slot and neighbours.rand() < 0.5:
                    frames[other] = (neighbours.randn(1920) * 0.3).astype(np.float32)
            eng.step(frames)
    finally:
        del quantizer.encode
    return seen


def test_widths_differ_only_in_the_last_bits(tiny_dir):
    """What a model replay relies on: at one batch width a session's latents are bit-identical
    in any slot, whatever its neighbours send; across widths they are only close."""
    import torch

    session = POOL[1]
    rs = np.random.RandomState(7)
    two_a, two_b, one = engine(tiny_dir, 2), engine(tiny_dir, 2), engine(tiny_dir, 1)
    first = _latents_of(two_a, session, 0, rs)
    second = _latents_of(two_b, session, 1, rs)
    alone = _latents_of(one, session, 0, rs)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert max(float((a - b).abs().max()) for a, b in zip(first, alone, strict=True)) < 1e-4
