"""The tick policies as pure functions: table-driven decisions over hand-built views."""

from __future__ import annotations

import math

import attrs
import pytest

from duplex_actors.scheduler.policy import (
    DeadlinePolicy,
    GridPolicy,
    PolicyState,
    SchedulerView,
    SlotState,
    SlotView,
    StepNow,
    WaitUntil,
    WindowPolicy,
    make_policy,
    percentile,
)

MS = 1e-3


def slot(index: int, *frames_ms: float, active: bool = True, reset: bool = False) -> SlotView:
    return SlotView(index, active=active, reset_pending=reset, frames=tuple(f * MS for f in frames_ms))


def view(
    *slots: SlotView, steps_ms: tuple[float, ...] = (), state: PolicyState | None = None
) -> SchedulerView:
    return SchedulerView(tuple(slots), tuple(s * MS for s in steps_ms), state or PolicyState())


def grid_state(origin_ms: float, next_tick: int, *slot_states: SlotState) -> PolicyState:
    return PolicyState(origin=origin_ms * MS, next_tick=next_tick, slots=tuple(slot_states))


STEADY = SlotState(streak=10, seen=True)
OWED = SlotState(streak=0, debt=1, seen=True)


def assert_decision(got: StepNow | WaitUntil, want: StepNow | WaitUntil) -> None:
    assert type(got) is type(want), (got, want)
    if isinstance(want, WaitUntil):
        assert isinstance(got, WaitUntil)
        assert got.at == pytest.approx(want.at, abs=1e-9), (got, want)
        assert got.held_tick == want.held_tick, (got, want)
    else:
        assert isinstance(got, StepNow)
        assert (got.slots, got.kind, got.riders) == (want.slots, want.kind, want.riders), (got, want)
        if want.tick_at is None:
            assert got.tick_at is None
        else:
            assert got.tick_at == pytest.approx(want.tick_at, abs=1e-9), (got, want)


# -- window: the scheduler's historical behaviour -------------------------------------------------
WINDOW_CASES = [
    ("nothing waiting: sleep until woken", 100, view(slot(0), slot(1)), WaitUntil(math.inf)),
    ("no active slot", 100, view(slot(0, active=False)), WaitUntil(math.inf)),
    ("every active slot has a frame", 100, view(slot(0, 90), slot(1, 95)), StepNow((0, 1), "window")),
    (
        "inactive slots are not waited for",
        100,
        view(slot(0, 90), slot(1, active=False)),
        StepNow((0,), "window"),
    ),
    (
        "a slot with a reset pending is not waited for",
        100,
        view(slot(0, 90), slot(1, reset=True)),
        StepNow((0,), "window"),
    ),
    (
        "a slot with a reset pending is not stepped",
        100,
        view(slot(0, 90), slot(1, 50, reset=True)),
        StepNow((0,), "window"),
    ),
    (
        "some waiting: until 20 ms after the oldest",
        100,
        view(slot(0, 90), slot(1, 95), slot(2)),
        WaitUntil(110 * MS),
    ),
    ("the window is over", 110, view(slot(0, 90), slot(1, 95), slot(2)), StepNow((0, 1), "window")),
    ("the oldest frame of each slot counts", 100, view(slot(0, 85, 99), slot(1)), WaitUntil(105 * MS)),
]


@pytest.mark.parametrize(
    ("now_ms", "v", "want"), [c[1:] for c in WINDOW_CASES], ids=[c[0] for c in WINDOW_CASES]
)
def test_window_policy(now_ms: float, v: SchedulerView, want: StepNow | WaitUntil) -> None:
    assert_decision(WindowPolicy(max_batch_wait_ms=20).decide(now_ms * MS, v), want)


# -- deadline: the window is one tick minus the p90 of recent steps minus a guard -----------------
DEADLINE_CASES = [
    ("no history: 78 ms window", 100, view(slot(0, 90), slot(1)), WaitUntil(168 * MS)),
    (
        "p90 of 30 ms steps: 48 ms window",
        100,
        view(slot(0, 90), slot(1), steps_ms=(30,) * 10),
        WaitUntil(138 * MS),
    ),
    (
        "p90, not the mean",
        100,
        view(slot(0, 90), slot(1), steps_ms=(10,) * 8 + (50, 50)),
        WaitUntil(118 * MS),
    ),
    ("window over", 140, view(slot(0, 90), slot(1), steps_ms=(30,) * 10), StepNow((0,), "window")),
    (
        "steps longer than the tick: no window",
        90,
        view(slot(0, 90), slot(1), steps_ms=(95,)),
        StepNow((0,), "window"),
    ),
    ("all have a frame", 91, view(slot(0, 90), slot(1, 91), steps_ms=(30,)), StepNow((0, 1), "window")),
]


