"""Refused input is logged without its audio (docs/design.md §4, decision 11): the core answers a
read-only query, ``refusal_for``, and the shell logs the ``rejected`` record it returns."""

from __future__ import annotations

import numpy as np
import pytest

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.log import records as r
from duplex_actors.log.segment import read_log
from duplex_actors.model.checkpoint import checkpoint_from_dir
from duplex_actors.model.family import detect_family
from duplex_actors.model.loading import load_checkpoint
from duplex_actors.model.moshi_engine import MoshiEngine
from duplex_actors.replay.replayer import replay_logic
from duplex_actors.server import open_duplex_server
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore, SessionLimits

SID = "sess_0123456789abcdef01234567"
LIMIT = 10 * 24_000


@pytest.fixture(scope="module")
def engine(parrot_dir):
    return MoshiEngine(load_checkpoint(checkpoint_from_dir(parrot_dir)), slots=1)


def new_core() -> SessionCore:
    core = SessionCore(
        SID, detect_family(["NATF2.pt", "NATM1.pt"]), SessionLimits(max_buffered_samples=LIMIT)
    )
    core.apply(r.Open({}))
    return core


def f32(n: int) -> bytes:
    return encode_f32(np.full(n, 0.1, dtype=np.float32))


def test_refusal_for_is_a_pure_query_and_replays_as_the_append_would():
    records = [r.Append(f32(LIMIT - 100), "pcm_f32le"), r.Append(f32(200), "pcm_f32le", "big")]
    as_before, as_now = new_core(), new_core()
    for rec in records:
        before = [e.event for e in as_before.apply(rec) if isinstance(e, Emit)]
        refusal = as_now.refusal_for(rec)
        assert as_now.refusal_for(rec) == refusal  # asking changes nothing
        now = [e.event for e in as_now.apply(refusal or rec) if isinstance(e, Emit)]
        assert now == before
    assert refusal is not None and refusal.code == "input_backpressure"
    assert refusal.audio_bytes == 800 and refusal.client_event_id == "big"
    assert as_now.digests() == as_before.digests()  # an old log holding the append replays alike


def test_no_refusal_for_what_the_core_takes_or_refuses_otherwise():
    core = new_core()
    assert core.refusal_for(r.Append(f32(LIMIT), "pcm_f32le")) is None  # exactly the limit fits
    assert core.refusal_for(r.Append(b"")) is None  # bad_event, from the core itself
    g711 = r.Append(b"\x00" * (LIMIT // 3 + 1), "g711_ulaw", sample_rate_hz=8000)
    assert core.refusal_for(g711) is not None  # counted in 24 kHz samples: 3 per byte
    core.apply(r.Close("client_close"))
    assert core.refusal_for(r.Append(f32(LIMIT + 1), "pcm_f32le")) is None  # closed: session_closed instead


def test_a_rejected_record_with_audio_bytes_round_trips():
    rec = r.Rejected("input_audio_buffer.append", "input_backpressure", "m", "e", audio_bytes=7)
    kind, payload = r.encode_payload(rec)
    assert r.decode_payload(kind, payload) == rec
    old = r.Rejected("input_audio_buffer.commit", "commit_unsupported", "m")
    decoded = r.decode_payload(*r.encode_payload(old))
    assert isinstance(decoded, r.Rejected) and decoded.audio_bytes is None


async def test_the_session_logs_a_refused_append_without_its_audio(engine, tmp_path):
    events: list[ev.SessionEvent] = []
    limits = SessionLimits(max_buffered_samples=LIMIT)
    async with open_duplex_server(engine, log_dir=tmp_path, virtual_time=True, limits=limits) as server:
        s = await server.open_session()
        big = f32(LIMIT + FRAME_SAMPLES)
        await s.append_bytes(big, "pcm_f32le", client_event_id="big")
        await s.append_bytes(f32(FRAME_SAMPLES), "pcm_f32le")
        await s.close()
        async for event in s.events():
            events.append(event)
    (path,) = tmp_path.glob("*.dlog")
    records = [rec for _, rec in read_log(path).records]
    appends = [rec for rec in records if isinstance(rec, r.Append)]
    assert [len(a.audio) for a in appends] == [FRAME_SAMPLES * 4]
    (rejected,) = [rec for rec in records if isinstance(rec, r.Rejected)]
    assert (rejected.code, rejected.audio_bytes, rejected.client_event_id) == (
        "input_backpressure",
        len(big),
        "big",
    )
    assert path.stat().st_size < len(big) // 4
    errors = [e for e in events if isinstance(e, ev.Error)]
    assert [(e.code, e.client_event_id) for e in errors] == [("input_backpressure", "big")]
    report = replay_logic(path)
    assert report.complete and report.identical, report.summary()


async def test_an_append_over_the_soft_budget_waits_for_the_backlog_to_drain(engine, tmp_path):
    limits = SessionLimits(max_buffered_samples=LIMIT, input_budget_samples=24_000)
    async with open_duplex_server(engine, log_dir=tmp_path, virtual_time=True, limits=limits) as server:
        s = await server.open_session()
        actor = server.sessions[s.session_id]
        three_s = f32(3 * 24_000)
        await s.append_bytes(three_s, "pcm_f32le")  # the backlog was empty: taken at once
        assert s.input_held_since is None
        assert actor.input_backlog == 3 * 24_000  # queued or buffered, not yet stepped
        await s.append_bytes(f32(FRAME_SAMPLES), "pcm_f32le")
        # It waited until the model had consumed the backlog down to the 1 s budget.
        assert s.input_held_since is not None
        assert actor.core.frames_stepped >= (3 * 24_000 - 24_000) // FRAME_SAMPLES
        # Over the hard limit: not held back but refused at once (and cheaply logged).
        await s.append_bytes(f32(LIMIT + 1), "pcm_f32le", client_event_id="huge")
        assert s.input_held_since is None
        await s.close()
        errors = [e async for e in s.events() if isinstance(e, ev.Error)]
    assert [(e.code, e.client_event_id) for e in errors] == [("input_backpressure", "huge")]
