"""The output frame's digest template writes the bytes the generic JSON encoder writes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex_actors.session import events as ev

TEXT = st.text(max_size=30)  # any code point: escapes, surrogates, non-ASCII


@given(
    response_id=TEXT,
    item_id=TEXT,
    epoch=st.integers(min_value=-1, max_value=2**70),
    frame_index=st.integers(min_value=-(2**70), max_value=2**70),
    pcm16=st.binary(max_size=64),
    text=TEXT,
    input_samples_end=st.none() | st.integers(min_value=-(2**70), max_value=2**70),
)
def test_audio_frame_template_equals_the_encoder(
    response_id: str,
    item_id: str,
    epoch: int,
    frame_index: int,
    pcm16: bytes,
    text: str,
    input_samples_end: int | None,
) -> None:
    event = ev.AudioFrame(response_id, item_id, epoch, frame_index, pcm16, text, input_samples_end)
    assert ev.canonical_bytes(event) == ev.generic_canonical_bytes(event)


class _Int(int):
    """An int subclass, as numpy or a bool would bring: its JSON is the encoder's to decide."""


@pytest.mark.parametrize(
    "event",
    [
        ev.AudioFrame("r", "i", True, 1, b"\x00", "t", 5),  # a bool where an int is
        ev.AudioFrame("r", "i", 1, _Int(1), b"\x00", "t"),
        ev.AudioFrame("r", "i", 1, 1, b"\x00", "t", _Int(7)),
    ],
)
def test_other_types_take_the_encoder(event: Any) -> None:
    assert ev.canonical_bytes(event) == ev.generic_canonical_bytes(event)
