"""Framing, reading and torn-tail recovery of session log bytes (sans-io), plus ``recover`` on files."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c
import pytest

from duplex_actors.log import records as r
from duplex_actors.log import segment
from duplex_actors.log.segment import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    LogCorruption,
    TornTail,
    encode_record,
    read_log,
    read_records,
    recover,
)


def every_kind() -> list[r.Record]:
    return [
        r.Header(
            format_version=r.FORMAT_VERSION,
            session_id="sess_1",
            model_id="tiny",
            checkpoint_sha256="ab" * 32,
            dtype="float32",
            engine={"slots": 4, "device": "cpu"},
            sampling={"temp": 0.8, "top_k": 250, "seed": None},
            dialect="openai",
            output={"format": "pcm16", "nested": [1, {"a": True}]},
            package_version="0.1.0",
            created_at=1712345678.25,
        ),
        r.Open(config={"voice": "NATF0"}),
        r.Update(config={"instructions": "héllo ✓"}, client_event_id="evt_1"),
        r.Append(audio=bytes(range(256)) * 15, format="pcm16", client_event_id="e2"),
        r.Append(audio=b"\x00\x00\x80\x3f" * 1920, format="pcm_f32le"),
        r.ClearInput(client_event_id=None),
        r.ClearOutput(client_event_id="c"),
        r.Cancel(),
        r.Cancel(client_event_id="k", reset=False),
        r.ClearOutput(reset=False),
        r.Truncate(item_id="item_x_0", content_index=0, audio_end_ms=2320, client_event_id="t"),
        r.TextItem(role="system", text="Speak French. ✓", item_id="msg_1", client_event_id="ti"),
        r.TextItem(role="user", text="hello"),
        r.RetrieveItem(item_id="item_x_0", client_event_id="r"),
        r.Detach(attachment=1, reason="dropped"),
        r.Resume(2, 10, 11, 14, 48000, "c", "resumed"),
        r.Heartbeat(client_event_id="hb"),
        r.PlaybackAck(payload={"item_id": "i", "audio_end_ms": 240}),
        r.Close(reason="client_close"),
        r.Step(
            epoch=2,
            frame_index=17,
            ready=True,
            text_token=3,
            text_piece="▁hi",
            agent_codes=tuple(range(8)),
            user_codes=(2047,) * 8,
            pcm16=b"\x01\x02" * 1920,
        ),
        r.Rejected(event_type="input_audio_buffer.append", code="invalid_audio", message="odd length"),
        r.End(events_sha256="0" * 64, audio_sha256="f" * 64, events=12, frames_out=17),
        r.Pad(samples=480, reason="start"),
        r.AlignHint(pad_ms=20, reason="margin"),
        r.Drain(frame_index=9),
    ]


def log_bytes(recs: list[r.Record]) -> tuple[bytes, list[int]]:
    """The file bytes and the offset of each record's frame."""
    out = bytearray(MAGIC)
    offsets = []
    for seq, rec in enumerate(recs):
        offsets.append(len(out))
        out += encode_record(seq, rec)
    return bytes(out), offsets


def raw_frame(seq: int, kind: int, payload: bytes) -> bytes:
    covered = struct.pack("<QB", seq, kind) + payload
    return struct.pack("<II", len(payload), crc32c.crc32c(covered)) + covered


def test_every_record_kind_round_trips() -> None:
    recs = every_kind()
    assert {type(rec) for rec in recs} == set(r.RECORD_TYPES)
    data, _ = log_bytes(recs)
    result = read_records(data)
    assert result.records == list(enumerate(recs))
    assert result.torn_tail is None
    assert result.valid_length == len(data)
    assert result.next_seq == len(recs)


def test_frame_layout_is_the_documented_header() -> None:
    frame = encode_record(5, r.Close(reason="timeout"))
    length, crc, seq, kind = HEADER.unpack_from(frame)
    assert HEADER_SIZE == 17
    assert (seq, kind, length) == (5, r.Close.KIND, len(frame) - HEADER_SIZE)
    assert crc == crc32c.crc32c(frame[8:])
    assert r.decode_payload(kind, frame[HEADER_SIZE:]) == r.Close(reason="timeout")


