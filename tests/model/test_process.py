"""EngineProcess: the tiny engine in a child process, compared with the same engine in-thread.

Each proxy spawns a child that imports torch and builds the tiny model (~3 s), so the module
starts few: one shared for equality and errors, one gated (a prepare that waits for the test),
one closed, one whose parent is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.faults import Faults, FaultyEngine, InjectedFault
from duplex_actors.model.engine import SamplingConfig, SessionPrompt, StepOutput
from duplex_actors.model.errors import CheckpointError, InvalidRuntimeConfig, InvalidVoice
from duplex_actors.model.factory import open_engine
from duplex_actors.model.process import EngineProcess, EngineProcessDied, RemoteTraceback
from duplex_actors.model.startup import DONE, FAILED, PhaseReport

from .helpers import session_audio

SLOTS = 2


def gated_engine(model: str, *, gate: str, entered: str, **kwargs: Any) -> Any:
    """The tiny engine whose ``prepare`` of a persona starting with "gated" creates the file
    ``entered``, then waits for the file ``gate`` (files, not multiprocessing events: a child
    killed while it waits on one leaves it unusable). Built in the child: module-level, so
    that it pickles."""
    engine = open_engine(model, **kwargs)
    prepare = engine.prepare

    def gated(prompt: SessionPrompt) -> Any:
        if not prompt.persona.startswith("gated"):
            return prepare(prompt)
        Path(entered).touch()
        deadline = time.monotonic() + 60
        while not Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never opened the gate")
            time.sleep(0.01)
        return prepare(prompt)

    engine.prepare = gated  # type: ignore[method-assign,assignment]
    return engine


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def wait_file(path: Path, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(scope="module")
def engines(tiny_dir):
    proxy = EngineProcess("tiny", slots=SLOTS)
    local = open_engine("tiny", slots=SLOTS)
    yield proxy, local
    proxy.close()


def _script() -> list[tuple[str, Any]]:
    """Resets and steps over 2 slots: a reset mid-stream, a slot that skips steps, sampling."""
    a, b = session_audio(1, 8), session_audio(2, 8)
    warm = SessionPrompt(voice="NATF2.pt", persona="You are a tester.")
    sampled = SessionPrompt(
        voice="NATM1.pt", persona="", sampling=SamplingConfig(temperature=0.8, temperature_text=0.7, seed=7)
    )
    ops: list[tuple[str, Any]] = [("reset", (0, warm)), ("reset", (1, sampled))]
    for i in range(8):
        if i == 4:
            ops.append(("reset", (0, SessionPrompt(voice="NATF0.pt", persona="Another one."))))
        frames = {0: a[i]} if i % 3 == 2 else {0: a[i], 1: b[i]}
        ops.append(("step", frames))
    ops.append(("reset", (1, None)))
    ops.append(("step", {0: a[0], 1: b[0]}))
    return ops


def _run(engine: Any, ops: list[tuple[str, Any]]) -> list[dict[int, StepOutput]]:
    out = []
    for kind, arg in ops:
        if kind == "reset":
            engine.reset(*arg)
        else:
            out.append(dict(engine.step(arg)))
    return out


def test_steps_are_bit_identical_to_the_in_thread_engine(engines):
    proxy, local = engines
    ops = _script()
    got, expected = _run(proxy, ops), _run(local, ops)
    assert len(got) == len(expected) == 9
    for n, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.keys() == e.keys(), n
        for slot in e:
            eo, go = e[slot], g[slot]
            fields = ("ready", "text_token", "text_piece", "agent_codes", "user_codes")
            assert [getattr(go, f) for f in fields] == [getattr(eo, f) for f in fields], (n, slot)
            assert go.pcm.dtype == eo.pcm.dtype and np.array_equal(go.pcm, eo.pcm), (n, slot)
    assert any(o.ready and o.pcm.any() for step in got for o in step.values())


def test_family_and_description_match_without_a_round_trip(engines):
    proxy, local = engines
    assert proxy.slots == SLOTS
    assert proxy.describe() == local.describe()
    assert proxy.family == local.family and type(proxy.family) is type(local.family)
    assert proxy.family.prompt_positions is not None
    for prompt in (
        SessionPrompt(voice="NATF2.pt", persona="short"),
        SessionPrompt(voice=None, persona="the default voice " * 3),
        SessionPrompt(voice="NATM1.pt", persona=""),
    ):
        assert proxy.family.prompt_positions(prompt) == local.family.prompt_positions(prompt)
        proxy.family.check_context(prompt)
    too_long = proxy.family.session_prompt(persona="word " * 400)
    for family in (proxy.family, local.family):
        with pytest.raises(InvalidRuntimeConfig, match="the persona is too long"):
            family.check_context(too_long)
    with pytest.raises(InvalidVoice, match=r"unknown voice 'x\.pt'"):
        proxy.family.prompt_positions(SessionPrompt(voice="x.pt"))


def test_exceptions_cross_with_type_message_and_code(engines):
    proxy, local = engines
    bad = SessionPrompt(voice="nobody.pt", persona="p")
    with pytest.raises(InvalidVoice) as local_err:
        local.reset(0, bad)
    with pytest.raises(InvalidVoice) as err:
        proxy.reset(0, bad)
    assert str(err.value) == str(local_err.value) and err.value.code == "invalid_voice"
    assert isinstance(err.value.__cause__, RemoteTraceback)
    assert "moshi_engine.py" in str(err.value.__cause__)  # the child's traceback
    with pytest.raises(InvalidVoice):
        proxy.prepare(bad)
    with pytest.raises(ValueError, match="frame must be"):
        proxy.step({0: np.zeros(10, dtype=np.float32)})
    with pytest.raises(IndexError, match="slot 5 out of range"):
        proxy.step({5: np.zeros(FRAME_SAMPLES, dtype=np.float32)})
    proxy.reset(0, SessionPrompt(voice="NATF2.pt"))  # the engine goes on
    assert proxy.step({0: np.zeros(FRAME_SAMPLES, dtype=np.float32)})[0].user_codes


def test_the_faults_wrapper_works_around_it(engines, tmp_path):
    proxy, _ = engines
    raise_, silence = tmp_path / "raise", tmp_path / "silence"
    faulty = FaultyEngine(proxy, Faults.parse(f"step_raise={raise_},step_silence={silence}"))
    assert faulty.family is proxy.family and faulty.slots == SLOTS
    frame = session_audio(4, 1)[0]
    faulty.reset(0, SessionPrompt(voice="NATF2.pt"))
    raise_.touch()
    with pytest.raises(InjectedFault):
        faulty.step({0: frame})
    silence.touch()
    assert not faulty.step({0: frame})[0].pcm.any()
    silence.unlink()
    assert faulty.step({0: frame})[0].pcm.any()


def test_a_prepare_runs_beside_steps_and_a_dead_child_fails_every_call(tiny_dir, tmp_path, caplog):
    gate, entered = tmp_path / "gate", tmp_path / "entered"
    proxy = EngineProcess("tiny", factory=gated_engine, gate=str(gate), entered=str(entered), slots=SLOTS)
    try:
        cold = SessionPrompt(voice="NATF0.pt", persona="gated: a persona nobody asked for yet.")
        results: list[object] = []
        prep = threading.Thread(target=lambda: results.append(proxy.prepare(cold)))
        prep.start()
        assert wait_file(entered)  # the child is inside prepare, held there until the gate opens
        proxy.reset(0, SessionPrompt(voice="NATF2.pt"))
        frames = session_audio(3, 5)
        stepped = [proxy.step({0: f})[0] for f in frames]
        assert len(stepped) == 5 and prep.is_alive() and results == []
        gate.touch()
        prep.join(30)
        assert results == [None]
        proxy.reset(1, cold)  # its snapshot is in the child's cache now

        # A prepare in flight when the child dies, and every call after it, fail clearly.
        entered.unlink()
        gate.unlink()
        errors: list[BaseException] = []

        def pending() -> None:
            try:
                proxy.prepare(SessionPrompt(voice="NATM1.pt", persona="gated, pending"))
            except BaseException as exc:
                errors.append(exc)

        prep = threading.Thread(target=pending)
        prep.start()
        assert wait_file(entered)
        with caplog.at_level(logging.ERROR, logger="duplex_actors.engine_process"):
            os.kill(proxy.pid, signal.SIGKILL)
            prep.join(30)
            assert len(errors) == 1 and isinstance(errors[0], EngineProcessDied)
            assert "killed by signal 9" in str(errors[0])
            for call in (
                lambda: proxy.step({0: frames[0]}),
                lambda: proxy.reset(0, None),
                lambda: proxy.prepare(cold),
            ):
                with pytest.raises(EngineProcessDied, match="killed by signal 9"):
                    call()
            deadline = time.monotonic() + 10
            while "exited unexpectedly with code -9" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert f"engine process {proxy.pid} exited unexpectedly with code -9" in caplog.text
        assert not proxy.alive and proxy.exitcode == -9
    finally:
        gate.touch()
        proxy.close()


def test_close_ends_the_child(tiny_dir):
    phases: list[PhaseReport] = []
    proxy = EngineProcess("tiny", slots=1, on_phase=phases.append)
    # The child's start-up phases reached the parent as they went, each with its duration.
    assert [p.name for p in phases if p.state == DONE] == ["import", "resolve", "load", "engine", "digest"]
    assert alive(proxy.pid) and proxy.alive
    proxy.close()
    assert not alive(proxy.pid) and proxy.exitcode == 0
    proxy.close()  # idempotent
    with pytest.raises(EngineProcessDied, match="closed"):
        proxy.step({0: np.zeros(FRAME_SAMPLES, dtype=np.float32)})


def test_a_failed_build_raises_its_error_and_leaves_no_child(tiny_dir):
    before = _engine_children()
    phases: list[PhaseReport] = []
    with pytest.raises(CheckpointError, match="no-such-model"):
        EngineProcess("no-such-model", slots=1, on_phase=phases.append)
    assert _engine_children() - before == set()
    failed = phases[-1]
    assert (failed.name, failed.state) == ("resolve", FAILED) and "no-such-model" in failed.detail


def _engine_children() -> set[int]:
    """This process's live children that multiprocessing spawned."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue  # a thread (a pytest or trio worker) that ended since the listing
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"spawn_main" in cmdline and alive(int(pid)):
                found.add(int(pid))
    return found


def test_the_child_exits_when_its_parent_dies(tiny_dir):
    parent = textwrap.dedent(
        """
        import sys, time
        from duplex_actors.model.process import EngineProcess

        if __name__ == "__main__":
            engine = EngineProcess("tiny", slots=1)
            print(engine.pid, flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert alive(child)
        proc.kill()  # no close, no atexit: the child only sees its pipe's EOF
        proc.wait(10)
        assert wait_gone(child), "the engine process outlived its parent"
    finally:
        proc.kill()
        proc.wait()
