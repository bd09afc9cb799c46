"""Sessions longer than the context, at the engine level: ``context_policy="pin-prompt"``.

The tiny checkpoint with a context of C = 96 positions, four slots and burst prefill (so that
every prompt position runs in the batch; steps go straight to the LM, see ``_run``): staggered
starts, a slot that idles on most ticks,
one closed and reopened with another persona, a slot with no prompt (pin 0) among wrapped
ones, and over 4C steps for the longest session. Hooks on the temporal transformer's layers
record every executed row's input and output by position; each output must equal moshi's
layer run without streaming state over the window of that layer's recorded inputs (the prompt,
then the last C - P positions: the streaming recurrence, layer by layer), and, until a slot
first wraps, the output of the same schedule on moshi's ring bit for bit.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any

import pytest
import torch

from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.engine import SessionPrompt
from duplex_actors.model.errors import InvalidRuntimeConfig
from duplex_actors.model.loading import load_checkpoint

from .conftest import SHORT_CONTEXT
from .helpers import engine

C = SHORT_CONTEXT
PIN_MAX = 85  # the tiny tokenizer spells a persona out: its default one takes 81 positions
TICKS = 320  # slot 0 reaches position 69 + 320 > 4C
RING_TICKS = 70  # by then slots 0, 1 and 3 have wrapped

LONGEST = SessionPrompt(voice="NATF2.pt", persona="You are a patient tutor. You sell bicycles on Monday.")
HI = SessionPrompt(voice="NATM1.pt", persona="Hi")
TUTOR = SessionPrompt(voice="NATF0.pt", persona="You are a patient tutor.")
BICYCLES = SessionPrompt(voice="NATF2.pt", persona="You sell bicycles.")
BICYCLES_M = SessionPrompt(voice="NATM1.pt", persona="You sell bicycles.")
STARTS = {0: (0, LONGEST), 5: (2, TUTOR), 12: (1, HI), 20: (3, BICYCLES), 140: (3, BICYCLES_M)}


def _schedule(tick: int) -> tuple[dict[int, SessionPrompt | None], list[int]]:
    """The resets (slot -> prompt, None: no prompt) and the slots stepped at ``tick``."""
    resets: dict[int, SessionPrompt | None] = {}
    if tick in STARTS:
        slot, prompt = STARTS[tick]
        resets[slot] = prompt
    if tick == 120:
        resets[3] = None  # closed; idle until reopened with another persona
    if tick == 200:
        resets[2] = None  # from here on a slot with no prompt: pin 0 among wrapped pins
    stepped = [0]
    if tick >= 12:
        stepped.append(1)
    if (5 <= tick < 200 and tick % 3 == 1) or tick >= 200:
        stepped.append(2)  # idle on two ticks of three until its reset
    if 20 <= tick < 120 or tick >= 140:
        stepped.append(3)
    return resets, stepped


class LayerRecorder:
    """Each temporal layer's input and output per executed row, one list per row and epoch
    (a slot's positions start at 0 again after a reset), with the row's pin at each position."""

    def __init__(self, eng: Any) -> None:
        self.runner = eng._runner
        self.epochs: dict[tuple[int, int], list[dict[str, list[Any]]]] = defaultdict(list)
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for index, layer in enumerate(self.runner.lm.transformer.layers):
            layer.register_forward_pre_hook(partial(self._before, index))
            layer.register_forward_hook(partial(self._after, index))

    def _before(self, index: int, layer: Any, args: tuple[Any, ...]) -> None:
        state = layer.self_attn._streaming_state
        self._pending[index] = (state.offset.clone(), state.exec_mask.clone())

    def _after(self, index: int, layer: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
        offset, executed = self._pending.pop(index)
        pins = self.runner.pins
        for row in executed.nonzero().flatten().tolist():
            position = int(offset[row])
            epochs = self.epochs[(row, index)]
            if position == 0:
                epochs.append({"inputs": [], "outputs": [], "pins": []})
            epoch = epochs[-1]
            assert len(epoch["inputs"]) == position
            epoch["inputs"].append(args[0][row, 0].clone())
            epoch["outputs"].append(output[row, 0].clone())
            epoch["pins"].append(pins.get(row) if pins is not None else 0)


def _run(eng: Any, ticks: int) -> tuple[LayerRecorder, dict[tuple[int, int], tuple[int, list[int]]]]:
    """Run the schedule: resets through the engine (prompts prefilled in the batch), steps
    straight into its LM with random user codes and agent codes forced (the temporal
    transformer is what pinning changes; Mimi and the depformer would only cost time). Return
    the recorder and each step's (position, tokens out) by (slot, tick)."""
    recorder = LayerRecorder(eng)
    runner = eng._runner
    state = runner.lm.transformer.layers[0].self_attn._streaming_state
    gen = torch.Generator().manual_seed(5)
    outputs: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for tick in range(ticks):
        resets, stepped = _schedule(tick)
        for slot, prompt in resets.items():
            eng.reset(slot, prompt)
        user = torch.randint(0, 2048, (4, 8, 1), generator=gen)
        agent = torch.randint(0, 2048, (4, 8, 1), generator=gen)
        executed = torch.zeros(4, dtype=torch.bool)
        executed[stepped] = True
        positions = state.offset.tolist()
        out = runner.step(user, executed, agent)
        for slot in stepped:
            outputs[(slot, tick)] = (positions[slot], out[slot, :, 0].tolist())
    return recorder, outputs


def _reference_outputs(layer: Any, inputs: list[torch.Tensor], pins: list[int]) -> torch.Tensor:
    """moshi's layer without streaming state, at every position t of one row's epoch: over
    x_0 .. x_t while t < C (one causal pass over the first C inputs gives them all), else over
    the window [x_0 .. x_{P-1}] + [x_{t-R+1} .. x_t] (R = C - P), all windows in one batch."""
    rows = torch.stack(inputs)
    first = layer(rows[None, :C])[0]
    if len(inputs) <= C:
        return first
    windows = torch.stack(
        [torch.cat([rows[: pins[t]], rows[t - (C - pins[t]) + 1 : t + 1]]) for t in range(C, len(inputs))]
    )
    return torch.cat([first, layer(windows)[:, -1]])


@pytest.fixture(scope="module")
def pinned_run(tiny_short_dir):
    eng = engine(tiny_short_dir, 4, prefill="burst", context_policy="pin-prompt", pin_max=PIN_MAX)
    return _run(eng, TICKS)


@torch.no_grad()
def test_every_layer_output_equals_the_window_reference(tiny_short_dir, pinned_run):
    recorder, _ = pinned_run
    reference = load_checkpoint(checkpoint_from_dir(tiny_short_dir)).lm.transformer.layers
    worst, scale, compared, wrapped, longest = 0.0, 0.0, 0, 0, 0
    pins_seen: set[int] = set()
    for (_, index), epochs in recorder.epochs.items():
        for epoch in epochs:
            expected = _reference_outputs(reference[index], epoch["inputs"], epoch["pins"])
            got = torch.stack(epoch["outputs"])
            worst = max(worst, float((expected - got).abs().max()))
            scale = max(scale, float(expected.abs().max()))
            longest = max(longest, len(got))
            compared += len(got)
            wrapped += max(0, len(got) - C)
            pins_seen.update(epoch["pins"][C:])
    assert longest > 4 * C, longest
    assert wrapped > 1000 and compared > 2000, (wrapped, compared)
    assert 0 in pins_seen and len(pins_seen) >= 4, pins_seen  # pin 0 and prompts of 3 lengths
    assert worst < 1e-4 * max(1.0, scale), (worst, scale)


@torch.no_grad()
def test_until_a_slot_wraps_it_is_moshis_ring_bit_for_bit(tiny_short_dir, pinned_run):
    pinned, pinned_outputs = pinned_run
    ring_engine = engine(tiny_short_dir, 4, prefill="burst")
    ring, ring_outputs = _run(ring_engine, RING_TICKS)
    compared = 0
    for key, epochs in ring.epochs.items():
        for epoch, ours in zip(epochs, pinned.epochs[key], strict=False):
            for t, theirs in enumerate(epoch["outputs"][:C]):
                assert torch.equal(ours["outputs"][t], theirs), (key, t)
                compared += 1
    assert compared > 4 * C, compared
    wrapped = [
        torch.equal(pinned.epochs[key][0]["outputs"][t], epoch[0]["outputs"][t])
        for key, epoch in ring.epochs.items()
        for t in range(C, len(epoch[0]["outputs"]))
    ]
    assert wrapped and not all(wrapped)  # past the wrap the two differ: the prompt is kept
    # And the tokens out (text; agent codes are forced here), for every step before the wrap.
    steps = 0
    for key, (position, theirs) in ring_outputs.items():
        if position < C:
            assert pinned_outputs[key][1] == theirs, key
            steps += 1
    assert steps > 100, steps


def test_pinned_prompts_are_capped(tiny_dir):
    """When pinning, a prompt over the pin cap is refused (moshi's ring takes it), and an engine
    whose default prompt would not fit its cap does not start (built-in tiny: C = 250)."""
    long = SessionPrompt(
        voice="NATF2.pt", persona="You are a patient tutor. You sell bicycles on Monday. " * 2
    )
    engine(tiny_dir, 1).family.check_context(long)  # 99 positions: within 3/4 of 250
    pinned = engine(tiny_dir, 1, context_policy="pin-prompt", pin_max=90)
    with pytest.raises(InvalidRuntimeConfig, match=r"takes 99 .* \(at most 90, the cap of a pinned prompt\)"):
        pinned.family.check_context(long)
    with pytest.raises(InvalidRuntimeConfig, match="the cap of a pinned prompt"):
        pinned.reset(0, long)
    with pytest.raises(ValueError, match=r"the default prompt .* takes 81 positions, more than .* cap of 62"):
        engine(tiny_dir, 1, context_policy="pin-prompt")  # the default cap: 250 // 4
    moshi = engine(tiny_dir, 1, family="moshi", context_policy="pin-prompt")  # no prompt to pin
    assert moshi.describe().engine["pin_max"] == 62