def test_a_frame_is_the_header_then_the_covered_bytes_for_every_kind() -> None:
    """encode_record's one join and running CRC give the frame the layout documents."""
    audio = bytes(range(256)) * 15
    recs = [
        *every_kind(),
        r.Step(3, 41, True, 7, " hi", tuple(range(2040, 2056)), (0, 4095, 4096, 70000), audio),
        r.Append(audio, "pcm16", "evt_1", 24000),
    ]
    for seq, record in enumerate(recs):
        kind, payload = r.encode_payload(record)
        covered = struct.pack("<QB", seq, kind) + payload
        assert (
            encode_record(seq, record) == struct.pack("<II", len(payload), crc32c.crc32c(covered)) + covered
        )


@pytest.mark.parametrize("data", [b"", MAGIC])
def test_empty_file_and_bare_magic_have_no_records(data: bytes) -> None:
    result = read_records(data)
    assert result.records == [] and result.torn_tail is None and result.next_seq == 0


def test_partial_magic_is_a_torn_tail() -> None:
    result = read_records(MAGIC[:5])
    assert result.records == []
    assert result.torn_tail == TornTail(0, 5, "truncated magic")


@pytest.mark.parametrize("data", [b"DUPLXLOX", b"NOTALOG!" + encode_record(0, r.Cancel()), b"xy"])
def test_bad_magic_is_corruption_at_offset_zero(data: bytes) -> None:
    with pytest.raises(LogCorruption) as info:
        read_records(data)
    assert info.value.offset == 0
    assert "byte 0" in str(info.value)


def test_truncation_at_every_offset_keeps_the_whole_records_before_the_cut() -> None:
    recs: list[r.Record] = [
        r.Cancel(),
        r.Append(audio=b"\x10\x20" * 40),
        r.Close(reason="x"),
        r.End("a", "b", 1, 2),
    ]
    data, offsets = log_bytes(recs)
    boundaries = {*offsets, len(data)}
    for cut in range(len(data) + 1):
        result = read_records(data[:cut])
        whole = sum(1 for o in [*offsets[1:], len(data)] if o <= cut)
        assert result.records == list(enumerate(recs))[:whole], cut
        if cut in boundaries or cut == 0:
            assert result.torn_tail is None, cut
        else:
            assert result.torn_tail is not None, cut
            assert result.torn_tail.offset == (offsets[whole] if cut > len(MAGIC) else 0)
            assert result.torn_tail.offset + result.torn_tail.dropped_bytes == cut
            assert result.valid_length == result.torn_tail.offset


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]


def test_flipped_byte_in_a_middle_record_is_corruption_at_its_offset() -> None:
    recs = every_kind()
    data, offsets = log_bytes(recs)
    victim = 5
    for at in range(offsets[victim], offsets[victim + 1]):
        with pytest.raises(LogCorruption) as info:
            read_records(flip(data, at))
        assert info.value.offset == offsets[victim], at
        assert f"byte {offsets[victim]}" in str(info.value)


def test_flipped_byte_in_the_last_record_is_a_torn_tail() -> None:
    recs = every_kind()
    data, offsets = log_bytes(recs)
    for at in range(offsets[-1], len(data)):
        result = read_records(flip(data, at))
        assert result.records == list(enumerate(recs))[:-1], at
        assert result.torn_tail is not None
        assert result.torn_tail.offset == offsets[-1]
        assert result.torn_tail.dropped_bytes == len(data) - offsets[-1]


def test_flipped_kind_byte_does_not_check() -> None:
    data, offsets = log_bytes([r.ClearInput(), r.ClearOutput()])
    kind_at = offsets[0] + HEADER_SIZE - 1
    tampered = data[:kind_at] + bytes([r.ClearOutput.KIND]) + data[kind_at + 1 :]
    with pytest.raises(LogCorruption, match="CRC mismatch"):
        read_records(tampered)


def test_records_in_the_wrong_order_are_corruption() -> None:
    a, b, c = encode_record(0, r.Cancel()), encode_record(1, r.Heartbeat()), encode_record(2, r.Cancel())
    with pytest.raises(LogCorruption, match="sequence number 2 where 1") as info:
        read_records(MAGIC + a + c + b)
    assert info.value.offset == len(MAGIC) + len(a)


def test_a_checked_frame_with_a_wrong_sequence_number_at_the_end_is_corruption_not_a_tear() -> None:
    with pytest.raises(LogCorruption, match="sequence number 7"):
        read_records(MAGIC + encode_record(0, r.Cancel()) + encode_record(7, r.Cancel()))


