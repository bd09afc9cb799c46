"""The aligner (session/alignment.py, sans-io): table tests and hypothesis over arrival traces.

``drive`` plays one session's appends through an ``Aligner`` as the session actor would: a
client sending ``chunk`` samples in real time from ``start`` over a link adding ``delays[j]``
to chunk j (in order, as one TCP stream), a core whose partial tail it tracks, server pads
inserted before the append they precede, and a client that applies hints (its next chunk
``pad_ms`` early with ``80 - pad_ms`` ms of audio) when ``obey`` is true. It records when every
80 ms frame completes, so the tests can check where frames land relative to the ticks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_actors.session.alignment import (
    FRAME,
    RATE,
    Aligner,
    ClientHint,
    Grid,
    ServerPad,
)

GRID = Grid(origin=0.050)
PERIOD = GRID.period


@attrs.define
class Run:
    decisions: list[tuple[int, ServerPad | ClientHint]] = attrs.field(factory=list)  # (append, what)
    completions: list[float] = attrs.field(factory=list)  # when each frame completed
    first_aligned: int | None = None  # index in completions of the first frame after the last pad


def drive(
    aligner: Aligner,
    *,
    chunk: int,
    start: float,
    delays: Sequence[float],
    grid: Grid | None = GRID,
    obey: bool = True,
    clear_at: int | None = None,
    held: frozenset[int] = frozenset(),
) -> Run:
    """``held``: chunks whose frame's tick the scheduler held (most sessions late together)."""
    run = Run()
    tail = 0
    sent = 0  # client samples sent
    last = 0.0
    hint: int | None = None
    for j, delay in enumerate(delays):
        if clear_at is not None and j == clear_at:
            aligner.cleared()
            tail = 0
        size, pad = chunk, 0
        if hint is not None and chunk == FRAME:
            pad, size, hint = hint * 24, FRAME - hint * 24, None
            aligner.client_padded(pad)
        sent += size
        now = last = max(last, start + sent / RATE + delay)
        if j in held and grid is not None:
            grid = attrs.evolve(grid, held=grid.held | {grid.tick_at_or_after(start + sent / RATE)})
        decision = aligner.before_append(now, grid, size, tail)
        if isinstance(decision, ServerPad):
            pad += decision.samples
        if decision is not None:
            run.decisions.append((j, decision))
        if isinstance(decision, ClientHint) and obey:
            hint = decision.pad_ms
        tail += pad + size
        while tail >= FRAME:
            tail -= FRAME
            run.completions.append(now)
        if pad:
            run.first_aligned = len(run.completions)
    return run


def before_tick(t: float, grid: Grid = GRID) -> float:
    """How long before the next tick (at or after t) ``t`` is, in ms."""
    n = math.ceil((t - grid.origin) / grid.period - 1e-9)
    return (grid.origin + n * grid.period - t) * 1000


def steady(n: int, delay: float = 0.0) -> list[float]:
    return [delay] * n


# -- table tests --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("chunk", "start_ms", "mode", "expect"),
    [
        # 20 ms chunks: a pad of whole chunks, the smallest that leaves >= 3 ms before the tick
        (480, 0.0, "server", ServerPad),
        (240, 20.0, "server", ServerPad),
        (960, 61.0, "client", ServerPad),  # "client" pads short chunks too
        (1920, 25.0, "client", ClientHint),
        (1920, 25.0, "server", None),  # 80 ms chunks are never padded by the server
        (720, 25.0, "client", None),  # 30 ms: does not divide 80
        (2400, 25.0, "client", None),  # 100 ms
        (480, 25.0, "off", None),
    ],
)
def test_what_each_chunk_size_gets(chunk: int, start_ms: float, mode: str, expect: type | None) -> None:
    run = drive(Aligner(mode=mode), chunk=chunk, start=start_ms / 1000, delays=steady(200))
    kinds = {type(d) for _, d in run.decisions}
    assert kinds == ({expect} if expect else set())
    if expect is not None:
        assert [d.reason for _, d in run.decisions] == ["start"]  # once, jitter-free


def test_server_pad_lands_frames_a_margin_before_the_tick() -> None:
    # Frames of this session complete 30 ms after a tick (start 0 + 80 ms = 80 ms; ticks at 50 +
    # 80n): it needs them 6 ms (the first margin) before one, i.e. 36 ms earlier: two 20 ms
    # chunks (40 ms).
    aligner = Aligner()
    run = drive(aligner, chunk=480, start=0.0, delays=steady(100))
    assert [(j, d) for j, d in run.decisions] == [(0, ServerPad(960, "start"))]  # before the first frame
    assert run.first_aligned is not None
    waits = {round(before_tick(t), 6) for t in run.completions[run.first_aligned :]}
    assert waits == {10.0}  # in [6, 6 + 20]: the 20 ms granule
    assert aligner.total_pad_samples == 960 and aligner.margin_ms == 3.0


