"""Properties of resume (docs/protocol.md §10): the output journal against a list, and the
session core, whose emitted events and audio do not depend on where detach and resume records
fall between its commands and step results."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex_actors.audio import FRAME_SAMPLES, encode_f32, float_to_pcm16
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore, SubmitFrame
from duplex_actors.session.journal import CursorAhead, Journal

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SID = "sess_0123456789abcdef01234567"
HEADER = r.Header(r.FORMAT_VERSION, SID, "tiny", "", "float32", {}, {}, "native", {}, "0", 0.0)


# -- the journal -------------------------------------------------------------------------------------
journal_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 300)),
        st.tuples(st.just("ack"), st.integers(0, 60)),
        st.tuples(st.just("read"), st.integers(0, 60)),
    ),
    max_size=80,
)


@SETTINGS
@given(journal_ops, st.integers(100, 2000))
def test_the_journal_replays_exactly_what_follows_a_cursor_it_covers(
    ops: list[tuple[str, int]], bound: int
) -> None:
    journal = Journal(bound)
    sent: list[str] = []
    for op, n in ops:
        if op == "append":
            message = f"{len(sent) + 1}:" + "x" * n
            assert journal.append(message) == len(sent) + 1
            sent.append(message)
        elif op == "ack":
            if n > len(sent):
                with pytest.raises(CursorAhead):
                    journal.ack(n)
            else:
                journal.ack(n)
        elif n <= len(sent):
            if journal.covers(n):
                assert journal.after(n) == sent[n:]
                assert journal.after(n, 3) == sent[n : n + 3]
            else:
                assert journal.after(n) == sent[journal.oldest - 1 :]
        assert journal.bytes == sum(len(m) for m in sent[journal.oldest - 1 :])
        # Bounded: within the bound, or only the newest message kept.
        assert journal.bytes <= bound or len(journal) == 1


# -- the session core --------------------------------------------------------------------------------
def step_for(core: SessionCore, submit: SubmitFrame, epoch: int) -> r.Step:
    """What a parrot model answers for a frame: its own samples, halved."""
    return r.Step(
        epoch=epoch,
        frame_index=submit.frame_index,
        ready=True,
        text_token=3,
        text_piece="",
        agent_codes=(1,) * 8,
        user_codes=(2,) * 8,
        pcm16=float_to_pcm16(submit.samples * 0.5),
    )


session_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3 * FRAME_SAMPLES), st.integers(0, 2**16)),
        st.tuples(st.just("step"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("cancel"), st.booleans(), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
        st.tuples(st.just("ack"), st.just(0), st.just(0)),
        st.tuples(st.just("detach"), st.just(0), st.just(0)),
        st.tuples(st.just("resume"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


def run(ops: list[tuple[str, Any, Any]], *, with_resumes: bool) -> tuple[r.End, list[bytes], list[str]]:
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
    queued: list[tuple[SubmitFrame, int]] = []
    audio: list[bytes] = []
    kinds: list[str] = []
    generation = 1

    def apply(record: r.Record) -> None:
        for effect in core.apply(record):
            if isinstance(effect, SubmitFrame):
                queued.append((effect, core.epoch))
            elif isinstance(effect, Emit):
                kinds.append(type(effect.event).__name__)
                if isinstance(effect.event, ev.AudioFrame):
                    audio.append(effect.event.pcm16)

    apply(HEADER)
    apply(r.Open({"duplex": {"alignment": "off"}}))
    for op, a, b in ops:
        if op == "append":
            samples = (0.3 * np.random.default_rng(b).standard_normal(a)).astype(np.float32)
            apply(r.Append(encode_f32(samples), "pcm_f32le"))
        elif op == "step":
            for _ in range(min(a, len(queued))):
                submit, epoch = queued.pop(0)
                apply(step_for(core, submit, epoch))
        elif op == "cancel":
            apply(r.Cancel(reset=a))
        elif op == "clear":
            apply(r.ClearInput())
        elif op in ("detach", "resume") and with_resumes:
            if op == "detach" and core.attached:
                apply(r.Detach(generation, "dropped"))
            elif op == "resume" and not core.attached:
                generation += 1
                apply(r.Resume(generation, 0, 1, core.events_emitted, core.client_samples))
        # "ack" trims the connection's journal: the core never sees it.
    while queued:
        submit, epoch = queued.pop(0)
        apply(step_for(core, submit, epoch))
    apply(r.Close("client_close"))
    return core.digests(), audio, kinds


@SETTINGS
@given(session_ops)
def test_detach_and_resume_anywhere_change_nothing_the_session_emits(ops: list[tuple[str, Any, Any]]) -> None:
    with_resumes = run(ops, with_resumes=True)
    without = run(ops, with_resumes=False)
    assert with_resumes == without
