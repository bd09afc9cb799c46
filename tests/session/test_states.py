"""The session core's states, table-driven: every record kind in every state.

The expected table is written out here, independently of ``core.ACCEPTS``: a record either moves
the core as the table says, or is refused with an ``error`` event carrying the code it names.
Nothing is ignored silently.
"""

from __future__ import annotations

import numpy as np
import pytest

from duplex_actors.audio import FRAME_SAMPLES, encode_f32
from duplex_actors.error_codes import CODES
from duplex_actors.log import records as r
from duplex_actors.model.family import detect_family
from duplex_actors.session import events as ev
from duplex_actors.session.core import Emit, SessionCore, State

SID = "sess_0123456789abcdef01234567"
FRAME = encode_f32(np.full(FRAME_SAMPLES, 0.1, dtype=np.float32))
HEADER = r.Header(1, SID, "tiny", "", "float32", {}, {}, "realtime", {}, "0", 0.0)


def sample(kind: str) -> r.Record:
    records: dict[str, r.Record] = {
        "header": HEADER,
        "open": r.Open({}, "o"),
        "update": r.Update({"temperature": 0.5}, "u"),
        "append": r.Append(FRAME, "pcm_f32le", "a"),
        "clear_input": r.ClearInput("ci"),
        "clear_output": r.ClearOutput("co"),
        "cancel": r.Cancel("c"),
        "heartbeat": r.Heartbeat("h"),
        "playback_ack": r.PlaybackAck({"frame_index": 0}, "p"),
        "rejected": r.Rejected("input_audio_buffer.commit", "commit_unsupported", "no commits", "x"),
        "step": r.Step(0, 0, True, 5, "hi", (1,) * 8, (2,) * 8, bytes(2 * FRAME_SAMPLES)),
        "close": r.Close("client_close"),
        "end": r.End("0" * 64, "0" * 64, 0, 0),
        "pad": r.Pad(480, "start"),
        "align_hint": r.AlignHint(20, "start"),
        "drain": r.Drain(0),
        "truncate": r.Truncate("item_x", 0, 240, "t"),
        "text_item": r.TextItem("user", "hello", None, "ti"),
        "retrieve_item": r.RetrieveItem("item_0123456789abcdef01234567_0", "ri"),
        "detach": r.Detach(1, "dropped"),
        "resume": r.Resume(2, 3, 4, 5, 1920, "c"),
    }
    return records[kind]


KINDS = [
    "header", "open", "update", "append", "clear_input", "clear_output", "cancel",
    "heartbeat", "playback_ack", "rejected", "step", "close", "end", "pad", "align_hint", "drain",
    "truncate", "text_item", "retrieve_item", "detach", "resume",
]  # fmt: skip


def core_in(state: State) -> SessionCore:
    """A core in ``state``; OPEN and RESPONDING have one frame waiting for its step result."""
    core = SessionCore(SID, detect_family(["NATF2.pt", "NATM1.pt"]))
    if state is State.IDLE:
        return core
    core.apply(r.Open({}))
    if state is State.ERROR:
        core.apply(HEADER)  # a header after the open: the log is out of order
    elif state is State.CLOSED:
        core.apply(r.Close("client_close"))
    else:
        core.apply(r.Append(FRAME + (FRAME if state is State.RESPONDING else b""), "pcm_f32le"))
        if state is State.RESPONDING:
            core.apply(sample("step"))
    assert core.state is state
    return core


IDLE, OPEN, RESP, ERR, CLOSED = State.IDLE, State.OPEN, State.RESPONDING, State.ERROR, State.CLOSED
BUG = (ERR, "internal_error")  # the record contradicts the session's life
# (state, record kind) -> (state after, error code or None)
TABLE: dict[State, dict[str, tuple[State, str | None]]] = {
    IDLE: {"header": (IDLE, None), "open": (OPEN, None), "close": (CLOSED, None)},
    OPEN: {
        "header": BUG, "open": BUG, "end": BUG,
        "update": (OPEN, None), "append": (OPEN, None), "clear_input": (OPEN, None), "clear_output": (OPEN, None),
        "cancel": (OPEN, "response_cancel_not_active"), "heartbeat": (OPEN, None), "playback_ack": (OPEN, None),
        "rejected": (OPEN, "commit_unsupported"), "step": (RESP, None), "close": (CLOSED, None),
        "pad": (OPEN, None), "align_hint": (OPEN, None), "drain": (OPEN, None),
        "truncate": (OPEN, None), "text_item": (OPEN, None),
        "retrieve_item": (OPEN, "item_retrieve_invalid_item_id"),
        "detach": (OPEN, None), "resume": (OPEN, None),
    },
    RESP: {
        "header": BUG, "open": BUG, "end": BUG,
        "update": (RESP, None), "append": (RESP, None), "clear_input": (RESP, None), "clear_output": (OPEN, None),
        "cancel": (OPEN, None), "heartbeat": (RESP, None), "playback_ack": (RESP, None),
        "rejected": (RESP, "commit_unsupported"), "step": (RESP, None), "close": (CLOSED, None),
        "pad": (RESP, None), "align_hint": (RESP, None), "drain": (RESP, None),
        "truncate": (RESP, None), "text_item": (RESP, None), "retrieve_item": (RESP, None),
        "detach": (RESP, None), "resume": (RESP, None),
    },
    ERR: {"close": (CLOSED, None)},
    CLOSED: {"end": (CLOSED, None)},
}  # fmt: skip
DEFAULT = {IDLE: BUG, OPEN: BUG, RESP: BUG, ERR: (ERR, "internal_error"), CLOSED: (CLOSED, "session_closed")}
CASES = [(state, kind, *TABLE[state].get(kind, DEFAULT[state])) for state in State for kind in KINDS]