@pytest.mark.parametrize(
    ("now_ms", "v", "want"), [c[1:] for c in DEADLINE_CASES], ids=[c[0] for c in DEADLINE_CASES]
)
def test_deadline_policy(now_ms: float, v: SchedulerView, want: StepNow | WaitUntil) -> None:
    assert_decision(DeadlinePolicy(tick_ms=80, guard_ms=2).decide(now_ms * MS, v), want)


# -- grid ------------------------------------------------------------------------------------------
# Grid origin 0, ticks every 80 ms; next_tick=2 means the due tick is at 160 ms.
GRID_CASES = [
    (
        "the first frame books the grid a lead after itself",
        37,
        view(slot(0, 37), slot(1)),
        WaitUntil(47 * MS),
    ),
    (
        "the first frames of every slot: step now for the first tick",
        38,
        view(slot(0, 37), slot(1, 38)),
        StepNow((0, 1), "early", 47 * MS),
    ),
    (
        "the first tick",
        47,
        view(slot(0, 37), slot(1)),
        StepNow((0,), "tick", 47 * MS),
    ),
    ("nothing waiting", 100, view(slot(0), state=grid_state(0, 2)), WaitUntil(math.inf)),
    ("wait for the due tick", 100, view(slot(0, 90), slot(1), state=grid_state(0, 2)), WaitUntil(160 * MS)),
    (
        "step at the tick",
        160,
        view(slot(0, 90), slot(1), state=grid_state(0, 2)),
        StepNow((0,), "tick", 160 * MS),
    ),
    (
        "a late step still serves its tick",
        175,
        view(slot(0, 90), slot(1, 170), state=grid_state(0, 2)),
        StepNow((0, 1), "tick", 160 * MS),
    ),
    (
        "early when every steppable slot has a frame",
        120,
        view(slot(0, 90), slot(1, 120), slot(2, reset=True), state=grid_state(0, 2)),
        StepNow((0, 1), "early", 160 * MS),
    ),
    (
        "ticks that passed empty are skipped whole, keeping the phase",
        535,
        view(slot(0, 530), slot(1), state=grid_state(0, 2)),
        WaitUntil(560 * MS),
    ),
    (
        "a frame within the late grace of a tick that passed empty is that tick's, stepped late",
        500,
        view(slot(0, 490), slot(1), state=grid_state(0, 2)),
        StepNow((0,), "tick", 480 * MS),
    ),
    (
        "a frame exactly on a passed tick is served by it",
        485,
        view(slot(0, 480), slot(1), state=grid_state(0, 2)),
        StepNow((0,), "tick", 480 * MS),
    ),
    (
        "a slot on cadence that missed the last tick: catch-up when the step fits",
        165,
        view(slot(0, 163), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 3, SlotState(debt=1), STEADY)),
        StepNow((0,), "catchup"),
    ),
    (
        "catch-up only for the owing slot",
        165,
        view(
            slot(0, 163),
            slot(1, 164),
            slot(2),
            steps_ms=(30,) * 5,
            state=grid_state(0, 3, OWED, STEADY, STEADY),
        ),
        StepNow((0,), "catchup"),
    ),
    (
        "no catch-up when neither it nor the tick it would delay fits before the tick after",
        209,
        view(slot(0, 163), slot(1), steps_ms=(60,) * 5, state=grid_state(0, 3, OWED, STEADY)),
        WaitUntil(240 * MS),
    ),
    (
        "a catch-up past the last start that fits delays the next tick when both fit before the one after",
        209,
        view(slot(0, 163), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 3, OWED, STEADY)),
        StepNow((0,), "catchup"),
    ),
    (
        "but not within the overrun interval of another: wake when it lapses, if it still fits then",
        209,
        view(
            slot(0, 163),
            slot(1),
            steps_ms=(30,) * 5,
            state=attrs.evolve(grid_state(0, 3, OWED, STEADY), last_overrun=150 * MS),
        ),
        WaitUntil(230 * MS),
    ),
    (
        "an overrun interval that lapses too late to overrun: wait for the tick",
        209,
        view(
            slot(0, 163),
            slot(1),
            steps_ms=(45,) * 5,
            state=attrs.evolve(grid_state(0, 3, OWED, STEADY), last_overrun=155 * MS),
        ),
        WaitUntil(240 * MS),
    ),
    (
        "a new session's first frame may overrun within the interval (sessions start together)",
        209,
        view(
            slot(0, 163),
            slot(1),
            steps_ms=(30,) * 5,
            state=attrs.evolve(grid_state(0, 3, SlotState(), STEADY), last_overrun=150 * MS),
        ),
        StepNow((0,), "catchup"),
    ),
    (
        "the last start that fits: catch-up",
        207.5,
        view(slot(0, 163), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 3, OWED, STEADY)),
        StepNow((0,), "catchup"),
    ),
    (
        "no catch-up without a step estimate",
        165,
        view(slot(0, 163), slot(1), state=grid_state(0, 3, OWED, STEADY)),
        WaitUntil(240 * MS),
    ),
    (
        "a backlog without debt gets no catch-up (a client ahead of real time)",
        165,
        view(slot(0, 100, 130, 163), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 3, STEADY, STEADY)),
        WaitUntil(240 * MS),
    ),
    (
        "catch-up budget spent: wait for the tick",
        1165,
        view(
            slot(0, 1163),
            slot(1),
            steps_ms=(30,) * 5,
            state=grid_state(0, 15, SlotState(debt=1, catchups=(0.9, 1.1), seen=True), STEADY),
        ),
        WaitUntil(1200 * MS),
    ),
    (
        "a slot owed a catch-up whose budget is spent rides along one another slot calls for",
        1165,
        view(
            slot(0, 1163),
            slot(1, 1150),
            slot(2, 1164),
            steps_ms=(30,) * 5,
            state=grid_state(0, 15, SlotState(debt=1, catchups=(0.9, 1.1), seen=True), OWED, STEADY),
        ),
        StepNow((0, 1), "catchup", riders=(0,)),
    ),
    (
        "catch-up budget frees before the last start that fits: wake then",
        1165,
        view(
            slot(0, 1163),
            slot(1),
            steps_ms=(10,) * 5,
            state=grid_state(0, 15, SlotState(debt=1, catchups=(0.17, 1.1), seen=True), STEADY),
        ),
        WaitUntil(1170 * MS),
    ),
    (
        "every steppable slot a whole tick behind (its oldest frame due by the tick before the last): ahead",
        150,
        view(
            slot(0, 50, 100, 130),
            slot(1, 60, 150),
            steps_ms=(30,) * 5,
            state=grid_state(0, 3, STEADY, STEADY),
        ),
        StepNow((0, 1), "ahead"),
    ),
    (
        "a lone slot behind, as an upload is: ahead",
        150,
        view(slot(0, 50, 100, 130), steps_ms=(30,) * 5, state=grid_state(0, 3, STEADY)),
        StepNow((0,), "ahead"),
    ),
    (
        "no step ahead that would end after the due tick's step must start: wait for its interval",
        150,
        view(slot(0, 50, 100, 130), steps_ms=(90,) * 5, state=grid_state(0, 3, STEADY)),
        WaitUntil(160 * MS),
    ),
    (
        "no step ahead while a steppable slot has no frame",
        150,
        view(slot(0, 50, 100, 130), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 3, STEADY, STEADY)),
        WaitUntil(240 * MS),
    ),
    (
        "no step ahead beside a slot on real time holding the second frame of a 100 ms chunk: early at 160",
        150,
        view(slot(0, 50, 100, 130), slot(1, 150), steps_ms=(30,) * 5, state=grid_state(0, 3, STEADY, STEADY)),
        WaitUntil(160 * MS),
    ),
    (
        "a tick that passed empty counts as missed for a steady slot",
        205,
        view(slot(0, 203), slot(1), steps_ms=(30,) * 5, state=grid_state(0, 2, STEADY, STEADY)),
        StepNow((0,), "catchup"),
    ),
]


