"""The pinned-prefix attention at the tensor level, against a reference and against moshi's ring.

One moshi ``StreamingMultiheadAttention`` (RoPE, context C = 16) with random weights streams a
batch of 5 rows for 90 ticks, with pins 5, 9, 0, 3 and 15 (a one-column ring), two rows reset
mid-run and two rows exec-masked on some ticks. Every executed row-step is compared with the
same weights run without streaming state over that row's window: its whole history while
t < C, else [x_0 .. x_{P-1}] + [x_{t-R+1} .. x_t] (R = C - P), at positions 0 .. C-1, which
are the distances the pinned attention uses. A row with pin 0, and every row before it first
wraps, must equal moshi's own ring (a second copy of the layer, unpatched) bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch

from duplex_actors.model import pinned_context
from duplex_actors.model.pinned_context import KERNEL_EXPLICIT, PinnedPrefix, pin_attention, write_index

EMBED, HEADS, CONTEXT = 64, 4, 16
PINS = (5, 9, 0, 3, 15)
TICKS = 90
RESETS = {(1, 40), (3, 55)}  # (row, tick)


def _attention():
    from moshi.modules.rope import RotaryEmbedding
    from moshi.modules.transformer import StreamingMultiheadAttention

    torch.manual_seed(0)
    attn = StreamingMultiheadAttention(
        EMBED, HEADS, causal=True, context=CONTEXT, rope=RotaryEmbedding(True), dtype=torch.float32
    )
    for param in attn.parameters():
        torch.nn.init.normal_(param, std=0.1)
    return attn


def _window(history: list[torch.Tensor], t: int, pin: int) -> torch.Tensor:
    if t < CONTEXT:
        rows = history[: t + 1]
    else:
        rows = history[:pin] + history[t - (CONTEXT - pin) + 1 : t + 1]
    return torch.stack(rows)[None]


@torch.no_grad()
def _run(kernel: str | None = None, static: bool | None = None) -> dict[str, float | int]:
    """Stream the schedule; return the largest error against the reference and what was seen."""
    attn = _attention()
    stock = copy.deepcopy(attn)
    reference = copy.deepcopy(attn)
    batch = len(PINS)
    pins = PinnedPrefix(batch, CONTEXT, max(PINS), torch.device("cpu"), kernel, static)
    pin_attention(attn, pins)
    attn.streaming_forever(batch)
    stock.streaming_forever(batch)
    histories: list[list[torch.Tensor]] = [[] for _ in PINS]
    gen = torch.Generator().manual_seed(1)
    worst, scale, compared, wrapped, identical, differing = 0.0, 0.0, 0, 0, 0, 0
    for tick in range(TICKS):
        resets = [row for row in range(batch) if (row, tick) in RESETS]
        if resets:
            mask = torch.zeros(batch, dtype=torch.bool)
            mask[resets] = True
            attn.reset_streaming(mask)
            stock.reset_streaming(mask)
            for row in resets:
                histories[row] = []
                pins.set(row, 0)
        for row, pin in enumerate(PINS):
            if len(histories[row]) == 2 * row:  # a pin may be set at any time before C
                pins.set(row, pin)
        executed = torch.ones(batch, dtype=torch.bool)
        executed[2] = tick % 7 != 3
        executed[4] = tick % 5 != 1
        x = torch.randn(batch, 1, EMBED, generator=gen)
        attn.set_exec_mask(executed)
        stock.set_exec_mask(executed)
        got = attn(x, x, x)
        moshi = stock(x, x, x)
        for row, pin in enumerate(PINS):
            if not executed[row]:
                continue
            histories[row].append(x[row, 0])
            t = len(histories[row]) - 1
            window = _window(histories[row], t, pin)
            expected = reference(window, window, window)[0, -1]
            worst = max(worst, float((expected - got[row, 0]).abs().max()))
            scale = max(scale, float(expected.abs().max()))
            compared += 1
            wrapped += t >= CONTEXT
            if t < CONTEXT or pin == 0:
                identical += 1
                differing += not torch.equal(got[row], moshi[row])
    return {
        "worst": worst,
        "scale": scale,
        "compared": compared,
        "wrapped": wrapped,
        "identical": identical,
        "differing": differing,
    }


def test_pinned_attention_equals_the_window_reference_and_moshi_before_the_wrap():
    seen = _run()
    assert seen["compared"] > 400 and seen["wrapped"] > 300, seen
    assert seen["identical"] > 150 and seen["differing"] == 0, seen  # moshi's ring, bit for bit
    assert seen["worst"] < 1e-5 * max(1.0, seen["scale"]), seen


@pytest.mark.parametrize("kernel", [None, KERNEL_EXPLICIT])
def test_the_graph_safe_path_equals_the_window_reference(kernel):
    """As run off CPU: the pinned part always over the full width, nothing skipped on a host
    read; with the CPU kernel (then still moshi's ring bit for bit before the wrap) and with the
    explicit one used on GPU (products and softmax spelled out: equal within rounding)."""
    seen = _run(kernel, static=True)
    assert seen["worst"] < 1e-5 * max(1.0, seen["scale"]), seen
    if kernel is None:
        assert seen["differing"] == 0, seen


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(lambda offset, context: offset, id="prompt-at-absolute-positions"),
        pytest.param(lambda offset, context: torch.clamp(offset, max=context), id="clamped-at-C"),
    ],
)
def test_the_reference_catches_wrong_positions(monkeypatch, mutant):
    """The comparison is sensitive to the pinned columns' positions: mutants fail it by far."""
    monkeypatch.setattr(pinned_context, "pinned_query_position", mutant)
    seen = _run()
    assert seen["differing"] == 0, seen  # before the wrap the pinned query is not used
    assert seen["worst"] > 1e-3, seen


def test_write_index_keeps_the_prefix_and_rings_the_rest():
    context = 8
    positions = torch.arange(40)
    for pin in (0, 3, 7):
        columns = write_index(positions, torch.full_like(positions, pin), context).tolist()
        assert columns[:context] == list(range(context))  # below C: the column is the position
        assert all(c == p for p, c in enumerate(columns) if p < pin)  # the prefix never moves
        ring = [c for p, c in enumerate(columns) if p >= pin]
        assert set(ring) == set(range(pin, context))
        # Each ring column is written once per lap of C - pin positions.
        assert all(ring[i] == ring[i + context - pin] for i in range(len(ring) - (context - pin)))


def test_pins_are_bounded_by_the_width():
    pins = PinnedPrefix(2, CONTEXT, 4, torch.device("cpu"))
    pins.set(1, 4)
    assert pins.get(1) == 4
    with pytest.raises(ValueError):
        pins.set(0, 5)
    with pytest.raises(ValueError):
        PinnedPrefix(2, CONTEXT, CONTEXT, torch.device("cpu"))
