"""bench/long_sessions_eval.py end to end on the tiny model, cut short: a probe before the wrap
scores every arm alike (they are one computation until then), and the report is written."""

from __future__ import annotations

import json

from .loader import load_bench

evaluation = load_bench("long_sessions_eval.py", "bench_long_sessions_eval")


def test_before_the_wrap_every_arm_makes_the_same_forced_choices(tiny_dir, tmp_path, capsys) -> None:
    result = evaluation.main(
        ["--dry-run-cpu", "--minutes", "1.5", "--probes", "1", "--timing-steps", "1", "--out", str(tmp_path)]
    )
    choices = result["choices"]
    assert {c["arm"] for c in choices} == {"S", "P", "K"} and {c["minute"] for c in choices} == {1.0}
    by_arm = {
        arm: sorted((c["persona"], c["fact"], c["margin"]) for c in choices if c["arm"] == arm)
        for arm in "SPK"
    }
    assert len(by_arm["S"]) == 2 and by_arm["S"] == by_arm["P"] == by_arm["K"]
    assert json.loads((tmp_path / "long_sessions_eval.json").read_text())["context"] == 96
    assert "forced choice: share right" in capsys.readouterr().out
