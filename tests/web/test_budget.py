"""The per-connection budget (web/budget.py): pure arithmetic over times the test passes in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_actors.web.budget import InputBudget, RateLimits, TokenBucket


def run(budget: InputBudget, arrivals: list[tuple[float, int]]) -> list[float]:
    """Feed messages arriving at the given times, each handled once admitted (the reader
    sleeps for what ``admit`` says); returns when each was handled."""
    handled, now = [], 0.0
    for at, size in arrivals:
        now = max(now, at)
        while (delay := budget.admit(now, size)) > 0:
            now += delay
        handled.append(now)
    return handled


def test_real_clients_are_never_held_back():
    # A 30 s upload in 80 ms chunks at session start, then a browser's 10 ms chunks (100/s,
    # base64 pcm16: ~640 bytes) plus DuplexClient's acks (25/s) for 10 minutes.
    budget = InputBudget(RateLimits(), 0.0)
    upload = [(0.0, 5200)] * 375
    stream = [(1.0 + i * 0.008, 640 if i % 5 else 60) for i in range(75_000)]
    handled = run(budget, upload + stream)
    assert handled[len(upload) - 1] == pytest.approx((375 - 250) / 200)  # held back 0.6 s
    assert not budget.persistent(handled[len(upload) - 1])
    assert all(h == at for h, (at, _) in zip(handled[len(upload) :], stream, strict=True))
    assert budget.held_since is None and not budget.persistent(601.0)


def test_a_storm_is_held_to_the_rate_and_reported_once_it_persists():
    limits = RateLimits(messages_per_s=100, message_burst=50, persist_s=5)
    budget = InputBudget(limits, 0.0)
    handled = run(budget, [(0.0, 10)] * 1050)  # everything at once
    assert handled[49] == 0.0 and handled[50] > 0.0
    assert handled[-1] == pytest.approx(10.0)  # 1000 beyond the burst at 100/s
    assert budget.held_since == 0.0
    assert not budget.persistent(4.9) and budget.persistent(5.1)


def test_bytes_are_budgeted_and_one_huge_message_passes_into_debt():
    limits = RateLimits(bytes_per_s=1000, byte_burst=4000)
    budget = InputBudget(limits, 0.0)
    assert budget.admit(0.0, 10_000) == 0.0  # larger than the burst: admitted when full
    assert budget.admit(0.0, 1) == pytest.approx(6.001)  # ... and paid for
    assert budget.admit(6.001, 1) == 0.0


def test_held_back_ends_once_messages_pass_without_waiting_and_the_buckets_refill():
    budget = InputBudget(RateLimits(messages_per_s=10, message_burst=4, persist_s=1), 0.0)
    assert [budget.admit(0.0, 1) for _ in range(4)] == [0.0] * 4
    assert budget.admit(0.0, 1) > 0  # held from t=0
    assert budget.admit(0.1, 1) == 0.0  # the held message itself goes: still held back
    assert budget.held_since == 0.0
    assert budget.admit(0.2, 1) == 0.0  # a sleep overshot: passes, but the bucket is low
    assert budget.held_since == 0.0
    assert budget.admit(1.0, 1) == 0.0  # arrived after the refill: no longer held
    assert budget.held_since is None
    assert budget.persistent(3.0, since=1.5)  # held by something else (the input backlog)


@given(
    rate=st.floats(1, 1000),
    burst=st.floats(1, 1000),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=300),
)
def test_never_more_than_burst_plus_rate_times_elapsed(rate, burst, gaps):
    budget = InputBudget(RateLimits(messages_per_s=rate, message_burst=burst), 0.0)
    at, arrivals = 0.0, []
    for gap in gaps:
        at += gap
        arrivals.append((at, 1))
    handled = run(budget, arrivals)
    assert handled == sorted(handled)
    for i, t in enumerate(handled):
        assert i + 1 <= burst + rate * t + 1e-6 * (1 + rate * t)
        assert t >= arrivals[i][0]


@given(cost=st.floats(0, 10_000), rate=st.floats(0.1, 1000), capacity=st.floats(1, 1000))
def test_waiting_what_the_bucket_says_is_enough(cost, rate, capacity):
    bucket = TokenBucket(rate, capacity, 0.0, 0.0)
    delay = bucket.wait(cost)
    bucket.refill(delay)
    assert bucket.wait(cost) <= 1e-9 * (1 + cost / rate)


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        RateLimits(messages_per_s=0)
    with pytest.raises(ValueError):
        RateLimits(message_burst=0.5)


def run_control(budget: InputBudget, arrivals: list[tuple[float, int]]) -> list[float]:
    """As ``run``, for messages that are not audio: the general budget, then the control bytes."""
    handled, now = [], 0.0
    for at, size in arrivals:
        now = max(now, at)
        while (delay := budget.admit(now, size)) > 0:
            now += delay
        while (delay := budget.admit_control(now, size)) > 0:
            now += delay
        handled.append(now)
    return handled


def test_control_messages_of_real_clients_pass_and_large_updates_are_held_to_the_control_rate():
    limits = RateLimits()
    # Four updates of the largest config the core takes, then acks (25/s, ~100 bytes) for 10 min.
    budget = InputBudget(limits, 0.0)
    arrivals = [(0.0, 256 * 1024)] * 4 + [(0.1 + i * 0.04, 100) for i in range(15_000)]
    handled = run_control(budget, arrivals)
    assert all(h == at for h, (at, _) in zip(handled, arrivals, strict=True))
    assert budget.held_since is None
    # 40 updates of 200 KB at once: the burst takes five, the rest go at the control rate.
    budget = InputBudget(limits, 0.0)
    handled = run_control(budget, [(0.0, 200_000)] * 40)
    assert handled[4] == 0.0 and handled[5] > 0.0
    expected = (40 * 200_000 - limits.control_byte_burst) / limits.control_bytes_per_s
    assert handled[-1] == pytest.approx(expected, rel=0.01)
    assert budget.held_since == 0.0 and budget.persistent(limits.persist_s + 1)


def test_one_huge_control_message_costs_at_most_the_control_burst():
    limits = RateLimits()
    budget = InputBudget(limits, 0.0)
    assert budget.admit_control(0.0, 16 * 1024 * 1024) == 0.0
    # the next small control message waits for the control bucket, not for 16 MiB of debt
    assert budget.admit_control(0.0, 100) == pytest.approx(100 / limits.control_bytes_per_s)


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5]), st.integers(min_value=0, max_value=20_000)),
        min_size=1,
        max_size=200,
    )
)
def test_admits_now_then_take_admitted_is_admit_without_its_waits(arrivals):
    """The reader's direct path (``admits_now``, then ``take_admitted`` once the message is
    handled) leaves the budget as ``admit`` does, message by message; a message that
    ``admits_now`` refuses takes the awaited path (``admit``) in both."""
    limits = RateLimits(messages_per_s=50, message_burst=5, bytes_per_s=40_000, byte_burst=30_000)
    awaited, direct = InputBudget(limits, 0.0), InputBudget(limits, 0.0)
    now = 0.0
    for gap, size in arrivals:
        now += gap
        if direct.admits_now(now, size):
            direct.take_admitted(size)
            assert awaited.admit(now, size) == 0.0
        else:
            assert awaited.admit(now, size) > 0.0
            while (delay := direct.admit(now, size)) > 0:
                assert awaited.admit(now, size) == pytest.approx(delay)
                now += delay
            assert awaited.admit(now, size) == 0.0
        for a, b in ((awaited.messages, direct.messages), (awaited.bytes, direct.bytes)):
            assert (a.tokens, a.stamp) == pytest.approx((b.tokens, b.stamp))
        assert awaited.held_since == direct.held_since
