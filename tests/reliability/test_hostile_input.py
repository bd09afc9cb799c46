"""Hostile input (docs/design.md §4, decision 11): a client flooding full frames, a
storm of one-sample appends, a stream of session.updates that grow the config without bound or
carry values the model cannot take, or a 60 s upload in a fraction of a second must not spend
the other sessions' time, nor fill the log disk with refused audio.

The reference-session pattern: a paced reference load (``duplex-load``, 2 sessions, its own
process) runs beside each attack; its round-trip p99 is compared with a no-attack baseline
measured in the same test. The attacker is a process of its own, niced
(``tests/reliability/attacker.py``), so that the figures measure the server, not the shared CPU.
One server: ``--max-sessions 4 --rate-limit-after 3``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from ..e2e.conftest import start_server
from .conftest import ametrics, metric_sum, wait_slots_free
from .test_disconnects import run_load

pytestmark = pytest.mark.serial  # its bounds are timings: run alone, after the rest (scripts/run-tests.sh)

RATE_LIMIT_AFTER_S = 3.0
ATTACK_S = 6.0
ROUNDS = 3
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory, parrot_dir):
    server = start_server(
        tmp_path_factory.mktemp("hostile"),
        "--max-sessions",
        "4",
        "--rate-limit-after",
        str(RATE_LIMIT_AFTER_S),
        "--drain-timeout",
        "2",
        # e.g. "--switch-interval-ms 5 --max-messages-per-s 1e9 --message-burst 1e9" measures
        # the server as it was before this test (RELIABILITY.md); the asserts then fail.
        *os.environ.get("DUPLEX_HOSTILE_SERVER_ARGS", "").split(),
    )
    yield server
    server.stop()


async def attack(server, mode: str, seconds: float, into: dict) -> None:
    cmd = ["nice", "-n", "10", sys.executable, "-m", "tests.reliability.attacker"]
    cmd += [str(server.port), mode, str(seconds)]
    with trio.fail_after(seconds + 30):
        proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    into.update(json.loads(proc.stdout))


def log_bytes(server) -> int:
    return sum(p.stat().st_size for p in server.log_dir.glob("*.dlog"))


async def step_stats(server) -> tuple[float, float]:
    text = await ametrics(server)
    return (
        metric_sum(text, "duplex_step_duration_seconds_sum"),
        metric_sum(text, "duplex_step_duration_seconds_count"),
    )


async def under_attack(server, tmp_path: Path, mode: str) -> tuple[dict, dict, dict]:
    """(the reference load's aggregate, what the attacker saw, server-side figures)."""
    await wait_slots_free(server)
    before_bytes = log_bytes(server)
    t0 = trio.current_time()
    s0, n0 = await step_stats(server)
    frames0 = metric_sum(await ametrics(server), "duplex_frames_in_total")
    seen: dict = {}
    loaded: dict = {}

    async def reference() -> None:
        await trio.sleep(0.5)  # the attack is under way first
        loaded.update(await run_load(server, tmp_path / mode, 2, ATTACK_S - 1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(attack, server, mode, ATTACK_S, seen)
        nursery.start_soon(reference)
    s1, n1 = await step_stats(server)
    frames = metric_sum(await ametrics(server), "duplex_frames_in_total") - frames0
    # Per second of the window the bytes were written in (the attack and the reference load,
    # each with its process's start-up: ~1.5 s more than ATTACK_S).
    elapsed = trio.current_time() - t0
    figures = {
        "log_bytes_per_s": (log_bytes(server) - before_bytes) / elapsed,
        "log_bytes_per_frame_in": (log_bytes(server) - before_bytes) / max(frames, 1),
        "frames_in": frames,
        "window_s": elapsed,
        "step_mean_ms": 1000 * (s1 - s0) / max(n1 - n0, 1),
    }
    return loaded, seen, figures


def record_round(
    record, mode: str, round_: int, base: dict, loaded: dict, seen: dict, figures: dict, **extra
) -> float:
    """Record one paired round (a baseline, then the attack ``mode``); returns its p99 ratio."""
    ratio = loaded["round_trip_ms"]["p99"] / base["round_trip_ms"]["p99"]
    record(
        mode=mode,
        round=round_,
        baseline_rtt_p99_ms=base["round_trip_ms"]["p99"],
        attack_rtt_p99_ms=loaded["round_trip_ms"]["p99"],
        p99_ratio=round(ratio, 3),
        attack_step_mean_ms=round(figures["step_mean_ms"], 2),
        log_bytes_per_s=round(figures["log_bytes_per_s"]),
        log_window_s=round(figures["window_s"], 2),
        attacker_errors=seen["errors"],
        attacker_closes=seen["closes"],
        attacker_connections=seen["connections"],
        reference_lost=loaded["lost_frames"],
        **extra,
    )
    return ratio


async def test_floods_are_pushed_back_log_little_and_leave_others_their_time(
    hostile_server, tmp_path, record
):
    """Items 1 and 2: full frames as fast as TCP takes them, and a storm of one-sample appends.
    As in the config test, the < 2x bound is on the median of ROUNDS paired rounds (a baseline,
    then each attack), every round recorded."""
    await wait_slots_free(hostile_server)
    await run_load(hostile_server, tmp_path / "warmup", 2, 2)
    ratios: dict[str, list[float]] = {"flood": [], "tiny": []}
    results = []
    for round_ in range(ROUNDS):
        await wait_slots_free(hostile_server)
        s0, n0 = await step_stats(hostile_server)
        base = await run_load(hostile_server, tmp_path / f"baseline{round_}", 2, ATTACK_S - 1)
        s1, n1 = await step_stats(hostile_server)
        base_step_ms = 1000 * (s1 - s0) / max(n1 - n0, 1)
        for mode in ("flood", "tiny"):
            loaded, seen, figures = await under_attack(hostile_server, tmp_path / f"round{round_}", mode)
            results.append((mode, loaded, seen, figures))
            ratios[mode].append(
                record_round(
                    record, mode, round_, base, loaded, seen, figures,
                    baseline_step_mean_ms=round(base_step_ms, 2),
                    log_bytes_per_frame_in=round(figures["log_bytes_per_frame_in"]),
                    attacker_sent_per_s=seen["sent_per_s"],
                )
            )  # fmt: skip
    for mode, loaded, seen, figures in results:  # every figure is recorded before any assert
        # Held back, then closed once that lasted past --rate-limit-after (it reconnected).
        assert seen["errors"].get("rate_limited", 0) >= 1 and seen["closes"].get("1008", 0) >= 1, seen
        assert "input_backpressure" not in seen["errors"]  # not refused append by append
        if mode == "flood":
            # The log grows with the input the sessions took in, not with what was sent: an
            # 80 ms frame in logs its 3840 bytes of pcm16 and its step record (~4 KB of output
            # audio and codes); refused audio logged whole grew it without bound (56 MB for 10
            # frames). Not per second: under the window policy a flooder's accepted backlog is
            # stepped faster than real time, more so on a faster host (372-620 KB/s measured).
            assert figures["log_bytes_per_frame_in"] < 12_000, figures
        else:
            # One-sample appends make a record each: they are held to the message budget, so
            # the bound is per second (162-166 KB/s measured, with the reference load's).
            assert figures["log_bytes_per_s"] < 500_000, figures
        assert loaded["lost_frames"] == 0
    # docs/design.md decision 11: under either flood the reference keeps its time.
    for mode, values in ratios.items():
        assert sorted(values)[len(values) // 2] < 2.0, (mode, values)


async def test_config_attacks_are_refused_and_leave_others_their_time(hostile_server, tmp_path, record):
    """Items 3, 6, 7 beside the reference: 40 updates each adding a 200 KB key (the merged config
    is bounded at 256 KiB, so the echo never grows past it), ``temperature: 1e400``, a persona
    with a lone surrogate and one past the model's context, sent over and over.

    The reference's p99 over 5 s is its second-worst of ~125 frames, so one stall of the shared
    host in either window moves a single ratio past 2x (a fresh-clone CI run: 2.02x, with every
    step twice as slow as on a quiet host). The bound is on the median of ROUNDS paired
    rounds (baseline, then attack), each recorded: an attack that costs the reference its time
    fails every round, a stall fails one."""
    ratios = []
    for round_ in range(ROUNDS):
        await wait_slots_free(hostile_server)
        base = await run_load(hostile_server, tmp_path / f"baseline{round_}", 2, ATTACK_S - 1)
        loaded, seen, figures = await under_attack(hostile_server, tmp_path / f"round{round_}", "config")
        ratios.append(record_round(record, "config", round_, base, loaded, seen, figures))
        errors = seen["errors"]
        # Each refusal is its documented code and the session goes on (no internal_error, no 1011).
        assert errors.get("invalid_value", 0) >= 1, errors  # the 256 KiB bound
        assert errors.get("bad_event", 0) >= 1 or errors.get("invalid_value", 0) >= 2, errors  # 1e400
        assert errors.get("invalid_duplex_runtime_config", 0) >= 2, errors  # surrogate, too long
        assert "internal_error" not in errors and "1011" not in seen["closes"], seen
        assert loaded["lost_frames"] == 0
        # Refused updates are logged as small rejected records, never with their config.
        assert figures["log_bytes_per_s"] < 1_000_000, figures
    # Decision 11: the 200 KB updates (held to the control-byte budget) leave the reference its time.
    assert sorted(ratios)[len(ratios) // 2] < 2.0, ratios


async def test_an_upload_counts_as_session_backlog_not_as_deadline_misses(hostile_server, tmp_path, record):
    """60 s of audio sent at once: the server reads what fits its soft budget (2 s), the model
    works through it back to back, and the frames that waited did so behind their own session."""
    await wait_slots_free(hostile_server)
    text = await ametrics(hostile_server)
    misses0 = metric_sum(text, "duplex_deadline_misses_total")
    backlog0 = metric_sum(text, "duplex_session_backlog_frames_total")
    seen: dict = {}
    await attack(hostile_server, "upload:60", 3.0, seen)
    text = await ametrics(hostile_server)
    misses = metric_sum(text, "duplex_deadline_misses_total") - misses0
    backlog = metric_sum(text, "duplex_session_backlog_frames_total") - backlog0
    record(deadline_misses=misses, session_backlog_frames=backlog, attacker_sent_per_s=seen["sent_per_s"])
    # Before the split every one of them was a deadline miss. A miss now means the engine fell
    # behind the real-time pace (possible on a shared box whose steps take ~70 of the 80 ms).
    assert backlog >= 10
    assert misses <= backlog / 4, (misses, backlog)