@pytest.mark.parametrize(("now_ms", "v", "want"), [c[1:] for c in GRID_CASES], ids=[c[0] for c in GRID_CASES])
def test_grid_policy(now_ms: float, v: SchedulerView, want: StepNow | WaitUntil) -> None:
    assert_decision(GridPolicy(tick_ms=80, guard_ms=2, max_catchups_per_s=2).decide(now_ms * MS, v), want)


def test_grid_books_next_tick_from_the_previous_due_time_not_from_now() -> None:
    policy = GridPolicy(first_tick_lead_ms=10)
    state = PolicyState()
    v = view(slot(0, 10), state=state)
    step = policy.decide(10 * MS, v)
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 10 * MS)
    assert state.origin == pytest.approx(20 * MS)
    # A step that starts 20 ms late still books the next tick from its own due time.
    v = view(slot(0, 95), state=state)
    step = policy.decide(120 * MS, v)
    assert_decision(step, StepNow((0,), "tick", 100 * MS))
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 120 * MS)
    assert policy.tick_time(state, state.next_tick) == pytest.approx(180 * MS)


def test_grid_slot_states_after_a_tick() -> None:
    policy = GridPolicy(steady_ticks=8)
    state = grid_state(0, 2, STEADY, STEADY, SlotState(streak=3), OWED, SlotState(streak=10, debt=2))
    v = view(
        slot(0, 150),  # stepped, nothing left: current
        slot(1),  # steady, missed the tick: owes one
        slot(2),  # not steady yet: a missing frame is not lateness
        slot(3),  # owes already and misses again: owes more (a late burst)
        slot(4, 70, 140, 150),  # stepped a frame that is a tick late: still behind, keeps its debt
        state=state,
    )
    step = policy.decide(160 * MS, v)
    assert_decision(step, StepNow((0, 4), "tick", 160 * MS))
    assert isinstance(step, StepNow)
    after = policy.after_step(state, v, step, 160 * MS)
    assert after.next_tick == 3 and after.ticks == 1
    assert [(s.streak, s.debt) for s in after.slots] == [(11, 0), (0, 1), (0, 0), (0, 2), (11, 2)]


