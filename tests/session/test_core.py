"""The session core as a pure state machine: records in, effects and events out."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.log import records as r
from duplex_actors.model.family import DEFAULT_PERSONA, detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import (
    Emit,
    ReleaseSlot,
    ResetSlot,
    SessionCore,
    SessionLimits,
    SubmitFrame,
    _entry_sizes,
    _json_size,
    _size_of,
)

SID = "sess_0123456789abcdef01234567"


def new_core(**limits) -> SessionCore:
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]), SessionLimits(**limits))
    core.apply(r.Open({}))
    return core


def events(effects) -> list:
    return [e.event for e in effects if isinstance(e, Emit)]


def append(core: SessionCore, n: int, value: float = 0.1, fmt: str = "pcm_f32le"):
    samples = np.full(n, value, dtype=np.float32)
    audio = encode_f32(samples) if fmt == "pcm_f32le" else (samples * 32767).astype("<i2").tobytes()
    return core.apply(r.Append(audio, fmt))


def step(core: SessionCore, epoch: int, index: int, text: str = "") -> list:
    return core.apply(
        r.Step(epoch, index, True, 5, text, (1,) * 8, (2,) * 8, np.zeros(FRAME_SAMPLES, "<i2").tobytes())
    )


def test_open_emits_created_then_updated_and_a_reset():
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
    effects = core.apply(r.Open({"voice": "NATM1.pt", "modalities": ["audio"]}))
    created, updated = events(effects)
    assert isinstance(created, ev.SessionCreated) and isinstance(updated, ev.SessionUpdated)
    assert created.config == updated.config
    assert created.config["voice"] == "NATM1.pt" and created.config["modalities"] == ["audio"]
    assert created.config["instructions"] == DEFAULT_PERSONA
    (reset,) = [e for e in effects if isinstance(e, ResetSlot)]
    assert reset.epoch == 0 and reset.prompt.voice == "NATM1.pt"


@pytest.mark.parametrize(
    "chunks", [[1920], [1000, 920], [5000, 3, 1], [1, 1919, 1920 * 3 + 7], [4000, 4000, 4000]]
)
def test_any_chunk_sizes_drain_every_whole_frame(chunks):
    core = new_core()
    submitted = []
    for n in chunks:
        submitted += [e for e in append(core, n) if isinstance(e, SubmitFrame)]
    total = sum(chunks)
    assert [s.frame_index for s in submitted] == list(range(total // FRAME_SAMPLES))
    assert all(s.samples.shape == (FRAME_SAMPLES,) for s in submitted)
    assert core.buffered_samples == total  # nothing stepped yet: partial tail + pending frames


def test_pcm16_and_float_give_the_same_frames():
    a, b = new_core(), new_core()
    fa = [e for e in append(a, 1920, 0.5) if isinstance(e, SubmitFrame)]
    fb = [e for e in append(b, 1920, 0.5, "pcm16") if isinstance(e, SubmitFrame)]
    assert np.allclose(fa[0].samples, fb[0].samples, atol=1e-4)


@pytest.mark.parametrize(
    "audio, fmt, code",
    [
        (b"", "pcm16", "bad_event"),
        (b"\x00\x01\x02", "pcm16", "bad_audio"),
        (np.array([np.nan], "<f4").tobytes(), "pcm_f32le", "bad_audio"),
        (b"\x00\x00", "mulaw", "unsupported_audio_format"),
    ],
)
def test_bad_audio_is_refused_and_the_session_stays_usable(audio, fmt, code):
    core = new_core()
    (err,) = events(core.apply(r.Append(audio, fmt, "evt_1")))
    assert isinstance(err, ev.Error) and err.code == code and err.client_event_id == "evt_1"
    assert any(isinstance(e, SubmitFrame) for e in append(core, 1920))


def test_backpressure_counts_tail_and_unstepped_frames():
    limit = 10 * 24_000
    core = new_core(max_buffered_samples=limit)
    append(core, limit - 100)
    (err,) = events(append(core, 200))
    assert err.code == "input_backpressure"
    step(core, 0, 0)  # one frame stepped frees room for it
    assert not events(append(core, 200))


def test_limits_hold_at_least_ten_seconds():
    with pytest.raises(ValueError):
        SessionLimits(max_buffered_samples=24_000)


def test_voice_and_persona_change_until_the_first_frame_then_only_same_value():
    core = new_core()
    effects = core.apply(r.Update({"voice": "NATM1.pt", "instructions": "Be brief."}, "u1"))
    (updated,) = events(effects)
    assert updated.config["voice"] == "NATM1.pt" and updated.client_event_id == "u1"
    assert [e.prompt.persona for e in effects if isinstance(e, ResetSlot)] == ["Be brief."]
    append(core, FRAME_SAMPLES)
    (err,) = events(core.apply(r.Update({"voice": "NATF2.pt"}, "u2")))
    assert err.code == "voice_update_unsupported" and err.client_event_id == "u2"
    (err,) = events(core.apply(r.Update({"instructions": "Be long."})))
    assert err.code == "persona_update_unsupported"
    effects = core.apply(r.Update({"voice": "NATM1.pt", "instructions": "Be brief.", "tools": []}))
    assert [type(e) for e in events(effects)] == [ev.SessionUpdated]
    assert not [e for e in effects if isinstance(e, ResetSlot)]


@pytest.mark.parametrize(
    "config, code",
    [
        ({"voice": "../NATF2.pt"}, "invalid_voice"),
        ({"voice": "x.wav"}, "invalid_voice"),
        ({"extra_body": {"personaplex_voice_prompt": "/etc"}}, "invalid_duplex_runtime_config"),
        ({"temperature": -1}, "invalid_duplex_runtime_config"),
    ],
)
def test_invalid_updates_are_refused(config, code):
    core = new_core()
    before = dict(core.config)
    (err,) = events(core.apply(r.Update(config)))
    assert err.code == code
    assert core.config == before


def test_an_update_past_the_config_bound_is_invalid_value_and_changes_nothing():
    core = new_core(max_config_bytes=64 * 1024)
    accepted = refused = 0
    for i in range(10):
        before = dict(core.config)
        effects = core.apply(r.Update({f"key{i}": "x" * 10_000}, client_event_id=f"u{i}"))
        (event,) = events(effects)
        if isinstance(event, ev.SessionUpdated):
            accepted += 1
            assert len(json.dumps(event.config, separators=(",", ":"))) <= 64 * 1024
        else:
            refused += 1
            assert event.code == "invalid_value" and event.client_event_id == f"u{i}"
            assert core.config == before
            assert not [e for e in effects if isinstance(e, ResetSlot)]
    assert accepted == 6 and refused == 4
    # Replacing a big key with a small one still fits and is taken.
    (event,) = events(core.apply(r.Update({"key0": "small"})))
    assert isinstance(event, ev.SessionUpdated) and event.config["key0"] == "small"


def test_the_default_config_bound_is_256_kib():
    assert SessionLimits().max_config_bytes == 256 * 1024


def test_response_lifecycle_cancel_and_a_new_epoch():
    core = new_core()
    append(core, FRAME_SAMPLES * 3)
    e0 = events(step(core, 0, 0, "Hi"))
    assert [type(e) for e in e0] == [ev.ResponseStarted, ev.AudioFrame]
    rid = e0[0].response_id
    assert rid == "resp_0123456789abcdef01234567_0" and e0[0].item_id == "item_0123456789abcdef01234567_0"
    assert events(step(core, 0, 1, " there"))[0].text == " there"
    effects = core.apply(r.Cancel("c1"))
    (ended,) = events(effects)
    assert isinstance(ended, ev.ResponseEnded) and ended.reason == "client_cancelled"
    assert ended.transcript == "Hi there" and ended.frames == 2 and not ended.audio_cleared
    assert [e.epoch for e in effects if isinstance(e, ResetSlot)] == [1]
    # Frame 2 was drained before the cancel: it is carried into epoch 1; a result of
    # epoch 0 arriving late is dropped.
    assert events(step(core, 0, 2)) == []
    assert core.frames_pending == 0
    append(core, FRAME_SAMPLES)
    e1 = events(step(core, 1, 3))
    assert isinstance(e1[0], ev.ResponseStarted) and e1[0].response_id.endswith("_1") and e1[0].epoch == 1
    assert e1[1].frame_index == 3
    assert core.frames_out == 3 <= core.frames_in == 4


def test_cancel_without_a_response_is_an_error_and_no_new_epoch():
    core = new_core()
    (err,) = events(core.apply(r.Cancel("c9")))
    assert err.code == "response_cancel_not_active" and err.client_event_id == "c9"
    assert core.epoch == 0


def test_output_clear():
    core = new_core()
    assert [type(e) for e in events(core.apply(r.ClearOutput()))] == [ev.OutputCleared]
    append(core, FRAME_SAMPLES)
    step(core, 0, 0)
    (ended,) = events(core.apply(r.ClearOutput()))
    assert ended.audio_cleared and ended.reason == "output_audio_buffer_clear"
    assert core.epoch == 1


def test_input_clear_drops_only_the_partial_frame():
    core = new_core()
    append(core, FRAME_SAMPLES + 100)
    assert [type(e) for e in events(core.apply(r.ClearInput()))] == [ev.InputCleared]
    assert core.buffered_samples == FRAME_SAMPLES  # the drained frame is still waiting
    frames = [e for e in append(core, FRAME_SAMPLES - 100) if isinstance(e, SubmitFrame)]
    assert frames == []  # the 100 samples are gone: 1820 is not a whole frame
    assert core.epoch == 0


def test_speech_started_once_per_epoch():
    core = new_core()
    quiet = events(append(core, FRAME_SAMPLES, 0.001))
    assert quiet == []
    (started,) = events(append(core, FRAME_SAMPLES * 2, 0.3))
    assert isinstance(started, ev.SpeechStarted) and started.frame_index == 1
    step(core, 0, 0)
    core.apply(r.Cancel())
    (again,) = events(append(core, FRAME_SAMPLES, 0.3))
    assert again.epoch == 1 and again.frame_index == 3


def test_close_ends_the_response_releases_then_closes_and_refuses_what_follows():
    core = new_core()
    append(core, FRAME_SAMPLES)
    step(core, 0, 0)
    effects = core.apply(r.Close("client_close"))
    kinds = [type(e).__name__ if not isinstance(e, Emit) else type(e.event).__name__ for e in effects]
    assert kinds == ["ResponseEnded", "ReleaseSlot", "SessionClosed"]
    assert isinstance(effects[1], ReleaseSlot)
    assert core.closed
    for late in (core.apply(r.Heartbeat()), step(core, 0, 1)):
        assert [e.code for e in events(late)] == ["session_closed"] and len(late) == 1


def test_small_commands():
    core = new_core()
    assert events(core.apply(r.Heartbeat("h"))) == [ev.HeartbeatAck("h")]
    assert events(core.apply(r.PlaybackAck({"frame_index": 3}, "p"))) == [
        ev.PlaybackAcknowledged({"frame_index": 3}, "p")
    ]
    (err,) = events(
        core.apply(r.Rejected("input_audio_buffer.commit", "commit_unsupported", "no commits", "e1"))
    )
    assert err == ev.Error("commit_unsupported", "no commits", "e1")


def test_digests_depend_on_every_event_and_frame():
    def run(text: str) -> r.End:
        core = new_core()
        append(core, FRAME_SAMPLES)
        step(core, 0, 0, text)
        core.apply(r.Close("client_close"))
        return core.digests()

    a, b, c = run("x"), run("x"), run("y")
    assert a == b and a.events_sha256 != c.events_sha256 and a.audio_sha256 == c.audio_sha256
    assert a.frames_out == 1 and a.events == 7  # created, updated, speech, started, frame, ended, closed


def test_the_transcript_is_capped_in_the_core_and_the_pieces_are_not():
    core = new_core()
    pieces = [chr(ord("a") + i) * 10_000 for i in range(8)]  # 80 000 characters in all
    append(core, FRAME_SAMPLES * len(pieces))
    frames = [e for i, p in enumerate(pieces) for e in events(step(core, 0, i, p))]
    assert [f.text for f in frames if isinstance(f, ev.AudioFrame)] == pieces
    (ended,) = [e for e in events(core.apply(r.Cancel())) if isinstance(e, ev.ResponseEnded)]
    assert len(ended.transcript) == ev.MAX_TRANSCRIPT_CHARS
    assert ended.transcript == "".join(pieces)[: ev.MAX_TRANSCRIPT_CHARS]
    assert ended.frames == len(pieces)


def test_an_extra_body_that_is_not_an_object_is_refused():
    core = new_core()
    (err,) = events(core.apply(r.Update({"extra_body": ["personaplex_persona"]}, "u1")))
    assert err == ev.Error("invalid_duplex_runtime_config", "extra_body must be an object", "u1")
    assert "extra_body" not in core.config
    opened = SessionCore(SID, detect_family(["NATF2.pt"]))
    kinds = [type(e).__name__ for e in events(opened.apply(r.Open({"extra_body": "x"}, "o1")))]
    assert kinds == ["SessionCreated", "SessionUpdated", "Error"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=12))
def test_frames_do_not_depend_on_how_the_input_was_chunked(sizes):
    """The partial frame is a reused buffer: every submitted frame is its own copy, equal to
    the frames of the same samples appended in one go, and the tail is what is left."""
    rng = np.random.default_rng(len(sizes))
    samples = (0.1 * rng.standard_normal(sum(sizes))).astype(np.float32)
    whole, chunked = new_core(), new_core()
    one = [
        e.samples
        for e in whole.apply(r.Append(encode_f32(samples), "pcm_f32le"))
        if isinstance(e, SubmitFrame)
    ]
    many, at = [], 0
    for n in sizes:
        effects = chunked.apply(r.Append(encode_f32(samples[at : at + n]), "pcm_f32le"))
        many += [e.samples for e in effects if isinstance(e, SubmitFrame)]
        at += n
    assert len(one) == len(many) == len(samples) // FRAME_SAMPLES
    for a, b in zip(one, many, strict=True):
        assert a.tobytes() == b.tobytes()
    assert len({id(f) for f in many}) == len(many)
    assert whole.buffered_samples == chunked.buffered_samples
    assert chunked.buffered_samples == len(samples) % FRAME_SAMPLES + chunked.frames_pending * FRAME_SAMPLES


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _JSON, max_size=6))
def test_the_config_size_from_entry_sizes_is_the_compact_json_size(config):
    entries = _entry_sizes(config)
    assert entries is not None and _size_of(entries) == _json_size(config)


def test_a_refused_oversize_update_names_the_exact_merged_size():
    core = new_core(max_config_bytes=64 * 1024)
    first = {"k0": "x" * 40_000}
    assert [type(e) for e in events(core.apply(r.Update(first)))] == [ev.SessionUpdated]
    update = {"k1": "y" * 40_000}
    merged = core._effective({**core.config, **update}, core.prompt)
    (err,) = events(core.apply(r.Update(update)))
    assert err.code == "invalid_value" and f"would be {_json_size(merged)} bytes" in err.message
