"""Framing of the session log: records to bytes and a whole file's bytes back to records.

Sans-io: :func:`encode_record` and :func:`read_records` take and return bytes and never touch a file
or Trio. :func:`read_log` and :func:`recover` at the bottom are the thin file-reading helpers.

A log file is ``MAGIC`` followed by frames. Each frame is a little-endian header
``u32 payload_length | u32 crc32c | u64 sequence_number | u8 kind`` and then the payload
(:func:`duplex_actors.log.records.encode_payload`). The CRC32C covers sequence number, kind and
payload, so a record copied to the wrong place or a flipped kind byte does not check.

Reading stops at the first bad record. It is a *torn tail* (a crash during an append: truncate and
report it) only if no valid frame (its CRC checks, its kind is known and its sequence number could
come later in this file) starts at any later byte; otherwise the file is corrupt and
:class:`LogCorruption` names the byte offset of the bad record. A frame whose CRC checks but whose
sequence number or payload is wrong is corruption too: an interrupted append cannot produce one.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

import attrs
import crc32c
import numpy as np
import numpy.typing as npt

from duplex_actors.log.records import (
    BY_KIND,
    PayloadError,
    Record,
    decode_payload,
    encode_payload_parts,
)

MAGIC: Final = b"DUPLXLOG"
SUFFIX: Final = ".dlog"
"""File name suffix of a session log: ``<session_id>.dlog``."""
HEADER: Final = struct.Struct("<IIQB")
HEADER_SIZE: Final = HEADER.size
# Offset of the CRC-covered part (sequence number, kind, payload) within a frame.
_COVERED_FROM: Final = 8
# Largest payload a reader believes. Real records are a few KB (one 80 ms audio frame); the cap keeps
# a garbage length from sending the reader (or the forward scan) across the whole file.
MAX_PAYLOAD: Final = 64 * 1024 * 1024
_SEQ_KIND: Final = struct.Struct("<QB")
_LENGTH_CRC: Final = struct.Struct("<II")


class LogCorruption(Exception):
    """A bad record with valid records after it (or a bad magic): the file is damaged, not torn."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"session log corrupt at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


@attrs.frozen(slots=True)
class TornTail:
    """An incomplete or bad last record: ``dropped_bytes`` from ``offset`` to the end do not count."""

    offset: int
    dropped_bytes: int
    reason: str


@attrs.frozen(slots=True)
class ReadResult:
    """The records of a log, in order, and the torn tail after them if there was one."""

    records: list[tuple[int, Record]]
    torn_tail: TornTail | None
    valid_length: int
    """Bytes of the file that hold the magic and whole valid records."""

    @property
    def next_seq(self) -> int:
        """The sequence number the next record appended to this log would get."""
        return self.records[-1][0] + 1 if self.records else 0


def encode_record(seq: int, record: Record) -> bytes:
    """One frame: header and payload of ``record`` with sequence number ``seq``."""
    kind, head, blob = encode_payload_parts(record)
    length = len(head) + len(blob)
    if length > MAX_PAYLOAD:
        raise ValueError(f"record payload of {length} bytes exceeds {MAX_PAYLOAD}")
    covered_head = _SEQ_KIND.pack(seq, kind) + head
    crc = crc32c.crc32c(covered_head)
    if blob:
        crc = crc32c.crc32c(blob, crc)  # the CRC of covered_head + blob, without joining them
    return b"".join((_LENGTH_CRC.pack(length, crc), covered_head, blob))


def _checked_frame(data: bytes, offset: int) -> tuple[int, int, int] | str:
    """``(seq, kind, payload_length)`` of a frame at ``offset`` whose CRC checks, else why not."""
    if len(data) - offset < HEADER_SIZE:
        return f"truncated header ({len(data) - offset} of {HEADER_SIZE} bytes)"
    length, crc, seq, kind = HEADER.unpack_from(data, offset)
    if length > MAX_PAYLOAD:
        return f"impossible payload length {length}"
    end = offset + HEADER_SIZE + length
    if end > len(data):
        return f"truncated record (payload length {length}, {len(data) - offset - HEADER_SIZE} bytes left)"
    if crc32c.crc32c(memoryview(data)[offset + _COVERED_FROM : end]) != crc:
        return "CRC mismatch"
    return seq, kind, length