def test_grid_a_lone_upload_is_stepped_ahead_of_the_grid_without_moving_it_or_spending_budget() -> None:
    policy = GridPolicy()
    state = grid_state(0, 3, STEADY)
    served = 0
    frames = [5.0 * i for i in range(10)]  # 10 frames, all complete by 45 ms
    now = 150.0
    while frames:
        v = view(slot(0, *frames), steps_ms=(20,) * 5, state=state)
        step = policy.decide(now * MS, v)
        assert isinstance(step, StepNow), (now, step)
        state = policy.after_step(state, v, step, now * MS)
        served += 1
        frames.pop(0)
        now += 20
    # Ahead at 150 ms (the oldest frame a whole tick behind), before the due tick's (240 ms)
    # interval opened at 160; that tick early at 170; ahead at 190-230; the 320 ms tick early at
    # 250; and so on: the engine's pace, not one frame per tick.
    assert served == 10 and now == 350
    assert state.ahead_steps == 7 and state.ticks == 3 and state.catchup_steps == 0
    assert state.next_tick == 6  # the ticks at 240, 320 and 400 ms: the grid kept its phase
    assert state.slots[0].catchups == ()


def test_grid_frames_queued_while_a_slot_was_prepared_are_caught_up_outside_the_budget() -> None:
    policy = GridPolicy(max_catchups_per_s=2)
    state = grid_state(0, 11, SlotState(), STEADY)  # slot 0 just became steppable; due 880 ms
    frames = [330.0, 410.0, 490.0, 570.0, 650.0, 730.0]  # sent on real time while it was prepared
    for now in (830, 835, 840):
        v = view(slot(0, *frames), slot(1), steps_ms=(4,) * 5, state=state)
        step = policy.decide(now * MS, v)
        assert_decision(step, StepNow((0,), "catchup"))
        assert isinstance(step, StepNow)
        state = policy.after_step(state, v, step, now * MS)
        frames.pop(0)
    # Five frames were queued behind the first (it completed six ticks before). The first
    # frame's catch-up is any new slot's; then two of the five in 10 ms, past the budget of two
    # catch-ups a second, and three still owed; never drained meanwhile.
    assert state.slots[0].start_backlog == 3 and state.catchup_steps == 3
    standing = attrs.evolve(state.slots[0], lags=(0.3,) * 8)
    assert not policy._owes_drain(standing, view(steps_ms=(4,) * 5), 0.85)
    # Unless no catch-up can pay it (steps of 60 ms: neither two in a tick nor three in two).
    assert policy._owes_drain(standing, view(steps_ms=(60,) * 5), 0.85)


