"""Start-up phases: records with progress and an estimate, logged durations, a failure named."""

from __future__ import annotations

import logging

import pytest

from duplex_actors.model.startup import DONE, FAILED, RETRYING, RUNNING, PhaseReport, Startup, StartupState


def current(state: StartupState) -> PhaseReport:
    report = state.current
    assert report is not None
    return report


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_phase_reports_progress_an_estimate_and_its_duration(caplog):
    clock, state = Clock(), StartupState()
    startup = Startup(state.record, clock=clock)
    caplog.set_level(logging.INFO, logger="duplex_actors.startup")
    with startup.phase("digest", total=10**9, unit="bytes") as phase:
        assert current(state).state == RUNNING
        clock.now += 4.0
        phase.progress(250 * 10**6)
        report = current(state)
        assert (report.done, report.total, report.unit) == (250 * 10**6, 10**9, "bytes")
        assert report.eta_s == pytest.approx(12.0)  # 4 s for a quarter: 12 s for the rest
        clock.now += 8.0
        phase.progress(750 * 10**6)  # logged: 10 s since the last line
        clock.now += 0.1
        phase.progress(800 * 10**6)  # within the report interval: not reported
        assert current(state).done == 750 * 10**6
    done = current(state)
    assert done.state == DONE and done.elapsed_s == pytest.approx(12.1) and done.done == 10**9
    assert state.duration("digest") == pytest.approx(12.1)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "start-up: digest ..."
    assert messages[1] == "start-up: digest 75% (0.75 GB of 1.00 GB), about 4 s left"
    assert messages[-1] == "start-up: digest done in 12.1 s"


def test_a_failed_phase_is_named_and_the_error_propagates():
    clock, state = Clock(), StartupState()
    startup = Startup(state.record, clock=clock)
    with startup.phase("resolve"):
        pass
    with pytest.raises(ValueError, match="no such model"), startup.phase("load"):
        clock.now += 1.5
        raise ValueError("no such model")
    failed = current(state)
    assert failed.name == "load" and failed.state == FAILED and failed.detail == "ValueError: no such model"
    assert state.duration("load") is None and state.duration("resolve") == 0.0
    body = state.as_json()
    assert body["phase"]["name"] == "load" and body["phase"]["state"] == FAILED
    assert body["phases_done_s"] == {"resolve": 0.0}


def test_a_retry_is_visible_and_a_running_phase_ages_on_the_serving_side():
    clock, state = Clock(), StartupState()
    startup = Startup(state.record, clock=clock)
    with startup.phase("resolve") as phase:
        phase.retrying("the hub cannot be reached", 5.0, 1)
        report = current(state)
        assert report.state == RETRYING
        assert report.detail == "attempt 1 failed: the hub cannot be reached; next attempt in 5 s"
        later = report.as_json(now=report.reported_at + 3.0)
        assert later["elapsed_s"] == pytest.approx(report.elapsed_s + 3.0, abs=0.05)


def test_a_record_brings_its_estimate_up_to_now():
    report = PhaseReport(
        "prefill", RUNNING, 10.0, reported_at=1000.0, done=50, total=200, unit="positions", eta_s=30.0
    )
    body = report.as_json(now=1004.0)
    assert body == {
        "name": "prefill",
        "state": RUNNING,
        "elapsed_s": 14.0,
        "done": 50,
        "total": 200,
        "unit": "positions",
        "progress": 0.25,
        "eta_s": 26.0,
    }
    finished = PhaseReport("prefill", DONE, 40.0, reported_at=1000.0, done=200, total=200, unit="positions")
    assert finished.as_json(now=2000.0)["elapsed_s"] == 40.0
