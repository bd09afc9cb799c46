"""bench/serving.py's ramp: the search state machine the sequential and the interleaved runs share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from .loader import load_bench

serving = load_bench("serving.py", "bench_serving")


@given(threshold=st.integers(0, 40), cap=st.integers(1, 40), doubling=st.booleans())
def test_the_ramp_finds_the_largest_n_that_holds_and_tries_each_n_once(
    threshold: int, cap: int, doubling: bool
) -> None:
    step = (lambda n: n * 2) if doubling else (lambda n: n + 1)
    tried: list[int] = []

    def test(n: int) -> dict[str, object]:
        tried.append(n)
        return {"held": n <= threshold, "reasons": [], "lat_p99": None, "step_ms": None}

    largest, rows = serving.ramp(test, cap, step, lambda _msg: None)
    assert largest == min(threshold, cap)
    assert len(tried) == len(set(tried)) == len(rows)
    assert all(1 <= n <= cap for n in tried)


def test_interleaved_ramps_advance_one_trial_per_arm_per_round() -> None:
    a, b = serving.Ramp(8, lambda n: n * 2), serving.Ramp(8, lambda n: n * 2)
    order: list[tuple[str, int]] = []
    while True:
        todo = [(name, r, n) for name, r in (("a", a), ("b", b)) if (n := r.next_n()) is not None]
        if not todo:
            break
        for name, r, n in todo:
            order.append((name, n))
            r.record(n, {"held": n <= (3 if name == "a" else 8)})
    assert (a.good, b.good) == (3, 8)
    assert order[:6] == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 4), ("b", 4)]
    assert [n for name, n in order if name == "a"] == [1, 2, 4, 3]