def test_grid_an_upload_at_a_slots_start_is_owed_no_start_backlog() -> None:
    policy = GridPolicy()
    state = grid_state(0, 11, SlotState(), STEADY)
    # 50 frames, sent at once 500 ms before the slot's first step (while it was prepared).
    v = view(slot(0, *([330.0] * 50)), slot(1), steps_ms=(4,) * 5, state=state)
    step = policy.decide(830 * MS, v)
    assert_decision(step, StepNow((0,), "catchup"))  # its first frame, as any slot's
    assert isinstance(step, StepNow)
    assert policy.after_step(state, v, step, 830 * MS).slots[0].start_backlog == 0


def test_grid_catch_up_spends_debt_and_budget_and_a_miss_right_after_is_phase() -> None:
    policy = GridPolicy(max_catchups_per_s=2)
    state = grid_state(0, 3, OWED, STEADY)
    v = view(slot(0, 163), slot(1), steps_ms=(30,), state=state)
    step = policy.decide(165 * MS, v)
    assert_decision(step, StepNow((0,), "catchup"))
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 165 * MS)
    assert state.slots[0] == SlotState(
        streak=0, debt=0, catchups=(165 * MS,), caught_up=True, seen=True, last_completed=163 * MS
    )
    assert state.catchup_steps == 1 and state.next_tick == 3
    # Slot 0's next frame comes after the tick again: that is its phase, it owes nothing.
    v = view(slot(0), slot(1, 230), state=state)
    step = policy.decide(240 * MS, v)
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 240 * MS)
    assert state.slots[0].debt == 0


def test_grid_a_rider_pays_its_debt_but_spends_no_budget() -> None:
    policy = GridPolicy()
    spent = SlotState(debt=1, catchups=(0.9, 1.1), seen=True, streak=5)
    state = grid_state(0, 15, spent, OWED, STEADY)
    v = view(slot(0, 1163), slot(1, 1150), slot(2, 1164), steps_ms=(30,) * 5, state=state)
    step = policy.decide(1165 * MS, v)
    assert isinstance(step, StepNow) and step.riders == (0,)
    after = policy.after_step(state, v, step, 1165 * MS)
    assert (after.slots[0].debt, after.slots[0].catchups) == (0, (0.9, 1.1))
    assert (after.slots[1].debt, after.slots[1].catchups) == (0, (1.165,))
    assert after.slots[2] == STEADY and after.catchup_steps == 1


def test_grid_slot_leaving_or_resetting_forgets_its_cadence() -> None:
    policy = GridPolicy()
    state = grid_state(0, 2, SlotState(streak=20, debt=1), SlotState(streak=20, debt=1))
    v = view(slot(0, 150, reset=True), slot(1, active=False), slot(2, 155), state=state)
    step = policy.decide(160 * MS, v)
    assert_decision(step, StepNow((2,), "tick", 160 * MS))
    assert isinstance(step, StepNow)
    after = policy.after_step(state, v, step, 160 * MS)
    assert after.slots[0] == SlotState() and after.slots[1] == SlotState()


def test_make_policy_validates_the_name() -> None:
    assert make_policy("grid").name == "grid"
    assert make_policy("deadline", guard_ms=3).name == "deadline"
    assert isinstance(make_policy("window", max_batch_wait_ms=5), WindowPolicy)
    assert make_policy("window", max_batch_wait_ms=5) == WindowPolicy(max_batch_wait_ms=5)
    with pytest.raises(
        ValueError, match=r"unknown tick policy 'fixed'; choose one of: grid, deadline, window"
    ):
        make_policy("fixed")


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ((1.0,), 90, 1.0),
        ((1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0), 90, 9.0),
        ((3.0, 1.0, 2.0), 50, 2.0),
        ((5.0, 1.0), 100, 5.0),
    ],
)
def test_percentile_nearest_rank(values: tuple[float, ...], q: float, want: float) -> None:
    assert percentile(values, q) == want


def test_views_are_immutable() -> None:
    v = view(slot(0, 1))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        v.slots[0].frames = ()  # type: ignore[misc]


def test_grid_a_backlog_of_constant_depth_becomes_debt_a_growing_one_does_not() -> None:
    policy = GridPolicy(stable_backlog_ticks=4)

    def tick(state: PolicyState, n: int, frames_ms: tuple[float, ...]) -> PolicyState:
        v = view(slot(0, *frames_ms), state=state)
        step = policy.decide(n * 80 * MS, v)
        assert_decision(step, StepNow((0,), "tick", n * 80 * MS))
        assert isinstance(step, StepNow)
        return policy.after_step(state, v, step, n * 80 * MS)

    # One frame behind for good (it came late before the slot was steady): owed after 4 ticks.
    state = grid_state(0, 1, SlotState(streak=5, seen=True))
    for n in range(1, 5):
        state = tick(state, n, ((n - 1) * 80 - 5, n * 80 - 5))
        assert state.slots[0].debt == (1 if n == 4 else 0), n
    # A client ahead of real time (1.5x): it falls further behind every other tick, never owed.
    state = grid_state(0, 1, SlotState(streak=5, seen=True))
    for n in range(1, 12):
        oldest = n * 80 - 5 - 40 * n
        state = tick(state, n, tuple(range(oldest, n * 80, 53)))
        assert state.slots[0].debt == 0, n


