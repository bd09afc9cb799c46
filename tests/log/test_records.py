"""The per-frame records' templates write the bytes the generic JSON encoder writes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_actors.log import records as r

# Audio codes (in and just past the template's table of 4096) and any other int.
CODES = st.lists(
    st.integers(min_value=0, max_value=4200) | st.integers(min_value=-(2**70), max_value=2**70), max_size=17
).map(tuple)
TEXT = st.text(max_size=40)  # any code point: escapes, surrogates, non-ASCII


@given(
    epoch=st.integers(min_value=0, max_value=2**40),
    frame_index=st.integers(min_value=-1, max_value=2**40),
    ready=st.booleans(),
    text_token=st.integers(min_value=-(2**63), max_value=2**63),
    text_piece=TEXT,
    agent=CODES,
    user=CODES,
    pcm16=st.binary(max_size=64),
)
def test_step_template_equals_the_encoder(
    epoch: int,
    frame_index: int,
    ready: bool,
    text_token: int,
    text_piece: str,
    agent: tuple[int, ...],
    user: tuple[int, ...],
    pcm16: bytes,
) -> None:
    record = r.Step(epoch, frame_index, ready, text_token, text_piece, agent, user, pcm16)
    assert r.encode_payload(record) == r.generic_payload(record)
    assert r.decode_payload(*r.encode_payload(record)) == record


@given(
    audio=st.binary(max_size=64),
    fmt=st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw", 'fmt\u00e9\n"x']),
    event_id=st.none() | TEXT,
    rate=st.integers(min_value=0, max_value=2**40),
)
def test_append_template_equals_the_encoder(audio: bytes, fmt: str, event_id: str | None, rate: int) -> None:
    record = r.Append(audio, fmt, event_id, rate)
    assert r.encode_payload(record) == r.generic_payload(record)
    assert r.decode_payload(*r.encode_payload(record)) == record


class _Int(int):
    """An int subclass, as numpy or a bool would bring: its JSON is the encoder's to decide."""


@pytest.mark.parametrize(
    "record",
    [
        r.Step(True, 1, True, 5, "a", (1, 2), (3,), b"\x00\x01"),  # a bool where an int is
        r.Step(1, 1, 1, 5, "a", (1, 2), (3,), b""),  # type: ignore[arg-type]  # an int for ready
        r.Step(1, 1, False, _Int(5), "a", (1, _Int(2)), (3,), b""),
        r.Step(1, 1, False, 5, "a", [1, 2], (3,), b""),  # type: ignore[arg-type]  # a list for codes
        r.Step(1, 1, False, 5, "a", (1, 2), (3, True), b""),  # a bool among the user's codes
        r.Append(b"\x01\x02", "pcm16", "evt", True),
        r.Append(b"", "pcm16", _Int(3), 8000),  # type: ignore[arg-type]
    ],
)
def test_other_types_take_the_encoder(record: Any) -> None:
    assert r.encode_payload(record) == r.generic_payload(record)


def test_a_frame_record_is_a_templated_step_or_append_over_bytes_that_cannot_change() -> None:
    """frame_record: what the log may encode later (at its commit) and get the same bytes."""
    step = r.Step(1, 2, True, 5, "a", (1, 2), (3,), b"\x00\x01")
    append = r.Append(b"\x01\x02", "pcm16", "evt", 24000)
    assert r.frame_record(step) and r.frame_record(append)
    not_frames: list[r.Record] = [
        r.Step(1, 2, True, 5, "a", (1, 2), (3,), bytearray(b"\x00\x01")),  # type: ignore[arg-type]
        r.Append(memoryview(b"\x01\x02"), "pcm16", None, 24000),  # type: ignore[arg-type]
        r.Step(1, 2, True, 5, "x" * (r.FRAME_TEXT_MAX + 1), (1,), (3,), b""),
        r.Append(b"\x01", "pcm16", "e" * (r.FRAME_TEXT_MAX + 1), 24000),
        r.Append(bytes(r.FRAME_AUDIO_MAX + 2), "pcm16", None, 24000),
        r.Step(True, 1, True, 5, "a", (1, 2), (3,), b"\x00\x01"),  # the encoder's to decide
        r.Append(b"\x01\x02", "pcm16", "evt", True),
        r.Heartbeat(None),
        r.Cancel(),
    ]
    assert not any(r.frame_record(record) for record in not_frames)