def test_a_checked_frame_with_a_bad_payload_is_corruption() -> None:
    bad = raw_frame(0, r.Close.KIND, struct.pack("<I", 2) + b"{}")  # missing `reason`
    with pytest.raises(LogCorruption, match="record 0: close record") as info:
        read_records(MAGIC + bad)
    assert info.value.offset == len(MAGIC)
    with pytest.raises(LogCorruption, match="unknown record kind 99"):
        read_records(MAGIC + raw_frame(0, 99, struct.pack("<I", 2) + b"{}"))


def test_impossible_length_is_a_torn_tail_when_nothing_follows() -> None:
    data = MAGIC + encode_record(0, r.Cancel())
    junk = struct.pack("<IIQB", MAX_PAYLOAD + 1, 0, 1, r.Cancel.KIND) + b"\x00" * 40
    result = read_records(data + junk)
    assert result.records == [(0, r.Cancel())]
    assert result.torn_tail is not None and "impossible payload length" in result.torn_tail.reason


def test_garbage_followed_by_a_valid_record_is_corruption() -> None:
    data = MAGIC + encode_record(0, r.Cancel()) + b"\xff" * 33 + encode_record(1, r.Cancel())
    with pytest.raises(LogCorruption) as info:
        read_records(data)
    assert info.value.offset == len(MAGIC) + len(encode_record(0, r.Cancel()))


def test_forward_scan_over_a_large_torn_region_checks_each_offset_at_most_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, _ = log_bytes([r.Append(audio=os.urandom(7680)) for _ in range(10)])
    checked: list[int] = []
    real_check = segment._checked_frame

    def counted_check(buf: bytes, offset: int) -> object:
        checked.append(offset)
        return real_check(buf, offset)

    monkeypatch.setattr(segment, "_checked_frame", counted_check)
    # A crash can leave a long run of zeros or stale junk after the last whole record: numpy
    # rules out its offsets, so a CRC is computed for only a handful (the 10 records, the bad one).
    for tail in (b"\x00" * (4 << 20), os.urandom(4 << 20)):
        checked.clear()
        result = read_records(data + tail)
        assert len(result.records) == 10
        assert result.torn_tail is not None and result.torn_tail.dropped_bytes == len(tail)
        assert len(checked) <= 16, len(checked)

    # Junk that passes numpy's filter at every 16th byte costs a CRC there, once: the scan goes
    # forward over each offset at most once, so its work grows with the region, not its square.
    tail = (b"\x01\x00" * 3 + b"\x00" * 10) * (1 << 16)  # 1 MiB
    checked.clear()
    result = read_records(data + tail)
    assert len(result.records) == 10
    assert result.torn_tail is not None and result.torn_tail.dropped_bytes == len(tail)
    scanned = [offset for offset in checked if offset > result.torn_tail.offset]
    assert scanned == sorted(set(scanned)), "an offset of the torn region was checked twice"
    assert len(tail) // 32 <= len(scanned) <= len(tail) // 16, len(scanned)  # dense, and once each


def test_recover_truncates_a_torn_tail_in_place_and_reports_it(tmp_path: Path) -> None:
    data, offsets = log_bytes(every_kind())
    path = tmp_path / "s.dlog"
    path.write_bytes(data[:-3])
    result = recover(path)
    assert result.torn_tail is not None and result.torn_tail.offset == offsets[-1]
    assert path.read_bytes() == data[: offsets[-1]]
    again = recover(path)
    assert again.torn_tail is None and again.records == result.records


def test_recover_leaves_a_corrupt_file_untouched(tmp_path: Path) -> None:
    data, offsets = log_bytes(every_kind())
    path = tmp_path / "s.dlog"
    path.write_bytes(flip(data, offsets[3] + 20))
    with pytest.raises(LogCorruption):
        recover(path)
    assert path.read_bytes() == flip(data, offsets[3] + 20)
    with pytest.raises(LogCorruption):
        read_log(path)


def test_oversized_payload_is_refused_at_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import duplex_actors.log.segment as segment

    monkeypatch.setattr(segment, "MAX_PAYLOAD", 100)
    with pytest.raises(ValueError, match="exceeds"):
        segment.encode_record(0, r.Append(audio=b"\x00" * 200))