def test_grid_a_slots_first_frame_is_owed_a_catch_up() -> None:
    policy = GridPolicy()
    new = SlotState()
    v = view(slot(0, 130), slot(1), steps_ms=(20,), state=grid_state(0, 2, new, STEADY))
    assert_decision(policy.decide(131 * MS, v), StepNow((0,), "catchup"))
    # Not caught up: its next frame (aligned) wanted the same tick, so at the tick after it
    # is a frame behind, within its first two steps: owed one.
    state = grid_state(0, 2, new, STEADY)
    for tick_ms, frames in ((160, (130, 150)), (240, (150, 230))):
        v = view(slot(0, *frames), slot(1, tick_ms - 5), steps_ms=(20,), state=state)
        step = policy.decide(tick_ms * MS, v)
        assert_decision(step, StepNow((0, 1), "tick", tick_ms * MS))
        assert isinstance(step, StepNow)
        state = policy.after_step(state, v, step, tick_ms * MS)
    assert (state.slots[0].seen, state.slots[0].debt) == (True, 1)


def test_grid_a_new_slots_double_is_owed_a_catch_up_though_no_frame_is_a_tick_late() -> None:
    # The slot's first frame came after tick 80 (at 100), the hinted next one before tick 160
    # (at 154): two frames for tick 160, the older only 60 ms old. After the tick it is owed a
    # catch-up, and with 45 ms steps (two do not fit in a tick) it gets one that delays the
    # next tick a little, rather than staying a frame behind.
    policy = GridPolicy()
    state = grid_state(0, 2, SlotState(), STEADY)
    v = view(slot(0, 100, 154), slot(1, 155), steps_ms=(45,) * 8, state=state)
    step = policy.decide(160 * MS, v)
    assert_decision(step, StepNow((0, 1), "tick", 160 * MS))
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 160 * MS)
    assert state.slots[0].debt == 1 and state.slots[1].debt == 0
    v = view(slot(0, 154), slot(1), steps_ms=(45,) * 8, state=state)
    assert_decision(policy.decide(205 * MS, v), StepNow((0,), "catchup"))
    after = policy.after_step(state, v, StepNow((0,), "catchup"), 205 * MS)
    assert after.overruns == 1 and after.last_overrun == pytest.approx(205 * MS)
    assert after.next_tick == 3  # tick 240 is still due: stepped late, not skipped


def padded_slot(index: int, frames_ms: tuple[float, ...], padded: tuple[bool, ...]) -> SlotView:
    return attrs.evolve(slot(index, *frames_ms), padded=padded)


def test_grid_a_re_alignments_double_is_owed_a_catch_up_after_its_tick() -> None:
    # A steady session whose frames completed 26 ms before the ticks, re-aligned 20 ms later (a
    # hint of 60 ms): the frame of the old phase completed at 134 and the padded one, sent 60 ms
    # early, at 154 (and, below, at 155): two frames for tick 160, neither late. One is owed.
    policy = GridPolicy()
    state = grid_state(0, 2, STEADY, STEADY)
    v = view(padded_slot(0, (134, 155), (False, True)), slot(1, 156), steps_ms=(20,) * 8, state=state)
    step = policy.decide(160 * MS, v)
    assert_decision(step, StepNow((0, 1), "tick", 160 * MS))
    assert isinstance(step, StepNow)
    state = policy.after_step(state, v, step, 160 * MS)
    assert (state.slots[0].debt, state.slots[1].debt) == (1, 0)
    v = view(padded_slot(0, (155,), (True,)), slot(1), steps_ms=(20,) * 8, state=state)
    assert_decision(policy.decide(181 * MS, v), StepNow((0,), "catchup"))
    # The same double of an unpadded frame (a client ahead of real time) is owed nothing.
    state = grid_state(0, 2, STEADY, STEADY)
    v = view(slot(0, 134, 155), slot(1, 156), steps_ms=(20,) * 8, state=state)
    step = policy.decide(160 * MS, v)
    assert isinstance(step, StepNow)
    assert policy.after_step(state, v, step, 160 * MS).slots[0].debt == 0


