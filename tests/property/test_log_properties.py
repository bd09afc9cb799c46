"""Properties of the session log framing: round trip, truncation recovery, single-byte damage."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplex_actors.log import records as r
from duplex_actors.log.segment import MAGIC, LogCorruption, encode_record, read_records

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(max_size=24)
ids = st.none() | text
ints = st.integers(min_value=-(2**63), max_value=2**64)
blobs = st.binary(max_size=4096)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(text, json_values, max_size=5)
codes = st.lists(st.integers(min_value=0, max_value=2**31), max_size=16).map(tuple)

records: st.SearchStrategy[r.Record] = st.one_of(
    st.builds(
        r.Header,
        format_version=ints,
        session_id=text,
        model_id=text,
        checkpoint_sha256=text,
        dtype=text,
        engine=json_objects,
        sampling=json_objects,
        dialect=text,
        output=json_objects,
        package_version=text,
        created_at=st.floats(allow_nan=False, allow_infinity=False),
    ),
    st.builds(r.Open, config=json_objects),
    st.builds(r.Update, config=json_objects, client_event_id=ids),
    st.builds(r.Append, audio=blobs, format=text, client_event_id=ids),
    st.builds(r.ClearInput, client_event_id=ids),
    st.builds(r.ClearOutput, client_event_id=ids),
    st.builds(r.Cancel, client_event_id=ids),
    st.builds(r.Heartbeat, client_event_id=ids),
    st.builds(r.PlaybackAck, payload=json_objects, client_event_id=ids),
    st.builds(r.Close, reason=text),
    st.builds(
        r.Step,
        epoch=ints,
        frame_index=ints,
        ready=st.booleans(),
        text_token=ints,
        text_piece=text,
        agent_codes=codes,
        user_codes=codes,
        pcm16=blobs,
    ),
    st.builds(r.Rejected, event_type=text, code=text, message=text, client_event_id=ids),
    st.builds(r.End, events_sha256=text, audio_sha256=text, events=ints, frames_out=ints),
)
record_lists = st.lists(records, max_size=8)


def log_bytes(recs: list[r.Record]) -> tuple[bytes, list[int]]:
    """The file bytes and the offset of each record's frame."""
    out = bytearray(MAGIC)
    offsets = []
    for seq, rec in enumerate(recs):
        offsets.append(len(out))
        out += encode_record(seq, rec)
    return bytes(out), offsets


@PROPERTY_SETTINGS
@given(record_lists)
def test_any_sequence_of_records_round_trips(recs: list[r.Record]) -> None:
    data, _ = log_bytes(recs)
    result = read_records(data)
    assert result.records == list(enumerate(recs))
    assert result.torn_tail is None and result.valid_length == len(data)


@PROPERTY_SETTINGS
@given(record_lists, st.data())
def test_any_truncation_recovers_up_to_the_last_whole_record(
    recs: list[r.Record], data: st.DataObject
) -> None:
    full, offsets = log_bytes(recs)
    cut = data.draw(st.integers(min_value=0, max_value=len(full)), label="cut")
    result = read_records(full[:cut])
    ends = [*offsets[1:], len(full)]
    whole = sum(1 for end in ends if end <= cut)
    assert result.records == list(enumerate(recs))[:whole]
    at_boundary = cut == 0 or cut == len(MAGIC) or cut in ends
    assert (result.torn_tail is None) == at_boundary
    assert result.valid_length == (cut if at_boundary else (offsets[whole] if cut > len(MAGIC) else 0))


@PROPERTY_SETTINGS
@given(record_lists.filter(bool), st.data())
def test_any_single_flipped_byte_is_detected(recs: list[r.Record], data: st.DataObject) -> None:
    full, offsets = log_bytes(recs)
    at = data.draw(st.integers(min_value=0, max_value=len(full) - 1), label="at")
    mask = data.draw(st.integers(min_value=1, max_value=255), label="mask")
    damaged = full[:at] + bytes([full[at] ^ mask]) + full[at + 1 :]
    # The record the flipped byte belongs to (-1: the magic).
    victim = sum(1 for offset in offsets if offset <= at) - 1
    try:
        result = read_records(damaged)
    except LogCorruption as exc:
        assert victim < len(recs) - 1, "damage to the last record must read as a torn tail"
        assert exc.offset == (0 if victim < 0 else offsets[victim])
        return
    # Never silently different records: a strict prefix of the originals, and the damage reported.
    assert result.torn_tail is not None
    assert result.records == list(enumerate(recs))[: len(result.records)]
    assert victim == len(recs) - 1 and result.torn_tail.offset == offsets[victim]


@pytest.mark.parametrize("seed_records", [[r.Cancel()], [r.Append(audio=b"\x00" * 64), r.Cancel()]])
def test_flipped_bytes_exhaustively_on_small_logs(seed_records: list[r.Record]) -> None:
    full, _ = log_bytes(seed_records)
    for at in range(len(full)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = full[:at] + bytes([full[at] ^ mask]) + full[at + 1 :]
            try:
                result = read_records(damaged)
            except LogCorruption:
                continue
            assert result.torn_tail is not None
            assert result.records == list(enumerate(seed_records))[: len(result.records)]
