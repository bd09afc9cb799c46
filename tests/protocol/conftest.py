"""Fixtures for the sans-io protocol tests: capabilities and a neutral event stream made by
the real session core."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from duplex_actors.audio import FRAME_SAMPLES
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore

SID = "sess_00112233445566778899aabb"


@pytest.fixture
def capabilities() -> dict[str, Any]:
    return {
        "implementation_level": "model_native_duplex",
        "chunk_period_ms": 80,
        "supports_client_commit": False,
        "supports_external_turn_signal": False,
        "supports_barge_in": False,
        "supports_session_resume": False,
        "supports_audio_truncate": False,
        "supports_playback_ack": True,
        "supports_input_append": True,
        "supports_multi_session": True,
        "supports_multi_session_same_replica": True,
        "input_modes": ["append_audio_chunk"],
    }


def _step(epoch: int, index: int, text: str) -> r.Step:
    pcm = (np.arange(FRAME_SAMPLES) % 100).astype("<i2").tobytes()
    return r.Step(epoch, index, True, 5, text, (1,) * 8, (2,) * 8, pcm)


def core_events() -> list[ev.SessionEvent]:
    """A whole session from the real core: open, loud input, two frames of output (one with
    text), cancel, a frame of the next epoch, output clear, heartbeat, playback ack, a refused
    cancel, input clear, an idle output clear, a refused update, a response open at close."""
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
    records: list[r.Record] = [
        r.Open({"voice": "NATM1.pt", "modalities": ["audio"], "turn_detection": None}),
        r.Append((np.full(FRAME_SAMPLES * 4, 0.3, "<f4")).tobytes(), "pcm_f32le", "ev_append"),
        _step(0, 0, "Hel"),
        _step(0, 1, ""),
        r.Cancel("ev_cancel"),
        _step(1, 2, "lo"),
        r.ClearOutput("ev_clear"),
        r.Heartbeat("ev_hb"),
        r.PlaybackAck({"played_ms": 160}, "ev_ack"),
        r.Cancel("ev_cancel2"),
        r.ClearInput("ev_clear_in"),
        r.ClearOutput("ev_clear_idle"),
        r.Update({"voice": "NATF2.pt"}, "ev_update"),
        _step(2, 3, "!"),
        r.Close("client_close"),
    ]
    out: list[ev.SessionEvent] = []
    for record in records:
        out += [e.event for e in core.apply(record) if isinstance(e, Emit)]
    return out


@pytest.fixture
def session_events() -> list[ev.SessionEvent]:
    return core_events()