def test_client_hint_lands_frames_a_margin_before_the_tick() -> None:
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=steady(100))
    # complete 50.5 ms after a tick: 50.5 + 6 (the first margin, a guess) = 56.5 -> 57 ms early
    assert [d for _, d in run.decisions] == [ClientHint(57, "start")]
    assert run.first_aligned is not None
    waits = [before_tick(t) for t in run.completions[run.first_aligned :]]
    assert all(6.0 - 1e-6 <= w <= 7.0 + 1e-6 for w in waits), waits
    # the margin adapted to 3 ms; 3 ms earlier than needed is not worth a pad of 77 ms
    assert aligner.total_pad_samples == 57 * 24 and aligner.margin_ms == 3.0


def test_ignored_hint_is_repeated_once_per_recheck() -> None:
    aligner = Aligner(mode="client", recheck_s=4.0)
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=steady(250), obey=False)  # 20 s
    hints = [(j, d) for j, d in run.decisions]
    assert [d for _, d in hints] == [ClientHint(57, "start")] + [ClientHint(54, "start")] * (len(hints) - 1)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(hints)]
    assert len(hints) >= 4 and all(g * 0.080 >= 4.0 - 1e-9 for g in gaps), gaps
    assert aligner.total_pad_samples == 0


def test_no_grid_measures_but_does_not_pad_until_there_is_one() -> None:
    aligner = Aligner()
    assert drive(aligner, chunk=480, start=0.0, delays=steady(40), grid=None).decisions == []
    run = drive(aligner, chunk=480, start=0.0, delays=steady(40))
    assert len(run.decisions) == 1 and run.decisions[0][1].reason == "start"


@pytest.mark.parametrize("clear_at", [49, 51, 53])
def test_clear_realigns_with_reason_clear(clear_at: int) -> None:
    # The clear drops the core's partial tail (1-3 chunks here): frames complete later after it.
    aligner = Aligner()
    run = drive(aligner, chunk=480, start=0.0, delays=steady(150), clear_at=clear_at)
    assert [d.reason for _, d in run.decisions] == ["start", "clear"]
    assert run.decisions[1][0] == clear_at and run.first_aligned is not None
    waits = {round(before_tick(t), 6) for t in run.completions[run.first_aligned :]}
    assert waits == {10.0}


def test_drift_realigns() -> None:
    # The path's delay grows by 30 ms at 6 s (a route change): frames miss their ticks until
    # the next check moves the anchor and pads them back in front of the tick.
    delays = [0.0] * 52 + [0.030] * 200  # the step starts a check window (rechecks at 51, 102)
    aligner = Aligner(mode="client", first_recheck_s=4.0)
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert [d.reason for _, d in run.decisions] == ["start", "drift"]
    tail = [before_tick(t) for t in run.completions[-50:]]
    assert all(3.0 - 1e-6 <= w <= 4.0 + 1e-6 for w in tail), tail


def test_margin_follows_the_lateness() -> None:
    # 10 ms of jitter on every other chunk from 4 s on: p95 = 10 -> margin 12 ms, re-aligned.
    delays = [0.0] * 60 + [0.010 * (j % 2) for j in range(300)]
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert [d.reason for _, d in run.decisions] == ["start", "margin"]
    assert aligner.margin_ms == pytest.approx(12.0)
    on_time = [before_tick(t) for t in run.completions[-100:] if before_tick(t) > 1.0]
    assert min(on_time) >= 1.9  # the late ones complete >= 2 ms before the tick, the rest 12-13


def test_a_stall_beyond_the_margin_cap_does_not_raise_the_margin() -> None:
    delays = [0.0] * 100
    for j in range(60, 63):  # a 240 ms stall: the held chunks arrive with the next one
        delays[j] = 0.240 - (j - 60) * 0.080
    aligner = Aligner(mode="client")
    drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert aligner.margin_ms == 3.0


def test_one_burst_of_late_frames_is_a_stall_and_keeps_the_margin() -> None:
    # Three consecutive frames 20 ms late at 4.1 s (under the 40 ms cap, e.g. the whole server
    # stalled) and three more at 4.6 s: the recheck at 5 s sees one burst and keeps the margin.
    # It releases and stalls again 0.5 s later: the same burst.
    delays = [0.0] * 100
    for j in (*range(51, 54), *range(57, 60)):
        delays[j] = 0.020
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert aligner.margin_ms == 3.0
    assert [d.reason for _, d in run.decisions] == ["start"]