def test_grid_a_padded_frame_that_missed_its_early_tick_is_caught_up_at_once() -> None:
    # Tick 160 was stepped early (every slot had a frame at 150); the re-aligned session's padded
    # frame then completed at 155, before that tick: a frame of a stepped tick, owed now rather
    # than at tick 240 (80 ms more).
    policy = GridPolicy()
    state = grid_state(0, 3, SlotState(streak=11, seen=True), SlotState(streak=11, seen=True))
    v = view(padded_slot(0, (155,), (True,)), slot(1), steps_ms=(20,) * 8, state=state)
    assert_decision(policy.decide(161 * MS, v), StepNow((0,), "catchup"))
    # Unpadded, the same frame waits for its tick (a client ahead of real time gets no catch-up).
    v = view(slot(0, 155), slot(1), steps_ms=(20,) * 8, state=state)
    assert_decision(policy.decide(161 * MS, v), WaitUntil(240 * MS))
    # Not caught up in time (no budget left), it is stepped at tick 240 a tick behind: owed then.
    spent = SlotState(streak=11, seen=True, catchups=(0.100, 0.120))
    state = grid_state(0, 3, spent, SlotState(streak=11, seen=True))
    v = view(padded_slot(0, (155, 235), (True, False)), slot(1, 236), steps_ms=(20,) * 8, state=state)
    step = policy.decide(240 * MS, v)
    assert_decision(step, StepNow((0, 1), "tick", 240 * MS))
    assert isinstance(step, StepNow)
    assert policy.after_step(state, v, step, 240 * MS).slots[0].debt == 1