def read_records(data: bytes) -> ReadResult:
    """Parse a whole log file's bytes.

    Raises :class:`LogCorruption` for a bad magic, for a frame whose CRC checks but whose sequence
    number or payload is wrong (a crash cannot produce one), and for a bad record followed by a valid
    frame anywhere later. A bad record with nothing valid after it is reported as the torn tail.
    """
    if len(data) < len(MAGIC):
        if MAGIC.startswith(data):
            # A crash while the file was being created: nothing was ever logged.
            torn = TornTail(0, len(data), "truncated magic") if data else None
            return ReadResult([], torn, 0)
        raise LogCorruption(0, "bad magic")
    if not data.startswith(MAGIC):
        raise LogCorruption(0, "bad magic")
    records: list[tuple[int, Record]] = []
    offset = len(MAGIC)
    seq = 0
    while offset < len(data):
        frame = _checked_frame(data, offset)
        if isinstance(frame, str):
            later = _find_frame(data, offset + 1, seq_limit=seq + (len(data) - offset) // HEADER_SIZE)
            if later is not None:
                raise LogCorruption(offset, f"{frame} in record {seq}, valid record at byte {later} after it")
            return ReadResult(records, TornTail(offset, len(data) - offset, frame), offset)
        frame_seq, kind, length = frame
        if frame_seq != seq:
            raise LogCorruption(offset, f"sequence number {frame_seq} where {seq} was expected")
        start = offset + HEADER_SIZE
        try:
            record = decode_payload(kind, data[start : start + length])
        except PayloadError as exc:
            raise LogCorruption(offset, f"record {seq}: {exc}") from exc
        records.append((seq, record))
        seq += 1
        offset = start + length
    return ReadResult(records, None, offset)


_KNOWN_KIND: Final = np.zeros(256, dtype=bool)
_KNOWN_KIND[list(BY_KIND)] = True
_SCAN_CHUNK: Final = 1 << 20


def _find_frame(data: bytes, start: int, *, seq_limit: int) -> int | None:
    """Offset of the first frame at or after ``start`` whose CRC checks, or None.

    Only frames that could belong to this log are candidates (known kind, sequence number at most
    ``seq_limit``, payload inside the file); numpy filters every offset of a chunk at once so that
    only the rare candidate costs a CRC.
    """
    last = len(data) - HEADER_SIZE  # last offset where a whole header fits
    buf = np.frombuffer(data, dtype=np.uint8)
    for lo in range(start, last + 1, _SCAN_CHUNK):
        n = min(_SCAN_CHUNK, last + 1 - lo)

        def field(at: int, width: int, lo: int = lo, n: int = n) -> npt.NDArray[np.uint64]:
            value = np.zeros(n, dtype=np.uint64)
            for i in range(width):
                value |= buf[lo + at + i : lo + at + i + n].astype(np.uint64) << np.uint64(8 * i)
            return value

        offsets = np.arange(lo, lo + n, dtype=np.uint64)
        mask = _KNOWN_KIND[buf[lo + 16 : lo + 16 + n]]
        mask &= field(8, 8) <= np.uint64(seq_limit)
        length = field(0, 4)
        mask &= length <= np.uint64(MAX_PAYLOAD)
        mask &= offsets + np.uint64(HEADER_SIZE) + length <= np.uint64(len(data))
        for candidate in np.flatnonzero(mask):
            offset = lo + int(candidate)
            if not isinstance(_checked_frame(data, offset), str):
                return offset
    return None


def read_log(path: str | os.PathLike[str]) -> ReadResult:
    """Read a log file without changing it."""
    return read_records(Path(path).read_bytes())


def recover(path: str | os.PathLike[str]) -> ReadResult:
    """Read a log file and truncate its torn tail in place, if it has one; the result reports it.

    A corrupt file raises :class:`LogCorruption` and is left exactly as it was.
    """
    result = read_log(path)
    if result.torn_tail is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, result.torn_tail.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
    return result