@pytest.mark.parametrize(
    ("state", "kind", "after", "code"), CASES, ids=[f"{c[0].value}-{c[1]}" for c in CASES]
)
def test_every_record_in_every_state(state: State, kind: str, after: State, code: str | None) -> None:
    core = core_in(state)
    effects = core.apply(sample(kind))
    assert core.state is after
    errors = [e.event for e in effects if isinstance(e, Emit) and isinstance(e.event, ev.Error)]
    assert [e.code for e in errors] == ([code] if code else [])
    if code is not None:
        assert code in CODES
    if code is not None and after in (State.ERROR, State.CLOSED):
        # A refused record has no other effect: nothing reaches the model, nothing else is said.
        assert len(effects) == 1
        rid = getattr(sample(kind), "client_event_id", None)
        assert errors[0].client_event_id == rid


def test_the_table_covers_every_record_kind() -> None:
    assert sorted(KINDS) == sorted(r.KIND_NAMES.values())


def test_nothing_but_the_trailer_follows_a_close_unrefused() -> None:
    core = core_in(State.CLOSED)
    (effect,) = core.apply(r.Heartbeat("late"))
    assert isinstance(effect, Emit)
    assert effect.event == ev.Error("session_closed", "the session is closed: heartbeat refused", "late")
    assert core.apply(r.End("0" * 64, "0" * 64, 0, 0)) == []


def test_an_error_state_still_closes_cleanly() -> None:
    core = core_in(State.RESPONDING)
    core.apply(r.Open({}))
    assert core.state is State.ERROR
    kinds = [type(e.event if isinstance(e, Emit) else e).__name__ for e in core.apply(r.Close("error"))]
    assert kinds == ["ResponseEnded", "ReleaseSlot", "SessionClosed"]
    state: State = core.state  # read again: apply() moved it
    assert state is State.CLOSED


@pytest.mark.parametrize(
    ("epoch", "appended"),
    [(1, 1), (0, 0)],  # an epoch that has not begun; no frame waiting for a result
    ids=["future-epoch", "nothing-pending"],
)
def test_a_step_result_for_a_frame_never_submitted_is_an_error(epoch: int, appended: int) -> None:
    core = core_in(State.OPEN) if appended else SessionCore(SID, detect_family(["NATF2.pt"]))
    if not appended:
        core.apply(r.Open({}))
    effects = core.apply(r.Step(epoch, 0, True, 5, "", (1,) * 8, (2,) * 8, bytes(2 * FRAME_SAMPLES)))
    assert core.state is State.ERROR and core.frames_out == 0
    (effect,) = effects
    assert isinstance(effect, Emit) and isinstance(effect.event, ev.Error)
    assert effect.event.code == "internal_error"


def test_a_stale_step_is_dropped_without_an_error() -> None:
    core = core_in(State.RESPONDING)
    core.apply(r.Cancel())
    assert core.epoch == 1 and core.frames_pending == 1
    assert core.apply(sample("step")) == []  # epoch 0's result after the cancel
    assert core.state is State.OPEN and core.frames_pending == 0


def test_a_second_header_is_an_error_and_another_sessions_header_raises() -> None:
    core = SessionCore(SID, detect_family(["NATF2.pt"]))
    assert core.apply(HEADER) == []
    (effect,) = core.apply(HEADER)
    assert isinstance(effect, Emit) and isinstance(effect.event, ev.Error)
    assert core.state is State.ERROR
    other = SessionCore("sess_other", detect_family(["NATF2.pt"]))
    with pytest.raises(ValueError, match="core of sess_other"):
        other.apply(HEADER)
