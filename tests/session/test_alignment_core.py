"""Alignment in the session core (spec section 7): pads, hints, drains, ``input_samples_end``
and the ``duplex.alignment`` config key; a hypothesis property over appends and pads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore, SessionLimits, SubmitFrame

SID = "sess_0123456789abcdef01234567"


def header(version: int = r.FORMAT_VERSION) -> r.Header:
    return r.Header(version, SID, "tiny", "", "float32", {}, {}, "realtime", {}, "0", 0.0)


def new_core(version: int = r.FORMAT_VERSION, config: dict | None = None, **limits) -> SessionCore:
    core = SessionCore(SID, detect_family(["NATF2.pt"]), SessionLimits(**limits))
    core.apply(header(version))
    core.apply(r.Open(config or {}))
    return core


def pcm16(n: int, value: float = 0.1) -> bytes:
    return (np.full(n, value, dtype=np.float32) * 32767).astype("<i2").tobytes()


def step(core: SessionCore, index: int, epoch: int = 0) -> list:
    pcm = np.zeros(FRAME_SAMPLES, "<i2").tobytes()
    return core.apply(r.Step(epoch, index, True, 5, "", (1,) * 8, (2,) * 8, pcm))


def emitted(effects: list) -> list:
    return [e.event for e in effects if isinstance(e, Emit)]


def frames(effects: list) -> list[SubmitFrame]:
    return [e for e in effects if isinstance(e, SubmitFrame)]


def test_a_pad_inserts_zeros_after_the_partial_tail():
    core = new_core()
    assert frames(core.apply(r.Append(pcm16(1000), "pcm16"))) == []
    (frame,) = frames(core.apply(r.Pad(920, "start")))  # 1000 + 920 = one whole frame
    assert np.all(frame.samples[:1000] > 0.09) and np.all(frame.samples[1000:] == 0)
    assert core.tail_samples == 0 and core.pad_samples == 920
    (audio,) = [e for e in emitted(step(core, 0)) if isinstance(e, ev.AudioFrame)]
    assert audio.input_samples_end == 1000  # the frame ended inside the pad: its start


def test_the_frames_that_hold_a_pad_are_marked_padded():
    # The scheduler owes the double a re-alignment makes a catch-up: it needs to know which
    # frame holds a pad the server asked for (and only that one: the frames after it are the
    # client's own).
    core = new_core()
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(FRAME_SAMPLES), "pcm16")))] == [False]
    core.apply(r.AlignHint(50, "margin"))
    assert frames(core.apply(r.Pad(1200, "client"))) == []
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(720), "pcm16")))] == [True]
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(FRAME_SAMPLES), "pcm16")))] == [False]
    # A client's pad that answers no hint is inserted, but is not the server's to pay back.
    core.apply(r.Pad(1200, "client"))
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(720), "pcm16")))] == [False]
    # A pad that fills one frame and spills into the next marks both; a clear forgets it.
    core.apply(r.Append(pcm16(1000), "pcm16"))
    assert [f.padded for f in frames(core.apply(r.Pad(1000, "drift")))] == [True]
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(1840), "pcm16")))] == [True]
    core.apply(r.Pad(500, "drift"))
    core.apply(r.ClearInput())
    assert [f.padded for f in frames(core.apply(r.Append(pcm16(FRAME_SAMPLES), "pcm16")))] == [False]


def test_a_pad_past_the_bound_is_refused_and_inserts_nothing():
    core = new_core(max_pad_samples=1000)
    assert emitted(core.apply(r.Pad(600, "start"))) == []
    (error,) = emitted(core.apply(r.Pad(600, "drift")))
    assert isinstance(error, ev.Error) and error.code == "invalid_value"
    assert core.pad_samples == 600 and core.tail_samples == 600
    for bad in (r.Pad(0, "start"), r.Pad(10, "why")):
        (error,) = emitted(core.apply(bad))
        assert error.code == "invalid_value"
    assert core.tail_samples == 600


def test_an_align_hint_is_an_event_and_a_bad_one_an_error():
    core = new_core()
    assert emitted(core.apply(r.AlignHint(37, "start"))) == [ev.AlignmentHint(37, "start")]
    for bad in (r.AlignHint(0, "start"), r.AlignHint(80, "start"), r.AlignHint(5, "client")):
        (error,) = emitted(core.apply(bad))
        assert isinstance(error, ev.Error) and error.code == "invalid_value"


def test_a_drained_frame_is_done_without_output():
    core = new_core()
    core.apply(r.Append(pcm16(3 * FRAME_SAMPLES), "pcm16"))
    assert core.frames_pending == 3
    assert core.apply(r.Drain(1)) == []
    assert core.frames_pending == 2 and core.frames_out == 0
    step(core, 0)
    (audio,) = [e for e in emitted(step(core, 2)) if isinstance(e, ev.AudioFrame)]
    assert (audio.frame_index, audio.input_samples_end) == (2, 3 * FRAME_SAMPLES)
    assert core.frames_pending == 0
    errors = emitted(core.apply(r.Drain(3)))  # nothing waits: the log contradicts the session
    assert [e.code for e in errors] == ["internal_error"]


def test_positions_are_filled_only_from_format_4_on():
    for version, want in ((3, None), (4, FRAME_SAMPLES)):
        core = new_core(version)
        core.apply(r.Append(pcm16(FRAME_SAMPLES), "pcm16"))
        (audio,) = [e for e in emitted(step(core, 0)) if isinstance(e, ev.AudioFrame)]
        assert audio.input_samples_end == want
    old = ev.AudioFrame("r", "i", 0, 0, b"\0\0", "")
    assert b"input_samples_end" not in ev.canonical_bytes(old)
    assert "input_samples_end" not in ev.event_to_jsonable(old)
    assert b'"input_samples_end":5' in ev.canonical_bytes(ev.AudioFrame("r", "i", 0, 0, b"", "", 5))


def test_positions_count_client_samples_at_the_client_rate():
    core = new_core()
    core.apply(r.Append(pcm16(FRAME_SAMPLES // 3), "pcm16", sample_rate_hz=8000))  # 80 ms at 8 kHz
    out: list = []
    for _ in range(5):
        out += frames(core.apply(r.Append(pcm16(FRAME_SAMPLES // 3), "pcm16", sample_rate_hz=8000)))
    ends: list[int] = []
    for f in out:
        ends += [
            e.input_samples_end
            for e in emitted(step(core, f.frame_index))
            if isinstance(e, ev.AudioFrame) and e.input_samples_end is not None
        ]
    assert len(ends) == len(out)
    assert ends == sorted(ends) and all(0 < e <= 6 * 640 for e in ends)
    assert core.client_samples == 6 * 640


@pytest.mark.parametrize(
    ("duplex", "ok"),
    [({"alignment": "client"}, True), ({"alignment": "off"}, True), ({}, True), ({"alignment": "x"}, False),
     ({"alignment": 1}, False), ("client", False)],
)  # fmt: skip
def test_duplex_alignment_is_validated(duplex, ok):
    core = new_core()
    (event,) = emitted(core.apply(r.Update({"duplex": duplex}, "u")))
    if ok:
        assert isinstance(event, ev.SessionUpdated) and event.config["duplex"] == duplex
        assert core.alignment == (duplex.get("alignment", "server"))
    else:
        assert isinstance(event, ev.Error) and event.code == "invalid_value"
        assert "duplex" not in core.config and core.alignment == "server"


def test_a_bad_opening_alignment_opens_with_defaults_and_says_why():
    core = SessionCore(SID, detect_family(["NATF2.pt"]))
    evs = emitted(core.apply(r.Open({"duplex": {"alignment": "sometimes"}})))
    assert [type(e).__name__ for e in evs] == ["SessionCreated", "SessionUpdated", "Error"]
    assert evs[-1].code == "invalid_value" and core.alignment == "server"


_ITEM = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5000), st.sampled_from(["pcm16", "pcm_f32le"])),
    st.tuples(st.just("pad"), st.integers(1, 1900), st.just("")),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_ITEM, max_size=40))
def test_frames_and_positions_over_any_interleaving_of_appends_and_pads(items):
    core = new_core(max_pad_samples=10**9)
    client = pads = 0
    # The client position of every 24 kHz sample of the server stream (pads: the position at
    # their start), to check each frame's input_samples_end against.
    position_after: list[int] = []
    submitted: list[int] = []
    for kind, n, fmt in items:
        if kind == "append":
            data = pcm16(n) if fmt == "pcm16" else encode_f32(np.full(n, 0.1, dtype=np.float32))
            effects = core.apply(r.Append(data, fmt))
            position_after += range(client + 1, client + n + 1)
            client += n
        else:
            effects = core.apply(r.Pad(n, "margin"))
            position_after += [client] * n
            pads += n
        assert not [e for e in emitted(effects) if isinstance(e, ev.Error)]
        submitted += [f.frame_index for f in frames(effects)]
    assert core.frames_in == len(submitted) == (client + pads) // FRAME_SAMPLES
    ends: list[int] = []
    for index in submitted:
        ends += [
            e.input_samples_end
            for e in emitted(step(core, index))
            if isinstance(e, ev.AudioFrame) and e.input_samples_end is not None
        ]
    assert ends == sorted(ends)
    assert ends == [position_after[(k + 1) * FRAME_SAMPLES - 1] for k in range(len(submitted))]
    assert core.client_samples == client and core.pad_samples == pads