def test_bursts_in_two_windows_raise_the_margin() -> None:
    # The same burst again in the next window (at 8 s): jitter, not a stall.
    delays = [0.0] * 140
    for j in (*range(57, 60), *range(100, 103)):
        delays[j] = 0.020
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert aligner.margin_ms == pytest.approx(22.0)
    assert [d.reason for _, d in run.decisions] == ["start", "margin"]


def test_lateness_of_a_tick_held_for_every_session_does_not_raise_the_margin() -> None:
    # The bursts above, but the scheduler held those ticks: most sessions' frames were late
    # together (a stall of the server, the host or the clients' process), which the held tick
    # absorbs; a margin raised for it would add its wait to every later frame of the session.
    delays = [0.0] * 140
    late = (*range(57, 60), *range(100, 103))
    for j in late:
        delays[j] = 0.020
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays, held=frozenset(late))
    assert aligner.margin_ms == 3.0
    assert [d.reason for _, d in run.decisions] == ["start"]
    # Held ticks elsewhere (other frames' stalls) do not excuse these frames' lateness.
    aligner = Aligner(mode="client")
    elsewhere = frozenset(j + 5 for j in late)
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays, held=elsewhere)
    assert aligner.margin_ms == pytest.approx(22.0)


def test_lateness_most_frames_share_is_the_sessions_phase_and_raises_the_margin_at_once() -> None:
    # From 2 s on every frame comes 8 ms late (the tail of the burst of aligned appends): not
    # a stall but where this session's frames arrive. The recheck at 5 s raises the margin to
    # 10 ms at once (a stall needs a burst in two windows), held ticks or not.
    delays = [0.0] * 25 + [0.008] * 45
    for held in (frozenset(), frozenset(range(25, 70))):
        aligner = Aligner(mode="client")
        run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays, held=held)
        assert aligner.margin_ms == pytest.approx(10.0), held
        assert [d.reason for _, d in run.decisions] == ["start", "margin"]


def test_a_long_stall_at_the_start_is_not_the_sessions_phase() -> None:
    # Frames 3-12 come 20 ms late (sessions starting together congest the server), then none:
    # the 1 s recheck sees late frames in most of its window, one stretch, and keeps the margin.
    delays = [0.0] * 3 + [0.020] * 10 + [0.0] * 60
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=0.0205, delays=delays)
    assert aligner.margin_ms == 3.0
    assert [d.reason for _, d in run.decisions] == ["start"]