def test_grid_a_tick_most_of_whose_slots_on_cadence_are_late_is_held_for_them() -> None:
    # Three slots whose frames complete ~5 ms before the ticks; at tick 160 only slot 0's
    # came (a stall held the other two): the tick waits for them, at most the late grace and
    # never past the last start that ends before the next tick (240 - 30 - 2 = 208).
    policy = GridPolicy()
    was = SlotState(streak=10, seen=True, last_completed=75 * MS, interval=80 * MS)
    state = grid_state(0, 2, was, was, was)
    # The held tick (its n, 2) is named: the shell tells the aligners (a shared stall).
    v = view(slot(0, 155), slot(1), slot(2), steps_ms=(30,) * 8, state=state)
    assert_decision(policy.decide(160 * MS, v), WaitUntil(200 * MS, held_tick=2))
    slow = view(slot(0, 155), slot(1), slot(2), steps_ms=(40,) * 8, state=state)
    assert_decision(policy.decide(160 * MS, slow), WaitUntil(198 * MS, held_tick=2))
    # They come 8 ms late: all three stepped as tick 160's.
    v = view(slot(0, 155), slot(1, 168), slot(2, 168), steps_ms=(30,) * 8, state=state)
    assert_decision(policy.decide(168 * MS, v), StepNow((0, 1, 2), "tick", 160 * MS))
    # The grace gone by, the tick goes with what it has.
    v = view(slot(0, 155), slot(1), slot(2), steps_ms=(30,) * 8, state=state)
    assert_decision(policy.decide(200 * MS, v), StepNow((0,), "tick", 160 * MS))
    # One of three late (a straggler: the tail of the burst of aligned appends) is waited for
    # 8 ms, not named a shared stall; then left to the catch-ups. A slot whose next frame is not
    # due by this tick (it was caught up ahead, or completes just after the ticks) is not.
    v = view(slot(0, 155), slot(1, 156), slot(2), steps_ms=(30,) * 8, state=state)
    assert_decision(policy.decide(160 * MS, v), WaitUntil(168 * MS))
    assert_decision(policy.decide(168 * MS, v), StepNow((0, 1), "tick", 160 * MS))
    v = view(slot(0, 155), slot(1, 156), slot(2, 162), steps_ms=(30,) * 8, state=state)
    assert_decision(policy.decide(162 * MS, v), StepNow((0, 1, 2), "tick", 160 * MS))
    # Nor one whose phase slipped just past the tick (its next frame expected at 163): the tick
    # waits for it (3 ms for the others, where it would wait 77 ms for the next tick), within
    # the grace; a later phase (170) is its own, served by the next tick.
    slipped = SlotState(streak=10, seen=True, last_completed=83 * MS, interval=80 * MS)
    state_slipped = grid_state(0, 2, was, was, slipped)
    v = view(slot(0, 155), slot(1, 156), slot(2), steps_ms=(30,) * 8, state=state_slipped)
    assert_decision(policy.decide(160 * MS, v), WaitUntil(168 * MS))
    later = SlotState(streak=10, seen=True, last_completed=90 * MS, interval=80 * MS)
    v = view(slot(0, 155), slot(1, 156), slot(2), steps_ms=(30,) * 8, state=grid_state(0, 2, was, was, later))
    assert_decision(policy.decide(160 * MS, v), StepNow((0, 1), "tick", 160 * MS))
    # Not one whose frames do not come a tick apart (30 ms chunks complete them 60 or 90 ms
    # apart, and one would hold every tick its frame falls just after).
    irregular = SlotState(streak=10, seen=True, last_completed=75 * MS, interval=60 * MS)
    v = view(
        slot(0, 155), slot(1, 156), slot(2), steps_ms=(30,) * 8, state=grid_state(0, 2, was, was, irregular)
    )
    assert_decision(policy.decide(160 * MS, v), StepNow((0, 1), "tick", 160 * MS))
    # Never past the last start that ends before the next tick: 240 - 75 - 2 = 163 with 75 ms
    # steps, none at all with 78 ms ones.
    v = view(slot(0, 155), slot(1, 156), slot(2), steps_ms=(75,) * 8, state=state)
    assert_decision(policy.decide(160 * MS, v), WaitUntil(163 * MS))
    v = view(slot(0, 155), slot(1, 156), slot(2), steps_ms=(78,) * 8, state=state)
    assert_decision(policy.decide(160 * MS, v), StepNow((0, 1), "tick", 160 * MS))
    ahead = SlotState(streak=10, seen=True, last_completed=155 * MS)
    v = view(slot(0, 155), slot(1), slot(2), state=grid_state(0, 2, was, ahead, ahead), steps_ms=(30,) * 8)
    assert_decision(policy.decide(160 * MS, v), StepNow((0,), "tick", 160 * MS))
    # Slots that missed their last tick (a pause) are not waited for, nor are slots whose frames
    # come 100 ms apart (their next one completes at 175); slots that just started are.
    paused = SlotState(streak=0, seen=True, last_completed=75 * MS)
    v = view(slot(0, 155), slot(1), slot(2), state=grid_state(0, 2, was, paused, paused), steps_ms=(30,) * 8)
    assert_decision(policy.decide(160 * MS, v), StepNow((0,), "tick", 160 * MS))
    slower = SlotState(streak=3, seen=True, last_completed=75 * MS, interval=100 * MS)
    v = view(slot(0, 155), slot(1), slot(2), state=grid_state(0, 2, was, slower, slower), steps_ms=(30,) * 8)
    assert_decision(policy.decide(160 * MS, v), StepNow((0,), "tick", 160 * MS))
    new = SlotState(streak=1, seen=True, last_completed=75 * MS, interval=20 * MS)
    v = view(slot(0, 155), slot(1), slot(2), state=grid_state(0, 2, was, new, new), steps_ms=(30,) * 8)
    assert_decision(policy.decide(160 * MS, v), WaitUntil(200 * MS, held_tick=2))


def test_grid_a_padded_frame_of_a_slot_already_behind_is_owed_nothing() -> None:
    # A client ahead of real time that pads its own appends stays served one frame per tick.
    policy = GridPolicy()
    behind = SlotState(streak=11, seen=True, backlog=1, last_completed=150 * MS)
    state = grid_state(0, 3, behind, SlotState(streak=11, seen=True))
    v = view(padded_slot(0, (155,), (True,)), slot(1), steps_ms=(20,) * 8, state=state)
    assert_decision(policy.decide(161 * MS, v), WaitUntil(240 * MS))
    v = view(padded_slot(0, (155, 200), (True, True)), slot(1, 236), steps_ms=(20,) * 8, state=state)
    step = policy.decide(240 * MS, v)
    assert isinstance(step, StepNow)
    assert policy.after_step(state, v, step, 240 * MS).slots[0].debt == 0


def test_policy_state_fresh_forgets_one_slot() -> None:
    state = grid_state(0, 3, OWED, STEADY)
    assert state.fresh(0).slots == (SlotState(), STEADY)
    assert state.fresh(5) == state