def test_total_pad_is_bounded_then_unaligned() -> None:
    # A pause of 37 ms every ~4 s moves the phase each check: re-aligned each time until the
    # next pad would pass the bound; from then on nothing.
    delays = [0.037 * (j // 50) for j in range(2000)]
    aligner = Aligner(mode="server", max_total_pad_samples=4000)
    run = drive(aligner, chunk=480, start=0.0, delays=delays)
    assert aligner.exhausted and aligner.total_pad_samples <= 4000
    assert 2 <= len(run.decisions) < 9
    last = run.decisions[-1][0]
    assert last < 1500  # none after the bound was hit


def test_set_mode_off_then_on() -> None:
    aligner = Aligner(mode="off")
    assert drive(aligner, chunk=480, start=0.0, delays=steady(60)).decisions == []
    aligner.set_mode("server")
    run = drive(aligner, chunk=480, start=0.0, delays=steady(60))
    assert [d.reason for _, d in run.decisions] == ["start"]
    with pytest.raises(ValueError):
        aligner.set_mode("sometimes")


def test_irregular_chunks_are_not_padded() -> None:
    # The first append is taken as the chunk size (the pad goes in before the first frame
    # completes); once the sizes vary, nothing more.
    aligner = Aligner()
    sizes = [480, 480, 240, 960, 480] * 40
    tail, sent, decisions = 0, 0, []
    for size in sizes:
        sent += size
        decision = aligner.before_append(sent / RATE, GRID, size, tail)
        if decision is not None:
            decisions.append((sent, decision))
        tail = (tail + size + (decision.samples if isinstance(decision, ServerPad) else 0)) % FRAME
    assert [s for s, _ in decisions] in ([], [480])


# -- hypothesis ---------------------------------------------------------------------------------
PADDED_CHUNKS = (240, 480, 960)


@settings(max_examples=150, deadline=None)
@given(
    chunk=st.sampled_from((*PADDED_CHUNKS, FRAME)),
    start=st.floats(0.0, 0.2),
    delay=st.floats(0.0, 0.1),
    origin=st.floats(0.0, 0.08),
)
def test_jitter_free_frames_land_in_the_target_window(
    chunk: int, start: float, delay: float, origin: float
) -> None:
    """Once aligned, on a jitter-free trace, every frame completes in
    [tick - m - granule, tick - m] (m: the first margin; granule: the chunk, or 1 ms for a
    hint; a hint is skipped for a gain of up to hint_gain_ms), one alignment only, and its pad
    is under 80 ms."""
    grid = Grid(origin=origin)
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=chunk, start=start, delays=steady(150 * FRAME // chunk, delay), grid=grid)
    assert len(run.decisions) <= 1
    assert aligner.total_pad_samples < FRAME
    granule_ms = 1.0 if chunk == FRAME else chunk / 24
    assert aligner.margin_ms == 3.0  # adapted; the alignment was made with the first margin
    m = aligner.initial_margin_ms
    start_at = run.first_aligned if run.decisions else 4
    assert start_at is not None
    after = run.completions[start_at:]
    assert len(after) > 100
    # A hint is not worth a gain of hint_gain_ms or less (it costs a double): such a session
    # is left where it is, at most that much further before the tick.
    slack = aligner.hint_gain_ms if chunk == FRAME and not run.decisions else 0.0
    for t in after:
        w = before_tick(t, grid)
        assert m - 1e-5 <= w <= m + granule_ms + slack + 1e-5 or (w >= 80 - 1e-5 and m + granule_ms >= 80), w


@st.composite
def traces(draw: st.DrawFn) -> tuple[int, float, list[float], str, int]:
    chunk = draw(st.sampled_from((240, 480, 720, 960, 1920, 2400)))
    n = draw(st.integers(20, 400))
    base = draw(st.floats(0.0, 0.05))
    jitter = draw(st.lists(st.floats(0.0, 0.06), min_size=n, max_size=n))
    # late bursts and steps in the base delay (route changes, pauses)
    for _ in range(draw(st.integers(0, 4))):
        at, size = draw(st.integers(0, n - 1)), draw(st.floats(0.0, 0.4))
        for j in range(at, n):
            jitter[j] += size
    mode = draw(st.sampled_from(("server", "client", "off")))
    bound = draw(st.sampled_from((0, 480, 4000, 24_000)))
    return chunk, draw(st.floats(0.0, 0.1)), [base + x for x in jitter], mode, bound


@settings(max_examples=200, deadline=None)
@given(trace=traces(), obey=st.booleans())
def test_decisions_are_bounded_and_of_the_right_kind(
    trace: tuple[int, float, list[float], str, int], obey: bool
) -> None:
    chunk, start, delays, mode, bound = trace
    aligner = Aligner(mode=mode, max_total_pad_samples=bound)
    run = drive(aligner, chunk=chunk, start=start, delays=delays, obey=obey)
    assert aligner.total_pad_samples <= bound
    assert 3.0 <= aligner.margin_ms <= 40.0
    for _, d in run.decisions:
        assert mode != "off"
        if isinstance(d, ServerPad):
            assert chunk in PADDED_CHUNKS and 0 < d.samples < FRAME and d.samples % chunk == 0
        else:
            assert chunk == FRAME and mode == "client" and 1 <= d.pad_ms <= 79
        assert d.reason in ("start", "drift", "margin")
    # deterministic: the same calls give the same decisions
    again = drive(
        Aligner(mode=mode, max_total_pad_samples=bound), chunk=chunk, start=start, delays=delays, obey=obey
    )
    assert again.decisions == run.decisions


@pytest.mark.parametrize(
    ("start_ms", "hinted"),
    [
        # Ticks at 50 + 80n; 80 ms chunks from start_ms complete at start_ms + 80 (mod 80).
        (40.0, False),  # 10 ms before the tick, margin 6: a gain of 4 ms is not worth a double
        (33.0, False),  # 17 ms before: a gain of 11 ms minus the 1 ms granule, not worth one
        (32.0, True),  # 18 ms before: a gain of 12 ms
        (45.0, True),  # 5 ms before: under the margin, would miss a tick by jitter
        (55.0, True),  # 5 ms after the tick: waits 75 ms
    ],
)
def test_a_hint_only_for_a_gain_worth_its_double(start_ms: float, hinted: bool) -> None:
    # A hint always puts two frames in one tick (the chunk sent early lands beside the one
    # before it), which costs a catch-up step: a session a few ms early stays where it is.
    aligner = Aligner(mode="client")
    run = drive(aligner, chunk=FRAME, start=start_ms / 1000, delays=steady(40))
    assert [type(d) for _, d in run.decisions] == ([ClientHint] if hinted else [])


def test_the_burst_floor_raises_the_margin_frames_are_aligned_to_within_its_bound() -> None:
    from duplex_actors.session.alignment import Aligner

    aligner = Aligner(margin_max_ms=40.0)
    measured = aligner.margin_ms
    aligner.burst_floor_ms = measured + 10
    assert aligner.margin_ms == measured + 10
    aligner.burst_floor_ms = 500.0
    assert aligner.margin_ms == 40.0
    aligner.burst_floor_ms = 0.0
    assert aligner.margin_ms == measured
